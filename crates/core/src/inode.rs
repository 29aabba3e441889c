//! Inodes: the attribute block under a seqlock, read without locks.
//!
//! LOCKING RULES
//! - `attr` is a `SeqLock<Attr>`: writers take its internal spinlock (innermost
//!   lock of the VFS); readers copy it lock-free and retry on a concurrent
//!   write. `stat` never takes a lock. One lock is taken inside it: ext4's
//!   per-inode copy mutex (`Ext4Inode::raw`, level 30 of the table), for a
//!   copy of the on-disk inode, so that racing updates store the newest
//!   copy in the order they take the writer lock (read before it, an older
//!   copy could be stored last). Nobody waits for the writer lock while
//!   holding that mutex (it is held only for a clone or a store), so the
//!   writer lock stays a leaf for deadlock (`SeqLock`'s rule).
//! - `dir_lock` (directories only) is the namespace lock of the directory: name
//!   operations inside it (create, unlink, rename of one name) take it SHARED,
//!   so creates of different names do not serialise; operations that need the
//!   directory's whole contents stable take it EXCLUSIVE (rmdir of this
//!   directory, rename of a directory over it: a try-lock, see `vfs.rs`).
//!   Per-name exclusion comes from the VFS name locks (see `vfs.rs`). It is a
//!   big-reader lock (`scalevfs_sync::brlock`): the shared side writes only
//!   the taking thread's own reader slots, so creates of different names in
//!   one directory share no line through it (issue 16). Both locks are
//!   `scalevfs_sync::ordered` locks (order checked in debug builds).
//! - `data_lock`: exclusive by writers, truncate and fallocate (see `io.rs`);
//!   shared by a positioned overwrite that changes no size or allocation
//!   (`Filesystem::write_shared`: memfs's overwrite inside one existing
//!   page, copy on write published by compare-and-exchange), so such
//!   writes of different pages of one file run side by side. A big-reader
//!   lock: the shared side writes only the taking thread's own line. Reads
//!   take no lock (memfs's page store is read lock-free).
//!
//! Lifetime: `Arc<Inode>`. Positive dentries hold one; open files hold one
//! through their dentry. The filesystem keeps its own (memfs: in directory
//! entries). An inode whose `nlink` reaches 0 is freed when the last `Arc` goes.

use scalevfs_orphan::OrphanSlot;
use scalevfs_sync::lockstat::LockClass;
use scalevfs_sync::ordered::{BrLock, Class, SpinLock};
use std::any::Any;

use scalevfs_sync::primitive::{AtomicI64, AtomicU32, Ordering};
use scalevfs_sync::SeqLock;

use crate::types::{Attr, Cred, FileType, Stat, Timespec, S_IFMT};
use crate::xattr::{acl_permits, AclEntry};
use crossbeam_epoch::{self as epoch, Atomic, Owned, Shared};

/// Inode flag: a directory that was removed (rmdir); creates in it fail ENOENT.
pub const I_DEAD: u32 = 1;
/// Inode flag: an O_TMPFILE file opened without O_EXCL, which linkat may
/// give a name although its link count is 0 (Linux's I_LINKABLE).
pub const I_LINKABLE: u32 = 2;
/// Inode flag: the file may have a `security.capability` attribute (set
/// with it, under the data lock). A write, truncate or fallocate removes
/// the attribute, by anyone, as Linux's `file_remove_privs` does; every
/// other write skips the check on this bit.
pub const I_FCAPS: u32 = 4;
/// Inode flag: the inode has an access ACL, cached in `Inode::acl` (set
/// and cleared with the cache). Without it permission checks read the
/// mode alone and do not look at the cache.
pub const I_ACL: u32 = 8;
/// Inode flag: the directory may have a default ACL
/// (`system.posix_acl_default`), which a create in it then reads from the
/// filesystem; without it a create applies the umask and reads nothing.
pub const I_DEFACL: u32 = 16;

/// chattr(1) flags (`FS_IOC_GETFLAGS`/`SETFLAGS`) that memfs keeps, as
/// tmpfs does: immutable, append-only, no-dump, no-atime. They live in the
/// inode's flag word shifted by [`FS_FL_SHIFT`] (set and read with
/// `fs_flags`/`set_fs_flags`); the VFS enforces them (`namei.rs`, `attr.rs`, `open.rs`, `io.rs`).
pub const FS_IMMUTABLE_FL: u32 = 0x10;
pub const FS_APPEND_FL: u32 = 0x20;
pub const FS_NODUMP_FL: u32 = 0x40;
pub const FS_NOATIME_FL: u32 = 0x80;
/// The chattr flags a task may set (tmpfs's SHMEM_FL_USER_MODIFIABLE less
/// casefold); others are EOPNOTSUPP.
pub const FS_FL_SETTABLE: u32 = FS_IMMUTABLE_FL | FS_APPEND_FL | FS_NODUMP_FL | FS_NOATIME_FL;
const FS_FL_SHIFT: u32 = 8;

/// An in-memory inode.
#[repr(C)]
pub struct Inode {
    /// What the path walk reads, on a cache line of its own: attribute
    /// writes (a create in this directory updates its mtime and size) and
    /// open/close counting do not disturb walkers passing through.
    hot: InodeHot,
    /// Read by every read (size, relatime), open (permissions) and stat;
    /// written by attribute changes only (a write within the clock tick of
    /// the last one changes nothing: `Timespec::now`). Nothing that opens,
    /// closes or writes write-locks shares its lines (the const asserts
    /// below).
    attr: SeqLock<Attr>,
    /// A big-reader lock: the shared side, which every name operation in
    /// the directory takes, writes only the taking thread's own line.
    pub(crate) dir_lock: BrLock,
    /// Tells this inode from an earlier one with the same number (file
    /// handles): set once by the filesystem at creation.
    generation: u32,
    /// When the inode was made (statx's `stx_btime`, std's
    /// `Metadata::created`): the ctime it was made with, or what the
    /// filesystem says (`with_birth`: ext4's `i_crtime`, none where its
    /// inodes are too small to hold one). Never changes: read without the
    /// attribute sequence lock.
    birth: Option<Timespec>,
    /// Attributes the filesystem keeps itself (`with_attr_fn`): `attr()`
    /// lets `attr_fn(self, &mut copy)` fill them in over the stored ones.
    /// memfs directories: the size from their entry count, which every
    /// create and unlink writes anyway, and the link count from their
    /// subdirectory count, so a name operation need not write the
    /// attribute record for either (issue 16). Set once at creation.
    attr_fn: Option<fn(&Inode, &mut Attr)>,
    /// The access ACL (Linux's `i_acl`), the stored one parsed, when the
    /// inode has one (`I_ACL`); the filesystem keeps the stored copy. Read
    /// under an epoch guard with no lock and no write (a permission check
    /// on a walk writes no shared line); replaced whole, the old copy freed
    /// after a grace period (as Linux frees `i_acl` after RCU).
    acl: Atomic<Vec<AclEntry>>,
    /// Open count and orphan registration (see `orphan.rs`): written by
    /// every open and close.
    pub(crate) orphan: InodeOrphan,
    /// Linux's `i_writecount`: n > 0 open file descriptions may write,
    /// n < 0 running programs hold it (`Task::open_exec`), never both; the
    /// clash is ETXTBSY ("text file busy").
    write_count: AtomicI64,
    /// Taken by every write, truncate and fallocate: on a line of its own,
    /// so a write does not write the line an open of the same file writes
    /// (the open count) or the lines a read reads (conflict matrix, issue
    /// 16: open x write of one file).
    pub(crate) data_lock: OwnLine<BrLock>,
}

/// A field alone on its cache line (aligned to 64 bytes and padded to a
/// multiple of it); derefs to the field.
#[repr(C, align(64))]
pub(crate) struct OwnLine<T>(T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}

// The lines above, checked: the attribute record's last line holds nothing
// that open/close (the orphan counts) or a write (the data lock) writes.
const _: () = {
    use core::mem::{offset_of, size_of};
    let attr_last = (offset_of!(Inode, attr) + size_of::<SeqLock<Attr>>() - 1) / 64;
    assert!(offset_of!(Inode, orphan) / 64 > attr_last);
    assert!(offset_of!(Inode, write_count) / 64 > attr_last);
    assert!(offset_of!(Inode, data_lock) / 64 > offset_of!(Inode, write_count) / 64);
    assert!(offset_of!(Inode, data_lock) % 64 == 0);
};

#[repr(C, align(64))]
struct InodeHot {
    /// A copy of `attr.mode` for the walk's search-permission fast path
    /// (one load instead of a seqlock read).
    mode: AtomicU32,
    flags: AtomicU32,
    ftype: FileType,
    /// log2 of `st_blksize` (Linux: the inode's `i_blkbits`, the block size
    /// of its filesystem for ext4, the page size for tmpfs).
    blkbits: u8,
    ino: u64,
    dev: u64,
    private: Box<dyn Any + Send + Sync>,
}

const _: () = assert!(core::mem::size_of::<InodeHot>() == 64);

impl Drop for Inode {
    fn drop(&mut self) {
        crate::limbo::inode_dropped();
        // Relaxed: exclusive access (`&mut self`).
        // SAFETY: `&mut self`: nobody else can reach the list now, and a
        // reader that loaded it earlier held a reference to this inode.
        let p = self.acl.swap(Shared::null(), Ordering::Relaxed, unsafe {
            epoch::unprotected()
        });
        if !p.is_null() {
            // SAFETY: as above; owned by the inode alone.
            drop(unsafe { p.into_owned() });
        }
    }
}

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inode")
            .field("ino", &self.hot.ino)
            .field("type", &self.hot.ftype)
            .finish()
    }
}

impl Inode {
    /// A new inode. `attr.mode` must carry a valid file type.
    pub fn new(ino: u64, dev: u64, attr: Attr, private: Box<dyn Any + Send + Sync>) -> Inode {
        let ftype = FileType::from_mode(attr.mode).unwrap_or(FileType::Regular);
        Inode {
            hot: InodeHot {
                mode: AtomicU32::new(attr.mode),
                flags: AtomicU32::new(0),
                ftype,
                blkbits: 12,
                ino,
                dev,
                private,
            },
            attr: SeqLock::new(attr),
            dir_lock: BrLock::new(Class::DirParent),
            generation: 0,
            birth: Some(attr.ctime()),
            attr_fn: None,
            acl: Atomic::null(),
            orphan: Default::default(),
            write_count: AtomicI64::new(0),
            data_lock: OwnLine(BrLock::new(Class::DataLock)),
        }
    }

    /// This inode with `st_blksize` `1 << bits` (default 4096, the page
    /// size, as tmpfs gives): the filesystem's block size on ext4, where
    /// programs size their I/O (and xattr values, xfstests' generic/486) by it.
    pub fn with_blkbits(mut self, bits: u8) -> Inode {
        self.hot.blkbits = bits.clamp(9, 16);
        self
    }

    /// This inode with birth time `birth` (`None`: unknown), for a
    /// filesystem that keeps one (default: the ctime it was made with).
    pub fn with_birth(mut self, birth: Option<Timespec>) -> Inode {
        self.birth = birth;
        self
    }

    /// When the inode was made, if known (see `with_birth`).
    pub fn birth(&self) -> Option<Timespec> {
        self.birth
    }

    /// This inode with generation number `generation` (see [`Inode::generation`]).
    pub fn with_generation(mut self, generation: u32) -> Inode {
        self.generation = generation;
        self
    }

    /// This inode with some attributes filled in by `f` (see the field
    /// `attr_fn`): `attr()` and `stat()` call it on the stored copy, and
    /// `update_attr` closures see (and may change) the stored values that
    /// `f` then overrides. `f` must not take a lock (it runs inside
    /// lock-free walks, under any lock of the VFS) and must not call
    /// `attr()` of this inode.
    pub fn with_attr_fn(mut self, f: fn(&Inode, &mut Attr)) -> Inode {
        self.attr_fn = Some(f);
        self
    }

    /// The generation number: (dev, ino, generation) names this inode and no
    /// later one that reuses its number.
    #[inline]
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Linux's `get_write_access`: count one more writer, or ETXTBSY while
    /// the file is being executed.
    pub(crate) fn get_write_access(&self) -> crate::errno::VfsResult<()> {
        // Relaxed: the count is the whole state (no data is published
        // through it); the RMW alone decides between writers and programs.
        self.write_count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n >= 0).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|_| crate::errno::Errno::ETXTBSY)
    }
    /// Undo one `get_write_access`.
    pub(crate) fn put_write_access(&self) {
        // Relaxed: as in get_write_access.
        self.write_count.fetch_sub(1, Ordering::Relaxed);
    }
    /// Linux's `deny_write_access` (exec): hold off writers, or ETXTBSY
    /// while the file is open for writing.
    pub(crate) fn deny_write_access(&self) -> crate::errno::VfsResult<()> {
        // Relaxed: as in get_write_access.
        self.write_count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n <= 0).then_some(n - 1)
            })
            .map(|_| ())
            .map_err(|_| crate::errno::Errno::ETXTBSY)
    }
    /// Undo one `deny_write_access`.
    pub(crate) fn allow_write_access(&self) {
        // Relaxed: as in get_write_access.
        self.write_count.fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    /// Wait until no writer, truncate or fallocate holds this inode's
    /// data lock exclusive (taken shared and let go): a filesystem's reader
    /// that found a multi-step change under way waits for it to end so.
    /// The caller must hold no lock of this inode.
    pub fn wait_for_data_writers(&self) {
        drop(self.data_lock.read());
    }

    pub fn ino(&self) -> u64 {
        self.hot.ino
    }
    #[inline]
    pub fn dev(&self) -> u64 {
        self.hot.dev
    }
    #[inline]
    pub fn file_type(&self) -> FileType {
        self.hot.ftype
    }
    #[inline]
    pub fn is_dir(&self) -> bool {
        self.hot.ftype == FileType::Directory
    }

    /// The mode from the walk's copy: one load, no seqlock (may lag a
    /// concurrent chmod, as any read racing with it may).
    #[inline]
    pub(crate) fn mode_hint(&self) -> u32 {
        // Acquire: pairs with the Release store in update_attr.
        self.hot.mode.load(Ordering::Acquire)
    }

    /// The stored attributes, without what the filesystem fills in
    /// (`with_attr_fn`: a memfs directory's size and link count). For
    /// permission checks, which read mode, owner and group only: a memfs
    /// directory's size is the length of its index's skip lists, whose
    /// lines every create and unlink in it writes, so a create's check on
    /// its parent would read what the other creates write (issue 16).
    #[inline]
    pub(crate) fn attr_stored(&self) -> Attr {
        self.attr.read()
    }

    /// A consistent copy of the attributes, read lock-free.
    #[inline]
    pub fn attr(&self) -> Attr {
        let mut a = self.attr.read();
        if let Some(f) = self.attr_fn {
            f(self, &mut a);
        }
        a
    }

    /// Set mtime and ctime to `now` (a change of a directory's names) unless
    /// both already are `now`: with coarse timestamps (`Timespec::now`, one
    /// value per clock tick) the store would change nothing, and skipping
    /// it spares every create and unlink in one directory but the first of
    /// each tick the shared write of the attribute record (issue 16; the
    /// rule of Linux's `file_update_time` for data writes). A stored time
    /// that differs from `now` in either direction is overwritten, as Linux
    /// does.
    pub fn touch_mc_unless_current(&self, now: crate::types::Timespec) {
        let a = self.attr.read();
        // Under loom the store is always made: whether it is skipped
        // depends on the real clock, and a loom model must run the same
        // atomics in every execution (the skip orders nothing: a reader
        // sees the same times either way).
        if a.mtime() == now && a.ctime() == now && !cfg!(loom) {
            return;
        }
        self.update_attr(|a| a.touch_mc(now));
    }

    /// Change the attributes under the seqlock's writer lock.
    pub fn update_attr<R>(&self, f: impl FnOnce(&mut Attr) -> R) -> R {
        self.attr.write(|a| {
            let r = f(a);
            // The walk's copy of the mode is stored under the writer lock,
            // so the copies go in the order of the attribute writes. Stored
            // after the lock, a create's mtime update that read the old
            // mode could store it after a chmod had stored the new one,
            // and the copy kept the old mode until the next change: a
            // `chmod 700` racing a create let everyone search the
            // directory (`search_for_all`), a `chmod u+s` racing a read
            // let an unprivileged write keep the bit (`mode_hint`).
            // (Stored before the seqlock publishes the attributes, the
            // closure running first: a walker may see the new mode a moment
            // before `attr()` has it, never after; every mode change holds
            // the data lock too.) Release, paired with the walkers'
            // Acquire loads: nothing they read depends on it today (the
            // attributes are stored after it), so stronger than needed.
            // Stored only when it changed: the hot
            // line is read by every walk through this directory, and a
            // create in it (mtime, size) must not invalidate the walkers'
            // copies. Relaxed load: under the writer lock, the last store
            // is this thread's or one ordered before it by the lock.
            if self.hot.mode.load(Ordering::Relaxed) != a.mode {
                self.hot.mode.store(a.mode, Ordering::Release);
            }
            r
        })
    }

    /// Search permission for everyone (`mode & 0o111 == 0o111`): the walk's
    /// fast path, one load and no seqlock.
    #[inline]
    pub fn search_for_all(&self) -> bool {
        // Acquire: pairs with the Release in update_attr. A named entry of
        // an ACL may refuse what the mode's bits give everyone.
        self.hot.mode.load(Ordering::Acquire) & 0o111 == 0o111 && self.flags() & I_ACL == 0
    }

    /// Replace the cached access ACL (`None`: the inode has none). The
    /// VFS calls it with the stored copy changed, under the data lock; a
    /// filesystem type calls it when it loads an inode that has one.
    pub fn set_access_acl(&self, acl: Option<Vec<AclEntry>>) {
        let g = epoch::pin();
        let has = acl.is_some();
        let new = acl.map_or(Shared::null(), |a| Owned::new(a).into_shared(&g));
        // AcqRel: publish the new list to readers (their Acquire loads),
        // take ownership of the old one.
        let old = self.acl.swap(new, Ordering::AcqRel, &g);
        if has {
            self.set_flag(I_ACL);
        } else {
            self.clear_flag(I_ACL);
        }
        if !old.is_null() {
            // SAFETY: unreachable from the inode now; readers that loaded
            // it hold a guard the destruction waits for.
            unsafe { g.defer_destroy(old) };
        }
    }

    /// A copy of the cached access ACL.
    pub fn access_acl(&self) -> Option<Vec<AclEntry>> {
        if self.flags() & I_ACL == 0 {
            return None;
        }
        let g = epoch::pin();
        // Acquire: pairs with the swap in `set_access_acl`.
        let p = self.acl.load(Ordering::Acquire, &g);
        // SAFETY: freed only after a grace period that `g` holds off.
        unsafe { p.as_ref() }.cloned()
    }

    /// Record whether the directory may have a default ACL (see
    /// [`I_DEFACL`]); a filesystem type loading a directory that has one
    /// sets it.
    pub fn mark_default_acl(&self, has: bool) {
        if has {
            self.set_flag(I_DEFACL);
        } else {
            self.clear_flag(I_DEFACL);
        }
    }

    /// Record that the file has a `security.capability` attribute (see
    /// [`I_FCAPS`]): a filesystem type loading such an inode sets it, so
    /// that the next write, truncate or fallocate removes the attribute as
    /// Linux's `file_remove_privs` does.
    pub fn mark_file_caps(&self) {
        self.set_flag(I_FCAPS);
    }

    /// Linux's `generic_permission`: may `cred` access this inode (whose
    /// attributes are `a`) for `mask`, a combination of R_OK(4)/W_OK(2)/
    /// X_OK(1)? The owner gets the mode's owner bits; others, when the
    /// inode has an access ACL and a group class, the ACL's answer (see
    /// `xattr::acl_permits`), else the group or other bits. Root passes
    /// read and write always and execute when any execute bit is set (or
    /// on directories).
    #[inline]
    pub fn permission_ok(&self, a: &Attr, cred: &Cred, mask: u32) -> bool {
        if mask == 0 {
            return true;
        }
        let mode = a.mode;
        // Fast path for the walk: search permission granted to everyone.
        if mask == 1 && mode & 0o111 == 0o111 && self.flags() & I_ACL == 0 {
            return true;
        }
        if cred.is_root() {
            if mask & 1 == 0 {
                return true;
            }
            return mode & S_IFMT == libc::S_IFDIR || mode & 0o111 != 0;
        }
        if cred.uid == a.uid {
            return (mode >> 6) & mask == mask;
        }
        if mode & 0o070 != 0 && self.flags() & I_ACL != 0 {
            let g = epoch::pin();
            // Acquire: pairs with the swap in `set_access_acl`.
            let p = self.acl.load(Ordering::Acquire, &g);
            // SAFETY: freed only after a grace period that `g` holds off.
            if let Some(acl) = unsafe { p.as_ref() } {
                return acl_permits(acl, a.gid, cred, mask);
            }
        }
        let bits = if cred.in_group(a.gid) {
            (mode >> 3) & 7
        } else {
            mode & 7
        };
        bits & mask == mask
    }

    /// The filesystem's private data, if it is of type `T`.
    pub fn private<T: 'static>(&self) -> Option<&T> {
        self.hot.private.downcast_ref::<T>()
    }

    pub fn flags(&self) -> u32 {
        // Acquire: pairs with the Release of `set_flag`/`clear_flag`. Most
        // bits are checked again under the locks that set them, but the
        // lock-free walk's permission checks (`search_for_all`,
        // `permission_ok`) read `I_ACL` with no lock and then the ACL it
        // announces: they must see the ACL stored before the flag.
        self.hot.flags.load(Ordering::Acquire)
    }
    pub(crate) fn set_flag(&self, f: u32) {
        // Release: pairs with Acquire readers that then look at namespace state.
        self.hot.flags.fetch_or(f, Ordering::Release);
    }
    pub(crate) fn clear_flag(&self, f: u32) {
        // Release: as set_flag.
        self.hot.flags.fetch_and(!f, Ordering::Release);
    }
    /// The chattr flags (`FS_*_FL`).
    pub fn fs_flags(&self) -> u32 {
        (self.flags() >> FS_FL_SHIFT) & FS_FL_SETTABLE
    }
    /// Replace the chattr flags (`FS_*_FL`, within [`FS_FL_SETTABLE`]);
    /// public for filesystem types that load them with the inode.
    pub fn set_fs_flags(&self, fl: u32) {
        let fl = (fl & FS_FL_SETTABLE) << FS_FL_SHIFT;
        // Release: as set_flag; the RMW keeps the other flag bits.
        let _ = self
            .hot
            .flags
            .fetch_update(Ordering::Release, Ordering::Relaxed, |f| {
                Some((f & !(FS_FL_SETTABLE << FS_FL_SHIFT)) | fl)
            });
    }
    /// FS_IMMUTABLE_FL: no change at all (EPERM).
    pub fn is_immutable(&self) -> bool {
        self.fs_flags() & FS_IMMUTABLE_FL != 0
    }
    /// FS_APPEND_FL: data only appended; no truncate, unlink, rename (EPERM).
    pub fn is_append_only(&self) -> bool {
        self.fs_flags() & FS_APPEND_FL != 0
    }
    pub fn is_dead(&self) -> bool {
        // Acquire: a dead directory's removal must be visible to a creator that sees the flag.
        self.hot.flags.load(Ordering::Acquire) & I_DEAD != 0
    }

    /// `struct stat` from a consistent attribute copy.
    pub fn stat(&self) -> Stat {
        let a = self.attr();
        stat_from_attr(self.hot.ino, self.hot.dev, 1 << self.hot.blkbits, &a)
    }

    /// `stat` with the birth time (`Task::statx`).
    pub fn statx(&self) -> crate::types::Statx {
        crate::types::Statx {
            stat: self.stat(),
            btime: self.birth,
        }
    }
}

pub(crate) fn stat_from_attr(ino: u64, dev: u64, blksize: u32, a: &Attr) -> Stat {
    Stat {
        dev,
        ino,
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        size: a.size,
        blksize,
        blocks: a.blocks,
        atime: a.atime(),
        mtime: a.mtime(),
        ctime: a.ctime(),
    }
}

#[derive(Default)]
pub(crate) struct Reg {
    pub(crate) count: u32,
    pub(crate) slot: Option<OrphanSlot>,
    pub(crate) unlinked: bool,
}

/// Per-inode orphan state (the protocol that uses it is `orphan.rs`'s; it
/// lives here so that the inode, the lower layer, does not name `orphan`).
pub(crate) struct InodeOrphan {
    /// Open file descriptions of this inode.
    pub(crate) opens: AtomicU32,
    /// `UNLINKED` | truncates in progress * `TRUNCATING`: non-zero means a
    /// last close must look closer.
    pub(crate) state: AtomicU32,
    pub(crate) reg: SpinLock<Reg>,
}

impl Default for InodeOrphan {
    fn default() -> Self {
        InodeOrphan {
            opens: AtomicU32::new(0),
            state: AtomicU32::new(0),
            reg: SpinLock::new(Class::OrphanReg, LockClass::OrphanFile, Reg::default()),
        }
    }
}

impl std::fmt::Debug for InodeOrphan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InodeOrphan").finish_non_exhaustive()
    }
}
