//! INSERT_RANGE must not shift an extent past the last logical block
//! (2^32 - 1): EINVAL, as the kernel's ext4_ext_shift_extents, which
//! checks the last extent after the split at the insert's offset. The
//! stepped path (`insert_prepare`, a tree shifted a leaf per handle)
//! checked the last extent before the split and only when it started at
//! or past the offset, so a last extent holding the offset (a
//! preallocated tail over EOF) was split and its upper half shifted past
//! the limit; and a tree in the inode (forced stepped) was not checked at
//! all. Checked on both paths: EINVAL, the block map as before, the mount
//! still writing and e2fsck clean.

mod common;

use std::collections::BTreeMap;

use common::*;
use scalevfs::io::{FALLOC_FL_INSERT_RANGE, FALLOC_FL_KEEP_SIZE};
use scalevfs::{Errno, Task, O_CREAT, O_RDWR};

const BS: u64 = 1024;
const M: u64 = 1 << 32;

fn map_of(t: &Task, fd: i32) -> BTreeMap<u64, (u64, u64, u32)> {
    t.fiemap(fd, 0, u64::MAX, 0)
        .unwrap()
        .into_iter()
        .map(|x| (x.logical, (x.physical, x.length, x.flags)))
        .collect()
}

/// `extents` one-block extents at the start of the file (5 or more: a
/// tree with a leaf), the size near the limit, a preallocated tail over
/// EOF up to two blocks below the limit, then an insert at `at` (a block
/// below EOF) of `k` blocks.
fn case(extents: u64, stepped: bool, at: u64, k: u64, label: &str) {
    if !have_tools() {
        return;
    }
    let s = Scratch::new(&format!("insert-limit-{label}"));
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "1024", "-m", "0"], "16M");
    let (e, vfs) = mount(&img);
    e.set_stepped_shifts(stepped);
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    for i in 0..extents {
        t.pwrite(fd, &[7u8; BS as usize], (2 * i * BS) as i64)
            .unwrap();
    }
    t.ftruncate(fd, ((M - 100) * BS) as i64).unwrap();
    t.fallocate(
        fd,
        FALLOC_FL_KEEP_SIZE,
        ((M - 200) * BS) as i64,
        (198 * BS) as i64,
    )
    .unwrap();
    let before = map_of(&t, fd);
    let size = t.fstat(fd).unwrap().size;
    assert_eq!(
        t.fallocate(
            fd,
            FALLOC_FL_INSERT_RANGE,
            (at * BS) as i64,
            (k * BS) as i64
        ),
        Err(Errno::EINVAL),
        "{label}"
    );
    let after = map_of(&t, fd);
    // Each block where it was (the split itself may stay, as in the
    // kernel: compare block by block).
    let blocks = |m: &BTreeMap<u64, (u64, u64, u32)>| -> Vec<(u64, u64)> {
        m.iter()
            .flat_map(|(&l, &(p, n, _))| (0..n / BS).map(move |i| (l / BS + i, p / BS + i)))
            .collect()
    };
    assert_eq!(blocks(&after), blocks(&before), "{label}: the map changed");
    assert!(t.fstat(fd).unwrap().size >= size, "{label}");
    // Still writing.
    assert_eq!(t.pwrite(fd, &[9u8; 10], 5), Ok(10));
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
    fsck_clean(&img);
}

#[test]
fn insert_into_a_tail_extent_reaching_the_limit_is_einval_one_handle() {
    case(8, false, M - 150, 10, "one-handle");
}

#[test]
fn insert_into_a_tail_extent_reaching_the_limit_is_einval_stepped() {
    case(8, true, M - 150, 10, "stepped");
}

#[test]
fn insert_below_a_tail_extent_reaching_the_limit_is_einval_in_an_inode_tree_stepped() {
    case(1, true, 4, 10, "stepped-inode");
}
