//! The gate's sleepers are woken (no lost wake-up): a closer that waits
//! for a pass held long enough to put it to sleep returns once the pass
//! leaves, and a thread that meets the gate closed long enough to sleep
//! enters once it opens. A lost wake-up would hang; the bounds below
//! (seconds, far above any scheduling delay) turn that into a failure.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use scalevfs_sync::Gate;

#[test]
#[cfg_attr(
    miri,
    ignore = "futex waits are yields under Miri; ThreadSanitizer runs it"
)]
fn a_sleeping_closer_is_woken_by_the_last_pass() {
    let g = Arc::new(Gate::new(4));
    for round in 0..20 {
        let (inside_tx, inside_rx) = mpsc::channel();
        let holder = {
            let g = g.clone();
            std::thread::spawn(move || {
                let p = g.enter();
                inside_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(5));
                drop(p);
            })
        };
        inside_rx.recv().unwrap();
        let (tx, rx) = mpsc::channel();
        let closer = {
            let g = g.clone();
            std::thread::spawn(move || {
                g.close();
                tx.send(()).unwrap();
            })
        };
        holder.join().unwrap();
        rx.recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("round {round}: the closer was not woken"));
        closer.join().unwrap();
        g.open();
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "futex waits are yields under Miri; ThreadSanitizer runs it"
)]
fn a_sleeping_entrant_is_woken_by_open() {
    let g = Arc::new(Gate::new(4));
    for round in 0..20 {
        g.close();
        let (tx, rx) = mpsc::channel();
        let entrant = {
            let g = g.clone();
            std::thread::spawn(move || {
                let p = g.enter();
                tx.send(()).unwrap();
                drop(p);
            })
        };
        // Long enough for the entrant to go to sleep.
        std::thread::sleep(Duration::from_millis(5));
        assert!(
            rx.try_recv().is_err(),
            "round {round}: entered a closed gate"
        );
        g.open();
        rx.recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("round {round}: the entrant was not woken"));
        entrant.join().unwrap();
    }
}
