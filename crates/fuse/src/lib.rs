//! FUSE front end for scalevfs: serves a [`scalevfs::Vfs`] to every program
//! on the machine. This crate is the only one that knows FUSE.
//!
//! # Design
//!
//! The adapter keeps, per FUSE node id, a counted [`nodes::Node`] that owns
//! a core handle ([`scalevfs::Handle`]: a counted mount + dentry reference,
//! what an `O_PATH` fd holds, without an fd table). Name operations become
//! `*at(&parent_handle, name)` (every `*at` call of the core takes an fd or
//! a handle, through the same resolution code); inode operations use the
//! node's handle with `AT_EMPTY_PATH`, `fstat`, `fchmod`, ...,
//! [`scalevfs::Task::reopen`] (open the file a handle names) and
//! [`scalevfs::Task::link_fd`]. Files the kernel opens are fds in one fd
//! table shared by every request ("the daemon's process").
//!
//! Node ids are the filesystem's inode numbers (fuser reports `attr.ino` as
//! the node id), so `st_ino` seen through the mount is the core's; the root
//! is node 1. The table is sharded (`nodes.rs`); a lookup of a known inode
//! takes one shard read lock and bumps the node's own lookup count.
//!
//! Each request runs on a per-thread [`scalevfs::Task`] that shares the fd
//! table and carries the caller's credentials (uid, gid from the request,
//! supplementary groups from `/proc/<pid>/status` for non-root callers), so
//! every permission check is the core's, with or without
//! `default_permissions`. New inodes get the caller's uid/gid (setgid
//! directories are the core's business).
//!
//! Changes made through the library by the embedding program's own tasks
//! are reported by the core to a listener [`spawn_mount`] registers, which
//! invalidates the kernel's entries and attributes (`mount.rs`); the
//! adapter's tasks are quiet, so no request notifies the kernel.
//!
//! The kernel caches attributes, names and misses for 60 s by default and
//! keeps page caches across opens (`FuseConfig`, `docs/fuse-compat.md`
//! "Caching"): every change reaches it through a reply or an invalidation,
//! so the timeouts are a backstop. Write-only opens are direct
//! (`FuseConfig::direct_write_only`). The requests served are counted per
//! operation (`stats.rs`; `FuseMount::request_counts`, `scalevfs mount
//! --stats`): what a workload costs in round trips.
//!
//! Two ways to serve: [`spawn_mount`] (request threads in the background, a
//! [`FuseMount`] that unmounts on drop; for programs and tests) and
//! [`mount`] + [`Mounted::serve`] (serve on the caller's thread until
//! unmounted; the `scalevfs mount` command in `crates/cli/src/mount.rs`,
//! which adds option parsing, detaching from the terminal and signals).
//!
//! # Lock order (adapter)
//! A node-table shard lock is never held across a core call, except that
//! `forget` may drop the last `Arc<Node>` (which releases its handle: a
//! dentry reference, core locks) after releasing the shard lock. The shard
//! locks are `ordered` locks of class `FuseNodes` (the innermost row of the
//! lock-order table in `docs/design.md`).
#![warn(missing_debug_implementations)]

mod attr;
mod creds;
pub mod mount;
mod nodes;
mod ops;
mod stats;

pub use mount::{
    check_config, default_threads, mount, spawn_mount, FuseMount, Invalidator, MountConfig,
    Mounted, RequestCounts, Unmounter,
};
pub use ops::{FuseConfig, ScaleFs, DEFAULT_TIMEOUT};
pub use stats::format_counts;
