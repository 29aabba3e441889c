//! Superblocks: one mounted filesystem instance, what every dentry of it
//! points to (Linux's `d_sb`).
//!
//! Below the dentry cache: the dcache names `Super`, and `Super` names no
//! dcache type, only the counters a freed dentry decrements.

use std::sync::Arc;

use scalevfs_sync::ordered::Mutex;

use crate::fstype::Filesystem;
use crate::percpu::ShardedCounter;

/// The dentry cache's entry counts (per-thread counters) and spare parent
/// references, shared by the `Dcache` and every `Super` so that a dentry
/// freed after a grace period can be counted out, and a dead child can give
/// its parent reference back, without naming the dcache.
#[derive(Debug, Default)]
pub struct DentryCounts {
    pub(crate) nr_dentry: ShardedCounter,
    pub(crate) nr_negative: ShardedCounter,
    /// The threads' spare references on this cache's dentries, for their
    /// children (dcache.rs, PARENT REFERENCES).
    pub(crate) spares: crate::spares::Table,
}

/// One mounted filesystem instance.
pub struct Super {
    pub fs: Arc<dyn Filesystem>,
    pub dev: u64,
    /// The dentry counters of the `Vfs`'s dcache, for a dentry freed
    /// through its superblock (`dcache::free_dentry`).
    pub(crate) dentries: Arc<DentryCounts>,
    pub(crate) rename_mutex: Mutex<()>,
    /// The in-memory orphan file (DESIGN 2.5; see `orphan.rs`).
    pub orphans: scalevfs_orphan::OrphanFile,
}

impl std::fmt::Debug for Super {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Super")
            .field("fs", &self.fs.name())
            .field("dev", &self.dev)
            .finish()
    }
}
