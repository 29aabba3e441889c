//! Threads creating in different directories work in different block
//! groups (issue 14: allocation per group with threads spread over the
//! groups): each thread's new directory goes to the group its thread number
//! picks (`alloc::spread`), its files' inodes and blocks next to it, and a
//! thread that fills its group walks on into a group no other thread
//! started in. Checked by inode numbers and block numbers, not by timing;
//! then the image must be clean for e2fsck.
//!
//! One test in this binary, on purpose: the allocator numbers threads in
//! the order they first allocate, process-wide, and the test starts its
//! threads one after another so that they are numbered 0, 1, 2, 3.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};

use common::{fresh, fsck_clean, have_tools, rw_journaled, Scratch};
use scalevfs::{Vfs, O_CREAT, O_WRONLY};
use scalevfs_ext4::Ext4;

#[test]
fn threads_creating_in_their_own_directories_use_disjoint_groups() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("createspread");
    // 1 KiB blocks, 64 MiB: 8 groups of 8192 blocks and 2048 inodes.
    let img = fresh(&s.0, 1024, "64M");
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let sb = e.superblock().clone();
    let (ipg, bpg, first) = (
        u64::from(sb.inodes_per_group),
        u64::from(sb.blocks_per_group),
        u64::from(sb.first_data_block),
    );
    assert_eq!(sb.group_count(), 8);
    let vfs = Arc::new(Vfs::with_root_fs(Default::default(), e.clone()));
    // More files than a group has inodes: every thread spills into a
    // second group.
    let (threads, per) = (4usize, ipg as usize + 400);
    let data = vec![0x5au8; 1000];
    // Thread k starts allocating after thread k - 1's first allocation
    // (its mkdir), so the allocator numbers them in order.
    let turns: Vec<Barrier> = (0..threads).map(|_| Barrier::new(2)).collect();
    let groups: Vec<BTreeSet<u64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|k| {
                let (vfs, data, turns) = (vfs.clone(), &data, &turns);
                sc.spawn(move || {
                    if k > 0 {
                        turns[k - 1].wait();
                    }
                    let t = vfs.root_task();
                    let dir = format!("/d{k}");
                    t.mkdir(&dir, 0o755).unwrap();
                    if k + 1 < threads {
                        turns[k].wait();
                    }
                    let mut ig = BTreeSet::new();
                    ig.insert((t.stat(&dir).unwrap().ino - 1) / ipg);
                    for i in 0..per {
                        let p = format!("{dir}/f{i}");
                        let fd = t.open(&p, O_CREAT | O_WRONLY, 0o644).unwrap();
                        assert_eq!(t.write(fd, data).unwrap(), data.len());
                        t.close(fd).unwrap();
                        ig.insert((t.stat(&p).unwrap().ino - 1) / ipg);
                    }
                    ig
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // The files' blocks, by group (FIEMAP through the VFS).
    let t = vfs.root_task();
    let bs = sb.block_size() as u64;
    let mut block_groups = Vec::new();
    for k in 0..threads {
        let mut bg = BTreeSet::new();
        for i in (0..per).step_by(7) {
            let fd = t.open(&format!("/d{k}/f{i}"), 0, 0).unwrap();
            for x in t.fiemap(fd, 0, u64::MAX, 0).unwrap() {
                bg.insert((x.physical / bs - first) / bpg);
            }
            t.close(fd).unwrap();
        }
        block_groups.push(bg);
    }
    for a in 0..threads {
        let ia = &groups[a];
        assert_eq!(ia.len(), 2, "thread {a}: inodes in groups {ia:?}");
        for b in a + 1..threads {
            let ib = &groups[b];
            assert!(
                ia.is_disjoint(ib),
                "threads {a} and {b} share inode groups: {ia:?} {ib:?}"
            );
            assert!(
                block_groups[a].is_disjoint(&block_groups[b]),
                "threads {a} and {b} share block groups: {:?} {:?}",
                block_groups[a],
                block_groups[b]
            );
        }
    }
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
}
