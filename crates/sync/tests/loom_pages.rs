//! Loom model of the lock-free page-read protocol of memfs
//! (`crates/core/src/pages.rs`), written with the same orderings:
//!
//! - a writer appends *in place* only at or beyond the file size, then
//!   publishes the new size (Release);
//! - a shrinking truncate publishes the smaller size first (Release), then
//!   replaces the page with a copy whose tail is zeroed (copy on write,
//!   pointer published with Release);
//! - a reader loads the page pointer (Acquire), then the size (Acquire), and
//!   copies only the bytes below that size.
//!
//! The page bytes are loom `UnsafeCell`s, so loom reports any read of a byte
//! that races with its in-place write; the assertions check that a reader
//! only ever returns contents the file really had. Page versions are
//! preallocated (the real code frees retired pages after an epoch grace
//! period, which loom cannot model; the model keeps them alive instead).
//!
//! Run with `ci/loom.sh`.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::model::Builder;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

const A: u8 = 1;
const B: u8 = 2;
const C: u8 = 3;

struct Page([UnsafeCell<u8>; 2]);

impl Page {
    fn new(b0: u8, b1: u8) -> Page {
        Page([UnsafeCell::new(b0), UnsafeCell::new(b1)])
    }
    fn write(&self, i: usize, v: u8) {
        self.0[i].with_mut(|p| {
            // SAFETY: loom hands us a valid pointer and tracks the access.
            unsafe { *p = v }
        });
    }
    fn read(&self, i: usize) -> u8 {
        // SAFETY: as in `write`.
        self.0[i].with(|p| unsafe { *p })
    }
}

struct File {
    pages: [Page; 2],
    cur: AtomicUsize,
    size: AtomicUsize,
}

/// The reader of pages.rs: pointer, then size, then bytes below the size.
fn read(f: &File) -> Vec<u8> {
    let p = f.cur.load(Ordering::Acquire);
    let s = f.size.load(Ordering::Acquire);
    (0..s).map(|i| f.pages[p].read(i)).collect()
}

fn model(check: impl Fn() + Sync + Send + 'static) {
    let mut b = Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(check);
}

#[test]
fn append_in_place_vs_read() {
    model(|| {
        let f = Arc::new(File {
            pages: [Page::new(A, 0), Page::new(0, 0)],
            cur: AtomicUsize::new(0),
            size: AtomicUsize::new(1),
        });
        let w = f.clone();
        let writer = thread::spawn(move || {
            // Append: bytes at or past EOF in place, then the size.
            w.pages[0].write(1, B);
            w.size.store(2, Ordering::Release);
        });
        let got = read(&f);
        assert!(got == [A] || got == [A, B], "read {got:?}");
        writer.join().unwrap();
    });
}

#[test]
fn truncate_then_append_vs_read() {
    model(|| {
        let f = Arc::new(File {
            pages: [Page::new(A, B), Page::new(0, 0)],
            cur: AtomicUsize::new(0),
            size: AtomicUsize::new(2),
        });
        let w = f.clone();
        let writer = thread::spawn(move || {
            // Shrinking truncate to 1: size first, then a copy with the
            // tail zeroed replaces the page.
            w.size.store(1, Ordering::Release);
            let old = w.pages[0].read(0);
            w.pages[1].write(0, old);
            w.pages[1].write(1, 0);
            w.cur.store(1, Ordering::Release);
            // Append C into the new page in place, then the size.
            w.pages[1].write(1, C);
            w.size.store(2, Ordering::Release);
        });
        let got = read(&f);
        assert!(
            got == [A, B] || got == [A] || got == [A, C],
            "read {got:?}: contents the file never had"
        );
        writer.join().unwrap();
    });
}

/// Two overwrites of one page under the shared data lock
/// (`FileData::overwrite_in_page`): each copies the current page, changes
/// its own byte, and publishes the copy by compare-and-exchange (AcqRel,
/// Acquire on failure), retrying from the winner's page when it lost. A
/// reader loads the page (Acquire) and reads both bytes. Neither write may
/// be lost, and loom reports a copy that reads a page while it is written.
#[test]
fn overwrites_by_compare_and_exchange_vs_read() {
    struct Versions {
        /// 0: the page as it was; 1-2: writer 0's copies; 3-4: writer 1's
        /// (a writer loses at most once: the other publishes once).
        pages: [Page; 5],
        cur: AtomicUsize,
    }
    fn overwrite(v: &Versions, w: usize) {
        for attempt in 0..2 {
            let cur = v.cur.load(Ordering::Acquire);
            let new = 1 + 2 * w + attempt;
            for i in 0..2 {
                v.pages[new].write(i, v.pages[cur].read(i));
            }
            v.pages[new].write(w, A + w as u8);
            if v.cur
                .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return;
            }
        }
        panic!("writer {w} lost twice");
    }
    model(|| {
        let v = Arc::new(Versions {
            pages: [0; 5].map(|_| Page::new(0, 0)),
            cur: AtomicUsize::new(0),
        });
        let ws: Vec<_> = (0..2)
            .map(|w| {
                let v = v.clone();
                thread::spawn(move || overwrite(&v, w))
            })
            .collect();
        let p = v.cur.load(Ordering::Acquire);
        let (b0, b1) = (v.pages[p].read(0), v.pages[p].read(1));
        assert!(b0 == 0 || b0 == A, "byte 0 read {b0}");
        assert!(b1 == 0 || b1 == B, "byte 1 read {b1}");
        for w in ws {
            w.join().unwrap();
        }
        let p = v.cur.load(Ordering::Acquire);
        assert_eq!(
            (v.pages[p].read(0), v.pages[p].read(1)),
            (A, B),
            "a write was lost"
        );
    });
}
