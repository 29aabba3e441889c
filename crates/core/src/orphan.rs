//! Orphan glue: when an inode goes on the filesystem's orphan file (the
//! algorithm lives in the `scalevfs-orphan` crate) and how the last close
//! decides, without a lock, whether it has work to do.
//!
//! Orphan lifecycle (in memory; the persistent type writes the same slots):
//! - `unlink` / rename-over that drops a regular file's link count to 0 while
//!   the file is open, and `O_TMPFILE` (nlink 0 from birth), call
//!   [`mark_unlinked`]: the inode takes a slot, flag `UNLINKED` is set.
//! - `truncate` holds a registration for its duration ([`TruncateGuard`]).
//! - The last close of an inode ([`file_closed`]) frees the slot if the inode
//!   was unlinked. The inode's memory goes with the last reference.
//!
//! Last close without a lock: each open file description counts once in
//! `opens`. A close decrements it; only the one that reaches 0 *and* sees a
//! non-zero `state` (unlinked, or a truncate in progress) takes the slow
//! path. The race between "unlink marks the inode" and "the last close
//! leaves" is the store-buffer pattern: unlink stores `state` then loads
//! `opens`, close RMWs `opens` then loads `state`, all SeqCst, so at least one
//! of them sees the other and runs the slow path; the slow path rechecks
//! under the inode's registration lock, so running it twice is harmless.
//! An open racing with unlink (found the name before it went) is caught the
//! same way by [`file_opened`]: it counts itself, then looks at nlink behind
//! a SeqCst fence, pairing with the fence in [`mark_unlinked`].
//!
//! LOCKING RULES
//! - `InodeOrphan::reg` (spinlock, per inode): the registration count and
//!   the slot. Taken by unlink, truncate and the last-close slow path; never
//!   by the common close. It nests inside the inode's data lock (truncate)
//!   and outside the orphan file's own locks. Nothing is pinned while it is
//!   held.

use scalevfs_orphan::{thread_hint, OrphanFile, OrphanVariant};
use scalevfs_sync::primitive::{fence, Ordering};

use crate::inode::{Inode, Reg};
use crate::types::FileType;

/// `state` bit: unlinked while open, holds a registration.
const UNLINKED: u32 = 1;
/// `state` increment per truncate in progress.
const TRUNCATING: u32 = 2;

fn tracked(of: &OrphanFile, inode: &Inode) -> bool {
    of.variant() != OrphanVariant::None && inode.file_type() == FileType::Regular
}

fn register_locked(of: &OrphanFile, inode: &Inode, r: &mut Reg) {
    if r.count == 0 {
        r.slot = Some(of.add(inode.ino(), thread_hint()));
    }
    r.count += 1;
}

fn unregister_locked(of: &OrphanFile, inode: &Inode, r: &mut Reg) {
    r.count = r.count.saturating_sub(1);
    if r.count == 0 {
        if let Some(s) = r.slot.take() {
            of.remove(s, inode.ino());
        }
    }
}

/// A new open file description of `inode`.
pub(crate) fn file_opened(of: &OrphanFile, inode: &Inode) {
    let o = &inode.orphan;
    o.opens.fetch_add(1, Ordering::SeqCst);
    if !tracked(of, inode) {
        return;
    }
    // Pairs with the fence in `mark_unlinked` (store-buffer pattern: our
    // count vs its nlink).
    fence(Ordering::SeqCst);
    if inode.attr().nlink == 0 {
        mark_unlinked(of, inode);
    }
}

/// The last reference to an open file description of `inode` went away.
#[inline]
pub(crate) fn file_closed(of: &OrphanFile, inode: &Inode) {
    let o = &inode.orphan;
    if o.opens.fetch_sub(1, Ordering::SeqCst) == 1 && o.state.load(Ordering::SeqCst) != 0 {
        last_close_slow(of, inode);
    }
}

#[cold]
fn last_close_slow(of: &OrphanFile, inode: &Inode) {
    let o = &inode.orphan;
    let mut r = o.reg.lock();
    if r.unlinked && o.opens.load(Ordering::SeqCst) == 0 {
        r.unlinked = false;
        o.state.fetch_and(!UNLINKED, Ordering::SeqCst);
        unregister_locked(of, inode, &mut r);
    }
    // A truncate in progress drops its own registration when it ends.
}

/// `inode`'s link count dropped to 0 (unlink, rename over it, O_TMPFILE):
/// record it on the orphan file while it is open.
pub(crate) fn mark_unlinked(of: &OrphanFile, inode: &Inode) {
    if !tracked(of, inode) {
        return;
    }
    let o = &inode.orphan;
    // Pairs with the fence in `file_opened`: either it sees nlink 0, or we
    // see its count.
    fence(Ordering::SeqCst);
    if o.opens.load(Ordering::SeqCst) == 0 {
        return;
    }
    {
        let mut r = o.reg.lock();
        if r.unlinked {
            return;
        }
        register_locked(of, inode, &mut r);
        r.unlinked = true;
        o.state.fetch_or(UNLINKED, Ordering::SeqCst);
    }
    // The last close may have left between our check and the mark.
    if o.opens.load(Ordering::SeqCst) == 0 {
        last_close_slow(of, inode);
    }
}

/// `inode` got a name again (linkat of an O_TMPFILE file): off the orphan
/// file, as Linux's link takes a linkable tmpfile off the orphan list.
pub(crate) fn mark_linked(of: &OrphanFile, inode: &Inode) {
    if !tracked(of, inode) {
        return;
    }
    let o = &inode.orphan;
    let mut r = o.reg.lock();
    if r.unlinked {
        r.unlinked = false;
        o.state.fetch_and(!UNLINKED, Ordering::SeqCst);
        unregister_locked(of, inode, &mut r);
    }
}

/// Whether `inode` is on the orphan file as unlinked (tests, fsck).
pub fn is_orphan(inode: &Inode) -> bool {
    inode.orphan.state.load(Ordering::SeqCst) & UNLINKED != 0
}

/// Holds `inode` on the orphan file for the duration of a truncate.
pub(crate) struct TruncateGuard<'a> {
    of: &'a OrphanFile,
    inode: &'a Inode,
}

impl<'a> TruncateGuard<'a> {
    pub(crate) fn new(of: &'a OrphanFile, inode: &'a Inode) -> Option<TruncateGuard<'a>> {
        if !tracked(of, inode) {
            return None;
        }
        let o = &inode.orphan;
        o.state.fetch_add(TRUNCATING, Ordering::SeqCst);
        register_locked(of, inode, &mut o.reg.lock());
        Some(TruncateGuard { of, inode })
    }
}

impl Drop for TruncateGuard<'_> {
    fn drop(&mut self) {
        let o = &self.inode.orphan;
        unregister_locked(self.of, self.inode, &mut o.reg.lock());
        o.state.fetch_sub(TRUNCATING, Ordering::SeqCst);
    }
}
