//! Writes into files whose extents fill a tree of depth 2 (1 KiB blocks:
//! 84 extents per leaf): appends, holes filled in the middle of leaves,
//! overwrites, unwritten blocks written, in a seeded random order. Writes
//! inside one leaf change that leaf in place; the others rewrite the
//! tree. After every batch the file reads back as the model says, and at
//! the end e2fsck is clean and the kernel's ext4 (loop mount, where the
//! machine allows) reads the same bytes.

mod common;

use common::{fresh, fsck_clean, have_tools, rw_journaled, KMount, Scratch};
use scalevfs::{Vfs, O_CREAT, O_RDWR};
use scalevfs_ext4::Ext4;

#[test]
fn writes_into_a_deep_extent_tree_read_back_everywhere() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("leafwrites");
    let img = fresh(&s.0, 1024, "32M");
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    let bs = 1024usize;
    let nblk = 4000usize;
    let mut model = vec![0u8; nblk * bs];
    let put = |t: &scalevfs::Task, model: &mut Vec<u8>, blk: usize, len: usize, v: u8| {
        let off = blk * bs + 17;
        let data = vec![v; len];
        t.pwrite(fd, &data, off as i64).unwrap();
        if model.len() < off + len {
            model.resize(off + len, 0);
        }
        model[off..off + len].copy_from_slice(&data);
    };
    // Every other block: 2000 one-block extents (24 leaves, depth 2).
    for b in (0..nblk).step_by(2) {
        put(&t, &mut model, b, 10, (b % 251) as u8);
    }
    // An unwritten range past the end, then the random mix.
    t.fallocate(
        fd,
        scalevfs::io::FALLOC_FL_KEEP_SIZE,
        (nblk * bs) as i64,
        64 * 1024,
    )
    .unwrap();
    let mut seed = 0x1234_5678_9ABC_DEF1u64;
    let mut rnd = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for round in 0..600 {
        let (blk, len) = match rnd(4) {
            0 => (rnd(nblk / 2) * 2 + 1, 100),        // fill a hole
            1 => (rnd(nblk), 700),                    // overwrite (may span two blocks)
            2 => (nblk + rnd(64), 300),               // into the unwritten range
            _ => (model.len() / bs + 1 + rnd(3), 50), // append past a gap
        };
        put(&t, &mut model, blk, len, (round % 250 + 1) as u8);
        if round % 100 == 99 {
            let mut got = vec![0u8; model.len()];
            let n = t.pread(fd, &mut got, 0).unwrap();
            assert_eq!(n, model.len());
            assert!(got == model, "round {round}: content differs");
        }
    }
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
    let ex = common::debugfs_ro(&img, "ex f");
    eprintln!("{}", ex.lines().take(4).collect::<Vec<_>>().join("\n"));
    assert!(ex.contains(" 2/ 2 "), "a tree of depth 2:\n{ex}");
    // Our own read after a remount.
    let e = Ext4::open(&img, Default::default()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let got = scalevfs::fs::Fs::new(vfs.root_task()).read("/f").unwrap();
    assert!(got == model, "after remount: content differs");
    drop(vfs);
    // The kernel's read.
    let mnt = s.0.join("mnt");
    if let Some(_k) = KMount::new(&img, &mnt) {
        let got = std::fs::read(mnt.join("f")).unwrap();
        assert!(got == model, "the kernel reads other bytes");
    }
}
