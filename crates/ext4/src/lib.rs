//! ext4 for scalevfs: reads real ext4 images (made by mke2fs or the
//! kernel) through the [`scalevfs::Filesystem`] trait, and writes them
//! mounted read-write (`Ext4Options { ro: false, .. }`): clean ones, or
//! ones whose journal the open replays first (`Ext4Options::replay`),
//! through the jbd2 journal where the image has one; see `docs/ext4.md`
//! for what is supported.
//!
//! `Ext4Options::default()` opens the image read-only:
//!
//! ```no_run
//! use std::sync::Arc;
//! use scalevfs_ext4::{Ext4, Ext4Options};
//! let fs: Arc<dyn scalevfs::Filesystem> = Ext4::open("disk.img".as_ref(), Ext4Options::default())?;
//! let vfs = scalevfs::Vfs::with_root_fs(Default::default(), fs);
//! # Ok::<(), scalevfs_ext4::Error>(())
//! ```
//!
//! Read-write: `ro: false` (through the journal where the image has one;
//! `journal: true` is the default). Call [`Ext4::unmount`] before the
//! program exits: it commits the journal, writes the image back, marks it
//! clean and lets go of the image's `flock`, and says if any of it
//! failed. Dropping the last `Arc<Ext4>` (after the `Vfs` and every
//! handle) does the same, but cannot report an error.
//!
//! ```no_run
//! use std::sync::Arc;
//! use scalevfs_ext4::{Ext4, Ext4Options};
//! let opts = Ext4Options { ro: false, ..Default::default() };
//! let e: Arc<Ext4> = Ext4::open("disk.img".as_ref(), opts)?;
//! let vfs = scalevfs::Vfs::with_root_fs(Default::default(), e.clone());
//! vfs.root_task().mkdir("/new", 0o755)?;
//! drop(vfs);
//! e.unmount()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod alloc;
#[cfg(test)]
mod alloc_held_tests;
mod block_map;
pub mod bufcache;
pub mod crashdev;
pub mod device;
mod ea_inode;
pub mod error;
mod extent_write;
mod fiemap;
pub mod format;
mod fs;
mod inline_write;
pub mod journal;
#[cfg(all(test, debug_assertions))]
mod lock_order_tests;
mod meta_zone;
pub mod mkfs;
mod open;
mod orphan;
mod orphan_list;
mod txn;
mod util;
mod write;
mod xattr_cache;
mod xattr_write;

pub use device::{BlockDevice, FileDevice, MemDevice, MmapDevice};
pub use error::{Error, Result};
pub use fs::{Ext4, Ext4Inode, Ext4Options, IoMode, Mapping, OrphanMode, EXT4_SUPER_MAGIC};
