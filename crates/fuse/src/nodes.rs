//! The node table: FUSE node id -> counted core handle ([`scalevfs::Handle`]).
//!
//! LOCKING RULES
//! - Each shard is a reader-writer lock (`ordered::RwLock`, class
//!   `FuseNodes`, level 37 of the lock-order table: inner to every VFS and
//!   ext4 class; only the leaves `Spares`, `Ext4DeviceChunk`, `FuseDevs` and
//!   `Ext4MemDevice` come after it) over a hash map. Nothing is taken under
//!   it: no core call is made and no handle dropped while a shard is held.
//!   Lookups of a known node (and every inode operation fetching its node)
//!   take the shard's read lock; inserting a node and `forget` take the
//!   write lock.
//! - `Node::nlookup` counts the kernel's references (FUSE lookup count). It
//!   is incremented under the shard's read lock and decremented under its
//!   write lock, so a node whose count reached zero (and was removed under
//!   the write lock) can never be revived.
//! - Forgotten nodes: when the kernel drops a node, the shard keeps a weak
//!   reference to its inode (`Shard::gone`, at most `GONE_PER_SHARD` per
//!   shard, oldest out first), so that a file handle the kernel decodes
//!   later (open_by_handle_at after its inode was evicted: a LOOKUP of "."
//!   on the node id) finds the inode while something keeps it alive (a
//!   name). A weak reference keeps no data: only the inode's allocation
//!   until its entry goes. Past that, the adapter asks the filesystem for
//!   the inode by number (`Shared::decode` in `ops.rs`).
//! - No shard lock is held across a core call: the last `Arc<Node>` may be
//!   dropped by whoever holds it last, which releases the node's handle (a
//!   dentry reference and the mount's busy count) outside every shard.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_utils::CachePadded;
use scalevfs::inode::Inode;
use scalevfs::Handle;
use scalevfs_sync::ordered::{Class, RwLock};

const SHARDS: usize = 64;
/// Forgotten inodes remembered per shard (16,384 in all).
const GONE_PER_SHARD: usize = 256;

/// What the adapter holds for one node id the kernel knows.
#[derive(Debug)]
pub(crate) struct Node {
    /// The file: every call on the node is relative to it.
    pub(crate) h: Handle,
    nlookup: AtomicU64,
}

/// One shard: the nodes the kernel knows, and weak references to the
/// inodes of nodes it forgot (with their order, oldest first).
#[derive(Debug, Default)]
struct Maps {
    live: HashMap<u64, Arc<Node>>,
    gone: HashMap<u64, Weak<Inode>>,
    gone_order: VecDeque<u64>,
}

type Shard = CachePadded<RwLock<Maps>>;

#[derive(Debug)]
pub(crate) struct NodeTable {
    shards: Box<[Shard]>,
}

impl NodeTable {
    pub(crate) fn new() -> NodeTable {
        NodeTable {
            shards: (0..SHARDS)
                .map(|_| CachePadded::new(RwLock::new(Class::FuseNodes, Maps::default())))
                .collect(),
        }
    }

    fn shard(&self, id: u64) -> &RwLock<Maps> {
        // Fibonacci hashing: consecutive inode numbers spread over shards.
        let h = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.shards[h as usize % SHARDS]
    }

    /// The node `id`, without changing its lookup count.
    pub(crate) fn get(&self, id: u64) -> Option<Arc<Node>> {
        self.shard(id).read().live.get(&id).cloned()
    }

    /// The inode of node `id` if the kernel forgot the node and the inode
    /// is still alive.
    pub(crate) fn forgotten(&self, id: u64) -> Option<Arc<Inode>> {
        self.shard(id).read().gone.get(&id).and_then(Weak::upgrade)
    }

    /// Whether the kernel currently knows node `id`.
    pub(crate) fn contains(&self, id: u64) -> bool {
        self.shard(id).read().live.contains_key(&id)
    }

    /// Count one more kernel reference on an existing node; its inode's
    /// generation, or `None` if the kernel does not know `id`.
    pub(crate) fn lookup_existing(&self, id: u64) -> Option<u32> {
        let s = self.shard(id).read();
        let n = s.live.get(&id)?;
        // Relaxed: a counter; removal is decided under the write lock.
        n.nlookup.fetch_add(1, Ordering::Relaxed);
        Some(n.h.inode().generation())
    }

    /// Insert a node for `id` holding `h` with `nlookup` kernel references,
    /// or count them on the node already there. Returns `h` when it was not
    /// taken, for the caller to drop (outside the shard lock).
    #[must_use]
    pub(crate) fn insert_or_ref(&self, id: u64, h: Handle, nlookup: u64) -> Option<Handle> {
        let mut s = self.shard(id).write();
        if let Some(n) = s.live.get(&id) {
            // Relaxed: as in lookup_existing.
            n.nlookup.fetch_add(nlookup, Ordering::Relaxed);
            return Some(h);
        }
        // Known again: its weak entry is dropped (its place in
        // `gone_order` is skipped when it comes up).
        s.gone.remove(&id);
        s.live.insert(
            id,
            Arc::new(Node {
                h,
                nlookup: AtomicU64::new(nlookup),
            }),
        );
        None
    }

    /// Drop `n` kernel references; the node goes when none are left.
    pub(crate) fn forget(&self, id: u64, n: u64) {
        let dead = {
            let mut s = self.shard(id).write();
            let Some(node) = s.live.get(&id) else { return };
            // Relaxed: under the write lock no increment can race.
            let old = node.nlookup.load(Ordering::Relaxed);
            if old > n {
                node.nlookup.store(old - n, Ordering::Relaxed);
                None
            } else {
                let dead = s.live.remove(&id);
                if let Some(d) = &dead {
                    let w = Arc::downgrade(d.h.inode());
                    s.gone.insert(id, w);
                    s.gone_order.push_back(id);
                    // Bounded: the oldest weak entries go past the cap
                    // (an id revived meanwhile has none: its queue entry
                    // is skipped), and stale queue entries are dropped
                    // before the queue passes twice the cap.
                    let Maps {
                        gone, gone_order, ..
                    } = &mut *s;
                    while gone.len() > GONE_PER_SHARD {
                        let Some(old) = gone_order.pop_front() else {
                            break;
                        };
                        gone.remove(&old);
                    }
                    if gone_order.len() > 2 * GONE_PER_SHARD {
                        gone_order.retain(|i| gone.contains_key(i));
                    }
                }
                dead
            }
        };
        // The handle is released (core locks) after the shard lock is.
        drop(dead);
    }

    /// Number of live nodes (tests and statistics).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().live.len()).sum()
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
    use scalevfs::{Vfs, AT_FDCWD};

    #[test]
    fn counts_and_forget() {
        let vfs = Vfs::new();
        let t = vfs.root_task();
        t.mkdir("/m", 0o755).unwrap();
        t.mount("/m", vfs.new_memfs(Default::default()), false)
            .unwrap();
        let nodes = NodeTable::new();
        let h = t.handle_at(AT_FDCWD, "/m", 0).unwrap();
        assert!(nodes.insert_or_ref(7, h, 1).is_none());
        assert!(nodes.lookup_existing(7).is_some());
        let h2 = t.handle_at(AT_FDCWD, "/m", 0).unwrap();
        let back = nodes.insert_or_ref(7, h2, 1);
        assert!(back.is_some());
        drop(back);
        assert_eq!(nodes.nlookup(7), Some(3));
        nodes.forget(7, 2);
        assert_eq!(nodes.nlookup(7), Some(1));
        // The node's handle keeps the mount busy...
        assert_eq!(t.umount("/m").unwrap_err(), scalevfs::Errno::EBUSY);
        nodes.forget(7, 1);
        assert!(!nodes.contains(7));
        // ...and was released with it.
        t.umount("/m").unwrap();
        // Forgetting an unknown node is harmless.
        nodes.forget(9, 1);
        assert_eq!(nodes.len(), 0);
    }
}
