//! `scalevfs mkfs IMAGE --size SIZE`: make an empty ext4 image file
//! (`scalevfs_ext4::mkfs`), as `mke2fs -t ext4` would.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use scalevfs::{
    Task, Timespec, Vfs, AT_FDCWD, AT_SYMLINK_NOFOLLOW, O_CREAT, O_EXCL, O_WRONLY, S_IFMT,
};
use scalevfs_ext4::mkfs::{self, MkfsOptions};
use scalevfs_ext4::{Ext4, Ext4Options};

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
    /// Fill the new filesystem from this host directory (as mke2fs -d):
    /// directories, regular files, symlinks, FIFOs, sockets, devices and
    /// hard links, with their owners, modes and times, through the
    /// read-write ext4 type. No root needed.
    #[arg(long, short = 'd')]
    from: Option<PathBuf>,
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
    if let Some(from) = &a.from {
        let n = populate(&a.image, from, a.quiet).map_err(|e| {
            // A half-filled image must not pass for a good one.
            let _ = std::fs::File::create(&a.image);
            format!("mkfs --from {}: {e}", from.display())
        })?;
        if !a.quiet {
            println!("copied {} entries from {}", n.0, from.display());
            println!("free after copying: {} blocks, {} inodes", n.1, n.2);
        }
    }
    Ok(())
}

/// One host entry to copy: its path below the source and its metadata.
struct Entry {
    rel: PathBuf,
    md: std::fs::Metadata,
}

/// The tree below `from`, parents before children (an explicit stack: no
/// recursion, so a deep tree cannot overflow the stack).
fn scan(from: &Path) -> Result<Vec<Entry>, String> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = from.join(&rel);
        let rd = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut names: Vec<_> = rd
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        names.sort();
        for name in names {
            let rel = rel.join(name);
            let path = from.join(&rel);
            let md =
                std::fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            if md.is_dir() {
                stack.push(rel.clone());
            }
            out.push(Entry { rel, md });
        }
    }
    Ok(out)
}

fn vpath(rel: &Path) -> Vec<u8> {
    let mut v = b"/".to_vec();
    v.extend_from_slice(rel.as_os_str().as_bytes());
    v
}

/// Owner, mode (after the owner: a chown clears set-id bits) and times of
/// `p`, as the host has them.
fn set_attrs(t: &Task, p: &[u8], md: &std::fs::Metadata) -> scalevfs::VfsResult<()> {
    t.fchownat(AT_FDCWD, p, md.uid(), md.gid(), AT_SYMLINK_NOFOLLOW)?;
    if !md.file_type().is_symlink() {
        t.fchmodat(AT_FDCWD, p, md.mode() & 0o7777, 0)?;
    }
    let times = [
        Timespec {
            sec: md.atime(),
            nsec: md.atime_nsec(),
        },
        Timespec {
            sec: md.mtime(),
            nsec: md.mtime_nsec(),
        },
    ];
    t.utimensat(AT_FDCWD, p, Some(times), AT_SYMLINK_NOFOLLOW)
}

/// Copy the tree at `from` into the image (made just before): returns the
/// entries copied and the free blocks and inodes left.
fn populate(image: &Path, from: &Path, quiet: bool) -> Result<(u64, u64, u64), String> {
    let top = std::fs::metadata(from).map_err(|e| format!("{}: {e}", from.display()))?;
    if !top.is_dir() {
        return Err(format!("{} is not a directory", from.display()));
    }
    let entries = scan(from)?;
    let total: u64 = entries
        .iter()
        .filter(|e| e.md.is_file())
        .map(|e| e.md.len())
        .sum();
    let fs = Ext4::open(
        image,
        Ext4Options {
            ro: false,
            ..Default::default()
        },
    )
    .map_err(|e| format!("{}: {e}", image.display()))?;
    let vfs = Vfs::with_root_fs(Default::default(), fs.clone());
    let t = vfs.root_task();
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    };
    let err = |p: &[u8], what: &str, e: scalevfs::Errno| {
        format!("{} {}: {}", what, String::from_utf8_lossy(p), e.message())
    };
    let mut links: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    let mut buf = vec![0u8; 1 << 20];
    for e in &entries {
        let p = vpath(&e.rel);
        let ft = e.md.file_type();
        if ft.is_dir() {
            t.mkdir(&p, 0o700).map_err(|x| err(&p, "mkdir", x))?;
        } else if ft.is_file() {
            if e.md.nlink() > 1 {
                if let Some(first) = links.get(&(e.md.dev(), e.md.ino())) {
                    t.linkat(AT_FDCWD, first, AT_FDCWD, &p, 0)
                        .map_err(|x| err(&p, "link", x))?;
                    continue;
                }
                links.insert((e.md.dev(), e.md.ino()), p.clone());
            }
            let src = from.join(&e.rel);
            let mut f = std::fs::File::open(&src).map_err(|x| format!("{}: {x}", src.display()))?;
            let fd = t
                .open(&p, O_CREAT | O_EXCL | O_WRONLY, 0o600)
                .map_err(|x| err(&p, "create", x))?;
            // All-zero blocks are skipped and the size set at the end, so
            // holes stay holes (as mke2fs -d keeps sparse files sparse).
            let r = (|| -> Result<(), String> {
                let mut pos: u64 = 0;
                loop {
                    let n = f
                        .read(&mut buf)
                        .map_err(|x| format!("{}: {x}", src.display()))?;
                    if n == 0 {
                        let size = i64::try_from(pos).map_err(|_| "file too large".to_string())?;
                        return t.ftruncate(fd, size).map_err(|x| err(&p, "truncate", x));
                    }
                    for (k, chunk) in buf[..n].chunks(4096).enumerate() {
                        if chunk.iter().all(|&b| b == 0) {
                            continue;
                        }
                        let at = pos + (k * 4096) as u64;
                        let mut done = 0;
                        while done < chunk.len() {
                            let off = i64::try_from(at + done as u64)
                                .map_err(|_| "file too large".to_string())?;
                            done += t
                                .pwrite(fd, &chunk[done..], off)
                                .map_err(|x| err(&p, "write", x))?;
                        }
                    }
                    pos += n as u64;
                    bar.inc(n as u64);
                }
            })();
            t.close(fd).map_err(|x| err(&p, "close", x))?;
            r?;
        } else if ft.is_symlink() {
            let src = from.join(&e.rel);
            let target = std::fs::read_link(&src).map_err(|x| format!("{}: {x}", src.display()))?;
            t.symlinkat(target.as_os_str().as_bytes(), AT_FDCWD, &p)
                .map_err(|x| err(&p, "symlink", x))?;
        } else {
            // FIFOs, sockets, character and block devices.
            t.mknodat(AT_FDCWD, &p, e.md.mode() & (S_IFMT | 0o7777), e.md.rdev())
                .map_err(|x| err(&p, "mknod", x))?;
        }
        set_attrs(&t, &p, &e.md).map_err(|x| err(&p, "set attributes of", x))?;
    }
    // Directory times last (their children changed them), deepest first.
    for e in entries.iter().rev().filter(|e| e.md.is_dir()) {
        let p = vpath(&e.rel);
        set_attrs(&t, &p, &e.md).map_err(|x| err(&p, "set attributes of", x))?;
    }
    set_attrs(&t, b"/", &top).map_err(|x| err(b"/", "set attributes of", x))?;
    bar.finish_and_clear();
    let st = t.statfs("/").map_err(|x| err(b"/", "statfs", x))?;
    drop(t);
    drop(vfs);
    fs.unmount()
        .map_err(|e| format!("{}: {e}", image.display()))?;
    Ok((entries.len() as u64, st.bfree, st.ffree))
}
