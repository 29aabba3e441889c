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
    /// `exportfs_decode_fh`), in `within`'s mount. ESTALE for an inode with
    /// no name left (an unlinked file's handle is stale), one of another
    /// filesystem, and one that cannot be reached from the mount's root.
    ///
    /// A non-directory gets an unhashed dentry of its own (Linux's
    /// `d_obtain_alias`), which no walk reaches. A directory's handle must
    /// sit in the tree (its `..`, its children, getcwd), so it is connected
    /// as Linux's `reconnect_path` does: climb with
    /// `Filesystem::get_parent` to the mount's root, then walk back down,
    /// finding each directory's name in its parent by reading the parent
    /// (`getdents`, matching the inode number), and check that the walk
    /// ends at `inode`. The reads and walks run with `self`'s credentials
    /// (search and read permission on every ancestor): a front end decoding
    /// for a caller the kernel already checked (open_by_handle_at needs
    /// CAP_DAC_READ_SEARCH) passes a root task. A rename racing with the
    /// walk, or a mount on one of the directories, makes it ESTALE.
    ///
    /// Cost: one `get_parent` per ancestor and a read of each ancestor up
    /// to the entry (a slow path: the front end calls it only for an inode
    /// it no longer holds).
    pub fn handle_for_inode(&self, within: &Handle, inode: Arc<Inode>) -> VfsResult<Handle> {
        let p = within.path();
        if inode.dev() != p.mnt.sb.dev || inode.attr().nlink == 0 {
            return Err(Errno::ESTALE);
        }
        if inode.is_dir() {
            return self.connect_dir(within, inode);
        }
        let dentry = self.vfs().dcache().alloc_root(p.mnt.sb.clone(), inode);
        Ok(Handle::new(PathRef {
            mnt: p.mnt.clone(),
            dentry,
        }))
    }

    /// [`Task::handle_for_inode`] for the inode numbered `ino` of
    /// `within`'s filesystem (`Filesystem::inode_by_number`): a file handle
    /// decoded by a front end that never held the inode (a new daemon after
    /// a remount). With `generation`, an inode of another generation (the
    /// number was reused) is ESTALE. Any 64-bit `ino` is accepted: one that
    /// names no live inode is ESTALE.
    pub fn handle_by_number(
        &self,
        within: &Handle,
        ino: u64,
        generation: Option<u32>,
    ) -> VfsResult<Handle> {
        let inode = within.path().mnt.sb.fs.inode_by_number(ino)?;
        if inode.ino() != ino || generation.is_some_and(|g| g != inode.generation()) {
            return Err(Errno::ESTALE);
        }
        self.handle_for_inode(within, inode)
    }

    /// The connected handle of directory `dir` (see `handle_for_inode`).
    #[cold]
    fn connect_dir(&self, within: &Handle, dir: Arc<Inode>) -> VfsResult<Handle> {
        /// Deeper than any path a walk can name (PATH_MAX / 2): a longer
        /// chain of parents is a loop in a damaged filesystem.
        const MAX_DEPTH: usize = 4096;
        let p = within.path();
        let top = p.mnt.root.inode().ok_or(Errno::ESTALE)?.clone();
        let fs = &p.mnt.sb.fs;
        // The directory and its ancestors below the mount's root, child
        // first.
        let mut chain = vec![dir];
        loop {
            let cur = chain.last().ok_or(Errno::ESTALE)?;
            if Arc::ptr_eq(cur, &top) {
                chain.pop();
                break;
            }
            if chain.len() > MAX_DEPTH {
                return Err(Errno::ESTALE);
            }
            let parent = fs.get_parent(cur)?;
            if Arc::ptr_eq(&parent, cur) || !parent.is_dir() {
                // The filesystem's root, and not the mount's: not
                // reachable through this mount.
                return Err(Errno::ESTALE);
            }
            chain.push(parent);
        }
        let mut h = Handle::new(PathRef {
            mnt: p.mnt.clone(),
            dentry: p.mnt.root.clone(),
        });
        // A name gone (or no longer a directory) since it was read: the
        // tree moved under the walk.
        let moved = |e| match e {
            Errno::ENOENT | Errno::ENOTDIR => Errno::ESTALE,
            e => e,
        };
        for child in chain.iter().rev() {
            let name = self.name_in_dir(&h, child.ino()).map_err(moved)?;
            let next = self
                .handle_at(&h, &name, AT_SYMLINK_NOFOLLOW)
                .map_err(moved)?;
            if !Arc::ptr_eq(next.inode(), child) {
                return Err(Errno::ESTALE);
            }
            h = next;
        }
        Ok(h)
    }

    /// The name of inode `ino` in directory `dir` (Linux's exportfs
    /// `get_name`): a read of `dir` up to the first entry with that number.
    fn name_in_dir(&self, dir: &Handle, ino: u64) -> VfsResult<Vec<u8>> {
        let fd = self.reopen(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)?;
        let r = loop {
            match self.getdents(fd, 256) {
                Ok(b) if b.is_empty() => break Err(Errno::ESTALE),
                Ok(b) => {
                    let hit = b.into_iter().find(|e| {
                        e.ino == ino && e.name.as_slice() != b"." && e.name.as_slice() != b".."
                    });
                    if let Some(e) = hit {
                        break Ok(e.name);
                    }
                }
                Err(e) => break Err(e),
            }
        };
        let _ = self.close(fd);
        r
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
