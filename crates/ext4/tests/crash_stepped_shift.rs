//! Crash testing of INSERT_RANGE and COLLAPSE_RANGE done a leaf per
//! handle (`shift_step`: what a tree too large for one transaction gets;
//! forced here on a small file with `Ext4::set_stepped_shifts`, and the
//! transaction limit lowered so that the steps spread over many commits).
//! As the kernel's ext4, such a shift is not atomic: a crash may leave the
//! file partly shifted. What a crash may leave, and what each recovered
//! crash state is checked for:
//! - `e2fsck -fn` passes (only the superblock's free totals may lag): the
//!   tree is valid between any two steps (every key still bounds its
//!   subtree);
//! - no data is lost or duplicated: every block of the file as it was at
//!   the last fsync is either where it was or moved by exactly the shift,
//!   the moved ones a suffix (insert: from the end down) or a prefix
//!   (collapse: from the range up) of those that move, and every other
//!   block reads as zeros;
//! - the size is the old one or the new one; an insert grows it before it
//!   moves anything, a collapse shrinks it after it moved everything.

mod common;

use std::sync::Arc;

use common::{
    fresh, fsck_ok_but_free_totals, have_tools, point_at, recover, rw_journaled, Scratch,
};
use scalevfs::io::{FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE};
use scalevfs::{Vfs, O_CREAT, O_RDONLY, O_RDWR};
use scalevfs_ext4::crashdev::{CrashLog, RecordingDevice};
use scalevfs_ext4::{Ext4, MemDevice};

const BS: usize = 1024;
/// One-block extents of /f, at every other block: about 36 leaves.
const EXTENTS: usize = 3000;

/// The content of data block `i` (distinct for every block, never zero).
fn block(i: usize) -> Vec<u8> {
    let mut b: Vec<u8> = (0..BS).map(|k| (k * 7 + i * 13) as u8 | 1).collect();
    b[..8].copy_from_slice(&(i as u64).to_le_bytes());
    b
}

/// /f's bytes (its size exactly).
fn file_of(vfs: &Vfs) -> Vec<u8> {
    let t = vfs.root_task();
    let fd = t.open("/f", O_RDONLY, 0).unwrap();
    let size = t.fstat(fd).unwrap().size as usize;
    let mut b = vec![0u8; size + 1];
    let n = t.pread(fd, &mut b, 0).unwrap();
    b.truncate(n);
    t.close(fd).unwrap();
    b
}

/// A shift the workload does: every block from `a` on by `k` blocks,
/// right (insert) or left (collapse of `a..a + k`).
#[derive(Clone, Copy)]
struct Shift {
    a: usize,
    k: usize,
    right: bool,
}

/// Whether `got` is what a crash during `s` may leave of `before`
/// (see the module comment); the reason when not.
fn partial_ok(before: &[u8], got: &[u8], s: Shift) -> Result<(), String> {
    let (old, new) = if s.right {
        (before.len(), before.len() + s.k * BS)
    } else {
        (before.len(), before.len() - s.k * BS)
    };
    if got.len() != old && got.len() != new {
        return Err(format!("size {} (old {old}, new {new})", got.len()));
    }
    let blk = |v: &[u8], b: usize| v.get(b * BS..(b + 1) * BS).map(|x| x.to_vec());
    let mut claimed = vec![false; got.len().div_ceil(BS)];
    // Of the blocks that move: whether each moved, in order.
    let mut moved = Vec::new();
    for b in 0..before.len() / BS {
        let c = blk(before, b).unwrap();
        if c.iter().all(|&x| x == 0) {
            continue;
        }
        let moves = if s.right { b >= s.a } else { b >= s.a + s.k };
        let mut at = None;
        if moves {
            let to = if s.right { b + s.k } else { b - s.k };
            if blk(got, to).as_ref() == Some(&c) {
                at = Some(to);
                moved.push(true);
            } else if blk(got, b).as_ref() == Some(&c) {
                at = Some(b);
                moved.push(false);
            }
        } else if blk(got, b).as_ref() == Some(&c) {
            at = Some(b);
        } else if !s.right && b >= s.a {
            // In the collapsed range: punched.
            continue;
        }
        match at {
            Some(p) => claimed[p] = true,
            None => return Err(format!("block {b} of the file before is lost")),
        }
    }
    // Insert: moved from the end down, so the moved ones are a suffix;
    // collapse: from the range up, a prefix.
    let order_ok = if s.right {
        moved.windows(2).all(|w| w[0] <= w[1])
    } else {
        moved.windows(2).all(|w| w[0] >= w[1])
    };
    if !order_ok {
        return Err("the moved blocks are not one run from where the shift starts".into());
    }
    let any = moved.iter().any(|&m| m);
    let all = moved.iter().all(|&m| m);
    if s.right && any && got.len() != new {
        return Err("blocks moved right before the size grew".into());
    }
    if !s.right && got.len() == new && !all {
        return Err("the size shrank before every block moved left".into());
    }
    for (p, c) in claimed.iter().enumerate() {
        if !c {
            let end = ((p + 1) * BS).min(got.len());
            if got[p * BS..end].iter().any(|&x| x != 0) {
                return Err(format!("block {p} holds data that is nobody's"));
            }
        }
    }
    Ok(())
}

#[test]
fn a_crash_during_a_stepped_shift_leaves_a_consistent_partly_shifted_file() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("crash-shift");
    let img = fresh(&s.0, BS, "16M");
    let base = std::fs::read(&img).unwrap();
    let rec = Arc::new(RecordingDevice::new(MemDevice::new(base.clone()), 400_000));
    let shifts = [
        // Insert inside a longer extent (it splits), collapse it back,
        // then collapse a range holding data.
        Shift {
            a: 603,
            k: 5,
            right: true,
        },
        Shift {
            a: 603,
            k: 5,
            right: false,
        },
        Shift {
            a: 100,
            k: 20,
            right: false,
        },
    ];
    let points = {
        let e = Ext4::open_device(Box::new(rec.clone()), rw_journaled()).unwrap();
        let vfs = Vfs::with_root_fs(Default::default(), e.clone());
        let t = vfs.root_task();
        let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
        for i in 0..EXTENTS {
            t.pwrite(fd, &block(i), (2 * i * BS) as i64).unwrap();
        }
        // Blocks 600..608 written in one go: one extent of 8 blocks.
        let run: Vec<u8> = (0..8).flat_map(|j| block(EXTENTS + j)).collect();
        t.pwrite(fd, &run, (600 * BS) as i64).unwrap();
        t.fsync(fd).unwrap();
        let mut points = vec![(rec.writes(), file_of(&vfs))];
        e.set_stepped_shifts(true);
        e.set_txn_limit(8);
        let commits = e.commit_stats().0;
        for sh in shifts {
            let mode = if sh.right {
                FALLOC_FL_INSERT_RANGE
            } else {
                FALLOC_FL_COLLAPSE_RANGE
            };
            t.fallocate(fd, mode, (sh.a * BS) as i64, (sh.k * BS) as i64)
                .unwrap();
            t.fsync(fd).unwrap();
            points.push((rec.writes(), file_of(&vfs)));
        }
        let steps = e.commit_stats().0 - commits;
        assert!(steps >= 9, "the shifts took only {steps} commits");
        t.close(fd).unwrap();
        drop(t);
        drop(vfs);
        e.unmount().unwrap();
        points
    };
    // What the three shifts leave, computed on the original: each one
    // must have done exactly that.
    let mut want = points[0].1.clone();
    for (sh, p) in shifts.iter().zip(&points[1..]) {
        let at = sh.a * BS;
        if sh.right {
            want.splice(at..at, vec![0u8; sh.k * BS]);
        } else {
            want.drain(at..at + sh.k * BS);
        }
        assert!(want == p.1, "a shift did not do what it should");
    }
    let log = CrashLog {
        base,
        ops: rec.ops(),
    };
    let state_img = s.0.join("state");
    let mut n = 0;
    let mut partial = 0;
    log.states(3, BS as u64 + 23, &mut |st| {
        n += 1;
        let i = point_at(&points, st.flushed_writes);
        let before_first = st.flushed_writes < points[0].0;
        let (after, got) = recover(st.image.clone(), |v| {
            if before_first {
                Vec::new()
            } else {
                file_of(v)
            }
        });
        // Before the first fsync: only e2fsck's verdict counts.
        if !before_first && got != points[i].1 && points.get(i + 1).is_none_or(|p| got != p.1) {
            partial += 1;
            assert!(
                i < shifts.len(),
                "state {n}: after the last fsync, /f changed"
            );
            let sh = shifts[i];
            if let Err(why) = partial_ok(&points[i].1, &got, sh) {
                panic!(
                    "state {n} (flushed {}, in flight {:?}), during shift {i}: {why}",
                    st.flushed_writes, st.in_flight
                );
            }
        }
        std::fs::write(&state_img, &after).unwrap();
        fsck_ok_but_free_totals(&state_img, &format!("state {n}"));
        true
    });
    eprintln!("{n} crash states checked, {partial} of them partly shifted");
    assert!(n > 30, "only {n} crash states");
    assert!(
        partial > 5,
        "only {partial} states in the middle of a shift"
    );
}

/// The checker itself: it accepts partial shifts and refuses lost,
/// doubled or out-of-order blocks.
#[test]
fn the_partial_shift_check_refuses_what_a_crash_may_not_leave() {
    // Data in blocks 0, 2, 4 and 6 of 8.
    let layout = |at: &[(usize, usize)], blocks: usize| {
        let mut v = vec![0u8; blocks * BS];
        for &(i, p) in at {
            v[p * BS..(p + 1) * BS].copy_from_slice(&block(i));
        }
        v
    };
    let before = layout(&[(0, 0), (1, 2), (2, 4), (3, 6)], 8);
    let ins = Shift {
        a: 2,
        k: 1,
        right: true,
    };
    // Valid: nothing moved (old size, or new size before any move), the
    // last block moved, all moved.
    for got in [
        before.clone(),
        layout(&[(0, 0), (1, 2), (2, 4), (3, 6)], 9),
        layout(&[(0, 0), (1, 2), (2, 4), (3, 7)], 9),
        layout(&[(0, 0), (1, 3), (2, 5), (3, 7)], 9),
    ] {
        assert_eq!(partial_ok(&before, &got, ins), Ok(()));
    }
    // Refused: a block lost, one moved before a later one, a move before
    // the size grew, a stray block.
    for got in [
        layout(&[(0, 0), (1, 2), (3, 7)], 9),
        layout(&[(0, 0), (1, 3), (2, 4), (3, 7)], 9),
        layout(&[(0, 0), (1, 2), (2, 4)], 8),
        layout(&[(0, 0), (1, 2), (2, 4), (3, 6), (9, 8)], 9),
    ] {
        assert!(partial_ok(&before, &got, ins).is_err());
    }
    let col = Shift {
        a: 1,
        k: 1,
        right: false,
    };
    // Collapse of block 1 (a hole): valid partials, the final state.
    for got in [
        before.clone(),
        layout(&[(0, 0), (1, 1), (2, 4), (3, 6)], 8),
        layout(&[(0, 0), (1, 1), (2, 3), (3, 5)], 7),
    ] {
        assert_eq!(partial_ok(&before, &got, col), Ok(()));
    }
    // Refused: a later block moved before an earlier one; the size shrank
    // before every block moved; a block lost.
    for got in [
        layout(&[(0, 0), (1, 2), (2, 3), (3, 6)], 8),
        layout(&[(0, 0), (1, 1), (2, 4), (3, 6)], 7),
        layout(&[(0, 0), (1, 1), (3, 6)], 8),
    ] {
        assert!(partial_ok(&before, &got, col).is_err());
    }
}
