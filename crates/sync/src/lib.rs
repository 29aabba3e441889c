//! Synchronisation primitives for scalevfs.
//!
//! - [`LockRef`]: a spinlock and a reference count in one 64-bit word, with
//!   the four historical update schemes selectable at run time
//!   ([`LockRefVariant`]).
//! - [`SeqCount`] / [`SeqLock`]: sequence counters for lock-free readers.
//! - [`SpinLock`]: a test-and-test-and-set spinlock with backoff.
//! - [`lockstat`]: per-thread sharded event counters and per-lock-class
//!   contention statistics, cheap enough to leave on.
//! - [`primitive`]: the loom shim every atomic goes through.
//!
//! Build with `RUSTFLAGS="--cfg loom"` to run the loom models
//! (`ci/loom.sh`); in that build the statistics are compiled out.
//!
//! Lock order among the locks in this crate: none nests inside another.
//! A `SeqLock`'s writer lock and a `LockRef`'s lock half are leaves as far as
//! this crate is concerned; the VFS-wide order is in `docs/design.md`.

#![warn(missing_docs, missing_debug_implementations)]

pub mod lockref;
pub mod lockstat;
pub mod primitive;
pub mod seqcount;
pub mod spin;

pub use lockref::{LockRef, LockRefVariant, LOCKREF_DEAD};
pub use lockstat::{LockClass, Snapshot, Stat};
pub use seqcount::{SeqCount, SeqLock};
pub use spin::{SpinGuard, SpinLock};
