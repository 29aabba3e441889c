//! A gate that many threads pass through without sharing a lock or a
//! counter, and that one closer can shut and drain: the ext4 journal's
//! "handles" (jbd2's `t_updates`), per thread.
//!
//! DESIGN
//! - `enter` adds one to the caller's own slot (one cache line per slot,
//!   chosen by a thread number), then reads `closed`. `close` sets `closed`,
//!   then waits until every slot reads zero. Both sides are `SeqCst`: the
//!   pair is a Dekker handshake (a store then a load on each side), so
//!   either the entering thread sees `closed` (and backs out) or the closer
//!   sees its count (and waits for it to leave). Never both missed.
//! - A pass leaves on the slot it entered on, so a slot returns to zero
//!   when all of its passes have left; the closer checks each slot on its
//!   own (no sum across slots that could see a count in flight twice).
//! - Waiting (an `enter` while closed, `close` while passes are inside)
//!   spins, yields, then sleeps on an `EventCount` (a futex, woken only
//!   if someone sleeps): `open` notifies `opened`, where entrants sleep; a
//!   pass that leaves while the gate is closed notifies `left`, where the
//!   closer sleeps. Each sleeper reads its word before it
//!   checks its condition, so a change between the check and the sleep
//!   makes the sleep return at once. (It slept in 50 µs steps: with two
//!   threads that fsync and commit in turn, a handle that met a closed
//!   gate, or a commit that waited for a handle, lost most of such a step,
//!   while the gate is closed for a few microseconds.)
//! - One closer at a time: the caller serialises `close`/`open` (the
//!   journal's commit mutex).
//! - Nested passes on one thread must not wait: a thread inside the gate
//!   that enters again gets `enter_nested` (the caller tracks nesting), or
//!   a close waiting for its outer pass would never end.

use crate::eventcount::EventCount;
use crate::primitive::{AtomicBool, AtomicUsize, Ordering};
use crossbeam_utils::CachePadded;

/// See the module documentation.
pub struct Gate {
    closed: CachePadded<AtomicBool>,
    slots: Box<[CachePadded<AtomicUsize>]>,
    /// Notified by `open`; entering threads sleep on it.
    opened: CachePadded<EventCount>,
    /// Bumped by a pass that leaves while the gate is closed; the closer
    /// sleeps on it.
    left: CachePadded<EventCount>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

/// A pass through a [`Gate`]: the closer waits until it is dropped.
#[must_use = "the pass leaves the gate when dropped"]
pub struct Pass<'a> {
    gate: &'a Gate,
    slot: usize,
}

impl std::fmt::Debug for Pass<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pass").field("slot", &self.slot).finish()
    }
}

/// A number for the calling thread, given at its first call (0, 1, 2, ...
/// in order of first use): for spreading threads over slots and shards.
/// Under loom every thread gets 0.
#[cfg(not(loom))]
pub fn thread_number() -> usize {
    use std::sync::atomic::{AtomicUsize as StdUsize, Ordering as O};
    static NEXT: StdUsize = StdUsize::new(0);
    thread_local! {
        // Relaxed: a unique number, publishing nothing.
        static SLOT: usize = NEXT.fetch_add(1, O::Relaxed);
    }
    SLOT.with(|s| *s)
}

/// This thread's number (under loom: 0 for every thread; see below).
#[cfg(loom)]
pub fn thread_number() -> usize {
    // loom threads get distinct ids from loom itself; any stable number is
    // correct (slots may be shared), so the models use one slot per thread
    // through `enter_on`.
    0
}

/// One step of a wait: spin, then yield; false once it is time to sleep.
fn wait_step(spins: &mut u32) -> bool {
    *spins += 1;
    #[cfg(not(loom))]
    {
        if *spins < 64 {
            std::hint::spin_loop();
        } else if *spins < 96 {
            std::thread::yield_now();
        } else {
            return false;
        }
    }
    #[cfg(loom)]
    crate::primitive::thread::yield_now();
    true
}

impl Gate {
    /// An open gate with `slots` counters (rounded up to at least one).
    pub fn new(slots: usize) -> Gate {
        Gate {
            closed: CachePadded::new(AtomicBool::new(false)),
            slots: (0..slots.max(1))
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
            opened: CachePadded::new(EventCount::new()),
            left: CachePadded::new(EventCount::new()),
        }
    }

    /// Enter, waiting while the gate is closed.
    pub fn enter(&self) -> Pass<'_> {
        self.enter_on(thread_number())
    }

    /// Enter on slot `slot` (modulo the slot count): the models pick slots.
    pub fn enter_on(&self, slot: usize) -> Pass<'_> {
        let mut spins = 0;
        loop {
            if let Some(p) = self.try_enter_on(slot) {
                return p;
            }
            // SeqCst: as the other loads of `closed`; waiting until it opens.
            while self.closed.load(Ordering::SeqCst) {
                if wait_step(&mut spins) {
                    continue;
                }
                // The count read before the check (`EventCount`): an
                // `open` after the read makes the sleep return at once.
                let e = self.opened.prepare();
                // SeqCst: as the other loads of `closed`.
                if !self.closed.load(Ordering::SeqCst) {
                    break;
                }
                self.opened.wait(e);
            }
        }
    }

    /// One attempt to enter on slot `slot`: `None` if the gate is closed
    /// (the count was taken back). The step `enter` repeats; the loom model
    /// checks it without the waiting loop (loom cannot explore unbounded
    /// spinning).
    pub fn try_enter_on(&self, slot: usize) -> Option<Pass<'_>> {
        let slot = slot % self.slots.len();
        let c = &self.slots[slot];
        // SeqCst: the store half of the Dekker pair with `close`.
        c.fetch_add(1, Ordering::SeqCst);
        // SeqCst: the load half (see the module documentation).
        if !self.closed.load(Ordering::SeqCst) {
            return Some(Pass { gate: self, slot });
        }
        self.back_out(slot);
        None
    }

    /// Take back the count of an entrant that found the gate closed. The
    /// closer may have seen that count and gone to sleep: wake it, as a
    /// pass that leaves while the gate is closed does.
    fn back_out(&self, slot: usize) {
        // SeqCst: backing out is seen by the closer's drain loop.
        self.slots[slot].fetch_sub(1, Ordering::SeqCst);
        self.left_while_closed();
    }

    /// Enter even though the gate may be closed: only for a thread that
    /// already holds a pass of this gate (the closer is waiting for that
    /// one anyway, so it cannot have drained).
    pub fn enter_nested(&self) -> Pass<'_> {
        let slot = thread_number() % self.slots.len();
        // SeqCst: as `enter`.
        self.slots[slot].fetch_add(1, Ordering::SeqCst);
        Pass { gate: self, slot }
    }

    /// Close the gate and wait until every pass has left. New `enter`s wait
    /// until [`Gate::open`]. One closer at a time (the caller's lock).
    pub fn close(&self) {
        self.shut();
        let mut spins = 0;
        while let Some(e) = self.drain_check() {
            if !wait_step(&mut spins) {
                self.left.wait(e);
            }
        }
    }

    /// One look of a closer (after `shut`): `None` if drained, else the
    /// value of the word it may sleep on (`left`), read before the check,
    /// so that a pass that leaves after the check, which bumps it, makes
    /// the sleep return at once. Public for the loom model, which checks
    /// that the word always changes after a closer saw a count.
    #[doc(hidden)]
    pub fn drain_check(&self) -> Option<u32> {
        // SeqCst: read before the check; a pass that leaves after it bumps
        // `left` (it sees `closed`: see `Pass::drop`), and so does an
        // entrant that backs out (`back_out`).
        let e = self.left.prepare();
        (!self.drained()).then_some(e)
    }

    /// The word a closer sleeps on (for the loom model; see `drain_check`).
    #[doc(hidden)]
    pub fn left_word(&self) -> u32 {
        self.left.prepare()
    }

    /// The first half of `close`: new passes are refused from here on.
    pub fn shut(&self) {
        // SeqCst: the store half of the Dekker pair with `enter` (an RMW, so
        // that under loom, which treats SeqCst as AcqRel, it is ordered in
        // the one modification order with the entering threads' RMWs).
        self.closed.swap(true, Ordering::SeqCst);
    }

    /// The second half of `close`, one check: true when every slot reads
    /// zero (after `shut`, no pass is inside and none can enter).
    pub fn drained(&self) -> bool {
        // SeqCst: the load half; zero means this slot's passes left.
        self.slots.iter().all(|c| c.load(Ordering::SeqCst) == 0)
    }

    /// Open the gate again.
    pub fn open(&self) {
        // SeqCst: ordered after everything the closer did while closed, for
        // the entering threads' SeqCst loads.
        self.closed.swap(false, Ordering::SeqCst);
        self.opened.notify();
    }

    /// A count left a slot while the gate is closed (a pass dropped, or an
    /// entrant backed out): wake the closer if it sleeps.
    fn left_while_closed(&self) {
        self.left.notify();
    }

    /// True while closed.
    pub fn is_closed(&self) -> bool {
        // SeqCst: as the other loads of `closed`.
        self.closed.load(Ordering::SeqCst)
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let g = self.gate;
        // SeqCst: the closer's drain loop reads this (release of everything
        // done inside the pass is included in SeqCst).
        g.slots[self.slot].fetch_sub(1, Ordering::SeqCst);
        // SeqCst: the Dekker pair again (the closer stores `closed`, then
        // reads the slots; this decrement, then this load): a closer that
        // read the old count sees the bump of `left` and does not sleep
        // through it (see `close`).
        if g.closed.load(Ordering::SeqCst) {
            g.left_while_closed();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool as B, AtomicUsize as U, Ordering as O};
    use std::sync::Arc;

    /// While the gate is closed and drained, no pass is inside; passes
    /// entered meanwhile wait for `open`.
    #[test]
    fn closed_gate_excludes_passes() {
        let g = Arc::new(Gate::new(4));
        let inside = Arc::new(U::new(0));
        let stop = Arc::new(B::new(false));
        let passes = Arc::new(U::new(0));
        let mut hs = Vec::new();
        for _ in 0..3 {
            let (g, inside, stop, passes) =
                (g.clone(), inside.clone(), stop.clone(), passes.clone());
            hs.push(std::thread::spawn(move || {
                while !stop.load(O::Relaxed) {
                    let _p = g.enter();
                    inside.fetch_add(1, O::SeqCst);
                    std::hint::spin_loop();
                    inside.fetch_sub(1, O::SeqCst);
                    passes.fetch_add(1, O::Relaxed);
                }
            }));
        }
        // Stops the threads however this one leaves (a failed assertion
        // included), so that a failure is reported, not a hang.
        struct Stop(Arc<B>);
        impl Drop for Stop {
            fn drop(&mut self) {
                self.0.store(true, O::Relaxed);
            }
        }
        let _stop = Stop(stop.clone());
        for _ in 0..200 {
            g.close();
            assert_eq!(inside.load(O::SeqCst), 0, "a pass inside a closed gate");
            std::thread::yield_now();
            assert_eq!(inside.load(O::SeqCst), 0, "a pass entered a closed gate");
            g.open();
        }
        // The gate open, the threads get through (on a loaded machine they
        // may not have while it opened and closed).
        let t0 = std::time::Instant::now();
        while passes.load(O::Relaxed) == 0 {
            assert!(
                t0.elapsed().as_secs() < 10,
                "no pass got through the open gate"
            );
            std::thread::yield_now();
        }
        stop.store(true, O::Relaxed);
        for h in hs {
            h.join().unwrap();
        }
    }

    /// An entrant that counted itself in, then found the gate closed and
    /// backed out, wakes a closer that went to sleep on its count (without
    /// the wake-up the closer slept for ever: CI hung here).
    #[test]
    fn a_closer_asleep_on_an_entrant_that_backs_out_is_woken() {
        let g = Arc::new(Gate::new(2));
        for round in 0..10 {
            // The entrant's first step (its count), as in `try_enter_on`.
            g.slots[1].fetch_add(1, O::SeqCst);
            let (tx, rx) = std::sync::mpsc::channel();
            let closer = {
                let g = g.clone();
                std::thread::spawn(move || {
                    g.close();
                    tx.send(()).unwrap();
                })
            };
            while !g.is_closed() {
                std::thread::yield_now();
            }
            // Long enough for the closer to go to sleep on the count.
            std::thread::sleep(std::time::Duration::from_millis(5));
            assert!(
                rx.try_recv().is_err(),
                "round {round}: drained with a count in"
            );
            g.back_out(1);
            rx.recv_timeout(std::time::Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("round {round}: the closer was not woken"));
            closer.join().unwrap();
            g.open();
        }
    }

    #[test]
    fn nested_pass_does_not_wait() {
        let g = Gate::new(2);
        let outer = g.enter();
        let g2 = &g;
        std::thread::scope(|s| {
            let h = s.spawn(move || {
                g2.close();
                g2.open();
            });
            // The closer is (or will be) waiting for `outer`.
            while !g.is_closed() && !h.is_finished() {
                std::thread::yield_now();
            }
            let inner = g.enter_nested();
            drop(inner);
            drop(outer);
            h.join().unwrap();
        });
    }
}
