//! Crash testing of orphans that found the orphan file full and went on
//! the orphan list instead (`s_last_orphan`, chained through `i_dtime`, as
//! the kernel falls back to it). On an image whose orphan file has two
//! 1 KiB blocks (508 slots), through a recording device:
//! 1. 512 files are unlinked while open: 508 fill the slots, 4 go on the
//!    list;
//! 2. two of the listed ones are closed (the head and one inside the
//!    chain: their predecessor is relinked);
//! 3. three in slots are closed and five more unlinked while open: three
//!    take the freed slots, two join the list;
//! 4. a long truncate of /keep (several transactions, the limit lowered)
//!    finds the file full: its record is on the list during the steps,
//!    and leaves it at the end;
//! 5. everything is closed (freed over a few commits: the lowered limit
//!    bounds the groups one commit's frees may change).
//!
//! Every crash state (each prefix ending at a flush, and random subsets
//! of the writes in flight since) is recovered by our mount (replay, then
//! the orphan list and the orphan file processed), then
//! - `e2fsck -fn` finds nothing but lagging free totals in the superblock;
//! - no orphan is left: the inodes in use are exactly the fresh image's
//!   plus /d, /keep and the names in /d (none once the unlinks commit);
//! - /keep is at its old size with its data or truncated with the data
//!   below.
//!
//! Every 4th state is recovered by `e2fsck -fy` instead (its own replay
//! and orphan processing): the same inodes in use, and clean.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::{have_tools, mkfs, rw_journaled, tool, Scratch};
use scalevfs::fs::Fs;
use scalevfs::{Vfs, O_CREAT, O_RDONLY, O_RDWR, O_WRONLY};
use scalevfs_ext4::crashdev::{CrashLog, RecordingDevice};
use scalevfs_ext4::journal::Replay;
use scalevfs_ext4::{Ext4, Ext4Options, MemDevice};

const BS: usize = 1024;
/// Slots of the two-block orphan file.
const SLOTS: usize = 2 * 254;
/// /keep: over ~20 of the 64 groups of 256 blocks; truncated to
/// `NEW_BLOCKS` (block-aligned) in several transactions.
const KEEP_BLOCKS: usize = 5_000;
const NEW_BLOCKS: usize = 300;

fn keep_content() -> Vec<u8> {
    (0..KEEP_BLOCKS * BS)
        .map(|k| ((k / BS) as u8 ^ 0x5a) | 1)
        .collect()
}

/// What a state shows: /keep, and the names in /d (None: no /d).
type State = (Option<Vec<u8>>, Option<usize>);

fn state(vfs: &Vfs) -> State {
    let t = vfs.root_task();
    let keep = t.open("/keep", O_RDONLY, 0).ok().map(|fd| {
        let size = t.fstat(fd).unwrap().size as usize;
        let mut b = vec![0u8; size];
        let mut n = 0;
        while n < size {
            let k = t.pread(fd, &mut b[n..], n as i64).unwrap();
            assert!(k > 0);
            n += k;
        }
        t.close(fd).unwrap();
        b
    });
    let names = Fs::new(vfs.root_task())
        .read_dir("/d")
        .ok()
        .map(|rd| rd.count());
    (keep, names)
}

/// The workload; returns (writes recorded at each commit point, the
/// state then).
fn workload(rec: &Arc<RecordingDevice<MemDevice>>) -> Vec<(usize, State)> {
    let e = Ext4::open_device(Box::new(rec.clone()), rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let mut points = vec![(rec.writes(), state(&vfs))];
    let mut point = |e: &Ext4, vfs: &Vfs| {
        scalevfs::flush_deferred_frees();
        e.commit().unwrap();
        points.push((rec.writes(), state(vfs)));
    };
    t.mkdir("/d", 0o755).unwrap();
    let kfd = t.open("/keep", O_CREAT | O_RDWR, 0o644).unwrap();
    let keep = keep_content();
    for c in (0..keep.len()).step_by(1 << 20) {
        t.pwrite(kfd, &keep[c..(c + (1 << 20)).min(keep.len())], c as i64)
            .unwrap();
    }
    point(&e, &vfs);
    let mut open_unlinked = |i: usize| {
        let p = format!("/d/f{i}");
        let fd = t.open(&p, O_CREAT | O_WRONLY, 0o644).unwrap();
        t.write(fd, &[i as u8 | 1; 1000]).unwrap();
        t.unlink(&p).unwrap();
        fd
    };
    // 1. The slots fill up; the last four go on the list.
    let mut fds: Vec<i32> = (0..SLOTS + 4).map(&mut open_unlinked).collect();
    point(&e, &vfs);
    assert_eq!(e.orphan_list_len(), 4);
    // 2. The list's head (the last to join) and one inside it.
    let head = fds.pop().unwrap();
    let inner = fds.remove(SLOTS + 1);
    t.close(head).unwrap();
    t.close(inner).unwrap();
    point(&e, &vfs);
    assert_eq!(e.orphan_list_len(), 2);
    // 3. Three slots freed, five more unlinked open files: three take the
    //    slots, two join the list.
    for k in [300, 100, 0] {
        t.close(fds.remove(k)).unwrap();
    }
    scalevfs::flush_deferred_frees();
    fds.extend((SLOTS + 4..SLOTS + 9).map(&mut open_unlinked));
    point(&e, &vfs);
    assert_eq!(e.orphan_list_len(), 4);
    // 4. A long truncate with the file full: its record is on the list.
    //    (8 blocks per transaction, the least: a step changes the file's
    //    one extent leaf in place, so it logs few blocks.)
    e.set_txn_limit(8);
    let commits = e.commit_stats().0;
    t.ftruncate(kfd, (NEW_BLOCKS * BS) as i64).unwrap();
    point(&e, &vfs);
    assert!(
        e.commit_stats().0 >= commits + 3,
        "the truncate ran as {} transactions",
        e.commit_stats().0 - commits
    );
    assert_eq!(e.orphan_list_len(), 4);
    // 5. Everything closed. With the lowered limit the frees take several
    //    commits: each frees what fits one step's budget of groups.
    for fd in fds {
        t.close(fd).unwrap();
    }
    t.close(kfd).unwrap();
    point(&e, &vfs);
    for _ in 0..100 {
        if e.orphan_list_len() == 0 {
            break;
        }
        point(&e, &vfs);
    }
    assert_eq!(e.orphan_list_len(), 0);
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    points
}

/// Inodes in use by e2fsck's summary ("img: 13/4096 files ...").
fn used_inodes(fsck_text: &str) -> usize {
    fsck_text
        .lines()
        .find(|l| l.contains(" files ("))
        .and_then(|l| l.split(": ").nth(1))
        .and_then(|r| r.split('/').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no summary in:\n{fsck_text}"))
}

/// `s_last_orphan` is set once the log is replayed (read-only, in
/// memory).
fn listed_after_replay(image: &[u8]) -> bool {
    let opts = Ext4Options {
        ro: true,
        replay: Replay::InMemory,
        ..Ext4Options::default()
    };
    let e = Ext4::open_device(Box::new(MemDevice::new(image.to_vec())), opts).unwrap();
    e.superblock().last_orphan != 0
}

#[test]
fn every_crash_state_with_orphans_on_the_fallback_list_recovers() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("crashorphanoverflow");
    let img = s.0.join("img");
    let out = Command::new(mkfs().unwrap())
        .args([
            "-q", "-F", "-b", "1024", "-g", "256", "-J", "size=1", "-m", "0",
        ])
        .args([
            "-O",
            "^resize_inode,orphan_file",
            "-E",
            "orphan_file_size=2",
        ])
        .arg(&img)
        .arg("16M")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let base_used = used_inodes(&common::fsck_ok_but_free_totals(&img, "fresh image"));
    let base = std::fs::read(&img).unwrap();
    let rec = Arc::new(RecordingDevice::new(MemDevice::new(base.clone()), 400_000));
    let points = workload(&rec);
    let (old, new) = (keep_content(), keep_content()[..NEW_BLOCKS * BS].to_vec());
    let log = CrashLog {
        base,
        ops: rec.ops(),
    };
    let state_img = s.0.join("state");
    let (mut n, mut by_fsck, mut listed) = (0, 0, 0);
    log.states(2, 11, &mut |st| {
        n += 1;
        let what = format!("crash state {n} (flushed {})", st.flushed_writes);
        let i = common::point_at(&points, st.flushed_writes);
        if listed_after_replay(&st.image) {
            listed += 1;
        }
        let (after, (keep, names)) = common::recover(st.image.clone(), state);
        std::fs::write(&state_img, &after).unwrap();
        // Every orphan freed: in use are the fresh image's inodes, /d,
        // /keep and the names left in /d.
        let ours = used_inodes(&common::fsck_ok_but_free_totals(&state_img, &what));
        let expect = base_used
            + usize::from(keep.is_some())
            + usize::from(names.is_some())
            + names.unwrap_or(0);
        assert_eq!(ours, expect, "{what}: inodes in use after our recovery");
        // Before the first commit point /keep may be partly written.
        if let (Some(k), true) = (&keep, i >= 1) {
            assert!(
                *k == old || *k == new,
                "{what}: /keep has {} bytes, neither old nor truncated",
                k.len()
            );
        }
        let ok = points[i..(i + 2).min(points.len())]
            .iter()
            .any(|(_, p)| p.1 == names);
        assert!(
            ok,
            "{what}: {names:?} names in /d, not commit point {i} nor the next"
        );
        if n % 4 == 0 {
            std::fs::write(&state_img, &st.image).unwrap();
            let out = Command::new(tool("e2fsck"))
                .arg("-fy")
                .arg(&state_img)
                .output()
                .unwrap();
            let code = out.status.code().unwrap_or(-1);
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(code <= 1, "{what}: e2fsck -fy exit {code}:\n{text}");
            let theirs = used_inodes(&common::fsck_ok_but_free_totals(&state_img, &what));
            assert_eq!(
                theirs, ours,
                "{what}: e2fsck -fy and our recovery disagree on the inodes in use"
            );
            by_fsck += 1;
        }
        true
    });
    eprintln!(
        "{n} crash states over {} commit points ({listed} with inodes on the orphan list \
         after replay, {by_fsck} also recovered by e2fsck -fy)",
        points.len()
    );
    assert!(n > 20);
    assert!(
        listed > 5,
        "only {listed} states had the fallback list in use"
    );
    let _ = std::fs::remove_file(&state_img);
}
