//! Orphans that are ext2/3-style (block-mapped) files, on an image that
//! got the extent feature later (`tune2fs -O extent`), left by a crash:
//! - a truncate cut short (links left, the size stored, the blocks past
//!   it not yet freed) is finished at mount, as e2fsck and the kernel do
//!   (it used to be dropped from the list with its blocks kept, so
//!   e2fsck then found "i_size is 10240, should be 102400");
//! - an unlinked one whose block map is corrupt stops the mount before it
//!   writes anything (the map used to be read only when freeing it, after
//!   the mount had written its superblock and journal).

mod common;

use common::*;
use scalevfs::O_RDONLY;
use scalevfs_ext4::Ext4;

/// A 16 MiB, 1 KiB-block image without extents or `orphan_file`, /f written by debugfs from `len` bytes of 0x5a (block-
/// mapped), then the extent feature turned on. Returns (image, /f's inode).
fn ext3_style(s: &Scratch, len: usize) -> (std::path::PathBuf, u32) {
    let img = s.0.join("img");
    mkfs_args(
        &img,
        &["-b", "1024", "-O", "^extent,^64bit,^orphan_file"],
        "16M",
    );
    let host = s.0.join("data");
    std::fs::write(&host, vec![0x5au8; len]).unwrap();
    assert!(debugfs(&img, &format!("write {} f", host.display())));
    tool_ok("tune2fs", &["-O", "extent"], &img);
    let ino = ino_of(&img, "f");
    (img, ino)
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
