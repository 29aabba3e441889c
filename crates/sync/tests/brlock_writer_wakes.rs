//! A writer that waits for readers to leave sleeps (after its spinning and
//! yielding) and is woken by the last reader's unlock: with readers that
//! hold the lock long enough to put it to sleep, every write completes
//! soon after the readers leave. Before the wake-up existed the writer
//! polled every 50 µs; a lost wake-up would now hang it, which the bound
//! below (seconds, far above any scheduling delay) turns into a failure.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use scalevfs_sync::ordered::{BrLock, Class};

#[test]
#[cfg_attr(
    miri,
    ignore = "futex waits are yields under Miri; ThreadSanitizer runs it"
)]
fn a_sleeping_writer_is_woken_by_the_last_reader() {
    let lock = Arc::new(BrLock::new(Class::DirParent));
    for round in 0..20 {
        let inside = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        let readers: Vec<_> = (0..2)
            .map(|k| {
                let (lock, inside) = (lock.clone(), inside.clone());
                std::thread::spawn(move || {
                    let g = lock.read();
                    inside.fetch_add(1, Ordering::SeqCst);
                    // Long enough for the writer to go to sleep.
                    std::thread::sleep(Duration::from_millis(5 + 3 * k));
                    drop(g);
                })
            })
            .collect();
        // Both readers inside before the writer comes (a reader that came
        // after the writer's claim would wait for it).
        while inside.load(Ordering::SeqCst) < 2 {
            std::thread::yield_now();
        }
        let writer = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                let g = lock.write();
                tx.send(()).unwrap();
                drop(g);
            })
        };
        for r in readers {
            r.join().unwrap();
        }
        rx.recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("round {round}: the writer was not woken"));
        writer.join().unwrap();
    }
}
