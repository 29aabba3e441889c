//! Loom models of the big-reader lock (`brlock.rs`), on its own code: a
//! reader that registers its slot block while a writer arrives, a reader
//! counted in the overflow count, two readers, and a writer's try-lock.
//! The data each side touches is a loom `UnsafeCell`, so an access that
//! the lock does not order against the other side's is reported as a
//! race. Readers make one attempt (`try_read`, the step `read` repeats
//! while a writer is there), as the other models here run non-waiting
//! steps (loom cannot explore two sides spinning on each other); the
//! writer runs `write` itself, which waits only for a reader already
//! inside.
//!
//! The writer's sleep for readers is checked as a state: a writer that
//! would sleep on a value of its word must see a reader change that value
//! (a lost wake-up would leave it asleep for ever).
//!
//! Run with `ci/loom.sh loom_brlock`.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use scalevfs_sync::brlock::{RawBrLock, Readers};

struct Shared {
    readers: Readers,
    lock: RawBrLock,
    data: UnsafeCell<u64>,
}

// SAFETY: `data` is touched only under the lock (the property under test).
unsafe impl Sync for Shared {}

fn shared() -> Arc<Shared> {
    Arc::new(Shared {
        readers: Readers::new(),
        lock: RawBrLock::new(),
        data: UnsafeCell::new(0),
    })
}

/// A reader thread: one attempt (registering its block first, or in the
/// overflow count); the value it read, if it got in.
fn reader(s: Arc<Shared>, slot: bool) -> thread::JoinHandle<Option<u64>> {
    thread::spawn(move || {
        let me = slot.then(|| s.readers.register());
        let t = s.lock.try_read(me)?;
        // SAFETY: shared side held (the property under test).
        let seen = s.data.with(|d| unsafe { *d });
        s.lock.read_unlock(me, t);
        if let Some(me) = me {
            s.readers.unregister(me);
        }
        Some(seen)
    })
}

/// The writer: `write` itself (it waits only for a reader already inside,
/// which leaves after one attempt), then its write.
fn writer(s: &Shared) {
    s.lock.write(&s.readers);
    // SAFETY: exclusive side held.
    s.data.with_mut(|d| unsafe { *d += 1 });
    s.lock.write_unlock();
}

/// A reader in a slot of its own (its block registered as the writer
/// arrives) against a writer.
#[test]
fn a_slot_reader_and_a_writer_exclude_each_other() {
    loom::model(|| {
        let s = shared();
        let r = reader(s.clone(), true);
        writer(&s);
        // The reader read before the write or after it, never during.
        assert!(r.join().unwrap().unwrap_or(0) <= 1);
    });
}

/// A reader without a block (its slots all in use, or its thread ending)
/// goes through the overflow count, with the same exclusion.
#[test]
fn an_overflow_reader_and_a_writer_exclude_each_other() {
    loom::model(|| {
        let s = shared();
        let r = reader(s.clone(), false);
        writer(&s);
        assert!(r.join().unwrap().unwrap_or(0) <= 1);
    });
}

/// A writer's try-lock against a reader that holds the lock.
#[test]
fn a_try_write_never_overlaps_a_reader() {
    loom::model(|| {
        let s = shared();
        let r = reader(s.clone(), true);
        let got = s.lock.try_write(&s.readers);
        if got {
            // SAFETY: exclusive side held.
            s.data.with_mut(|d| unsafe { *d += 1 });
            s.lock.write_unlock();
        }
        let seen = r.join().unwrap();
        assert!(seen.unwrap_or(0) <= u64::from(got));
    });
}

/// Two readers, each in its own block: neither turns the other away.
#[test]
fn two_readers_share() {
    loom::model(|| {
        let s = shared();
        let a = reader(s.clone(), true);
        let b = reader(s.clone(), false);
        assert_eq!(a.join().unwrap(), Some(0));
        assert_eq!(b.join().unwrap(), Some(0));
    });
}

/// A reader that waits (`read`) for a writer that holds the lock: it
/// marks the writer word as waited on, and gets in after the unlock,
/// seeing the writer's data.
#[test]
fn a_waiting_reader_gets_in_after_the_writer() {
    loom::model(|| {
        let s = shared();
        s.lock.write(&s.readers);
        let r = {
            let s = s.clone();
            thread::spawn(move || {
                let me = s.readers.register();
                let t = s.lock.read(Some(me));
                // SAFETY: shared side held.
                let seen = s.data.with(|d| unsafe { *d });
                s.lock.read_unlock(Some(me), t);
                s.readers.unregister(me);
                seen
            })
        };
        // SAFETY: exclusive side held.
        s.data.with_mut(|d| unsafe { *d += 1 });
        s.lock.write_unlock();
        assert_eq!(r.join().unwrap(), 1);
    });
}

/// A writer that would go to sleep waiting for a reader (one that is
/// inside, or one that stored its slot and then backs out on seeing the
/// writer) finds its word changed once that reader is done: the reader
/// cleared the sleep bit and woke it. Both kinds of reader, in a slot and
/// in the overflow count.
#[test]
fn a_writer_that_sleeps_for_a_reader_is_woken() {
    for slot in [true, false] {
        loom::model(move || {
            let s = shared();
            let r = reader(s.clone(), slot);
            assert!(s.lock.try_claim());
            let asleep_on = s.lock.announce_sleep(&s.readers);
            r.join().unwrap();
            if let Some(w) = asleep_on {
                assert_ne!(s.lock.writer_word(), w, "the writer would sleep for ever");
            }
            s.lock.write_unlock();
        });
    }
}
