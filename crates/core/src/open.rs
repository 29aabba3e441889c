//! Opening files and the fd table's own calls: open/openat (O_CREAT with
//! `namei.rs`'s create steps, O_TMPFILE, O_TRUNC), open for exec, reopen of
//! an fd or handle, close, dup, getdents. The data calls on open files are
//! in `io.rs`.

use scalevfs_sync::primitive::Ordering;
use std::sync::Arc;

use crossbeam_epoch as epoch;

use crate::errno::{Errno, VfsResult};
use crate::file::File;
use crate::fstype::NewNode;
use crate::handle::At;
use crate::mount::PathRef;
use crate::task::{as_bytes, Task};
use crate::types::*;
use crate::walk::{check_path, Last};

/// A regular file just opened for writing on a mount that a concurrent
/// remount made read-only meanwhile (see `Vfs::remount_at`): EROFS (the
/// file is dropped, which uncounts it).
fn read_only_race(r: VfsResult<File>) -> VfsResult<File> {
    match r {
        Ok(f) if f.writer_on_readonly() => Err(Errno::EROFS),
        r => r,
    }
}

impl Task {
    // ---------------------------------------------------------------
    // Open files (the basics; data calls live in `io.rs`).
    // ---------------------------------------------------------------

    /// `openat(2)`.
    pub fn openat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        flags: u32,
        mode: u32,
    ) -> VfsResult<i32> {
        // This thread's deferred frees that are due (limbo.rs).
        crate::limbo::poll();
        // The fd first, as Linux's do_sys_openat2: a full table must fail
        // the open before O_CREAT makes a name.
        let fd = if flags & O_ANYFD != 0 {
            self.files.reserve_any()?
        } else {
            self.files.reserve()?
        };
        match self.open_file(dirfd, as_bytes(path), flags & !(FMODE_EXEC | O_ANYFD), mode) {
            Ok(file) => {
                self.files
                    .install_reserved(fd, Arc::new(file), flags & O_CLOEXEC != 0);
                Ok(fd)
            }
            Err(e) => {
                self.files.unreserve(fd);
                Err(e)
            }
        }
    }

    /// Open a regular file to execute it (Linux's `open_exec`): execute
    /// permission is required, read permission is not (a mode 0711 program
    /// can be run by anyone), and only a regular file qualifies (else
    /// EACCES). The description is read-only. [`Task::reopen`] with
    /// [`FMODE_EXEC`] in its flags does the same for a held fd.
    pub fn open_exec<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
    ) -> VfsResult<i32> {
        let fd = self.files.reserve()?;
        let r = self
            .resolve(dirfd, as_bytes(path), true, false)
            .and_then(|p| self.open_checked(p, O_RDONLY | FMODE_EXEC, false));
        match r {
            Ok(file) => {
                self.files.install_reserved(fd, Arc::new(file), false);
                Ok(fd)
            }
            Err(e) => {
                self.files.unreserve(fd);
                Err(e)
            }
        }
    }

    pub fn open<P: AsRef<[u8]> + ?Sized>(&self, path: &P, flags: u32, mode: u32) -> VfsResult<i32> {
        self.openat(AT_FDCWD, path, flags, mode)
    }

    /// open(2)'s work up to a new open file description (not installed).
    /// Checks follow Linux's `build_open_flags`, `do_open` and `may_open`,
    /// in their order.
    pub(crate) fn open_file<'a>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &[u8],
        flags: u32,
        mode: u32,
    ) -> VfsResult<File> {
        check_path(path)?;
        let acc = flags & O_ACCMODE;
        if flags & (O_TMPFILE & !O_DIRECTORY) != 0 {
            if flags & (O_TMPFILE | O_CREAT) != O_TMPFILE || acc == O_RDONLY {
                return Err(Errno::EINVAL);
            }
            return read_only_race(self.open_tmpfile(dirfd, path, flags, mode));
        }
        if flags & O_PATH != 0 {
            let p = self.resolve(dirfd, path, flags & O_NOFOLLOW == 0, false)?;
            if flags & O_DIRECTORY != 0 && !p.inode().is_dir() {
                return Err(Errno::ENOTDIR);
            }
            return File::new(p, flags & (O_PATH | O_DIRECTORY | O_NOFOLLOW), &self.cred);
        }
        if flags & O_CREAT != 0 && flags & O_DIRECTORY != 0 {
            return Err(Errno::EINVAL);
        }
        let (p, created) = if flags & O_CREAT != 0 {
            self.open_create(dirfd, path, flags, mode, 0)?
        } else {
            (
                self.resolve(dirfd, path, flags & O_NOFOLLOW == 0, false)?,
                false,
            )
        };
        self.open_checked(p, flags, created)
    }

    /// Open again the file that `fd` names (often an O_PATH fd), as Linux's
    /// `open("/proc/self/fd/N", flags)` does: a new open file description
    /// with open(2)'s permission checks and O_TRUNC, done with this task's
    /// credentials. For front ends that hold files by handle (the FUSE
    /// adapter opens its nodes this way). O_CREAT/O_EXCL are ignored.
    pub fn reopen<'a>(&self, fd: impl Into<At<'a>> + Copy, flags: u32) -> VfsResult<i32> {
        // (O_TMPFILE's bits less O_DIRECTORY, which it includes and which
        // must still refuse a non-directory.)
        let anyfd = flags & O_ANYFD != 0;
        let flags = flags & !(O_CREAT | O_EXCL | (O_TMPFILE & !O_DIRECTORY) | O_PATH | O_ANYFD);
        // Access mode 3 (O_RDWR|O_WRONLY) is open(2)'s: read and write
        // permission checked, an fd that can neither read nor write (for
        // ioctls), as reopening /proc/self/fd/N with it gives on Linux.
        let p = self.held(fd)?;
        let file = Arc::new(self.open_resolved(p, flags)?);
        let cloexec = flags & O_CLOEXEC != 0;
        if anyfd {
            self.files.install_any(file, cloexec)
        } else {
            self.files.install(file, cloexec, 0)
        }
    }

    /// The checks and truncation of open(2) on a resolved location.
    pub(crate) fn open_resolved(&self, p: PathRef, flags: u32) -> VfsResult<File> {
        self.open_checked(p, flags, false)
    }

    /// Linux's `do_open` + `may_open` on the final location. A file this
    /// open just created (`created`) skips the permission checks and O_TRUNC.
    pub(crate) fn open_checked(&self, p: PathRef, flags: u32, created: bool) -> VfsResult<File> {
        read_only_race(self.open_checked_inner(p, flags, created))
    }

    pub(crate) fn open_checked_inner(
        &self,
        p: PathRef,
        flags: u32,
        created: bool,
    ) -> VfsResult<File> {
        if created {
            return File::new(p, flags & !FMODE_EXEC, &self.cred);
        }
        let i = p.inode().clone();
        let ty = i.file_type();
        if flags & O_CREAT != 0 && i.is_dir() {
            return Err(Errno::EISDIR);
        }
        if flags & O_DIRECTORY != 0 && !i.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        // ACC_MODE: O_RDWR|O_WRONLY (3) asks for both, like O_RDWR. An open
        // for exec asks for execute only (open_exec's MAY_EXEC), and only a
        // regular file can be executed (do_open_execat).
        let exec = flags & FMODE_EXEC != 0;
        if exec && ty != FileType::Regular {
            return Err(Errno::EACCES);
        }
        let mut want = match flags & O_ACCMODE {
            _ if exec => X_OK,
            O_RDONLY => R_OK,
            O_WRONLY => W_OK,
            _ => R_OK | W_OK,
        };
        if flags & O_TRUNC != 0 {
            want |= W_OK;
        }
        let trunc = flags & O_TRUNC != 0 && ty == FileType::Regular;
        if trunc && p.mnt.is_readonly() {
            return Err(Errno::EROFS);
        }
        match ty {
            FileType::Symlink => return Err(Errno::ELOOP),
            FileType::Directory if want & W_OK != 0 => return Err(Errno::EISDIR),
            _ => {}
        }
        if want & W_OK != 0
            && p.mnt.is_readonly()
            && matches!(
                ty,
                FileType::Regular | FileType::Directory | FileType::Symlink
            )
        {
            return Err(Errno::EROFS);
        }
        let a = i.attr();
        // inode_permission(MAY_WRITE) on an immutable file is EPERM.
        if want & W_OK != 0 && i.is_immutable() {
            return Err(Errno::EPERM);
        }
        if !i.permission_ok(&a, &self.cred, want) {
            return Err(Errno::EACCES);
        }
        // may_open: an append-only file opens for writing only with
        // O_APPEND, and never with O_TRUNC.
        if i.is_append_only()
            && ((flags & O_ACCMODE != O_RDONLY && flags & O_APPEND == 0) || flags & O_TRUNC != 0)
        {
            return Err(Errno::EPERM);
        }
        if flags & O_NOATIME != 0 && !self.cred.is_root() && self.cred.uid != a.uid {
            return Err(Errno::EPERM);
        }
        // The description first: it takes write access (or, for exec,
        // holds writers off), so a running program is ETXTBSY before
        // anything is truncated (Linux's do_dentry_open, then
        // handle_truncate).
        let file = File::new(p, flags, &self.cred)?;
        if trunc {
            // O_RDONLY|O_TRUNC holds no write access: take it for the
            // truncate, as handle_truncate does.
            let temporary = !file.can_write();
            if temporary {
                i.get_write_access()?;
            }
            let r = crate::fileops::truncate_inode(file.path(), 0, &self.cred);
            if temporary {
                i.put_write_access();
            }
            r?;
            // No lock is held here: report at once.
            self.changes().inode(&i);
        }
        Ok(file)
    }

    /// O_CREAT: find or create the last component. Returns the location and
    /// whether this call created it. An existing symlink is followed (unless
    /// O_NOFOLLOW / O_EXCL); a dangling one gets its target created, as on
    /// Linux (`depth` counts the links followed).
    pub(crate) fn open_create<'a>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &[u8],
        flags: u32,
        mode: u32,
        depth: u32,
    ) -> VfsResult<(PathRef, bool)> {
        crate::namei::redo_counted_enospc(self.vfs.dcache(), |counted| {
            self.open_create_walked(dirfd, path, flags, mode, depth, counted)
        })
    }

    /// `open_create` with the parent walked counted or not
    /// (`Task::parent_of`).
    fn open_create_walked<'a>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &[u8],
        flags: u32,
        mode: u32,
        depth: u32,
        counted: bool,
    ) -> VfsResult<(PathRef, bool)> {
        if depth > MAX_SYMLINKS {
            return Err(Errno::ELOOP);
        }
        let pw = self.parent_of(dirfd, path, counted)?;
        let name = match &pw.last {
            Last::Normal(n) => n.clone(),
            // ".", ".." or "/": an existing directory. Linux's do_open
            // checks O_EXCL (EEXIST) before the directory (EISDIR).
            _ if flags & O_EXCL != 0 => return Err(Errno::EEXIST),
            _ => return Err(Errno::EISDIR),
        };
        if pw.trailing {
            return Err(Errno::EISDIR);
        }
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut ch = self.changes();
        let parent = &pw.parent;
        let dir = parent.inode();
        let existing = {
            let mut slot = self.lock_name(&pw, &name)?;
            match slot.existing.take() {
                Some(d) => d,
                None => {
                    parent.mnt.check_writable()?;
                    self.may_create(parent)?;
                    let (owner, sgid) = self.owner_for(dir);
                    let fs = &parent.mnt.sb.fs;
                    let (perm, acl) = self.create_mode(fs, dir, mode & 0o7777, false)?;
                    let perm = self.strip_sgid(perm, owner.1, sgid);
                    let node = NewNode::Node {
                        mode: S_IFREG | perm,
                        rdev: 0,
                    };
                    let inode =
                        crate::caller::with(&self.cred, || fs.create(dir, &name, node, owner))?;
                    if let Err(e) = self.store_inherited_acl(fs, &inode, acl) {
                        self.undo_create(fs, parent, &name, inode, false, &mut ch);
                        return Err(e);
                    }
                    let d = self.instantiate(parent, &name, inode, &mut ch);
                    drop(slot);
                    return Ok((
                        PathRef {
                            mnt: parent.mnt.clone(),
                            dentry: d,
                        },
                        true,
                    ));
                }
            }
        };
        if flags & O_EXCL != 0 {
            return Err(Errno::EEXIST);
        }
        let here = PathRef {
            mnt: parent.mnt.clone(),
            dentry: existing,
        };
        if here.inode().file_type() == FileType::Symlink && flags & O_NOFOLLOW == 0 {
            // The link's body is walked as the rest of the path, as Linux's
            // open_last_lookups does: its last name is found or created
            // here again (a dangling link gets its target created), and
            // one with a trailing '/' is EISDIR before it is looked up
            // (`pw.trailing` above), so a link "d" -> "d/" is EISDIR, not
            // ELOOP. A relative target is walked from the link's directory
            // (not re-walked from the path: links that name themselves
            // through "./" would grow the path past PATH_MAX,
            // ENAMETOOLONG, before the 40th link gave ELOOP).
            // The walk goes on from the parent, after its locks went: an
            // uncounted parent (kept by the guard alone) may die
            // meanwhile, and a count taken on a dead dentry would free it
            // twice. Redone with a counted parent (review, stop 48).
            if !pw.counted {
                return Err(Errno::RESTART_WALK);
            }
            // The body of the link found here, not of whatever the path
            // names by now (a rename or unlink racing with this open would
            // make a second walk of `path` fail, or read another link).
            let fs = &here.mnt.sb.fs;
            let target = match fs.get_link_cached(here.inode()) {
                Some(b) => b.to_vec(),
                None => fs.readlink(here.inode())?,
            };
            let from = crate::handle::Handle::new((*pw.parent).clone());
            return self.open_create(&from, &target, flags, mode, depth + 1);
        }
        Ok((self.cross_mounts(here), false))
    }

    pub(crate) fn cross_mounts(&self, p: PathRef) -> PathRef {
        let g = epoch::pin();
        self.ctx(&g).cross_mounts_ref(p, &g)
    }

    /// O_TMPFILE: an unnamed regular file in the directory `path`; it is an
    /// orphan from birth (nlink 0; `File::new` records it).
    pub(crate) fn open_tmpfile<'a>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &[u8],
        flags: u32,
        mode: u32,
    ) -> VfsResult<File> {
        let p = self.resolve(dirfd, path, true, false)?;
        if !p.inode().is_dir() {
            return Err(Errno::ENOTDIR);
        }
        p.mnt.check_writable()?;
        self.may_create(&p)?;
        let (owner, sgid) = self.owner_for(p.inode());
        let fs = &p.mnt.sb.fs;
        let (perm, acl) = self.create_mode(fs, p.inode(), mode & 0o7777, false)?;
        let perm = self.strip_sgid(perm, owner.1, sgid);
        let inode = crate::caller::with(&self.cred, || fs.create_tmpfile(p.inode(), perm, owner))?;
        self.store_inherited_acl(fs, &inode, acl)?;
        if flags & O_EXCL == 0 {
            inode.set_flag(crate::inode::I_LINKABLE);
        }
        // An unnamed dentry under the directory, never hashed: dies with the
        // last reference.
        let q = self.vfs.dcache().qname(p.dentry.as_ptr(), b"#tmpfile");
        let d = self.vfs.dcache().alloc_unhashed(&p.dentry, &q, inode);
        File::new(
            PathRef {
                mnt: p.mnt.clone(),
                dentry: d,
            },
            flags,
            &self.cred,
        )
    }

    /// `close(2)`.
    pub fn close(&self, fd: i32) -> VfsResult<()> {
        // This thread's deferred frees that are due (limbo.rs).
        crate::limbo::poll();
        let r = self.files.close(fd);
        crate::limbo::flush_if_due();
        r
    }

    /// `dup(2)`.
    pub fn dup(&self, fd: i32) -> VfsResult<i32> {
        let f = self.files.get_arc(fd)?;
        self.files.install(f, false, 0)
    }

    /// `dup3(2)` (and dup2 with `flags` 0; dup2 of an fd onto itself is a
    /// no-op that checks the fd, dup3 of that is EINVAL).
    pub fn dup3(&self, old: i32, new: i32, flags: u32) -> VfsResult<i32> {
        if flags & !O_CLOEXEC != 0 || old == new {
            return Err(Errno::EINVAL);
        }
        if new < 0 || new as usize >= self.files.max() {
            return Err(Errno::EBADF);
        }
        let f = self.files.get_arc(old)?;
        self.files.install_at(new, f, flags & O_CLOEXEC != 0)?;
        Ok(new)
    }

    pub fn dup2(&self, old: i32, new: i32) -> VfsResult<i32> {
        if old == new {
            self.files.get_arc(old)?;
            return Ok(new);
        }
        self.dup3(old, new, 0)
    }

    /// `fcntl(F_DUPFD[_CLOEXEC])`.
    pub fn dupfd(&self, fd: i32, min: i32, cloexec: bool) -> VfsResult<i32> {
        let f = self.files.get_arc(fd)?;
        let min = usize::try_from(min).map_err(|_| Errno::EINVAL)?;
        if min >= self.files.max() {
            return Err(Errno::EINVAL);
        }
        self.files.install(f, cloexec, min)
    }

    /// `getdents64(2)`-style: the next batch of entries of the directory
    /// open at `fd` ("." and ".." first), at most `max` of them; an empty
    /// vector at the end. `max` 0 is EINVAL, as getdents64 with a buffer
    /// too small for one entry (after EBADF and ENOTDIR, as there).
    pub fn getdents(&self, fd: i32, max: usize) -> VfsResult<Vec<DirEntry>> {
        let f = self.files.get_arc(fd)?;
        if f.is_path_only() {
            return Err(Errno::EBADF);
        }
        let i = f.inode().clone();
        if !i.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        // Linux's f_pos_lock (fdget_pos): two getdents (or a getdents and
        // an lseek) on one shared description must not both use the same
        // position. Order: pos_lock -> dir_lock, as for writes.
        let _pl = f.pos_lock.lock();
        let fs = &f.path.mnt.sb.fs;
        // The directory lock (shared) only where the filesystem's listing
        // needs it (`readdir_needs_dir_lock`): memfs lists without it, so two
        // listings of one directory write no shared line (its reader count
        // was one: conflict matrix, issue 16). A removal racing with such a
        // listing is linearized after it (the directory was empty).
        let _dl = fs.readdir_needs_dir_lock().then(|| self.dir_shared(&i));
        // iterate_dir: a removed directory lists nothing, ENOENT.
        if i.is_dead() {
            return Err(Errno::ENOENT);
        }
        let mut out = Vec::new();
        let mut pos = f.position();
        if max == 0 {
            return Err(Errno::EINVAL);
        }
        if pos == 0 && out.len() < max {
            out.push(DirEntry {
                ino: i.ino(),
                next_cookie: 1,
                file_type: FileType::Directory,
                name: b".".to_vec(),
            });
            pos = 1;
        }
        if pos == 1 && out.len() < max {
            let pi = self.dotdot_ino(&f.path);
            out.push(DirEntry {
                ino: pi,
                next_cookie: 2,
                file_type: FileType::Directory,
                name: b"..".to_vec(),
            });
            pos = 2;
        }
        if f.position() == 0 {
            // A new listing (open or rewind): it ends at what the directory
            // holds now, however often its entries are moved out and back.
            // Relaxed: under pos_lock.
            f.dir_end
                .store(fs.readdir_end(&i).unwrap_or(u64::MAX), Ordering::Relaxed);
        }
        // Relaxed: under pos_lock.
        let end = f.dir_end.load(Ordering::Relaxed);
        if out.len() < max {
            let locking = self.vfs.config().readdir_locking;
            let dc = self.vfs.dcache();
            let r = fs.readdir(&i, pos, &mut |e| {
                if e.next_cookie > end {
                    // Its cookie (next_cookie - 1) is at or past the end.
                    return false;
                }
                if locking {
                    // Linux's libfs readdir takes each child's d_lock.
                    let g = epoch::pin();
                    let q = dc.qname(f.path.dentry.as_ptr(), &e.name);
                    if let crate::dcache::RcuLookup::Hit(d) = dc.lookup_rcu(&f.path.dentry, &q, &g)
                    {
                        d.lockref().lock();
                        d.lockref().unlock();
                    }
                }
                pos = e.next_cookie;
                out.push(e);
                out.len() < max
            });
            // Linux's getdents64: an error after some entries (an
            // unreadable block further on) returns those entries, and
            // the next call, from the position after them, meets the
            // error again; an error before any is returned.
            if let Err(e) = r {
                if out.is_empty() {
                    return Err(e);
                }
            }
        }
        // Relaxed: a value, written under pos_lock.
        f.pos.store(pos, Ordering::Relaxed);
        // Linux's iterate_dir ends with file_accessed: a listing sets the
        // directory's atime (relatime: the first listing after a change).
        // After the directory lock goes: the filesystem may take it to
        // store the time (ext4's setattr).
        drop(_dl);
        crate::fileops::touch_atime(&f);
        Ok(out)
    }

    pub(crate) fn dotdot_ino(&self, p: &PathRef) -> u64 {
        let g = epoch::pin();
        let s = self.fs.load(&g);
        // Common case, neither the task's root nor a mount root: the parent
        // dentry read under the guard, without taking references on the
        // directory or its parent (two listings would write both dentries'
        // counts: conflict matrix, issue 16). A racing rename makes it the
        // old or the new parent, as a walk of ".." would.
        if !p.same(s.root.mnt.as_ptr(), s.root.dentry.as_ptr())
            && p.dentry.as_ptr() != p.mnt.root.as_ptr()
        {
            // SAFETY: a dentry is freed only after a grace period and the
            // guard `g` is held, so the parent (current or just replaced by
            // a rename) stays allocated; its inode is fixed for its life.
            let parent = unsafe { &*p.dentry.parent_ptr() };
            if let Some(i) = parent.inode() {
                return i.ino();
            }
        }
        match p.clone().climb_for_dotdot(&s.root) {
            Ok(c) => c.dentry_parent().inode().ino(),
            Err(top) => top.inode().ino(),
        }
    }

    /// Read a whole directory by path (convenience over open+getdents).
    pub fn read_dir<P: AsRef<[u8]> + ?Sized>(&self, path: &P) -> VfsResult<Vec<DirEntry>> {
        let fd = self.openat(AT_FDCWD, path, O_RDONLY | O_DIRECTORY, 0)?;
        let mut all = Vec::new();
        let r = loop {
            match self.getdents(fd, 256) {
                Ok(v) if v.is_empty() => break Ok(()),
                Ok(v) => all.extend(v),
                Err(e) => break Err(e),
            }
        };
        let _ = self.close(fd);
        r.map(|_| all)
    }
}
