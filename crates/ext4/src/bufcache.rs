//! The metadata buffer cache of a read-write mount: bitmaps, inode table
//! blocks, descriptor blocks, extent and directory blocks. Bounded in
//! memory, write-back: a modified block stays dirty in the cache until
//! [`BufCache::flush`] (fsync, sync, unmount) or until the shard grows past
//! its bound, when the oldest blocks are written back and dropped.
//!
//! DESIGN
//! - `SHARDS` shards by block number, each its own lock
//!   (`Class::Ext4Buf`), so threads working in different groups do not
//!   share a lock. A caller holds one shard lock at a time.
//! - Blocks are copied in and out (`read`) or changed in place under the
//!   shard lock (`modify`): no reference to a cached block escapes, so
//!   eviction never races a user.
//! - A block freed by the allocator is `forget`-ed: its cached copy (dirty
//!   or not) must not be written over the data a later owner puts there.

use std::collections::hash_map::{Entry, HashMap};
use std::io;

use scalevfs_sync::ordered::{Class, Mutex};

use crate::device::BlockDevice;

const SHARDS: usize = 16;

struct Buf {
    data: Box<[u8]>,
    dirty: bool,
    /// Last use, for eviction (the shard's own clock).
    stamp: u64,
}

#[derive(Default)]
struct Shard {
    map: HashMap<u64, Buf>,
    clock: u64,
}

/// The cache (see the module comment).
pub struct BufCache {
    bs: usize,
    cap_per_shard: usize,
    shards: Vec<Mutex<Shard>>,
}

impl std::fmt::Debug for BufCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufCache")
            .field("bs", &self.bs)
            .field("cap_per_shard", &self.cap_per_shard)
            .finish()
    }
}

impl BufCache {
    /// A cache of at most about `cap_blocks` blocks of `bs` bytes.
    pub fn new(bs: usize, cap_blocks: usize) -> BufCache {
        BufCache {
            bs,
            cap_per_shard: (cap_blocks / SHARDS).max(4),
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Class::Ext4Buf, Shard::default()))
                .collect(),
        }
    }

    fn shard(&self, blk: u64) -> &Mutex<Shard> {
        &self.shards[(blk % SHARDS as u64) as usize]
    }

    /// Copy block `blk` into `out` (one block): the cached copy if there is
    /// one, else the device's (not cached: data reads pass by).
    pub fn read(&self, dev: &dyn BlockDevice, blk: u64, out: &mut [u8]) -> io::Result<()> {
        let mut s = self.shard(blk).lock();
        if let Some(b) = s.map.get(&blk) {
            out.copy_from_slice(&b.data);
            return Ok(());
        }
        drop(s);
        dev.read_at(blk * self.bs as u64, out)?;
        // A writer may have cached (and changed) it meanwhile: prefer that.
        s = self.shard(blk).lock();
        if let Some(b) = s.map.get(&blk) {
            out.copy_from_slice(&b.data);
        }
        Ok(())
    }

    /// Run `f` on block `blk` in the cache and mark it dirty. With `load`
    /// the block is read from the device if absent; without, an absent
    /// block starts zeroed (a block the caller is about to fill whole).
    pub fn modify<R>(
        &self,
        dev: &dyn BlockDevice,
        blk: u64,
        load: bool,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> io::Result<R> {
        let mut s = self.shard(blk).lock();
        s.clock += 1;
        let now = s.clock;
        let b = match s.map.entry(blk) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                let mut data = vec![0u8; self.bs].into_boxed_slice();
                if load {
                    dev.read_at(blk * self.bs as u64, &mut data)?;
                }
                v.insert(Buf {
                    data,
                    dirty: false,
                    stamp: now,
                })
            }
        };
        b.stamp = now;
        b.dirty = true;
        let r = f(&mut b.data);
        if s.map.len() > self.cap_per_shard {
            self.shrink(dev, &mut s)?;
        }
        Ok(r)
    }

    /// Write back and drop the older half of an over-full shard.
    fn shrink(&self, dev: &dyn BlockDevice, s: &mut Shard) -> io::Result<()> {
        let mut by_age: Vec<(u64, u64)> = s.map.iter().map(|(&k, b)| (b.stamp, k)).collect();
        by_age.sort_unstable();
        let drop_n = by_age.len() - self.cap_per_shard / 2;
        for &(_, blk) in &by_age[..drop_n] {
            if let Some(b) = s.map.get(&blk) {
                if b.dirty {
                    dev.write_at(blk * self.bs as u64, &b.data)?;
                }
            }
            s.map.remove(&blk);
        }
        Ok(())
    }

    /// Drop block `blk` without writing it (it was freed).
    pub fn forget(&self, blk: u64) {
        self.shard(blk).lock().map.remove(&blk);
    }

    /// Write every dirty block to the device (not flushed: the caller
    /// flushes the device once after its own writes).
    pub fn write_back(&self, dev: &dyn BlockDevice) -> io::Result<()> {
        for sh in &self.shards {
            let mut s = sh.lock();
            let mut dirty: Vec<u64> = s
                .map
                .iter()
                .filter(|(_, b)| b.dirty)
                .map(|(&k, _)| k)
                .collect();
            dirty.sort_unstable();
            for blk in dirty {
                let b = s.map.get_mut(&blk).expect("listed above");
                dev.write_at(blk * self.bs as u64, &b.data)?;
                b.dirty = false;
            }
        }
        Ok(())
    }

    /// Blocks now cached (all shards).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
