//! Mounts and locations: a filesystem instance attached at a point of the
//! namespace (`Mount`), a counted (mount, dentry) pair (`PathRef`), and the
//! mount table the lock-free walk reads.

use std::collections::HashMap;
use std::sync::Arc;

use scalevfs_sync::primitive::{AtomicBool, Ordering};

use crate::dcache::{Dentry, DentryRef};
use crate::percpu::SplitCount;
use crate::sb::Super;

/// A mount: a filesystem instance attached at a point of the namespace.
pub struct Mount {
    pub(crate) id: u64,
    pub(crate) sb: Arc<Super>,
    pub(crate) root: DentryRef,
    /// Where it is mounted: the parent mount and the mount point dentry.
    pub(crate) parent: Option<(Arc<Mount>, DentryRef)>,
    /// Read-only (EROFS); flipped by `Vfs::remount_at`.
    pub(crate) readonly: AtomicBool,
    /// `noatime`: reads through this mount never update atime (set by
    /// `Task::set_noatime`, e.g. from the FUSE front end's `-o noatime`).
    pub(crate) noatime: AtomicBool,
    /// Regular files open for writing through this mount (Linux's
    /// mnt_writers, per-CPU there, per-thread slots here): a read-only
    /// remount is EBUSY while any is open.
    pub(crate) writers: SplitCount,
    /// What keeps it busy for `umount` (Linux's mnt_count beyond the tree's
    /// own): fd-table slots holding a file in it, and tasks' root or cwd
    /// snapshots in it. Changed with `hold`/`release`.
    pub(crate) users: SplitCount,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount")
            .field("id", &self.id)
            .field("sb", &self.sb)
            .finish()
    }
}

impl Mount {
    pub(crate) fn hold(&self) {
        // A per-thread slot: an open or close writes no line that other
        // threads' opens write (issue 16). An open racing with umount is not
        // excluded (see umount_at).
        self.users.add(1);
    }
    pub(crate) fn release(&self) {
        self.users.add(-1);
    }
    pub fn is_readonly(&self) -> bool {
        // SeqCst: with `writers`, a Dekker pair against `Vfs::remount_at`
        // (see `File::new`).
        self.readonly.load(Ordering::SeqCst)
    }
    /// EROFS on a read-only mount: the check every change makes first
    /// (Linux's `mnt_want_write` without the count; writers of regular
    /// files are counted in `File::new`).
    pub fn check_writable(&self) -> crate::errno::VfsResult<()> {
        if self.is_readonly() {
            Err(crate::errno::Errno::EROFS)
        } else {
            Ok(())
        }
    }
    pub fn is_noatime(&self) -> bool {
        // Relaxed: a policy bit; a read racing with the change may go
        // either way, as on Linux.
        self.noatime.load(Ordering::Relaxed)
    }
    /// A regular file opened for writing (`File::new`).
    pub(crate) fn add_writer(&self) {
        // SeqCst inside: the store side of the Dekker pair (see
        // `is_readonly` and `SplitCount`).
        self.writers.add(1);
    }
    pub(crate) fn drop_writer(&self) {
        self.writers.add(-1);
    }
    pub fn sb(&self) -> &Arc<Super> {
        &self.sb
    }
}

/// A counted location in the namespace: a mount and a dentry in it.
#[derive(Clone, Debug)]
pub struct PathRef {
    pub mnt: Arc<Mount>,
    pub dentry: DentryRef,
}

impl PathRef {
    pub(crate) fn same(&self, mnt: *const Mount, d: *const Dentry) -> bool {
        std::ptr::eq(Arc::as_ptr(&self.mnt), mnt) && std::ptr::eq(self.dentry.as_ptr(), d)
    }
    /// For `..`: climb out of mount roots to their mount points, stopping
    /// at `root`. `Ok(p)`: `..` is the parent dentry of `p`, in `p`'s mount.
    /// `Err(p)`: `p` is `root` or the top of the namespace, its own `..`.
    pub(crate) fn climb_for_dotdot(self, root: &PathRef) -> Result<PathRef, PathRef> {
        let mut cur = self;
        loop {
            if cur.same(Arc::as_ptr(&root.mnt), root.dentry.as_ptr()) {
                return Err(cur);
            }
            if cur.dentry.as_ptr() != cur.mnt.root.as_ptr() {
                return Ok(cur);
            }
            match cur.mnt.parent.clone() {
                Some((mnt, dentry)) => cur = PathRef { mnt, dentry },
                None => return Err(cur),
            }
        }
    }

    /// The parent dentry of this location, in the same mount.
    pub(crate) fn dentry_parent(self) -> PathRef {
        let dentry = self.dentry.parent();
        PathRef {
            mnt: self.mnt,
            dentry,
        }
    }

    pub fn inode(&self) -> &Arc<crate::inode::Inode> {
        // A PathRef always names a positive dentry.
        self.dentry
            .inode()
            .expect("PathRef names a positive dentry")
    }
}

/// The mount table, replaced as a whole (copy on write) on mount/unmount and
/// read under an epoch guard by the lock-free walk.
#[derive(Default)]
pub(crate) struct MountTable {
    /// (parent mount, mount point dentry) -> mount on top.
    pub(crate) on: HashMap<(usize, usize), Arc<Mount>>,
}
