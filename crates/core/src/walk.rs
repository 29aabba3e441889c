//! Path walk (namei).
//!
//! TWO MODES, and how one hands over to the other. The locked loop first:
//!
//! ```text
//! cur = start (counted reference)
//! for each component c:
//!     check cur is a directory and searchable
//!     child = lookup_ref(cur, c)          // bucket lock, get_not_dead
//!           or fs.lookup(cur, c) + add    // on a miss of a non-authoritative fs
//!     if child is a mount point: cross into the mounted root
//!     if child is a symlink to follow: push its body onto the component stack
//!     cur = child                         // dput(old cur)
//! ```
//!
//! Each step writes two shared cache lines (the child's LockRef up, the
//! parent's down). Each step is one lookup under the bucket lock, so the
//! locked walk is a *sequence* of atomic steps, not an atomic whole: a
//! rename of a directory the walk has already passed does not affect it,
//! and a rename or unlink of the leaf after its step leaves the walk holding
//! the moved or unlinked dentry (Linux's reference walk is the same). That
//! sequence is the specification the lock-free loop meets. It is the same
//! loop with each step validated on its own in place of references:
//!
//! ```text
//! pin an epoch guard; m0 = mount_seq.read_begin()
//! cur = start (raw pointer, no reference)
//! for each component c:
//!     check directory and search permission (the inode's mode copy, or
//!         its attributes read under the inode seqlock: a copy, no lock)
//!     match lookup_rcu(cur, c):           // hash chain walk, no lock
//!         Hit(child) -> cur = child       // child's d_seq even and unchanged
//!                                         //   around its (parent, name, hashed)
//!         Miss       -> ENOENT if the fs is authoritative, else UNLAZY
//!                                         // the bucket's seq unchanged
//!         Retry      -> UNLAZY
//!     ".." -> cur = cur.parent            // one atomic load
//! at the leaf: the caller's closure runs under the guard (stat copies the
//!     attributes); then mount_seq.retry(m0): a mount or umount since the
//!     start voids the result (the walk is redone in reference mode).
//! ```
//!
//! WHY EACH STEP IS LINEARIZABLE. A step's answer is one the locked lookup
//! could give at an instant inside the step:
//!
//! - A hit: the child's d_seq was even before and unchanged after the reads
//!   of its parent pointer, name and `D_HASHED` flag, so those belong to one
//!   instant, at which the child was the hashed dentry of (cur, c). `d_move`
//!   and `d_exchange` write the moved dentries' d_seq around every change of
//!   those fields (Linux's rule: rename bumps the moved dentry's d_seq).
//! - A miss: the bucket's sequence was even at the start of the chain walk
//!   and unchanged at its end. Everything that can make a chain walk miss a
//!   name that is there writes it: a move re-links a dentry into another
//!   chain (a reader standing on it would follow it there) and a rename
//!   over a name, or `add` over a negative dentry, links the new dentry in
//!   at the head, behind the reader, and unlinks the old one ahead of it
//!   (both write every bucket they touch, `Dcache::lock_buckets`). A plain
//!   insert or unhash does not need to: the miss is linearized before the
//!   insert, or after the unhash.
//! - Permission, directory and symlink checks read the current directory's
//!   inode, which never changes for a dentry (the inode pointer and type
//!   are fixed at allocation; a unlink unhashes the dentry, it does not make
//!   it negative); the mode is read with one load or a seqlock copy.
//! - `..`: the parent pointer is read with one atomic load: the parent at
//!   that instant, which is what the locked walk's `dget_parent` reads too.
//!   A walk that goes up from a directory renamed since it entered it goes
//!   to the new parent, as the locked walk does.
//!
//! Steps are taken in program order, so the lock-free walk's answer is one
//! the locked walk could give: the same sequence of step answers. The two
//! walks differ in one way: the locked walk holds the directory it stands
//! on, the lock-free one does not, so that directory can die under it
//! (unhashed and put, or evicted from a non-authoritative filesystem). The
//! guard keeps its memory, and it answers as the locked walk's unhashed
//! directory would: a dead dentry has no children (a child holds a count on
//! its parent), so every lookup in it misses; on an authoritative
//! filesystem that ENOENT is right (a directory is removed or replaced only
//! when empty); on another one the miss un-lazies, and `get_not_dead` fails
//! on the dead dentry, so the walk restarts. Its parent pointer no longer
//! changes, so `..` from it is the locked walk's `..` too.
//!
//! Why no check of the parent's d_seq after the child is found (Linux's
//! `lookup_fast` re-checks it, forming an interlocked chain of seqcount
//! checks down the path): Linux needs the chain because a dentry's inode
//! can change (unlink makes a dentry negative, a create instantiates one)
//! and `nd->inode` and the permission check were read from it, and because
//! `legitimize_path` re-validates the whole position at unlazy. Here a
//! dentry's inode is fixed at allocation and the position is re-taken with
//! `get_not_dead` (below), so the child's own validation is the whole step
//! check. Not needing it is what makes a rename of an unrelated name
//! invisible to walks: a file's rename writes only its own dentry's d_seq
//! and the two buckets' lines (issue 16); the global rename sequence is
//! written only by moves of directories, for `getcwd`'s climb, which must
//! see one tree (Linux's `d_path` and `rename_lock`). The walk reads it
//! nowhere.
//!
//! THE LEAF, FOR CALLERS THAT TAKE NO REFERENCE (stat, access, readlink).
//! The closure reads the leaf's inode under the guard after the step that
//! found it, as the locked walk reads it after its last lookup while
//! holding the leaf; the attributes are a seqlock copy. What is validated
//! afterwards is only the mount sequence: a mount or umount during the walk
//! voids it (Linux's `mount_lock` seqcount, which only mount changes write:
//! every mount crossing of one walk then comes from one mount table).
//! Errors found on the way (ENOENT from a validated miss, ENOTDIR, EACCES,
//! ELOOP) are answers of single steps and are returned the same way.
//!
//! UNLAZY ("partial") and LEGITIMIZE: when a step cannot finish lock-free
//! (a miss on a filesystem that is not dcache-authoritative, a `Retry`, a
//! symlink body the filesystem cannot give lock-free), the walk takes a
//! reference on the directory it stands on (`get_not_dead`) and, with it,
//! one on the mount, if the mount sequence has not moved. If both hold it
//! continues from there in reference mode, redoing the component: the
//! reference pins a position the walk reached by valid steps, so the
//! continuation is the locked walk's. If `get_not_dead` fails (the
//! directory died) or a mount changed, the walk is ABORTED and restarted
//! from the beginning in reference mode. A walk that finished lock-free is
//! HANDLED; callers that keep the result (open, chdir, the parent of a
//! create) legitimize the leaf the same way. The three outcomes are counted
//! (`Stat::WalkHandled/Partial/Aborted`).
//!
//! Callers that keep the result get a reference on the leaf only. `stat`,
//! `access` and `readlink` take no reference at all: a commuting operation
//! writes no shared cache line, and a rename of another name writes nothing
//! such a walk reads.
//!
//! The whole walk runs under one epoch guard, pinned before any lock.

use std::mem::ManuallyDrop;

use crossbeam_epoch::Guard;
use scalevfs_sync::lockstat::{self, Stat};

use crate::config::WalkMode;
use crate::dcache::{
    Dentry, DentryRef, Pinned, RcuKeys, RcuLookup, D_DIR, D_MOUNTED, D_NEGATIVE, D_SYMLINK,
};
use crate::errno::{Errno, VfsResult};
use crate::mount::{MntRef, Mount, PathRef};
use crate::types::{Cred, FileType, MAX_SYMLINKS, NAME_MAX, PATH_MAX, X_OK};
use crate::vfs::Vfs;

/// Check a path at the API edge: NUL bytes and length.
pub(crate) fn check_path(path: &[u8]) -> VfsResult<()> {
    if has_nul(path) {
        return Err(Errno::EINVAL);
    }
    if path.len() >= PATH_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(())
}

/// `path.contains(&0)`, a word at a time (for paths of a few dozen bytes,
/// `memchr`'s byte-wise head and tail dominate a stat).
#[inline]
fn has_nul(path: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // Nonzero in a byte's high bit iff some byte of `w` is 0 (false
    // positives only above a true zero byte).
    let zeros = |w: u64| w.wrapping_sub(ONES) & !w;
    let mut acc = 0;
    let mut chunks = path.chunks_exact(8);
    for c in &mut chunks {
        acc |= zeros(u64::from_le_bytes([
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
        ]));
    }
    if !chunks.remainder().is_empty() {
        match path.last_chunk::<8>() {
            // The last 8 bytes, overlapping the words already checked.
            Some(c) => acc |= zeros(u64::from_le_bytes(*c)),
            None => return path.contains(&0),
        }
    }
    acc & HIGHS != 0
}

/// The kind of the last component of a path walked in parent mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Last {
    Normal(Vec<u8>),
    Dot,
    DotDot,
    /// The path was "/" (or resolved to a root with no component).
    Root,
}

/// The result of a parent-mode walk.
///
/// The parent is counted (a reference on its dentry), or, from a lock-free
/// walk asked for no count (`walk_parent`'s `counted` false), held by the
/// epoch guard kept here: create, unlink, mkdir, rmdir, link and rename of
/// different names in one directory then write nothing to the parent
/// dentry's LockRef (each `dget`/`dput` of it was a shared-line write per
/// call, issue 16). A mount's root is never hashed; it qualifies while its
/// mount lives (`Dentry::is_attached`), which the walk's `PathRef` ensures.
/// An uncounted parent may be evicted or killed until its directory lock
/// is held; `Task::lock_name` (and rename, once it holds both parents'
/// locks) takes the lock, then checks that the dentry is still hashed and
/// alive and its inode not removed.
/// Under that shared lock nothing can unhash or kill it: eviction
/// try-locks a directory's lock exclusively before it kills the
/// directory's dentry (`Dcache::sweep_bucket`), and rmdir and rename over
/// a directory mark the inode removed under that lock before they unhash.
/// When the check fails the operation is redone with a counted walk
/// (`Errno::RESTART_WALK`).
pub(crate) struct ParentWalk {
    /// Dropped by `Drop` below: the dentry's reference only when counted.
    pub parent: ManuallyDrop<PathRef>,
    pub last: Last,
    /// The path ended in a slash.
    pub trailing: bool,
    /// Whether `parent.dentry` owns a count.
    pub counted: bool,
    /// Keeps an uncounted parent's memory: dropped after `parent`.
    guard: Option<Guard>,
}

impl ParentWalk {
    /// Keep `g` for an uncounted parent (`Task::parent_of`).
    pub(crate) fn keep_guard(&mut self, g: Guard) {
        if !self.counted {
            self.guard = Some(g);
        }
    }
}

impl Drop for ParentWalk {
    fn drop(&mut self) {
        if self.counted {
            // SAFETY: dropped once, here; never used after.
            unsafe { ManuallyDrop::drop(&mut self.parent) };
        } else {
            // The mount's count only: the dentry's reference owns no count
            // and is forgotten (the guard, dropped after this, kept it).
            // SAFETY: dropped once, here; the rest of `parent` is a plain
            // pointer with no drop of its own once left alone.
            unsafe { std::ptr::drop_in_place(&mut self.parent.mnt) };
        }
    }
}

impl std::fmt::Debug for ParentWalk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParentWalk")
            .field("parent", &*self.parent)
            .field("last", &self.last)
            .field("trailing", &self.trailing)
            .field("counted", &self.counted)
            .finish()
    }
}

/// Component iterator over the path and a stack of symlink bodies pushed as
/// they are followed. Kept small: it runs once per component.
struct Comps<'p> {
    path: &'p [u8],
    pos: usize,
    /// Symlink bodies: (bytes, position, everything below was exhausted
    /// when it was pushed).
    links: Vec<(Vec<u8>, usize, bool)>,
    /// Symlinks followed so far (the 40-link budget), and whether the path
    /// so far demands a directory at the end (a trailing slash). Both belong
    /// to the walk, not to one mode: they survive the lock-free walk's
    /// handover to reference mode (Linux keeps them in the nameidata).
    nlinks: u32,
    must_dir: bool,
}

#[derive(Clone, Copy)]
struct Comp {
    /// 0: the path; k: `links[k - 1]`.
    buf: usize,
    start: usize,
    end: usize,
    last: bool,
    trailing: bool,
}

impl<'p> Comps<'p> {
    fn new(path: &'p [u8]) -> Self {
        Comps {
            path,
            pos: 0,
            links: Vec::new(),
            nlinks: 0,
            must_dir: false,
        }
    }

    /// Advance to the next component; `scan(buf, start)` finds where it
    /// ends (and may compute something on the way, such as its hash).
    #[inline(always)]
    fn advance<R>(
        &mut self,
        mut scan: impl FnMut(&[u8], usize) -> (usize, R),
    ) -> Option<(Comp, R)> {
        loop {
            let depth = self.links.len();
            let (b, pos, below_done): (&[u8], &mut usize, bool) = match self.links.last_mut() {
                Some((v, p, done)) => (&v[..], p, *done),
                None => (self.path, &mut self.pos, true),
            };
            let len = b.len();
            let mut p = *pos;
            while p < len && b[p] == b'/' {
                p += 1;
            }
            if p == len {
                *pos = p;
                if depth == 0 {
                    return None;
                }
                self.links.pop();
                continue;
            }
            let start = p;
            let (end, r) = scan(b, start);
            p = end;
            while p < len && b[p] == b'/' {
                p += 1;
            }
            *pos = p;
            let last = p == len && below_done;
            let c = Comp {
                buf: depth,
                start,
                end,
                last,
                trailing: end < len && last,
            };
            return Some((c, r));
        }
    }

    #[inline]
    fn next(&mut self) -> Option<Comp> {
        let scan = |b: &[u8], p: usize| {
            let end = b[p..]
                .iter()
                .position(|&c| c == b'/')
                .map_or(b.len(), |i| p + i);
            (end, ())
        };
        self.advance(scan).map(|(c, ())| c)
    }

    /// `next`, with the component hashed for lookups under `parent` in the
    /// same pass (the lock-free walk's general loop).
    #[inline(always)]
    fn next_hashed<'s>(
        &'s mut self,
        dc: &crate::dcache::Dcache,
        parent: *const Dentry,
    ) -> Option<(Comp, crate::dcache::QName<'s>)> {
        let scan = |b: &[u8], start: usize| {
            let (end, hash, words) = dc.scan_component(parent, b, start);
            (end, (hash, words))
        };
        let (c, (hash, words)) = self.advance(scan)?;
        Some((
            c,
            crate::dcache::QName::from_parts(self.bytes(c), hash, words),
        ))
    }

    #[inline]
    fn bytes(&self, c: Comp) -> &[u8] {
        let b: &[u8] = if c.buf == 0 {
            self.path
        } else {
            &self.links[c.buf - 1].0
        };
        &b[c.start..c.end]
    }

    /// Push a symlink body found at component `c`.
    fn push(&mut self, body: Vec<u8>, c: Comp) {
        self.links.push((body, 0, c.last));
    }
}

/// What a walk is for.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WalkOpts {
    /// Follow a symlink in the last component.
    pub follow: bool,
    /// Stop before the last component (create, unlink, rename, ...).
    pub parent: bool,
}

/// The start of a walk.
#[derive(Clone, Copy)]
pub(crate) enum Start<'a> {
    /// The task's cwd (relative path) or root (absolute path).
    Cwd,
    /// A directory file (dirfd); absolute paths still start at the root.
    At(&'a PathRef),
}

/// The task context a walk needs: credentials and the root/cwd.
pub(crate) struct WalkCtx<'a> {
    pub vfs: &'a Vfs,
    pub cred: &'a Cred,
    pub root: &'a PathRef,
    pub cwd: &'a PathRef,
}

/// A position in the walk; `held` owns a reference on exactly (mnt, d) in
/// reference mode. `Pinned`, not references: `hold` and `legitimize` turn
/// these pointers back into an `Arc<Mount>` and a `DentryRef`, which needs
/// the allocations' provenance.
struct Pos<'g> {
    mnt: Pinned<'g, Mount>,
    d: Pinned<'g, Dentry>,
    held: Option<PathRef>,
}

/// Outcome of a lock-free attempt.
enum Lazy<T> {
    Done(T),
    /// Continue from here in reference mode.
    Unlazy,
    /// Start over in reference mode.
    Abort,
}

/// Take a new reference on a mount known to be alive under the guard.
fn mount_arc(m: Pinned<'_, Mount>) -> MntRef {
    // SAFETY: `m` is kept alive by a MntRef in the mount table or in a
    // PathRef that the walk's guard or reference holds (a detached mount's
    // count folds only after that guard), and came from `MntRef::as_ptr`
    // through raw pointers only; the count we add is released by the
    // returned MntRef.
    unsafe { MntRef::from_pinned(m.as_ptr()) }
}

impl<'a> WalkCtx<'a> {
    /// Walk `path` and hand the leaf to `f` without taking any reference
    /// when the lock-free walk succeeds (stat, access, readlink). `f` may be
    /// called twice (lock-free, then after a reference-mode redo); only the
    /// last call's result is returned.
    pub(crate) fn with_leaf<R>(
        &self,
        guard: &Guard,
        start: Start<'_>,
        path: &[u8],
        follow: bool,
        mut f: impl FnMut(&Mount, &Dentry) -> VfsResult<R>,
    ) -> VfsResult<R> {
        let opts = WalkOpts {
            follow,
            parent: false,
        };
        if self.vfs.config().stat_takes_ref {
            // Linux's shape: lock-free walk, a reference on the leaf around
            // the call, then dput.
            let p = self.walk(guard, start, path, follow)?;
            return f(&p.mnt, &p.dentry);
        }
        if self.vfs.config().walk == WalkMode::LockFree {
            let seq0 = self.vfs.mount_read_begin();
            let mut comps = Comps::new(path);
            let mut pos = self.start_pos(start, path, guard);
            match self.walk_lazy(guard, &mut comps, &mut pos, opts, seq0) {
                Lazy::Done(Ok(())) => {
                    let r = f(pos.mnt.get(), pos.d.get());
                    if !self.vfs.mount_retry(seq0) {
                        lockstat::inc(Stat::WalkHandled);
                        return r;
                    }
                    lockstat::inc(Stat::WalkAborted);
                }
                Lazy::Done(Err(e)) => {
                    if !self.vfs.mount_retry(seq0) {
                        lockstat::inc(Stat::WalkHandled);
                        return Err(e);
                    }
                    lockstat::inc(Stat::WalkAborted);
                }
                Lazy::Unlazy => {
                    if let Some(held) = self.legitimize(&pos, seq0) {
                        lockstat::inc(Stat::WalkPartial);
                        pos.held = Some(held);
                        let p = self.walk_ref(guard, &mut comps, pos, opts)?;
                        return f(&p.mnt, &p.dentry);
                    }
                    lockstat::inc(Stat::WalkAborted);
                }
                Lazy::Abort => lockstat::inc(Stat::WalkAborted),
            }
        }
        let p = self.walk_ref_from_start(guard, start, path, opts, &mut Comps::new(path))?;
        f(&p.mnt, &p.dentry)
    }

    /// Walk `path` to a counted leaf (open, chdir, ...): lock-free as far as
    /// possible, one reference taken at the end.
    pub(crate) fn walk(
        &self,
        guard: &Guard,
        start: Start<'_>,
        path: &[u8],
        follow: bool,
    ) -> VfsResult<PathRef> {
        let opts = WalkOpts {
            follow,
            parent: false,
        };
        Ok(self
            .walk_held(guard, start, path, opts, &mut Comps::new(path), true)?
            .0)
    }

    /// The walk for callers that keep the result: lock-free as far as
    /// possible, then either one reference where it ended (handled), the
    /// reference walk from where it stopped (partial), or the reference walk
    /// from the start (aborted). `comps` is left after the last component
    /// walked (in parent mode: before the last component). With `counted`
    /// false and the lock-free walk done in one go, the result has no count
    /// on its dentry (held by `guard` only: `ParentWalk`). Returns
    /// `(path, counted)`.
    fn walk_held<'p>(
        &self,
        guard: &Guard,
        start: Start<'_>,
        path: &'p [u8],
        opts: WalkOpts,
        comps: &mut Comps<'p>,
        counted: bool,
    ) -> VfsResult<(PathRef, bool)> {
        if self.vfs.config().walk == WalkMode::LockFree {
            let seq0 = self.vfs.mount_read_begin();
            let mut pos = self.start_pos(start, path, guard);
            match self.walk_lazy(guard, comps, &mut pos, opts, seq0) {
                Lazy::Done(Err(e)) => {
                    if !self.vfs.mount_retry(seq0) {
                        lockstat::inc(Stat::WalkHandled);
                        return Err(e);
                    }
                }
                // A root that is not a live mount's (`is_attached`) would
                // always fail the uncounted check below, and the walk be
                // done twice: count it at once.
                Lazy::Done(Ok(())) if counted || (pos.d.is_root() && !pos.d.is_attached()) => {
                    if let Some(held) = self.legitimize(&pos, seq0) {
                        lockstat::inc(Stat::WalkHandled);
                        return Ok((held, true));
                    }
                }
                Lazy::Done(Ok(())) => {
                    // As `legitimize`, less the count: alive and hashed (or
                    // a live mount's root, whose mount the PathRef below
                    // holds) now (`Task::lock_name` checks again under the
                    // lock).
                    if !pos.d.lockref().is_dead()
                        && pos.d.is_attached()
                        && !self.vfs.mount_retry(seq0)
                    {
                        lockstat::inc(Stat::WalkHandled);
                        // SAFETY: no count is taken, and none is dropped:
                        // `ParentWalk` never drops this dentry reference
                        // (`counted` false) and keeps the guard that keeps
                        // the dentry's memory; the pointer is the walk's,
                        // with the allocation's provenance.
                        let d = unsafe { DentryRef::from_counted(pos.d.as_ptr()) };
                        let p = PathRef {
                            mnt: mount_arc(pos.mnt),
                            dentry: d,
                        };
                        return Ok((p, false));
                    }
                }
                Lazy::Unlazy => {
                    if let Some(held) = self.legitimize(&pos, seq0) {
                        lockstat::inc(Stat::WalkPartial);
                        pos.held = Some(held);
                        return Ok((self.walk_ref(guard, comps, pos, opts)?, true));
                    }
                }
                Lazy::Abort => {}
            }
            lockstat::inc(Stat::WalkAborted);
            *comps = Comps::new(path);
        }
        Ok((
            self.walk_ref_from_start(guard, start, path, opts, comps)?,
            true,
        ))
    }

    /// Walk all but the last component; the parent comes back counted,
    /// or (`counted` false, the lock-free walk done in one go) held only
    /// by `guard` (see `ParentWalk`; the caller keeps the guard in it).
    pub(crate) fn walk_parent(
        &self,
        guard: &Guard,
        start: Start<'_>,
        path: &[u8],
        counted: bool,
    ) -> VfsResult<ParentWalk> {
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        let opts = WalkOpts {
            follow: false,
            parent: true,
        };
        let mut comps = Comps::new(path);
        let (parent, counted) = self.walk_held(guard, start, path, opts, &mut comps, counted)?;
        let (last, trailing) = match comps.next() {
            None => (Last::Root, false),
            Some(c) => {
                let b = comps.bytes(c);
                let l = match b {
                    b"." => Last::Dot,
                    b".." => Last::DotDot,
                    _ => Last::Normal(b.to_vec()),
                };
                (l, c.trailing)
            }
        };
        let pw = ParentWalk {
            parent: ManuallyDrop::new(parent),
            last,
            trailing,
            counted,
            guard: None,
        };
        let dir = pw.parent.inode();
        if !dir.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        // Search permission on the last directory, before anything looks
        // the last name up (Linux's link_path_walk runs may_lookup before
        // every component, the last included): else a name operation in a
        // directory the caller may not search would tell existing names
        // from missing ones, and open(O_CREAT) would open an existing file
        // there. The walks above check each directory only before stepping
        // into the next one.
        if !matches!(pw.last, Last::Root)
            && !dir.search_for_all()
            && !dir.permission_ok(&dir.attr_stored(), self.cred, X_OK)
        {
            return Err(Errno::EACCES);
        }
        Ok(pw)
    }

    /// The reference walk over the whole of `path` (`comps` fresh).
    fn walk_ref_from_start<'p>(
        &self,
        guard: &Guard,
        start: Start<'_>,
        path: &'p [u8],
        opts: WalkOpts,
        comps: &mut Comps<'p>,
    ) -> VfsResult<PathRef> {
        let s = self.start_pos(start, path, guard);
        let held = self.hold(&s);
        let pos = Pos {
            mnt: s.mnt,
            d: s.d,
            held: Some(held),
        };
        self.walk_ref(guard, comps, pos, opts)
    }

    fn start_pos<'g>(&self, start: Start<'_>, path: &[u8], guard: &'g Guard) -> Pos<'g> {
        let _ = guard;
        let p: &PathRef = if path.first() == Some(&b'/') {
            self.root
        } else {
            match start {
                Start::Cwd => self.cwd,
                Start::At(p) => p,
            }
        };
        // SAFETY: the PathRef is owned by the task's fs snapshot or by an open
        // file, both kept alive by the guard for the walk's duration; the
        // pointers come from `Arc::as_ptr` and `DentryRef::as_ptr`.
        unsafe {
            Pos {
                mnt: Pinned::new(p.mnt.as_ptr()),
                d: Pinned::new(p.dentry.as_ptr()),
                held: None,
            }
        }
    }

    fn hold(&self, p: &Pos<'_>) -> PathRef {
        let d = DentryRef::try_get(p.d).unwrap_or_else(|| {
            // Starting points are held by their owners and cannot be dead.
            // SAFETY: a start dentry is referenced by its owner; a Pinned
            // carries the allocation's provenance.
            unsafe { DentryRef::from_counted(p.d.as_ptr()) }
        });
        PathRef {
            mnt: mount_arc(p.mnt),
            dentry: d,
        }
    }

    /// Take references on a lazily reached position (Linux's
    /// `legitimize_path` + `legitimize_mnt`). The dentry's reference is
    /// `get_not_dead`: a dead dentry (evicted, or unhashed and put since the
    /// walk stood on it) cannot be revived, and then the walk starts over.
    /// A live one is a position a reference walk could hold: the step that
    /// reached it was valid when taken, and a reference walk holding it
    /// would not notice a later rename or unlink of it either. The mount's
    /// reference is taken only if no mount or umount happened since the
    /// walk began (the mount sequence; a stale mount crossing is redone).
    fn legitimize(&self, p: &Pos<'_>, seq0: u32) -> Option<PathRef> {
        let d = DentryRef::try_get(p.d)?;
        if self.vfs.mount_retry(seq0) {
            return None;
        }
        Some(PathRef {
            mnt: mount_arc(p.mnt),
            dentry: d,
        })
    }

    /// The lock-free loop.
    fn walk_lazy<'g>(
        &self,
        guard: &'g Guard,
        comps: &mut Comps<'_>,
        pos: &mut Pos<'g>,
        opts: WalkOpts,
        seq0: u32,
    ) -> Lazy<VfsResult<()>> {
        let dc = self.vfs.dcache();
        let root = self.start_pos(Start::Cwd, b"/", guard);
        let keys = dc.rcu_keys();
        loop {
            let fast_done = match keys {
                Some(k) if comps.links.is_empty() => walk_fast(k, comps, pos, opts, guard),
                _ => false,
            };
            if fast_done {
                // The whole path is walked (`next_hashed` would say None).
                break;
            }
            let prev_must_dir = comps.must_dir;
            let Some((c, q)) = comps.next_hashed(dc, pos.d.get()) else {
                break;
            };
            if opts.parent && c.last {
                unstep(comps, c);
                break;
            }
            let name = q.bytes;
            let must_dir = prev_must_dir | c.trailing;
            let Some(inode) = pos.d.inode() else {
                return Lazy::Abort;
            };
            if inode.file_type() != FileType::Directory {
                return Lazy::Done(Err(Errno::ENOTDIR));
            }
            if !inode.search_for_all()
                && !inode.permission_ok(&inode.attr_stored(), self.cred, X_OK)
            {
                return Lazy::Done(Err(Errno::EACCES));
            }
            if name == b"." {
                comps.must_dir = must_dir;
                continue;
            }
            if name == b".." {
                comps.must_dir = must_dir;
                self.dotdot_lazy(pos, &root, guard);
                continue;
            }
            if name.len() > NAME_MAX {
                return Lazy::Done(Err(Errno::ENAMETOOLONG));
            }
            let child = match dc.lookup_rcu(pos.d.get(), &q, guard) {
                RcuLookup::Hit(d) => d,
                RcuLookup::Miss => {
                    if pos.mnt.sb.fs.dcache_authoritative() {
                        return Lazy::Done(Err(Errno::ENOENT));
                    }
                    unstep(comps, c);
                    return Lazy::Unlazy;
                }
                RcuLookup::Retry => {
                    unstep(comps, c);
                    return Lazy::Unlazy;
                }
            };
            comps.must_dir = must_dir;
            let Some(ci) = child.inode() else {
                return Lazy::Done(Err(Errno::ENOENT));
            };
            if ci.file_type() == FileType::Symlink && (!c.last || opts.follow || must_dir) {
                if comps.nlinks >= MAX_SYMLINKS {
                    return Lazy::Done(Err(Errno::ELOOP));
                }
                let fs = &pos.mnt.sb.fs;
                let Some(body) = fs.get_link_cached(ci) else {
                    // Counted by the reference walk when it follows it.
                    unstep(comps, c);
                    return Lazy::Unlazy;
                };
                comps.nlinks += 1;
                if body.is_empty() {
                    return Lazy::Done(Err(Errno::ENOENT));
                }
                if body[0] == b'/' {
                    pos.mnt = root.mnt;
                    pos.d = root.d;
                }
                comps.push(body.to_vec(), c);
                continue;
            }
            pos.d = child;
            self.cross_mounts_lazy(pos, guard);
        }
        let _ = seq0;
        if !opts.parent {
            match pos.d.inode() {
                None => return Lazy::Done(Err(Errno::ENOENT)),
                Some(i) if comps.must_dir && !i.is_dir() => return Lazy::Done(Err(Errno::ENOTDIR)),
                _ => {}
            }
        }
        Lazy::Done(Ok(()))
    }

    fn dotdot_lazy<'g>(&self, pos: &mut Pos<'g>, root: &Pos<'g>, guard: &'g Guard) {
        loop {
            if pos.mnt.as_ptr() == root.mnt.as_ptr() && pos.d.as_ptr() == root.d.as_ptr() {
                return;
            }
            if pos.d.as_ptr() == pos.mnt.root.as_ptr() {
                match &pos.mnt.get().parent {
                    Some((pm, pd)) => {
                        // SAFETY: the parent mount and mountpoint are held by
                        // `pos.mnt`, which the guard keeps alive.
                        unsafe {
                            pos.mnt = Pinned::new(pm.as_ptr());
                            pos.d = Pinned::new(pd.as_ptr());
                        }
                        continue;
                    }
                    None => return,
                }
            }
            // One atomic load: the parent at that instant, as a reference
            // walk's `dget_parent` would find it (a rename of `pos.d` before
            // or after it is a state a reference walk can meet too).
            // SAFETY: the parent is kept alive by its child's reference, and
            // if a rename just moved the child, or the child died after this
            // walk reached it, the old parent's count went down during this
            // walk's guard, so it is freed only after the guard.
            pos.d = unsafe { Pinned::new(pos.d.parent_ptr()) };
            let _ = guard;
            return;
        }
    }

    fn cross_mounts_lazy<'g>(&self, pos: &mut Pos<'g>, guard: &'g Guard) {
        while pos.d.is_mounted() {
            match self.vfs.mounted_on(pos.mnt.as_ptr(), pos.d.as_ptr(), guard) {
                Some(m) => {
                    // SAFETY: the table is alive under the guard and holds m.
                    pos.mnt = unsafe { Pinned::new(m.as_ptr()) };
                    // SAFETY: m holds its root dentry.
                    pos.d = unsafe { Pinned::new(m.root.as_ptr()) };
                }
                None => return,
            }
        }
    }

    /// The reference-mode loop, from `pos` (which holds a reference).
    fn walk_ref<'g>(
        &self,
        guard: &'g Guard,
        comps: &mut Comps<'_>,
        mut pos: Pos<'g>,
        opts: WalkOpts,
    ) -> VfsResult<PathRef> {
        let mut cur: PathRef = pos.held.take().ok_or(Errno::EIO)?;
        while let Some(c) = peek_or_next(comps, opts) {
            let name = comps.bytes(c).to_vec();
            comps.must_dir |= c.trailing;
            let must_dir = comps.must_dir;
            let inode = cur.dentry.inode().ok_or(Errno::ENOENT)?.clone();
            if inode.file_type() != FileType::Directory {
                return Err(Errno::ENOTDIR);
            }
            if !inode.permission_ok(&inode.attr_stored(), self.cred, X_OK) {
                return Err(Errno::EACCES);
            }
            if name == b"." {
                continue;
            }
            if name == b".." {
                cur = self.dotdot_ref(cur);
                continue;
            }
            if name.len() > NAME_MAX {
                return Err(Errno::ENAMETOOLONG);
            }
            let child = self.lookup_slow(&cur, &name, false)?;
            let Some(ci) = child.inode().cloned() else {
                return Err(Errno::ENOENT);
            };
            if ci.file_type() == FileType::Symlink && (!c.last || opts.follow || must_dir) {
                comps.nlinks += 1;
                if comps.nlinks > MAX_SYMLINKS {
                    return Err(Errno::ELOOP);
                }
                let body = cur.mnt.sb.fs.readlink(&ci)?;
                if body.is_empty() {
                    return Err(Errno::ENOENT);
                }
                if body[0] == b'/' {
                    cur = self.root.clone();
                }
                comps.push(body, c);
                continue;
            }
            cur = PathRef {
                mnt: cur.mnt.clone(),
                dentry: child,
            };
            cur = self.cross_mounts_ref(cur, guard);
        }
        let _ = &mut pos;
        if !opts.parent {
            match cur.dentry.inode() {
                None => return Err(Errno::ENOENT),
                Some(i) if comps.must_dir && !i.is_dir() => return Err(Errno::ENOTDIR),
                _ => {}
            }
        }
        Ok(cur)
    }

    fn dotdot_ref(&self, cur: PathRef) -> PathRef {
        match cur.climb_for_dotdot(self.root) {
            Ok(p) => p.dentry_parent(),
            Err(top) => top,
        }
    }

    /// From `cur` to the root of whatever is mounted on it (stacked mounts
    /// too).
    pub(crate) fn cross_mounts_ref(&self, mut cur: PathRef, guard: &Guard) -> PathRef {
        while cur.dentry.is_mounted() {
            match self
                .vfs
                .mounted_on(cur.mnt.as_ptr(), cur.dentry.as_ptr(), guard)
            {
                Some(m) => {
                    cur = PathRef {
                        mnt: m.clone(),
                        dentry: m.root.clone(),
                    }
                }
                None => break,
            }
        }
        cur
    }

    /// Reference-mode lookup of one name: the cache under its lock, then the
    /// filesystem for a non-authoritative one (under the name lock, so two
    /// walkers do not both ask it; `name_locked`: the caller holds it).
    pub(crate) fn lookup_slow(
        &self,
        dir: &PathRef,
        name: &[u8],
        name_locked: bool,
    ) -> VfsResult<DentryRef> {
        let dc = self.vfs.dcache();
        let q = dc.qname(dir.dentry.as_ptr(), name);
        if let Some(d) = dc.lookup_ref(&dir.dentry, &q) {
            lockstat::inc(Stat::DcacheHit);
            return Ok(d);
        }
        lockstat::inc(Stat::DcacheMiss);
        let fs = &dir.mnt.sb.fs;
        // Linux's __lookup_slow: a removed directory (IS_DEADDIR) has no
        // names, and asking the filesystem would only leave a negative
        // dentry that pins the dead directory until pruned.
        if fs.dcache_authoritative() || dir.inode().is_dead() {
            return Err(Errno::ENOENT);
        }
        let _nl = if name_locked {
            None
        } else {
            let idx = self.vfs.name_lock_index(&dir.dentry, name);
            Some(self.vfs.inner.name_locks[idx].lock_key(idx as u64))
        };
        if let Some(d) = dc.lookup_ref(&dir.dentry, &q) {
            return Ok(d);
        }
        let inode = fs.lookup(dir.inode(), name)?;
        Ok(dc.add(&dir.dentry, &q, inode))
    }
}

/// The lock-free loop's fast path, over the path itself (no symlink body
/// pushed): walks plain components (not `.`/`..`, at most `INLINE_NAME`
/// bytes) through searchable-by-all directories to hashed children that are
/// not symlinks, negative or mount points, exactly as the general loop in
/// `walk_lazy` would, and stops at the first component it cannot take (or
/// at the end of the path), leaving `comps` and `pos` at that component's
/// start for the general loop (stopping early is always allowed: the general
/// loop redoes that component from scratch). Returns whether the whole path
/// was walked.
///
/// Per component: one flags word of the current dentry (kept from its
/// validated lookup: directory?), one mode load of its inode (search
/// permission), the scan-and-hash of the name, and the hash chain walk with
/// every candidate validated by its d_seq around the (parent, name, hashed)
/// compare: each step is linearizable on its own (see the module header).
/// Anything but a validated hit (a miss too) goes back to the general loop,
/// whose `lookup_rcu` tells a miss from a concurrent change.
#[inline(never)]
fn walk_fast<'g>(
    dc: RcuKeys<'_>,
    comps: &mut Comps<'_>,
    pos: &mut Pos<'g>,
    opts: WalkOpts,
    guard: &'g Guard,
) -> bool {
    debug_assert!(comps.links.is_empty());
    let b = comps.path;
    let len = b.len();
    let mut p = comps.pos;
    let mut d: Pinned<'g, Dentry> = pos.d;
    let mut flags = d.flags();
    let mut must_dir = comps.must_dir;
    while p < len && b[p] == b'/' {
        p += 1;
    }
    // `p` is at the start of a component, or at the end.
    while p < len {
        // The general loop's checks on the current directory, in its order:
        // a directory (the flag mirrors the inode's fixed type), then search
        // permission (the general loop also handles the slow permission path).
        if flags & D_DIR == 0 {
            break;
        }
        let Some(inode) = d.inode() else {
            break;
        };
        if !inode.search_for_all() {
            break;
        }
        let Some((end, hash, w0)) = dc.scan_fast(d.get(), b, p) else {
            break;
        };
        let mut q = end;
        while q < len && b[q] == b'/' {
            q += 1;
        }
        let last = q >= len;
        if last && opts.parent {
            break;
        }
        let Some((child, cf)) = dc.lookup_rcu_fast(d.get(), hash, b, p..end, w0, guard) else {
            break;
        };
        // Symlinks (to follow or not), negative dentries (ENOENT or a
        // non-authoritative filesystem) and mount points: the general loop.
        if cf & (D_SYMLINK | D_NEGATIVE | D_MOUNTED) != 0 {
            break;
        }
        d = child;
        flags = cf;
        p = q;
        if last {
            // A trailing slash: the leaf must be a directory.
            must_dir |= end < len;
            break;
        }
    }
    comps.pos = p;
    comps.must_dir = must_dir;
    pos.d = d;
    p >= len
}

/// The next component, except that in parent mode the last one is left for
/// the caller.
#[inline]
fn peek_or_next(comps: &mut Comps<'_>, opts: WalkOpts) -> Option<Comp> {
    let c = comps.next()?;
    if opts.parent && c.last {
        unstep(comps, c);
        return None;
    }
    Some(c)
}

/// Put a component back (the reference walk will redo it). Buffers above
/// `c.buf` that `next` popped were exhausted, so this restores an
/// equivalent state.
fn unstep(comps: &mut Comps<'_>, c: Comp) {
    comps.links.truncate(c.buf);
    match comps.links.last_mut() {
        Some(l) => l.1 = c.start,
        None => comps.pos = c.start,
    }
}

#[cfg(test)]
mod tests {
    use super::has_nul;
    use crate::dcache::{DcacheConfig, DcacheIndex};
    use crate::types::{O_CREAT, O_RDONLY, O_WRONLY};
    use crate::{Errno, MemFsOptions, Vfs, VfsConfig, WalkMode};

    fn small_vfs(walk: WalkMode, index: DcacheIndex, authoritative: bool) -> Vfs {
        let mut c = VfsConfig {
            walk,
            dcache: DcacheConfig {
                index,
                hash_bits: 4,
                ..Default::default()
            },
            ..Default::default()
        };
        c.memfs.authoritative = authoritative;
        Vfs::with_config(c)
    }

    /// References the walk takes on the mounts and dentries it reached
    /// without counts (`hold`, `legitimize`, `lookup_ref`) are the ones that
    /// later free them. Under Miri (Tree Borrows) this was undefined
    /// behaviour while `mount_arc` incremented an `Arc` count through a
    /// pointer cast from `&Mount`, and `try_get` adopted a pointer cast from
    /// `&Dentry`: freeing through it is a write through a read-only tag.
    /// Outside Miri it checks the walk's results across mounts, renames and
    /// unlinks.
    #[test]
    fn counted_walk_then_free_through_the_walks_pointers() {
        let mut configs = Vec::new();
        for walk in [WalkMode::LockFree, WalkMode::RefOnly] {
            for index in [DcacheIndex::GlobalHash, DcacheIndex::PerDir] {
                for auth in [true, false] {
                    configs.push((walk, index, auth));
                }
            }
        }
        if cfg!(miri) {
            // Each walk mode and index once (Miri is slow).
            configs = vec![
                (WalkMode::LockFree, DcacheIndex::GlobalHash, true),
                (WalkMode::RefOnly, DcacheIndex::PerDir, false),
            ];
        }
        for (walk, index, auth) in configs {
            let vfs = small_vfs(walk, index, auth);
            let t = vfs.root_task();
            t.mkdir("/m", 0o755).unwrap();
            let fs = vfs.new_memfs(MemFsOptions::default());
            t.mount("/m", fs, false).unwrap();
            t.mkdir("/m/d", 0o755).unwrap();
            let fd = t.open("/m/d/f", O_CREAT | O_WRONLY, 0o644).unwrap();
            assert_eq!(t.write(fd, b"abc").unwrap(), 3);
            t.close(fd).unwrap();
            // Counted walks across the mount: `legitimize` (or, in
            // ref-only mode, `hold`) takes the Arc<Mount> and DentryRef.
            t.chdir("/m/d").unwrap();
            let fd = t.open("f", O_RDONLY, 0).unwrap();
            assert_eq!(t.stat("../d/f").unwrap().size, 3);
            // ".." out of the mount's root back into the parent mount.
            assert_eq!(t.stat("../..").unwrap().ino, t.stat("/").unwrap().ino);
            t.rename("/m/d/f", "/m/g").unwrap();
            t.unlink("/m/g").unwrap();
            assert_eq!(t.stat("f"), Err(Errno::ENOENT));
            // The last references on the file's dentry are the open
            // file's and the cwd's, both taken by the walk.
            t.close(fd).unwrap();
            t.chdir("/").unwrap();
            t.rmdir("/m/d").unwrap();
            t.umount("/m").unwrap();
            t.rmdir("/m").unwrap();
            assert_eq!(t.stat("/m"), Err(Errno::ENOENT));
            vfs.dcache().shrink_all();
            vfs.flush_deferred();
            drop(t);
            drop(vfs);
        }
    }

    #[test]
    fn has_nul_matches_contains() {
        for len in 0..40usize {
            let base: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            assert!(!has_nul(&base), "{len}");
            for z in 0..len {
                let mut v = base.clone();
                v[z] = 0;
                assert!(has_nul(&v), "{len} {z}");
                // Bytes that borrow into a false positive next to a 0x01.
                v[z] = 1;
                assert!(!has_nul(&v), "{len} {z}");
            }
        }
    }
}
