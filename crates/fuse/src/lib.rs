//! FUSE front end for scalevfs: serves a [`scalevfs::Vfs`] to every program
//! on the machine. This crate is the only one that knows FUSE.
//!
//! # Design
//!
//! The core has no inode-number API: everything is a `*at` call on a task's
//! fd table. The adapter therefore keeps, per FUSE node id, a counted
//! [`nodes::Node`] that owns an `O_PATH` fd in one fd table shared by every
//! request ("the daemon's process"). Name operations become
//! `*at(parent_fd, name)`; inode operations use the node's fd with
//! `AT_EMPTY_PATH`, `fstat`, `fchmod`, ..., [`scalevfs::Task::reopen`] (open
//! the file an O_PATH fd names) and [`scalevfs::Task::link_fd`].
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
//! # Lock order (adapter)
//! A node-table shard lock is never held across a core call, except that
//! `forget` may drop the last `Arc<Node>` (which closes its fd in the fd
//! table: core lock) after releasing the shard lock.
#![warn(missing_debug_implementations)]

mod attr;
mod creds;
pub mod mount;
mod nodes;
mod ops;

pub use mount::{run_mount, spawn_mount, FuseMount, Invalidator, MountArgs, MountConfig};
pub use ops::{FuseConfig, ScaleFs};
