//! [`EventCount`]: sleep until something happens, and let the side that
//! makes it happen skip the wake-up system call when no one sleeps.
//!
//! A waiter reads the count (`prepare`), checks its condition, and if it
//! does not hold calls `wait` with the value read: `wait` announces the
//! sleeper, then sleeps only if the count still has that value (a futex).
//! A notifier changes what the waiters check, then calls `notify`: it
//! bumps the count and wakes only if a sleeper is announced.
//!
//! Both sides are `SeqCst` store-then-load pairs (Dekker's pattern): the
//! waiter's announcement then its re-read of the count, the notifier's
//! bump then its read of the sleepers. If the notifier reads no sleeper,
//! the announcement came after that read, so the waiter's re-read sees the
//! bump and it does not sleep; if it reads one, it wakes it, and a waiter
//! that had not slept yet finds the count changed and returns at once.
//! The ext4 journal uses it for the commit waiters, where the wake-up of
//! every commit was a system call though the other thread rarely slept.

use crate::primitive::{wait_u32, wake_all_u32, AtomicU32, Ordering};

/// See the module documentation.
#[derive(Debug, Default)]
pub struct EventCount {
    seq: AtomicU32,
    sleepers: AtomicU32,
}

impl EventCount {
    /// A count with no sleeper.
    pub fn new() -> EventCount {
        EventCount::default()
    }

    /// The count, read before the waiter checks its condition.
    pub fn prepare(&self) -> u32 {
        // SeqCst: see the module documentation.
        self.seq.load(Ordering::SeqCst)
    }

    /// Sleep unless the count moved since `seen` (read by `prepare` before
    /// the condition was found false). May return early; callers re-check.
    pub fn wait(&self, seen: u32) {
        if self.announce(seen) {
            wait_u32(&self.seq, seen);
        }
        // SeqCst: as the announcement.
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// The first step of `wait`: count this thread as a sleeper and tell
    /// whether it would sleep (the count still `seen`). The caller must
    /// take the count back (`wait` does). Public for the loom model.
    #[doc(hidden)]
    pub fn announce(&self, seen: u32) -> bool {
        // SeqCst (both): see the module documentation.
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        self.seq.load(Ordering::SeqCst) == seen
    }

    /// Take back an `announce` (for the loom model; `wait` does it).
    #[doc(hidden)]
    pub fn unannounce(&self) {
        // SeqCst: as the announcement.
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Something happened: bump the count and wake the sleepers, if any.
    /// Returns whether it made the wake-up call.
    pub fn notify(&self) -> bool {
        // SeqCst (both): see the module documentation.
        self.seq.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) == 0 {
            return false;
        }
        wake_all_u32(&self.seq);
        true
    }
}
