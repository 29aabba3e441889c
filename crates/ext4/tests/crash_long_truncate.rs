//! Crash testing of operations that run as several transactions (issue
//! 15): a truncate whose frees span more groups than one step may touch,
//! the unlink of such a file and a punch over such a range, on a small image with the transaction
//! limit lowered (`Ext4::set_txn_limit`) so that each runs as ~10
//! transactions. Every crash state (each prefix ending at a flush, and
//! random subsets of the writes in flight since) is recovered as a mount
//! does (replay, then the orphan file or orphan list processed), then
//! - `e2fsck -fn` passes: no leaked block, no block past a file's size,
//!   no bitmap or count problem (only the superblock's free totals may
//!   lag);
//! - /f is either at its old size with all its data (the crash came before
//!   the transaction that recorded it as an orphan; the tail of the block
//!   holding the new end may read as zeros, written in place before that
//!   commit as the kernel's ordered truncate does) or fully truncated to
//!   its new size with the data below it: never half-freed;
//! - /g (unlinked after the truncate) is there with its data or gone;
//! - a hole then punched in /f over ~11 groups (also several
//!   transactions, from the end of the hole) is punched, not yet punched,
//!   or punched from some block to its end (a valid file at each step,
//!   as the kernel's punch leaves it).
//!
//! A sample of states is also recovered by `e2fsck -fy` (its own replay
//! and orphan processing), and the files compared with ours.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::{have_tools, mkfs, rw_journaled, tool, Scratch};
use scalevfs::{Vfs, O_CREAT, O_RDONLY, O_RDWR};
use scalevfs_ext4::crashdev::{CrashLog, RecordingDevice};
use scalevfs_ext4::{Ext4, Ext4Options, MemDevice};

const BS: usize = 1024;
/// Blocks of /f and /g: ~40 and ~10 of the 64 groups of 256 blocks.
const F_BLOCKS: usize = 10_000;
const G_BLOCKS: usize = 2_500;
/// /f's size after the truncate: not block-aligned, so its last block's
/// tail is zeroed too.
const NEW_SIZE: usize = 3_000 * BS + 100;

/// The hole punched after the truncate (blocks): ~11 groups, from the end
/// in steps.
const PUNCH: (usize, usize) = (100, 2_900);
/// The fsync point before the punch.
const BEFORE_PUNCH: usize = 3;

type State = (Option<Vec<u8>>, Option<Vec<u8>>);

fn content(tag: u8, blocks: usize) -> Vec<u8> {
    (0..blocks * BS)
        .map(|k| ((k / BS) as u8 ^ tag) | 1)
        .collect()
}

fn file(vfs: &Vfs, p: &str) -> Option<Vec<u8>> {
    let t = vfs.root_task();
    let fd = t.open(p, O_RDONLY, 0).ok()?;
    let size = t.fstat(fd).unwrap().size as usize;
    let mut b = vec![0u8; size + 1];
    let mut n = 0;
    while n < b.len() {
        let k = t.pread(fd, &mut b[n..], n as i64).unwrap();
        if k == 0 {
            break;
        }
        n += k;
    }
    b.truncate(n);
    t.close(fd).unwrap();
    Some(b)
}

fn state(vfs: &Vfs) -> State {
    (file(vfs, "/f"), file(vfs, "/g"))
}

/// The workload; returns (writes recorded when each fsync returned, the
/// state then).
fn workload(rec: &Arc<RecordingDevice<MemDevice>>) -> Vec<(usize, State)> {
    let e = Ext4::open_device(Box::new(rec.clone()), rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let mut points = vec![(rec.writes(), state(&vfs))];
    let (f, g) = (content(0, F_BLOCKS), content(0x55, G_BLOCKS));
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    let gd = t.open("/g", O_CREAT | O_RDWR, 0o644).unwrap();
    for c in (0..f.len()).step_by(1 << 20) {
        t.pwrite(fd, &f[c..(c + (1 << 20)).min(f.len())], c as i64)
            .unwrap();
    }
    t.pwrite(gd, &g, 0).unwrap();
    t.fsync(fd).unwrap();
    t.fsync(gd).unwrap();
    points.push((rec.writes(), state(&vfs)));
    // From here a transaction holds about 8 blocks (the least
    // `set_txn_limit` allows): a step frees blocks in a group or two, and
    // changes /f's one leaf in place.
    e.set_txn_limit(8);
    let commits = e.commit_stats().0;
    t.ftruncate(fd, NEW_SIZE as i64).unwrap();
    t.fsync(fd).unwrap();
    points.push((rec.writes(), state(&vfs)));
    assert!(
        e.commit_stats().0 >= commits + 5,
        "the truncate ran as {} transactions",
        e.commit_stats().0 - commits
    );
    t.close(gd).unwrap();
    t.unlink("/g").unwrap();
    // A commit (an fsync of /f would not wait for the unlink's).
    e.commit().unwrap();
    points.push((rec.writes(), state(&vfs)));
    let c = e.commit_stats().0;
    let mode = scalevfs::io::FALLOC_FL_PUNCH_HOLE | scalevfs::io::FALLOC_FL_KEEP_SIZE;
    let (a, b) = PUNCH;
    t.fallocate(fd, mode, (a * BS) as i64, ((b - a) * BS) as i64)
        .unwrap();
    t.fsync(fd).unwrap();
    points.push((rec.writes(), state(&vfs)));
    assert!(
        e.commit_stats().0 >= c + 2,
        "the punch ran as one transaction"
    );
    t.close(fd).unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    let last = points.last().unwrap().1.clone();
    points.push((rec.writes(), last));
    points
}

/// `f` is `before` with the blocks `c..PUNCH.1` zeroed for some `c` in
/// the punched range.
fn partly_punched(f: &[u8], before: &[u8]) -> bool {
    let (a, b) = (PUNCH.0 * BS, PUNCH.1 * BS);
    if f.len() != before.len() || f[..a] != before[..a] || f[b..] != before[b..] {
        return false;
    }
    let c = (a..b).rev().find(|&k| f[k] != 0).map_or(a, |k| k + 1);
    f[a..c] == before[a..c]
}

/// The files of an image e2fsck recovered, read by a read-only mount.
fn read_only(img: &Path) -> State {
    let e = Ext4::open(img, Ext4Options::default()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e);
    state(&vfs)
}

fn run(features: &str) {
    let s = Scratch::new("crashlongtrunc");
    let img = s.0.join("img");
    let out = Command::new(mkfs().unwrap())
        .args([
            "-q", "-F", "-b", "1024", "-g", "256", "-J", "size=1", "-m", "0",
        ])
        .args(["-O", &format!("^resize_inode,{features}")])
        .arg(&img)
        .arg("16M")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let base = std::fs::read(&img).unwrap();
    let rec = Arc::new(RecordingDevice::new(MemDevice::new(base.clone()), 400_000));
    let points = workload(&rec);
    let f_old = content(0, F_BLOCKS);
    let f_new = f_old[..NEW_SIZE].to_vec();
    let mut f_zeroed = f_old.clone();
    f_zeroed[NEW_SIZE..NEW_SIZE.div_ceil(BS) * BS].fill(0);
    assert_eq!(points[2].1 .0.as_deref(), Some(&f_new[..]));
    assert!(points[BEFORE_PUNCH + 1]
        .1
         .0
        .as_deref()
        .is_some_and(|f| partly_punched(f, &f_new)));
    let log = CrashLog {
        base,
        ops: rec.ops(),
    };
    let state_img = s.0.join("state");
    let (mut n, mut by_fsck) = (0, 0);
    log.states(1, 7, &mut |st| {
        n += 1;
        let what = format!(
            "{features}: crash state {n} (flushed {})",
            st.flushed_writes
        );
        let i = common::point_at(&points, st.flushed_writes);
        let (img_after, mut got) = common::recover(st.image.clone(), state);
        let ours = got.clone();
        // The partial last block's tail is zeroed in place before the
        // transaction that shrinks the size commits (ordered data, as the
        // kernel's truncate): the old file may show those zeros.
        if got.0.as_deref() == Some(&f_zeroed[..]) {
            got.0 = Some(f_old.clone());
        }
        // A crash during the punch: the end of the hole punched, the rest
        // not yet (each step a valid file, as the kernel's punch).
        if i == BEFORE_PUNCH && got.0.as_deref().is_some_and(|f| partly_punched(f, &f_new)) {
            got.0 = points[i + 1].1 .0.clone();
        }
        let ok = points[i..(i + 2).min(points.len())]
            .iter()
            .any(|(_, p)| *p == got);
        assert!(
            ok,
            "{what}: /f (size {:?}) and /g (size {:?}) are neither fsync point {i} nor \
             the next",
            got.0.as_ref().map(Vec::len),
            got.1.as_ref().map(Vec::len)
        );
        std::fs::write(&state_img, &img_after).unwrap();
        common::fsck_ok_but_free_totals(&state_img, &what);
        // e2fsck's own recovery on a sample: the same files.
        if n % 8 == 0 {
            std::fs::write(&state_img, &st.image).unwrap();
            let out = Command::new(tool("e2fsck"))
                .arg("-fy")
                .arg(&state_img)
                .output()
                .unwrap();
            let code = out.status.code().unwrap_or(-1);
            assert!(
                code <= 1,
                "{what}: e2fsck -fy exit {code}:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
            let theirs = read_only(&state_img);
            if theirs != ours {
                let d = |a: &Option<Vec<u8>>, b: &Option<Vec<u8>>| match (a, b) {
                    (Some(a), Some(b)) => format!(
                        "sizes {} {}, first difference at {:?}",
                        a.len(),
                        b.len(),
                        a.iter().zip(b.iter()).position(|(x, y)| x != y)
                    ),
                    _ => format!(
                        "{:?} {:?}",
                        a.as_ref().map(Vec::len),
                        b.as_ref().map(Vec::len)
                    ),
                };
                panic!(
                    "{what} (after point {i}): e2fsck -fy recovered other files: /f {}; /g {}:\n{}",
                    d(&theirs.0, &ours.0),
                    d(&theirs.1, &ours.1),
                    String::from_utf8_lossy(&out.stdout)
                );
            }
            by_fsck += 1;
        }
        true
    });
    eprintln!(
        "{features}: {n} crash states over {} fsync points checked ({by_fsck} also by e2fsck -fy)",
        points.len()
    );
    assert!(n > 20);
    let _ = std::fs::remove_file(&state_img);
}

#[test]
fn every_crash_state_of_a_long_truncate_and_unlink_recovers() {
    if !have_tools() {
        return;
    }
    run("orphan_file");
}

#[test]
fn every_crash_state_of_a_long_truncate_on_the_orphan_list_recovers() {
    if !have_tools() {
        return;
    }
    run("^orphan_file");
}
