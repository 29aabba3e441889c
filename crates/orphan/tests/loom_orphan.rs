//! Loom model of the orphan file's slot claim and release: no slot is ever
//! handed to two inodes, and the free counters end consistent.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p scalevfs-orphan --release --test loom_orphan`
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use scalevfs_orphan::{OrphanFile, OrphanSlot, OrphanVariant};

fn check_owned(f: &OrphanFile, s: OrphanSlot, ino: u64) {
    if let OrphanSlot::Slot { block, index } = s {
        assert_eq!(
            u64::from(f.slot(block as usize, index as usize)),
            ino,
            "slot handed to two inodes"
        );
    }
}

fn run(variant: OrphanVariant, blocks: usize, spb: usize, threads: u64, cycles: usize) {
    let mut b = loom::model::Builder::new();
    // Bound preemptions so the spin-until-claimed loops stay tractable; the
    // interesting races (two reservers, one zero slot, a release between)
    // need at most two.
    b.preemption_bound = Some(3);
    b.check(move || {
        let f = Arc::new(OrphanFile::with_geometry(variant, blocks, spb));
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let f = f.clone();
                thread::spawn(move || {
                    for c in 0..cycles {
                        let ino = t * 10 + c as u64 + 1;
                        let s = f.add(ino, t as usize);
                        check_owned(&f, s, ino);
                        f.remove(s, ino);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(f.is_empty(), "free counters inconsistent");
        for b in 0..f.blocks() {
            assert_eq!(f.free_slots(b) as usize, f.slots_per_block());
        }
    });
}

/// Two adders race for one block of two slots.
#[test]
fn lockless_one_block_contended() {
    run(OrphanVariant::Lockless, 1, 2, 2, 1);
}

/// Three adders for two slots: one overflows, nobody shares a slot.
#[test]
fn lockless_overflow() {
    run(OrphanVariant::Lockless, 1, 2, 3, 1);
}

/// Two blocks of one slot: adders start in different blocks and spill over.
#[test]
fn lockless_two_blocks_spill() {
    run(OrphanVariant::Lockless, 2, 1, 2, 1);
}

/// Re-use: two threads add and remove twice in a one-slot file.
#[test]
fn lockless_reuse_after_release() {
    run(OrphanVariant::Lockless, 1, 1, 2, 2);
}

#[test]
fn locked_one_block_contended() {
    run(OrphanVariant::Locked, 1, 2, 2, 1);
}
