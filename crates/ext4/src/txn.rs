//! The journaled write path's state: handles, the running transaction's
//! freed blocks, and the log a commit writes to (`LogSink`, implemented by
//! `journal::writer::LogWriter` and installed by `open.rs`, so that `fs.rs`
//! does not import the journal, which opens images through `fs.rs`).
//!
//! DESIGN (jbd2 in small; the commit itself is `Ext4::commit` in fs.rs)
//! - Every change to the filesystem runs inside a handle: a pass through
//!   `gate` (`scalevfs_sync::Gate`), a per-thread count, so that handles of
//!   different threads share no lock and no counter line (jbd2 counts
//!   `t_updates` in one atomic).
//! - A commit takes `commit` (one committer), closes the gate and waits for
//!   the handles inside to finish: the metadata blocks in the buffer cache
//!   are then a consistent state. It frees what must be freed, copies the
//!   dirty blocks out, opens the gate again, reserves the transaction's
//!   place in the log (`LogSink::begin`) and lets the commit lock go; then
//!   it writes the copies to the log while new handles run (they dirty
//!   blocks for the next transaction) and the next commit may begin and
//!   write its own log at the same time. The log makes commits durable in
//!   the order they began (each commit block waits for the earlier ones:
//!   `journal::writer`, `scalevfs_sync::Turnstile`), so `done` never
//!   passes a commit that is not durable. A thread whose commit has begun
//!   waits for it to be done instead of taking the lock for the next.
//! - Shared commit work: the threads that wait for a commit would idle
//!   while the committer alone computes the tag checksums and writes the
//!   log, and a commit of two threads' changes costs about twice a commit
//!   of one (their blocks differ). When another thread waits, the
//!   committer offers it the log writes of the data blocks (`HelpSlot`,
//!   `SharedWrite`) and computes the checksums and writes the descriptors
//!   meanwhile; it then waits for those writes (or does them itself if no
//!   one took them) before its flush, so the log on disk is the same as
//!   when one thread writes it all.
//! - Ordered data: file data goes to its home blocks before its handle
//!   ends, so it is on the device before the commit's first flush, which
//!   comes before the commit block.
//! - Freed blocks are not reusable until the transaction that freed them
//!   has committed: `pending` holds them, the commit frees them in the
//!   bitmaps of the transaction it writes, and the allocator holds them
//!   back until that commit is durable (`Alloc::free_block_held`): the
//!   gate opens before the log is written, and a handle of the next
//!   transaction could otherwise write its data over them before a crash
//!   that loses the free. Otherwise a crash before that
//!   commit would leave the old owner (still the owner on disk) pointing at
//!   a new owner's data. A freed block that an earlier transaction logged
//!   gets a revoke record, so replay never writes its old copy over data.
//! - Group commit: a caller waits for a commit that started after it
//!   called (`started`, `done`); concurrent fsyncs share one.
//! - Size: a transaction must fit the log. A new handle commits first
//!   when the running transaction's dirty blocks plus the block bitmaps
//!   its pending frees will dirty at the commit (`freed_groups`, an upper
//!   estimate) pass `limit`, a quarter of the log. One handle may add at
//!   most about `limit` more: an operation whose metadata is larger runs
//!   as several handles (`Ext4::step_groups`): truncate and unlink free
//!   from the end in steps (the inode an orphan meanwhile, so a crash
//!   between steps leaves an orphan that the next mount finishes), punch
//!   hole frees from the end of the hole, fallocate and write allocate in
//!   pieces (`extent_write.rs`). Each step reserves its log blocks in the
//!   running transaction (`Journal::reserve_step`, one shared counter
//!   touched once per step) and shrinks, down to one group, when the
//!   steps of other threads already hold the log's room: many long
//!   operations at once then still fit one commit. A small handle
//!   reserves nothing: the log's room past `limit` (three quarters of
//!   it) covers the small handles that start before the next commit, up
//!   to some hundred at once on the smallest journal.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use scalevfs_orphan::OrphanFile;
use scalevfs_sync::ordered::{Class, Mutex, MutexGuard};
use scalevfs_sync::{Gate, Offer, Pass};

use crate::bufcache::Block;
use crate::device::BlockDevice;
use crate::error::Result;

/// Where commits go: a jbd2 log (`journal::writer::LogWriter`).
pub trait LogSink: Send {
    /// Reserve one transaction's place and turn in the log; `blocks`
    /// (home block, contents) are kept for the checkpoint. The returned
    /// [`LogWrite`] writes it, without the commit lock.
    fn begin(
        &mut self,
        blocks: Vec<(u64, Block)>,
        revokes: &[u64],
        time: u64,
    ) -> Result<Box<dyn LogWrite>>;
    /// Wait until every transaction begun is durable.
    fn wait_all(&self) -> Result<()>;
    /// Write every committed transaction home and empty the log.
    fn checkpoint(&mut self) -> Result<()>;
    /// Freed blocks: never write their logged copies home again.
    fn forget(&mut self, homes: &[u64]);
    /// Log blocks free for new transactions (without a checkpoint).
    fn room(&self) -> u32;
    /// Log blocks in all (the largest transaction is a quarter of it).
    fn capacity(&self) -> u32;
    /// Tags one descriptor block holds (to size a transaction).
    fn tags_per_block(&self) -> u32;
    /// Checkpoint, mark the log empty, clear needs_recovery.
    fn close(self: Box<Self>) -> Result<()>;
}

/// A transaction whose place in the log is reserved (`LogSink::begin`).
pub trait LogWrite: Send {
    /// Write it and return when it (and every transaction begun before
    /// it) is durable. With `help`, the log writes of its blocks are
    /// offered there to the threads waiting for this commit
    /// ([`HelpSlot`]).
    fn write(self: Box<Self>, help: Option<&HelpSlot>) -> Result<()>;
}

/// `Journal::pipeline` (`Ext4::set_pipelined`): by the average commit
/// time, always, never.
pub(crate) const PIPELINE_AUTO: u8 = 0;
pub(crate) const PIPELINE_ALWAYS: u8 = 1;
pub(crate) const PIPELINE_NEVER: u8 = 2;

/// The committer's state.
pub(crate) struct Committer {
    pub(crate) log: Option<Box<dyn LogSink>>,
    /// Home blocks logged by transactions not yet checkpointed: freeing
    /// one needs a revoke record.
    pub(crate) logged: HashSet<u64>,
}

/// A journaled mount's transaction state.
pub(crate) struct Journal {
    pub(crate) gate: Gate,
    pub(crate) commit: Mutex<Committer>,
    pub(crate) pending: Sharded<u64>,
    /// Commits started (the number of the running transaction's commit is
    /// `started + 1`).
    pub(crate) started: AtomicU64,
    /// Commits finished (durable).
    pub(crate) done: AtomicU64,
    /// Dirty metadata blocks past which a new handle commits first
    /// (`Ext4::set_txn_limit` lowers it for crash tests).
    pub(crate) limit: AtomicUsize,
    /// INSERT_RANGE and COLLAPSE_RANGE shift a leaf per handle whatever
    /// the tree's size (`Ext4::set_stepped_shifts`, for crash tests).
    pub(crate) stepped_shifts: AtomicBool,
    /// Log blocks in all, and tags one descriptor block holds (fixed at
    /// mount): what one transaction may log (`handle_room`).
    pub(crate) capacity: usize,
    pub(crate) tags_per_desc: usize,
    /// Block bitmaps the running transaction's pending frees will dirty
    /// at its commit (an upper estimate: one per change of group in a
    /// thread's run of frees); zeroed by the commit.
    pub(crate) freed_groups: AtomicUsize,
    /// Statistics: commits that logged something, and `commit` calls that
    /// asked for durability (fsync, sync): fsyncs per commit.
    pub(crate) commits: AtomicU64,
    pub(crate) requests: AtomicU64,
    /// Batching (jbd2's `j_last_sync_writer` and average commit time): the
    /// thread that asked for the last commit, and a moving average of how
    /// long writing a commit takes (ns).
    pub(crate) last_sync_thread: AtomicU64,
    pub(crate) avg_commit_ns: AtomicU64,
    /// Group commit: threads now inside a commit request (fsync, sync) by
    /// the parity of the commit they wait for (a waiter for the commit
    /// about to start counts there; one already served, not yet gone,
    /// counts in the other), and how many the last commit served
    /// (`Ext4::commit_until`).
    pub(crate) waiters: [AtomicU64; 2],
    /// Bumped (and its sleepers woken, if any: an `EventCount`, a futex
    /// with no wake-up call when no one sleeps) each time the commit lock
    /// is released by a commit request and each time a commit's log is
    /// durable: a thread waiting for another's commit sleeps on it instead
    /// of polling with a timer.
    pub(crate) released: scalevfs_sync::EventCount,
    /// Set while a commit request holds `commit` (a hint, on a line of its
    /// own): the threads waiting in `commit_until` read it and try the
    /// lock only when it is clear. A failed `try_lock` is a locked
    /// compare-and-exchange, which takes the lock's line from the
    /// committer, whose `Committer` state shares that line.
    pub(crate) committing: CachePadded<AtomicBool>,
    pub(crate) last_batch: AtomicU64,
    /// Whether a commit may begin while the one before writes its log
    /// (`Ext4::set_pipelined`).
    pub(crate) pipeline: std::sync::atomic::AtomicU8,
    /// Where the committer offers its log writes to the threads waiting
    /// for its commit.
    pub(crate) help: HelpSlot,
    /// Log blocks the steps now inside handles have reserved in the
    /// running transaction (`reserve_step`), on a line of its own: only
    /// long operations' steps touch it, once per step. jbd2 counts every
    /// handle's credits so (`t_outstanding_credits`); here a small handle
    /// reserves nothing (see "Size" in the module comment).
    reserved: CachePadded<AtomicUsize>,
    /// What the steps may reserve in all: the log less its descriptor
    /// blocks and a margin for revoke and commit blocks.
    pool: usize,
}

impl Journal {
    pub(crate) fn new(log: Box<dyn LogSink>) -> Journal {
        let limit = (log.capacity() / 4).saturating_sub(64).max(16) as usize;
        let (capacity, tags_per_desc) = (
            log.capacity() as usize,
            log.tags_per_block().max(1) as usize,
        );
        // The steps' share: the log less its descriptor blocks, a margin
        // for revoke and commit blocks, and half the handle limit for the
        // small handles that start beside them (they reserve nothing).
        let pool = capacity.saturating_sub(capacity / tags_per_desc + 16 + limit / 2);
        Journal {
            gate: Gate::new(64),
            commit: Mutex::new(
                Class::Ext4Commit,
                Committer {
                    log: Some(log),
                    logged: HashSet::new(),
                },
            ),
            pending: Sharded::new(Class::Ext4Pending),
            started: AtomicU64::new(0),
            done: AtomicU64::new(0),
            limit: AtomicUsize::new(limit),
            stepped_shifts: AtomicBool::new(false),
            capacity,
            tags_per_desc,
            freed_groups: AtomicUsize::new(0),
            commits: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            last_sync_thread: AtomicU64::new(0),
            avg_commit_ns: AtomicU64::new(0),
            waiters: [AtomicU64::new(0), AtomicU64::new(0)],
            released: scalevfs_sync::EventCount::new(),
            committing: CachePadded::new(AtomicBool::new(false)),
            last_batch: AtomicU64::new(1),
            pipeline: std::sync::atomic::AtomicU8::new(PIPELINE_AUTO),
            help: HelpSlot::new(),
            reserved: CachePadded::new(AtomicUsize::new(0)),
            pool,
        }
    }

    /// Reserve the log blocks of the steps of the calling thread's
    /// handle in the running transaction, and return their size in
    /// bitmap groups: `full` when the log has room for them beside the
    /// transaction so far (`est` blocks) and the steps of other threads
    /// now running, else as many as it has room for, at least one. Once
    /// per handle: a later call in the same handle gets the same size and
    /// reserves nothing more. A handle holds one step of a long operation
    /// and the reap that may follow it (`Ext4::journaled`, each at most
    /// `g` groups, a reap at least 32): a group changes at most a bitmap
    /// and a descriptor block, and each a few blocks more (the inode, its
    /// tree path, an orphan record). Without this, twelve threads each
    /// fallocating a step at once overflowed a 1 MiB journal: every step
    /// fitted alone and the commit of them all did not, which stopped the
    /// filesystem (tiny_journal_concurrent.rs). Released when the handle
    /// ends (`release_steps`). The reservations of all threads stay
    /// within `pool`, which leaves room for the small handles that
    /// reserve nothing. (They are not counted in the commit-first check
    /// at handle start: while any step ran, every create would commit.)
    pub(crate) fn reserve_step(&self, est: usize, full: usize) -> usize {
        let me = self as *const Journal as usize;
        if let Some(g) = STEP_RESERVED.with(|c| {
            c.borrow()
                .iter()
                .find(|r| r.journal == me)
                .map(|r| r.groups)
        }) {
            return g;
        }
        let cost = |g: usize| (2 * g + 8) + (2 * g.max(32) + 8);
        // SeqCst: the reservation is a counter others compare against in
        // their own compare-exchange; the strongest order keeps the
        // reasoning simple and costs nothing next to a step's work.
        let mut cur = self.reserved.load(Ordering::SeqCst);
        loop {
            let avail = self.pool.saturating_sub(est.saturating_add(cur));
            // The largest g with cost(g) <= avail (cost is 4g + 16 from
            // 32 groups on, 2g + 80 below), within 1..=full.
            let g = if avail >= cost(32) {
                (avail - 16) / 4
            } else {
                avail.saturating_sub(80) / 2
            }
            .clamp(1, full.max(1));
            let c = cost(g);
            match self
                .reserved
                .compare_exchange(cur, cur + c, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    STEP_RESERVED.with(|r| {
                        r.borrow_mut().push(StepReservation {
                            journal: me,
                            blocks: c,
                            groups: g,
                        })
                    });
                    return g;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Give back what this thread's steps reserved in this journal (its
    /// outer handle or its commit ends).
    fn release_steps(&self) {
        let me = self as *const Journal as usize;
        let r = STEP_RESERVED.with(|c| {
            let mut v = c.borrow_mut();
            let mut sum = 0;
            v.retain(|r| {
                if r.journal == me {
                    sum += r.blocks;
                    false
                } else {
                    true
                }
            });
            sum
        });
        if r > 0 {
            // SeqCst: see `reserve_step`.
            let before = self.reserved.fetch_sub(r, Ordering::SeqCst);
            debug_assert!(before >= r, "step reservations given back twice");
        }
    }

    /// Blocks the running steps hold (`reserve_step`; tests).
    #[cfg(test)]
    pub(crate) fn steps_reserved(&self) -> usize {
        // Relaxed: an estimate, as `txn_estimate`.
        self.reserved.load(Ordering::Relaxed)
    }

    /// Blocks the running transaction will log as far as handles can
    /// tell: its dirty blocks (`dirty`) and the bitmaps of its frees.
    pub(crate) fn txn_estimate(&self, dirty: usize) -> usize {
        // Relaxed: an estimate that decides when to commit early; a stale
        // value only moves that commit by one handle.
        dirty + self.freed_groups.load(Ordering::Relaxed)
    }

    /// Dirty metadata blocks past which a new handle commits first.
    pub(crate) fn limit(&self) -> usize {
        // Relaxed: set at mount (or once by a test before its workload).
        self.limit.load(Ordering::Relaxed)
    }

    /// Blocks one handle may add to the running transaction and still
    /// commit: the log, less the running transaction's share before the
    /// handle (`limit`; a new handle commits first past it), the
    /// descriptor blocks and a margin for the revoke and commit blocks.
    /// A change larger than this cannot be done in one transaction
    /// (jbd2 refuses such a handle with ENOSPC).
    pub(crate) fn handle_room(&self) -> usize {
        let overhead = self.capacity / self.tags_per_desc + 16;
        self.capacity
            .saturating_sub(self.limit())
            .saturating_sub(overhead)
    }

    /// The number a commit starting now would get.
    pub(crate) fn next_commit(&self) -> u64 {
        // SeqCst: compared with `done` by group-commit waiters. `started`
        // changes under the commit lock, `done` after a commit's log is
        // durable (`fetch_max`, by whichever writer finishes); SeqCst keeps
        // the reasoning simple.
        self.started.load(Ordering::SeqCst) + 1
    }
}

thread_local! {
    /// The journal (address) whose handle this thread holds, if any.
    static IN_HANDLE: Cell<usize> = const { Cell::new(0) };
    /// The commit that will carry this thread's current handle (0: none).
    static CUR_TID: Cell<u64> = const { Cell::new(0) };
    /// What this thread's current handles reserved for their steps
    /// (`Journal::reserve_step`), one entry per journal (a thread may
    /// hold handles of two filesystems, one inside the other).
    static STEP_RESERVED: std::cell::RefCell<Vec<StepReservation>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// A handle's step reservation in one journal.
struct StepReservation {
    journal: usize,
    blocks: usize,
    groups: usize,
}

/// A number for the calling thread (never 0).
pub(crate) fn thread_id() -> u64 {
    scalevfs_sync::thread_number() as u64 + 1
}

/// The commit that will carry the changes of the handle this thread holds
/// (0 outside a handle): an inode changed now records it, and an fsync of
/// that inode waits for that commit only (jbd2's `i_sync_tid`).
pub(crate) fn current_tid() -> u64 {
    CUR_TID.with(|c| c.get())
}

/// A handle: the thread is changing the filesystem (see the module
/// documentation). Dropping it ends the handle.
pub(crate) struct Handle<'a> {
    _pass: Option<Pass<'a>>,
    outer: bool,
    journal: Option<&'a Journal>,
}

impl Handle<'_> {
    /// No journal: a handle that does nothing.
    pub(crate) fn none() -> Handle<'static> {
        Handle {
            _pass: None,
            outer: false,
            journal: None,
        }
    }

    /// True if this thread already holds a handle of `j`.
    pub(crate) fn nested(j: &Journal) -> bool {
        IN_HANDLE.with(|c| c.get() == j as *const Journal as usize)
    }

    /// Start a handle on `j`.
    pub(crate) fn start(j: &Journal) -> Handle<'_> {
        if Handle::nested(j) {
            return Handle {
                _pass: Some(j.gate.enter_nested()),
                outer: false,
                journal: Some(j),
            };
        }
        // Entering may wait for a commit (the gate closed): no ext4 lock
        // may be held, as the committer takes them with the gate closed
        // and a handle inside may be waiting for one.
        scalevfs_sync::ordered::check_wait(Class::Ext4Handle, 0);
        let p = j.gate.enter();
        IN_HANDLE.with(|c| c.set(j as *const Journal as usize));
        // Inside the gate `started` cannot move: a committer increments it
        // only after every pass has left. So this handle's changes go in
        // commit `started + 1`.
        CUR_TID.with(|c| c.set(j.next_commit()));
        Handle {
            _pass: Some(p),
            outer: true,
            journal: Some(j),
        }
    }
}

/// The committer, while the gate is closed, counts as inside a handle: a
/// deferred destructor it runs that changes the filesystem gets a nested
/// handle instead of waiting for the gate it closed itself.
pub(crate) struct CommitterMark<'a>(&'a Journal);

impl CommitterMark<'_> {
    pub(crate) fn set(j: &Journal) -> CommitterMark<'_> {
        IN_HANDLE.with(|c| c.set(j as *const Journal as usize));
        CommitterMark(j)
    }
}

impl Drop for CommitterMark<'_> {
    fn drop(&mut self) {
        self.0.release_steps();
        IN_HANDLE.with(|c| c.set(0));
    }
}

impl Drop for Handle<'_> {
    fn drop(&mut self) {
        if self.outer {
            if let Some(j) = self.journal {
                j.release_steps();
            }
            IN_HANDLE.with(|c| c.set(0));
            CUR_TID.with(|c| c.set(0));
        }
    }
}

/// The on-disk orphan file of a journaled mount (`orphan.rs`): the slot
/// allocator, the orphan file's physical blocks, and its checksum seed
/// (None without metadata_csum).
pub(crate) struct OrphanDisk {
    pub(crate) file: OrphanFile,
    pub(crate) blocks: Vec<u64>,
    pub(crate) seed: Option<u32>,
    /// One bit per orphan block a slot store changed in the running
    /// transaction: the commit recomputes those blocks' tails only
    /// (`Ext4::orphan_tails`), not every block's.
    pub(crate) touched: Box<[AtomicU64]>,
}

/// Lists kept in shards, each under its own lock (one class, taken one at
/// a time): threads that push to different shards share no lock and no
/// line. Used for the running transaction's freed blocks (by thread), the
/// unlinked inodes (by inode number) and the inodes the VFS dropped (by
/// thread).
pub(crate) struct Sharded<T> {
    shards: Box<[CachePadded<Shard<T>>]>,
}

/// One shard: its list, and the list's length as of the last unlock, read
/// without the lock so that a pass over every shard (a commit's) skips the
/// empty ones instead of locking 64 mutexes.
pub(crate) struct Shard<T> {
    len: AtomicUsize,
    list: Mutex<Vec<T>>,
}

/// A locked shard: the list, whose length is published when it unlocks.
pub(crate) struct ShardGuard<'a, T> {
    len: &'a AtomicUsize,
    list: MutexGuard<'a, Vec<T>>,
}

impl<T> std::ops::Deref for ShardGuard<'_, T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.list
    }
}

impl<T> std::ops::DerefMut for ShardGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.list
    }
}

impl<T> Drop for ShardGuard<'_, T> {
    fn drop(&mut self) {
        // Release, paired with `busy`'s Acquire: a reader that sees the new
        // length sees the items behind it (it then takes the lock anyway).
        // The length is a hint: items pushed inside a handle are seen by the
        // commit that waits for the handle to leave (the gate orders that);
        // otherwise a stale 0 only delays an item to a later pass (as a
        // push just after a locked check would), and a stale non-zero costs
        // one lock.
        self.len.store(self.list.len(), Ordering::Release);
    }
}

impl<T> Shard<T> {
    pub(crate) fn lock(&self) -> ShardGuard<'_, T> {
        ShardGuard {
            len: &self.len,
            list: self.list.lock(),
        }
    }

    /// Possibly non-empty (see `ShardGuard`'s drop).
    fn busy(&self) -> bool {
        // Acquire: see `ShardGuard`'s drop.
        self.len.load(Ordering::Acquire) != 0
    }
}

const SHARDS: usize = 64;

impl<T> std::fmt::Debug for Sharded<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sharded")
    }
}

impl<T> Sharded<T> {
    pub(crate) fn new(class: Class) -> Sharded<T> {
        Sharded {
            shards: (0..SHARDS)
                .map(|_| {
                    CachePadded::new(Shard {
                        len: AtomicUsize::new(0),
                        list: Mutex::new(class, Vec::new()),
                    })
                })
                .collect(),
        }
    }

    /// The shard for `key`.
    pub(crate) fn shard(&self, key: u64) -> &Shard<T> {
        &self.shards[(key % SHARDS as u64) as usize]
    }

    /// The calling thread's shard.
    pub(crate) fn mine(&self) -> &Shard<T> {
        self.shard(thread_id())
    }

    /// Take everything (shard by shard; shards whose published length is 0
    /// are skipped, see `ShardGuard`).
    pub(crate) fn drain_all(&self) -> Vec<T> {
        let mut out = Vec::new();
        for s in self.shards.iter().filter(|s| s.busy()) {
            out.append(&mut s.lock());
        }
        out
    }

    /// True if every shard is empty (by the published lengths).
    pub(crate) fn is_empty(&self) -> bool {
        !self.shards.iter().any(|s| s.busy())
    }

    /// Run `f` on each shard's list in turn (every shard with `all`, else
    /// those whose published length is not 0).
    pub(crate) fn for_each(&self, all: bool, mut f: impl FnMut(&mut Vec<T>)) {
        for s in self.shards.iter().filter(|s| all || s.busy()) {
            f(&mut s.lock());
        }
    }
}

/// The in-memory mirror of the on-disk chain.
#[derive(Default)]
pub(crate) struct ListState {
    /// `s_last_orphan` as it will be committed.
    pub(crate) head: u32,
    /// Inode -> the next one on the chain (0: the last).
    pub(crate) next: HashMap<u32, u32>,
    /// Inode -> the one before it (absent: it is the head).
    pub(crate) prev: HashMap<u32, u32>,
    /// Inode -> records of it beyond the first (a long truncate's and the
    /// unlink's of the same inode): it leaves the chain when the last is
    /// removed. Absent: one record.
    pub(crate) extra: HashMap<u32, u32>,
}

/// An orphan list of a journaled mount (`orphan_list.rs` keeps it; here
/// so that `fs.rs` can hold one without importing that module): every
/// orphan of an `orphan=list` mount, or, on a mount that uses the orphan
/// file, the inodes that found it full (the fallback, as the kernel's).
pub(crate) struct OrphanList {
    pub(crate) state: Mutex<ListState>,
    /// Inodes on the chain (`state.next.len()`), published for the
    /// fallback's lock-free check in `Ext4::with_orphan_link`; changed
    /// under `state`.
    pub(crate) len: AtomicUsize,
    /// Inodes ever added (changed under `state`, before the chain is
    /// patched): an encode that checked `len` without the mutex sees a
    /// join that raced with it (`Ext4::with_orphan_link`).
    pub(crate) adds: AtomicU64,
}

impl OrphanList {
    pub(crate) fn new() -> OrphanList {
        OrphanList {
            state: Mutex::new(Class::Ext4OrphanList, ListState::default()),
            len: AtomicUsize::new(0),
            adds: AtomicU64::new(0),
        }
    }

    /// Inodes on the list (tests, statistics).
    pub(crate) fn len(&self) -> usize {
        self.state.lock().next.len()
    }
}

/// Writes to the device that any one of several threads may do: the
/// committer offers the log writes of a commit's blocks ([`HelpSlot`]); a
/// thread waiting for that commit takes them (`try_run`) and writes while
/// the committer computes the blocks' checksums and writes the
/// descriptors; the committer then runs them itself if no one took them,
/// or waits for the thread that did (`finish`), before its flush.
///
/// The hand-off is a `scalevfs_sync::Offer` (exactly one writer; its
/// writes happen-before the committer sees the outcome; loom-modelled in
/// `crates/sync/tests/loom_offer.rs`). The outcome is 0, or the OS error
/// of the failed write (-1: one without a code).
pub struct SharedWrite {
    dev: Arc<dyn BlockDevice>,
    /// Byte offset, then the blocks written there one after another.
    runs: Vec<(u64, Vec<Block>)>,
    offer: Offer,
}

impl std::fmt::Debug for SharedWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWrite")
            .field("runs", &self.runs.len())
            .finish()
    }
}

impl SharedWrite {
    pub fn new(dev: Arc<dyn BlockDevice>, runs: Vec<(u64, Vec<Block>)>) -> SharedWrite {
        SharedWrite {
            dev,
            runs,
            offer: Offer::new(),
        }
    }

    /// Do the writes unless another thread took them; true if this
    /// thread did.
    pub fn try_run(&self) -> bool {
        if !self.offer.take() {
            return false;
        }
        let mut bufs: Vec<&[u8]> = Vec::new();
        let mut r = Ok(());
        for (off, blocks) in &self.runs {
            bufs.clear();
            bufs.extend(blocks.iter().map(|b| &b[..]));
            r = self.dev.write_vectored_at(*off, &bufs);
            if r.is_err() {
                break;
            }
        }
        // The writes returned: the committer's flush after `finish` covers
        // them.
        self.offer
            .complete(r.map_or_else(|e| i64::from(e.raw_os_error().unwrap_or(-1)), |()| 0));
        true
    }

    /// The writes done (by this thread if no other took them): their
    /// outcome. The committer calls this before the flush that must cover
    /// them.
    pub fn finish(&self) -> io::Result<()> {
        self.try_run();
        let mut spins = 0u32;
        let outcome = loop {
            if let Some(o) = self.offer.outcome() {
                break o;
            }
            // Another thread is writing (a few microseconds).
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        };
        match outcome {
            0 => Ok(()),
            e => Err(i32::try_from(e).ok().filter(|&e| e > 0).map_or_else(
                || io::Error::other("log write failed"),
                io::Error::from_raw_os_error,
            )),
        }
    }
}

/// The offer of a commit's log writes to the threads that wait for it
/// (`Ext4::commit_until`): the committer `post`s a [`SharedWrite`] and
/// `withdraw`s it after `SharedWrite::finish`; a waiter that finds one
/// (`help`) runs it unless someone already did.
pub(crate) struct HelpSlot {
    /// A write is on offer (a hint read without the lock: a waiter takes
    /// the lock only when set).
    posted: AtomicBool,
    slot: Mutex<Option<Arc<SharedWrite>>>,
}

impl HelpSlot {
    pub(crate) fn new() -> HelpSlot {
        HelpSlot {
            posted: AtomicBool::new(false),
            slot: Mutex::new(Class::Ext4Help, None),
        }
    }

    /// Offer `w` (a committer writing its log; two writing at once replace
    /// each other's offer, and each does what no one took).
    pub(crate) fn post(&self, w: &Arc<SharedWrite>) {
        *self.slot.lock() = Some(Arc::clone(w));
        // Relaxed: a hint; the offer itself is read under the lock.
        self.posted.store(true, Ordering::Relaxed);
    }

    /// Take the offer of `w` back (after `SharedWrite::finish`), unless
    /// another committer's replaced it.
    pub(crate) fn withdraw(&self, w: &Arc<SharedWrite>) {
        let mut slot = self.slot.lock();
        if slot.as_ref().is_some_and(|o| Arc::ptr_eq(o, w)) {
            // Relaxed: a hint (see `post`).
            self.posted.store(false, Ordering::Relaxed);
            slot.take();
        }
    }

    /// A waiter: run the write on offer, if any and not yet taken; true
    /// if this thread wrote.
    pub(crate) fn help(&self) -> bool {
        // Relaxed: a hint (see `post`); a stale false only skips a chance
        // to help, a stale true costs one lock.
        if !self.posted.load(Ordering::Relaxed) {
            return false;
        }
        let w = self.slot.lock().clone();
        w.is_some_and(|w| w.try_run())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log of `cap` blocks that takes nothing (only its size matters).
    struct Sized(u32);

    impl LogSink for Sized {
        fn begin(&mut self, _: Vec<(u64, Block)>, _: &[u64], _: u64) -> Result<Box<dyn LogWrite>> {
            unreachable!("no commit in these tests")
        }
        fn wait_all(&self) -> Result<()> {
            Ok(())
        }
        fn checkpoint(&mut self) -> Result<()> {
            Ok(())
        }
        fn forget(&mut self, _: &[u64]) {}
        fn room(&self) -> u32 {
            self.0
        }
        fn capacity(&self) -> u32 {
            self.0
        }
        fn tags_per_block(&self) -> u32 {
            64
        }
        fn close(self: Box<Self>) -> Result<()> {
            Ok(())
        }
    }

    /// Steps of threads now in handles share the log: the first gets its
    /// full size, later ones what is left (at least one group); a handle
    /// reserves once, and its end gives its steps' room back.
    #[test]
    fn steps_share_the_log_and_give_it_back() {
        let j = Journal::new(Box::new(Sized(1024)));
        // limit 192; the pool: 1024 less 16 descriptor blocks, 16 of
        // margin and 96 for small handles = 896.
        let full = j.limit() / 2;
        assert_eq!(full, 96);
        let go = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            let (j, go) = (&j, &go);
            let a = s.spawn(move || {
                let _h = Handle::start(j);
                let g = j.reserve_step(0, full);
                // Asked again in the same handle: the same, nothing more.
                assert_eq!(j.reserve_step(0, full), g);
                go.wait();
                go.wait();
                g
            });
            go.wait();
            // The first took a step and a reap of 96 groups: 4 * 96 + 16.
            assert_eq!(j.steps_reserved(), 400);
            let h = Handle::start(j);
            // 896 - 300 - 400 = 196 left: (196 - 16) / 4 = 45 groups.
            assert_eq!(j.reserve_step(300, full), 45);
            assert_eq!(j.steps_reserved(), 596);
            drop(h);
            assert_eq!(j.steps_reserved(), 400, "the handle's steps went back");
            let h = Handle::start(j);
            // Nothing left: one group all the same (a step must progress).
            assert_eq!(j.reserve_step(700, full), 1);
            drop(h);
            go.wait();
            assert_eq!(a.join().unwrap(), full);
        });
        assert_eq!(j.steps_reserved(), 0);
    }
}
