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
//!   retries if the position moved meanwhile, so reads on a shared
//!   description never return the same bytes twice. `File::pos_lock` (mutex,
//!   Linux's `f_pos_lock`) serialises position-using `write`s of one
//!   description; it nests outside the inode's data lock. A write that races
//!   with an lseek keeps the lseek's position (as if the lseek came after),
//!   so a SEEK_CUR racing with a write behaves like a SEEK_SET, which is also
//!   what Linux's generic_file_llseek documents. `getdents` holds `pos_lock`
//!   for its whole listing step (outside the directory's `dir_lock`).
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

use scalevfs_sync::ordered::{Class, Mutex, SpinLock};
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
    /// Whether `writer`'s or `exec`'s counts are held now.
    access_held: AtomicBool,
    /// fd-table slots holding this file.
    slots: AtomicUsize,
    /// Serialises position-using writes (see LOCKING RULES).
    pub(crate) pos_lock: Mutex<()>,
    /// A directory listing's end (`Filesystem::readdir_end`), taken when a
    /// listing starts at position 0; u64::MAX: none. Under `pos_lock`.
    pub(crate) dir_end: AtomicU64,
}

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
    pub(crate) fn new(path: PathRef, flags: u32) -> VfsResult<File> {
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
            access_held: AtomicBool::new(writer || exec),
            slots: AtomicUsize::new(0),
            flags: AtomicU32::new(flags),
            pos: AtomicU64::new(0),
            pos_lock: Mutex::new(Class::PosLock, ()),
            dir_end: AtomicU64::new(u64::MAX),
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
        if (self.writer || self.exec) && self.access_held.swap(false, Ordering::SeqCst) {
            if self.writer {
                self.inode.put_write_access();
                self.path.mnt.drop_writer();
            } else {
                self.inode.allow_write_access();
            }
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
        crate::orphan::file_closed(&self.path.mnt.sb.orphans, &self.inode);
    }
}

struct Slot {
    file: Atomic<Arc<File>>,
    cloexec: AtomicBool,
}

struct FdArray {
    slots: Box<[Slot]>,
}

/// A task's fd table. Aligned to a cache line: two processes' tables (each
/// written by its own opens) must never share one (the conflict matrix
/// caught two tables allocated side by side).
#[repr(align(64))]
pub struct FdTable {
    arr: Atomic<FdArray>,
    /// The table lock (a spinlock, as Linux's `file_lock`: every section
    /// is a few slot operations, and a sleeping mutex made threads of one
    /// process queue behind each other's opens: 0.22x at 16 threads).
    /// It guards the fds reserved by an open in progress (`reserve`:
    /// taken, not yet filled; Linux's get_unused_fd_flags).
    lock: SpinLock<Vec<usize>>,
    max: AtomicUsize,
    /// The most `set_max` allows (fs.nr_open).
    nr_open: usize,
    /// Lowest fd that might be free (a hint).
    next_hint: AtomicU64,
}

impl std::fmt::Debug for FdTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdTable").finish_non_exhaustive()
    }
}

fn new_array(n: usize) -> FdArray {
    FdArray {
        slots: (0..n)
            .map(|_| Slot {
                file: Atomic::null(),
                cloexec: Default::default(),
            })
            .collect(),
    }
}

impl FdTable {
    pub fn new() -> FdTable {
        FdTable::with_nr_open(NR_OPEN)
    }

    /// A table whose limit may be raised up to `nr_open` (clamped to
    /// `NR_OPEN_MIN..=NR_OPEN_MAX`).
    pub fn with_nr_open(nr_open: usize) -> FdTable {
        FdTable {
            arr: Atomic::new(new_array(64)),
            lock: SpinLock::new(Class::FdTable, LockClass::FdTable, Vec::new()),
            max: AtomicUsize::new(DEFAULT_MAX_FDS),
            nr_open: nr_open.clamp(NR_OPEN_MIN, NR_OPEN_MAX),
            next_hint: AtomicU64::new(0),
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
        self.max.load(Ordering::Relaxed)
    }

    fn array<'g>(&self, g: &'g Guard) -> &'g FdArray {
        // Acquire: pairs with the Release publication of a grown array.
        let p = self.arr.load(Ordering::Acquire, g);
        // SAFETY: never null (set in new, replaced only by a valid array),
        // freed after a grace period.
        unsafe { p.deref() }
    }

    /// The file at `fd`, borrowed under `g`: no reference count is taken.
    #[inline]
    pub fn get<'g>(&self, fd: i32, g: &'g Guard) -> VfsResult<&'g Arc<File>> {
        let arr = self.array(g);
        let slot = usize::try_from(fd)
            .ok()
            .and_then(|i| arr.slots.get(i))
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
        let g = epoch::pin();
        let l = self.lock.lock();
        let fd = self.find_free(&l, min, &g)?;
        let arr = self.array(&g);
        self.store_locked(arr, fd, file, cloexec, &g);
        Ok(fd as i32)
    }

    /// Reserve the lowest free fd (>= 0) for an open in progress, so that a
    /// full table fails the open (EMFILE) before it creates anything, as
    /// Linux allocates the fd first. Fill it with `install_reserved` or give
    /// it back with `unreserve`.
    pub fn reserve(&self) -> VfsResult<i32> {
        let g = epoch::pin();
        let mut l = self.lock.lock();
        let fd = self.find_free(&l, 0, &g)?;
        l.push(fd);
        Ok(fd as i32)
    }

    /// Put `file` in the fd `reserve` returned.
    pub fn install_reserved(&self, fd: i32, file: Arc<File>, cloexec: bool) {
        let g = epoch::pin();
        let mut l = self.lock.lock();
        let i = fd as usize;
        if let Some(k) = l.iter().position(|&r| r == i) {
            l.swap_remove(k);
            let arr = self.array(&g);
            self.store_locked(arr, i, file, cloexec, &g);
        }
    }

    /// Give back a reserved fd that was not filled.
    pub fn unreserve(&self, fd: i32) {
        let mut l = self.lock.lock();
        if let Some(k) = l.iter().position(|&r| r == fd as usize) {
            l.swap_remove(k);
            // Relaxed: under the table lock.
            if (fd as u64) < self.next_hint.load(Ordering::Relaxed) {
                self.next_hint.store(fd as u64, Ordering::Relaxed);
            }
        }
    }

    /// The lowest fd >= `min` that is neither open nor reserved (table lock
    /// held: `reserved`), growing the array to hold it.
    fn find_free(&self, reserved: &[usize], min: usize, g: &Guard) -> VfsResult<usize> {
        let max = self.max();
        let mut arr = self.array(g);
        // Relaxed: a hint read under the table lock.
        let hint = (self.next_hint.load(Ordering::Relaxed) as usize).max(min);
        let mut fd = hint;
        loop {
            if fd >= max {
                return Err(Errno::EMFILE);
            }
            if fd >= arr.slots.len() {
                arr = self.grow(fd + 1, g);
            }
            // Relaxed: under the table lock, which orders every slot change.
            if arr.slots[fd].file.load(Ordering::Relaxed, g).is_null() && !reserved.contains(&fd) {
                break;
            }
            fd += 1;
        }
        if min == 0 || hint == min {
            // Relaxed: under the table lock.
            self.next_hint.store(fd as u64 + 1, Ordering::Relaxed);
        }
        Ok(fd)
    }

    fn store_locked(&self, arr: &FdArray, fd: usize, file: Arc<File>, cloexec: bool, g: &Guard) {
        let slot = &arr.slots[fd];
        slot.cloexec.store(cloexec, Ordering::Relaxed);
        // Each slot holds its file's mount busy (umount's EBUSY), from here
        // to the slot's close, not to the deferred drop.
        file.path.mnt.hold();
        // Relaxed: a count (tables of different tasks may share the file:
        // an RMW); the last decrement in `release_slot` is AcqRel.
        file.slots.fetch_add(1, Ordering::Relaxed);
        // SeqCst: a file installed again after its last slot closed (an
        // `Arc<File>` kept by a library user) counts as a writer again. Its
        // write access (or exec hold) is taken again only if that is
        // possible now; otherwise the description goes on without it.
        if (file.writer || file.exec) && !file.access_held.load(Ordering::SeqCst) {
            let ok = if file.writer {
                file.inode.get_write_access().is_ok()
            } else {
                file.inode.deny_write_access().is_ok()
            };
            if ok && !file.access_held.swap(true, Ordering::SeqCst) {
                if file.writer {
                    file.path.mnt.add_writer();
                }
            } else if ok {
                // Another install took it first: give ours back.
                if file.writer {
                    file.inode.put_write_access();
                } else {
                    file.inode.allow_write_access();
                }
            }
        }
        // Release: publish the File to lock-free readers.
        let old = slot.file.swap(Owned::new(file), Ordering::Release, g);
        release_slot(old, g);
    }

    /// Install `file` at exactly `fd`, closing what was there (dup2).
    pub fn install_at(&self, fd: i32, file: Arc<File>, cloexec: bool) -> VfsResult<()> {
        let g = epoch::pin();
        let l = self.lock.lock();
        let i = usize::try_from(fd).map_err(|_| Errno::EBADF)?;
        if i >= self.max() {
            return Err(Errno::EBADF);
        }
        if l.contains(&i) {
            // Linux's do_dup2: an fd allocated by an open in progress.
            return Err(Errno::EBUSY);
        }
        let mut arr = self.array(&g);
        if i >= arr.slots.len() {
            arr = self.grow(i + 1, &g);
        }
        self.store_locked(arr, i, file, cloexec, &g);
        Ok(())
    }

    fn grow<'g>(&self, need: usize, g: &'g Guard) -> &'g FdArray {
        let old = self.array(g);
        let n = need.next_power_of_two().max(old.slots.len() * 2);
        let new = new_array(n);
        for (o, s) in old.slots.iter().zip(new.slots.iter()) {
            // Relaxed: under the table lock; published by the Release below.
            s.file
                .store(o.file.load(Ordering::Relaxed, g), Ordering::Relaxed);
            s.cloexec
                .store(o.cloexec.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        // Release: publish the copied slots.
        let prev = self.arr.swap(Owned::new(new), Ordering::Release, g);
        // The old array's slots are now shared with the new one; free only
        // the array itself (its Atomic fields do not own the files).
        // SAFETY: unreachable now; pinned readers are waited for.
        unsafe { g.defer_destroy(prev) };
        self.array(g)
    }

    /// Close `fd`.
    pub fn close(&self, fd: i32) -> VfsResult<()> {
        let g = epoch::pin();
        let _l = self.lock.lock();
        let arr = self.array(&g);
        let i = usize::try_from(fd).map_err(|_| Errno::EBADF)?;
        let slot = arr.slots.get(i).ok_or(Errno::EBADF)?;
        // AcqRel: take ownership of the file pointer.
        let old = slot.file.swap(Shared::null(), Ordering::AcqRel, &g);
        if old.is_null() {
            return Err(Errno::EBADF);
        }
        release_slot(old, &g);
        // Relaxed: under the table lock.
        if (i as u64) < self.next_hint.load(Ordering::Relaxed) {
            self.next_hint.store(i as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    pub fn is_cloexec(&self, fd: i32) -> VfsResult<bool> {
        let g = epoch::pin();
        let arr = self.array(&g);
        let i = usize::try_from(fd).map_err(|_| Errno::EBADF)?;
        let slot = arr.slots.get(i).ok_or(Errno::EBADF)?;
        if slot.file.load(Ordering::Acquire, &g).is_null() {
            return Err(Errno::EBADF);
        }
        Ok(slot.cloexec.load(Ordering::Relaxed))
    }

    pub fn set_cloexec(&self, fd: i32, on: bool) -> VfsResult<()> {
        let g = epoch::pin();
        let _l = self.lock.lock();
        let arr = self.array(&g);
        let i = usize::try_from(fd).map_err(|_| Errno::EBADF)?;
        let slot = arr.slots.get(i).ok_or(Errno::EBADF)?;
        if slot.file.load(Ordering::Acquire, &g).is_null() {
            return Err(Errno::EBADF);
        }
        slot.cloexec.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// A copy of the table (fork): same open file descriptions, new table.
    pub fn fork(&self) -> FdTable {
        let g = epoch::pin();
        let _l = self.lock.lock();
        let arr = self.array(&g);
        let t = FdTable::with_nr_open(self.nr_open);
        // Relaxed: as set_max (the value was checked when it was set).
        t.max.store(self.max(), Ordering::Relaxed);
        {
            let g2 = &g;
            let mut dst = t.array(g2);
            if dst.slots.len() < arr.slots.len() {
                dst = t.grow(arr.slots.len(), g2);
            }
            for (i, s) in arr.slots.iter().enumerate() {
                let p = s.file.load(Ordering::Acquire, g2);
                // SAFETY: live while in the slot; we hold the table lock.
                if let Some(f) = unsafe { p.as_ref() } {
                    t.store_locked(dst, i, f.clone(), s.cloexec.load(Ordering::Relaxed), g2);
                }
            }
        }
        t.next_hint.store(0, Ordering::Relaxed);
        t
    }

    /// Close every fd marked close-on-exec.
    pub fn close_on_exec(&self) {
        let g = epoch::pin();
        let n = self.array(&g).slots.len();
        for fd in 0..n {
            if self.is_cloexec(fd as i32) == Ok(true) {
                let _ = self.close(fd as i32);
            }
        }
    }

    /// Number of open fds.
    pub fn count(&self) -> usize {
        let g = epoch::pin();
        self.array(&g)
            .slots
            .iter()
            .filter(|s| !s.file.load(Ordering::Acquire, &g).is_null())
            .count()
    }
}

/// A slot's file pointer taken out of the table (null: nothing): its
/// mount stops being busy for this slot now, the `Arc` is dropped after a
/// grace period.
fn release_slot(old: Shared<'_, Arc<File>>, g: &Guard) {
    // SAFETY: a non-null slot pointer is a live Arc<File> box; it is freed
    // only by the deferred destruction below.
    if let Some(f) = unsafe { old.as_ref() } {
        f.path.mnt.release();
        // AcqRel: the last slot's close gives write access back now, not at the
        // deferred drop (a read-only remount right after close succeeds).
        if f.slots.fetch_sub(1, Ordering::AcqRel) == 1 {
            f.release_access();
        }
        // SAFETY: unreachable from the table now; pinned readers are waited for.
        unsafe { g.defer_destroy(old) };
    }
}

impl Default for FdTable {
    fn default() -> Self {
        FdTable::new()
    }
}

impl Drop for FdTable {
    fn drop(&mut self) {
        let g = epoch::pin();
        // AcqRel: take ownership of the array.
        let arr = self.arr.swap(Shared::null(), Ordering::AcqRel, &g);
        // SAFETY: we own the table; pinned readers are waited for by the
        // deferred destruction.
        if let Some(a) = unsafe { arr.as_ref() } {
            for s in a.slots.iter() {
                let p = s.file.swap(Shared::null(), Ordering::AcqRel, &g);
                release_slot(p, &g);
            }
            // SAFETY: unreachable now.
            unsafe { g.defer_destroy(arr) };
        }
    }
}
