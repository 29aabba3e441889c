//! BSD file locks: `flock(2)` (`Task::flock`, in `io.rs`).
//!
//! A lock belongs to an open file description (`File`): fds made by dup,
//! dup2, F_DUPFD or fork share it, and it goes at `LOCK_UN`, when the last
//! fd slot holding the description closes (Linux's close releases it before
//! returning, not a grace period later when the `File` is freed), or, as a
//! safety net, when the `File` is dropped. Locks are per inode: every name
//! of a hard-linked file shares them. An exclusive lock excludes every
//! other description's lock, a shared one the others' exclusive locks; a
//! description never conflicts with itself. The semantics and the order of
//! the errors are Linux's (`fs/locks.c`, `flock_lock_inode`):
//! - `LOCK_MAND` set: success, nothing done (deprecated and ignored);
//! - a command other than exactly one of SH, EX, UN (`LOCK_NB` aside):
//!   EINVAL, before the fd is looked at (EBADF);
//! - an O_PATH fd: EBADF (the fd lookup, `fdget`, refuses it);
//! - a second lock of the same type on a description: nothing; of the other
//!   type (a conversion): the old lock is removed first and its waiters
//!   woken, then the new one is tried, so a conversion that fails with
//!   `LOCK_NB` leaves the description with no lock;
//! - a conflict: EWOULDBLOCK (EAGAIN) with `LOCK_NB`, else a sleep until
//!   the lock can be granted (no queue: any waiter that finds it free takes
//!   it, as in Linux, so shared locks can keep an exclusive waiter out).
//!
//! Cost for files that never lock: one word in the `File`
//! (`File::flock`), read by the close of its last fd; no table access.
//!
//! DATA. The state is a global table of [`SHARDS`] shards keyed by the
//! inode's address (its `Arc<Inode>` pointer: each holder's and waiter's
//! `File` keeps the inode alive, so the address is not reused while an
//! entry names it). An entry counts the shared holders, whether one holds
//! it exclusively, and the waiters; it is removed as soon as all three are
//! zero, so the table holds only inodes locked or waited for now. What a
//! description holds is in its own `File::flock` word: [`USED`] (sticky:
//! it has asked for a lock once, so its last close must look at the table)
//! and [`SH`] or [`EX`] (the lock it holds), the latter changed only under
//! the shard lock of its inode.
//!
//! LOCKING RULES
//! - `flock::Shard` (mutex, `Class::FlockShard`, the last level): the
//!   entries of the shard and every `File::flock` holder bit of their
//!   descriptions. A leaf: nothing is taken under it, no `File` or `Arc`
//!   is dropped under it, no epoch is pinned under it (a pin may run a
//!   deferred `File` drop, which takes it). It may be taken under any other
//!   lock: the last close runs under `FdTable::lock` (dup2 over an open
//!   fd) and a `File`'s drop wherever an epoch collection runs.
//! - Waiting: never with the shard lock held. A waiter counts itself in
//!   its entry (which keeps the entry), reads the shard's [`EventCount`]
//!   under the lock, releases the lock and sleeps unless the count moved;
//!   a release that finds waiters in its entry bumps the count after its
//!   change (after releasing the lock). The count is read under the lock
//!   before any later release can run, so no wake-up is lost (the
//!   `EventCount`'s own loom model covers its announce/notify pair). A wake
//!   wakes every waiter of the shard; each re-checks under the lock.
//! - Last close against a lock being granted (the one lock-free step): the
//!   close decrements `File::slots` and then reads [`USED`]; `flock` sets
//!   `USED` before taking the shard lock and, once it has granted, reads
//!   the slot count under the lock. All four are SeqCst (Dekker's pattern),
//!   so at least one side sees the other: if the close misses `USED`, the
//!   grant sees no slot left and undoes itself (as Linux's `fput` at the
//!   end of a `flock` racing with the last close releases it); if the
//!   close sees it, it releases under the shard lock whatever the
//!   description holds then, and a grant that takes the lock after that
//!   sees the decrement (it came before the close's lock) and undoes
//!   itself. Both may act: each removes only what is held, under the lock
//!   (loom model `loom_models::flock_grant_vs_last_close`).
//!
//! A dup racing with the close of the very fd it duplicates may find the
//! description's slot count at zero for a moment (Linux's dup would have
//! held a reference across it): the lock goes with that close and the new
//! fd has none. That race has no defined order in POSIX either.

use std::collections::HashMap;
use std::sync::LazyLock;

use crossbeam_utils::CachePadded;
use scalevfs_sync::ordered::{Class, Mutex, MutexGuard};
use scalevfs_sync::primitive::{AtomicU32, AtomicUsize, Ordering};
use scalevfs_sync::EventCount;

use crate::errno::{Errno, VfsResult};

/// What the table needs of an open file description (`File::flock_desc`):
/// its lock word (`File::flock`), its fd-slot count (`File::slots`, with
/// `held_bit` the access flag sharing it) and its inode's address (the
/// key). A view, so that this module sits below `file.rs` (layer 0):
/// `file.rs` calls it at the last close and the drop, `io.rs` (`Task::
/// flock`) to lock.
pub(crate) struct Desc<'a> {
    pub(crate) word: &'a AtomicU32,
    pub(crate) slots: &'a AtomicUsize,
    pub(crate) held_bit: usize,
    pub(crate) key: usize,
}

/// `File::flock`: the description has asked for a lock at least once
/// (sticky; its last close then looks at the table).
pub(crate) const USED: u32 = 1;
/// `File::flock`: holds a shared lock.
pub(crate) const SH: u32 = 2;
/// `File::flock`: holds the exclusive lock.
pub(crate) const EX: u32 = 4;
const HOLDS: u32 = SH | EX;

/// Shards of the table (a power of two).
const SHARDS: usize = 64;

/// The lock state of one inode.
#[derive(Debug, Default)]
struct Entry {
    /// Descriptions holding it shared.
    shared: u32,
    /// One description holds it exclusively.
    exclusive: bool,
    /// Callers sleeping for it (they keep the entry).
    waiters: u32,
}

impl Entry {
    fn admits(&self, exclusive: bool) -> bool {
        !self.exclusive && (!exclusive || self.shared == 0)
    }
    fn idle(&self) -> bool {
        self.shared == 0 && !self.exclusive && self.waiters == 0
    }
}

struct Shard {
    map: Mutex<HashMap<usize, Entry>>,
    /// Bumped by a release that found waiters (see LOCKING RULES).
    wake: EventCount,
}

static TABLE: LazyLock<Box<[CachePadded<Shard>]>> = LazyLock::new(|| {
    (0..SHARDS)
        .map(|_| {
            CachePadded::new(Shard {
                map: Mutex::new(Class::FlockShard, HashMap::new()),
                wake: EventCount::new(),
            })
        })
        .collect()
});

/// The table key of `f`'s inode and its shard.
fn shard_of(f: &Desc<'_>) -> (usize, &'static Shard) {
    let key = f.key;
    // Fibonacci hashing: inodes are allocated with a common alignment, so
    // the low bits alone would use few shards.
    let i = (key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARDS.trailing_zeros());
    (key, &TABLE[i as usize])
}

/// Mark `flock` (`File::flock`) as having asked for a lock: the locking
/// side's store of the Dekker pair with the last close (module doc).
pub(crate) fn mark_used(flock: &AtomicU32) {
    // SeqCst: before the grant's read of the slot count (`orphaned`), in
    // the total order with the close's decrement and its read of `USED`.
    flock.fetch_or(USED, Ordering::SeqCst);
}

/// After the last slot's decrement: whether the close must release a lock
/// (the description has asked for one).
pub(crate) fn used(flock: &AtomicU32) -> bool {
    // SeqCst: the close's load of the Dekker pair (module doc).
    flock.load(Ordering::SeqCst) & USED != 0
}

/// Under the shard lock after a grant: whether the description's last fd
/// slot has closed (`slots`: `File::slots`, `held_bit` its access flag), so
/// the grant must be undone.
pub(crate) fn orphaned(slots: &AtomicUsize, held_bit: usize) -> bool {
    // SeqCst: the grant's load of the Dekker pair (module doc).
    slots.load(Ordering::SeqCst) & !held_bit == 0
}

/// Give up what `f` holds (`held`, its holder bits) in its locked shard
/// `m`; true if the entry has waiters to wake (after the lock is released).
fn drop_hold(
    m: &mut MutexGuard<'_, HashMap<usize, Entry>>,
    key: usize,
    f: &Desc<'_>,
    held: u32,
) -> bool {
    let e = m.get_mut(&key).expect("a holder keeps its inode's entry");
    if held == EX {
        e.exclusive = false;
    } else {
        e.shared -= 1;
    }
    // Relaxed: holder bits change only under the shard lock, which orders
    // them for every reader (all read them under it).
    f.word.fetch_and(!HOLDS, Ordering::Relaxed);
    let wake = e.waiters > 0;
    if e.idle() {
        m.remove(&key);
        shrink(m);
    }
    wake
}

/// A shard that emptied after a burst gives its memory back.
fn shrink(m: &mut HashMap<usize, Entry>) {
    if m.is_empty() && m.capacity() > 64 {
        m.shrink_to(0);
    }
}

/// Take a lock on `f` (`exclusive` or shared), waiting if `wait`.
pub(crate) fn lock(f: &Desc<'_>, exclusive: bool, wait: bool) -> VfsResult<()> {
    let want = if exclusive { EX } else { SH };
    mark_used(f.word);
    let (key, shard) = shard_of(f);
    let mut m = shard.map.lock();
    loop {
        // What the description holds, read again on every pass: another
        // thread on the same description may have been granted a lock, or
        // changed it, while this one slept (as Linux's flock_lock_inode
        // looks for the file's own lock on every retry). Read once, two
        // threads of one description waiting for a shared lock both
        // counted themselves on the entry with one holder bit between
        // them: a count no unlock could take back, and every exclusive
        // lock of the inode refused from then on.
        // Relaxed: holder bits are read and written under the shard lock.
        let held = f.word.load(Ordering::Relaxed) & HOLDS;
        if held == want {
            return Ok(());
        }
        if held != 0 {
            // A conversion: the old lock goes first and its waiters are
            // woken (Linux's flock_lock_inode), then the new one is tried.
            if drop_hold(&mut m, key, f, held) {
                drop(m);
                shard.wake.notify();
                m = shard.map.lock();
            }
            continue;
        }
        let e = m.entry(key).or_default();
        if e.admits(exclusive) {
            if exclusive {
                e.exclusive = true;
            } else {
                e.shared += 1;
            }
            // Relaxed: under the shard lock (see `drop_hold`).
            f.word.fetch_or(want, Ordering::Relaxed);
            if orphaned(f.slots, f.held_bit) {
                // The last fd closed meanwhile and may have looked before
                // this grant: the lock goes now, as with Linux's fput at
                // the end of this call.
                let wake = drop_hold(&mut m, key, f, want);
                drop(m);
                if wake {
                    shard.wake.notify();
                }
            }
            return Ok(());
        }
        if !wait {
            // The conflicting holder keeps the entry; nothing to remove.
            return Err(Errno::EAGAIN);
        }
        e.waiters += 1;
        let seen = shard.wake.prepare();
        drop(m);
        shard.wake.wait(seen);
        m = shard.map.lock();
        let e = m.get_mut(&key).expect("a waiter keeps its inode's entry");
        e.waiters -= 1;
        // The pass below may return with nothing more to do for this
        // inode (another thread of the description holds what was
        // wanted): an entry that only this waiter kept goes now.
        if e.idle() {
            m.remove(&key);
            shrink(&mut m);
        }
    }
}

/// Release whatever lock `f` holds (`LOCK_UN`, the last close, the drop).
pub(crate) fn unlock(f: &Desc<'_>) {
    // Relaxed: a description that never asked for a lock holds none; one
    // asking concurrently (another thread on the same description) is
    // ordered after this unlock.
    if f.word.load(Ordering::Relaxed) & USED == 0 {
        return;
    }
    let (key, shard) = shard_of(f);
    let mut m = shard.map.lock();
    // Relaxed: under the shard lock.
    let held = f.word.load(Ordering::Relaxed) & HOLDS;
    if held == 0 {
        return;
    }
    let wake = drop_hold(&mut m, key, f, held);
    drop(m);
    if wake {
        shard.wake.notify();
    }
}

/// Entries in the table (locked or waited-for inodes), for tests.
#[doc(hidden)]
pub fn table_entries() -> usize {
    TABLE.iter().map(|s| s.map.lock().len()).sum()
}
