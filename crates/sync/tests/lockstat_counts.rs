//! Per-thread counters: counts from many threads sum up, survive thread exit,
//! and stop when recording is switched off.
#![cfg(not(loom))]

use scalevfs_sync::lockstat::{self, LockClass, Snapshot, Stat, HIST_BUCKETS};
use std::sync::Mutex;
use std::thread;

/// Tests here toggle the global switch and read global sums: one at a time.
/// Each uses a counter nothing else in this test binary touches.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn counts_from_many_threads_sum_and_survive_exit() {
    let _s = serial();
    lockstat::set_enabled(true);
    let before = lockstat::snapshot();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            thread::spawn(move || {
                for _ in 0..1000 {
                    lockstat::inc(Stat::OrphanAdd);
                }
                lockstat::add(Stat::OrphanAdd, i);
                lockstat::lock_acquired(LockClass::OrphanFile, i % 2 == 0, 5);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // All four threads have exited: their shards were folded into the totals.
    let d = lockstat::snapshot().delta(&before);
    assert_eq!(d.get(Stat::OrphanAdd), 4000 + 6);
    let c = d.class(LockClass::OrphanFile);
    assert_eq!(c.acquired, 4);
    assert_eq!(c.contended, 2);
    assert_eq!(c.spins, 10);
    assert_eq!(c.hist[lockstat::hist_bucket(5)], 2);

    // Live threads count too.
    let before = lockstat::snapshot();
    let (tx, rx) = std::sync::mpsc::channel();
    let (tx2, rx2) = std::sync::mpsc::channel::<()>();
    let t = thread::spawn(move || {
        lockstat::add(Stat::OrphanAdd, 7);
        tx.send(()).unwrap();
        rx2.recv().unwrap();
    });
    rx.recv().unwrap();
    assert_eq!(lockstat::snapshot().delta(&before).get(Stat::OrphanAdd), 7);
    tx2.send(()).unwrap();
    t.join().unwrap();
    assert_eq!(lockstat::snapshot().delta(&before).get(Stat::OrphanAdd), 7);
}

#[test]
fn disabled_switch_stops_recording() {
    let _s = serial();
    let before = lockstat::snapshot();
    lockstat::set_enabled(false);
    assert!(!lockstat::enabled());
    lockstat::inc(Stat::OrphanDel);
    thread::spawn(|| lockstat::add(Stat::OrphanDel, 10))
        .join()
        .unwrap();
    lockstat::lock_acquired(LockClass::Sb, true, 3);
    lockstat::set_enabled(true);
    let d = lockstat::snapshot().delta(&before);
    assert_eq!(d.get(Stat::OrphanDel), 0);
    assert_eq!(d.class(LockClass::Sb).acquired, 0);
    lockstat::inc(Stat::OrphanDel);
    assert_eq!(lockstat::snapshot().delta(&before).get(Stat::OrphanDel), 1);
}

#[test]
fn reset_sets_a_baseline() {
    let _s = serial();
    lockstat::set_enabled(true);
    lockstat::add(Stat::DcacheReclaim, 5);
    lockstat::reset();
    assert_eq!(lockstat::snapshot().get(Stat::DcacheReclaim), 0);
    lockstat::add(Stat::DcacheReclaim, 2);
    assert_eq!(lockstat::snapshot().get(Stat::DcacheReclaim), 2);
    // The calling thread's own view is not affected by reset.
    assert!(lockstat::thread_snapshot().get(Stat::DcacheReclaim) >= 7);
}

#[test]
fn snapshot_display_and_delta() {
    let mut a = Snapshot::default();
    a.stats[Stat::DcacheHit.index()] = 10;
    a.classes[LockClass::DirLock.index()].acquired = 4;
    a.classes[LockClass::DirLock.index()].contended = 1;
    a.classes[LockClass::DirLock.index()].spins = 3;
    a.classes[LockClass::DirLock.index()].hist[2] = 1;
    let text = a.to_string();
    assert!(text.contains("dcache_hit"), "{text}");
    assert!(text.contains("dir_lock"), "{text}");
    assert!(
        !text.contains("dcache_miss"),
        "zero rows are left out: {text}"
    );
    let d = a.delta(&Snapshot::default());
    assert_eq!(d, a);
    let z = Snapshot::default().delta(&a);
    assert_eq!(z, Snapshot::default(), "delta saturates");
    assert_eq!(HIST_BUCKETS, a.class(LockClass::DirLock).hist.len());
    let mut m = a.clone();
    m.merge(&a);
    assert_eq!(m.get(Stat::DcacheHit), 20);
    assert_eq!(Stat::ALL.len(), Stat::COUNT);
    assert_eq!(Stat::DcacheHit.to_string(), "dcache_hit");
}
