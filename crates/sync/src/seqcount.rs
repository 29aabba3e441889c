//! Sequence counters: lock-free readers validated by a counter that writers
//! make odd while they write.
//!
//! LOCKING RULES
//!
//! - A [`SeqCount`] does not exclude writers from each other: the caller must
//!   serialise `write_begin`/`write_end`/`invalidate` with a lock of its own
//!   (in scalevfs, e.g., the dentry's `d_lock` for `d_seq`, the rename lock
//!   for `rename_seq`). Readers take no lock.
//! - A [`SeqLock<T>`] bundles a writer spinlock ([`LockClass::SeqLockWriter`]),
//!   a `SeqCount` and the value. The writer lock is a leaf: `write`'s closure
//!   must not take other locks that could be held while waiting for it.
//! - Data protected by a sequence counter may be read by readers *while* it
//!   is being written. It must therefore be accessed through atomics (here:
//!   Relaxed `AtomicU64` words), never through plain loads, or the program
//!   has a data race. The sequence check then tells the reader whether the
//!   words it read belong together.
//!
//! THE READ SIDE, FIRST WITH A LOCK, THEN WITHOUT
//!
//! ```text
//! lock(); v = data; unlock();               // what a reader means
//!
//! loop {                                    // what it does instead
//!     s = read_begin();                     // Acquire load; waits while odd
//!     v = data;                             // Relaxed word loads
//!     if !retry(s) { break }                // Acquire fence; reload; same?
//! }
//! ```
//!
//! FENCES (the same argument as crossbeam's `AtomicCell` seqlock)
//!
//! - `write_begin` stores the odd value and then issues a Release fence.
//!   If a reader's data load sees any value stored after that fence, the
//!   reader's Acquire fence in `retry` synchronises with the writer's fence,
//!   so the odd store happens-before the reader's reload of the counter: the
//!   reload sees odd (or later) and the read is retried. Without the fence,
//!   the data stores could become visible before the odd counter.
//! - `write_end` stores the next even value with Release: a reader whose
//!   `read_begin` (Acquire) sees it also sees every data store before it.
//! - `retry` puts an Acquire fence between the data loads and the reload of
//!   the counter, so the reload cannot be satisfied "before" the data loads.
//!   A plain Acquire load of the counter would not do: Acquire orders later
//!   accesses, not earlier ones.

use crate::lockstat::{self, LockClass, Stat};
use crate::primitive::{fence, spin_loop, AtomicU32, AtomicU64, Ordering};
use crate::spin::SpinLock;
use bytemuck::Pod;
use core::fmt;

/// A sequence counter. See the module documentation.
pub struct SeqCount {
    seq: AtomicU32,
}

impl SeqCount {
    /// A counter at 0 (even: no write in progress).
    #[cfg(not(loom))]
    #[inline]
    pub const fn new() -> Self {
        SeqCount {
            seq: AtomicU32::new(0),
        }
    }

    /// A counter at 0 (even: no write in progress).
    #[cfg(loom)]
    pub fn new() -> Self {
        SeqCount {
            seq: AtomicU32::new(0),
        }
    }

    /// Open a write section: the counter becomes odd. The caller serialises
    /// writers.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn write_begin(&self) {
        // Relaxed: writers are serialised by the caller's lock, whose Acquire
        // already ordered this load after the previous writer's stores.
        let s = self.seq.load(Ordering::Relaxed);
        debug_assert!(s & 1 == 0, "SeqCount::write_begin inside a write section");
        // Relaxed store + Release fence: see FENCES; the fence keeps the data
        // stores that follow from being seen before this odd value.
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        lockstat::inc(Stat::SharedWrite);
    }

    /// Close the write section: the counter becomes even again.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn write_end(&self) {
        // Relaxed: we are the only writer (see write_begin).
        let s = self.seq.load(Ordering::Relaxed);
        debug_assert!(s & 1 == 1, "SeqCount::write_end without write_begin");
        // Release: the data stores happen-before any read_begin that sees this.
        self.seq.store(s.wrapping_add(1), Ordering::Release);
        lockstat::inc(Stat::SharedWrite);
    }

    /// Start a read: wait until no write is in progress and return the
    /// (even) counter value to pass to [`retry`](Self::retry).
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn read_begin(&self) -> u32 {
        loop {
            // Acquire: the data loads that follow see at least the stores that
            // preceded this value's Release store in `write_end`.
            let s = self.seq.load(Ordering::Acquire);
            if s & 1 == 0 {
                return s;
            }
            spin_loop();
        }
    }

    /// Start a read without waiting: the value may be odd, in which case
    /// [`retry`](Self::retry) will report failure. For lock-free walkers that
    /// would rather fall back than spin.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn raw_read_begin(&self) -> u32 {
        // Acquire: as in read_begin.
        self.seq.load(Ordering::Acquire)
    }

    /// End a read: `true` if a write overlapped it (or `start` was odd) and
    /// the values read since `start` must be thrown away.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn retry(&self, start: u32) -> bool {
        // Acquire fence, then Relaxed reload: see FENCES.
        fence(Ordering::Acquire);
        start & 1 != 0 || self.seq.load(Ordering::Relaxed) != start
    }

    /// Make every reader that started before this call retry, without a
    /// write section (the counter stays even, bumped by 2). Writer side: the
    /// caller serialises it with the writers.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn invalidate(&self) {
        // Release: a reader that sees the new value also sees the changes made
        // before the call. RMW so that concurrent invalidations are not lost.
        self.seq.fetch_add(2, Ordering::Release);
        // Release fence: stores after the call cannot be seen by a reader
        // whose reload still returns the old value (as in write_begin).
        fence(Ordering::Release);
        lockstat::inc(Stat::SharedWrite);
    }

    /// The current value (racy; for diagnostics).
    #[inline]
    pub fn current(&self) -> u32 {
        // Relaxed: a diagnostic observation.
        self.seq.load(Ordering::Relaxed)
    }
}

impl Default for SeqCount {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for SeqCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SeqCount")
            .field("seq", &self.current())
            .finish()
    }
}

/// Storage of a `SeqLock` value as `AtomicU64` words.
#[cfg(not(loom))]
mod words {
    use super::*;
    use core::cell::UnsafeCell;

    #[repr(C, align(8))]
    struct Aligned<T>(T);

    pub(super) struct Words<T: Pod> {
        cell: UnsafeCell<Aligned<T>>,
    }

    // SAFETY: while shared, the value's bytes are only accessed through
    // `AtomicU64` operations (see `word`), so sharing is race-free; values
    // move between threads by copy, hence `T: Send`.
    unsafe impl<T: Pod + Send> Sync for Words<T> {}

    impl<T: Pod> Words<T> {
        pub(super) const N: usize = {
            assert!(
                core::mem::size_of::<T>() % 8 == 0,
                "SeqLock<T>: size_of::<T>() must be a multiple of 8 (add explicit padding)"
            );
            core::mem::size_of::<T>() / 8
        };

        pub(super) fn new(v: T) -> Self {
            let _ = Self::N;
            Words {
                cell: UnsafeCell::new(Aligned(v)),
            }
        }

        #[inline(always)]
        pub(super) fn word(&self, i: usize) -> &AtomicU64 {
            assert!(i < Self::N);
            // SAFETY: `cell` is 8-aligned (`Aligned`) and `N * 8` bytes long
            // with every byte initialised: `T: Pod` has no padding and its
            // size is a multiple of 8, so `Aligned` adds none. Word `i < N` is
            // in bounds and aligned for `AtomicU64`. The memory lives as long
            // as `&self`. Every access while `self` is shared goes through
            // this function (atomic, same size), and the only non-atomic
            // accesses are the initial write in `new` and `into_inner`, which
            // own the value, so atomic and plain accesses never race.
            unsafe { AtomicU64::from_ptr((self.cell.get() as *mut u64).add(i)) }
        }

        pub(super) fn into_inner(self) -> T {
            self.cell.into_inner().0
        }
    }
}

/// Storage of a `SeqLock` value as `AtomicU64` words (loom: a boxed slice of
/// loom atomics, since loom atomics cannot alias plain memory).
#[cfg(loom)]
mod words {
    use super::*;
    use core::marker::PhantomData;

    pub(super) struct Words<T: Pod> {
        words: Box<[AtomicU64]>,
        _t: PhantomData<T>,
    }

    impl<T: Pod> Words<T> {
        pub(super) const N: usize = {
            assert!(
                core::mem::size_of::<T>() % 8 == 0,
                "SeqLock<T>: size_of::<T>() must be a multiple of 8 (add explicit padding)"
            );
            core::mem::size_of::<T>() / 8
        };

        pub(super) fn new(v: T) -> Self {
            let _ = Self::N;
            let words = bytemuck::bytes_of(&v)
                .chunks_exact(8)
                .map(|c| AtomicU64::new(u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]))))
                .collect();
            Words {
                words,
                _t: PhantomData,
            }
        }

        #[inline(always)]
        pub(super) fn word(&self, i: usize) -> &AtomicU64 {
            &self.words[i]
        }

        pub(super) fn into_inner(self) -> T {
            let mut v = T::zeroed();
            for (i, c) in bytemuck::bytes_of_mut(&mut v)
                .chunks_exact_mut(8)
                .enumerate()
            {
                // Relaxed: `self` is owned; no concurrent access remains.
                c.copy_from_slice(&self.words[i].load(Ordering::Relaxed).to_ne_bytes());
            }
            v
        }
    }
}

use words::Words;

/// A value of plain-old-data type protected by a sequence counter, with a
/// spinlock serialising writers. Reads are lock-free and never block writers.
///
/// `size_of::<T>()` must be a multiple of 8 (checked at compile time).
pub struct SeqLock<T: Pod> {
    seq: SeqCount,
    writer: SpinLock<()>,
    data: Words<T>,
}

impl<T: Pod> SeqLock<T> {
    /// A `SeqLock` holding `v`.
    pub fn new(v: T) -> Self {
        SeqLock {
            seq: SeqCount::new(),
            writer: SpinLock::with_class((), LockClass::SeqLockWriter),
            data: Words::new(v),
        }
    }

    /// A consistent copy of the value. Lock-free; retries (counting
    /// [`Stat::SeqRetry`]) while writes overlap it.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn read(&self) -> T {
        loop {
            let s = self.seq.read_begin();
            let v = self.read_racy();
            if !self.seq.retry(s) {
                return v;
            }
            self.note_retry();
        }
    }

    #[cold]
    fn note_retry(&self) {
        lockstat::inc(Stat::SeqRetry);
    }

    /// Update the value: `f` edits a copy; the result is then published in
    /// one write section. Writers are serialised by the writer lock.
    ///
    /// `f` runs before the write section opens, so a panic in `f` leaves the
    /// value and the counter untouched (and the lock released).
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn write<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // The lock-order checker (compiled out in release and loom builds).
        let _order = WriterOrder::new(&self.writer);
        let _guard = self.writer.lock();
        // Only writers change the words and we exclude them: a plain copy.
        let mut v = self.read_racy();
        let r = f(&mut v);
        self.seq.write_begin();
        self.store_words(&v);
        self.seq.write_end();
        r
    }

    /// The sequence counter, for callers that validate a larger read section
    /// of their own (with [`read_racy`](Self::read_racy) inside it).
    #[inline]
    pub fn seq(&self) -> &SeqCount {
        &self.seq
    }

    /// Read the words without any validation. Only meaningful inside a
    /// section the caller validates with `seq()`, or while holding off
    /// writers; otherwise the result may mix two writes (it is still a
    /// valid `T`, since `T: Pod`).
    #[inline]
    pub fn read_racy(&self) -> T {
        let mut v = T::zeroed();
        for (i, c) in bytemuck::bytes_of_mut(&mut v)
            .chunks_exact_mut(8)
            .enumerate()
        {
            // Relaxed: ordered by the sequence protocol (see FENCES).
            c.copy_from_slice(&self.data.word(i).load(Ordering::Relaxed).to_ne_bytes());
        }
        v
    }

    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    fn store_words(&self, v: &T) {
        for (i, c) in bytemuck::bytes_of(v).chunks_exact(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            // Relaxed: ordered by the sequence protocol (see FENCES).
            self.data
                .word(i)
                .store(u64::from_ne_bytes(b), Ordering::Relaxed);
        }
    }

    /// Consume the lock and return the value.
    pub fn into_inner(self) -> T {
        self.data.into_inner()
    }
}

impl<T: Pod + Default> Default for SeqLock<T> {
    fn default() -> Self {
        SeqLock::new(T::default())
    }
}

impl<T: Pod + fmt::Debug> fmt::Debug for SeqLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SeqLock")
            .field("seq", &self.seq.current())
            .field("value", &self.read())
            .finish()
    }
}

/// Records a [`SeqLock`] writer lock with the lock-order checker
/// ([`crate::ordered::Class::AttrWriter`]) for as long as it lives.
struct WriterOrder(usize);

impl WriterOrder {
    #[inline(always)]
    fn new<T: ?Sized>(l: &SpinLock<T>) -> WriterOrder {
        let a = l as *const SpinLock<T> as *const u8 as usize;
        crate::ordered::acquire(crate::ordered::Class::AttrWriter, 0, a);
        WriterOrder(a)
    }
}

impl Drop for WriterOrder {
    #[inline(always)]
    fn drop(&mut self) {
        crate::ordered::release(crate::ordered::Class::AttrWriter, self.0);
    }
}
