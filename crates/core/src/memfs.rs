//! memfs: the in-memory filesystem type (tmpfs-like), the embedded default.
//!
//! LOCKING RULES
//! - Directory contents are two concurrent indexes (by name, by cookie),
//!   each split into up to `NAME_SHARDS` / `COOKIE_SHARDS` skip lists (`Shards`: by a hash of the
//!   name, by the cookie's batch): creates and unlinks of different names
//!   in one directory run in parallel, take no directory-wide lock, and
//!   from different threads mostly write different lists. The names of a
//!   directory that one thread alone has filled stay in one list (most
//!   directories: a list costs about 500 bytes), and spread by hash from
//!   the first insert by a second thread on (`MemDir::names`). Operations on
//!   one name are serialised by the VFS name locks, so the two indexes are
//!   updated without a lock of their own: insert into `by_cookie` then
//!   `by_name`; remove from `by_name` then `by_cookie`.
//! - File data: `MemFile` is a page store read without locks (see
//!   `pages.rs`); the VFS holds the inode's data lock exclusively around
//!   writes, truncates and fallocate, which serialises the writers, except
//!   positioned overwrites inside one existing page (`write_shared`), which
//!   hold it shared and publish their copies by compare-and-exchange.
//! - Attributes live in the VFS inode (its seqlock); memfs has no copy,
//!   except a directory's size and link count, which it reports from the
//!   entry count and its own subdirectory count (`dir_attrs`,
//!   `Inode::with_attr_fn`): a create, unlink, mkdir or rmdir writes the
//!   directory's attribute record only for its mtime/ctime, and only when
//!   they are not the current clock tick already
//!   (`Inode::touch_mc_unless_current`).
//! - Limits (tmpfs's `size=` and `nr_inodes=`): one counter each in
//!   `MemStats`, taken with a bounded read-modify-write (never past the
//!   limit) and given back when pages or inodes are freed. The inode count
//!   is a per-thread `LimitedCounter` (`percpu.rs`): a create takes a unit
//!   its thread reserved, so creates on different threads write no shared
//!   line; inode numbers come from per-thread batches (`InoAllocator`).
//! - A directory's parent (`MemDir::parent`, for `get_parent`: file handles
//!   of directories) is a boxed weak reference behind an epoch pointer,
//!   read lock-free; mkdir sets it and a rename that moves the directory
//!   to another parent swaps in a new box (the VFS's rename locks order the
//!   writers), the old one freed after a grace period.
//!
//! By default memfs keeps every dentry in the dcache (`dcache_authoritative`),
//! as tmpfs does: a cache miss is a definite ENOENT. With
//! `authoritative: false` the dcache treats it as it would a disk
//! filesystem (lookups on miss, negative dentries, eviction), which tests use
//! to exercise the cache machinery.

use std::ptr;
use std::sync::{Arc, OnceLock, Weak};

use crossbeam_epoch::{self as epoch, Atomic, Owned};
use crossbeam_skiplist::SkipMap;
use scalevfs_sync::primitive::{AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::percpu::{InoAllocator, LimitedCounter};
use crate::xattr::{XattrBudget, XattrStore};

use crate::errno::{Errno, VfsResult};
use crate::fstype::{Filesystem, NewNode};
use crate::inode::Inode;
use crate::types::{Attr, DirEntry, FileType, StatFs, Timespec, S_IFDIR, S_IFLNK};

/// Page size of file data.
pub const PAGE: usize = crate::pages::PAGE;
/// Size tmpfs charges per directory entry (`BOGO_DIRENT_SIZE`).
const BOGO_DIRENT_SIZE: u64 = 20;
/// First cookie of a real entry: 1 and 2 are "." and "..".
pub const FIRST_COOKIE: u64 = 3;

/// memfs mount options.
#[derive(Clone, Debug)]
pub struct MemFsOptions {
    /// The dcache holds every name (a miss is ENOENT). Default true.
    pub authoritative: bool,
    /// Maximum number of inodes, the root included (ENOSPC past it; tmpfs's
    /// `nr_inodes`). Default: half the physical RAM pages, as tmpfs.
    pub max_inodes: u64,
    /// Maximum bytes of file data, in whole pages (ENOSPC past it; tmpfs's
    /// `size`). Default: half the physical RAM, as tmpfs.
    pub max_bytes: u64,
    /// Maximum file size (EFBIG past it).
    pub max_file_size: u64,
}

impl Default for MemFsOptions {
    fn default() -> Self {
        let ram = MemFsOptions::physical_ram();
        MemFsOptions {
            authoritative: true,
            max_inodes: (ram / PAGE as u64 / 2).max(1),
            max_bytes: (ram / 2) / PAGE as u64 * PAGE as u64,
            max_file_size: i64::MAX as u64,
        }
    }
}

impl MemFsOptions {
    /// Bytes of physical RAM (`sysconf(_SC_PHYS_PAGES)`; 1 GiB if unknown).
    pub fn physical_ram() -> u64 {
        // Miri cannot ask the OS; its tests take the fallback.
        if cfg!(miri) {
            return 1 << 30;
        }
        // SAFETY: sysconf has no preconditions.
        let (pages, size) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if pages <= 0 || size <= 0 {
            return 1 << 30;
        }
        (pages as u64).saturating_mul(size as u64)
    }

    /// Parse tmpfs's `size=`: bytes with an optional k, m, g, t, p or e
    /// suffix (powers of 1024, either case), or `N%` of physical RAM;
    /// rounded up to whole pages. 0 (tmpfs's "no limit") is refused: memfs
    /// always has a limit.
    pub fn parse_size(v: &str) -> Result<u64, String> {
        let bytes = match v.strip_suffix('%') {
            Some(pct) => {
                let pct: u64 = pct.parse().map_err(|e| format!("size={v}: {e}"))?;
                (u128::from(MemFsOptions::physical_ram()) * u128::from(pct) / 100)
                    .try_into()
                    .map_err(|_| format!("size={v}: too large"))?
            }
            None => parse_suffixed(v).map_err(|e| format!("size={v}: {e}"))?,
        };
        if bytes == 0 {
            return Err(format!("size={v}: memfs needs a limit above 0"));
        }
        bytes
            .checked_next_multiple_of(PAGE as u64)
            .ok_or_else(|| format!("size={v}: too large"))
    }

    /// Parse tmpfs's `nr_inodes=`: a count with an optional k, m, g, t, p or
    /// e suffix; 0 (tmpfs's "no limit") is refused.
    pub fn parse_inodes(v: &str) -> Result<u64, String> {
        match parse_suffixed(v).map_err(|e| format!("nr_inodes={v}: {e}"))? {
            0 => Err(format!("nr_inodes={v}: memfs needs a limit above 0")),
            n => Ok(n),
        }
    }
}

/// Run the frees that are due: push this thread's deferred frees (epoch
/// garbage: file pages, index nodes; and the thread's own batch of closed
/// files, dropped dentries and directory entries' inode counts, which it
/// frees itself, `limbo.rs`) to the global queue and collect, a few rounds
/// since a freed object may defer more. Garbage otherwise waits in the
/// thread's own bag or batch until the thread defers more or makes its next
/// system calls, which an idle server thread never does: the space and
/// memory of a deleted file would stay taken. Cheap when there is nothing
/// to free. The FUSE adapter calls it after a release or forget; a library
/// user may call it after deleting files (the epoch's own `flush` does not
/// reach the thread's batch).
///
/// One flush collects only a few sealed bags (crossbeam's COLLECT_STEPS, 8
/// bags of up to 64 frees), and an overwrite of existing pages retires a
/// page per 4 KiB: after overwriting 200 MiB, 800 bags wait, and a later
/// delete's frees queue behind them (issue 12: stress-ng's sync-file left
/// ~1 GiB resident and counted as used after the file was gone). So keep
/// flushing while retired pages are being freed, then a few rounds more
/// for what is queued behind them. Bounded: the rounds needed for the
/// pages pending at the start, plus slack.
pub fn flush_deferred_frees() {
    let mut last = crate::pages::retired_pending();
    let bound = 4 + last / 64 + 16;
    // Rounds that free no retired page before stopping: after a backlog,
    // more, since what queued behind it (the file's inode) waits for the
    // epoch to advance past it.
    let patience = if last == 0 { 4 } else { 8 };
    let mut idle = 0;
    for _ in 0..bound {
        // This thread's own deferred frees (dentries, open files, entry
        // counts: limbo.rs) go with the epoch's: sealed each round (a free
        // run here may retire more: a file's last count drops its dentry),
        // freed once due.
        crate::limbo::seal_open();
        crossbeam_epoch::pin().flush();
        crate::limbo::poll();
        let now = crate::pages::retired_pending();
        if now < last {
            idle = 0;
        } else {
            idle += 1;
            if idle >= patience {
                break;
            }
        }
        last = now;
    }
    crate::frames::clean_local();
}

/// A number with an optional binary suffix, as the kernel's `memparse`.
fn parse_suffixed(v: &str) -> Result<u64, String> {
    let (num, shift) = match v.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_lowercase() {
                'k' => 10,
                'm' => 20,
                'g' => 30,
                't' => 40,
                'p' => 50,
                'e' => 60,
                _ => return Err(format!("unknown suffix {c}")),
            };
            (&v[..i], shift)
        }
        _ => (v, 0),
    };
    let n: u64 = num.parse().map_err(|e| format!("{e}"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| "too large".to_string())
}

/// The budget attribute `name` is charged to: none for the POSIX ACLs,
/// which tmpfs keeps in the inode (`i_acl`), not in its attribute store,
/// and does not count against its inode space (checked on the host: an
/// ACL set on a full pool succeeds). Their values are bounded by
/// validation and there are two per inode at most.
fn charged<'a>(name: &[u8], b: &'a XattrBudget<'a>) -> Option<&'a XattrBudget<'a>> {
    let acl = name == crate::xattr::POSIX_ACL_ACCESS || name == crate::xattr::POSIX_ACL_DEFAULT;
    (!acl).then_some(b)
}

#[derive(Debug, Default)]
pub(crate) struct MemStats {
    /// Units of `nr_inodes` taken: inodes, extra names, and the whole
    /// KiBs attributes hold (`XattrBudget`).
    live_inodes: LimitedCounter,
    used_pages: AtomicI64,
    /// Bytes charged by extended attributes (`xattr::xattr_space`).
    xattr_bytes: AtomicU64,
}

impl MemStats {
    /// The attributes' share of the inode space (`XattrBudget`); only a
    /// release when `max_units` is 0.
    fn xattr_budget(&self, max_units: u64) -> XattrBudget<'_> {
        XattrBudget {
            bytes: &self.xattr_bytes,
            units: &self.live_inodes,
            max_units,
        }
    }
}

/// memfs's per-inode data.
pub(crate) struct MemNode {
    kind: MemKind,
    stats: Arc<MemStats>,
    xattrs: XattrStore,
}

enum MemKind {
    // Boxed: two skip lists are ~1 KiB, which every file would otherwise carry.
    Dir(Box<MemDir>),
    File(MemFile),
    Symlink(Box<[u8]>),
    Special,
}

impl Drop for MemNode {
    fn drop(&mut self) {
        self.stats.live_inodes.dec();
        let x = self.xattrs.space();
        if x != 0 {
            self.stats.xattr_budget(0).release(x);
        }
        let pages = match &self.kind {
            MemKind::File(f) => f.npages() as i64,
            MemKind::Symlink(t) if symlink_takes_page(t) => 1,
            _ => 0,
        };
        if pages != 0 {
            // Relaxed: as `pages::Quota::give`: the page count orders
            // nothing but itself.
            self.stats.used_pages.fetch_sub(pages, Ordering::Relaxed);
        }
        // What this inode held on the heap, roughly (a directory's index
        // lists about 1 KiB), toward the heap trim (`frames::heap_freed`).
        let extra = match &self.kind {
            MemKind::Dir(_) => std::mem::size_of::<MemDir>() + 1024,
            MemKind::Symlink(t) => t.len(),
            _ => 0,
        };
        crate::frames::heap_freed(
            std::mem::size_of::<Inode>() + std::mem::size_of::<MemNode>() + extra + x as usize,
        );
    }
}

/// Targets at least this long are stored in a page that the filesystem's
/// size limit counts, as tmpfs's (`SHORT_SYMLINK_LEN`, 128 bytes with the
/// terminating NUL: shorter ones live in the inode); such a symlink
/// reports 8 blocks. Without the charge, 4 KiB per inode of `nr_inodes`
/// went past `size=`.
const SHORT_SYMLINK_LEN: usize = 128;

fn symlink_takes_page(target: &[u8]) -> bool {
    target.len() + 1 > SHORT_SYMLINK_LEN
}

struct DirSlot {
    cookie: u64,
    inode: InodeCell,
}

/// A directory entry's inode: one strong count of an `Arc<Inode>`, held as
/// a raw pointer so that the thread removing the entry takes it out and
/// drops it itself, after a grace period (`limbo.rs`). Left in the
/// skip-list node, the count went with the node to whichever thread
/// collected the epoch's garbage, and with it, often, the inode's last
/// count: a file's inode freed by the other core (issue 16, cross-thread
/// frees).
struct InodeCell(AtomicPtr<Inode>);

impl InodeCell {
    fn new(i: Arc<Inode>) -> InodeCell {
        InodeCell(AtomicPtr::new(Arc::into_raw(i) as *mut Inode))
    }

    /// `f` on the inode, unless the entry was removed meanwhile. Takes no
    /// count (writes nothing).
    fn with<R>(&self, f: impl FnOnce(&Arc<Inode>) -> R) -> Option<R> {
        let _g = epoch::pin();
        // Acquire: the inode behind the pointer.
        let p = self.0.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null: one strong count is held by this cell or, once
        // `detach` took it, by a retired drop that waits for our guard; so
        // the Arc is alive while we are pinned. ManuallyDrop: we borrow it.
        let a = std::mem::ManuallyDrop::new(unsafe { Arc::from_raw(p) });
        Some(f(&a))
    }

    /// A counted reference, unless the entry was removed meanwhile.
    fn get(&self) -> Option<Arc<Inode>> {
        self.with(Arc::clone)
    }

    /// Take the count out (the entry is out of the index) and drop it
    /// after a grace period, on this thread when it can; `last`: the
    /// inode's last name went (`remove_entry`).
    fn detach(&self, last: bool) {
        if cfg!(loom) {
            // Loom's threads share std's thread-locals (limbo.rs): the
            // count stays with the node.
            return;
        }
        // AcqRel: the count leaves once (Acquire: the inode's state for the
        // drop).
        let p = self.0.swap(ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: `p` is a strong count we hold (taken out above).
            let heavy = last && crate::limbo::is_heavy(0, unsafe { &*p }.attr().blocks);
            // SAFETY: `p` is this cell's count, now ours alone; `retire`
            // waits for readers pinned in `with`.
            unsafe {
                if heavy {
                    // Its last name: maybe its last count, holding data.
                    crate::limbo::retire_heavy(drop_inode_count, p as *mut ())
                } else {
                    crate::limbo::retire(drop_inode_count, p as *mut ())
                }
            };
        }
    }
}

impl Drop for InodeCell {
    fn drop(&mut self) {
        // Relaxed: the node is being destroyed, no one else reaches it.
        let p = self.0.load(Ordering::Relaxed);
        if !p.is_null() {
            // SAFETY: the cell's own count (`new`), not detached.
            drop_entry_count(unsafe { Arc::from_raw(p) });
        }
    }
}

std::thread_local! {
    /// Entry counts whose drop `drop_entry_count` put off: the inodes of a
    /// directory being freed, freed by the outermost drop on this thread.
    static ENTRY_DROPS: std::cell::RefCell<Vec<Arc<Inode>>> =
        const { std::cell::RefCell::new(Vec::new()) };
    /// An outermost `drop_entry_count` is running on this thread.
    static ENTRY_DROPPING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Drop the count a directory entry held, without recursion: a directory
/// still holding entries is freed only when a whole tree goes (its file
/// system dropped, the `Vfs` gone), and the last count of a child
/// directory frees that directory's entries in turn, a dozen stack frames
/// per level: a tree 100,000 levels deep (mkdirat relative to an fd makes
/// one) overflowed the stack of whichever thread collected it. Counts met
/// while a drop is running on this thread queue here, and the outermost
/// drop frees them one at a time (Linux's `shrink_dcache_for_umount` is a
/// loop too). The queue holds at most one count per inode of the tree.
fn drop_entry_count(a: Arc<Inode>) {
    // Not the last count: nothing below it goes now. Under loom the
    // model's threads share std's thread-locals (limbo.rs): drop in place.
    if Arc::strong_count(&a) > 1 || cfg!(loom) {
        drop(a);
        return;
    }
    // A thread being torn down may have lost its thread-locals already:
    // then drop in place (what a thread exit collects is shallow).
    let nested = ENTRY_DROPPING.try_with(|d| d.replace(true)).unwrap_or(true);
    if nested {
        if let Err(a) = queue_entry_drop(a) {
            drop(a);
        }
        return;
    }
    // Clears the flag however the loop ends (a drop that panics included).
    struct Outermost;
    impl Drop for Outermost {
        fn drop(&mut self) {
            let _ = ENTRY_DROPPING.try_with(|d| d.set(false));
        }
    }
    let _outermost = Outermost;
    let mut next = Some(a);
    while let Some(a) = next {
        // The drop may queue more (this directory's entries).
        drop(a);
        next = ENTRY_DROPS
            .try_with(|q| q.borrow_mut().pop())
            .ok()
            .flatten();
    }
    // A big tree's queue gives its memory back.
    let _ = ENTRY_DROPS.try_with(|q| {
        let mut q = q.borrow_mut();
        if q.capacity() > 1024 {
            *q = Vec::new();
        }
    });
}

/// Queue `a` for the running outermost `drop_entry_count`; `Err` when this
/// thread's queue is gone (thread exit).
fn queue_entry_drop(a: Arc<Inode>) -> Result<(), Arc<Inode>> {
    let mut a = Some(a);
    let r = ENTRY_DROPS.try_with(|q| {
        if let Some(a) = a.take() {
            q.borrow_mut().push(a);
        }
    });
    match (r, a) {
        (Ok(()), None) => Ok(()),
        (_, Some(a)) => Err(a),
        (Err(_), None) => Ok(()),
    }
}

/// The deferred half of `InodeCell::detach`.
///
/// # Safety
/// `p` is one strong count of an `Arc<Inode>` (`Arc::into_raw`), after a
/// grace period; called once.
unsafe fn drop_inode_count(p: *mut ()) {
    // SAFETY: the contract above.
    drop(unsafe { Arc::from_raw(p as *const Inode) });
}

/// A name in a directory's index: up to 24 bytes inside the skip-list node
/// itself (most names), longer ones on the heap. A node is freed by
/// whichever thread collects the epoch's garbage, often not the one that
/// made it; a name kept inline is one block less allocated per create and
/// freed by another thread per unlink (issue 16: on a machine where
/// moving a line between cores is slow, each such free costs several line
/// transfers in the allocator).
type NameBuf = smallvec::SmallVec<[u8; 24]>;

/// Skip lists of a directory's name index (a power of two). Names spread
/// over them by hash once two threads inserted, so every list a busy
/// directory makes costs about 500 bytes: 16 lists instead of 8 took
/// 5-10% more memory in directories two threads filled (1.4 KB more per
/// 10-name directory) for 0.3 fewer shared writes per create at 16
/// threads, so names keep 8.
const NAME_SHARDS: usize = 8;
/// Skip lists of a directory's cookie index (a power of two). Cookies go
/// by their batch, which is a thread's own, so a list is made per thread
/// that inserted, whatever the count: 16 instead of 8 halved the chance
/// that two of 16 threads share one (1.4 fewer shared writes per create
/// and 1.5 per mkdir at 16 threads, `bench/results/2026-11-27-stop31-
/// 16core.md`) and costs 64 bytes of empty slots per directory.
const COOKIE_SHARDS: usize = 16;

/// One directory index split into `N` skip lists, each made on first use
/// (a list costs about 500 bytes even when empty).
///
/// crossbeam-skiplist keeps a list's length and the seed of its random
/// tower heights on one line, and every insert and remove writes both: with
/// one list per index, every create and unlink in a directory wrote two
/// such lines that every other thread creating there also wrote (issue 16:
/// 2 shared-line writes per list per op at 2 to 16 threads). Names are
/// spread by a hash, cookies by their batch (`percpu::INO_BATCH`: a
/// thread's creates take consecutive cookies from its own batch), so
/// threads creating different names mostly write different lists. A
/// listing merges the cookie lists in cookie order (`MemFs::readdir`).
struct Shards<K, V, const N: usize>([OnceLock<Box<Shard<K, V>>>; N]);

/// One list of a `Shards`, with a count beside it that its writers keep:
/// in `by_cookie`, the subdirectories among the entries whose cookies are
/// in this list (`MemDir::subdirs`).
struct Shard<K, V> {
    list: SkipMap<K, V>,
    count: AtomicU32,
}

impl<K, V, const N: usize> Default for Shards<K, V, N> {
    fn default() -> Self {
        Shards(std::array::from_fn(|_| OnceLock::new()))
    }
}

impl<K: Ord + Send + 'static, V: Send + 'static, const N: usize> Shards<K, V, N> {
    /// List `i`, if it was made.
    fn get(&self, i: usize) -> Option<&SkipMap<K, V>> {
        self.0[i].get().map(|b| &b.list)
    }
    /// Shard `i`, made now if it was not.
    fn make_shard(&self, i: usize) -> &Shard<K, V> {
        self.0[i].get_or_init(|| {
            Box::new(Shard {
                list: SkipMap::new(),
                count: AtomicU32::new(0),
            })
        })
    }
    /// List `i`, made now if it was not.
    fn make(&self, i: usize) -> &SkipMap<K, V> {
        &self.make_shard(i).list
    }
    /// The lists made so far.
    fn made(&self) -> impl Iterator<Item = &SkipMap<K, V>> {
        self.0.iter().filter_map(|l| l.get().map(|b| &b.list))
    }
    /// The sum of the made shards' counts.
    fn count_sum(&self) -> u32 {
        self.0
            .iter()
            .filter_map(|l| l.get())
            // Relaxed: counts, like the lists' lengths.
            .fold(0u32, |n, b| {
                n.saturating_add(b.count.load(Ordering::Relaxed))
            })
    }
    fn len(&self) -> usize {
        self.made().map(SkipMap::len).sum()
    }
    fn is_empty(&self) -> bool {
        self.made().all(SkipMap::is_empty)
    }
}

/// The `by_name` list of `name`: FNV-1a of its bytes.
fn name_shard(name: &[u8]) -> usize {
    let mut h: u32 = 0x811c_9dc5;
    for &b in name {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    (h ^ (h >> 16)) as usize & (NAME_SHARDS - 1)
}

/// The `by_cookie` list of `cookie`: its batch's.
fn cookie_shard(cookie: u64) -> usize {
    (cookie / crate::percpu::INO_BATCH) as usize & (COOKIE_SHARDS - 1)
}

/// Counting build: record a use of skip list `l` (`MemDir::trace`).
#[inline(always)]
fn note_list<T>(write: bool, l: Option<&T>, what: &'static str) {
    if let Some(l) = l {
        if write {
            scalevfs_sync::trace::note_write(l, what);
        } else {
            scalevfs_sync::trace::note_read(l, what);
        }
    }
}

/// `MemDir::names` once a second thread inserted: names spread by hash.
const NAMES_SPREAD: usize = usize::MAX;

/// Where a directory's new names go (`MemDir::names`): list 0 while one
/// thread alone inserted, then the list of each name's hash.
#[derive(Default)]
pub(crate) struct NameSpread(AtomicUsize);

impl NameSpread {
    /// Whether new names spread by hash.
    pub(crate) fn spread(&self) -> bool {
        // Acquire: a name inserted in its hash's list after the store is
        // looked for there (see `MemDir::names`).
        self.0.load(Ordering::Acquire) == NAMES_SPREAD
    }

    /// The list a new name whose hash's list is `hashed` goes to, noting
    /// this thread as an inserter.
    pub(crate) fn insert_list(&self, hashed: usize) -> usize {
        let me = crate::percpu::thread_index()
            .wrapping_add(1)
            .min(NAMES_SPREAD - 1);
        // Relaxed load and failure: only the switch to NAMES_SPREAD
        // publishes anything (Release, read by `spread`'s Acquire); the
        // thread number is a hint, and the compare-exchange (AcqRel) only
        // decides which thread was first.
        let cur = self.0.load(Ordering::Relaxed);
        if cur == NAMES_SPREAD {
            return hashed;
        }
        if cur == me {
            return 0;
        }
        if cur == 0 {
            match self
                .0
                .compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return 0,
                Err(v) if v == me => return 0,
                Err(v) if v == NAMES_SPREAD => return hashed,
                Err(_) => {}
            }
        }
        self.0.store(NAMES_SPREAD, Ordering::Release);
        hashed
    }
}

#[derive(Default)]
struct MemDir {
    by_name: Shards<NameBuf, DirSlot, NAME_SHARDS>,
    /// Where new names go: 0 before the first insert, then the inserting
    /// thread's number + 1 while only that thread inserted (every name in
    /// `by_name` list 0), then `NAMES_SPREAD` (each new name in the list
    /// of its hash; names inserted before stay in list 0, so a lookup
    /// tries its hash's list, then list 0). Written twice at most, so a
    /// directory filled by one thread costs one name list instead of up to
    /// `NAME_SHARDS`, and threads creating in one directory still write
    /// different lists from the second thread's first insert on (issue 16).
    /// A lookup that reads a value before `NAMES_SPREAD` and so misses a
    /// name inserted in its hash's list ran before the insert: the insert
    /// came after the store of `NAMES_SPREAD`. Checks before a create
    /// see the store (the name lock orders them after any earlier insert
    /// of that name, which read it).
    names: NameSpread,
    by_cookie: Shards<u64, NameBuf, COOKIE_SHARDS>,
    /// The cookie batch (`MemFs::next_cookie`) the last listing of this
    /// directory to start ended at (`readdir_end`): entries added after it
    /// take their cookies from that batch or a later one, so at or past
    /// the listing's end. Written only when a listing starts after a new
    /// batch was handed out; read by every insert.
    listed_batch: AtomicU64,
    /// The parent directory (`..`); null for the root, its own parent.
    parent: Atomic<Weak<Inode>>,
    // Subdirectories: the link count is 2 more (`dir_attrs`). Counted in
    // the `by_cookie` shards (`Shard::count`), each subdirectory in the
    // shard of its entry's cookie: changed by mkdir, rmdir and renames of
    // directories (under the directory's lock, shared) instead of the
    // attribute record, and beside the cookie list that the same create or
    // removal writes anyway, so two threads making directories in one
    // parent (whose cookies come from their own batches) mostly write
    // different counters (issue 16). `MemDir::subdirs` is the sum.
}

impl Drop for MemDir {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other thread reaches this cell any more,
        // so no guard is needed to load it.
        let g = unsafe { epoch::unprotected() };
        // Relaxed: as above.
        let p = self.parent.load(Ordering::Relaxed, g);
        if !p.is_null() {
            // SAFETY: the box was made by `Owned::new` and is owned by this
            // cell alone (`set_parent` unlinked the earlier ones).
            drop(unsafe { p.into_owned() });
        }
    }
}

impl MemDir {
    /// A new directory in `parent`.
    fn in_dir(parent: &Arc<Inode>) -> MemDir {
        let d = MemDir::default();
        // Relaxed: the directory is not shared yet; publishing its inode
        // publishes this.
        d.parent
            .store(Owned::new(Arc::downgrade(parent)), Ordering::Relaxed);
        d
    }

    /// The directory moved to `parent`.
    fn set_parent(&self, parent: &Arc<Inode>) {
        let g = epoch::pin();
        // AcqRel: the new box is published to readers (Release); the old
        // one's contents were read before it is retired (Acquire).
        let old = self
            .parent
            .swap(Owned::new(Arc::downgrade(parent)), Ordering::AcqRel, &g);
        if !old.is_null() {
            // SAFETY: unlinked by the swap, so no new reader reaches it;
            // freed once, after every guard that may have loaded it.
            unsafe { g.defer_destroy(old) };
        }
    }

    /// The parent directory, `None` for the root (or a parent that is
    /// gone: this directory was removed with it).
    fn parent(&self) -> Option<Arc<Inode>> {
        let g = epoch::pin();
        // Acquire: pairs with the Release of `in_dir`/`set_parent`.
        let p = self.parent.load(Ordering::Acquire, &g);
        // SAFETY: a box loaded under `g` is freed only after `g` is dropped
        // (`set_parent` defers its destruction; `drop` runs when no reader
        // is left).
        unsafe { p.as_ref() }.and_then(Weak::upgrade)
    }

    /// Counting build (`trace-lines`, `scalevfs bench commute`) only: the
    /// skip lists' atomics live in crossbeam and bypass the shim, so record
    /// each list as one object: an insert or remove writes its list's
    /// length and seed (and often its head links), a lookup reads the head
    /// of its name's list. `name`: the entry's name and cookie; None for a
    /// look at every list (the size, a listing).
    #[inline(always)]
    fn trace(&self, write: bool, name: Option<(&[u8], u64)>) {
        if scalevfs_sync::trace::ENABLED {
            match name {
                Some((n, c)) => {
                    let i = if self.spread() { name_shard(n) } else { 0 };
                    note_list(write, self.by_name.get(i), "memfs dir by_name skiplist");
                    if write {
                        let l = self.by_cookie.get(cookie_shard(c));
                        note_list(write, l, "memfs dir by_cookie skiplist");
                    }
                }
                None => {
                    for l in self.by_name.made() {
                        note_list(write, Some(l), "memfs dir by_name skiplist");
                    }
                    for l in self.by_cookie.made() {
                        note_list(write, Some(l), "memfs dir by_cookie skiplist");
                    }
                }
            }
        }
    }

    /// Whether new names spread by hash (`names`).
    fn spread(&self) -> bool {
        self.names.spread()
    }

    /// The `by_name` list a new name goes to, noting this thread as an
    /// inserter (see `names`).
    fn insert_list(&self, name: &[u8]) -> usize {
        self.names.insert_list(name_shard(name))
    }

    /// The `by_name` list that holds `name`, if one does.
    fn locate(&self, name: &[u8]) -> Option<usize> {
        let has = |i: usize| self.by_name.get(i).is_some_and(|l| l.contains_key(name));
        if self.spread() {
            let h = name_shard(name);
            if has(h) {
                return Some(h);
            }
        }
        has(0).then_some(0)
    }

    /// Take the entry `name` out of the list that holds it (one search
    /// where it is: its hash's list once spread, else list 0).
    fn remove_name(
        &self,
        name: &[u8],
    ) -> Option<crossbeam_skiplist::map::Entry<'_, NameBuf, DirSlot>> {
        if self.spread() {
            let h = name_shard(name);
            if let Some(e) = self.by_name.get(h).and_then(|l| l.remove(name)) {
                return Some(e);
            }
            if h == 0 {
                return None;
            }
        }
        self.by_name.get(0)?.remove(name)
    }

    /// The entry `name`.
    fn entry(&self, name: &[u8]) -> Option<crossbeam_skiplist::map::Entry<'_, NameBuf, DirSlot>> {
        if self.spread() {
            let h = name_shard(name);
            if let Some(e) = self.by_name.get(h).and_then(|l| l.get(name)) {
                return Some(e);
            }
            if h == 0 {
                return None;
            }
        }
        self.by_name.get(0)?.get(name)
    }
}

/// A regular file's data (see `pages.rs`).
pub(crate) type MemFile = crate::pages::FileData;

/// The in-memory filesystem.
pub struct MemFs {
    dev: u64,
    opts: MemFsOptions,
    root: Arc<Inode>,
    next_ino: InoAllocator,
    /// Directory cookies (listing positions), for every directory of this
    /// filesystem: unique filesystem-wide, hence in each directory, and
    /// taken from per-thread batches, so creates in one directory do not
    /// all write one counter (issue 16; it was one per directory).
    next_cookie: InoAllocator,
    stats: Arc<MemStats>,
    /// Every inode's generation (see `new`).
    generation: u32,
}

/// The next memfs instance's generation number.
static NEXT_GENERATION: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

impl std::fmt::Debug for MemFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemFs").field("dev", &self.dev).finish()
    }
}

fn node(inode: &Inode) -> &MemNode {
    inode.private::<MemNode>().expect("memfs inode")
}

fn dir(inode: &Inode) -> VfsResult<&MemDir> {
    match &node(inode).kind {
        MemKind::Dir(d) => Ok(d),
        _ => Err(Errno::ENOTDIR),
    }
}

fn file(inode: &Inode) -> VfsResult<&MemFile> {
    match &node(inode).kind {
        MemKind::File(f) => Ok(f),
        MemKind::Dir(_) => Err(Errno::EISDIR),
        _ => Err(Errno::EINVAL),
    }
}

impl MemFs {
    /// A new, empty memfs with device number `dev`.
    pub fn new(dev: u64, opts: MemFsOptions) -> MemFs {
        let stats = Arc::new(MemStats::default());
        let now = Timespec::now();
        let mut a = Attr {
            mode: S_IFDIR | 0o1777,
            nlink: 2,
            size: 2 * BOGO_DIRENT_SIZE,
            ..Attr::default()
        };
        a.set_atime(now);
        a.touch_mc(now);
        stats.live_inodes.inc();
        // memfs never reuses an inode number (a 64-bit allocator), so one
        // generation per filesystem instance makes (ino, generation) unique
        // and costs the create path no shared counter. Relaxed: uniqueness
        // comes from the RMW alone (a process-wide counter, std atomic: no
        // loom model involves it).
        let generation = NEXT_GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = Arc::new(
            Inode::new(
                1,
                dev,
                a,
                Box::new(MemNode {
                    kind: MemKind::Dir(Box::default()),
                    stats: stats.clone(),
                    xattrs: XattrStore::default(),
                }),
            )
            .with_generation(generation)
            .with_attr_fn(dir_attrs),
        );
        MemFs {
            dev,
            opts,
            root,
            generation,
            next_ino: InoAllocator::new(2),
            next_cookie: InoAllocator::new(FIRST_COOKIE),
            stats,
        }
    }

    /// Units of `nr_inodes` in use: inodes alive (named or open), the
    /// root included, plus one per name of a file past its first (hard
    /// links take units, as tmpfs's `shmem_link`), plus the whole KiBs
    /// extended attributes take (as tmpfs's `free_ispace`).
    pub fn live_inodes(&self) -> i64 {
        self.stats.live_inodes.sum()
    }

    fn quota(&self) -> crate::pages::Quota<'_> {
        crate::pages::Quota {
            used: &self.stats.used_pages,
            max_pages: self.opts.max_bytes / PAGE as u64,
        }
    }

    /// The extended attributes' space: tmpfs's `free_ispace`, shared with
    /// the inodes (`XattrBudget`).
    fn xattr_budget(&self) -> XattrBudget<'_> {
        self.stats.xattr_budget(self.opts.max_inodes)
    }

    fn new_inode(&self, attr: Attr, kind: MemKind) -> VfsResult<Arc<Inode>> {
        // Never past the limit; a unit this thread reserved, so no shared
        // line in the common case (see `percpu.rs`).
        if !self.stats.live_inodes.try_inc(self.opts.max_inodes) {
            return Err(Errno::ENOSPC);
        }
        let ino = self.next_ino.next();
        let is_dir = matches!(kind, MemKind::Dir(_));
        let inode = Inode::new(
            ino,
            self.dev,
            attr,
            Box::new(MemNode {
                kind,
                stats: self.stats.clone(),
                xattrs: XattrStore::default(),
            }),
        )
        .with_generation(self.generation);
        Ok(Arc::new(if is_dir {
            inode.with_attr_fn(dir_attrs)
        } else {
            inode
        }))
    }

    /// Add the entry `name` (the directory's size follows from its entry
    /// count: `dir_attrs`).
    fn insert_entry(&self, d: &MemDir, name: &[u8], inode: Arc<Inode>) -> u64 {
        // Unique (filesystem-wide, so in this directory too) and never
        // below FIRST_COOKIE; not increasing in the order of creation
        // across threads, which a listing does not need, but at or past the
        // end of every listing of this directory that started before
        // (`readdir_end`). Relaxed: a listing start that happened before
        // this insert is read (coherence); a concurrent one may be missed,
        // as an entry created during a listing may or may not be listed.
        let min = d.listed_batch.load(Ordering::Relaxed);
        let cookie = self.next_cookie.next_from_batch(min);
        let (ln, lc) = (
            d.by_name.make(d.insert_list(name)),
            d.by_cookie.make(cookie_shard(cookie)),
        );
        d.trace(true, Some((name, cookie)));
        lc.insert(cookie, NameBuf::from_slice(name));
        ln.insert(
            NameBuf::from_slice(name),
            DirSlot {
                cookie,
                inode: InodeCell::new(inode),
            },
        );
        cookie
    }

    /// Rename `old` to `new` in one directory keeping its readdir cookie
    /// (`new` is free): a listing that renames what it reads (generic/736)
    /// must not see the entry again at the end. The new name is in place
    /// before the cookie points at it, and the old one goes last, so a
    /// concurrent readdir at that cookie finds one of the two names.
    fn rename_in_place(&self, d: &MemDir, old: &[u8], new: &[u8], inode: Arc<Inode>) -> bool {
        let Some(cookie) = d.entry(old).map(|e| e.value().cookie) else {
            return false;
        };
        let Some(at) = d.locate(old) else {
            return false;
        };
        d.trace(true, Some((old, cookie)));
        d.trace(true, Some((new, cookie)));
        d.by_name.make(d.insert_list(new)).insert(
            NameBuf::from_slice(new),
            DirSlot {
                cookie,
                inode: InodeCell::new(inode),
            },
        );
        d.by_cookie
            .make(cookie_shard(cookie))
            .insert(cookie, NameBuf::from_slice(new));
        d.by_name.make(at).remove(old);
        true
    }

    /// Point the existing entry `name` at `inode`, keeping its cookie
    /// (RENAME_EXCHANGE: the names stay, the inodes swap).
    fn set_inode(&self, d: &MemDir, name: &[u8], inode: Arc<Inode>) -> Option<u64> {
        let cookie = d.entry(name).map(|e| e.value().cookie)?;
        // In the list that holds it: a second copy elsewhere would outlive
        // the name's removal.
        let at = d.locate(name)?;
        d.trace(true, Some((name, cookie)));
        d.by_name.make(at).insert(
            NameBuf::from_slice(name),
            DirSlot {
                cookie,
                inode: InodeCell::new(inode),
            },
        );
        Some(cookie)
    }

    /// Remove the entry `name` (see `insert_entry`) and return its cookie;
    /// None if absent. Its count on the inode leaves with this thread
    /// (`InodeCell::detach`).
    /// `last`: the name is the inode's last (an unlink or a replacing
    /// rename is taking it): its count may then be the one holding the
    /// file's data.
    fn remove_entry(&self, d: &MemDir, name: &[u8], last: bool) -> Option<u64> {
        let e = d.remove_name(name)?;
        let slot = e.value();
        d.trace(true, Some((name, slot.cookie)));
        if let Some(l) = d.by_cookie.get(cookie_shard(slot.cookie)) {
            l.remove(&slot.cookie);
        }
        slot.inode.detach(last);
        Some(slot.cookie)
    }
}

/// A directory's size and link count (`Inode::with_attr_fn`, issue 16).
///
/// The size, as tmpfs counts it (`BOGO_DIRENT_SIZE` for each entry, `.` and
/// `..` included), from its entry count: the skip list's length, which
/// every insert and remove writes anyway (its hot line), so the create path
/// does not also write the size into the directory's attribute record.
/// Exact when no name operation runs in the directory; during a rename
/// within it the old and the new name are both counted for a moment.
///
/// The link count, 2 plus the subdirectories (`MemDir::subdirs`), unless
/// the stored one is 0 (the directory was removed): mkdir and rmdir change
/// one counter instead of writing the record (lock, sequence count and
/// every word of it, each a line that the walks through the directory
/// read). A stat racing a mkdir may pair the new link count with the old
/// times, as it may pair the new size with them.
fn dir_attrs(i: &Inode, a: &mut Attr) {
    match i.private::<MemNode>().map(|n| &n.kind) {
        Some(MemKind::Dir(d)) => {
            d.trace(false, None);
            a.size = BOGO_DIRENT_SIZE * (2 + d.by_name.len() as u64);
            if a.nlink != 0 {
                // Relaxed: a count, like the skip list's length.
                a.nlink = 2u32.saturating_add(d.subdirs());
            }
        }
        _ => a.size = 0,
    }
}

impl MemDir {
    /// The subdirectories (the sum of the cookie shards' counts).
    fn subdirs(&self) -> u32 {
        self.by_cookie.count_sum()
    }
    /// One subdirectory more, at the entry with `cookie` (mkdir, a
    /// directory renamed or exchanged into this one).
    fn subdir_added(&self, cookie: u64) {
        let c = &self.by_cookie.make_shard(cookie_shard(cookie)).count;
        // Relaxed: a count; the entry itself is published by the skip list.
        c.fetch_add(1, Ordering::Relaxed);
    }
    /// One subdirectory fewer, at the entry with `cookie`; never below 0.
    fn subdir_removed(&self, cookie: u64) {
        let c = &self.by_cookie.make_shard(cookie_shard(cookie)).count;
        // Relaxed: as `subdir_added`.
        let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

fn new_attr(mode: u32, owner: (u32, u32), nlink: u32, rdev: u64) -> Attr {
    let now = Timespec::now();
    let mut a = Attr {
        mode,
        uid: owner.0,
        gid: owner.1,
        nlink,
        rdev,
        ..Attr::default()
    };
    a.set_atime(now);
    a.touch_mc(now);
    a
}

impl Filesystem for MemFs {
    fn name(&self) -> &'static str {
        "memfs"
    }

    fn root(&self) -> Arc<Inode> {
        self.root.clone()
    }

    fn dcache_authoritative(&self) -> bool {
        self.opts.authoritative
    }

    fn lookup(&self, d: &Arc<Inode>, name: &[u8]) -> VfsResult<Option<Arc<Inode>>> {
        let md = dir(d)?;
        md.trace(false, Some((name, 0)));
        Ok(md.entry(name).and_then(|e| e.value().inode.get()))
    }

    fn create(
        &self,
        d: &Arc<Inode>,
        name: &[u8],
        new: NewNode<'_>,
        owner: (u32, u32),
    ) -> VfsResult<Arc<Inode>> {
        let md = dir(d)?;
        let is_dir = matches!(new, NewNode::Dir { .. });
        let inode = match new {
            NewNode::Dir { mode } => {
                let mut a = new_attr(S_IFDIR | (mode & 0o7777), owner, 2, 0);
                a.size = 2 * BOGO_DIRENT_SIZE;
                self.new_inode(a, MemKind::Dir(Box::new(MemDir::in_dir(d))))?
            }
            NewNode::Symlink { target } => {
                let mut a = new_attr(S_IFLNK | 0o777, owner, 1, 0);
                a.size = target.len() as u64;
                // A long target takes a page of the filesystem's space, as
                // tmpfs's (given back when the inode goes: MemNode's drop).
                let paged = symlink_takes_page(target);
                if paged {
                    if !self.quota().take(1) {
                        return Err(Errno::ENOSPC);
                    }
                    a.blocks = PAGE as u64 / 512;
                }
                match self.new_inode(a, MemKind::Symlink(target.to_vec().into_boxed_slice())) {
                    Ok(i) => i,
                    Err(e) => {
                        if paged {
                            self.quota().give(1);
                        }
                        return Err(e);
                    }
                }
            }
            NewNode::Node { mode, rdev } => {
                let kind = match FileType::from_mode(mode) {
                    Some(FileType::Regular) => MemKind::File(MemFile::default()),
                    Some(FileType::Directory) | Some(FileType::Symlink) | None => {
                        return Err(Errno::EINVAL)
                    }
                    Some(_) => MemKind::Special,
                };
                self.new_inode(new_attr(mode, owner, 1, rdev), kind)?
            }
        };
        let cookie = self.insert_entry(md, name, inode.clone());
        let now = Timespec::now();
        // The parent's size and link count follow from its entries and
        // subdirectories (`dir_attrs`); its times are written once per
        // clock tick.
        if is_dir {
            md.subdir_added(cookie);
        }
        d.touch_mc_unless_current(now);
        Ok(inode)
    }

    fn create_tmpfile(
        &self,
        _d: &Arc<Inode>,
        mode: u32,
        owner: (u32, u32),
    ) -> VfsResult<Arc<Inode>> {
        let a = new_attr(crate::types::S_IFREG | (mode & 0o7777), owner, 0, 0);
        self.new_inode(a, MemKind::File(MemFile::default()))
    }

    fn link(&self, d: &Arc<Inode>, name: &[u8], inode: &Arc<Inode>) -> VfsResult<()> {
        let md = dir(d)?;
        // Every name past an inode's first takes a unit of `nr_inodes`, as
        // tmpfs's shmem_link reserves one (the first name of an O_TMPFILE
        // inode does not): hard links were free, and each one a directory
        // entry and a dentry in memory, without bound.
        if !self.stats.live_inodes.try_inc(self.opts.max_inodes) {
            return Err(Errno::ENOSPC);
        }
        self.insert_entry(md, name, inode.clone());
        let now = Timespec::now();
        let first = inode.update_attr(|a| {
            a.nlink += 1;
            a.set_ctime(now);
            a.nlink == 1
        });
        if first {
            self.stats.live_inodes.dec();
        }
        d.touch_mc_unless_current(now);
        Ok(())
    }

    fn unlink(&self, d: &Arc<Inode>, name: &[u8], inode: &Arc<Inode>) -> VfsResult<()> {
        let md = dir(d)?;
        let last = inode.attr().nlink <= 1;
        self.remove_entry(md, name, last).ok_or(Errno::ENOENT)?;
        let now = Timespec::now();
        let more = inode.update_attr(|a| {
            a.nlink = a.nlink.saturating_sub(1);
            a.set_ctime(now);
            a.nlink > 0
        });
        // Not the last name: the unit its link took (the last one goes
        // with the inode).
        if more {
            self.stats.live_inodes.dec();
        }
        d.touch_mc_unless_current(now);
        Ok(())
    }

    fn rmdir(&self, d: &Arc<Inode>, name: &[u8], inode: &Arc<Inode>) -> VfsResult<()> {
        let md = dir(d)?;
        if !dir(inode)?.by_name.is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        let cookie = self.remove_entry(md, name, true).ok_or(Errno::ENOENT)?;
        let now = Timespec::now();
        inode.update_attr(|a| {
            a.nlink = 0;
            a.set_ctime(now);
        });
        md.subdir_removed(cookie);
        d.touch_mc_unless_current(now);
        Ok(())
    }

    fn rename(
        &self,
        old_dir: &Arc<Inode>,
        old_name: &[u8],
        new_dir: &Arc<Inode>,
        new_name: &[u8],
        moved: &Arc<Inode>,
        replaced: Option<&Arc<Inode>>,
        exchange: bool,
    ) -> VfsResult<()> {
        let od = dir(old_dir)?;
        let nd = dir(new_dir)?;
        let now = Timespec::now();
        let cross = !Arc::ptr_eq(old_dir, new_dir);
        if exchange {
            let other = replaced.ok_or(Errno::EINVAL)?;
            // Both names stay where they are in their listings.
            let (Some(cn), Some(co)) = (
                self.set_inode(nd, new_name, moved.clone()),
                self.set_inode(od, old_name, other.clone()),
            ) else {
                return Err(Errno::ENOENT);
            };
            if cross {
                for (i, to) in [(moved, new_dir), (other, old_dir)] {
                    if let MemKind::Dir(md) = &node(i).kind {
                        md.set_parent(to);
                    }
                }
            }
            if moved.is_dir() != other.is_dir() {
                // The entry that now holds the directory gains it; the
                // other one held it before (in one directory too: the two
                // entries' cookies may be in different shards).
                let (gain, lose) = if moved.is_dir() {
                    ((nd, cn), (od, co))
                } else {
                    ((od, co), (nd, cn))
                };
                gain.0.subdir_added(gain.1);
                lose.0.subdir_removed(lose.1);
            }
            other.update_attr(|a| a.set_ctime(now));
        } else {
            if let Some(r) = replaced {
                if r.is_dir() && !dir(r)?.by_name.is_empty() {
                    return Err(Errno::ENOTEMPTY);
                }
                let last = r.is_dir() || r.attr().nlink <= 1;
                let gone = self.remove_entry(nd, new_name, last);
                let more = r.update_attr(|a| {
                    a.nlink = if r.is_dir() {
                        0
                    } else {
                        a.nlink.saturating_sub(1)
                    };
                    a.set_ctime(now);
                    a.nlink > 0
                });
                // As in `unlink`: a name that was not the last one.
                if more {
                    self.stats.live_inodes.dec();
                }
                if let (true, Some(c)) = (r.is_dir(), gone) {
                    nd.subdir_removed(c);
                }
            }
            if cross {
                let old = self.remove_entry(od, old_name, false);
                let new = self.insert_entry(nd, new_name, moved.clone());
                if moved.is_dir() {
                    if let Ok(md) = dir(moved) {
                        md.set_parent(new_dir);
                    }
                    if let Some(c) = old {
                        od.subdir_removed(c);
                    }
                    nd.subdir_added(new);
                }
            } else if !self.rename_in_place(od, old_name, new_name, moved.clone()) {
                return Err(Errno::ENOENT);
            }
        }
        moved.update_attr(|a| a.set_ctime(now));
        old_dir.touch_mc_unless_current(now);
        if cross {
            new_dir.touch_mc_unless_current(now);
        }
        Ok(())
    }

    fn get_parent(&self, d: &Arc<Inode>) -> VfsResult<Arc<Inode>> {
        let md = dir(d)?;
        if Arc::ptr_eq(d, &self.root) {
            return Ok(self.root.clone());
        }
        md.parent().ok_or(Errno::ESTALE)
    }

    fn getxattr(&self, inode: &Arc<Inode>, name: &[u8]) -> VfsResult<Vec<u8>> {
        node(inode).xattrs.get(name)
    }

    fn listxattr(&self, inode: &Arc<Inode>) -> VfsResult<Vec<Vec<u8>>> {
        Ok(node(inode).xattrs.names())
    }

    fn setxattr(&self, inode: &Arc<Inode>, name: &[u8], value: &[u8], flags: u32) -> VfsResult<()> {
        let b = self.xattr_budget();
        node(inode)
            .xattrs
            .change(name, Some(value), flags, charged(name, &b))
    }

    fn removexattr(&self, inode: &Arc<Inode>, name: &[u8]) -> VfsResult<()> {
        let b = self.xattr_budget();
        node(inode).xattrs.change(name, None, 0, charged(name, &b))
    }

    fn readlink(&self, inode: &Arc<Inode>) -> VfsResult<Vec<u8>> {
        match &node(inode).kind {
            MemKind::Symlink(t) => Ok(t.to_vec()),
            _ => Err(Errno::EINVAL),
        }
    }

    fn get_link_cached<'i>(&self, inode: &'i Inode) -> Option<&'i [u8]> {
        // Immutable after creation, lives as long as the inode: fits the
        // lock-free callback contract.
        match &inode.private::<MemNode>()?.kind {
            MemKind::Symlink(t) => Some(t),
            _ => None,
        }
    }

    fn readdir(
        &self,
        d: &Arc<Inode>,
        cookie: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> VfsResult<()> {
        let md = dir(d)?;
        md.trace(false, None);
        // One pin for the listing: each entry's `InodeCell::with` then pins
        // nested (a count, not a fence of its own per entry).
        let _g = epoch::pin();
        // The cookie lists merged in cookie order: each one's next entry,
        // the smallest taken first.
        let from = cookie.max(FIRST_COOKIE);
        let mut lists: Vec<_> = md
            .by_cookie
            .made()
            .map(|l| l.range(from..).peekable())
            .collect();
        let next = |lists: &mut Vec<_>| {
            let i = (0..lists.len())
                .filter_map(|i| {
                    let l: &mut std::iter::Peekable<_> = &mut lists[i];
                    l.peek()
                        .map(|e: &crossbeam_skiplist::map::Entry<'_, u64, NameBuf>| (*e.key(), i))
                })
                .min()?
                .1;
            lists[i].next()
        };
        while let Some(e) = next(&mut lists) {
            let c = *e.key();
            let Some(slot) = md.entry(&e.value()[..]) else {
                continue;
            };
            // The name may have been removed and re-created with a new cookie
            // since: report it under its current cookie only.
            if slot.value().cookie != c {
                continue;
            }
            // Removed meanwhile: as if listed after.
            let Some((ino, file_type)) = slot.value().inode.with(|i| (i.ino(), i.file_type()))
            else {
                continue;
            };
            let ent = DirEntry {
                ino,
                next_cookie: c + 1,
                file_type,
                name: e.value().to_vec(),
            };
            if !emit(ent) {
                break;
            }
        }
        Ok(())
    }

    fn readdir_needs_dir_lock(&self) -> bool {
        // The listing is a lock-free skip-list range read (above).
        false
    }

    fn readdir_end(&self, d: &Arc<Inode>) -> Option<u64> {
        // Every cookie handed out before this call is below the bound (so
        // every entry present is listed), and every insert into this
        // directory that follows it takes a cookie at or past it (the
        // batch recorded here; see `insert_entry`). Stored only when it
        // moves, so repeated listings write nothing in the steady state.
        // Relaxed: see `insert_entry` and `InoAllocator::bound_batch`;
        // the update keeps the highest of racing listing starts.
        let md = dir(d).ok()?;
        let k = self.next_cookie.bound_batch();
        if md.listed_batch.load(Ordering::Relaxed) < k {
            let _ = md
                .listed_batch
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    (v < k).then_some(k)
                });
        }
        Some((k * crate::percpu::INO_BATCH).max(FIRST_COOKIE))
    }

    fn statfs(&self) -> StatFs {
        // Relaxed: statistics.
        let used = self.stats.used_pages.load(Ordering::Relaxed).max(0) as u64;
        let files = self.stats.live_inodes.sum().max(0) as u64;
        let blocks = self.opts.max_bytes / PAGE as u64;
        StatFs {
            fs_type: 0x0102_1994, // TMPFS_MAGIC
            bsize: PAGE as u64,
            blocks,
            bfree: blocks.saturating_sub(used),
            bavail: blocks.saturating_sub(used),
            files: self.opts.max_inodes,
            ffree: self.opts.max_inodes.saturating_sub(files),
            namelen: 255,
            frsize: PAGE as u64,
            flags: 0,
        }
    }

    fn max_file_size(&self) -> u64 {
        self.opts.max_file_size
    }

    fn read(&self, inode: &Arc<Inode>, off: u64, buf: &mut [u8]) -> VfsResult<usize> {
        Ok(file(inode)?.read(inode, off, buf))
    }

    fn write(&self, inode: &Arc<Inode>, off: u64, buf: &[u8]) -> VfsResult<usize> {
        let f = file(inode)?;
        let end = off.checked_add(buf.len() as u64).ok_or(Errno::EFBIG)?;
        if end > self.opts.max_file_size {
            return Err(Errno::EFBIG);
        }
        f.write(inode, &self.quota(), off, buf)
    }

    fn write_shared(&self, inode: &Arc<Inode>, off: u64, buf: &[u8]) -> Option<VfsResult<usize>> {
        // Below the size (checked there), so within the size limit.
        file(inode).ok()?.overwrite_in_page(inode, off, buf)
    }

    fn truncate(&self, inode: &Arc<Inode>, size: u64) -> VfsResult<()> {
        let f = file(inode)?;
        if size > self.opts.max_file_size {
            return Err(Errno::EFBIG);
        }
        f.truncate(inode, &self.quota(), size)
    }

    fn fallocate(&self, inode: &Arc<Inode>, punch: bool, off: u64, len: u64) -> VfsResult<()> {
        let f = file(inode)?;
        if !matches!(off.checked_add(len), Some(e) if e <= self.opts.max_file_size) {
            return Err(Errno::EFBIG);
        }
        f.fallocate(inode, &self.quota(), punch, off, len)
    }

    fn fallocate_range(
        &self,
        inode: &Arc<Inode>,
        op: crate::fstype::RangeOp,
        off: u64,
        len: u64,
    ) -> VfsResult<()> {
        use crate::fstype::RangeOp;
        let f = file(inode)?;
        let max = self.opts.max_file_size;
        match op {
            RangeOp::Zero => {
                if !matches!(off.checked_add(len), Some(e) if e <= max) {
                    return Err(Errno::EFBIG);
                }
                f.zero_range(inode, &self.quota(), off, len)
            }
            RangeOp::Collapse => f.collapse_range(inode, &self.quota(), off, len),
            RangeOp::Insert => f.insert_range(inode, off, len, max),
        }
    }

    fn seek_data_hole(&self, inode: &Arc<Inode>, off: u64, data: bool) -> VfsResult<u64> {
        file(inode)?.seek_data_hole(inode, off, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkdir(fs: &MemFs, d: &Arc<Inode>, name: &[u8]) -> Arc<Inode> {
        fs.create(d, name, NewNode::Dir { mode: 0o755 }, (0, 0))
            .unwrap()
    }

    /// `get_parent` follows mkdir, moves to another parent and exchanges;
    /// the replaced boxes are freed after a grace period and the last one
    /// with the directory (Miri checks the epoch handling).
    #[test]
    fn directories_know_their_parent() {
        let fs = MemFs::new(1, MemFsOptions::default());
        let root = fs.root();
        let a = mkdir(&fs, &root, b"a");
        let b = mkdir(&fs, &root, b"b");
        let c = mkdir(&fs, &a, b"c");
        let parent = |i: &Arc<Inode>| fs.get_parent(i).unwrap().ino();
        assert_eq!(parent(&root), root.ino());
        assert_eq!(parent(&a), root.ino());
        assert_eq!(parent(&c), a.ino());
        fs.rename(&a, b"c", &b, b"c", &c, None, false).unwrap();
        assert_eq!(parent(&c), b.ino());
        // Renamed in place: the same parent.
        fs.rename(&b, b"c", &b, b"c2", &c, None, false).unwrap();
        assert_eq!(parent(&c), b.ino());
        // Exchanged with a directory elsewhere: both follow.
        let d = mkdir(&fs, &a, b"d");
        fs.rename(&b, b"c2", &a, b"d", &c, Some(&d), true).unwrap();
        assert_eq!(parent(&c), a.ino());
        assert_eq!(parent(&d), b.ino());
        let f = fs
            .create(
                &a,
                b"f",
                NewNode::Node {
                    mode: crate::types::S_IFREG | 0o644,
                    rdev: 0,
                },
                (0, 0),
            )
            .unwrap();
        assert_eq!(fs.get_parent(&f).unwrap_err(), Errno::ENOTDIR);
        drop((c, d, f));
        crossbeam_epoch::pin().flush();
    }
}
