//! The caches of shareable xattr storage by hash (the kernel's two
//! mbcaches): our xattr blocks by header hash, and our value inodes
//! (`ea_inode`) by value hash, where a block about to be written or a
//! value about to get an inode may find an identical one to share. Only
//! the map; the sharing protocols (what goes in, when an entry must go,
//! what is done under a shard) are in `xattr_write.rs`, "Sharing", and
//! `ea_inode.rs`, POLICY. Lock: `Class::Ext4XattrCache`, one per shard;
//! never one cache's shard under the other's.

use std::collections::HashMap;

use crossbeam_utils::CachePadded;
use scalevfs_sync::ordered::{Class, Mutex as OMutex};

/// Hash -> block or inode numbers (newest last).
pub(crate) type ByHash = HashMap<u32, Vec<u64>>;

const CACHE_SHARDS: usize = 16;
/// Numbers remembered per hash (the newest), and hashes per shard
/// (past it the shard starts over: a cache, losing only chances to share).
const PER_HASH: usize = 4;
const PER_SHARD: usize = 4096;

/// Block or inode numbers by hash: where an identical copy may be found
/// to share (`xattr_write.rs`, "Sharing"; `ea_inode.rs`, POLICY).
pub(crate) struct XattrBlockCache {
    shards: Vec<CachePadded<OMutex<ByHash>>>,
}

impl XattrBlockCache {
    pub(crate) fn new() -> XattrBlockCache {
        XattrBlockCache {
            shards: (0..CACHE_SHARDS)
                .map(|_| CachePadded::new(OMutex::new(Class::Ext4XattrCache, HashMap::new())))
                .collect(),
        }
    }

    pub(crate) fn shard(&self, hash: u32) -> &OMutex<ByHash> {
        &self.shards[hash as usize % CACHE_SHARDS]
    }

    pub(crate) fn insert(&self, hash: u32, blk: u64) {
        let mut m = self.shard(hash).lock();
        if m.len() >= PER_SHARD && !m.contains_key(&hash) {
            m.clear();
        }
        let v = m.entry(hash).or_default();
        if !v.contains(&blk) {
            if v.len() >= PER_HASH {
                v.remove(0);
            }
            v.push(blk);
        }
    }

    pub(crate) fn remove(&self, hash: u32, blk: u64) {
        let mut m = self.shard(hash).lock();
        if let Some(v) = m.get_mut(&hash) {
            v.retain(|&b| b != blk);
            if v.is_empty() {
                m.remove(&hash);
            }
        }
    }
}
