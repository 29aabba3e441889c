//! Mounts and locations: a filesystem instance attached at a point of the
//! namespace (`Mount`), a counted (mount, dentry) pair (`PathRef`), and the
//! mount table the lock-free walk reads.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;

use crossbeam_epoch as epoch;
use scalevfs_sync::primitive::{AtomicBool, AtomicI64, Ordering};

use crate::dcache::{Dentry, DentryRef};
use crate::percpu::SplitCount;
use crate::sb::Super;

/// A mount: a filesystem instance attached at a point of the namespace.
pub struct Mount {
    pub(crate) id: u64,
    pub(crate) sb: Arc<Super>,
    pub(crate) root: DentryRef,
    /// Where it is mounted: the parent mount and the mount point dentry.
    pub(crate) parent: Option<(MntRef, DentryRef)>,
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
    /// The references (`MntRef`s) on this mount: see `MntRef`.
    refs: MntCount,
}

impl Drop for Mount {
    fn drop(&mut self) {
        // Threads' spare references on the root come back before the root's
        // last put below (dcache.rs, PARENT REFERENCES).
        crate::dcache::retire_root(&self.root);
    }
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
    /// A mount with these parts and no flags set.
    pub(crate) fn new(
        id: u64,
        sb: Arc<Super>,
        root: DentryRef,
        parent: Option<(MntRef, DentryRef)>,
        readonly: bool,
    ) -> Mount {
        Mount {
            id,
            sb,
            root,
            parent,
            readonly: AtomicBool::new(readonly),
            noatime: AtomicBool::new(false),
            writers: SplitCount::default(),
            users: SplitCount::default(),
            refs: MntCount::default(),
        }
    }

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
    /// A change of data in progress through this mount (Linux's
    /// `mnt_want_write` with its count, and the file reference a write
    /// holds): counted as a writer and a user until the guard drops, so a
    /// read-only remount or an unmount is EBUSY meanwhile, though another
    /// thread closed the fd the change came through (its slot's counts
    /// went with the close). EROFS if the mount is read-only already.
    /// Per-thread slots: two threads' writes share no line here.
    pub(crate) fn want_write(&self) -> crate::errno::VfsResult<WantWrite<'_>> {
        self.users.add(1);
        // SeqCst inside, then the SeqCst load: the Dekker pair with
        // `Vfs::remount_at` (see `is_readonly`).
        self.add_writer();
        let g = WantWrite(self);
        self.check_writable()?;
        Ok(g)
    }
    pub fn sb(&self) -> &Arc<Super> {
        &self.sb
    }
}

/// See [`Mount::want_write`].
pub(crate) struct WantWrite<'a>(&'a Mount);

impl Drop for WantWrite<'_> {
    fn drop(&mut self) {
        self.0.drop_writer();
        self.0.release();
    }
}

// ---------------------------------------------------------------------
// Mount references
// ---------------------------------------------------------------------

/// Bias of `MntCount::slow` between a detach and the fold of the per-thread
/// counts: far above any real count, so the slow count cannot reach zero
/// before the fold.
const DETACH_BIAS: i64 = 1 << 48;

/// The reference count of a mount, Linux's `mnt_count` (per CPU there).
///
/// While the mount is in the tree (`detached` false) a reference taken or
/// dropped changes this thread's slot of `fast` only: an open or a walk
/// result on one thread writes no line another thread's opens write, where
/// an `Arc<Mount>` count was one line for every open of the whole mount
/// (issue 16). Nothing is freed in this mode (the tree holds a reference).
///
/// When the mount leaves the tree (`MntRef::detach`: unmount, or the `Vfs`
/// going away) it switches to one exact counter, `slow`, as Linux's
/// `mntput` takes its slow path once the mount is out of the namespace:
/// 1. `detached` is set (SeqCst) and `slow` starts at `DETACH_BIAS`;
/// 2. every change that read `detached` false did so inside an epoch pin
///    (`get`/`put` pin), so once every thread pinned at step 1 has unpinned
///    no fast-path change is in flight or can start: the function deferred
///    at step 1 then runs (crossbeam-epoch's grace period), reads the now
///    stable sum of `fast` and adds `sum - DETACH_BIAS` to `slow`;
/// 3. changes after step 1 go to `slow`; whichever change brings it to 0
///    (a last `put`, or the fold itself when no reference is left) frees
///    the mount. The bias keeps `slow` above 0 until the fold, so a count
///    that is only transiently low (taken on one thread and dropped on
///    another) never frees early.
#[derive(Default)]
pub(crate) struct MntCount {
    fast: SplitCount,
    slow: AtomicI64,
    detached: AtomicBool,
}

/// The steps of the protocol, on atomics only; `MntRef` adds the epoch pin
/// around `get`/`put` and the grace period before `fold` (the loom model
/// `loom_models::mount_count_*` drives these steps with an explicit grace
/// period).
impl MntCount {
    /// Count one more reference (an epoch pin held).
    pub(crate) fn get(&self) {
        // SeqCst: the Dekker pair with `detach`'s swap (see above).
        if !self.detached.load(Ordering::SeqCst) {
            self.fast.add(1);
        } else {
            // SeqCst: as above; the bias keeps it above 0 until the fold.
            self.slow.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Count one reference fewer (an epoch pin held); true if it was the
    /// last one of a detached, folded mount: the caller frees it.
    pub(crate) fn put(&self) -> bool {
        // SeqCst: the Dekker pair with `detach` (see above).
        if !self.detached.load(Ordering::SeqCst) {
            self.fast.add(-1);
            false
        } else {
            // SeqCst: as above.
            self.slow.fetch_sub(1, Ordering::SeqCst) == 1
        }
    }

    /// Step 1: switch to the exact count; false if already detached.
    pub(crate) fn detach(&self) -> bool {
        // SeqCst: the bias is in place before any slow-path change can
        // follow the flag.
        self.slow.store(DETACH_BIAS, Ordering::SeqCst);
        !self.detached.swap(true, Ordering::SeqCst)
    }

    /// Step 2, after a grace period (no `get`/`put` that read `detached`
    /// false is still running): fold the per-thread counts into the exact
    /// one; true if no reference is left (the caller frees the mount).
    pub(crate) fn fold(&self) -> bool {
        let total = self.fast.sum();
        // SeqCst: as in `get`.
        self.slow.fetch_add(total - DETACH_BIAS, Ordering::SeqCst) + total - DETACH_BIAS == 0
    }
}

/// A counted reference to a mount (Linux's `mntget`/`mntput`): keeps the
/// mount (and through it its superblock and root dentry) alive. Cheap to
/// clone and drop while the mount is in the tree (a per-thread slot, see
/// `MntCount`).
pub struct MntRef {
    ptr: NonNull<Mount>,
}

// SAFETY: a MntRef is a shared reference to a `Mount` plus a count kept with
// atomics; `Mount` is `Send + Sync` (its fields are atomics, Arcs and
// DentryRefs), and the count may be dropped on any thread (the slots are
// summed).
unsafe impl Send for MntRef {}
// SAFETY: as for Send: `&MntRef` only gives `&Mount`.
unsafe impl Sync for MntRef {}

/// A mount pointer moved into the deferred fold (see `MntCount`).
struct Folding(NonNull<Mount>);
// SAFETY: the fold only touches the mount's atomics and, when it frees the
// mount, owns it (the count is 0: nobody else refers to it).
unsafe impl Send for Folding {}

impl MntRef {
    /// A new mount with one reference (this one).
    pub(crate) fn new(m: Mount) -> MntRef {
        m.refs.fast.add(1);
        MntRef {
            ptr: NonNull::from(Box::leak(Box::new(m))),
        }
    }

    /// A new reference on the mount at `p`, reached without one (the
    /// walk's `hold`/`legitimize`).
    ///
    /// # Safety
    /// `p` came from [`MntRef::as_ptr`] and the mount is alive for the
    /// duration of the call: the caller's epoch guard has been held since
    /// it read `p` from the mount table or from a `MntRef` that the walk
    /// holds (a detached mount's fold waits for that guard, see
    /// `MntCount`).
    pub(crate) unsafe fn from_pinned(p: *const Mount) -> MntRef {
        // SAFETY: the caller's contract: alive and from a MntRef's pointer.
        let ptr = unsafe { NonNull::new_unchecked(p as *mut Mount) };
        let r = MntRef { ptr };
        r.get();
        r
    }

    pub fn as_ptr(&self) -> *const Mount {
        self.ptr.as_ptr()
    }

    /// Whether `a` and `b` refer to the same mount.
    pub fn ptr_eq(a: &MntRef, b: &MntRef) -> bool {
        a.ptr == b.ptr
    }

    /// Count one more reference.
    fn get(&self) {
        let _g = epoch::pin();
        self.refs.get();
    }

    /// The mount leaves the tree: from now on its count is exact and the
    /// last reference frees it (see `MntCount`). Called once per mount,
    /// under the mount lock or by the last owner of the `Vfs`. The flag
    /// returned turns true once the per-thread counts have been folded
    /// (after a grace period).
    pub(crate) fn detach(&self) -> Arc<std::sync::atomic::AtomicBool> {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let g = epoch::pin();
        if !self.refs.detach() {
            debug_assert!(false, "mount detached twice");
            // Release, as the fold's store below, though nothing is
            // published here (no fold was scheduled, nothing was freed):
            // the flag only tells the waiters (`Vfs` drop and umount, with
            // Acquire) not to wait; Relaxed would do.
            done.store(true, std::sync::atomic::Ordering::Release);
            return done;
        }
        let m = Folding(self.ptr);
        let folded = done.clone();
        g.defer(move || {
            let m = m;
            // SAFETY: the bias keeps the mount alive until this fold.
            let c = unsafe { &m.0.as_ref().refs };
            if c.fold() {
                // SAFETY: no reference is left and the mount is out of the
                // tree: nobody can reach it any more; we own it.
                drop(unsafe { Box::from_raw(m.0.as_ptr()) });
            }
            // Release: whoever waits for the fold sees its effects.
            folded.store(true, std::sync::atomic::Ordering::Release);
        });
        g.flush();
        done
    }
}

impl std::ops::Deref for MntRef {
    type Target = Mount;
    #[inline]
    fn deref(&self) -> &Mount {
        // SAFETY: this reference keeps the mount alive.
        unsafe { self.ptr.as_ref() }
    }
}

impl Clone for MntRef {
    #[inline]
    fn clone(&self) -> MntRef {
        self.get();
        MntRef { ptr: self.ptr }
    }
}

impl Drop for MntRef {
    #[inline]
    fn drop(&mut self) {
        let last = {
            // A file's drop may run inside a collection (limbo.rs, "Pins
            // in frees").
            let _g = crate::limbo::pin();
            self.refs.put()
        };
        if last {
            // SAFETY: this was the last reference of a detached mount
            // (after its fold): nobody else can reach it; we own it.
            drop(unsafe { Box::from_raw(self.ptr.as_ptr()) });
        }
    }
}

impl std::fmt::Debug for MntRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// A counted location in the namespace: a mount and a dentry in it.
#[derive(Clone, Debug)]
pub struct PathRef {
    pub mnt: MntRef,
    pub dentry: DentryRef,
}

impl PathRef {
    pub(crate) fn same(&self, mnt: *const Mount, d: *const Dentry) -> bool {
        std::ptr::eq(self.mnt.as_ptr(), mnt) && std::ptr::eq(self.dentry.as_ptr(), d)
    }
    /// For `..`: climb out of mount roots to their mount points, stopping
    /// at `root`. `Ok(p)`: `..` is the parent dentry of `p`, in `p`'s mount.
    /// `Err(p)`: `p` is `root` or the top of the namespace, its own `..`.
    pub(crate) fn climb_for_dotdot(self, root: &PathRef) -> Result<PathRef, PathRef> {
        let mut cur = self;
        loop {
            if cur.same(root.mnt.as_ptr(), root.dentry.as_ptr()) {
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
    pub(crate) on: HashMap<(usize, usize), MntRef>,
}
