//! The calls of a [`Handle`] (`h.lookup(t, name)`, `h.mkdir(t, name,
//! mode)`, ...) and [`Task::handle_at`]: short spellings of the `Task`'s
//! `*at` calls with the handle as their base. Above `task.rs`; `handle.rs`
//! (the type, below the walk) names no `Task`.

use std::sync::Arc;

use crate::errno::{Errno, VfsResult};
use crate::handle::{At, Handle};
use crate::inode::Inode;
use crate::mount::PathRef;
use crate::task::Task;
use crate::types::{DirEntry, AT_EMPTY_PATH, AT_SYMLINK_NOFOLLOW, O_CLOEXEC};
use crate::types::{O_DIRECTORY, O_RDONLY};

impl Handle {
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

impl Task {
    /// A handle on `inode`, found by its number rather than by a name (a
    /// file handle decoded after the front end forgot the node: Linux's
    /// `d_obtain_alias` for exportfs): an unhashed dentry of its own in
    /// `within`'s mount, which no walk reaches. Non-directories only: a
    /// directory's handle must sit in the tree (its `..`, its children), so
    /// a directory is ESTALE here, as is an inode with no name left (an
    /// unlinked file's handle is stale) or one of another filesystem.
    pub fn handle_for_inode(&self, within: &Handle, inode: Arc<Inode>) -> VfsResult<Handle> {
        let p = within.path();
        if inode.dev() != p.mnt.sb.dev || inode.is_dir() || inode.attr().nlink == 0 {
            return Err(Errno::ESTALE);
        }
        let dentry = self.vfs().dcache().alloc_root(p.mnt.sb.clone(), inode);
        Ok(Handle::new(PathRef {
            mnt: p.mnt.clone(),
            dentry,
        }))
    }

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
