//! Per-thread event counters and per-lock-class contention statistics.
//!
//! USAGE
//!
//! Hot paths call [`inc`], [`add`] or [`lock_acquired`]; reporting code calls
//! [`snapshot`] twice and prints `later.delta(&earlier)`. [`set_enabled`]
//! switches recording off globally (one Relaxed load on every hot-path call).
//!
//! DESIGN AND LOCKING RULES
//!
//! - Every thread owns one `crossbeam_utils::CachePadded` shard of counters, created and
//!   registered in the global registry the first time the thread records
//!   anything. Only the owning thread ever writes its live shard, so an
//!   update is a Relaxed load plus a Relaxed store of the thread's own cache
//!   line: no atomic read-modify-write and no shared cache line on the hot
//!   path. The counters are atomics only so that readers may load them while
//!   the owner writes (no data race); a reader may see a value a few
//!   increments old, which is all a statistics counter promises.
//! - `REGISTRY` (a `std::sync::Mutex`) protects the list of live shards, the
//!   accumulated counts of exited threads and the [`reset`] baseline. It is
//!   taken on a thread's first record, at thread exit, and by
//!   [`snapshot`]/[`reset`]; never on the counting path. It is a leaf lock:
//!   nothing else is acquired while it is held.
//! - When a thread exits, its shard is folded into the `retired` totals under
//!   the registry lock and unlinked in the same critical section, so a
//!   concurrent snapshot counts it exactly once and memory stays bounded in
//!   programs that start many short-lived threads.
//! - Events recorded while the thread's own thread-locals are being torn down
//!   (e.g. a `Drop` running after the shard was retired) are dropped.
//!
//! Under `cfg(loom)` every recording function is a no-op and snapshots are
//! all zero: loom models must not touch real statics or thread-locals.

use core::fmt;

macro_rules! counter_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[doc = $doc:literal])* $variant:ident => $label:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(usize)]
        pub enum $name {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl $name {
            /// Every value, in declaration (and index) order.
            pub const ALL: [$name; [$($name::$variant),*].len()] = [$($name::$variant),*];
            /// Number of values.
            pub const COUNT: usize = Self::ALL.len();

            /// Short snake_case name used in reports.
            pub const fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $label, )*
                }
            }

            /// Position in [`Self::ALL`] (and in snapshot arrays).
            #[inline(always)]
            pub const fn index(self) -> usize {
                self as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

counter_enum! {
    /// A countable event.
    pub enum Stat {
        /// A LockRef operation completed without taking the lock.
        LockrefFast => "lockref_fast",
        /// A LockRef operation fell back to (or, for `spin`, always used) the lock.
        LockrefLocked => "lockref_locked",
        /// A `lockref-wait` operation found the lock held and waited for it
        /// at least once (counted once per operation).
        LockrefWait => "lockref_wait",
        /// Wait iterations (`spin_loop` calls) spent by `lockref-wait`
        /// operations waiting for the lock half to clear.
        LockrefWaitSpins => "lockref_wait_spins",
        /// Failed compare-exchange attempts on a LockRef word.
        LockrefCasFail => "lockref_cas_fail",
        /// A sequence-counter reader had to retry.
        SeqRetry => "seq_retry",
        /// A successful write or read-modify-write of a shared synchronisation
        /// word (CAS success, lock acquire, unlock, sequence bump).
        SharedWrite => "shared_write",
        /// Path walk finished entirely in lock-free mode.
        WalkHandled => "walk_handled",
        /// Path walk started lock-free and handed over to ref-walk.
        WalkPartial => "walk_partial",
        /// Lock-free path walk aborted and restarted from the beginning.
        WalkAborted => "walk_aborted",
        /// Lock-free walk converted its state to references (unlazy).
        WalkUnlazy => "walk_unlazy",
        /// Dentry cache lookup found the entry.
        DcacheHit => "dcache_hit",
        /// Dentry cache lookup missed.
        DcacheMiss => "dcache_miss",
        /// Dentry cache lookup hit a negative entry.
        DcacheNegative => "dcache_negative",
        /// A dentry was inserted into the cache.
        DcacheInsert => "dcache_insert",
        /// A dentry was reclaimed from the cache.
        DcacheReclaim => "dcache_reclaim",
        /// An inode was added to the orphan list.
        OrphanAdd => "orphan_add",
        /// An inode was removed from the orphan list.
        OrphanDel => "orphan_del",
    }
}

counter_enum! {
    /// What a lock protects, for per-class contention statistics
    /// (in the spirit of Linux lockdep classes / lock_stat).
    pub enum LockClass {
        /// Anything not classified.
        Other => "other",
        /// A dentry hash bucket.
        DcacheBucket => "dcache_bucket",
        /// A dentry's own lock (`d_lock`) when it is a separate lock.
        DentryLock => "dentry_lock",
        /// The spinlock half of a [`LockRef`](crate::LockRef).
        LockRef => "lockref",
        /// Inode attributes.
        InodeAttr => "inode_attr",
        /// Inode data (file contents).
        InodeData => "inode_data",
        /// A directory's children / directory-modification lock.
        DirLock => "dir_lock",
        /// A dentry's name.
        NameLock => "name_lock",
        /// The filesystem-wide rename lock.
        RenameLock => "rename_lock",
        /// A task's file-descriptor table.
        FdTable => "fd_table",
        /// The orphan file / orphan list.
        OrphanFile => "orphan_file",
        /// Superblock-wide state.
        Sb => "sb",
        /// The writer lock of a [`SeqLock`](crate::SeqLock).
        SeqLockWriter => "seqlock_writer",
    }
}

/// Number of buckets in the per-class wait histogram.
///
/// Bucket 0 counts contended acquisitions that needed no backoff step,
/// bucket `k >= 1` those that needed `2^(k-1) ..= 2^k - 1` steps; the last
/// bucket also holds everything larger.
pub const HIST_BUCKETS: usize = 16;

/// Histogram bucket for a contended acquisition that took `spins` steps.
#[inline]
pub const fn hist_bucket(spins: u64) -> usize {
    let b = (u64::BITS - spins.leading_zeros()) as usize;
    if b < HIST_BUCKETS {
        b
    } else {
        HIST_BUCKETS - 1
    }
}

/// Contention statistics of one lock class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Acquisitions.
    pub acquired: u64,
    /// Acquisitions that found the lock held.
    pub contended: u64,
    /// Backoff steps spent in contended acquisitions.
    pub spins: u64,
    /// Contended acquisitions by backoff steps, see [`HIST_BUCKETS`].
    pub hist: [u64; HIST_BUCKETS],
}

impl ClassStats {
    fn delta(&self, earlier: &ClassStats) -> ClassStats {
        let mut hist = [0; HIST_BUCKETS];
        for (i, h) in hist.iter_mut().enumerate() {
            *h = self.hist[i].saturating_sub(earlier.hist[i]);
        }
        ClassStats {
            acquired: self.acquired.saturating_sub(earlier.acquired),
            contended: self.contended.saturating_sub(earlier.contended),
            spins: self.spins.saturating_sub(earlier.spins),
            hist,
        }
    }

    fn accumulate(&mut self, other: &ClassStats) {
        self.acquired = self.acquired.wrapping_add(other.acquired);
        self.contended = self.contended.wrapping_add(other.contended);
        self.spins = self.spins.wrapping_add(other.spins);
        for (h, o) in self.hist.iter_mut().zip(other.hist.iter()) {
            *h = h.wrapping_add(*o);
        }
    }
}

/// A point-in-time sum of all counters. Take two and subtract with
/// [`Snapshot::delta`] to measure an interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Indexed by [`Stat::index`].
    pub stats: [u64; Stat::COUNT],
    /// Indexed by [`LockClass::index`].
    pub classes: [ClassStats; LockClass::COUNT],
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            stats: [0; Stat::COUNT],
            classes: [ClassStats::default(); LockClass::COUNT],
        }
    }
}

impl Snapshot {
    /// Value of one counter.
    #[inline]
    pub fn get(&self, s: Stat) -> u64 {
        self.stats[s.index()]
    }

    /// Statistics of one lock class.
    #[inline]
    pub fn class(&self, c: LockClass) -> &ClassStats {
        &self.classes[c.index()]
    }

    /// `self - earlier`, counter by counter (saturating at zero, so a
    /// [`reset`] in between cannot produce huge numbers).
    pub fn delta(&self, earlier: &Snapshot) -> Snapshot {
        let mut out = Snapshot::default();
        for i in 0..Stat::COUNT {
            out.stats[i] = self.stats[i].saturating_sub(earlier.stats[i]);
        }
        for i in 0..LockClass::COUNT {
            out.classes[i] = self.classes[i].delta(&earlier.classes[i]);
        }
        out
    }

    /// Fraction of LockRef operations that took the lock (0.0 when there
    /// were none).
    pub fn lockref_locked_fraction(&self) -> f64 {
        let locked = self.get(Stat::LockrefLocked);
        let total = locked + self.get(Stat::LockrefFast);
        if total == 0 {
            0.0
        } else {
            locked as f64 / total as f64
        }
    }

    /// Add `other` into `self`, counter by counter (e.g. to sum several
    /// threads' [`thread_snapshot`] deltas).
    pub fn merge(&mut self, other: &Snapshot) {
        for (a, b) in self.stats.iter_mut().zip(other.stats.iter()) {
            *a = a.wrapping_add(*b);
        }
        for (a, b) in self.classes.iter_mut().zip(other.classes.iter()) {
            a.accumulate(b);
        }
    }
}

impl fmt::Display for Snapshot {
    /// A readable table; zero rows are left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:<20} {:>14}", "counter", "value")?;
        for s in Stat::ALL {
            let v = self.get(s);
            if v != 0 {
                writeln!(f, "{:<20} {:>14}", s.name(), v)?;
            }
        }
        writeln!(f)?;
        writeln!(
            f,
            "{:<16} {:>12} {:>12} {:>7} {:>12} {:>9}  wait histogram (log2 steps: count)",
            "lock class", "acquired", "contended", "cont%", "spins", "spins/c"
        )?;
        for c in LockClass::ALL {
            let cs = self.class(c);
            if cs.acquired == 0 && cs.contended == 0 {
                continue;
            }
            let pct = if cs.acquired == 0 {
                0.0
            } else {
                100.0 * cs.contended as f64 / cs.acquired as f64
            };
            let per = if cs.contended == 0 {
                0.0
            } else {
                cs.spins as f64 / cs.contended as f64
            };
            write!(
                f,
                "{:<16} {:>12} {:>12} {:>6.2}% {:>12} {:>9.1} ",
                c.name(),
                cs.acquired,
                cs.contended,
                pct,
                cs.spins,
                per
            )?;
            for (b, n) in cs.hist.iter().enumerate() {
                if *n != 0 {
                    write!(f, " {b}:{n}")?;
                }
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(not(loom))]
mod imp {
    use super::{hist_bucket, ClassStats, LockClass, Snapshot, Stat, HIST_BUCKETS};
    use crate::primitive::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use crossbeam_utils::CachePadded;
    use std::sync::{Arc, Mutex, MutexGuard};

    /// Recording switch. Relaxed: a stale value only means a few events more
    /// or fewer are recorded around the switch.
    static ENABLED: AtomicBool = AtomicBool::new(true);

    struct ClassShard {
        acquired: AtomicU64,
        contended: AtomicU64,
        spins: AtomicU64,
        hist: [AtomicU64; HIST_BUCKETS],
    }

    impl ClassShard {
        const fn new() -> Self {
            ClassShard {
                acquired: AtomicU64::new(0),
                contended: AtomicU64::new(0),
                spins: AtomicU64::new(0),
                hist: [const { AtomicU64::new(0) }; HIST_BUCKETS],
            }
        }
    }

    pub(super) struct Shard {
        stats: [AtomicU64; Stat::COUNT],
        classes: [ClassShard; LockClass::COUNT],
    }

    /// Single-writer increment: only the owning thread (or the registry-lock
    /// holder, for `retired`) writes a shard, so load + store loses nothing.
    /// Relaxed: readers want an approximately current value, not ordering.
    #[inline(always)]
    fn bump(c: &AtomicU64, n: u64) {
        c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
    }

    impl Shard {
        const fn new() -> Self {
            Shard {
                stats: [const { AtomicU64::new(0) }; Stat::COUNT],
                classes: [const { ClassShard::new() }; LockClass::COUNT],
            }
        }

        #[inline(always)]
        pub(super) fn add(&self, s: Stat, n: u64) {
            bump(&self.stats[s.index()], n);
        }

        #[inline(always)]
        pub(super) fn lock_acquired(&self, class: LockClass, contended: bool, spins: u64) {
            let c = &self.classes[class.index()];
            bump(&c.acquired, 1);
            if contended {
                bump(&c.contended, 1);
                bump(&c.spins, spins);
                bump(&c.hist[hist_bucket(spins)], 1);
            }
        }

        /// Relaxed loads: see `bump`.
        fn read(&self) -> Snapshot {
            let mut out = Snapshot::default();
            for (o, s) in out.stats.iter_mut().zip(self.stats.iter()) {
                *o = s.load(Relaxed);
            }
            for (o, c) in out.classes.iter_mut().zip(self.classes.iter()) {
                let mut hist = [0; HIST_BUCKETS];
                for (h, a) in hist.iter_mut().zip(c.hist.iter()) {
                    *h = a.load(Relaxed);
                }
                *o = ClassStats {
                    acquired: c.acquired.load(Relaxed),
                    contended: c.contended.load(Relaxed),
                    spins: c.spins.load(Relaxed),
                    hist,
                };
            }
            out
        }

        /// Add `other` into `self`; caller is `self`'s only writer.
        fn absorb(&self, other: &Snapshot) {
            for (a, v) in self.stats.iter().zip(other.stats.iter()) {
                bump(a, *v);
            }
            for (a, v) in self.classes.iter().zip(other.classes.iter()) {
                bump(&a.acquired, v.acquired);
                bump(&a.contended, v.contended);
                bump(&a.spins, v.spins);
                for (h, n) in a.hist.iter().zip(v.hist.iter()) {
                    bump(h, *n);
                }
            }
        }
    }

    struct Registry {
        live: Vec<Arc<CachePadded<Shard>>>,
        /// Sum of the shards of exited threads; written only under the lock.
        retired: Shard,
        /// Subtracted from every global snapshot; set by `reset`.
        baseline: Option<Box<Snapshot>>,
    }

    static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
        live: Vec::new(),
        retired: Shard::new(),
        baseline: None,
    });

    /// The registry guard; a panic elsewhere while it was held cannot leave
    /// the counters inconsistent in a way that matters, so ignore poisoning.
    fn registry() -> MutexGuard<'static, Registry> {
        REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
    }

    struct Local {
        shard: Arc<CachePadded<Shard>>,
    }

    impl Local {
        #[cold]
        fn register() -> Local {
            let shard = Arc::new(CachePadded::new(Shard::new()));
            registry().live.push(Arc::clone(&shard));
            Local { shard }
        }
    }

    impl Drop for Local {
        /// Thread exit: fold this thread's counts into `retired` and unlink the
        /// shard, atomically with respect to `snapshot`.
        fn drop(&mut self) {
            let mut reg = registry();
            let counts = self.shard.read();
            reg.retired.absorb(&counts);
            reg.live.retain(|s| !Arc::ptr_eq(s, &self.shard));
        }
    }

    thread_local! {
        static LOCAL: Local = Local::register();
    }

    #[inline(always)]
    pub(super) fn enabled() -> bool {
        // Relaxed: see ENABLED.
        ENABLED.load(Relaxed)
    }

    pub(super) fn set_enabled(on: bool) {
        // Relaxed: see ENABLED.
        ENABLED.store(on, Relaxed);
    }

    /// Run `f` on this thread's shard if recording is on and the thread's
    /// locals are still alive.
    #[inline(always)]
    pub(super) fn with_shard(f: impl FnOnce(&Shard)) {
        if enabled() {
            let _ = LOCAL.try_with(|l| f(&l.shard));
        }
    }

    fn raw_sum(reg: &Registry) -> Snapshot {
        let mut sum = reg.retired.read();
        for s in &reg.live {
            sum.merge(&s.read());
        }
        sum
    }

    pub(super) fn snapshot() -> Snapshot {
        let reg = registry();
        let sum = raw_sum(&reg);
        match &reg.baseline {
            Some(b) => sum.delta(b),
            None => sum,
        }
    }

    pub(super) fn thread_snapshot() -> Snapshot {
        LOCAL.try_with(|l| l.shard.read()).unwrap_or_default()
    }

    pub(super) fn reset() {
        let mut reg = registry();
        let sum = raw_sum(&reg);
        reg.baseline = Some(Box::new(sum));
    }
}

#[cfg(loom)]
mod imp {
    use super::{LockClass, Snapshot, Stat};

    pub(super) struct Shard;

    impl Shard {
        #[inline(always)]
        pub(super) fn add(&self, _s: Stat, _n: u64) {}
        #[inline(always)]
        pub(super) fn lock_acquired(&self, _c: LockClass, _contended: bool, _spins: u64) {}
    }

    #[inline(always)]
    pub(super) fn enabled() -> bool {
        false
    }
    pub(super) fn set_enabled(_on: bool) {}
    #[inline(always)]
    pub(super) fn with_shard(_f: impl FnOnce(&Shard)) {}
    pub(super) fn snapshot() -> Snapshot {
        Snapshot::default()
    }
    pub(super) fn thread_snapshot() -> Snapshot {
        Snapshot::default()
    }
    pub(super) fn reset() {}
}

/// Several counter updates for the price of one thread-local lookup; used by
/// the primitives in this crate.
#[derive(Clone, Copy)]
pub(crate) struct Recorder<'a>(&'a imp::Shard);

impl Recorder<'_> {
    #[inline(always)]
    pub(crate) fn add(self, s: Stat, n: u64) {
        self.0.add(s, n);
    }

    #[inline(always)]
    pub(crate) fn lock_acquired(self, class: LockClass, contended: bool, spins: u64) {
        self.0.lock_acquired(class, contended, spins);
    }
}

/// Run `f` with this thread's recorder (not at all when recording is off).
#[inline(always)]
pub(crate) fn record(f: impl FnOnce(Recorder<'_>)) {
    imp::with_shard(|s| f(Recorder(s)));
}

/// Count one event.
#[inline]
pub fn inc(s: Stat) {
    add(s, 1);
}

/// Count `n` events.
#[inline]
pub fn add(s: Stat, n: u64) {
    imp::with_shard(|sh| sh.add(s, n));
}

/// Record one acquisition of a lock of class `class`: whether it found the
/// lock held, and how many backoff steps it spent waiting (0 if not
/// contended).
#[inline]
pub fn lock_acquired(class: LockClass, contended: bool, spins: u64) {
    imp::with_shard(|sh| sh.lock_acquired(class, contended, spins));
}

/// Switch recording on or off for all threads (on by default).
pub fn set_enabled(on: bool) {
    imp::set_enabled(on);
}

/// Whether recording is on.
#[inline]
pub fn enabled() -> bool {
    imp::enabled()
}

/// Sum of every thread's counters (including exited threads), minus the
/// baseline set by the last [`reset`].
pub fn snapshot() -> Snapshot {
    imp::snapshot()
}

/// The calling thread's own counters since the thread first recorded
/// anything (not affected by [`reset`]). Useful to measure a workload that
/// shares the process with others, e.g. in tests.
pub fn thread_snapshot() -> Snapshot {
    imp::thread_snapshot()
}

/// Make later [`snapshot`]s count from now. Snapshots taken before a reset
/// and deltas across it saturate at zero.
pub fn reset() {
    imp::reset();
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bucket_boundaries() {
        assert_eq!(hist_bucket(0), 0);
        assert_eq!(hist_bucket(1), 1);
        assert_eq!(hist_bucket(2), 2);
        assert_eq!(hist_bucket(3), 2);
        assert_eq!(hist_bucket(4), 3);
        assert_eq!(hist_bucket(u64::MAX), HIST_BUCKETS - 1);
    }

    #[test]
    fn names_are_unique() {
        let mut n: Vec<_> = Stat::ALL.iter().map(|s| s.name()).collect();
        n.sort_unstable();
        n.dedup();
        assert_eq!(n.len(), Stat::COUNT);
        for (i, s) in Stat::ALL.iter().enumerate() {
            assert_eq!(s.index(), i);
        }
        for (i, c) in LockClass::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
    }
}
