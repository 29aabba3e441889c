//! Per-thread ("sloppy") counters and number allocators for the write side
//! (issue 16): a create or unlink must not write a cache line that every
//! other creating thread writes too.
//!
//! DESIGN
//! - A [`ShardedCounter`] has one cache-padded slot per shard; a thread
//!   updates the slot of its own shard index (threads are numbered once, at
//!   their first use, and the index is that number modulo the shard count,
//!   which is a power of two at least twice the machine's parallelism). With
//!   no more threads than shards every slot has one writer and the update is
//!   an RMW of a line no other thread writes. More threads share slots:
//!   still exact, just no longer private. The value is the sum of the slots,
//!   exact when no update runs concurrently (Linux's `percpu_counter_sum`).
//! - A [`LimitedCounter`] adds a limit: the shared total counts units
//!   granted, each slot holds units its threads reserved but do not use
//!   (taken from the total a `BATCH` at a time, with a bounded RMW that
//!   never passes the limit; a decrement returns its unit to the slot).
//!   An increment takes a reserved unit from its own slot; only a refill
//!   (once per `BATCH`) writes the total. At the limit the increment takes
//!   every slot's reservations back first, so nothing is ever granted past
//!   the limit and a lone thread gets exactly what is left (concurrent
//!   threads near the limit may see ENOSPC while another holds a
//!   reservation it has not used yet, as per-CPU quota schemes do).
//! - [`InoAllocator`]: unique numbers handed out in per-shard batches of
//!   `INO_BATCH` (Linux's `get_next_ino`): one shared RMW per batch.
//!
//! No locks. Orderings: [`ShardedCounter`] and [`LimitedCounter`] are
//! Relaxed (each orders nothing but its own value; exactness needs only the
//! RMWs' atomicity). [`SplitCount`] is SeqCst: the "flag, then count"
//! handshake of a read-only remount needs a single total order (see the
//! type). [`InoAllocator`]'s uniqueness needs only atomicity, but a refill
//! publishes its batch with Release and a hand-out reads the shard with
//! Acquire, so that `bound_batch` bounds every number handed out before it
//! (see `next_from_batch_on`); its `next_batch` RMW and load are Relaxed.

use crossbeam_utils::CachePadded;
use scalevfs_sync::primitive::{AtomicI64, AtomicU64, Ordering};
// The thread-slot index is a process-wide static; loom's atomics cannot be
// built in a `static`, so these two stay std's (they only hand out indexes).
use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};

/// How many increments a [`LimitedCounter`] slot gathers before folding them
/// into the shared total.
pub(crate) const BATCH: i64 = 64;

/// Inode numbers per batch of an [`InoAllocator`] shard.
pub(crate) const INO_BATCH: u64 = 1024;

/// Shard count: a power of two, at least twice the parallelism, at most 256.
pub(crate) fn shard_count() -> usize {
    static N: AtomicUsize = AtomicUsize::new(0);
    // Relaxed: a cached pure function of the machine; racing stores agree.
    let n = N.load(StdOrdering::Relaxed);
    if n != 0 {
        return n;
    }
    let p = std::thread::available_parallelism().map_or(8, |p| p.get());
    let n = (2 * p).next_power_of_two().clamp(2, 256);
    // Relaxed: see above.
    N.store(n, StdOrdering::Relaxed);
    n
}

/// This thread's number (assigned at its first call). Under loom, model
/// threads run on one OS thread, so the number comes from loom's own
/// thread-locals: each model thread gets its own slot, as real threads do.
#[cfg(loom)]
pub(crate) fn thread_index() -> usize {
    loom::lazy_static! {
        static ref NEXT: loom::sync::atomic::AtomicUsize = loom::sync::atomic::AtomicUsize::new(0);
    }
    loom::thread_local! {
        // Relaxed: only uniqueness (spreading) of the numbers matters.
        static IDX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    IDX.with(|i| *i)
}

/// This thread's number (assigned at its first call).
#[cfg(not(loom))]
pub(crate) fn thread_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        // Relaxed: only uniqueness (spreading) of the numbers matters.
        static IDX: usize = NEXT.fetch_add(1, StdOrdering::Relaxed);
    }
    // During thread-local teardown: shard 0 (still exact, only shared).
    IDX.try_with(|i| *i).unwrap_or(0)
}

/// This thread's shard among `shard_count()` (a power of two).
#[inline]
pub(crate) fn shard_index() -> usize {
    thread_index() & (shard_count() - 1)
}

fn slots<T: Default>() -> Box<[CachePadded<T>]> {
    (0..shard_count())
        .map(|_| CachePadded::new(T::default()))
        .collect()
}

/// A counter whose updates write a per-thread slot (see the module doc);
/// a slot folds into the shared `total` when it holds a batch either way,
/// so [`approx`](Self::approx) is within `shards * BATCH` of the value
/// without reading the slots (Linux's `percpu_counter_read`).
pub(crate) struct ShardedCounter {
    total: CachePadded<AtomicI64>,
    slots: Box<[CachePadded<AtomicI64>]>,
}

impl std::fmt::Debug for ShardedCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ShardedCounter").field(&self.sum()).finish()
    }
}

impl Default for ShardedCounter {
    fn default() -> Self {
        ShardedCounter {
            total: CachePadded::new(AtomicI64::new(0)),
            slots: slots(),
        }
    }
}

impl ShardedCounter {
    #[inline]
    pub(crate) fn add(&self, v: i64) {
        let s = &self.slots[thread_index() & (self.slots.len() - 1)];
        // Relaxed (here and below): a counter orders nothing but itself; the
        // RMWs' atomicity keeps the sum exact.
        let now = s.fetch_add(v, Ordering::Relaxed) + v;
        if !(-BATCH..BATCH).contains(&now) {
            let d = s.swap(0, Ordering::Relaxed);
            self.total.fetch_add(d, Ordering::Relaxed);
        }
    }

    /// Within `slack()` of the value; reads one shared line.
    #[inline]
    pub(crate) fn approx(&self) -> usize {
        // Relaxed: see `add`.
        self.total.load(Ordering::Relaxed).max(0) as usize
    }

    /// The most `approx` may differ from the value.
    pub(crate) fn slack(&self) -> usize {
        self.slots.len() * BATCH as usize
    }

    /// Whether the value is above `limit`: from `approx` when that is
    /// conclusive, else from the exact sum (`percpu_counter_compare`).
    #[inline]
    pub(crate) fn above(&self, limit: usize) -> bool {
        let a = self.approx();
        if a + self.slack() <= limit {
            false
        } else if a > limit + self.slack() {
            true
        } else {
            self.sum() > limit
        }
    }

    /// The total plus every slot (never below 0; exact when no update runs
    /// concurrently).
    pub(crate) fn sum(&self) -> usize {
        // Relaxed: see `add`.
        let s: i64 = self.total.load(Ordering::Relaxed)
            + self
                .slots
                .iter()
                .map(|s| s.load(Ordering::Relaxed))
                .sum::<i64>();
        s.max(0) as usize
    }
}

/// A count that is only ever compared with zero by a rare reader (a
/// mount's open files and writers, read by umount and a read-only
/// remount): per-thread slots and no shared total, so an update writes only
/// its own thread's line. A thread may take a unit on one slot and give it
/// back on another, so slots go negative; the value is their sum. Updates
/// and the reader's loads are SeqCst, which keeps the "flag, then count"
/// handshake of `Vfs::remount_at` (see `Mount::add_writer`) sound: a unit
/// whose increment the reader's scan missed came after the reader's flag
/// store in the single total order, so its taker sees the flag. Nothing is
/// folded between slots, so no unit is ever in flight between two places
/// and a zero sum is never a false one for a unit still held.
pub(crate) struct SplitCount {
    slots: Box<[CachePadded<AtomicI64>]>,
}

impl std::fmt::Debug for SplitCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SplitCount").field(&self.sum()).finish()
    }
}

impl Default for SplitCount {
    fn default() -> Self {
        SplitCount { slots: slots() }
    }
}

impl SplitCount {
    #[inline]
    pub(crate) fn add(&self, v: i64) {
        let s = &self.slots[thread_index() & (self.slots.len() - 1)];
        // SeqCst: the handshake in the type's doc.
        s.fetch_add(v, Ordering::SeqCst);
    }

    /// The sum of the slots (SeqCst loads, see the type's doc).
    pub(crate) fn sum(&self) -> i64 {
        self.slots.iter().map(|s| s.load(Ordering::SeqCst)).sum()
    }
}

/// A counter with a limit (see the module doc): `total` counts the units
/// granted, those in use and those reserved in the slots; the value is
/// `total - Σ slots`. Public for filesystem types (the ext4 allocator's
/// free-block count); the value may go below zero when units counted
/// before it existed are given back.
pub struct LimitedCounter {
    total: CachePadded<AtomicI64>,
    slots: Box<[CachePadded<AtomicI64>]>,
}

impl std::fmt::Debug for LimitedCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LimitedCounter").field(&self.sum()).finish()
    }
}

impl Default for LimitedCounter {
    fn default() -> Self {
        LimitedCounter {
            total: CachePadded::new(AtomicI64::new(0)),
            slots: slots(),
        }
    }
}

impl LimitedCounter {
    #[inline]
    fn mine(&self) -> &AtomicI64 {
        &self.slots[thread_index() & (self.slots.len() - 1)]
    }

    /// Count one more unless that would pass `limit`.
    pub fn try_inc(&self, limit: u64) -> bool {
        self.try_inc_signed(limit.min(i64::MAX as u64 / 2) as i64)
    }

    /// `try_inc` with a limit that may be below 0 (the count may be too:
    /// ext4 counts blocks taken since mount, and a limit is what was free
    /// at mount less a reserve, which may be more than was free then).
    pub fn try_inc_signed(&self, limit: i64) -> bool {
        let limit = limit.min(i64::MAX / 2);
        let s = self.mine();
        // Relaxed (every access below): the counter orders nothing but
        // itself; exactness comes from the RMWs' atomicity. Callers may
        // pass different limits (ext4: root may take the reserved blocks,
        // others not), so a unit this slot reserved under a higher limit
        // is spent only while the total, reservations included, is
        // within this call's: the value stays below it.
        // The take is Acquire, pairing with the refill's Release below: a
        // unit taken from a batch comes with the total that batch raised,
        // for the check after the take.
        if self.total.load(Ordering::Relaxed) <= limit
            && s.fetch_update(Ordering::Acquire, Ordering::Relaxed, |r| {
                (r > 0).then_some(r - 1)
            })
            .is_ok()
        {
            // Checked again after the take: a thread sharing this slot
            // with a higher limit may have refilled it (raising the total
            // past ours) between the check and the take, and the unit
            // taken is then one of its batch; spent under our limit it
            // put the value past it (the loom model
            // `limited_counter_shared_slot_mixed_limits`: 3 under a limit
            // of 1; ext4: a non-root caller into root's reserve). The
            // total is at least the value (slots are never below 0), so
            // a total within the limit now bounds the value with this
            // unit in it; else the unit goes back and the slow path
            // decides.
            if self.total.load(Ordering::Relaxed) <= limit {
                return true;
            }
            s.fetch_add(1, Ordering::Relaxed);
        }
        // Refill: a batch (or what is left below the limit) from the total.
        let mut grant = 0;
        let got = self
            .total
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                grant = BATCH.min(limit - n);
                (grant > 0).then_some(n + grant)
            });
        if got.is_ok() {
            if grant > 1 {
                // Release: see the take above (the batch's total first).
                s.fetch_add(grant - 1, Ordering::Release);
            }
            return true;
        }
        // At the limit: take back every reservation, then one unit, bounded.
        self.unreserve_all();
        self.total
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok()
    }

    /// Give every slot's reserved units back to the total.
    fn unreserve_all(&self) {
        for s in self.slots.iter() {
            // Relaxed: see `try_inc`.
            let v = s.swap(0, Ordering::Relaxed);
            if v != 0 {
                self.total.fetch_sub(v, Ordering::Relaxed);
            }
        }
    }

    /// Count one more, ignoring any limit.
    pub(crate) fn inc(&self) {
        // Relaxed: see `try_inc`.
        self.total.fetch_add(1, Ordering::Relaxed);
    }

    /// Count one less: the unit becomes a reservation of this thread's slot
    /// (up to a batch; past that it goes back to the total).
    pub fn dec(&self) {
        let s = self.mine();
        // Relaxed: see `try_inc`.
        if s.fetch_add(1, Ordering::Relaxed) >= BATCH {
            let v = s.swap(0, Ordering::Relaxed);
            self.total.fetch_sub(v, Ordering::Relaxed);
        }
    }

    /// The value: units granted less units reserved (exact when nothing
    /// runs concurrently).
    pub fn sum(&self) -> i64 {
        // Relaxed: see `try_inc`.
        self.total.load(Ordering::Relaxed)
            - self
                .slots
                .iter()
                .map(|s| s.load(Ordering::Relaxed))
                .sum::<i64>()
    }
}

/// Unique numbers from `first` up, handed out in per-shard batches.
pub(crate) struct InoAllocator {
    /// The next batch's index (batch k = numbers `k*INO_BATCH ..`).
    next_batch: CachePadded<AtomicU64>,
    /// Each shard's next number; 0 or a multiple of `INO_BATCH` means its
    /// batch is used up.
    slots: Box<[CachePadded<AtomicU64>]>,
    /// Numbers below this are never handed out (batch 0 starts here).
    first: u64,
}

impl std::fmt::Debug for InoAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InoAllocator").finish_non_exhaustive()
    }
}

impl InoAllocator {
    /// Numbers from `first` (< `INO_BATCH`) up.
    pub(crate) fn new(first: u64) -> InoAllocator {
        assert!(first > 0 && first < INO_BATCH);
        InoAllocator {
            next_batch: CachePadded::new(AtomicU64::new(0)),
            slots: slots(),
            first,
        }
    }

    /// A number never returned before by this allocator.
    pub(crate) fn next(&self) -> u64 {
        self.next_from_batch(0)
    }

    /// A number never returned before, from batch `min_batch` or a later
    /// one (this thread's batch is given up if it is older): with
    /// `min_batch` from [`bound_batch`](Self::bound_batch), the number is
    /// at or above that bound (memfs's directory cookies after a listing
    /// started, `readdir_end`).
    pub(crate) fn next_from_batch(&self, min_batch: u64) -> u64 {
        self.next_from_batch_on(thread_index(), min_batch)
    }

    /// `next_from_batch` from shard `shard` (modulo the shard count):
    /// threads whose indexes agree modulo it share a shard.
    pub(crate) fn next_from_batch_on(&self, shard: usize, min_batch: u64) -> u64 {
        let s = &self.slots[shard & (self.slots.len() - 1)];
        // Uniqueness comes from each RMW's atomicity. The bound
        // (`bound_batch`) needs more: a number handed out must be below
        // the bound read by any call that happens after the hand-out, so
        // the batch's `next_batch` RMW must happen before the hand-out,
        // though another thread sharing the shard may have done it. Hence
        // the refill publishes the batch with Release and a hand-out reads
        // the shard with Acquire (the shard's RMWs extend the release
        // sequence, so every later taker synchronises with the refiller).
        // A fresh batch is at or above `min_batch` when the `bound_batch`
        // load that produced it happened before this call: the RMW on
        // `next_batch` then reads that value or a later one (read-write
        // coherence).
        let mut v = s.load(Ordering::Acquire);
        loop {
            if !v.is_multiple_of(INO_BATCH) && v / INO_BATCH >= min_batch {
                match s.compare_exchange_weak(v, v + 1, Ordering::Acquire, Ordering::Acquire) {
                    Ok(_) => return v,
                    Err(now) => v = now,
                }
                continue;
            }
            // Used up (or never filled): a fresh batch, all ours. Relaxed:
            // ordered before the hand-outs by the Release below.
            let k = self.next_batch.fetch_add(1, Ordering::Relaxed);
            let base = k.checked_mul(INO_BATCH).expect("inode numbers exhausted");
            let start = if k == 0 { self.first } else { base };
            // Keep the rest of it in the slot unless another thread sharing
            // the slot refilled it meanwhile (then the rest is skipped:
            // still unique). Release: see above.
            let _ = s.compare_exchange(v, start + 1, Ordering::Release, Ordering::Relaxed);
            return start;
        }
    }

    /// The batch index above every number returned so far (a number whose
    /// hand-out happened before this call is below `bound_batch() *
    /// INO_BATCH`: its batch's RMW happened before it, see
    /// `next_from_batch_on`, and this load reads that RMW or a later one).
    pub(crate) fn bound_batch(&self) -> u64 {
        // Relaxed: see above.
        self.next_batch.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    #[test]
    fn sharded_counter_sums_every_thread() {
        let c = Arc::new(ShardedCounter::default());
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.add(1);
                    }
                    for _ in 0..(100 * i) {
                        c.add(-1);
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(c.sum(), 4000 - 600);
        assert!(c.approx().abs_diff(3400) <= c.slack());
        assert!(c.above(3399) && !c.above(3400));
    }

    #[test]
    fn split_count_sums_across_threads() {
        let c = Arc::new(SplitCount::default());
        c.add(3);
        // Taken on one thread, dropped on another: the sum stays exact.
        let c2 = c.clone();
        std::thread::spawn(move || c2.add(-1)).join().unwrap();
        assert_eq!(c.sum(), 2);
        c.add(-2);
        assert_eq!(c.sum(), 0);
    }

    #[test]
    fn limited_counter_never_passes_the_limit() {
        let c = Arc::new(LimitedCounter::default());
        let limit = 5 * BATCH as u64 + 7;
        // Threads race for the units: never more than the limit granted.
        let granted: u64 = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || (0..limit).filter(|_| c.try_inc(limit)).count() as u64)
            })
            .map(|h| h.join().unwrap())
            .sum();
        assert!(granted <= limit, "{granted} > {limit}");
        assert_eq!(c.sum(), granted as i64);
        // Alone, a thread gets exactly the rest (the others' reservations
        // included), and not one more.
        let mut more = 0;
        while c.try_inc(limit) {
            more += 1;
            assert!(more <= limit);
        }
        assert_eq!(granted + more, limit);
        assert_eq!(c.sum(), limit as i64);
        // Decrements on another thread (kept there as reservations) make
        // room again, exactly.
        let c2 = c.clone();
        std::thread::spawn(move || {
            c2.dec();
            c2.dec();
        })
        .join()
        .unwrap();
        assert_eq!(c.sum(), limit as i64 - 2);
        assert!(c.try_inc(limit));
        assert!(c.try_inc(limit));
        assert!(!c.try_inc(limit));
        assert_eq!(c.sum(), limit as i64);
    }

    /// ext4's block counter: blocks taken since mount, below 0 after
    /// frees; the limit for a non-root caller is what was free at mount
    /// less the reserve, below 0 when the filesystem was mounted inside
    /// its reserve (review, stop 49: the limit was saturated to 0, so such
    /// a caller could take every block root had freed, though the free
    /// space stayed inside the reserve).
    #[test]
    fn limited_counter_takes_a_limit_below_zero() {
        let c = LimitedCounter::default();
        for _ in 0..100 {
            c.dec();
        }
        // Mounted with 500 free and a reserve of 1000: limit -500. Root
        // freed 100 (count -100): still 400 inside the reserve.
        assert!(!c.try_inc_signed(-500));
        // A reserve of 550 (limit -50): 50 may be taken, no more.
        let taken = (0..100).filter(|_| c.try_inc_signed(-50)).count();
        assert_eq!(taken, 50);
        assert_eq!(c.sum(), -50);
    }

    #[test]
    fn limited_counter_keeps_each_callers_limit() {
        // A call with a higher limit reserves a batch in this thread's
        // slot; a call with a lower limit must not spend it past its own.
        let c = LimitedCounter::default();
        let low = 3u64;
        let high = 10 * BATCH as u64;
        for _ in 0..low {
            assert!(c.try_inc(high));
        }
        assert!(
            !c.try_inc(low),
            "spent a unit reserved under the higher limit"
        );
        assert_eq!(c.sum(), low as i64);
        // Below the low limit again, both may count.
        c.dec();
        assert!(c.try_inc(low));
        assert!(!c.try_inc(low));
        assert!(c.try_inc(high));
        assert_eq!(c.sum(), low as i64 + 1);
    }

    #[test]
    fn ino_allocator_numbers_are_unique() {
        let a = Arc::new(InoAllocator::new(2));
        let mut all = HashSet::new();
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let a = a.clone();
                std::thread::spawn(move || (0..3000).map(|_| a.next()).collect::<Vec<_>>())
            })
            .collect();
        for h in hs {
            for n in h.join().unwrap() {
                assert!(n >= 2, "{n}");
                assert!(all.insert(n), "{n} twice");
            }
        }
        assert_eq!(all.len(), 12000);
    }
}
