//! Operations whose metadata is larger than one transaction (issue 15):
//! on an image with the smallest journal (1024 blocks of 1 KiB, so a
//! transaction logs at most about 1000 blocks) and 256-block groups, a
//! file spread over ~1000 groups is truncated, unlinked, punched and
//! allocated in one call each. Freeing or allocating its blocks changes
//! ~1000 block bitmaps plus their group descriptors: more than the log
//! holds. Each must work (the long ones run as several transactions, a
//! truncate or unlink protected by an orphan record), leave `e2fsck -fn`
//! clean, and give back every block it freed.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{debugfs, fsck_clean, have_tools, mkfs, rw_journaled, sb_field, Scratch};
use scalevfs::io::*;
use scalevfs::{Vfs, O_CREAT, O_RDWR};
use scalevfs_ext4::{Ext4, OrphanMode};

const BS: i64 = 1024;
/// Blocks the big file gets: ~1150 of the 1280 groups.
const FILE_BLOCKS: i64 = 290_000;

/// A 320 MiB image: 1 KiB blocks, 256-block groups (1280 groups), a
/// 1 MiB journal, no reserved blocks, `-O features`.
fn image(dir: &Path, features: &str) -> PathBuf {
    let img = dir.join("big.img");
    let out = Command::new(mkfs().unwrap())
        .args([
            "-q", "-F", "-b", "1024", "-g", "256", "-J", "size=1", "-m", "0",
        ])
        .args(["-O", &format!("^resize_inode,{features}")])
        .arg(&img)
        .arg("320M")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mkfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    img
}

fn free_blocks(img: &Path) -> u64 {
    sb_field(img, "Free blocks").parse().unwrap()
}

/// Mount `img`, create /f of FILE_BLOCKS blocks (allocated in pieces of
/// at most 4 groups, each fsynced, so building it never needs a big
/// transaction), with data in its first and last blocks; run `op` on the
/// task and fd; unmount.
fn with_big_file(img: &Path, op: impl FnOnce(&Ext4, &scalevfs::Task, i32)) {
    let e = Ext4::open(img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    let step = 1000 * BS;
    let mut off = 0;
    while off < FILE_BLOCKS * BS {
        let len = step.min(FILE_BLOCKS * BS - off);
        t.fallocate(fd, 0, off, len).unwrap();
        t.fsync(fd).unwrap();
        off += len;
    }
    t.pwrite(fd, b"first", 0).unwrap();
    t.pwrite(fd, b"last", (FILE_BLOCKS - 1) * BS).unwrap();
    t.fsync(fd).unwrap();
    assert!(t.fstat(fd).unwrap().blocks >= FILE_BLOCKS as u64 * 2);
    op(&e, &t, fd);
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
}

#[test]
fn truncating_a_file_over_a_thousand_groups_to_zero_works() {
    if !have_tools() {
        return;
    }
    for features in ["orphan_file", "^orphan_file"] {
        let s = Scratch::new("bigtrunc");
        let img = image(&s.0, features);
        let before = free_blocks(&img);
        with_big_file(&img, |_, t, fd| {
            t.ftruncate(fd, 0).unwrap();
            let r = t.fsync(fd);
            assert!(r.is_ok(), "fsync after the truncate: {r:?}");
            let st = t.fstat(fd).unwrap();
            assert_eq!((st.size, st.blocks), (0, 0));
            // The mount still writes.
            let r = t.pwrite(fd, b"again", 0);
            assert!(r.is_ok(), "a write after the truncate: {r:?}");
            t.ftruncate(fd, 0).unwrap();
            t.close(fd).unwrap();
        });
        fsck_clean(&img);
        // The inode itself stays; its blocks all came back.
        assert_eq!(free_blocks(&img), before, "{features}");
    }
}

#[test]
fn unlinking_a_file_over_a_thousand_groups_works() {
    if !have_tools() {
        return;
    }
    for features in ["orphan_file", "^orphan_file"] {
        let s = Scratch::new("bigunlink");
        let img = image(&s.0, features);
        let before = free_blocks(&img);
        with_big_file(&img, |e, t, fd| {
            t.close(fd).unwrap();
            t.unlink("/f").unwrap();
            let r = e.commit();
            assert!(r.is_ok(), "commit after the unlink: {r:?}");
            let fd = t.open("/g", O_CREAT | O_RDWR, 0o644).unwrap();
            let r = t.pwrite(fd, b"x", 0);
            assert!(r.is_ok(), "a write after the unlink: {r:?}");
            t.close(fd).unwrap();
            t.unlink("/g").unwrap();
        });
        fsck_clean(&img);
        assert_eq!(free_blocks(&img), before, "{features}");
    }
}

#[test]
fn punching_a_hole_over_a_thousand_groups_works() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("bigpunch");
    let img = image(&s.0, "orphan_file");
    let before = free_blocks(&img);
    with_big_file(&img, |_, t, fd| {
        let mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
        // All but the first and last blocks.
        let r = t.fallocate(fd, mode, BS, (FILE_BLOCKS - 2) * BS);
        assert!(r.is_ok(), "punch: {r:?}");
        let r = t.fsync(fd);
        assert!(r.is_ok(), "fsync after the punch: {r:?}");
        let st = t.fstat(fd).unwrap();
        assert_eq!((st.size, st.blocks), (FILE_BLOCKS as u64 * 1024, 4));
        let mut b = [0u8; 5];
        t.pread(fd, &mut b, 0).unwrap();
        assert_eq!(&b, b"first");
        t.pread(fd, &mut b[..4], (FILE_BLOCKS - 1) * BS).unwrap();
        assert_eq!(&b[..4], b"last");
        t.ftruncate(fd, 0).unwrap();
        t.close(fd).unwrap();
    });
    fsck_clean(&img);
    assert_eq!(free_blocks(&img), before);
}

#[test]
fn allocating_over_a_thousand_groups_in_one_call_works() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("bigfalloc");
    let img = image(&s.0, "orphan_file");
    let before = free_blocks(&img);
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    let r = t.fallocate(fd, 0, 0, FILE_BLOCKS * BS);
    assert!(r.is_ok(), "fallocate: {r:?}");
    let r = t.fsync(fd);
    assert!(r.is_ok(), "fsync after the fallocate: {r:?}");
    assert!(t.fstat(fd).unwrap().blocks >= FILE_BLOCKS as u64 * 2);
    t.close(fd).unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);
    assert!(free_blocks(&img) <= before - FILE_BLOCKS as u64);
}

/// On a small image with the transaction limit lowered (8 blocks, the
/// least: a step touches a group or two, and a step that changes one
/// extent leaf in place adds few new blocks to the transaction), a 10 MiB
/// write in one call, a ZERO_RANGE over
/// a 4 MiB hole and a COLLAPSE_RANGE of 8 MiB each run as several
/// transactions and do what one would.
#[test]
fn a_large_write_zero_range_and_collapse_run_as_several_transactions() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("bigsteps");
    let img = s.0.join("small.img");
    let out = Command::new(mkfs().unwrap())
        .args([
            "-q", "-F", "-b", "1024", "-g", "256", "-J", "size=1", "-m", "0",
        ])
        .args(["-O", "^resize_inode,orphan_file"])
        .arg(&img)
        .arg("24M")
        .output()
        .unwrap();
    assert!(out.status.success());
    let mib = 1 << 20;
    let data: Vec<u8> = (0..10 * mib).map(|k| (k / 1024 * 7) as u8 | 1).collect();
    {
        let e = Ext4::open(&img, rw_journaled()).unwrap();
        e.set_txn_limit(8);
        let vfs = Vfs::with_root_fs(Default::default(), e.clone());
        let t = vfs.root_task();
        let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
        let read = |len: usize| {
            let mut b = vec![0u8; len];
            let mut n = 0;
            while n < len {
                n += t.pread(fd, &mut b[n..], n as i64).unwrap();
            }
            b
        };
        let commits = |e: &Ext4| e.commit_stats().0;
        let c0 = commits(&e);
        assert_eq!(t.pwrite(fd, &data, 0).unwrap(), data.len());
        assert!(commits(&e) >= c0 + 3, "the write ran as one transaction");
        t.fsync(fd).unwrap();
        assert!(read(data.len()) == data);
        // A hole from 10 to 14 MiB, zeroed (allocated) but for 100 bytes
        // at each end.
        t.ftruncate(fd, 14 * mib as i64).unwrap();
        let c1 = commits(&e);
        let mode = FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE;
        t.fallocate(fd, mode, 10 * mib as i64 + 100, 4 * mib as i64 - 200)
            .unwrap();
        // (Its steps re-dirty one extent leaf and add a bitmap or two
        // each: two transactions at this limit.)
        assert!(
            commits(&e) >= c1 + 2,
            "the zero range ran as {} transactions",
            commits(&e) - c1
        );
        let blocks = t.fstat(fd).unwrap().blocks;
        assert!(blocks >= 14 * 2048, "{blocks} sectors after ZERO_RANGE");
        let mut want = data.clone();
        want.resize(14 * mib, 0);
        t.fsync(fd).unwrap();
        assert!(read(want.len()) == want);
        // Collapse 1..9 MiB.
        let c2 = commits(&e);
        t.fallocate(fd, FALLOC_FL_COLLAPSE_RANGE, mib as i64, 8 * mib as i64)
            .unwrap();
        assert!(commits(&e) >= c2 + 3, "the collapse ran as one transaction");
        want.drain(mib..9 * mib);
        assert_eq!(t.fstat(fd).unwrap().size, want.len() as u64);
        assert!(read(want.len()) == want);
        t.close(fd).unwrap();
        drop(t);
        drop(vfs);
        e.unmount().unwrap();
    }
    fsck_clean(&img);
}

/// Orphans left by a crash (made with debugfs, as the kernel leaves
/// them on the orphan list) whose blocks span ~1150 groups: the mount
/// frees them a step per handle (several commits), e2fsck is clean after,
/// and the blocks come back: a truncate orphan keeps its first 1000
/// blocks, an unlinked one is freed whole.
#[test]
fn a_big_orphan_left_by_a_crash_is_finished_in_steps() {
    if !have_tools() {
        return;
    }
    for unlinked in [false, true] {
        let s = Scratch::new("bigorphan");
        let img = image(&s.0, "^orphan_file");
        let before = free_blocks(&img);
        with_big_file(&img, |_, _, _| {});
        let ino = common::ino_of(&img, "/f");
        if unlinked {
            assert!(debugfs(&img, "unlink /f"));
            assert!(debugfs(&img, &format!("sif <{ino}> links_count 0")));
        } else {
            assert!(debugfs(&img, &format!("sif <{ino}> size {}", 1000 * BS)));
        }
        assert!(debugfs(&img, &format!("ssv last_orphan {ino}")));
        let e = Ext4::open(&img, rw_journaled()).unwrap();
        let commits = e.commit_stats().0;
        assert!(commits >= 3, "the orphan took {commits} commits");
        if !unlinked {
            let vfs = Vfs::with_root_fs(Default::default(), e.clone());
            let st = vfs.root_task().stat("/f").unwrap();
            assert_eq!(st.size, 1000 * BS as u64);
            assert!((2000..2100).contains(&st.blocks), "{} sectors", st.blocks);
        }
        e.unmount().unwrap();
        fsck_clean(&img);
        let after = free_blocks(&img);
        if unlinked {
            assert_eq!(after, before);
        } else {
            assert!((before - 1050..=before - 1000).contains(&after));
        }
    }
}

/// Unmount with many unlinked files still open: they are freed one per
/// handle, so the last commits stay within the (lowered) transaction
/// limit instead of one commit freeing them all at once; e2fsck is clean
/// and every block and inode comes back.
#[test]
fn unmount_frees_many_open_unlinked_files_over_several_commits() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("unmountmany");
    let img = image(&s.0, "orphan_file");
    let (blocks0, inodes0): (u64, u64) = (
        free_blocks(&img),
        sb_field(&img, "Free inodes").parse().unwrap(),
    );
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let mut fds = Vec::new();
    for i in 0..200 {
        let p = format!("/f{i}");
        let fd = t.open(&p, O_CREAT | O_RDWR, 0o644).unwrap();
        t.pwrite(fd, &[i as u8; 8 * BS as usize], 0).unwrap();
        t.unlink(&p).unwrap();
        fds.push(fd);
    }
    e.commit().unwrap();
    e.set_txn_limit(12);
    let commits = e.commit_stats().0;
    // Unmount with every file still open.
    e.unmount().unwrap();
    let n = e.commit_stats().0 - commits;
    assert!(n >= 4, "unmount freed 200 inodes in {n} commit(s)");
    drop(fds);
    drop(t);
    drop(vfs);
    drop(e);
    fsck_clean(&img);
    assert_eq!(free_blocks(&img), blocks0);
    let inodes: u64 = sb_field(&img, "Free inodes").parse().unwrap();
    assert_eq!(inodes, inodes0);
}

/// Twelve unlinked files of ~94 groups each, open until after a commit,
/// then closed together: each alone fits one step, but their frees
/// together are more than the log holds. The next commit frees as many as
/// fit one step's budget and leaves the rest to later handles and commits
/// (as the kernel frees each evicted inode in a handle of its own); it
/// used to free them all in one transaction, which did not fit the log
/// and stopped the filesystem (EROFS from then on).
#[test]
fn many_unlinked_files_closed_at_once_are_freed_over_several_commits() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("closemany");
    let img = image(&s.0, "orphan_file");
    let blocks0 = free_blocks(&img);
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    const FILES: usize = 12;
    const PER: i64 = 24_000;
    let mut fds = Vec::new();
    for i in 0..FILES {
        let p = format!("/f{i}");
        let fd = t.open(&p, O_CREAT | O_RDWR, 0o644).unwrap();
        let mut off = 0;
        while off < PER * BS {
            let len = (1000 * BS).min(PER * BS - off);
            t.fallocate(fd, 0, off, len).unwrap();
            t.fsync(fd).unwrap();
            off += len;
        }
        fds.push(fd);
    }
    for i in 0..FILES {
        t.unlink(&format!("/f{i}")).unwrap();
    }
    e.commit().unwrap();
    let commits = e.commit_stats().0;
    for fd in fds {
        t.close(fd).unwrap();
    }
    scalevfs::flush_deferred_frees();
    e.commit().expect("the commit after the closes");
    // Still writing; the files left for later handles go with them.
    let fd = t.open("/g", O_CREAT | O_RDWR, 0o644).unwrap();
    t.pwrite(fd, b"x", 0).unwrap();
    t.close(fd).unwrap();
    e.commit().unwrap();
    let n = e.commit_stats().0 - commits;
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
    // Every block back but /g's one (and nothing else held).
    assert_eq!(free_blocks(&img), blocks0 - 1, "after {n} commits");
}

/// A fragmented file too large to free in one step (the limit lowered so
/// that steps are one group each) is deleted on a full filesystem (no
/// reserved blocks): each step frees from the end and rewrites the shrunk
/// extent tree into its own old blocks, so it needs no new block. Steps
/// used to allocate a new tree: ENOSPC, and the filesystem stopped
/// writing, with the space never given back.
#[test]
fn deleting_a_stepped_file_on_a_full_filesystem_gives_the_space_back() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("fulldel");
    let img = s.0.join("img");
    common::mkfs_args(&img, &["-b", "1024", "-m", "0", "-O", "orphan_file"], "32M");
    let free0 = free_blocks(&img);
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    e.set_txn_limit(8);
    // Truly full: not even the kernel's 2% pool for splits left.
    e.set_reserved_clusters(0).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    // 20 MiB, then a hole every 32 blocks: ~640 extents in a depth-1 tree.
    let fd = t.open("/frag", O_CREAT | O_RDWR, 0o644).unwrap();
    let mb = vec![0x11u8; 1 << 20];
    for i in 0..20 {
        t.pwrite(fd, &mb, i << 20).unwrap();
    }
    t.fsync(fd).unwrap();
    let mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    let mut off = 0;
    while off < 20 << 20 {
        t.fallocate(fd, mode, off, BS).unwrap();
        off += 32 * BS;
    }
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    // Fill the rest.
    let fd = t.open("/fill", O_CREAT | O_RDWR, 0o644).unwrap();
    let mut pos = 0i64;
    for chunk in [1i64 << 20, 64 << 10, BS] {
        let buf = vec![0x22u8; chunk as usize];
        while matches!(t.pwrite(fd, &buf, pos), Ok(n) if n > 0) {
            pos += chunk;
        }
    }
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    assert!(t.statfs("/").unwrap().bfree < 64, "not full");
    t.unlink("/frag").unwrap();
    scalevfs::flush_deferred_frees();
    // A step per handle or commit: the space comes back over a few.
    // The inode's drop is epoch-deferred: with other tests' threads
    // pinned (CI, loaded) it may come late, so flush each round and allow
    // up to ~20 s.
    for i in 0..2000 {
        scalevfs::flush_deferred_frees();
        if i >= 100 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        e.commit().unwrap();
        if t.statfs("/").unwrap().bfree > 15 * 1024 {
            break;
        }
        let fd = t.open("/step", O_CREAT | O_RDWR, 0o644).unwrap();
        t.close(fd).unwrap();
    }
    assert!(t.statfs("/").unwrap().bfree > 15 * 1024);
    // Still writing.
    let fd = t.open("/x", O_CREAT | O_RDWR, 0o644).unwrap();
    t.pwrite(fd, &mb, 0).unwrap();
    t.close(fd).unwrap();
    e.commit().unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
    let free1 = free_blocks(&img);
    assert!(
        free1 + 4 * 1024 < free0 && free1 > 15 * 1024,
        "{free1} of {free0}"
    );
}

/// Many small unlinked files closed at once: each needs few bitmap
/// groups, but each logs its own inode table block (1 KiB inodes in
/// 1 KiB blocks) and its orphan record's block (or, on the list, a
/// neighbour's link). 1200 of them in one commit would log ~1230 blocks
/// in a 1023-block log (the filesystem then stopped writing, EROFS):
/// `reap_some` counts those blocks too, so the frees spread over later
/// handles and commits. Both orphan schemes.
#[test]
fn many_small_unlinked_files_closed_at_once_fit_the_log() {
    if !have_tools() {
        return;
    }
    for mode in [OrphanMode::File, OrphanMode::List] {
        let s = Scratch::new("itable-budget");
        let img = s.0.join("img");
        common::mkfs_args(
            &img,
            &[
                "-b",
                "1024",
                "-I",
                "1024",
                "-N",
                "4096",
                "-J",
                "size=1",
                "-m",
                "0",
                "-O",
                "orphan_file",
            ],
            "64M",
        );
        let free0 = free_blocks(&img);
        let opts = scalevfs_ext4::Ext4Options {
            orphans: mode,
            ..rw_journaled()
        };
        let e = Ext4::open(&img, opts).unwrap();
        let vfs = Vfs::with_root_fs(Default::default(), e.clone());
        let t = vfs.root_task();
        t.files().set_max(4096).unwrap();
        const N: usize = 1200;
        let mut fds = Vec::new();
        for i in 0..N {
            let p = format!("/f{i}");
            let fd = t.open(&p, O_CREAT | O_RDWR, 0o644).unwrap();
            t.pwrite(fd, b"x", 0).unwrap();
            t.unlink(&p).unwrap();
            fds.push(fd);
            if i % 100 == 99 {
                e.commit().unwrap();
            }
        }
        e.commit().unwrap();
        for fd in fds {
            t.close(fd).unwrap();
        }
        scalevfs::flush_deferred_frees();
        e.commit()
            .unwrap_or_else(|err| panic!("{mode:?}: commit after closing {N} files: {err}"));
        // Still writing; the rest freed by later commits and the unmount.
        let fd = t.open("/g", O_CREAT | O_RDWR, 0o644).unwrap();
        t.close(fd).unwrap();
        e.commit().unwrap();
        drop(t);
        drop(vfs);
        e.unmount().unwrap();
        drop(e);
        fsck_clean(&img);
        // Every data block and inode given back (the new empty /g has no block).
        assert_eq!(free_blocks(&img), free0, "{mode:?}");
    }
}
