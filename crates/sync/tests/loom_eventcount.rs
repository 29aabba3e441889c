//! Loom model of `EventCount`: a waiter that would sleep (its condition
//! false, the count unchanged after it announced itself) is always seen by
//! the notifier, which then makes the wake-up call; a notifier that skips
//! the call has a waiter that will not sleep (a lost wake-up would leave
//! the waiter asleep for ever).
//!
//! The condition flag goes through the crate's loom shim, whose `SeqCst`
//! loads are read-only RMWs (loom weakens `SeqCst` to acquire-release; see
//! `primitive.rs`).
//!
//! Run with `ci/loom.sh loom_eventcount`.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use scalevfs_sync::primitive::{AtomicBool, Ordering};
use scalevfs_sync::EventCount;

#[test]
fn a_waiter_that_would_sleep_is_always_woken() {
    loom::model(|| {
        let ev = Arc::new(EventCount::new());
        let ready = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (ev, ready) = (ev.clone(), ready.clone());
            thread::spawn(move || {
                let seen = ev.prepare();
                // SeqCst: the condition, as the caller checks it.
                if ready.load(Ordering::SeqCst) {
                    return false;
                }
                // A waiter that sleeps stays announced until woken (here:
                // for the rest of the model); one that does not takes it
                // back at once, as `wait` does.
                let sleeps = ev.announce(seen);
                if !sleeps {
                    ev.unannounce();
                }
                sleeps
            })
        };
        // SeqCst: the change the waiter waits for, then the event.
        ready.store(true, Ordering::SeqCst);
        let woke = ev.notify();
        let slept = waiter.join().unwrap();
        assert!(!slept || woke, "the waiter would sleep and no one wakes it");
    });
}
