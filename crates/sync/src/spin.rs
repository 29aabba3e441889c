//! A test-and-test-and-set spinlock with bounded backoff and per-class
//! contention statistics.
//!
//! LOCKING RULES
//!
//! - A `SpinLock<T>` protects exactly its `T`; the data is reachable only
//!   through a [`SpinGuard`], so the type system enforces "hold the lock to
//!   touch the data".
//! - Critical sections must be short and must not block or sleep: waiters
//!   burn CPU. After a few exponential spin steps a waiter starts yielding its
//!   time slice (crossbeam's `Backoff`), which keeps an oversubscribed machine
//!   from spinning away the lock holder's CPU, but this is not a sleeping
//!   lock.
//! - Not reentrant: locking a lock the thread already holds deadlocks.
//! - Lock order between classes is the caller's business; the table is
//!   [`crate::ordered::Class`] and [`crate::ordered::SpinLock`] wraps this
//!   lock with the run-time check. This module does not check it.
//!
//! ACQUIRE PROTOCOL
//!
//! The fast path is one compare-exchange `false -> true`. If it fails the
//! waiter (cold path) spins on plain loads until the lock reads free, and only
//! then retries the compare-exchange, so waiters share the line read-only
//! instead of bouncing it with failed RMWs.
//!
//! STATISTICS
//!
//! Each acquisition records `lock_acquired(class, contended, backoff_steps)`
//! and two [`Stat::SharedWrite`]s (the acquire and the matching release)
//! with a single thread-local lookup.

use crate::lockstat::{self, LockClass, Stat};
use crate::primitive::{AtomicBool, Backoff, Ordering};
use core::cell::UnsafeCell;
use core::fmt;
use core::ops::{Deref, DerefMut};

/// A spinlock protecting a `T`. See the module documentation.
pub struct SpinLock<T: ?Sized> {
    locked: AtomicBool,
    class: LockClass,
    data: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to `T` to one thread at a time, so sharing
// a `SpinLock<T>` between threads only ever moves `T` access between threads,
// which needs `T: Send` (the same bound as `std::sync::Mutex`).
unsafe impl<T: ?Sized + Send> Sync for SpinLock<T> {}
// SAFETY: moving the lock moves the owned `T`; `T: Send` makes that sound.
unsafe impl<T: ?Sized + Send> Send for SpinLock<T> {}

impl<T> SpinLock<T> {
    /// An unlocked lock of class [`LockClass::Other`].
    #[cfg(not(loom))]
    #[inline]
    pub const fn new(v: T) -> Self {
        Self::with_class(v, LockClass::Other)
    }

    /// An unlocked lock whose statistics are recorded under `class`.
    #[cfg(not(loom))]
    #[inline]
    pub const fn with_class(v: T, class: LockClass) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            class,
            data: UnsafeCell::new(v),
        }
    }

    /// An unlocked lock of class [`LockClass::Other`].
    #[cfg(loom)]
    pub fn new(v: T) -> Self {
        Self::with_class(v, LockClass::Other)
    }

    /// An unlocked lock whose statistics are recorded under `class`.
    #[cfg(loom)]
    pub fn with_class(v: T, class: LockClass) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            class,
            data: UnsafeCell::new(v),
        }
    }

    /// Consume the lock and return the data.
    #[inline]
    pub fn into_inner(self) -> T {
        self.data.into_inner()
    }
}

impl<T: ?Sized> SpinLock<T> {
    /// Acquire the lock, spinning (then yielding) while it is held.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        // Acquire: the critical section must see everything the previous
        // holder wrote before its Release unlock. Relaxed on failure: we only
        // learn "held" and go wait.
        if self
            .locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        } else {
            self.record(false, 0);
        }
        SpinGuard {
            lock: self,
            _not_send: std::marker::PhantomData,
        }
    }

    #[cold]
    #[inline(never)]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    fn lock_contended(&self) {
        let backoff = Backoff::new();
        let mut steps: u64 = 0;
        loop {
            // Relaxed: a read-only probe; the CAS below provides the Acquire.
            while self.locked.load(Ordering::Relaxed) {
                backoff.snooze();
                steps += 1;
            }
            // Acquire/Relaxed: as in `lock`.
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                self.record(true, steps);
                return;
            }
        }
    }

    #[inline(always)]
    fn record(&self, contended: bool, steps: u64) {
        let class = self.class;
        lockstat::record(|r| {
            r.lock_acquired(class, contended, steps);
            // The acquire now and the release to come.
            r.add(Stat::SharedWrite, 2);
        });
    }

    /// Acquire the lock if it is free right now.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        // Acquire/Relaxed: as in `lock`. Test first so that a polling caller
        // does not dirty the line while the lock is held.
        if !self.locked.load(Ordering::Relaxed)
            && self
                .locked
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            self.record(false, 0);
            Some(SpinGuard {
                lock: self,
                _not_send: std::marker::PhantomData,
            })
        } else {
            None
        }
    }

    /// Whether some thread holds the lock (racy; for assertions and
    /// heuristics).
    #[inline]
    pub fn is_locked(&self) -> bool {
        // Relaxed: an instantaneous, unordered observation.
        self.locked.load(Ordering::Relaxed)
    }

    /// The lock's statistics class.
    #[inline]
    pub fn class(&self) -> LockClass {
        self.class
    }

    /// Access the data through an exclusive borrow, without locking.
    #[inline]
    pub fn get_mut(&mut self) -> &mut T {
        self.data.get_mut()
    }
}

impl<T: Default> Default for SpinLock<T> {
    fn default() -> Self {
        SpinLock::new(T::default())
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for SpinLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("SpinLock");
        d.field("class", &self.class);
        match self.try_lock() {
            Some(g) => d.field("data", &&*g),
            None => d.field("data", &format_args!("<locked>")),
        };
        d.finish()
    }
}

/// Proof of holding a [`SpinLock`]; unlocks when dropped.
#[must_use = "dropping the guard unlocks the lock immediately"]
pub struct SpinGuard<'a, T: ?Sized> {
    lock: &'a SpinLock<T>,
    /// Not `Send` (see below): the lock-order checker's record of the
    /// lock (`ordered::SpinGuard`) is this thread's, and an unlock from
    /// another thread would leave it behind.
    _not_send: std::marker::PhantomData<*const ()>,
}

// SAFETY: a shared guard only gives `&T`, so sending `&SpinGuard` to another
// thread is like sending `&T`, which needs `T: Sync`. (`Send` for the guard
// is left out on purpose, like `std::sync::MutexGuard`: unlocking from another
// thread is allowed by this lock but not needed.)
unsafe impl<T: ?Sized + Sync> Sync for SpinGuard<'_, T> {}

impl<T: ?Sized> Deref for SpinGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock, so
        // no other thread has a reference into `data`; the returned borrow is
        // tied to `&self`, hence to the guard's life.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T: ?Sized> DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this borrow the only one
        // derived from this guard, and the lock excludes all other guards.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T: ?Sized> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // Release: publish the critical section's writes to the next holder.
        self.lock.locked.store(false, Ordering::Release);
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for SpinGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: ?Sized + fmt::Display> fmt::Display for SpinGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}
