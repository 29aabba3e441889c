//! A big write whose data takes the last free blocks while its extents
//! need a new tree leaf: it ends short at a folio boundary (the tree gets
//! a block the write gives back), never a whole-write ENOSPC; nothing
//! leaks and e2fsck passes. (Kernel differential seed 1148 at 1 KiB: the
//! 13 MiB write failed whole.)

mod common;

use common::*;
use scalevfs::{Task, O_CREAT, O_RDWR};

const BS: usize = 1024;

/// Fill the filesystem a block at a time.
fn fill(t: &Task) -> i32 {
    let fd = t.open("/fill", O_CREAT | O_RDWR, 0o644).unwrap();
    let one = [7u8; BS];
    let mut n = 0i64;
    while t.pwrite(fd, &one, n * BS as i64).is_ok() {
        n += 1;
    }
    fd
}

#[test]
fn the_tree_gets_a_block_when_the_data_took_the_last() {
    if !have_tools() {
        return;
    }
    // `free`: blocks free in runs of 2 before the write. Folios of the
    // write: [0, 128K), [128K, 160K), [160K, 176K)... With 132 free the
    // second takes 4 and fails: they are given back at once and the leaf
    // takes one. With 160 free the third fails at its first block: the
    // second, written whole, is given back and the write ends before it.
    for (free, want) in [(132usize, 128usize << 10), (160, 128 << 10)] {
        let s = Scratch::new(&format!("write-enospc-tree-{free}"));
        let img = s.0.join("img");
        mkfs_args(&img, &["-b", "1024", "-m", "0"], "8M");
        let (e, vfs) = mount(&img);
        // Truly full: the kernel's 2% pool too.
        e.set_reserved_clusters(0).unwrap();
        let t = vfs.root_task();
        let small: Vec<i32> = (0..200)
            .map(|i| {
                let fd = t
                    .open(format!("/s{i}").as_str(), O_CREAT | O_RDWR, 0o644)
                    .unwrap();
                t.pwrite(fd, &[1u8; 2 * BS], 0).unwrap();
                fd
            })
            .collect();
        let f = fill(&t);
        for (i, fd) in small.into_iter().enumerate() {
            if i % 2 == 1 && i < free {
                t.ftruncate(fd, 0).unwrap();
            }
            t.close(fd).unwrap();
        }
        t.fsync(f).unwrap();
        scalevfs::flush_deferred_frees();
        e.commit().unwrap();
        assert_eq!(t.statfs("/").unwrap().bfree, free as u64, "free {free}");
        let fd = t.open("/t", O_CREAT | O_RDWR, 0o644).unwrap();
        let data: Vec<u8> = (0..190 << 10).map(|i| (i % 251) as u8).collect();
        let r = t.pwrite(fd, &data, 0);
        assert_eq!(r, Ok(want), "free {free}");
        let st = t.fstat(fd).unwrap();
        assert_eq!(st.size, want as u64, "free {free}");
        let mut back = vec![0u8; want];
        assert_eq!(t.pread(fd, &mut back, 0), Ok(want));
        assert!(back == data[..want], "free {free}: data differs");
        // The file's data blocks and one leaf, the rest free again.
        assert_eq!(st.blocks, (want / BS + 1) as u64 * 2, "free {free}");
        t.fsync(fd).unwrap();
        scalevfs::flush_deferred_frees();
        e.commit().unwrap();
        assert_eq!(
            t.statfs("/").unwrap().bfree,
            (free - want / BS - 1) as u64,
            "free {free}: leaked"
        );
        t.close(fd).unwrap();
        t.close(f).unwrap();
        unmount_clean(t, vfs, e, &img);
    }
}
