//! [`Turnstile`]: numbered tickets that pass one at a time, in order.
//!
//! The ext4 journal writes the log of several transactions at once (each
//! by the thread that committed it) but lets them reach the disk in their
//! order: a transaction's commit block is written only after every earlier
//! one's, so "commit `n` is durable" still means "every commit before it
//! is". Each transaction gets a ticket when its log space is reserved
//! (under the commit lock, so tickets follow the log); its writer does its
//! work, then waits for its turn (`wait_turn`), writes the commit block
//! and `pass`es. A checkpoint waits for the turn after the last ticket
//! given out. A writer that fails calls `fail`: every waiter, now and
//! later, gets `false` (nothing after a failed transaction may claim to
//! be durable).
//!
//! Waiting: a short spin, a few yields, then a sleep on `epoch`, which
//! every `pass` and `fail` bumps after its store (an [`EventCount`]: no
//! wake-up call when no one sleeps, the common case). The waiter reads `epoch` before it checks the
//! ticket, so a pass between the check and the sleep changes `epoch` and
//! the sleep returns at once.

use crate::eventcount::EventCount;
use crate::primitive::{AtomicBool, AtomicU64, Ordering};

/// Tickets that pass in order (see the module documentation).
#[derive(Debug)]
pub struct Turnstile {
    /// Tickets passed: the next ticket to pass is this one.
    passed: AtomicU64,
    failed: AtomicBool,
    /// Bumped by every `pass` and `fail`; sleepers wait for it to change.
    epoch: EventCount,
}

impl Default for Turnstile {
    fn default() -> Self {
        Self::new()
    }
}

impl Turnstile {
    /// A turnstile whose first ticket is 0.
    pub fn new() -> Turnstile {
        Turnstile {
            passed: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            epoch: EventCount::new(),
        }
    }

    /// Tickets passed so far.
    pub fn passed(&self) -> u64 {
        // SeqCst: see `wait_turn`.
        self.passed.load(Ordering::SeqCst)
    }

    /// Whether a ticket holder failed.
    pub fn failed(&self) -> bool {
        // SeqCst: see `wait_turn`.
        self.failed.load(Ordering::SeqCst)
    }

    /// One look: `Some(true)` if every ticket before `k` has passed,
    /// `Some(false)` if a holder failed, `None` to wait. (`wait_turn`
    /// repeats it; the loom model checks this step, as loom cannot explore
    /// an unbounded waiting loop.)
    pub fn turn(&self, k: u64) -> Option<bool> {
        // SeqCst: see `wait_turn`.
        if self.failed.load(Ordering::SeqCst) {
            return Some(false);
        }
        (self.passed.load(Ordering::SeqCst) >= k).then_some(true)
    }

    /// Wait until every ticket before `k` has passed: true then, false if
    /// a holder failed (now or before).
    pub fn wait_turn(&self, k: u64) -> bool {
        let mut spins = 0u32;
        loop {
            // SeqCst (this load, the two in `turn`, and `pass`'s and
            // `fail`'s store then bump): if this load of `epoch` comes
            // before a bump, the sleep below returns at once; if after, the
            // store before that bump is seen by `turn`. The pass also
            // publishes what its holder did before it (the ticket orders
            // that work).
            let e = self.epoch.prepare();
            if let Some(r) = self.turn(k) {
                return r;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 96 {
                crate::primitive::yield_now();
            } else {
                self.epoch.wait(e);
            }
        }
    }

    /// Ticket `k` passes (its holder waited for its turn and is done).
    pub fn pass(&self, k: u64) {
        // SeqCst: see `wait_turn`. An RMW, not a store: only the holder
        // whose turn it is changes `passed`, so both write k + 1, and the
        // RMW checks that (loom also models an RMW against the read-only
        // RMWs of its SeqCst loads, where a plain store lost to them).
        let was = self.passed.fetch_add(1, Ordering::SeqCst);
        debug_assert_eq!(was, k, "ticket passed out of turn");
        self.bump();
    }

    /// A holder failed: every waiter gets false from now on.
    pub fn fail(&self) {
        // SeqCst: see `wait_turn` (an RMW, as `pass`).
        self.failed.fetch_or(true, Ordering::SeqCst);
        self.bump();
    }

    fn bump(&self) {
        // SeqCst: see `wait_turn`.
        self.epoch.notify();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Eight threads holding tickets in shuffled order pass in ticket
    /// order, and a holder sees every earlier holder's work done.
    #[test]
    fn tickets_pass_in_order() {
        let t = Turnstile::new();
        let log = std::sync::Mutex::new(Vec::new());
        let work = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for k in [5u64, 2, 7, 0, 3, 6, 1, 4] {
                let (t, log, work) = (&t, &log, &work);
                s.spawn(move || {
                    assert!(t.wait_turn(k));
                    // Relaxed: the turnstile orders it.
                    assert_eq!(work.load(std::sync::atomic::Ordering::Relaxed), k as usize);
                    work.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    log.lock().unwrap().push(k);
                    t.pass(k);
                });
            }
        });
        assert_eq!(*log.lock().unwrap(), (0..8).collect::<Vec<u64>>());
        assert!(t.wait_turn(8));
    }

    /// After a failure every waiter, sleeping or new, gets false.
    #[test]
    fn a_failure_releases_every_waiter() {
        let t = Turnstile::new();
        std::thread::scope(|s| {
            let waiters: Vec<_> = (1..4u64)
                .map(|k| {
                    let t = &t;
                    s.spawn(move || t.wait_turn(k))
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_millis(20));
            t.fail();
            for w in waiters {
                assert!(!w.join().unwrap());
            }
        });
        assert!(!t.wait_turn(0));
    }
}
