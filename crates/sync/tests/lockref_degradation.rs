//! The `lockref` variant degrades to locked operation when an outside thread
//! briefly takes the lock under a steady stream of get/put; `lockref-wait`
//! does not (seed 001). Asserted on counters, not on time.
//!
//! Setup: `WORKERS` threads do get + put on one `LockRef`; one outside
//! thread repeatedly takes the lock for a few `spin_loop` iterations, then
//! leaves it free for a while. Every worker records its own counters with
//! `lockstat::thread_snapshot`, so other tests running in parallel cannot
//! disturb the numbers.
//!
//! Expected: with `lockref`, every operation that observes the brief hold
//! goes to the lock (and operations that observe *those* holds do too: the
//! cascade). With `lockref-wait` the waiters outlast the brief hold within
//! their budget of 100 and almost none is locked. On a 2-core VM we see
//! about one locked operation per outside hold for `lockref` (roughly 0.2%
//! of operations with the timings below) and practically none for
//! `lockref-wait`; the self-sustaining all-locked state of seed 001 needs
//! many more CPUs. The assertion is therefore per outside hold, which does
//! not depend on how fast the machine runs operations. On a noisy, oversubscribed 2-core VM a lock holder can be
//! descheduled mid-hold, which pushes even `lockref-wait` to the lock for a
//! while; so the comparison is a ratio with generous margins, repeated a few
//! times, and passes if any round shows it.
#![cfg(not(loom))]

use scalevfs_sync::lockstat::{self, Snapshot, Stat};
use scalevfs_sync::{LockRef, LockRefVariant};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;

const WORKERS: usize = 2;
/// How many times the outside thread takes the lock per round.
const HOLDS: usize = 3_000;
/// `spin_loop` iterations the outside thread holds the lock for.
const HOLD_SPINS: usize = 8;
/// `spin_loop` iterations between two holds.
const GAP_SPINS: usize = 50;
const ROUNDS: usize = 5;

/// The tests in this file would disturb each other's timing; run them one at
/// a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// One round: returns the workers' summed counter deltas.
fn run(v: LockRefVariant) -> Snapshot {
    let lr = LockRef::new(1);
    let stop = AtomicBool::new(false);
    let progress = AtomicU64::new(0);
    let barrier = Barrier::new(WORKERS + 1);
    let mut total = Snapshot::default();
    thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (lr, stop, barrier, progress) = (&lr, &stop, &barrier, &progress);
                s.spawn(move || {
                    barrier.wait();
                    let before = lockstat::thread_snapshot();
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..64 {
                            lr.get(v);
                            assert!(lr.put_or_lock(v), "count >= 2 here");
                        }
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                    lockstat::thread_snapshot().delta(&before)
                })
            })
            .collect();
        barrier.wait();
        let mut last = 0;
        for _ in 0..HOLDS {
            // Hold only while a worker is running right now (its progress
            // counter just moved), so that on an oversubscribed machine the
            // holds overlap the workers instead of a descheduled period.
            let mut spins = 0u32;
            loop {
                let p = progress.load(Ordering::Relaxed);
                if p != last {
                    last = p;
                    break;
                }
                spins += 1;
                if spins % 1024 == 0 {
                    thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            lr.lock();
            for _ in 0..HOLD_SPINS {
                std::hint::spin_loop();
            }
            lr.unlock();
            for _ in 0..GAP_SPINS {
                std::hint::spin_loop();
            }
        }
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            total.merge(&w.join().unwrap());
        }
    });
    assert_eq!(lr.count(), 1);
    total
}

#[test]
#[cfg_attr(miri, ignore = "timing workload; too slow under Miri")]
fn lockref_degrades_lockref_wait_does_not() {
    if !lockstat::enabled() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut report = String::new();
    for round in 0..ROUNDS {
        let plain = run(LockRefVariant::Lockref);
        let wait = run(LockRefVariant::LockrefWait);
        let (fp, fw) = (
            plain.lockref_locked_fraction(),
            wait.lockref_locked_fraction(),
        );
        let (lp, lw) = (
            plain.get(Stat::LockrefLocked),
            wait.get(Stat::LockrefLocked),
        );
        let line = format!(
            "round {round}: {HOLDS} outside holds; lockref: {lp} locked ops ({:.3}% of {}); \
             lockref-wait: {lw} locked ops ({:.4}% of {}), {} ops waited ({} wait spins)\n",
            100.0 * fp,
            plain.get(Stat::LockrefFast) + lp,
            100.0 * fw,
            wait.get(Stat::LockrefFast) + lw,
            wait.get(Stat::LockrefWait),
            wait.get(Stat::LockrefWaitSpins),
        );
        eprint!("{line}");
        report.push_str(&line);
        // The workers must have run into the outside holds (otherwise the
        // round says nothing): lockref-wait shows it by waiting. Then
        // lockref must send a good share of the holds' victims to the lock
        // (one op per ten holds at least; about one per hold is typical),
        // and at least ten times as many as lockref-wait does.
        let saw_holds = 10 * wait.get(Stat::LockrefWait) >= HOLDS as u64;
        if saw_holds && 10 * lp >= HOLDS as u64 && lp >= 10 * lw {
            return;
        }
    }
    panic!("lockref did not degrade measurably more than lockref-wait:\n{report}");
}

/// The counters themselves: `lockref` never records a wait; `lockref-wait`
/// records waits only when it saw the lock.
#[test]
#[cfg_attr(miri, ignore = "timing workload; too slow under Miri")]
fn only_lockref_wait_waits() {
    if !lockstat::enabled() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let plain = run(LockRefVariant::Lockref);
    assert_eq!(plain.get(Stat::LockrefWait), 0);
    assert_eq!(plain.get(Stat::LockrefWaitSpins), 0);
    let wait = run(LockRefVariant::LockrefWait);
    assert!(wait.get(Stat::LockrefWaitSpins) >= wait.get(Stat::LockrefWait));
}
