//! Data calls on open files: read, write, pread, pwrite, readv, writev,
//! lseek, ftruncate, truncate, fallocate, fsync, fdatasync, fcntl.
//!
//! Every call on an fd borrows the open file description under an epoch
//! guard (no reference count is taken; see `file.rs`). Errno choices and
//! their order follow Linux (`fs/read_write.c`, `fs/open.c`, tmpfs).
//!
//! LOCKING RULES
//! - `Inode::data_lock` (a big-reader lock), exclusive: write, truncate and
//!   fallocate (so an O_APPEND write's "end of file" and its data land
//!   atomically); shared: a positioned overwrite that changes no size or
//!   allocation, where the filesystem offers one (`Filesystem::write_shared`,
//!   memfs: inside one existing page, published by compare-and-exchange, so
//!   such writers of one page still do not lose each other's bytes). Reads
//!   take no lock: memfs's page store is read lock-free (`pages.rs`).
//! - `File::pos_lock` (mutex) serialises position-using reads and writes
//!   (O_APPEND ones too) of one open regular file's description, as
//!   Linux's `f_pos_lock`; order: `pos_lock` -> `data_lock` -> the inode's
//!   orphan registration lock (`orphan.rs`) -> the orphan file's locks.
//! - lseek on a regular file takes no lock (variant `Lockless`, seed 003):
//!   SEEK_SET/SEEK_END are stores, SEEK_CUR an atomic update, SEEK_END reads
//!   the size through the inode's seqlock. Variant `Locked` takes the data
//!   lock around every lseek (the 2005 behaviour). A directory's lseek
//!   takes the description's `pos_lock`, which getdents holds while it
//!   lists from the position (Linux's `f_pos_lock`; the directory's own
//!   lock is not needed for a position).
//! - An epoch guard is pinned before any of these locks is taken: a pin may
//!   run deferred destructors (a last close), which must not find us holding
//!   a lock they need.

use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Guard};
use scalevfs_sync::primitive::Ordering;

use crate::config::LlseekVariant;
use crate::errno::{Errno, VfsResult};
use crate::file::{File, O_LARGEFILE_KERNEL};
use crate::fileops::*;
use crate::task::Task;
use crate::types::*;
use crate::vfs::Changes;

pub const SEEK_SET: u32 = 0;
pub const SEEK_CUR: u32 = 1;
pub const SEEK_END: u32 = 2;
pub const SEEK_DATA: u32 = 3;
pub const SEEK_HOLE: u32 = 4;

/// `fallocate` modes.
pub const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
pub const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
pub const FALLOC_FL_COLLAPSE_RANGE: u32 = 0x08;
pub const FALLOC_FL_ZERO_RANGE: u32 = 0x10;
pub const FALLOC_FL_INSERT_RANGE: u32 = 0x20;
const FALLOC_FL_UNSHARE_RANGE: u32 = 0x40;
const FALLOC_FL_WRITE_ZEROES: u32 = 0x80;
/// Every mode bit Linux's VFS knows (collapse, zero, insert, unshare,
/// write-zeroes); tmpfs supports only KEEP_SIZE and PUNCH_HOLE.
const FALLOC_FL_KNOWN: u32 = 0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x20 | 0x40 | 0x80;

/// `fcntl` commands.
pub const F_DUPFD: u32 = libc::F_DUPFD as u32;
pub const F_DUPFD_CLOEXEC: u32 = libc::F_DUPFD_CLOEXEC as u32;
pub const F_GETFD: u32 = libc::F_GETFD as u32;
pub const F_SETFD: u32 = libc::F_SETFD as u32;
pub const F_GETFL: u32 = libc::F_GETFL as u32;
pub const F_SETFL: u32 = libc::F_SETFL as u32;
pub const FD_CLOEXEC: u32 = libc::FD_CLOEXEC as u32;

impl Task {
    /// The description at `fd`, borrowed under `g` (no count taken); O_PATH
    /// descriptions are EBADF for I/O, as `fdget` does.
    fn io_file<'g>(&self, fd: i32, g: &'g Guard) -> VfsResult<&'g Arc<File>> {
        let f = self.files().get(fd, g)?;
        if f.is_path_only() {
            return Err(Errno::EBADF);
        }
        Ok(f)
    }

    /// `read(2)`. A regular file's read holds the description's
    /// `pos_lock`, as a write does (Linux's `f_pos_lock` for
    /// FMODE_ATOMIC_POS files): a read and a write of one description
    /// cannot both start at one position (the write would land where the
    /// read had already moved past, and the next write over its tail). The
    /// new position is published with a compare-exchange; if an lseek
    /// (which takes no lock) moved it meanwhile, the read is redone at the
    /// new position.
    pub fn read(&self, fd: i32, buf: &mut [u8]) -> VfsResult<usize> {
        if buf.len() >= UNPINNED_IO {
            // Counted, not pinned (`UNPINNED_IO`); the common small read
            // below pays for none of it.
            let f = self.counted_io_file(fd)?;
            return self.read_on(&f, buf);
        }
        let g = epoch::pin();
        let f = self.io_file(fd, &g)?;
        self.read_on(f, buf)
    }

    /// A descriptor's file, counted (for calls of `UNPINNED_IO` or more).
    #[cold]
    fn counted_io_file(&self, fd: i32) -> VfsResult<Arc<File>> {
        let g = epoch::pin();
        Ok(self.io_file(fd, &g)?.clone())
    }

    /// `read` on `f` (pinned or counted by the caller).
    #[inline(always)]
    fn read_on(&self, f: &File, buf: &mut [u8]) -> VfsResult<usize> {
        if !f.can_read() {
            return Err(Errno::EBADF);
        }
        // rw_verify_area checks the count asked for; only then is it cut
        // to MAX_RW_COUNT (a read of 3 GiB near the end of the offsets is
        // EINVAL, not a short read).
        let asked = buf.len();
        let len = asked.min(MAX_RW_COUNT);
        let buf = &mut buf[..len];
        // Not for FIFOs and the like, whose read may wait for a writer of
        // the same description.
        let _pl = (f.inode().file_type() == FileType::Regular).then(|| f.pos_lock.lock());
        loop {
            let pos = f.position();
            verify_area(pos, asked)?;
            let n = file_read(f, pos, buf)?;
            if n == 0 {
                return Ok(0);
            }
            // Relaxed: the position is a value; the CAS only detects a move.
            if f.pos
                .compare_exchange(pos, pos + n as u64, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(n);
            }
        }
    }

    /// `pread(2)`: no reference on the description, no shared write.
    pub fn pread(&self, fd: i32, buf: &mut [u8], off: i64) -> VfsResult<usize> {
        if off < 0 {
            return Err(Errno::EINVAL);
        }
        if buf.len() >= UNPINNED_IO {
            let f = self.counted_io_file(fd)?;
            return Self::pread_on(&f, buf, off);
        }
        let g = epoch::pin();
        let f = self.io_file(fd, &g)?;
        Self::pread_on(f, buf, off)
    }

    /// `pread` on `f` (pinned or counted by the caller; `off` checked).
    #[inline(always)]
    fn pread_on(f: &File, buf: &mut [u8], off: i64) -> VfsResult<usize> {
        if is_pipe_like(f.inode().file_type()) {
            return Err(Errno::ESPIPE);
        }
        if !f.can_read() {
            return Err(Errno::EBADF);
        }
        // The whole count is checked, then cut (as `read`).
        verify_area(off as u64, buf.len())?;
        let len = buf.len().min(MAX_RW_COUNT);
        file_read(f, off as u64, &mut buf[..len])
    }

    /// Run a write of `len` bytes (`once(from)` writes those from `from`
    /// on and says how many it wrote, and whether the file is a regular
    /// one), again after this thread's deferred frees ran when it found no
    /// space: a removed file's space comes back when its inode is freed, a
    /// grace period after its last name and descriptor went, where the
    /// kernel's unlink frees it at once. A few tries with short pauses, as
    /// name operations (`namei::redo_counted_enospc`); a regular file's
    /// write that ended short goes on once more after a flush, for the same
    /// reason. Each try runs unpinned (a pinned thread holds the grace
    /// period back). So `rm big; write` on a full filesystem gets the
    /// space, as on the kernel (the random kernel differential, seed 122).
    fn write_retrying(
        len: usize,
        once: impl Fn(usize) -> VfsResult<(usize, bool)>,
    ) -> VfsResult<usize> {
        match Self::redo_enospc(|| once(0)) {
            Ok((n, true)) if n > 0 && n < len.min(MAX_RW_COUNT) => {
                crate::flush_deferred_frees();
                match once(n) {
                    Ok((k, _)) => Ok(n + k),
                    Err(_) => Ok(n),
                }
            }
            r => r.map(|(n, _)| n),
        }
    }

    /// Run `once` again after this thread's deferred frees ran while it
    /// fails with ENOSPC (see `write_retrying`), each try unpinned.
    pub(crate) fn redo_enospc<R>(once: impl Fn() -> VfsResult<R>) -> VfsResult<R> {
        let once = || {
            crate::namei::enospc_final_reset();
            once()
        };
        let mut r = once();
        let mut wait = None;
        while matches!(r, Err(Errno::ENOSPC)) {
            if !wait
                .get_or_insert_with(|| crate::namei::EnospcWait::new(false))
                .round()
            {
                break;
            }
            r = once();
        }
        r
    }

    /// `write(2)`. O_APPEND writes land at the end of file atomically (the
    /// data lock covers "find the end" and "copy"); other writes of one
    /// description are serialised by its `pos_lock`. Out of space, see
    /// `write_retrying`.
    pub fn write(&self, fd: i32, buf: &[u8]) -> VfsResult<usize> {
        let held = Held::default();
        Self::write_retrying(buf.len(), |from| {
            // Reported when this drops, after the try's locks, unpinned.
            let mut ch = self.changes();
            held.count_if_big(self, fd, buf.len() - from)?;
            let g = held.pin();
            let f = held.file(self, fd, g.as_ref())?;
            let r = self.write_once(f, &buf[from..], &mut ch);
            held.keep_unless_done(f, r, buf.len() - from)
        })
    }

    /// One try of a write on `f` (the caller pins): how much it wrote,
    /// and whether a short count may go on (a regular file, not O_APPEND:
    /// an append's second part could land after another appender's).
    fn write_once(&self, f: &File, buf: &[u8], ch: &mut Changes) -> VfsResult<(usize, bool)> {
        if !f.can_write() {
            return Err(Errno::EBADF);
        }
        let regular = f.inode().file_type() == FileType::Regular;
        if f.is_append() {
            // Linux checks the description's position even for an append
            // (`file_ppos`): an O_APPEND fd moved near the end of the
            // offsets is EINVAL before anything is written.
            verify_area(f.position(), buf.len())?;
            // Under the position lock: two appends of one description
            // publish their ends in the order they wrote (an unlocked
            // store could move the position back).
            let _pl = regular.then(|| f.pos_lock.lock());
            let (n, end) = file_write(f, None, buf, self.cred())?;
            // Only a write of something moves the position (Linux stores
            // the end when the write returned more than 0: an empty write
            // leaves it where it was).
            if n > 0 {
                // Relaxed: the position is a value, stored under `pos_lock`.
                f.pos.store(end, Ordering::Relaxed);
                ch.inode(f.inode());
            }
            return Ok((n, false));
        }
        let _pl = f.pos_lock.lock();
        let pos = f.position();
        // The whole count is checked (file_write cuts it to MAX_RW_COUNT).
        verify_area(pos, buf.len())?;
        let (n, end) = file_write(f, Some(pos), buf, self.cred())?;
        if n > 0 {
            ch.inode(f.inode());
        }
        // Relaxed: a value. If an lseek moved the position meanwhile, it
        // wins (it linearises after this write).
        let _ = f
            .pos
            .compare_exchange(pos, end, Ordering::Relaxed, Ordering::Relaxed);
        Ok((n, regular))
    }

    /// `pwrite(2)` (O_APPEND descriptions append, as on Linux). Out of
    /// space, see `write_retrying`.
    pub fn pwrite(&self, fd: i32, buf: &[u8], off: i64) -> VfsResult<usize> {
        if off < 0 {
            return Err(Errno::EINVAL);
        }
        let held = Held::default();
        Self::write_retrying(buf.len(), |from| {
            let mut ch = self.changes();
            held.count_if_big(self, fd, buf.len() - from)?;
            let g = held.pin();
            let f = held.file(self, fd, g.as_ref())?;
            let r = self.pwrite_once(f, &buf[from..], off.saturating_add(from as i64), &mut ch);
            held.keep_unless_done(f, r, buf.len() - from)
        })
    }

    /// One try of a pwrite on `f` (the caller pins); as `write_once`.
    fn pwrite_once(
        &self,
        f: &File,
        buf: &[u8],
        off: i64,
        ch: &mut Changes,
    ) -> VfsResult<(usize, bool)> {
        if is_pipe_like(f.inode().file_type()) {
            return Err(Errno::ESPIPE);
        }
        if !f.can_write() {
            return Err(Errno::EBADF);
        }
        verify_area(off as u64, buf.len())?;
        let at = if f.is_append() {
            None
        } else {
            Some(off as u64)
        };
        let n = file_write(f, at, buf, self.cred())?.0;
        if n > 0 {
            ch.inode(f.inode());
        }
        Ok((
            n,
            at.is_some() && f.inode().file_type() == FileType::Regular,
        ))
    }

    /// `readv(2)`: one read (so one position update), scattered.
    pub fn readv(&self, fd: i32, bufs: &mut [&mut [u8]]) -> VfsResult<usize> {
        let total = iov_total(bufs.iter().map(|b| b.len()), bufs.len())?;
        let mut tmp = vec![0u8; total.min(MAX_RW_COUNT)];
        let n = self.read(fd, &mut tmp)?;
        let mut done = 0;
        for b in bufs.iter_mut() {
            if done == n {
                break;
            }
            let k = b.len().min(n - done);
            b[..k].copy_from_slice(&tmp[done..done + k]);
            done += k;
        }
        Ok(n)
    }

    /// `writev(2)`: gathered into one write, so an O_APPEND writev is atomic.
    pub fn writev(&self, fd: i32, bufs: &[&[u8]]) -> VfsResult<usize> {
        let total = iov_total(bufs.iter().map(|b| b.len()), bufs.len())?;
        // import_iovec cuts the vector to MAX_RW_COUNT before
        // rw_verify_area sees it (as `readv`): gathered whole, 3 GiB
        // near the end of the offsets would be EINVAL where Linux writes.
        let mut one = Vec::with_capacity(total.min(MAX_RW_COUNT));
        for b in bufs {
            let k = b.len().min(MAX_RW_COUNT - one.len());
            one.extend_from_slice(&b[..k]);
        }
        self.write(fd, &one)
    }

    /// `lseek(2)`. See LOCKING RULES for what each variant locks.
    pub fn lseek(&self, fd: i32, off: i64, whence: u32) -> VfsResult<u64> {
        let g = epoch::pin();
        let f = self.io_file(fd, &g)?;
        let i = f.inode();
        // ksys_lseek: an unknown whence is EINVAL before the file's own
        // llseek says ESPIPE.
        if whence > SEEK_HOLE {
            return Err(Errno::EINVAL);
        }
        if is_pipe_like(i.file_type()) {
            return Err(Errno::ESPIPE);
        }
        if i.is_dir() {
            // tmpfs's dcache_dir_lseek: SEEK_SET and SEEK_CUR only; a
            // filesystem with an end (`Filesystem::dir_seek_bounds`: ext4's
            // htree end) answers the rest as generic_file_llseek_size.
            // Under the description's position lock, which getdents holds
            // while it lists from the position (Linux's f_pos_lock).
            let bounds = f.path().mnt.sb.fs.dir_seek_bounds(i);
            let _pl = f.pos_lock.lock();
            let new = match (whence, bounds) {
                (SEEK_SET, _) => off,
                (SEEK_CUR, _) => (f.position() as i64).wrapping_add(off),
                (SEEK_END, Some((eof, _))) => (eof as i64).wrapping_add(off),
                // (Compared unsigned, as there: a negative offset is past it.)
                (SEEK_DATA, Some((eof, _))) if (off as u64) < eof => off,
                (SEEK_HOLE, Some((eof, _))) if (off as u64) < eof => eof as i64,
                (SEEK_DATA | SEEK_HOLE, Some(_)) => return Err(Errno::ENXIO),
                _ => return Err(Errno::EINVAL),
            };
            if new < 0 || bounds.is_some_and(|(_, max)| new as u64 > max) {
                return Err(Errno::EINVAL);
            }
            // Relaxed: a value, under the position lock.
            f.pos.store(new as u64, Ordering::Relaxed);
            return Ok(new as u64);
        }
        let _locked = match self.vfs().config().llseek {
            LlseekVariant::Lockless => None,
            LlseekVariant::Locked => Some(lock_data_counted(i)),
        };
        let max = f.path().mnt.sb.fs.max_file_size_of(i).min(i64::MAX as u64) as i64;
        let check = |new: i64| {
            if new < 0 || new > max {
                Err(Errno::EINVAL)
            } else {
                Ok(new as u64)
            }
        };
        let new = match whence {
            SEEK_SET => check(off)?,
            SEEK_CUR if off == 0 => return Ok(f.position()),
            SEEK_CUR => {
                // Relaxed: the position is a value; the RMW makes concurrent
                // SEEK_CURs add up.
                let r = f
                    .pos
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                        check((p as i64).wrapping_add(off)).ok()
                    });
                return match r {
                    Ok(p) => Ok((p as i64).wrapping_add(off) as u64),
                    Err(_) => Err(Errno::EINVAL),
                };
            }
            SEEK_END => check((i.attr().size as i64).wrapping_add(off))?,
            _ => {
                if off < 0 {
                    return Err(Errno::ENXIO);
                }
                let n = f
                    .path()
                    .mnt
                    .sb
                    .fs
                    .seek_data_hole(i, off as u64, whence == SEEK_DATA)?;
                check(n as i64)?
            }
        };
        // Write the shared line only when the position changes.
        if f.position() != new {
            // Relaxed: the position is a value.
            f.pos.store(new, Ordering::Relaxed);
        }
        Ok(new)
    }

    /// Linux's `file_remove_privs` on the file open at `fd`, with this
    /// task's credentials: what a write, truncate or fallocate by this task
    /// does to setuid/setgid (see `privs_to_drop`; root keeps them). For a
    /// front end that moves the data through a privileged task but knows
    /// who asked (FUSE's FUSE_WRITE_KILL_SUIDGID / FATTR_KILL_SUIDGID).
    pub fn file_remove_privs(&self, fd: i32) -> VfsResult<()> {
        let f = self.files().get_arc(fd)?;
        if remove_privs(f.path(), self.cred())? {
            self.changes().inode(f.inode());
        }
        Ok(())
    }

    /// `ftruncate(2)`.
    pub fn ftruncate(&self, fd: i32, size: i64) -> VfsResult<()> {
        if size < 0 {
            return Err(Errno::EINVAL);
        }
        // Reported when this drops, after `g` is unpinned.
        let mut ch = self.changes();
        let g = epoch::pin();
        let f = self.io_file(fd, &g)?;
        if f.inode().file_type() != FileType::Regular || !f.can_write() {
            return Err(Errno::EINVAL);
        }
        // do_ftruncate: append-only is EPERM (immutable is not checked: the
        // file was open for writing before it became immutable).
        if f.inode().is_append_only() {
            return Err(Errno::EPERM);
        }
        truncate_inode(f.path(), size as u64, self.cred())?;
        ch.inode(f.inode());
        Ok(())
    }

    /// `truncate(2)`.
    pub fn truncate<P: AsRef<[u8]> + ?Sized>(&self, path: &P, size: i64) -> VfsResult<()> {
        if size < 0 {
            return Err(Errno::EINVAL);
        }
        let p = self.resolve(AT_FDCWD, path.as_ref(), true, false)?;
        let i = p.inode();
        if i.is_dir() {
            return Err(Errno::EISDIR);
        }
        if i.file_type() != FileType::Regular {
            return Err(Errno::EINVAL);
        }
        p.mnt.check_writable()?;
        // inode_permission(MAY_WRITE): immutable is EPERM.
        if i.is_immutable() {
            return Err(Errno::EPERM);
        }
        if !i.permission_ok(&i.attr(), self.cred(), W_OK) {
            return Err(Errno::EACCES);
        }
        if i.is_append_only() {
            return Err(Errno::EPERM);
        }
        // vfs_truncate: a running program is ETXTBSY.
        i.get_write_access()?;
        let r = truncate_inode(&p, size as u64, self.cred());
        i.put_write_access();
        r?;
        // No lock is held here: report at once.
        self.changes().inode(i);
        Ok(())
    }

    /// `fallocate(2)`: mode 0 (allocate, growing the size), KEEP_SIZE,
    /// PUNCH_HOLE|KEEP_SIZE (as tmpfs), and ZERO_RANGE (with or without
    /// KEEP_SIZE), COLLAPSE_RANGE and INSERT_RANGE (as ext4, where the
    /// filesystem has them: `Filesystem::fallocate_range`); UNSHARE_RANGE
    /// and WRITE_ZEROES are EOPNOTSUPP. Mode checks as `vfs_fallocate`.
    /// Out of space, it runs again after this thread's deferred frees ran
    /// (`redo_enospc`: a closed unlinked file's blocks come back a grace
    /// period later; the kernel frees them at the last close), continuing
    /// from what the failed try kept.
    pub fn fallocate(&self, fd: i32, mode: u32, off: i64, len: i64) -> VfsResult<()> {
        let held = Held::default();
        Self::redo_enospc(|| {
            // Reported when this drops, after the try's `_w`, unpinned.
            let mut ch = self.changes();
            let g = epoch::pin();
            // A bad fd first (ksys_fallocate's fdget), then vfs_fallocate's
            // argument checks, then the access mode.
            let f = held.file(self, fd, Some(&g))?;
            let r = self.fallocate_once(f, mode, off, len, &mut ch);
            held.keep_unless_done(f, r.map(|()| (0, false)), 0)
                .map(drop)
        })
    }

    /// One try of a fallocate on `f` (the caller pins).
    fn fallocate_once(
        &self,
        f: &File,
        mode: u32,
        off: i64,
        len: i64,
        ch: &mut Changes,
    ) -> VfsResult<()> {
        use crate::fstype::RangeOp;
        if off < 0 || len <= 0 {
            return Err(Errno::EINVAL);
        }
        if mode & !FALLOC_FL_KNOWN != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        let keep = mode & FALLOC_FL_KEEP_SIZE != 0;
        // One operation, with KEEP_SIZE where it means something.
        let op = mode & !FALLOC_FL_KEEP_SIZE;
        match op {
            0 | FALLOC_FL_ZERO_RANGE | FALLOC_FL_UNSHARE_RANGE => {}
            FALLOC_FL_PUNCH_HOLE if keep => {}
            FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_INSERT_RANGE | FALLOC_FL_WRITE_ZEROES if !keep => {
            }
            _ => return Err(Errno::EOPNOTSUPP),
        }
        if !f.can_write() {
            return Err(Errno::EBADF);
        }
        let i = f.inode();
        // vfs_fallocate: on an append-only file only preallocation; nothing
        // on an immutable one.
        if (mode & !FALLOC_FL_KEEP_SIZE != 0 && i.is_append_only()) || i.is_immutable() {
            return Err(Errno::EPERM);
        }
        match i.file_type() {
            FileType::Fifo => return Err(Errno::ESPIPE),
            FileType::Directory => return Err(Errno::EISDIR),
            FileType::Regular => {}
            _ => return Err(Errno::ENODEV),
        }
        let fs = &f.path().mnt.sb.fs;
        let end = off.checked_add(len).ok_or(Errno::EFBIG)? as u64;
        // The filesystem-wide limit, as vfs_fallocate (ext4's punch clips
        // to EOF, its other modes refuse block-mapped files).
        if end > fs.max_file_size() {
            return Err(Errno::EFBIG);
        }
        let range = match op {
            FALLOC_FL_ZERO_RANGE => Some(RangeOp::Zero),
            FALLOC_FL_COLLAPSE_RANGE => Some(RangeOp::Collapse),
            FALLOC_FL_INSERT_RANGE => Some(RangeOp::Insert),
            0 | FALLOC_FL_PUNCH_HOLE => None,
            _ => return Err(Errno::EOPNOTSUPP),
        };
        // Counted busy and written while it runs (see `file_write`).
        let _ww = f.path().mnt.want_write()?;
        let _w = i.data_lock.write();
        // vfs_fallocate's file_modified, every mode (tmpfs and ext4 too,
        // before their own checks).
        remove_privs(f.path(), self.cred())?;
        let r = crate::caller::with(self.cred(), || match range {
            None => fs.fallocate(i, op == FALLOC_FL_PUNCH_HOLE, off as u64, len as u64),
            Some(r) => fs.fallocate_range(i, r, off as u64, len as u64),
        });
        if r == Err(Errno::ENOSPC) && matches!(op, 0 | FALLOC_FL_ZERO_RANGE) && !keep {
            // As the kernel's ext4_alloc_file_blocks (which ext4's zero
            // range uses too): the size still grows over what was
            // allocated before the space ran out (the range is filled from
            // its start, so up to its first hole). A filesystem without
            // FIEMAP (memfs, as tmpfs) gives everything back on failure
            // instead.
            if let Ok(map) = fs.fiemap(i, off as u64, len as u64, 0) {
                let mut upto = off as u64;
                for x in &map {
                    if x.logical > upto {
                        break;
                    }
                    upto = upto.max(x.logical.saturating_add(x.length));
                }
                let upto = upto.min(end);
                // Nothing mapped at `off`: nothing allocated, no growth.
                if upto > off as u64 && upto > i.attr().size {
                    fs.truncate(i, upto)?;
                    ch.inode(i);
                }
            }
        }
        r?;
        if !keep && matches!(op, 0 | FALLOC_FL_ZERO_RANGE) && end > i.attr().size {
            fs.truncate(i, end)?;
        }
        ch.inode(i);
        Ok(())
    }

    /// `ioctl(fd, FS_IOC_FIEMAP)` over the bytes `[start, start + len)`
    /// with `fm_flags` `flags` (`fstype::FIEMAP_FLAG_*`): every extent that
    /// maps the range (`fm_extent_count` unbounded; a caller with a fixed
    /// array keeps the first ones, as the kernel fills it). Any open file
    /// but O_PATH (EBADF); the filesystem answers for regular files and
    /// directories, other types are EOPNOTSUPP (no `fiemap` inode
    /// operation), as is memfs (as tmpfs). FIEMAP cannot reach a FUSE
    /// daemon: the kernel has no FUSE request for it.
    pub fn fiemap(
        &self,
        fd: i32,
        start: u64,
        len: u64,
        flags: u32,
    ) -> VfsResult<Vec<crate::fstype::FiemapExtent>> {
        let f = self.files().get_arc(fd)?;
        if f.is_path_only() {
            return Err(Errno::EBADF);
        }
        let i = f.inode();
        if !matches!(i.file_type(), FileType::Regular | FileType::Directory) {
            return Err(Errno::EOPNOTSUPP);
        }
        f.path().mnt.sb.fs.fiemap(i, start, len, flags)
    }

    /// `fsync(2)`.
    pub fn fsync(&self, fd: i32) -> VfsResult<()> {
        let g = epoch::pin();
        let f = self.io_file(fd, &g)?;
        f.path().mnt.sb.fs.fsync(f.inode(), false)
    }

    /// `fdatasync(2)`.
    pub fn fdatasync(&self, fd: i32) -> VfsResult<()> {
        let g = epoch::pin();
        let f = self.io_file(fd, &g)?;
        f.path().mnt.sb.fs.fsync(f.inode(), true)
    }

    /// `fcntl(2)` for F_DUPFD, F_DUPFD_CLOEXEC, F_GETFD, F_SETFD, F_GETFL
    /// and F_SETFL.
    pub fn fcntl(&self, fd: i32, cmd: u32, arg: u64) -> VfsResult<u32> {
        let g = epoch::pin();
        let f = self.files().get(fd, &g)?;
        match cmd {
            F_DUPFD | F_DUPFD_CLOEXEC => {
                let min = i32::try_from(arg).map_err(|_| Errno::EINVAL)?;
                self.dupfd(fd, min, cmd == F_DUPFD_CLOEXEC)
                    .map(|n| n as u32)
            }
            F_GETFD => Ok(if self.files().is_cloexec(fd)? {
                FD_CLOEXEC
            } else {
                0
            }),
            F_SETFD => {
                self.files().set_cloexec(fd, arg as u32 & FD_CLOEXEC != 0)?;
                Ok(0)
            }
            F_GETFL => Ok(f.flags()),
            F_SETFL => {
                if f.is_path_only() {
                    return Err(Errno::EBADF);
                }
                let arg = arg as u32;
                let i = f.inode();
                // Linux's setfl: O_APPEND neither set nor cleared on an
                // append-only file; O_NOATIME set only by the owner (or
                // root), as at open.
                if (arg ^ f.flags()) & O_APPEND != 0 && i.is_append_only() {
                    return Err(Errno::EPERM);
                }
                if arg & O_NOATIME != 0
                    && f.flags() & O_NOATIME == 0
                    && !self.cred.is_root()
                    && self.cred.uid != i.attr().uid
                {
                    return Err(Errno::EPERM);
                }
                f.set_status_flags(arg);
                Ok(0)
            }
            _ => Err(Errno::EINVAL),
        }
    }
}

const _: () = assert!(O_LARGEFILE_KERNEL == 0 || O_LARGEFILE_KERNEL & crate::file::SETFL_MASK == 0);

/// How much `copy_file_range` moves per read/write step: the buffer it
/// needs, whatever the length asked for.
const COPY_CHUNK: usize = 128 << 10;

impl Task {
    /// `copy_file_range(2)`: copy up to `len` bytes from `fd_in` at `off_in`
    /// to `fd_out` at `off_out` inside the kernel (here: without a round trip
    /// through the caller). An offset of `None` uses and advances the
    /// description's position. Checks in Linux's order
    /// (`vfs_copy_file_range`, `generic_copy_file_checks`): flags (EINVAL),
    /// directories (EISDIR), non-regular files (EINVAL), access modes and
    /// O_APPEND (EBADF), an immutable target (EPERM), offset overflow
    /// (EOVERFLOW), different filesystems (EXDEV), the copy shortened to the
    /// source's end and the target's size limit (EFBIG at it), overlapping
    /// ranges of one file (EINVAL). At most `MAX_RW_COUNT` bytes per call.
    pub fn copy_file_range(
        &self,
        fd_in: i32,
        off_in: Option<i64>,
        fd_out: i32,
        off_out: Option<i64>,
        len: usize,
        flags: u32,
    ) -> VfsResult<usize> {
        let mut ch = self.changes();
        // Counted handles, not a pin held across the copy: up to 2 GiB
        // moved in chunks, and a pinned thread would hold every thread's
        // reclamation back for all of it (and a pinned wait for space would
        // wait for itself).
        let (fin, fout) = {
            let g = epoch::pin();
            let fin = self.io_file(fd_in, &g)?.clone();
            (fin, self.io_file(fd_out, &g)?.clone())
        };
        let (fin, fout) = (&*fin, &*fout);
        if flags != 0 {
            return Err(Errno::EINVAL);
        }
        let (ii, io) = (fin.inode(), fout.inode());
        if ii.is_dir() || io.is_dir() {
            return Err(Errno::EISDIR);
        }
        if ii.file_type() != FileType::Regular || io.file_type() != FileType::Regular {
            return Err(Errno::EINVAL);
        }
        if !fin.can_read() || !fout.can_write() || fout.is_append() {
            return Err(Errno::EBADF);
        }
        // generic_copy_file_checks: files of two filesystem types (their
        // file operations differ) are EXDEV before the immutable, offset
        // and size checks; two mounts of one type are EXDEV after them
        // (below), as between two tmpfs.
        if fin.path().mnt.sb.fs.name() != fout.path().mnt.sb.fs.name() {
            return Err(Errno::EXDEV);
        }
        if io.is_immutable() {
            return Err(Errno::EPERM);
        }
        let pos_in = off_in
            .map_or(Ok(fin.position()), u64::try_from)
            .map_err(|_| Errno::EOVERFLOW)?;
        let pos_out = off_out
            .map_or(Ok(fout.position()), u64::try_from)
            .map_err(|_| Errno::EOVERFLOW)?;
        // A negative offset is a huge one here, as in Linux's unsigned sum,
        // which adds the whole `len` (the copy is cut to MAX_RW_COUNT
        // after: a huge `len` to an offset near i64::MAX is EOVERFLOW).
        if pos_in.checked_add(len as u64).is_none() || pos_out.checked_add(len as u64).is_none() {
            return Err(Errno::EOVERFLOW);
        }
        let mut count = len.min(MAX_RW_COUNT) as u64;
        if !Arc::ptr_eq(&fin.path().mnt.sb, &fout.path().mnt.sb) {
            return Err(Errno::EXDEV);
        }
        let size_in = ii.attr().size;
        count = if pos_in >= size_in {
            0
        } else {
            count.min(size_in - pos_in)
        };
        // generic_write_check_limits: EFBIG at the limit, else shortened.
        // At or past the filesystem's limit (s_maxbytes) it is EFBIG
        // whatever the count, a copy of nothing included (Linux checks
        // before `len == 0` returns).
        let fs = &fout.path().mnt.sb.fs;
        if pos_out >= fs.max_file_size().min(i64::MAX as u64) {
            return Err(Errno::EFBIG);
        }
        let max = fs.max_file_size_of(io).min(i64::MAX as u64);
        if count > 0 {
            if pos_out >= max {
                return Err(Errno::EFBIG);
            }
            count = count.min(max - pos_out);
        }
        if std::ptr::eq(&**ii, &**io) && pos_out < pos_in + count && pos_in < pos_out + count {
            return Err(Errno::EINVAL);
        }
        if count == 0 {
            return Ok(0);
        }
        // Bounded: `count` <= MAX_RW_COUNT, moved in COPY_CHUNK steps
        // through one buffer; a short read (the source shrank) ends it.
        let mut buf = vec![0u8; COPY_CHUNK.min(count as usize)];
        let mut done = 0u64;
        while done < count {
            let want = (count - done).min(buf.len() as u64) as usize;
            let n = file_read(fin, pos_in + done, &mut buf[..want])?;
            if n == 0 {
                break;
            }
            // Out of space, waits for removed files' space as `write`
            // does (`redo_enospc`), then ends short.
            let w = match Self::redo_enospc(|| {
                file_write(fout, Some(pos_out + done), &buf[..n], self.cred())
            }) {
                Ok((w, _)) => w,
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            };
            done += w as u64;
            if w < n {
                break;
            }
        }
        // Relaxed: positions are values (as read and write publish them).
        if off_in.is_none() {
            fin.pos.fetch_add(done, Ordering::Relaxed);
        }
        if off_out.is_none() {
            fout.pos.fetch_add(done, Ordering::Relaxed);
        }
        if done > 0 {
            ch.inode(io);
        }
        Ok(done as usize)
    }
}

/// The open file a call's first try found at its fd, kept for the call's
/// later tries (an ENOSPC wait, a short write's second part), which run
/// unpinned: meanwhile another thread may close the fd and open another
/// file at its number, and the rest of the call must still go to the file
/// it started on, as Linux's write holds its file from `fdget` to `fdput`.
/// Counted only when a try did not finish the call, so a write done at
/// once adds no count to the file (no shared line between two threads'
/// writes through one description) — or when the call is big (see
/// `UNPINNED_IO`), which reads and writes too.
#[derive(Default)]
struct Held(std::cell::OnceCell<Arc<File>>);

/// From this many bytes a read or write holds a count on its file instead
/// of an epoch pin for the whole call: a pin held while hundreds of MiB
/// are copied kept every page retired anywhere meanwhile (this call's own
/// copy-on-write overwrites included) from being freed, and a 256 MiB
/// overwrite raised the peak resident memory by 258 MiB. Unpinned, the
/// filesystem's copy loop re-pins as it goes (`Pages::read`/`write`).
/// The count's shared write costs nothing next to a copy this long.
const UNPINNED_IO: usize = 256 << 10;

impl Held {
    /// Count the file at `fd` if the call moves `len` bytes or more.
    fn count_if_big(&self, t: &Task, fd: i32, len: usize) -> VfsResult<()> {
        if len >= UNPINNED_IO && self.0.get().is_none() {
            let g = epoch::pin();
            let f = t.io_file(fd, &g)?.clone();
            let _ = self.0.set(f);
        }
        Ok(())
    }

    /// A pin for the call when the file is not counted.
    fn pin(&self) -> Option<Guard> {
        self.0.get().is_none().then(epoch::pin)
    }

    /// The file to try on: the one kept, else the one at `fd` now (the
    /// caller pinned: `g` is `self.pin()`).
    fn file<'a>(&'a self, t: &Task, fd: i32, g: Option<&'a Guard>) -> VfsResult<&'a Arc<File>> {
        match (self.0.get(), g) {
            (Some(f), _) => Ok(f),
            (None, Some(g)) => t.io_file(fd, g),
            (None, None) => Err(Errno::EBADF),
        }
    }

    /// Pass `r` on, keeping `f` for another try unless `r` wrote all of
    /// the `want` bytes left.
    fn keep_unless_done(
        &self,
        f: &Arc<File>,
        r: VfsResult<(usize, bool)>,
        want: usize,
    ) -> VfsResult<(usize, bool)> {
        let done = match &r {
            Ok((n, _)) => *n >= want,
            Err(e) => *e != Errno::ENOSPC,
        };
        if !done {
            let _ = self.0.get_or_init(|| f.clone());
        }
        r
    }
}

/// `flock(2)` (the table and its rules: `flock.rs`).
impl Task {
    /// `flock(2)`: `op` is one of [`LOCK_SH`], [`LOCK_EX`], [`LOCK_UN`],
    /// optionally with [`LOCK_NB`], as Linux's. The lock belongs to the
    /// open file description (shared by dup and fork), is per inode (all
    /// hard links), and goes at `LOCK_UN` or when the description's last fd
    /// closes. A second request on a description converts its lock (the
    /// old one is dropped first, so a failed `LOCK_NB` conversion leaves
    /// none). Errors in Linux's order: an op with [`LOCK_MAND`] succeeds
    /// and does nothing; any other op but SH, EX or UN (with or without
    /// NB) is EINVAL; a closed or O_PATH fd is EBADF; a conflict with
    /// `LOCK_NB` is EWOULDBLOCK (`Errno::EAGAIN`). Without `LOCK_NB` a
    /// conflicting request sleeps until it can be granted.
    pub fn flock(&self, fd: i32, op: u32) -> VfsResult<()> {
        if op & LOCK_MAND != 0 {
            return Ok(());
        }
        let kind = match op & !LOCK_NB {
            LOCK_SH => Some(false),
            LOCK_EX => Some(true),
            LOCK_UN => None,
            _ => return Err(Errno::EINVAL),
        };
        // Counted, not borrowed under a pin: the call may sleep, and a
        // thread pinned that long would hold every deferred free back.
        let f = self.files().get_arc(fd)?;
        if f.is_path_only() {
            return Err(Errno::EBADF);
        }
        match kind {
            Some(exclusive) => crate::flock::lock(&f.flock_desc(), exclusive, op & LOCK_NB == 0),
            None => {
                crate::flock::unlock(&f.flock_desc());
                Ok(())
            }
        }
    }
}
