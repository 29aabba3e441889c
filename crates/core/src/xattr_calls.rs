//! The `*xattr` calls of a [`Task`] (get, list, set, remove; the path,
//! `l`, `f` and `*at` forms): Linux's `xattr_permission` rules and the
//! dispatch to the filesystem. The names, name spaces, ACL format and
//! memfs's store are in `xattr.rs`, below the filesystems; this file is
//! above `Task`.

use crossbeam_epoch as epoch;

use crate::errno::{Errno, VfsResult};
use crate::handle::At;
use crate::inode::Inode;
use crate::mount::PathRef;
use crate::task::Task;
use crate::types::*;
use crate::xattr::*;

// ---------------------------------------------------------------------
// Task calls
// ---------------------------------------------------------------------

fn as_bytes<P: AsRef<[u8]> + ?Sized>(p: &P) -> &[u8] {
    p.as_ref()
}

impl Task {
    /// The file an xattr call names: a path (`follow`: the `l` variants do
    /// not) or, with `AT_EMPTY_PATH` and an empty path, `dirfd` itself (an
    /// O_PATH fd too, as for Linux's `getxattrat`).
    fn xattr_target<'a>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &[u8],
        at_flags: u32,
    ) -> VfsResult<PathRef> {
        if at_flags & !(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH) != 0 {
            return Err(Errno::EINVAL);
        }
        self.resolve(
            dirfd,
            path,
            at_flags & AT_SYMLINK_NOFOLLOW == 0,
            at_flags & AT_EMPTY_PATH != 0,
        )
    }

    /// The file of an open fd; an O_PATH fd is EBADF, as for `f*xattr`.
    fn xattr_fd(&self, fd: i32) -> VfsResult<PathRef> {
        let f = self.files().get_arc(fd)?;
        if f.is_path_only() {
            return Err(Errno::EBADF);
        }
        Ok(f.path().clone())
    }

    /// `xattr_permission`: the VFS's checks for `name` with `mask` (read
    /// or write).
    fn xattr_permission(&self, i: &Inode, name: &[u8], mask: u32) -> VfsResult<()> {
        let cred = self.cred();
        if mask & MAY_WRITE != 0 && (i.is_immutable() || i.is_append_only()) {
            return Err(Errno::EPERM);
        }
        let denied = if mask & MAY_WRITE != 0 {
            Errno::EPERM
        } else {
            Errno::ENODATA
        };
        let a = i.attr();
        match XattrNs::of(name) {
            XattrNs::Trusted => {
                return if cred.is_root() { Ok(()) } else { Err(denied) };
            }
            XattrNs::Security | XattrNs::Acl { .. } => return Ok(()),
            _ if name.starts_with(b"system.") => return Ok(()),
            XattrNs::User => {
                if !matches!(i.file_type(), FileType::Regular | FileType::Directory) {
                    return Err(denied);
                }
                if i.is_dir()
                    && a.mode & S_ISVTX != 0
                    && mask & MAY_WRITE != 0
                    && !(cred.is_root() || cred.uid == a.uid)
                {
                    return Err(Errno::EPERM);
                }
            }
            _ => {}
        }
        if i.permission_ok(&a, cred, mask) {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    // ---- get ----

    /// `getxattr` with a dirfd and `AT_SYMLINK_NOFOLLOW`/`AT_EMPTY_PATH`
    /// (Linux 6.13's `getxattrat`). Copies the value into `buf` and
    /// returns its length; an empty `buf` asks for the length only; a
    /// value longer than `buf` is ERANGE.
    pub fn getxattrat<'a, P: AsRef<[u8]> + ?Sized, N: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        at_flags: u32,
        name: &N,
        buf: &mut [u8],
    ) -> VfsResult<usize> {
        let name = as_bytes(name);
        check_name(name)?;
        let p = self.xattr_target(dirfd, as_bytes(path), at_flags)?;
        self.getxattr_path(&p, name, buf)
    }

    /// `getxattr(2)`: follows a final symlink.
    pub fn getxattr<P: AsRef<[u8]> + ?Sized, N: AsRef<[u8]> + ?Sized>(
        &self,
        path: &P,
        name: &N,
        buf: &mut [u8],
    ) -> VfsResult<usize> {
        self.getxattrat(AT_FDCWD, path, 0, name, buf)
    }

    /// `lgetxattr(2)`: a final symlink's own attributes.
    pub fn lgetxattr<P: AsRef<[u8]> + ?Sized, N: AsRef<[u8]> + ?Sized>(
        &self,
        path: &P,
        name: &N,
        buf: &mut [u8],
    ) -> VfsResult<usize> {
        self.getxattrat(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, name, buf)
    }

    /// `fgetxattr(2)`.
    pub fn fgetxattr<N: AsRef<[u8]> + ?Sized>(
        &self,
        fd: i32,
        name: &N,
        buf: &mut [u8],
    ) -> VfsResult<usize> {
        let name = as_bytes(name);
        check_name(name)?;
        let p = self.xattr_fd(fd)?;
        self.getxattr_path(&p, name, buf)
    }

    /// The whole value of `name` (no size protocol): a convenience over
    /// `getxattrat`.
    pub fn xattr_value<P: AsRef<[u8]> + ?Sized, N: AsRef<[u8]> + ?Sized>(
        &self,
        path: &P,
        name: &N,
        at_flags: u32,
    ) -> VfsResult<Vec<u8>> {
        let name = as_bytes(name);
        check_name(name)?;
        let p = self.xattr_target(AT_FDCWD, as_bytes(path), at_flags)?;
        self.xattr_get_inner(&p, name)
    }

    fn xattr_get_inner(&self, p: &PathRef, name: &[u8]) -> VfsResult<Vec<u8>> {
        let i = p.inode();
        self.xattr_permission(i, name, MAY_READ)?;
        let ns = XattrNs::of(name);
        ns.resolve(name)?;
        if let XattrNs::Acl { .. } = ns {
            // get_posix_acl (Linux >= 6.2): a symlink has no get_acl.
            if i.file_type() == FileType::Symlink {
                return Err(Errno::EOPNOTSUPP);
            }
        }
        p.mnt.sb().fs.getxattr(i, name)
    }

    pub(crate) fn getxattr_path(
        &self,
        p: &PathRef,
        name: &[u8],
        buf: &mut [u8],
    ) -> VfsResult<usize> {
        let v = self.xattr_get_inner(p, name)?;
        if buf.is_empty() {
            return Ok(v.len());
        }
        if v.len() > buf.len() {
            return Err(Errno::ERANGE);
        }
        buf[..v.len()].copy_from_slice(&v);
        Ok(v.len())
    }

    // ---- list ----

    /// `listxattr` with a dirfd and flags (`listxattrat`): the names, each
    /// ending in NUL, into `buf`; returns the length. An empty `buf` asks
    /// for the length; a short one is ERANGE (E2BIG when it is already
    /// XATTR_LIST_MAX long). `trusted.*` names are listed to root only.
    pub fn listxattrat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        at_flags: u32,
        buf: &mut [u8],
    ) -> VfsResult<usize> {
        let p = self.xattr_target(dirfd, as_bytes(path), at_flags)?;
        self.listxattr_path(&p, buf)
    }

    /// `listxattr(2)`.
    pub fn listxattr<P: AsRef<[u8]> + ?Sized>(&self, path: &P, buf: &mut [u8]) -> VfsResult<usize> {
        self.listxattrat(AT_FDCWD, path, 0, buf)
    }

    /// `llistxattr(2)`.
    pub fn llistxattr<P: AsRef<[u8]> + ?Sized>(
        &self,
        path: &P,
        buf: &mut [u8],
    ) -> VfsResult<usize> {
        self.listxattrat(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, buf)
    }

    /// `flistxattr(2)`.
    pub fn flistxattr(&self, fd: i32, buf: &mut [u8]) -> VfsResult<usize> {
        let p = self.xattr_fd(fd)?;
        self.listxattr_path(&p, buf)
    }

    /// The names as a list (no size protocol).
    pub fn xattr_names<P: AsRef<[u8]> + ?Sized>(
        &self,
        path: &P,
        at_flags: u32,
    ) -> VfsResult<Vec<Vec<u8>>> {
        let p = self.xattr_target(AT_FDCWD, as_bytes(path), at_flags)?;
        self.xattr_list_inner(&p)
    }

    fn xattr_list_inner(&self, p: &PathRef) -> VfsResult<Vec<Vec<u8>>> {
        let mut names = p.mnt.sb().fs.listxattr(p.inode())?;
        if !self.cred().is_root() {
            names.retain(|n| XattrNs::of(n) != XattrNs::Trusted);
        }
        Ok(names)
    }

    pub(crate) fn listxattr_path(&self, p: &PathRef, buf: &mut [u8]) -> VfsResult<usize> {
        let names = self.xattr_list_inner(p)?;
        let len: usize = names.iter().map(|n| n.len() + 1).sum();
        if buf.is_empty() {
            return Ok(len);
        }
        // Linux reads at most XATTR_LIST_MAX bytes whatever the buffer.
        let cap = buf.len().min(XATTR_LIST_MAX);
        if len > cap {
            return Err(if cap >= XATTR_LIST_MAX {
                Errno::E2BIG
            } else {
                Errno::ERANGE
            });
        }
        let mut at = 0;
        for n in &names {
            buf[at..at + n.len()].copy_from_slice(n);
            buf[at + n.len()] = 0;
            at += n.len() + 1;
        }
        Ok(len)
    }

    // ---- set ----

    /// `setxattr` with a dirfd and flags (`setxattrat`). `flags`:
    /// XATTR_CREATE (EEXIST if present) or XATTR_REPLACE (ENODATA if
    /// absent). The ctime changes.
    pub fn setxattrat<'a, P: AsRef<[u8]> + ?Sized, N: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        at_flags: u32,
        name: &N,
        value: &[u8],
        flags: u32,
    ) -> VfsResult<()> {
        let name = as_bytes(name);
        check_set_args(name, value, flags)?;
        let p = self.xattr_target(dirfd, as_bytes(path), at_flags)?;
        self.setxattr_path(&p, name, value, flags)
    }

    /// `setxattr(2)`.
    pub fn setxattr<P: AsRef<[u8]> + ?Sized, N: AsRef<[u8]> + ?Sized>(
        &self,
        path: &P,
        name: &N,
        value: &[u8],
        flags: u32,
    ) -> VfsResult<()> {
        self.setxattrat(AT_FDCWD, path, 0, name, value, flags)
    }

    /// `lsetxattr(2)`.
    pub fn lsetxattr<P: AsRef<[u8]> + ?Sized, N: AsRef<[u8]> + ?Sized>(
        &self,
        path: &P,
        name: &N,
        value: &[u8],
        flags: u32,
    ) -> VfsResult<()> {
        self.setxattrat(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, name, value, flags)
    }

    /// `fsetxattr(2)`.
    pub fn fsetxattr<N: AsRef<[u8]> + ?Sized>(
        &self,
        fd: i32,
        name: &N,
        value: &[u8],
        flags: u32,
    ) -> VfsResult<()> {
        let name = as_bytes(name);
        check_set_args(name, value, flags)?;
        let p = self.xattr_fd(fd)?;
        self.setxattr_path(&p, name, value, flags)
    }

    pub(crate) fn setxattr_path(
        &self,
        p: &PathRef,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> VfsResult<()> {
        self.xattr_change(p, name, Some((value, flags)))
    }

    // ---- remove ----

    /// `removexattr` with a dirfd and flags (`removexattrat`). ENODATA if
    /// absent; the ctime changes.
    pub fn removexattrat<'a, P: AsRef<[u8]> + ?Sized, N: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        at_flags: u32,
        name: &N,
    ) -> VfsResult<()> {
        let name = as_bytes(name);
        check_name(name)?;
        let p = self.xattr_target(dirfd, as_bytes(path), at_flags)?;
        self.removexattr_path(&p, name)
    }

    /// `removexattr(2)`.
    pub fn removexattr<P: AsRef<[u8]> + ?Sized, N: AsRef<[u8]> + ?Sized>(
        &self,
        path: &P,
        name: &N,
    ) -> VfsResult<()> {
        self.removexattrat(AT_FDCWD, path, 0, name)
    }

    /// `lremovexattr(2)`.
    pub fn lremovexattr<P: AsRef<[u8]> + ?Sized, N: AsRef<[u8]> + ?Sized>(
        &self,
        path: &P,
        name: &N,
    ) -> VfsResult<()> {
        self.removexattrat(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, name)
    }

    /// `fremovexattr(2)`.
    pub fn fremovexattr<N: AsRef<[u8]> + ?Sized>(&self, fd: i32, name: &N) -> VfsResult<()> {
        let name = as_bytes(name);
        check_name(name)?;
        let p = self.xattr_fd(fd)?;
        self.removexattr_path(&p, name)
    }

    pub(crate) fn removexattr_path(&self, p: &PathRef, name: &[u8]) -> VfsResult<()> {
        self.xattr_change(p, name, None)
    }

    /// A set (`Some((value, flags))`) or a remove (`None`), in Linux's
    /// order of checks.
    /// Set or remove an attribute. Out of space, it runs again after this
    /// thread's deferred frees (`redo_enospc`): a file removed just
    /// before gives back its attribute block a grace period later, where
    /// the kernel's unlink frees it at once (the random kernel
    /// differential, seed 348 at 1 KiB).
    fn xattr_change(&self, p: &PathRef, name: &[u8], set: Option<(&[u8], u32)>) -> VfsResult<()> {
        Self::redo_enospc(|| self.xattr_change_once(p, name, set))
    }

    fn xattr_change_once(
        &self,
        p: &PathRef,
        name: &[u8],
        set: Option<(&[u8], u32)>,
    ) -> VfsResult<()> {
        let i = p.inode();
        p.mnt.check_writable()?;
        // Under the data lock: chattr (which takes it too) cannot make the
        // inode immutable between the check and the change, and writers
        // of one inode's attributes are serialised (memfs's store relies
        // on it).
        let _pin = epoch::pin();
        let w = i.data_lock.write();
        self.xattr_permission(i, name, MAY_WRITE)?;
        let ns = XattrNs::of(name);
        // cap_inode_setxattr / cap_inode_removexattr.
        if ns == XattrNs::Security && !self.cred().is_root() {
            return Err(Errno::EPERM);
        }
        ns.resolve(name)?;
        let fs = &p.mnt.sb().fs;
        let mut new_mode = None;
        match (ns, set) {
            // set_posix_acl: setting and removing alike are the owner's
            // (or root's), never on a symlink, and take no
            // XATTR_CREATE/REPLACE (Linux ignores them for ACLs; removing
            // an ACL the file lacks succeeds).
            (XattrNs::Acl { default }, set) => {
                // Linux's order: the value's format (posix_acl_from_xattr;
                // an empty value is no ACL: removal), the symlink, a default
                // ACL on a non-directory, the owner, then posix_acl_valid.
                let acl = match set {
                    Some((value, _)) if !value.is_empty() => parse_acl_format(value)?,
                    _ => None,
                };
                if i.file_type() == FileType::Symlink {
                    return Err(Errno::EOPNOTSUPP);
                }
                if default && !i.is_dir() {
                    return if acl.is_some() {
                        Err(Errno::EACCES)
                    } else {
                        Ok(())
                    };
                }
                let a = i.attr();
                if !(self.cred().is_root() || self.cred().uid == a.uid) {
                    return Err(Errno::EPERM);
                }
                if let Some(acl) = &acl {
                    validate_acl(acl)?;
                }
                let store = match &acl {
                    // posix_acl_update_mode with no ACL: the mode stays, but
                    // setgid goes for an owner outside the file's group.
                    None if !default => {
                        let m = a.mode & 0o7777;
                        if m & S_ISGID != 0
                            && !self.cred().is_root()
                            && !self.cred().in_group(a.gid)
                        {
                            new_mode = Some(m & !S_ISGID);
                        }
                        None
                    }
                    None => None,
                    Some(acl) if !default => {
                        // posix_acl_update_mode.
                        let (perm, equiv) = acl_mode(acl);
                        let mut m = (a.mode & 0o7000) | perm;
                        if !self.cred().is_root() && !self.cred().in_group(a.gid) {
                            m &= !S_ISGID;
                        }
                        new_mode = Some(m);
                        (!equiv).then(|| encode_acl(acl))
                    }
                    Some(acl) => Some(encode_acl(acl)),
                };
                let stored = store.is_some();
                match store {
                    Some(v) => crate::caller::with(self.cred(), || fs.setxattr(i, name, &v, 0))?,
                    None => match fs.removexattr(i, name) {
                        Ok(()) | Err(Errno::ENODATA) => {}
                        Err(e) => return Err(e),
                    },
                }
                // The cache follows the stored copy (under the data lock).
                if default {
                    i.mark_default_acl(stored);
                } else {
                    i.set_access_acl(if stored { acl } else { None });
                }
            }
            (_, Some((value, flags))) => {
                crate::caller::with(self.cred(), || fs.setxattr(i, name, value, flags))?;
                if name == b"security.capability" {
                    i.set_flag(crate::inode::I_FCAPS);
                }
            }
            (_, None) => {
                // A shared xattr block is copied before it changes.
                crate::caller::with(self.cred(), || fs.removexattr(i, name))?;
            }
        }
        let set = SetAttr {
            mode: new_mode,
            ctime: Some(Timespec::now()),
            ..Default::default()
        };
        fs.setattr(i, &set)?;
        drop(w);
        self.changes().inode(i);
        Ok(())
    }
}

/// The checks on `setxattr`'s arguments that come before the path lookup.
fn check_set_args(name: &[u8], value: &[u8], flags: u32) -> VfsResult<()> {
    if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
        return Err(Errno::EINVAL);
    }
    check_name(name)?;
    if value.len() > XATTR_SIZE_MAX {
        return Err(Errno::E2BIG);
    }
    Ok(())
}
