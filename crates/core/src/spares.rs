//! Per-thread spare references ("sloppy" references, after the sloppy
//! counters of Boyd-Wickizer et al., OSDI'10, which MOSBENCH used for the
//! dentry counts): the table behind the dcache's parent references
//! (issue 16).
//!
//! Every live dentry holds one counted reference on its parent. Taken and
//! dropped on the parent's LockRef, that is one write of one shared line per
//! create and per unlink in a directory, from every thread that creates or
//! unlinks there. Instead, a thread takes a batch of references on the
//! parent at once and keeps the ones it has not used yet in its shard of
//! this table; a new child takes one from there, and a dead child gives its
//! reference back there. The spares are real counts, so nothing changes
//! for the rules that read the count: a parent with spares outstanding is
//! "in use", as it is with children.
//!
//! This module is only the table, keyed by address. The protocol (when a
//! spare may be stored, when they are called back) is the dcache's, in
//! `dcache.rs` ("PARENT REFERENCES"). It needs from here:
//! - `stash` and `give` insert or grow an entry only if the caller's
//!   `valid` check, run under the shard lock, says yes. An unhasher checks
//!   the flag after unhashing, then `recall`s every shard, each under its
//!   lock: a thread whose check ran before that is found by the recall, and
//!   one whose check ran after sees the object unhashed.
//! - Nothing is taken under a shard lock and no reference is dropped
//!   there: every function returns what its caller must put back, and the
//!   caller does it after the lock is released. So the lock is a leaf
//!   (`Class::Spares`, level 38: inner to every VFS, ext4 and FUSE-node
//!   class) and may be taken under any of them; only the leaves
//!   `Ext4DeviceChunk`, `FuseDevs`, `Ext4MemDevice` and `FlockShard`
//!   (39-42) come after it, and nothing is taken under those.
//!
//! A shard belongs to the threads whose number (`percpu::shard_index`) maps
//! to it: one thread per shard up to twice the machine's parallelism, as the
//! per-thread counters. There is one table per dentry cache (in
//! `sb::DentryCounts`, which every dentry reaches through its superblock),
//! bounded (`WAYS` entries per shard); a full shard evicts an entry
//! round-robin and returns its spares. Entries outlive the thread that made
//! them (the next thread on the shard uses them) until they are evicted or
//! recalled, or the cache is torn down (`Dcache::shrink_all` drains it).

use crossbeam_utils::CachePadded;
use scalevfs_sync::lockstat::LockClass;
use scalevfs_sync::ordered::{Class, SpinLock};

use crate::percpu;

/// Spares taken from the shared count at once: one shared write per this
/// many children made in a directory by one thread.
pub(crate) const BATCH: u32 = 32;

/// At most this many spares per entry: a `give` past it returns `BATCH`
/// of them (a thread that only unlinks writes the shared count once per
/// `BATCH` unlinks).
pub(crate) const MAX: u32 = 2 * BATCH;

/// Entries per shard.
const WAYS: usize = 8;

/// An object's address, as the key of its entry.
pub(crate) type Key = *const ();

#[derive(Clone, Copy)]
struct Entry {
    /// The object; null for a free way.
    key: Key,
    spares: u32,
}

impl Default for Entry {
    fn default() -> Self {
        Entry {
            key: std::ptr::null(),
            spares: 0,
        }
    }
}

#[derive(Default)]
struct Shard {
    ways: [Entry; WAYS],
    /// The next way to evict when none is free.
    hand: usize,
}

// SAFETY: the table never dereferences a key: it compares them and hands
// them back to the dcache, which owns what they point to and what the
// spares mean (a shard moves between threads only behind its lock).
unsafe impl Send for Shard {}

impl Shard {
    fn find(&mut self, key: Key) -> Option<&mut Entry> {
        self.ways.iter_mut().find(|e| e.key == key)
    }

    /// A way for `key` (free, or evicted: its old entry is returned).
    fn insert(&mut self, key: Key, spares: u32) -> Option<(Key, u32)> {
        let new = Entry { key, spares };
        if let Some(e) = self.ways.iter_mut().find(|e| e.key.is_null()) {
            *e = new;
            return None;
        }
        let i = self.hand % WAYS;
        self.hand = self.hand.wrapping_add(1);
        let old = std::mem::replace(&mut self.ways[i], new);
        (old.spares != 0).then_some((old.key, old.spares))
    }
}

/// One cache's spares: a shard per thread shard.
pub(crate) struct Table {
    shards: Box<[CachePadded<SpinLock<Shard>>]>,
}

impl Default for Table {
    fn default() -> Self {
        Table::with_shards(percpu::shard_count())
    }
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("spares::Table")
            .field("shards", &self.shards.len())
            .finish()
    }
}

/// What a caller must put back on an object's count after the call.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum PutBack {
    /// Nothing.
    None,
    /// `n` references on the caller's own object.
    Own(u32),
    /// `n` references on another object, whose entry was evicted.
    Other(Key, u32),
}

impl Table {
    fn with_shards(n: usize) -> Table {
        debug_assert!(n.is_power_of_two());
        Table {
            shards: (0..n)
                .map(|_| {
                    CachePadded::new(SpinLock::new(
                        Class::Spares,
                        LockClass::Other,
                        Shard::default(),
                    ))
                })
                .collect(),
        }
    }

    fn mine(&self) -> &SpinLock<Shard> {
        &self.shards[percpu::shard_index() & (self.shards.len() - 1)]
    }

    /// Take one spare of `key` from this thread's shard. `false`: there was
    /// none; the caller takes a reference (or a batch) on the object itself.
    #[inline]
    pub(crate) fn take(&self, key: Key) -> bool {
        take_in(self.mine(), key)
    }

    /// Keep `n` references on `key`, which the caller holds, as spares of
    /// this thread's shard, if `valid()` (run under the shard lock) says so;
    /// otherwise they come back as `PutBack::Own(n)`.
    pub(crate) fn stash(&self, key: Key, n: u32, valid: impl FnOnce() -> bool) -> PutBack {
        stash_in(self.mine(), key, n, valid)
    }

    /// Give one reference on `key`, which the caller holds, back to this
    /// thread's shard. `None`: refused (no entry and `valid()` said no); the
    /// caller drops the reference itself. `Some(put_back)`: kept, and the
    /// caller puts back what it says.
    #[inline]
    pub(crate) fn give(&self, key: Key, valid: impl FnOnce() -> bool) -> Option<PutBack> {
        give_in(self.mine(), key, valid)
    }

    /// Take every shard's spares of `key` out of the table: the references
    /// the caller must now drop.
    pub(crate) fn recall(&self, key: Key) -> u32 {
        let mut n = 0u32;
        for s in self.shards.iter() {
            let mut s = s.lock();
            if let Some(e) = s.find(key) {
                n = n.saturating_add(e.spares);
                *e = Entry::default();
            }
        }
        n
    }

    /// Take out every entry (a sweep or a teardown): the references the
    /// caller must now drop, by key.
    pub(crate) fn drain(&self) -> Vec<(Key, u32)> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let mut s = s.lock();
            for e in s.ways.iter_mut() {
                if e.spares != 0 {
                    out.push((e.key, e.spares));
                }
                *e = Entry::default();
            }
        }
        out
    }
}

fn take_in(s: &SpinLock<Shard>, key: Key) -> bool {
    let mut s = s.lock();
    match s.find(key) {
        Some(e) if e.spares > 0 => {
            e.spares -= 1;
            true
        }
        _ => false,
    }
}

fn stash_in(s: &SpinLock<Shard>, key: Key, n: u32, valid: impl FnOnce() -> bool) -> PutBack {
    let mut s = s.lock();
    if !valid() {
        return PutBack::Own(n);
    }
    if let Some(e) = s.find(key) {
        e.spares += n;
        return PutBack::None;
    }
    match s.insert(key, n) {
        Some((k, m)) => PutBack::Other(k, m),
        None => PutBack::None,
    }
}

fn give_in(s: &SpinLock<Shard>, key: Key, valid: impl FnOnce() -> bool) -> Option<PutBack> {
    let mut s = s.lock();
    if !valid() {
        return None;
    }
    if let Some(e) = s.find(key) {
        e.spares += 1;
        if e.spares > MAX {
            e.spares -= BATCH;
            return Some(PutBack::Own(BATCH));
        }
        return Some(PutBack::None);
    }
    Some(match s.insert(key, 1) {
        Some((k, m)) => PutBack::Other(k, m),
        None => PutBack::None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's bookkeeping: spares taken are the ones stashed or given,
    /// a full entry returns a batch, eviction, recall and drain hand back
    /// exactly what was held.
    #[test]
    fn spares_are_conserved() {
        let t = Table::with_shards(2);
        let s = &*t.shards[0];
        // Objects to key by (never dereferenced).
        let objs = [0u8; 3 * WAYS];
        let key = |i: usize| &objs[i] as *const u8 as Key;
        let k = key(0);
        assert!(!take_in(s, k));
        assert_eq!(stash_in(s, k, 3, || false), PutBack::Own(3));
        assert_eq!(stash_in(s, k, 3, || true), PutBack::None);
        assert!(take_in(s, k) && take_in(s, k) && take_in(s, k));
        assert!(!take_in(s, k));
        assert_eq!(give_in(s, k, || false), None);
        let mut back = 0;
        for _ in 0..(MAX + 1) {
            match give_in(s, k, || true) {
                Some(PutBack::Own(n)) => back += n,
                Some(PutBack::None) => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(back, BATCH);
        // Another shard's entry for the same key is recalled too.
        assert_eq!(stash_in(&t.shards[1], k, 2, || true), PutBack::None);
        assert_eq!(t.recall(k), MAX + 1 - BATCH + 2);
        assert_eq!(t.recall(k), 0);
        // Filling the shard evicts entries with their spares.
        let mut evicted = 0;
        let keys: Vec<Key> = (1..=2 * WAYS).map(key).collect();
        for &key in &keys {
            match stash_in(s, key, 5, || true) {
                PutBack::Other(old, n) => {
                    assert!(keys.contains(&old) && old != key);
                    evicted += n;
                }
                PutBack::None => {}
                PutBack::Own(_) => panic!("refused"),
            }
        }
        assert_eq!(evicted, 5 * WAYS as u32);
        let left = t.drain();
        assert!(left.iter().all(|e| keys.contains(&e.0)));
        let left: u32 = left.iter().map(|e| e.1).sum();
        assert_eq!(evicted + left, 5 * keys.len() as u32);
        assert!(t.drain().is_empty());
    }
}
