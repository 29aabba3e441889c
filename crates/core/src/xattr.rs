//! Extended attributes: the `*xattr` calls of a [`Task`], Linux's name
//! spaces and permission rules, POSIX ACL validation, and the store memfs
//! keeps per inode (a skip list read without locks).
//!
//! What the VFS decides (as `fs/xattr.c` does) and what the filesystem
//! stores: names are checked here (empty or over 255 bytes: ERANGE; values
//! over 64 KiB: E2BIG), then `xattr_permission`'s rules (immutable or
//! append-only: EPERM for a change; `trusted.*` needs root: EPERM to change,
//! ENODATA to read; `user.*` only on regular files and directories: EPERM to
//! change, ENODATA to read, and not on someone else's sticky directory;
//! `user.*` and unknown names need read or write permission on the inode),
//! then the capability rule for `security.*` (root to change), then the
//! name space: `user.`, `trusted.`, `security.` with a non-empty rest, and
//! `system.posix_acl_access`/`_default`; anything else is EOPNOTSUPP.
//! Writes take the inode's data lock exclusively (serialising them with
//! each other and with chattr, as Linux's inode lock does); reads take no
//! lock.
//!
//! POSIX ACLs are stored and returned, in the `posix_acl_xattr` format
//! (version 2, then 8-byte entries); a value that is not a valid ACL is
//! EINVAL (EOPNOTSUPP for another version, as Linux). Setting the access ACL updates the mode's permission bits as
//! Linux does (an ACL the mode says in full is not stored at all). ACLs are
//! not enforced (permission checks read the mode only), a chmod does not
//! rewrite a stored access ACL, and a default ACL is not inherited by new
//! files: those come later.

use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Atomic, Owned};
use crossbeam_skiplist::SkipMap;
use scalevfs_sync::primitive::{AtomicU64, Ordering};

use crate::errno::{Errno, VfsResult};
use crate::handle::At;
use crate::inode::{permission_ok, Inode};
use crate::task::Task;
use crate::types::*;
use crate::vfs::PathRef;

/// `setxattr` flag: fail with EEXIST if the attribute exists.
pub const XATTR_CREATE: u32 = 1;
/// `setxattr` flag: fail with ENODATA unless the attribute exists.
pub const XATTR_REPLACE: u32 = 2;
/// Longest name, prefix included (Linux's XATTR_NAME_MAX).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest value (XATTR_SIZE_MAX).
pub const XATTR_SIZE_MAX: usize = 65536;
/// Largest name list `listxattr` returns (XATTR_LIST_MAX).
pub const XATTR_LIST_MAX: usize = 65536;

/// The access ACL's name.
pub const POSIX_ACL_ACCESS: &[u8] = b"system.posix_acl_access";
/// The default ACL's name (directories only).
pub const POSIX_ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

const MAY_READ: u32 = 4;
const MAY_WRITE: u32 = 2;

/// The name spaces the VFS knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrNs {
    User,
    Trusted,
    Security,
    /// `system.posix_acl_access` or `system.posix_acl_default`.
    Acl {
        default: bool,
    },
    /// Any other name (`system.foo`, `foo.bar`): EOPNOTSUPP once the
    /// permission checks pass.
    Unknown,
}

impl XattrNs {
    /// The name space of a full name.
    pub fn of(name: &[u8]) -> XattrNs {
        if name.starts_with(b"user.") {
            XattrNs::User
        } else if name.starts_with(b"trusted.") {
            XattrNs::Trusted
        } else if name.starts_with(b"security.") {
            XattrNs::Security
        } else if name == POSIX_ACL_ACCESS {
            XattrNs::Acl { default: false }
        } else if name == POSIX_ACL_DEFAULT {
            XattrNs::Acl { default: true }
        } else {
            XattrNs::Unknown
        }
    }

    /// `xattr_resolve_name`: EOPNOTSUPP for an unknown prefix, EINVAL for
    /// a known prefix with nothing after it.
    fn resolve(self, name: &[u8]) -> VfsResult<()> {
        let prefix = match self {
            XattrNs::User => 5,
            XattrNs::Trusted => 8,
            XattrNs::Security => 9,
            XattrNs::Acl { .. } => return Ok(()),
            XattrNs::Unknown => return Err(Errno::EOPNOTSUPP),
        };
        if name.len() == prefix {
            return Err(Errno::EINVAL);
        }
        Ok(())
    }
}

/// The checks on a name that come before the path lookup.
fn check_name(name: &[u8]) -> VfsResult<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX || name.contains(&0) {
        return Err(Errno::ERANGE);
    }
    Ok(())
}

// ---------------------------------------------------------------------
// POSIX ACLs (the xattr format of include/uapi/linux/posix_acl_xattr.h)
// ---------------------------------------------------------------------

const ACL_VERSION: u32 = 2;
const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;
const ACL_UNDEFINED_ID: u32 = u32::MAX;

/// One ACL entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// Parse and validate an ACL in xattr form (`posix_acl_from_xattr` then
/// `posix_acl_valid`): `Ok(None)` for an empty ACL (a header only), which
/// means "no ACL". EOPNOTSUPP for another version; EINVAL for a short
/// header, a size, tag, permission, id, order or a missing entry.
pub fn parse_acl(v: &[u8]) -> VfsResult<Option<Vec<AclEntry>>> {
    if v.len() < 4 {
        return Err(Errno::EINVAL);
    }
    // As posix_acl_from_xattr: another version is EOPNOTSUPP, not EINVAL.
    if u32::from_le_bytes([v[0], v[1], v[2], v[3]]) != ACL_VERSION {
        return Err(Errno::EOPNOTSUPP);
    }
    let body = &v[4..];
    if !body.len().is_multiple_of(8) {
        return Err(Errno::EINVAL);
    }
    if body.is_empty() {
        return Ok(None);
    }
    // At most XATTR_SIZE_MAX / 8 entries: the value's size is checked first.
    let mut out = Vec::with_capacity(body.len() / 8);
    // posix_acl_valid's state machine: the entries come in tag order, named
    // users and groups each by ascending id, once each.
    let mut state = ACL_USER_OBJ;
    let mut needs_mask = false;
    let mut last_id: Option<u32> = None;
    for e in body.chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        // An id of -1 maps to no user or group (make_kuid fails).
        if perm & !7 != 0 || (matches!(tag, ACL_USER | ACL_GROUP) && id == ACL_UNDEFINED_ID) {
            return Err(Errno::EINVAL);
        }
        let id = match tag {
            ACL_USER_OBJ if state == ACL_USER_OBJ => {
                state = ACL_USER;
                ACL_UNDEFINED_ID
            }
            ACL_USER if state == ACL_USER => {
                if last_id.is_some_and(|l| id <= l) {
                    return Err(Errno::EINVAL);
                }
                last_id = Some(id);
                needs_mask = true;
                id
            }
            ACL_GROUP_OBJ if state == ACL_USER => {
                state = ACL_GROUP;
                last_id = None;
                ACL_UNDEFINED_ID
            }
            ACL_GROUP if state == ACL_GROUP => {
                if last_id.is_some_and(|l| id <= l) {
                    return Err(Errno::EINVAL);
                }
                last_id = Some(id);
                needs_mask = true;
                id
            }
            ACL_MASK if state == ACL_GROUP => {
                state = ACL_OTHER;
                ACL_UNDEFINED_ID
            }
            ACL_OTHER if state == ACL_OTHER || (state == ACL_GROUP && !needs_mask) => {
                state = 0;
                ACL_UNDEFINED_ID
            }
            _ => return Err(Errno::EINVAL),
        };
        out.push(AclEntry { tag, perm, id });
    }
    if state != 0 {
        return Err(Errno::EINVAL);
    }
    Ok(Some(out))
}

/// An ACL in xattr form.
pub fn encode_acl(acl: &[AclEntry]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + acl.len() * 8);
    v.extend_from_slice(&ACL_VERSION.to_le_bytes());
    for e in acl {
        v.extend_from_slice(&e.tag.to_le_bytes());
        v.extend_from_slice(&e.perm.to_le_bytes());
        v.extend_from_slice(&e.id.to_le_bytes());
    }
    v
}

/// `posix_acl_equiv_mode`: the permission bits the ACL gives (owner from
/// USER_OBJ, group from MASK if present else GROUP_OBJ, other from OTHER),
/// and whether the mode says all of it (no named entries and no mask).
pub fn acl_mode(acl: &[AclEntry]) -> (u32, bool) {
    let (mut mode, mut equiv) = (0u32, true);
    for e in acl {
        let p = u32::from(e.perm);
        match e.tag {
            ACL_USER_OBJ => mode |= p << 6,
            ACL_GROUP_OBJ => mode |= p << 3,
            ACL_MASK => {
                mode = (mode & !0o070) | (p << 3);
                equiv = false;
            }
            ACL_OTHER => mode |= p,
            _ => equiv = false,
        }
    }
    (mode, equiv)
}

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
        if permission_ok(&a, cred, mask) {
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
            if i.file_type() == FileType::Symlink {
                return Err(Errno::ENODATA);
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
    fn xattr_change(&self, p: &PathRef, name: &[u8], set: Option<(&[u8], u32)>) -> VfsResult<()> {
        let i = p.inode();
        if p.mnt.is_readonly() {
            return Err(Errno::EROFS);
        }
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
            (XattrNs::Acl { default }, Some((value, flags))) => {
                let acl = parse_acl(value)?;
                if i.file_type() == FileType::Symlink {
                    return Err(Errno::EOPNOTSUPP);
                }
                let a = i.attr();
                if !(self.cred().is_root() || self.cred().uid == a.uid) {
                    return Err(Errno::EPERM);
                }
                if default && !i.is_dir() {
                    return if acl.is_some() {
                        Err(Errno::EACCES)
                    } else {
                        Ok(())
                    };
                }
                let store = match &acl {
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
                match store {
                    Some(v) => fs.setxattr(i, name, &v, flags)?,
                    None => match fs.removexattr(i, name) {
                        Ok(()) | Err(Errno::ENODATA) => {}
                        Err(e) => return Err(e),
                    },
                }
            }
            (_, Some((value, flags))) => fs.setxattr(i, name, value, flags)?,
            (_, None) => fs.removexattr(i, name)?,
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

// ---------------------------------------------------------------------
// memfs's store
// ---------------------------------------------------------------------

/// The space an attribute is charged (Linux's `simple_xattr_space`: the
/// entry's header, the name with its NUL, the value).
pub(crate) fn xattr_space(name: &[u8], value: &[u8]) -> u64 {
    (32 + name.len() + 1 + value.len()) as u64
}

/// Name -> value (values shared with readers that copy them out).
type XattrMap = SkipMap<Box<[u8]>, Arc<[u8]>>;

/// One inode's attributes: a concurrent skip list (name -> value), made on
/// the first set and kept until the inode goes. Readers take no lock;
/// writers are serialised by the inode's data lock (see
/// `Task::xattr_change`), so a check-then-insert is not raced.
#[derive(Default)]
pub(crate) struct XattrStore {
    map: Atomic<XattrMap>,
}

impl std::fmt::Debug for XattrStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XattrStore").finish_non_exhaustive()
    }
}

/// The filesystem-wide space budget the store charges (tmpfs's
/// `free_ispace`): `used` never passes `max` (ENOSPC).
#[derive(Debug)]
pub(crate) struct XattrBudget<'a> {
    pub(crate) used: &'a AtomicU64,
    pub(crate) max: u64,
}

impl XattrBudget<'_> {
    fn charge(&self, n: u64) -> VfsResult<()> {
        // Relaxed: a bounded counter; it publishes no data.
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                u.checked_add(n).filter(|&t| t <= self.max)
            })
            .map(|_| ())
            .map_err(|_| Errno::ENOSPC)
    }
    pub(crate) fn release(&self, n: u64) {
        // Relaxed: as charge.
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

impl XattrStore {
    fn map<'g>(&self, g: &'g epoch::Guard) -> Option<&'g XattrMap> {
        // Acquire: pairs with the Release store that published the map.
        let p = self.map.load(Ordering::Acquire, g);
        // SAFETY: once published the map lives as long as the store, which
        // outlives every `&self`.
        unsafe { p.as_ref() }
    }

    pub(crate) fn get(&self, name: &[u8]) -> VfsResult<Vec<u8>> {
        let g = epoch::pin();
        let m = self.map(&g).ok_or(Errno::ENODATA)?;
        m.get(name)
            .map(|e| e.value().to_vec())
            .ok_or(Errno::ENODATA)
    }

    pub(crate) fn names(&self) -> Vec<Vec<u8>> {
        let g = epoch::pin();
        match self.map(&g) {
            Some(m) => m.iter().map(|e| e.key().to_vec()).collect(),
            None => Vec::new(),
        }
    }

    /// The space all the attributes are charged.
    pub(crate) fn space(&mut self) -> u64 {
        let g = epoch::pin();
        self.map(&g).map_or(0, |m| {
            m.iter().map(|e| xattr_space(e.key(), e.value())).sum()
        })
    }

    /// Set or (`value: None`) remove `name`. The caller serialises writers.
    pub(crate) fn change(
        &self,
        name: &[u8],
        value: Option<&[u8]>,
        flags: u32,
        budget: &XattrBudget<'_>,
    ) -> VfsResult<()> {
        let g = epoch::pin();
        let m = match (self.map(&g), value) {
            (Some(m), _) => m,
            (None, None) => return Err(Errno::ENODATA),
            (None, Some(_)) => {
                let m = Owned::new(SkipMap::new()).into_shared(&g);
                // Release: publish the empty map; writers are serialised,
                // so nobody else installs one.
                self.map.store(m, Ordering::Release);
                // SAFETY: just made, and lives as long as the store.
                unsafe { m.deref() }
            }
        };
        let old_space = m.get(name).map(|e| xattr_space(name, e.value()));
        match (value, old_space) {
            (None, None) => Err(Errno::ENODATA),
            (None, Some(old)) => {
                m.remove(name);
                budget.release(old);
                Ok(())
            }
            (Some(_), Some(_)) if flags & XATTR_CREATE != 0 => Err(Errno::EEXIST),
            (Some(_), None) if flags & XATTR_REPLACE != 0 => Err(Errno::ENODATA),
            (Some(v), old) => {
                let old = old.unwrap_or(0);
                let new = xattr_space(name, v);
                if new > old {
                    budget.charge(new - old)?;
                } else {
                    budget.release(old - new);
                }
                m.insert(Box::from(name), Arc::from(v));
                Ok(())
            }
        }
    }
}

impl Drop for XattrStore {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader holds this store, so the map can
        // be freed at once.
        unsafe {
            let p = self.map.load(Ordering::Relaxed, epoch::unprotected());
            if !p.is_null() {
                drop(p.into_owned());
            }
        }
    }
}
