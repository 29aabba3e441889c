//! Images and tools shared by the journal recovery tests (`journal.rs`,
//! `journal_recovery_edges.rs`): an image made by mke2fs -d with a
//! `/data` file of known blocks, e2fsck's journal-only replay, byte
//! differences between images, the journal's blocks and superblock.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{mkfs, Scratch};
use scalevfs_ext4::journal::format as jf;
use scalevfs_ext4::BlockDevice;

pub fn tool(name: &str) -> PathBuf {
    mkfs().unwrap().with_file_name(name)
}

pub fn tools() -> bool {
    let ok = mkfs().is_some() && tool("debugfs").exists() && tool("e2fsck").exists();
    if !ok {
        eprintln!("SKIP: e2fsprogs (mkfs.ext4, debugfs, e2fsck) not found");
    }
    ok
}

/// Blocks of `/data`.
pub const DATA_BLOCKS: usize = 700;

/// An image with a `DATA_BLOCKS`-block file `/data`, and where its blocks are.
pub struct Img {
    pub _dir: Scratch,
    pub dir: PathBuf,
    pub path: PathBuf,
    pub bs: usize,
    pub data_blocks: Vec<u64>,
}

pub fn make(bs: usize, tag: &str) -> Img {
    let dir = Scratch::new(tag);
    let src = dir.0.join("src");
    std::fs::create_dir(&src).unwrap();
    let pat: Vec<u8> = (0..DATA_BLOCKS * bs).map(|i| (i % 251) as u8).collect();
    std::fs::write(src.join("data"), &pat).unwrap();
    std::fs::write(src.join("small"), b"small file\n").unwrap();
    let path = dir.0.join("img");
    let size = if bs == 1024 { "8M" } else { "32M" };
    let out = Command::new(mkfs().unwrap())
        .args(["-q", "-F", "-b", &bs.to_string(), "-O", "orphan_file", "-d"])
        .arg(&src)
        .arg(&path)
        .arg(size)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(tool("debugfs"))
        .args(["-R", "blocks /data"])
        .arg(&path)
        .output()
        .unwrap();
    let data_blocks: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(data_blocks.len(), DATA_BLOCKS, "blocks of /data");
    Img {
        dir: dir.0.clone(),
        _dir: dir,
        path,
        bs,
        data_blocks,
    }
}

pub fn copy(img: &Path, name: &str) -> PathBuf {
    let p = img.with_file_name(name);
    std::fs::copy(img, &p).unwrap();
    p
}

/// Let e2fsck replay the journal only (no -f: with it e2fsck 1.47 goes on
/// to a full check, which could repair more than the journal).
pub fn e2fsck_replay(img: &Path) -> String {
    let out = Command::new(tool("e2fsck"))
        .args(["-y", "-E", "journal_only"])
        .arg(img)
        .output()
        .unwrap();
    let s = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        matches!(out.status.code(), Some(0..=2)),
        "e2fsck -E journal_only: {s}"
    );
    s
}

/// The offsets where A and B differ outside the allowed fields.
pub const SB_ALLOWED: &[(usize, usize)] = &[(0x30, 4), (0x274, 1), (0x178, 8), (0x3FC, 4)];

pub fn differences(a: &Path, b: &Path) -> Vec<usize> {
    let a = std::fs::read(a).unwrap();
    let b = std::fs::read(b).unwrap();
    assert_eq!(a.len(), b.len());
    let mut bad = Vec::new();
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        if x != y {
            let ok = (1024..2048).contains(&i)
                && SB_ALLOWED
                    .iter()
                    .any(|&(o, l)| (1024 + o..1024 + o + l).contains(&i));
            if !ok {
                bad.push(i);
            }
        }
    }
    bad
}

/// The journal's physical blocks (debugfs `blocks <8>`).
pub fn journal_blocks(img: &Path) -> Vec<u64> {
    let out = Command::new(tool("debugfs"))
        .args(["-R", "blocks <8>"])
        .arg(img)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect()
}

pub fn read_block(img: &Path, bs: usize, blk: u64) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(img).unwrap();
    let mut b = vec![0u8; bs];
    f.read_exact_at(&mut b, blk * bs as u64).unwrap();
    b
}

pub fn write_block(img: &Path, bs: usize, blk: u64, b: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    f.write_all_at(b, blk * bs as u64).unwrap();
}

pub fn journal_sb(img: &Img) -> (jf::JournalSuperblock, Vec<u64>) {
    let jb = journal_blocks(&img.path);
    let b = read_block(&img.path, img.bs, jb[0]);
    let js = jf::JournalSuperblock::parse(&b, img.bs, jb.len() as u64).unwrap();
    (js, jb)
}

pub fn snapshot(d: &dyn BlockDevice) -> Vec<u8> {
    let mut v = vec![0u8; d.size() as usize];
    d.read_at(0, &mut v).unwrap();
    v
}
