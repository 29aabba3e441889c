//! The node table: FUSE node id -> counted handle on a core file.
//!
//! LOCKING RULES
//! - Each shard is a reader-writer lock over a hash map. Lookups of a known
//!   node (and every inode operation fetching its node) take the shard's
//!   read lock; inserting a node and `forget` take the write lock.
//! - `Node::nlookup` counts the kernel's references (FUSE lookup count). It
//!   is incremented under the shard's read lock and decremented under its
//!   write lock, so a node whose count reached zero (and was removed under
//!   the write lock) can never be revived.
//! - No shard lock is held across a core call: the last `Arc<Node>` may be
//!   dropped by whoever holds it last, which closes the node's fd.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crossbeam_utils::CachePadded;
use scalevfs::Task;

const SHARDS: usize = 64;

/// What the adapter holds for one node id the kernel knows.
#[derive(Debug)]
pub(crate) struct Node {
    /// An O_PATH fd (or a dup of an open fd) in the shared fd table.
    pub(crate) fd: i32,
    nlookup: AtomicU64,
    /// Closes `fd` when the node dies.
    closer: Arc<Task>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.closer.close(self.fd);
    }
}

type Shard = CachePadded<RwLock<HashMap<u64, Arc<Node>>>>;

#[derive(Debug)]
pub(crate) struct NodeTable {
    shards: Box<[Shard]>,
}

impl NodeTable {
    pub(crate) fn new() -> NodeTable {
        NodeTable {
            shards: (0..SHARDS)
                .map(|_| CachePadded::new(RwLock::new(HashMap::new())))
                .collect(),
        }
    }

    fn shard(&self, id: u64) -> &RwLock<HashMap<u64, Arc<Node>>> {
        // Fibonacci hashing: consecutive inode numbers spread over shards.
        let h = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.shards[h as usize % SHARDS]
    }

    /// The node `id`, without changing its lookup count.
    pub(crate) fn get(&self, id: u64) -> Option<Arc<Node>> {
        let s = self.shard(id).read().unwrap_or_else(|e| e.into_inner());
        s.get(&id).cloned()
    }

    /// Whether the kernel currently knows node `id`.
    pub(crate) fn contains(&self, id: u64) -> bool {
        let s = self.shard(id).read().unwrap_or_else(|e| e.into_inner());
        s.contains_key(&id)
    }

    /// Count one more kernel reference on an existing node.
    pub(crate) fn lookup_existing(&self, id: u64) -> bool {
        let s = self.shard(id).read().unwrap_or_else(|e| e.into_inner());
        match s.get(&id) {
            Some(n) => {
                // Relaxed: a counter; removal is decided under the write lock.
                n.nlookup.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Insert a node for `id` holding `fd` with one kernel reference, or
    /// count a reference on the node already there. Returns whether `fd` was
    /// taken; if not, the caller still owns it.
    pub(crate) fn insert_or_ref(&self, id: u64, fd: i32, closer: &Arc<Task>, nlookup: u64) -> bool {
        let mut s = self.shard(id).write().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = s.get(&id) {
            // Relaxed: as in lookup_existing.
            n.nlookup.fetch_add(nlookup, Ordering::Relaxed);
            return false;
        }
        s.insert(
            id,
            Arc::new(Node {
                fd,
                nlookup: AtomicU64::new(nlookup),
                closer: closer.clone(),
            }),
        );
        true
    }

    /// Drop `n` kernel references; the node goes when none are left.
    pub(crate) fn forget(&self, id: u64, n: u64) {
        let dead = {
            let mut s = self.shard(id).write().unwrap_or_else(|e| e.into_inner());
            let Some(node) = s.get(&id) else { return };
            // Relaxed: under the write lock no increment can race.
            let old = node.nlookup.load(Ordering::Relaxed);
            if old > n {
                node.nlookup.store(old - n, Ordering::Relaxed);
                None
            } else {
                s.remove(&id)
            }
        };
        // The fd is closed (core lock) after the shard lock is released.
        drop(dead);
    }

    /// Number of live nodes (tests and statistics).
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    /// The lookup count of `id` (tests).
    #[cfg(test)]
    pub(crate) fn nlookup(&self, id: u64) -> Option<u64> {
        self.get(id).map(|n| n.nlookup.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scalevfs::{Vfs, O_PATH, O_RDONLY};

    #[test]
    fn counts_and_forget() {
        let vfs = Vfs::new();
        let t = Arc::new(vfs.root_task());
        let nodes = NodeTable::new();
        let fd = t
            .openat(scalevfs::AT_FDCWD, "/", O_PATH | O_RDONLY, 0)
            .unwrap();
        assert!(nodes.insert_or_ref(7, fd, &t, 1));
        assert!(nodes.lookup_existing(7));
        let fd2 = t.openat(scalevfs::AT_FDCWD, "/", O_PATH, 0).unwrap();
        assert!(!nodes.insert_or_ref(7, fd2, &t, 1));
        t.close(fd2).unwrap();
        assert_eq!(nodes.nlookup(7), Some(3));
        nodes.forget(7, 2);
        assert_eq!(nodes.nlookup(7), Some(1));
        nodes.forget(7, 1);
        assert!(!nodes.contains(7));
        // The node's fd was closed with it.
        assert!(t.fstat(fd).is_err());
        // Forgetting an unknown node is harmless.
        nodes.forget(9, 1);
        assert_eq!(nodes.len(), 0);
    }
}
