//! A piece of work that exactly one of several threads does, and whose
//! owner waits for its outcome: the ext4 journal offers the log writes of
//! a commit to the threads waiting for that commit, so that one of them
//! writes while the committer computes checksums (`crates/ext4/src/txn.rs`,
//! `SharedWrite`).
//!
//! DESIGN
//! - `take` claims the work: `taken` goes false -> true once, so exactly
//!   one caller (the owner or a helper) gets true and must `complete` it.
//!   `Relaxed`: the claim only decides who works; the work's inputs reach
//!   a helper through whatever handed it the `Offer` (a mutex, an `Arc`),
//!   and its effects reach the owner through `done`.
//! - `complete` stores the outcome, then sets `done` with `Release`;
//!   `outcome` reads `done` with `Acquire`, then the outcome: everything
//!   the worker did before `complete` (its writes) happens-before the
//!   owner's next step once it sees the outcome.
//! - Waiting is the owner's business (it spins, then yields: the work is
//!   a few microseconds of writes already under way).
//!
//! Modelled in `tests/loom_offer.rs`.

use crate::primitive::{AtomicBool, AtomicI64, Ordering};

/// See the module documentation.
#[derive(Debug)]
pub struct Offer {
    taken: AtomicBool,
    done: AtomicBool,
    outcome: AtomicI64,
}

impl Default for Offer {
    fn default() -> Offer {
        Offer::new()
    }
}

impl Offer {
    /// Work not yet taken.
    pub fn new() -> Offer {
        Offer {
            taken: AtomicBool::new(false),
            done: AtomicBool::new(false),
            outcome: AtomicI64::new(0),
        }
    }

    /// Claim the work: true for exactly one caller, which must then
    /// [`complete`](Offer::complete) it.
    pub fn take(&self) -> bool {
        // Relaxed: see the module documentation (the claim publishes
        // nothing; `done` does).
        !self.taken.swap(true, Ordering::Relaxed)
    }

    /// The taker: the work is done, with `outcome`.
    pub fn complete(&self, outcome: i64) {
        // Relaxed: published by the Release store of `done` just below.
        self.outcome.store(outcome, Ordering::Relaxed);
        // Release: the work and the outcome before a reader that sees it.
        self.done.store(true, Ordering::Release);
    }

    /// The outcome once the work is complete.
    pub fn outcome(&self) -> Option<i64> {
        // Acquire: pairs with `complete`'s Release store.
        if !self.done.load(Ordering::Acquire) {
            return None;
        }
        // Relaxed: ordered after the Acquire load above.
        Some(self.outcome.load(Ordering::Relaxed))
    }
}
