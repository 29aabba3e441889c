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
use std::collections::HashMap;
use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned};
use scalevfs_sync::primitive::{AtomicBool, AtomicU64, Ordering};
use scalevfs_sync::LockRefVariant;

use crate::dcache::{Dcache, DcacheConfig, DcacheIndex, Dentry, DentryLayout, DentryRef};
use crate::errno::{Errno, VfsResult};
use crate::fstype::Filesystem;
use crate::inode::Inode;
use crate::memfs::{MemFs, MemFsOptions};
use crate::percpu::SplitCount;
use crate::types::Cred;
use crossbeam_utils::CachePadded;

/// One mounted filesystem instance.
pub struct Super {
    pub fs: Arc<dyn Filesystem>,
    pub dev: u64,
    pub(crate) dc: Arc<Dcache>,
    pub(crate) rename_mutex: Mutex<()>,
    /// The in-memory orphan file (DESIGN 2.5; see `orphan.rs`).
    pub orphans: scalevfs_orphan::OrphanFile,
}

impl std::fmt::Debug for Super {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Super")
            .field("fs", &self.fs.name())
            .field("dev", &self.dev)
            .finish()
    }
}

/// A mount: a filesystem instance attached at a point of the namespace.
pub struct Mount {
    pub(crate) id: u64,
    pub(crate) sb: Arc<Super>,
    pub(crate) root: DentryRef,
    /// Where it is mounted: the parent mount and the mount point dentry.
    pub(crate) parent: Option<(Arc<Mount>, DentryRef)>,
    /// Read-only (EROFS); flipped by `Vfs::remount_at`.
    pub(crate) readonly: AtomicBool,
    /// `noatime`: reads through this mount never update atime (set by
    /// `Task::set_noatime`, e.g. from the FUSE front end's `-o noatime`).
    pub(crate) noatime: AtomicBool,
    /// Regular files open for writing through this mount (Linux's
    /// mnt_writers, per-CPU there, per-thread slots here): a read-only
    /// remount is EBUSY while any is open.
    pub(crate) writers: SplitCount,
    /// What keeps it busy for `umount` (Linux's mnt_count beyond the tree's
    /// own): fd-table slots holding a file in it, and tasks' root or cwd
    /// snapshots in it. Changed with `hold`/`release`.
    pub(crate) users: SplitCount,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount")
            .field("id", &self.id)
            .field("sb", &self.sb)
            .finish()
    }
}

impl Mount {
    pub(crate) fn hold(&self) {
        // A per-thread slot: an open or close writes no line that other
        // threads' opens write (issue 16). An open racing with umount is not
        // excluded (see umount_at).
        self.users.add(1);
    }
    pub(crate) fn release(&self) {
        self.users.add(-1);
    }
    pub fn is_readonly(&self) -> bool {
        // SeqCst: with `writers`, a Dekker pair against `Vfs::remount_at`
        // (see `File::new`).
        self.readonly.load(Ordering::SeqCst)
    }
    pub fn is_noatime(&self) -> bool {
        // Relaxed: a policy bit; a read racing with the change may go
        // either way, as on Linux.
        self.noatime.load(Ordering::Relaxed)
    }
    /// A regular file opened for writing (`File::new`).
    pub(crate) fn add_writer(&self) {
        // SeqCst inside: the store side of the Dekker pair (see
        // `is_readonly` and `SplitCount`).
        self.writers.add(1);
    }
    pub(crate) fn drop_writer(&self) {
        self.writers.add(-1);
    }
    pub fn sb(&self) -> &Arc<Super> {
        &self.sb
    }
}

/// A counted location in the namespace: a mount and a dentry in it.
#[derive(Clone, Debug)]
pub struct PathRef {
    pub mnt: Arc<Mount>,
    pub dentry: DentryRef,
}

impl PathRef {
    pub(crate) fn same(&self, mnt: *const Mount, d: *const Dentry) -> bool {
        std::ptr::eq(Arc::as_ptr(&self.mnt), mnt) && std::ptr::eq(self.dentry.as_ptr(), d)
    }
    /// For `..`: climb out of mount roots to their mount points, stopping
    /// at `root`. `Ok(p)`: `..` is the parent dentry of `p`, in `p`'s mount.
    /// `Err(p)`: `p` is `root` or the top of the namespace, its own `..`.
    pub(crate) fn climb_for_dotdot(self, root: &PathRef) -> Result<PathRef, PathRef> {
        let mut cur = self;
        loop {
            if cur.same(Arc::as_ptr(&root.mnt), root.dentry.as_ptr()) {
                return Err(cur);
            }
            if cur.dentry.as_ptr() != cur.mnt.root.as_ptr() {
                return Ok(cur);
            }
            match cur.mnt.parent.clone() {
                Some((mnt, dentry)) => cur = PathRef { mnt, dentry },
                None => return Err(cur),
            }
        }
    }

    /// The parent dentry of this location, in the same mount.
    pub(crate) fn dentry_parent(self) -> PathRef {
        let dentry = self.dentry.parent();
        PathRef {
            mnt: self.mnt,
            dentry,
        }
    }

    pub fn inode(&self) -> &Arc<crate::inode::Inode> {
        // A PathRef always names a positive dentry.
        self.dentry
            .inode()
            .expect("PathRef names a positive dentry")
    }
}

/// The mount table, replaced as a whole (copy on write) on mount/unmount and
/// read under an epoch guard by the lock-free walk.
#[derive(Default)]
pub(crate) struct MountTable {
    /// (parent mount, mount point dentry) -> mount on top.
    pub(crate) on: HashMap<(usize, usize), Arc<Mount>>,
}

/// How the path walk runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WalkMode {
    /// Lock-free first, references only at the leaf (default).
    #[default]
    LockFree,
    /// Reference mode for every component (a lock/ref per step: "before").
    RefOnly,
}

/// Configuration of a `Vfs`: every mechanism's variant, selectable at run
/// time so one process can compare them.
#[derive(Clone, Debug, Default)]
pub struct VfsConfig {
    pub dcache: DcacheConfig,
    pub walk: WalkMode,
    /// `stat` takes and drops a reference on the leaf, as Linux does
    /// (the default takes none).
    pub stat_takes_ref: bool,
    /// Listing a directory locks each child's dentry, as Linux's libfs does.
    pub readdir_locking: bool,
    /// Options of the root memfs.
    pub memfs: MemFsOptions,
    /// How `lseek` on a regular file synchronises (key `llseek`).
    pub llseek: LlseekVariant,
    /// Orphan-file algorithm of every mounted filesystem (key `orphan`).
    pub orphan: scalevfs_orphan::OrphanVariant,
    /// Blocks in each orphan file (key `orphan-blocks`; 0 = default 16).
    pub orphan_blocks: usize,
    /// Linux's `fs.protected_hardlinks=0` (key `protected-hardlinks=0|1`;
    /// default 1, on): anyone may link any file they can reach. A front end
    /// whose kernel already checked (FUSE: do_linkat's may_linkat runs
    /// before FUSE_LINK, with the host's sysctl) turns the check off here.
    pub protected_hardlinks_off: bool,
    /// Linux's `fs.nr_open` (key `nr-open`; 0 = default
    /// [`crate::file::NR_OPEN`]): the most a task's fd limit may be set to.
    pub nr_open: usize,
}

/// How `lseek` on a regular file synchronises (DESIGN 2.4, seed 003).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LlseekVariant {
    /// No inode lock: SEEK_SET/SEEK_END are stores, SEEK_CUR an atomic update.
    #[default]
    Lockless,
    /// The 2005 behaviour: every lseek takes the inode's lock.
    Locked,
}

impl VfsConfig {
    pub(crate) fn nr_open(&self) -> usize {
        if self.nr_open == 0 {
            crate::file::NR_OPEN
        } else {
            self.nr_open
        }
    }

    pub(crate) fn new_orphan_file(&self) -> scalevfs_orphan::OrphanFile {
        let blocks = if self.orphan_blocks == 0 {
            16
        } else {
            self.orphan_blocks
        };
        scalevfs_orphan::OrphanFile::new(self.orphan, blocks)
    }
}

impl VfsConfig {
    /// Set a variant by name (`lockref=spin`, `layout=packed`,
    /// `index=per-dir`, `walk=ref`, `stat=ref`, `readdir=locking`,
    /// `llseek=locked|lockless`, `orphan=locked|lockless|none`,
    /// `orphan-blocks=N`, `protected-hardlinks=0|1`, `nr-open=N`, the root
    /// memfs's `size=` and `nr_inodes=` as tmpfs spells them).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "lockref" => self.dcache.lockref = value.parse::<LockRefVariant>()?,
            "layout" => {
                self.dcache.layout = match value {
                    "separated" => DentryLayout::Separated,
                    "packed" => DentryLayout::Packed,
                    _ => return Err(format!("unknown layout {value}")),
                }
            }
            "index" => {
                self.dcache.index = match value {
                    "hash" | "global-hash" => DcacheIndex::GlobalHash,
                    "per-dir" => DcacheIndex::PerDir,
                    _ => return Err(format!("unknown index {value}")),
                }
            }
            "walk" => {
                self.walk = match value {
                    "lockfree" | "lock-free" => WalkMode::LockFree,
                    "ref" | "rwlock" => WalkMode::RefOnly,
                    _ => return Err(format!("unknown walk mode {value}")),
                }
            }
            "stat" => self.stat_takes_ref = value == "ref",
            "readdir" => self.readdir_locking = value == "locking",
            "llseek" => {
                self.llseek = match value {
                    "lockless" | "light" => LlseekVariant::Lockless,
                    "locked" | "locked-llseek" => LlseekVariant::Locked,
                    _ => return Err(format!("unknown llseek variant {value} (lockless, locked)")),
                }
            }
            "orphan" => self.orphan = value.parse()?,
            "orphan-blocks" => self.orphan_blocks = value.parse().map_err(|e| format!("{e}"))?,
            "max-entries" => self.dcache.max_entries = value.parse().map_err(|e| format!("{e}"))?,
            "max-bytes" => self.dcache.max_bytes = value.parse().map_err(|e| format!("{e}"))?,
            "nr-open" => {
                let n: usize = value.parse().map_err(|e| format!("{e}"))?;
                if !(crate::file::NR_OPEN_MIN..=crate::file::NR_OPEN_MAX).contains(&n) {
                    return Err(format!(
                        "nr-open={n}: {}..={}",
                        crate::file::NR_OPEN_MIN,
                        crate::file::NR_OPEN_MAX
                    ));
                }
                self.nr_open = n;
            }
            "protected-hardlinks" => {
                self.protected_hardlinks_off = match value {
                    "0" => true,
                    "1" => false,
                    _ => return Err(format!("protected-hardlinks={value}: 0 or 1")),
                }
            }
            "size" => self.memfs.max_bytes = MemFsOptions::parse_size(value)?,
            "nr_inodes" | "nr-inodes" => self.memfs.max_inodes = MemFsOptions::parse_inodes(value)?,
            _ => return Err(format!("unknown option {key}")),
        }
        Ok(())
    }
}

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
    pub(crate) mount_lock: Mutex<()>,
    pub(crate) root: Arc<Mount>,
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
            dc: dc.clone(),
            rename_mutex: Mutex::new(Class::RenameMutex, ()),
            orphans: config.new_orphan_file(),
        });
        let root_d = dc.alloc_root(sb.clone(), fs.root());
        let root = Arc::new(Mount {
            id: 1,
            sb,
            root: root_d,
            parent: None,
            readonly: AtomicBool::new(false),
            noatime: AtomicBool::new(false),
            writers: SplitCount::default(),
            users: SplitCount::default(),
        });
        let inner = VfsInner {
            config,
            dc,
            mounts: Atomic::new(MountTable::default()),
            mount_lock: Mutex::new(Class::MountLock, ()),
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

    /// A new task (process) with credentials `cred`, umask 022, root and cwd
    /// at the root of the namespace.
    pub fn task(&self, cred: Cred) -> crate::task::Task {
        crate::task::Task::new(self.clone(), cred)
    }

    /// A task with root credentials.
    pub fn root_task(&self) -> crate::task::Task {
        self.task(Cred::root())
    }

    pub(crate) fn root_path(&self) -> PathRef {
        PathRef {
            mnt: self.inner.root.clone(),
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
        let guard = epoch::pin();
        let cur = self.table(&guard);
        let key = (Arc::as_ptr(&at.mnt) as usize, at.dentry.as_ptr() as usize);
        if cur.on.contains_key(&key) {
            return Err(Errno::EBUSY);
        }
        let root_inode = fs.root();
        let dev = root_inode.dev();
        let sb = Arc::new(Super {
            fs,
            dev,
            dc: self.inner.dc.clone(),
            rename_mutex: Mutex::new(Class::RenameMutex, ()),
            orphans: self.inner.config.new_orphan_file(),
        });
        let root_d = self.inner.dc.alloc_root(sb.clone(), root_inode);
        // Relaxed: only uniqueness matters.
        let id = self.inner.next_mount.fetch_add(1, Ordering::Relaxed);
        self.inner.dc.set_mounted(&at.dentry, true);
        let m = Arc::new(Mount {
            id,
            sb,
            root: root_d,
            parent: Some((at.mnt.clone(), at.dentry.clone())),
            readonly: AtomicBool::new(readonly),
            noatime: AtomicBool::new(false),
            writers: SplitCount::default(),
            users: SplitCount::default(),
        });
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
        let _l = self.inner.mount_lock.lock();
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
                .is_some_and(|(p, _)| Arc::ptr_eq(p, &at.mnt))
        }) {
            return Err(Errno::EBUSY);
        }
        if at.mnt.users.sum() != 0 {
            return Err(Errno::EBUSY);
        }
        let key = (Arc::as_ptr(pm) as usize, pd.as_ptr() as usize);
        let mut next = MountTable { on: cur.on.clone() };
        next.on.remove(&key);
        self.inner.dc.set_mounted(pd, false);
        self.publish(next, &guard);
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
        // Make walkers that raced with the change retry (mounts ride on the
        // rename sequence).
        self.inner.dc.bump_rename_seq();
        // SAFETY: the old table is unreachable now; readers are pinned.
        unsafe { guard.defer_destroy(old) };
    }

    /// Stop-the-world style quiescence for tests: run deferred frees.
    pub fn flush_deferred(&self) {
        for _ in 0..8 {
            epoch::pin().flush();
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
        let guard = epoch::pin();
        // AcqRel: take ownership of the last table.
        let old = self
            .mounts
            .swap(epoch::Shared::null(), Ordering::AcqRel, &guard);
        if !old.is_null() {
            // SAFETY: we are the last owner of the Vfs: every task and file
            // holds a `Vfs`, so no walker can be reading the table.
            drop(unsafe { old.into_owned() });
        }
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
        // Unused cached dentries hold their parents and superblocks; free
        // them so the filesystems can go. Ones still referenced by a leaked
        // handle stay.
        self.dc.shrink_all();
    }
}
