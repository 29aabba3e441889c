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
//! Differences under loom worth knowing:
//! - `spin_loop()` is a yield, so every busy-wait loop is a scheduling point.
//! - [`Backoff::snooze`] is a plain yield (no exponential spinning).
//! - loom atomics are not `const`-constructible, so constructors that are
//!   `const fn` in a normal build are ordinary functions under loom.

#[cfg(loom)]
pub use loom::sync::atomic::{
    fence, AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub use loom::{hint, thread};

#[cfg(not(loom))]
pub use std::sync::atomic::{
    fence, AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub use std::{hint, thread};

/// Tell the CPU we are in a busy-wait loop (`pause` on x86). Under loom this
/// yields to another modelled thread.
#[inline(always)]
pub fn spin_loop() {
    hint::spin_loop();
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
