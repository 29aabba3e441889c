//! Per-thread deferred frees: an object a thread retires is freed by that
//! same thread after a grace period, as Linux queues RCU callbacks per CPU.
//!
//! crossbeam-epoch keeps a thread's garbage in a bag that, once full, goes
//! to one global queue, and whichever thread collects next runs it. On two
//! threads about half of each thread's dentries were then freed by the
//! other: each such free is a cross-thread free in the allocator (a push to
//! the owning page's remote list, collected later by the owner) plus first
//! touches of lines last held by the other core, several line transfers
//! per object where a transfer costs ~200 ns (issue 16, "cross-thread
//! frees").
//!
//! Here a thread gathers its retired objects in its own batch. A full
//! batch is sealed and one crossbeam deferral is registered for it; that
//! deferral only marks the batch READY (the grace period has passed). The
//! owner frees READY batches itself at the entry of its next system call
//! that retires objects (`poll`: no lock of the core is held there).
//! The deferral also registers a second one (one grace period later) that
//! steals the batch if the owner has not taken it by then, so an idle
//! owner keeps its garbage no longer than crossbeam would keep any; a
//! thread that exits hands its batches over the same way (ORPHANED).
//!
//! States of a sealed batch (`Batch::state`); whoever moves it to TAKEN
//! runs its frees, so they run exactly once:
//! PENDING -> READY (grace period over) -> TAKEN (owner or thief);
//! PENDING -> ORPHANED (owner exited) -> TAKEN (at the grace period).
//! Loom: `crates/core/src/loom_models.rs` (`limbo_*`).
//!
//! ## Pins in frees (`pin`)
//!
//! Frees run inside crossbeam's collection, which runs inside a pin. While
//! a thread exits, crossbeam's per-thread handle may already be gone; each
//! pin then registers a fresh participant, and a fresh participant's first
//! pin collects. A free that pinned there (a closed file puts its mount
//! reference under a pin) started one more collection inside the first,
//! one stack level per queued bag, until the stack overflowed. The pins of
//! code that frees go through `pin` instead: inside a collection started by
//! `pin` on this thread it pins nothing (the pin in progress protects the
//! thread already) and queues deferrals on the thread (`Pin::Nested`,
//! `LATER`); that outer `pin` hands them to its guard once the collection
//! is over. Nesting is one level at most. Test:
//! `crates/core/tests/thread_exit_frees.rs`.

#[cfg(not(loom))]
use std::cell::UnsafeCell;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;

#[cfg(loom)]
use loom::cell::UnsafeCell;
use scalevfs_sync::primitive::{AtomicU32, Ordering};

/// Frees per sealed batch: one deferral and one `Arc` per this many.
const BATCH: usize = 32;

const PENDING: u32 = 0;
const READY: u32 = 1;
const TAKEN: u32 = 2;
const ORPHANED: u32 = 3;

/// One retired object: its free function and its address.
#[derive(Clone, Copy)]
pub(crate) struct Item {
    pub(crate) free: unsafe fn(*mut ()),
    pub(crate) ptr: *mut (),
}

// SAFETY: an item is an address and the function that frees it; `retire`'s
// contract makes the object free-able by any thread once the grace period
// has passed.
unsafe impl Send for Item {}

pub(crate) struct Batch {
    state: AtomicU32,
    /// Written by the owner before the batch is shared; then read and
    /// emptied only by the one thread that moved `state` to TAKEN.
    items: UnsafeCell<Vec<Item>>,
}

// SAFETY: `items` is reached by one thread at a time (module comment: the
// TAKEN transition is the only way in after sealing).
unsafe impl Sync for Batch {}
// SAFETY: as above; the items are Send.
unsafe impl Send for Batch {}

impl Batch {
    pub(crate) fn new(items: Vec<Item>) -> Batch {
        Batch {
            state: AtomicU32::new(PENDING),
            items: UnsafeCell::new(items),
        }
    }

    /// Move `from` -> TAKEN; on success the caller runs the frees.
    /// AcqRel: the winner's reads of `items` follow the owner's writes
    /// (Acquire, through the earlier transitions), and exactly one thread
    /// wins (the compare-and-exchange).
    fn take_from(&self, from: u32) -> bool {
        self.state
            .compare_exchange(from, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Run the frees. Only by the thread that moved the batch to TAKEN
    /// (`take_from`, or `owner_claim` returning `Some(true)`).
    pub(crate) fn run(&self) {
        // SAFETY: this thread moved the state to TAKEN (exclusive access).
        // (Under loom the cell is loom's, which checks that claim.)
        #[cfg(not(loom))]
        let items = std::mem::take(unsafe { &mut *self.items.get() });
        #[cfg(loom)]
        let items = self.items.with_mut(|p| std::mem::take(unsafe { &mut *p }));
        for it in items {
            // SAFETY: `retire`'s contract: the grace period has passed.
            unsafe { (it.free)(it.ptr) };
        }
    }

    /// The grace period has passed. Returns true when the caller should
    /// arrange a steal later (the owner is alive and may take it).
    pub(crate) fn on_grace(&self) -> bool {
        // AcqRel: pairs with the owner's ORPHANED store (Release) so the
        // failure path below sees the state it must act on.
        match self
            .state
            .compare_exchange(PENDING, READY, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(ORPHANED) => {
                if self.take_from(ORPHANED) {
                    self.run();
                }
                false
            }
            Err(_) => false,
        }
    }

    /// The owner takes the batch's frees back, whatever its grace period
    /// (to defer them again, later: `retire_heavy`); none when a thief or
    /// an exit took them already.
    pub(crate) fn take_items(&self) -> Vec<Item> {
        if !(self.take_from(PENDING) || self.take_from(READY)) {
            return Vec::new();
        }
        // SAFETY: this thread moved the state to TAKEN (exclusive access).
        #[cfg(not(loom))]
        let items = std::mem::take(unsafe { &mut *self.items.get() });
        #[cfg(loom)]
        let items = self.items.with_mut(|p| std::mem::take(unsafe { &mut *p }));
        items
    }

    /// A grace period after READY: free it if the owner has not.
    pub(crate) fn steal(&self) {
        if self.take_from(READY) {
            self.run();
        }
    }

    /// The owner's attempt: `Some(true)` when it took the batch (it runs
    /// the frees, `run`), `Some(false)` when a thief did, `None`
    /// while the grace period lasts.
    pub(crate) fn owner_claim(&self) -> Option<bool> {
        // Acquire: see a thief's TAKEN (then nothing to do).
        match self.state.load(Ordering::Acquire) {
            READY => Some(self.take_from(READY)),
            TAKEN => Some(false),
            _ => None,
        }
    }

    /// Whether `owner_claim` would find the grace period over (a look, no
    /// claim).
    pub(crate) fn owner_claim_ready(&self) -> bool {
        // Acquire: as `owner_claim`.
        self.state.load(Ordering::Acquire) != PENDING
    }

    /// The owner is exiting: a PENDING batch is left to its grace-period
    /// deferral, a READY one is freed now.
    pub(crate) fn orphan(&self) {
        // AcqRel: pairs with `on_grace`'s compare-and-exchange.
        if self
            .state
            .compare_exchange(PENDING, ORPHANED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
            && self.take_from(READY)
        {
            self.run();
        }
    }
}

#[derive(Default)]
struct Limbo {
    open: Vec<Item>,
    sealed: VecDeque<Arc<Batch>>,
    /// A batch was sealed since the last flush under `Pressure`: its
    /// deferral may still sit in this thread's crossbeam bag, which reaches
    /// the global queue (and a grace period) only when it holds 64
    /// deferrals or is flushed.
    unflushed: bool,
}

impl Drop for Limbo {
    fn drop(&mut self) {
        // The thread exits: seal what is open, hand over every batch.
        if !self.open.is_empty() {
            self.seal();
        }
        for b in self.sealed.drain(..) {
            b.orphan();
        }
    }
}

impl Limbo {
    fn seal(&mut self) {
        let b = Arc::new(Batch::new(std::mem::replace(
            &mut self.open,
            Vec::with_capacity(BATCH),
        )));
        let g = pin();
        let b2 = b.clone();
        // The deferral runs after every thread pinned now has unpinned;
        // each item was unreachable before this thread pinned here.
        // The steal waits two more grace periods: the owner, polling at
        // each of its system calls, takes nearly every batch first.
        g.defer(move || {
            if b2.on_grace() {
                let g = pin();
                g.defer(move || {
                    let g = pin();
                    g.defer(move || b2.steal());
                });
            }
        });
        self.sealed.push_back(b);
        self.unflushed = true;
    }
}

/// Threads retrying an operation that found no space while removed files
/// may still be held by deferred frees (`Pressure`). While any are, every
/// thread hands the deferrals of the batches it sealed to the epoch at its
/// next call (`poll`) instead of leaving them in crossbeam's bag of the
/// thread until 64 gather: 16 threads creating and removing files on an
/// image with 2,036 free inodes ran out with every one of them held
/// (tests/enospc_churn.rs). (Sealing every thread's open batch at each
/// call as well made 4 threads with ext4's commit thread run out: left
/// out.) A plain std atomic: a hint, read at each `poll`, whose late sight
/// only delays frees; loom does not model it.
static PRESSURE: crossbeam_utils::CachePadded<std::sync::atomic::AtomicUsize> =
    crossbeam_utils::CachePadded::new(std::sync::atomic::AtomicUsize::new(0));

/// Inodes dropped (their last reference gone: a removed file's space and
/// inode given back) while some thread waited for space: what such a
/// thread watches for progress (`namei::EnospcWait`). Counted only then,
/// or every unlink would write this line.
static INODES_DROPPED: crossbeam_utils::CachePadded<std::sync::atomic::AtomicUsize> =
    crossbeam_utils::CachePadded::new(std::sync::atomic::AtomicUsize::new(0));

/// An inode's last reference went (`Inode`'s drop).
pub(crate) fn inode_dropped() {
    // Relaxed (both): hints.
    if PRESSURE.load(std::sync::atomic::Ordering::Relaxed) != 0 {
        INODES_DROPPED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `INODES_DROPPED` now.
pub(crate) fn inodes_dropped() -> usize {
    // Relaxed: a hint.
    INODES_DROPPED.load(std::sync::atomic::Ordering::Relaxed)
}

/// This thread waits for other threads' deferred frees (`PRESSURE`) while
/// this lives.
pub(crate) struct Pressure(());

impl Pressure {
    pub(crate) fn new() -> Pressure {
        // Relaxed: a hint (see `PRESSURE`).
        PRESSURE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Pressure(())
    }
}

impl Drop for Pressure {
    fn drop(&mut self) {
        // Relaxed: as in `new`.
        PRESSURE.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

thread_local! {
    static LIMBO: RefCell<Limbo> = RefCell::new(Limbo::default());
    /// Whether this thread is inside `pin`'s call of crossbeam's pin (in
    /// the collection it may run). Const, no destructor: usable while the
    /// thread exits.
    static PINNING: Cell<bool> = const { Cell::new(false) };
    /// A heavy object was retired in this system call (`retire_heavy`).
    static FLUSH_DUE: Cell<bool> = const { Cell::new(false) };
    /// Deferrals asked for under `Pin::Nested`, newest first.
    static LATER: Cell<*mut Later> = const { Cell::new(std::ptr::null_mut()) };
}

/// A deferral waiting for the outer `pin` of this thread.
struct Later {
    f: Box<dyn FnOnce()>,
    next: *mut Later,
}

/// An epoch pin for code that frees or runs inside a free (module comment,
/// "Pins in frees").
pub(crate) enum Pin {
    Guard(crossbeam_epoch::Guard),
    /// This thread is inside a collection of `pin`'s own pin in progress,
    /// which protects it: nothing pinned here.
    Nested,
}

/// Pin the epoch, unless this thread is inside a collection that `pin`
/// started (then `Pin::Nested`).
pub(crate) fn pin() -> Pin {
    if PINNING.with(Cell::get) {
        return Pin::Nested;
    }
    /// Clears `PINNING` however `crossbeam_epoch::pin` leaves (a
    /// deferred free that panics in its collection, caught by a caller,
    /// must not leave every later `pin` of this thread `Nested`, unpinned).
    struct Unmark;
    impl Drop for Unmark {
        fn drop(&mut self) {
            PINNING.with(|p| p.set(false));
        }
    }
    PINNING.with(|p| p.set(true));
    let unmark = Unmark;
    let g = crossbeam_epoch::pin();
    drop(unmark);
    // Deferrals asked for during the collection: to this guard.
    let mut l = LATER.with(|l| l.replace(std::ptr::null_mut()));
    while !l.is_null() {
        // SAFETY: `Pin::defer_unchecked` made it with Box::into_raw and
        // linked it on this thread only; taken off the list once, here.
        let later = unsafe { Box::from_raw(l) };
        l = later.next;
        let f = later.f;
        // SAFETY: the deferral's contract was checked when it was queued
        // (`Pin::defer_unchecked`); deferring later only delays it.
        unsafe { g.defer_unchecked(f) };
    }
    Pin::Guard(g)
}

impl Pin {
    /// A guard for loads and swaps of epoch pointers. Under `Nested` the
    /// unprotected guard: the thread is pinned by the outer pin, and the
    /// deferrals must go through `Pin::defer_unchecked`, never this guard.
    pub(crate) fn loads(&self) -> &crossbeam_epoch::Guard {
        match self {
            Pin::Guard(g) => g,
            // SAFETY: only its type is used for loads and swaps; the
            // thread is inside a pinned section (the variant's meaning).
            Pin::Nested => unsafe { crossbeam_epoch::unprotected() },
        }
    }

    /// Run `f` after a grace period (crossbeam's `defer_unchecked`; under
    /// `Nested`, queued for the outer pin's guard).
    ///
    /// # Safety
    /// As crossbeam's `Guard::defer_unchecked`.
    pub(crate) unsafe fn defer_unchecked<F: FnOnce() + 'static>(&self, f: F) {
        match self {
            // SAFETY: the caller's contract.
            Pin::Guard(g) => unsafe { g.defer_unchecked(f) },
            Pin::Nested => {
                let l = Box::into_raw(Box::new(Later {
                    f: Box::new(f),
                    next: LATER.with(Cell::get),
                }));
                LATER.with(|h| h.set(l));
            }
        }
    }

    /// Run `f` after a grace period (crossbeam's `defer`).
    pub(crate) fn defer<F: FnOnce() + Send + 'static>(&self, f: F) {
        // SAFETY: `f` owns what it uses ('static) and may run on any
        // thread (Send): crossbeam's safe `defer` asks no more.
        unsafe { self.defer_unchecked(f) }
    }

    /// Free `p` after a grace period (crossbeam's `defer_destroy`).
    ///
    /// # Safety
    /// As crossbeam's `Guard::defer_destroy`.
    pub(crate) unsafe fn defer_destroy<T: 'static>(&self, p: crossbeam_epoch::Shared<'_, T>) {
        let raw = p.as_raw() as usize;
        // SAFETY: the caller's contract: `p` is unreachable and freed once.
        unsafe {
            self.defer_unchecked(move || {
                drop(crossbeam_epoch::Owned::from_raw(raw as *mut T));
            })
        };
    }
}

/// Free `ptr` with `free` after a grace period, on this thread when it is
/// still running then.
///
/// # Safety
/// `ptr` is unreachable for new readers (unlinked from every structure)
/// before this call, pinned readers may still hold it, and `free(ptr)` is
/// sound on any thread once every epoch guard alive at this call is gone.
pub(crate) unsafe fn retire(free: unsafe fn(*mut ()), ptr: *mut ()) {
    let item = Item { free, ptr };
    let queued = LIMBO.try_with(|l| {
        let Ok(mut l) = l.try_borrow_mut() else {
            return false;
        };
        l.open.push(item);
        if l.open.len() >= BATCH {
            l.seal();
        }
        true
    });
    if queued != Ok(true) {
        // The thread is exiting or inside a free run by `poll`: the
        // global queue.
        let g = pin();
        // SAFETY: as this function's contract.
        unsafe { g.defer_unchecked(move || (item.free)(item.ptr)) };
    }
}

/// Data a removed file must hold (its `st_blocks`, in 512-byte units) for
/// its last counts to go by `retire_heavy`: 1 MiB. Each such removal
/// costs a flush and a collection (and the frees run on whichever thread
/// collects), which doubled the delete phase of `bench-tree` at two
/// threads when every removed file with data took it; a smaller file's
/// space comes back at the remover's next call, or once 32 more frees
/// seal its batch (and to its own calls at once: `namei::EnospcWait`).
pub(crate) const HEAVY_BLOCKS: u64 = (1 << 20) / 512;

/// Whether the removal of a file with these attributes (its last name
/// gone: `nlink` 0, or `last`) gives back enough space to free its last
/// counts through `retire_heavy`.
///
/// Smaller removals add up: once the data of this thread's lighter
/// removals since its last heavy one reaches `HEAVY_BLOCKS`, the next
/// removal with data is heavy and takes them all along (`retire_heavy`
/// empties this thread's batches). Before, twenty files of 1020 KiB
/// removed by a thread that then parked kept their 20 MiB from every
/// other thread (statfs counted them, a write got ENOSPC; tmpfs gives
/// them back). A removal may be counted more than once (its dentry, its
/// description, its name each ask): that only makes the hand-over come
/// sooner.
pub(crate) fn is_heavy(nlink: u32, blocks: u64) -> bool {
    if nlink != 0 || blocks == 0 {
        return false;
    }
    if blocks >= HEAVY_BLOCKS {
        return true;
    }
    LIGHT_BLOCKS
        .try_with(|c| {
            let n = c.get().saturating_add(blocks);
            if n >= HEAVY_BLOCKS {
                true
            } else {
                c.set(n);
                false
            }
        })
        .unwrap_or(false)
}

std::thread_local! {
    /// The data (512-byte blocks) of this thread's removals since its
    /// last heavy one (`is_heavy`).
    static LIGHT_BLOCKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// `retire` for an object whose free may give a large space back (the
/// last count of a removed file's inode that holds at least
/// `HEAVY_BLOCKS`, or the description or dentry that holds it). It and everything this thread still holds (its
/// open batch and the sealed batches it has not freed: a description
/// closed just before the unlink holds the same inode) leave the
/// thread's batches for one crossbeam deferral of their own, handed to
/// the global queue at the end of the system call (`flush_if_due`),
/// where any thread's collection frees them after a grace period
/// (another's wait for space among them). In the batches they waited for
/// this thread to retire 31 more objects or to call again: a thread that
/// removed a large file and then only read, or parked, kept its space
/// from every other thread, which could only wait (`statfs` still counted
/// it; a write got ENOSPC). tmpfs gives the space back at the unlink or
/// last close. The cross-thread frees the batches avoid cost nothing that
/// matters here: such removals are rare.
///
/// # Safety
/// As `retire`.
pub(crate) unsafe fn retire_heavy(free: unsafe fn(*mut ()), ptr: *mut ()) {
    let _ = LIGHT_BLOCKS.try_with(|c| c.set(0));
    let mut items = Vec::new();
    let _ = LIMBO.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            items.append(&mut l.open);
            for b in l.sealed.drain(..) {
                items.extend(b.take_items());
            }
        }
    });
    items.push(Item { free, ptr });
    let g = pin();
    // SAFETY: each item was unreachable before this thread pinned here
    // (`retire`'s contract, and this one's), so freeing them all after
    // the grace period this deferral waits for is sound; taken out of
    // their batches (`take_items`), they are freed here only.
    unsafe {
        g.defer_unchecked(move || {
            for it in items {
                (it.free)(it.ptr);
            }
        })
    };
    let _ = FLUSH_DUE.try_with(|f| f.set(true));
}

/// At the end of a system call that retired a heavy object
/// (`retire_heavy`), unpinned and holding no lock of the core: hand this
/// thread's deferrals to the global queue (one push and a collection,
/// only after such a removal). A free run by that collection may retire
/// another heavy object (a description's drop puts its dentry), whose
/// deferral is handed over the same way, a few rounds at most.
pub(crate) fn flush_if_due() {
    for _ in 0..4 {
        if crossbeam_epoch::is_pinned() || FLUSH_DUE.try_with(|f| f.replace(false)) != Ok(true) {
            return;
        }
        crossbeam_epoch::pin().flush();
    }
}

/// Seal this thread's open batch now (whatever its size), so that its
/// frees follow the next grace period (`memfs::flush_deferred_frees`).
pub(crate) fn seal_open() {
    let _ = LIMBO.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            if !l.open.is_empty() {
                l.seal();
            }
        }
    });
}

/// Whether this thread has no deferred frees waiting (none gathered, none
/// sealed): what a teardown waits for (`Vfs`'s drop).
pub(crate) fn drained() -> bool {
    LIMBO
        .try_with(|l| {
            l.try_borrow()
                .is_ok_and(|l| l.open.is_empty() && l.sealed.is_empty())
        })
        .unwrap_or(true)
}

/// Free this thread's batches whose grace period is over (oldest first).
///
/// Called at the entry of the system calls that retire objects (open,
/// close, the name operations), where the thread holds no lock of the
/// core: the frees drop dentries, open files and inodes, whose drops take
/// locks. Not while the thread is pinned (a caller inside an epoch guard
/// may be anywhere). Cheap when nothing is due: one thread-local look at
/// the oldest sealed batch. The frees run with no borrow held: one may retire
/// more.
pub(crate) fn poll() {
    // Claim the due batches at the front (batches come due in about the
    // order they were sealed: one look at the oldest when none is due)
    // under the borrow, run them after it.
    let mut flush = false;
    let due = LIMBO.try_with(|l| {
        let Ok(mut l) = l.try_borrow_mut() else {
            return Vec::new();
        };
        // Some thread waits for space: hand the deferrals of the batches
        // sealed since the last flush to the global queue (below, after
        // the borrow). Left in crossbeam's bag of this thread, up to 64 of
        // them (2,048 frees, each maybe the last reference of a removed
        // inode) wait for the bag to fill (`PRESSURE`). Not in normal
        // running: a flush is a push to the global queue and a collection
        // (one per sealed batch cost creat-clo about a tenth).
        // Relaxed: a hint (see `PRESSURE`).
        if PRESSURE.load(std::sync::atomic::Ordering::Relaxed) != 0
            && l.unflushed
            && !crossbeam_epoch::is_pinned()
        {
            l.unflushed = false;
            flush = true;
        }
        let mut due = Vec::new();
        let mut unpinned = false;
        while let Some(b) = l.sealed.front() {
            if !b.owner_claim_ready() {
                break;
            }
            // Only now ask whether the thread is pinned: most calls find
            // nothing due.
            if !unpinned {
                if crossbeam_epoch::is_pinned() {
                    break;
                }
                unpinned = true;
            }
            match b.owner_claim() {
                Some(true) => due.push(l.sealed.pop_front().expect("front")),
                Some(false) => {
                    l.sealed.pop_front();
                }
                None => break,
            }
        }
        due
    });
    if flush {
        if let Pin::Guard(g) = pin() {
            g.flush();
        }
    }
    for b in due.unwrap_or_default() {
        b.run();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering as O};
    use std::sync::Mutex;

    /// Frees done, and the threads that did them.
    static FREED: AtomicUsize = AtomicUsize::new(0);
    static BY: Mutex<Vec<std::thread::ThreadId>> = Mutex::new(Vec::new());

    unsafe fn free_box(p: *mut ()) {
        // SAFETY: `p` came from `Box::into_raw` below, freed once.
        drop(unsafe { Box::from_raw(p as *mut u64) });
        FREED.fetch_add(1, O::SeqCst);
        BY.lock().unwrap().push(std::thread::current().id());
    }

    fn retire_boxes(n: usize) {
        for i in 0..n {
            let p = Box::into_raw(Box::new(i as u64)) as *mut ();
            // SAFETY: the box is reachable from nowhere else.
            unsafe { retire(free_box, p) };
        }
    }

    /// Until `FREED` reaches `n` (for up to 10 s): flush the epoch, seal
    /// and poll. Bounded by time, not by a count of rounds: the epoch
    /// advances only when no thread is pinned in an older one, and the
    /// other tests of this binary pin on other threads meanwhile (CI once
    /// saw 10,000 quick rounds pass without an advance).
    fn settle(n: usize) {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_secs(10) {
            if FREED.load(O::SeqCst) >= n {
                return;
            }
            seal_open();
            crossbeam_epoch::pin().flush();
            poll();
            std::thread::yield_now();
        }
    }

    /// One test (the counters are shared): a thread's retired objects
    /// (more than a batch) are freed after grace periods by that thread,
    /// at its polls; a thread that exits hands its batches over and they
    /// are freed anyway; nothing is freed twice.
    #[test]
    fn retired_objects_are_freed_once_by_their_thread_or_after_it() {
        let me = std::thread::current().id();
        retire_boxes(BATCH + 5);
        assert!(FREED.load(O::SeqCst) <= BATCH + 5);
        settle(BATCH + 5);
        assert_eq!(FREED.load(O::SeqCst), BATCH + 5);
        assert!(
            BY.lock().unwrap().iter().all(|t| *t == me),
            "freed elsewhere"
        );
        assert!(drained());
        // A thread that retires and exits: its batches go on without it.
        std::thread::spawn(|| retire_boxes(BATCH * 2 + 3))
            .join()
            .unwrap();
        settle(BATCH * 3 + 8);
        assert_eq!(FREED.load(O::SeqCst), BATCH * 3 + 8);
    }
}
