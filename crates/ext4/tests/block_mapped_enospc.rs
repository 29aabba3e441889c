//! Block-mapped (ext2/3-style) files: ENOSPC in the middle of a block-mapped write that needs several
//! new blocks (indirect blocks and data): nothing leaked, the image clean.

mod common;

use common::*;
use scalevfs::{O_CREAT, O_RDWR};

fn fill(t: &scalevfs::Task, bs: usize) {
    let fd = t.open("/fill", O_CREAT | O_RDWR, 0o644).unwrap();
    let mut off = 0i64;
    let blk = vec![0x33u8; bs * 64];
    let mut step = 64usize;
    loop {
        match t.pwrite(fd, &blk[..step * bs], off) {
            Ok(n) if n > 0 => off += n as i64,
            _ if step > 1 => step /= 2,
            _ => break,
        }
    }
    t.close(fd).unwrap();
    // The rest: one-block files (direct blocks, no indirect block).
    for i in 0.. {
        let p = format!("/z{i}");
        let fd = t.open(p.as_str(), O_CREAT | O_RDWR, 0o644).unwrap();
        let r = t.pwrite(fd, &blk[..bs], 0);
        t.close(fd).unwrap();
        if r.is_err() {
            break;
        }
    }
    t.fsync(t.open("/fill", O_RDWR, 0).unwrap()).unwrap();
}

#[test]
fn enospc_mid_block_mapped_write_leaks_nothing() {
    if !have_tools() {
        return;
    }
    for bs in [1024usize, 4096] {
        let s = Scratch::new(&format!("blockmap-enospc-{bs}"));
        let img = s.0.join("img");
        mkfs_args(
            &img,
            &["-t", "ext3", "-b", &bs.to_string(), "-m", "0"],
            "16M",
        );
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        for i in 0..10 {
            let p = format!("/k{i}");
            let fd = t.open(p.as_str(), O_CREAT | O_RDWR, 0o644).unwrap();
            t.pwrite(fd, &vec![1u8; bs], 0).unwrap();
            t.close(fd).unwrap();
        }
        fill(&t, bs);
        assert_eq!(t.statfs("/").unwrap().bfree, 0, "bs {bs}: not full");
        for i in 0..3 {
            let fd = t.open(format!("/k{i}").as_str(), O_RDWR, 0).unwrap();
            t.ftruncate(fd, 0).unwrap();
            t.close(fd).unwrap();
        }
        let fd = t.open("/t", O_CREAT | O_RDWR, 0o644).unwrap();
        t.fsync(fd).unwrap();
        assert_eq!(t.statfs("/").unwrap().bfree, 3, "bs {bs}");
        let per = (bs / 4) as i64;
        let b = bs as i64;
        // The triple indirect region: 4 blocks needed, 3 free.
        let r = t.pwrite(fd, b"x", (12 + per + per * per + 5) * b);
        assert_eq!(r, Err(scalevfs::Errno::ENOSPC), "bs {bs}");
        let st = t.fstat(fd).unwrap();
        assert_eq!((st.size, st.blocks), (0, 0), "bs {bs}");
        e.sync().unwrap();
        assert_eq!(t.statfs("/").unwrap().bfree, 3, "bs {bs}: leaked");
        // The double: a write of two blocks needing a double, a single
        // indirect block and two data blocks; 3 free. With 1 KiB blocks
        // both are in the write's first folio (a page, as it starts
        // inside one), which cannot be mapped whole: ENOSPC, nothing
        // kept (as the kernel's 6.18). With 4 KiB blocks the first folio
        // is the first block: short.
        let at = (12 + per) * b + 5;
        let r = t.pwrite(fd, &vec![9u8; 2 * bs], at);
        if bs == 1024 {
            assert_eq!(r, Err(scalevfs::Errno::ENOSPC), "bs {bs}");
            let st = t.fstat(fd).unwrap();
            assert_eq!((st.size, st.blocks), (0, 0), "bs {bs}");
            e.sync().unwrap();
            assert_eq!(t.statfs("/").unwrap().bfree, 3, "bs {bs}: leaked");
            t.close(fd).unwrap();
            unmount_clean(t, vfs, e, &img);
            continue;
        }
        assert_eq!(r, Ok(bs - 5), "bs {bs}");
        let st = t.fstat(fd).unwrap();
        assert_eq!(st.size, (at as u64) + bs as u64 - 5, "bs {bs}");
        assert_eq!(st.blocks, 3 * bs as u64 / 512, "bs {bs}");
        let mut back = vec![0xffu8; bs];
        assert_eq!(t.pread(fd, &mut back, (12 + per) * b), Ok(bs));
        assert!(back[..5].iter().all(|&c| c == 0) && back[5..].iter().all(|&c| c == 9));
        e.sync().unwrap();
        assert_eq!(t.statfs("/").unwrap().bfree, 0, "bs {bs}");
        t.close(fd).unwrap();
        unmount_clean(t, vfs, e, &img);
    }
}

/// A block-mapped directory of 12 blocks that needs its 13th (a single
/// indirect block and a data block) with one block free: ENOSPC, the new
/// inode not leaked, the one free block still free, the image clean.
#[test]
fn a_block_mapped_directory_growing_into_its_indirect_block_at_enospc() {
    if !have_tools() {
        return;
    }
    for (bs, idx) in [
        (1024usize, "^dir_index"),
        (4096, "^dir_index"),
        (1024, "dir_index"),
        (4096, "dir_index"),
    ] {
        let s = Scratch::new(&format!("blockmap-dirnospc-{bs}{idx}"));
        let img = s.0.join("img");
        mkfs_args(
            &img,
            &["-t", "ext3", "-b", &bs.to_string(), "-m", "0", "-O", idx],
            "16M",
        );
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        t.mkdir("/d", 0o755).unwrap();
        let long = "q".repeat(100);
        let mut i = 0;
        while t.stat("/d").unwrap().size < 12 * bs as u64 {
            let fd = t
                .open(format!("/d/{i:06}{long}").as_str(), O_CREAT | O_RDWR, 0o644)
                .unwrap();
            t.close(fd).unwrap();
            i += 1;
        }
        let fd = t.open("/k0", O_CREAT | O_RDWR, 0o644).unwrap();
        t.pwrite(fd, &vec![1u8; bs], 0).unwrap();
        t.close(fd).unwrap();
        fill(&t, bs);
        let fd = t.open("/k0", O_RDWR, 0).unwrap();
        t.ftruncate(fd, 0).unwrap();
        t.close(fd).unwrap();
        e.sync().unwrap();
        assert_eq!(t.statfs("/").unwrap().bfree, 1, "bs {bs}");
        let ifree = t.statfs("/").unwrap().ffree;
        let r = loop {
            let p = format!("/d/{i:06}{long}");
            match t.open(p.as_str(), O_CREAT | O_RDWR, 0o644) {
                Ok(fd) => t.close(fd).unwrap(),
                Err(err) => {
                    assert_eq!(t.stat(p.as_str()).err(), Some(scalevfs::Errno::ENOENT));
                    break err;
                }
            }
            i += 1;
        };
        assert_eq!(r, scalevfs::Errno::ENOSPC, "bs {bs}");
        assert_eq!(t.stat("/d").unwrap().size, 12 * bs as u64, "bs {bs}");
        e.sync().unwrap();
        assert_eq!(t.statfs("/").unwrap().bfree, 1, "bs {bs}");
        let created = i as u64 - (ifree - t.statfs("/").unwrap().ffree);
        let _ = created;
        unmount_clean(t, vfs, e, &img);
    }
}
