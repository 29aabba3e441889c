//! The orphan file (DESIGN 2.5, after ext4's orphan file and Jan Kara's
//! 2021 lockless rework of it).
//!
//! An inode that is unlinked while still open, or that is in the middle of a
//! truncate, is recorded here so that a crash cannot leak its space: recovery
//! walks the file and finishes the job. The file has a fixed number of
//! blocks; each block is an array of 32-bit inode numbers (0 = free slot)
//! followed by an 8-byte tail (magic, then a crc32c). This crate holds the
//! in-memory side (slots, free counts); the bytes on disk and their
//! checksum are the ext4 type's (`scalevfs-ext4`'s `orphan.rs`: the
//! kernel's seed, orphan inode number and generation, block number).
//!
//! In memory each block also has an atomic count of free slots. Adding an
//! inode:
//! 1. start at a block chosen from the calling thread (`hint * 13 % blocks`),
//!    so threads spread over different blocks and different cache lines;
//! 2. reserve a slot in a block by decrementing its free counter if it is
//!    positive (`dec_if_positive`), moving to the next block if not;
//! 3. claim any zero slot of that block with a compare-exchange. The
//!    reservation guarantees one exists: every reserver that has not claimed
//!    yet is matched by a zero slot (deleters zero the slot *before* they
//!    give the reservation back).
//!
//! Deleting: store 0 in the slot, then increment the block's counter.
//!
//! When every block is full [`OrphanFile::add`] puts the inode on an
//! in-memory overflow list (memfs, which has no disk); an unlink never
//! fails because of the orphan file. [`OrphanFile::try_add`] reports the
//! full file instead: the ext4 type then records the inode on its on-disk
//! orphan list, as the kernel falls back to it.
//!
//! The checksum is computed only when a block is written out (by the ext4
//! type, at its commit), never on the add/delete path.
//!
//! Variants ([`OrphanVariant`]): `Lockless` (the above, default), `Locked`
//! (one spinlock around the whole file, the pre-2021 scheme) and `None` (no
//! orphan tracking at all: the upper bound for benchmarks).
//!
//! LOCKING RULES
//! - `OrphanFile::lock` (spinlock, class `orphan_file`): the `Locked` variant
//!   holds it around every add and delete. The lockless variant never takes it.
//! - `OrphanFile::overflow` (spinlock): the overflow list; a leaf lock.
//! - Both are leaves: nothing is called while they are held, in particular
//!   no epoch pin (a pin may run deferred destructors that add or delete
//!   orphans).
//!
//! Every atomic goes through `scalevfs_sync::primitive`, so the loom model in
//! `tests/loom_orphan.rs` explores the same code.

#![warn(missing_docs, missing_debug_implementations)]

use crossbeam_utils::CachePadded;
use scalevfs_sync::lockstat::LockClass;
use scalevfs_sync::ordered::{Class, SpinLock};
use scalevfs_sync::primitive::{AtomicU32, Ordering};

/// Size of one orphan block on disk.
pub const BLOCK_SIZE: usize = 4096;
/// Size of the block tail (magic + checksum).
pub const TAIL_SIZE: usize = 8;
/// Slots per full-size block.
pub const SLOTS_PER_BLOCK: usize = (BLOCK_SIZE - TAIL_SIZE) / 4;
/// Magic number in the tail of every orphan block (ext4's value).
pub const ORPHAN_MAGIC: u32 = 0x0b10_ca04;

const _: () = assert!(SLOTS_PER_BLOCK * 4 + TAIL_SIZE == BLOCK_SIZE);

/// Which orphan-file algorithm runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OrphanVariant {
    /// One lock around the whole file (ext4 before 2021).
    Locked,
    /// Per-block atomic free counters and compare-exchange slot claims.
    #[default]
    Lockless,
    /// No orphan tracking (the upper bound).
    None,
}

impl std::str::FromStr for OrphanVariant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "locked" => Ok(OrphanVariant::Locked),
            "lockless" => Ok(OrphanVariant::Lockless),
            "none" => Ok(OrphanVariant::None),
            _ => Err(format!(
                "unknown orphan variant {s} (locked, lockless, none)"
            )),
        }
    }
}

/// Where an inode was recorded; give it back to [`OrphanFile::remove`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OrphanSlot {
    /// Slot `index` of block `block`.
    Slot {
        /// Block number.
        block: u32,
        /// Slot within the block.
        index: u32,
    },
    /// On the in-memory overflow list ([`OrphanFile::add`]); for the
    /// ext4 type, on its fallback orphan list (`try_add` found no slot).
    Overflow,
    /// Not recorded (variant `None`).
    Untracked,
}

struct Block {
    /// Free slots not reserved by an adder.
    free: CachePadded<AtomicU32>,
    slots: Box<[AtomicU32]>,
}

/// The orphan file of one filesystem instance.
pub struct OrphanFile {
    variant: OrphanVariant,
    slots_per_block: usize,
    blocks: Box<[Block]>,
    lock: SpinLock<()>,
    overflow: SpinLock<Vec<u64>>,
}

impl std::fmt::Debug for OrphanFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrphanFile")
            .field("variant", &self.variant)
            .field("blocks", &self.blocks.len())
            .field("slots_per_block", &self.slots_per_block)
            .finish_non_exhaustive()
    }
}

impl OrphanFile {
    /// An empty orphan file of `blocks` full-size blocks (at least one).
    pub fn new(variant: OrphanVariant, blocks: usize) -> OrphanFile {
        OrphanFile::with_geometry(variant, blocks, SLOTS_PER_BLOCK)
    }

    /// An empty orphan file with `slots_per_block` slots per block (at most
    /// [`SLOTS_PER_BLOCK`]; smaller values let tests and models fill it).
    pub fn with_geometry(
        variant: OrphanVariant,
        blocks: usize,
        slots_per_block: usize,
    ) -> OrphanFile {
        let spb = slots_per_block.clamp(1, SLOTS_PER_BLOCK);
        let blocks = (0..blocks.max(1))
            .map(|_| Block {
                free: CachePadded::new(AtomicU32::new(spb as u32)),
                slots: (0..spb).map(|_| AtomicU32::new(0)).collect(),
            })
            .collect();
        OrphanFile {
            variant,
            slots_per_block: spb,
            blocks,
            lock: SpinLock::new(Class::OrphanFile, LockClass::OrphanFile, ()),
            overflow: SpinLock::new(Class::OrphanOverflow, LockClass::OrphanFile, Vec::new()),
        }
    }

    /// The algorithm in use.
    pub fn variant(&self) -> OrphanVariant {
        self.variant
    }

    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Slots per block.
    pub fn slots_per_block(&self) -> usize {
        self.slots_per_block
    }

    /// Record inode `ino`. `hint` spreads callers over blocks: pass
    /// something that differs between threads ([`thread_hint`]).
    /// Never fails: a full file (or an inode number that does not fit in 32
    /// bits) goes to the overflow list.
    pub fn add(&self, ino: u64, hint: usize) -> OrphanSlot {
        match self.try_add(ino, hint) {
            Some(s) => s,
            None => self.add_overflow(ino),
        }
    }

    /// Record inode `ino` in a slot, or `None` when every slot is taken
    /// (or the number does not fit in 32 bits): the caller keeps the
    /// record elsewhere (the ext4 type falls back to the on-disk orphan
    /// list, as the kernel does). `Untracked` for the `None` variant.
    pub fn try_add(&self, ino: u64, hint: usize) -> Option<OrphanSlot> {
        match self.variant {
            OrphanVariant::None => Some(OrphanSlot::Untracked),
            _ if ino == 0 || ino > u64::from(u32::MAX) => None,
            OrphanVariant::Lockless => self.add_lockless(ino as u32, hint),
            OrphanVariant::Locked => self.add_locked(ino as u32),
        }
    }

    /// Remove the record `slot` of inode `ino` (as returned by [`add`](Self::add)).
    pub fn remove(&self, slot: OrphanSlot, ino: u64) {
        match slot {
            OrphanSlot::Untracked => {}
            OrphanSlot::Overflow => {
                let mut l = self.overflow.lock();
                if let Some(i) = l.iter().position(|&x| x == ino) {
                    l.swap_remove(i);
                }
            }
            OrphanSlot::Slot { block, index } => {
                let Some(b) = self.blocks.get(block as usize) else {
                    return;
                };
                let Some(s) = b.slots.get(index as usize) else {
                    return;
                };
                let _l = (self.variant == OrphanVariant::Locked).then(|| self.lock.lock());
                // Only a slot that holds `ino` is given back: a second
                // remove of one record (a caller's bug) would otherwise
                // count a free slot that is not there, and the next
                // adder's `claim` would look for it for ever.
                // Release: the zero must be visible before the reservation
                // is given back (an adder that reserves through our
                // increment must find this slot free); Relaxed on failure:
                // nothing changes.
                if ino > u64::from(u32::MAX)
                    || s.compare_exchange(ino as u32, 0, Ordering::Release, Ordering::Relaxed)
                        .is_err()
                {
                    return;
                }
                // Release: publishes the zeroed slot to the next reserver
                // (pairs with the Acquire of its dec_if_positive).
                b.free.fetch_add(1, Ordering::Release);
            }
        }
    }

    fn add_lockless(&self, ino: u32, hint: usize) -> Option<OrphanSlot> {
        let n = self.blocks.len();
        let start = hint.wrapping_mul(13) % n;
        let mut i = start;
        loop {
            if dec_if_positive(&self.blocks[i].free) {
                return Some(self.claim(i, ino));
            }
            i += 1;
            if i == n {
                i = 0;
            }
            if i == start {
                return None;
            }
        }
    }

    /// Claim a zero slot in block `i`, where we hold a reservation.
    fn claim(&self, i: usize, ino: u32) -> OrphanSlot {
        let slots = &self.blocks[i].slots;
        let mut j = 0;
        loop {
            // Acquire: pairs with the Release zeroing in `remove`.
            while slots[j].load(Ordering::Acquire) != 0 {
                j += 1;
                if j == slots.len() {
                    j = 0;
                }
            }
            // AcqRel: the claim orders with the deleter's zeroing and with
            // whoever frees this slot later.
            if slots[j]
                .compare_exchange(0, ino, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return OrphanSlot::Slot {
                    block: i as u32,
                    index: j as u32,
                };
            }
        }
    }

    fn add_locked(&self, ino: u32) -> Option<OrphanSlot> {
        let _l = self.lock.lock();
        // Relaxed (all below): every access happens under `lock`.
        let i = self
            .blocks
            .iter()
            .position(|b| b.free.load(Ordering::Relaxed) > 0)?;
        let b = &self.blocks[i];
        // The zero slot first: the count goes down only with a claim.
        let j = b
            .slots
            .iter()
            .position(|s| s.load(Ordering::Relaxed) == 0)?;
        b.free.fetch_sub(1, Ordering::Relaxed);
        b.slots[j].store(ino, Ordering::Relaxed);
        Some(OrphanSlot::Slot {
            block: i as u32,
            index: j as u32,
        })
    }

    #[cold]
    fn add_overflow(&self, ino: u64) -> OrphanSlot {
        self.overflow.lock().push(ino);
        OrphanSlot::Overflow
    }

    /// Free-slot counter of block `b` (tests, fsck).
    pub fn free_slots(&self, b: usize) -> u32 {
        // Acquire: a reader of the counter then looks at the slots.
        self.blocks
            .get(b)
            .map_or(0, |b| b.free.load(Ordering::Acquire))
    }

    /// The inode number in slot `i` of block `b` (0 = free).
    pub fn slot(&self, b: usize, i: usize) -> u32 {
        // Acquire: pairs with the claim / zeroing.
        self.blocks
            .get(b)
            .and_then(|b| b.slots.get(i))
            .map_or(0, |s| s.load(Ordering::Acquire))
    }

    /// Every recorded inode (a snapshot; exact when no add/delete runs).
    pub fn orphans(&self) -> Vec<u64> {
        let mut v: Vec<u64> = Vec::new();
        for b in 0..self.blocks.len() {
            for i in 0..self.slots_per_block {
                let x = self.slot(b, i);
                if x != 0 {
                    v.push(u64::from(x));
                }
            }
        }
        v.extend(self.overflow.lock().iter().copied());
        v
    }

    /// Number of inodes on the overflow list.
    pub fn overflow_len(&self) -> usize {
        self.overflow.lock().len()
    }

    /// True when nothing is recorded.
    pub fn is_empty(&self) -> bool {
        (0..self.blocks.len()).all(|b| self.free_slots(b) as usize == self.slots_per_block)
            && self.overflow.lock().is_empty()
    }
}

/// Decrement `c` if it is positive; true if it was.
fn dec_if_positive(c: &AtomicU32) -> bool {
    // Relaxed first read: only a guess for the loop; the CAS orders.
    let mut cur = c.load(Ordering::Relaxed);
    while cur > 0 {
        // Acquire on success: pairs with the Release increment of a deleter
        // so the slot it zeroed is visible to `claim`.
        match c.compare_exchange_weak(cur, cur - 1, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(v) => cur = v,
        }
    }
    false
}

/// A small number that differs between threads, for spreading adders over
/// blocks (the kernel uses the CPU number).
#[cfg(not(loom))]
pub fn thread_hint() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering as O};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        // Relaxed: only distinctness matters.
        static HINT: usize = NEXT.fetch_add(1, O::Relaxed);
    }
    HINT.with(|h| *h)
}

/// Under loom every thread gets 0; models pass explicit hints.
#[cfg(loom)]
pub fn thread_hint() -> usize {
    0
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn add_remove_all_variants_and_overflow() {
        for v in [OrphanVariant::Locked, OrphanVariant::Lockless] {
            let f = OrphanFile::with_geometry(v, 2, 3);
            let s: Vec<_> = (1..=7u64).map(|i| (f.add(i, i as usize), i)).collect();
            assert_eq!(s.iter().filter(|x| x.0 == OrphanSlot::Overflow).count(), 1);
            let mut got = f.orphans();
            got.sort();
            assert_eq!(got, (1..=7).collect::<Vec<_>>());
            for (slot, ino) in s {
                f.remove(slot, ino);
            }
            assert!(f.is_empty());
        }
        let f = OrphanFile::new(OrphanVariant::None, 1);
        assert_eq!(f.add(5, 0), OrphanSlot::Untracked);
        assert!(f.is_empty());
    }

    #[test]
    fn try_add_reports_a_full_file_and_keeps_no_overflow() {
        for v in [OrphanVariant::Locked, OrphanVariant::Lockless] {
            let f = OrphanFile::with_geometry(v, 2, 2);
            let s: Vec<_> = (1..=4u64).map(|i| f.try_add(i, i as usize)).collect();
            assert!(s.iter().all(Option::is_some));
            assert_eq!(f.try_add(5, 0), None);
            assert_eq!(f.overflow_len(), 0);
            f.remove(s[2].unwrap(), 3);
            assert!(f.try_add(6, 0).is_some());
        }
        let f = OrphanFile::new(OrphanVariant::None, 1);
        assert_eq!(f.try_add(5, 0), Some(OrphanSlot::Untracked));
    }

    #[test]
    fn numbers_beyond_32_bits_overflow() {
        let f = OrphanFile::new(OrphanVariant::Lockless, 4);
        assert!(matches!(f.add(42, 1), OrphanSlot::Slot { .. }));
        assert_eq!(f.add(u64::from(u32::MAX) + 1, 0), OrphanSlot::Overflow);
        assert_eq!(f.try_add(u64::from(u32::MAX) + 1, 0), None);
    }

    /// A record removed twice, or removed with another inode's number,
    /// gives nothing back: counted free with no zero slot behind it, the
    /// next add of a full block looked for a zero for ever.
    #[test]
    fn a_wrong_remove_gives_no_slot_back() {
        for v in [OrphanVariant::Lockless, OrphanVariant::Locked] {
            let f = OrphanFile::with_geometry(v, 1, 2);
            let a = f.add(10, 0);
            let b = f.add(11, 0);
            assert_eq!(f.free_slots(0), 0);
            f.remove(a, 10);
            f.remove(a, 10);
            f.remove(b, 12);
            assert_eq!(f.free_slots(0), 1, "{v:?}");
            let c = f.add(13, 0);
            assert!(matches!(c, OrphanSlot::Slot { .. }));
            assert_eq!(f.try_add(14, 0), None, "{v:?}: the block is full again");
            f.remove(b, 11);
            f.remove(c, 13);
            assert!(f.is_empty());
        }
    }

    #[test]
    fn threads_never_share_a_slot() {
        let f = std::sync::Arc::new(OrphanFile::with_geometry(OrphanVariant::Lockless, 4, 8));
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let f = f.clone();
                std::thread::spawn(move || {
                    for k in 0..20_000u64 {
                        let ino = t * 1_000_000 + k + 1;
                        let s = f.add(ino, t as usize);
                        if let OrphanSlot::Slot { block, index } = s {
                            assert_eq!(f.slot(block as usize, index as usize) as u64, ino);
                        }
                        f.remove(s, ino);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(f.is_empty());
    }
}
