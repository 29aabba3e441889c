//! Creating and unlinking in one shared directory (creat-clo, seed 002 on
//! disk), the path whose two-thread rate once fell to half the one-thread
//! rate:
//! - the hot path takes no block-sized heap allocation per operation
//!   (`util::BlockBuf`): glibc serves `calloc` under the malloc arena's
//!   lock, which another thread's frees also take, and the two threads
//!   handed it back and forth through futex sleeps on every operation.
//!   Counted with a counting allocator, not timed;
//! - threads creating, closing and unlinking in one directory at once
//!   (the new inode is allocated and written before the directory's lock
//!   is taken, the lock is taken spinning first) leave exactly the names
//!   they kept, and the image is clean for e2fsck (debug builds check the
//!   lock order on every acquisition).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{fresh, fsck_clean, have_tools, rw_journaled, Scratch};
use scalevfs::{Vfs, O_CREAT, O_WRONLY};
use scalevfs_ext4::Ext4;

/// Counts, on threads that asked for it, allocations of at least
/// `BIG` bytes.
struct Counting;

const BIG: usize = 1024;

thread_local! {
    static COUNT_HERE: Cell<bool> = const { Cell::new(false) };
}
static BIG_ALLOCS: AtomicU64 = AtomicU64::new(0);

fn note(size: usize) {
    if size >= BIG && COUNT_HERE.try_with(|c| c.get()).unwrap_or(false) {
        // Relaxed: a counter read by the same thread.
        BIG_ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed on to `System` unchanged; counting
// allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(p, l, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Create (empty), close and unlink `name`.
fn creat_clo(t: &scalevfs::Task, name: &str) {
    let fd = t.open(name, O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
    t.unlink(name).unwrap();
}

#[test]
fn create_close_unlink_takes_no_block_sized_allocation_per_operation() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("shareddiralloc");
    // 1 KiB blocks (what mkfs picks for a small image, and what the
    // benchmark's 256 MiB image has): the size where glibc's calloc took
    // the arena lock although a malloc of it would not.
    let img = fresh(&s.0, 1024, "32M");
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    t.mkdir("/shared", 0o755).unwrap();
    // Warm up: the thread's buffer pool, the caches, the first blocks.
    for _ in 0..200 {
        creat_clo(&t, "/shared/f0");
    }
    let ops = 2000u64;
    // Relaxed: counted and read on this thread only.
    let before = BIG_ALLOCS.load(Ordering::Relaxed);
    COUNT_HERE.with(|c| c.set(true));
    for _ in 0..ops {
        creat_clo(&t, "/shared/f0");
    }
    COUNT_HERE.with(|c| c.set(false));
    let big = BIG_ALLOCS.load(Ordering::Relaxed) - before;
    // Before the per-thread pool each operation took about nine (every
    // directory, extent and inode-table block read into a fresh buffer).
    // What is left (about one in five operations) is the buffer cache
    // taking in a block now and then, a commit's copies when the
    // transaction grows large, and the VFS's fd table (a 2 KiB chunk on
    // some closes).
    assert!(
        big * 2 < ops,
        "{big} allocations of {BIG} bytes or more in {ops} create/close/unlink"
    );
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
}

#[test]
fn threads_creating_and_unlinking_in_one_directory_keep_exactly_their_names() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("shareddir");
    let img = fresh(&s.0, 1024, "64M");
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Arc::new(Vfs::with_root_fs(Default::default(), e.clone()));
    vfs.root_task().mkdir("/shared", 0o755).unwrap();
    let (threads, per) = (4, 300);
    std::thread::scope(|sc| {
        for k in 0..threads {
            let vfs = vfs.clone();
            sc.spawn(move || {
                let t = vfs.root_task();
                for i in 0..per {
                    // Each thread's own churn name, and every third file
                    // kept (the directory grows into more blocks while
                    // the others insert and remove).
                    creat_clo(&t, &format!("/shared/t{k}"));
                    if i % 3 == 0 {
                        let fd = t
                            .open(&format!("/shared/k{k}_{i}"), O_CREAT | O_WRONLY, 0o644)
                            .unwrap();
                        t.close(fd).unwrap();
                    }
                    if i % 50 == 0 {
                        t.mkdir(&format!("/shared/d{k}_{i}"), 0o755).unwrap();
                    }
                }
            });
        }
    });
    let want: BTreeSet<String> = (0..threads)
        .flat_map(|k| {
            (0..per).flat_map(move |i| {
                let mut v = Vec::new();
                if i % 3 == 0 {
                    v.push(format!("k{k}_{i}"));
                }
                if i % 50 == 0 {
                    v.push(format!("d{k}_{i}"));
                }
                v
            })
        })
        .collect();
    let t = vfs.root_task();
    let got: BTreeSet<String> = t
        .read_dir("/shared")
        .unwrap()
        .into_iter()
        .map(|d| String::from_utf8(d.name).unwrap())
        .filter(|n| n != "." && n != "..")
        .collect();
    assert_eq!(got, want);
    let st = t.stat("/shared").unwrap();
    assert_eq!(st.nlink, 2 + (threads * per / 50) as u32);
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
}
