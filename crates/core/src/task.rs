//! `Task`: a process-like context (credentials, umask, root, cwd, fd table)
//! and the POSIX-shaped namespace calls.
//!
//! LOCKING RULES
//! - `FsContext::lock` (mutex) serialises chdir/chroot of tasks sharing the
//!   context. Readers take no lock: the (root, cwd) pair is an immutable
//!   snapshot replaced as a whole and read under an epoch guard.
//! - The namespace calls take the locks of `vfs.rs` in its global order:
//!   parents' `dir_lock` (shared; two only under the rename mutex, ancestor
//!   first), then name stripes; a victim directory's `dir_lock` only by
//!   try-lock (`try_victim_excl`), and on failure every lock is dropped, the
//!   victim's lock waited for with nothing held, and the call starts over.

use scalevfs_sync::ordered::{Class, Mutex, MutexGuard, RwLockReadGuard, RwLockWriteGuard};
use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned};
use scalevfs_sync::primitive::{AtomicU32, Ordering};

use crate::dcache::{Dentry, DentryRef};
use crate::errno::{Errno, VfsResult};
use crate::file::{FdTable, File};
use crate::fstype::{Filesystem, NewNode};
use crate::handle::At;
use crate::inode::{permission_ok, Inode};
use crate::mount::{Mount, PathRef};
use crate::types::*;
use crate::vfs::{Changes, Vfs};
use crate::walk::{check_path, Last, ParentWalk, Start, WalkCtx};

pub(crate) struct FsSnap {
    pub(crate) root: PathRef,
    pub(crate) cwd: PathRef,
}

/// Root and cwd, shared by tasks that are "threads" of one process.
pub struct FsContext {
    snap: Atomic<FsSnap>,
    lock: Mutex<()>,
}

impl std::fmt::Debug for FsContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsContext").finish_non_exhaustive()
    }
}

impl FsSnap {
    /// The snapshot's root and cwd hold their mounts busy (umount's EBUSY)
    /// from `hold` until `release`, which runs when the snapshot is replaced
    /// or its context dropped, not at its deferred free.
    fn hold(&self) {
        self.root.mnt.hold();
        self.cwd.mnt.hold();
    }
    fn release(&self) {
        self.root.mnt.release();
        self.cwd.mnt.release();
    }
}

impl FsContext {
    fn new(root: PathRef, cwd: PathRef) -> FsContext {
        let s = FsSnap { root, cwd };
        s.hold();
        FsContext {
            snap: Atomic::new(s),
            lock: Mutex::new(Class::FsContext, ()),
        }
    }
    pub(crate) fn load<'g>(&self, g: &'g Guard) -> &'g FsSnap {
        // Acquire: pairs with the Release publication in `replace`.
        let p = self.snap.load(Ordering::Acquire, g);
        // SAFETY: never null; old snapshots are freed after a grace period.
        unsafe { p.deref() }
    }
    fn replace(&self, f: impl FnOnce(&FsSnap) -> FsSnap) {
        let g = epoch::pin();
        let _l = self.lock.lock();
        let new = f(self.load(&g));
        new.hold();
        // AcqRel: publish the new snapshot, take the old one.
        let old = self.snap.swap(Owned::new(new), Ordering::AcqRel, &g);
        // SAFETY: never null while the context lives; freed only below.
        unsafe { old.deref() }.release();
        // SAFETY: unreachable now; pinned readers are waited for.
        unsafe { g.defer_destroy(old) };
    }
    fn copy(&self) -> FsContext {
        let g = epoch::pin();
        let s = self.load(&g);
        FsContext::new(s.root.clone(), s.cwd.clone())
    }
}

impl Drop for FsContext {
    fn drop(&mut self) {
        let g = epoch::pin();
        let old = self.snap.swap(epoch::Shared::null(), Ordering::AcqRel, &g);
        // SAFETY: a non-null snapshot is live until the deferred free below.
        if let Some(s) = unsafe { old.as_ref() } {
            s.release();
            // SAFETY: unreachable now; pinned readers are waited for.
            unsafe { g.defer_destroy(old) };
        }
    }
}

/// A process-like context issuing calls.
pub struct Task {
    vfs: Vfs,
    cred: Arc<Cred>,
    umask: AtomicU32,
    fs: Arc<FsContext>,
    files: Arc<FdTable>,
    /// Changes made by this task are not reported to the `Vfs`'s change
    /// listeners (a front end's own tasks: the front end knows).
    quiet_changes: bool,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("cred", &self.cred)
            .finish_non_exhaustive()
    }
}

/// Where a name operation happens: a locked parent and a name.
struct NameOp {
    pw: ParentWalk,
    name: Vec<u8>,
}

/// A regular file just opened for writing on a mount that a concurrent
/// remount made read-only meanwhile (see `Vfs::remount_at`): EROFS (the
/// file is dropped, which uncounts it).
fn read_only_race(r: VfsResult<File>) -> VfsResult<File> {
    match r {
        Ok(f) if f.writer_on_readonly() => Err(Errno::EROFS),
        r => r,
    }
}

fn as_bytes<P: AsRef<[u8]> + ?Sized>(p: &P) -> &[u8] {
    p.as_ref()
}

impl Task {
    pub(crate) fn new(vfs: Vfs, cred: Cred) -> Task {
        let root = vfs.root_path();
        let files = FdTable::with_nr_open(vfs.config().nr_open());
        Task {
            fs: Arc::new(FsContext::new(root.clone(), root)),
            vfs,
            cred: Arc::new(cred),
            umask: AtomicU32::new(0o022),
            files: Arc::new(files),
            quiet_changes: false,
        }
    }

    pub fn vfs(&self) -> &Vfs {
        &self.vfs
    }
    pub fn cred(&self) -> &Cred {
        &self.cred
    }
    /// Change credentials (setfsuid/setgroups-style).
    pub fn set_cred(&mut self, cred: Cred) {
        self.cred = Arc::new(cred);
    }
    pub fn files(&self) -> &FdTable {
        &self.files
    }
    /// Set the umask; returns the old one.
    pub fn umask(&self, mask: u32) -> u32 {
        // Relaxed: the umask is a value read at create time.
        self.umask.swap(mask & 0o777, Ordering::Relaxed)
    }
    fn cur_umask(&self) -> u32 {
        // Relaxed: as umask.
        self.umask.load(Ordering::Relaxed)
    }

    /// A "thread" of this task: shares fs context and fd table.
    pub fn clone_thread(&self) -> Task {
        Task {
            vfs: self.vfs.clone(),
            cred: self.cred.clone(),
            umask: AtomicU32::new(self.cur_umask()),
            fs: self.fs.clone(),
            files: self.files.clone(),
            quiet_changes: self.quiet_changes,
        }
    }

    /// A "forked" child: copies of the fs context and fd table (the open
    /// file descriptions are shared, as after fork(2)).
    pub fn fork(&self) -> Task {
        Task {
            vfs: self.vfs.clone(),
            cred: self.cred.clone(),
            umask: AtomicU32::new(self.cur_umask()),
            fs: Arc::new(self.fs.copy()),
            files: Arc::new(self.files.fork()),
            quiet_changes: self.quiet_changes,
        }
    }

    /// Do not report this task's changes to the `Vfs`'s change listeners
    /// ([`crate::ChangeListener`]); inherited by `clone_thread` and `fork`.
    /// For a front end's own tasks: a FUSE daemon must not tell the kernel
    /// about a change the kernel asked for (it knows, and notifying it from
    /// inside its own request can deadlock).
    pub fn set_quiet_changes(&mut self, quiet: bool) {
        self.quiet_changes = quiet;
    }

    /// Whether this task's changes go unreported (`set_quiet_changes`).
    pub fn quiet_changes(&self) -> bool {
        self.quiet_changes
    }

    /// The change record of one operation: declare it before the
    /// operation's lock guards so it reports after they are released.
    #[inline]
    pub(crate) fn changes(&self) -> Changes<'_> {
        Changes::new(&self.vfs, self.quiet_changes)
    }

    fn ctx<'g>(&'g self, g: &'g Guard) -> WalkCtx<'g> {
        let s = self.fs.load(g);
        WalkCtx {
            vfs: &self.vfs,
            cred: &self.cred,
            root: &s.root,
            cwd: &s.cwd,
        }
    }

    /// Resolve a dirfd into a walk start. A relative path needs a directory.
    fn start<'a: 'g, 'g>(
        &self,
        dirfd: impl Into<At<'a>>,
        path: &[u8],
        g: &'g Guard,
    ) -> VfsResult<Start<'g>> {
        let dirfd = match dirfd.into() {
            At::Fd(fd) => fd,
            At::Handle(h) => {
                if path.first() == Some(&b'/') {
                    return Ok(Start::Cwd);
                }
                if !path.is_empty() && !h.inode().is_dir() {
                    return Err(Errno::ENOTDIR);
                }
                return Ok(Start::At(h.path()));
            }
        };
        if dirfd == AT_FDCWD || path.first() == Some(&b'/') {
            return Ok(Start::Cwd);
        }
        let f = self.files.get(dirfd, g)?;
        if !path.is_empty() && !f.inode().is_dir() {
            return Err(Errno::ENOTDIR);
        }
        Ok(Start::At(&f.path))
    }

    /// The file an empty path with AT_EMPTY_PATH names.
    fn empty_path_target<'a>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        g: &Guard,
    ) -> VfsResult<PathRef> {
        let dirfd = match dirfd.into() {
            At::Fd(fd) => fd,
            At::Handle(h) => return Ok(h.path().clone()),
        };
        if dirfd == AT_FDCWD {
            return Ok(self.fs.load(g).cwd.clone());
        }
        Ok(self.files.get(dirfd, g)?.path.clone())
    }

    // ---------------------------------------------------------------
    // Lookups that take no reference: stat, access, readlink.
    // ---------------------------------------------------------------

    /// `fstatat(2)`. Flags: AT_SYMLINK_NOFOLLOW, AT_EMPTY_PATH.
    pub fn fstatat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        flags: u32,
    ) -> VfsResult<Stat> {
        let path = as_bytes(path);
        check_path(path)?;
        if flags & !(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH | libc::AT_NO_AUTOMOUNT as u32) != 0 {
            return Err(Errno::EINVAL);
        }
        let g = epoch::pin();
        if path.is_empty() {
            if flags & AT_EMPTY_PATH == 0 {
                return Err(Errno::ENOENT);
            }
            return Ok(self.empty_path_target(dirfd, &g)?.inode().stat());
        }
        let start = self.start(dirfd, path, &g)?;
        let follow = flags & AT_SYMLINK_NOFOLLOW == 0;
        self.ctx(&g).with_leaf(&g, start, path, follow, stat_of)
    }

    /// `stat(2)`.
    pub fn stat<P: AsRef<[u8]> + ?Sized>(&self, path: &P) -> VfsResult<Stat> {
        self.fstatat(AT_FDCWD, path, 0)
    }

    /// `lstat(2)`.
    pub fn lstat<P: AsRef<[u8]> + ?Sized>(&self, path: &P) -> VfsResult<Stat> {
        self.fstatat(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW)
    }

    /// `fstat(2)`: no reference taken on the file.
    pub fn fstat<'a>(&self, fd: impl Into<At<'a>> + Copy) -> VfsResult<Stat> {
        self.with_held(fd, |p| p.inode().stat())
    }

    /// What an fd (or a handle) holds, for the `f*` calls on it.
    fn with_held<'a, R>(
        &self,
        fd: impl Into<At<'a>> + Copy,
        f: impl FnOnce(&PathRef) -> R,
    ) -> VfsResult<R> {
        match fd.into() {
            At::Fd(fd) => {
                let g = epoch::pin();
                Ok(f(&self.files.get(fd, &g)?.path))
            }
            At::Handle(h) => Ok(f(h.path())),
        }
    }

    /// As `with_held`, keeping a counted reference.
    fn held<'a>(&self, fd: impl Into<At<'a>> + Copy) -> VfsResult<PathRef> {
        self.with_held(fd, PathRef::clone)
    }

    /// `faccessat2(2)`. `mode`: F_OK or R_OK|W_OK|X_OK; flags: AT_EACCESS,
    /// AT_SYMLINK_NOFOLLOW, AT_EMPTY_PATH.
    pub fn faccessat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        mode: u32,
        flags: u32,
    ) -> VfsResult<()> {
        let path = as_bytes(path);
        check_path(path)?;
        if mode & !7 != 0 {
            return Err(Errno::EINVAL);
        }
        if flags & !(AT_EACCESS | AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH) != 0 {
            return Err(Errno::EINVAL);
        }
        let g = epoch::pin();
        let cred = &self.cred;
        let check = |m: &Mount, i: &Inode| -> VfsResult<()> {
            let a = i.attr();
            if mode & W_OK != 0
                && m.is_readonly()
                && matches!(
                    i.file_type(),
                    FileType::Regular | FileType::Directory | FileType::Symlink
                )
            {
                return Err(Errno::EROFS);
            }
            if permission_ok(&a, cred, mode) {
                Ok(())
            } else {
                Err(Errno::EACCES)
            }
        };
        if path.is_empty() {
            if flags & AT_EMPTY_PATH == 0 {
                return Err(Errno::ENOENT);
            }
            let p = self.empty_path_target(dirfd, &g)?;
            return check(&p.mnt, p.inode());
        }
        let start = self.start(dirfd, path, &g)?;
        let follow = flags & AT_SYMLINK_NOFOLLOW == 0;
        self.ctx(&g).with_leaf(&g, start, path, follow, |m, d| {
            check(m, d.inode().ok_or(Errno::ENOENT)?)
        })
    }

    /// `access(2)`.
    pub fn access<P: AsRef<[u8]> + ?Sized>(&self, path: &P, mode: u32) -> VfsResult<()> {
        self.faccessat(AT_FDCWD, path, mode, 0)
    }

    /// `readlinkat(2)`: the whole target.
    pub fn readlinkat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
    ) -> VfsResult<Vec<u8>> {
        let path = as_bytes(path);
        check_path(path)?;
        let g = epoch::pin();
        let read = |m: &Mount, i: &Arc<Inode>| -> VfsResult<Vec<u8>> {
            if i.file_type() != FileType::Symlink {
                return Err(Errno::EINVAL);
            }
            match m.sb.fs.get_link_cached(i) {
                Some(b) => Ok(b.to_vec()),
                None => m.sb.fs.readlink(i),
            }
        };
        if path.is_empty() {
            // Linux: an empty path reads the link the dirfd (O_PATH) names.
            let p = self.empty_path_target(dirfd, &g)?;
            return match read(&p.mnt, p.inode()) {
                Err(Errno::EINVAL) => Err(Errno::ENOENT),
                r => r,
            };
        }
        let start = self.start(dirfd, path, &g)?;
        self.ctx(&g).with_leaf(&g, start, path, false, |m, d| {
            read(m, d.inode().ok_or(Errno::ENOENT)?)
        })
    }

    pub fn readlink<P: AsRef<[u8]> + ?Sized>(&self, path: &P) -> VfsResult<Vec<u8>> {
        self.readlinkat(AT_FDCWD, path)
    }

    /// `statfs(2)`.
    pub fn statfs<P: AsRef<[u8]> + ?Sized>(&self, path: &P) -> VfsResult<StatFs> {
        let path = as_bytes(path);
        check_path(path)?;
        let g = epoch::pin();
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        self.ctx(&g)
            .with_leaf(&g, Start::Cwd, path, true, |m, _| Ok(m.sb.fs.statfs()))
    }

    /// `fstatfs(2)`.
    pub fn fstatfs<'a>(&self, fd: impl Into<At<'a>> + Copy) -> VfsResult<StatFs> {
        self.with_held(fd, |p| p.mnt.sb.fs.statfs())
    }

    // ---------------------------------------------------------------
    // Walks that keep the result.
    // ---------------------------------------------------------------

    /// Resolve a path to a counted location.
    pub(crate) fn resolve<'a>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &[u8],
        follow: bool,
        empty_ok: bool,
    ) -> VfsResult<PathRef> {
        check_path(path)?;
        let g = epoch::pin();
        if path.is_empty() {
            if !empty_ok {
                return Err(Errno::ENOENT);
            }
            return self.empty_path_target(dirfd, &g);
        }
        let start = self.start(dirfd, path, &g)?;
        self.ctx(&g).walk(&g, start, path, follow)
    }

    fn parent_of<'a>(&self, dirfd: impl Into<At<'a>> + Copy, path: &[u8]) -> VfsResult<ParentWalk> {
        check_path(path)?;
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        let g = epoch::pin();
        let start = self.start(dirfd, path, &g)?;
        self.ctx(&g).walk_parent(&g, start, path)
    }

    /// `chdir(2)`.
    pub fn chdir<P: AsRef<[u8]> + ?Sized>(&self, path: &P) -> VfsResult<()> {
        let p = self.resolve(AT_FDCWD, as_bytes(path), true, false)?;
        self.set_cwd(p)
    }

    fn set_cwd(&self, p: PathRef) -> VfsResult<()> {
        if !p.inode().is_dir() {
            return Err(Errno::ENOTDIR);
        }
        if !permission_ok(&p.inode().attr(), &self.cred, X_OK) {
            return Err(Errno::EACCES);
        }
        self.fs.replace(|s| FsSnap {
            root: s.root.clone(),
            cwd: p,
        });
        Ok(())
    }

    /// `fchdir(2)`.
    pub fn fchdir(&self, fd: i32) -> VfsResult<()> {
        let p = {
            let g = epoch::pin();
            self.files.get(fd, &g)?.path.clone()
        };
        self.set_cwd(p)
    }

    /// `chroot(2)`: root only.
    pub fn chroot<P: AsRef<[u8]> + ?Sized>(&self, path: &P) -> VfsResult<()> {
        let p = self.resolve(AT_FDCWD, as_bytes(path), true, false)?;
        if !p.inode().is_dir() {
            return Err(Errno::ENOTDIR);
        }
        if !permission_ok(&p.inode().attr(), &self.cred, X_OK) {
            return Err(Errno::EACCES);
        }
        if !self.cred.is_root() {
            return Err(Errno::EPERM);
        }
        self.fs.replace(|s| FsSnap {
            root: p,
            cwd: s.cwd.clone(),
        });
        Ok(())
    }

    /// The cwd as a path from the task's root (getcwd). Built lock-free and
    /// validated with the rename seqcount (a rename or mount change during
    /// the climb could otherwise splice names from before and after it into
    /// a path that never existed); after `GETCWD_TRIES` failed tries it is
    /// built under the rename lock, as Linux's `d_path` falls back to
    /// `rename_lock`. A path of PATH_MAX bytes or more is ENAMETOOLONG; a
    /// removed cwd is ENOENT.
    pub fn getcwd(&self) -> VfsResult<Vec<u8>> {
        const GETCWD_TRIES: usize = 4;
        let g = epoch::pin();
        let s = self.fs.load(&g);
        let dc = self.vfs.dcache();
        for _ in 0..GETCWD_TRIES {
            let seq = dc.rename_read_begin();
            let r = cwd_path(&s.cwd, &s.root);
            if !dc.rename_retry(seq) {
                return r;
            }
            scalevfs_sync::lockstat::inc(scalevfs_sync::lockstat::Stat::SeqRetry);
        }
        dc.with_rename_lock(|| cwd_path(&s.cwd, &s.root))
    }

    // ---------------------------------------------------------------
    // Name operations.
    // ---------------------------------------------------------------

    /// Walk to the parent and require a normal last component.
    fn name_op<'a>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &[u8],
        special: Errno,
    ) -> VfsResult<NameOp> {
        let pw = self.parent_of(dirfd, path)?;
        let name = match &pw.last {
            Last::Normal(n) => n.clone(),
            _ => return Err(special),
        };
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        Ok(NameOp { pw, name })
    }

    fn name_lock(&self, parent: &Dentry, name: &[u8]) -> MutexGuard<'_, ()> {
        let i = self.vfs.name_lock_index(parent, name);
        self.vfs.inner.name_locks[i].lock_key(i as u64)
    }

    /// Lock two names' stripes in index order (once if they share one).
    fn name_lock2(
        &self,
        a: (&Dentry, &[u8]),
        b: (&Dentry, &[u8]),
    ) -> (MutexGuard<'_, ()>, Option<MutexGuard<'_, ()>>) {
        let ia = self.vfs.name_lock_index(a.0, a.1);
        let ib = self.vfs.name_lock_index(b.0, b.1);
        let locks = &self.vfs.inner.name_locks;
        let lk = |i: usize| locks[i].lock_key(i as u64);
        match ia.cmp(&ib) {
            std::cmp::Ordering::Equal => (lk(ia), None),
            std::cmp::Ordering::Less => {
                let x = lk(ia);
                (x, Some(lk(ib)))
            }
            std::cmp::Ordering::Greater => {
                let y = lk(ib);
                (lk(ia), Some(y))
            }
        }
    }

    /// Find the current dentry for a name (parent held, name lock held).
    fn lookup_child(&self, parent: &PathRef, name: &[u8]) -> VfsResult<Option<DentryRef>> {
        Ok(self
            .lookup_child_any(parent, name)?
            .filter(|d| !d.is_negative()))
    }

    /// As `lookup_child`, but a cached negative dentry is returned too
    /// (rename must unhash it when it moves a dentry onto its name).
    fn lookup_child_any(&self, parent: &PathRef, name: &[u8]) -> VfsResult<Option<DentryRef>> {
        let g = epoch::pin();
        match self.ctx(&g).lookup_slow(parent, name, true) {
            Ok(d) => Ok(Some(d)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn may_create(&self, dir: &PathRef) -> VfsResult<()> {
        let i = dir.inode();
        if i.is_dead() {
            return Err(Errno::ENOENT);
        }
        // inode_permission(MAY_WRITE): an immutable directory is EPERM.
        if i.is_immutable() {
            return Err(Errno::EPERM);
        }
        if !permission_ok(&i.attr(), &self.cred, W_OK | X_OK) {
            return Err(Errno::EACCES);
        }
        Ok(())
    }

    /// Linux's may_delete: `victim` in `dir`, `isdir` says what the
    /// operation expects.
    fn may_delete(&self, dir: &PathRef, victim: &Inode, isdir: bool) -> VfsResult<()> {
        let da = dir.inode().attr();
        // inode_permission(MAY_WRITE): an immutable directory is EPERM.
        if dir.inode().is_immutable() {
            return Err(Errno::EPERM);
        }
        if !permission_ok(&da, &self.cred, W_OK | X_OK) {
            return Err(Errno::EACCES);
        }
        // may_delete: an append-only directory, an immutable or append-only
        // victim.
        if dir.inode().is_append_only() || victim.is_immutable() || victim.is_append_only() {
            return Err(Errno::EPERM);
        }
        if da.mode & S_ISVTX != 0 && !self.cred.is_root() {
            let va = victim.attr();
            if self.cred.uid != da.uid && self.cred.uid != va.uid {
                return Err(Errno::EPERM);
            }
        }
        if isdir {
            if !victim.is_dir() {
                return Err(Errno::ENOTDIR);
            }
        } else if victim.is_dir() {
            return Err(Errno::EISDIR);
        }
        if dir.inode().is_dead() {
            return Err(Errno::ENOENT);
        }
        Ok(())
    }

    /// Linux's mode_strip_sgid: a non-directory created in a setgid
    /// directory (`inherited`) with setgid and group-execute loses setgid
    /// unless the creator is in the group it gets (`gid`) or is root
    /// (CAP_FSETID). `perm` is the permission part of the mode.
    pub(crate) fn strip_sgid(&self, perm: u32, gid: u32, inherited: bool) -> u32 {
        if inherited
            && perm & (S_ISGID | 0o010) == (S_ISGID | 0o010)
            && !self.cred.is_root()
            && !self.cred.in_group(gid)
        {
            perm & !S_ISGID
        } else {
            perm
        }
    }

    fn owner_for(&self, dir: &Inode) -> ((u32, u32), bool) {
        let a = dir.attr();
        if a.mode & S_ISGID != 0 {
            ((self.cred.uid, a.gid), true)
        } else {
            ((self.cred.uid, self.cred.gid), false)
        }
    }

    fn dir_shared<'a>(&self, i: &'a Inode) -> RwLockReadGuard<'a, ()> {
        i.dir_lock.read()
    }
    /// A victim directory's lock (rmdir, rename over a directory), taken
    /// with the parents' locks and the name stripes held: a try-lock only,
    /// so this acquisition never waits (see LOCKING RULES in `vfs.rs`).
    fn try_victim_excl<'a>(&self, i: &'a Inode) -> Option<RwLockWriteGuard<'a, ()>> {
        i.dir_lock.try_write_as(Class::DirVictim)
    }
    /// After `try_victim_excl` failed and every lock was dropped: wait,
    /// holding no lock, until the victim's lock has been free once, so the
    /// caller's retry is not a busy loop.
    fn wait_victim(&self, i: &Inode) {
        drop(i.dir_lock.write());
    }

    /// Common create path: parent locked shared, name locked, existence
    /// checked, then `make` builds the inode, then the dentry is added.
    fn create_node(
        &self,
        op: &NameOp,
        is_dir: bool,
        make: impl FnOnce(&Arc<dyn Filesystem>, &Arc<Inode>, (u32, u32), bool) -> VfsResult<Arc<Inode>>,
    ) -> VfsResult<DentryRef> {
        let mut ch = self.changes();
        let parent = &op.pw.parent;
        // Borrowed, not cloned: no RMW of the parent inode's shared Arc count
        // per create (issue 16); the same in the other name operations.
        let dir = parent.inode();
        let _dl = self.dir_shared(dir);
        let _nl = self.name_lock(&parent.dentry, &op.name);
        if self.lookup_child(parent, &op.name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        // Linux's filename_create: "foo/" asks for a directory; creating
        // anything else there is ENOENT (after the EEXIST check).
        if op.pw.trailing && !is_dir {
            return Err(Errno::ENOENT);
        }
        if parent.mnt.is_readonly() {
            return Err(Errno::EROFS);
        }
        self.may_create(parent)?;
        let (owner, sgid) = self.owner_for(dir);
        let inode = make(&parent.mnt.sb.fs, dir, owner, sgid)?;
        let q = self.vfs.dcache().qname(parent.dentry.as_ptr(), &op.name);
        let d = self.vfs.dcache().add(&parent.dentry, &q, Some(inode));
        ch.entry(dir, &op.name);
        Ok(d)
    }

    /// `mkdirat(2)`.
    pub fn mkdirat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        mode: u32,
    ) -> VfsResult<()> {
        let op = self.name_op(dirfd, as_bytes(path), Errno::EEXIST)?;
        let mode = mode & 0o1777 & !self.cur_umask();
        self.create_node(&op, true, |fs, dir, owner, sgid| {
            let m = if sgid { mode | S_ISGID } else { mode };
            fs.create(dir, &op.name, NewNode::Dir { mode: m }, owner)
        })?;
        Ok(())
    }

    pub fn mkdir<P: AsRef<[u8]> + ?Sized>(&self, path: &P, mode: u32) -> VfsResult<()> {
        self.mkdirat(AT_FDCWD, path, mode)
    }

    /// `mknodat(2)`: regular files, FIFOs and sockets; devices for root.
    pub fn mknodat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        mode: u32,
        dev: u64,
    ) -> VfsResult<()> {
        let ty = if mode & S_IFMT == 0 {
            S_IFREG
        } else {
            mode & S_IFMT
        };
        match FileType::from_mode(ty) {
            Some(FileType::Regular | FileType::Fifo | FileType::Socket) => {}
            Some(FileType::CharDevice | FileType::BlockDevice) => {}
            Some(FileType::Directory) => return Err(Errno::EPERM),
            _ => return Err(Errno::EINVAL),
        }
        let op = self.name_op(dirfd, as_bytes(path), Errno::EEXIST)?;
        let perm = mode & 0o7777 & !self.cur_umask();
        let rdev = if matches!(ty, S_IFCHR | S_IFBLK) {
            dev
        } else {
            0
        };
        self.create_node(&op, false, |fs, dir, owner, sgid| {
            // Linux's vfs_mknod checks CAP_MKNOD after may_create (EEXIST
            // and EACCES come first).
            if matches!(ty, S_IFCHR | S_IFBLK) && !self.cred.is_root() {
                return Err(Errno::EPERM);
            }
            let perm = self.strip_sgid(perm, owner.1, sgid);
            fs.create(
                dir,
                &op.name,
                NewNode::Node {
                    mode: ty | perm,
                    rdev,
                },
                owner,
            )
        })?;
        Ok(())
    }

    /// `symlinkat(2)`.
    pub fn symlinkat<'a, T: AsRef<[u8]> + ?Sized, P: AsRef<[u8]> + ?Sized>(
        &self,
        target: &T,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
    ) -> VfsResult<()> {
        let target = as_bytes(target);
        check_path(target)?;
        if target.is_empty() {
            return Err(Errno::ENOENT);
        }
        let op = self.name_op(dirfd, as_bytes(path), Errno::EEXIST)?;
        self.create_node(&op, false, |fs, dir, owner, _| {
            fs.create(dir, &op.name, NewNode::Symlink { target }, owner)
        })?;
        Ok(())
    }

    pub fn symlink<T: AsRef<[u8]> + ?Sized, P: AsRef<[u8]> + ?Sized>(
        &self,
        target: &T,
        path: &P,
    ) -> VfsResult<()> {
        self.symlinkat(target, AT_FDCWD, path)
    }

    /// `linkat(2)`. Flags: AT_SYMLINK_FOLLOW, AT_EMPTY_PATH.
    pub fn linkat<'a, P: AsRef<[u8]> + ?Sized, Q: AsRef<[u8]> + ?Sized>(
        &self,
        olddirfd: impl Into<At<'a>> + Copy,
        old: &P,
        newdirfd: impl Into<At<'a>> + Copy,
        new: &Q,
        flags: u32,
    ) -> VfsResult<()> {
        if flags & !(AT_SYMLINK_FOLLOW | AT_EMPTY_PATH) != 0 {
            return Err(Errno::EINVAL);
        }
        let old = as_bytes(old);
        if flags & AT_EMPTY_PATH != 0 && !self.cred.is_root() && old.is_empty() {
            return Err(Errno::ENOENT);
        }
        let src = self.resolve(
            olddirfd,
            old,
            flags & AT_SYMLINK_FOLLOW != 0,
            flags & AT_EMPTY_PATH != 0,
        )?;
        self.link_path(src, newdirfd, as_bytes(new))
    }

    /// Give the file open at `fd` (often an O_PATH fd) the new name
    /// `newdirfd`/`new`: `linkat(fd, "", newdirfd, new, AT_EMPTY_PATH)`
    /// without its CAP_DAC_READ_SEARCH requirement, so a front end that holds
    /// files by handle (FUSE's LINK) can link as an unprivileged caller. All
    /// of linkat's other checks (protected hardlinks, may_create) apply.
    pub fn link_fd<'a, Q: AsRef<[u8]> + ?Sized>(
        &self,
        fd: impl Into<At<'a>> + Copy,
        newdirfd: impl Into<At<'a>> + Copy,
        new: &Q,
    ) -> VfsResult<()> {
        let src = self.held(fd)?;
        self.link_path(src, newdirfd, as_bytes(new))
    }

    fn link_path<'a>(
        &self,
        src: PathRef,
        newdirfd: impl Into<At<'a>> + Copy,
        new: &[u8],
    ) -> VfsResult<()> {
        let mut ch = self.changes();
        let op = self.name_op(newdirfd, new, Errno::EEXIST)?;
        if !Arc::ptr_eq(&src.mnt, &op.pw.parent.mnt) {
            return Err(Errno::EXDEV);
        }
        let inode = src.inode().clone();
        let parent = &op.pw.parent;
        let dir = parent.inode();
        let _dl = self.dir_shared(dir);
        let _nl = self.name_lock(&parent.dentry, &op.name);
        if self.lookup_child(parent, &op.name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        if op.pw.trailing {
            return Err(Errno::ENOENT);
        }
        if parent.mnt.is_readonly() {
            return Err(Errno::EROFS);
        }
        // do_linkat: may_linkat (EPERM) before vfs_link's may_create.
        self.may_linkat(&inode)?;
        self.may_create(parent)?;
        // vfs_link: an immutable or append-only file gets no new name.
        if inode.is_immutable() || inode.is_append_only() {
            return Err(Errno::EPERM);
        }
        if inode.is_dir() {
            return Err(Errno::EPERM);
        }
        // vfs_link: a file with no name stays nameless, unless it is an
        // O_TMPFILE file opened without O_EXCL (I_LINKABLE).
        let revive = inode.attr().nlink == 0;
        if revive && inode.flags() & crate::inode::I_LINKABLE == 0 {
            return Err(Errno::ENOENT);
        }
        parent.mnt.sb.fs.link(dir, &op.name, &inode)?;
        if revive {
            inode.clear_flag(crate::inode::I_LINKABLE);
            crate::orphan::mark_linked(&parent.mnt.sb.orphans, &inode);
        }
        ch.entry(dir, &op.name);
        ch.inode(&inode);
        let q = self.vfs.dcache().qname(parent.dentry.as_ptr(), &op.name);
        drop(self.vfs.dcache().add(&parent.dentry, &q, Some(inode)));
        Ok(())
    }

    pub fn link<P: AsRef<[u8]> + ?Sized, Q: AsRef<[u8]> + ?Sized>(
        &self,
        old: &P,
        new: &Q,
    ) -> VfsResult<()> {
        self.linkat(AT_FDCWD, old, AT_FDCWD, new, 0)
    }

    /// Linux's protected_hardlinks (on by default; config key
    /// `protected-hardlinks`): a non-owner may link only a regular,
    /// non-setuid file they can read and write.
    fn may_linkat(&self, inode: &Inode) -> VfsResult<()> {
        if self.vfs.config().protected_hardlinks_off {
            return Ok(());
        }
        let a = inode.attr();
        if self.cred.is_root() || self.cred.uid == a.uid {
            return Ok(());
        }
        let safe = inode.file_type() == FileType::Regular
            && a.mode & S_ISUID == 0
            && a.mode & (S_ISGID | 0o010) != (S_ISGID | 0o010)
            && permission_ok(&a, &self.cred, R_OK | W_OK);
        if safe {
            Ok(())
        } else {
            Err(Errno::EPERM)
        }
    }

    /// `unlinkat(2)`. Flags: AT_REMOVEDIR.
    pub fn unlinkat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        flags: u32,
    ) -> VfsResult<()> {
        if flags & !AT_REMOVEDIR != 0 {
            return Err(Errno::EINVAL);
        }
        let path = as_bytes(path);
        let rmdir = flags & AT_REMOVEDIR != 0;
        let pw = self.parent_of(dirfd, path)?;
        let name = match &pw.last {
            Last::Normal(n) => n.clone(),
            Last::Dot if rmdir => return Err(Errno::EINVAL),
            Last::DotDot if rmdir => return Err(Errno::ENOTEMPTY),
            Last::Root if rmdir => return Err(Errno::EBUSY),
            _ => return Err(Errno::EISDIR),
        };
        if pw.parent.mnt.is_readonly() {
            return Err(Errno::EROFS);
        }
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut ch = self.changes();
        let parent = &pw.parent;
        let dir = parent.inode();
        let fs = &parent.mnt.sb.fs;
        // Retried only when the victim directory's lock was busy (see
        // `try_victim_excl`); each retry first waits for that lock.
        loop {
            let _dl = self.dir_shared(dir);
            let _nl = self.name_lock(&parent.dentry, &name);
            let victim = self.lookup_child(parent, &name)?.ok_or(Errno::ENOENT)?;
            let vi = victim.inode().ok_or(Errno::ENOENT)?.clone();
            if !rmdir && pw.trailing {
                return Err(if vi.is_dir() {
                    Errno::EISDIR
                } else {
                    Errno::ENOTDIR
                });
            }
            self.may_delete(parent, &vi, rmdir)?;
            if victim.is_mounted() {
                return Err(Errno::EBUSY);
            }
            if rmdir {
                {
                    let g = epoch::pin();
                    let s = self.fs.load(&g);
                    if s.root.dentry == victim {
                        return Err(Errno::EBUSY);
                    }
                }
                let Some(_vl) = self.try_victim_excl(&vi) else {
                    drop(_nl);
                    drop(_dl);
                    self.wait_victim(&vi);
                    continue;
                };
                fs.rmdir(dir, &name, &vi)?;
                vi.set_flag(crate::inode::I_DEAD);
            } else {
                fs.unlink(dir, &name, &vi)?;
                if vi.attr().nlink == 0 {
                    // Still open somewhere: onto the orphan file (orphan.rs).
                    crate::orphan::mark_unlinked(&parent.mnt.sb.orphans, &vi);
                }
            }
            self.vfs.dcache().unhash(&victim);
            ch.entry(dir, &name);
            ch.inode(&vi);
            return Ok(());
        }
    }

    pub fn unlink<P: AsRef<[u8]> + ?Sized>(&self, path: &P) -> VfsResult<()> {
        self.unlinkat(AT_FDCWD, path, 0)
    }
    pub fn rmdir<P: AsRef<[u8]> + ?Sized>(&self, path: &P) -> VfsResult<()> {
        self.unlinkat(AT_FDCWD, path, AT_REMOVEDIR)
    }

    /// `renameat2(2)`. Flags: RENAME_NOREPLACE, RENAME_EXCHANGE.
    pub fn renameat2<'a, P: AsRef<[u8]> + ?Sized, Q: AsRef<[u8]> + ?Sized>(
        &self,
        olddirfd: impl Into<At<'a>> + Copy,
        old: &P,
        newdirfd: impl Into<At<'a>> + Copy,
        new: &Q,
        flags: u32,
    ) -> VfsResult<()> {
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) != 0 {
            return Err(Errno::EINVAL);
        }
        if flags & (RENAME_NOREPLACE | RENAME_WHITEOUT) != 0 && flags & RENAME_EXCHANGE != 0 {
            return Err(Errno::EINVAL);
        }
        // RENAME_WHITEOUT (overlayfs's): the old name becomes a whiteout, a
        // character device 0:0 with no permission bits owned by the caller,
        // as tmpfs makes it. No CAP_MKNOD needed (Linux 5.8 and later).
        let whiteout = flags & RENAME_WHITEOUT != 0;
        let exchange = flags & RENAME_EXCHANGE != 0;
        let opw = self.parent_of(olddirfd, as_bytes(old))?;
        let npw = self.parent_of(newdirfd, as_bytes(new))?;
        if !Arc::ptr_eq(&opw.parent.mnt, &npw.parent.mnt) {
            return Err(Errno::EXDEV);
        }
        let Last::Normal(oname) = opw.last.clone() else {
            return Err(Errno::EBUSY);
        };
        let nname = match npw.last.clone() {
            Last::Normal(n) => n,
            _ => {
                return Err(if flags & RENAME_NOREPLACE != 0 {
                    Errno::EEXIST
                } else {
                    Errno::EBUSY
                })
            }
        };
        if opw.parent.mnt.is_readonly() {
            return Err(Errno::EROFS);
        }
        if oname.len() > NAME_MAX || nname.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut ch = self.changes();
        let op = &opw.parent;
        let np = &npw.parent;
        let sb = op.mnt.sb.clone();
        let cross = op.dentry != np.dentry;
        let odir = op.inode().clone();
        let ndir = np.inode().clone();
        // Retried only when a victim directory's lock was busy (see
        // `try_victim_excl`); each retry first waits for that lock.
        loop {
            let _rm = if cross {
                Some(sb.rename_mutex.lock())
            } else {
                None
            };
            // Parents shared: an ancestor before its descendant, else in address
            // order (the tree's shape is stable under the rename mutex).
            let (_d1, _d2) = if !cross {
                (self.dir_shared(&odir), None)
            } else if is_ancestor(&op.dentry, &np.dentry)
                || (!is_ancestor(&np.dentry, &op.dentry) && Arc::as_ptr(&odir) < Arc::as_ptr(&ndir))
            {
                let a = self.dir_shared(&odir);
                (a, Some(self.dir_shared(&ndir)))
            } else {
                let b = self.dir_shared(&ndir);
                (self.dir_shared(&odir), Some(b))
            };
            let _nl = self.name_lock2((&op.dentry, &oname), (&np.dentry, &nname));
            let src = self.lookup_child(op, &oname)?.ok_or(Errno::ENOENT)?;
            let si = src.inode().ok_or(Errno::ENOENT)?.clone();
            // `dst_any` may be a negative dentry: d_move must unhash it, or it
            // would stay hashed behind the moved dentry and, once that one is
            // evicted, hide the name (a later create would then overwrite it).
            let dst_any = self.lookup_child_any(np, &nname)?;
            let dst = dst_any.as_ref().filter(|d| !d.is_negative()).cloned();
            let di = dst.as_ref().and_then(|d| d.inode().cloned());
            // do_renameat2's order: EEXIST / the exchange target's ENOENT
            // before the trailing-slash ENOTDIRs; a trailing slash counts
            // against the name it ends (and, when not exchanging, a slash
            // on the new name against a source that is no directory).
            if flags & RENAME_NOREPLACE != 0 && di.is_some() {
                return Err(Errno::EEXIST);
            }
            if exchange {
                match &di {
                    None => return Err(Errno::ENOENT),
                    Some(d) if !d.is_dir() && npw.trailing => return Err(Errno::ENOTDIR),
                    _ => {}
                }
            }
            if !si.is_dir() && (opw.trailing || (!exchange && npw.trailing)) {
                return Err(Errno::ENOTDIR);
            }
            // Source must not be an ancestor of the target's parent, and the
            // target must not be an ancestor of the source's parent.
            if cross {
                if is_ancestor(&src, &np.dentry) {
                    return Err(Errno::EINVAL);
                }
                if let Some(d) = &dst {
                    if is_ancestor(d, &op.dentry) {
                        return Err(if exchange {
                            Errno::EINVAL
                        } else {
                            Errno::ENOTEMPTY
                        });
                    }
                }
            }
            if let Some(d) = &di {
                if Arc::ptr_eq(d, &si) {
                    // Two names of one inode (or the same name): nothing to do.
                    return Ok(());
                }
            }
            self.may_delete(op, &si, si.is_dir())?;
            match &di {
                Some(d) => {
                    if exchange {
                        self.may_delete(np, d, d.is_dir())?;
                    } else {
                        self.may_delete(np, d, si.is_dir())?;
                    }
                }
                None => self.may_create(np)?,
            }
            if cross && si.is_dir() && !permission_ok(&si.attr(), &self.cred, W_OK) {
                return Err(Errno::EACCES);
            }
            if exchange && cross {
                if let Some(d) = &di {
                    if d.is_dir() && !permission_ok(&d.attr(), &self.cred, W_OK) {
                        return Err(Errno::EACCES);
                    }
                }
            }
            if src.is_mounted() || dst.as_ref().is_some_and(|d| d.is_mounted()) {
                return Err(Errno::EBUSY);
            }
            {
                let g = epoch::pin();
                let s = self.fs.load(&g);
                if s.root.dentry == src || dst.as_ref().is_some_and(|d| *d == s.root.dentry) {
                    return Err(Errno::EBUSY);
                }
            }
            let _vl = match (&di, exchange) {
                (Some(d), false) if d.is_dir() => match self.try_victim_excl(d) {
                    Some(g) => Some(g),
                    None => {
                        drop(_nl);
                        drop(_d2);
                        drop(_d1);
                        drop(_rm);
                        self.wait_victim(d);
                        continue;
                    }
                },
                _ => None,
            };
            sb.fs
                .rename(&odir, &oname, &ndir, &nname, &si, di.as_ref(), exchange)?;
            // The whiteout, made once the name is free (tmpfs makes it first;
            // here a failure, ENOSPC of inodes, leaves the rename done and
            // no whiteout, and is returned).
            let wo = if whiteout {
                let (owner, _) = self.owner_for(&odir);
                let node = NewNode::Node {
                    mode: S_IFCHR,
                    rdev: 0,
                };
                Some(sb.fs.create(&odir, &oname, node, owner))
            } else {
                None
            };
            if let Some(d) = di.as_ref().filter(|d| !exchange && d.attr().nlink == 0) {
                // The replaced file may still be open: onto the orphan file.
                crate::orphan::mark_unlinked(&sb.orphans, d);
            }
            let dc = self.vfs.dcache();
            if exchange {
                if let Some(d) = &dst {
                    dc.d_exchange(&src, d);
                }
            } else {
                if let Some(d) = &di {
                    if d.is_dir() {
                        d.set_flag(crate::inode::I_DEAD);
                    }
                }
                dc.d_move(&src, &np.dentry, &nname, dst_any.as_ref());
            }
            if let Some(Ok(w)) = &wo {
                let q = dc.qname(op.dentry.as_ptr(), &oname);
                drop(dc.add(&op.dentry, &q, Some(w.clone())));
            }
            ch.entry(&odir, &oname);
            ch.entry(&ndir, &nname);
            ch.inode(&si);
            if let Some(d) = &di {
                ch.inode(d);
            }
            return wo.map_or(Ok(()), |w| w.map(drop));
        }
    }

    pub fn rename<P: AsRef<[u8]> + ?Sized, Q: AsRef<[u8]> + ?Sized>(
        &self,
        old: &P,
        new: &Q,
    ) -> VfsResult<()> {
        self.renameat2(AT_FDCWD, old, AT_FDCWD, new, 0)
    }

    // ---------------------------------------------------------------
    // Attribute changes.
    // ---------------------------------------------------------------

    fn setattr_target<'a>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &[u8],
        flags: u32,
    ) -> VfsResult<PathRef> {
        if flags & !(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH) != 0 {
            return Err(Errno::EINVAL);
        }
        self.resolve(
            dirfd,
            path,
            flags & AT_SYMLINK_NOFOLLOW == 0,
            flags & AT_EMPTY_PATH != 0,
        )
    }

    /// Apply `set` to the inode at `p` and report the change (no lock is
    /// held here, so listeners run at once).
    fn setattr_and_report(&self, p: &PathRef, set: &SetAttr) -> VfsResult<()> {
        let i = p.inode();
        p.mnt.sb.fs.setattr(i, set)?;
        self.changes().inode(i);
        Ok(())
    }

    fn is_owner(&self, a: &Attr) -> bool {
        self.cred.is_root() || self.cred.uid == a.uid
    }

    /// `fchmodat(2)`.
    pub fn fchmodat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        mode: u32,
        flags: u32,
    ) -> VfsResult<()> {
        let p = self.setattr_target(dirfd, as_bytes(path), flags)?;
        if flags & AT_SYMLINK_NOFOLLOW != 0 && p.inode().file_type() == FileType::Symlink {
            return Err(Errno::EOPNOTSUPP);
        }
        self.chmod_path(&p, mode)
    }

    pub fn chmod<P: AsRef<[u8]> + ?Sized>(&self, path: &P, mode: u32) -> VfsResult<()> {
        self.fchmodat(AT_FDCWD, path, mode, 0)
    }

    /// `fchmod(2)`.
    pub fn fchmod<'a>(&self, fd: impl Into<At<'a>> + Copy, mode: u32) -> VfsResult<()> {
        let p = self.held(fd)?;
        self.chmod_path(&p, mode)
    }

    /// `ioctl(fd, FS_IOC_GETFLAGS)`: the chattr flags (`FS_*_FL`). Any
    /// open file but O_PATH (EBADF); fifos, sockets and devices are ENOTTY
    /// (their ioctls are the driver's), as on tmpfs.
    pub fn ioctl_getflags(&self, fd: i32) -> VfsResult<u32> {
        let f = self.files.get_arc(fd)?;
        if f.is_path_only() {
            return Err(Errno::EBADF);
        }
        let i = f.inode();
        if !matches!(i.file_type(), FileType::Regular | FileType::Directory) {
            return Err(Errno::ENOTTY);
        }
        Ok(i.fs_flags())
    }

    /// `ioctl(fd, FS_IOC_SETFLAGS, &flags)`, in Linux's order: EROFS on a
    /// read-only mount, EPERM unless owner or root, EPERM when a non-root
    /// task changes FS_IMMUTABLE_FL or FS_APPEND_FL (CAP_LINUX_IMMUTABLE),
    /// EOPNOTSUPP for a flag memfs does not keep (tmpfs's set). The ctime
    /// changes. Needs no write access to the file.
    pub fn ioctl_setflags(&self, fd: i32, flags: u32) -> VfsResult<()> {
        use crate::inode::{FS_APPEND_FL, FS_FL_SETTABLE, FS_IMMUTABLE_FL};
        let f = self.files.get_arc(fd)?;
        if f.is_path_only() {
            return Err(Errno::EBADF);
        }
        let i = f.inode();
        if f.path().mnt.is_readonly() {
            return Err(Errno::EROFS);
        }
        if !self.is_owner(&i.attr()) {
            return Err(Errno::EPERM);
        }
        if !matches!(i.file_type(), FileType::Regular | FileType::Directory) {
            return Err(Errno::ENOTTY);
        }
        // Under the data lock, so a write or truncate that checked the
        // flags finishes first (Linux holds the inode lock here).
        let _pin = epoch::pin();
        let _w = i.data_lock.write();
        let old = i.fs_flags();
        if (old ^ flags) & (FS_IMMUTABLE_FL | FS_APPEND_FL) != 0 && !self.cred.is_root() {
            return Err(Errno::EPERM);
        }
        if flags & !FS_FL_SETTABLE != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        i.set_fs_flags(flags);
        let now = Timespec::now();
        i.update_attr(|a| a.set_ctime(now));
        drop(_w);
        self.changes().inode(i);
        Ok(())
    }

    fn chmod_path(&self, p: &PathRef, mode: u32) -> VfsResult<()> {
        let i = p.inode();
        if p.mnt.is_readonly() {
            return Err(Errno::EROFS);
        }
        let a = i.attr();
        // notify_change: no mode change on an immutable or append-only file.
        if !self.is_owner(&a) || i.is_immutable() || i.is_append_only() {
            return Err(Errno::EPERM);
        }
        let mut m = mode & 0o7777;
        if !self.cred.is_root() && !self.cred.in_group(a.gid) {
            m &= !S_ISGID;
        }
        let set = SetAttr {
            mode: Some(m),
            ctime: Some(Timespec::now()),
            ..Default::default()
        };
        self.setattr_and_report(p, &set)
    }

    /// `fchownat(2)`: `uid`/`gid` of `u32::MAX` (-1) leave that id alone.
    pub fn fchownat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        uid: u32,
        gid: u32,
        flags: u32,
    ) -> VfsResult<()> {
        let p = self.setattr_target(dirfd, as_bytes(path), flags)?;
        self.chown_path(&p, uid, gid)
    }

    pub fn chown<P: AsRef<[u8]> + ?Sized>(&self, path: &P, uid: u32, gid: u32) -> VfsResult<()> {
        self.fchownat(AT_FDCWD, path, uid, gid, 0)
    }

    /// `fchown(2)`.
    pub fn fchown<'a>(&self, fd: impl Into<At<'a>> + Copy, uid: u32, gid: u32) -> VfsResult<()> {
        let p = self.held(fd)?;
        self.chown_path(&p, uid, gid)
    }

    fn chown_path(&self, p: &PathRef, uid: u32, gid: u32) -> VfsResult<()> {
        let i = p.inode();
        if p.mnt.is_readonly() {
            return Err(Errno::EROFS);
        }
        let a = i.attr();
        let uid = (uid != u32::MAX).then_some(uid);
        let gid = (gid != u32::MAX).then_some(gid);
        // notify_change: no owner change on an immutable or append-only file.
        if (uid.is_some() || gid.is_some()) && (i.is_immutable() || i.is_append_only()) {
            return Err(Errno::EPERM);
        }
        if !self.cred.is_root() {
            if let Some(u) = uid {
                if u != a.uid {
                    return Err(Errno::EPERM);
                }
            }
            if let Some(g) = gid {
                if self.cred.uid != a.uid || (g != a.gid && !self.cred.in_group(g)) {
                    return Err(Errno::EPERM);
                }
            }
        }
        let mut set = SetAttr {
            uid,
            gid,
            ctime: Some(Timespec::now()),
            ..Default::default()
        };
        // Linux clears setuid of a non-directory on every chown, by root too
        // and for chown(f, -1, -1) too (chown_common's ATTR_KILL_SUID), and
        // setgid where `setattr_should_drop_sgid` says: with group-exec, or
        // when the caller is neither in the file's group nor root.
        if !i.is_dir() {
            let mut m = a.mode & 0o7777;
            m &= !S_ISUID;
            if m & 0o010 != 0 || (!self.cred.is_root() && !self.cred.in_group(a.gid)) {
                m &= !S_ISGID;
            }
            if m != a.mode & 0o7777 {
                set.mode = Some(m);
            }
        }
        self.setattr_and_report(p, &set)
    }

    /// `utimensat(2)`: `times` of `None` sets both to now; a nanosecond of
    /// UTIME_NOW/UTIME_OMIT selects that behaviour per time.
    pub fn utimensat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        times: Option<[Timespec; 2]>,
        flags: u32,
    ) -> VfsResult<()> {
        check_times(&times)?;
        let p = self.setattr_target(dirfd, as_bytes(path), flags)?;
        self.utimens_path(&p, times)
    }

    /// `futimens(2)`.
    pub fn futimens<'a>(
        &self,
        fd: impl Into<At<'a>> + Copy,
        times: Option<[Timespec; 2]>,
    ) -> VfsResult<()> {
        // Linux's do_utimes checks the times before it looks at the fd.
        check_times(&times)?;
        let p = self.held(fd)?;
        self.utimens_path(&p, times)
    }

    fn utimens_path(&self, p: &PathRef, times: Option<[Timespec; 2]>) -> VfsResult<()> {
        let i = p.inode();
        let times = match times {
            Some([a, m]) if a.nsec == UTIME_OMIT && m.nsec == UTIME_OMIT => return Ok(()),
            Some([a, m]) if a.nsec == UTIME_NOW && m.nsec == UTIME_NOW => None,
            t => t,
        };
        if p.mnt.is_readonly() {
            return Err(Errno::EROFS);
        }
        let a = i.attr();
        let now = Timespec::now();
        // notify_change: setting times is EPERM on an immutable or
        // append-only file; touching them (now) only on an immutable one.
        if i.is_immutable() || (times.is_some() && i.is_append_only()) {
            return Err(Errno::EPERM);
        }
        let set = match times {
            None => {
                if !self.is_owner(&a) && !permission_ok(&a, &self.cred, W_OK) {
                    return Err(Errno::EACCES);
                }
                SetAttr {
                    atime: Some(now),
                    mtime: Some(now),
                    ctime: Some(now),
                    ..Default::default()
                }
            }
            Some([at, mt]) => {
                if !self.is_owner(&a) {
                    return Err(Errno::EPERM);
                }
                let pick = |t: Timespec| match t.nsec {
                    UTIME_OMIT => None,
                    UTIME_NOW => Some(now),
                    _ => Some(t),
                };
                SetAttr {
                    atime: pick(at),
                    mtime: pick(mt),
                    ctime: Some(now),
                    ..Default::default()
                }
            }
        };
        self.setattr_and_report(p, &set)
    }

    // ---------------------------------------------------------------
    // Mounts.
    // ---------------------------------------------------------------

    /// Mount `fs` on the directory `path` (root only).
    pub fn mount<P: AsRef<[u8]> + ?Sized>(
        &self,
        path: &P,
        fs: Arc<dyn Filesystem>,
        readonly: bool,
    ) -> VfsResult<()> {
        if !self.cred.is_root() {
            return Err(Errno::EPERM);
        }
        let p = self.resolve(AT_FDCWD, as_bytes(path), true, false)?;
        self.vfs.mount_at(p, fs, readonly)
    }

    /// `mount -o remount,ro` (`readonly`) or `remount,rw` of the mount whose
    /// root is `path` (root only, EPERM): EINVAL if `path` is not a mount
    /// root, EBUSY for `ro` while a regular file is open for writing
    /// through it. While read-only, every change through it is EROFS.
    pub fn remount<P: AsRef<[u8]> + ?Sized>(&self, path: &P, readonly: bool) -> VfsResult<()> {
        if !self.cred.is_root() {
            return Err(Errno::EPERM);
        }
        let p = self.resolve(AT_FDCWD, as_bytes(path), true, false)?;
        self.vfs.remount_at(&p, readonly)
    }

    /// `mount -o remount,noatime` (`on`) or `remount,relatime` of the
    /// mount whose root is `path` (root only, EPERM; EINVAL if `path` is not
    /// a mount root): with it, reads never update atime.
    pub fn set_noatime<P: AsRef<[u8]> + ?Sized>(&self, path: &P, on: bool) -> VfsResult<()> {
        if !self.cred.is_root() {
            return Err(Errno::EPERM);
        }
        let p = self.resolve(AT_FDCWD, as_bytes(path), true, false)?;
        if !std::ptr::eq(p.dentry.as_ptr(), p.mnt.root.as_ptr()) {
            return Err(Errno::EINVAL);
        }
        // Relaxed: see Mount::is_noatime.
        p.mnt.noatime.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Unmount the filesystem mounted at `path` (root only).
    pub fn umount<P: AsRef<[u8]> + ?Sized>(&self, path: &P) -> VfsResult<()> {
        if !self.cred.is_root() {
            return Err(Errno::EPERM);
        }
        let p = self.resolve(AT_FDCWD, as_bytes(path), true, false)?;
        self.vfs.umount_at(&p)
    }

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
        // The fd first, as Linux's do_sys_openat2: a full table must fail
        // the open before O_CREAT makes a name.
        let fd = self.files.reserve()?;
        match self.open_file(dirfd, as_bytes(path), flags & !FMODE_EXEC, mode) {
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
            return File::new(p, flags & (O_PATH | O_DIRECTORY | O_NOFOLLOW));
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
        let flags = flags & !(O_CREAT | O_EXCL | (O_TMPFILE & !O_DIRECTORY) | O_PATH);
        if flags & O_ACCMODE == O_ACCMODE {
            return Err(Errno::EINVAL);
        }
        let p = self.held(fd)?;
        let file = self.open_resolved(p, flags)?;
        self.files
            .install(Arc::new(file), flags & O_CLOEXEC != 0, 0)
    }

    /// The checks and truncation of open(2) on a resolved location.
    fn open_resolved(&self, p: PathRef, flags: u32) -> VfsResult<File> {
        self.open_checked(p, flags, false)
    }

    /// Linux's `do_open` + `may_open` on the final location. A file this
    /// open just created (`created`) skips the permission checks and O_TRUNC.
    fn open_checked(&self, p: PathRef, flags: u32, created: bool) -> VfsResult<File> {
        read_only_race(self.open_checked_inner(p, flags, created))
    }

    fn open_checked_inner(&self, p: PathRef, flags: u32, created: bool) -> VfsResult<File> {
        if created {
            return File::new(p, flags & !FMODE_EXEC);
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
        if !permission_ok(&a, &self.cred, want) {
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
        let file = File::new(p, flags)?;
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
    fn open_create<'a>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &[u8],
        flags: u32,
        mode: u32,
        depth: u32,
    ) -> VfsResult<(PathRef, bool)> {
        if depth > MAX_SYMLINKS {
            return Err(Errno::ELOOP);
        }
        let pw = self.parent_of(dirfd, path)?;
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
            let _dl = self.dir_shared(dir);
            let _nl = self.name_lock(&parent.dentry, &name);
            match self.lookup_child(parent, &name)? {
                Some(d) => d,
                None => {
                    if parent.mnt.is_readonly() {
                        return Err(Errno::EROFS);
                    }
                    self.may_create(parent)?;
                    let (owner, sgid) = self.owner_for(dir);
                    let perm = self.strip_sgid(mode & 0o7777 & !self.cur_umask(), owner.1, sgid);
                    let node = NewNode::Node {
                        mode: S_IFREG | perm,
                        rdev: 0,
                    };
                    let inode = parent.mnt.sb.fs.create(dir, &name, node, owner)?;
                    let q = self.vfs.dcache().qname(parent.dentry.as_ptr(), &name);
                    let d = self.vfs.dcache().add(&parent.dentry, &q, Some(inode));
                    // Reported when `ch` drops, after the locks.
                    ch.entry(dir, &name);
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
            match self.resolve(dirfd, path, true, false) {
                Err(Errno::ENOENT) => {}
                r => return r.map(|p| (p, false)),
            }
            // Dangling: create the target, named relative to the link's
            // directory (the path with its last component replaced).
            let target = self.readlinkat(dirfd, path)?;
            let next = if target.first() == Some(&b'/') {
                target
            } else {
                let cut = path.iter().rposition(|&c| c == b'/').map_or(0, |k| k + 1);
                let mut v = path[..cut].to_vec();
                v.extend_from_slice(&target);
                v
            };
            return self.open_create(dirfd, &next, flags, mode, depth + 1);
        }
        Ok((self.cross_mounts(here), false))
    }

    fn cross_mounts(&self, p: PathRef) -> PathRef {
        if !p.dentry.is_mounted() {
            return p;
        }
        let g = epoch::pin();
        let t = self.vfs.table(&g);
        match t
            .on
            .get(&(Arc::as_ptr(&p.mnt) as usize, p.dentry.as_ptr() as usize))
        {
            Some(m) => PathRef {
                mnt: m.clone(),
                dentry: m.root.clone(),
            },
            None => p,
        }
    }

    /// O_TMPFILE: an unnamed regular file in the directory `path`; it is an
    /// orphan from birth (nlink 0; `File::new` records it).
    fn open_tmpfile<'a>(
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
        if p.mnt.is_readonly() {
            return Err(Errno::EROFS);
        }
        self.may_create(&p)?;
        let (owner, sgid) = self.owner_for(p.inode());
        let perm = self.strip_sgid(mode & 0o7777 & !self.cur_umask(), owner.1, sgid);
        let inode = p.mnt.sb.fs.create_tmpfile(p.inode(), perm, owner)?;
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
        )
    }

    /// `close(2)`.
    pub fn close(&self, fd: i32) -> VfsResult<()> {
        self.files.close(fd)
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
    /// vector at the end.
    pub fn getdents(&self, fd: i32, max: usize) -> VfsResult<Vec<DirEntry>> {
        let f = self.files.get_arc(fd)?;
        if f.is_path_only() {
            return Err(Errno::EBADF);
        }
        let i = f.inode().clone();
        if !i.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        // Linux's f_pos_lock (fdget_pos): two getdents on one shared
        // description must not both list from the same position. Order:
        // pos_lock -> dir_lock, as for writes.
        let _pl = f.pos_lock.lock();
        let _dl = self.dir_shared(&i);
        if i.is_dead() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut pos = f.position();
        let max = max.max(1);
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
        let fs = &f.path.mnt.sb.fs;
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
            fs.readdir(&i, pos, &mut |e| {
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
            })?;
        }
        // Relaxed: a value, written under pos_lock.
        f.pos.store(pos, Ordering::Relaxed);
        Ok(out)
    }

    fn dotdot_ino(&self, p: &PathRef) -> u64 {
        let g = epoch::pin();
        let s = self.fs.load(&g);
        // Common case, neither the task's root nor a mount root: the parent
        // dentry read under the guard, without taking references on the
        // directory or its parent (two listings would write both dentries'
        // counts: conflict matrix, issue 16). A racing rename makes it the
        // old or the new parent, as a walk of ".." would.
        if !p.same(Arc::as_ptr(&s.root.mnt), s.root.dentry.as_ptr())
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

/// The path of `cwd` from `root`, climbing raw parent pointers. Called
/// pinned (the caller validates with the rename seqcount: a torn read is
/// thrown away, and the PATH_MAX bound ends a climb that a race sent round
/// a loop) or under the rename lock (then it is exact). Pins nothing, takes
/// no lock.
fn cwd_path(cwd: &PathRef, root: &PathRef) -> VfsResult<Vec<u8>> {
    let mut mnt = cwd.mnt.clone();
    let mut d: *const Dentry = cwd.dentry.as_ptr();
    let mut parts: Vec<Vec<u8>> = Vec::new();
    let mut len = 0usize;
    loop {
        if std::ptr::eq(Arc::as_ptr(&mnt), Arc::as_ptr(&root.mnt))
            && std::ptr::eq(d, root.dentry.as_ptr())
        {
            break;
        }
        if std::ptr::eq(d, mnt.root.as_ptr()) {
            match mnt.parent.clone() {
                Some((pm, pd)) => {
                    d = pd.as_ptr();
                    mnt = pm;
                    continue;
                }
                None => break,
            }
        }
        // SAFETY: `cwd` holds a reference on its dentry and every live
        // dentry one on its parent; a parent pointer read racily may name a
        // dentry released since, whose memory the caller's epoch guard (or
        // the rename lock, under which no pointer changes) keeps valid.
        let de = unsafe { &*d };
        if !de.is_hashed() {
            return Err(Errno::ENOENT);
        }
        let name = de.name_vec();
        len += 1 + name.len();
        if len + 1 > PATH_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        parts.push(name);
        d = de.parent_ptr();
    }
    let mut out = Vec::with_capacity(len.max(1));
    for p in parts.iter().rev() {
        out.push(b'/');
        out.extend_from_slice(p);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Ok(out)
}

/// utimensat's EINVAL: a nanosecond field outside 0..1e9 that is neither
/// UTIME_NOW nor UTIME_OMIT.
fn check_times(times: &Option<[Timespec; 2]>) -> VfsResult<()> {
    if let Some(t) = times {
        for ts in t {
            let special = ts.nsec == UTIME_NOW || ts.nsec == UTIME_OMIT;
            if !special && !(0..1_000_000_000).contains(&ts.nsec) {
                return Err(Errno::EINVAL);
            }
        }
    }
    Ok(())
}

fn stat_of(m: &Mount, d: &Dentry) -> VfsResult<Stat> {
    let _ = m;
    Ok(d.inode().ok_or(Errno::ENOENT)?.stat())
}

/// Whether `a` is `d` or an ancestor of `d` (rename lock held).
fn is_ancestor(a: &Dentry, d: &Dentry) -> bool {
    let mut cur: *const Dentry = d;
    loop {
        if std::ptr::eq(cur, a) {
            return true;
        }
        // SAFETY: ancestors of a referenced dentry are referenced by their
        // children; the fs rename mutex keeps the chain from changing.
        let c = unsafe { &*cur };
        if c.is_root() {
            return false;
        }
        cur = c.parent_ptr();
    }
}

/// Tasks are made from a `Vfs` (here, above it: the `Vfs` layer knows no
/// `Task`).
impl Vfs {
    /// A new task (process) with credentials `cred`, umask 022, root and cwd
    /// at the root of the namespace.
    pub fn task(&self, cred: Cred) -> Task {
        Task::new(self.clone(), cred)
    }

    /// A task with root credentials.
    pub fn root_task(&self) -> Task {
        self.task(Cred::root())
    }
}
