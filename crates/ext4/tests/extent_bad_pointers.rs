//! Files whose extents, extent index entries or block map pointers name
//! filesystem metadata (an inode table block here), as the kernel's
//! `ext4_inode_block_valid` refuses them: reading, writing, truncating and
//! unlinking such a file is EUCLEAN, and the metadata it points at is
//! neither written nor freed (another file's inode in that block still
//! reads back, and e2fsck finds no block marked free that is in use). An
//! extent tree naming one block twice, and a directory whose size is
//! short of its mapped blocks, are EUCLEAN too instead of gathering the
//! shared blocks again and again or mapping one block twice. From a
//! review (stop 48); the pointer and directory cases failed before. The
//! small tree naming a block twice was refused before too, but only
//! after gathering the block once per name (a few blocks naming each
//! other could stand for billions of extents); it keeps the refusal.

mod common;

use std::path::Path;

use scalevfs::fs::Fs;
use scalevfs::{Errno, O_RDWR};

use common::*;

/// The inode table block holding inode `ino`.
fn itable_block_of(img: &Path, ino: u32) -> u64 {
    num_after(
        &debugfs_ro(img, &format!("imap <{ino}>")),
        "located at block",
    )
}

/// The image as its journal leaves it (a refused change may have stopped
/// writes, leaving the log to replay): a copy, replayed by e2fsck.
fn replayed(img: &Path) -> std::path::PathBuf {
    let copy = img.with_extension("replayed");
    std::fs::copy(img, &copy).unwrap();
    let out = std::process::Command::new(tool("e2fsck"))
        .args(["-y", "-E", "journal_only"])
        .arg(&copy)
        .output()
        .unwrap();
    assert!(
        out.status.code().unwrap_or(8) < 4,
        "journal replay: {out:?}"
    );
    copy
}

/// e2fsck -fn must not find blocks in use that are marked free (what a
/// free of metadata leaves, "+(34--35)"); the bad file's own complaints
/// (its blocks shared with metadata, its old blocks now unclaimed) are
/// expected.
fn nothing_freed(img: &Path) {
    let (_, text) = e2fsck(img, "-fn");
    let diff = text
        .lines()
        .find(|l| l.starts_with("Block bitmap differences"))
        .unwrap_or("");
    assert!(!diff.contains('+'), "a metadata block was freed:\n{text}");
}

/// An image with `/f` (two blocks of data, `block_mapped`: made without
/// extents) and `/g` (a small file whose inode lies in the table block
/// `/f` is then pointed at).
fn image(dir: &Path, extents: bool) -> (std::path::PathBuf, u32) {
    let img = dir.join("img");
    let feats = if extents {
        "orphan_file"
    } else {
        "^extent,^64bit"
    };
    mkfs_args(&img, &["-b", "4096", "-O", feats], "8M");
    let (e, vfs) = mount(&img);
    {
        let fs = Fs::new(vfs.root_task());
        fs.write("/f", vec![7u8; 8192]).unwrap();
        fs.write("/g", b"hello g").unwrap();
    }
    unmount_clean(vfs.root_task(), vfs, e, &img);
    let g = ino_of(&img, "/g");
    let b = itable_block_of(&img, g);
    // i_block word 5 is the first extent's ee_start_lo (words 0-2 the
    // header, 3 ee_block, 4 ee_len and ee_start_hi); word 0 is the first
    // direct pointer of a block map.
    let word = if extents { 5 } else { 0 };
    assert!(debugfs(&img, &format!("sif /f block[{word}] {b}")));
    (img, g)
}

fn bad_data_pointer(extents: bool) {
    if !have_tools() {
        return;
    }
    let s = Scratch::new(if extents { "badext" } else { "badmap" });
    let (img, _) = image(&s.0, extents);
    let (e, vfs) = mount(&img);
    {
        let t = vfs.root_task();
        let fd = t.open("/f", O_RDWR, 0).unwrap();
        let mut b = [0u8; 100];
        assert_eq!(t.pread(fd, &mut b, 0), Err(Errno::EUCLEAN), "read");
        assert_eq!(t.pwrite(fd, &[1u8; 100], 0), Err(Errno::EUCLEAN), "write");
        let _ = t.close(fd);
        assert_eq!(t.truncate("/f", 0), Err(Errno::EUCLEAN), "truncate");
        // Unlinking may succeed (the name goes) or fail; the blocks stay.
        let _ = t.unlink("/f");
    }
    let _ = e.unmount();
    drop(vfs);
    drop(e);
    let img = replayed(&img);
    assert_eq!(debugfs_ro(&img, "cat /g"), "hello g", "/g's inode");
    nothing_freed(&img);
}

#[test]
fn extent_into_an_inode_table_is_euclean() {
    bad_data_pointer(true);
}

#[test]
fn block_pointer_into_an_inode_table_is_euclean() {
    bad_data_pointer(false);
}

/// A depth-1 tree whose root names its one leaf twice (a second index
/// entry, later in the file, pointing at the same block).
#[test]
fn extent_tree_naming_a_block_twice_is_euclean() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("twice");
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "4096"], "8M");
    let (e, vfs) = mount(&img);
    {
        let t = vfs.root_task();
        // Five separate runs: more extents than the inode holds, so the
        // tree gets a leaf block (depth 1).
        let fd = t
            .open("/f", scalevfs::O_CREAT | scalevfs::O_WRONLY, 0o644)
            .unwrap();
        for k in 0..5i64 {
            t.pwrite(fd, &[1u8; 4096], k * 8192).unwrap();
        }
        t.close(fd).unwrap();
    }
    unmount_clean(vfs.root_task(), vfs, e, &img);
    let st = debugfs_ro(&img, "stat /f");
    assert!(st.contains("(0-1)") || st.contains("ETB"), "{st}");
    // Root: 2 entries (word 0: magic 0xf30a, entries << 16), the second
    // (words 6-8) at logical 100000 naming the first's leaf (word 4).
    // The root's line: "0/ 1 1/ 1 0 - 8 LEAF 9".
    let ex = debugfs_ro(&img, "ex /f");
    let leaf: u64 = ex
        .lines()
        .find(|l| l.trim_start().starts_with("0/ 1"))
        .and_then(|l| l.split_whitespace().nth(7)?.parse().ok())
        .unwrap_or_else(|| panic!("no index line in {ex}"));
    assert!(debugfs(
        &img,
        &format!("sif /f block[0] {}", 0xf30a | (2 << 16))
    ));
    assert!(debugfs(&img, "sif /f block[6] 100000"));
    assert!(debugfs(&img, &format!("sif /f block[7] {leaf}")));
    let (e, vfs) = mount(&img);
    {
        let t = vfs.root_task();
        assert_eq!(t.truncate("/f", 0), Err(Errno::EUCLEAN), "truncate");
    }
    let _ = e.unmount();
    drop(vfs);
    drop(e);
    nothing_freed(&replayed(&img));
}

/// A directory whose size (one block) is short of its mapped blocks
/// (two): a create that needs a new block must not map the second
/// logical block again.
#[test]
fn directory_size_short_of_its_blocks_is_euclean() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("dirshort");
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "1024", "-O", "^dir_index"], "8M");
    let (e, vfs) = mount(&img);
    {
        let fs = Fs::new(vfs.root_task());
        fs.create_dir("/d").unwrap();
        for i in 0..60 {
            fs.write(format!("/d/{i:040}"), b"").unwrap();
        }
    }
    unmount_clean(vfs.root_task(), vfs, e, &img);
    let st = debugfs_ro(&img, "stat /d");
    assert!(num_after(&st, "Size:") >= 2048, "{st}");
    assert!(debugfs(&img, "sif /d size 1024"));
    let (e, vfs) = mount(&img);
    let mut hit = None;
    {
        let fs = Fs::new(vfs.root_task());
        for i in 0..60 {
            if let Err(x) = fs.write(format!("/d/new{i:037}"), b"") {
                hit = Some(x.raw_os_error());
                break;
            }
        }
    }
    let _ = e.unmount();
    drop(vfs);
    drop(e);
    assert_eq!(
        hit,
        Some(Some(libc::EUCLEAN)),
        "a create past the short size"
    );
    // No two extents cover one logical block.
    let ex = debugfs_ro(&replayed(&img), "ex /d");
    let mut ranges: Vec<(u64, u64)> = ex
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.get(4)?.parse().ok()?, f.get(6)?.parse().ok()?))
        })
        .collect();
    ranges.sort_unstable();
    assert!(
        ranges.windows(2).all(|w| w[0].1 < w[1].0),
        "a logical block mapped twice:\n{ex}"
    );
}

/// An extent naming a block of the orphan file is EUCLEAN too, as one
/// naming the journal (the orphan file's blocks joined the metadata zone,
/// review stop 49): before, a write through it went over orphan slots.
#[test]
fn extent_into_the_orphan_file_is_euclean() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("badorphan");
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "4096", "-O", "orphan_file"], "8M");
    let (e, vfs) = mount(&img);
    Fs::new(vfs.root_task())
        .write("/f", vec![7u8; 8192])
        .unwrap();
    unmount_clean(vfs.root_task(), vfs, e, &img);
    let orphan_ino = sb_field(&img, "Orphan file inode");
    let b: u64 = debugfs_ro(&img, &format!("bmap <{orphan_ino}> 0"))
        .trim()
        .parse()
        .unwrap();
    assert!(b > 0);
    assert!(debugfs(&img, &format!("sif /f block[5] {b}")));
    let before = std::fs::read(&img).unwrap();
    let (e, vfs) = mount(&img);
    {
        let t = vfs.root_task();
        let fd = t.open("/f", O_RDWR, 0).unwrap();
        let mut buf = [0u8; 100];
        assert_eq!(t.pread(fd, &mut buf, 0), Err(Errno::EUCLEAN), "read");
        assert_eq!(t.pwrite(fd, &[1u8; 100], 0), Err(Errno::EUCLEAN), "write");
        let _ = t.close(fd);
    }
    let _ = e.unmount();
    drop(vfs);
    drop(e);
    let after = std::fs::read(&img).unwrap();
    let bs = 4096usize;
    let at = b as usize * bs;
    assert!(
        after[at..at + bs] == before[at..at + bs],
        "the orphan file's block was written"
    );
}
