//! Loom model of `Offer` (the ext4 journal's offer of a commit's log
//! writes to the threads waiting for it): exactly one of the owner and a
//! helper does the work, and once the owner sees the outcome, the work's
//! effects are visible to it (checked with loom's `UnsafeCell`, which
//! reports unsynchronised accesses).
//!
//! Run with `ci/loom.sh loom_offer`.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use scalevfs_sync::Offer;

struct Shared {
    offer: Offer,
    /// Written by whoever does the work (the "log writes").
    written: UnsafeCell<u64>,
}

// SAFETY: `written` is touched only by the taker of `offer` and by the
// owner after it saw the outcome; the model checks exactly that.
unsafe impl Sync for Shared {}

fn work(s: &Shared, by: u64) {
    // SAFETY: only the taker gets here (the property under test).
    s.written.with_mut(|w| unsafe { *w += by });
    s.offer.complete(by as i64);
}

#[test]
fn one_worker_and_its_writes_seen_by_the_owner() {
    loom::model(|| {
        let s = Arc::new(Shared {
            offer: Offer::new(),
            written: UnsafeCell::new(0),
        });
        let helper = {
            let s = s.clone();
            thread::spawn(move || {
                if s.offer.take() {
                    work(&s, 2);
                    true
                } else {
                    false
                }
            })
        };
        // The owner: does the work unless the helper took it, then waits.
        let mine = s.offer.take();
        if mine {
            work(&s, 1);
        }
        let outcome = loop {
            if let Some(o) = s.offer.outcome() {
                break o;
            }
            thread::yield_now();
        };
        // SAFETY: the outcome was seen (the property under test).
        let w = s.written.with(|w| unsafe { *w });
        assert_eq!(w as i64, outcome);
        assert_eq!(outcome, if mine { 1 } else { 2 });
        let helped = helper.join().unwrap();
        assert_ne!(mine, helped);
    });
}
