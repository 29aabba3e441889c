//! Attribute changes of a [`Task`]: chmod, chown, utimensat and the inode
//! flags (`FS_IOC_GETFLAGS`/`SETFLAGS`), with Linux's permission rules and
//! order of checks.

use crossbeam_epoch as epoch;

use crate::errno::{Errno, VfsResult};
use crate::handle::At;
use crate::mount::PathRef;
use crate::task::{as_bytes, Task};
use crate::types::*;
use crate::xattr::{acl_chmod, encode_acl, POSIX_ACL_ACCESS};

impl Task {
    // ---------------------------------------------------------------
    // Attribute changes.
    // ---------------------------------------------------------------

    pub(crate) fn setattr_target<'a>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &[u8],
        flags: u32,
    ) -> VfsResult<PathRef> {
        if flags & !(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH) != 0 {
            return Err(Errno::EINVAL);
        }
        self.resolve(
            dirfd,
            path,
            flags & AT_SYMLINK_NOFOLLOW == 0,
            flags & AT_EMPTY_PATH != 0,
        )
    }

    /// Apply `set` to the inode at `p` and report the change (no lock is
    /// held here, so listeners run at once).
    pub(crate) fn setattr_and_report(&self, p: &PathRef, set: &SetAttr) -> VfsResult<()> {
        let i = p.inode();
        crate::caller::with(self.cred(), || p.mnt.sb.fs.setattr(i, set))?;
        self.changes().inode(i);
        Ok(())
    }

    pub(crate) fn is_owner(&self, a: &Attr) -> bool {
        self.cred.is_root() || self.cred.uid == a.uid
    }

    /// `fchmodat(2)`.
    pub fn fchmodat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        mode: u32,
        flags: u32,
    ) -> VfsResult<()> {
        let p = self.setattr_target(dirfd, as_bytes(path), flags)?;
        self.chmod_path(&p, mode)
    }

    pub fn chmod<P: AsRef<[u8]> + ?Sized>(&self, path: &P, mode: u32) -> VfsResult<()> {
        self.fchmodat(AT_FDCWD, path, mode, 0)
    }

    /// Clear the set-id bits of the file at `fd` (and its file
    /// capabilities) as a data change by `writer` would (Linux's
    /// `file_remove_privs`: setuid always, setgid with group-exec or for
    /// a writer outside the group, nothing for root), with this task's
    /// authority and no permission check: for a front end whose kernel
    /// decided the change (FUSE's emptied SETATTR of a non-owner's
    /// fallocate). Under the data lock, as every writer of the mode, so a
    /// racing chmod is not undone by a mode read before it. Whether
    /// anything changed.
    pub fn remove_privs_for<'a>(
        &self,
        fd: impl Into<At<'a>> + Copy,
        writer: &Cred,
    ) -> VfsResult<bool> {
        let p = self.held(fd)?;
        p.mnt.check_writable()?;
        if p.inode().file_type() != FileType::Regular {
            return Ok(false);
        }
        let _pin = epoch::pin();
        let _w = p.inode().data_lock.write();
        crate::fileops::remove_privs(&p, writer)
    }

    /// `fchmod(2)`.
    pub fn fchmod<'a>(&self, fd: impl Into<At<'a>> + Copy, mode: u32) -> VfsResult<()> {
        let p = self.held_open(fd)?;
        self.chmod_path(&p, mode)
    }

    /// `ioctl(fd, FS_IOC_GETFLAGS)`: the chattr flags (`FS_*_FL`). Any
    /// open file but O_PATH (EBADF); fifos, sockets and devices are ENOTTY
    /// (their ioctls are the driver's), as on tmpfs.
    pub fn ioctl_getflags(&self, fd: i32) -> VfsResult<u32> {
        let f = self.files.get_arc(fd)?;
        if f.is_path_only() {
            return Err(Errno::EBADF);
        }
        let i = f.inode();
        if !matches!(i.file_type(), FileType::Regular | FileType::Directory) {
            return Err(Errno::ENOTTY);
        }
        Ok(i.fs_flags())
    }

    /// `ioctl(fd, FS_IOC_SETFLAGS, &flags)`, in Linux's order: EROFS on a
    /// read-only mount, ENOTTY for a file that is not regular or a
    /// directory, EPERM unless owner or root, EPERM when a non-root
    /// task changes FS_IMMUTABLE_FL or FS_APPEND_FL (CAP_LINUX_IMMUTABLE),
    /// EOPNOTSUPP for a flag memfs does not keep (tmpfs's set). The ctime
    /// changes. Needs no write access to the file.
    pub fn ioctl_setflags(&self, fd: i32, flags: u32) -> VfsResult<()> {
        use crate::inode::{FS_APPEND_FL, FS_FL_SETTABLE, FS_IMMUTABLE_FL};
        let f = self.files.get_arc(fd)?;
        if f.is_path_only() {
            return Err(Errno::EBADF);
        }
        let i = f.inode();
        f.path().mnt.check_writable()?;
        // vfs_fileattr_set: no fileattr operation (fifos, sockets,
        // devices, symlinks) before the owner check.
        if !matches!(i.file_type(), FileType::Regular | FileType::Directory) {
            return Err(Errno::ENOTTY);
        }
        if !self.is_owner(&i.attr()) {
            return Err(Errno::EPERM);
        }
        // Under the data lock, so a write or truncate that checked the
        // flags finishes first (Linux holds the inode lock here).
        let _pin = epoch::pin();
        let _w = i.data_lock.write();
        let old = i.fs_flags();
        if (old ^ flags) & (FS_IMMUTABLE_FL | FS_APPEND_FL) != 0 && !self.cred.is_root() {
            return Err(Errno::EPERM);
        }
        if flags & !FS_FL_SETTABLE != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        let now = Timespec::now();
        f.path().mnt.sb.fs.set_fs_flags(i, flags, now)?;
        i.set_fs_flags(flags);
        i.update_attr(|a| a.set_ctime(now));
        drop(_w);
        self.changes().inode(i);
        Ok(())
    }

    pub(crate) fn chmod_path(&self, p: &PathRef, mode: u32) -> VfsResult<()> {
        let i = p.inode();
        p.mnt.check_writable()?;
        // notify_change: no mode change on an immutable or append-only file.
        if i.is_immutable() || i.is_append_only() {
            return Err(Errno::EPERM);
        }
        // notify_change: a symlink's mode never changes, however it was
        // reached (AT_SYMLINK_NOFOLLOW, an O_PATH fd with AT_EMPTY_PATH, a
        // handle), after EROFS and the flags' EPERM.
        if i.file_type() == FileType::Symlink {
            return Err(Errno::EOPNOTSUPP);
        }
        // Under the data lock, as every other writer of the mode (a write
        // dropping set-id bits, chown, an ACL set): each reads the mode and
        // stores a new one whole, and two of them unlocked could lose one
        // change (a write's cleared setuid bit undoing a chmod 0700 into
        // 0755). The attributes are read under it.
        let _pin = epoch::pin();
        let _w = i.data_lock.write();
        let a = i.attr();
        if !self.is_owner(&a) {
            return Err(Errno::EPERM);
        }
        let mut m = mode & 0o7777;
        if !self.cred.is_root() && !self.cred.in_group(a.gid) {
            m &= !S_ISGID;
        }
        let set = SetAttr {
            mode: Some(m),
            ctime: Some(Timespec::now()),
            ..Default::default()
        };
        crate::caller::with(self.cred(), || p.mnt.sb.fs.setattr(i, &set))?;
        // posix_acl_chmod: the stored access ACL takes the new bits.
        if i.flags() & crate::inode::I_ACL != 0 {
            if let Some(mut acl) = i.access_acl() {
                acl_chmod(&mut acl, m);
                p.mnt
                    .sb
                    .fs
                    .setxattr(i, POSIX_ACL_ACCESS, &encode_acl(&acl), 0)?;
                i.set_access_acl(Some(acl));
            }
        }
        drop(_w);
        self.changes().inode(i);
        Ok(())
    }

    /// `fchownat(2)`: `uid`/`gid` of `u32::MAX` (-1) leave that id alone.
    pub fn fchownat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        uid: u32,
        gid: u32,
        flags: u32,
    ) -> VfsResult<()> {
        let p = self.setattr_target(dirfd, as_bytes(path), flags)?;
        self.chown_path(&p, uid, gid)
    }

    pub fn chown<P: AsRef<[u8]> + ?Sized>(&self, path: &P, uid: u32, gid: u32) -> VfsResult<()> {
        self.fchownat(AT_FDCWD, path, uid, gid, 0)
    }

    /// `fchown(2)`.
    pub fn fchown<'a>(&self, fd: impl Into<At<'a>> + Copy, uid: u32, gid: u32) -> VfsResult<()> {
        let p = self.held_open(fd)?;
        self.chown_path(&p, uid, gid)
    }

    pub(crate) fn chown_path(&self, p: &PathRef, uid: u32, gid: u32) -> VfsResult<()> {
        let i = p.inode();
        p.mnt.check_writable()?;
        // Under the data lock, as chmod (see `chmod_path`): the set-id bits
        // it clears are computed from the mode read under it.
        let _pin = epoch::pin();
        let _w = i.data_lock.write();
        let a = i.attr();
        let uid = (uid != u32::MAX).then_some(uid);
        let gid = (gid != u32::MAX).then_some(gid);
        // notify_change: no owner change on an immutable or append-only file.
        if (uid.is_some() || gid.is_some()) && (i.is_immutable() || i.is_append_only()) {
            return Err(Errno::EPERM);
        }
        if !self.cred.is_root() {
            // chown_ok: only the owner may "change" the owner, and only to
            // itself (a non-owner naming the current owner is EPERM too).
            if let Some(u) = uid {
                if u != a.uid || self.cred.uid != a.uid {
                    return Err(Errno::EPERM);
                }
            }
            if let Some(g) = gid {
                if self.cred.uid != a.uid || (g != a.gid && !self.cred.in_group(g)) {
                    return Err(Errno::EPERM);
                }
            }
        }
        let mut set = SetAttr {
            uid,
            gid,
            ctime: Some(Timespec::now()),
            ..Default::default()
        };
        // Linux clears setuid of a non-directory on every chown, by root too
        // and for chown(f, -1, -1) too (chown_common's ATTR_KILL_SUID), and
        // setgid where `setattr_should_drop_sgid` says: with group-exec, or
        // when the caller is neither in the file's group nor root.
        if !i.is_dir() {
            let mut m = a.mode & 0o7777;
            m &= !S_ISUID;
            if m & 0o010 != 0 || (!self.cred.is_root() && !self.cred.in_group(a.gid)) {
                m &= !S_ISGID;
            }
            if m != a.mode & 0o7777 {
                // setattr_prepare: the bits chown_common clears are a mode
                // change, which needs ownership (a non-owner's chown(-1,
                // -1) of a set-id file is EPERM, not a way to clear its
                // bits).
                if !self.is_owner(&a) {
                    return Err(Errno::EPERM);
                }
                set.mode = Some(m);
            }
            // ATTR_KILL_PRIV: the file capabilities go on every chown of a
            // non-directory, by root too (cap_inode_killpriv), under the
            // data lock as a write removes them (`remove_privs`).
            if i.flags() & crate::inode::I_FCAPS != 0 {
                match p.mnt.sb.fs.removexattr(i, b"security.capability") {
                    Ok(()) | Err(Errno::ENODATA) => {}
                    Err(e) => return Err(e),
                }
                i.clear_flag(crate::inode::I_FCAPS);
            }
        }
        crate::caller::with(self.cred(), || p.mnt.sb.fs.setattr(i, &set))?;
        drop(_w);
        self.changes().inode(i);
        Ok(())
    }

    /// `utimensat(2)`: `times` of `None` sets both to now; a nanosecond of
    /// UTIME_NOW/UTIME_OMIT selects that behaviour per time.
    pub fn utimensat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        times: Option<[Timespec; 2]>,
        flags: u32,
    ) -> VfsResult<()> {
        if both_omitted(&times) {
            return Ok(());
        }
        check_times(&times)?;
        let p = self.setattr_target(dirfd, as_bytes(path), flags)?;
        self.utimens_path(&p, times)
    }

    /// `futimens(2)`.
    pub fn futimens<'a>(
        &self,
        fd: impl Into<At<'a>> + Copy,
        times: Option<[Timespec; 2]>,
    ) -> VfsResult<()> {
        if both_omitted(&times) {
            return Ok(());
        }
        // Linux's do_utimes checks the times before it looks at the fd.
        check_times(&times)?;
        let p = self.held_open(fd)?;
        self.utimens_path(&p, times)
    }

    pub(crate) fn utimens_path(&self, p: &PathRef, times: Option<[Timespec; 2]>) -> VfsResult<()> {
        let i = p.inode();
        let times = match times {
            Some([a, m]) if a.nsec == UTIME_OMIT && m.nsec == UTIME_OMIT => return Ok(()),
            Some([a, m]) if a.nsec == UTIME_NOW && m.nsec == UTIME_NOW => None,
            t => t,
        };
        p.mnt.check_writable()?;
        let a = i.attr();
        let now = Timespec::now();
        // notify_change: setting times is EPERM on an immutable or
        // append-only file; touching them (now) only on an immutable one.
        if i.is_immutable() || (times.is_some() && i.is_append_only()) {
            return Err(Errno::EPERM);
        }
        let set = match times {
            None => {
                if !self.is_owner(&a) && !i.permission_ok(&a, &self.cred, W_OK) {
                    return Err(Errno::EACCES);
                }
                SetAttr {
                    atime: Some(now),
                    mtime: Some(now),
                    ctime: Some(now),
                    ..Default::default()
                }
            }
            Some([at, mt]) => {
                if !self.is_owner(&a) {
                    return Err(Errno::EPERM);
                }
                // A time the filesystem cannot hold is clamped, as the
                // kernel's timestamp_truncate (`Filesystem::clamp_time`).
                let fs = &p.mnt.sb.fs;
                let pick = |t: Timespec| match t.nsec {
                    UTIME_OMIT => None,
                    UTIME_NOW => Some(now),
                    _ => Some(fs.clamp_time(t)),
                };
                SetAttr {
                    atime: pick(at),
                    mtime: pick(mt),
                    ctime: Some(now),
                    ..Default::default()
                }
            }
        };
        self.setattr_and_report(p, &set)
    }
}

/// Both times UTIME_OMIT: Linux's utimensat returns 0 before it looks at
/// the path, the descriptor or the flags ("Nothing to do, we must not even
/// check the path"; utimensat(2): it succeeds even where the file does not
/// exist).
fn both_omitted(times: &Option<[Timespec; 2]>) -> bool {
    times.is_some_and(|t| t.iter().all(|ts| ts.nsec == UTIME_OMIT))
}

/// utimensat's EINVAL: a nanosecond field outside 0..1e9 that is neither
/// UTIME_NOW nor UTIME_OMIT.
fn check_times(times: &Option<[Timespec; 2]>) -> VfsResult<()> {
    if let Some(t) = times {
        for ts in t {
            let special = ts.nsec == UTIME_NOW || ts.nsec == UTIME_OMIT;
            if !special && !(0..1_000_000_000).contains(&ts.nsec) {
                return Err(Errno::EINVAL);
            }
        }
    }
    Ok(())
}
