//! Loom model of `Turnstile` (the ext4 journal's order in which
//! transactions written at once become durable): ticket 1 passes only
//! after ticket 0, its holder then sees ticket 0's work (checked with
//! loom's `UnsafeCell`, which reports unsynchronised accesses), and a
//! failure of ticket 0 releases ticket 1's waiter with `false`, never
//! letting it through.
//!
//! Run with `ci/loom.sh loom_turnstile`.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use scalevfs_sync::Turnstile;

struct Shared {
    t: Turnstile,
    /// Written by each ticket's holder before it passes.
    log: UnsafeCell<Vec<u64>>,
}

// SAFETY: `log` is touched only by the holder whose turn it is; the model
// checks exactly that.
unsafe impl Sync for Shared {}

/// Ticket `k`'s holder, one look at its turn (loom cannot explore the
/// waiting loop): `None` if it is not its turn yet, else whether it went
/// through.
fn holder(s: &Shared, k: u64, fail: bool) -> Option<bool> {
    if !s.t.turn(k)? {
        return Some(false);
    }
    if fail {
        s.t.fail();
        return Some(false);
    }
    // SAFETY: our turn (the property under test).
    s.log.with_mut(|l| unsafe { (*l).push(k) });
    s.t.pass(k);
    Some(true)
}

/// Ticket 0's holder on this thread (failing if `fail`), ticket 1's on
/// another: the shared state and what each holder's look gave.
fn two_holders(fail: bool) -> (Arc<Shared>, Option<bool>, Option<bool>) {
    let s = Arc::new(Shared {
        t: Turnstile::new(),
        log: UnsafeCell::new(Vec::new()),
    });
    let second = {
        let s = s.clone();
        thread::spawn(move || holder(&s, 1, false))
    };
    let first = holder(&s, 0, fail);
    let went = second.join().unwrap();
    (s, first, went)
}

#[test]
fn tickets_pass_in_order_and_see_the_earlier_work() {
    loom::model(|| {
        let (s, first, went) = two_holders(false);
        assert_eq!(first, Some(true));
        // SAFETY: both holders are done (joined).
        let log = s.log.with(|l| unsafe { (*l).clone() });
        match went {
            Some(true) => assert_eq!(log, [0, 1]),
            None => assert_eq!(log, [0]),
            Some(false) => panic!("no ticket failed"),
        }
        assert_eq!(s.t.turn(1), Some(true));
    });
}

#[test]
fn a_failed_ticket_stops_the_later_ones() {
    loom::model(|| {
        let (s, first, went) = two_holders(true);
        assert_eq!(first, Some(false));
        assert_ne!(went, Some(true));
        assert_eq!(s.t.turn(1), Some(false));
        // SAFETY: both holders are done.
        s.log.with(|l| assert!(unsafe { &*l }.is_empty()));
    });
}
