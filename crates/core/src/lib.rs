//! scalevfs: a multicore-scalable virtual filesystem engine.
//!
//! A [`Vfs`] holds mounted filesystems and the shared caches; a [`Task`] (a
//! process-like context: credentials, umask, root, cwd, fd table) issues
//! POSIX-shaped calls that return [`Errno`] on failure. See `docs/design.md`
//! for the mechanisms, the lock order and the object lifetimes.
#![warn(missing_debug_implementations)]

mod attr;
pub mod caller;
pub mod config;
pub mod dcache;
pub mod errno;
pub mod file;
pub(crate) mod fileops;
mod flock;
pub(crate) mod frames;
pub mod fs;
pub mod fstype;
pub mod handle;
mod handle_ops;
pub mod inode;
pub mod io;
pub(crate) mod limbo;
pub mod memfs;
pub mod mount;
mod namei;
mod open;
pub mod orphan;
pub(crate) mod pages;
pub mod percpu;
pub mod sb;
pub(crate) mod spares;
pub mod task;
pub mod types;
pub mod vfs;
pub(crate) mod walk;
pub mod xattr;
mod xattr_calls;

#[cfg(all(test, loom))]
mod loom_models;

pub use dcache::{DcacheConfig, DcacheIndex, DentryLayout};
pub use errno::{Errno, VfsResult};
#[doc(hidden)]
pub use flock::table_entries as flock_table_entries;
pub use fstype::Filesystem;
pub use handle::{At, Handle, HandleId};
pub use memfs::{flush_deferred_frees, MemFs, MemFsOptions};
pub use namei::{enospc_final, enospc_final_reset, enospc_is_final};
pub use scalevfs_orphan::OrphanVariant;
pub use scalevfs_sync::LockRefVariant;
pub use task::Task;
pub use types::*;
pub use vfs::{ChangeListener, LlseekVariant, Vfs, VfsConfig, WalkMode};
