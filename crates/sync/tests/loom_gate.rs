//! Loom model of `Gate` (the ext4 journal's handle gate): a closer that has
//! shut the gate and found it drained excludes every pass, and everything a
//! pass did before leaving happens-before the closer's work (checked with
//! loom's `UnsafeCell`, which reports unsynchronised accesses). The models
//! run the non-waiting steps `try_enter_on`, `shut` and `drained` that
//! `enter` and `close` repeat (loom cannot explore unbounded spinning).
//!
//! The closer's sleep is checked as a state: a closer that would sleep on
//! a value of `left` must see a pass (or an entrant that backs out)
//! change it (a lost wake-up would leave it asleep for ever).
//!
//! Run with `ci/loom.sh loom_gate`.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use scalevfs_sync::Gate;

struct Shared {
    gate: Gate,
    /// `data[i]` is written by pass thread `i` and by the closer: a data
    /// race unless the gate excludes them (passes do not exclude each
    /// other, so each has its own cell).
    data: [UnsafeCell<u64>; 2],
}

// SAFETY: `data` is only touched inside a pass or by the closer after
// `shut` + `drained`; the model checks exactly that exclusion.
unsafe impl Sync for Shared {}

fn pass_thread(s: Arc<Shared>, cell: usize, slot: usize) -> thread::JoinHandle<bool> {
    thread::spawn(move || match s.gate.try_enter_on(slot) {
        Some(_p) => {
            // SAFETY: inside a pass (the property under test).
            s.data[cell].with_mut(|d| unsafe { *d += 1 });
            true
        }
        None => false,
    })
}

/// One pass against one closer, on different slots and on the same slot.
#[test]
fn a_drained_gate_excludes_passes() {
    for same_slot in [false, true] {
        loom::model(move || {
            let s = Arc::new(Shared {
                gate: Gate::new(2),
                data: [UnsafeCell::new(0), UnsafeCell::new(0)],
            });
            let t = pass_thread(s.clone(), 0, usize::from(!same_slot));
            s.gate.shut();
            let closed_work = s.gate.drained();
            if closed_work {
                // SAFETY: shut and drained (the property under test).
                s.data[0].with_mut(|d| unsafe { *d += 10 });
            }
            s.gate.open();
            let passed = t.join().unwrap();
            // SAFETY: both threads are done.
            let end = s.data[0].with(|d| unsafe { *d });
            assert_eq!(end, u64::from(passed) + if closed_work { 10 } else { 0 });
        });
    }
}

/// Two passes (one slot each) and a closer: still exclusive, and each
/// cell ends holding exactly what its pass and the closer added. Across
/// the executions the closer must find the gate drained at least once and
/// both passes must get in at least once (else the model checked nothing
/// of the exclusion).
#[test]
fn two_passes_and_a_closer() {
    // Outside the model (std, not loom): what some execution saw.
    static DRAINED_SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    static BOTH_PASSED_SEEN: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.check(|| {
        let s = Arc::new(Shared {
            gate: Gate::new(2),
            data: [UnsafeCell::new(0), UnsafeCell::new(0)],
        });
        let t1 = pass_thread(s.clone(), 0, 0);
        let t2 = pass_thread(s.clone(), 1, 1);
        s.gate.shut();
        let drained = s.gate.drained();
        if drained {
            for c in &s.data {
                // SAFETY: shut and drained.
                c.with_mut(|d| unsafe { *d += 10 });
            }
        }
        s.gate.open();
        let passed = [t1.join().unwrap(), t2.join().unwrap()];
        for (c, p) in s.data.iter().zip(passed) {
            // SAFETY: both threads are done.
            let end = c.with(|d| unsafe { *d });
            assert_eq!(
                end,
                u64::from(p) + if drained { 10 } else { 0 },
                "passed {passed:?}, drained {drained}"
            );
        }
        // Relaxed: read after the model, on this thread.
        if drained {
            DRAINED_SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if passed == [true, true] {
            BOTH_PASSED_SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    assert!(
        DRAINED_SEEN.load(std::sync::atomic::Ordering::Relaxed),
        "no execution found the gate drained"
    );
    assert!(
        BOTH_PASSED_SEEN.load(std::sync::atomic::Ordering::Relaxed),
        "no execution let both passes in"
    );
}

/// A closer that finds a count in (a pass inside, or an entrant that
/// counted itself in and then backs out on seeing the gate shut) and
/// would sleep finds `left` changed once that thread is done: it was
/// woken. (Without the back-out's wake-up this fails; CI hung on it.)
#[test]
fn a_closer_that_sleeps_for_a_count_is_woken() {
    loom::model(|| {
        let s = Arc::new(Shared {
            gate: Gate::new(2),
            data: [UnsafeCell::new(0), UnsafeCell::new(0)],
        });
        let p = pass_thread(s.clone(), 0, 0);
        s.gate.shut();
        let asleep_on = s.gate.drain_check();
        p.join().unwrap();
        if let Some(e) = asleep_on {
            assert_ne!(s.gate.left_word(), e, "the closer would sleep for ever");
        }
        assert!(s.gate.drain_check().is_none());
        s.gate.open();
    });
}
