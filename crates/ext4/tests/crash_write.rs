//! Crash testing of the journaled write path (issue 15): a workload of
//! creates, writes, fsyncs, renames (one over an existing file), a
//! subdirectory, an unlink, an unlink of an open file that is written after
//! it, an overwrite in place and a truncate (freed blocks reused by a later
//! file) runs on a fresh `mkfs.ext4` image through a recording device;
//! every crash state a disk could be left in (each prefix ending at a
//! flush, and random subsets of the writes in flight since the last flush)
//! is recovered as a mount does (our replay, then the orphan file's inodes
//! freed), then
//! - `e2fsck -fn` passes (no bitmap, count, checksum or structure problem;
//!   only the superblock's free totals may lag, as the kernel's do),
//! - the tree is exactly the tree at the last fsync that completed before
//!   the crash, or at the next one (whose commit may have reached the
//!   disk): each fsync'ed file intact, each rename atomic (old or new
//!   name, never both or neither), no leaked or half-made entries.
//!
//! A state is also replayed by `e2fsck -fy` (the referee's own replay) on
//! a sample, and the tree compared with ours. The whole runs three times:
//! with the orphan file, on images without one (the orphan list), and on
//! ext3 images (no extent feature: every file block-mapped, written in
//! place with its indirect blocks journaled).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{e2fsck, fresh, fresh_list, have_tools, rw_journaled, Scratch};
use scalevfs::fs::Fs;
use scalevfs::{Vfs, O_CREAT, O_RDWR, O_TRUNC, O_WRONLY};
use scalevfs_ext4::crashdev::{CrashLog, RecordingDevice};
use scalevfs_ext4::{Ext4, MemDevice};

type Tree = BTreeMap<String, Option<Vec<u8>>>;

/// Names under /d (recursively) with file contents; directories as None.
fn tree_of(vfs: &Vfs) -> Tree {
    let fs = Fs::new(vfs.root_task());
    let mut out = Tree::new();
    let mut stack = vec!["/d".to_string()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = fs.read_dir(&dir) else { continue };
        for e in rd {
            let e = e.unwrap();
            let p = format!("{dir}/{}", e.file_name().to_str().unwrap());
            if e.file_type().unwrap().is_dir() {
                out.insert(p.clone(), None);
                stack.push(p);
            } else {
                out.insert(p.clone(), Some(fs.read(&p).unwrap()));
            }
        }
    }
    out
}

fn pattern(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k * 7 + i * 13) as u8).collect()
}

/// The workload; returns (writes recorded when each fsync returned, the
/// tree then).
fn workload(rec: &Arc<RecordingDevice<MemDevice>>, bs: usize) -> Vec<(usize, Tree)> {
    let e = Ext4::open_device(Box::new(rec.clone()), rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let mut points = vec![(rec.writes(), tree_of(&vfs))];
    let mut sync = |fd: i32, vfs: &Vfs| {
        t.fsync(fd).unwrap();
        points.push((rec.writes(), tree_of(vfs)));
    };
    t.mkdir("/d", 0o755).unwrap();
    for i in 0..5 {
        let fd = t
            .open(&format!("/d/f{i}"), O_CREAT | O_WRONLY, 0o644)
            .unwrap();
        t.write(fd, &pattern(i, bs * (i + 1) - 100)).unwrap();
        sync(fd, &vfs);
        t.close(fd).unwrap();
    }
    // Rename to a new name, then over an existing file (its inode becomes
    // an orphan): atomic, old name or new, never both or neither.
    t.rename("/d/f0", "/d/g0").unwrap();
    t.rename("/d/f3", "/d/f4").unwrap();
    let fd = t.open("/d/g0", O_RDWR, 0).unwrap();
    sync(fd, &vfs);
    t.close(fd).unwrap();
    // A subdirectory with files, an unlink, an overwrite in place, a
    // truncate that frees blocks, and files that reuse them.
    t.mkdir("/d/sub", 0o755).unwrap();
    for i in 0..3 {
        let fd = t
            .open(&format!("/d/sub/s{i}"), O_CREAT | O_WRONLY, 0o644)
            .unwrap();
        t.write(fd, &pattern(10 + i, 3 * bs)).unwrap();
        t.close(fd).unwrap();
    }
    // An unlink, and an unlink of a file still open (written and fsynced
    // after it lost its name): both orphans until freed.
    t.unlink("/d/f1").unwrap();
    let held = t.open("/d/sub/s1", O_RDWR, 0).unwrap();
    t.unlink("/d/sub/s1").unwrap();
    t.write(held, &pattern(77, 2 * bs)).unwrap();
    let fd = t.open("/d/f2", O_RDWR, 0).unwrap();
    t.pwrite(fd, &pattern(99, 200), 50).unwrap();
    sync(fd, &vfs);
    t.close(fd).unwrap();
    let fd = t.open("/d/f4", O_RDWR | O_TRUNC, 0).unwrap();
    sync(fd, &vfs);
    t.close(fd).unwrap();
    let fd = t.open("/d/new", O_CREAT | O_WRONLY, 0o600).unwrap();
    t.write(fd, &pattern(42, 5 * bs)).unwrap();
    // Far out: a new indirect chain in a block-mapped file (double
    // indirect with 1 KiB blocks), a deeper extent tree in another.
    t.pwrite(fd, &pattern(43, bs + 9), (300 * bs) as i64)
        .unwrap();
    sync(fd, &vfs);
    t.close(fd).unwrap();
    // The open orphan is closed (freed at the next commit).
    t.close(held).unwrap();
    let fd = t.open("/d/g0", O_RDWR, 0).unwrap();
    sync(fd, &vfs);
    t.close(fd).unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    let last = points.last().unwrap().1.clone();
    points.push((rec.writes(), last));
    points
}

/// Which images the workload runs on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// mkfs.ext4's defaults with the orphan file.
    OrphanFile,
    /// Without the orphan file (the orphan list).
    OrphanList,
    /// `mkfs -t ext3`: no extent feature, every file block-mapped (its
    /// indirect blocks journaled), the orphan list.
    Ext3,
}

#[test]
fn every_crash_state_recovers_to_an_fsynced_tree() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let total = crash_states(Kind::OrphanFile);
    eprintln!("crash test (orphan file): {total} crash states");
}

/// The same on ext3 images: block-mapped files written in place.
#[test]
fn every_crash_state_of_an_ext3_image_recovers() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let total = crash_states(Kind::Ext3);
    eprintln!("crash test (ext3): {total} crash states");
}

/// The same on images without an orphan file: the unlinked inodes are
/// chained on the orphan list (`s_last_orphan`, journaled superblock).
#[test]
fn every_crash_state_recovers_with_the_orphan_list() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let total = crash_states(Kind::OrphanList);
    eprintln!("crash test (orphan list): {total} crash states");
}

/// Every crash state of the workload on 1 KiB and 4 KiB images of `kind`,
/// recovered and checked; how many.
fn crash_states(kind: Kind) -> usize {
    let s = Scratch::new(&format!("crash-{kind:?}"));
    let mut total = 0;
    for bs in [1024usize, 4096] {
        let img = match kind {
            Kind::OrphanList => fresh_list(&s.0, bs, "8M"),
            Kind::OrphanFile => fresh(&s.0, bs, "8M"),
            Kind::Ext3 => {
                let img = s.0.join(format!("ext3-{bs}"));
                common::mkfs_args(&img, &["-t", "ext3", "-b", &bs.to_string()], "8M");
                img
            }
        };
        let base = std::fs::read(&img).unwrap();
        let rec = Arc::new(RecordingDevice::new(MemDevice::new(base.clone()), 200_000));
        let points = workload(&rec, bs);
        let log = CrashLog {
            base,
            ops: rec.ops(),
        };
        let state_img = s.0.join(format!("state{bs}"));
        let mut n = 0;
        let mut sampled = 0;
        log.states(4, bs as u64 + 7, &mut |st| {
            n += 1;
            // The last fsync point at or before this state, and the next.
            let i = common::point_at(&points, st.flushed_writes);
            let (img_after, tree) = common::recover(st.image.clone(), tree_of);
            let ok_trees: Vec<&Tree> = points[i..(i + 2).min(points.len())]
                .iter()
                .map(|(_, t)| t)
                .collect();
            // An overwrite in place (f2's pwrite) goes home before its
            // commit, as in ext4's data=ordered: until the fsync that
            // follows it, a crash may show the old or the new bytes.
            let f2_later: Vec<&Option<Vec<u8>>> = points[i..]
                .iter()
                .filter_map(|(_, t)| t.get("/d/f2"))
                .collect();
            let same = |t: &Tree| {
                t.len() == tree.len()
                    && t.iter().all(|(k, v)| match tree.get(k) {
                        Some(g) if k == "/d/f2" => g == v || f2_later.contains(&g),
                        Some(g) => g == v,
                        None => false,
                    })
            };
            assert!(
                ok_trees.iter().any(|t| same(t)),
                "bs {bs}, crash state {n} (flushed {}, in flight {:?}): recovered tree {:?} \
                 is neither fsync point {i} {:?} nor the next",
                st.flushed_writes,
                st.in_flight,
                tree.keys().collect::<Vec<_>>(),
                ok_trees[0].keys().collect::<Vec<_>>()
            );
            std::fs::write(&state_img, &img_after).unwrap();
            common::fsck_ok_but_free_totals(&state_img, &format!("bs {bs}, crash state {n}"));
            // The referee's own replay on every 8th state that needs one.
            if st.image[1024 + 0x60] & 4 != 0 && n % 8 == 0 {
                std::fs::write(&state_img, &st.image).unwrap();
                let (code, text) = e2fsck(&state_img, "-fy");
                assert!(code <= 1, "e2fsck -fy exit {code}:\n{text}");
                for bad in ["Illegal", "orphan linked list", "zero dtime"] {
                    assert!(!text.contains(bad), "e2fsck -fy: {bad}:\n{text}");
                }
                let theirs = std::fs::read(&state_img).unwrap();
                let (_, their_tree) = common::recover(theirs, tree_of);
                assert_eq!(their_tree, tree, "e2fsck's replay differs from ours");
                sampled += 1;
            }
            true
        });
        eprintln!(
            "bs {bs}: {n} crash states over {} fsync points, each recovered and checked; \
             {sampled} also replayed by e2fsck -fy",
            points.len()
        );
        assert!(n > 30);
        total += n;
    }
    total
}
