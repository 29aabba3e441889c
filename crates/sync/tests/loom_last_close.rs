//! Loom model of the lock-free last-close decision of
//! `crates/core/src/orphan.rs` (same operations, same SeqCst orderings):
//!
//! - `file_closed`: `opens.fetch_sub`; only the close that reaches 0 *and*
//!   sees a non-zero `state` takes the slow path;
//! - `mark_unlinked` (unlink of an open file): fence, look at `opens`, then
//!   under the registration lock register and set `state`, then look at
//!   `opens` again in case the last close left meanwhile;
//! - `file_opened` (an open that found the name before the unlink):
//!   `opens.fetch_add`, fence, look at nlink, and mark the inode if it is 0;
//! - the slow path rechecks under the registration lock.
//!
//! Properties: when every file is closed the orphan registration is gone
//! (no leaked slot), it is never released twice, and it is never released
//! while a file is open.
//!
//! Loom limitation: loom treats SeqCst as AcqRel, so in loom a plain SeqCst
//! load may read a value that the C++/Rust model's single total order of
//! SeqCst operations forbids, and the store-buffer pattern at the heart of
//! this protocol fails spuriously. The model therefore performs each
//! protocol *load* as a read-only RMW (`fetch_add(0)`), which always reads
//! the latest value in modification order, as the SeqCst load does in this
//! pattern. (Checked: with plain loads loom reports a leak that the real
//! SeqCst semantics rule out; with the reads as RMWs it finds none, and it
//! still finds the leak if the re-check of `opens` after marking is
//! removed.)
//!
//! Run with `ci/loom.sh`.
#![cfg(loom)]

use loom::model::Builder;
use loom::sync::atomic::{fence, AtomicU32, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

const UNLINKED: u32 = 1;

/// A SeqCst load, modelled as a read-only RMW (see the module comment).
fn sc_load(a: &AtomicU32) -> u32 {
    a.fetch_add(0, Ordering::SeqCst)
}

#[derive(Default)]
struct Reg {
    registered: bool,
    unlinked: bool,
}

struct Inode {
    nlink: AtomicU32,
    opens: AtomicU32,
    state: AtomicU32,
    reg: Mutex<Reg>,
}

impl Inode {
    fn new(opens: u32) -> Inode {
        Inode {
            nlink: AtomicU32::new(1),
            opens: AtomicU32::new(opens),
            state: AtomicU32::new(0),
            reg: Mutex::new(Reg::default()),
        }
    }

    fn last_close_slow(&self) {
        let mut r = self.reg.lock().unwrap();
        if r.unlinked && sc_load(&self.opens) == 0 {
            r.unlinked = false;
            self.state.fetch_and(!UNLINKED, Ordering::SeqCst);
            assert!(r.registered, "released twice");
            r.registered = false;
        }
    }

    fn mark_unlinked(&self) {
        fence(Ordering::SeqCst);
        if sc_load(&self.opens) == 0 {
            return;
        }
        {
            let mut r = self.reg.lock().unwrap();
            if r.unlinked {
                return;
            }
            assert!(!r.registered, "registered twice");
            r.registered = true;
            r.unlinked = true;
            self.state.fetch_or(UNLINKED, Ordering::SeqCst);
        }
        if sc_load(&self.opens) == 0 {
            self.last_close_slow();
        }
    }

    fn unlink(&self) {
        self.nlink.store(0, Ordering::SeqCst);
        self.mark_unlinked();
    }

    fn file_opened(&self) {
        self.opens.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if sc_load(&self.nlink) == 0 {
            self.mark_unlinked();
        }
    }

    fn file_closed(&self) {
        if self.opens.fetch_sub(1, Ordering::SeqCst) == 1 && sc_load(&self.state) != 0 {
            self.last_close_slow();
        }
    }

    fn assert_released(&self) {
        let r = self.reg.lock().unwrap();
        assert!(
            !r.registered && !r.unlinked,
            "orphan slot leaked after the last close"
        );
    }
}

fn model(bound: usize, check: impl Fn() + Sync + Send + 'static) {
    let mut b = Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(bound);
    }
    b.check(check);
}

#[test]
fn unlink_vs_last_close() {
    model(3, || {
        let i = Arc::new(Inode::new(1));
        let c = i.clone();
        let closer = thread::spawn(move || c.file_closed());
        i.unlink();
        closer.join().unwrap();
        i.assert_released();
    });
}

#[test]
fn unlink_vs_racing_open_and_close() {
    model(2, || {
        let i = Arc::new(Inode::new(1));
        let (c, o) = (i.clone(), i.clone());
        let closer = thread::spawn(move || c.file_closed());
        let opener = thread::spawn(move || {
            o.file_opened();
            o.file_closed();
        });
        i.unlink();
        closer.join().unwrap();
        opener.join().unwrap();
        i.assert_released();
    });
}
