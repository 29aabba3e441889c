//! Loom models of the two dentry-cache protocols of `crates/core/src/dcache.rs`
//! and `walk.rs`, written against the same primitives (LockRef, SeqCount):
//!
//! - **revive vs kill**: a lock-free lookup that found an unused (count 0)
//!   cached dentry revives it with `get_not_dead` while the reclaimer tries
//!   to evict it (lock, check count 0, mark dead, unhash, free). The dentry
//!   is never freed while the reader holds its revived reference, and a
//!   reader never revives a dead one.
//! - **seqcount-validated lookup of a dentry being renamed**: a lock-free
//!   reader compares (parent, name) of a dentry that a rename rewrites in
//!   place. A reader whose `d_seq` and global rename-seq checks both pass
//!   sees the old pair or the new pair, never a mix.
//!
//! Run with `ci/loom.sh` or
//! `RUSTFLAGS="--cfg loom" cargo test -p scalevfs-sync --release --test loom_dcache`.
#![cfg(loom)]

use loom::model::Builder;
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use scalevfs_sync::{LockRef, LockRefVariant, SeqCount};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

struct Dentry {
    lockref: LockRef,
    hashed: AtomicBool,
    freed: AtomicBool,
}

/// The reclaimer's eviction step (dcache.rs `sweep_bucket`).
fn evict(d: &Dentry) -> bool {
    d.lockref.lock();
    if d.lockref.count() == 0 {
        d.lockref.mark_dead_locked();
        d.lockref.unlock();
        d.hashed.store(false, Ordering::SeqCst);
        d.freed.store(true, Ordering::SeqCst);
        true
    } else {
        d.lockref.unlock();
        false
    }
}

/// The last `dput` of a hashed dentry keeps it cached at count 0.
fn dput_hashed(d: &Dentry, v: LockRefVariant) {
    if d.lockref.put_or_lock(v) {
        return;
    }
    d.lockref.dec_locked();
    d.lockref.unlock();
}

#[test]
fn revive_vs_kill() {
    for v in LockRefVariant::ALL {
        model(move || {
            let d = Arc::new(Dentry {
                lockref: LockRef::new(0),
                hashed: AtomicBool::new(true),
                freed: AtomicBool::new(false),
            });
            let r = d.clone();
            let reader = thread::spawn(move || {
                if !r.hashed.load(Ordering::SeqCst) {
                    return false;
                }
                if r.lockref.get_not_dead(v) {
                    // We hold a reference: the dentry must not be freed.
                    assert!(!r.freed.load(Ordering::SeqCst), "revived a freed dentry");
                    assert!(!r.lockref.is_dead());
                    dput_hashed(&r, v);
                    true
                } else {
                    // Failing is only allowed because it died.
                    assert!(r.lockref.is_dead());
                    false
                }
            });
            let killed = evict(&d);
            let revived = reader.join().unwrap();
            if killed {
                // Dead exactly once, and no holder touched it after death.
                assert_eq!(d.lockref.count(), scalevfs_sync::LOCKREF_DEAD);
            } else {
                // Eviction saw the reader's reference; it was returned.
                assert!(revived);
                assert_eq!(d.lockref.count(), 0);
            }
        });
    }
}

/// The rename seqcount's value before any rename.
fn rename_seq_initial() -> u32 {
    SeqCount::new().raw_read_begin()
}

struct Named {
    seq: SeqCount,
    parent: AtomicU64,
    name: AtomicU64,
}

#[test]
fn seq_validated_lookup_during_rename() {
    model(|| {
        let rename_seq = Arc::new(SeqCount::new());
        let d = Arc::new(Named {
            seq: SeqCount::new(),
            parent: AtomicU64::new(1),
            name: AtomicU64::new(10),
        });
        let (rs, dd) = (rename_seq.clone(), d.clone());
        let writer = thread::spawn(move || {
            // d_move: rename seq, then d_seq, around the in-place update.
            rs.write_begin();
            dd.seq.write_begin();
            dd.parent.store(2, Ordering::Relaxed);
            dd.name.store(20, Ordering::Relaxed);
            dd.seq.write_end();
            rs.write_end();
        });
        // One lock-free lookup attempt (walk.rs + dcache.rs lookup_rcu).
        let s0 = rename_seq.read_begin();
        let s = d.seq.raw_read_begin();
        if s & 1 == 0 {
            let p = d.parent.load(Ordering::Relaxed);
            let n = d.name.load(Ordering::Relaxed);
            let dentry_ok = !d.seq.retry(s);
            let walk_ok = !rename_seq.retry(s0);
            if dentry_ok {
                assert!((p, n) == (1, 10) || (p, n) == (2, 20), "torn ({p}, {n})");
            }
            if walk_ok {
                // The whole walk validated: nothing was renamed meanwhile, so
                // it saw the state of its start exactly.
                let want = if s0 == rename_seq_initial() {
                    (1, 10)
                } else {
                    (2, 20)
                };
                assert_eq!((p, n), want);
            }
        }
        writer.join().unwrap();
    });
}
