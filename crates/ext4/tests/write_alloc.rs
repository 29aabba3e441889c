//! Read-write mount and the allocator, judged by e2fsck: a clean mount and
//! unmount, block and inode allocation over every group (BLOCK_UNINIT and
//! INODE_UNINIT groups initialised on first use), to ENOSPC and back, from
//! several threads; a failed check never writes.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::{debugfs_ro, fresh, fsck_clean, sb_field, Scratch};
use scalevfs::fstype::Filesystem;
use scalevfs::{Cred, Errno};
use scalevfs_ext4::format::group_desc;
use scalevfs_ext4::format::superblock::Superblock;
use scalevfs_ext4::{Ext4, Ext4Options};

fn rw() -> Ext4Options {
    Ext4Options {
        ro: false,
        ..Ext4Options::default()
    }
}

/// The allocator tests call `alloc_block`/`free_block` directly, outside
/// any handle, and read the bitmaps' home blocks with debugfs right after
/// `sync`: they run without the journal, where sync writes home.
fn rw_in_place() -> Ext4Options {
    Ext4Options {
        journal: false,
        ..rw()
    }
}

fn errno(e: scalevfs_ext4::Error) -> Errno {
    e.errno()
}

#[test]
fn clean_mount_and_unmount_pass_e2fsck() {
    if !common::have_tools() {
        return;
    }
    let s = Scratch::new("rwmount");
    for bs in [1024, 4096] {
        let img = fresh(&s.0, bs, "32M");
        let count0: u32 = sb_field(&img, "Mount count").parse().unwrap();
        let e = Ext4::open(&img, rw()).unwrap();
        assert!(e.is_rw());
        // While mounted with the journal the image says needs_recovery
        // (the state stays valid, as the kernel leaves it).
        assert!(sb_field(&img, "Filesystem features").contains("needs_recovery"));
        assert_eq!(e.statfs().flags & libc::ST_RDONLY, 0);
        e.sync().unwrap();
        drop(e);
        assert_eq!(sb_field(&img, "Filesystem state"), "clean");
        assert!(!sb_field(&img, "Filesystem features").contains("needs_recovery"));
        // Without the journal the image is marked in use (not clean).
        let e = Ext4::open(&img, rw_in_place()).unwrap();
        assert_eq!(sb_field(&img, "Filesystem state"), "not clean");
        drop(e);
        assert_eq!(sb_field(&img, "Filesystem state"), "clean");
        let count0 = count0 + 1;
        let count1: u32 = sb_field(&img, "Mount count").parse().unwrap();
        assert_eq!(count1, count0 + 1);
        fsck_clean(&img);
        // A read-only open writes nothing.
        let before = std::fs::read(&img).unwrap();
        drop(Ext4::open(&img, Ext4Options::default()).unwrap());
        assert!(std::fs::read(&img).unwrap() == before);
    }
}

#[test]
fn unclean_image_is_refused_read_write() {
    if !common::have_tools() {
        return;
    }
    let s = Scratch::new("rwunclean");
    let img = fresh(&s.0, 4096, "16M");
    assert!(common::debugfs(&img, "ssv state 0"));
    let e = Ext4::open(&img, rw()).unwrap_err();
    assert!(e.to_string().contains("not cleanly unmounted"), "{e}");
    // Read-only still works.
    Ext4::open(&img, Ext4Options::default()).unwrap();
}

/// Every block the allocator hands out is unique and marked in the bitmap;
/// non-root allocation stops at the reserved blocks, root's at the last
/// block; freeing them all restores the counts e2fsck expects.
#[test]
fn fill_to_enospc_and_free_again() {
    if !common::have_tools() {
        return;
    }
    let s = Scratch::new("rwfill");
    for bs in [1024, 4096] {
        let img = fresh(&s.0, bs, "24M");
        let free0 = sb_field(&img, "Free blocks");
        let ifree0 = sb_field(&img, "Free inodes");
        let reserved: u64 = sb_field(&img, "Reserved block count").parse().unwrap();
        let blocks: u64 = sb_field(&img, "Block count").parse().unwrap();
        // The kernel's s_resv_clusters: 2%, at most 4096, kept from all
        // but the splits that free space.
        let pool = (blocks / 50).min(4096);
        let e = Ext4::open(&img, rw_in_place()).unwrap();
        let free: u64 = free0.parse().unwrap();
        let user = Cred::user(1000, 1000);
        // Four threads of an ordinary user allocate until ENOSPC.
        let got: Vec<Vec<u64>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let (e, user) = (&e, &user);
                    sc.spawn(move || {
                        let mut v = Vec::new();
                        scalevfs::caller::with(user, || loop {
                            match e.alloc_block(0) {
                                Ok(b) => v.push(b),
                                Err(err) => {
                                    assert_eq!(errno(err), Errno::ENOSPC);
                                    return v;
                                }
                            }
                        })
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<u64> = got.into_iter().flatten().collect();
        let uniq: HashSet<u64> = all.iter().copied().collect();
        assert_eq!(uniq.len(), all.len(), "a block handed out twice");
        assert_eq!(
            all.len() as u64,
            free - reserved - pool,
            "non-root stops at both reserves"
        );
        // Root (and work with no caller) takes the reserved blocks but
        // not the pool.
        scalevfs::caller::with(&Cred::root(), || {
            while let Ok(b) = e.alloc_block(0) {
                all.push(b);
            }
        });
        assert_eq!(all.len() as u64, free - pool, "root stops at the pool");
        assert_eq!(errno(e.alloc_block(0).unwrap_err()), Errno::ENOSPC);
        // A split that frees space takes the pool too, then ENOSPC.
        while let Ok(b) = e.alloc_block_nofail(0) {
            all.push(b);
        }
        assert_eq!(all.len() as u64, free);
        assert_eq!(errno(e.alloc_block_nofail(0).unwrap_err()), Errno::ENOSPC);
        assert_eq!(e.statfs().bfree, 0);
        e.sync().unwrap();
        // Every block we hold is marked in use on disk (spot checks).
        for &b in all.iter().step_by(all.len() / 7) {
            let t = debugfs_ro(&img, &format!("testb {b}"));
            assert!(t.contains("marked in use"), "block {b}: {t}");
        }
        for b in all {
            e.free_block(b).unwrap();
        }
        // The pool can be set (the kernel's sysfs reserved_clusters), up
        // to less than the filesystem's size; statfs follows it.
        assert_eq!(
            errno(e.set_reserved_clusters(blocks).unwrap_err()),
            Errno::EINVAL
        );
        e.set_reserved_clusters(0).unwrap();
        let st = e.statfs();
        assert_eq!(st.bavail, st.bfree - reserved);
        e.set_reserved_clusters(7).unwrap();
        let st = e.statfs();
        assert_eq!(st.bavail, st.bfree - reserved - 7);
        drop(e);
        assert_eq!(sb_field(&img, "Free blocks"), free0);
        assert_eq!(sb_field(&img, "Free inodes"), ifree0);
        fsck_clean(&img);
    }
}

#[test]
fn inodes_to_enospc_and_free_again() {
    if !common::have_tools() {
        return;
    }
    let s = Scratch::new("rwinodes");
    for bs in [1024, 4096] {
        let img = fresh(&s.0, bs, "16M");
        let ifree0 = sb_field(&img, "Free inodes");
        let free: u64 = ifree0.parse().unwrap();
        let e = Arc::new(Ext4::open(&img, rw_in_place()).unwrap());
        let mut all = Vec::new();
        loop {
            match e.alloc_inode(None, all.len() % 3 == 0) {
                Ok(i) => all.push(i),
                Err(err) => {
                    assert_eq!(errno(err), Errno::ENOSPC);
                    break;
                }
            }
        }
        assert_eq!(all.len() as u64, free);
        let uniq: HashSet<u32> = all.iter().copied().collect();
        assert_eq!(uniq.len(), all.len());
        assert!(all.iter().all(|&i| i >= 11), "reserved inode handed out");
        e.sync().unwrap();
        let last = *all.last().unwrap();
        let t = debugfs_ro(&img, &format!("testi <{last}>"));
        assert!(t.contains("marked in use"), "inode {last}: {t}");
        for (k, &i) in all.iter().enumerate() {
            e.free_inode(i, k % 3 == 0).unwrap();
        }
        drop(e);
        assert_eq!(sb_field(&img, "Free inodes"), ifree0);
        fsck_clean(&img);
    }
}

/// A group whose descriptor contradicts its layout is found out before
/// anything is written, and the mount then writes nothing more.
#[test]
fn failed_check_stops_all_writes() {
    if !common::have_tools() {
        return;
    }
    let s = Scratch::new("rwcorrupt");
    let img = fresh(&s.0, 1024, "24M");
    // Group 1 is BLOCK_UNINIT in a fresh image; lie about its free count.
    let gd = debugfs_ro(&img, "show_super_stats");
    let g1 = gd.split("Group  1:").nth(1).unwrap();
    assert!(
        g1.split("Group").next().unwrap().contains("Block not init"),
        "{gd}"
    );
    // (debugfs set_bg leaves a bad checksum: patch it here, checksum and all.)
    let mut raw = std::fs::read(&img).unwrap();
    let sb = Superblock::parse(&raw[1024..2048]).unwrap();
    let dsz = usize::from(sb.desc_size());
    let off = 2 * 1024 + dsz; // 1 KiB blocks: the table is block 2
    raw[off + 0xC..off + 0xE].copy_from_slice(&7u16.to_le_bytes());
    let c = group_desc::checksum(&sb, 1, &raw[off..off + dsz]).unwrap();
    raw[off + 0x1E..off + 0x20].copy_from_slice(&c.to_le_bytes());
    std::fs::write(&img, &raw).unwrap();
    let e = Ext4::open(&img, rw()).unwrap();
    let after_mount = std::fs::read(&img).unwrap();
    // A goal in group 1: the allocator builds its bitmap and refuses.
    let goal = 1 + 8192;
    let err = e.alloc_block(goal).unwrap_err();
    assert!(err.is_corrupt(), "{err}");
    assert_eq!(errno(e.alloc_block(0).unwrap_err()), Errno::EROFS);
    assert!(e.sync().is_err());
    drop(e);
    assert!(
        std::fs::read(&img).unwrap() == after_mount,
        "the image changed after a failed check"
    );
}

/// Four threads create, write and remove files at once — each in its own
/// directory and all in one shared directory (which grows into an htree
/// while they insert) — then the image passes e2fsck -fn and every file
/// reads back.
#[test]
fn concurrent_creates_pass_e2fsck() {
    if !common::have_tools() {
        return;
    }
    use scalevfs::fs::Fs;
    use scalevfs::{Vfs, VfsConfig};
    let s = Scratch::new("rwconc");
    for bs in [1024, 4096] {
        let img = fresh(&s.0, bs, "32M");
        let e = Ext4::open(&img, rw()).unwrap();
        let fsd: Arc<dyn Filesystem> = e.clone();
        let vfs = Vfs::with_root_fs(VfsConfig::default(), fsd);
        Fs::new(vfs.root_task()).create_dir("/shared").unwrap();
        std::thread::scope(|sc| {
            for t in 0..4 {
                let vfs = &vfs;
                sc.spawn(move || {
                    let fs = Fs::new(vfs.root_task());
                    fs.create_dir(format!("/own{t}")).unwrap();
                    for i in 0..150 {
                        let body = format!("{t}:{i}").repeat(i % 7 * 100 + 1);
                        fs.write(format!("/own{t}/f{i}"), &body).unwrap();
                        fs.write(format!("/shared/t{t}-file-{i:04}"), &body)
                            .unwrap();
                        if i % 5 == 0 {
                            fs.remove_file(format!("/own{t}/f{i}")).unwrap();
                        }
                    }
                });
            }
        });
        let fs = Fs::new(vfs.root_task());
        for t in 0..4 {
            for i in 0..150 {
                let body = format!("{t}:{i}").repeat(i % 7 * 100 + 1);
                assert_eq!(
                    fs.read(format!("/shared/t{t}-file-{i:04}")).unwrap(),
                    body.as_bytes()
                );
                assert_eq!(fs.exists(format!("/own{t}/f{i}")), i % 5 != 0);
            }
        }
        e.unmount().unwrap();
        fsck_clean(&img);
    }
}

/// A reader racing a writer whose every call rewrites the file's extent
/// tree (every other block, so the tree grows levels and its blocks are
/// freed and reallocated) never gets an error or data that was not
/// written.
#[test]
fn reads_racing_tree_rewrites_see_no_freed_blocks() {
    if !common::have_tools() {
        return;
    }
    use scalevfs::fs::{FileExt, Fs};
    use scalevfs::{Vfs, VfsConfig};
    let s = Scratch::new("rwrace");
    let bs = 1024;
    let img = fresh(&s.0, bs, "16M");
    let e = Ext4::open(&img, rw()).unwrap();
    let fsd: Arc<dyn Filesystem> = e.clone();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fsd);
    Fs::new(vfs.root_task()).write("/f", b"").unwrap();
    let nblk = 800;
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let (vfs, done) = (&vfs, &done);
        sc.spawn(move || {
            let fs = Fs::new(vfs.root_task());
            let f = fs.options().write(true).open("/f").unwrap();
            for i in (0..nblk).step_by(2) {
                f.write_all_at(&vec![(i % 251) as u8 + 1; bs], (i * bs) as u64)
                    .unwrap();
            }
            // SeqCst: plain flag between two test threads.
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        sc.spawn(move || {
            let fs = Fs::new(vfs.root_task());
            let f = fs.open("/f").unwrap();
            let mut buf = vec![0u8; bs];
            let mut k = 0usize;
            // SeqCst: as above.
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let i = k % nblk;
                k += 7;
                let n = f.read_at(&mut buf, (i * bs) as u64).unwrap();
                let want = if i.is_multiple_of(2) {
                    (i % 251) as u8 + 1
                } else {
                    0
                };
                assert!(
                    buf[..n].iter().all(|&b| b == want || b == 0),
                    "block {i}: foreign data"
                );
            }
        });
    });
    e.unmount().unwrap();
    fsck_clean(&img);
}
