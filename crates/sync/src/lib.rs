//! Synchronisation primitives for scalevfs.
//!
//! - [`LockRef`]: a spinlock and a reference count in one 64-bit word, with
//!   the four historical update schemes selectable at run time
//!   ([`LockRefVariant`]).
//! - [`SeqCount`] / [`SeqLock`]: sequence counters for lock-free readers.
//! - [`SpinLock`]: a test-and-test-and-set spinlock with backoff.
//! - [`Offer`]: work that exactly one of several threads does, its owner
//!   waiting for the outcome (the ext4 journal's shared commit writes).
//! - [`EventCount`]: sleep until an event; no wake-up call when no one
//!   sleeps.
//! - [`Turnstile`]: numbered tickets that pass in order (the ext4
//!   journal's transactions written at once, made durable in order).
//! - [`brlock`]: a big-reader lock (shared acquisitions write only the
//!   acquiring thread's own line), wrapped as [`ordered::BrLock`].
//! - [`lockstat`]: per-thread sharded event counters and per-lock-class
//!   contention statistics, cheap enough to leave on.
//! - [`primitive`]: the loom shim every atomic goes through.
//! - [`trace`]: cache-line recording for the conflict matrix (the
//!   `trace-lines` feature; hooks only in that build).
//! - [`ordered`]: the VFS-wide lock-order table and lock wrappers that check
//!   it at run time in debug builds (a small lockdep).
//!
//! Checking:
//! - `cargo test -p scalevfs-sync`: stress tests on real threads, the
//!   `lockref`-degradation test (asserted on counters), unit tests.
//! - `ci/loom.sh`: the loom models (`RUSTFLAGS="--cfg loom"`, own target
//!   directory); in that build the statistics are compiled out.
//! - `cargo +nightly miri test -p scalevfs-sync`: the same tests under Miri
//!   (iteration counts shrink under `cfg(miri)`; timing tests are ignored).
//! - `cargo bench -p scalevfs-sync --bench lockref`: get+put throughput of
//!   every variant, shared and per-thread, at 1, 2 and 4 threads.
//!
//! Known limitations: statistics cost a thread-local lookup and two
//! thread-owned load/store pairs per operation (switch them off with
//! [`lockstat::set_enabled`]); `SeqLock<T>` needs `size_of::<T>()` to be a
//! multiple of 8; loom cannot model three threads waiting on one lock, so
//! the models keep lock waiters to two (see `tests/loom_models.rs`).
//!
//! Lock order among the locks in this crate: none nests inside another.
//! A `SeqLock`'s writer lock and a `LockRef`'s lock half are leaves as far as
//! this crate is concerned; the VFS-wide order is [`ordered::Class`]
//! (copied in `docs/design.md`).

#![warn(missing_docs, missing_debug_implementations)]

pub mod brlock;
pub mod eventcount;
pub mod gate;
pub mod lockref;
pub mod lockstat;
pub mod offer;
pub mod ordered;
pub mod primitive;
pub mod seqcount;
pub mod spin;
pub mod trace;
pub mod turnstile;

pub use eventcount::EventCount;
pub use gate::{thread_number, Gate, Pass};
pub use lockref::{LockRef, LockRefVariant, LOCKREF_DEAD};
pub use lockstat::{LockClass, Snapshot, Stat};
pub use offer::Offer;
pub use seqcount::{SeqCount, SeqLock};
pub use spin::{SpinGuard, SpinLock};
pub use turnstile::Turnstile;
