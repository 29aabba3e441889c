//! A `SeqLock` reader never returns a value mixed from two writes, and a
//! `SeqCount`-validated read of separate atomics never passes validation
//! while torn.
#![cfg(not(loom))]

use bytemuck::{Pod, Zeroable};
use scalevfs_sync::lockstat::{self, Stat};
use scalevfs_sync::{SeqCount, SeqLock};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

/// Every field carries the same generation number, so a torn read shows up
/// as two fields that differ; the checksum catches mixes within a field pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
struct Attr {
    size: u64,
    mtime: u64,
    ino: u32,
    mode: u32,
    check: u64,
}

impl Attr {
    fn gen(g: u64) -> Attr {
        Attr {
            size: g,
            mtime: g.wrapping_mul(3),
            ino: g as u32,
            mode: (g >> 32) as u32 ^ 0xa5a5,
            check: g ^ 0xdead_beef,
        }
    }
    fn consistent(&self) -> bool {
        *self == Attr::gen(self.size)
    }
}

const WRITES: u64 = if cfg!(miri) { 20 } else { 50_000 };

#[test]
fn readers_never_see_torn_values() {
    let lock = SeqLock::new(Attr::gen(0));
    let done = AtomicBool::new(false);
    let before = lockstat::snapshot();
    thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut last = 0;
                let mut reads = 0u64;
                while !done.load(Ordering::Relaxed) || reads == 0 {
                    let a = lock.read();
                    assert!(a.consistent(), "torn read: {a:?}");
                    assert!(a.size >= last, "went back in time: {} < {last}", a.size);
                    last = a.size;
                    reads += 1;
                }
            });
        }
        s.spawn(|| {
            for g in 1..=WRITES {
                lock.write(|a| {
                    assert_eq!(a.size, g - 1);
                    *a = Attr::gen(g);
                });
            }
            done.store(true, Ordering::Relaxed);
        });
    });
    assert_eq!(lock.read(), Attr::gen(WRITES));
    assert_eq!(lock.into_inner(), Attr::gen(WRITES));
    // Each write bumps the sequence twice and takes/releases the writer lock.
    let d = lockstat::snapshot().delta(&before);
    if lockstat::enabled() {
        assert!(d.get(Stat::SharedWrite) >= 4 * WRITES);
    }
}

#[test]
fn two_writers_serialise() {
    let lock = SeqLock::new([0u64; 4]);
    thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..WRITES / 4 {
                    lock.write(|v| {
                        let n = v[0] + 1;
                        *v = [n; 4];
                    });
                }
            });
        }
        s.spawn(|| {
            for _ in 0..WRITES / 4 {
                let v = lock.read();
                assert!(v.iter().all(|x| *x == v[0]), "torn: {v:?}");
            }
        });
    });
    assert_eq!(lock.read(), [2 * (WRITES / 4); 4]);
}

#[test]
fn write_returns_closure_result_and_panics_leave_value_intact() {
    let lock = SeqLock::new(7u64);
    assert_eq!(lock.write(|v| std::mem::replace(v, 8)), 7);
    let seq = lock.seq().current();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        lock.write(|v| {
            *v = 99;
            panic!("writer failed");
        })
    }));
    assert!(r.is_err());
    assert_eq!(lock.read(), 8, "a panicking writer must not publish");
    assert_eq!(lock.seq().current(), seq, "sequence untouched");
    lock.write(|v| *v = 9);
    assert_eq!(lock.read(), 9, "writer lock released after the panic");
}

#[test]
fn seqcount_validated_reads_of_separate_words() {
    let seq = SeqCount::new();
    let (a, b) = (AtomicU64::new(0), AtomicU64::new(0));
    let done = AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            for i in 1..=WRITES {
                // Single writer: no extra serialisation needed.
                seq.write_begin();
                a.store(i, Ordering::Relaxed);
                b.store(i, Ordering::Relaxed);
                seq.write_end();
                if i % 64 == 0 {
                    seq.invalidate();
                }
            }
            done.store(true, Ordering::Relaxed);
        });
        s.spawn(|| {
            let mut validated = 0u64;
            loop {
                let finished = done.load(Ordering::Relaxed);
                let start = seq.raw_read_begin();
                let (x, y) = (a.load(Ordering::Relaxed), b.load(Ordering::Relaxed));
                if !seq.retry(start) {
                    assert_eq!(x, y, "validated torn read");
                    validated += 1;
                }
                if finished && validated > 0 {
                    break;
                }
            }
        });
    });
    assert_eq!(seq.current() % 2, 0);
    assert_eq!(a.load(Ordering::Relaxed), WRITES);
}

#[test]
fn odd_start_always_retries() {
    let seq = SeqCount::new();
    seq.write_begin();
    let s = seq.raw_read_begin();
    assert_eq!(s & 1, 1);
    assert!(seq.retry(s));
    seq.write_end();
    assert!(seq.retry(s));
    let s = seq.read_begin();
    assert!(!seq.retry(s));
    seq.invalidate();
    assert!(seq.retry(s), "invalidate forces earlier readers to retry");
    assert_eq!(seq.read_begin() % 2, 0);
}
