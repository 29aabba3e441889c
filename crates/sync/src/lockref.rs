//! `LockRef`: a spinlock and a reference count packed into one 64-bit word,
//! after Linux's `lib/lockref.c`.
//!
//! LOCKING RULES
//!
//! - The word is `{ lock: u32 (low half), count: i32 (high half) }`. The lock
//!   half is 0 (free) or 1 (held).
//! - The lock half protects the count *for every decision that involves
//!   zero*: taking the count to or from zero (`put_or_lock` returning with the
//!   lock, reviving with `get_not_dead`), marking the object dead, and
//!   whatever the owner of the `LockRef` protects with it besides the count
//!   (in scalevfs: the dentry fields guarded by `d_lock`).
//! - Counts above the thresholds below may change without the lock by a
//!   compare-exchange of the whole word. In the three CAS-loop variants such
//!   an update only succeeds on a word whose lock half is free, so the lock
//!   holder sees a stable count. The `cmpxchg2` variant (the 2013 design)
//!   instead lets counts above 1 (get) / 2 (put) change under a held lock,
//!   which is why every `*_locked` method below updates the count with an
//!   atomic read-modify-write rather than a plain store.
//! - `*_locked` methods require the caller to hold the lock (`lock()`,
//!   `try_lock()`, or a `put_or_lock` that returned `false`). Misuse is caught
//!   by `debug_assert!` only.
//! - A dead `LockRef` (count [`LOCKREF_DEAD`], any negative count counts as
//!   dead) never gets a reference again through `get_not_zero`/`get_not_dead`.
//!   `get` on a dead object is caller misuse (it requires a reference).
//!
//! THE FAST PATH, FIRST WITH THE LOCK
//!
//! ```text
//! lock(); count += 1; unlock();               // `spin`: two shared RMWs
//! ```
//!
//! and then without it (`lockref` / `lockref-wait`):
//!
//! ```text
//! old = load
//! for budget in 0..100:
//!     if old.lock is free:
//!         if cas(old, old with count+1) succeeds: done     // one shared RMW
//!         old = value seen by the failed cas
//!     else if variant is lockref-wait:
//!         spin_loop(); old = load                          // wait it out
//!     else:                                                // `lockref`
//!         break
//! lock(); count += 1; unlock()                             // fallback
//! ```
//!
//! The `lockref` variant leaves for the lock the moment it sees it held. With
//! a steady stream of operations from several threads, one outside thread
//! that briefly takes the lock makes some operations take it too, each of
//! those makes more operations see it held, and the object can stay in
//! locked-only operation indefinitely (seed 001, 2024). `lockref-wait` folds
//! the wait for the unlock into the same bounded loop (one budget for waits
//! and CAS failures), which stops the cascade: a brief hold costs waiters a
//! few spins instead of a lock round trip. `cmpxchg2` is the earlier (2013,
//! seed 000) scheme: at most two compare-exchange attempts, only while the
//! count stays clear of the values where the lock matters.
//!
//! MEMORY ORDERING
//!
//! - Lock acquire: Acquire. Unlock (always an RMW, see above): Release.
//! - Count compare-exchange: AcqRel on success. A put may be the one after
//!   which the caller frees the object (`put_return` -> `Some(0)`), so every
//!   earlier user's accesses must happen-before it (Release on each put,
//!   Acquire on the last one), and a get that revives or re-finds an object
//!   must see the state the previous lock holder published (Acquire). On
//!   x86 this costs nothing; `lock cmpxchg` is a full barrier anyway, as it
//!   is in the kernel.
//! - Loads that only seed a compare-exchange or a wait loop: Relaxed; the
//!   compare-exchange validates them.
//!
//! STATISTICS (see `lockstat`)
//!
//! [`Stat::LockrefFast`] per operation finished without the lock (including a
//! lockless "no": e.g. `get_not_zero` seeing zero), [`Stat::LockrefLocked`]
//! per operation that took the lock, [`Stat::LockrefWait`] per operation that
//! waited for an unlock at least once (with [`Stat::LockrefWaitSpins`] the
//! number of waiting iterations), [`Stat::LockrefCasFail`] per failed
//! compare-exchange, [`Stat::SharedWrite`] per successful write to the word
//! (CAS, lock acquire, unlock), and lock-class statistics for acquisitions
//! of the lock half under [`LockClass::LockRef`].

use crate::lockstat::{self, LockClass, Stat};
use crate::primitive::{spin_loop, AtomicU64, Backoff, Ordering};
use core::fmt;
use core::str::FromStr;

/// How the reference count is updated; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum LockRefVariant {
    /// Every update takes the spinlock (Linux before 2013).
    Spin,
    /// Up to two compare-exchange attempts while the count is above 1 (get)
    /// or 2 (put), else the lock (the 2013 `dcount` patch).
    Cmpxchg2,
    /// The mainline compare-exchange loop that leaves for the lock as soon as
    /// it sees the lock held (Linux 3.12 .. 6.10). Can degrade.
    Lockref,
    /// The same loop, waiting for the unlock within the same retry budget
    /// (Linux 6.11+). The default.
    #[default]
    LockrefWait,
}

impl LockRefVariant {
    /// Every variant, oldest design first.
    pub const ALL: [LockRefVariant; 4] = [
        LockRefVariant::Spin,
        LockRefVariant::Cmpxchg2,
        LockRefVariant::Lockref,
        LockRefVariant::LockrefWait,
    ];

    /// The name used on command lines and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            LockRefVariant::Spin => "spin",
            LockRefVariant::Cmpxchg2 => "cmpxchg2",
            LockRefVariant::Lockref => "lockref",
            LockRefVariant::LockrefWait => "lockref-wait",
        }
    }
}

impl fmt::Display for LockRefVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LockRefVariant {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        LockRefVariant::ALL
            .into_iter()
            .find(|v| v.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!(
                    "unknown lockref variant `{s}` (expected one of: spin, cmpxchg2, lockref, \
                     lockref-wait)"
                )
            })
    }
}

/// The count of a dead object.
pub const LOCKREF_DEAD: i32 = -128;

/// Iterations of the lockless loop (compare-exchange failures plus, for
/// `lockref-wait`, lock waits) before falling back to the lock. The kernel's
/// value; a small one under loom keeps the models tractable.
#[cfg(not(loom))]
pub const LOCKREF_RETRIES: u32 = 100;
/// Iterations of the lockless loop before falling back to the lock (reduced
/// under loom to keep the models small).
#[cfg(loom)]
pub const LOCKREF_RETRIES: u32 = 3;

/// Compare-exchange attempts of the `cmpxchg2` variant.
const CMPXCHG2_ATTEMPTS: u32 = 2;

const LOCK_MASK: u64 = 0xffff_ffff;
const LOCKED: u64 = 1;

/// Success ordering of every count compare-exchange; see MEMORY ORDERING.
const CAS_SUCCESS: Ordering = Ordering::AcqRel;

#[inline(always)]
const fn pack(count: i32) -> u64 {
    (count as u32 as u64) << 32
}

#[inline(always)]
const fn count_of(w: u64) -> i32 {
    (w >> 32) as u32 as i32
}

#[inline(always)]
const fn locked(w: u64) -> bool {
    w & LOCK_MASK != 0
}

#[inline(always)]
const fn with_count(w: u64, c: i32) -> u64 {
    (w & LOCK_MASK) | pack(c)
}

/// The word increment that adds `d` to the count half (mod 2^32) and leaves
/// the lock half alone.
#[inline(always)]
const fn count_delta(d: i32) -> u64 {
    ((d as i64) << 32) as u64
}

/// What a lockless step decided for the count it was shown.
enum Step {
    /// Install this new count.
    Update(i32),
    /// Definitive "no" without the lock (e.g. `get_not_zero` on zero).
    Refuse,
    /// Only the lock can decide (e.g. `put_or_lock` on 1).
    NeedLock,
}

/// Outcome of the lockless attempt.
enum Fast {
    Updated(i32),
    Refused,
    Slow,
}

/// A spinlock and a reference count in one 64-bit word.
#[repr(C, align(8))]
pub struct LockRef {
    word: AtomicU64,
}

#[cfg(not(loom))]
const _: () = assert!(
    core::mem::size_of::<LockRef>() == 8 && core::mem::align_of::<LockRef>() == 8,
    "LockRef must be one 64-bit word"
);

impl LockRef {
    /// An unlocked `LockRef` holding `count`.
    #[cfg(not(loom))]
    #[inline]
    pub const fn new(count: i32) -> Self {
        LockRef {
            word: AtomicU64::new(pack(count)),
        }
    }

    /// An unlocked `LockRef` holding `count`.
    #[cfg(loom)]
    pub fn new(count: i32) -> Self {
        LockRef {
            word: AtomicU64::new(pack(count)),
        }
    }

    // ----- reference operations -------------------------------------------

    /// Take one more reference; the caller already holds one (so the count is
    /// positive and the object is not dead).
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn get(&self, v: LockRefVariant) {
        if let Fast::Updated(_) = self.fast(v, 1, |c| Step::Update(c.wrapping_add(1))) {
            return;
        }
        self.locked_op(|_| (1, true));
    }

    /// Take `n` more references at once; the caller already holds one. (The
    /// dcache takes a batch of spare parent references per thread this way;
    /// see `core/src/spares.rs`.)
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn get_many(&self, n: i32, v: LockRefVariant) {
        debug_assert!(n > 0);
        if let Fast::Updated(_) = self.fast(v, 1, |c| Step::Update(c.wrapping_add(n))) {
            return;
        }
        self.locked_op(|_| (n, true));
    }

    /// Drop `n` references at once, keeping at least one: the caller holds
    /// more than `n`, so the count stays positive and no zero transition
    /// happens here (the last reference goes through [`put_or_lock`]).
    ///
    /// [`put_or_lock`]: Self::put_or_lock
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn put_many(&self, n: i32, v: LockRefVariant) {
        debug_assert!(n > 0);
        let step = |c: i32| {
            if c <= n {
                Step::NeedLock
            } else {
                Step::Update(c - n)
            }
        };
        if let Fast::Updated(_) = self.fast(v, n.saturating_add(1), step) {
            return;
        }
        self.locked_op(|_| (-n, true));
    }

    /// Take a reference if the count is positive. Returns whether it did.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn get_not_zero(&self, v: LockRefVariant) -> bool {
        let step = |c: i32| {
            if c <= 0 {
                Step::Refuse
            } else {
                Step::Update(c + 1)
            }
        };
        match self.fast(v, 1, step) {
            Fast::Updated(_) => true,
            Fast::Refused => false,
            Fast::Slow => self.locked_op(|c| if c > 0 { (1, true) } else { (0, false) }),
        }
    }

    /// Take a reference unless the object is dead; zero counts are revived
    /// (0 -> 1: a cached, unused dentry comes back into use). Returns
    /// whether it did.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn get_not_dead(&self, v: LockRefVariant) -> bool {
        let step = |c: i32| {
            if c < 0 {
                Step::Refuse
            } else {
                Step::Update(c + 1)
            }
        };
        match self.fast(v, 1, step) {
            Fast::Updated(_) => true,
            Fast::Refused => false,
            Fast::Slow => self.locked_op(|c| if c >= 0 { (1, true) } else { (0, false) }),
        }
    }

    /// Drop a reference without ever taking the lock (the kernel's
    /// `lockref_put_return`). `Some(new_count)` on success, and the new count
    /// may be 0: the caller then owns the zero-count transition. `None` when
    /// the lockless path could not do it (lock held, count not positive,
    /// retries exhausted; for `cmpxchg2` also whenever the count is 2 or
    /// less; for `spin` always): the caller must use the locked path.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn put_return(&self, v: LockRefVariant) -> Option<i32> {
        let step = |c: i32| {
            if c <= 0 {
                Step::Refuse
            } else {
                Step::Update(c - 1)
            }
        };
        match self.fast(v, 2, step) {
            Fast::Updated(n) => Some(n),
            Fast::Refused | Fast::Slow => None,
        }
    }

    /// Drop a reference unless it is the last one. If the count is above 1,
    /// decrement it and return `true`. Otherwise take the lock and return
    /// `false` with the count unchanged: the caller holds the lock and
    /// decides what the last reference means (typically: `dec_locked`,
    /// maybe `mark_dead_locked`, `unlock`).
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn put_or_lock(&self, v: LockRefVariant) -> bool {
        let step = |c: i32| {
            if c <= 1 {
                Step::NeedLock
            } else {
                Step::Update(c - 1)
            }
        };
        match self.fast(v, 2, step) {
            Fast::Updated(_) => true,
            Fast::Refused | Fast::Slow => self.put_or_lock_slow(),
        }
    }

    // ----- lock-held operations -------------------------------------------

    /// Mark the object dead (count = [`LOCKREF_DEAD`]). Caller holds the lock.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn mark_dead_locked(&self) {
        self.set_count_locked(LOCKREF_DEAD);
    }

    /// Set the count. Caller holds the lock.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn set_count_locked(&self, c: i32) {
        // Relaxed: the lock orders this for other lock users (their Acquire
        // pairs with our Release unlock) and for CAS-loop variants, which only
        // install values over an unlocked word; a loop because `cmpxchg2` may
        // change counts above 1 under the lock.
        let mut old = self.word.load(Ordering::Relaxed);
        debug_assert!(locked(old), "LockRef::set_count_locked without the lock");
        while let Err(cur) = self.word.compare_exchange_weak(
            old,
            with_count(old, c),
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            old = cur;
        }
    }

    /// Increment the count. Caller holds the lock.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn inc_locked(&self) {
        // Relaxed: ordered by the lock, as in `set_count_locked`.
        let _old = self.word.fetch_add(count_delta(1), Ordering::Relaxed);
        debug_assert!(locked(_old), "LockRef::inc_locked without the lock");
    }

    /// Decrement the count and return the new value. Caller holds the lock.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn dec_locked(&self) -> i32 {
        // Relaxed: ordered by the lock, as in `set_count_locked`.
        let old = self.word.fetch_add(count_delta(-1), Ordering::Relaxed);
        debug_assert!(locked(old), "LockRef::dec_locked without the lock");
        count_of(old).wrapping_sub(1)
    }

    // ----- the lock half --------------------------------------------------

    /// Take the lock half (test-and-test-and-set with backoff).
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn lock(&self) {
        let (_, contended, steps) = self.lock_word();
        lockstat::record(|r| {
            r.lock_acquired(LockClass::LockRef, contended, steps);
            r.add(Stat::SharedWrite, 1);
        });
    }

    /// Release the lock half. Releasing a lock that is not held is misuse
    /// (caught by a `debug_assert!`).
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn unlock(&self) {
        // Release: publish the critical section to the next lock holder and to
        // the next lockless update (which reads this unlocked word). An RMW,
        // not a store, because `cmpxchg2` may update the count meanwhile.
        let old = self.word.fetch_sub(LOCKED, Ordering::Release);
        debug_assert!(locked(old), "LockRef::unlock of an unlocked LockRef");
        crate::ordered::release(crate::ordered::Class::LockRef, self.addr());
        lockstat::inc(Stat::SharedWrite);
    }

    /// Take the lock half if it is free now.
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn try_lock(&self) -> bool {
        // Relaxed: seeds the CAS.
        let mut old = self.word.load(Ordering::Relaxed);
        while !locked(old) {
            // Acquire: as in `lock`. Retry while the word is unlocked: a
            // failure then only means a lockless count update won the race.
            match self.word.compare_exchange_weak(
                old,
                old | LOCKED,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    crate::ordered::acquired_try(crate::ordered::Class::LockRef, 0, self.addr());
                    lockstat::record(|r| {
                        r.lock_acquired(LockClass::LockRef, false, 0);
                        r.add(Stat::SharedWrite, 1);
                    });
                    return true;
                }
                Err(cur) => old = cur,
            }
        }
        false
    }

    /// Whether the lock half is held (racy).
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn is_locked(&self) -> bool {
        // Relaxed: an instantaneous observation, no data depends on it.
        locked(self.word.load(Ordering::Relaxed))
    }

    /// The count (racy unless the caller holds the lock and the variant is
    /// not `cmpxchg2`).
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn count(&self) -> i32 {
        // Relaxed: an instantaneous observation; callers that act on it
        // hold the lock, whose Acquire already ordered this load.
        count_of(self.word.load(Ordering::Relaxed))
    }

    /// Whether the object is dead (racy; negative count).
    #[inline]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    pub fn is_dead(&self) -> bool {
        self.count() < 0
    }

    // ----- internals ------------------------------------------------------

    /// The lockless attempt. `cmpxchg2_floor` is the count at or below which
    /// the `cmpxchg2` variant must use the lock (1 for gets, 2 for puts).
    #[inline(always)]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    fn fast(&self, v: LockRefVariant, cmpxchg2_floor: i32, step: impl Fn(i32) -> Step) -> Fast {
        match v {
            LockRefVariant::Spin => Fast::Slow,
            LockRefVariant::Cmpxchg2 => self.fast_cmpxchg2(cmpxchg2_floor, step),
            LockRefVariant::Lockref => self.fast_loop::<false>(step),
            LockRefVariant::LockrefWait => self.fast_loop::<true>(step),
        }
    }

    /// The mainline loop (`WAIT = false`) and the 2024 wait-for-unlock loop
    /// (`WAIT = true`).
    #[inline(always)]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    fn fast_loop<const WAIT: bool>(&self, step: impl Fn(i32) -> Step) -> Fast {
        let mut cas_fail: u64 = 0;
        let mut wait_spins: u64 = 0;
        // Relaxed: seeds the CAS, which validates it.
        let mut old = self.word.load(Ordering::Relaxed);
        let mut budget = LOCKREF_RETRIES;
        let out = loop {
            if !locked(old) {
                match step(count_of(old)) {
                    Step::Update(n) => {
                        // AcqRel/Relaxed: see MEMORY ORDERING; the failure
                        // value only seeds the next iteration.
                        match self.word.compare_exchange_weak(
                            old,
                            with_count(old, n),
                            CAS_SUCCESS,
                            Ordering::Relaxed,
                        ) {
                            Ok(_) => break Fast::Updated(n),
                            Err(cur) => {
                                old = cur;
                                cas_fail += 1;
                            }
                        }
                    }
                    Step::Refuse => break Fast::Refused,
                    Step::NeedLock => break Fast::Slow,
                }
            } else if WAIT {
                spin_loop();
                wait_spins += 1;
                // Relaxed: only looks for the unlock; the CAS validates.
                old = self.word.load(Ordering::Relaxed);
            } else {
                break Fast::Slow;
            }
            budget -= 1;
            if budget == 0 {
                break Fast::Slow;
            }
        };
        Self::record_fast(&out, cas_fail, wait_spins);
        out
    }

    /// The 2013 scheme: two attempts while the count is above the floor,
    /// regardless of the lock half.
    #[inline(always)]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    fn fast_cmpxchg2(&self, floor: i32, step: impl Fn(i32) -> Step) -> Fast {
        let mut cas_fail: u64 = 0;
        let mut out = Fast::Slow;
        for _ in 0..CMPXCHG2_ATTEMPTS {
            // Relaxed: seeds the CAS, which validates it.
            let old = self.word.load(Ordering::Relaxed);
            let c = count_of(old);
            if c <= floor {
                break;
            }
            let Step::Update(n) = step(c) else { break };
            // AcqRel/Relaxed: see MEMORY ORDERING.
            if self
                .word
                .compare_exchange(old, with_count(old, n), CAS_SUCCESS, Ordering::Relaxed)
                .is_ok()
            {
                out = Fast::Updated(n);
                break;
            }
            cas_fail += 1;
            spin_loop();
        }
        Self::record_fast(&out, cas_fail, 0);
        out
    }

    #[inline(always)]
    fn record_fast(out: &Fast, cas_fail: u64, wait_spins: u64) {
        lockstat::record(|r| {
            match out {
                Fast::Updated(_) => {
                    r.add(Stat::LockrefFast, 1);
                    r.add(Stat::SharedWrite, 1);
                }
                Fast::Refused => r.add(Stat::LockrefFast, 1),
                Fast::Slow => {}
            }
            if cas_fail != 0 {
                r.add(Stat::LockrefCasFail, cas_fail);
            }
            if wait_spins != 0 {
                r.add(Stat::LockrefWait, 1);
                r.add(Stat::LockrefWaitSpins, wait_spins);
            }
        });
    }

    /// This lock's identity for the lock-order checker.
    #[inline(always)]
    fn addr(&self) -> usize {
        self as *const Self as usize
    }

    /// Acquire the lock half; returns the word we installed (lock bit set)
    /// and whether / how long we had to wait.
    #[inline(always)]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    fn lock_word(&self) -> (u64, bool, u64) {
        // The lock-order checker (compiled out in release and loom builds).
        crate::ordered::acquire(crate::ordered::Class::LockRef, 0, self.addr());
        // Relaxed: seeds the CAS.
        let old = self.word.load(Ordering::Relaxed);
        // Acquire: the critical section sees what the last holder published.
        if !locked(old)
            && self
                .word
                .compare_exchange(old, old | LOCKED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            return (old | LOCKED, false, 0);
        }
        self.lock_word_contended()
    }

    #[cold]
    #[inline(never)]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    fn lock_word_contended(&self) -> (u64, bool, u64) {
        let backoff = Backoff::new();
        let mut steps: u64 = 0;
        // Relaxed: test before test-and-set; the CAS validates.
        let mut old = self.word.load(Ordering::Relaxed);
        loop {
            if locked(old) {
                backoff.snooze();
                steps += 1;
                // Relaxed: only watches for the unlock; the CAS validates.
                old = self.word.load(Ordering::Relaxed);
                continue;
            }
            // Acquire: as in `lock_word`.
            match self.word.compare_exchange_weak(
                old,
                old | LOCKED,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return (old | LOCKED, steps != 0, steps),
                Err(cur) => old = cur,
            }
        }
    }

    /// Add `delta` to the count and release the lock in one RMW. The lock
    /// half is exactly 1, so subtracting 1 clears it without a borrow.
    #[inline(always)]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    fn unlock_add(&self, delta: i32) {
        // Release: this is the unlock.
        let _old = self
            .word
            .fetch_add(count_delta(delta).wrapping_sub(LOCKED), Ordering::Release);
        debug_assert!(locked(_old));
        crate::ordered::release(crate::ordered::Class::LockRef, self.addr());
    }

    /// The locked path shared by the gets: lock, let `f` decide from the
    /// count (`(delta, result)`), apply the delta while unlocking.
    #[cold]
    #[inline(never)]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    fn locked_op(&self, f: impl FnOnce(i32) -> (i32, bool)) -> bool {
        let (w, contended, steps) = self.lock_word();
        // Under `cmpxchg2` the count may move while we hold the lock, but
        // only above the floors, so decisions about 0 and 1 stay valid.
        let (delta, result) = f(count_of(w));
        self.unlock_add(delta);
        lockstat::record(|r| {
            r.lock_acquired(LockClass::LockRef, contended, steps);
            r.add(Stat::LockrefLocked, 1);
            r.add(Stat::SharedWrite, 2);
        });
        result
    }

    #[cold]
    #[inline(never)]
    #[cfg_attr(all(feature = "trace-lines", not(loom)), track_caller)]
    fn put_or_lock_slow(&self) -> bool {
        let (w, contended, steps) = self.lock_word();
        let last = count_of(w) <= 1;
        if !last {
            self.unlock_add(-1);
        }
        lockstat::record(|r| {
            r.lock_acquired(LockClass::LockRef, contended, steps);
            r.add(Stat::LockrefLocked, 1);
            r.add(Stat::SharedWrite, if last { 1 } else { 2 });
        });
        !last
    }
}

impl fmt::Debug for LockRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Relaxed: a diagnostic snapshot.
        let w = self.word.load(Ordering::Relaxed);
        f.debug_struct("LockRef")
            .field("count", &count_of(w))
            .field("locked", &locked(w))
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn word_arithmetic() {
        for c in [0, 1, 2, -1, LOCKREF_DEAD, i32::MAX, i32::MIN] {
            let w = pack(c);
            assert_eq!(count_of(w), c);
            assert!(!locked(w));
            let l = w | LOCKED;
            assert_eq!(count_of(l), c);
            for d in [1, -1, 5] {
                let u = l.wrapping_add(count_delta(d).wrapping_sub(LOCKED));
                assert!(!locked(u));
                assert_eq!(count_of(u), c.wrapping_add(d));
                let k = l.wrapping_add(count_delta(d));
                assert!(locked(k));
                assert_eq!(count_of(k), c.wrapping_add(d));
            }
        }
    }

    #[test]
    fn variant_names_round_trip() {
        for v in LockRefVariant::ALL {
            assert_eq!(v.name().parse::<LockRefVariant>(), Ok(v));
            assert_eq!(v.to_string(), v.name());
        }
        assert!("nope".parse::<LockRefVariant>().is_err());
        assert_eq!(LockRefVariant::default(), LockRefVariant::LockrefWait);
    }
}
