//! `scalevfs mkfs IMAGE --size SIZE`: make an empty ext4 image file
//! (`scalevfs_ext4::mkfs`), as `mke2fs -t ext4` would.

use std::path::PathBuf;

use clap::Args;
use scalevfs_ext4::mkfs::{self, MkfsOptions};

#[derive(Args, Debug)]
pub struct MkfsArgs {
    /// The image file to write (created, or cut to SIZE; its old contents
    /// are lost), or a block device (not mounted; SIZE must fit in it).
    image: PathBuf,
    /// Filesystem size: bytes, or a number with K, M, G or T (e.g. 64M, 1G).
    #[arg(long)]
    size: String,
    /// Block size: 1024, 2048 or 4096 (default: 1024 below 512M, else 4096).
    #[arg(long, short = 'b')]
    block_size: Option<u32>,
    /// Inode size in bytes (default 256).
    #[arg(long, short = 'I')]
    inode_size: Option<u16>,
    /// Bytes per inode (default as mke2fs: 4096 below 512M, else 16384).
    #[arg(long, short = 'i')]
    inode_ratio: Option<u32>,
    /// Volume label (at most 16 bytes).
    #[arg(long, short = 'L', default_value = "")]
    label: String,
    /// Filesystem UUID (default: random).
    #[arg(long, short = 'U')]
    uuid: Option<String>,
    /// Feature edits as mke2fs -O: `feature` on, `^feature` off
    /// (comma-separated or repeated).
    #[arg(long = "features", short = 'O')]
    features: Vec<String>,
    /// Print nothing on success.
    #[arg(long, short)]
    quiet: bool,
}

pub fn run(a: MkfsArgs) -> Result<(), String> {
    let size = mkfs::parse_size(&a.size).map_err(|e| e.to_string())?;
    let uuid = match &a.uuid {
        Some(u) => Some(mkfs::parse_uuid(u).map_err(|e| e.to_string())?),
        None => None,
    };
    let o = MkfsOptions {
        size,
        block_size: a.block_size,
        inode_size: a.inode_size,
        inode_ratio: a.inode_ratio,
        label: a.label,
        uuid,
        features: a.features,
        ..Default::default()
    };
    let r = mkfs::make(&a.image, &o).map_err(|e| format!("mkfs {}: {e}", a.image.display()))?;
    if !a.quiet {
        println!(
            "{}: ext4, {} blocks of {} bytes, {} inodes, {} groups, journal {} blocks",
            a.image.display(),
            r.blocks,
            r.block_size,
            r.inodes,
            r.groups,
            r.journal_blocks
        );
        println!("UUID {}", mkfs::format_uuid(&r.uuid));
        println!("features: {}", r.features.join(" "));
        if !r.backup_groups.is_empty() {
            let b: Vec<String> = r
                .backup_groups
                .iter()
                .map(|&g| {
                    (u64::from(g) * u64::from(r.blocks_per_group) + u64::from(r.block_size == 1024))
                        .to_string()
                })
                .collect();
            println!("superblock backups at blocks: {}", b.join(", "));
        }
        println!("free: {} blocks, {} inodes", r.free_blocks, r.free_inodes);
    }
    Ok(())
}
