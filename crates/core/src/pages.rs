//! The page store of a memfs file: a radix tree of 4 KiB pages that readers
//! walk without taking a lock or writing shared memory.
//!
//! LOCKING RULES
//! - Readers (`read`, `seek_data_hole`) pin an epoch guard and follow
//!   Acquire-loaded pointers. They write nothing shared, so `pread`s of the
//!   same or different ranges from many threads do not contend.
//! - Writers (`write`, `truncate`, `fallocate`) are serialised by the caller:
//!   the VFS holds the inode's data lock exclusively (see `io.rs`). This
//!   module has no lock of its own.
//! - Nodes and pages that leave the tree are freed after a grace period.
//!
//! How a reader never sees garbage without a lock:
//! - A published page is never modified, with one exception: bytes at or
//!   beyond the file size at the time of the write (an append into the last
//!   page, or into a page allocated past EOF by fallocate). Every other
//!   change (overwrite, truncate's zeroed tail, hole punch) publishes a
//!   modified copy and frees the old page after a grace period (copy on
//!   write). So a reader holding a page sees one version of it.
//! - Invariant: bytes of any page at or beyond the file size are zero.
//! - A shrinking truncate stores the new size *before* it removes or replaces
//!   pages; a write stores data *before* the new size. A reader loads the page
//!   pointer first and then reads the size, and copies only bytes below that
//!   size. While a page stays in the tree its bytes below the size are never
//!   written in place again (getting the size at or below such a byte needs a
//!   shrink, which replaces the page), and the in-place writes that happened
//!   before the size rose past a byte happen-before the reader's size read. A
//!   read that overlaps a truncate therefore returns old data, new data, or a
//!   short count, never bytes that were not in the file.
//!
//! Performance: the tree has 64-way nodes and grows in height with the
//! largest index (one level per 256 KiB up to 16 MiB, ...); lookups are a few
//! dependent loads. Overwrites inside EOF copy the page (4 KiB) once per
//! write call; appends write in place. Empty interior nodes left behind by a
//! partial truncate or hole punch are kept until the file is truncated to 0
//! or freed (a known cost for sparse files that shrink).

use scalevfs_sync::primitive::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::cell::UnsafeCell;

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned, Shared};

use crate::errno::{Errno, VfsResult};
use crate::inode::Inode;
use crate::types::Timespec;

/// Page size of file data.
pub const PAGE: usize = 4096;
const BITS: u32 = 6;
const FAN: usize = 1 << BITS;
const MASK: u64 = FAN as u64 - 1;

/// One page of file data.
pub(crate) struct Page {
    data: UnsafeCell<[u8; PAGE]>,
    /// False for a page allocated by fallocate and never written: it reads as
    /// zeros and SEEK_DATA treats it as a hole (tmpfs does the same).
    written: AtomicBool,
}

// SAFETY: the bytes are shared between threads under the protocol of the
// module comment: a writer (serialised by the data lock) writes in place only
// bytes no reader may read, and readers copy only bytes that are no longer
// written in place; everything else is copy on write.
unsafe impl Sync for Page {}

impl Page {
    fn new(written: bool) -> Owned<Page> {
        Owned::new(Page {
            data: UnsafeCell::new([0; PAGE]),
            written: AtomicBool::new(written),
        })
    }

    /// A written copy of `self` (the caller is the only writer).
    fn copy(&self) -> Owned<Page> {
        let mut p = Page::new(true);
        // SAFETY: we hold the data lock, so no one writes `self` meanwhile;
        // the destination is ours alone.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.data.get().cast::<u8>(),
                p.data.get_mut().as_mut_ptr(),
                PAGE,
            )
        };
        p
    }

    pub(crate) fn is_written(&self) -> bool {
        // Acquire: pairs with the Release store of a writer (the flag is only
        // advisory for SEEK_DATA, the bytes are published by the size).
        self.written.load(Ordering::Acquire)
    }

    /// Copy bytes `[at, at + out.len())` out.
    ///
    /// # Safety
    /// No thread may write those bytes concurrently (module comment: they are
    /// below a size the reader read after loading this page).
    unsafe fn read_at(&self, at: usize, out: &mut [u8]) {
        debug_assert!(at + out.len() <= PAGE);
        // SAFETY: in bounds (callers clamp to the page); no concurrent writer
        // by this function's contract.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.data.get().cast::<u8>().add(at),
                out.as_mut_ptr(),
                out.len(),
            )
        };
    }

    /// Write bytes in place into a published page.
    ///
    /// # Safety
    /// The caller holds the data lock and every byte written is at or beyond
    /// the current file size, so no reader reads it.
    unsafe fn write_at(&self, at: usize, src: &[u8]) {
        debug_assert!(at + src.len() <= PAGE);
        // SAFETY: in bounds; exclusive by this function's contract.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.data.get().cast::<u8>().add(at),
                src.len(),
            )
        };
    }
}

enum Slots {
    Inner(Box<[Atomic<Node>; FAN]>),
    Leaf(Box<[Atomic<Page>; FAN]>),
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
            Slots::Leaf(Box::new(std::array::from_fn(|_| Atomic::null())))
        } else {
            Slots::Inner(Box::new(std::array::from_fn(|_| Atomic::null())))
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
                    if !x.is_null() {
                        // SAFETY: exclusively owned, see above.
                        drop(unsafe { x.into_owned() });
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

/// Accounting of a filesystem's pages (tmpfs's `size=`).
pub(crate) struct Quota<'a> {
    pub used: &'a AtomicI64,
    pub max_pages: u64,
}

impl Quota<'_> {
    fn take(&self, n: u64) -> bool {
        // Relaxed: a soft limit checked approximately, as tmpfs's size= option.
        let used = self.used.load(Ordering::Relaxed).max(0) as u64;
        if used + n > self.max_pages {
            return false;
        }
        self.used.fetch_add(n as i64, Ordering::Relaxed);
        true
    }
    fn give(&self, n: u64) {
        // Relaxed: statistics.
        self.used.fetch_sub(n as i64, Ordering::Relaxed);
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
        // SAFETY: the file is being freed: no reader or writer is left.
        let g = unsafe { epoch::unprotected() };
        // Relaxed: exclusive access.
        let r = self.root.swap(Shared::null(), Ordering::Relaxed, g);
        if !r.is_null() {
            // SAFETY: exclusively owned now.
            drop(unsafe { r.into_owned() });
        }
    }
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
    fn get<'g>(&self, idx: u64, g: &'g Guard) -> Option<&'g Page> {
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
                // SAFETY: as in `root`.
                Slots::Leaf(p) => return unsafe { p[i].load(Ordering::Acquire, g).as_ref() },
            }
        }
    }

    /// The first page at index >= `from` (lock-free).
    fn next_present<'g>(&self, from: u64, g: &'g Guard) -> Option<(u64, &'g Page)> {
        fn rec<'g>(n: &'g Node, base: u128, from: u128, g: &'g Guard) -> Option<(u64, &'g Page)> {
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
                        // Acquire + SAFETY: as in `get`.
                        if let Some(pg) = unsafe { p[i].load(Ordering::Acquire, g).as_ref() } {
                            return Some((lo as u64, pg));
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
    fn slot_for_write<'g>(&self, idx: u64, g: &'g Guard) -> &'g Atomic<Page> {
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
                Slots::Leaf(p) => return &p[i],
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
                        let x = p[i].swap(Shared::null(), Ordering::Release, g);
                        if !x.is_null() {
                            removed += 1;
                            // SAFETY: unreachable now; pinned readers are waited for.
                            unsafe { g.defer_destroy(x) };
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
        rec(rn, 0, u128::from(lo), u128::from(hi), g)
    }

    /// Replace the page at `idx` (if any, and written) with a copy whose bytes
    /// `[from, to)` are zero.
    fn zero_in_page(&self, idx: u64, from: usize, to: usize, g: &Guard) {
        if from >= to {
            return;
        }
        let Some(p) = self.get(idx, g) else { return };
        if !p.is_written() {
            return;
        }
        let mut np = p.copy();
        np.data.get_mut()[from..to].fill(0);
        let slot = self.slot_for_write(idx, g);
        // Release: publish the initialised copy.
        let old = slot.swap(np, Ordering::Release, g);
        // SAFETY: unreachable now; pinned readers are waited for.
        unsafe { g.defer_destroy(old) };
    }

    fn set_blocks(&self, inode: &Inode, delta: i64, now: Option<Timespec>, size: Option<u64>) {
        // Relaxed: writer-side counter (data lock held), read as statistics.
        let n = if delta >= 0 {
            self.npages.fetch_add(delta as u64, Ordering::Relaxed) + delta as u64
        } else {
            self.npages
                .fetch_sub(delta.unsigned_abs(), Ordering::Relaxed)
                - delta.unsigned_abs()
        };
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
        let g = epoch::pin();
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
        }
        done
    }

    /// Write at `off` (data lock held; limits checked by the VFS).
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
        let g = epoch::pin();
        let size = inode.attr().size;
        let mut done = 0;
        let mut added = 0i64;
        while done < buf.len() {
            let pos = off + done as u64;
            let idx = pos / PAGE as u64;
            let in_page = (pos % PAGE as u64) as usize;
            let chunk = (PAGE - in_page).min(buf.len() - done);
            let src = &buf[done..done + chunk];
            let slot = self.slot_for_write(idx, &g);
            // Relaxed: writer-side read (data lock held).
            let cur = slot.load(Ordering::Relaxed, &g);
            // SAFETY: alive; pages leave the tree only through us.
            match unsafe { cur.as_ref() } {
                None => {
                    if !q.take(1) {
                        if done == 0 {
                            return Err(Errno::ENOSPC);
                        }
                        break;
                    }
                    let mut p = Page::new(true);
                    p.data.get_mut()[in_page..in_page + chunk].copy_from_slice(src);
                    // Release: publish the initialised page.
                    slot.store(p, Ordering::Release);
                    added += 1;
                }
                Some(p) if pos >= size => {
                    // SAFETY: every byte written is at or beyond the size and
                    // we hold the data lock (module comment).
                    unsafe { p.write_at(in_page, src) };
                    // Release: advisory flag, see `is_written`.
                    p.written.store(true, Ordering::Release);
                }
                Some(p) => {
                    let mut np = if chunk == PAGE {
                        Page::new(true)
                    } else {
                        p.copy()
                    };
                    np.data.get_mut()[in_page..in_page + chunk].copy_from_slice(src);
                    // Release: publish the initialised copy.
                    let old = slot.swap(np, Ordering::Release, &g);
                    // SAFETY: unreachable now; pinned readers are waited for.
                    unsafe { g.defer_destroy(old) };
                }
            }
            done += chunk;
        }
        let end = off + done as u64;
        self.set_blocks(inode, added, Some(Timespec::now()), Some(end.max(size)));
        Ok(done)
    }

    /// Set the size (data lock held). Shrinking stores the size first, then
    /// drops pages (module comment); truncating to the same or a smaller size
    /// also drops pages that fallocate put beyond EOF, as tmpfs does.
    pub(crate) fn truncate(&self, inode: &Inode, q: &Quota<'_>, size: u64) {
        let g = epoch::pin();
        let old = inode.attr().size;
        let now = Timespec::now();
        inode.update_attr(|a| {
            a.size = size;
            a.touch_mc(now);
        });
        if size > old {
            return;
        }
        let keep = size.div_ceil(PAGE as u64);
        let removed = self.remove_range(keep, u64::MAX, &g);
        let tail = (size % PAGE as u64) as usize;
        if tail != 0 {
            self.zero_in_page(size / PAGE as u64, tail, PAGE, &g);
        }
        q.give(removed);
        self.set_blocks(inode, -(removed as i64), None, None);
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
            let full_lo = off.div_ceil(PAGE as u64);
            let full_hi = end / PAGE as u64;
            let removed = if full_lo < full_hi {
                self.remove_range(full_lo, full_hi, &g)
            } else {
                0
            };
            let a = (off % PAGE as u64) as usize;
            if first == end.saturating_sub(1) / PAGE as u64 {
                let b = end - first * PAGE as u64;
                if a != 0 || b != PAGE as u64 {
                    self.zero_in_page(first, a, b as usize, &g);
                }
            } else {
                if a != 0 {
                    self.zero_in_page(first, a, PAGE, &g);
                }
                let b = (end % PAGE as u64) as usize;
                if b != 0 {
                    self.zero_in_page(end / PAGE as u64, 0, b, &g);
                }
            }
            q.give(removed);
            self.set_blocks(inode, -(removed as i64), Some(Timespec::now()), None);
            return Ok(());
        }
        let mut missing = 0;
        for idx in first..last {
            if self.get(idx, &g).is_none() {
                missing += 1;
            }
        }
        if !q.take(missing) {
            return Err(Errno::ENOSPC);
        }
        for idx in first..last {
            let slot = self.slot_for_write(idx, &g);
            // Relaxed: writer-side read (data lock held).
            if slot.load(Ordering::Relaxed, &g).is_null() {
                // Release: publish the initialised (zero) page.
                slot.store(Page::new(false), Ordering::Release);
            }
        }
        self.set_blocks(inode, missing as i64, None, None);
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
