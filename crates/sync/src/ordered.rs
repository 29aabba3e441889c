//! The VFS-wide lock order, in one table, and lock types that check it at
//! run time (a small lockdep).
//!
//! [`Class`] lists every lock class of scalevfs with its level, outermost
//! first. `docs/design.md` section 2 copies the table; a test in the core
//! crate parses that copy and compares it with [`Class::ALL`], so the two
//! cannot drift.
//!
//! THE RULE. A thread may take a lock of class `C` only if every lock it
//! holds has a level below `C`'s, except where `C`'s [`Nest`] rule allows a
//! second lock of the same class:
//! - [`Nest::Ascending`]: same-class locks in strictly increasing key order
//!   (name stripes and dcache buckets by index, per-directory maps by
//!   address); the checker verifies the keys.
//! - [`Nest::UnderRenameMutex`]: at most two, only while a
//!   [`Class::RenameMutex`] is held (the two parent directories of a
//!   cross-directory rename; the caller orders them ancestor first, else by
//!   address; the checker verifies the count and the mutex).
//! - [`Nest::TryOnly`]: the class is only try-locked; waiting for it is a
//!   violation whatever is held.
//!
//! A try-lock never waits, so it is not checked against the locks held; it
//! is recorded, and what is taken while holding it is checked against it.
//!
//! CHECKING. In builds with `debug_assertions` (tests, `cargo build`) and not
//! under loom, every acquisition through [`Mutex`], [`RwLock`], [`SpinLock`]
//! or [`acquire`] runs [`check`] against a per-thread stack of held locks
//! and panics, naming both locks, on a violation. In release builds the
//! wrappers are the plain locks: the class is not stored, the guard is the
//! inner guard plus a zero-sized marker, and every hook is an empty
//! `#[inline(always)]` function.
//!
//! The wrappers do not poison: a panic while a lock is held leaves the data
//! as it was, as the callers' `unwrap_or_else(|e| e.into_inner())` did.

use core::fmt;
use core::ops::{Deref, DerefMut};

/// Whether a second lock of one class may be taken while one is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nest {
    /// Never.
    No,
    /// In strictly increasing key order.
    Ascending,
    /// At most two, and only under [`Class::RenameMutex`].
    UnderRenameMutex,
    /// The class is only ever try-locked: a waiting acquisition is itself a
    /// violation. (A victim directory's lock is a parent directory's lock
    /// taken out of order, which is safe only because it never waits.)
    TryOnly,
}

macro_rules! classes {
    ($( $(#[$m:meta])* $v:ident = $level:literal, $name:literal, $nest:ident; )*) => {
        /// A lock class and its place in the global order (see the module
        /// documentation).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Class {
            $( $(#[$m])* $v, )*
        }
        impl Class {
            /// Every class, outermost first.
            pub const ALL: &'static [Class] = &[$(Class::$v),*];
            /// The level: a lock may be taken only with locks of lower
            /// levels held (see [`Nest`] for the exceptions).
            pub const fn level(self) -> u8 {
                match self { $(Class::$v => $level,)* }
            }
            /// The lock's name as the code spells it (`docs/design.md`
            /// uses the same).
            pub const fn name(self) -> &'static str {
                match self { $(Class::$v => $name,)* }
            }
            /// The same-class rule.
            pub const fn nest(self) -> Nest {
                match self { $(Class::$v => Nest::$nest,)* }
            }
        }
    };
}

classes! {
    /// `File::pos_lock`: the file position across a read, write,
    /// getdents or lseek of a directory. Outermost, as Linux's
    /// `f_pos_lock` is taken before the inode's lock (getdents holds it
    /// across the directory's lock where the filesystem needs that).
    PosLock = 1, "File::pos_lock", No;
    /// `VfsInner::mount_lock`: mount and unmount.
    MountLock = 2, "VfsInner::mount_lock", No;
    /// `Super::rename_mutex`: the tree's shape during a cross-directory
    /// rename.
    RenameMutex = 3, "Super::rename_mutex", No;
    /// `Inode::dir_lock` of a parent directory: shared for a name
    /// operation in it (and a listing, where the filesystem needs it);
    /// exclusive only with nothing else held (the wait before a victim
    /// retry).
    DirParent = 4, "Inode::dir_lock (parent)", UnderRenameMutex;
    /// `VfsInner::name_locks[i]`: one name stripe.
    NameStripe = 5, "VfsInner::name_locks", Ascending;
    /// `Inode::dir_lock` of a victim directory, exclusive, try-lock only.
    DirVictim = 6, "Inode::dir_lock (victim)", TryOnly;
    /// `FsContext::lock`: chdir and chroot.
    FsContext = 7, "FsContext::lock", No;
    /// `FdTable::lock`: the lowest-fd search, dup2, growing the table.
    FdTable = 8, "FdTable::lock", No;
    /// `Inode::data_lock`: size and data for writers.
    DataLock = 9, "Inode::data_lock", No;
    /// `VfsInner::listeners_lock`: adding and removing change listeners.
    ListenersLock = 10, "VfsInner::listeners_lock", No;
    /// `Dcache::sweeping`: one reclaim sweep at a time (try-lock).
    DcacheSweep = 11, "Dcache::sweeping", TryOnly;
    /// `Dcache::rename_lock`: in-place moves of directories (a file's move
    /// takes only its buckets' locks).
    DcacheRename = 12, "Dcache::rename_lock", No;
    /// `Dentry::children`: a directory's name map (per-dir index), two in
    /// address order.
    DirChildren = 13, "Dentry::children", Ascending;
    /// `Bucket::lock`: a dcache hash bucket, several in index order.
    DcacheBucket = 14, "Bucket::lock", Ascending;
    /// The spinlock half of a dentry's `LockRef`.
    LockRef = 15, "Dentry LockRef", No;
    /// An inode's orphan registration (`InodeOrphan::reg`, `orphan.rs`).
    OrphanReg = 16, "InodeOrphan::reg", No;
    /// `OrphanFile::lock` (the `locked` orphan variant).
    OrphanFile = 17, "OrphanFile::lock", No;
    /// The writer lock of an inode's attribute `SeqLock`.
    AttrWriter = 18, "Inode attr SeqLock writer", No;
    /// `frames::POOL`: memfs's pool of free page frames; a leaf (nothing
    /// is taken under it, `frames.rs`). Inner to every VFS class, not the
    /// innermost: pages are allocated under the data lock, and freed by
    /// epoch destructors, which run on whichever thread collects (at its
    /// outermost pin, one in 128, or at a `Guard::flush`, which collects
    /// even inside a pin) with whatever that thread holds. The VFS pins
    /// before it locks (docs/design.md, "Pin before lock"), so its
    /// collections run outside its locks or under ones below this level.
    /// Nothing but that convention keeps a collection from running under
    /// a class after this one (ext4, FUSE, device: 20-41), e.g. on an ext4
    /// thread with no VFS guard whose first pin comes under its own locks
    /// (`Inode::set_access_acl` from an inode load). That cannot deadlock,
    /// the pool being a leaf, but the debug checker would report it.
    FramePool = 19, "frames::POOL", No;
    /// `ext4 Journal::commit`: one journal commit at a time (fsync, sync,
    /// the commit thread, unmount); taken with no ext4 lock and no journal
    /// handle held. While it is held the committer closes the handle gate
    /// and takes ext4 locks below to free unlinked inodes.
    Ext4Commit = 20, "ext4 Journal::commit", No;
    /// `ext4 Journal::gate`: a journal handle (`txn.rs`), a pass through
    /// the handle gate (`scalevfs_sync::Gate`), taken with no ext4 lock
    /// held; the committer closes the gate (exclusive) under the commit
    /// lock and waits for every pass to leave. Not recorded as held (the
    /// VFS's leaf spinlocks, below it, are taken inside handles): waiting
    /// to enter or to close it is checked ([`check_wait`]).
    Ext4Handle = 21, "ext4 Journal::gate (handle)", No;
    /// `ext4 Ext4Inode::dir_lock`: a directory's shape (blocks, index,
    /// size, link count), exclusive while it changes (two by inode number
    /// for a rename), shared for lookup, readdir and a create or unlink
    /// that changes one block atomically.
    Ext4Dir = 22, "ext4 Ext4Inode::dir_lock", Ascending;
    /// `ext4 Ext4Inode::dir_lock` of a directory being removed (rmdir, or
    /// replaced by a rename) or moved to another parent (its `..`
    /// rewritten), exclusive, taken with the parents' locks held and so
    /// out of their order: only by try-locks (`Ext4::removed_dir_lock`
    /// retries them), never a blocking wait. Safe because no holder of a
    /// directory's lock waits for the gate or the commit lock (checked)
    /// and only a cross-directory rename, which the VFS's rename mutex
    /// keeps alone, waits for a second directory's lock.
    Ext4DirRemoved = 23, "ext4 Ext4Inode::dir_lock (removed)", TryOnly;
    /// `ext4 Ext4Inode::data`: a file's extent tree, exclusive while it
    /// changes (write, truncate, fallocate), shared for read and seek;
    /// also any inode's xattrs (exclusive to set/remove, shared to read).
    Ext4File = 24, "ext4 Ext4Inode::data", No;
    /// `ext4 OrphanList::state`: the orphan list (`orphan=list`, seed
    /// 002's "before"): one mutex for the whole filesystem, held while an
    /// inode joins or leaves the chain and while an inode on it is encoded
    /// (its dtime is the chain's next pointer).
    Ext4OrphanList = 25, "ext4 OrphanList::state", No;
    /// `ext4 RwState::xattr_blocks[i]` and `ea_values[i]`: one shard of
    /// the cache of our xattr blocks by header hash or of our value inodes
    /// by value hash (the kernel's mbcaches): held while a twin is looked
    /// for and its count raised (the candidate's buffer, inode and value
    /// read under it), and to add or drop an entry; a freed block's or
    /// inode's entry goes before it is freed. Never one cache's shard
    /// under the other's.
    Ext4XattrCache = 26, "ext4 RwState::xattr_blocks", No;
    /// `ext4 Alloc::groups[g]`: one block group's allocation state
    /// (bitmaps, free counts, flags); one group at a time.
    Ext4Group = 27, "ext4 Alloc::groups", No;
    /// `ext4 BufCache::shards[i]`: one shard of the metadata buffer cache.
    Ext4Buf = 28, "ext4 BufCache::shards", No;
    /// `ext4 Ext4::sb_raw`: the raw superblock at writeback.
    Ext4Super = 29, "ext4 Ext4::sb_raw", No;
    /// `ext4 Ext4Inode::raw`: an inode's on-disk copy, held only to copy
    /// or replace it.
    Ext4Raw = 30, "ext4 Ext4Inode::raw", No;
    /// `ext4 RwState::unlinked`: inodes whose last name is gone.
    Ext4Unlinked = 31, "ext4 RwState::unlinked", No;
    /// `ext4 Journal::pending`: blocks freed in the running transaction,
    /// reusable after its commit; held only to push or take the list.
    Ext4Pending = 32, "ext4 Journal::pending", No;
    /// `ext4 RwState::dead`: numbers of unlinked inodes whose last VFS
    /// reference just went (pushed from the inode's drop, wherever that
    /// runs; nothing is taken under it).
    Ext4Dead = 33, "ext4 RwState::dead", No;
    /// `ext4 Ext4::cache[i]`: one shard of the inode cache (number -> inode),
    /// held only around its map and recent list; inodes it lets go are
    /// dropped after it is released, so nothing is taken under it.
    Ext4Icache = 34, "ext4 Ext4::cache", No;
    /// `ext4 Journal::help`: where a committer offers the log writes of its
    /// commit to the threads waiting for it (`HelpSlot`); a leaf, held only
    /// to put, take back or clone the offer (by a thread writing its
    /// commit's log, by a waiting thread; nothing held either way).
    Ext4Help = 35, "ext4 Journal::help", No;
    /// `OrphanFile::overflow`: a leaf (nothing is taken under it), taken
    /// when the orphan file is full, under any of the locks above it
    /// (an ext4 directory's lock, the ext4 commit).
    OrphanOverflow = 36, "OrphanFile::overflow", No;
    /// A shard of the FUSE adapter's node table (`crates/fuse/src/
    /// nodes.rs`): held only around its hash map, never across a core call
    /// (a node's handle is dropped after the shard is released).
    FuseNodes = 37, "fuse NodeTable shard", No;
    /// A shard of the per-thread spare parent references
    /// (`core/src/spares.rs`): a leaf, held only around its table, so it
    /// may be taken under any lock above (a dentry's last put runs
    /// wherever a reference is dropped).
    Spares = 38, "spares::Shard", No;
    /// `ext4 MmapDevice::allocating`: one of 64 stripes serialising the
    /// first allocation of a lazily mapped image's chunks
    /// (`MmapDevice::open_lazy`); a leaf, held only across one
    /// allocation (`fallocate`, or populating the chunk's pages on
    /// tmpfs), taken under whatever a device write is done under.
    Ext4DeviceChunk = 39, "ext4 MmapDevice::allocating", No;
    /// `fuse Shared::other_devs`: the device numbers of the mounts under
    /// the FUSE root other than the root's (a node id's slot); a leaf,
    /// held only to find or add a device.
    FuseDevs = 40, "fuse Shared::other_devs", No;
    /// `ext4 MemDevice::data`: the bytes of an in-memory image (tests and
    /// crash simulations); a leaf, held only across one copy in or out,
    /// under whatever a device read or write is done under.
    Ext4MemDevice = 41, "ext4 MemDevice::data", No;
    /// `flock::Shard`: one shard of the BSD file lock table (`core/src/
    /// flock.rs`), inode address -> holders and waiters; a leaf, held only
    /// around its map (nothing is taken, pinned or dropped under it, no
    /// sleep), so it may be taken under any lock above: the last close
    /// runs under `FdTable::lock` (dup2 over an open fd) and a `File`'s
    /// drop wherever an epoch collection runs.
    FlockShard = 42, "flock::Shard", No;
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (level {})", self.name(), self.level())
    }
}

/// Whether the checker runs in this build.
pub const CHECKING: bool = cfg!(all(debug_assertions, not(loom)));

#[cfg(all(debug_assertions, not(loom)))]
mod imp {
    use super::{Class, Nest};
    use std::cell::RefCell;

    #[derive(Clone, Copy, Debug)]
    pub(super) struct Held {
        pub(super) class: Class,
        pub(super) key: u64,
        pub(super) addr: usize,
    }

    thread_local! {
        static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
    }

    /// The violation, if taking `class` (same-class `key`) with `held` held
    /// breaks the order.
    pub(super) fn violation(held: &[Held], class: Class, key: u64) -> Option<String> {
        if class.nest() == Nest::TryOnly {
            return Some(format!(
                "lock order violation: waiting for {class}, which may only be try-locked; \
                 held, oldest first: {:?}",
                held.iter().map(|h| h.class.name()).collect::<Vec<_>>()
            ));
        }
        let same = held.iter().filter(|h| h.class == class).count();
        for h in held {
            let bad = if h.class.level() > class.level() {
                true
            } else if h.class.level() < class.level() {
                false
            } else if h.class != class {
                true
            } else {
                match class.nest() {
                    Nest::No | Nest::TryOnly => true,
                    Nest::Ascending => key <= h.key,
                    Nest::UnderRenameMutex => {
                        same >= 2 || !held.iter().any(|x| x.class == Class::RenameMutex)
                    }
                }
            };
            if bad {
                return Some(format!(
                    "lock order violation: taking {class} [key {key}] while holding {} [key {}]; \
                     held, oldest first: {:?}",
                    h.class,
                    h.key,
                    held.iter().map(|h| h.class.name()).collect::<Vec<_>>()
                ));
            }
        }
        None
    }

    pub(super) fn acquire(class: Class, key: u64, addr: usize, checked: bool) {
        let msg = HELD
            .try_with(|s| {
                let mut s = s.borrow_mut();
                let msg = if checked {
                    violation(&s, class, key)
                } else {
                    None
                };
                if msg.is_none() {
                    s.push(Held { class, key, addr });
                }
                msg
            })
            .ok()
            .flatten();
        if let Some(m) = msg {
            panic!("{m}");
        }
    }

    pub(super) fn check_wait(class: Class, key: u64) {
        let msg = HELD
            .try_with(|s| violation(&s.borrow(), class, key))
            .ok()
            .flatten();
        if let Some(m) = msg {
            panic!("{m}");
        }
    }

    pub(super) fn release(class: Class, addr: usize) {
        let _ = HELD.try_with(|s| {
            let mut s = s.borrow_mut();
            if let Some(i) = s.iter().rposition(|h| h.addr == addr && h.class == class) {
                s.remove(i);
            }
        });
    }

    pub(super) fn held() -> Vec<Class> {
        HELD.try_with(|s| s.borrow().iter().map(|h| h.class).collect())
            .unwrap_or_default()
    }
}

/// Record that this thread takes (`checked`: is about to wait for) a lock
/// of `class` at `addr`; panics if that breaks the order. `key` orders
/// same-class locks for [`Nest::Ascending`]. Pair with [`release`]. For locks
/// that have no guard (a `LockRef`'s lock half); the wrappers call it.
#[inline(always)]
pub fn acquire(class: Class, key: u64, addr: usize) {
    #[cfg(all(debug_assertions, not(loom)))]
    imp::acquire(class, key, addr, true);
    #[cfg(not(all(debug_assertions, not(loom))))]
    let _ = (class, key, addr);
}

/// As [`acquire`] for a lock that was taken without waiting (a try-lock):
/// recorded, not checked.
#[inline(always)]
pub fn acquired_try(class: Class, key: u64, addr: usize) {
    #[cfg(all(debug_assertions, not(loom)))]
    imp::acquire(class, key, addr, false);
    #[cfg(not(all(debug_assertions, not(loom))))]
    let _ = (class, key, addr);
}

/// Check that this thread may now wait for a lock of `class` (same-class
/// `key`) and panic, as [`acquire`] does, if not; nothing is recorded. For
/// waits that are not an acquisition through the wrappers: entering or
/// closing the ext4 handle gate ([`Class::Ext4Handle`]), and a lock taken
/// by a loop of try-locks and sleeps (the ext4 commit lock's waiters),
/// which [`acquired_try`] records without checking.
#[inline(always)]
pub fn check_wait(class: Class, key: u64) {
    #[cfg(all(debug_assertions, not(loom)))]
    imp::check_wait(class, key);
    #[cfg(not(all(debug_assertions, not(loom))))]
    let _ = (class, key);
}

/// Record that this thread released the lock of `class` at `addr`.
#[inline(always)]
pub fn release(class: Class, addr: usize) {
    #[cfg(all(debug_assertions, not(loom)))]
    imp::release(class, addr);
    #[cfg(not(all(debug_assertions, not(loom))))]
    let _ = (class, addr);
}

/// The classes this thread holds, oldest first (always empty when the
/// checker is compiled out).
pub fn held() -> Vec<Class> {
    #[cfg(all(debug_assertions, not(loom)))]
    return imp::held();
    #[cfg(not(all(debug_assertions, not(loom))))]
    Vec::new()
}

/// Whether taking `class` (same-class `key`) with `held` (class, key) held
/// breaks the order; `Some` describes the violation. The pure rule
/// [`acquire`] applies, for tests and tools. Always `None` when the checker
/// is compiled out.
pub fn check(held: &[(Class, u64)], class: Class, key: u64) -> Option<String> {
    #[cfg(all(debug_assertions, not(loom)))]
    {
        let h: Vec<imp::Held> = held
            .iter()
            .map(|&(class, key)| imp::Held {
                class,
                key,
                addr: 0,
            })
            .collect();
        imp::violation(&h, class, key)
    }
    #[cfg(not(all(debug_assertions, not(loom))))]
    {
        let _ = (held, class, key);
        None
    }
}

/// What a guard keeps to undo its record: nothing in release builds.
struct Token {
    #[cfg(all(debug_assertions, not(loom)))]
    class: Class,
    #[cfg(all(debug_assertions, not(loom)))]
    addr: usize,
}

impl Token {
    #[inline(always)]
    fn new(class: Class, key: u64, addr: usize, checked: bool) -> Token {
        // Counting build: taking a lock (shared or not) writes its word.
        #[cfg(all(feature = "trace-lines", not(loom)))]
        crate::trace::lock(addr, class.name());
        Token::new_untraced(class, key, addr, checked)
    }

    /// As `new`, for a lock whose own atomics the counting build records
    /// (a [`BrLock`]: a shared acquisition writes the reader's own line,
    /// not the lock's).
    #[inline(always)]
    fn new_untraced(class: Class, key: u64, addr: usize, checked: bool) -> Token {
        if checked {
            acquire(class, key, addr);
        } else {
            acquired_try(class, key, addr);
        }
        Token {
            #[cfg(all(debug_assertions, not(loom)))]
            class,
            #[cfg(all(debug_assertions, not(loom)))]
            addr,
        }
    }
}

impl Drop for Token {
    #[inline(always)]
    fn drop(&mut self) {
        #[cfg(all(debug_assertions, not(loom)))]
        release(self.class, self.addr);
    }
}

/// The class as stored in a lock: only where the checker runs.
#[derive(Clone, Copy)]
struct Cls {
    #[cfg(any(
        all(debug_assertions, not(loom)),
        all(feature = "trace-lines", not(loom))
    ))]
    c: Class,
}

impl Cls {
    #[inline(always)]
    const fn new(c: Class) -> Cls {
        #[cfg(not(any(
            all(debug_assertions, not(loom)),
            all(feature = "trace-lines", not(loom))
        )))]
        let _ = c;
        Cls {
            #[cfg(any(
                all(debug_assertions, not(loom)),
                all(feature = "trace-lines", not(loom))
            ))]
            c,
        }
    }
    /// The class; `Other` (any) when not stored, where nothing reads it.
    #[inline(always)]
    fn get(self) -> Class {
        #[cfg(any(
            all(debug_assertions, not(loom)),
            all(feature = "trace-lines", not(loom))
        ))]
        return self.c;
        #[cfg(not(any(
            all(debug_assertions, not(loom)),
            all(feature = "trace-lines", not(loom))
        )))]
        Class::MountLock
    }
}

// Release builds: the wrappers are exactly the wrapped locks (no class
// stored; the guards add only zero-sized markers).
#[cfg(not(any(debug_assertions, feature = "trace-lines")))]
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<Mutex<u64>>() == size_of::<std::sync::Mutex<u64>>());
    assert!(size_of::<RwLock<u64>>() == size_of::<std::sync::RwLock<u64>>());
    assert!(size_of::<Token>() == 0);
    assert!(
        size_of::<MutexGuard<'static, u64>>() == size_of::<std::sync::MutexGuard<'static, u64>>()
    );
};

// ---------------------------------------------------------------------------
// Mutex

/// `std::sync::Mutex` with a lock class (see the module documentation).
pub struct Mutex<T: ?Sized> {
    cls: Cls,
    inner: std::sync::Mutex<T>,
}

/// Guard of a [`Mutex`].
pub struct MutexGuard<'a, T: ?Sized> {
    g: std::sync::MutexGuard<'a, T>,
    _t: Token,
}

impl<T> Mutex<T> {
    /// An unlocked mutex of class `class`.
    pub const fn new(class: Class, v: T) -> Mutex<T> {
        Mutex {
            cls: Cls::new(class),
            inner: std::sync::Mutex::new(v),
        }
    }
}

impl<T: ?Sized> Mutex<T> {
    /// The lock word's address (the lock's identity; the counting build
    /// records its line).
    fn addr(&self) -> usize {
        &self.inner as *const _ as *const u8 as usize
    }
    /// Lock (checked against the order).
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.lock_key(0)
    }
    /// Lock with a same-class ordering key ([`Nest::Ascending`]).
    #[inline]
    pub fn lock_key(&self, key: u64) -> MutexGuard<'_, T> {
        let t = Token::new(self.cls.get(), key, self.addr(), true);
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        MutexGuard { g, _t: t }
    }
    /// Lock if free, without waiting.
    #[inline]
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let g = match self.inner.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let t = Token::new(self.cls.get(), 0, self.addr(), false);
        Some(MutexGuard { g, _t: t })
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.g
    }
}
impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.g
    }
}
impl<T: ?Sized> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ordered::Mutex")
    }
}
impl<T: ?Sized> fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ordered::MutexGuard")
    }
}

// ---------------------------------------------------------------------------
// RwLock

/// `std::sync::RwLock` with a lock class. The `_as` methods take it as
/// another class (one lock plays two roles: `Inode::dir_lock` is a parent's
/// lock or a victim's).
pub struct RwLock<T: ?Sized> {
    cls: Cls,
    inner: std::sync::RwLock<T>,
}

/// Shared guard of a [`RwLock`].
pub struct RwLockReadGuard<'a, T: ?Sized> {
    g: std::sync::RwLockReadGuard<'a, T>,
    _t: Token,
}

/// Exclusive guard of a [`RwLock`].
pub struct RwLockWriteGuard<'a, T: ?Sized> {
    g: std::sync::RwLockWriteGuard<'a, T>,
    _t: Token,
}

impl<T> RwLock<T> {
    /// An unlocked rwlock of class `class`.
    pub const fn new(class: Class, v: T) -> RwLock<T> {
        RwLock {
            cls: Cls::new(class),
            inner: std::sync::RwLock::new(v),
        }
    }
}

impl<T: ?Sized> RwLock<T> {
    /// The lock word's address (the lock's identity; the counting build
    /// records its line).
    fn addr(&self) -> usize {
        &self.inner as *const _ as *const u8 as usize
    }
    /// Shared lock (checked).
    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.read_as(self.cls.get(), 0)
    }
    /// Exclusive lock (checked).
    #[inline]
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.write_as(self.cls.get(), 0)
    }
    /// Shared lock as `class` with same-class key `key` (checked).
    #[inline]
    pub fn read_as(&self, class: Class, key: u64) -> RwLockReadGuard<'_, T> {
        let t = Token::new(class, key, self.addr(), true);
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        RwLockReadGuard { g, _t: t }
    }
    /// Exclusive lock as `class` with same-class key `key` (checked).
    #[inline]
    pub fn write_as(&self, class: Class, key: u64) -> RwLockWriteGuard<'_, T> {
        let t = Token::new(class, key, self.addr(), true);
        let g = self.inner.write().unwrap_or_else(|e| e.into_inner());
        RwLockWriteGuard { g, _t: t }
    }
    /// Shared lock as `class` with same-class key `key` (checked), spinning
    /// and yielding a little before sleeping: see [`RwLock::write_spin_as`].
    #[inline]
    pub fn read_spin_as(&self, class: Class, key: u64) -> RwLockReadGuard<'_, T> {
        let t = Token::new(class, key, self.addr(), true);
        let g = spin_then_block(|| self.inner.try_read(), || self.inner.read());
        RwLockReadGuard { g, _t: t }
    }
    /// Exclusive lock as `class` with same-class key `key` (checked),
    /// spinning and yielding a little ([`crate::primitive::Backoff`]'s
    /// budget: about 130 spins and 4 yields) before sleeping in the futex.
    ///
    /// For a lock that threads take on every operation and hold for a
    /// microsecond or two (ext4's directory lock for a create or unlink in
    /// a shared directory). `std`'s lock spins only while nobody sleeps on
    /// it: once one waiter sleeps, every later waiter sleeps at once and
    /// every release must wake one, so two running threads hand the lock
    /// over through a futex sleep and wake (several microseconds) each time,
    /// and adding threads makes the whole slower. Spinning on regardless is
    /// what the kernel's rwsem does (optimistic spinning while the owner
    /// runs); the yields keep an oversubscribed machine from spinning away
    /// the owner's CPU. A spinner may take the lock ahead of a woken
    /// sleeper (as a spinner may in the kernel), so this is for locks held
    /// briefly, not for long waits.
    #[inline]
    pub fn write_spin_as(&self, class: Class, key: u64) -> RwLockWriteGuard<'_, T> {
        let t = Token::new(class, key, self.addr(), true);
        let g = spin_then_block(|| self.inner.try_write(), || self.inner.write());
        RwLockWriteGuard { g, _t: t }
    }
    /// Exclusive lock if free, without waiting (not checked).
    #[inline]
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
        self.try_write_as(self.cls.get())
    }
    /// Exclusive lock as `class` if free, without waiting (not checked).
    #[inline]
    pub fn try_write_as(&self, class: Class) -> Option<RwLockWriteGuard<'_, T>> {
        let g = match self.inner.try_write() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let t = Token::new(class, 0, self.addr(), false);
        Some(RwLockWriteGuard { g, _t: t })
    }
}

/// Try `try_lock` under a bounded backoff, then `lock` (which may sleep).
/// Poisoning is ignored, as everywhere in this module.
#[inline]
fn spin_then_block<G>(
    try_lock: impl Fn() -> std::sync::TryLockResult<G>,
    lock: impl FnOnce() -> std::sync::LockResult<G>,
) -> G {
    let backoff = crate::primitive::Backoff::new();
    loop {
        match try_lock() {
            Ok(g) => return g,
            Err(std::sync::TryLockError::Poisoned(e)) => return e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if !backoff.is_completed() => backoff.snooze(),
            Err(std::sync::TryLockError::WouldBlock) => {
                return lock().unwrap_or_else(|e| e.into_inner())
            }
        }
    }
}

impl<T: ?Sized> Deref for RwLockReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.g
    }
}
impl<T: ?Sized> Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.g
    }
}
impl<T: ?Sized> DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.g
    }
}
impl<T: ?Sized> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ordered::RwLock")
    }
}
impl<T: ?Sized> fmt::Debug for RwLockReadGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ordered::RwLockReadGuard")
    }
}
impl<T: ?Sized> fmt::Debug for RwLockWriteGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ordered::RwLockWriteGuard")
    }
}

// ---------------------------------------------------------------------------
// SpinLock

/// [`crate::SpinLock`] with a lock class (the statistics class stays the
/// inner lock's).
pub struct SpinLock<T: ?Sized> {
    cls: Cls,
    inner: crate::SpinLock<T>,
}

/// Guard of a [`SpinLock`].
pub struct SpinGuard<'a, T: ?Sized> {
    g: crate::SpinGuard<'a, T>,
    _t: Token,
}

#[cfg(not(loom))]
impl<T> SpinLock<T> {
    /// An unlocked spinlock of order class `class` whose statistics go to
    /// `stat`.
    pub const fn new(class: Class, stat: crate::LockClass, v: T) -> SpinLock<T> {
        SpinLock {
            cls: Cls::new(class),
            inner: crate::SpinLock::with_class(v, stat),
        }
    }
}

#[cfg(loom)]
impl<T> SpinLock<T> {
    /// An unlocked spinlock of order class `class` whose statistics go to
    /// `stat`.
    pub fn new(class: Class, stat: crate::LockClass, v: T) -> SpinLock<T> {
        SpinLock {
            cls: Cls::new(class),
            inner: crate::SpinLock::with_class(v, stat),
        }
    }
}

impl<T: ?Sized> SpinLock<T> {
    /// The lock word's address (the lock's identity; the counting build
    /// records its line).
    fn addr(&self) -> usize {
        &self.inner as *const _ as *const u8 as usize
    }
    /// Lock (checked).
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        self.lock_key(0)
    }
    /// Lock with a same-class ordering key (checked).
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn lock_key(&self, key: u64) -> SpinGuard<'_, T> {
        let t = Token::new(self.cls.get(), key, self.addr(), true);
        SpinGuard {
            g: self.inner.lock(),
            _t: t,
        }
    }
    /// Lock if free, without waiting (not checked).
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        let g = self.inner.try_lock()?;
        let t = Token::new(self.cls.get(), 0, self.addr(), false);
        Some(SpinGuard { g, _t: t })
    }
}

impl<T: ?Sized> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.g
    }
}
impl<T: ?Sized> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.g
    }
}
impl<T: ?Sized> fmt::Debug for SpinLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ordered::SpinLock")
    }
}
impl<T: ?Sized> fmt::Debug for SpinGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ordered::SpinGuard")
    }
}

#[cfg(all(test, debug_assertions, not(loom)))]
mod tests {
    use super::*;

    fn panics(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
        let e = std::panic::catch_unwind(f).expect_err("expected a lock-order panic");
        e.downcast_ref::<String>().cloned().unwrap_or_default()
    }

    #[test]
    fn levels_strictly_increase_and_names_are_unique() {
        for w in Class::ALL.windows(2) {
            assert!(w[0].level() < w[1].level(), "{} then {}", w[0], w[1]);
        }
        let mut names: Vec<_> = Class::ALL.iter().map(|c| c.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Class::ALL.len());
    }

    #[test]
    fn inversion_panics_with_both_names() {
        let stripe = Mutex::new(Class::NameStripe, ());
        let dir = RwLock::new(Class::DirParent, ());
        let msg = panics(|| {
            let _s = stripe.lock();
            let _d = dir.read();
        });
        assert!(msg.contains("VfsInner::name_locks"), "{msg}");
        assert!(msg.contains("Inode::dir_lock (parent)"), "{msg}");
        // The failed acquisition left nothing behind; the order works.
        assert!(held().is_empty(), "{:?}", held());
        let _d = dir.read();
        let _s = stripe.lock();
        assert_eq!(held(), vec![Class::DirParent, Class::NameStripe]);
    }

    #[test]
    fn same_class_needs_its_rule() {
        let a = Mutex::new(Class::FdTable, ());
        let b = Mutex::new(Class::FdTable, ());
        panics(|| {
            let _a = a.lock();
            let _b = b.lock();
        });
        // Stripes: ascending keys only.
        let s = [
            Mutex::new(Class::NameStripe, ()),
            Mutex::new(Class::NameStripe, ()),
        ];
        {
            let _x = s[0].lock_key(3);
            let _y = s[1].lock_key(7);
        }
        panics(|| {
            let _x = s[1].lock_key(7);
            let _y = s[0].lock_key(3);
        });
        // Two parents only under the rename mutex, and never three.
        let rm = Mutex::new(Class::RenameMutex, ());
        let d: Vec<_> = (0..3).map(|_| RwLock::new(Class::DirParent, ())).collect();
        panics(|| {
            let _a = d[0].read();
            let _b = d[1].read();
        });
        {
            let _m = rm.lock();
            let _a = d[0].read();
            let _b = d[1].read();
        }
        panics(|| {
            let _m = rm.lock();
            let _a = d[0].read();
            let _b = d[1].read();
            let _c = d[2].read();
        });
    }

    #[test]
    fn try_lock_is_recorded_not_checked() {
        let stripe = Mutex::new(Class::NameStripe, ());
        let dir = RwLock::new(Class::DirParent, ());
        let victim = RwLock::new(Class::DirParent, ());
        let _s = stripe.lock();
        // Out of order, but it does not wait: allowed.
        let v = victim.try_write_as(Class::DirVictim).unwrap();
        assert_eq!(held(), vec![Class::NameStripe, Class::DirVictim]);
        // What is taken under it is checked against it.
        let msg = panics(|| {
            let _d = dir.read();
        });
        assert!(msg.contains("Inode::dir_lock (victim)"), "{msg}");
        drop(v);
        assert_eq!(held(), vec![Class::NameStripe]);
    }

    #[test]
    fn check_wait_checks_without_recording() {
        // The handle gate: waiting to enter it with an ext4 lock held
        // panics, naming both; with only VFS-level locks it passes.
        let data = RwLock::new(Class::Ext4File, ());
        let msg = panics(|| {
            let _d = data.write();
            check_wait(Class::Ext4Handle, 0);
        });
        assert!(msg.contains("ext4 Journal::gate (handle)"), "{msg}");
        assert!(msg.contains("ext4 Ext4Inode::data"), "{msg}");
        assert!(held().is_empty(), "{:?}", held());
        let vfs_data = Mutex::new(Class::DataLock, ());
        let commit = Mutex::new(Class::Ext4Commit, ());
        let _v = vfs_data.lock();
        check_wait(Class::Ext4Commit, 0);
        // The committer closes the gate under the commit lock.
        let _c = commit.lock();
        check_wait(Class::Ext4Handle, 0);
        // Nothing recorded by the checks.
        assert_eq!(held(), vec![Class::DataLock, Class::Ext4Commit]);
        // The commit lock again (a commit requested by its holder).
        let msg = panics(|| check_wait(Class::Ext4Commit, 0));
        assert!(msg.contains("ext4 Journal::commit"), "{msg}");
    }

    #[test]
    fn waiting_for_a_try_only_class_panics() {
        // Issue 12's old order: parent shared, stripe, then WAIT for the
        // victim directory's lock.
        let parent = RwLock::new(Class::DirParent, ());
        let stripe = Mutex::new(Class::NameStripe, ());
        let victim = RwLock::new(Class::DirParent, ());
        let msg = panics(|| {
            let _p = parent.read();
            let _s = stripe.lock();
            let _v = victim.write_as(Class::DirVictim, 0);
        });
        assert!(msg.contains("may only be try-locked"), "{msg}");
        assert!(msg.contains("VfsInner::name_locks"), "{msg}");
    }

    #[test]
    fn spinning_acquisitions_are_checked_and_exclusive() {
        // Checked like the plain ones: an inversion panics before waiting.
        let stripe = Mutex::new(Class::NameStripe, ());
        let dir = RwLock::new(Class::DirParent, ());
        let msg = panics(|| {
            let _s = stripe.lock();
            let _d = dir.write_spin_as(Class::DirParent, 0);
        });
        assert!(msg.contains("Inode::dir_lock (parent)"), "{msg}");
        assert!(held().is_empty(), "{:?}", held());
        // Exclusive against each other and against readers, whether the
        // waiter gets the lock while spinning or after its backoff ran out
        // and it slept (the holder here keeps it for a millisecond).
        let lock = std::sync::Arc::new(RwLock::new(Class::DirParent, 0u64));
        std::thread::scope(|s| {
            for k in 0..4 {
                let lock = lock.clone();
                s.spawn(move || {
                    for i in 0..200 {
                        if (i + k) % 3 == 0 {
                            let g = lock.read_spin_as(Class::DirParent, 0);
                            assert_eq!(*g % 2, 0);
                        } else {
                            let mut g = lock.write_spin_as(Class::DirParent, 0);
                            *g += 1;
                            if i % 50 == 0 {
                                std::thread::sleep(std::time::Duration::from_millis(1));
                            }
                            *g += 1;
                        }
                    }
                    assert!(held().is_empty(), "{:?}", held());
                });
            }
        });
        let writes = (0..4u64)
            .map(|k| (0..200u64).filter(|i| (i + k) % 3 != 0).count() as u64)
            .sum::<u64>();
        assert_eq!(*lock.read(), 2 * writes);
    }

    #[test]
    fn release_out_of_order() {
        let a = Mutex::new(Class::MountLock, ());
        let b = Mutex::new(Class::RenameMutex, ());
        let ga = a.lock();
        let gb = b.lock();
        drop(ga);
        assert_eq!(held(), vec![Class::RenameMutex]);
        drop(gb);
        assert!(held().is_empty());
    }
}

/// The `trace-lines` build: shim atomics and ordered locks report their
/// lines to `crate::trace` (here, not in `trace.rs`: the recorder is the
/// lower layer and names neither the shim nor the locks).
#[cfg(all(test, feature = "trace-lines", not(loom)))]
mod trace_tests {
    use super::*;

    #[test]
    fn shim_atomics_and_locks_report() {
        use crate::primitive::{AtomicU64, Ordering};
        use crate::trace::{start, stop, Label, LINE};
        let x = AtomicU64::new(0);
        let y = AtomicU64::new(0);
        let m = Mutex::new(Class::MountLock, ());
        start();
        x.fetch_add(1, Ordering::Relaxed);
        let _ = y.load(Ordering::Relaxed);
        drop(m.lock());
        let l = stop();
        let line = |p: usize| p & !(LINE - 1);
        assert!(l.writes.contains_key(&line(&x as *const _ as usize)));
        assert!(
            !l.writes.contains_key(&line(&y as *const _ as usize))
                || line(&x as *const _ as usize) == line(&y as *const _ as usize)
        );
        assert!(l.touches.contains_key(&line(&y as *const _ as usize)));
        assert!(l
            .writes
            .values()
            .any(|v| *v == Label::Lock(Class::MountLock.name())));
        // Not recording: nothing.
        x.fetch_add(1, Ordering::Relaxed);
        start();
        let l = stop();
        assert!(l.touches.is_empty());
    }
}

/// A big-reader lock ([`crate::brlock`]) with a class in the order table:
/// taken shared, it writes only the calling thread's own reader slots, so
/// threads that take it shared do not share a line through it; taken
/// exclusive, it scans every thread's slots. Holds no data (a lock for a
/// namespace, like the VFS's directory lock). Checked like [`RwLock`].
pub struct BrLock {
    cls: Cls,
    raw: crate::brlock::RawBrLock,
    /// Under loom no thread has a block (the process-wide list lives in a
    /// `static`): every reader uses the overflow count, and writers scan
    /// this empty list.
    #[cfg(loom)]
    none: crate::brlock::Readers,
}

/// Shared guard of a [`BrLock`].
pub struct BrReadGuard<'a> {
    l: &'a BrLock,
    me: Option<&'static crate::brlock::ReaderSlots>,
    t: crate::brlock::ReadTicket,
    _t: Token,
    /// Not `Send`: the release clears the taking thread's own slot.
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Exclusive guard of a [`BrLock`].
pub struct BrWriteGuard<'a> {
    l: &'a BrLock,
    _t: Token,
    /// Not `Send`, as std's guards (the lock-order record is per thread).
    _not_send: std::marker::PhantomData<*const ()>,
}

impl BrLock {
    /// An unlocked lock of class `class`.
    pub fn new(class: Class) -> BrLock {
        BrLock {
            cls: Cls::new(class),
            raw: crate::brlock::RawBrLock::new(),
            #[cfg(loom)]
            none: crate::brlock::Readers::new(),
        }
    }
    fn addr(&self) -> usize {
        &self.raw as *const _ as usize
    }
    fn readers(&self) -> &crate::brlock::Readers {
        #[cfg(not(loom))]
        return &crate::brlock::global::READERS;
        #[cfg(loom)]
        &self.none
    }
    fn mine() -> Option<&'static crate::brlock::ReaderSlots> {
        #[cfg(not(loom))]
        return crate::brlock::global::mine();
        #[cfg(loom)]
        None
    }
    /// Shared lock (checked).
    #[inline]
    pub fn read(&self) -> BrReadGuard<'_> {
        self.read_as(self.cls.get(), 0)
    }
    /// Shared lock as `class` with same-class key `key` (checked).
    #[inline]
    pub fn read_as(&self, class: Class, key: u64) -> BrReadGuard<'_> {
        let tok = Token::new_untraced(class, key, self.addr(), true);
        let me = Self::mine();
        let t = self.raw.read(me);
        BrReadGuard {
            l: self,
            me,
            t,
            _t: tok,
            _not_send: std::marker::PhantomData,
        }
    }
    /// Exclusive lock (checked).
    #[inline]
    pub fn write(&self) -> BrWriteGuard<'_> {
        self.write_as(self.cls.get(), 0)
    }
    /// Exclusive lock as `class` with same-class key `key` (checked).
    #[inline]
    pub fn write_as(&self, class: Class, key: u64) -> BrWriteGuard<'_> {
        let tok = Token::new(class, key, self.addr(), true);
        self.raw.write(self.readers());
        BrWriteGuard {
            l: self,
            _t: tok,
            _not_send: std::marker::PhantomData,
        }
    }
    /// Exclusive lock if no writer holds it and no reader is inside,
    /// without waiting (not checked).
    #[inline]
    pub fn try_write(&self) -> Option<BrWriteGuard<'_>> {
        self.try_write_as(self.cls.get())
    }
    /// Exclusive lock as `class` if no writer holds it and no reader is
    /// inside, without waiting (not checked).
    #[inline]
    pub fn try_write_as(&self, class: Class) -> Option<BrWriteGuard<'_>> {
        if !self.raw.try_write(self.readers()) {
            return None;
        }
        let tok = Token::new(class, 0, self.addr(), false);
        Some(BrWriteGuard {
            l: self,
            _t: tok,
            _not_send: std::marker::PhantomData,
        })
    }
}

impl Drop for BrReadGuard<'_> {
    fn drop(&mut self) {
        self.l.raw.read_unlock(self.me, self.t);
    }
}
impl Drop for BrWriteGuard<'_> {
    fn drop(&mut self) {
        self.l.raw.write_unlock();
    }
}
impl fmt::Debug for BrLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ordered::BrLock")
    }
}
impl fmt::Debug for BrReadGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ordered::BrReadGuard")
    }
}
impl fmt::Debug for BrWriteGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ordered::BrWriteGuard")
    }
}
