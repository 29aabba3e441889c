//! Page frames for memfs file data: 4 KiB frames carved out of 2 MiB
//! anonymous mappings, given back to the OS (`madvise(MADV_DONTNEED)`) in
//! batches after they are freed, so that deleting files lowers the
//! process's RSS. Up to `POOL_DIRTY_MAX` (16 MiB) of freed frames, plus
//! each thread's batch (1 MiB), stay resident for whole-page overwrites
//! until `clean_local` (`memfs::flush_deferred_frees`) gives them back.
//!
//! LOCKING RULES
//! - Each thread keeps a cache of free frames and a batch of freed frames
//!   not yet given back (`LOCAL`): allocating and freeing touch no shared
//!   memory most of the time.
//! - `POOL` (a mutex) holds the free frames of all threads, and up to
//!   `POOL_DIRTY_MAX` freed frames still resident; a thread takes or
//!   returns `BATCH` frames at a time. New mappings are made under it. It
//!   is a leaf lock: nothing else is taken while it is held.
//!
//! Invariant: a frame on a free list (`POOL.free`, a thread's `cache`) is not
//! resident and reads as zeros (it was never touched, or was madvised
//! after its last use), so `alloc_zeroed` needs no memset. Frames in a
//! thread's `dirty` batch hold old data; `alloc_dirty` (for callers that
//! overwrite the whole frame) takes them first, which spares the madvise
//! and the page fault for overwrite-heavy loads.
//!
//! Address space is never unmapped (a freed frame costs no memory, only its
//! 8-byte entry on a free list); the frames ever mapped are bounded by the
//! memfs size limits (file data is allocated only within them) plus the
//! pages waiting for an epoch grace period, the resident ones (`POOL.dirty`,
//! 16 MiB, and the threads' batches) and the free lists' slack (zeroed
//! frames are taken from `POOL.free` only; a new chunk is mapped while
//! resident ones wait to be reused).

use scalevfs_sync::ordered::{Class, Mutex, MutexGuard};
use std::cell::{RefCell, UnsafeCell};
use std::ptr::NonNull;
// Process-wide statics: std's atomics (loom's cannot be built in a static).
use std::sync::atomic::{AtomicUsize, Ordering};

/// Size of one frame (the memfs page size).
pub(crate) const FRAME: usize = 4096;
/// Bytes mapped at once.
const CHUNK: usize = 2 << 20;
/// Frames moved between a thread and `POOL` at once.
const BATCH: usize = 64;
/// Freed frames a thread collects before giving them back (1 MiB).
const DIRTY_MAX: usize = 256;

/// One page of file data; the alignment leaves 12 tag bits in pointers.
#[repr(C, align(4096))]
pub(crate) struct Frame(UnsafeCell<[u8; FRAME]>);

// SAFETY: a frame is raw memory; who may read or write which bytes when is
// the page protocol of `pages.rs`, whose callers uphold it.
unsafe impl Sync for Frame {}

impl Frame {
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.0.get().cast()
    }
}

/// Frames given back to the OS so far (for `clean_local`'s heap trim).
static RELEASED: AtomicUsize = AtomicUsize::new(0);
/// `RELEASED` at the last heap trim.
static TRIMMED_AT: AtomicUsize = AtomicUsize::new(0);
/// Frames given back between heap trims (64 MiB).
const TRIM_EVERY: usize = (64 << 20) / FRAME;

/// Free frames of all threads (addresses).
static POOL: Mutex<Pool> = Mutex::new(
    Class::FramePool,
    Pool {
        free: Vec::new(),
        dirty: Vec::new(),
    },
);

/// Frames shared by all threads.
struct Pool {
    /// Zero, not resident.
    free: Vec<usize>,
    /// Freed with old data, still resident: for `alloc_dirty` of any
    /// thread. Frames are freed after an epoch grace period by whichever
    /// thread collects, often not the one that overwrites (a copy on write
    /// allocates on the writer's thread): without this, the writer's
    /// thread found its own batch empty and took zeroed frames (a page
    /// fault and the kernel's zeroing each), while the collector's thread
    /// gave its batch back to the OS (an madvise per batch), so two threads
    /// overwriting their own files ran no faster than one.
    dirty: Vec<usize>,
}

/// `POOL.dirty`'s length as of the last change (kept under the lock):
/// `alloc_dirty` looks here before taking the lock, so a thread that finds
/// its own batch and the pool's both empty does not take the mutex per
/// frame.
static POOL_DIRTY_LEN: AtomicUsize = AtomicUsize::new(0);

/// Resident freed frames the pool keeps for any thread (16 MiB); past it,
/// a full batch is given back to the OS as before. `clean_local` gives
/// them all back.
const POOL_DIRTY_MAX: usize = (16 << 20) / FRAME;

struct Local {
    /// Free frames: zero, not resident.
    cache: Vec<usize>,
    /// Freed frames with old data, not yet given back to the OS.
    dirty: Vec<usize>,
}

impl Local {
    /// A full batch of dirty frames: to the pool's resident frames if it
    /// has room (another thread's `alloc_dirty` reuses them without a
    /// fault), else back to the OS (`clean`).
    fn spill(&mut self) {
        {
            let mut p = pool();
            if p.dirty.len() + self.dirty.len() <= POOL_DIRTY_MAX {
                p.dirty.append(&mut self.dirty);
                // Relaxed: a hint (see `POOL_DIRTY_LEN`), written under the lock.
                POOL_DIRTY_LEN.store(p.dirty.len(), Ordering::Relaxed);
                return;
            }
        }
        self.clean();
    }

    /// Give the dirty frames back to the OS and keep them as free frames.
    fn clean(&mut self) {
        release(&mut self.dirty);
        self.cache.append(&mut self.dirty);
        // Keep BATCH, hand the rest to the pool. (Draining only the last
        // BATCH stranded the rest here: a thread that mostly frees, e.g.
        // the one running epoch collections, grew its cache without bound
        // while the allocating threads mapped new chunks; issue 13:
        // stress-ng's sync-file left ~1 GB of free-list vectors resident.)
        if self.cache.len() > 2 * BATCH {
            pool().free.extend(self.cache.drain(BATCH..));
        }
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        release(&mut self.dirty);
        let mut p = pool();
        p.free.append(&mut self.dirty);
        p.free.append(&mut self.cache);
    }
}

thread_local! {
    static LOCAL: RefCell<Local> = const {
        RefCell::new(Local {
            cache: Vec::new(),
            dirty: Vec::new(),
        })
    };
}

thread_local! {
    /// Bytes of metadata this thread freed that `RELEASED` does not count
    /// yet (`heap_freed`).
    static HEAP_FREED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Count `bytes` of C heap a removal freed (an inode, a directory's
/// index, a symlink's target, attributes) toward `clean_local`'s heap
/// trim, as if they were frames given back. Removing files that hold no
/// data frees no frame, and glibc kept what they held: 200,000 empty
/// directories made and removed left RSS 264 MiB higher after every flush.
/// Per thread, added to the shared counter a `FRAME * 64` at a time (no
/// shared line per removal).
pub(crate) fn heap_freed(bytes: usize) {
    let _ = HEAP_FREED.try_with(|c| {
        let n = c.get() + bytes;
        if n >= FRAME * 64 {
            // Relaxed: a statistic, as in `release`.
            RELEASED.fetch_add(n / FRAME, Ordering::Relaxed);
            c.set(n % FRAME);
        } else {
            c.set(n);
        }
    });
}

fn pool() -> MutexGuard<'static, Pool> {
    POOL.lock()
}

/// `madvise(MADV_DONTNEED)` the frames in `v` (sorted, adjacent frames in
/// one call). Afterwards they read as zeros and take no memory.
fn release(v: &mut [usize]) {
    // Relaxed: a statistic, no data hangs on it.
    RELEASED.fetch_add(v.len(), Ordering::Relaxed);
    v.sort_unstable();
    let mut i = 0;
    while i < v.len() {
        let mut j = i + 1;
        while j < v.len() && v[j] == v[j - 1] + FRAME {
            j += 1;
        }
        let len = (j - i) * FRAME;
        // Miri has no madvise: it takes the memset below.
        let r = if cfg!(miri) {
            -1
        } else {
            // SAFETY: the range is frames of our mappings that no one uses
            // (they were freed); DONTNEED on private anonymous memory only
            // drops them.
            unsafe { libc::madvise(v[i] as *mut libc::c_void, len, libc::MADV_DONTNEED) }
        };
        if r != 0 {
            // Cannot happen for our own mappings; keep the zero invariant.
            // SAFETY: as above, the frames are ours and unused.
            unsafe { std::ptr::write_bytes(v[i] as *mut u8, 0, len) };
        }
        i = j;
    }
}

/// Map a new chunk; returns its frames, or an empty vector if the OS has no
/// memory.
#[cfg(miri)]
fn map_chunk() -> Vec<usize> {
    // Miri has no mmap: a zeroed, frame-aligned heap chunk, never freed
    // (as mappings are never unmapped).
    let layout = std::alloc::Layout::from_size_align(CHUNK, FRAME).expect("constant layout");
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Vec::new();
    }
    (0..CHUNK / FRAME).map(|i| p as usize + i * FRAME).collect()
}

/// Map a new chunk; returns its frames, or an empty vector if the OS has no
/// memory.
#[cfg(not(miri))]
fn map_chunk() -> Vec<usize> {
    // SAFETY: a fresh private anonymous mapping, no existing memory touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            CHUNK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Vec::new();
    }
    // Huge pages would make a 4 KiB frame cost 2 MiB and make DONTNEED split
    // them; advisory, so the result does not matter.
    // SAFETY: our fresh mapping.
    unsafe { libc::madvise(p, CHUNK, libc::MADV_NOHUGEPAGE) };
    (0..CHUNK / FRAME).map(|i| p as usize + i * FRAME).collect()
}

fn refill(l: &mut Local) {
    let mut p = pool();
    if p.free.is_empty() {
        let c = map_chunk();
        p.free.extend(c);
    }
    let take = p.free.len().min(BATCH);
    let at = p.free.len() - take;
    l.cache.extend(p.free.drain(at..));
}

fn to_frame(a: usize) -> NonNull<Frame> {
    // SAFETY: addresses on the free lists come from a successful mmap and
    // are not null.
    unsafe { NonNull::new_unchecked(a as *mut Frame) }
}

/// A zeroed frame, or `None` if the OS has no memory for a new mapping.
pub(crate) fn alloc_zeroed() -> Option<NonNull<Frame>> {
    let a = LOCAL
        .try_with(|l| {
            let mut l = l.borrow_mut();
            if l.cache.is_empty() {
                refill(&mut l);
            }
            l.cache.pop()
        })
        .unwrap_or_else(|_| {
            // Thread-local storage is gone (thread exit): use the pool.
            let mut p = pool();
            if p.free.is_empty() {
                let c = map_chunk();
                p.free.extend(c);
            }
            p.free.pop()
        })?;
    Some(to_frame(a))
}

/// A frame with unspecified contents, for a caller that overwrites all of
/// it; `None` if the OS has no memory.
pub(crate) fn alloc_dirty() -> Option<NonNull<Frame>> {
    // Inside `try_with` (no re-entry: `alloc_zeroed` is called after).
    let a = LOCAL
        .try_with(|l| {
            let mut l = l.borrow_mut();
            // Relaxed: a hint; the lock decides.
            if l.dirty.is_empty() && POOL_DIRTY_LEN.load(Ordering::Relaxed) > 0 {
                // A batch of the pool's resident frames, if it has any.
                let mut p = pool();
                let take = p.dirty.len().min(BATCH);
                let at = p.dirty.len() - take;
                l.dirty.extend(p.dirty.drain(at..));
                // Relaxed: as in `spill`.
                POOL_DIRTY_LEN.store(p.dirty.len(), Ordering::Relaxed);
            }
            l.dirty.pop()
        })
        .ok()
        .flatten();
    match a {
        Some(a) => Some(to_frame(a)),
        None => alloc_zeroed(),
    }
}

/// Give this thread's freed frames back to the OS now rather than when
/// its batch fills: an idle server thread would otherwise keep up to
/// `DIRTY_MAX` frames (1 MiB) of deleted data resident.
///
/// Also trims the C heap once per `TRIM_EVERY` frames given back (and
/// metadata freed, `heap_freed`): the radix
/// nodes, epoch bags and free lists of deleted data are freed on whichever
/// thread collects them, and glibc keeps freed memory inside its per-thread
/// arenas (issue 13: tens of MB after a delete, without a trim).
pub(crate) fn clean_local() {
    let _ = LOCAL.try_with(|l| l.borrow_mut().clean());
    // And the pool's resident frames (freed data no thread reused yet).
    let mut d = {
        let mut p = pool();
        // Relaxed: as in `spill`.
        POOL_DIRTY_LEN.store(0, Ordering::Relaxed);
        std::mem::take(&mut p.dirty)
    };
    if !d.is_empty() {
        release(&mut d);
        pool().free.append(&mut d);
    }
    // Relaxed: statistics; the CAS only picks one thread to trim.
    let r = RELEASED.load(Ordering::Relaxed);
    let t = TRIMMED_AT.load(Ordering::Relaxed);
    if r.wrapping_sub(t) >= TRIM_EVERY
        && TRIMMED_AT
            .compare_exchange(t, r, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        #[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
        // SAFETY: malloc_trim has no preconditions; it only gives free heap
        // memory back to the OS.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// Free a frame.
///
/// # Safety
/// `f` came from `alloc_*` and no one uses it any more (for a frame that
/// was in a file, an epoch grace period has passed since it left it).
pub(crate) unsafe fn free(f: NonNull<Frame>) {
    let a = f.as_ptr() as usize;
    let done = LOCAL.try_with(|l| {
        let mut l = l.borrow_mut();
        l.dirty.push(a);
        if l.dirty.len() >= DIRTY_MAX {
            l.spill();
        }
    });
    if done.is_err() {
        release(&mut [a]);
        pool().free.push(a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Freed frames come back zeroed from `alloc_zeroed`, whether they were
    /// given back to the OS or not.
    #[test]
    fn recycled_frames_are_zero() {
        // Under Miri (an interpreter) fewer frames and a sampled check: the
        // unsafe code paths are the same.
        let (n, stride) = if cfg!(miri) {
            (DIRTY_MAX + 8, 509)
        } else {
            (3 * DIRTY_MAX, 1)
        };
        let mut v = Vec::new();
        for i in 0..n {
            let f = alloc_dirty().unwrap();
            // SAFETY: ours alone.
            unsafe { std::ptr::write_bytes(f.as_ref().as_ptr(), i as u8 | 1, FRAME) };
            v.push(f);
        }
        for f in v {
            // SAFETY: allocated above, unused now.
            unsafe { free(f) };
        }
        let mut v = Vec::new();
        for _ in 0..n + DIRTY_MAX {
            let f = alloc_zeroed().unwrap();
            // SAFETY: ours alone.
            let b = unsafe { std::slice::from_raw_parts(f.as_ref().as_ptr(), FRAME) };
            assert!(b.iter().step_by(stride).all(|&x| x == 0));
            assert_eq!(b[FRAME - 1], 0);
            v.push(f);
        }
        for f in v {
            // SAFETY: allocated above, unused now.
            unsafe { free(f) };
        }
    }
}
