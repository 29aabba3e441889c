//! Data calls on open files: read, write, pread, pwrite, lseek, truncate,
//! fsync.
//!
//! LOCKING RULES
//! - `Inode::data_lock`: writers and truncate take it exclusive (so an
//!   O_APPEND write's "end of file" and its data land atomically); readers
//!   take it shared. It nests inside nothing of the namespace locks.
//! - `File::pos` is an atomic. lseek on a regular file takes no lock.

use std::sync::Arc;

use crossbeam_epoch as epoch;
use scalevfs_sync::primitive::Ordering;

use crate::errno::{Errno, VfsResult};
use crate::file::File;
use crate::types::*;
use crate::vfs::PathRef;
use crate::Task;

pub const SEEK_SET: u32 = 0;
pub const SEEK_CUR: u32 = 1;
pub const SEEK_END: u32 = 2;
pub const SEEK_DATA: u32 = 3;
pub const SEEK_HOLE: u32 = 4;

/// Truncate the inode at `p` to `size` (permissions already checked).
pub(crate) fn truncate_inode(p: &PathRef, size: u64) -> VfsResult<()> {
    let i = p.inode();
    if i.is_dir() {
        return Err(Errno::EISDIR);
    }
    if i.file_type() != FileType::Regular {
        return Err(Errno::EINVAL);
    }
    let fs = &p.mnt.sb.fs;
    if size > fs.max_file_size() || size > i64::MAX as u64 {
        return Err(Errno::EFBIG);
    }
    let _w = i.data_lock.write().unwrap_or_else(|e| e.into_inner());
    fs.truncate(i, size)
}

fn file_read(f: &File, off: u64, buf: &mut [u8]) -> VfsResult<usize> {
    let i = f.inode();
    if i.is_dir() {
        return Err(Errno::EISDIR);
    }
    let _r = i.data_lock.read().unwrap_or_else(|e| e.into_inner());
    f.path().mnt.sb.fs.read(i, off, buf)
}

fn file_write(f: &File, off: Option<u64>, buf: &[u8]) -> VfsResult<(usize, u64)> {
    let i = f.inode();
    let fs = &f.path().mnt.sb.fs;
    let _w = i.data_lock.write().unwrap_or_else(|e| e.into_inner());
    let off = match off {
        Some(o) => o,
        None => i.attr().size,
    };
    if off > fs.max_file_size() {
        return Err(Errno::EFBIG);
    }
    let room = (fs.max_file_size() - off).min(buf.len() as u64) as usize;
    if room == 0 && !buf.is_empty() {
        return Err(Errno::EFBIG);
    }
    let n = fs.write(i, off, &buf[..room])?;
    // Linux clears setuid/setgid on write by a non-owner; memfs leaves it.
    Ok((n, off + n as u64))
}

impl Task {
    fn readable(&self, fd: i32) -> VfsResult<Arc<File>> {
        let f = self.files().get_arc(fd)?;
        if !f.can_read() {
            return Err(Errno::EBADF);
        }
        Ok(f)
    }
    fn writable(&self, fd: i32) -> VfsResult<Arc<File>> {
        let f = self.files().get_arc(fd)?;
        if !f.can_write() {
            return Err(Errno::EBADF);
        }
        Ok(f)
    }

    /// `read(2)`.
    pub fn read(&self, fd: i32, buf: &mut [u8]) -> VfsResult<usize> {
        let f = self.readable(fd)?;
        let pos = f.position();
        let n = file_read(&f, pos, buf)?;
        // Relaxed: the position is a value.
        f.pos.store(pos + n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// `pread(2)`: no reference on the file, no shared write.
    pub fn pread(&self, fd: i32, buf: &mut [u8], off: i64) -> VfsResult<usize> {
        let g = epoch::pin();
        let f = self.files().get(fd, &g)?;
        if !f.can_read() {
            return Err(Errno::EBADF);
        }
        if off < 0 {
            return Err(Errno::EINVAL);
        }
        if matches!(f.inode().file_type(), FileType::Fifo | FileType::Socket) {
            return Err(Errno::ESPIPE);
        }
        file_read(f, off as u64, buf)
    }

    /// `write(2)`.
    pub fn write(&self, fd: i32, buf: &[u8]) -> VfsResult<usize> {
        let f = self.writable(fd)?;
        let at = if f.is_append() { None } else { Some(f.position()) };
        let (n, end) = file_write(&f, at, buf)?;
        // Relaxed: the position is a value.
        f.pos.store(end, Ordering::Relaxed);
        Ok(n)
    }

    /// `pwrite(2)` (O_APPEND files append, as on Linux).
    pub fn pwrite(&self, fd: i32, buf: &[u8], off: i64) -> VfsResult<usize> {
        let f = self.writable(fd)?;
        if off < 0 {
            return Err(Errno::EINVAL);
        }
        if matches!(f.inode().file_type(), FileType::Fifo | FileType::Socket) {
            return Err(Errno::ESPIPE);
        }
        let at = if f.is_append() { None } else { Some(off as u64) };
        Ok(file_write(&f, at, buf)?.0)
    }

    /// `lseek(2)`.
    pub fn lseek(&self, fd: i32, off: i64, whence: u32) -> VfsResult<u64> {
        let g = epoch::pin();
        let f = self.files().get(fd, &g)?;
        if f.is_path_only() {
            return Err(Errno::EBADF);
        }
        let i = f.inode();
        if matches!(i.file_type(), FileType::Fifo | FileType::Socket) {
            return Err(Errno::ESPIPE);
        }
        let new = match whence {
            SEEK_SET => off,
            SEEK_CUR => (f.position() as i64).checked_add(off).ok_or(Errno::EOVERFLOW)?,
            SEEK_END => (i.attr().size as i64).checked_add(off).ok_or(Errno::EOVERFLOW)?,
            SEEK_DATA | SEEK_HOLE => {
                if off < 0 {
                    return Err(Errno::ENXIO);
                }
                f.path().mnt.sb.fs.seek_data_hole(i, off as u64, whence == SEEK_DATA)? as i64
            }
            _ => return Err(Errno::EINVAL),
        };
        if new < 0 {
            return Err(Errno::EINVAL);
        }
        // Relaxed: the position is a value.
        f.pos.store(new as u64, Ordering::Relaxed);
        Ok(new as u64)
    }

    /// `ftruncate(2)`.
    pub fn ftruncate(&self, fd: i32, size: i64) -> VfsResult<()> {
        let f = self.files().get_arc(fd)?;
        if size < 0 {
            return Err(Errno::EINVAL);
        }
        if f.is_path_only() {
            return Err(Errno::EBADF);
        }
        if !f.can_write() {
            return Err(Errno::EINVAL);
        }
        if f.is_append() {
            return Err(Errno::EPERM);
        }
        truncate_inode(f.path(), size as u64)
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
        if !crate::inode::permission_ok(&i.attr(), self.cred(), W_OK) {
            return Err(Errno::EACCES);
        }
        if p.mnt.is_readonly() {
            return Err(Errno::EROFS);
        }
        truncate_inode(&p, size as u64)
    }

    /// `fsync(2)`.
    pub fn fsync(&self, fd: i32) -> VfsResult<()> {
        let f = self.files().get_arc(fd)?;
        if f.is_path_only() {
            return Err(Errno::EBADF);
        }
        f.path().mnt.sb.fs.fsync(f.inode(), false)
    }

    /// `fdatasync(2)`.
    pub fn fdatasync(&self, fd: i32) -> VfsResult<()> {
        let f = self.files().get_arc(fd)?;
        if f.is_path_only() {
            return Err(Errno::EBADF);
        }
        f.path().mnt.sb.fs.fsync(f.inode(), true)
    }
}
