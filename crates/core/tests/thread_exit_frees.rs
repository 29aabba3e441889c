//! A thread that exits while garbage of many other exited threads waits in
//! the epoch's queue frees it with bounded stack.
//!
//! During a thread's exit, crossbeam-epoch's per-thread handle may already
//! be gone; each pin then registers a fresh participant whose first pin
//! collects the global queue. A free run by that collection that pins again
//! (closing a file puts its mount reference under a pin) used to start one
//! more collection inside the first, one stack level per queued bag: the
//! `scalevfs bench` run of many workloads died of a stack overflow in a
//! thread-local destructor. Here a guard held by the test keeps a few
//! hundred exited threads' batches of closed files and removed inodes queued, then a thread
//! with a small stack closes files from its thread-local destructors
//! (registered before and after the library's own, so one of them runs
//! after crossbeam's handle is gone). One test in its own binary: the
//! queue is process-wide.

use std::cell::RefCell;
use std::sync::Arc;

use scalevfs::*;

/// Open files closed when the thread-local goes (at thread exit).
struct CloseAtExit(RefCell<Vec<(Arc<Task>, i32)>>);

impl Drop for CloseAtExit {
    fn drop(&mut self) {
        for (t, fd) in self.0.borrow_mut().drain(..) {
            let _ = t.close(fd);
        }
    }
}

thread_local! {
    static FIRST: CloseAtExit = const { CloseAtExit(RefCell::new(Vec::new())) };
    static LAST: CloseAtExit = const { CloseAtExit(RefCell::new(Vec::new())) };
}

#[test]
fn exiting_thread_frees_queued_garbage_with_bounded_stack() {
    let vfs = Vfs::new();
    let t = Arc::new(vfs.root_task());
    t.mkdir("/d", 0o755).unwrap();
    for i in 0..8 {
        let fd = t
            .open(&format!("/d/f{i}"), O_CREAT | O_WRONLY, 0o644)
            .unwrap();
        t.close(fd).unwrap();
    }
    // No grace period ends while this guard lives: every exited thread's
    // batches stay queued, orphaned.
    let hold = crossbeam_epoch::pin();
    const THREADS: usize = 300;
    for round in 0..THREADS / 10 {
        let ws: Vec<_> = (0..10)
            .map(|w| {
                let t = Arc::new(t.fork());
                std::thread::spawn(move || {
                    // Sealed batches and an open one, all orphaned at exit:
                    // closed files, and removed names with their inodes
                    // (one with an extended attribute).
                    for k in 0..80 {
                        let p = format!("/d/f{}", (round + w + k) % 8);
                        let fd = t.open(&p, O_RDONLY, 0).unwrap();
                        t.close(fd).unwrap();
                        let own = format!("/d/t{round}-{w}-{k}");
                        let fd = t.open(&own, O_CREAT | O_WRONLY, 0o644).unwrap();
                        t.close(fd).unwrap();
                        if k == 0 {
                            t.setxattr(&own, b"user.k", b"v", 0).unwrap();
                        }
                        t.unlink(&own).unwrap();
                    }
                })
            })
            .collect();
        for w in ws {
            w.join().unwrap();
        }
    }
    drop(hold);
    // A small stack: a few dozen nested collections overflow it.
    let t2 = t.clone();
    let h = std::thread::Builder::new()
        .stack_size(192 * 1024)
        .spawn(move || {
            let open = |t: &Arc<Task>| t.open("/d/f0", O_RDONLY, 0).unwrap();
            FIRST.with(|c| c.0.borrow_mut().push((t2.clone(), open(&t2))));
            for _ in 0..40 {
                let fd = open(&t2);
                t2.close(fd).unwrap();
            }
            LAST.with(|c| c.0.borrow_mut().push((t2.clone(), open(&t2))));
        })
        .unwrap();
    h.join().expect("the exiting thread finished");
    // The files the threads' destructors closed are gone with their names.
    for i in 0..8 {
        t.unlink(&format!("/d/f{i}")).unwrap();
    }
    flush_deferred_frees();
    assert_eq!(t.rmdir("/d"), Ok(()));
}
