//! Name operations of a [`Task`]: mkdir, mknod, symlink, link, unlink,
//! rmdir, rename — and the steps they share with `open(O_CREAT)`
//! (`open.rs`): the walk to the parent with a normal last name
//! (`name_op`), the parent's shared directory lock with the name's stripe
//! and the lookup under them (`lock_name`), the checks before a create
//! (`may_create`, read-only mount first), and entering the new inode in the
//! dcache (`instantiate`).
//!
//! LOCKING RULES: see `task.rs` and the table in `vfs.rs`.

use scalevfs_sync::ordered::{BrReadGuard, BrWriteGuard, Class, MutexGuard};
use std::sync::Arc;

use crossbeam_epoch as epoch;

use crate::dcache::{Dentry, DentryRef};
use crate::errno::{Errno, VfsResult};
use crate::fstype::{Filesystem, NewNode};
use crate::handle::At;
use crate::inode::{Inode, I_DEFACL};
use crate::mount::{MntRef, PathRef};
use crate::task::{as_bytes, Task};
use crate::types::*;
use crate::vfs::Changes;
use crate::walk::{check_path, Last, ParentWalk};
use crate::xattr::{
    acl_create_masq, encode_acl, parse_acl, AclEntry, POSIX_ACL_ACCESS, POSIX_ACL_DEFAULT,
};

/// The ACLs a new inode inherits from its directory's default ACL.
#[derive(Default)]
pub(crate) struct InheritedAcl {
    /// A directory's default ACL: the parent's, unchanged.
    default: Option<Vec<AclEntry>>,
    /// The access ACL, when the inherited one says more than the mode.
    access: Option<Vec<AclEntry>>,
}

/// A name locked for a change (`Task::lock_name`); the locks go when it
/// drops (the stripe first, as locals declared in that order would).
pub(crate) struct LockedName<'a> {
    /// The name's positive dentry, if it has one.
    pub(crate) existing: Option<DentryRef>,
    _nl: MutexGuard<'a, ()>,
    _dl: BrReadGuard<'a>,
}

/// Where a name operation happens: a locked parent and a name.
pub(crate) struct NameOp {
    pub(crate) pw: ParentWalk,
    pub(crate) name: Vec<u8>,
}

impl Task {
    // ---------------------------------------------------------------
    // Name operations.
    // ---------------------------------------------------------------

    /// Walk to the parent and require a normal last component (`counted`:
    /// see `Task::parent_of`).
    pub(crate) fn name_op<'a>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &[u8],
        special: Errno,
        counted: bool,
    ) -> VfsResult<NameOp> {
        let pw = self.parent_of(dirfd, path, counted)?;
        let name = match &pw.last {
            Last::Normal(n) => n.clone(),
            _ => return Err(special),
        };
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        Ok(NameOp { pw, name })
    }

    pub(crate) fn name_lock(&self, parent: &Dentry, name: &[u8]) -> MutexGuard<'_, ()> {
        let i = self.vfs.name_lock_index(parent, name);
        self.vfs.inner.name_locks[i].lock_key(i as u64)
    }

    /// Lock two names' stripes in index order (once if they share one).
    pub(crate) fn name_lock2(
        &self,
        a: (&Dentry, &[u8]),
        b: (&Dentry, &[u8]),
    ) -> (MutexGuard<'_, ()>, Option<MutexGuard<'_, ()>>) {
        let ia = self.vfs.name_lock_index(a.0, a.1);
        let ib = self.vfs.name_lock_index(b.0, b.1);
        let locks = &self.vfs.inner.name_locks;
        let lk = |i: usize| locks[i].lock_key(i as u64);
        match ia.cmp(&ib) {
            std::cmp::Ordering::Equal => (lk(ia), None),
            std::cmp::Ordering::Less => {
                let x = lk(ia);
                (x, Some(lk(ib)))
            }
            std::cmp::Ordering::Greater => {
                let y = lk(ib);
                (lk(ia), Some(y))
            }
        }
    }

    /// The first step of every create, link and unlink: the parent's
    /// directory lock (shared) and the name's stripe, in the global order,
    /// and the name's positive dentry under them.
    ///
    /// An uncounted parent (`ParentWalk`) is checked under the directory
    /// lock: still hashed, not dead, its inode not removed; from then on
    /// nothing unhashes or kills it until the lock goes. Otherwise
    /// `Errno::RESTART_WALK`: the caller redoes the operation with a
    /// counted walk (`redo_counted`).
    pub(crate) fn lock_name<'a>(
        &'a self,
        pw: &'a ParentWalk,
        name: &[u8],
    ) -> VfsResult<LockedName<'a>> {
        let parent = &*pw.parent;
        let dl = self.dir_shared(parent.inode());
        if parent_gone(pw) {
            return Err(Errno::RESTART_WALK);
        }
        let nl = self.name_lock(&parent.dentry, name);
        let existing = self.lookup_child(parent, name)?;
        Ok(LockedName {
            existing,
            _nl: nl,
            _dl: dl,
        })
    }

    /// The last step of every create and link: enter `inode` under `name` in
    /// the dcache and record the new entry (reported when `ch` drops, after
    /// the locks).
    pub(crate) fn instantiate(
        &self,
        parent: &PathRef,
        name: &[u8],
        inode: Arc<Inode>,
        ch: &mut Changes<'_>,
    ) -> DentryRef {
        let q = self.vfs.dcache().qname(parent.dentry.as_ptr(), name);
        let d = self.vfs.dcache().add(&parent.dentry, &q, Some(inode));
        ch.entry(parent.inode(), name);
        d
    }

    /// Find the current dentry for a name (parent held, name lock held).
    pub(crate) fn lookup_child(
        &self,
        parent: &PathRef,
        name: &[u8],
    ) -> VfsResult<Option<DentryRef>> {
        Ok(self
            .lookup_child_any(parent, name)?
            .filter(|d| !d.is_negative()))
    }

    /// As `lookup_child`, but a cached negative dentry is returned too
    /// (rename must unhash it when it moves a dentry onto its name).
    pub(crate) fn lookup_child_any(
        &self,
        parent: &PathRef,
        name: &[u8],
    ) -> VfsResult<Option<DentryRef>> {
        let g = epoch::pin();
        match self.ctx(&g).lookup_slow(parent, name, true) {
            Ok(d) => Ok(Some(d)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn may_create(&self, dir: &PathRef) -> VfsResult<()> {
        let i = dir.inode();
        if i.is_dead() {
            return Err(Errno::ENOENT);
        }
        // inode_permission(MAY_WRITE): an immutable directory is EPERM.
        if i.is_immutable() {
            return Err(Errno::EPERM);
        }
        if !i.permission_ok(&i.attr_stored(), &self.cred, W_OK | X_OK) {
            return Err(Errno::EACCES);
        }
        Ok(())
    }

    /// Linux's may_delete: `victim` in `dir`, `isdir` says what the
    /// operation expects.
    pub(crate) fn may_delete(&self, dir: &PathRef, victim: &Inode, isdir: bool) -> VfsResult<()> {
        let da = dir.inode().attr_stored();
        // inode_permission(MAY_WRITE): an immutable directory is EPERM.
        if dir.inode().is_immutable() {
            return Err(Errno::EPERM);
        }
        if !dir.inode().permission_ok(&da, &self.cred, W_OK | X_OK) {
            return Err(Errno::EACCES);
        }
        // may_delete: an append-only directory, an immutable or append-only
        // victim.
        if dir.inode().is_append_only() || victim.is_immutable() || victim.is_append_only() {
            return Err(Errno::EPERM);
        }
        if da.mode & S_ISVTX != 0 && !self.cred.is_root() {
            let va = victim.attr_stored();
            if self.cred.uid != da.uid && self.cred.uid != va.uid {
                return Err(Errno::EPERM);
            }
        }
        if isdir {
            if !victim.is_dir() {
                return Err(Errno::ENOTDIR);
            }
        } else if victim.is_dir() {
            return Err(Errno::EISDIR);
        }
        if dir.inode().is_dead() {
            return Err(Errno::ENOENT);
        }
        Ok(())
    }

    /// Linux's mode_strip_sgid: a non-directory created in a setgid
    /// directory (`inherited`) with setgid and group-execute loses setgid
    /// unless the creator is in the group it gets (`gid`) or is root
    /// (CAP_FSETID). `perm` is the permission part of the mode.
    pub(crate) fn strip_sgid(&self, perm: u32, gid: u32, inherited: bool) -> u32 {
        if inherited
            && perm & (S_ISGID | 0o010) == (S_ISGID | 0o010)
            && !self.cred.is_root()
            && !self.cred.in_group(gid)
        {
            perm & !S_ISGID
        } else {
            perm
        }
    }

    pub(crate) fn owner_for(&self, dir: &Inode) -> ((u32, u32), bool) {
        let a = dir.attr_stored();
        if a.mode & S_ISGID != 0 {
            ((self.cred.uid, a.gid), true)
        } else {
            ((self.cred.uid, self.cred.gid), false)
        }
    }

    pub(crate) fn dir_shared<'a>(&self, i: &'a Inode) -> BrReadGuard<'a> {
        i.dir_lock.read()
    }
    /// A victim directory's lock (rmdir, rename over a directory), taken
    /// with the parents' locks and the name stripes held: a try-lock only,
    /// so this acquisition never waits (see LOCKING RULES in `vfs.rs`).
    pub(crate) fn try_victim_excl<'a>(&self, i: &'a Inode) -> Option<BrWriteGuard<'a>> {
        i.dir_lock.try_write_as(Class::DirVictim)
    }
    /// After `try_victim_excl` failed and every lock was dropped: wait,
    /// holding no lock, until the victim's lock has been free once, so the
    /// caller's retry is not a busy loop.
    pub(crate) fn wait_victim(&self, i: &Inode) {
        drop(i.dir_lock.write());
    }

    /// Common create path: parent locked shared, name locked, existence
    /// checked, then `make` builds the inode, then the dentry is added.
    /// `perm` is the requested permission bits (none for a symlink); `make`
    /// gets them after the umask or the directory's default ACL
    /// (`create_mode`), and the inherited ACLs are stored before the name
    /// is added.
    pub(crate) fn create_node(
        &self,
        op: &NameOp,
        is_dir: bool,
        perm: Option<u32>,
        make: impl FnOnce(
            &Arc<dyn Filesystem>,
            &Arc<Inode>,
            (u32, u32),
            bool,
            u32,
        ) -> VfsResult<Arc<Inode>>,
    ) -> VfsResult<DentryRef> {
        let mut ch = self.changes();
        let parent = &op.pw.parent;
        // Borrowed, not cloned: no RMW of the parent inode's shared Arc count
        // per create (issue 16); the same in the other name operations.
        let dir = parent.inode();
        let slot = self.lock_name(&op.pw, &op.name)?;
        if slot.existing.is_some() {
            return Err(Errno::EEXIST);
        }
        // Linux's filename_create: "foo/" asks for a directory; creating
        // anything else there is ENOENT (after the EEXIST check).
        if op.pw.trailing && !is_dir {
            return Err(Errno::ENOENT);
        }
        parent.mnt.check_writable()?;
        self.may_create(parent)?;
        let (owner, sgid) = self.owner_for(dir);
        let fs = &parent.mnt.sb.fs;
        let (perm, acl) = match perm {
            Some(p) => self.create_mode(fs, dir, p, is_dir)?,
            None => (0, InheritedAcl::default()),
        };
        let inode = crate::caller::with(&self.cred, || make(fs, dir, owner, sgid, perm))?;
        if let Err(e) = self.store_inherited_acl(fs, &inode, acl) {
            self.undo_create(fs, parent, &op.name, inode, is_dir, &mut ch);
            return Err(e);
        }
        let d = self.instantiate(parent, &op.name, inode, &mut ch);
        drop(slot);
        Ok(d)
    }

    /// The permission bits of a new inode asked for with `perm` in `dir`:
    /// less the umask, or, when `dir` has a default ACL, fitted to that
    /// ACL instead (Linux's `mode_strip_umask` and `posix_acl_create`);
    /// with the ACLs the new inode inherits.
    pub(crate) fn create_mode(
        &self,
        fs: &Arc<dyn Filesystem>,
        dir: &Arc<Inode>,
        perm: u32,
        is_dir: bool,
    ) -> VfsResult<(u32, InheritedAcl)> {
        if dir.flags() & I_DEFACL != 0 {
            let stored = match fs.getxattr(dir, POSIX_ACL_DEFAULT) {
                Ok(v) => parse_acl(&v)?,
                Err(Errno::ENODATA | Errno::EOPNOTSUPP) => None,
                Err(e) => return Err(e),
            };
            if let Some(default) = stored {
                let mut access = default.clone();
                let (perm, not_equiv) = acl_create_masq(&mut access, perm);
                let acl = InheritedAcl {
                    default: is_dir.then_some(default),
                    access: not_equiv.then_some(access),
                };
                return Ok((perm, acl));
            }
        }
        Ok((perm & !self.cur_umask(), InheritedAcl::default()))
    }

    /// A create whose name is on the filesystem failed afterwards (its
    /// inherited ACL could not be stored: ENOSPC): remove the name again,
    /// as the kernel frees a new inode whose ACL fails before linking it,
    /// so that the call changes nothing and may be retried
    /// (`redo_counted`). If even that fails, the name is made visible in
    /// the dcache (it exists), never left behind a negative dentry that
    /// would let a later create add a second entry of the same name.
    pub(crate) fn undo_create(
        &self,
        fs: &Arc<dyn Filesystem>,
        parent: &PathRef,
        name: &[u8],
        inode: Arc<Inode>,
        is_dir: bool,
        ch: &mut Changes<'_>,
    ) {
        let dir = parent.inode();
        let undone = if is_dir {
            fs.rmdir(dir, name, &inode)
        } else {
            fs.unlink(dir, name, &inode)
        };
        if undone.is_err() {
            drop(self.instantiate(parent, name, inode, ch));
        }
    }

    /// Store the ACLs `create_mode` gave a new inode (before its name is
    /// visible in the dcache).
    pub(crate) fn store_inherited_acl(
        &self,
        fs: &Arc<dyn Filesystem>,
        inode: &Arc<Inode>,
        acl: InheritedAcl,
    ) -> VfsResult<()> {
        crate::caller::with(&self.cred, || self.store_acl_as_caller(fs, inode, acl))
    }

    fn store_acl_as_caller(
        &self,
        fs: &Arc<dyn Filesystem>,
        inode: &Arc<Inode>,
        acl: InheritedAcl,
    ) -> VfsResult<()> {
        if let Some(d) = acl.default {
            fs.setxattr(inode, POSIX_ACL_DEFAULT, &encode_acl(&d), 0)?;
            inode.mark_default_acl(true);
        }
        if let Some(a) = acl.access {
            fs.setxattr(inode, POSIX_ACL_ACCESS, &encode_acl(&a), 0)?;
            inode.set_access_acl(Some(a));
        }
        Ok(())
    }

    /// `mkdirat(2)`.
    pub fn mkdirat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        mode: u32,
    ) -> VfsResult<()> {
        redo_counted_enospc(self.vfs.dcache(), |counted| {
            let op = self.name_op(dirfd, as_bytes(path), Errno::EEXIST, counted)?;
            self.create_node(
                &op,
                true,
                Some(mode & 0o1777),
                |fs, dir, owner, sgid, mode| {
                    let m = if sgid { mode | S_ISGID } else { mode };
                    fs.create(dir, &op.name, NewNode::Dir { mode: m }, owner)
                },
            )?;
            Ok(())
        })
    }

    pub fn mkdir<P: AsRef<[u8]> + ?Sized>(&self, path: &P, mode: u32) -> VfsResult<()> {
        self.mkdirat(AT_FDCWD, path, mode)
    }

    /// `mknodat(2)`: regular files, FIFOs and sockets; devices for root.
    pub fn mknodat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        mode: u32,
        dev: u64,
    ) -> VfsResult<()> {
        let ty = if mode & S_IFMT == 0 {
            S_IFREG
        } else {
            mode & S_IFMT
        };
        match FileType::from_mode(ty) {
            Some(FileType::Regular | FileType::Fifo | FileType::Socket) => {}
            Some(FileType::CharDevice | FileType::BlockDevice) => {}
            Some(FileType::Directory) => return Err(Errno::EPERM),
            _ => return Err(Errno::EINVAL),
        }
        let rdev = if matches!(ty, S_IFCHR | S_IFBLK) {
            dev
        } else {
            0
        };
        redo_counted_enospc(self.vfs.dcache(), |counted| {
            let op = self.name_op(dirfd, as_bytes(path), Errno::EEXIST, counted)?;
            self.create_node(
                &op,
                false,
                Some(mode & 0o7777),
                |fs, dir, owner, sgid, perm| {
                    // Linux's vfs_mknod checks CAP_MKNOD after may_create (EEXIST
                    // and EACCES come first); a whiteout (a character device
                    // 0:0) needs none since Linux 5.8 (unprivileged overlay
                    // tools make them).
                    let whiteout = ty == S_IFCHR && rdev == 0;
                    if matches!(ty, S_IFCHR | S_IFBLK) && !whiteout && !self.cred.is_root() {
                        return Err(Errno::EPERM);
                    }
                    let perm = self.strip_sgid(perm, owner.1, sgid);
                    fs.create(
                        dir,
                        &op.name,
                        NewNode::Node {
                            mode: ty | perm,
                            rdev,
                        },
                        owner,
                    )
                },
            )?;
            Ok(())
        })
    }

    /// `symlinkat(2)`.
    pub fn symlinkat<'a, T: AsRef<[u8]> + ?Sized, P: AsRef<[u8]> + ?Sized>(
        &self,
        target: &T,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
    ) -> VfsResult<()> {
        let target = as_bytes(target);
        check_path(target)?;
        if target.is_empty() {
            return Err(Errno::ENOENT);
        }
        redo_counted_enospc(self.vfs.dcache(), |counted| {
            let op = self.name_op(dirfd, as_bytes(path), Errno::EEXIST, counted)?;
            self.create_node(&op, false, None, |fs, dir, owner, _, _| {
                fs.create(dir, &op.name, NewNode::Symlink { target }, owner)
            })?;
            Ok(())
        })
    }

    pub fn symlink<T: AsRef<[u8]> + ?Sized, P: AsRef<[u8]> + ?Sized>(
        &self,
        target: &T,
        path: &P,
    ) -> VfsResult<()> {
        self.symlinkat(target, AT_FDCWD, path)
    }

    /// `linkat(2)`. Flags: AT_SYMLINK_FOLLOW, AT_EMPTY_PATH.
    pub fn linkat<'a, P: AsRef<[u8]> + ?Sized, Q: AsRef<[u8]> + ?Sized>(
        &self,
        olddirfd: impl Into<At<'a>> + Copy,
        old: &P,
        newdirfd: impl Into<At<'a>> + Copy,
        new: &Q,
        flags: u32,
    ) -> VfsResult<()> {
        if flags & !(AT_SYMLINK_FOLLOW | AT_EMPTY_PATH) != 0 {
            return Err(Errno::EINVAL);
        }
        let old = as_bytes(old);
        // flink: without CAP_DAC_READ_SEARCH only a file the caller opened
        // itself (the same credentials as its opener; Linux 6.10's
        // LOOKUP_LINKAT_EMPTY): an fd passed from a more privileged
        // process stays ENOENT. The cwd (AT_FDCWD) is not checked, as
        // there (it goes on to EPERM, a directory). Checked on the host.
        if flags & AT_EMPTY_PATH != 0 && !self.cred.is_root() && old.is_empty() {
            if let At::Fd(fd) = olddirfd.into() {
                if fd != AT_FDCWD {
                    let g = epoch::pin();
                    let f = self.files().get(fd, &g)?;
                    if f.opener != self.cred.fingerprint() {
                        return Err(Errno::ENOENT);
                    }
                }
            }
        }
        let src = self.resolve(
            olddirfd,
            old,
            flags & AT_SYMLINK_FOLLOW != 0,
            flags & AT_EMPTY_PATH != 0,
        )?;
        self.link_path(src, newdirfd, as_bytes(new))
    }

    /// Give the file open at `fd` (often an O_PATH fd) the new name
    /// `newdirfd`/`new`: `linkat(fd, "", newdirfd, new, AT_EMPTY_PATH)`
    /// without its CAP_DAC_READ_SEARCH requirement, so a front end that holds
    /// files by handle (FUSE's LINK) can link as an unprivileged caller. All
    /// of linkat's other checks (protected hardlinks, may_create) apply.
    pub fn link_fd<'a, Q: AsRef<[u8]> + ?Sized>(
        &self,
        fd: impl Into<At<'a>> + Copy,
        newdirfd: impl Into<At<'a>> + Copy,
        new: &Q,
    ) -> VfsResult<()> {
        let src = self.held(fd)?;
        self.link_path(src, newdirfd, as_bytes(new))
    }

    pub(crate) fn link_path<'a>(
        &self,
        src: PathRef,
        newdirfd: impl Into<At<'a>> + Copy,
        new: &[u8],
    ) -> VfsResult<()> {
        redo_counted_enospc(self.vfs.dcache(), |counted| {
            self.link_walked(&src, newdirfd, new, counted)
        })
    }

    /// `link_path` with the new name's parent walked counted or not
    /// (`Task::parent_of`).
    fn link_walked<'a>(
        &self,
        src: &PathRef,
        newdirfd: impl Into<At<'a>> + Copy,
        new: &[u8],
        counted: bool,
    ) -> VfsResult<()> {
        let mut ch = self.changes();
        let op = self.name_op(newdirfd, new, Errno::EEXIST, counted)?;
        let inode = src.inode().clone();
        let parent = &op.pw.parent;
        let dir = parent.inode();
        let slot = self.lock_name(&op.pw, &op.name)?;
        if slot.existing.is_some() {
            return Err(Errno::EEXIST);
        }
        if op.pw.trailing {
            return Err(Errno::ENOENT);
        }
        parent.mnt.check_writable()?;
        // do_linkat: EXDEV after filename_create (EEXIST, the trailing
        // slash's ENOENT, EROFS), then may_linkat (EPERM) before vfs_link's
        // may_create.
        if !MntRef::ptr_eq(&src.mnt, &op.pw.parent.mnt) {
            return Err(Errno::EXDEV);
        }
        self.may_linkat(&inode)?;
        self.may_create(parent)?;
        // vfs_link: an immutable or append-only file gets no new name.
        if inode.is_immutable() || inode.is_append_only() {
            return Err(Errno::EPERM);
        }
        if inode.is_dir() {
            return Err(Errno::EPERM);
        }
        // vfs_link: a file with no name stays nameless, unless it is an
        // O_TMPFILE file opened without O_EXCL (I_LINKABLE). Checked and
        // the name added under the inode's data lock, which unlink and
        // rename hold on the inode they take a name from (Linux: the
        // inode's i_rwsem): else a link that saw nlink 1 could add its
        // name after the last unlink had put the open file on the orphan
        // file, which would free it at the last close.
        let _il = inode.data_lock.write();
        let revive = inode.attr().nlink == 0;
        if revive && inode.flags() & crate::inode::I_LINKABLE == 0 {
            return Err(Errno::ENOENT);
        }
        crate::caller::with(&self.cred, || parent.mnt.sb.fs.link(dir, &op.name, &inode))?;
        if revive {
            inode.clear_flag(crate::inode::I_LINKABLE);
            crate::orphan::mark_linked(&parent.mnt.sb.orphans, &inode);
        }
        drop(self.instantiate(parent, &op.name, inode.clone(), &mut ch));
        ch.inode(&inode);
        drop(slot);
        Ok(())
    }

    pub fn link<P: AsRef<[u8]> + ?Sized, Q: AsRef<[u8]> + ?Sized>(
        &self,
        old: &P,
        new: &Q,
    ) -> VfsResult<()> {
        self.linkat(AT_FDCWD, old, AT_FDCWD, new, 0)
    }

    /// Linux's protected_hardlinks (on by default; config key
    /// `protected-hardlinks`): a non-owner may link only a regular,
    /// non-setuid file they can read and write.
    pub(crate) fn may_linkat(&self, inode: &Inode) -> VfsResult<()> {
        if self.vfs.config().protected_hardlinks_off {
            return Ok(());
        }
        let a = inode.attr();
        if self.cred.is_root() || self.cred.uid == a.uid {
            return Ok(());
        }
        let safe = inode.file_type() == FileType::Regular
            && a.mode & S_ISUID == 0
            && a.mode & (S_ISGID | 0o010) != (S_ISGID | 0o010)
            && inode.permission_ok(&a, &self.cred, R_OK | W_OK);
        if safe {
            Ok(())
        } else {
            Err(Errno::EPERM)
        }
    }

    /// `unlinkat(2)`. Flags: AT_REMOVEDIR.
    pub fn unlinkat<'a, P: AsRef<[u8]> + ?Sized>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &P,
        flags: u32,
    ) -> VfsResult<()> {
        // This thread's deferred frees that are due (limbo.rs).
        crate::limbo::poll();
        if flags & !AT_REMOVEDIR != 0 {
            return Err(Errno::EINVAL);
        }
        let path = as_bytes(path);
        let rmdir = flags & AT_REMOVEDIR != 0;
        let r = redo_counted(|counted| self.unlink_walked(dirfd, path, rmdir, counted));
        crate::limbo::flush_if_due();
        r
    }

    /// `unlinkat` after its flag checks, with the parent walked counted or
    /// not (`Task::parent_of`).
    fn unlink_walked<'a>(
        &self,
        dirfd: impl Into<At<'a>> + Copy,
        path: &[u8],
        rmdir: bool,
        counted: bool,
    ) -> VfsResult<()> {
        let pw = self.parent_of(dirfd, path, counted)?;
        let name = match &pw.last {
            Last::Normal(n) => n.clone(),
            Last::Dot if rmdir => return Err(Errno::EINVAL),
            Last::DotDot if rmdir => return Err(Errno::ENOTEMPTY),
            Last::Root if rmdir => return Err(Errno::EBUSY),
            _ => return Err(Errno::EISDIR),
        };
        pw.parent.mnt.check_writable()?;
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut ch = self.changes();
        let parent = &pw.parent;
        let dir = parent.inode();
        let fs = &parent.mnt.sb.fs;
        // Retried only when the victim directory's lock was busy (see
        // `try_victim_excl`); each retry first waits for that lock.
        loop {
            let mut slot = self.lock_name(&pw, &name)?;
            let victim = slot.existing.take().ok_or(Errno::ENOENT)?;
            let vi = victim.inode().ok_or(Errno::ENOENT)?.clone();
            if !rmdir && pw.trailing {
                return Err(if vi.is_dir() {
                    Errno::EISDIR
                } else {
                    Errno::ENOTDIR
                });
            }
            self.may_delete(parent, &vi, rmdir)?;
            if victim.is_mounted() {
                return Err(Errno::EBUSY);
            }
            if rmdir {
                {
                    let g = epoch::pin();
                    let s = self.fs.load(&g);
                    if s.root.dentry == victim {
                        return Err(Errno::EBUSY);
                    }
                }
                let Some(_vl) = self.try_victim_excl(&vi) else {
                    drop(slot);
                    self.wait_victim(&vi);
                    continue;
                };
                // Again under the victim's lock, which a mount on it holds
                // shared (`Vfs::mount_at`).
                if victim.is_mounted() {
                    return Err(Errno::EBUSY);
                }
                fs.rmdir(dir, &name, &vi)?;
                vi.set_flag(crate::inode::I_DEAD);
            } else {
                // Against a link of this inode (see `link_walked`) and a
                // second unlink or rename of another of its names.
                let _il = vi.data_lock.write();
                fs.unlink(dir, &name, &vi)?;
                if vi.attr().nlink == 0 {
                    // Still open somewhere: onto the orphan file (orphan.rs).
                    crate::orphan::mark_unlinked(&parent.mnt.sb.orphans, &vi);
                }
            }
            self.vfs.dcache().unhash(&victim);
            ch.entry(dir, &name);
            ch.inode(&vi);
            return Ok(());
        }
    }

    pub fn unlink<P: AsRef<[u8]> + ?Sized>(&self, path: &P) -> VfsResult<()> {
        self.unlinkat(AT_FDCWD, path, 0)
    }
    pub fn rmdir<P: AsRef<[u8]> + ?Sized>(&self, path: &P) -> VfsResult<()> {
        self.unlinkat(AT_FDCWD, path, AT_REMOVEDIR)
    }

    /// `renameat2(2)`. Flags: RENAME_NOREPLACE, RENAME_EXCHANGE.
    pub fn renameat2<'a, P: AsRef<[u8]> + ?Sized, Q: AsRef<[u8]> + ?Sized>(
        &self,
        olddirfd: impl Into<At<'a>> + Copy,
        old: &P,
        newdirfd: impl Into<At<'a>> + Copy,
        new: &Q,
        flags: u32,
    ) -> VfsResult<()> {
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) != 0 {
            return Err(Errno::EINVAL);
        }
        if flags & (RENAME_NOREPLACE | RENAME_WHITEOUT) != 0 && flags & RENAME_EXCHANGE != 0 {
            return Err(Errno::EINVAL);
        }
        // RENAME_WHITEOUT (overlayfs's): the old name becomes a whiteout, a
        // character device 0:0 with no permission bits owned by the caller,
        // as tmpfs makes it. No CAP_MKNOD needed (Linux 5.8 and later).
        let (old, new) = (as_bytes(old), as_bytes(new));
        let r = redo_counted(|counted| {
            self.rename_walked(olddirfd, old, newdirfd, new, flags, counted)
        });
        // A file the rename replaced may have given its data up.
        crate::limbo::flush_if_due();
        r
    }

    /// `renameat2` after its flag checks, with the parents walked counted
    /// or not (`Task::parent_of`; uncounted ones are checked once both
    /// directory locks are held, as `lock_name` does).
    fn rename_walked<'a>(
        &self,
        olddirfd: impl Into<At<'a>> + Copy,
        old: &[u8],
        newdirfd: impl Into<At<'a>> + Copy,
        new: &[u8],
        flags: u32,
        counted: bool,
    ) -> VfsResult<()> {
        let whiteout = flags & RENAME_WHITEOUT != 0;
        let exchange = flags & RENAME_EXCHANGE != 0;
        let opw = self.parent_of(olddirfd, old, counted)?;
        let npw = self.parent_of(newdirfd, new, counted)?;
        if !MntRef::ptr_eq(&opw.parent.mnt, &npw.parent.mnt) {
            return Err(Errno::EXDEV);
        }
        let Last::Normal(oname) = opw.last.clone() else {
            return Err(Errno::EBUSY);
        };
        let nname = match npw.last.clone() {
            Last::Normal(n) => n,
            _ => {
                return Err(if flags & RENAME_NOREPLACE != 0 {
                    Errno::EEXIST
                } else {
                    Errno::EBUSY
                })
            }
        };
        opw.parent.mnt.check_writable()?;
        // do_renameat2 looks the old name up first (a name too long is
        // ENAMETOOLONG there, a missing one ENOENT), the new one after:
        // its length is checked once the source is found (below).
        if oname.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut ch = self.changes();
        let op = &opw.parent;
        let np = &npw.parent;
        let sb = op.mnt.sb.clone();
        let cross = op.dentry != np.dentry;
        let odir = op.inode().clone();
        let ndir = np.inode().clone();
        // Retried only when a victim directory's lock was busy (see
        // `try_victim_excl`); each retry first waits for that lock.
        loop {
            let _rm = if cross {
                Some(sb.rename_mutex.lock())
            } else {
                None
            };
            // Parents shared: an ancestor before its descendant, else in address
            // order (the tree's shape is stable under the rename mutex).
            let (_d1, _d2) = if !cross {
                (self.dir_shared(&odir), None)
            } else if is_ancestor(&op.dentry, &np.dentry)
                || (!is_ancestor(&np.dentry, &op.dentry) && Arc::as_ptr(&odir) < Arc::as_ptr(&ndir))
            {
                let a = self.dir_shared(&odir);
                (a, Some(self.dir_shared(&ndir)))
            } else {
                let b = self.dir_shared(&ndir);
                (self.dir_shared(&odir), Some(b))
            };
            if parent_gone(&opw) || parent_gone(&npw) {
                return Err(Errno::RESTART_WALK);
            }
            let _nl = self.name_lock2((&op.dentry, &oname), (&np.dentry, &nname));
            let src = self.lookup_child(op, &oname)?.ok_or(Errno::ENOENT)?;
            let si = src.inode().ok_or(Errno::ENOENT)?.clone();
            if nname.len() > NAME_MAX {
                return Err(Errno::ENAMETOOLONG);
            }
            // `dst_any` may be a negative dentry: d_move must unhash it, or it
            // would stay hashed behind the moved dentry and, once that one is
            // evicted, hide the name (a later create would then overwrite it).
            let dst_any = self.lookup_child_any(np, &nname)?;
            let dst = dst_any.as_ref().filter(|d| !d.is_negative()).cloned();
            let di = dst.as_ref().and_then(|d| d.inode().cloned());
            // do_renameat2's order: EEXIST / the exchange target's ENOENT
            // before the trailing-slash ENOTDIRs; a trailing slash counts
            // against the name it ends (and, when not exchanging, a slash
            // on the new name against a source that is no directory).
            if flags & RENAME_NOREPLACE != 0 && di.is_some() {
                return Err(Errno::EEXIST);
            }
            if exchange {
                match &di {
                    None => return Err(Errno::ENOENT),
                    Some(d) if !d.is_dir() && npw.trailing => return Err(Errno::ENOTDIR),
                    _ => {}
                }
            }
            if !si.is_dir() && (opw.trailing || (!exchange && npw.trailing)) {
                return Err(Errno::ENOTDIR);
            }
            // Source must not be an ancestor of the target's parent, and the
            // target must not be an ancestor of the source's parent.
            if cross {
                if is_ancestor(&src, &np.dentry) {
                    return Err(Errno::EINVAL);
                }
                if let Some(d) = &dst {
                    if is_ancestor(d, &op.dentry) {
                        return Err(if exchange {
                            Errno::EINVAL
                        } else {
                            Errno::ENOTEMPTY
                        });
                    }
                }
            }
            if let Some(d) = &di {
                if Arc::ptr_eq(d, &si) {
                    // Two names of one inode (or the same name): nothing to do.
                    return Ok(());
                }
            }
            self.may_delete(op, &si, si.is_dir())?;
            match &di {
                Some(d) => {
                    if exchange {
                        self.may_delete(np, d, d.is_dir())?;
                    } else {
                        self.may_delete(np, d, si.is_dir())?;
                    }
                }
                None => self.may_create(np)?,
            }
            if cross && si.is_dir() && !si.permission_ok(&si.attr_stored(), &self.cred, W_OK) {
                return Err(Errno::EACCES);
            }
            if exchange && cross {
                if let Some(d) = &di {
                    if d.is_dir() && !d.permission_ok(&d.attr_stored(), &self.cred, W_OK) {
                        return Err(Errno::EACCES);
                    }
                }
            }
            if src.is_mounted() || dst.as_ref().is_some_and(|d| d.is_mounted()) {
                return Err(Errno::EBUSY);
            }
            {
                let g = epoch::pin();
                let s = self.fs.load(&g);
                if s.root.dentry == src || dst.as_ref().is_some_and(|d| *d == s.root.dentry) {
                    return Err(Errno::EBUSY);
                }
            }
            let _vl = match (&di, exchange) {
                (Some(d), false) if d.is_dir() => match self.try_victim_excl(d) {
                    Some(g) => Some(g),
                    None => {
                        drop(_nl);
                        drop(_d2);
                        drop(_d1);
                        drop(_rm);
                        self.wait_victim(d);
                        continue;
                    }
                },
                _ => None,
            };
            // Again under the victim's lock (see `unlink_walked`).
            if _vl.is_some() && dst.as_ref().is_some_and(|d| d.is_mounted()) {
                return Err(Errno::EBUSY);
            }
            // A file replaced: its name goes under its data lock, as an
            // unlink's (see `link_walked`).
            let _il = match (&di, exchange) {
                (Some(d), false) if !d.is_dir() => Some(d.data_lock.write()),
                _ => None,
            };
            // The whiteout, made once the name is free, with the rename
            // (`Filesystem::rename_whiteout`; tmpfs makes it first; here a
            // failure, ENOSPC of inodes, leaves the rename done and no
            // whiteout, and is returned).
            let wo = if whiteout {
                let (owner, _) = self.owner_for(&odir);
                Some(crate::caller::with(&self.cred, || {
                    sb.fs
                        .rename_whiteout(&odir, &oname, &ndir, &nname, &si, di.as_ref(), owner)
                })?)
            } else {
                crate::caller::with(&self.cred, || {
                    sb.fs
                        .rename(&odir, &oname, &ndir, &nname, &si, di.as_ref(), exchange)
                })?;
                None
            };
            if let Some(d) = di.as_ref().filter(|d| !exchange && d.attr().nlink == 0) {
                // The replaced file may still be open: onto the orphan file.
                crate::orphan::mark_unlinked(&sb.orphans, d);
            }
            let dc = self.vfs.dcache();
            if exchange {
                if let Some(d) = &dst {
                    dc.d_exchange(&src, d);
                }
            } else {
                if let Some(d) = &di {
                    if d.is_dir() {
                        d.set_flag(crate::inode::I_DEAD);
                    }
                }
                dc.d_move(&src, &np.dentry, &nname, dst_any.as_ref());
            }
            if let Some(Ok(w)) = &wo {
                let q = dc.qname(op.dentry.as_ptr(), &oname);
                drop(dc.add(&op.dentry, &q, Some(w.clone())));
            }
            ch.entry(&odir, &oname);
            ch.entry(&ndir, &nname);
            ch.inode(&si);
            if let Some(d) = &di {
                ch.inode(d);
            }
            return wo.map_or(Ok(()), |w| w.map(drop));
        }
    }

    pub fn rename<P: AsRef<[u8]> + ?Sized, Q: AsRef<[u8]> + ?Sized>(
        &self,
        old: &P,
        new: &Q,
    ) -> VfsResult<()> {
        self.renameat2(AT_FDCWD, old, AT_FDCWD, new, 0)
    }
}

/// Whether `a` is `d` or an ancestor of `d` (rename lock held).
fn is_ancestor(a: &Dentry, d: &Dentry) -> bool {
    let mut cur: *const Dentry = d;
    loop {
        if std::ptr::eq(cur, a) {
            return true;
        }
        // SAFETY: ancestors of a referenced dentry are referenced by their
        // children; the fs rename mutex keeps the chain from changing.
        let c = unsafe { &*cur };
        if c.is_root() {
            return false;
        }
        cur = c.parent_ptr();
    }
}

/// Whether an uncounted parent (`ParentWalk`) went away before its
/// directory's lock was taken (the caller holds it now, shared): unhashed
/// (a mount's root: retired), dead, or its inode removed. Nothing can do that to it while the lock is
/// held (`Task::lock_name`).
fn parent_gone(pw: &ParentWalk) -> bool {
    let p = &*pw.parent;
    let gone = !pw.counted
        && (p.dentry.lockref().is_dead() || !p.dentry.is_attached() || p.inode().is_dead());
    if gone {
        scalevfs_sync::lockstat::inc(scalevfs_sync::lockstat::Stat::WalkAborted);
    }
    gone
}

/// `redo_counted` for the operations that make a name (mkdir, mknod,
/// symlink, link, open with O_CREAT), which fail with ENOSPC before they
/// change anything (a create whose ACL fails is undone: `undo_create`).
/// Not for rename (a whiteout that fails leaves the rename done) or unlink.
///
/// ENOSPC may come from space or inodes that removed files still hold
/// through deferred frees (a dentry, and with it its inode, is freed a
/// grace period after its last name goes; other threads' frees run as
/// their grace periods end): then flush this thread's deferred frees and
/// try again, a few times with a short pause (no lock of the core is held
/// here). Threads creating and removing files on an ext4 image with few
/// free inodes got ENOSPC with thousands of removed inodes still held
/// (review, stop 38). The waits: `EnospcWait` (31 ms on a full
/// filesystem, up to a second while inodes are being dropped, none for an
/// ENOSPC the filesystem calls final). Before the first wait, the cached
/// negative names under removed directories are evicted
/// (`Dcache::prune_dead_negatives`): they held those directories' inodes.
pub(crate) fn redo_counted_enospc<R>(
    dcache: &crate::dcache::Dcache,
    f: impl Fn(bool) -> VfsResult<R>,
) -> VfsResult<R> {
    let once = || {
        enospc_final_reset();
        redo_counted(&f)
    };
    let mut r = once();
    let mut wait = None;
    while matches!(r, Err(e) if e == Errno::ENOSPC) {
        if wait.is_none() && !enospc_is_final() {
            // Removed directories still held by cached negative names
            // under them: their inodes come back once those go (see
            // `Dcache::prune_dead_negatives`), in this wait's frees.
            dcache.prune_dead_negatives();
        }
        if !wait.get_or_insert_with(|| EnospcWait::new(true)).round() {
            break;
        }
        r = once();
    }
    r
}

thread_local! {
    /// Set by a filesystem with the ENOSPC it is about to return when no
    /// freeing can cure it (`enospc_final`).
    static ENOSPC_FINAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// For filesystems: the ENOSPC this thread is about to return is not for
/// want of free space, so no freeing cures it (an extended attribute too
/// large for the room an inode has, which is what ext4 and Linux answer
/// then): the VFS returns it at once instead of flushing deferred frees
/// and trying again (`EnospcWait`), and a journaled filesystem need not
/// commit to free blocks first (`enospc_is_final`). Two fsstress
/// processes setting attributes that did not fit spent 31 ms and a commit
/// on each (xfstests generic/642 ran for many minutes).
pub fn enospc_final() {
    ENOSPC_FINAL.with(|f| f.set(true));
}

/// Whether this thread's filesystem call said its ENOSPC is final
/// (`enospc_final`) since the VFS last started one.
pub fn enospc_is_final() -> bool {
    ENOSPC_FINAL.with(std::cell::Cell::get)
}

/// Forget `enospc_final`: the VFS before each try of a call, a
/// filesystem at the start of an operation of its own.
pub fn enospc_final_reset() {
    ENOSPC_FINAL.with(|f| f.set(false));
}

/// The waits between the tries of an operation that found no space
/// (`redo_counted_enospc`, `Task::redo_enospc`): space or inodes may be
/// held by removed files whose last reference sits in a deferred free
/// (limbo.rs), this thread's or another's. Each round flushes this
/// thread's and pauses, 1, 2, 4, 8, 16 ms, then 16 ms each; while it
/// lives every thread hands its sealed batches of deferred frees to the
/// epoch at its next call (`limbo::Pressure`). Six rounds (31 ms) always; more, up to a second
/// in all, while inodes keep being dropped somewhere
/// (`limbo::inodes_dropped`: a removed file's last reference going gives
/// its space back): with many more threads than cores, a thread holding
/// frees may wait that long for a core (32 threads creating and removing
/// files on 2 cores and 2,036 inodes, tests/enospc_churn.rs). Stops after
/// four rounds in which no inode was dropped. Only for the operations
/// that make a name (`extend`; they need an inode): a write or attribute
/// change keeps the six rounds. Extended on any progress of frees, two
/// threads whose attributes did not fit in their inodes kept each other
/// going for the whole second, each freeing what the other's tries left
/// (xfstests generic/642, its fsstress slowed to a crawl). A full
/// filesystem pays 31 ms per failed call, a name operation more only
/// while inodes are being dropped.
pub(crate) struct EnospcWait {
    _pressure: crate::limbo::Pressure,
    /// Whether rounds past the sixth may follow (name operations only).
    extend: bool,
    round: u32,
    start: std::time::Instant,
    dropped: usize,
    idle: u32,
}

impl EnospcWait {
    pub(crate) fn new(extend: bool) -> EnospcWait {
        EnospcWait {
            _pressure: crate::limbo::Pressure::new(),
            extend,
            round: 0,
            start: std::time::Instant::now(),
            dropped: crate::limbo::inodes_dropped(),
            idle: 0,
        }
    }

    /// Wait for the next try; false: give up (ENOSPC stands).
    pub(crate) fn round(&mut self) -> bool {
        if enospc_is_final() {
            return false;
        }
        if self.round >= ENOSPC_RETRIES
            && (!self.extend
                || self.idle >= 4
                || self.start.elapsed() >= std::time::Duration::from_secs(1))
        {
            return false;
        }
        if self.round > 0 {
            let ms = 1u64 << (self.round - 1).min(4);
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        self.round += 1;
        crate::flush_deferred_frees();
        let now = crate::limbo::inodes_dropped();
        if now == self.dropped {
            self.idle += 1;
        } else {
            self.idle = 0;
        }
        self.dropped = now;
        true
    }
}

/// Run a name operation with an uncounted parent walk, and once more with a
/// counted one if that parent went away before it was locked
/// (`Task::lock_name`, `Errno::RESTART_WALK`).
pub(crate) fn redo_counted<R>(f: impl Fn(bool) -> VfsResult<R>) -> VfsResult<R> {
    match f(false) {
        Err(e) if e == Errno::RESTART_WALK => f(true),
        r => r,
    }
}

/// Retries of a name operation that failed with ENOSPC (`redo_counted_enospc`):
/// pauses of 1, 2, 4, 8 and 16 ms between them, 31 ms in all.
pub(crate) const ENOSPC_RETRIES: u32 = 6;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A write or attribute change waits six rounds whatever happens
    /// meanwhile: extended like a name operation, two threads whose
    /// attributes did not fit kept each other waiting a second per call.
    #[test]
    fn enospc_wait_of_a_write_is_six_rounds() {
        let mut w = EnospcWait::new(false);
        let mut rounds = 0;
        while w.round() {
            rounds += 1;
            crate::limbo::inode_dropped();
            assert!(rounds <= ENOSPC_RETRIES, "{rounds} rounds");
        }
        assert_eq!(rounds, ENOSPC_RETRIES);
    }

    /// A name operation goes on waiting while inodes are being dropped,
    /// and stops within about a second.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "under Miri six rounds take longer than the second the waits are bounded by"
    )]
    fn enospc_wait_of_a_name_operation_goes_on_while_inodes_drop() {
        let t0 = std::time::Instant::now();
        let mut w = EnospcWait::new(true);
        let mut rounds = 0;
        while w.round() {
            rounds += 1;
            crate::limbo::inode_dropped();
        }
        assert!(rounds > ENOSPC_RETRIES, "{rounds} rounds");
        assert!(t0.elapsed() < std::time::Duration::from_secs(10));
    }
}
