//! The page store of a memfs file: a radix tree of 4 KiB pages that readers
//! walk without taking a lock or writing shared memory.
//!
//! LOCKING RULES
//! - Readers (`read`, `seek_data_hole`) pin an epoch guard and follow
//!   Acquire-loaded pointers. They write nothing shared, so `pread`s of the
//!   same or different ranges from many threads do not contend.
//! - Writers (`write`, `truncate`, `fallocate`) are serialised by the caller:
//!   the VFS holds the inode's data lock exclusively (see `io.rs`). The one
//!   exception is `overwrite_in_page`, a copy-on-write overwrite inside one
//!   existing page below the size, which runs under the lock held shared,
//!   beside others of its kind, and publishes its copy by
//!   compare-and-exchange (a loser re-copies the winner's page). This
//!   module has no lock of its own.
//! - Nodes and pages that leave the tree are freed after a grace period;
//!   page frames go back to the OS then (`frames.rs`).
//! - Space: the filesystem's page count (`Quota`, one atomic per memfs) is
//!   updated once per call that removes pages and once per 64 pages a call
//!   adds, never for an overwrite or an append inside the last page.
//!
//! How a reader never sees garbage without a lock:
//! - Rule: a byte that a reader may copy is never written in place. A
//!   reader may copy byte `b` of a page if, after loading the page pointer,
//!   it read a size above `b`. So a writer writes in place only bytes at or
//!   beyond the current size (an append into the last page, or into a page
//!   allocated past EOF by fallocate), and only into a page that has been in
//!   the tree only while the size was at or below those bytes. Every other
//!   change (overwrite, truncate's zeroed tail, hole punch) publishes a
//!   modified copy and frees the old page after a grace period (copy on
//!   write). So a reader holding a page sees one version of it.
//! - A shrinking truncate is what could break the second half of the rule:
//!   readers that read the old size may still copy bytes past the new one.
//!   So it removes every page wholly past the new size and *replaces* the
//!   page holding the new EOF, whether it was ever written or not (a page
//!   fallocate made and no one wrote is still one readers copy from).
//! - Invariant: bytes of any page at or beyond the file size are zero.
//! - A shrinking truncate stores the new size *before* it removes or replaces
//!   pages; a write stores data *before* the new size. A reader loads the page
//!   pointer first and then reads the size, and copies only bytes below that
//!   size. The in-place writes that happened before the size rose past a
//!   byte happen-before the reader's size read. A read that overlaps a
//!   truncate therefore returns old data, new data, or a short count, never
//!   bytes that were not in the file.
//!
//! Limits: every size, offset and count from outside is checked with O(1)
//! arithmetic before any loop: a fallocate larger than the filesystem or
//! than its free space fails at once (ENOSPC, as tmpfs); the other loops
//! visit only pages and nodes that exist or bytes of the caller's buffer.
//!
//! Performance: the tree has 64-way nodes and grows in height with the
//! largest index (one level per 256 KiB up to 16 MiB, ...); lookups are a few
//! dependent loads. A node's slots are cache-line aligned, and a leaf keeps
//! page `i` in slot `leaf_slot(i)` (an 8x8 transpose), so neighbouring pages'
//! slots are on different lines: a copy-on-write overwrite of one page
//! (which stores its slot) does not write the line a reader of the next
//! page loads. Overwrites inside EOF copy the page (4 KiB) once per
//! write call; appends write in place. Empty interior nodes left behind by a
//! partial truncate or hole punch are kept until the file is truncated to 0
//! or freed (a known cost for sparse files that shrink).

use scalevfs_sync::primitive::{AtomicI64, AtomicU64, Ordering};

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned, Shared};

use crate::errno::{Errno, VfsResult};
use crate::frames::{self, Frame};
use crate::inode::Inode;
use crate::types::Timespec;

/// Page size of file data.
pub const PAGE: usize = frames::FRAME;
const BITS: u32 = 6;
const FAN: usize = 1 << BITS;
const MASK: u64 = FAN as u64 - 1;

/// Pages a write takes from the quota at once.
const RESERVE: u64 = 64;

/// Where page `i` (0..64) of a leaf sits in the leaf's slot array: the 8x8
/// transpose of `i`, so that pages next to each other are on different
/// cache lines (8 slots of 8 bytes to a line) and pages 8 apart share one.
/// Threads working on neighbouring pages of one file (a reader of page 0,
/// a copy-on-write overwrite of page 1, which stores page 1's slot) then
/// share no line of the tree (issue 16, conflict matrix: read x write of
/// one file). A bijection on 0..64, so code that visits every slot of a
/// leaf visits every page; code that visits pages in order goes through
/// this.
#[inline(always)]
const fn leaf_slot(i: usize) -> usize {
    ((i & 7) << 3) | (i >> 3)
}
// A permutation of the 64 slots (every page has its own slot), and
// neighbours land on different lines.
const _: () = {
    assert!(FAN == 64);
    let mut seen = [false; FAN];
    let mut i = 0;
    while i < FAN {
        let j = leaf_slot(i);
        assert!(j < FAN && !seen[j]);
        seen[j] = true;
        if i + 1 < FAN {
            assert!(j / 8 != leaf_slot(i + 1) / 8);
        }
        i += 1;
    }
};

/// Tell the conflict matrix's recorder (`trace-lines` builds) about an
/// access to a page slot: the slots are crossbeam `Atomic`s, which the
/// recorder does not see by itself. Compiles to nothing otherwise.
#[inline(always)]
fn trace_slot<T>(slot: &T, write: bool) {
    if scalevfs_sync::trace::ENABLED {
        if write {
            scalevfs_sync::trace::note_write(slot, "memfs page slots");
        } else {
            scalevfs_sync::trace::note_read(slot, "memfs page slots");
        }
    }
}

/// Tag of a leaf slot whose page has been written. A page allocated by
/// fallocate and never written reads as zeros and SEEK_DATA treats it as a
/// hole (tmpfs does the same).
const WRITTEN: usize = 1;

/// A page in the tree: its frame, tagged [`WRITTEN`].
#[derive(Clone, Copy)]
struct Page<'g>(Shared<'g, Frame>);

impl<'g> Page<'g> {
    /// A new zero page, not yet published; `None` if memory is exhausted.
    fn new(written: bool) -> Option<Page<'static>> {
        let f = frames::alloc_zeroed()?;
        Some(Page(
            Shared::from(f.as_ptr() as *const Frame).with_tag(written as usize),
        ))
    }

    /// A written, unpublished page with unspecified contents, for a caller
    /// that overwrites all of it (a recycled frame: no page fault, no
    /// zeroing).
    fn for_overwrite() -> Option<Page<'static>> {
        let f = frames::alloc_dirty()?;
        Some(Page(
            Shared::from(f.as_ptr() as *const Frame).with_tag(WRITTEN),
        ))
    }

    /// A written, unpublished copy of `self` (the caller is the only writer).
    fn copy(self) -> Option<Page<'static>> {
        let f = frames::alloc_dirty()?;
        // SAFETY: we hold the data lock (shared or exclusive): bytes of a
        // published page are written in place only at or above the size and
        // only under the exclusive lock, and the shared holders copy only
        // pages below the size (`overwrite_in_page`); the destination is
        // ours alone.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(), f.as_ref().as_ptr(), PAGE) };
        Some(Page(
            Shared::from(f.as_ptr() as *const Frame).with_tag(WRITTEN),
        ))
    }

    fn ptr(self) -> *mut u8 {
        // SAFETY: a page is a live frame: published ones are freed only after
        // a grace period that the guard of `'g` holds off.
        unsafe { self.0.deref() }.as_ptr()
    }

    fn is_written(self) -> bool {
        self.0.tag() & WRITTEN != 0
    }

    /// Bytes of an unpublished page (ours alone).
    ///
    /// # Safety
    /// The page is not published yet.
    unsafe fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: a live frame of PAGE bytes that no one else sees.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), PAGE) }
    }

    /// Copy bytes `[at, at + out.len())` out.
    ///
    /// # Safety
    /// No thread may write those bytes concurrently (module comment: they are
    /// below a size the reader read after loading this page).
    unsafe fn read_at(self, at: usize, out: &mut [u8]) {
        debug_assert!(at + out.len() <= PAGE);
        // SAFETY: in bounds (callers clamp to the page); no concurrent writer
        // by this function's contract.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr().add(at), out.as_mut_ptr(), out.len()) };
    }

    /// Write bytes in place into a published page.
    ///
    /// # Safety
    /// The caller holds the data lock and no reader may read the bytes
    /// (module comment: at or beyond the size, in a page that has never been
    /// in the tree while the size was above them).
    unsafe fn write_at(self, at: usize, src: &[u8]) {
        debug_assert!(at + src.len() <= PAGE);
        // SAFETY: in bounds; exclusive by this function's contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr().add(at), src.len()) };
    }

    /// Free the frame of a page that left the tree, after a grace period.
    ///
    /// # Safety
    /// The page is unreachable for new readers.
    unsafe fn retire(self, g: &Guard) {
        let a = self.0.as_raw() as usize;
        // Per-thread slots: the overwrite path writes no shared line here.
        RETIRED.add(1);
        // SAFETY: pinned readers are waited for; then no one uses the frame.
        unsafe {
            g.defer_unchecked(move || {
                frames::free(std::ptr::NonNull::new_unchecked(a as *mut Frame));
                RETIRED.add(-1);
            })
        };
        // crossbeam-epoch runs deferred frees a few bags at a time, on
        // every 128th pin: a thread that overwrites 256 pages per call (a
        // 1 MiB write) made garbage far faster than that, and a loop of
        // overwrites of one 32 MiB file grew by 32 MiB a pass until the
        // daemon ran out of memory (xfstests generic/208). So every
        // `FLUSH_EVERY` retirements (one crossbeam bag) this thread hands
        // its bag over and collects what is due (`Guard::flush`).
        let n = RETIRED_HERE.with(|c| {
            let n = c.get().wrapping_add(1);
            c.set(n);
            n
        });
        if n.is_multiple_of(FLUSH_EVERY) {
            g.flush();
        }
    }
}

/// Pages retired one by one (`Page::retire`: a page replaced by a copy,
/// removed by a punch or truncate) whose frames wait for a grace period.
/// An overwrite of N existing pages retires N, each its own deferred free;
/// `memfs::flush_deferred_frees` drains while this falls.
/// A per-thread (sharded) counter, so an overwrite writes no shared cache
/// line for it; only `retired_pending` sums the slots.
static RETIRED: std::sync::LazyLock<crate::percpu::ShardedCounter> =
    std::sync::LazyLock::new(crate::percpu::ShardedCounter::default);

std::thread_local! {
    /// Pages this thread retired (wrapping; see `Page::retire`).
    static RETIRED_HERE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Retirements between two `Guard::flush`es of a thread (crossbeam's bag
/// holds 64 deferred functions).
const FLUSH_EVERY: u32 = 64;

/// A long read or write re-pins every `REPIN_PAGES` pages (256 KiB): the
/// epoch can then advance past the pages it and others retired meanwhile
/// (a 256 MiB overwrite under one pin held all 256 MiB it replaced until it
/// returned). No page or slot pointer is kept across the re-pin; each page
/// is looked up again from the root. Without effect when the caller is
/// pinned too (crossbeam re-pins only a thread's single guard): the VFS
/// holds a count on the file instead of a pin for calls this long
/// (`UNPINNED_IO` in io.rs).
const REPIN_PAGES: u64 = 64;

/// Re-pin when `end` (the byte after a copied chunk) ends a page that
/// completes a run of `REPIN_PAGES`.
fn repin_at_page_end(g: &mut Guard, end: u64) {
    if end.is_multiple_of(PAGE as u64 * REPIN_PAGES) {
        g.repin();
    }
}

/// See `RETIRED`.
pub(crate) fn retired_pending() -> usize {
    RETIRED.sum()
}

/// A node's 64 slots (512 bytes), cache-line aligned, so no line of one
/// node's slots is shared with another allocation (another file's leaf).
type SlotArray<T> = crossbeam_utils::CachePadded<[Atomic<T>; FAN]>;

enum Slots {
    Inner(Box<SlotArray<Node>>),
    Leaf(Box<SlotArray<Frame>>),
}

struct Node {
    /// 0 for a node holding pages; the root's level says the tree's height.
    level: u32,
    slots: Slots,
}

/// Whether a node of `level` reaches page index `idx`.
fn covers(level: u32, idx: u64) -> bool {
    let bits = BITS * (level + 1);
    bits >= 64 || idx >> bits == 0
}

impl Node {
    fn new(level: u32) -> Owned<Node> {
        let slots = if level == 0 {
            Slots::Leaf(Box::new(crossbeam_utils::CachePadded::new(
                std::array::from_fn(|_| Atomic::null()),
            )))
        } else {
            Slots::Inner(Box::new(crossbeam_utils::CachePadded::new(
                std::array::from_fn(|_| Atomic::null()),
            )))
        };
        Owned::new(Node { level, slots })
    }

    /// Pages under one slot of this node.
    fn span(&self) -> u128 {
        1u128 << (BITS * self.level)
    }

    fn covers(&self, idx: u64) -> bool {
        covers(self.level, idx)
    }

    fn slot_index(&self, idx: u64) -> usize {
        let sh = BITS * self.level;
        if sh >= 64 {
            0
        } else {
            ((idx >> sh) & MASK) as usize
        }
    }

    /// Whether no slot holds anything (writer only: data lock held).
    fn is_empty(&self, g: &Guard) -> bool {
        match &self.slots {
            // Relaxed: writer-side walk, serialised by the data lock.
            Slots::Leaf(p) => p.iter().all(|s| s.load(Ordering::Relaxed, g).is_null()),
            Slots::Inner(k) => k.iter().all(|s| s.load(Ordering::Relaxed, g).is_null()),
        }
    }

    fn count_pages(&self) -> u64 {
        // SAFETY: called by the writer (data lock held) or the owner; nodes
        // reachable from `self` are alive.
        let g = unsafe { epoch::unprotected() };
        match &self.slots {
            // Relaxed: writer-side walk, serialised by the data lock.
            Slots::Leaf(p) => p
                .iter()
                .filter(|s| !s.load(Ordering::Relaxed, g).is_null())
                .count() as u64,
            Slots::Inner(k) => k
                .iter()
                // SAFETY: as above.
                .filter_map(|s| unsafe { s.load(Ordering::Relaxed, g).as_ref() })
                .map(Node::count_pages)
                .sum(),
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // SAFETY: a node is dropped only when unreachable (after a grace
        // period, or by the file's owner); it owns its children then.
        let g = unsafe { epoch::unprotected() };
        match &self.slots {
            Slots::Leaf(p) => {
                for s in p.iter() {
                    // Relaxed: exclusive access.
                    let x = s.load(Ordering::Relaxed, g);
                    if let Some(f) = std::ptr::NonNull::new(x.as_raw() as *mut Frame) {
                        // SAFETY: exclusively owned, see above.
                        unsafe { frames::free(f) };
                    }
                }
            }
            Slots::Inner(k) => {
                for s in k.iter() {
                    // Relaxed: exclusive access.
                    let x = s.load(Ordering::Relaxed, g);
                    if !x.is_null() {
                        // SAFETY: exclusively owned, see above.
                        drop(unsafe { x.into_owned() });
                    }
                }
            }
        }
    }
}

/// Accounting of a filesystem's pages (tmpfs's `size=`): one counter per
/// filesystem, never above `max_pages`. A known cost: every call that adds
/// or removes pages does a read-modify-write of it (one per 64 pages added;
/// appends inside the last page and overwrites do none); tmpfs uses a
/// per-CPU counter.
pub(crate) struct Quota<'a> {
    pub used: &'a AtomicI64,
    pub max_pages: u64,
}

impl Quota<'_> {
    /// Pages free now.
    fn free(&self) -> u64 {
        // Relaxed: a hint; `take_upto` decides.
        let used = self.used.load(Ordering::Relaxed).max(0) as u64;
        self.max_pages.saturating_sub(used)
    }

    /// Take up to `n` pages; returns how many were granted.
    fn take_upto(&self, n: u64) -> u64 {
        let mut got = 0;
        // Relaxed: the counter orders nothing but itself; the RMW keeps it
        // at or below the limit however many threads take at once.
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                got = n.min(self.max_pages.saturating_sub(u.max(0) as u64));
                (got > 0).then_some(u + got as i64)
            });
        got
    }

    /// Take exactly `n` pages, or none.
    pub(crate) fn take(&self, n: u64) -> bool {
        if n == 0 {
            return true;
        }
        // Relaxed: as in `take_upto`.
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                (u.max(0) as u64 + n <= self.max_pages).then_some(u + n as i64)
            })
            .is_ok()
    }

    pub(crate) fn give(&self, n: u64) {
        if n > 0 {
            // Relaxed: as in `take_upto`.
            self.used.fetch_sub(n as i64, Ordering::Relaxed);
        }
    }
}

/// The data of one memfs file.
#[derive(Default)]
pub(crate) struct FileData {
    root: Atomic<Node>,
    /// Pages in the tree (written by writers under the data lock).
    npages: AtomicU64,
}

impl Drop for FileData {
    fn drop(&mut self) {
        // SAFETY: the file is being freed: no writer is left, and readers
        // hold the inode (so this file) until they unpin.
        let g = unsafe { epoch::unprotected() };
        // Relaxed: exclusive access.
        let r = self.root.swap(Shared::null(), Ordering::Relaxed, g);
        if !r.is_null() {
            // SAFETY: exclusively owned now.
            drop(unsafe { r.into_owned() });
        }
    }
}

/// mtime and ctime after an overwrite under the shared data lock: the
/// current tick, read inside the attribute record's write section. Shared
/// writers do not exclude each other, so a tick read before the section
/// could be stored after a later writer's (or a chmod's) later one, and the
/// times would go back. Nothing when they already hold the tick
/// (`file_update_time`'s rule, as in `set_blocks`).
fn touch_shared(inode: &Inode) {
    let cur = inode.attr();
    let now = Timespec::now();
    if cur.mtime() == now && cur.ctime() == now {
        return;
    }
    inode.update_attr(|a| {
        let t = Timespec::now();
        a.touch_mc(t);
    });
}

impl FileData {
    /// Pages held (allocated, written or not).
    pub(crate) fn npages(&self) -> u64 {
        // Relaxed: statistics.
        self.npages.load(Ordering::Relaxed)
    }

    fn root<'g>(&self, g: &'g Guard) -> Option<&'g Node> {
        // Acquire: pairs with the Release publication of a (new) root.
        // SAFETY: nodes are freed only after a grace period, which `g` holds off.
        unsafe { self.root.load(Ordering::Acquire, g).as_ref() }
    }

    /// The page at index `idx`, if any (lock-free).
    fn get<'g>(&self, idx: u64, g: &'g Guard) -> Option<Page<'g>> {
        let slot = self.leaf_of(idx, g)?;
        trace_slot(slot, false);
        // Acquire: pairs with the Release publication of the page.
        let x = slot.load(Ordering::Acquire, g);
        (!x.is_null()).then_some(Page(x))
    }

    /// The leaf slot of page `idx` if the nodes down to it exist, for a
    /// caller that compares and exchanges it (creates nothing; lock-free).
    fn slot_present<'g>(&self, idx: u64, g: &'g Guard) -> Option<&'g Atomic<Frame>> {
        let slot = self.leaf_of(idx, g)?;
        trace_slot(slot, true);
        Some(slot)
    }

    /// The leaf slot of page `idx`, if the nodes down to it exist.
    fn leaf_of<'g>(&self, idx: u64, g: &'g Guard) -> Option<&'g Atomic<Frame>> {
        let mut n = self.root(g)?;
        if !n.covers(idx) {
            return None;
        }
        loop {
            let i = n.slot_index(idx);
            match &n.slots {
                // Acquire: pairs with the Release publication of the child.
                // SAFETY: as in `root`.
                Slots::Inner(k) => n = unsafe { k[i].load(Ordering::Acquire, g).as_ref() }?,
                Slots::Leaf(p) => return Some(&p[leaf_slot(i)]),
            }
        }
    }

    /// The first page at index >= `from` (lock-free).
    fn next_present<'g>(&self, from: u64, g: &'g Guard) -> Option<(u64, Page<'g>)> {
        fn rec<'g>(n: &'g Node, base: u128, from: u128, g: &'g Guard) -> Option<(u64, Page<'g>)> {
            let span = n.span();
            let first = if from > base {
                ((from - base) / span) as usize
            } else {
                0
            };
            for i in first..FAN {
                let lo = base + i as u128 * span;
                match &n.slots {
                    Slots::Leaf(p) => {
                        trace_slot(&p[leaf_slot(i)], false);
                        // Acquire: as in `get`.
                        let x = p[leaf_slot(i)].load(Ordering::Acquire, g);
                        if !x.is_null() {
                            return Some((lo as u64, Page(x)));
                        }
                    }
                    Slots::Inner(k) => {
                        // Acquire + SAFETY: as in `get`.
                        if let Some(c) = unsafe { k[i].load(Ordering::Acquire, g).as_ref() } {
                            if let Some(r) = rec(c, lo, from.max(lo), g) {
                                return Some(r);
                            }
                        }
                    }
                }
            }
            None
        }
        let r = self.root(g)?;
        if !r.covers(from) {
            return None;
        }
        rec(r, 0, u128::from(from), g)
    }

    /// The slot for page `idx`, creating nodes (writer only).
    fn slot_for_write<'g>(&self, idx: u64, g: &'g Guard) -> &'g Atomic<Frame> {
        // Relaxed: writers are serialised by the data lock, which orders them.
        let mut root = self.root.load(Ordering::Relaxed, g);
        if root.is_null() {
            let mut level = 0;
            while !covers(level, idx) {
                level += 1;
            }
            root = Node::new(level).into_shared(g);
            // Release: publish the initialised node.
            self.root.store(root, Ordering::Release);
        }
        loop {
            // SAFETY: non-null, alive (we are the writer; nodes leave the tree
            // only through us).
            let r = unsafe { root.deref() };
            if r.covers(idx) {
                break;
            }
            let up = Node::new(r.level + 1);
            if let Slots::Inner(k) = &up.slots {
                // Relaxed: published by the Release store of `up` below.
                k[0].store(root, Ordering::Relaxed);
            }
            root = up.into_shared(g);
            // Release: publish the new root with its child.
            self.root.store(root, Ordering::Release);
        }
        // SAFETY: as above.
        let mut n = unsafe { root.deref() };
        loop {
            let i = n.slot_index(idx);
            match &n.slots {
                Slots::Leaf(p) => {
                    // The writer loads it and then stores, swaps or writes
                    // in place: counted as a write.
                    trace_slot(&p[leaf_slot(i)], true);
                    return &p[leaf_slot(i)];
                }
                Slots::Inner(k) => {
                    // Relaxed: writer-side read, see above.
                    let mut c = k[i].load(Ordering::Relaxed, g);
                    if c.is_null() {
                        c = Node::new(n.level - 1).into_shared(g);
                        // Release: publish the initialised node.
                        k[i].store(c, Ordering::Release);
                    }
                    // SAFETY: non-null and alive, see above.
                    n = unsafe { c.deref() };
                }
            }
        }
    }

    /// Pages with index in `[lo, hi)` (writer only; visits existing nodes).
    fn count_range(&self, lo: u64, hi: u64, g: &Guard) -> u64 {
        fn rec(n: &Node, base: u128, lo: u128, hi: u128, g: &Guard) -> u64 {
            let span = n.span();
            let mut count = 0;
            for i in 0..FAN {
                let a = base + i as u128 * span;
                let b = a + span;
                if b <= lo || a >= hi {
                    continue;
                }
                match &n.slots {
                    // Relaxed: writer-side read (data lock held).
                    Slots::Leaf(p) => {
                        trace_slot(&p[leaf_slot(i)], false);
                        // Relaxed: as above; the slots change only under
                        // the data lock, which this writer holds.
                        count += !p[leaf_slot(i)].load(Ordering::Relaxed, g).is_null() as u64
                    }
                    Slots::Inner(k) => {
                        // Relaxed + SAFETY: as above; alive, we are the writer.
                        if let Some(c) = unsafe { k[i].load(Ordering::Relaxed, g).as_ref() } {
                            count += if lo <= a && b <= hi {
                                c.count_pages()
                            } else {
                                rec(c, a, lo.max(a), hi.min(b), g)
                            };
                        }
                    }
                }
            }
            count
        }
        // Relaxed + SAFETY: writer-side read; alive, we are the only writer.
        match unsafe { self.root.load(Ordering::Relaxed, g).as_ref() } {
            Some(r) => rec(r, 0, u128::from(lo), u128::from(hi), g),
            None => 0,
        }
    }

    /// Remove the pages with index in `[lo, hi)`; returns how many.
    fn remove_range(&self, lo: u64, hi: u64, g: &Guard) -> u64 {
        fn rec(n: &Node, base: u128, lo: u128, hi: u128, g: &Guard) -> u64 {
            let span = n.span();
            let mut removed = 0;
            for i in 0..FAN {
                let a = base + i as u128 * span;
                let b = a + span;
                if b <= lo || a >= hi {
                    continue;
                }
                match &n.slots {
                    Slots::Leaf(p) => {
                        // Release: readers that load null see the size stored before.
                        trace_slot(&p[leaf_slot(i)], true);
                        let x = p[leaf_slot(i)].swap(Shared::null(), Ordering::Release, g);
                        if !x.is_null() {
                            removed += 1;
                            // SAFETY: unreachable now.
                            unsafe { Page(x).retire(g) };
                        }
                    }
                    Slots::Inner(k) => {
                        // Relaxed: writer-side read (data lock held).
                        let c = k[i].load(Ordering::Relaxed, g);
                        // SAFETY: alive, we are the only writer.
                        let Some(cn) = (unsafe { c.as_ref() }) else {
                            continue;
                        };
                        if lo <= a && b <= hi {
                            removed += cn.count_pages();
                            // Release: as for pages.
                            k[i].store(Shared::null(), Ordering::Release);
                            // SAFETY: unreachable now; its drop frees the
                            // subtree after the grace period.
                            unsafe { g.defer_destroy(c) };
                        } else {
                            removed += rec(cn, a, lo.max(a), hi.min(b), g);
                            // A node the removal emptied goes too: kept,
                            // a punch per gigabyte left three nodes each
                            // (uncounted by `size=`, memory without bound).
                            if cn.is_empty(g) {
                                // Release: as for pages.
                                k[i].store(Shared::null(), Ordering::Release);
                                // SAFETY: unreachable now; it holds nothing
                                // to free but itself, after the grace period.
                                unsafe { g.defer_destroy(c) };
                            }
                        }
                    }
                }
            }
            removed
        }
        // Relaxed: writer-side read (data lock held).
        let r = self.root.load(Ordering::Relaxed, g);
        // SAFETY: alive, we are the only writer.
        let Some(rn) = (unsafe { r.as_ref() }) else {
            return 0;
        };
        if lo == 0 && (!rn.covers(hi.saturating_sub(1)) || hi == u64::MAX) {
            let n = rn.count_pages();
            // Release: readers that load null see the size stored before.
            self.root.store(Shared::null(), Ordering::Release);
            // SAFETY: unreachable now; pinned readers are waited for.
            unsafe { g.defer_destroy(r) };
            return n;
        }
        let n = rec(rn, 0, u128::from(lo), u128::from(hi), g);
        if rn.is_empty(g) {
            // Release: readers that load null see the size stored before.
            self.root.store(Shared::null(), Ordering::Release);
            // SAFETY: unreachable now; pinned readers are waited for.
            unsafe { g.defer_destroy(r) };
        }
        n
    }

    /// Drop the nodes under `[lo, hi)` that hold no page (bottom up), and
    /// the root if it is left empty; no page is removed. Insert and
    /// collapse move pages to other indices and leave their old slots
    /// null: without this each call left its emptied nodes behind (about
    /// 700 bytes a call, uncounted by `size=`, kept after the file shrank
    /// back). Work: the nodes of the range.
    fn prune_empty(&self, lo: u64, hi: u64, g: &Guard) {
        fn rec(n: &Node, base: u128, lo: u128, hi: u128, g: &Guard) {
            let Slots::Inner(k) = &n.slots else {
                return;
            };
            let span = n.span();
            for (i, slot) in k.iter().enumerate() {
                let a = base + i as u128 * span;
                let b = a + span;
                if b <= lo || a >= hi {
                    continue;
                }
                // Relaxed: writer-side read (data lock held).
                let c = slot.load(Ordering::Relaxed, g);
                // SAFETY: alive, we are the only writer.
                let Some(cn) = (unsafe { c.as_ref() }) else {
                    continue;
                };
                rec(cn, a, lo.max(a), hi.min(b), g);
                if cn.is_empty(g) {
                    // Release: as in `remove_range`.
                    slot.store(Shared::null(), Ordering::Release);
                    // SAFETY: unreachable now; it holds nothing to free but
                    // itself, after the grace period.
                    unsafe { g.defer_destroy(c) };
                }
            }
        }
        // Relaxed: writer-side read (data lock held).
        let r = self.root.load(Ordering::Relaxed, g);
        // SAFETY: alive, we are the only writer.
        let Some(rn) = (unsafe { r.as_ref() }) else {
            return;
        };
        rec(rn, 0, u128::from(lo), u128::from(hi), g);
        if rn.is_empty(g) {
            // Release: readers that load null see the size stored before.
            self.root.store(Shared::null(), Ordering::Release);
            // SAFETY: unreachable now; pinned readers are waited for.
            unsafe { g.defer_destroy(r) };
        }
    }

    /// Replace the page at `idx` (if any) with a copy whose bytes `[from, to)`
    /// are zero. A page never written is all zeros already and is left alone
    /// unless `always`: a shrink must replace even that one (module comment).
    fn zero_in_page(
        &self,
        idx: u64,
        from: usize,
        to: usize,
        always: bool,
        g: &Guard,
    ) -> VfsResult<()> {
        if from >= to {
            return Ok(());
        }
        let Some(p) = self.get(idx, g) else {
            return Ok(());
        };
        let np = if p.is_written() {
            let mut np = p.copy().ok_or(Errno::ENOMEM)?;
            // SAFETY: not published yet.
            (unsafe { np.bytes_mut() })[from..to].fill(0);
            np
        } else if always {
            Page::new(false).ok_or(Errno::ENOMEM)?
        } else {
            return Ok(());
        };
        let slot = self.slot_for_write(idx, g);
        // Release: publish the initialised copy.
        let old = slot.swap(np.0, Ordering::Release, g);
        // SAFETY: unreachable now.
        unsafe { Page(old).retire(g) };
        Ok(())
    }

    fn set_blocks(&self, inode: &Inode, delta: i64, now: Option<Timespec>, size: Option<u64>) {
        // Relaxed: writer-side counter (data lock held), read as statistics.
        let n = match delta {
            // An overwrite in place adds no page: no write of the line.
            0 => self.npages.load(Ordering::Relaxed),
            1.. => self.npages.fetch_add(delta as u64, Ordering::Relaxed) + delta as u64,
            _ => {
                self.npages
                    .fetch_sub(delta.unsigned_abs(), Ordering::Relaxed)
                    - delta.unsigned_abs()
            }
        };
        // Linux's `file_update_time` rule: with the coarse clock
        // (`Timespec::now`), a change that finds blocks, size, mtime and
        // ctime already at their new values writes nothing, so repeated
        // writes within one clock tick leave the attribute record (which
        // every read and stat reads) alone. Blocks and size change only
        // under the data lock, which we hold; a racing chmod or utimensat
        // sets ctime to the current tick or later, so skipping our store of
        // the same values orders this write before it.
        let cur = inode.attr();
        let blocks = n * (PAGE as u64 / 512);
        if cur.blocks == blocks
            && size.is_none_or(|s| s == cur.size)
            && now.is_none_or(|t| cur.mtime() == t && cur.ctime() == t)
        {
            return;
        }
        inode.update_attr(|a| {
            a.blocks = n * (PAGE as u64 / 512);
            if let Some(s) = size {
                a.size = s;
            }
            if let Some(t) = now {
                a.touch_mc(t);
            }
        });
    }

    // ---- the calls ----

    /// Read at `off` without locks (module comment). Returns bytes read.
    pub(crate) fn read(&self, inode: &Inode, off: u64, buf: &mut [u8]) -> usize {
        let size = inode.attr().size;
        if off >= size || buf.is_empty() {
            return 0;
        }
        let want = buf.len().min((size - off).min(usize::MAX as u64) as usize);
        let mut g = epoch::pin();
        let mut done = 0;
        while done < want {
            let pos = off + done as u64;
            let in_page = (pos % PAGE as u64) as usize;
            let page = self.get(pos / PAGE as u64, &g);
            // The size read after the page pointer bounds what we may copy.
            let size = inode.attr().size;
            if pos >= size {
                break;
            }
            let chunk = (PAGE - in_page)
                .min(want - done)
                .min((size - pos).min(PAGE as u64) as usize);
            let out = &mut buf[done..done + chunk];
            match page {
                // SAFETY: the bytes are below a size read after loading the
                // page, so no one writes them in place (module comment).
                Some(p) => unsafe { p.read_at(in_page, out) },
                None => out.fill(0),
            }
            done += chunk;
            repin_at_page_end(&mut g, pos + chunk as u64);
        }
        done
    }

    /// Write at `off` (data lock held; limits checked by the VFS). A write
    /// that runs out of space stores what fits and returns the short count
    /// (ENOSPC if nothing fits), as Linux does.
    pub(crate) fn write(
        &self,
        inode: &Inode,
        q: &Quota<'_>,
        off: u64,
        buf: &[u8],
    ) -> VfsResult<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut g = epoch::pin();
        let size = inode.attr().size;
        let mut done = 0;
        let mut added = 0i64;
        // Pages taken from the quota and not used yet: taken at a missing
        // page for up to `RESERVE` more, so the counter is touched once per
        // 256 KiB of new pages and a concurrent writer near the limit is
        // kept waiting for at most that much.
        let mut reserved = 0u64;
        let mut err = None;
        while done < buf.len() {
            let pos = off + done as u64;
            let idx = pos / PAGE as u64;
            let in_page = (pos % PAGE as u64) as usize;
            let chunk = (PAGE - in_page).min(buf.len() - done);
            let src = &buf[done..done + chunk];
            let slot = self.slot_for_write(idx, &g);
            // Relaxed: writer-side read (data lock held).
            let cur = slot.load(Ordering::Relaxed, &g);
            if cur.is_null() {
                if reserved == 0 {
                    let rest = (in_page + buf.len() - done).div_ceil(PAGE) as u64;
                    reserved = q.take_upto(rest.min(RESERVE));
                    if reserved == 0 {
                        // The nodes made on the way to the slot go again
                        // (a failed write per terabyte left a path each).
                        self.remove_range(idx, idx + 1, &g);
                        err = Some(Errno::ENOSPC);
                        break;
                    }
                }
                let Some(mut p) = Page::new(true) else {
                    self.remove_range(idx, idx + 1, &g);
                    err = Some(Errno::ENOMEM);
                    break;
                };
                // SAFETY: not published yet.
                (unsafe { p.bytes_mut() })[in_page..in_page + chunk].copy_from_slice(src);
                // Release: publish the initialised page.
                slot.store(p.0, Ordering::Release);
                reserved -= 1;
                added += 1;
            } else if pos >= size {
                let p = Page(cur);
                // SAFETY: every byte written is at or beyond the size, in a
                // page that a shrink below them would have replaced (module
                // comment), and we hold the data lock.
                unsafe { p.write_at(in_page, src) };
                if !p.is_written() {
                    // Release: the tag is advisory (SEEK_DATA); the bytes
                    // are published by the size.
                    slot.store(cur.with_tag(WRITTEN), Ordering::Release);
                }
            } else {
                let np = if chunk == PAGE {
                    Page::for_overwrite()
                } else {
                    Page(cur).copy()
                };
                let Some(mut np) = np else {
                    err = Some(Errno::ENOMEM);
                    break;
                };
                // SAFETY: not published yet.
                (unsafe { np.bytes_mut() })[in_page..in_page + chunk].copy_from_slice(src);
                // Release: publish the initialised copy.
                let old = slot.swap(np.0, Ordering::Release, &g);
                // SAFETY: unreachable now.
                unsafe { Page(old).retire(&g) };
            }
            done += chunk;
            repin_at_page_end(&mut g, pos + chunk as u64);
        }
        q.give(reserved);
        if done == 0 {
            if let Some(e) = err {
                return Err(e);
            }
        }
        let end = off + done as u64;
        self.set_blocks(inode, added, Some(Timespec::now()), Some(end.max(size)));
        Ok(done)
    }

    /// Overwrite `buf` at `off` inside one page that exists, below the
    /// size, with the data lock held **shared** (`Filesystem::write_shared`):
    /// such writes of one file run side by side. Copy on write, published
    /// by compare-and-exchange of the page's slot: a writer that lost the
    /// race to another writer of the same page copies the winner's page
    /// and applies its bytes again, so neither write is lost and each is
    /// atomic. Writes that change the size or the page count, or reach a
    /// hole, take the lock exclusive (`None` here). Nothing that changes
    /// the tree's shape runs meanwhile (they hold the lock exclusive), and
    /// bytes below the size of a published page are never written in
    /// place, so the copy reads stable bytes.
    pub(crate) fn overwrite_in_page(
        &self,
        inode: &Inode,
        off: u64,
        buf: &[u8],
    ) -> Option<VfsResult<usize>> {
        let in_page = (off % PAGE as u64) as usize;
        if buf.is_empty() || in_page + buf.len() > PAGE {
            return None;
        }
        let end = off.checked_add(buf.len() as u64)?;
        if end > inode.attr().size {
            return None;
        }
        let g = epoch::pin();
        let slot = self.slot_present(off / PAGE as u64, &g)?;
        loop {
            // Acquire: the page's bytes, published by a Release swap or
            // exchange, are read by the copy.
            let cur = slot.load(Ordering::Acquire, &g);
            if cur.is_null() {
                return None;
            }
            let np = if buf.len() == PAGE {
                Page::for_overwrite()
            } else {
                Page(cur).copy()
            };
            let Some(mut np) = np else {
                return Some(Err(Errno::ENOMEM));
            };
            // SAFETY: not published yet.
            (unsafe { np.bytes_mut() })[in_page..in_page + buf.len()].copy_from_slice(buf);
            // AcqRel: publish the copy (Release); on failure, Acquire the
            // winner's page for the next copy (the load above re-reads it).
            match slot.compare_exchange(cur, np.0, Ordering::AcqRel, Ordering::Acquire, &g) {
                Ok(_) => {
                    // SAFETY: unreachable now.
                    unsafe { Page(cur).retire(&g) };
                    break;
                }
                Err(_) => {
                    // Never published: ours alone, freed at once.
                    // SAFETY: a frame from `frames::alloc_*`, unpublished.
                    unsafe {
                        frames::free(std::ptr::NonNull::new_unchecked(np.0.as_raw() as *mut Frame))
                    };
                }
            }
        }
        touch_shared(inode);
        Some(Ok(buf.len()))
    }

    /// Set the size (data lock held). Shrinking stores the size first, then
    /// drops pages and replaces the page holding the new EOF (module
    /// comment); truncating to the same or a smaller size also drops pages
    /// that fallocate put beyond EOF, as tmpfs does.
    pub(crate) fn truncate(&self, inode: &Inode, q: &Quota<'_>, size: u64) -> VfsResult<()> {
        let g = epoch::pin();
        let old = inode.attr().size;
        let now = Timespec::now();
        let tail = (size % PAGE as u64) as usize;
        // Allocate the EOF page's replacement first, so that running out of
        // memory leaves the file as it was.
        let mut repl = None;
        if tail != 0 && size < old {
            if let Some(p) = self.get(size / PAGE as u64, &g) {
                let np = if p.is_written() {
                    let mut np = p.copy().ok_or(Errno::ENOMEM)?;
                    // SAFETY: not published yet.
                    (unsafe { np.bytes_mut() })[tail..].fill(0);
                    np
                } else {
                    Page::new(false).ok_or(Errno::ENOMEM)?
                };
                repl = Some(np);
            }
        }
        inode.update_attr(|a| {
            a.size = size;
            a.touch_mc(now);
        });
        if size > old {
            return Ok(());
        }
        let keep = size.div_ceil(PAGE as u64);
        let removed = self.remove_range(keep, u64::MAX, &g);
        if let Some(np) = repl {
            // Readers that read the old size may copy this page's bytes at
            // or past the new size, which a later append writes in place:
            // replace it, written or not (module comment).
            let slot = self.slot_for_write(size / PAGE as u64, &g);
            // Release: publish the initialised copy.
            let old = slot.swap(np.0, Ordering::Release, &g);
            // SAFETY: unreachable now.
            unsafe { Page(old).retire(&g) };
        }
        q.give(removed);
        self.set_blocks(inode, -(removed as i64), None, None);
        Ok(())
    }

    /// Allocate pages over `[off, off + len)` without changing the size
    /// (the VFS grows the size for mode 0 without KEEP_SIZE), or punch a hole.
    pub(crate) fn fallocate(
        &self,
        inode: &Inode,
        q: &Quota<'_>,
        punch: bool,
        off: u64,
        len: u64,
    ) -> VfsResult<()> {
        let g = epoch::pin();
        let end = off.checked_add(len).ok_or(Errno::EFBIG)?;
        let (first, last) = (off / PAGE as u64, end.div_ceil(PAGE as u64));
        if punch {
            // Whole pages go; partial pages at the ends are zeroed (copies).
            // Zero the ends first: running out of memory there changes nothing.
            let a = (off % PAGE as u64) as usize;
            if first == end.saturating_sub(1) / PAGE as u64 {
                let b = end - first * PAGE as u64;
                if a != 0 || b != PAGE as u64 {
                    self.zero_in_page(first, a, b as usize, false, &g)?;
                }
            } else {
                if a != 0 {
                    self.zero_in_page(first, a, PAGE, false, &g)?;
                }
                let b = (end % PAGE as u64) as usize;
                if b != 0 {
                    self.zero_in_page(end / PAGE as u64, 0, b, false, &g)?;
                }
            }
            let full_lo = off.div_ceil(PAGE as u64);
            let full_hi = end / PAGE as u64;
            let removed = if full_lo < full_hi {
                self.remove_range(full_lo, full_hi, &g)
            } else {
                0
            };
            q.give(removed);
            self.set_blocks(inode, -(removed as i64), Some(Timespec::now()), None);
            return Ok(());
        }
        // O(1) checks first (tmpfs: ENOSPC for a range larger than the
        // filesystem), so the loops below are bounded by its size.
        let want = last - first;
        if want > q.max_pages || want.saturating_sub(self.npages()) > q.free() {
            return Err(Errno::ENOSPC);
        }
        let missing = want - self.count_range(first, last, &g);
        if !q.take(missing) {
            return Err(Errno::ENOSPC);
        }
        let mut added = 0;
        for idx in first..last {
            if added == missing {
                break;
            }
            let slot = self.slot_for_write(idx, &g);
            // Relaxed: writer-side read (data lock held).
            if slot.load(Ordering::Relaxed, &g).is_null() {
                let Some(p) = Page::new(false) else {
                    q.give(missing - added);
                    self.set_blocks(inode, added as i64, None, None);
                    return Err(Errno::ENOMEM);
                };
                // Release: publish the initialised (zero) page.
                slot.store(p.0, Ordering::Release);
                added += 1;
            }
        }
        self.set_blocks(inode, missing as i64, None, None);
        Ok(())
    }

    /// FALLOC_FL_ZERO_RANGE over `[off, off + len)` (data lock held): the
    /// range reads as zeros and every page it touches is allocated, as ext4
    /// allocates (unwritten) blocks; the size is the VFS's business. Whole
    /// written pages are replaced by fresh unwritten ones and partial pages
    /// by zeroed copies (copy on write, module comment). Space is checked
    /// and taken before anything changes (ENOSPC leaves the file as it was).
    pub(crate) fn zero_range(
        &self,
        inode: &Inode,
        q: &Quota<'_>,
        off: u64,
        len: u64,
    ) -> VfsResult<()> {
        let g = epoch::pin();
        let p = PAGE as u64;
        let end = off.checked_add(len).ok_or(Errno::EFBIG)?;
        let (first, last) = (off / p, end.div_ceil(p));
        // O(1) checks first, as in `fallocate`: the loop below is bounded by
        // the filesystem's size.
        let want = last - first;
        if want > q.max_pages || want.saturating_sub(self.npages()) > q.free() {
            return Err(Errno::ENOSPC);
        }
        let missing = want - self.count_range(first, last, &g);
        if !q.take(missing) {
            return Err(Errno::ENOSPC);
        }
        // Partial pages at the ends: zeroed copies of those that exist.
        let a = (off % p) as usize;
        let b = (end % p) as usize;
        let to = if b == 0 { PAGE } else { b };
        let partial = |idx: u64, from: usize, to: usize| {
            if from == 0 && to == PAGE {
                Ok(())
            } else {
                self.zero_in_page(idx, from, to, false, &g)
            }
        };
        let ends = if first + 1 == last {
            partial(first, a, to)
        } else {
            partial(first, a, PAGE).and_then(|()| partial(last - 1, 0, to))
        };
        if let Err(e) = ends {
            q.give(missing);
            return Err(e);
        }
        let mut added = 0;
        for idx in first..last {
            let whole = (idx > first || a == 0) && (idx + 1 < last || b == 0);
            let slot = self.slot_for_write(idx, &g);
            // Relaxed: writer-side read (data lock held).
            let cur = slot.load(Ordering::Relaxed, &g);
            // Kept: a partial page (zeroed above) or an unwritten one.
            let replace = cur.is_null() || (whole && Page(cur).is_written());
            if !replace {
                continue;
            }
            let Some(np) = Page::new(false) else {
                q.give(missing - added);
                self.set_blocks(inode, added as i64, Some(Timespec::now()), None);
                return Err(Errno::ENOMEM);
            };
            // Release: publish the initialised (zero) page.
            let old = slot.swap(np.0, Ordering::Release, &g);
            if old.is_null() {
                added += 1;
            } else {
                // SAFETY: unreachable now.
                unsafe { Page(old).retire(&g) };
            }
        }
        debug_assert_eq!(added, missing);
        self.set_blocks(inode, added as i64, Some(Timespec::now()), None);
        Ok(())
    }

    /// FALLOC_FL_COLLAPSE_RANGE (data lock held): remove `[off, off + len)`
    /// and move every later page down by `len`, shrinking the size by `len`.
    /// Rules as ext4's with 4 KiB blocks: `off` and `len` page-aligned and
    /// the range ending before EOF, else EINVAL.
    ///
    /// Readers: the new size is stored first, then the range's pages leave
    /// and the later pages move down in increasing order (a page is never
    /// written, only moved, so it may briefly be at two indices). A reader
    /// that loaded a page at its old index `i` copies in-page bytes below
    /// `size - i * PAGE` for the size it read (old or new); the page's new
    /// index is lower by `len / PAGE`, so the bytes a later append writes in
    /// place (at or past the new size) are at or above those, and never
    /// overlap what such a reader copies. Work: the pages of the file.
    pub(crate) fn collapse_range(
        &self,
        inode: &Inode,
        q: &Quota<'_>,
        off: u64,
        len: u64,
    ) -> VfsResult<()> {
        let p = PAGE as u64;
        if !off.is_multiple_of(p) || !len.is_multiple_of(p) {
            return Err(Errno::EINVAL);
        }
        let size = inode.attr().size;
        let end = off.checked_add(len).ok_or(Errno::EINVAL)?;
        if end >= size {
            return Err(Errno::EINVAL);
        }
        let g = epoch::pin();
        let now = Timespec::now();
        inode.update_attr(|a| {
            a.size = size - len;
            a.touch_mc(now);
        });
        let (lo, k) = (off / p, len / p);
        let removed = self.remove_range(lo, lo + k, &g);
        let mut from = lo + k;
        let mut last = None;
        while let Some((idx, pg)) = self.next_present(from, &g) {
            // Release: publish the page at its new index first, so a reader
            // finds it at one of the two.
            self.slot_for_write(idx - k, &g)
                .store(pg.0, Ordering::Release);
            self.slot_for_write(idx, &g)
                .store(Shared::null(), Ordering::Release);
            last = Some(idx);
            match idx.checked_add(1) {
                Some(n) => from = n,
                None => break,
            }
        }
        // The old slots of the pages moved: their emptied nodes go.
        if let Some(last) = last {
            self.prune_empty(lo + k, last.saturating_add(1), &g);
        }
        q.give(removed);
        self.set_blocks(inode, -(removed as i64), None, None);
        Ok(())
    }

    /// FALLOC_FL_INSERT_RANGE (data lock held): move every page at or past
    /// `off` up by `len`, leaving a hole, and grow the size by `len`. Rules
    /// as ext4's: `off` and `len` page-aligned and `off` below EOF (EINVAL),
    /// the new size within `max` (EFBIG).
    ///
    /// Readers: pages move first (in decreasing order), then the new size is
    /// stored. A reader that loaded a page at its old index `i` and then
    /// read the new size may copy in-page bytes up to `new size - i * PAGE`,
    /// which for the page holding the old EOF and the pages past it
    /// includes bytes a later append writes in place at the page's new,
    /// higher index. So those pages are replaced by copies (module comment:
    /// a page is written in place only if it has been in the tree only while
    /// the size was at or below those bytes); the pages below the old EOF
    /// page are wholly inside the file and never written in place. The
    /// copies are made before anything changes, so ENOMEM changes nothing.
    /// Work: the pages of the file.
    pub(crate) fn insert_range(
        &self,
        inode: &Inode,
        off: u64,
        len: u64,
        max: u64,
    ) -> VfsResult<()> {
        let p = PAGE as u64;
        if !off.is_multiple_of(p) || !len.is_multiple_of(p) {
            return Err(Errno::EINVAL);
        }
        let size = inode.attr().size;
        // In ext4_insert_range's order: the size limit, then the offset.
        if len > max.saturating_sub(size) {
            return Err(Errno::EFBIG);
        }
        if off >= size {
            return Err(Errno::EINVAL);
        }
        let g = epoch::pin();
        let (lo, k) = (off / p, len / p);
        let eof_page = size / p;
        // Pages to move, highest first, with the replacements of those at or
        // past the old EOF page (bounded by the pages the file has).
        let mut moves: Vec<(u64, Page<'_>, Option<Page<'static>>)> = Vec::new();
        let mut from = lo;
        while let Some((idx, pg)) = self.next_present(from, &g) {
            let np = if idx < eof_page {
                None
            } else {
                let np = if pg.is_written() {
                    pg.copy()
                } else {
                    Page::new(false)
                };
                let Some(np) = np else {
                    // The copies made so far were never published: freed
                    // (after a grace period, as any page).
                    for (_, _, np) in moves {
                        if let Some(np) = np {
                            // SAFETY: unpublished, reachable by no one.
                            unsafe { np.retire(&g) };
                        }
                    }
                    return Err(Errno::ENOMEM);
                };
                Some(np)
            };
            moves.push((idx, pg, np));
            match idx.checked_add(1) {
                Some(n) => from = n,
                None => break,
            }
        }
        // The old slots of the pages moved (their emptied nodes go after).
        let old_span = moves.first().map(|m| m.0).zip(moves.last().map(|m| m.0));
        for (idx, pg, np) in moves.into_iter().rev() {
            let dst = self.slot_for_write(idx + k, &g);
            match np {
                Some(np) => {
                    // Release: publish the initialised copy.
                    dst.store(np.0, Ordering::Release);
                    // Release: readers that load null read zeros (a hole).
                    self.slot_for_write(idx, &g)
                        .store(Shared::null(), Ordering::Release);
                    // SAFETY: unreachable now.
                    unsafe { pg.retire(&g) };
                }
                None => {
                    // Release: publish the page at its new index first.
                    dst.store(pg.0, Ordering::Release);
                    self.slot_for_write(idx, &g)
                        .store(Shared::null(), Ordering::Release);
                }
            }
        }
        if let Some((first, last)) = old_span {
            self.prune_empty(first.min(last), first.max(last).saturating_add(1), &g);
        }
        let now = Timespec::now();
        self.set_blocks(inode, 0, Some(now), Some(size + len));
        Ok(())
    }

    /// SEEK_DATA (`data`) or SEEK_HOLE from `off` (lock-free). Pages never
    /// written count as holes, and so does everything at or past EOF.
    pub(crate) fn seek_data_hole(&self, inode: &Inode, off: u64, data: bool) -> VfsResult<u64> {
        let size = inode.attr().size;
        if off >= size {
            return Err(Errno::ENXIO);
        }
        let g = epoch::pin();
        let p = PAGE as u64;
        if data {
            let mut from = off / p;
            loop {
                match self.next_present(from, &g) {
                    None => return Err(Errno::ENXIO),
                    Some((idx, _)) if idx.saturating_mul(p) >= size => return Err(Errno::ENXIO),
                    Some((idx, pg)) if pg.is_written() => return Ok((idx * p).max(off)),
                    Some((idx, _)) => from = idx + 1,
                }
            }
        }
        let mut idx = off / p;
        loop {
            if idx.saturating_mul(p) >= size {
                return Ok(size);
            }
            match self.get(idx, &g) {
                Some(pg) if pg.is_written() => idx += 1,
                _ => return Ok((idx * p).max(off)),
            }
        }
    }
}

#[cfg(test)]
mod tests_support {
    use super::*;
    use crate::types::{Attr, S_IFREG};

    pub(super) fn file() -> (Inode, FileData, AtomicI64) {
        let a = Attr {
            mode: S_IFREG | 0o644,
            nlink: 1,
            ..Attr::default()
        };
        (
            Inode::new(2, 1, a, Box::new(())),
            FileData::default(),
            AtomicI64::new(0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::*;
    use super::*;

    fn page_ptr(f: &FileData, idx: u64) -> usize {
        let g = epoch::pin();
        f.get(idx, &g).map_or(0, |p| p.0.as_raw() as usize)
    }

    /// Issue 12 (1): a page that fallocate allocated and nothing wrote
    /// survived a shrinking truncate, so a later append wrote in place bytes
    /// that a reader which had read the old, larger size could be copying.
    /// The shrink must replace the page that holds the new EOF.
    #[test]
    fn shrink_replaces_unwritten_tail_page() {
        let (i, f, used) = file();
        let q = Quota {
            used: &used,
            max_pages: 16,
        };
        f.fallocate(&i, &q, false, 0, 2 * PAGE as u64).unwrap();
        f.truncate(&i, &q, 2 * PAGE as u64).unwrap();
        let before = page_ptr(&f, 0);
        assert_ne!(before, 0);
        f.truncate(&i, &q, 100).unwrap();
        let after = page_ptr(&f, 0);
        assert_ne!(after, 0, "the partial page stays allocated");
        assert_ne!(
            before, after,
            "the shrink must not keep the page readers may copy"
        );
        assert_eq!(page_ptr(&f, 1), 0);
    }
    /// Issue 13 (5): the range modes keep the page accounting (quota and
    /// st_blocks) exact and fail without changing anything when they must.
    #[test]
    fn range_ops_account_pages() {
        let (i, f, used) = file();
        let q = Quota {
            used: &used,
            max_pages: 8,
        };
        let p = PAGE as u64;
        assert_eq!(f.write(&i, &q, 0, &[7u8; 4 * PAGE + 10]), Ok(4 * PAGE + 10));
        assert_eq!(used.load(Ordering::Relaxed), 5);
        // Collapse gives the range's pages back; the rest move down.
        f.collapse_range(&i, &q, p, 2 * p).unwrap();
        assert_eq!((i.attr().size, f.npages()), (2 * p + 10, 3));
        assert_eq!(used.load(Ordering::Relaxed), 3);
        let mut b = [0u8; 11];
        assert_eq!(f.read(&i, p, &mut b), 11);
        assert_eq!(b, [7u8; 11]);
        // Insert takes nothing: a hole.
        f.insert_range(&i, p, 3 * p, u64::MAX).unwrap();
        assert_eq!((i.attr().size, f.npages()), (5 * p + 10, 3));
        assert_eq!(used.load(Ordering::Relaxed), 3);
        assert_eq!(f.read(&i, p, &mut b), 11);
        assert_eq!(b, [0u8; 11]);
        assert_eq!(
            f.insert_range(&i, 0, p, 6 * p),
            Err(Errno::EFBIG),
            "past the maximum size"
        );
        // Zero range needing more pages than are free: ENOSPC, unchanged.
        assert_eq!(f.zero_range(&i, &q, 0, 20 * p), Err(Errno::ENOSPC));
        assert_eq!(f.zero_range(&i, &q, 6 * p, 6 * p), Err(Errno::ENOSPC));
        assert_eq!((f.npages(), used.load(Ordering::Relaxed)), (3, 3));
        assert_eq!(f.read(&i, 4 * p, &mut b), 11);
        assert_eq!(b, [7u8; 11]);
        // Within the limit it allocates every page of the range.
        f.zero_range(&i, &q, 0, 6 * p).unwrap();
        assert_eq!((f.npages(), used.load(Ordering::Relaxed)), (6, 6));
        assert_eq!(f.read(&i, 4 * p, &mut b), 11);
        assert_eq!(b, [0u8; 11]);
        f.truncate(&i, &q, 0).unwrap();
        assert_eq!((f.npages(), used.load(Ordering::Relaxed)), (0, 0));
    }
}

#[cfg(test)]
mod race_tests {
    use super::tests_support::*;
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Issue 12 (1), concurrently: readers copy the file while a writer
    /// fallocates two pages, shrinks the file into the first and appends
    /// there. Readers must only ever see zeros or the appended byte; under
    /// ThreadSanitizer (`RUSTFLAGS=-Zsanitizer=thread`, nightly) the old code
    /// reports the race.
    #[test]
    fn readers_race_shrink_and_append() {
        let (i, f, used) = file();
        let q = Quota {
            used: &used,
            max_pages: 16,
        };
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut buf = vec![0u8; 2 * PAGE];
                    // Relaxed: a stop flag.
                    while !done.load(Ordering::Relaxed) {
                        let n = f.read(&i, 0, &mut buf);
                        assert!(buf[..n].iter().all(|&b| b == 0 || b == b'B'));
                    }
                });
            }
            for _ in 0..2000 {
                f.truncate(&i, &q, 0).unwrap();
                f.fallocate(&i, &q, false, 0, 2 * PAGE as u64).unwrap();
                f.truncate(&i, &q, 2 * PAGE as u64).unwrap();
                f.truncate(&i, &q, 100).unwrap();
                assert_eq!(f.write(&i, &q, 100, &[b'B'; 1000]), Ok(1000));
            }
            // Relaxed: a stop flag.
            done.store(true, Ordering::Relaxed);
        });
    }

    /// Issue 13 (5), concurrently: readers copy the file while a writer
    /// inserts and collapses ranges and appends in place into the page that
    /// held the old EOF. Readers must only ever see zeros or written bytes
    /// (under ThreadSanitizer, an insert that moved the EOF page instead of
    /// replacing it reports the race with the append).
    #[test]
    fn readers_race_insert_collapse_and_append() {
        let (i, f, used) = file();
        let q = Quota {
            used: &used,
            max_pages: 32,
        };
        let p = PAGE as u64;
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut buf = vec![0u8; 8 * PAGE];
                    // Relaxed: a stop flag.
                    while !done.load(Ordering::Relaxed) {
                        let n = f.read(&i, 0, &mut buf);
                        assert!(buf[..n].iter().all(|&b| b == 0 || b == b'B'));
                    }
                });
            }
            for _ in 0..1000 {
                f.truncate(&i, &q, 0).unwrap();
                assert_eq!(
                    f.write(&i, &q, 0, &[b'B'; 2 * PAGE + 100]),
                    Ok(2 * PAGE + 100)
                );
                f.insert_range(&i, p, 2 * p, u64::MAX).unwrap();
                assert_eq!(f.write(&i, &q, 4 * p + 100, &[b'B'; 100]), Ok(100));
                f.collapse_range(&i, &q, 0, 2 * p).unwrap();
                assert_eq!(f.write(&i, &q, 2 * p + 200, &[b'B'; 100]), Ok(100));
                f.zero_range(&i, &q, 10, p).unwrap();
            }
            // Relaxed: a stop flag.
            done.store(true, Ordering::Relaxed);
        });
    }
}
