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
//! checks and locking. The methods below are short spellings of those calls.
//!
//! Identity: a handle names an inode by `(dev, ino, generation)`
//! ([`HandleId`]); the generation tells a reused inode number from the
//! inode it replaced (memfs: a per-filesystem counter; ext4: `i_generation`).

use std::sync::Arc;

use crate::errno::VfsResult;
use crate::inode::Inode;
use crate::task::Task;
use crate::types::{DirEntry, Stat, StatFs, AT_EMPTY_PATH, AT_SYMLINK_NOFOLLOW, O_CLOEXEC};
use crate::types::{O_DIRECTORY, O_RDONLY};
use crate::vfs::PathRef;

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
            .same(Arc::as_ptr(&other.path.mnt), other.path.dentry.as_ptr())
    }

    /// The child `name` (not following a final symlink; `.` and `..` as the
    /// walk resolves them, mounts crossed). A cached name costs one dcache
    /// hash lookup and a reference count; a miss asks the filesystem.
    pub fn lookup<P: AsRef<[u8]> + ?Sized>(&self, t: &Task, name: &P) -> VfsResult<Handle> {
        t.handle_at(self, name, AT_SYMLINK_NOFOLLOW)
    }

    /// Open the file this handle names: a new open file description in
    /// `t`'s fd table with open(2)'s checks (see [`Task::reopen`]).
    pub fn open(&self, t: &Task, flags: u32) -> VfsResult<i32> {
        t.reopen(self, flags)
    }

    /// The statfs of its filesystem.
    pub fn statfs(&self) -> StatFs {
        self.path.mnt.sb.fs.statfs()
    }

    /// `readlinkat(h, "")`.
    pub fn readlink(&self, t: &Task) -> VfsResult<Vec<u8>> {
        t.readlinkat(self, "")
    }

    /// `mkdirat(h, name, mode)`.
    pub fn mkdir<P: AsRef<[u8]> + ?Sized>(&self, t: &Task, name: &P, mode: u32) -> VfsResult<()> {
        t.mkdirat(self, name, mode)
    }

    /// `openat(h, name, flags | O_CREAT, mode)`: create (or open) a file.
    pub fn create<P: AsRef<[u8]> + ?Sized>(
        &self,
        t: &Task,
        name: &P,
        flags: u32,
        mode: u32,
    ) -> VfsResult<i32> {
        t.openat(self, name, flags | crate::types::O_CREAT, mode)
    }

    /// `unlinkat(h, name, flags)`.
    pub fn unlink<P: AsRef<[u8]> + ?Sized>(&self, t: &Task, name: &P, flags: u32) -> VfsResult<()> {
        t.unlinkat(self, name, flags)
    }

    /// `renameat2(h, name, newdir, newname, flags)`.
    pub fn rename<P: AsRef<[u8]> + ?Sized, Q: AsRef<[u8]> + ?Sized>(
        &self,
        t: &Task,
        name: &P,
        newdir: &Handle,
        newname: &Q,
        flags: u32,
    ) -> VfsResult<()> {
        t.renameat2(self, name, newdir, newname, flags)
    }

    /// Give the file this handle names the name `newdir/name` (linkat with
    /// AT_EMPTY_PATH, without its capability check, see [`Task::link_fd`]).
    pub fn link<Q: AsRef<[u8]> + ?Sized>(
        &self,
        t: &Task,
        newdir: &Handle,
        name: &Q,
    ) -> VfsResult<()> {
        t.link_fd(self, newdir, name)
    }

    /// `symlinkat(target, h, name)`.
    pub fn symlink<T: AsRef<[u8]> + ?Sized, P: AsRef<[u8]> + ?Sized>(
        &self,
        t: &Task,
        target: &T,
        name: &P,
    ) -> VfsResult<()> {
        t.symlinkat(target, self, name)
    }

    /// `fchmodat(h, "", mode, AT_EMPTY_PATH)`.
    pub fn chmod(&self, t: &Task, mode: u32) -> VfsResult<()> {
        t.fchmod(self, mode)
    }

    /// `fchownat(h, "", uid, gid, AT_EMPTY_PATH)` (`u32::MAX`: unchanged).
    pub fn chown(&self, t: &Task, uid: u32, gid: u32) -> VfsResult<()> {
        t.fchown(self, uid, gid)
    }

    /// `utimensat(h, "", times, AT_EMPTY_PATH)`.
    pub fn set_times(&self, t: &Task, times: Option<[crate::types::Timespec; 2]>) -> VfsResult<()> {
        t.futimens(self, times)
    }

    /// The whole listing of this directory (`.` and `..` included), read
    /// through an open description as getdents(2) does.
    pub fn read_dir(&self, t: &Task) -> VfsResult<Vec<DirEntry>> {
        let fd = t.reopen(self, O_RDONLY | O_DIRECTORY | O_CLOEXEC)?;
        let mut out = Vec::new();
        let r = loop {
            match t.getdents(fd, 256) {
                Ok(b) if b.is_empty() => break Ok(()),
                Ok(b) => out.extend(b),
                Err(e) => break Err(e),
            }
        };
        let _ = t.close(fd);
        r.map(|()| out)
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

impl Task {
    /// A handle on `dirfd`/`path` (`dirfd` an fd, `AT_FDCWD` or a handle).
    /// Flags: AT_SYMLINK_NOFOLLOW (a final symlink is the handle's file),
    /// AT_EMPTY_PATH (an empty path names `dirfd` itself).
    pub fn handle_at<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        flags: u32,
    ) -> VfsResult<Handle> {
        if flags & !(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH) != 0 {
            return Err(crate::errno::Errno::EINVAL);
        }
        let p = self.resolve(
            dirfd,
            path.as_ref(),
            flags & AT_SYMLINK_NOFOLLOW == 0,
            flags & AT_EMPTY_PATH != 0,
        )?;
        Ok(Handle::new(p))
    }
}
