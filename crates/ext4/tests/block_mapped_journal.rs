//! Block-mapped (ext2/3-style) files: one large write into a block-mapped file on an ext3 image with
//! the smallest journal (1 KiB blocks, -J size=1: 1024 log blocks). Every
//! 256 data blocks need a new indirect block, each of them a journaled
//! metadata block, which `write_mapped` counts against its step (it
//! counted groups only: the commit overflowed the log and the filesystem
//! stopped writing; from a review, stop 39).

mod common;

use common::*;

#[test]
fn one_big_write_into_a_block_mapped_file_fits_the_smallest_journal() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("blockmap-bigwrite");
    let img = s.0.join("img");
    mkfs_args(&img, &["-t", "ext3", "-b", "1024", "-J", "size=1"], "512M");
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t
        .open("/f", scalevfs::O_CREAT | scalevfs::O_RDWR, 0o644)
        .unwrap();
    let n = 300usize << 20;
    let buf: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    let r = t.pwrite(fd, &buf, 0);
    assert_eq!(r, Ok(n), "one pwrite of 300 MiB");
    t.fsync(fd).expect("fsync after the big write");
    let mut back = vec![0u8; 1 << 20];
    for k in [0usize, 77, 299] {
        assert_eq!(t.pread(fd, &mut back, (k << 20) as i64), Ok(1 << 20));
        assert!(back == buf[k << 20..(k + 1) << 20], "MiB {k} reads back");
    }
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
}

/// A punch of most of a 150 MiB block-mapped file in one call, on the
/// smallest journal: a step per handle.
#[test]
fn a_long_punch_of_a_block_mapped_file_on_the_smallest_journal() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("blockmap-bigpunch");
    let img = s.0.join("img");
    mkfs_args(&img, &["-t", "ext3", "-b", "1024", "-J", "size=1"], "256M");
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t
        .open("/f", scalevfs::O_CREAT | scalevfs::O_RDWR, 0o644)
        .unwrap();
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
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
}

/// Control: the same write into an extent file (ext4, same journal).
#[test]
fn control_the_same_big_write_into_an_extent_file() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("blockmap-bigwrite-ext4");
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "1024", "-J", "size=1"], "512M");
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t
        .open("/f", scalevfs::O_CREAT | scalevfs::O_RDWR, 0o644)
        .unwrap();
    let n = 300usize << 20;
    let buf: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    assert_eq!(t.pwrite(fd, &buf, 0), Ok(n));
    t.fsync(fd).expect("fsync after the big write");
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
}
