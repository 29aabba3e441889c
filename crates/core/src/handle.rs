//! Core handles: a counted reference to a location in the namespace (a
//! mount and a positive dentry), for front ends and programs that hold files
//! by reference rather than by path (the FUSE adapter keeps one per node id).
//!
//! A [`Handle`] is what an `O_PATH` descriptor holds, without the fd table:
//! cloning it counts one more reference on the dentry (its `LockRef`) and
//! on the mount's busy count; dropping it releases both. Calls relative to a
//! handle go through the same code as the path-based [`Task`] calls: every
//! `*at` call of `Task` takes an [`At`], which is an fd (`i32`, including
//! `AT_FDCWD`) or a `&Handle`, so `t.mkdirat(&h, "d", 0o755)` and
//! `t.mkdirat(fd, "d", 0o755)` run the same name resolution, permission
//! checks and locking. `handle_ops.rs` (above `Task`) gives handles short
//! spellings of those calls (`h.mkdir(t, name, mode)`, ...).
//!
//! Identity: a handle names an inode by `(dev, ino, generation)`
//! ([`HandleId`]); the generation tells a reused inode number from the
//! inode it replaced (memfs: a per-filesystem counter; ext4: `i_generation`).

use std::sync::Arc;

use crate::inode::Inode;
use crate::mount::PathRef;
use crate::types::{Stat, StatFs};

/// A counted reference to a file: a mount and a dentry (see the module doc).
#[derive(Debug)]
pub struct Handle {
    path: PathRef,
}

/// The stable identity of the inode a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HandleId {
    pub dev: u64,
    pub ino: u64,
    pub generation: u32,
}

/// The base of an `*at` call: a descriptor (or `AT_FDCWD`) or a handle.
#[derive(Clone, Copy, Debug)]
pub enum At<'a> {
    Fd(i32),
    Handle(&'a Handle),
}

impl From<i32> for At<'_> {
    fn from(fd: i32) -> Self {
        At::Fd(fd)
    }
}

impl<'a> From<&'a Handle> for At<'a> {
    fn from(h: &'a Handle) -> Self {
        At::Handle(h)
    }
}

impl Handle {
    /// Hold `path`: one more busy count on its mount (umount answers EBUSY
    /// while a handle lives, as for an open file).
    pub(crate) fn new(path: PathRef) -> Handle {
        path.mnt.hold();
        Handle { path }
    }

    pub(crate) fn path(&self) -> &PathRef {
        &self.path
    }

    /// The inode this handle names.
    pub fn inode(&self) -> &Arc<Inode> {
        self.path.inode()
    }

    /// Its attributes (no lock: a seqlock read).
    pub fn getattr(&self) -> Stat {
        self.inode().stat()
    }

    /// Its stable identity.
    pub fn id(&self) -> HandleId {
        let i = self.inode();
        HandleId {
            dev: i.dev(),
            ino: i.ino(),
            generation: i.generation(),
        }
    }

    /// Whether two handles name the same location (mount and dentry).
    pub fn same_location(&self, other: &Handle) -> bool {
        self.path
            .same(other.path.mnt.as_ptr(), other.path.dentry.as_ptr())
    }

    /// The statfs of its filesystem.
    pub fn statfs(&self) -> StatFs {
        self.path.mnt.sb.fs.statfs()
    }
}

impl Clone for Handle {
    fn clone(&self) -> Handle {
        Handle::new(self.path.clone())
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.path.mnt.release();
    }
}
