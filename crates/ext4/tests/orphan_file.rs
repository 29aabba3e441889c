//! The orphan file as a read-write journaled mount reads it (issue 15):
//! - a block with a bad checksum or magic stops the mount before anything
//!   is written (the image stays byte-identical);
//! - slots filled with arbitrary inode numbers (with a valid checksum):
//!   the mount either refuses with an error (a number out of range or
//!   reserved, an in-use inode that does not read back) or frees what is an
//!   unlinked inode and clears the rest (inodes not in use, live ones), and
//!   after unmount `e2fsck -fn` passes — never a panic;
//! - an inode unlinked while open and left by a "crash" (the image copied
//!   while mounted, after a commit) is freed by the next mount, as e2fsck
//!   would.

mod common;

use std::path::Path;
use std::process::Command;

use common::{fresh, fsck_clean, have_tools, rw_journaled, sb_field, Scratch};
use scalevfs_ext4::format::checksum::crc32c;
use scalevfs_ext4::format::superblock::Superblock;
use scalevfs_ext4::Ext4;

/// Physical blocks of the orphan file (debugfs), and its inode number.
fn orphan_blocks(img: &Path) -> (u32, Vec<u64>) {
    let ino: u32 = sb_field(img, "Orphan file inode").parse().unwrap();
    let out = Command::new(common::tool("debugfs"))
        .args(["-R", &format!("blocks <{ino}>")])
        .arg(img)
        .output()
        .unwrap();
    let blocks = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    (ino, blocks)
}

/// Rewrite the tail checksum of orphan block `pblk` in `image`.
fn fix_tail(image: &mut [u8], bs: usize, pblk: u64, orphan_ino: u32) {
    let sb = Superblock::parse(&image[1024..2048]).unwrap();
    let off = pblk as usize * bs;
    // The orphan file's generation (mke2fs leaves it 0; checked below).
    let s = crc32c(sb.csum_seed(), &orphan_ino.to_le_bytes());
    let s = crc32c(s, &0u32.to_le_bytes());
    let c = crc32c(s, &pblk.to_le_bytes());
    let c = crc32c(c, &image[off..off + bs - 8]);
    image[off + bs - 4..off + bs].copy_from_slice(&c.to_le_bytes());
}

#[test]
fn a_bad_orphan_block_stops_the_mount_before_any_write() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("orphanbad");
    let bs = 4096;
    let img = fresh(&s.0, bs, "16M");
    let (_, blocks) = orphan_blocks(&img);
    assert!(!blocks.is_empty());
    let base = std::fs::read(&img).unwrap();
    for (what, at) in [
        ("a slot byte (checksum)", 17usize),
        ("the magic", bs - 7),
        ("the checksum", bs - 2),
    ] {
        let mut bad = base.clone();
        bad[blocks[0] as usize * bs + at] ^= 0x5A;
        std::fs::write(&img, &bad).unwrap();
        let e = Ext4::open(&img, rw_journaled()).err();
        let msg = format!("{e:?}");
        assert!(msg.contains("orphan file"), "{what}: {msg}");
        assert!(std::fs::read(&img).unwrap() == bad, "{what}: image written");
    }
}

#[test]
fn arbitrary_slots_are_refused_or_cleared() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("orphanfuzz");
    let bs = 4096;
    let img = fresh(&s.0, bs, "16M");
    let (oino, blocks) = orphan_blocks(&img);
    let base = std::fs::read(&img).unwrap();
    let inodes: u32 = sb_field(&img, "Inode count").parse().unwrap();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut ok, mut refused) = (0, 0);
    for round in 0..24 {
        let mut im = base.clone();
        let b = blocks[(next() as usize) % blocks.len()];
        for _ in 0..1 + next() % 6 {
            let slot = (next() as usize) % ((bs - 8) / 4);
            let ino = match next() % 4 {
                0 => (next() % u64::from(inodes + 20)) as u32, // anything, some out of range
                1 => 2 + (next() % 12) as u32,                 // reserved and early inodes
                2 => oino,                                     // the orphan file itself
                _ => 11 + (next() % 40) as u32,                // lost+found and unused ones
            };
            let off = b as usize * bs + slot * 4;
            im[off..off + 4].copy_from_slice(&ino.to_le_bytes());
        }
        fix_tail(&mut im, bs, b, oino);
        std::fs::write(&img, &im).unwrap();
        match Ext4::open(&img, rw_journaled()) {
            Ok(e) => {
                e.unmount().unwrap();
                drop(e);
                fsck_clean(&img);
                ok += 1;
            }
            Err(err) => {
                assert!(
                    format!("{err:?}").contains("orphan"),
                    "round {round}: {err:?}"
                );
                assert!(
                    std::fs::read(&img).unwrap() == im,
                    "round {round}: image written"
                );
                refused += 1;
            }
        }
    }
    eprintln!("orphan slots: {ok} mounted and cleaned (e2fsck clean), {refused} refused");
    assert!(ok > 0 && refused > 0);
}

/// Run `debugfs -w -R cmd` on `img`.
fn debugfs_w(img: &Path, cmd: &str) {
    let st = Command::new(common::tool("debugfs"))
        .args(["-w", "-R", cmd])
        .arg(img)
        .output()
        .unwrap();
    assert!(st.status.success(), "debugfs {cmd}: {st:?}");
}

/// The orphan file listing itself, with no link left (review, stop 51):
/// recovery took it for an unlinked orphan and freed it, handing its
/// blocks out while the mount kept writing records into them. The
/// kernel's iget refuses the filesystem's own inodes; so does the mount
/// now, before it writes anything.
#[test]
fn the_orphan_file_listing_itself_is_refused() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("orphanself");
    let bs = 4096;
    let img = fresh(&s.0, bs, "16M");
    let (oino, blocks) = orphan_blocks(&img);
    debugfs_w(&img, &format!("sif <{oino}> links_count 0"));
    let mut im = std::fs::read(&img).unwrap();
    let off = blocks[0] as usize * bs + 8;
    im[off..off + 4].copy_from_slice(&oino.to_le_bytes());
    fix_tail(&mut im, bs, blocks[0], oino);
    std::fs::write(&img, &im).unwrap();
    let e = Ext4::open(&img, rw_journaled()).err();
    let msg = format!("{e:?}");
    assert!(msg.contains(&format!("lists inode {oino}")), "{msg}");
    assert!(std::fs::read(&img).unwrap() == im, "image written");
}

/// An orphan file whose map names one block twice (logical 0 and 1):
/// two slots would share a disk word, one record overwriting the other
/// (a crash then leaks an inode). Refused at mount, image untouched.
#[test]
fn an_orphan_file_mapping_a_block_twice_is_refused() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("orphandup");
    let img = fresh(&s.0, 4096, "16M");
    let (oino, blocks) = orphan_blocks(&img);
    let n = blocks.len() as u64;
    assert!(n >= 2 && blocks.windows(2).all(|w| w[1] == w[0] + 1));
    // One extent (0-(n-1)) made two: (0) at the first block, (1-(n-1))
    // starting at the same block. i_block words: header (magic, entries),
    // then 3 words per extent (first logical, length, start).
    for cmd in [
        "block[0] 0x0002F30A".to_string(),
        "block[4] 1".to_string(),
        "block[6] 1".to_string(),
        format!("block[7] {}", n - 1),
        format!("block[8] {}", blocks[0]),
    ] {
        debugfs_w(&img, &format!("sif <{oino}> {cmd}"));
    }
    let before = std::fs::read(&img).unwrap();
    let e = Ext4::open(&img, rw_journaled()).err();
    let msg = format!("{e:?}");
    assert!(msg.contains("mapped twice"), "{msg}");
    assert!(std::fs::read(&img).unwrap() == before, "image written");
}

#[test]
fn an_open_unlinked_file_left_by_a_crash_is_freed_at_mount() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("orphancrash");
    let img = fresh(&s.0, 4096, "16M");
    let free0: u64 = sb_field(&img, "Free blocks").parse().unwrap();
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = scalevfs::Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fd = t
        .open("/big", scalevfs::O_CREAT | scalevfs::O_RDWR, 0o644)
        .unwrap();
    t.write(fd, &vec![7u8; 1 << 20]).unwrap();
    t.unlink("/big").unwrap();
    t.fsync(fd).unwrap();
    // The "crash": the image as it is now (journal committed, the inode
    // unlinked but open, listed in the orphan file).
    let crashed = s.0.join("crashed");
    std::fs::copy(&img, &crashed).unwrap();
    t.close(fd).unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    // Our mount frees it.
    let e = Ext4::open(&crashed, rw_journaled()).unwrap();
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&crashed);
    let free1: u64 = sb_field(&crashed, "Free blocks").parse().unwrap();
    assert_eq!(free1, free0, "the orphan's 1 MiB came back");
}

/// An unlinked inode listed in the orphan file whose `i_dtime` is not 0
/// (an image another implementation wrote, or a crafted one) is freed at
/// mount as the kernel (`ext4_orphan_get` accepts a link count of 0 while
/// processing orphans, whatever the dtime) and e2fsck do. It used to be
/// skipped and only its slot cleared: the inode stayed in use with no name
/// and its blocks allocated, which e2fsck then reports.
#[test]
fn an_orphan_with_a_dtime_is_freed_at_mount() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("orphandtime");
    let bs = 4096;
    let img = fresh(&s.0, bs, "16M");
    let free0: u64 = sb_field(&img, "Free blocks").parse().unwrap();
    let host = s.0.join("data");
    std::fs::write(&host, vec![7u8; 1 << 20]).unwrap();
    assert!(common::debugfs(
        &img,
        &format!("write {} f", host.display())
    ));
    let ino = common::ino_of(&img, "f");
    assert!(common::debugfs(&img, "unlink f"));
    assert!(common::debugfs(&img, &format!("sif <{ino}> links_count 0")));
    assert!(common::debugfs(&img, &format!("sif <{ino}> dtime 12345")));
    assert!(common::debugfs(&img, "feature orphan_present"));
    let (oino, blocks) = orphan_blocks(&img);
    let mut im = std::fs::read(&img).unwrap();
    let off = blocks[0] as usize * bs;
    im[off..off + 4].copy_from_slice(&ino.to_le_bytes());
    fix_tail(&mut im, bs, blocks[0], oino);
    std::fs::write(&img, &im).unwrap();
    // The referee: e2fsck frees it.
    let referee = s.0.join("referee");
    std::fs::copy(&img, &referee).unwrap();
    let (code, text) = common::e2fsck(&referee, "-fy");
    assert!(code <= 1, "e2fsck -fy exit {code}: {text}");
    let want: u64 = sb_field(&referee, "Free blocks").parse().unwrap();
    assert_eq!(want, free0, "the referee gave the 1 MiB back");
    // Our mount does the same.
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
    let free1: u64 = sb_field(&img, "Free blocks").parse().unwrap();
    assert_eq!(free1, free0, "the orphan's 1 MiB came back");
}
