//! LockRef keeps exact counts under concurrency, for every variant, and each
//! operation has the documented single-threaded semantics.
#![cfg(not(loom))]

use scalevfs_sync::lockstat::{self, Stat};
use scalevfs_sync::{LockRef, LockRefVariant, LOCKREF_DEAD};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::thread;

const THREADS: usize = 4;
const OPS: usize = if cfg!(miri) { 50 } else { 20_000 };

/// Small deterministic PRNG (xorshift) so the op mix differs per thread.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Drop a reference known not to be the last.
fn put_not_last(lr: &LockRef, v: LockRefVariant, lockless_first: bool) {
    if lockless_first {
        if let Some(n) = lr.put_return(v) {
            assert!(
                n >= 1,
                "{v}: put_return reached {n} with a reference outstanding"
            );
            return;
        }
    }
    assert!(
        lr.put_or_lock(v),
        "{v}: put_or_lock locked with a reference outstanding"
    );
}

/// Threads take and drop references with a mix of every operation while an
/// outside thread takes the lock and moves the count under it; the count
/// returns to its start value.
fn stress_counts(v: LockRefVariant) {
    let lr = LockRef::new(1);
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(THREADS + 1);
    thread::scope(|s| {
        s.spawn(|| {
            barrier.wait();
            while !stop.load(Ordering::Relaxed) {
                lr.lock();
                assert!(lr.count() >= 1, "{v}: count fell below the base reference");
                lr.inc_locked();
                for _ in 0..8 {
                    std::hint::spin_loop();
                }
                assert!(lr.dec_locked() >= 1);
                lr.unlock();
                thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (lr, barrier) = (&lr, &barrier);
                s.spawn(move || {
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
                    barrier.wait();
                    let mut held = 0u32;
                    for _ in 0..OPS {
                        let r = rng.next();
                        if held == 0 || (held < 8 && r & 1 == 0) {
                            match (r >> 1) % 3 {
                                0 => lr.get(v),
                                1 => assert!(lr.get_not_zero(v), "{v}: get_not_zero failed"),
                                _ => assert!(lr.get_not_dead(v), "{v}: get_not_dead failed"),
                            }
                            held += 1;
                        } else {
                            put_not_last(lr, v, (r >> 1) & 1 == 0);
                            held -= 1;
                        }
                    }
                    for _ in 0..held {
                        put_not_last(lr, v, false);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(lr.count(), 1, "{v}: lost or invented a count");
    assert!(!lr.is_locked());
}

#[test]
fn stress_counts_spin() {
    stress_counts(LockRefVariant::Spin);
}
#[test]
fn stress_counts_cmpxchg2() {
    stress_counts(LockRefVariant::Cmpxchg2);
}
#[test]
fn stress_counts_lockref() {
    stress_counts(LockRefVariant::Lockref);
}
#[test]
fn stress_counts_lockref_wait() {
    stress_counts(LockRefVariant::LockrefWait);
}

/// Every thread starts with one reference and churns; exactly one final put
/// finds itself last (lock held, count 1), kills the object, and afterwards
/// no `get_not_dead`/`get_not_zero` succeeds.
fn exactly_one_last(v: LockRefVariant) {
    let lr = LockRef::new(THREADS as i32);
    let lasts = AtomicUsize::new(0);
    let barrier = Barrier::new(THREADS);
    thread::scope(|s| {
        for t in 0..THREADS {
            let (lr, lasts, barrier) = (&lr, &lasts, &barrier);
            s.spawn(move || {
                barrier.wait();
                for i in 0..OPS / 4 {
                    lr.get(v);
                    put_not_last(lr, v, (i + t) & 1 == 0);
                }
                if !lr.put_or_lock(v) {
                    assert!(lr.is_locked());
                    assert_eq!(lr.count(), 1, "{v}: put_or_lock locked above 1");
                    assert_eq!(lr.dec_locked(), 0);
                    lr.mark_dead_locked();
                    lr.unlock();
                    lasts.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    assert_eq!(lasts.load(Ordering::SeqCst), 1, "{v}");
    assert!(lr.is_dead());
    assert_eq!(lr.count(), LOCKREF_DEAD);
    assert!(!lr.get_not_dead(v));
    assert!(!lr.get_not_zero(v));
    assert_eq!(lr.put_return(v), None);
}

#[test]
fn exactly_one_last_spin() {
    exactly_one_last(LockRefVariant::Spin);
}
#[test]
fn exactly_one_last_cmpxchg2() {
    exactly_one_last(LockRefVariant::Cmpxchg2);
}
#[test]
fn exactly_one_last_lockref() {
    exactly_one_last(LockRefVariant::Lockref);
}
#[test]
fn exactly_one_last_lockref_wait() {
    exactly_one_last(LockRefVariant::LockrefWait);
}

/// Zero-count revival races with a reclaimer that kills the object only at
/// count 0 under the lock: a successful `get_not_dead` never yields a dead
/// object.
#[test]
fn revive_races_reclaim() {
    for v in LockRefVariant::ALL {
        for _ in 0..if cfg!(miri) { 2 } else { 200 } {
            let lr = LockRef::new(0);
            thread::scope(|s| {
                s.spawn(|| {
                    lr.lock();
                    if lr.count() == 0 {
                        lr.mark_dead_locked();
                    }
                    lr.unlock();
                });
                s.spawn(|| {
                    if lr.get_not_dead(v) {
                        assert!(!lr.is_dead(), "{v}: revived a dead object");
                        if !lr.put_or_lock(v) {
                            lr.dec_locked();
                            lr.unlock();
                        }
                    }
                });
            });
            assert!(lr.count() == 0 || lr.is_dead());
        }
    }
}

// ----- single-threaded semantics ---------------------------------------------

#[test]
fn semantics_of_each_operation() {
    for v in LockRefVariant::ALL {
        let lr = LockRef::new(0);
        assert!(!lr.get_not_zero(v), "{v}");
        assert_eq!(lr.count(), 0);
        assert!(lr.get_not_dead(v), "{v}: revive 0 -> 1");
        assert_eq!(lr.count(), 1);
        lr.get(v);
        lr.get(v);
        assert_eq!(lr.count(), 3);
        assert!(lr.get_not_zero(v));
        assert_eq!(lr.count(), 4);
        assert!(lr.put_or_lock(v));
        assert_eq!(lr.count(), 3);

        // put_return: lockless only; spin never, cmpxchg2 only above 2.
        let r = lr.put_return(v);
        match v {
            LockRefVariant::Spin => assert_eq!(r, None),
            _ => assert_eq!(r, Some(2), "{v}"),
        }
        if r.is_none() {
            assert!(lr.put_or_lock(v));
        }
        assert_eq!(lr.count(), 2);
        let r = lr.put_return(v);
        match v {
            LockRefVariant::Spin | LockRefVariant::Cmpxchg2 => assert_eq!(r, None, "{v}"),
            _ => assert_eq!(r, Some(1), "{v}"),
        }
        if r.is_none() {
            assert!(lr.put_or_lock(v), "{v}: 2 -> 1 without the lock held after");
        }
        assert_eq!(lr.count(), 1);
        assert!(!lr.is_locked());

        // The last reference: put_or_lock returns holding the lock.
        assert!(!lr.put_or_lock(v), "{v}");
        assert!(lr.is_locked());
        assert_eq!(
            lr.count(),
            1,
            "{v}: put_or_lock changed the count when locking"
        );
        assert_eq!(lr.dec_locked(), 0);
        lr.unlock();
        assert!(!lr.is_locked());

        // put_return on 1 may reach 0 (lockless variants).
        lr.get(v);
        match (v, lr.put_return(v)) {
            (LockRefVariant::Spin | LockRefVariant::Cmpxchg2, None) => {
                assert!(!lr.put_or_lock(v));
                lr.dec_locked();
                lr.unlock();
            }
            (_, Some(0)) => {}
            (_, other) => panic!("{v}: put_return on 1 gave {other:?}"),
        }
        assert_eq!(lr.count(), 0);
        assert_eq!(lr.put_return(v), None, "{v}: put_return on 0");

        // Death is final.
        lr.lock();
        lr.mark_dead_locked();
        lr.unlock();
        assert!(lr.is_dead());
        assert!(!lr.get_not_dead(v));
        assert!(!lr.get_not_zero(v));
        assert_eq!(lr.count(), LOCKREF_DEAD);

        // set_count_locked / inc_locked.
        lr.lock();
        lr.set_count_locked(5);
        lr.inc_locked();
        assert_eq!(lr.count(), 6);
        lr.unlock();
        assert!(!lr.is_dead());
    }
}

#[test]
fn try_lock_and_is_locked() {
    let lr = LockRef::new(3);
    assert!(lr.try_lock());
    assert!(!lr.try_lock());
    assert!(lr.is_locked());
    assert_eq!(lr.count(), 3);
    lr.unlock();
    assert!(!lr.is_locked());
    assert_eq!(format!("{lr:?}"), "LockRef { count: 3, locked: false }");
}

/// With the lock held by someone else, the lockless paths behave as their
/// variant says: `lockref` gives up at once, `lockref-wait` spends its budget
/// waiting, `cmpxchg2` ignores the lock above its thresholds.
#[test]
fn lockless_paths_with_lock_held() {
    let lr = LockRef::new(5);
    lr.lock();

    let before = lockstat::thread_snapshot();
    assert_eq!(lr.put_return(LockRefVariant::Lockref), None);
    let d = lockstat::thread_snapshot().delta(&before);
    assert_eq!(d.get(Stat::LockrefWait), 0);
    assert_eq!(d.get(Stat::LockrefFast), 0);

    let before = lockstat::thread_snapshot();
    assert_eq!(lr.put_return(LockRefVariant::LockrefWait), None);
    let d = lockstat::thread_snapshot().delta(&before);
    if lockstat::enabled() {
        assert_eq!(d.get(Stat::LockrefWait), 1, "one op waited");
        assert!(d.get(Stat::LockrefWaitSpins) >= 1);
    }

    assert_eq!(lr.put_return(LockRefVariant::Spin), None);
    // cmpxchg2 updates counts above 2 even while the lock is held (2013).
    assert_eq!(lr.put_return(LockRefVariant::Cmpxchg2), Some(4));
    assert_eq!(lr.count(), 4);
    assert!(
        lr.is_locked(),
        "a lockless update must not disturb the lock half"
    );
    lr.unlock();
    assert_eq!(lr.count(), 4);
}

/// Fast and locked paths are counted per operation.
#[test]
fn operations_are_counted() {
    if !lockstat::enabled() {
        return;
    }
    for v in LockRefVariant::ALL {
        let lr = LockRef::new(3);
        let before = lockstat::thread_snapshot();
        for _ in 0..10 {
            lr.get(v);
            assert!(lr.put_or_lock(v));
        }
        let d = lockstat::thread_snapshot().delta(&before);
        let (fast, locked) = (d.get(Stat::LockrefFast), d.get(Stat::LockrefLocked));
        assert_eq!(fast + locked, 20, "{v}: every op counted once");
        match v {
            LockRefVariant::Spin => assert_eq!(locked, 20),
            _ => assert_eq!(fast, 20, "{v}: uncontended ops take the fast path"),
        }
        // Fast ops: one CAS each. Locked ops: acquire + unlock.
        assert_eq!(d.get(Stat::SharedWrite), fast + 2 * locked, "{v}");
    }
}
