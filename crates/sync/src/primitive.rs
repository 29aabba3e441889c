//! The loom shim: every atomic, fence, spin hint and yield in this crate comes
//! from here.
//!
//! Built normally, this module re-exports `std`. Built with
//! `RUSTFLAGS="--cfg loom"`, it re-exports loom's mocks, so the model tests in
//! `tests/loom_models.rs` explore every interleaving (and every weak-memory
//! outcome loom can simulate) of the same code that ships. Nothing in the
//! crate may name `std::sync::atomic` directly; the one exception is
//! `lockstat`, whose counters live in `static`s and are compiled out under
//! loom (loom atomics cannot live in statics and must not outlive a model).
//!
//! The core crate (`scalevfs`) routes its protocol atomics through here too
//! (`dcache.rs`, `orphan.rs`, `inode.rs`), so its loom models
//! (`crates/core/src/loom_models.rs`) run the production code.
//!
//! Differences under loom worth knowing:
//! - A `SeqCst` *load* of an integer or bool atomic is performed as a
//!   read-only RMW (`fetch_add(0)`, `fetch_or(false)`) by the wrappers below.
//!   loom treats `SeqCst` as `AcqRel`, so a plain load could read a value
//!   that the single total order of `SeqCst` operations forbids, and every
//!   store-buffer protocol (`orphan.rs`'s last close against unlink) would
//!   fail spuriously. An RMW reads the latest value in modification order,
//!   which is what a `SeqCst` load reads in those patterns. Loads with any
//!   other ordering, and every other operation, are loom's own. (`AtomicPtr`
//!   is loom's unchanged: a `SeqCst` pointer load, `brlock.rs`'s read of its
//!   reader list, is a plain one under loom, where the models cover that
//!   list's registration race through the writer's claim instead.)
//! - `spin_loop()` is a yield, so every busy-wait loop is a scheduling point.
//! - [`Backoff::snooze`] is a plain yield (no exponential spinning).
//! - loom atomics are not `const`-constructible, so constructors that are
//!   `const fn` in a normal build are ordinary functions under loom.

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicPtr, Ordering};
#[cfg(loom)]
pub use loom::{hint, thread};
#[cfg(loom)]
pub use sc_load::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize};

#[cfg(all(not(loom), not(feature = "trace-lines")))]
pub use std::sync::atomic::{
    fence, AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

// The counting build (`trace-lines`): the same atomics, each access reported
// to `crate::trace` (see there); for `scalevfs bench commute` only.
#[cfg(all(not(loom), feature = "trace-lines"))]
pub use crate::trace::traced::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize,
};
#[cfg(all(not(loom), feature = "trace-lines"))]
pub use std::sync::atomic::{fence, Ordering};

/// loom's atomics with `SeqCst` loads performed as read-only RMWs (see the
/// module documentation); everything else forwards.
#[cfg(loom)]
mod sc_load {
    use loom::sync::atomic as l;
    use loom::sync::atomic::Ordering;

    macro_rules! sc_atomic {
        ($name:ident, $t:ty, $zero:expr, $read:ident) => {
            #[doc = concat!("loom's `", stringify!($name), "`; a `SeqCst` load is an RMW.")]
            #[derive(Debug, Default)]
            pub struct $name(l::$name);

            #[allow(missing_docs)]
            impl $name {
                pub fn new(v: $t) -> Self {
                    $name(l::$name::new(v))
                }
                pub fn load(&self, o: Ordering) -> $t {
                    if o == Ordering::SeqCst {
                        self.0.$read($zero, o)
                    } else {
                        self.0.load(o)
                    }
                }
                pub fn store(&self, v: $t, o: Ordering) {
                    self.0.store(v, o)
                }
                pub fn swap(&self, v: $t, o: Ordering) -> $t {
                    self.0.swap(v, o)
                }
                pub fn compare_exchange(
                    &self,
                    cur: $t,
                    new: $t,
                    s: Ordering,
                    f: Ordering,
                ) -> Result<$t, $t> {
                    self.0.compare_exchange(cur, new, s, f)
                }
                pub fn compare_exchange_weak(
                    &self,
                    cur: $t,
                    new: $t,
                    s: Ordering,
                    f: Ordering,
                ) -> Result<$t, $t> {
                    self.0.compare_exchange_weak(cur, new, s, f)
                }
                pub fn fetch_or(&self, v: $t, o: Ordering) -> $t {
                    self.0.fetch_or(v, o)
                }
                pub fn fetch_and(&self, v: $t, o: Ordering) -> $t {
                    self.0.fetch_and(v, o)
                }
                pub fn fetch_update<F: FnMut($t) -> Option<$t>>(
                    &self,
                    set: Ordering,
                    fetch: Ordering,
                    f: F,
                ) -> Result<$t, $t> {
                    self.0.fetch_update(set, fetch, f)
                }
            }
        };
    }
    macro_rules! sc_int {
        ($name:ident, $t:ty) => {
            sc_atomic!($name, $t, 0, fetch_add);
            #[allow(missing_docs)]
            impl $name {
                pub fn fetch_add(&self, v: $t, o: Ordering) -> $t {
                    self.0.fetch_add(v, o)
                }
                pub fn fetch_sub(&self, v: $t, o: Ordering) -> $t {
                    self.0.fetch_sub(v, o)
                }
            }
        };
    }
    sc_atomic!(AtomicBool, bool, false, fetch_or);
    sc_int!(AtomicU32, u32);
    sc_int!(AtomicU64, u64);
    sc_int!(AtomicUsize, usize);
    sc_int!(AtomicI64, i64);
}
#[cfg(not(loom))]
pub use std::{hint, thread};

/// Tell the CPU we are in a busy-wait loop (`pause` on x86). Under loom this
/// yields to another modelled thread.
#[inline(always)]
pub fn spin_loop() {
    hint::spin_loop();
}

/// Sleep while `a` holds `expected` (a futex wait: it may return early or
/// spuriously; callers re-check). Under loom and Miri a yield (Miri rejects
/// the futex call's argument types, and a yield is a correct wait for
/// callers that re-check).
#[inline]
pub fn wait_u32(a: &AtomicU32, expected: u32) {
    #[cfg(all(not(loom), not(miri), not(feature = "trace-lines")))]
    atomic_wait::wait(a, expected);
    #[cfg(all(not(loom), not(miri), feature = "trace-lines"))]
    atomic_wait::wait(a.as_std(), expected);
    #[cfg(any(loom, miri))]
    {
        let _ = (a, expected);
        yield_now();
    }
}

/// Wake every thread sleeping in [`wait_u32`] on `a`. Under loom and Miri
/// nothing (their waits are yields).
#[inline]
pub fn wake_all_u32(a: &AtomicU32) {
    #[cfg(all(not(loom), not(miri), not(feature = "trace-lines")))]
    atomic_wait::wake_all(a);
    #[cfg(all(not(loom), not(miri), feature = "trace-lines"))]
    atomic_wait::wake_all(a.as_std());
    #[cfg(any(loom, miri))]
    let _ = a;
}

/// Give up the rest of this time slice (a loom scheduling point under loom).
#[inline]
pub fn yield_now() {
    thread::yield_now();
}

/// Bounded exponential backoff for spin-wait loops.
///
/// Outside loom this is `crossbeam_utils::Backoff`: it spins `2^step` times
/// for the first few steps, then starts yielding the thread, which matters on
/// an oversubscribed machine where the lock holder may be waiting for our CPU.
/// Under loom every `snooze` is a single yield.
pub struct Backoff {
    #[cfg(not(loom))]
    inner: crossbeam_utils::Backoff,
}

impl Backoff {
    /// A fresh backoff at its shortest step.
    #[inline]
    pub fn new() -> Self {
        Backoff {
            #[cfg(not(loom))]
            inner: crossbeam_utils::Backoff::new(),
        }
    }

    /// Wait a little, a bit longer each call; yields once spinning has gone on
    /// for a while.
    #[inline]
    pub fn snooze(&self) {
        #[cfg(not(loom))]
        self.inner.snooze();
        #[cfg(loom)]
        yield_now();
    }

    /// True once the backoff has spun and yielded for its whole budget: a
    /// waiter should block (sleep) instead. Under loom at once.
    #[inline]
    pub fn is_completed(&self) -> bool {
        #[cfg(not(loom))]
        return self.inner.is_completed();
        #[cfg(loom)]
        true
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl core::fmt::Debug for Backoff {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Backoff")
    }
}
