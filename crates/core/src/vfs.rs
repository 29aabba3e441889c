//! The `Vfs`: mounted filesystems, the dentry cache, configuration, and the
//! locks that order namespace changes.
//!
//! LOCKING RULES
//! The global order is one table in code, `scalevfs_sync::ordered::Class`
//! (levels, outermost first, and the same-class rules), copied in
//! `docs/design.md` section 2 (a test keeps the two equal). Every lock of
//! the core is an `ordered` lock, so debug builds check each acquisition
//! against it. The namespace part, in short (levels as in the table):
//! 1. `File::pos_lock` (a read, write or getdents on a shared open file;
//!    Linux's `f_pos_lock`, taken before any inode lock).
//! 2. `VfsInner::mount_lock`, 3. `Super::rename_mutex` (cross-directory
//!    renames of one filesystem: the ancestor checks and the move are
//!    atomic).
//! 4. `Inode::dir_lock` of parent directories, SHARED for name operations;
//!    two only under 3, an ancestor before its descendant, unrelated ones
//!    in address order.
//! 5. `VfsInner::name_locks` stripes (by hash of (parent, name)), several
//!    in index order. No directory lock is ever waited for while a stripe
//!    is held.
//! 6. `Inode::dir_lock` of a victim directory, EXCLUSIVE (rmdir, rename over
//!    a directory): TRY-LOCK only. A shared parent lock does not pin the
//!    victim's place in the tree (Linux's exclusive `i_rwsem` does), so
//!    waiting for it under 4-5 could wait for a directory that has become
//!    an ancestor (issue 12: rmdir against rename deadlocked). When the
//!    try fails the operation drops every lock, waits for the victim's
//!    lock holding nothing, and starts over.
//!
//! Then the per-task locks, the data lock, the dcache's (rename_lock ->
//! per-dir maps -> buckets -> LockRef lock), the orphan locks, the
//! attribute seqlock writer and memfs's frame pool (innermost).
//!
//! Filesystem methods are called with the sleeping locks (levels 1-9) as
//! needed but never with a spinlock held. An epoch guard is pinned before
//! any spinlock is taken.
//!
//! `VfsInner::listeners_lock` (mutex) only serialises adding and removing
//! change listeners and is never held with another lock. Change listeners
//! are called with no lock of the core held (see [`ChangeListener`]).

use scalevfs_sync::ordered::{Class, Mutex};
use scalevfs_sync::SeqCount;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned};
use scalevfs_sync::primitive::{AtomicU64, Ordering};

use crate::dcache::{Dcache, Dentry};
use crate::errno::{Errno, VfsResult};
use crate::fstype::Filesystem;
use crate::inode::Inode;
use crate::memfs::{MemFs, MemFsOptions};

pub use crate::config::{LlseekVariant, VfsConfig, WalkMode};
pub(crate) use crate::mount::MountTable;
pub use crate::mount::{MntRef, Mount, PathRef};
pub use crate::sb::Super;
use crossbeam_utils::CachePadded;

/// Told about changes made through the library, so that a cache outside the
/// core (the kernel's, behind a FUSE mount) can drop what it holds.
///
/// Called after the change is complete, on the thread that made it, with no
/// lock of the core held; never for reads or `stat`, and never for changes
/// made by a task with [`crate::Task::set_quiet_changes`]. A listener must
/// not hold a strong reference to the [`Vfs`] (it would keep it alive).
pub trait ChangeListener: Send + Sync {
    /// The name `name` in the directory `parent_ino` (on device `dev`) was
    /// created, removed or renamed to or from. The directory itself also
    /// gets an [`ChangeListener::inode_changed`].
    fn entry_changed(&self, parent_ino: u64, dev: u64, name: &[u8]);
    /// The attributes (mode, owner, times, size, link count) or the data of
    /// the inode `ino` on device `dev` changed.
    fn inode_changed(&self, ino: u64, dev: u64);
}

/// The registered listeners, replaced as a whole (copy on write).
pub(crate) struct Listeners(Vec<Arc<dyn ChangeListener>>);

/// One change, recorded while the operation holds its locks and reported
/// when the [`Changes`] holding it is dropped.
enum Change {
    Entry { dir: u64, dev: u64, name: Vec<u8> },
    Inode { ino: u64, dev: u64 },
}

/// The changes an operation made, reported to the listeners when dropped.
/// Declared before an operation's lock guards, it drops after them, so
/// listeners run with no lock held. Records nothing (and allocates nothing)
/// when no listener is registered or the task is quiet.
pub(crate) struct Changes<'a> {
    vfs: Option<&'a Vfs>,
    list: Vec<Change>,
}

impl<'a> Changes<'a> {
    #[inline]
    pub(crate) fn new(vfs: &'a Vfs, quiet: bool) -> Changes<'a> {
        Changes {
            vfs: (!quiet && vfs.has_change_listeners()).then_some(vfs),
            list: Vec::new(),
        }
    }

    /// `name` in `dir` changed (and so did `dir`).
    #[inline]
    pub(crate) fn entry(&mut self, dir: &Inode, name: &[u8]) {
        if self.vfs.is_some() {
            self.list.push(Change::Entry {
                dir: dir.ino(),
                dev: dir.dev(),
                name: name.to_vec(),
            });
            self.inode(dir);
        }
    }

    /// The attributes or data of `i` changed.
    #[inline]
    pub(crate) fn inode(&mut self, i: &Inode) {
        if self.vfs.is_some() {
            let (ino, dev) = (i.ino(), i.dev());
            let dup = self
                .list
                .iter()
                .any(|c| matches!(c, Change::Inode { ino: a, dev: b } if (*a, *b) == (ino, dev)));
            if !dup {
                self.list.push(Change::Inode { ino, dev });
            }
        }
    }
}

impl Drop for Changes<'_> {
    fn drop(&mut self) {
        let Some(vfs) = self.vfs else { return };
        if self.list.is_empty() {
            return;
        }
        for l in vfs.change_listeners() {
            for c in &self.list {
                match c {
                    Change::Entry { dir, dev, name } => l.entry_changed(*dir, *dev, name),
                    Change::Inode { ino, dev } => l.inode_changed(*ino, *dev),
                }
            }
        }
    }
}

pub(crate) const NAME_LOCKS: usize = 1024;

pub(crate) struct VfsInner {
    pub(crate) config: VfsConfig,
    pub(crate) dc: Arc<Dcache>,
    pub(crate) mounts: Atomic<MountTable>,
    /// Linux's `mount_lock` sequence: bumped by every mount table change
    /// (mount, umount) after it is made; every lock-free walk samples it at
    /// its start and checks it at the end and before it takes references
    /// (walk.rs). On its own line: nothing else writes it.
    pub(crate) mount_seq: CachePadded<SeqCount>,
    /// Serialises mount, umount and remount; holds the fold flags of
    /// unmounted mounts whose counts have not been folded yet (see
    /// `MntRef::detach`), which the last owner waits for.
    pub(crate) mount_lock: Mutex<Vec<Arc<std::sync::atomic::AtomicBool>>>,
    /// The root mount (dropped by hand in `drop`, before the dcache is
    /// shrunk).
    pub(crate) root: ManuallyDrop<MntRef>,
    /// One cache line per stripe: packed, eight stripes shared a line, so
    /// creates of unrelated names collided there by chance (conflict
    /// matrix, issue 16).
    pub(crate) name_locks: Box<[CachePadded<Mutex<()>>]>,
    next_dev: AtomicU64,
    next_mount: AtomicU64,
    /// Change listeners: null when there are none (the common case, tested
    /// with one load by every changing call).
    listeners: Atomic<Listeners>,
    listeners_lock: Mutex<()>,
}

/// A virtual filesystem: a namespace of mounted filesystems with shared
/// caches. Cheap to clone (an `Arc`).
#[derive(Clone)]
pub struct Vfs {
    pub(crate) inner: Arc<VfsInner>,
}

impl std::fmt::Debug for Vfs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vfs")
            .field("config", &self.inner.config)
            .finish()
    }
}

impl Vfs {
    /// A `Vfs` whose root is a fresh memfs, with default variants.
    pub fn new() -> Vfs {
        Vfs::with_config(VfsConfig::default())
    }

    /// A `Vfs` whose root is a fresh memfs.
    pub fn with_config(config: VfsConfig) -> Vfs {
        let fs: Arc<dyn Filesystem> = Arc::new(MemFs::new(1, config.memfs.clone()));
        Vfs::with_root_fs(config, fs)
    }

    /// A `Vfs` whose root is `fs`.
    pub fn with_root_fs(config: VfsConfig, fs: Arc<dyn Filesystem>) -> Vfs {
        let dc = Arc::new(Dcache::new(config.dcache.clone()));
        let sb = Arc::new(Super {
            fs: fs.clone(),
            dev: 1,
            dentries: dc.counts().clone(),
            rename_mutex: Mutex::new(Class::RenameMutex, ()),
            orphans: config.new_orphan_file(),
        });
        let root_d = dc.alloc_root(sb.clone(), fs.root());
        let root = ManuallyDrop::new(MntRef::new(Mount::new(1, sb, root_d, None, false)));
        let inner = VfsInner {
            config,
            dc,
            mounts: Atomic::new(MountTable::default()),
            mount_seq: CachePadded::new(SeqCount::new()),
            mount_lock: Mutex::new(Class::MountLock, Vec::new()),
            root,
            name_locks: (0..NAME_LOCKS)
                .map(|_| CachePadded::new(Mutex::new(Class::NameStripe, ())))
                .collect(),
            next_dev: AtomicU64::new(2),
            next_mount: AtomicU64::new(2),
            listeners: Atomic::null(),
            listeners_lock: Mutex::new(Class::ListenersLock, ()),
        };
        Vfs {
            inner: Arc::new(inner),
        }
    }

    pub fn config(&self) -> &VfsConfig {
        &self.inner.config
    }

    /// The dentry cache (statistics, shrinking).
    pub fn dcache(&self) -> &Dcache {
        &self.inner.dc
    }

    pub(crate) fn root_path(&self) -> PathRef {
        PathRef {
            mnt: MntRef::clone(&self.inner.root),
            dentry: self.inner.root.root.clone(),
        }
    }

    /// Allocate a device number for a new filesystem instance.
    pub fn new_dev(&self) -> u64 {
        // Relaxed: only uniqueness matters.
        self.inner.next_dev.fetch_add(1, Ordering::Relaxed)
    }

    /// A new memfs instance with its own device number.
    pub fn new_memfs(&self, opts: MemFsOptions) -> Arc<dyn Filesystem> {
        Arc::new(MemFs::new(self.new_dev(), opts))
    }

    /// Mount `fs` on the directory `at` (a resolved path).
    pub(crate) fn mount_at(
        &self,
        at: PathRef,
        fs: Arc<dyn Filesystem>,
        readonly: bool,
    ) -> VfsResult<()> {
        if !at.inode().is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let _l = self.inner.mount_lock.lock();
        // The mount point's own directory lock, shared: an rmdir (or a
        // rename over it) holds it exclusive while it removes the
        // directory and marks it dead, and checks for a mount again under
        // it. So either this mount comes first (the removal is EBUSY) or it
        // finds the directory dead: ENOENT, as Linux's do_lock_mount
        // (cant_mount). Before, a removed working directory could be
        // mounted on, unreachable, and the mount above it stayed busy.
        let _dl = at.inode().dir_lock.read();
        if at.inode().is_dead() {
            return Err(Errno::ENOENT);
        }
        let guard = epoch::pin();
        let cur = self.table(&guard);
        let key = (at.mnt.as_ptr() as usize, at.dentry.as_ptr() as usize);
        if cur.on.contains_key(&key) {
            return Err(Errno::EBUSY);
        }
        let root_inode = fs.root();
        let dev = root_inode.dev();
        let sb = Arc::new(Super {
            fs,
            dev,
            dentries: self.inner.dc.counts().clone(),
            rename_mutex: Mutex::new(Class::RenameMutex, ()),
            orphans: self.inner.config.new_orphan_file(),
        });
        let root_d = self.inner.dc.alloc_root(sb.clone(), root_inode);
        // Relaxed: only uniqueness matters.
        let id = self.inner.next_mount.fetch_add(1, Ordering::Relaxed);
        self.inner.dc.set_mounted(&at.dentry, true);
        let m = MntRef::new(Mount::new(
            id,
            sb,
            root_d,
            Some((at.mnt.clone(), at.dentry.clone())),
            readonly,
        ));
        let mut next = MountTable { on: cur.on.clone() };
        next.on.insert(key, m);
        self.publish(next, &guard);
        Ok(())
    }

    /// Unmount the filesystem mounted on `at`'s mount point (`at` is the
    /// mount's root). EBUSY if something below it is mounted or in use: an
    /// fd open on a file in it, or a task's cwd or root in it (as Linux
    /// without MNT_DETACH). An open or chdir that walked into the mount
    /// before the unmount and finishes after it is not excluded.
    pub(crate) fn umount_at(&self, at: &PathRef) -> VfsResult<()> {
        let mut folds = self.inner.mount_lock.lock();
        let guard = epoch::pin();
        if !std::ptr::eq(at.dentry.as_ptr(), at.mnt.root.as_ptr()) {
            return Err(Errno::EINVAL);
        }
        let Some((pm, pd)) = at.mnt.parent.as_ref() else {
            return Err(Errno::EBUSY);
        };
        let cur = self.table(&guard);
        if cur.on.values().any(|m| {
            m.parent
                .as_ref()
                .is_some_and(|(p, _)| MntRef::ptr_eq(p, &at.mnt))
        }) {
            return Err(Errno::EBUSY);
        }
        if at.mnt.users.sum() != 0 {
            return Err(Errno::EBUSY);
        }
        let key = (pm.as_ptr() as usize, pd.as_ptr() as usize);
        let mut next = MountTable { on: cur.on.clone() };
        next.on.remove(&key);
        self.inner.dc.set_mounted(pd, false);
        self.publish(next, &guard);
        // Out of the tree: its count goes exact, the last reference frees it.
        // Acquire: pairs with the folds' Release.
        folds.retain(|f| !f.load(std::sync::atomic::Ordering::Acquire));
        folds.push(at.mnt.detach());
        Ok(())
    }

    /// `mount -o remount,ro` / `remount,rw` of the mount whose root is
    /// `at`: EINVAL if `at` is not a mount root; making it read-only is
    /// EBUSY while a regular file is open for writing through it (Linux's
    /// sb_prepare_remount_readonly). Race with opens (Dekker, SeqCst): the
    /// flag is set first and the writer count read after; an open counts
    /// itself first and reads the flag after (`File::new`'s callers), so
    /// one of them sees the other: the remount fails EBUSY (the flag goes
    /// back) or the open fails EROFS. Unlike Linux (MNT_WRITE_HOLD) an open
    /// racing with a remount that then fails may see EROFS.
    pub(crate) fn remount_at(&self, at: &PathRef, readonly: bool) -> VfsResult<()> {
        let _l = self.inner.mount_lock.lock();
        if !std::ptr::eq(at.dentry.as_ptr(), at.mnt.root.as_ptr()) {
            return Err(Errno::EINVAL);
        }
        let m = &at.mnt;
        if !readonly {
            // SeqCst: as is_readonly.
            m.readonly.store(false, Ordering::SeqCst);
            return Ok(());
        }
        // SeqCst: the Dekker pair with add_writer/is_readonly.
        if m.readonly.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        // SeqCst: as above.
        if m.writers.sum() != 0 {
            // SeqCst: as above.
            m.readonly.store(false, Ordering::SeqCst);
            return Err(Errno::EBUSY);
        }
        Ok(())
    }

    /// The mount on top of dentry `d` of mount `mnt`, if any: the one
    /// lookup behind every mount crossing (the walk's lock-free and
    /// reference loops, and so `open`'s final crossing).
    pub(crate) fn mounted_on<'g>(
        &self,
        mnt: *const Mount,
        d: *const Dentry,
        guard: &'g Guard,
    ) -> Option<&'g MntRef> {
        self.table(guard).on.get(&(mnt as usize, d as usize))
    }

    /// Sample the mount sequence (start of a lock-free walk).
    #[inline]
    pub(crate) fn mount_read_begin(&self) -> u32 {
        self.inner.mount_seq.read_begin()
    }

    /// Whether the mount table changed since `seq`.
    #[inline]
    pub(crate) fn mount_retry(&self, seq: u32) -> bool {
        self.inner.mount_seq.retry(seq)
    }

    pub(crate) fn table<'g>(&self, guard: &'g Guard) -> &'g MountTable {
        // Acquire: pairs with the Release publication in `publish`.
        let p = self.inner.mounts.load(Ordering::Acquire, guard);
        // SAFETY: the table pointer is never null (set at construction and
        // only swapped for another valid table), and it is freed only after
        // a grace period, which `guard` holds off.
        unsafe { p.deref() }
    }

    fn publish(&self, t: MountTable, guard: &Guard) {
        // AcqRel: publish the new table, take ownership of the old one.
        let old = self
            .inner
            .mounts
            .swap(Owned::new(t), Ordering::AcqRel, guard);
        // Make lock-free walks that raced with the change redo themselves
        // (they validate with the mount sequence at the end and before
        // taking references). Written only here, under `mount_lock`.
        self.inner.mount_seq.write_begin();
        self.inner.mount_seq.write_end();
        // SAFETY: the old table is unreachable now; readers are pinned.
        unsafe { guard.defer_destroy(old) };
    }

    /// Stop-the-world style quiescence for tests: run deferred frees.
    pub fn flush_deferred(&self) {
        // This thread's own deferred frees (limbo.rs) join the epoch's,
        // sealed each round (a free may retire more).
        for _ in 0..8 {
            crate::limbo::seal_open();
            epoch::pin().flush();
            crate::limbo::poll();
        }
    }

    /// Register `l` to be told about changes made through the library by
    /// tasks that are not quiet (see [`ChangeListener`]).
    pub fn add_change_listener(&self, l: Arc<dyn ChangeListener>) {
        self.update_listeners(|v| v.push(l));
    }

    /// Unregister `l` (the same `Arc` that was added). Returns whether it
    /// was registered. Once this returns, no new call of `l` starts (calls
    /// already running may finish after it).
    pub fn remove_change_listener(&self, l: &Arc<dyn ChangeListener>) -> bool {
        let mut found = false;
        self.update_listeners(|v| {
            if let Some(i) = v.iter().position(|x| same_listener(x, l)) {
                v.remove(i);
                found = true;
            }
        });
        found
    }

    fn update_listeners(&self, f: impl FnOnce(&mut Vec<Arc<dyn ChangeListener>>)) {
        let _l = self.inner.listeners_lock.lock();
        let guard = epoch::pin();
        // Acquire: pairs with the Release part of the swap below (earlier
        // updates); updates are serialised by `listeners_lock`.
        let cur = self.inner.listeners.load(Ordering::Acquire, &guard);
        // SAFETY: a non-null pointer is a published `Listeners`, freed only
        // after a grace period, which `guard` holds off.
        let mut v = unsafe { cur.as_ref() }.map_or_else(Vec::new, |c| c.0.clone());
        f(&mut v);
        let next = if v.is_empty() {
            epoch::Shared::null()
        } else {
            Owned::new(Listeners(v)).into_shared(&guard)
        };
        // AcqRel: publish the new list, take ownership of the old one.
        let old = self.inner.listeners.swap(next, Ordering::AcqRel, &guard);
        if !old.is_null() {
            // SAFETY: the old list is unreachable now; readers are pinned.
            unsafe { guard.defer_destroy(old) };
        }
    }

    /// Whether any change listener is registered: one load, no write.
    #[inline]
    pub(crate) fn has_change_listeners(&self) -> bool {
        // SAFETY: the unprotected guard is only used to read the pointer,
        // which is compared with null and never dereferenced.
        let g = unsafe { epoch::unprotected() };
        // Relaxed: a hint whether to record changes; the list is loaded
        // again with Acquire (under a real guard) before it is used.
        !self.inner.listeners.load(Ordering::Relaxed, g).is_null()
    }

    /// A snapshot of the registered listeners (so they are called unpinned).
    pub(crate) fn change_listeners(&self) -> Vec<Arc<dyn ChangeListener>> {
        let guard = epoch::pin();
        // Acquire: pairs with the publication in `update_listeners`.
        let cur = self.inner.listeners.load(Ordering::Acquire, &guard);
        // SAFETY: as in `update_listeners`.
        unsafe { cur.as_ref() }.map_or_else(Vec::new, |c| c.0.clone())
    }

    /// Index of the name lock stripe for `(parent, name)`.
    pub(crate) fn name_lock_index(&self, parent: &Dentry, name: &[u8]) -> usize {
        (self.inner.dc.qname(parent, name).hash >> 32) as usize % NAME_LOCKS
    }
}

fn same_listener(a: &Arc<dyn ChangeListener>, b: &Arc<dyn ChangeListener>) -> bool {
    // The data pointers only: vtable pointers of one type may differ
    // between codegen units.
    std::ptr::eq(Arc::as_ptr(a).cast::<()>(), Arc::as_ptr(b).cast::<()>())
}

impl Default for Vfs {
    fn default() -> Self {
        Vfs::new()
    }
}

impl Drop for VfsInner {
    fn drop(&mut self) {
        let mut folds = std::mem::take(&mut *self.mount_lock.lock());
        let guard = epoch::pin();
        // AcqRel: take ownership of the last table.
        let old = self
            .mounts
            .swap(epoch::Shared::null(), Ordering::AcqRel, &guard);
        if !old.is_null() {
            // SAFETY: we are the last owner of the Vfs: every task and file
            // holds a `Vfs`, so no walker can be reading the table.
            let table = unsafe { old.into_owned() };
            // The tree goes: each mount's count goes exact, and the last
            // reference (a handle may outlive the Vfs) frees it.
            folds.extend(table.on.values().map(|m| m.detach()));
            drop(table);
        }
        folds.push(self.root.detach());
        // SAFETY: dropped once, here; `root` is not used after this.
        unsafe { ManuallyDrop::drop(&mut self.root) };
        // AcqRel: take ownership of the listener list.
        let old = self
            .listeners
            .swap(epoch::Shared::null(), Ordering::AcqRel, &guard);
        if !old.is_null() {
            // SAFETY: as for the mount table: we are the last owner, and
            // listeners are only read through a `Vfs`.
            drop(unsafe { old.into_owned() });
        }
        drop(guard);
        // Let the mounts' counts fold (a grace period each; bounded: a
        // thread that stays pinned holds them off, and then what they hold
        // stays until later), so that mounts nothing else refers to are
        // freed and their dentries released before the shrink below.
        // This thread's own deferred frees go first too (limbo.rs: a file it
        // closed last holds its dentry, which must be unused before the
        // shrink).
        for _ in 0..1000 {
            // Acquire: pairs with the fold's Release.
            if folds
                .iter()
                .all(|f| f.load(std::sync::atomic::Ordering::Acquire))
                && crate::limbo::drained()
            {
                break;
            }
            crate::limbo::seal_open();
            epoch::pin().flush();
            crate::limbo::poll();
        }
        // Unused cached dentries hold their parents and superblocks; free
        // them so the filesystems can go. Ones still referenced by a leaked
        // handle stay.
        self.dc.shrink_all();
        // The shrink's frees wait for a grace period, and the last count on
        // a filesystem (its superblock's, its inodes') goes with them: run
        // them now (bounded), so that a filesystem the caller drops next is
        // the last count and is shut down then (an ext4 image written back
        // and marked clean), not whenever this thread frees again — never,
        // if the program exits first (an embedded ext4 dropped before exit
        // left its journal needing recovery and its last writes unseen).
        // Not under loom: its models free what an execution deferred at the
        // end of it (`loom_models::model`), and this reads counters that
        // live in statics, which loom's objects cannot.
        if !cfg!(loom) {
            crate::flush_deferred_frees();
        }
    }
}
