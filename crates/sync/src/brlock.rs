//! A big-reader lock: taking it shared writes only the taking thread's own
//! cache line; taking it exclusive scans every thread's.
//!
//! For a lock that every operation takes shared and almost nothing takes
//! exclusive: the VFS's directory lock, which creates, unlinks and renames
//! in a directory take shared (the names have locks of their own) and only
//! the removal of the directory itself takes exclusive. A reader-writer
//! lock with a reader count makes every create in a shared directory write
//! the count's line twice; with two threads creating there, that line moves
//! between their cores on every operation (issue 16).
//!
//! ## The protocol
//!
//! Every thread has a block of [`SLOTS`] reader slots, on a cache line of
//! its own, and a node in one list of all threads ([`Readers`]) numbered
//! in the order they were pushed. A lock is a writer word, an overflow
//! count and a reader hint: a bit per node number (modulo 64).
//!
//! - **Shared**: wait until no writer is there; set the own node's bit in
//!   the lock's hint if it is not set yet (once per thread and lock: the
//!   bits are never cleared, so in steady state this is a read); store the
//!   lock's address in a free slot of the own block; load the writer word;
//!   if a writer came meanwhile, clear the slot and start over. Release:
//!   clear the slot. A thread whose slots are all in use counts itself in
//!   the lock's overflow count instead (the same store, check and undo).
//! - **Exclusive**: claim the writer word (0 -> 1); then wait until no slot
//!   of a node whose bit is in the hint holds the lock's address and the
//!   overflow count is 0. Release: store 0. A writer thus reads the slot
//!   lines of the threads that have used this lock, not of every thread:
//!   removing a directory does not touch the lines of threads working in
//!   other directories (the conflict matrix's own-directory pairs).
//!
//! The reader's store then load, and the writer's claim then loads, are all
//! `SeqCst`: of a reader and a writer that arrive together, at least one
//! sees the other (Dekker's pattern), so they never both proceed. The
//! reader sets its hint bit (`SeqCst`) before its slot store, so a writer
//! whose load of the hint misses the bit loaded it before that store, and
//! the reader then sees the writer's claim. A block
//! pushed onto the list after a writer read the list's head belongs to a
//! thread whose first slot store comes after the writer's claim in the
//! single order of `SeqCst` operations, so that reader sees the writer.
//! A reader's acquire is its `SeqCst` load of the writer word (it reads the
//! last writer's `Release` store of 0); a writer's acquire is its `SeqCst`
//! loads of the slots (they read the readers' `Release` stores of 0).
//!
//! Writers are preferred: a claimed writer word turns new readers away, so
//! a writer waits only for readers already inside. Readers then wait for
//! the writer. Waiting for a writer spins a little, then sleeps on the
//! writer word (a futex; a bit in the word tells the unlock to wake the
//! sleepers). A writer waiting for readers to leave spins, yields, then
//! sleeps on the writer word too, after setting `WRITER_SLEEPS` in it; a
//! reader's unlock (or a reader backing out because a writer came) clears
//! its slot, then loads the word (both `SeqCst`:
//! Dekker's pattern again, with the writer's setting of the bit then its
//! loads of the slots), and if the bit is set clears it and wakes: the
//! writer either saw the slot clear or is woken (the clearing changes the
//! word it sleeps on, so a wake before the sleep is not lost). It used to
//! poll every 50 µs instead.
//!
//! Blocks are never freed: a thread that ends gives its block back (all
//! its slots are clear then) and a new thread takes it over, so the list is
//! as long as the most threads that ever lived at once.
//!
//! Checked by `tests/loom_brlock.rs` (readers against a writer, a reader
//! in the overflow count, a writer's try-lock) on this code.

use crate::primitive::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Backoff, Ordering,
};
use crossbeam_utils::CachePadded;

/// Reader slots per thread: the brlocks one thread can hold shared at once
/// before it counts itself in a lock's overflow count.
pub const SLOTS: usize = 4;

/// One thread's reader slots, and its node in the list of all threads'.
/// The slots are on a line of their own, which only this thread writes;
/// the node's fields are read by writers walking the list and written
/// only when a thread takes the node or gives it back.
#[derive(Debug)]
pub struct ReaderSlots {
    /// The addresses of the locks this thread holds shared (0: free).
    slots: Box<CachePadded<[AtomicUsize; SLOTS]>>,
    /// The node's place in the list (0 for the first pushed): the bit
    /// `1 << (index % 64)` stands for it in a lock's reader hint.
    index: usize,
    /// A live thread owns this node.
    owned: AtomicBool,
    /// The next node of the list (set before the node is published,
    /// never changed after).
    next: *const CachePadded<ReaderSlots>,
}

impl ReaderSlots {
    fn bit(&self) -> u64 {
        1 << (self.index % 64)
    }
}

// SAFETY: `next` is written before the node is published (by the release
// of the list's compare-exchange) and never after; nodes are never freed,
// so sharing the pointer between threads is sound. The rest is atomics
// or immutable.
unsafe impl Sync for ReaderSlots {}
// SAFETY: as above.
unsafe impl Send for ReaderSlots {}

/// Every thread's reader slots: a list that only grows (nodes are reused,
/// never freed).
#[derive(Debug)]
pub struct Readers {
    head: AtomicPtr<CachePadded<ReaderSlots>>,
}

impl Default for Readers {
    fn default() -> Self {
        Self::new()
    }
}

impl Readers {
    /// An empty list.
    #[cfg(not(loom))]
    pub const fn new() -> Readers {
        Readers {
            head: AtomicPtr::new(std::ptr::null_mut()),
        }
    }
    /// An empty list.
    #[cfg(loom)]
    pub fn new() -> Readers {
        Readers {
            head: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &ReaderSlots> {
        // SeqCst: the writer's read of the list (see the module
        // documentation) comes after its claim in the single order.
        let mut p = self.head.load(Ordering::SeqCst) as *const CachePadded<ReaderSlots>;
        std::iter::from_fn(move || {
            // SAFETY: nodes are never freed, and `next` was written before
            // the node was published.
            let b = unsafe { p.as_ref() }?;
            p = b.next;
            Some(&**b)
        })
    }

    /// A node for the calling thread: one a finished thread gave back, or
    /// a new one pushed onto the list. Never freed (the list owns it).
    pub fn register(&self) -> &ReaderSlots {
        for b in self.iter() {
            // Relaxed load first: skip owned nodes without writing them.
            // Acquire on success: the previous owner's clears of its slots
            // (Release) happen before this thread's use.
            if !b.owned.load(Ordering::Relaxed)
                && b.owned
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return b;
            }
        }
        let mut head = self.head.load(Ordering::Acquire);
        let index_after = |h: *mut CachePadded<ReaderSlots>| {
            // SAFETY: published nodes are never freed (Acquire above and
            // on the failed compare-exchange: their fields are visible).
            unsafe { h.as_ref() }.map_or(0, |n| n.index + 1)
        };
        let b = Box::into_raw(Box::new(CachePadded::new(ReaderSlots {
            slots: Box::new(CachePadded::new(std::array::from_fn(|_| {
                AtomicUsize::new(0)
            }))),
            index: index_after(head),
            owned: AtomicBool::new(true),
            next: head,
        })));
        loop {
            // SeqCst: see the module documentation (registration against a
            // writer's read of the list).
            match self
                .head
                .compare_exchange(head, b, Ordering::SeqCst, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(h) => {
                    head = h;
                    // SAFETY: `b` is not published yet: this thread owns it
                    // and no other reference to it exists.
                    let n = unsafe { &mut *b };
                    n.next = h;
                    n.index = index_after(h);
                }
            }
        }
        // SAFETY: published and never freed: valid for the list's life.
        unsafe { &*b }
    }

    /// Give `b` back (its thread ends). Every slot must be clear.
    pub fn unregister(&self, b: &ReaderSlots) {
        debug_assert!(b.slots.iter().all(|s| s.load(Ordering::Relaxed) == 0));
        // Release: pairs with `register`'s Acquire.
        b.owned.store(false, Ordering::Release);
    }
}

/// How a shared acquisition was recorded (give it back to
/// [`RawBrLock::read_unlock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadTicket {
    /// In the reader's slot of this index.
    Slot(usize),
    /// In the lock's overflow count.
    Overflow,
}

/// The lock itself: a writer word, an overflow count and a reader hint
/// (24 bytes).
#[derive(Debug, Default)]
pub struct RawBrLock {
    writer: AtomicU32,
    overflow: AtomicUsize,
    /// Which threads' nodes a writer must look at: bit `index % 64` of
    /// every node that has ever held this lock shared (set before its
    /// first slot store, never cleared). A writer reads only the slot
    /// lines of those nodes, so a directory's removal does not touch the
    /// lines of threads that never worked in it.
    hint: AtomicU64,
}

/// The writer word: a writer holds or claims the lock.
const HELD: u32 = 1;
/// The writer word: someone sleeps until the word is 0 (the unlock wakes).
const WAITERS: u32 = 2;
/// The writer word: the writer sleeps until a reader leaves (the reader's
/// unlock clears the bit and wakes it).
const WRITER_SLEEPS: u32 = 4;

impl RawBrLock {
    /// An unlocked lock.
    #[cfg(not(loom))]
    pub const fn new() -> RawBrLock {
        RawBrLock {
            writer: AtomicU32::new(0),
            overflow: AtomicUsize::new(0),
            hint: AtomicU64::new(0),
        }
    }
    /// An unlocked lock.
    #[cfg(loom)]
    pub fn new() -> RawBrLock {
        RawBrLock {
            writer: AtomicU32::new(0),
            overflow: AtomicUsize::new(0),
            hint: AtomicU64::new(0),
        }
    }

    fn id(&self) -> usize {
        self as *const RawBrLock as usize
    }

    /// One attempt to take the lock shared, recorded in `me` (the calling
    /// thread's block; `None`: in the overflow count): `None` if a writer
    /// is there (nothing is left recorded then).
    pub fn try_read(&self, me: Option<&ReaderSlots>) -> Option<ReadTicket> {
        let free = me.and_then(|m| {
            // Relaxed: only this thread writes its own slots.
            (0..SLOTS).find(|&i| m.slots[i].load(Ordering::Relaxed) == 0)
        });
        match (me, free) {
            (Some(m), Some(i)) => {
                // SeqCst (read and set): the bit is sticky, but may have
                // been set by another thread (this node's previous owner,
                // or the node 64 places away), so this read, not only our
                // own set, must come before the slot store in the single
                // order: a writer whose SeqCst read of the hint misses the
                // bit then comes before the store, and this reader sees its
                // claim. (A plain load on x86, `ldar` on ARM.)
                if self.hint.load(Ordering::SeqCst) & m.bit() == 0 {
                    self.hint.fetch_or(m.bit(), Ordering::SeqCst);
                }
                // SeqCst (store, then load): see the module documentation
                // (Dekker's pattern with the writer). The slot's writes are
                // swaps (an x86 SeqCst store is one anyway; the clears cost
                // a locked instruction on a line only this thread writes),
                // so that under loom they are ordered with the writer's
                // SeqCst loads, which the shim performs as read-only RMWs.
                m.slots[i].swap(self.id(), Ordering::SeqCst);
                if self.writer.load(Ordering::SeqCst) == 0 {
                    return Some(ReadTicket::Slot(i));
                }
                // SeqCst: a writer that sees the clear slot proceeds; one
                // that saw it set may be asleep (see `reader_left`).
                m.slots[i].swap(0, Ordering::SeqCst);
                self.reader_left();
            }
            _ => {
                // SeqCst: as above, with the count for the slot.
                self.overflow.fetch_add(1, Ordering::SeqCst);
                if self.writer.load(Ordering::SeqCst) == 0 {
                    return Some(ReadTicket::Overflow);
                }
                // SeqCst: as above.
                self.overflow.fetch_sub(1, Ordering::SeqCst);
                self.reader_left();
            }
        }
        None
    }

    /// Take the lock shared (see [`RawBrLock::try_read`]), waiting while a
    /// writer is there.
    pub fn read(&self, me: Option<&ReaderSlots>) -> ReadTicket {
        loop {
            self.wait_no_writer();
            if let Some(t) = self.try_read(me) {
                return t;
            }
        }
    }

    /// Wait until no writer holds or claims the lock: spin and yield a
    /// little, then sleep on the writer word (a futex), announced by its
    /// `WAITERS` bit so that the writer's unlock wakes the sleepers. (A
    /// writer can hold the lock for a long time: a large write.)
    fn wait_no_writer(&self) {
        let backoff = Backoff::new();
        loop {
            // Relaxed: a hint; the caller's SeqCst load or claim decides.
            let w = self.writer.load(Ordering::Relaxed);
            if w == 0 {
                return;
            }
            if !backoff.is_completed() {
                backoff.snooze();
                continue;
            }
            // Relaxed: the bit only asks the unlock for a wake-up; the
            // futex re-checks the word against `w | WAITERS` atomically.
            if w & WAITERS == 0
                && self
                    .writer
                    .compare_exchange(w, w | WAITERS, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            crate::primitive::wait_u32(&self.writer, w | WAITERS);
        }
    }

    /// Release a shared acquisition (`me`: the block given to `read`).
    pub fn read_unlock(&self, me: Option<&ReaderSlots>, t: ReadTicket) {
        match (t, me) {
            // Release: the reader's critical section happens before the
            // writer that sees the clear slot (its SeqCst load acquires).
            // (A swap: see `try_read`.)
            // SeqCst (this write and the load below): the Dekker pair with
            // a writer that sets `WRITER_SLEEPS` then loads the slots (see
            // the module documentation).
            (ReadTicket::Slot(i), Some(m)) => {
                m.slots[i].swap(0, Ordering::SeqCst);
            }
            // SeqCst: as above.
            (ReadTicket::Overflow, _) => {
                self.overflow.fetch_sub(1, Ordering::SeqCst);
            }
            (ReadTicket::Slot(_), None) => unreachable!("a slot ticket without its block"),
        }
        self.reader_left();
    }

    /// A reader's count is gone (an unlock, or a reader that backed out
    /// because a writer came): wake the writer if it sleeps until readers
    /// leave. Called after the count's `SeqCst` clear.
    fn reader_left(&self) {
        // SeqCst: see the module documentation (Dekker's pattern with the
        // writer's setting of the bit, then its loads of the slots).
        if self.writer.load(Ordering::SeqCst) & WRITER_SLEEPS != 0 {
            // Relaxed: the wake below is what the writer waits for; the
            // change of the word makes its futex wait return if it has
            // not slept yet.
            self.writer.fetch_and(!WRITER_SLEEPS, Ordering::Relaxed);
            crate::primitive::wake_all_u32(&self.writer);
        }
    }

    /// Whether a reader is inside (in a slot of a block of `all`, or in
    /// the overflow count). After a successful [`RawBrLock::try_claim`], a
    /// `false` means the lock is held exclusive.
    pub fn readers_inside(&self, all: &Readers) -> bool {
        let id = self.id();
        // SeqCst: the writer's loads after its claim (see the module
        // documentation).
        if self.overflow.load(Ordering::SeqCst) != 0 {
            return true;
        }
        // SeqCst: after the claim; see `try_read`.
        let hint = self.hint.load(Ordering::SeqCst);
        hint != 0
            && all.iter().any(|b| {
                hint & b.bit() != 0 && b.slots.iter().any(|s| s.load(Ordering::SeqCst) == id)
            })
    }

    /// One attempt to claim the writer word (turning new readers away);
    /// the claimer then waits until [`RawBrLock::readers_inside`] is false,
    /// or gives the claim up with [`RawBrLock::write_unlock`].
    pub fn try_claim(&self) -> bool {
        // Relaxed read first (no write while another writer holds it);
        // SeqCst claim: see the module documentation.
        self.writer.load(Ordering::Relaxed) == 0
            && self
                .writer
                .compare_exchange(0, HELD, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
    }

    /// Take the lock exclusive (`all`: every thread's slots).
    pub fn write(&self, all: &Readers) {
        while !self.try_claim() {
            self.wait_no_writer();
        }
        self.wait_readers_gone(all);
    }

    /// After a claim: wait until no reader is inside, spinning, yielding,
    /// then sleeping on the writer word with `WRITER_SLEEPS` set (see the
    /// module documentation).
    fn wait_readers_gone(&self, all: &Readers) {
        let backoff = Backoff::new();
        let mut yields = 0u32;
        while self.readers_inside(all) {
            if !backoff.is_completed() {
                backoff.snooze();
            } else if yields < 64 {
                yields += 1;
                crate::primitive::yield_now();
            } else {
                let Some(w) = self.announce_sleep(all) else {
                    break;
                };
                crate::primitive::wait_u32(&self.writer, w);
            }
        }
    }

    /// The sleeping step of a claimed writer's wait for readers: ask them
    /// for a wake-up (`WRITER_SLEEPS`) and look again. `None`: no reader
    /// is inside, go on; `Some(w)`: sleep while the writer word is `w` (a
    /// reader that leaves, or backs out, changes it and wakes). Public for
    /// the loom model, which checks that a reader always changes the word
    /// a writer would sleep on.
    #[doc(hidden)]
    pub fn announce_sleep(&self, all: &Readers) -> Option<u32> {
        // SeqCst: the Dekker pair with `reader_left` (this RMW, then the
        // loads of the slots).
        let w = self.writer.fetch_or(WRITER_SLEEPS, Ordering::SeqCst) | WRITER_SLEEPS;
        self.readers_inside(all).then_some(w)
    }

    /// The writer word (for the loom model; see `announce_sleep`).
    #[doc(hidden)]
    pub fn writer_word(&self) -> u32 {
        // SeqCst: as the other loads of the word.
        self.writer.load(Ordering::SeqCst)
    }

    /// Take the lock exclusive if no writer holds it and no reader is
    /// inside, without waiting.
    pub fn try_write(&self, all: &Readers) -> bool {
        if !self.try_claim() {
            return false;
        }
        if self.readers_inside(all) {
            // Nothing was done under the claim.
            self.write_unlock();
            return false;
        }
        true
    }

    /// Release an exclusive acquisition (or give a claim up).
    pub fn write_unlock(&self) {
        // Release: the writer's critical section happens before every
        // reader that then sees 0 (its SeqCst load acquires). A swap for
        // loom's sake, as the slots' writes (see `try_read`); it also tells
        // whether someone sleeps on the word.
        if self.writer.swap(0, Ordering::Release) & WAITERS != 0 {
            crate::primitive::wake_all_u32(&self.writer);
        }
    }
}

/// The readers of this process's big-reader locks (`ordered::BrLock`, the
/// wrapper one layer up), and the calling thread's block in it (taken at
/// its first shared acquisition, given back when it ends).
#[cfg(not(loom))]
pub(crate) mod global {
    use super::{ReaderSlots, Readers};

    pub(crate) static READERS: Readers = Readers::new();

    struct Mine(&'static ReaderSlots);
    impl Drop for Mine {
        fn drop(&mut self) {
            READERS.unregister(self.0);
        }
    }

    thread_local! {
        static MINE: Mine = Mine(READERS.register());
    }

    /// The calling thread's block; `None` while the thread ends (its
    /// locals are gone: the overflow count serves it).
    #[inline]
    pub(crate) fn mine() -> Option<&'static ReaderSlots> {
        MINE.try_with(|m| m.0).ok()
    }
}
