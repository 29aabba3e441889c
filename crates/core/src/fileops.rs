//! What the data calls do to an open file and an inode, below the `Task`:
//! Linux's `rw_verify_area`, the privilege bits a write or truncate drops
//! (`file_remove_privs`), truncating an inode with its orphan record,
//! atime, and the read and write of an open file through its filesystem.
//! The calls themselves (read, write, lseek, ...) are `Task` methods in
//! `io.rs`; `task.rs` truncates for `O_TRUNC` through here.

use crossbeam_epoch as epoch;

use crate::errno::{Errno, VfsResult};
use crate::file::File;
use crate::mount::PathRef;
use crate::orphan::TruncateGuard;
use crate::types::*;

/// Linux's MAX_RW_COUNT: one call moves at most this many bytes.
pub(crate) const MAX_RW_COUNT: usize = (i32::MAX as usize) & !(4096 - 1);

/// Linux's `rw_verify_area` for a regular file: `pos + count` must fit.
pub(crate) fn verify_area(pos: u64, count: usize) -> VfsResult<()> {
    if pos > i64::MAX as u64 || (pos as i64).checked_add(count as i64).is_none() {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

pub(crate) fn is_pipe_like(t: FileType) -> bool {
    matches!(t, FileType::Fifo | FileType::Socket)
}

/// Linux's `setattr_should_drop_suidgid` for a data change (write,
/// truncate, fallocate) by `cred`: the permission bits the file should have
/// instead, or `None` to leave them. Only regular files lose anything;
/// CAP_FSETID (root) keeps both bits. setuid always goes; setgid goes when
/// group-execute is set or the writer is not in the file's group
/// (`setattr_should_drop_sgid`).
pub(crate) fn privs_to_drop(a: &Attr, cred: &Cred) -> Option<u32> {
    if a.mode & (S_ISUID | S_ISGID) == 0 || a.mode & S_IFMT != S_IFREG || cred.is_root() {
        return None;
    }
    let mut m = a.mode & 0o7777 & !S_ISUID;
    if m & S_ISGID != 0 && (m & 0o010 != 0 || !cred.in_group(a.gid)) {
        m &= !S_ISGID;
    }
    (m != a.mode & 0o7777).then_some(m)
}

/// Linux's `file_remove_privs`: remove the file's `security.capability`
/// (whoever writes) and clear setuid/setgid (see `privs_to_drop`) before
/// `cred` changes the data of the inode at `p`. Returns whether anything
/// changed.
pub(crate) fn remove_privs(p: &PathRef, cred: &Cred) -> VfsResult<bool> {
    let i = p.inode();
    // File capabilities go whoever writes (cap_inode_killpriv: also root,
    // as on tmpfs). The caller holds the data lock, which setxattr takes to
    // set the flag.
    let mut caps = false;
    if i.flags() & crate::inode::I_FCAPS != 0 {
        match p.mnt.sb.fs.removexattr(i, b"security.capability") {
            Ok(()) => caps = true,
            Err(Errno::ENODATA) => {}
            Err(e) => return Err(e),
        }
        i.clear_flag(crate::inode::I_FCAPS);
    }
    // Fast path for every write (Linux's IS_NOSEC): no set-id bit, no
    // seqlock read.
    if i.mode_hint() & (S_ISUID | S_ISGID) == 0 {
        return Ok(caps);
    }
    let Some(m) = privs_to_drop(&i.attr(), cred) else {
        return Ok(caps);
    };
    let set = SetAttr {
        mode: Some(m),
        ctime: Some(Timespec::now()),
        ..Default::default()
    };
    p.mnt.sb.fs.setattr(i, &set)?;
    Ok(true)
}

/// Truncate the inode at `p` to `size` (permissions already checked) on
/// behalf of `cred` (setuid/setgid dropped as Linux's do_truncate does). The
/// inode is on the orphan file while a shrinking truncate runs.
pub(crate) fn truncate_inode(p: &PathRef, size: u64, cred: &Cred) -> VfsResult<()> {
    let i = p.inode();
    if i.is_dir() {
        return Err(Errno::EISDIR);
    }
    if i.file_type() != FileType::Regular {
        return Err(Errno::EINVAL);
    }
    let fs = &p.mnt.sb.fs;
    if size > fs.max_file_size_of(i) || size > i64::MAX as u64 {
        return Err(Errno::EFBIG);
    }
    // Counted busy and written while it runs (see `file_write`).
    let _ww = p.mnt.want_write()?;
    let _pin = epoch::pin();
    let _w = i.data_lock.write();
    remove_privs(p, cred)?;
    let _orphan = if size < i.attr().size {
        TruncateGuard::new(&p.mnt.sb.orphans, i)
    } else {
        None
    };
    crate::caller::with(cred, || fs.truncate(i, size))
}

/// relatime: update atime only when it is not newer than mtime or ctime, so
/// repeated reads write nothing and call no clock; and, as Linux's
/// `atime_needs_update`, not when it already equals the current (coarse)
/// time, so reads in the tick of a write write nothing either.
pub(crate) fn touch_atime(f: &File) {
    let i = f.inode();
    if f.flags() & O_NOATIME != 0
        || f.path().mnt.is_readonly()
        || f.path().mnt.is_noatime()
        || i.fs_flags() & crate::inode::FS_NOATIME_FL != 0
    {
        return;
    }
    let a = i.attr();
    if a.atime() <= a.mtime() || a.atime() <= a.ctime() {
        let now = Timespec::now();
        if a.atime() != now {
            // Through the filesystem, which keeps it (ext4 writes the inode,
            // as the kernel's mark_inode_dirty does; memfs sets the
            // attribute). A failure to record an access time fails no
            // read, as in Linux's touch_atime.
            let set = crate::types::SetAttr {
                atime: Some(now),
                ..Default::default()
            };
            let _ = f.path().mnt.sb.fs.setattr(i, &set);
        }
    }
}

/// Take the inode's data lock exclusively and record it in the lock
/// statistics (the `locked-llseek` variant: two shared-line writes, lock and
/// unlock, and a contended acquisition when it had to wait).
pub(crate) fn lock_data_counted(
    i: &crate::inode::Inode,
) -> scalevfs_sync::ordered::BrWriteGuard<'_> {
    use scalevfs_sync::lockstat::{self, LockClass, Stat};
    let (g, contended) = match i.data_lock.try_write() {
        Some(g) => (g, false),
        None => (i.data_lock.write(), true),
    };
    lockstat::lock_acquired(LockClass::InodeData, contended, 0);
    lockstat::add(Stat::SharedWrite, 2);
    g
}

pub(crate) fn file_read(f: &File, off: u64, buf: &mut [u8]) -> VfsResult<usize> {
    let i = f.inode();
    if i.is_dir() {
        return Err(Errno::EISDIR);
    }
    let n = f.path().mnt.sb.fs.read(i, off, buf)?;
    touch_atime(f);
    Ok(n)
}

/// Write at `off` (`None`: at end of file, O_APPEND). Returns bytes written
/// and the position after them.
pub(crate) fn file_write(
    f: &File,
    off: Option<u64>,
    buf: &[u8],
    cred: &Cred,
) -> VfsResult<(usize, u64)> {
    let i = f.inode();
    if i.is_dir() {
        return Err(Errno::EISDIR);
    }
    // The mount counted busy and written while this write runs (a close
    // of the fd by another thread does not end that: `want_write`).
    let _ww = if i.file_type() == FileType::Regular {
        Some(f.path().mnt.want_write()?)
    } else {
        None
    };
    let fs = &f.path().mnt.sb.fs;
    // A positioned overwrite that changes no size or allocation runs
    // beside others of the same file, under the data lock shared, if the
    // filesystem can do it (`Filesystem::write_shared`; memfs: inside one
    // existing page) and the write has no privileges to remove: no
    // capability flag (set under the data lock exclusive, so stable under
    // the shared side) and no set-id bit, both checked again under the
    // lock. (chmod stores the mode under the data lock exclusive, so the
    // bits cannot change while a shared writer holds it.)
    if let Some(o) = off {
        let no_privs =
            || i.flags() & crate::inode::I_FCAPS == 0 && i.mode_hint() & (S_ISUID | S_ISGID) == 0;
        if !buf.is_empty() && buf.len() <= MAX_RW_COUNT && no_privs() {
            let _r = i.data_lock.read();
            if no_privs() {
                if let Some(r) = fs.write_shared(i, o, buf) {
                    let n = r?;
                    return Ok((n, o + n as u64));
                }
            }
        }
    }
    let _w = i.data_lock.write();
    let off = match off {
        Some(o) => o,
        None => i.attr().size,
    };
    if buf.is_empty() {
        return Ok((0, off));
    }
    // generic_write_checks: EFBIG at or past the limit, else a short write.
    let max = fs.max_file_size_of(i).min(i64::MAX as u64);
    if off >= max {
        return Err(Errno::EFBIG);
    }
    let room = (max - off).min(buf.len().min(MAX_RW_COUNT) as u64) as usize;
    // After generic_write_checks, as Linux's __generic_file_write_iter.
    remove_privs(f.path(), cred)?;
    let n = crate::caller::with(cred, || fs.write(i, off, &buf[..room]))?;
    Ok((n, off + n as u64))
}

/// Total length of an iovec (`IOV_MAX` entries at most, no overflow), as
/// readv/writev check it.
pub(crate) fn iov_total(mut lens: impl Iterator<Item = usize>, count: usize) -> VfsResult<usize> {
    if count > 1024 {
        return Err(Errno::EINVAL);
    }
    let total = lens
        .try_fold(0usize, |a, l| a.checked_add(l))
        .ok_or(Errno::EINVAL)?;
    if total > isize::MAX as usize {
        return Err(Errno::EINVAL);
    }
    Ok(total)
}
