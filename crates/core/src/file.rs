//! Open file descriptions and fd tables.
//!
//! LOCKING RULES
//! - `FdTable::lock` (spinlock) serialises every change of the table (open,
//!   close, dup, growth). Lookups take no lock: they load the slot under an
//!   epoch guard and use the `File` without touching its reference count.
//!   A closed file's `Arc` is dropped only after a grace period, so a
//!   concurrent lookup that still sees it stays safe.
//! - `File::pos` is an atomic. `lseek` stores it (SEEK_CUR: an atomic
//!   update); `read` publishes its new position with a compare-exchange and
//!   retries if an lseek moved it meanwhile, so reads on a shared
//!   description never return the same bytes twice. `File::pos_lock` (mutex,
//!   Linux's `f_pos_lock`) serialises the position-using `read`s and
//!   `write`s of a regular file's description (a read and a write starting
//!   at one position would otherwise both move it, and the next write go
//!   over the first one's tail); it nests outside the inode's data lock. A write that races
//!   with an lseek keeps the lseek's position (as if the lseek came after),
//!   so a SEEK_CUR racing with a write behaves like a SEEK_SET, which is also
//!   what Linux's generic_file_llseek documents. `getdents` holds `pos_lock`
//!   for its whole listing step (outside the directory's `dir_lock`, where
//!   the filesystem needs that), and an lseek of a directory takes it.
//! - Open reserves its fd first (`FdTable::reserve`, under the table lock):
//!   a reserved fd is skipped by allocation and is EBUSY for dup2 until
//!   `install_reserved` fills it or `unreserve` gives it back.
//! - Each fd slot holding a file keeps the file's mount busy for umount
//!   (`Mount::hold` at install, `release` when the slot is emptied).
//!
//! Lifetime: a `File` is an `Arc`; each fd slot holding it owns one strong
//! count (released through the epoch on close); `dup` adds one. Calls on an
//! fd borrow the `File` under an epoch guard and take no count. The last
//! drop of a `File` is the "last close" of DESIGN 2.4 (see `orphan.rs`).

use crossbeam_utils::CachePadded;
use scalevfs_sync::ordered::{Class, Mutex, SpinGuard, SpinLock};
use scalevfs_sync::LockClass;
use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned, Shared};
use scalevfs_sync::primitive::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::errno::{Errno, VfsResult};
use crate::inode::Inode;
use crate::mount::PathRef;
use crate::types::FMODE_EXEC;
use crate::types::{
    O_ACCMODE, O_APPEND, O_CLOEXEC, O_CREAT, O_DIRECT, O_DIRECTORY, O_EXCL, O_LARGEFILE, O_NOATIME,
    O_NOCTTY, O_NOFOLLOW, O_NONBLOCK, O_PATH, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY,
};

/// Default per-task limit on open files (RLIMIT_NOFILE's usual soft value).
pub const DEFAULT_MAX_FDS: usize = 1024;

/// The most open files a table may be allowed by default (Linux's
/// `fs.nr_open` default; config key `nr-open`): `FdTable::set_max` refuses
/// more with EPERM, as setrlimit does.
pub const NR_OPEN: usize = 1 << 20;
/// The range Linux's `fs.nr_open` sysctl accepts (64-bit): BITS_PER_LONG to
/// `sysctl_nr_open_max`.
pub const NR_OPEN_MIN: usize = 64;
pub const NR_OPEN_MAX: usize = (i32::MAX as usize) & !63;

/// An open file description.
#[derive(Debug)]
pub struct File {
    pub(crate) path: PathRef,
    pub(crate) inode: Arc<Inode>,
    /// Open flags: access mode and status flags (O_APPEND, O_NONBLOCK, ...).
    flags: AtomicU32,
    /// The file position.
    pub(crate) pos: AtomicU64,
    /// A regular file opened for writing: counted in its mount's writers
    /// (read-only remount is EBUSY meanwhile) and in its inode's write
    /// access from `new` until its last fd slot closes (not until the
    /// deferred drop: Linux's close releases them before returning), or
    /// until the drop if it was never installed.
    writer: bool,
    /// Opened to execute (`FMODE_EXEC`): holds the inode's writers off for
    /// the same span.
    exec: bool,
    /// The fd-table slots holding this file (the low bits) and, in
    /// [`HELD`], whether `writer`'s or `exec`'s counts are held now: one
    /// word, so an install that finds the counts held and the close of the
    /// last other slot agree on who has them (as two words, a close could
    /// give them back after a racing dup had seen them held and taken
    /// none, leaving an fd open for writing with no writer counted).
    slots: AtomicUsize,
    /// BSD file lock state (`flock.rs`): `flock::USED` once the
    /// description has asked for a lock (its last close then releases it),
    /// and `flock::SH` or `flock::EX` while it holds one (changed under the
    /// inode's shard lock of the flock table). 0 for a file never locked:
    /// its close reads this word and nothing else of the feature.
    pub(crate) flock: AtomicU32,
    /// Serialises position-using writes (see LOCKING RULES).
    pub(crate) pos_lock: Mutex<()>,
    /// A directory listing's end (`Filesystem::readdir_end`), taken when a
    /// listing starts at position 0; u64::MAX: none. Under `pos_lock`.
    pub(crate) dir_end: AtomicU64,
    /// The opener's credentials (`Cred::fingerprint`), Linux's `f_cred`
    /// as far as `linkat(fd, "", AT_EMPTY_PATH)` asks: its caller needs
    /// no CAP_DAC_READ_SEARCH for a file it opened itself.
    pub(crate) opener: u64,
    /// No bytes: gives the description the alignment of a cache-line pair
    /// (crossbeam's `CachePadded`), so its `Arc` box starts on a line of
    /// its own and two descriptions never share one: a thread moving its
    /// file's position (`pos`, `pos_lock`) writes no line another thread's
    /// description lives on.
    _line: [CachePadded<()>; 0],
}

// The box is a whole number of line pairs, as the field above asks.
const _: () = assert!(std::mem::align_of::<File>() >= 64);

/// The kernel's O_LARGEFILE bit, which 64-bit Linux sets on every open file
/// and reports in F_GETFL (libc's `O_LARGEFILE` is 0 on 64-bit glibc).
#[cfg(target_arch = "x86_64")]
pub const O_LARGEFILE_KERNEL: u32 = 0o100000;
#[cfg(target_arch = "aarch64")]
pub const O_LARGEFILE_KERNEL: u32 = 0o400000;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub const O_LARGEFILE_KERNEL: u32 = 0;

/// Status flags `fcntl(F_SETFL)` may change.
pub const SETFL_MASK: u32 = O_APPEND | O_NONBLOCK | O_DIRECT | O_NOATIME;

impl File {
    /// A new open file description; `flags` as given to open (the ones that
    /// only matter at open time are dropped, as Linux's `f_flags`).
    /// A new open file description; `flags` as given to open (the ones that
    /// only matter at open time are dropped, as Linux's `f_flags`).
    /// A regular file opened for writing takes write access (ETXTBSY while
    /// it runs as a program); one opened with [`FMODE_EXEC`] holds writers
    /// off while it is open (Linux's `deny_write_access`).
    pub(crate) fn new(path: PathRef, flags: u32, opener: &crate::types::Cred) -> VfsResult<File> {
        let inode = path.inode().clone();
        let exec = flags & O_PATH == 0 && flags & FMODE_EXEC != 0;
        let flags = if flags & O_PATH != 0 {
            flags & (O_PATH | O_DIRECTORY | O_NOFOLLOW)
        } else {
            (flags
                & !(O_CLOEXEC | O_CREAT | O_EXCL | O_NOCTTY | O_TRUNC | O_LARGEFILE | FMODE_EXEC))
                | O_LARGEFILE_KERNEL
        };
        let writer = flags & O_PATH == 0
            && matches!(flags & O_ACCMODE, O_WRONLY | O_RDWR)
            && inode.file_type() == crate::types::FileType::Regular;
        if writer {
            inode.get_write_access()?;
        } else if exec {
            inode.deny_write_access()?;
        }
        crate::orphan::file_opened(&path.mnt.sb.orphans, &inode);
        if writer {
            path.mnt.add_writer();
        }
        Ok(File {
            path,
            inode,
            writer,
            exec,
            slots: AtomicUsize::new(if writer || exec { HELD } else { 0 }),
            flock: AtomicU32::new(0),
            flags: AtomicU32::new(flags),
            pos: AtomicU64::new(0),
            pos_lock: Mutex::new(Class::PosLock, ()),
            dir_end: AtomicU64::new(u64::MAX),
            opener: opener.fingerprint(),
            _line: [],
        })
    }
    pub fn inode(&self) -> &Arc<Inode> {
        &self.inode
    }
    pub fn path(&self) -> &PathRef {
        &self.path
    }
    pub fn flags(&self) -> u32 {
        // Relaxed: status flags are independent bits; no data is published through them.
        self.flags.load(Ordering::Relaxed)
    }
    /// `fcntl(F_SETFL)`: replace the changeable status flags.
    pub(crate) fn set_status_flags(&self, f: u32) {
        // Relaxed: as `flags`; concurrent F_SETFLs each apply atomically.
        let _ = self
            .flags
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some((old & !SETFL_MASK) | (f & SETFL_MASK))
            });
    }
    pub fn is_path_only(&self) -> bool {
        self.flags() & O_PATH != 0
    }
    pub fn can_read(&self) -> bool {
        let f = self.flags();
        f & O_PATH == 0 && matches!(f & O_ACCMODE, O_RDONLY | O_RDWR)
    }
    pub fn can_write(&self) -> bool {
        let f = self.flags();
        f & O_PATH == 0 && matches!(f & O_ACCMODE, O_WRONLY | O_RDWR)
    }
    /// Give back what `new` counted (once): the mount's writer and the
    /// inode's write access, or the exec's hold on writers.
    fn release_access(&self) {
        // SeqCst: with the mount's writer count (see `Vfs::remount_at`).
        if self.slots.fetch_and(!HELD, Ordering::SeqCst) & HELD != 0 {
            self.give_back_access();
        }
    }
    /// The counts `writer` or `exec` stand for, given back (their holder
    /// cleared `HELD`, or never set it).
    fn give_back_access(&self) {
        if self.writer {
            self.inode.put_write_access();
            self.path.mnt.drop_writer();
        } else if self.exec {
            self.inode.allow_write_access();
        }
    }
    /// Whether this is a counted writer on a mount that is read-only now:
    /// an open checks this after making the file (see `Vfs::remount_at`).
    pub(crate) fn writer_on_readonly(&self) -> bool {
        self.writer && self.path.mnt.is_readonly()
    }
    pub fn is_append(&self) -> bool {
        self.flags() & O_APPEND != 0
    }
    /// The view of this description the flock table works on.
    pub(crate) fn flock_desc(&self) -> crate::flock::Desc<'_> {
        crate::flock::Desc {
            word: &self.flock,
            slots: &self.slots,
            held_bit: HELD,
            key: Arc::as_ptr(&self.inode) as usize,
        }
    }
    /// Current position.
    pub fn position(&self) -> u64 {
        // Relaxed: a position is a value, not a publication of other data.
        self.pos.load(Ordering::Relaxed)
    }
}

impl Drop for File {
    /// The last close: lock-free unless the inode was unlinked or is being
    /// truncated (`orphan::file_closed`).
    fn drop(&mut self) {
        self.release_access();
        // A safety net: the close of the last fd slot released the flock
        // already, unless the description was never installed or a grant
        // raced with that close (both handled there; this costs a load).
        crate::flock::unlock(&self.flock_desc());
        crate::orphan::file_closed(&self.path.mnt.sb.orphans, &self.inode);
    }
}

struct Slot {
    /// Null (free), [`reserved`] (an open in progress owns it) or a file.
    file: Atomic<Arc<File>>,
    cloexec: AtomicBool,
}

/// Slots from the hint that an open tries without the table lock
/// (`FdTable::reserve_at_hint`).
const FAST_SCAN: usize = 4;

/// Fds per chunk. Chunks never move once made, so a slot can be claimed
/// with a compare-exchange and no lock (`install_any`, `close`).
const CHUNK: usize = 256;
/// Fds per home range of `install_any` (a thread's own run of slots).
const ANY_RANGE: usize = 64;

/// A slot's "reserved" mark: no file, tag 1 (an `Arc<File>` box is 8-byte
/// aligned, so the tag bit is free). Readers see no file (EBADF), the
/// lowest-fd search and `install_any` skip it, dup2 onto it is EBUSY.
fn reserved<'g>() -> Shared<'g, Arc<File>> {
    Shared::null().with_tag(1)
}

fn is_free(p: Shared<'_, Arc<File>>) -> bool {
    p.is_null() && p.tag() == 0
}

struct Chunk {
    /// Fd `ci * CHUNK + k` is `slots[slot_index(k)]`.
    slots: Box<[Slot]>,
}

/// Neighbouring fds that land on different cache lines (see `slot_index`).
const SPREAD: usize = 8;
const _: () = assert!(CHUNK / SPREAD * SPREAD == CHUNK && std::mem::size_of::<Slot>() == 16);

/// Where fd `k` of a chunk lives in it: consecutive fds `CHUNK / SPREAD`
/// slots (512 bytes) apart, so threads of one table that hold
/// neighbouring low fds (3 and 4, open and closed over and over) write
/// different lines (issue 16: the slot line was 0.9 shared writes per
/// open+close at 2 threads); the lowest-fd search still goes in fd order.
#[inline(always)]
fn slot_index(k: usize) -> usize {
    (k % SPREAD) * (CHUNK / SPREAD) + k / SPREAD
}

fn new_chunk() -> Chunk {
    Chunk {
        slots: (0..CHUNK)
            .map(|_| Slot {
                file: Atomic::null(),
                cloexec: Default::default(),
            })
            .collect(),
    }
}

/// The chunks of a table by index: a directory copied (under the table
/// lock) to grow; the chunks it points to are shared by every copy and
/// freed with the table.
struct Dir {
    chunks: Box<[Atomic<Chunk>]>,
}

fn new_dir(n: usize) -> Dir {
    Dir {
        chunks: (0..n).map(|_| Atomic::null()).collect(),
    }
}

/// A task's fd table. Aligned to a cache line: two processes' tables (each
/// written by its own opens) must never share one (the conflict matrix
/// caught two tables allocated side by side).
///
/// LOCKING RULES. Slots live in chunks of `CHUNK` that never move (the
/// directory of chunks is copied to grow, the chunks are not), so a slot
/// changes by compare-exchange:
/// - free -> reserved: the lowest-fd search (`reserve`, `install`): at the
///   hint without the lock when that slot is free (`reserve_at_hint`),
///   else under the table lock; `install_any` in its home range, without
///   it;
/// - reserved -> file or free: the reserving open (`install_reserved`,
///   `unreserve`), without the lock;
/// - file -> free: `close`, without the lock; free or file -> file: dup2
///   (`install_at`), under the lock, by compare-exchange from a value it
///   saw unreserved (a reservation may appear without the lock).
///
/// The table lock (a spinlock, as Linux's `file_lock`) serialises the
/// lowest-fd searches that go past the hint, dup2, growing the directory
/// and making chunks.
/// `next_hint`: every fd below it is in use (not free), so the lowest-fd
/// search starts there. A close below it lowers it (`fetch_min`); a
/// search that raises it re-checks the slots it passed afterwards, and a
/// close reads it after freeing its slot (both SeqCst): a Dekker pair, so
/// either the close sees the raised hint and lowers it, or the search sees
/// the freed slot and lowers the hint itself (loom model
/// `loom_models::fd_hint_vs_close`).
///
/// Layout: the directory pointer and the limit, which every fd lookup
/// reads, are on a line of their own; the lock and the hint, which every
/// open and close of a low fd writes, on another (`FdAlloc`), so that
/// threads sharing a table do not miss on each lookup after another
/// thread's open.
#[repr(align(64))]
pub struct FdTable {
    dir: Atomic<Dir>,
    max: AtomicUsize,
    /// The most `set_max` allows (fs.nr_open).
    nr_open: usize,
    alloc: CachePadded<FdAlloc>,
}

/// The written half of an `FdTable` (see its doc).
struct FdAlloc {
    lock: SpinLock<()>,
    /// Lowest fd that might be free (see `FdTable`).
    next_hint: AtomicU64,
}

impl std::fmt::Debug for FdTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdTable").finish_non_exhaustive()
    }
}

impl FdTable {
    pub fn new() -> FdTable {
        FdTable::with_nr_open(NR_OPEN)
    }

    /// A table whose limit may be raised up to `nr_open` (clamped to
    /// `NR_OPEN_MIN..=NR_OPEN_MAX`).
    pub fn with_nr_open(nr_open: usize) -> FdTable {
        let dir = new_dir(4);
        dir.chunks[0].store(Owned::new(new_chunk()), Ordering::Relaxed);
        FdTable {
            dir: Atomic::new(dir),
            max: AtomicUsize::new(DEFAULT_MAX_FDS),
            nr_open: nr_open.clamp(NR_OPEN_MIN, NR_OPEN_MAX),
            alloc: CachePadded::new(FdAlloc {
                lock: SpinLock::new(Class::FdTable, LockClass::FdTable, ()),
                next_hint: AtomicU64::new(0),
            }),
        }
    }

    /// Set the limit on open fds (RLIMIT_NOFILE). More than `nr_open()` is
    /// EPERM, as setrlimit refuses a limit above `fs.nr_open`. Nothing is
    /// allocated here: the table grows with the fds actually used.
    pub fn set_max(&self, n: usize) -> VfsResult<()> {
        if n > self.nr_open {
            return Err(Errno::EPERM);
        }
        // Relaxed: a limit read at each allocation, publishing nothing else.
        self.max.store(n, Ordering::Relaxed);
        Ok(())
    }
    /// The most `set_max` accepts (the Vfs's `nr-open`, default [`NR_OPEN`]).
    pub fn nr_open(&self) -> usize {
        self.nr_open
    }
    pub fn max(&self) -> usize {
        // Relaxed: see `set_max`; an allocation racing with a new limit may
        // use either.
        self.max.load(Ordering::Relaxed)
    }

    fn dir<'g>(&self, g: &'g Guard) -> &'g Dir {
        // Acquire: pairs with the Release publication of a grown directory.
        let p = self.dir.load(Ordering::Acquire, g);
        // SAFETY: never null while the table lives (set in new, replaced
        // only by a valid directory), freed after a grace period.
        unsafe { p.deref() }
    }

    /// The slot of `fd` if its chunk exists.
    fn slot(&self, fd: usize, g: &Guard) -> Option<&Slot> {
        let c = self.dir(g).chunks.get(fd / CHUNK)?;
        // Acquire: pairs with the Release publication of a new chunk.
        let p = c.load(Ordering::Acquire, g);
        // SAFETY: a chunk is freed only with the table (`Drop`), which
        // `&self` outlives; never moved.
        let chunk = unsafe { p.as_raw().as_ref() }?;
        Some(&chunk.slots[slot_index(fd % CHUNK)])
    }

    /// The slot of `fd`, making its chunk (and growing the directory) if
    /// needed. Table lock held (`_l`).
    fn slot_locked<'s>(&'s self, fd: usize, g: &Guard, _l: &SpinGuard<'_, ()>) -> &'s Slot {
        let ci = fd / CHUNK;
        let mut dir = self.dir(g);
        if ci >= dir.chunks.len() {
            let n = (ci + 1).next_power_of_two().max(dir.chunks.len() * 2);
            let new = new_dir(n);
            for (o, s) in dir.chunks.iter().zip(new.chunks.iter()) {
                // Relaxed: under the table lock; published by the Release
                // below. Chunk pointers are shared by both directories.
                s.store(o.load(Ordering::Relaxed, g), Ordering::Relaxed);
            }
            // Release: publish the copied pointers.
            let prev = self.dir.swap(Owned::new(new), Ordering::Release, g);
            // SAFETY: unreachable now; pinned readers are waited for. A
            // `Dir` does not own its chunks (plain `Atomic`s).
            unsafe { g.defer_destroy(prev) };
            dir = self.dir(g);
        }
        let c = &dir.chunks[ci];
        if c.load(Ordering::Relaxed, g).is_null() {
            // Release: the chunk's empty slots before its pointer.
            c.store(Owned::new(new_chunk()), Ordering::Release);
        }
        self.slot(fd, g).expect("chunk just made")
    }

    /// The file at `fd`, borrowed under `g`: no reference count is taken.
    #[inline]
    pub fn get<'g>(&self, fd: i32, g: &'g Guard) -> VfsResult<&'g Arc<File>> {
        let slot = usize::try_from(fd)
            .ok()
            .and_then(|i| self.slot(i, g))
            .ok_or(Errno::EBADF)?;
        // Acquire: the File's contents were published before its pointer.
        let p = slot.file.load(Ordering::Acquire, g);
        // SAFETY: a non-null slot pointer is a live Arc<File> box, freed only
        // after a grace period.
        unsafe { p.as_ref() }.ok_or(Errno::EBADF)
    }

    /// A counted handle on the file at `fd`.
    pub fn get_arc(&self, fd: i32) -> VfsResult<Arc<File>> {
        let g = epoch::pin();
        self.get(fd, &g).cloned()
    }

    /// Install `file` at the lowest free fd >= `min`.
    pub fn install(&self, file: Arc<File>, cloexec: bool, min: usize) -> VfsResult<i32> {
        let fd = self.reserve_from(min)?;
        self.install_reserved(fd, file, cloexec);
        Ok(fd)
    }

    /// Reserve the lowest free fd (>= 0) for an open in progress, so that a
    /// full table fails the open (EMFILE) before it creates anything, as
    /// Linux allocates the fd first. Fill it with `install_reserved` or give
    /// it back with `unreserve`.
    pub fn reserve(&self) -> VfsResult<i32> {
        self.reserve_from(0)
    }

    fn reserve_from(&self, min: usize) -> VfsResult<i32> {
        let g = epoch::pin();
        if let Some(fd) = self.reserve_at_hint(min, &g) {
            return Ok(fd);
        }
        let l = self.alloc.lock.lock();
        let max = self.max();
        // SeqCst: the hint's Dekker pair with `close` (see the type's doc).
        let hint = self.alloc.next_hint.load(Ordering::SeqCst) as usize;
        let start = hint.max(min);
        let mut fd = start;
        loop {
            if fd >= max {
                return Err(Errno::EMFILE);
            }
            if claim(self.slot_locked(fd, &g, &l), &g) {
                break;
            }
            fd += 1;
        }
        if start == hint {
            // The chunks up to `fd` exist (made above) for the re-check.
            self.raise_hint(hint, fd, &g);
        }
        Ok(fd as i32)
    }

    /// The common case without the lock: one of the `FAST_SCAN` slots from
    /// the hint is free (a close just lowered the hint to it, or the fds
    /// below are packed), so the first free one is the lowest free fd. The
    /// same steps as the locked search: claim it by compare-exchange, raise
    /// the hint past it only from the value read, then re-check the slots
    /// passed. Searches may run concurrently (only the ones that go further
    /// take the lock): a raise from a value another search or a close has
    /// moved fails, and every raise is followed by its own re-check, so the
    /// Dekker pair of the type's doc holds for each (loom model
    /// `loom_models::fd_hint_fast_path`). `None`: fall back to the locked
    /// search.
    fn reserve_at_hint(&self, min: usize, g: &Guard) -> Option<i32> {
        // SeqCst: the hint's Dekker pair with `close`.
        let h = self.alloc.next_hint.load(Ordering::SeqCst) as usize;
        let end = h.saturating_add(FAST_SCAN).min(self.max());
        if h < min || h >= end {
            return None;
        }
        let mut fd = h;
        while !claim(self.slot(fd, g)?, g) {
            fd += 1;
            if fd == end {
                return None;
            }
        }
        // The hint is a lower bound, so leaving it is always correct. It is
        // raised only past two or more slots in use: threads that keep
        // taking the first two free fds (3 and 4 of a shared table) then
        // only read its line, and closes above it do not write it either.
        if fd >= h + 2 {
            self.raise_hint(h, fd, g);
        }
        Some(fd as i32)
    }

    /// Raise the hint from `from` (the value the search read) past `fd`,
    /// unless a close lowered it or another search raised it meanwhile;
    /// then re-check the slots passed (`from..fd`, all in use when the
    /// search looked): a close that freed one of them before it could read
    /// the raised hint is caught here and the hint lowered to it (the
    /// search's half of the Dekker pair).
    fn raise_hint(&self, from: usize, fd: usize, g: &Guard) {
        // SeqCst: the Dekker pair with `close` (see the type's doc).
        if self
            .alloc
            .next_hint
            .compare_exchange(
                from as u64,
                fd as u64 + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_err()
        {
            return;
        }
        for i in from..fd {
            let Some(s) = self.slot(i, g) else { return };
            // SeqCst: the Dekker pair.
            if is_free(s.file.load(Ordering::SeqCst, g)) {
                self.lower_hint(i);
                return;
            }
        }
    }

    /// Put `file` in the fd `reserve` returned.
    pub fn install_reserved(&self, fd: i32, file: Arc<File>, cloexec: bool) {
        let g = epoch::pin();
        let Some(slot) = usize::try_from(fd).ok().and_then(|i| self.slot(i, &g)) else {
            return;
        };
        // Relaxed: the slot is reserved, so no one else writes its flag
        // (`set_cloexec` sees no file, EBADF; dup2 onto it is EBUSY), and
        // the Release compare-exchange below publishes the flag with the
        // file to readers that load the file with Acquire first.
        slot.cloexec.store(cloexec, Ordering::Relaxed);
        account(&file);
        // Release: publish the File to lock-free readers. Only the reserving
        // open turns its reserved slot into something else.
        if let Err(e) = slot.file.compare_exchange(
            reserved(),
            Owned::new(file),
            Ordering::Release,
            Ordering::Relaxed,
            &g,
        ) {
            debug_assert!(false, "fd {fd} was not reserved");
            // Not published: give the accounting back, drop the file.
            release_slot(e.new.into_shared(&g), &g);
        }
    }

    /// Give back a reserved fd that was not filled.
    pub fn unreserve(&self, fd: i32) {
        let g = epoch::pin();
        let Some(i) = usize::try_from(fd).ok() else {
            return;
        };
        if let Some(slot) = self.slot(i, &g) {
            // SeqCst: the freeing side of the hint's Dekker pair.
            if slot
                .file
                .compare_exchange(
                    reserved(),
                    Shared::null(),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                    &g,
                )
                .is_ok()
            {
                self.lower_hint(i);
            }
        }
    }

    /// After freeing slot `fd`: make the lowest-fd search see it.
    fn lower_hint(&self, fd: usize) {
        // SeqCst: the Dekker pair with `reserve_from` (see the type's doc):
        // the load comes after the slot was freed. Above the hint nothing
        // is written (an `install_any` fd, usually).
        if (fd as u64) < self.alloc.next_hint.load(Ordering::SeqCst) {
            // Err: already at or below fd.
            let _ = self
                .alloc
                .next_hint
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                    ((fd as u64) < v).then_some(fd as u64)
                });
        }
    }

    /// Install `file` at any free fd (sv6's O_ANYFD, scalevfs's
    /// [`crate::types::O_ANYFD`]): POSIX's lowest-fd rule does not hold
    /// for it, so no shared lock is taken in the common case. Each thread
    /// has a home range of `ANY_RANGE` fds (by thread number, above the
    /// first range, within the limit) and claims a free slot there by
    /// compare-exchange; when it is full the next ranges are tried, then
    /// the lowest-fd search.
    pub fn install_any(&self, file: Arc<File>, cloexec: bool) -> VfsResult<i32> {
        let fd = self.reserve_any()?;
        self.install_reserved(fd, file, cloexec);
        Ok(fd)
    }

    /// Reserve any free fd (see `install_any`).
    pub fn reserve_any(&self) -> VfsResult<i32> {
        let max = self.max();
        let ranges = max / ANY_RANGE;
        if ranges < 2 {
            return self.reserve();
        }
        let g = epoch::pin();
        let home = 1 + scalevfs_sync::thread_number() % (ranges - 1);
        // At most 4 ranges are tried: bounded work, then the common path.
        for k in 0..4.min(ranges - 1) {
            let r = 1 + (home - 1 + k) % (ranges - 1);
            let base = r * ANY_RANGE;
            if self.slot(base, &g).is_none() {
                // Make the chunk (rare: once per chunk of the table).
                let l = self.alloc.lock.lock();
                self.slot_locked(base, &g, &l);
            }
            for fd in base..base + ANY_RANGE {
                let Some(slot) = self.slot(fd, &g) else {
                    break;
                };
                // The lowest-fd search may claim the same slot.
                if claim(slot, &g) {
                    return Ok(fd as i32);
                }
            }
        }
        self.reserve()
    }

    /// Install `file` at exactly `fd`, closing what was there (dup2).
    pub fn install_at(&self, fd: i32, file: Arc<File>, cloexec: bool) -> VfsResult<()> {
        let g = epoch::pin();
        let l = self.alloc.lock.lock();
        let i = usize::try_from(fd).map_err(|_| Errno::EBADF)?;
        if i >= self.max() {
            return Err(Errno::EBADF);
        }
        let slot = self.slot_locked(i, &g, &l);
        account(&file);
        let new = Owned::new(file).into_shared(&g);
        // A reservation can appear without the lock (`install_any` claims a
        // free slot by compare-exchange), so the slot is replaced only from
        // a value seen not reserved: a plain swap could take a reservation
        // away from its open.
        // SeqCst: ordered with the other slot transitions.
        let mut cur = slot.file.load(Ordering::SeqCst, &g);
        loop {
            if cur.tag() != 0 {
                // Linux's do_dup2: an fd allocated by an open in progress.
                // Never published: give the accounting back, drop the file.
                release_slot(new, &g);
                return Err(Errno::EBUSY);
            }
            // SeqCst: as above; publishes the File (a release too).
            match slot
                .file
                .compare_exchange(cur, new, Ordering::SeqCst, Ordering::SeqCst, &g)
            {
                Ok(_) => break,
                Err(e) => cur = e.current,
            }
        }
        // After the slot is ours: a reserving open stores its flag before
        // its own install, so a store before our compare-exchange could
        // land on its fd. A lock-free reader of the flag racing with this
        // dup2 may pair the new file with the old flag for that moment;
        // fork copies under the lock we hold, so never does.
        slot.cloexec.store(cloexec, Ordering::Relaxed);
        release_slot(cur, &g);
        Ok(())
    }

    /// Close `fd`.
    pub fn close(&self, fd: i32) -> VfsResult<()> {
        let g = epoch::pin();
        let i = usize::try_from(fd).map_err(|_| Errno::EBADF)?;
        let slot = self.slot(i, &g).ok_or(Errno::EBADF)?;
        loop {
            // Acquire: the file we may take.
            let cur = slot.file.load(Ordering::Acquire, &g);
            if cur.is_null() {
                // Free or reserved by an open in progress: not open.
                return Err(Errno::EBADF);
            }
            // SeqCst: the freeing side of the hint's Dekker pair; takes
            // ownership of the pointer.
            if slot
                .file
                .compare_exchange(cur, Shared::null(), Ordering::SeqCst, Ordering::Acquire, &g)
                .is_ok()
            {
                release_slot(cur, &g);
                self.lower_hint(i);
                return Ok(());
            }
            // A dup2 replaced the file meanwhile: close that one.
        }
    }

    pub fn is_cloexec(&self, fd: i32) -> VfsResult<bool> {
        let g = epoch::pin();
        let i = usize::try_from(fd).map_err(|_| Errno::EBADF)?;
        let slot = self.slot(i, &g).ok_or(Errno::EBADF)?;
        // Acquire: pairs with the install's Release, so the flag read below
        // is the installing open's (stored before it published the file)
        // or a later one, not that of the fd's previous file.
        if slot.file.load(Ordering::Acquire, &g).is_null() {
            return Err(Errno::EBADF);
        }
        // Relaxed: ordered after the file's load by its Acquire.
        Ok(slot.cloexec.load(Ordering::Relaxed))
    }

    pub fn set_cloexec(&self, fd: i32, on: bool) -> VfsResult<()> {
        let g = epoch::pin();
        let _l = self.alloc.lock.lock();
        let i = usize::try_from(fd).map_err(|_| Errno::EBADF)?;
        let slot = self.slot(i, &g).ok_or(Errno::EBADF)?;
        // Acquire: an install without the table lock (`install_reserved`)
        // stores its flag before its Release publication of the file; seeing
        // the file orders that store before ours, so fcntl's flag wins.
        if slot.file.load(Ordering::Acquire, &g).is_null() {
            return Err(Errno::EBADF);
        }
        // Relaxed: the flag orders nothing else; stores to it are ordered
        // by the table lock (dup2) or by the Acquire above (a lock-free
        // install).
        slot.cloexec.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Every slot that exists, in fd order.
    fn for_each_slot(&self, g: &Guard, mut f: impl FnMut(usize, &Slot)) {
        let dir = self.dir(g);
        for (ci, c) in dir.chunks.iter().enumerate() {
            // Acquire: as in `slot`.
            let p = c.load(Ordering::Acquire, g);
            // SAFETY: as in `slot`.
            if let Some(chunk) = unsafe { p.as_raw().as_ref() } {
                for k in 0..CHUNK {
                    f(ci * CHUNK + k, &chunk.slots[slot_index(k)]);
                }
            }
        }
    }

    /// A copy of the table (fork): same open file descriptions, new table.
    pub fn fork(&self) -> FdTable {
        let g = epoch::pin();
        let t = FdTable::with_nr_open(self.nr_open);
        // Relaxed: as set_max (the value was checked when it was set).
        t.max.store(self.max(), Ordering::Relaxed);
        let mut files = Vec::new();
        {
            // A snapshot with no search or dup2 in progress (Linux's dup_fd
            // holds file_lock too); the new table is filled after.
            let _l = self.alloc.lock.lock();
            self.for_each_slot(&g, |i, s| {
                // Acquire: the File's contents and its flag, published by a
                // lock-free install's Release (the lock we hold orders only
                // dup2's), before we clone the file and read the flag.
                let p = s.file.load(Ordering::Acquire, &g);
                // SAFETY: live while in the slot (pinned).
                if let Some(f) = unsafe { p.as_ref() } {
                    files.push((i, f.clone(), s.cloexec.load(Ordering::Relaxed)));
                }
            });
        }
        // Every fd is copied, those at or above a limit lowered after they
        // were opened too (Linux's dup_fd copies the table whatever the
        // rlimit): the limit is raised past them while they go in, then
        // set back. A fresh table has no reservation.
        let limit = t.max();
        if let Some(&(top, _, _)) = files.last() {
            // Relaxed: as above; nobody else sees `t` yet.
            t.max.store(limit.max(top + 1), Ordering::Relaxed);
        }
        for (i, f, cloexec) in files {
            let _ = t.install_at(i as i32, f, cloexec);
        }
        // Relaxed: as above.
        t.max.store(limit, Ordering::Relaxed);
        t
    }

    /// Close every fd marked close-on-exec.
    pub fn close_on_exec(&self) {
        let g = epoch::pin();
        let mut fds = Vec::new();
        self.for_each_slot(&g, |i, s| {
            // Only candidates, each checked again by `is_cloexec` (file
            // first, with Acquire) before it is closed: the flag is read
            // before the file here, so the Acquire orders nothing and
            // Relaxed would do.
            if s.cloexec.load(Ordering::Relaxed) && !s.file.load(Ordering::Acquire, &g).is_null() {
                fds.push(i);
            }
        });
        for fd in fds {
            if self.is_cloexec(fd as i32) == Ok(true) {
                let _ = self.close(fd as i32);
            }
        }
    }

    /// Number of open fds.
    pub fn count(&self) -> usize {
        let g = epoch::pin();
        let mut n = 0;
        self.for_each_slot(&g, |_, s| {
            // Acquire: more than needed (Relaxed would do): only whether
            // the slot holds a file is read, for a count that is a
            // snapshot anyway.
            if !s.file.load(Ordering::Acquire, &g).is_null() {
                n += 1;
            }
        });
        n
    }
}

/// What a slot holding `file` counts, done before the slot is published.
fn account(file: &Arc<File>) {
    // Each slot holds its file's mount busy (umount's EBUSY), from here
    // to the slot's close, not to the deferred drop.
    file.path.mnt.hold();
    // SeqCst: the count and `HELD` are one word; a file installed again
    // after its last slot closed (an `Arc<File>` kept by a library user)
    // counts as a writer again. Its write access (or exec hold) is taken
    // again only if that is possible now; otherwise the description goes
    // on without it. A count found with `HELD` set keeps the counts held
    // whatever closes race with this: the last close gives them back only
    // by clearing `HELD` from a word with no slot (`release_slot`).
    slot_added(
        &file.slots,
        file.writer || file.exec,
        || {
            if file.writer {
                let ok = file.inode.get_write_access().is_ok();
                if ok {
                    file.path.mnt.add_writer();
                }
                ok
            } else {
                file.inode.deny_write_access().is_ok()
            }
        },
        || file.give_back_access(),
    );
}

/// `File::slots`'s bit: the file's write access (or exec hold) is held.
pub(crate) const HELD: usize = 1 << (usize::BITS - 1);

/// One slot more in `word` (`File::slots`) of a file that holds counts
/// (`counted`): if they are not held, `take` takes them (true: it could)
/// and they are published with `HELD`, or given back with `give` if a
/// racing install published its own first. (The loom model
/// `file_access_vs_last_close` runs this and `slot_removed`.)
pub(crate) fn slot_added(
    word: &AtomicUsize,
    counted: bool,
    take: impl FnOnce() -> bool,
    give: impl FnOnce(),
) {
    let prev = word.fetch_add(1, Ordering::SeqCst);
    if counted && prev & HELD == 0 && take() && word.fetch_or(HELD, Ordering::SeqCst) & HELD != 0 {
        give();
    }
}

/// What [`slot_removed`] found.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Removed {
    /// The slot count went from 1 to 0 (the description's last fd closed).
    pub(crate) last: bool,
    /// The caller must give the counts back: this was the last slot, the
    /// counts were held, and no slot came before `HELD` was cleared.
    pub(crate) give_back: bool,
}

/// One slot fewer in `word`.
pub(crate) fn slot_removed(word: &AtomicUsize) -> Removed {
    let prev = word.fetch_sub(1, Ordering::SeqCst);
    Removed {
        last: prev & !HELD == 1,
        give_back: prev == HELD | 1
            && word
                .compare_exchange(HELD, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok(),
    }
}

/// A slot's file pointer taken out of the table (null: nothing): its
/// mount stops being busy for this slot now, the `Arc` is dropped after a
/// grace period.
/// Reserve a free slot for an open in progress (free -> reserved).
#[inline]
fn claim(slot: &Slot, g: &Guard) -> bool {
    // SeqCst: searches and `install_any` claim concurrently; and the
    // freeing side of the hint's Dekker pair.
    slot.file
        .compare_exchange(
            Shared::null(),
            reserved(),
            Ordering::SeqCst,
            Ordering::SeqCst,
            g,
        )
        .is_ok()
}

fn release_slot(old: Shared<'_, Arc<File>>, g: &Guard) {
    // SAFETY: a non-null slot pointer is a live Arc<File> box; it is freed
    // only by the deferred destruction below.
    if let Some(f) = unsafe { old.as_ref() } {
        f.path.mnt.release();
        // SeqCst: the last slot's close gives write access back now, not at
        // the deferred drop (a read-only remount right after close
        // succeeds), unless a slot came meanwhile (a dup or fork racing
        // with this close saw `HELD` and took nothing): only the clearing
        // of `HELD` from a word with no slot gives the counts back.
        let r = slot_removed(&f.slots);
        if r.give_back {
            f.give_back_access();
        }
        // The last fd's close releases the description's flock now (Linux
        // releases it before close returns), after the decrement above:
        // the close's half of the Dekker pair with a grant (`flock.rs`).
        if r.last && crate::flock::used(&f.flock) {
            crate::flock::unlock(&f.flock_desc());
        }
        if cfg!(loom) {
            // Loom's threads share std's thread-locals: the global queue.
            // (`g` is a real guard here: loom's models drop no table
            // inside a collection, the one place `limbo::pin` nests.)
            // SAFETY: unreachable from the table now; pinned readers are
            // waited for.
            unsafe { g.defer_destroy(old) };
            return;
        }
        // A removed file's description, maybe the last holder of its data.
        let a = f.inode().attr();
        let heavy = crate::limbo::is_heavy(a.nlink, a.blocks);
        // SAFETY: unreachable from the table now; `retire` waits for pinned
        // readers, then `drop_slot_file` frees the box once. Freed by this
        // thread at its next system call when it can (limbo.rs).
        unsafe {
            if heavy {
                crate::limbo::retire_heavy(drop_slot_file, old.as_raw() as *mut ())
            } else {
                crate::limbo::retire(drop_slot_file, old.as_raw() as *mut ())
            }
        };
    }
}

/// The deferred half of `release_slot`.
///
/// # Safety
/// `p` is a slot's `Arc<File>` box (crossbeam's `Owned`), out of every
/// table, after a grace period; called once.
unsafe fn drop_slot_file(p: *mut ()) {
    // SAFETY: the contract above.
    drop(unsafe { Owned::from_raw(p as *mut Arc<File>) });
}

impl Default for FdTable {
    fn default() -> Self {
        FdTable::new()
    }
}

impl Drop for FdTable {
    fn drop(&mut self) {
        // A table may go inside a collection (limbo.rs, "Pins in frees").
        let pin = crate::limbo::pin();
        let g = pin.loads();
        // AcqRel: take ownership of the directory.
        let dir = self.dir.swap(Shared::null(), Ordering::AcqRel, g);
        // SAFETY: we own the table; pinned readers are waited for by the
        // deferred destruction.
        if let Some(d) = unsafe { dir.as_ref() } {
            for c in d.chunks.iter() {
                // AcqRel: take ownership of the chunk.
                let p = c.swap(Shared::null(), Ordering::AcqRel, g);
                // SAFETY: as for the directory.
                if let Some(chunk) = unsafe { p.as_ref() } {
                    for s in chunk.slots.iter() {
                        let f = s.file.swap(Shared::null(), Ordering::AcqRel, g);
                        // A reservation (tag, no pointer) owns nothing.
                        release_slot(f, g);
                    }
                    // SAFETY: unreachable now.
                    unsafe { pin.defer_destroy(p) };
                }
            }
            // SAFETY: unreachable now.
            unsafe { pin.defer_destroy(dir) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every fd of a chunk has a slot of its own, and fds next to each
    /// other are on different cache lines (128 bytes: two with the
    /// adjacent-line prefetch).
    #[test]
    fn slot_index_is_a_permutation_that_spreads_neighbours() {
        let mut seen = vec![false; CHUNK];
        for k in 0..CHUNK {
            let i = slot_index(k);
            assert!(i < CHUNK && !seen[i], "fd {k} -> slot {i}");
            seen[i] = true;
        }
        let line = |k: usize| slot_index(k) * std::mem::size_of::<Slot>() / 128;
        for k in 0..SPREAD - 1 {
            assert_ne!(line(k), line(k + 1), "fds {k} and {}", k + 1);
        }
    }
}
