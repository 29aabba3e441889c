//! Block-mapped (ext2/3-style) files: one large write into a block-mapped file on an ext3 image with
//! the smallest journal (1 KiB blocks, -J size=1: 1024 log blocks). Every
//! 256 data blocks need a new indirect block, each of them a journaled
//! metadata block, which `write_mapped` counts against its step (it
//! counted groups only: the commit overflowed the log and the filesystem
//! stopped writing; from a review, stop 39).

mod common;

use common::*;
use scalevfs::Task;

/// A fresh image made with `mkfs` (of `size`), mounted; `body` runs on a
/// new file /f (open read-write), which is closed afterwards, and the
/// image must unmount clean.
fn on_new_file(tag: &str, mkfs: &[&str], size: &str, body: impl FnOnce(&Task, i32)) {
    if !have_tools() {
        return;
    }
    let s = Scratch::new(tag);
    let img = s.0.join("img");
    mkfs_args(&img, mkfs, size);
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t
        .open("/f", scalevfs::O_CREAT | scalevfs::O_RDWR, 0o644)
        .unwrap();
    body(&t, fd);
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
}

/// One pwrite of 300 MiB at 0, then fsync; the bytes written.
fn big_write(t: &Task, fd: i32) -> Vec<u8> {
    let n = 300usize << 20;
    let buf: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    assert_eq!(t.pwrite(fd, &buf, 0), Ok(n), "one pwrite of 300 MiB");
    t.fsync(fd).expect("fsync after the big write");
    buf
}

#[test]
fn one_big_write_into_a_block_mapped_file_fits_the_smallest_journal() {
    on_new_file(
        "blockmap-bigwrite",
        &["-t", "ext3", "-b", "1024", "-J", "size=1"],
        "512M",
        |t, fd| {
            let buf = big_write(t, fd);
            let mut back = vec![0u8; 1 << 20];
            for k in [0usize, 77, 299] {
                assert_eq!(t.pread(fd, &mut back, (k << 20) as i64), Ok(1 << 20));
                assert!(back == buf[k << 20..(k + 1) << 20], "MiB {k} reads back");
            }
        },
    );
}

/// A punch of most of a 150 MiB block-mapped file in one call, on the
/// smallest journal: a step per handle.
#[test]
fn a_long_punch_of_a_block_mapped_file_on_the_smallest_journal() {
    on_new_file(
        "blockmap-bigpunch",
        &["-t", "ext3", "-b", "1024", "-J", "size=1"],
        "256M",
        |t, fd| {
            let mb = vec![0x5au8; 1 << 20];
            for k in 0..150i64 {
                assert_eq!(t.pwrite(fd, &mb, k << 20), Ok(1 << 20));
            }
            t.fsync(fd).unwrap();
            let punch = scalevfs::io::FALLOC_FL_PUNCH_HOLE | scalevfs::io::FALLOC_FL_KEEP_SIZE;
            t.fallocate(fd, punch, (1 << 20) + 5, (148 << 20) - 10)
                .expect("long punch");
            t.fsync(fd).expect("fsync after the punch");
            let mut b = vec![0u8; 16];
            assert_eq!(t.pread(fd, &mut b, (1 << 20) + 3), Ok(16));
            assert_eq!(&b[..2], &[0x5a, 0x5a]);
            assert!(b[2..].iter().all(|&c| c == 0));
        },
    );
}

/// Control: the same write into an extent file (ext4, same journal).
#[test]
fn control_the_same_big_write_into_an_extent_file() {
    on_new_file(
        "blockmap-bigwrite-ext4",
        &["-b", "1024", "-J", "size=1"],
        "512M",
        |t, fd| {
            big_write(t, fd);
        },
    );
}
