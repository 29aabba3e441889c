//! Requests served, by operation: how many round trips a workload costs
//! through the mount (`scalevfs mount --stats` prints them at unmount,
//! [`crate::FuseMount::request_counts`] returns them to tests).
//!
//! Counting must not become the shared line every request writes, so the
//! counters are spread over `SLOTS` cache-padded rows; a request thread
//! counts in the row of its thread number (`scalevfs_sync::thread_number`),
//! so request threads (at most 16) normally have a row each. Rows may be
//! shared (more threads than rows), so a count is an atomic add, not a
//! plain store. No lock anywhere.
//!
//! Counted where the adapter implements the operation: a request fuser
//! answers itself (FLUSH: ENOSYS, after which the kernel sends none;
//! INTERRUPT, DESTROY) is not counted. FORGET counts nodes, so a
//! BATCH_FORGET of 10 nodes counts 10; FSYNCDIR counts as FSYNC.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// Operations counted, in report order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Op {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Create,
    Read,
    Write,
    CopyFileRange,
    Release,
    Fsync,
    Opendir,
    Readdir,
    Readdirplus,
    Releasedir,
    Statfs,
    Access,
    Fallocate,
    Ioctl,
    Lseek,
    Getxattr,
    Setxattr,
    Listxattr,
    Removexattr,
}

/// Names as the kernel's `FUSE_*` opcodes, without the prefix, lower case.
const NAMES: [&str; OPS] = [
    "lookup",
    "forget",
    "getattr",
    "setattr",
    "readlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "rename",
    "link",
    "open",
    "create",
    "read",
    "write",
    "copy_file_range",
    "release",
    "fsync",
    "opendir",
    "readdir",
    "readdirplus",
    "releasedir",
    "statfs",
    "access",
    "fallocate",
    "ioctl",
    "lseek",
    "getxattr",
    "setxattr",
    "listxattr",
    "removexattr",
];

const OPS: usize = Op::Removexattr as usize + 1;
const SLOTS: usize = 32;

/// Per-operation request counters of one adapter.
#[derive(Debug)]
pub(crate) struct RequestStats {
    rows: Box<[CachePadded<[AtomicU64; OPS]>]>,
}

impl RequestStats {
    pub(crate) fn new() -> RequestStats {
        RequestStats {
            rows: (0..SLOTS)
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    /// Count `n` requests of `op` (FORGET counts nodes).
    #[inline]
    pub(crate) fn count(&self, op: Op, n: u64) {
        let row = &self.rows[scalevfs_sync::thread_number() % SLOTS];
        // Relaxed: a statistic; nothing is published through it, and
        // readers sum whatever each row holds when they look.
        row[op as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Requests served so far, by operation (operations never seen left
    /// out), in the order of the `Op` enum.
    pub(crate) fn snapshot(&self) -> Vec<(&'static str, u64)> {
        (0..OPS)
            .filter_map(|i| {
                // Relaxed: see `count`.
                let n: u64 = self.rows.iter().map(|r| r[i].load(Ordering::Relaxed)).sum();
                (n > 0).then_some((NAMES[i], n))
            })
            .collect()
    }
}

/// A snapshot as one line: `lookup 20200, create 20000, ...`.
pub fn format_counts(counts: &[(&'static str, u64)]) -> String {
    let total: u64 = counts.iter().map(|c| c.1).sum();
    let mut s = format!("{total} requests");
    for (name, n) in counts {
        s.push_str(&format!(", {name} {n}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_over_threads() {
        let s = RequestStats::new();
        std::thread::scope(|sc| {
            for _ in 0..40 {
                sc.spawn(|| {
                    for _ in 0..100 {
                        s.count(Op::Lookup, 1);
                    }
                    s.count(Op::Forget, 3);
                });
            }
        });
        assert_eq!(s.snapshot(), vec![("lookup", 4000), ("forget", 120)]);
        assert_eq!(NAMES[Op::Removexattr as usize], "removexattr");
        assert!(format_counts(&s.snapshot()).starts_with("4120 requests, lookup 4000"));
    }
}
