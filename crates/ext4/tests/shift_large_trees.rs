//! INSERT_RANGE and COLLAPSE_RANGE on a file whose extent tree has more
//! blocks than a transaction holds: on an image with the smallest journal
//! (1024 blocks of 1 KiB), a file of 90,000 one-block extents (~1,070
//! leaves). One handle could not rewrite that tree; the kernel's ext4
//! shifts such a tree a leaf per credit check, and so does scalevfs now
//! (`shift_step`): the insert splits and grows the size in one handle,
//! then moves the leaves from the last one down; the collapse punches the
//! range, moves the leaves from the range up, then shrinks the size.
//! Before, the insert failed with ENOSPC (and earlier still the commit
//! found the transaction larger than the log and the mount stopped
//! writing). Checked: every sampled block where it must be, holes still
//! holes, the mount still writing, `e2fsck -fn` clean, and a remount and
//! the kernel's own ext4 read the same blocks.

mod common;

use std::os::unix::fs::FileExt;
use std::process::Command;

use common::{fsck_clean, have_tools, mkfs, rw_journaled, KMount, Scratch};
use scalevfs::io::{FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE};
use scalevfs::{Task, Vfs, O_CREAT, O_RDONLY, O_RDWR};
use scalevfs_ext4::Ext4;

const BS: u64 = 1024;
/// One-block extents of /f (data in every other block).
const EXTENTS: u64 = 90_000;
/// Where the data blocks sampled are, by extent number.
const SAMPLE: &[u64] = &[
    0, 1, 499, 500, 509, 510, 511, 999, 1000, 1001, 45_000, 89_998, 89_999,
];

fn block(k: u64) -> Vec<u8> {
    let mut b = vec![(k % 251) as u8 | 1; BS as usize];
    b[..8].copy_from_slice(&k.to_le_bytes());
    b
}

/// Where extent `k`'s block lies (a byte offset), after the changes so
/// far: `None` when it was collapsed away.
type Layout = dyn Fn(u64) -> Option<u64>;

fn check(read: &dyn Fn(&mut [u8], u64) -> usize, at: &Layout, what: &str) {
    for &k in SAMPLE {
        let Some(off) = at(k) else { continue };
        let mut b = vec![0u8; BS as usize];
        assert_eq!(read(&mut b, off), b.len(), "{what}: extent {k}");
        assert_eq!(b, block(k), "{what}: extent {k} at {off}");
        // The hole before it reads as zeros.
        let mut h = vec![1u8; BS as usize];
        assert_eq!(read(&mut h, off - BS), h.len(), "{what}: hole {k}");
        assert!(h.iter().all(|&x| x == 0), "{what}: hole before extent {k}");
    }
}

fn check_vfs(t: &Task, path: &str, at: &Layout, what: &str) {
    let fd = t.open(path, O_RDONLY, 0).unwrap();
    check(&|b, off| t.pread(fd, b, off as i64).unwrap(), at, what);
    t.close(fd).unwrap();
}

/// An image in `dir` with the smallest log (1024 blocks of 1 KiB) and
/// the files `names`, each of `n` one-block extents (data in every other
/// block: sparse on the host, and mke2fs -d keeps the holes).
fn sparse_image(dir: &std::path::Path, names: &[&str], n: u64) -> std::path::PathBuf {
    let src = dir.join("src");
    std::fs::create_dir(&src).unwrap();
    for name in names {
        let f = std::fs::File::create(src.join(name)).unwrap();
        for k in 0..n {
            f.write_at(&block(k), (2 * k + 1) * BS).unwrap();
        }
    }
    let img = dir.join("img");
    let out = Command::new(mkfs().unwrap())
        .args(["-q", "-F", "-b", "1024", "-J", "size=1", "-m", "0"])
        .arg("-d")
        .arg(&src)
        .arg(&img)
        .arg("200M")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mkfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&src).unwrap();
    img
}

#[test]
fn insert_and_collapse_shift_a_tree_larger_than_the_log_leaf_by_leaf() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("shiftbig");
    let img = sparse_image(&s.0, &["f"], EXTENTS);
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fd = t.open("/f", O_RDWR, 0).unwrap();
    let size = t.fstat(fd).unwrap().size;
    assert_eq!(size, 2 * EXTENTS * BS);
    let orig = |k: u64| Some((2 * k + 1) * BS);

    // Insert 3 blocks at block 2000 (extent 1000's hole).
    t.fallocate(
        fd,
        FALLOC_FL_INSERT_RANGE,
        (2000 * BS) as i64,
        (3 * BS) as i64,
    )
    .unwrap();
    assert_eq!(t.fstat(fd).unwrap().size, size + 3 * BS);
    let inserted = |k: u64| Some((2 * k + 1 + if k >= 1000 { 3 } else { 0 }) * BS);
    check_vfs(&t, "/f", &inserted, "after the insert");

    // Collapse them again: the file as it was.
    t.fallocate(
        fd,
        FALLOC_FL_COLLAPSE_RANGE,
        (2000 * BS) as i64,
        (3 * BS) as i64,
    )
    .unwrap();
    assert_eq!(t.fstat(fd).unwrap().size, size);
    check_vfs(&t, "/f", &orig, "after the collapse back");

    // Collapse 20 blocks holding extents 500..510: the rest moves down.
    t.fallocate(
        fd,
        FALLOC_FL_COLLAPSE_RANGE,
        (1000 * BS) as i64,
        (20 * BS) as i64,
    )
    .unwrap();
    assert_eq!(t.fstat(fd).unwrap().size, size - 20 * BS);
    let collapsed = |k: u64| match k {
        500..510 => None,
        _ if k >= 510 => Some((2 * k + 1 - 20) * BS),
        _ => Some((2 * k + 1) * BS),
    };
    check_vfs(&t, "/f", &collapsed, "after the collapse of data");
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();

    // The mount still writes: a new file, and an insert on a small tree.
    let g = t.open("/g", O_CREAT | O_RDWR, 0o644).unwrap();
    t.pwrite(g, &[7u8; 4 * BS as usize], 0).unwrap();
    t.fallocate(g, FALLOC_FL_INSERT_RANGE, BS as i64, BS as i64)
        .unwrap();
    t.fsync(g).unwrap();
    assert_eq!(t.fstat(g).unwrap().size, 5 * BS);
    t.close(g).unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);

    // A remount reads the same.
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    check_vfs(&t, "/f", &collapsed, "after a remount");
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);

    // And so does the kernel's ext4.
    if let Some(m) = KMount::new(&img, &s.0.join("mnt")) {
        let f = std::fs::File::open(m.0.join("f")).unwrap();
        assert_eq!(f.metadata().unwrap().len(), size - 20 * BS);
        check(
            &|b, off| f.read_at(b, off).unwrap(),
            &collapsed,
            "the kernel's read",
        );
    }
}

/// A truncate to 0 and an unlink of files whose trees are too large for
/// one transaction to rewrite (70,000 one-block extents each, past the
/// ~67,000 a 1 MiB log's handle can rewrite): the frees go leaf by leaf,
/// a handle per step. Before, each step chose to rewrite the whole tree,
/// which the log could not take: the truncate and the unlink failed with
/// ENOSPC and the blocks stayed (review, stop 48).
#[test]
fn truncate_and_unlink_a_tree_larger_than_the_log() {
    if !have_tools() {
        return;
    }
    const N: u64 = 70_000;
    let s = Scratch::new("dropbig");
    let img = sparse_image(&s.0, &["f", "g"], N);
    let free_before = common::sb_field(&img, "Free blocks");
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    {
        let vfs = Vfs::with_root_fs(Default::default(), e.clone());
        let t = vfs.root_task();
        t.truncate("/f", 0).unwrap();
        assert_eq!(t.stat("/f").unwrap().blocks, 0);
        t.unlink("/g").unwrap();
        // Still writing.
        let fd = t.open("/h", O_CREAT | O_RDWR, 0o644).unwrap();
        assert_eq!(t.pwrite(fd, &block(1), 0), Ok(BS as usize));
        t.close(fd).unwrap();
    }
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
    let free_after: u64 = common::sb_field(&img, "Free blocks").parse().unwrap();
    let before: u64 = free_before.parse().unwrap();
    // Both files' data and trees came back (less /h's one block).
    assert!(free_after >= before + 2 * N, "{before} -> {free_after}");
}
