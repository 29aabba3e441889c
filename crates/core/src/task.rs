//! `Task`: a process-like context (credentials, umask, root, cwd, fd table),
//! the walks it starts (`resolve`, `parent_of`, chdir/chroot/getcwd), the
//! lookups that take no reference (stat, access, readlink, statfs) and
//! mount/umount/remount. Its other calls are `impl Task` blocks in the files
//! above it: `namei.rs` (name operations), `attr.rs` (attribute changes),
//! `open.rs` (open, close, dup, getdents), `io.rs` (data calls),
//! `xattr_calls.rs`.
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

use scalevfs_sync::ordered::{Class, Mutex};
use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned};
use scalevfs_sync::primitive::{AtomicU32, Ordering};

use crate::dcache::Dentry;
use crate::errno::{Errno, VfsResult};
use crate::file::FdTable;
use crate::fstype::Filesystem;
use crate::handle::At;
use crate::inode::Inode;
use crate::mount::{Mount, PathRef};
use crate::types::*;
use crate::vfs::{Changes, Vfs};
use crate::walk::{check_path, ParentWalk, Start, WalkCtx};

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
        // May run inside a collection (limbo.rs, "Pins in frees").
        let pin = crate::limbo::pin();
        // AcqRel, as in `replace`, though more than needed: `drop` has the
        // context alone (`&mut self`; whoever handed it here synchronised
        // with every earlier `replace`), so Relaxed would do. The swap only
        // takes the snapshot for the deferred free below.
        let old = self
            .snap
            .swap(epoch::Shared::null(), Ordering::AcqRel, pin.loads());
        // SAFETY: a non-null snapshot is live until the deferred free below.
        if let Some(s) = unsafe { old.as_ref() } {
            s.release();
            // SAFETY: unreachable now; pinned readers are waited for.
            unsafe { pin.defer_destroy(old) };
        }
    }
}

/// A process-like context issuing calls.
pub struct Task {
    pub(crate) vfs: Vfs,
    pub(crate) cred: Arc<Cred>,
    pub(crate) umask: AtomicU32,
    pub(crate) fs: Arc<FsContext>,
    pub(crate) files: Arc<FdTable>,
    /// Changes made by this task are not reported to the `Vfs`'s change
    /// listeners (a front end's own tasks: the front end knows).
    pub(crate) quiet_changes: bool,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("cred", &self.cred)
            .finish_non_exhaustive()
    }
}

pub(crate) fn as_bytes<P: AsRef<[u8]> + ?Sized>(p: &P) -> &[u8] {
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
    pub(crate) fn cur_umask(&self) -> u32 {
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

    pub(crate) fn ctx<'g>(&'g self, g: &'g Guard) -> WalkCtx<'g> {
        let s = self.fs.load(g);
        WalkCtx {
            vfs: &self.vfs,
            cred: &self.cred,
            root: &s.root,
            cwd: &s.cwd,
        }
    }

    /// Resolve a dirfd into a walk start. A relative path needs a directory.
    pub(crate) fn start<'a: 'g, 'g>(
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
    pub(crate) fn empty_path_target<'a>(
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
        self.stat_with(dirfd, path, flags, Inode::stat)
    }

    /// `statx(2)`, as far as this crate goes: `fstatat`'s answer and the
    /// birth time (`Statx`). Same flags.
    pub fn statx<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        flags: u32,
    ) -> VfsResult<Statx> {
        self.stat_with(dirfd, path, flags, Inode::statx)
    }

    /// `statx` of an open file (`statx(fd, "", AT_EMPTY_PATH)`).
    pub fn fstatx<'a>(&self, fd: impl Into<At<'a>> + Copy) -> VfsResult<Statx> {
        self.with_held(fd, |p| p.inode().statx())
    }

    /// `fstatat` with `of` for the answer, taken from the leaf's inode.
    #[inline(always)]
    fn stat_with<'a, P: AsRef<[u8]> + ?Sized, R>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        flags: u32,
        of: fn(&Inode) -> R,
    ) -> VfsResult<R> {
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
            return Ok(of(self.empty_path_target(dirfd, &g)?.inode()));
        }
        let start = self.start(dirfd, path, &g)?;
        let follow = flags & AT_SYMLINK_NOFOLLOW == 0;
        self.ctx(&g)
            .with_leaf(&g, start, path, follow, |_m: &Mount, d: &Dentry| {
                Ok(of(d.inode().ok_or(Errno::ENOENT)?))
            })
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
    pub(crate) fn with_held<'a, R>(
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
    pub(crate) fn held<'a>(&self, fd: impl Into<At<'a>> + Copy) -> VfsResult<PathRef> {
        self.with_held(fd, PathRef::clone)
    }

    /// `held` for the calls that take an open file and no path (fchmod,
    /// fchown, futimens): an O_PATH fd is EBADF there (Linux's `fdget`
    /// refuses FMODE_PATH files); a handle is taken as it is.
    pub(crate) fn held_open<'a>(&self, fd: impl Into<At<'a>> + Copy) -> VfsResult<PathRef> {
        match fd.into() {
            At::Fd(fd) => {
                let g = epoch::pin();
                let f = self.files.get(fd, &g)?;
                if f.is_path_only() {
                    return Err(Errno::EBADF);
                }
                Ok(f.path.clone())
            }
            At::Handle(h) => Ok(h.path().clone()),
        }
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
            // inode_permission: no write to an immutable inode, whoever
            // asks (root included), after the read-only mount's EROFS.
            if mode & W_OK != 0 && i.is_immutable() {
                return Err(Errno::EPERM);
            }
            if i.permission_ok(&a, cred, mode) {
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
        // What this thread removed is free when it asks (Linux frees an
        // unlinked inode at its last reference; here its dentry, and with
        // it the inode, goes a grace period later): flushed before this
        // call pins the epoch, which would hold that grace period back.
        crate::flush_deferred_frees();
        let g = epoch::pin();
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        self.ctx(&g)
            .with_leaf(&g, Start::Cwd, path, true, |m, _| Ok(m.sb.fs.statfs()))
    }

    /// `fstatfs(2)`.
    pub fn fstatfs<'a>(&self, fd: impl Into<At<'a>> + Copy) -> VfsResult<StatFs> {
        // As `statfs`.
        crate::flush_deferred_frees();
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

    /// Walk to the parent of `path`'s last component: counted, or (with
    /// `counted` false, where the caller redoes the operation counted on
    /// `Errno::RESTART_WALK` from `lock_name`) held by an epoch guard that
    /// the result keeps (`ParentWalk`).
    pub(crate) fn parent_of<'a>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &[u8],
        counted: bool,
    ) -> VfsResult<ParentWalk> {
        check_path(path)?;
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        let g = epoch::pin();
        let start = self.start(dirfd, path, &g)?;
        let mut pw = self.ctx(&g).walk_parent(&g, start, path, counted)?;
        pw.keep_guard(g);
        Ok(pw)
    }

    /// `chdir(2)`.
    pub fn chdir<P: AsRef<[u8]> + ?Sized>(&self, path: &P) -> VfsResult<()> {
        let p = self.resolve(AT_FDCWD, as_bytes(path), true, false)?;
        self.set_cwd(p)
    }

    pub(crate) fn set_cwd(&self, p: PathRef) -> VfsResult<()> {
        if !p.inode().is_dir() {
            return Err(Errno::ENOTDIR);
        }
        if !p
            .inode()
            .permission_ok(&p.inode().attr_stored(), &self.cred, X_OK)
        {
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
        if !p
            .inode()
            .permission_ok(&p.inode().attr_stored(), &self.cred, X_OK)
        {
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
    /// validated with the global rename seqcount, which every move of a
    /// directory writes, and the mount seqcount (a directory rename or a
    /// mount change during the climb could otherwise splice names from
    /// before and after it into a path that never existed; the climb passes
    /// directories only, so moves of files do not matter); after
    /// `GETCWD_TRIES` failed tries it is built under the mount lock and the
    /// rename lock, as Linux's `d_path` falls back to `rename_lock` and
    /// `mount_lock`. A path of PATH_MAX bytes or more is ENAMETOOLONG; a
    /// removed cwd is ENOENT.
    pub fn getcwd(&self) -> VfsResult<Vec<u8>> {
        const GETCWD_TRIES: usize = 4;
        let g = epoch::pin();
        let s = self.fs.load(&g);
        let dc = self.vfs.dcache();
        for _ in 0..GETCWD_TRIES {
            let mseq = self.vfs.mount_read_begin();
            let seq = dc.rename_read_begin();
            let r = cwd_path(&s.cwd, &s.root);
            if !dc.rename_retry(seq) && !self.vfs.mount_retry(mseq) {
                return r;
            }
            scalevfs_sync::lockstat::inc(scalevfs_sync::lockstat::Stat::SeqRetry);
        }
        let _m = self.vfs.inner.mount_lock.lock();
        dc.with_rename_lock(|| cwd_path(&s.cwd, &s.root))
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
    // The top of the namespace reached without meeting the root (a cwd
    // outside a chroot): Linux returns the path from the top with
    // "(unreachable)" in front, which names nothing inside the root.
    let mut unreachable = false;
    loop {
        if std::ptr::eq(mnt.as_ptr(), root.mnt.as_ptr()) && std::ptr::eq(d, root.dentry.as_ptr()) {
            break;
        }
        if std::ptr::eq(d, mnt.root.as_ptr()) {
            match mnt.parent.clone() {
                Some((pm, pd)) => {
                    d = pd.as_ptr();
                    mnt = pm;
                    continue;
                }
                None => {
                    unreachable = true;
                    break;
                }
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
    const UNREACHABLE: &[u8] = b"(unreachable)";
    if unreachable && len.max(1) + UNREACHABLE.len() + 1 > PATH_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    let mut out = Vec::with_capacity(len.max(1) + UNREACHABLE.len());
    if unreachable {
        out.extend_from_slice(UNREACHABLE);
    }
    for p in parts.iter().rev() {
        out.push(b'/');
        out.extend_from_slice(p);
    }
    if parts.is_empty() {
        out.push(b'/');
    }
    Ok(out)
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
