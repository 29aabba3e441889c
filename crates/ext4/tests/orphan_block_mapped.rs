//! Orphans that are ext2/3-style (block-mapped) files, on an image that
//! got the extent feature later (`tune2fs -O extent`), left by a crash:
//! - a truncate cut short (links left, the size stored, the blocks past
//!   it not yet freed) is finished at mount, as e2fsck and the kernel do
//!   (it used to be dropped from the list with its blocks kept, so
//!   e2fsck then found "i_size is 10240, should be 102400");
//! - an unlinked one whose block map is corrupt stops the mount before it
//!   writes anything (the map used to be read only when freeing it, after
//!   the mount had written its superblock and journal);
//! - the truncate is finished without allocating (the map is cut, as the
//!   kernel's `ext4_ind_truncate`): on a full filesystem it used to be
//!   turned into an extent file first, which needs a leaf block, and the
//!   mount failed with ENOSPC;
//! - a truncate, or the freeing of an unlinked file, larger than one
//!   transaction of the smallest journal goes a step per handle (it used
//!   to be one handle: the log overflowed and the filesystem stopped);
//! - the same on a live mount: a truncate keeps the file block-mapped and
//!   cuts its map (it used to map the file by extents first: ENOSPC on a
//!   full filesystem for a file of more than four runs).

mod common;

use common::*;
use scalevfs::{O_CREAT, O_RDONLY, O_RDWR};
use scalevfs_ext4::Ext4;

/// A 16 MiB, 1 KiB-block image without extents or `orphan_file`, /f written by debugfs from `len` bytes of 0x5a (block-
/// mapped), then the extent feature turned on. Returns (image, /f's inode).
fn ext3_style(s: &Scratch, len: usize) -> (std::path::PathBuf, u32) {
    ext3_style_with(s, len, &[], "16M")
}

/// `ext3_style` with more mkfs arguments and another size.
fn ext3_style_with(
    s: &Scratch,
    len: usize,
    more: &[&str],
    size: &str,
) -> (std::path::PathBuf, u32) {
    let img = s.0.join("img");
    let mut args = vec!["-b", "1024", "-O", "^extent,^64bit,^orphan_file"];
    args.extend_from_slice(more);
    mkfs_args(&img, &args, size);
    let host = s.0.join("data");
    std::fs::write(&host, vec![0x5au8; len]).unwrap();
    assert!(debugfs(&img, &format!("write {} f", host.display())));
    tool_ok("tune2fs", &["-O", "extent"], &img);
    let ino = ino_of(&img, "f");
    (img, ino)
}

/// Take every free block with /fill (fallocate, halving the step down to
/// one block), the kernel's 2% pool for splits included (set to 0).
fn fill(e: &Ext4, t: &scalevfs::Task) {
    e.set_reserved_clusters(0).unwrap();
    let fd = t.open("/fill", O_CREAT | O_RDWR, 0o644).unwrap();
    let (mut off, mut step) = (0i64, 1i64 << 20);
    while step >= 1024 {
        match t.fallocate(fd, 0, off, step) {
            Ok(()) => off += step,
            Err(_) => step /= 2,
        }
    }
    t.close(fd).unwrap();
    assert_eq!(t.statfs("/").unwrap().bfree, 0, "not full");
}

fn blockcount(img: &std::path::Path) -> u64 {
    debugfs_ro(img, "stat f")
        .split("Blockcount: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("Blockcount")
}

#[test]
fn a_cut_truncate_of_a_block_mapped_file_is_finished_at_mount() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("bmap-trunc");
    // 100 KiB, truncated to 10 KiB: the size stored, the inode on the
    // orphan list, the crash before its blocks went.
    let (img, ino) = ext3_style(&s, 100 * 1024);
    assert!(debugfs(&img, "sif f size 10240"));
    assert!(debugfs(&img, &format!("ssv last_orphan {ino}")));
    let referee = s.0.join("referee");
    std::fs::copy(&img, &referee).unwrap();
    let (code, text) = e2fsck(&referee, "-fy");
    assert!(code <= 1, "e2fsck -fy exit {code}: {text}");
    let want = blockcount(&referee);
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t.open("/f", O_RDONLY, 0).unwrap();
    assert_eq!(t.fstat(fd).unwrap().size, 10240);
    let mut b = vec![0u8; 20 * 1024];
    assert_eq!(t.read(fd, &mut b).unwrap(), 10240);
    assert!(b[..10240].iter().all(|&x| x == 0x5a));
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
    // 10 data blocks in 512-byte units, as the referee left it.
    assert_eq!(blockcount(&img), want);
    assert_eq!(want, 20);
}

#[test]
fn a_corrupt_block_map_of_an_orphan_stops_the_mount_before_any_write() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("bmap-bad");
    let (img, ino) = ext3_style(&s, 20 * 1024);
    assert!(debugfs(&img, "sif f block[IND] 99999999"));
    assert!(debugfs(&img, "unlink f"));
    assert!(debugfs(&img, &format!("sif <{ino}> links_count 0")));
    assert!(debugfs(&img, &format!("ssv last_orphan {ino}")));
    let before = std::fs::read(&img).unwrap();
    let r = Ext4::open(&img, rw_journaled());
    let err = r.as_ref().err().map(|e| e.to_string());
    if let Ok(e) = r {
        let _ = e.unmount();
    }
    let err = err.expect("the mount is refused");
    assert!(err.contains("block pointer 99999999"), "{err}");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "refused after writing"
    );
}

/// A truncate cut short, on a filesystem with no free block: finishing it
/// allocates nothing. /f (2000 KiB) is mapped through single and double
/// indirect blocks, so as extents it would need more than the four the
/// inode holds: a leaf block.
#[test]
fn a_cut_truncate_of_a_block_mapped_file_on_a_full_filesystem_is_finished() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("bmap-full");
    let (img, ino) = ext3_style_with(&s, 2000 * 1024, &["-m", "0"], "16M");
    {
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        fill(&e, &t);
        unmount_clean(t, vfs, e, &img);
    }
    assert!(debugfs(&img, "sif f size 10240"));
    assert!(debugfs(&img, &format!("ssv last_orphan {ino}")));
    let referee = s.0.join("referee");
    std::fs::copy(&img, &referee).unwrap();
    let (code, text) = e2fsck(&referee, "-fy");
    assert!(code <= 1, "e2fsck -fy exit {code}: {text}");
    let want = blockcount(&referee);
    let e = Ext4::open(&img, rw_journaled())
        .unwrap_or_else(|err| panic!("the mount finishes the truncate: {err}"));
    let vfs = scalevfs::Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fd = t.open("/f", O_RDONLY, 0).unwrap();
    assert_eq!(t.fstat(fd).unwrap().size, 10240);
    t.close(fd).unwrap();
    // The space past 10 KiB came back (free once the frees commit).
    e.commit().unwrap();
    let bfree = t.statfs("/").unwrap().bfree;
    assert!(bfree > 1900, "{bfree}");
    unmount_clean(t, vfs, e, &img);
    assert_eq!(blockcount(&img), want);
    assert_eq!(want, 20);
}

/// A block-mapped image with the smallest journal (1024 blocks of 1 KiB)
/// and 256-block groups, /f spread over ~1100 of them (280 MiB): freeing
/// it changes more bitmaps than one transaction holds.
fn big_ext3_style(s: &Scratch) -> (std::path::PathBuf, u32) {
    let img = s.0.join("img");
    mkfs_args(
        &img,
        &[
            "-b",
            "1024",
            "-g",
            "256",
            "-J",
            "size=1",
            "-m",
            "0",
            "-O",
            "^extent,^64bit,^orphan_file,^resize_inode",
        ],
        "320M",
    );
    let host = s.0.join("big");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&host).unwrap();
        let mb = vec![0x5au8; 1 << 20];
        for i in 0..280u64 {
            f.write_all_at(&mb, i << 20).unwrap();
        }
    }
    assert!(debugfs(&img, &format!("write {} f", host.display())));
    std::fs::remove_file(&host).unwrap();
    tool_ok("tune2fs", &["-O", "extent"], &img);
    assert!(
        !debugfs_ro(&img, "stat f").contains("EXTENTS"),
        "/f is block-mapped"
    );
    (img.clone(), ino_of(&img, "f"))
}

#[test]
fn a_large_cut_truncate_of_a_block_mapped_file_goes_a_step_per_handle() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("bmap-big-trunc");
    let (img, ino) = big_ext3_style(&s);
    assert!(debugfs(&img, "sif f size 10240"));
    assert!(debugfs(&img, &format!("ssv last_orphan {ino}")));
    let e = Ext4::open(&img, rw_journaled())
        .unwrap_or_else(|err| panic!("the mount finishes the truncate: {err}"));
    let commits = e.commit_stats().0;
    let vfs = scalevfs::Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fd = t.open("/f", O_RDONLY, 0).unwrap();
    assert_eq!(t.fstat(fd).unwrap().size, 10240);
    let mut b = vec![0u8; 10240];
    assert_eq!(t.read(fd, &mut b).unwrap(), 10240);
    assert!(b.iter().all(|&x| x == 0x5a));
    t.close(fd).unwrap();
    assert!(t.statfs("/").unwrap().bfree > 280 * 1024);
    e.commit().unwrap();
    let _ = commits;
    unmount_clean(t, vfs, e, &img);
    assert_eq!(blockcount(&img), 20);
}

#[test]
fn a_large_unlinked_block_mapped_file_is_freed_a_step_per_handle() {
    if !have_tools() {
        return;
    }
    // At mount (a crash after the last name went while it was open)...
    let s = Scratch::new("bmap-big-orphan");
    let (img, ino) = big_ext3_style(&s);
    let free0: u64 = sb_field(&img, "Free blocks").parse().unwrap();
    assert!(debugfs(&img, "unlink f"));
    assert!(debugfs(&img, &format!("sif <{ino}> links_count 0")));
    assert!(debugfs(&img, &format!("ssv last_orphan {ino}")));
    let e = Ext4::open(&img, rw_journaled())
        .unwrap_or_else(|err| panic!("the mount frees the orphan: {err}"));
    let vfs = scalevfs::Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    unmount_clean(t, vfs, e, &img);
    let free1: u64 = sb_field(&img, "Free blocks").parse().unwrap();
    assert!(free1 > free0 + 280 * 1024, "{free0} -> {free1}");

    // ... and on a mount: unlinked while open, then closed.
    let s = Scratch::new("bmap-big-close");
    let (img, _) = big_ext3_style(&s);
    let free0: u64 = sb_field(&img, "Free blocks").parse().unwrap();
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = scalevfs::Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fd = t.open("/f", O_RDONLY, 0).unwrap();
    t.unlink("/f").unwrap();
    e.commit().unwrap();
    t.close(fd).unwrap();
    scalevfs::flush_deferred_frees();
    // A step per commit or handle: the space comes back over a few.
    // The inode's drop is epoch-deferred: with other tests' threads
    // pinned (CI, loaded) it may come late, so flush each round and allow
    // up to ~20 s.
    for i in 0..2000 {
        scalevfs::flush_deferred_frees();
        if i >= 100 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        e.commit()
            .unwrap_or_else(|err| panic!("commit while freeing: {err}"));
        if t.statfs("/").unwrap().bfree > free0 + 280 * 1024 {
            break;
        }
        let fd = t.open("/step", O_CREAT | O_RDWR, 0o644).unwrap();
        t.close(fd).unwrap();
    }
    assert!(t.statfs("/").unwrap().bfree > free0 + 280 * 1024);
    unmount_clean(t, vfs, e, &img);
}

/// A live truncate of a fragmented block-mapped file on a full
/// filesystem: its map is cut (partial last block zeroed), nothing
/// allocated, the file stays block-mapped.
#[test]
fn truncating_a_block_mapped_file_on_a_full_filesystem_works() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("bmap-live-full");
    let (img, _) = ext3_style_with(&s, 2000 * 1024, &["-m", "0"], "16M");
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    fill(&e, &t);
    t.truncate("/f", 10_000).unwrap();
    e.commit().unwrap();
    assert!(t.statfs("/").unwrap().bfree > 1900);
    // The tail of the last block reads as zeros once the file grows.
    t.truncate("/f", 12_000).unwrap();
    let fd = t.open("/f", O_RDONLY, 0).unwrap();
    let mut b = vec![0u8; 12_000];
    assert_eq!(t.read(fd, &mut b).unwrap(), 12_000);
    assert!(b[..10_000].iter().all(|&x| x == 0x5a));
    assert!(b[10_000..].iter().all(|&x| x == 0));
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
    assert!(
        !debugfs_ro(&img, "stat f").contains("EXTENTS"),
        "still block-mapped"
    );
    // 12 data blocks (the last two holes after the growth: 10 of them).
    assert_eq!(blockcount(&img), 20);
}

/// A live truncate of a block-mapped file larger than one transaction
/// of the smallest journal: a step per handle, the inode an orphan
/// meanwhile.
#[test]
fn a_large_live_truncate_of_a_block_mapped_file_goes_a_step_per_handle() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("bmap-live-big");
    let (img, _) = big_ext3_style(&s);
    let free0: u64 = sb_field(&img, "Free blocks").parse().unwrap();
    let (e, vfs) = mount(&img);
    let commits = e.commit_stats().0;
    let t = vfs.root_task();
    t.truncate("/f", 10240)
        .unwrap_or_else(|err| panic!("truncate: {err}"));
    assert!(
        e.commit_stats().0 > commits + 1,
        "one transaction: {}",
        e.commit_stats().0 - commits
    );
    let fd = t.open("/f", O_RDONLY, 0).unwrap();
    assert_eq!(t.fstat(fd).unwrap().size, 10240);
    let mut b = vec![0u8; 10240];
    assert_eq!(t.read(fd, &mut b).unwrap(), 10240);
    assert!(b.iter().all(|&x| x == 0x5a));
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
    assert_eq!(blockcount(&img), 20);
    let free1: u64 = sb_field(&img, "Free blocks").parse().unwrap();
    assert!(free1 > free0 + 279 * 1024, "{free0} -> {free1}");
    assert!(
        !debugfs_ro(&img, "stat f").contains("EXTENTS"),
        "still block-mapped"
    );
}
