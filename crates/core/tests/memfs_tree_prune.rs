//! memfs insert and collapse (FALLOC_FL_INSERT_RANGE, COLLAPSE_RANGE)
//! move pages to other indices of the file's page tree and leave their old
//! slots empty; the tree nodes they emptied must go, as a punch's do.
//! Kept, each call left its emptied nodes behind (about 700 bytes a call,
//! uncounted by `size=`, kept after the file shrank back), and later calls
//! walked them (quadratic time). Memory is counted exactly by this test
//! binary's allocator (the only test in the file, so nothing else runs).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use scalevfs::io::*;
use scalevfs::*;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator, counting sizes on the way.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // Relaxed: a statistic, read after the work is done.
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc requires.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // Relaxed: as above.
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from `alloc` with this layout.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn live() -> isize {
    // Deferred frees (pages, nodes) run first.
    for _ in 0..4 {
        flush_deferred_frees();
    }
    // Relaxed: as above.
    LIVE.load(Ordering::Relaxed)
}

#[test]
fn insert_and_collapse_leave_no_empty_nodes() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let f = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    assert_eq!(t.pwrite(f, b"x", 0), Ok(1));
    // Each insert moves the page a quarter megabyte (64 pages) on, into
    // another leaf of the tree, and empties the one it left; the
    // collapses bring it back the same way.
    const STEP: i64 = 256 << 10;
    const N: isize = 3000;
    let before = live();
    for _ in 0..N {
        t.fallocate(f, FALLOC_FL_INSERT_RANGE, 0, STEP).unwrap();
    }
    let after_inserts = live() - before;
    for _ in 0..N {
        t.fallocate(f, FALLOC_FL_COLLAPSE_RANGE, 0, STEP).unwrap();
    }
    let grown = live() - before;
    eprintln!("{after_inserts} bytes more after {N} inserts, {grown} after as many collapses");
    // Kept, the emptied nodes came to some 700 bytes a call (over 2 MB
    // here); the one path the page sits on is a few kilobytes.
    assert!(
        after_inserts < 64 << 10,
        "{after_inserts} bytes after {N} inserts"
    );
    assert!(
        grown < 64 << 10,
        "{grown} bytes after {N} inserts and collapses"
    );
    // The byte moved up and back and is where it was.
    let mut b = [0u8; 1];
    assert_eq!(t.pread(f, &mut b, 0), Ok(1));
    assert_eq!(&b, b"x");
    let st = t.fstat(f).unwrap();
    assert_eq!((st.size, st.blocks), (1, 8));
    t.close(f).unwrap();
}
