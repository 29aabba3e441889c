//! The `scalevfs` binary's memory allocator: mimalloc, or the C library's
//! `malloc` when the environment says `SCALEVFS_ALLOC=system`.
//!
//! Why: creates and unlinks free memory on other threads than the ones
//! that allocated it (dentries, names and skip-list nodes go through
//! crossbeam-epoch, whose deferred frees run on whichever thread collects
//! them). glibc's `malloc` takes the owning arena's lock for such a free,
//! and on two threads that lock became the bottleneck of every create in
//! `scalevfs bench` (`perf`: ~16% of the time in `__lll_lock_wait_private` /
//! `__lll_lock_wake_private` futex calls and ~28% in `_int_free`,
//! `_int_malloc` and `malloc_consolidate` on creat-clo at 2 threads).
//! mimalloc frees cross-thread through lock-free per-page lists.
//!
//! The library itself does not choose an allocator (that is the embedding
//! program's choice); this binary, which runs the benchmarks and the FUSE
//! mount, does. The switch makes a before/after comparison possible with
//! one binary: the choice is read once, at the first allocation (before
//! `main`, on one thread), and never changes, so every block is freed by
//! the allocator that made it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

use mimalloc::MiMalloc;

/// Not decided yet / mimalloc / the C library's malloc.
const UNSET: u8 = 0;
const MIMALLOC: u8 = 1;
const SYSTEM: u8 = 2;

static CHOICE: AtomicU8 = AtomicU8::new(UNSET);

/// The allocator of this process (decided at its first allocation).
#[inline]
fn choice() -> u8 {
    // Relaxed: the value is a pure function of the environment at start-up;
    // every thread that computes it computes the same value, so no order
    // with anything else is needed.
    match CHOICE.load(Ordering::Relaxed) {
        UNSET => {
            // SAFETY: the name is a NUL-terminated C string; getenv does not
            // allocate and returns null or a NUL-terminated string that we
            // only read here, while no other thread can yet change the
            // environment (this runs at the process's first allocation).
            let v = unsafe { libc::getenv(c"SCALEVFS_ALLOC".as_ptr()) };
            // SAFETY: a non-null result of getenv is a NUL-terminated string.
            let system =
                !v.is_null() && unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes() == b"system";
            let c = if system { SYSTEM } else { MIMALLOC };
            CHOICE.store(c, Ordering::Relaxed);
            c
        }
        c => c,
    }
}

/// The name of the allocator in use ("mimalloc" or "system"), for reports.
pub fn name() -> &'static str {
    if choice() == SYSTEM {
        "system"
    } else {
        "mimalloc"
    }
}

/// mimalloc or `System`, by [`choice`].
pub struct Switch;

// SAFETY: every method forwards to one allocator, the same one for the whole
// life of the process (`choice` never changes once set), so a block is always
// resized and freed by the allocator that returned it; both allocators uphold
// GlobalAlloc's contract themselves.
unsafe impl GlobalAlloc for Switch {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe {
            if choice() == SYSTEM {
                System.alloc(layout)
            } else {
                MiMalloc.alloc(layout)
            }
        }
    }
    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe {
            if choice() == SYSTEM {
                System.alloc_zeroed(layout)
            } else {
                MiMalloc.alloc_zeroed(layout)
            }
        }
    }
    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from the same allocator (see the impl's comment).
        unsafe {
            if choice() == SYSTEM {
                System.dealloc(ptr, layout)
            } else {
                MiMalloc.dealloc(ptr, layout)
            }
        }
    }
    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from the same allocator (see the impl's comment).
        unsafe {
            if choice() == SYSTEM {
                System.realloc(ptr, layout, new_size)
            } else {
                MiMalloc.realloc(ptr, layout, new_size)
            }
        }
    }
}

#[global_allocator]
static GLOBAL: Switch = Switch;
