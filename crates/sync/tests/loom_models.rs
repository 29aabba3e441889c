//! Loom models of the lock-free algorithms in scalevfs-sync.
//!
//! Run with `ci/loom.sh` (or
//! `RUSTFLAGS="--cfg loom" cargo test -p scalevfs-sync --release --test loom_models`).
//! Each model is explored exhaustively up to a preemption bound (default 3,
//! 2 for three-thread models; `LOOM_MAX_PREEMPTIONS` overrides it). Under
//! loom `LOCKREF_RETRIES` is 3, so the "retries exhausted" fallback is
//! reachable in the models.
//!
//! Properties:
//! - (a) concurrent get/put never lose a count; the count returns to start,
//!   also while an outside thread takes the lock.
//! - (b) `put_or_lock` returns holding the lock exactly for the last
//!   reference, and `get_not_zero` never succeeds on a count that reached 0.
//! - (b') whoever drops the last reference may free the object: every other
//!   holder's accesses happen-before that (checked with loom's `UnsafeCell`).
//! - (c) after `mark_dead_locked`, `get_not_dead` never succeeds; a successful
//!   `get_not_dead` never yields a dead object.
//! - (d) a sequence-counter reader that passes `retry` never sees a
//!   half-written pair of words.
//! - (e) the lock half of a `LockRef` and `SpinLock` give mutual exclusion and
//!   happens-before between critical sections (checked with loom's
//!   `UnsafeCell`, which reports unsynchronised accesses).
//!
//! Loom limitation: loom 0.7 cannot explore three threads that busy-wait on
//! the same lock (the yielded spinners can be scheduled against each other
//! forever and the model exceeds its branch limit, tokio-rs/loom#162; even a
//! three-thread `swap` spinlock does). Models in which three threads could
//! all end up waiting for the lock half therefore use two threads for the
//! lock-heavy variants (`spin`, `cmpxchg2`), and three only where at most two
//! can be waiting at once.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::model::Builder;
use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use scalevfs_sync::{LockRef, LockRefVariant, SeqCount, SeqLock, SpinLock};

fn model(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(bound);
    }
    b.check(f);
}

/// Drop one reference that is known not to be the last.
fn put_not_last(lr: &LockRef, v: LockRefVariant, lockless_first: bool) {
    if lockless_first {
        if let Some(n) = lr.put_return(v) {
            assert!(
                n >= 1,
                "put_return reached {n} although another reference exists"
            );
            return;
        }
    }
    assert!(
        lr.put_or_lock(v),
        "put_or_lock took the lock although another reference exists"
    );
}

// ----- (a) counts ------------------------------------------------------------

fn counts_two_threads(v: LockRefVariant) {
    model(3, move || {
        let lr = Arc::new(LockRef::new(1));
        let t = {
            let lr = lr.clone();
            thread::spawn(move || {
                lr.get(v);
                put_not_last(&lr, v, true);
            })
        };
        lr.get(v);
        put_not_last(&lr, v, false);
        t.join().unwrap();
        assert_eq!(lr.count(), 1);
        assert!(!lr.is_locked());
    });
}

/// Three threads doing get/put at once. Only the CAS-loop variants: their
/// lock is reached only after the retry budget runs out, so at most two
/// threads can end up waiting for it (see the module comment).
fn counts_three_threads(v: LockRefVariant) {
    model(2, move || {
        let lr = Arc::new(LockRef::new(1));
        let ts: Vec<_> = (0..2)
            .map(|i| {
                let lr = lr.clone();
                thread::spawn(move || {
                    lr.get(v);
                    put_not_last(&lr, v, i == 0);
                })
            })
            .collect();
        assert!(lr.get_not_dead(v));
        put_not_last(&lr, v, true);
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(lr.count(), 1);
        assert!(!lr.is_locked());
    });
}

/// `two_workers`: a second worker thread besides the model's main thread
/// (three threads in all; only for variants where at most two of them can be
/// waiting for the lock at once, see the module comment).
fn counts_with_outside_locker(v: LockRefVariant, two_workers: bool) {
    model(2, move || {
        let lr = Arc::new(LockRef::new(1));
        let locker = {
            let lr = lr.clone();
            thread::spawn(move || {
                lr.lock();
                let c = lr.count();
                assert!(c >= 1);
                lr.inc_locked();
                // (Under cmpxchg2 the count may move above 1 meanwhile.)
                assert!(lr.dec_locked() >= 1);
                lr.unlock();
            })
        };
        let t = two_workers.then(|| {
            let lr = lr.clone();
            thread::spawn(move || {
                assert!(lr.get_not_zero(v));
                put_not_last(&lr, v, true);
            })
        });
        lr.get(v);
        put_not_last(&lr, v, !two_workers);
        if let Some(t) = t {
            t.join().unwrap();
        }
        locker.join().unwrap();
        assert_eq!(lr.count(), 1);
        assert!(!lr.is_locked());
    });
}

#[test]
fn a_counts_spin() {
    counts_two_threads(LockRefVariant::Spin);
}
#[test]
fn a_counts_cmpxchg2() {
    counts_two_threads(LockRefVariant::Cmpxchg2);
}
#[test]
fn a_counts_lockref() {
    counts_two_threads(LockRefVariant::Lockref);
}
#[test]
fn a_counts_lockref_wait() {
    counts_two_threads(LockRefVariant::LockrefWait);
}
#[test]
fn a_counts_three_lockref() {
    counts_three_threads(LockRefVariant::Lockref);
}
#[test]
fn a_counts_three_lockref_wait() {
    counts_three_threads(LockRefVariant::LockrefWait);
}
#[test]
fn a_counts_outside_locker_spin() {
    counts_with_outside_locker(LockRefVariant::Spin, false);
}
#[test]
fn a_counts_outside_locker_cmpxchg2() {
    counts_with_outside_locker(LockRefVariant::Cmpxchg2, false);
}
#[test]
fn a_counts_outside_locker_lockref() {
    counts_with_outside_locker(LockRefVariant::Lockref, true);
}
#[test]
fn a_counts_outside_locker_lockref_wait() {
    counts_with_outside_locker(LockRefVariant::LockrefWait, true);
}

// ----- (b) the last reference ------------------------------------------------

/// `owners` threads (1 or 2) drop their references while the model's main
/// thread tries `get_not_zero`. The owner of the last reference must get the
/// lock with count 1, take the count to 0 and retire the object; a
/// `get_not_zero` that succeeds must find the object live, and one that runs
/// after the count reached 0 must fail. (Two owners make three threads; `spin`
/// uses one, see the module comment.)
fn last_put_takes_lock(v: LockRefVariant, owners: usize) {
    model(2, move || {
        let lr = Arc::new(LockRef::new(owners as i32));
        let live = Arc::new(AtomicBool::new(true));
        let lasts = Arc::new(AtomicUsize::new(0));

        let put = {
            let (lr, live, lasts) = (lr.clone(), live.clone(), lasts.clone());
            move || {
                if !lr.put_or_lock(v) {
                    assert!(
                        lr.is_locked(),
                        "put_or_lock returned false without the lock"
                    );
                    assert_eq!(lr.count(), 1, "put_or_lock returned false above 1");
                    live.store(false, Ordering::SeqCst);
                    assert_eq!(lr.dec_locked(), 0);
                    lr.unlock();
                    lasts.fetch_add(1, Ordering::SeqCst);
                }
            }
        };
        let threads: Vec<_> = (0..owners).map(|_| thread::spawn(put.clone())).collect();

        let saw_zero = lasts.load(Ordering::SeqCst) == 1;
        if lr.get_not_zero(v) {
            assert!(
                !saw_zero,
                "get_not_zero succeeded after the count reached 0"
            );
            assert!(
                live.load(Ordering::SeqCst),
                "get_not_zero revived a retired object"
            );
            put();
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(
            lasts.load(Ordering::SeqCst),
            1,
            "exactly one last reference"
        );
        assert_eq!(lr.count(), 0);
        assert!(!lr.is_locked());
    });
}

#[test]
fn b_last_put_spin() {
    last_put_takes_lock(LockRefVariant::Spin, 1);
}
#[test]
fn b_last_put_cmpxchg2() {
    last_put_takes_lock(LockRefVariant::Cmpxchg2, 2);
}
#[test]
fn b_last_put_lockref() {
    last_put_takes_lock(LockRefVariant::Lockref, 2);
}
#[test]
fn b_last_put_lockref_wait() {
    last_put_takes_lock(LockRefVariant::LockrefWait, 2);
}

/// `put_return` may take the count to 0 without the lock; exactly one of two
/// racing droppers then owns the zero.
fn put_return_zero_is_unique(v: LockRefVariant) {
    model(3, move || {
        let lr = Arc::new(LockRef::new(2));
        let zeros = Arc::new(AtomicUsize::new(0));
        let drop_ref = {
            let (lr, zeros) = (lr.clone(), zeros.clone());
            move || match lr.put_return(v) {
                Some(0) => {
                    zeros.fetch_add(1, Ordering::SeqCst);
                }
                Some(_) => {}
                None => {
                    if !lr.put_or_lock(v) {
                        assert_eq!(lr.dec_locked(), 0);
                        lr.unlock();
                        zeros.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        };
        let t = thread::spawn(drop_ref.clone());
        drop_ref();
        t.join().unwrap();
        assert_eq!(zeros.load(Ordering::SeqCst), 1);
        assert_eq!(lr.count(), 0);
    });
}

#[test]
fn b_put_return_zero_lockref() {
    put_return_zero_is_unique(LockRefVariant::Lockref);
}
#[test]
fn b_put_return_zero_lockref_wait() {
    put_return_zero_is_unique(LockRefVariant::LockrefWait);
}
#[test]
fn b_put_return_zero_cmpxchg2() {
    put_return_zero_is_unique(LockRefVariant::Cmpxchg2);
}

/// The object's memory is modelled by a loom `UnsafeCell`: every holder reads
/// it while holding its reference, and whoever drops the last reference
/// "frees" it (writes it). Loom reports the write as a data race unless every
/// earlier reader's accesses happen-before it, i.e. unless the puts order
/// memory (a Relaxed count update would fail here).
fn free_after_last_put(v: LockRefVariant) {
    model(3, move || {
        let obj = Arc::new((LockRef::new(2), UnsafeCell::new(7u32)));
        let release = {
            let obj = obj.clone();
            move || {
                // SAFETY: we hold a reference, so nobody frees (writes) it.
                let x = obj.1.with(|p| unsafe { *p });
                assert_eq!(x, 7);
                let last = match obj.0.put_return(v) {
                    Some(n) => n == 0,
                    None => {
                        if obj.0.put_or_lock(v) {
                            false
                        } else {
                            obj.0.dec_locked();
                            obj.0.mark_dead_locked();
                            obj.0.unlock();
                            true
                        }
                    }
                };
                if last {
                    // SAFETY: last reference: no other holder may access it.
                    obj.1.with_mut(|p| unsafe { *p = 0 });
                }
            }
        };
        let t = thread::spawn(release.clone());
        release();
        t.join().unwrap();
    });
}

#[test]
fn b_free_after_last_put_spin() {
    free_after_last_put(LockRefVariant::Spin);
}
#[test]
fn b_free_after_last_put_cmpxchg2() {
    free_after_last_put(LockRefVariant::Cmpxchg2);
}
#[test]
fn b_free_after_last_put_lockref() {
    free_after_last_put(LockRefVariant::Lockref);
}
#[test]
fn b_free_after_last_put_lockref_wait() {
    free_after_last_put(LockRefVariant::LockrefWait);
}

// ----- (c) dead is final -----------------------------------------------------

/// A cached, unused object (count 0) is killed under the lock by a reclaimer
/// while a lookup tries to revive it with `get_not_dead`.
fn dead_is_final(v: LockRefVariant) {
    model(3, move || {
        let lr = Arc::new(LockRef::new(0));
        let killed = Arc::new(AtomicBool::new(false));
        let reclaimer = {
            let (lr, killed) = (lr.clone(), killed.clone());
            thread::spawn(move || {
                lr.lock();
                if lr.count() == 0 {
                    lr.mark_dead_locked();
                    lr.unlock();
                    killed.store(true, Ordering::SeqCst);
                } else {
                    lr.unlock();
                }
            })
        };
        let saw_killed = killed.load(Ordering::SeqCst);
        if lr.get_not_dead(v) {
            assert!(!saw_killed, "get_not_dead succeeded after mark_dead_locked");
            assert!(!lr.is_dead(), "get_not_dead returned a dead object");
            if !lr.put_or_lock(v) {
                lr.dec_locked();
                lr.unlock();
            }
        } else {
            assert!(lr.is_dead());
        }
        reclaimer.join().unwrap();
        assert!(!lr.get_not_dead(v) || !killed.load(Ordering::SeqCst));
        assert!(!lr.is_locked());
    });
}

#[test]
fn c_dead_spin() {
    dead_is_final(LockRefVariant::Spin);
}
#[test]
fn c_dead_cmpxchg2() {
    dead_is_final(LockRefVariant::Cmpxchg2);
}
#[test]
fn c_dead_lockref() {
    dead_is_final(LockRefVariant::Lockref);
}
#[test]
fn c_dead_lockref_wait() {
    dead_is_final(LockRefVariant::LockrefWait);
}

// ----- (d) sequence counters -------------------------------------------------

#[test]
fn d_seqcount_no_torn_read() {
    model(3, || {
        let s = Arc::new((SeqCount::new(), AtomicU64::new(0), AtomicU64::new(0)));
        let w = {
            let s = s.clone();
            thread::spawn(move || {
                for i in 1..=2 {
                    s.0.write_begin();
                    s.1.store(i, Ordering::Relaxed);
                    s.2.store(i, Ordering::Relaxed);
                    s.0.write_end();
                }
            })
        };
        for _ in 0..2 {
            let start = s.0.read_begin();
            let a = s.1.load(Ordering::Relaxed);
            let b = s.2.load(Ordering::Relaxed);
            if !s.0.retry(start) {
                assert_eq!(a, b, "validated read saw a half-written pair");
            }
        }
        w.join().unwrap();
    });
}

#[test]
fn d_seqcount_raw_begin_and_invalidate() {
    model(3, || {
        let s = Arc::new((SeqCount::new(), AtomicU64::new(0), AtomicU64::new(0)));
        let w = {
            let s = s.clone();
            thread::spawn(move || {
                s.0.write_begin();
                s.1.store(1, Ordering::Relaxed);
                s.2.store(1, Ordering::Relaxed);
                s.0.write_end();
                // Unpaired changes after an invalidation (the d_drop pattern):
                // a reader that sees them must fail validation if it started
                // before the invalidation.
                s.0.invalidate();
                s.1.store(2, Ordering::Relaxed);
            })
        };
        let start = s.0.raw_read_begin();
        let a = s.1.load(Ordering::Relaxed);
        let b = s.2.load(Ordering::Relaxed);
        if !s.0.retry(start) {
            assert_eq!(start & 1, 0);
            // A reader that started after the invalidation may see the
            // unpaired store; one that started before must not.
            if start < 4 {
                assert_eq!(
                    a, b,
                    "validated read saw a half-written pair or a later store"
                );
            }
        }
        w.join().unwrap();
    });
}

#[test]
fn d_seqlock_no_torn_read() {
    model(3, || {
        let s = Arc::new(SeqLock::new([0u64; 2]));
        let w = {
            let s = s.clone();
            thread::spawn(move || {
                for i in 1..=2u64 {
                    s.write(|v| *v = [i, i]);
                }
            })
        };
        let v = s.read();
        assert_eq!(v[0], v[1]);
        w.join().unwrap();
        assert_eq!(s.read(), [2, 2]);
    });
}

// ----- (e) mutual exclusion --------------------------------------------------

#[test]
fn e_lockref_lock_excludes() {
    model(3, || {
        let lr = Arc::new((LockRef::new(1), UnsafeCell::new(0u32)));
        let t = {
            let lr = lr.clone();
            thread::spawn(move || {
                lr.0.lock();
                // SAFETY: the lock half excludes the other thread's access.
                lr.1.with_mut(|p| unsafe { *p += 1 });
                lr.0.unlock();
            })
        };
        while !lr.0.try_lock() {
            thread::yield_now();
        }
        // SAFETY: as above.
        lr.1.with_mut(|p| unsafe { *p += 1 });
        lr.0.unlock();
        t.join().unwrap();
        // SAFETY: the other thread has been joined.
        assert_eq!(lr.1.with(|p| unsafe { *p }), 2);
    });
}

#[test]
fn e_spinlock_excludes() {
    model(3, || {
        let l = Arc::new(SpinLock::new(UnsafeCell::new(0u32)));
        let t = {
            let l = l.clone();
            thread::spawn(move || {
                let g = l.lock();
                // SAFETY: the guard excludes the other thread's access.
                g.with_mut(|p| unsafe { *p += 1 });
            })
        };
        {
            let g = l.lock();
            // SAFETY: as above.
            g.with_mut(|p| unsafe { *p += 1 });
        }
        t.join().unwrap();
        let g = l.lock();
        // SAFETY: as above.
        assert_eq!(g.with(|p| unsafe { *p }), 2);
    });
}
