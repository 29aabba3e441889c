//! The dentry cache: (parent, name) -> inode or negative, with lock-free
//! lookups.
//!
//! LOCKING RULES
//! - `Dcache::rename` (spinlock + the global rename `SeqCount`): held by
//!   every in-place move of a *directory* (`d_move`, `d_exchange` when one
//!   side is a directory), whose write section the sequence spans. Only
//!   `getcwd` (`Task::getcwd`, which climbs directories) validates with it;
//!   the path walk does not read it (see walk.rs: each step is validated on
//!   its own, by the found dentry's d_seq or, for a miss, the bucket's
//!   sequence). Moves of files take neither.
//! - `Dentry::children` (per-dir variant only): the per-directory ordered
//!   index, a reader-writer lock; lookups take it shared, inserts/removals
//!   exclusive.
//! - `Bucket::lock`: protects the bucket's chain (`Dentry::next` links of
//!   dentries in that chain) and, for a dentry in the chain, its `D_HASHED`
//!   flag, `hash`, `parent` and name. Readers never take it.
//! - `Dentry::lockref`'s lock half: protects the transition of the count to
//!   and from 0 and to dead. Taken last.
//! - `Dentry::seq` (d_seq): written (odd) while the dentry's name/parent/hash
//!   change, under the bucket locks.
//! - `Bucket::seq`: written (odd) under the bucket lock around every change
//!   that moves a dentry out of or into the chain (`d_move`, `d_exchange`)
//!   or replaces a name's dentry (`add` over a negative one); a lock-free
//!   miss re-checks it (see `lookup_rcu`).
//!
//! Nesting order: rename -> children (parent dirs, by address) ->
//! bucket locks (by index) -> lockref lock. Nothing here is held across a
//! filesystem call, and no epoch guard is *created* while one is held
//! (pinning may run deferred frees, which take bucket and lockref locks).
//!
//! LIFETIMES
//! - A dentry is a raw heap allocation. A counted reference (`DentryRef`) is
//!   one unit of its LockRef count. Every hashed or unhashed live dentry holds
//!   one counted reference on its parent (the root is its own parent).
//! - At count 0 a hashed dentry stays cached ("unused") and a lookup can
//!   revive it with `get_not_dead`. An unhashed dentry is killed when its
//!   count reaches 0: marked dead under its lock, then its memory is freed
//!   after an epoch grace period, so lock-free readers that still hold its
//!   address under a guard stay safe.
//! - `unhash` requires the caller to hold a counted reference, so the last
//!   `dput` is the one that sees the dentry unhashed and kills it.
//! - Reclaim (CLOCK): a sweep over the hash buckets evicts unused (count 0)
//!   dentries that are not pinned (dentries of a filesystem whose dcache is
//!   authoritative are pinned) and whose referenced bit is clear, clearing the
//!   bit of the ones it skips. Eviction locks the bucket then the lockref,
//!   checks count 0, marks dead, unhashes, then drops the parent reference.
//!
//! PARENT REFERENCES (issue 16; `spares.rs`)
//! - A child's reference on its parent is a real count, but a thread takes
//!   them in batches (`spares::BATCH`) and keeps the unused ones in its
//!   shard of the spare table; a dead child gives its reference back there.
//!   So creating and unlinking names in one directory does not write the
//!   directory's LockRef line, except once per batch. The rules above that
//!   read the count are unchanged: spares are counts, a directory with
//!   spares out is in use, not evictable.
//! - Spares are kept only for a hashed dentry or a mount's root (never
//!   hashed; `D_LIVE_ROOT` until its `Mount` is dropped, `retire_root`),
//!   and an unhashed (retired) one must get them back, or it would never
//!   reach its last `dput`. The protocol: the
//!   keeper runs `may_keep_spares` under its shard's lock (hashed? then
//!   set `D_SPARES`, by an RMW of the flag word when not yet set); the
//!   unhasher, holding a counted reference, clears `D_HASHED` (an RMW of
//!   the same word), then if `D_SPARES` is set takes every shard's entry
//!   out, each under that shard's lock (`recall_spares`), and drops them
//!   (the count stays positive: its own reference). A keeper whose check ran
//!   before the unhasher locked its shard left an entry that the recall
//!   takes; one that locked the shard after saw `D_HASHED` clear (the
//!   shard lock orders them; and when the keeper sets `D_SPARES` itself,
//!   the two RMWs of one word are ordered, so one sees the other).
//! - Nothing is dropped under a shard lock; an entry evicted from a full
//!   shard is dropped after it is released (`put_back`). Its dentry is
//!   hashed, or its unhasher still holds a reference, so that `dput` only
//!   makes it unused and never cascades.
//! - The table is the cache's own (`DentryCounts::spares`, reached from a
//!   dentry through its superblock). `shrink_all` (teardown) drains it
//!   first, and `shrink` does when a sweep comes up short of its target
//!   (directories kept in use only by spares are then evictable).

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::ptr;
use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Guard};
use crossbeam_utils::CachePadded;
use scalevfs_sync::lockstat::{self, Stat};
use scalevfs_sync::ordered::{Class, RwLock, RwLockWriteGuard, SpinGuard, SpinLock};
use scalevfs_sync::primitive::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use scalevfs_sync::{LockRef, LockRefVariant, SeqCount};

use crate::inode::Inode;
use crate::sb::{DentryCounts, Super};
use crate::spares;
use crate::types::FileType;

/// Where a dentry's LockRef lives (seed 001).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DentryLayout {
    /// On its own cache line, away from the read-mostly fields (default).
    #[default]
    Separated,
    /// Sharing the cache line with the name, as Linux had it before 2024.
    Packed,
}

/// How a directory's children are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DcacheIndex {
    /// One global hash table keyed by (parent, name); lock-free readers (default).
    #[default]
    GlobalHash,
    /// A per-directory ordered index under a reader-writer lock (NetBSD 2020).
    PerDir,
}

/// Dcache configuration.
#[derive(Clone, Debug)]
pub struct DcacheConfig {
    pub layout: DentryLayout,
    pub index: DcacheIndex,
    pub lockref: LockRefVariant,
    /// log2 of the number of hash buckets.
    pub hash_bits: u32,
    /// Reclaim unused dentries when more than this many are cached.
    pub max_entries: usize,
    /// Reclaim when the dentries themselves would take more than this many
    /// bytes (`size_of::<Dentry>()` each; long names and inodes not
    /// counted). The effective entry limit is the smaller of the two.
    pub max_bytes: usize,
    /// At most this percentage of the entry limit may be negative dentries.
    pub negative_percent: u32,
    /// A new dentry takes its reference on its parent from per-thread
    /// spares (`spares.rs`, PARENT REFERENCES) instead of the parent's
    /// LockRef (`false`: the parent's count is written by every create and
    /// every last put of a child, as before issue 16).
    pub parent_spares: bool,
}

impl Default for DcacheConfig {
    fn default() -> Self {
        DcacheConfig {
            layout: DentryLayout::default(),
            index: DcacheIndex::default(),
            lockref: LockRefVariant::default(),
            // Smaller under Miri, which interprets every bucket's
            // initialisation.
            hash_bits: if cfg!(miri) { 8 } else { 16 },
            max_entries: 1 << 20,
            max_bytes: usize::MAX,
            negative_percent: 25,
            parent_spares: true,
        }
    }
}

// Dentry flags.
/// In the lookup index (hash chain, and the parent's map in per-dir mode).
pub const D_HASHED: u32 = 1 << 0;
/// Something is mounted on this dentry.
pub const D_MOUNTED: u32 = 1 << 1;
/// CLOCK referenced bit.
pub const D_REFERENCED: u32 = 1 << 2;
/// Never evicted while hashed (its filesystem's dcache is authoritative).
pub const D_PINNED: u32 = 1 << 3;
/// Uses the packed LockRef slot.
pub const D_PACKED: u32 = 1 << 4;
/// Dead: freed after a grace period.
pub const D_DEAD: u32 = 1 << 5;
/// The inode is a directory. Set at allocation: a dentry's inode and an
/// inode's type never change, so the walk can decide "directory?" and
/// "symlink?" from the flags word it loads anyway, without the inode.
pub const D_DIR: u32 = 1 << 6;
/// The inode is a symlink (set at allocation, as `D_DIR`).
pub const D_SYMLINK: u32 = 1 << 7;
/// Negative: no inode (set at allocation, as `D_DIR`).
pub const D_NEGATIVE: u32 = 1 << 10;
/// Threads may keep spare references on this dentry for its children
/// (`spares.rs`, PARENT REFERENCES): set by the first thread that keeps
/// some, before it keeps them; never cleared.
pub const D_SPARES: u32 = 1 << 11;
/// A mount's root directory, never hashed, until its mount retires it
/// (`retire_root`): threads may keep spares on it (PARENT REFERENCES) and
/// name operations may use it as an uncounted parent (`is_attached`).
pub const D_LIVE_ROOT: u32 = 1 << 12;
const D_VARIANT_SHIFT: u32 = 8;

/// Names up to this length are stored inline in the dentry.
pub const INLINE_NAME: usize = 32;
pub(crate) const INLINE_WORDS: usize = INLINE_NAME / 8;

/// A name with its hash, prepared once per path component.
#[derive(Clone, Copy, Debug)]
pub struct QName<'a> {
    pub bytes: &'a [u8],
    pub hash: u64,
    words: [u64; INLINE_WORDS],
}

impl<'a> QName<'a> {
    /// Assemble from the parts `Dcache::scan_component` computed.
    #[inline(always)]
    pub(crate) fn from_parts(bytes: &'a [u8], hash: u64, words: [u64; INLINE_WORDS]) -> Self {
        QName { bytes, hash, words }
    }
}

const HASH_K: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline(always)]
fn folded_mul(a: u64, b: u64) -> u64 {
    let r = (a as u128).wrapping_mul(b as u128);
    (r as u64) ^ ((r >> 64) as u64)
}

/// Hash of (parent, name), keyed by the per-`Vfs` seed, computed a word at a
/// time (Linux's dcache hashes names word-at-a-time too). Each 8-byte word is
/// folded in with a 64x64->128 multiply by a seeded constant, so without the
/// seed an attacker cannot choose names that share a bucket. The parent is
/// folded in last, with the length, so that in the walk only one multiply
/// depends on the previous component's lookup (the name's words are hashed
/// in parallel).
/// `h0` is `folded_mul(seed[0], HASH_K)` (`Dcache::h0`). Also returns the
/// first `INLINE_WORDS` words, zero-padded, for the name compare.
#[inline(always)]
fn hash_name(seed: [u64; 2], h0: u64, parent: usize, name: &[u8]) -> (u64, [u64; INLINE_WORDS]) {
    let mut words = [0u64; INLINE_WORDS];
    let mut h = h0;
    let mut chunks = name.chunks_exact(8);
    let mut i = 0;
    for c in &mut chunks {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        if i < INLINE_WORDS {
            words[i] = w;
        }
        h = folded_mul(h ^ w, seed[1]);
        i += 1;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        // Byte loop, not a variable-length copy: that would call memcpy.
        let mut w = 0u64;
        for (j, &byte) in rest.iter().enumerate() {
            w |= (byte as u64) << (8 * j);
        }
        if i < INLINE_WORDS {
            words[i] = w;
        }
        h = folded_mul(h ^ w, seed[1]);
    }
    (finish_hash(h, name.len(), parent), words)
}

/// The bytes `b[p..p + 8]` as a little-endian word, zero-padded past the end
/// of `b` (`p < b.len()`). Near the end, one overlapping load shifted down
/// rather than a byte loop (unless `b` is shorter than a word).
#[inline(always)]
fn load_word(b: &[u8], p: usize) -> u64 {
    let rest = &b[p..];
    if let Some(c) = rest.first_chunk::<8>() {
        return u64::from_le_bytes(*c);
    }
    if let Some(c) = b.last_chunk::<8>() {
        // 1..=7 bytes before `p` are in the word; shift them out.
        return u64::from_le_bytes(*c) >> (8 * (8 - rest.len()));
    }
    load_short(rest)
}

/// `load_word` of a buffer shorter than a word: byte by byte.
#[inline(never)]
fn load_short(rest: &[u8]) -> u64 {
    let mut w = 0u64;
    for (j, &c) in rest.iter().enumerate().take(8) {
        w |= (c as u64) << (8 * j);
    }
    w
}

/// The number of bytes of `w` (little-endian) before its first '/', 8 if none.
#[inline(always)]
fn word_name_len(w: u64) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    const SLASHES: u64 = 0x2f2f_2f2f_2f2f_2f2f;
    let x = w ^ SLASHES;
    // The lowest set bit marks the first '/' exactly (borrows only create
    // false positives above a true zero byte).
    let m = x.wrapping_sub(ONES) & !x & HIGHS;
    (m.trailing_zeros() / 8) as usize
}

/// The last fold of `hash_name`: the parent and the length together (user
/// addresses are below 2^48 and a component is shorter than 2^16 bytes, so
/// `parent ^ len << 48` keeps both).
#[inline(always)]
fn finish_hash(h: u64, len: usize, parent: usize) -> u64 {
    folded_mul(h ^ parent as u64 ^ (len as u64) << 48, HASH_K)
}

/// The read-mostly part: everything a lock-free lookup reads. Aligned to a
/// cache line so it starts one.
#[repr(C, align(64))]
struct Hot {
    seq: SeqCount,
    flags: AtomicU32,
    hash: AtomicU64,
    parent: AtomicPtr<Dentry>,
    next: AtomicPtr<Dentry>,
    inode: Option<Arc<Inode>>,
    name_len: AtomicU32,
    name_long: AtomicPtr<Box<[u8]>>,
    name: [AtomicU64; INLINE_WORDS],
    /// The LockRef slot of the `packed` layout, right after the name.
    lockref_packed: LockRef,
}

/// A directory entry in the cache.
#[repr(C)]
pub struct Dentry {
    hot: Hot,
    cold: Cold,
}

/// The written part: the LockRef of the `separated` layout on its own cache
/// line, with fields that only reference holders touch.
#[repr(C, align(64))]
struct Cold {
    lockref_sep: LockRef,
    sb: Arc<Super>,
    /// Per-dir variant: this directory's children by name.
    children: RwLock<BTreeMap<Box<[u8]>, DPtr>>,
}

// The layout the seed asks for: the separated LockRef does not share a cache
// line with the read-mostly fields, the packed one shares the name's. The
// whole dentry is 192 bytes, as Linux's.
const _: () = {
    assert!(core::mem::offset_of!(Dentry, hot) == 0);
    assert!(core::mem::offset_of!(Dentry, cold) >= core::mem::size_of::<Hot>());
    assert!(core::mem::offset_of!(Dentry, cold) % 64 == 0);
    assert!(core::mem::offset_of!(Cold, lockref_sep) == 0);
    assert!(core::mem::offset_of!(Hot, lockref_packed) < 128);
    assert!(
        core::mem::offset_of!(Hot, lockref_packed) / 64
            == core::mem::offset_of!(Hot, name) / 64 + 1
            || core::mem::offset_of!(Hot, lockref_packed) / 64
                == core::mem::offset_of!(Hot, name) / 64
    );
    assert!(core::mem::size_of::<LockRef>() == 8);
    assert!(core::mem::size_of::<Dentry>() <= 192);
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct DPtr(pub(crate) *const Dentry);
// SAFETY: a DPtr is only dereferenced under an epoch guard or while a counted
// reference is held; Dentry itself is Sync (all shared fields are atomics or
// locks).
unsafe impl Send for DPtr {}
// SAFETY: as above.
unsafe impl Sync for DPtr {}

/// A pointer to an object that something else keeps alive for `'g` (an
/// epoch guard, or a count or `Arc` held elsewhere), used in place of a
/// `&'g T` wherever the pointer may later be turned back into an owning
/// handle (`DentryRef::try_get`, `Arc::increment_strong_count`).
///
/// A `&T` made from a raw pointer only licenses reads of `T`'s non-`Cell`
/// parts: a pointer cast back from it cannot be used to free the object
/// (or, for an `Arc`'s contents, to touch the counts next to it) without
/// undefined behaviour (Miri, Tree Borrows). A `Pinned` keeps the raw
/// pointer, with the provenance of the allocation (`Box::into_raw`,
/// `Arc::as_ptr`), and hands out short-lived references on deref. It is the
/// size of a reference and costs nothing more to use.
pub(crate) struct Pinned<'g, T> {
    ptr: ptr::NonNull<T>,
    _life: std::marker::PhantomData<&'g T>,
}

impl<T> Clone for Pinned<'_, T> {
    #[inline(always)]
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Pinned<'_, T> {}

impl<'g, T> Pinned<'g, T> {
    /// # Safety
    /// `p` is non-null, points to a live `T` that stays alive (not freed,
    /// not mutably borrowed) for `'g`, and carries the provenance of the
    /// whole allocation (it was never cast from a reference).
    #[inline(always)]
    pub(crate) unsafe fn new(p: *const T) -> Self {
        debug_assert!(!p.is_null());
        Pinned {
            // SAFETY: non-null by the caller's contract.
            ptr: unsafe { ptr::NonNull::new_unchecked(p as *mut T) },
            _life: std::marker::PhantomData,
        }
    }
    /// The referent for all of `'g`.
    #[inline(always)]
    pub(crate) fn get(self) -> &'g T {
        // SAFETY: alive for 'g by `new`'s contract.
        unsafe { self.ptr.as_ref() }
    }
    /// The raw pointer, with its provenance.
    #[inline(always)]
    pub(crate) fn as_ptr(self) -> *const T {
        self.ptr.as_ptr()
    }
}

impl<T> std::ops::Deref for Pinned<'_, T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: alive for 'g by `new`'s contract, which outlives `&self`.
        unsafe { self.ptr.as_ref() }
    }
}

impl std::fmt::Debug for Dentry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dentry")
            .field("name", &String::from_utf8_lossy(&self.name_vec()))
            .field("count", &self.lockref().count())
            .field("flags", &self.flags())
            .finish()
    }
}

impl Dentry {
    #[inline]
    pub fn flags(&self) -> u32 {
        // Acquire: a reader that sees D_HASHED/D_MOUNTED then reads what the
        // setter published before setting it.
        self.hot.flags.load(Ordering::Acquire)
    }
    fn set_flag(&self, f: u32) {
        // AcqRel: read-modify-write of a published flag word.
        self.hot.flags.fetch_or(f, Ordering::AcqRel);
    }
    fn clear_flag(&self, f: u32) {
        // AcqRel: as set_flag.
        self.hot.flags.fetch_and(!f, Ordering::AcqRel);
    }
    /// Whether a thread may keep spare references on this dentry; run
    /// under the spare table's shard lock (PARENT REFERENCES).
    fn may_keep_spares(&self) -> bool {
        // Hashed, or a mount's root not yet retired: either clear means
        // the dentry is on its way out and recalls its spares.
        const LIVE: u32 = D_HASHED | D_LIVE_ROOT;
        let f = self.flags();
        if f & LIVE == 0 {
            return false;
        }
        if f & D_SPARES != 0 {
            return true;
        }
        // AcqRel: the flag and the unhasher's clear of D_HASHED (or the
        // retirer's of D_LIVE_ROOT) are RMWs of one word, so one of them
        // sees the other (PARENT REFERENCES).
        self.hot.flags.fetch_or(D_SPARES, Ordering::AcqRel) & LIVE != 0
    }
    #[inline]
    pub fn is_hashed(&self) -> bool {
        self.flags() & D_HASHED != 0
    }
    /// Hashed, or the root of a mount not yet dropped (`D_LIVE_ROOT`):
    /// what a name operation's uncounted parent must be (`Task::lock_name`).
    /// A mount's root stays so while anyone holds its mount, as the
    /// uncounted walk does.
    #[inline]
    pub fn is_attached(&self) -> bool {
        self.flags() & (D_HASHED | D_LIVE_ROOT) != 0
    }
    #[inline]
    pub fn is_mounted(&self) -> bool {
        self.flags() & D_MOUNTED != 0
    }
    #[inline]
    fn variant(&self) -> LockRefVariant {
        LockRefVariant::ALL[((self.flags() >> D_VARIANT_SHIFT) & 3) as usize]
    }
    #[inline]
    pub fn lockref(&self) -> &LockRef {
        if self.flags() & D_PACKED != 0 {
            &self.hot.lockref_packed
        } else {
            &self.cold.lockref_sep
        }
    }
    /// The inode, `None` for a negative dentry. Fixed for the dentry's life.
    #[inline]
    pub fn inode(&self) -> Option<&Arc<Inode>> {
        self.hot.inode.as_ref()
    }
    #[inline]
    pub fn is_negative(&self) -> bool {
        self.hot.inode.is_none()
    }
    #[inline]
    pub fn seq(&self) -> &SeqCount {
        &self.hot.seq
    }
    /// The superblock (filesystem instance) of this dentry.
    pub fn sb(&self) -> &Arc<Super> {
        &self.cold.sb
    }
    /// Racy read of the parent pointer; validate with `seq` or hold the
    /// rename lock.
    #[inline]
    pub(crate) fn parent_ptr(&self) -> *const Dentry {
        // Acquire: the parent dentry's contents were published before the pointer.
        self.hot.parent.load(Ordering::Acquire)
    }
    pub fn is_root(&self) -> bool {
        ptr::eq(self.parent_ptr(), self)
    }

    fn name_eq(&self, q: &QName<'_>) -> bool {
        // Relaxed loads: the caller validates with the dentry's seqcount.
        if self.hot.name_len.load(Ordering::Relaxed) as usize != q.bytes.len() {
            return false;
        }
        let n = q.bytes.len().div_ceil(8).min(INLINE_WORDS);
        for i in 0..n {
            if self.hot.name[i].load(Ordering::Relaxed) != q.words[i] {
                return false;
            }
        }
        if q.bytes.len() <= INLINE_NAME {
            return true;
        }
        // Acquire: the long name's bytes were written before the pointer was published.
        let p = self.hot.name_long.load(Ordering::Acquire);
        if p.is_null() {
            return false;
        }
        // SAFETY: name_long is freed only via the epoch (on rename or at
        // dentry free), and callers hold a guard or the rename lock.
        let long = unsafe { &*p };
        long[..] == *q.bytes
    }

    /// Inline name words 1.. against `name` (`8 < name.len() <=
    /// INLINE_NAME`; the caller compared the length and word 0). Relaxed
    /// loads: the caller validates with the dentry's seqcount.
    #[inline(never)]
    fn name_tail_eq(&self, name: &[u8]) -> bool {
        let len = name.len();
        let mut i = 8;
        while i < len {
            // Zero-padded past the end of `name`, as the stored words are.
            let w = load_word(name, i);
            // Relaxed: validated by the caller's d_seq retry.
            if self.hot.name[i / 8].load(Ordering::Relaxed) != w {
                return false;
            }
            i += 8;
        }
        true
    }

    /// A copy of the name. Racy against rename unless the caller holds the
    /// rename lock or validates with `seq`.
    pub fn name_vec(&self) -> Vec<u8> {
        // Relaxed (the length and the inline words below): a name is
        // stored before the dentry is published, or by a move, under the
        // dentry's d_seq write section and inside locks the mover holds
        // (the dentry's buckets, the VFS name stripe, for a directory the
        // rename lock). A caller holding one of those for this dentry sees
        // the name whole (the lock orders the stores before these loads);
        // one holding none validates its copy with a sequence retry
        // (`getcwd`: the rename sequence), so a torn copy is never used.
        // Only `Debug` prints a racy copy.
        let len = self.hot.name_len.load(Ordering::Relaxed) as usize;
        if len > INLINE_NAME {
            // Acquire: see name_eq.
            let p = self.hot.name_long.load(Ordering::Acquire);
            if p.is_null() {
                return Vec::new();
            }
            // SAFETY: as in name_eq; callers of name_vec hold a reference on
            // the dentry and are pinned or hold the rename lock.
            return unsafe { (*p).to_vec() };
        }
        let mut out = Vec::with_capacity(INLINE_NAME);
        for w in &self.hot.name {
            // Relaxed: see `len` above.
            out.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        out.truncate(len);
        out
    }

    /// Store a name (dentry not yet visible, or d_seq write held).
    fn store_name(&self, q: &QName<'_>, guard: Option<&Guard>) {
        // Relaxed stores: ordered before publication by the Release of the
        // chain insertion or the d_seq write_end.
        self.hot
            .name_len
            .store(q.bytes.len() as u32, Ordering::Relaxed);
        for (w, v) in self.hot.name.iter().zip(q.words) {
            w.store(v, Ordering::Relaxed);
        }
        let new = if q.bytes.len() > INLINE_NAME {
            Box::into_raw(Box::new(q.bytes.to_vec().into_boxed_slice()))
        } else {
            ptr::null_mut()
        };
        // AcqRel: publish the new long name, take ownership of the old one.
        let old = self.hot.name_long.swap(new, Ordering::AcqRel);
        if !old.is_null() {
            let old = DPtrName(old);
            match guard {
                // SAFETY: old was produced by Box::into_raw and is no longer
                // reachable from the dentry; readers that loaded it are pinned.
                Some(g) => unsafe {
                    g.defer_unchecked(move || drop(Box::from_raw(old.into_raw())))
                },
                // SAFETY: no guard means the dentry was never published.
                None => drop(unsafe { Box::from_raw(old.0) }),
            }
        }
    }
}

struct DPtrName(*mut Box<[u8]>);
impl DPtrName {
    fn into_raw(self) -> *mut Box<[u8]> {
        self.0
    }
}
// SAFETY: the pointed-to name is owned by this value once it has been
// unlinked from its dentry.
unsafe impl Send for DPtrName {}

/// A counted reference on a dentry (one unit of its LockRef). Dropping it is
/// `dput`.
pub struct DentryRef {
    ptr: ptr::NonNull<Dentry>,
}

// SAFETY: a counted reference keeps the dentry alive; Dentry is Sync.
unsafe impl Send for DentryRef {}
// SAFETY: as above.
unsafe impl Sync for DentryRef {}

impl std::ops::Deref for DentryRef {
    type Target = Dentry;
    #[inline]
    fn deref(&self) -> &Dentry {
        // SAFETY: we hold a count, so the dentry is not freed.
        unsafe { self.ptr.as_ref() }
    }
}

impl Clone for DentryRef {
    fn clone(&self) -> Self {
        self.lockref().get(self.variant());
        DentryRef { ptr: self.ptr }
    }
}

impl Drop for DentryRef {
    fn drop(&mut self) {
        dput(self.ptr.as_ptr());
    }
}

impl std::fmt::Debug for DentryRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl PartialEq for DentryRef {
    fn eq(&self, o: &Self) -> bool {
        self.ptr == o.ptr
    }
}
impl Eq for DentryRef {}

impl DentryRef {
    /// Adopt one count that the caller already took on `d`.
    ///
    /// # Safety
    /// The caller owns one unit of `d`'s count, and `d` carries the
    /// provenance of the whole allocation: it comes from `alloc`'s
    /// `Box::into_raw` through raw pointers only (a chain link, a parent
    /// pointer, `DentryRef::as_ptr`, a [`Pinned`]), never cast from a
    /// `&Dentry`. The last reference frees the dentry through it.
    pub(crate) unsafe fn from_counted(d: *const Dentry) -> DentryRef {
        DentryRef {
            ptr: ptr::NonNull::new(d as *mut Dentry).expect("non-null dentry"),
        }
    }
    /// Take a counted reference on a dentry found under a guard; fails if it
    /// is dead (being freed). A [`Pinned`], not a `&Dentry`: the reference
    /// adopts the pointer, provenance included (see `from_counted`).
    pub(crate) fn try_get(d: Pinned<'_, Dentry>) -> Option<DentryRef> {
        if d.lockref().get_not_dead(d.variant()) {
            // SAFETY: we just took a count; a Pinned carries the
            // allocation's provenance.
            Some(unsafe { DentryRef::from_counted(d.as_ptr()) })
        } else {
            None
        }
    }
    pub fn as_ptr(&self) -> *const Dentry {
        self.ptr.as_ptr()
    }
    /// The parent, with a counted reference (Linux's dget_parent).
    pub fn parent(&self) -> DentryRef {
        let guard = epoch::pin();
        loop {
            let p = self.parent_ptr();
            // SAFETY: the parent is kept alive by our child's reference on it
            // or, if a rename just switched it, by the epoch guard; parent
            // pointers are stored from raw pointers.
            let pd = unsafe { Pinned::new(p) };
            if let Some(r) = DentryRef::try_get(pd) {
                if ptr::eq(self.parent_ptr(), p) {
                    return r;
                }
                drop(r);
            }
            lockstat::inc(Stat::SeqRetry);
            let _ = &guard;
        }
    }
}

/// Release one counted reference (Linux's dput).
fn dput(mut d: *mut Dentry) {
    loop {
        // SAFETY: the caller owns a count on d, so it is alive.
        let dent = unsafe { &*d };
        let v = dent.variant();
        let lr = dent.lockref();
        if lr.put_or_lock(v) {
            return;
        }
        // Lock held, count <= 1: we are the last holder.
        if dent.flags() & D_HASHED != 0 {
            lr.dec_locked();
            if dent.flags() & D_REFERENCED == 0 {
                dent.set_flag(D_REFERENCED);
            }
            lr.unlock();
            return;
        }
        lr.mark_dead_locked();
        lr.unlock();
        let parent = dent.parent_ptr() as *mut Dentry;
        let is_root = ptr::eq(parent, d);
        free_dentry(d);
        if is_root || give_parent_ref(parent) {
            return;
        }
        d = parent;
    }
}

/// Drop a dead child's reference on `parent` (PARENT REFERENCES).
fn put_parent(parent: *mut Dentry) {
    if !give_parent_ref(parent) {
        dput(parent);
    }
}

/// Give a dead child's reference on `parent` to this thread's spares if
/// the parent keeps spares and is hashed. `false`: the caller drops it.
fn give_parent_ref(parent: *mut Dentry) -> bool {
    // SAFETY: the caller owns a count on parent.
    let p = unsafe { &*parent };
    if p.flags() & D_SPARES == 0 || !p.is_attached() {
        return false;
    }
    let table = &p.cold.sb.dentries.spares;
    match table.give(parent as spares::Key, || p.may_keep_spares()) {
        // A batch back from an entry over its limit: this thread's given
        // reference was the only one it held, so these may be the last
        // (an rmdir may have unhashed `p` and recalled the rest since):
        // the last goes through `dput`, which kills an unhashed dentry
        // (a plain subtract left it at 0, alive, for ever; review, stop
        // 48).
        Some(spares::PutBack::Own(n)) => {
            put_spares(parent as spares::Key, n);
            true
        }
        Some(back) => {
            put_back(p, back);
            true
        }
        None => false,
    }
}

/// Drop what the spare table handed back (`spares::PutBack`). `own`
/// still holds at least one reference besides the ones handed back.
fn put_back(own: &Dentry, back: spares::PutBack) {
    match back {
        spares::PutBack::None => {}
        spares::PutBack::Own(n) => own.lockref().put_many(n as i32, own.variant()),
        spares::PutBack::Other(key, n) => put_spares(key, n),
    }
}

/// Drop `n` (at least 1) references on the dentry at `key`, taken out of
/// the spare table (an evicted entry, a drain, or a batch handed back to a
/// thread that gave its last reference: `give_parent_ref`); the last goes
/// through `dput`, so a dentry unhashed meanwhile dies there.
fn put_spares(key: spares::Key, n: u32) {
    let d = key as *mut Dentry;
    if n > 1 {
        // SAFETY: the spares are counts on it, now ours: it is alive.
        let dd = unsafe { &*d };
        dd.lockref().put_many(n as i32 - 1, dd.variant());
    }
    dput(d);
}

/// A mount's root is going (its `Mount` is dropped): no thread may keep
/// spares on it from now on, and those kept come back, so that it dies at
/// its last put (the unhash protocol of PARENT REFERENCES, with
/// `D_LIVE_ROOT` in the place of `D_HASHED`). The caller holds a counted
/// reference.
pub(crate) fn retire_root(d: &DentryRef) {
    d.clear_flag(D_LIVE_ROOT);
    recall_spares(d);
}

/// Take every thread's spares on `d` back after `d` was unhashed; the
/// caller holds a counted reference, so the count stays positive here and
/// `d` dies at the caller's last `dput` as before.
fn recall_spares(d: &Dentry) {
    if d.flags() & D_SPARES == 0 {
        return;
    }
    let n = d
        .cold
        .sb
        .dentries
        .spares
        .recall(d as *const Dentry as spares::Key);
    if n > 0 {
        d.lockref().put_many(n as i32, d.variant());
    }
}

/// Free a dead, unhashed dentry after a grace period.
fn free_dentry(d: *mut Dentry) {
    // SAFETY: d is dead and unreachable from every index; only pinned readers
    // may still hold its address.
    let dent = unsafe { &*d };
    dent.set_flag(D_DEAD);
    let dc = &dent.cold.sb.dentries;
    // Per-thread counters (percpu.rs): no shared line per free.
    dc.nr_dentry.add(-1);
    if dent.is_negative() {
        dc.nr_negative.add(-1);
    }
    let p = DPtr(d);
    // Under loom (crates/core/src/loom_models.rs) the memory is leaked: loom
    // cannot model the epoch (crossbeam-epoch has no loom support), and the
    // deferred free would run during a later loom execution and touch that
    // execution's atomics.
    if cfg!(loom) {
        let _ = p;
        return;
    }
    // The dentry of a removed file may hold the last count of its inode,
    // and with it the file's data (`limbo::retire_heavy`).
    let heavy = dent.inode().is_some_and(|i| {
        let a = i.attr();
        crate::limbo::is_heavy(a.nlink, a.blocks)
    });
    // SAFETY: d came from Box::into_raw in `alloc`, is unreachable, and is
    // freed exactly once (only the thread that marked it dead gets here);
    // `retire` waits for pinned readers. Freed by this thread at its next
    // system call when it can (limbo.rs: a free by the other core costs
    // line transfers).
    unsafe {
        if heavy {
            crate::limbo::retire_heavy(drop_dentry, p.0 as *mut ())
        } else {
            crate::limbo::retire(drop_dentry, p.0 as *mut ())
        }
    };
}

/// The deferred half of `free_dentry`.
///
/// # Safety
/// `p` is a dead dentry from `alloc`'s `Box::into_raw`, unreachable, after
/// a grace period; called once.
unsafe fn drop_dentry(p: *mut ()) {
    // SAFETY: the contract above.
    let b = unsafe { Box::from_raw(p as *mut Dentry) };
    // Acquire: take ownership of the long name.
    let long = b.hot.name_long.swap(ptr::null_mut(), Ordering::Acquire);
    if !long.is_null() {
        // SAFETY: the long name is owned by the dentry alone now.
        drop(unsafe { Box::from_raw(long) });
    }
    drop(b);
}

/// A per-dir variant directory's child map, write-locked.
type ChildMapGuard<'a> = RwLockWriteGuard<'a, BTreeMap<Box<[u8]>, DPtr>>;

struct Bucket {
    head: AtomicPtr<Dentry>,
    lock: SpinLock<()>,
    /// The chain's sequence count, written (odd) under `lock` around every
    /// change that takes a dentry out of this chain and puts it (or another
    /// dentry for the same name) back in one step: `d_move`, `d_exchange`
    /// and `add` over a negative dentry. A lock-free *miss* re-checks it
    /// (see `Dcache::lookup_rcu`); hits do not need it. A plain insert at
    /// the head or a plain unhash does not write it. Sits on the line the
    /// lock and the head already share, which only changes of this chain
    /// write.
    seq: SeqCount,
}

/// The global rename lock and sequence, on a line of their own (the walk's
/// hash keys in `Dcache` are read by every lookup).
struct RenameLock {
    lock: SpinLock<()>,
    seq: SeqCount,
}

/// The bucket locks a move holds, each bucket's sequence in its write
/// section (`Dcache::lock_buckets`).
struct MoveLocks<'a> {
    dc: &'a Dcache,
    idx: Vec<usize>,
    _guards: Vec<SpinGuard<'a, ()>>,
}

impl Drop for MoveLocks<'_> {
    fn drop(&mut self) {
        // Close the write sections before the locks go (the fields drop
        // after this): the sequences are serialised by the bucket locks.
        for &i in &self.idx {
            self.dc.buckets[i].seq.write_end();
        }
    }
}

/// The dentry cache of one `Vfs`.
pub struct Dcache {
    pub(crate) config: DcacheConfig,
    buckets: Box<[Bucket]>,
    mask: usize,
    /// Per-instance hash key.
    seed: [u64; 2],
    /// `folded_mul(seed[0], HASH_K)`: the hash state before the first word.
    h0: u64,
    /// Global rename lock and sequence counter: written by moves of
    /// directories only (see `d_move`).
    rename: CachePadded<RenameLock>,
    /// Entry counts, shared with every `Super` (see `free_dentry`).
    counts: Arc<DentryCounts>,
    clock_hand: AtomicUsize,
    sweeping: SpinLock<()>,
    /// The entry count at which a sweep last came up short (0: none):
    /// what is left is pinned (an authoritative filesystem's names) or in
    /// use. No sweep again until the cache grows past it by a sixteenth
    /// of the limit, or shrinks below it: else, past the limit, every
    /// create swept the whole table twice and evicted nothing (review,
    /// stop 48).
    short_at: AtomicUsize,
    /// The entry limit: `max_entries`, or fewer if `max_bytes` says so.
    limit: usize,
}

impl std::fmt::Debug for Dcache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dcache")
            .field("config", &self.config)
            .field("entries", &self.counts.nr_dentry.sum())
            .finish()
    }
}

/// `Dcache::rcu_keys`: what the walk's fast loop needs of the dcache, in
/// registers.
#[derive(Clone, Copy)]
pub(crate) struct RcuKeys<'a> {
    seed: [u64; 2],
    h0: u64,
    mask: usize,
    buckets: &'a [Bucket],
}

impl RcuKeys<'_> {
    /// `scan_component` for the walk's fast loop: the same end and hash,
    /// but only the name's first word (zero-padded) instead of all inline
    /// words; `lookup_rcu_fast` reads the others from `b` when it needs them.
    /// A component that ends within 8 bytes of the end of `b` is read with
    /// one (overlapping) word load instead of byte by byte. `b[start]` is
    /// not a '/'. `None` for what the fast loop leaves to the general one:
    /// `.` and `..` (first word 0x2e or 0x2e2e; the test also catches a few
    /// other short names, which merely take the general loop) and names
    /// longer than `INLINE_NAME`.
    #[inline(always)]
    pub(crate) fn scan_fast(
        &self,
        parent: *const Dentry,
        b: &[u8],
        start: usize,
    ) -> Option<(usize, u64, u64)> {
        let w = load_word(b, start);
        let n = word_name_len(w).min(b.len() - start);
        if n == 8 {
            let r = self.scan_long(parent, b, start, w);
            return (r.0 - start <= INLINE_NAME).then_some(r);
        }
        // 1..=7 bytes: one word, masked (the padding is 0 already unless a
        // '/' follows).
        let w = w & (u64::MAX >> (64 - 8 * n));
        if w | 0x2e00 == 0x2e2e {
            return None;
        }
        let h = folded_mul(self.h0 ^ w, self.seed[1]);
        Some((start + n, finish_hash(h, n, parent as usize), w))
    }

    /// `scan_fast` of a name of 8 bytes or more (`w0`: its first word).
    #[inline(never)]
    fn scan_long(
        &self,
        parent: *const Dentry,
        b: &[u8],
        start: usize,
        w0: u64,
    ) -> (usize, u64, u64) {
        let len = b.len();
        let mut h = folded_mul(self.h0 ^ w0, self.seed[1]);
        let mut p = start + 8;
        while p < len {
            let w = load_word(b, p);
            let n = word_name_len(w).min(len - p);
            if n == 0 {
                break;
            }
            if n < 8 {
                h = folded_mul(h ^ (w & (u64::MAX >> (64 - 8 * n))), self.seed[1]);
                p += n;
                break;
            }
            h = folded_mul(h ^ w, self.seed[1]);
            p += 8;
        }
        (p, finish_hash(h, p - start, parent as usize), w0)
    }

    /// `lookup_rcu` for the walk's fast loop (global hash index only), of
    /// the name `b[name]` (`0 < len <= INLINE_NAME`, `w0` its first word,
    /// zero-padded, from `scan_fast`): the hit and the flags word read inside its
    /// validated d_seq section. `None` means "miss or concurrent change":
    /// the caller redoes the component with `lookup_rcu`, which tells the
    /// two apart.
    #[inline(always)]
    pub(crate) fn lookup_rcu_fast<'g>(
        &self,
        parent: &'g Dentry,
        hash: u64,
        b: &[u8],
        name: std::ops::Range<usize>,
        w0: u64,
        _guard: &'g Guard,
    ) -> Option<(Pinned<'g, Dentry>, u32)> {
        let len = name.end - name.start;
        debug_assert!(len > 0 && len <= INLINE_NAME && name.end <= b.len());
        let i = hash as usize & self.mask;
        debug_assert!(i < self.buckets.len());
        // SAFETY: the table has `mask + 1` buckets (a power of two).
        let bk = unsafe { self.buckets.get_unchecked(i) };
        // Acquire: pairs with the Release publication of a new chain head.
        let mut p = bk.head.load(Ordering::Acquire);
        while !p.is_null() {
            // SAFETY: chain members are freed only after a grace period and
            // we are pinned by `_guard`; chain links are raw pointers.
            let d: Pinned<'g, Dentry> = unsafe { Pinned::new(p) };
            // Relaxed: a filter; the match is validated by d_seq below.
            if d.hot.hash.load(Ordering::Relaxed) == hash {
                let s = d.hot.seq.raw_read_begin();
                if s & 1 != 0 {
                    return None;
                }
                let f = d.flags();
                // Relaxed loads: validated by d_seq (retry below).
                if ptr::eq(d.parent_ptr(), parent)
                    && d.hot.name_len.load(Ordering::Relaxed) as usize == len
                    && f & D_HASHED != 0
                    && d.hot.name[0].load(Ordering::Relaxed) == w0
                    && (len <= 8 || d.name_tail_eq(&b[name.clone()]))
                {
                    if d.hot.seq.retry(s) {
                        return None;
                    }
                    return Some((d, f));
                }
            }
            // Acquire: pairs with the Release store linking the next dentry.
            p = d.hot.next.load(Ordering::Acquire);
        }
        None
    }
}

/// Result of a lock-free lookup.
pub(crate) enum RcuLookup<'g> {
    Hit(Pinned<'g, Dentry>),
    Miss,
    /// A concurrent change was seen; take the locked path.
    Retry,
}

/// Which dentries a sweep of one bucket may evict (`Dcache::sweep_bucket_with`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Victims {
    /// Any unused, unpinned one (a second look for recently used ones).
    Any,
    /// Unused, unpinned negative ones.
    Negative,
    /// Unused negative ones whose parent is no longer hashed, at once.
    DeadParentNegative,
    /// Every unused one, pinned ones too, at once (teardown).
    Forced,
}

impl Dcache {
    /// The entry counts (shared with each `Super`).
    pub(crate) fn counts(&self) -> &Arc<DentryCounts> {
        &self.counts
    }

    pub fn new(config: DcacheConfig) -> Dcache {
        let limit = config
            .max_entries
            .min(config.max_bytes / core::mem::size_of::<Dentry>())
            .max(1);
        // Under loom one bucket may be asked for: which bucket a name falls
        // in depends on the random seed and the parent's address, and a loom
        // model must do the same atomic operations in every execution.
        let bits = config.hash_bits.clamp(if cfg!(loom) { 0 } else { 4 }, 28);
        let n = 1usize << bits;
        let buckets = (0..n)
            .map(|_| Bucket {
                head: AtomicPtr::new(ptr::null_mut()),
                lock: SpinLock::new(Class::DcacheBucket, lockstat::LockClass::DcacheBucket, ()),
                seq: SeqCount::new(),
            })
            .collect();
        // Seeded per instance: names chosen by an attacker cannot be aimed
        // at one bucket.
        let seed = {
            let r = std::collections::hash_map::RandomState::new();
            // Odd multiplier so the fold never degenerates.
            [r.hash_one(0x5eed_u64), r.hash_one(0xf00d_u64) | 1]
        };
        Dcache {
            config,
            buckets,
            mask: n - 1,
            seed,
            h0: folded_mul(seed[0], HASH_K),
            rename: CachePadded::new(RenameLock {
                lock: SpinLock::new(Class::DcacheRename, lockstat::LockClass::RenameLock, ()),
                seq: SeqCount::new(),
            }),
            counts: Arc::new(DentryCounts::default()),
            clock_hand: AtomicUsize::new(0),
            sweeping: SpinLock::new(Class::DcacheSweep, lockstat::LockClass::Other, ()),
            short_at: AtomicUsize::new(0),
            limit,
        }
    }

    /// Number of cached dentries (approximate under concurrency).
    pub fn len(&self) -> usize {
        self.counts.nr_dentry.sum()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The effective entry limit (`max_entries`, or fewer under `max_bytes`).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Number of cached negative dentries.
    pub fn negative_len(&self) -> usize {
        self.counts.nr_negative.sum()
    }

    /// Buckets the reclaim sweeps have looked at so far (the clock hand's
    /// steps): what a sweep costs, for tests and benchmarks.
    pub fn sweep_steps(&self) -> usize {
        // Relaxed: a counter read.
        self.clock_hand.load(Ordering::Relaxed)
    }

    /// Hash a component for lookups under `parent`.
    #[inline(always)]
    pub fn qname<'a>(&self, parent: *const Dentry, name: &'a [u8]) -> QName<'a> {
        let (hash, words) = hash_name(self.seed, self.h0, parent as usize, name);
        QName {
            bytes: name,
            hash,
            words,
        }
    }

    /// Scan the path component of `b` that starts at `start` (not a '/'),
    /// hashing it for lookups under `parent` in the same pass, a word at a
    /// time: each 8-byte load is searched for '/' with the has-zero-byte bit
    /// trick and folded into the hash. Returns the component's end, its hash
    /// and packed words: `QName::from_parts(&b[start..end], ..)` is identical
    /// to `qname(parent, &b[start..end])`.
    #[inline(always)]
    pub(crate) fn scan_component(
        &self,
        parent: *const Dentry,
        b: &[u8],
        start: usize,
    ) -> (usize, u64, [u64; INLINE_WORDS]) {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGHS: u64 = 0x8080_8080_8080_8080;
        const SLASHES: u64 = 0x2f2f_2f2f_2f2f_2f2f;
        let seed = self.seed;
        let mut h = self.h0;
        let mut words = [0u64; INLINE_WORDS];
        let mut i = 0;
        let mut p = start;
        let len = b.len();
        let end = loop {
            if let Some(chunk) = b.get(p..p + 8) {
                let w = u64::from_le_bytes([
                    chunk[0], chunk[1], chunk[2], chunk[3], chunk[4], chunk[5], chunk[6], chunk[7],
                ]);
                let x = w ^ SLASHES;
                // The lowest set bit marks the first '/' exactly (borrows
                // only create false positives above a true zero byte).
                let m = x.wrapping_sub(ONES) & !x & HIGHS;
                if m == 0 {
                    if i < INLINE_WORDS {
                        words[i] = w;
                    }
                    h = folded_mul(h ^ w, seed[1]);
                    i += 1;
                    p += 8;
                    continue;
                }
                let n = (m.trailing_zeros() / 8) as usize;
                if n > 0 {
                    let w = w & ((1u64 << (8 * n)) - 1);
                    if i < INLINE_WORDS {
                        words[i] = w;
                    }
                    h = folded_mul(h ^ w, seed[1]);
                }
                break p + n;
            }
            // Fewer than 8 bytes left: byte by byte.
            let mut w = 0u64;
            let mut j = 0;
            while p + j < len && b[p + j] != b'/' {
                w |= (b[p + j] as u64) << (8 * j);
                j += 1;
            }
            if j > 0 {
                if i < INLINE_WORDS {
                    words[i] = w;
                }
                h = folded_mul(h ^ w, seed[1]);
            }
            break p + j;
        };
        let hash = finish_hash(h, end - start, parent as usize);
        (end, hash, words)
    }

    #[inline]
    fn bucket(&self, hash: u64) -> &Bucket {
        &self.buckets[hash as usize & self.mask]
    }

    /// Sample the global rename sequence, which only moves of directories
    /// write (`getcwd`'s climb validates with it; the walk does not read it).
    #[inline]
    pub fn rename_read_begin(&self) -> u32 {
        self.rename.seq.read_begin()
    }
    /// Whether a directory was moved since `seq`.
    #[inline]
    pub fn rename_retry(&self, seq: u32) -> bool {
        self.rename.seq.retry(seq)
    }

    /// Allocate a root dentry (its own parent, not hashed). A directory's
    /// takes spares for its children (`D_LIVE_ROOT`): its owner must
    /// `retire_root` it before its last put.
    pub(crate) fn alloc_root(&self, sb: Arc<Super>, inode: Arc<Inode>) -> DentryRef {
        let dir = inode.is_dir();
        let d = self.alloc(sb, ptr::null(), None, Some(inode));
        // SAFETY: d is not yet published; we own it.
        let dent = unsafe { &*d };
        // Relaxed: not yet published.
        dent.hot.parent.store(d, Ordering::Relaxed);
        if dir {
            // Relaxed: not yet published.
            dent.hot.flags.fetch_or(D_LIVE_ROOT, Ordering::Relaxed);
        }
        // SAFETY: alloc returned it with count 1, owned by us.
        unsafe { DentryRef::from_counted(d) }
    }

    /// A new dentry with count 1, not hashed. Takes a reference on `parent`
    /// (if non-null) for the child.
    fn alloc(
        &self,
        sb: Arc<Super>,
        parent: *const Dentry,
        name: Option<&QName<'_>>,
        inode: Option<Arc<Inode>>,
    ) -> *mut Dentry {
        let mut flags = (self.config.lockref as u32) << D_VARIANT_SHIFT;
        if self.config.layout == DentryLayout::Packed {
            flags |= D_PACKED;
        }
        if inode.is_some() && sb.fs.dcache_authoritative() {
            flags |= D_PINNED;
        }
        flags |= match inode.as_deref().map(Inode::file_type) {
            None => D_NEGATIVE,
            Some(FileType::Directory) => D_DIR,
            Some(FileType::Symlink) => D_SYMLINK,
            Some(_) => 0,
        };
        let negative = inode.is_none();
        let d = Box::new(Dentry {
            hot: Hot {
                seq: SeqCount::new(),
                flags: AtomicU32::new(flags),
                hash: AtomicU64::new(name.map_or(0, |q| q.hash)),
                parent: AtomicPtr::new(parent as *mut Dentry),
                next: AtomicPtr::new(ptr::null_mut()),
                inode,
                name_len: AtomicU32::new(0),
                name_long: AtomicPtr::new(ptr::null_mut()),
                name: Default::default(),
                lockref_packed: LockRef::new(1),
            },
            cold: Cold {
                lockref_sep: LockRef::new(1),
                sb,
                children: RwLock::new(Class::DirChildren, BTreeMap::new()),
            },
        });
        if let Some(q) = name {
            d.store_name(q, None);
        }
        if !parent.is_null() {
            // SAFETY: the caller holds a counted reference on parent, or
            // its directory's lock with the dentry validated (`ParentWalk`).
            let p = unsafe { &*parent };
            self.take_parent_ref(p);
        }
        // Per-thread counters (percpu.rs): no shared line per alloc.
        self.counts.nr_dentry.add(1);
        if negative {
            self.counts.nr_negative.add(1);
        }
        Box::into_raw(d)
    }

    /// A new child's reference on `p` (PARENT REFERENCES): a spare of this
    /// thread's if it has one, else a batch taken at once.
    fn take_parent_ref(&self, p: &Dentry) {
        let v = p.variant();
        if !self.config.parent_spares {
            p.lockref().get(v);
            return;
        }
        let key = p as *const Dentry as spares::Key;
        let table = &self.counts.spares;
        if table.take(key) {
            return;
        }
        p.lockref().get_many(1 + spares::BATCH as i32, v);
        let back = table.stash(key, spares::BATCH, || p.may_keep_spares());
        put_back(p, back);
    }

    /// A dentry for an unnamed inode (O_TMPFILE) under `parent`, never
    /// hashed: it dies with its last reference.
    pub(crate) fn alloc_unhashed(
        &self,
        parent: &DentryRef,
        q: &QName<'_>,
        inode: Arc<Inode>,
    ) -> DentryRef {
        let d = self.alloc(
            parent.cold.sb.clone(),
            parent.as_ptr(),
            Some(q),
            Some(inode),
        );
        // SAFETY: alloc returned it with count 1, owned by us.
        unsafe { DentryRef::from_counted(d) }
    }

    /// Lock-free lookup of `q` under `parent`, under `guard`. Takes no lock
    /// and writes nothing shared. Each answer is linearizable on its own:
    ///
    /// - `Hit(d)`: `d`'s d_seq was even and unchanged around the read of
    ///   its parent, name and `D_HASHED`, so at one instant inside the
    ///   lookup `d` was the hashed dentry of (`parent`, name). (A dentry's
    ///   inode and type never change, so nothing else needs validating.)
    /// - `Miss`: the bucket's sequence was even at the start and unchanged
    ///   at the end. Without that check a miss could be false in two ways,
    ///   both caused by a move: a reader standing on a dentry that `d_move`
    ///   re-links into another chain follows its new `next` there and skips
    ///   the rest of this chain; and a rename over the name (or `add` over
    ///   a negative dentry) links the new dentry in at the head, which the
    ///   reader has passed, and unlinks the old one before the reader gets
    ///   to it, so a name that existed throughout is missed. Every such
    ///   change writes this bucket's sequence (both buckets of a move), so a
    ///   miss that overlapped one retries. A plain insert at the head or a
    ///   plain unhash needs no check: the miss is then linearized before the
    ///   insert or after the unhash (an unhashed dentry keeps its `next`, so
    ///   readers standing on it go on down the same chain).
    /// - `Retry`: a concurrent change was seen; the caller takes the locked
    ///   path.
    #[inline]
    pub(crate) fn lookup_rcu<'g>(
        &self,
        parent: &'g Dentry,
        q: &QName<'_>,
        _guard: &'g Guard,
    ) -> RcuLookup<'g> {
        if self.config.index == DcacheIndex::PerDir {
            return self.lookup_perdir(parent, q);
        }
        let b = self.bucket(q.hash);
        // Acquire (in raw_read_begin): a reader that sees the even value a
        // move's write_end stored also sees the chain as the move left it.
        let bseq = b.seq.raw_read_begin();
        // Acquire: pairs with the Release publication of a new chain head.
        let mut p = b.head.load(Ordering::Acquire);
        while !p.is_null() {
            // SAFETY: chain members are freed only after a grace period and
            // we are pinned by `_guard`; chain links are raw pointers.
            let d: Pinned<'g, Dentry> = unsafe { Pinned::new(p) };
            // Relaxed: validated by d_seq below.
            if d.hot.hash.load(Ordering::Relaxed) == q.hash {
                let s = d.hot.seq.raw_read_begin();
                if s & 1 != 0 {
                    return RcuLookup::Retry;
                }
                if ptr::eq(d.parent_ptr(), parent) && d.name_eq(q) && d.is_hashed() {
                    if d.hot.seq.retry(s) {
                        return RcuLookup::Retry;
                    }
                    return RcuLookup::Hit(d);
                }
            }
            // Acquire: pairs with the Release store linking the next dentry.
            p = d.hot.next.load(Ordering::Acquire);
        }
        // `retry` is true for an odd start too (a move was in progress).
        if b.seq.retry(bseq) {
            lockstat::inc(Stat::SeqRetry);
            return RcuLookup::Retry;
        }
        RcuLookup::Miss
    }

    /// The hash keys and table, copied out for the walk's fast loop (its
    /// Acquire loads would otherwise make the compiler reload them for
    /// every component). `None` for the per-dir index.
    #[inline(always)]
    pub(crate) fn rcu_keys(&self) -> Option<RcuKeys<'_>> {
        if self.config.index != DcacheIndex::GlobalHash {
            return None;
        }
        Some(RcuKeys {
            seed: self.seed,
            h0: self.h0,
            mask: self.mask,
            buckets: &self.buckets,
        })
    }

    #[cold]
    fn lookup_perdir<'g>(&self, parent: &'g Dentry, q: &QName<'_>) -> RcuLookup<'g> {
        let map = parent.cold.children.read();
        lockstat::inc(Stat::SharedWrite);
        match map.get(q.bytes) {
            // SAFETY: entries are removed from the map before the dentry is
            // killed; the caller is pinned, so it is not freed yet.
            Some(p) => RcuLookup::Hit(unsafe { Pinned::new(p.0) }),
            None => RcuLookup::Miss,
        }
    }

    /// Locked lookup: returns a counted reference to the hashed dentry for
    /// `q` under `parent`, if cached.
    pub(crate) fn lookup_ref(&self, parent: &Dentry, q: &QName<'_>) -> Option<DentryRef> {
        let _guard = epoch::pin();
        if self.config.index == DcacheIndex::PerDir {
            let map = parent.cold.children.read();
            // SAFETY: as in lookup_perdir; we also hold the map lock.
            return map
                .get(q.bytes)
                .and_then(|p| DentryRef::try_get(unsafe { Pinned::new(p.0) }));
        }
        // Lock-free first (issue 16: a create or unlink of its own name must
        // not write the bucket lock's line, which other names share). A
        // miss from `lookup_rcu` is validated by the bucket's sequence and
        // so definite: every insert of a (parent, name) pair is made under
        // that name's lock, which the callers either hold (creates,
        // unlinks) or do not need a fresher answer than the lock-free walk
        // gives (`lookup_slow` retries under it). A hit is taken with a
        // counted reference and checked to be still hashed (reclaim kills
        // only unreferenced dentries, so a dead one fails the `try_get`);
        // anything doubtful takes the lock.
        match self.lookup_rcu(parent, q, &_guard) {
            RcuLookup::Miss => return None,
            RcuLookup::Hit(d) => {
                if let Some(r) = DentryRef::try_get(d) {
                    if r.is_hashed() && ptr::eq(r.parent_ptr(), parent) {
                        return Some(r);
                    }
                }
            }
            _ => {}
        }
        let b = self.bucket(q.hash);
        let _l = b.lock.lock();
        // Relaxed: the chain is stable under the bucket lock.
        let mut p = b.head.load(Ordering::Relaxed);
        while !p.is_null() {
            // SAFETY: chain members are alive while linked; we hold the lock.
            let d = unsafe { Pinned::new(p) };
            if d.hot.hash.load(Ordering::Relaxed) == q.hash
                && ptr::eq(d.parent_ptr(), parent)
                && d.name_eq(q)
            {
                return DentryRef::try_get(d);
            }
            p = d.hot.next.load(Ordering::Relaxed);
        }
        None
    }

    /// Make and hash a dentry for `q` under `parent` pointing at `inode`
    /// (`None`: negative). If a hashed dentry for the name already exists it
    /// is returned instead (a racing lookup added it first) unless it is
    /// negative and we are adding a positive one, in which case the negative
    /// one is unhashed and replaced.
    pub(crate) fn add(
        &self,
        parent: &DentryRef,
        q: &QName<'_>,
        inode: Option<Arc<Inode>>,
    ) -> DentryRef {
        let _guard = epoch::pin();
        let positive = inode.is_some();
        let d = self.alloc(parent.cold.sb.clone(), parent.as_ptr(), Some(q), inode);
        // SAFETY: we own the count alloc gave us.
        let new = unsafe { DentryRef::from_counted(d) };
        let mut replaced = None;
        {
            let _map = self.lock_children(parent);
            let b = self.bucket(q.hash);
            let _l = b.lock.lock();
            // Relaxed: stable under the bucket lock.
            let mut p = b.head.load(Ordering::Relaxed);
            while !p.is_null() {
                // SAFETY: alive while linked; lock held.
                let e = unsafe { Pinned::new(p) };
                if e.hot.hash.load(Ordering::Relaxed) == q.hash
                    && ptr::eq(e.parent_ptr(), parent.as_ptr())
                    && e.name_eq(q)
                {
                    if positive && e.is_negative() {
                        if let Some(r) = DentryRef::try_get(e) {
                            replaced = Some(r);
                        }
                        break;
                    }
                    if let Some(r) = DentryRef::try_get(e) {
                        drop(_l);
                        drop(_map);
                        // Unused new dentry: never hashed, so dropping kills it.
                        drop(new);
                        return r;
                    }
                    break;
                }
                p = e.hot.next.load(Ordering::Relaxed);
            }
            if let Some(old) = &replaced {
                // One name's dentry replaced by another in one step: a
                // lock-free miss that overlapped it must retry (see
                // `lookup_rcu`).
                b.seq.write_begin();
                self.unhash_locked(b, old, _map.as_deref());
                self.hash_locked(b, &new, _map);
                b.seq.write_end();
            } else {
                self.hash_locked(b, &new, _map);
            }
        }
        drop(replaced);
        self.maybe_reclaim();
        new
    }

    fn lock_children<'a>(&self, parent: &'a Dentry) -> Option<ChildMapGuard<'a>> {
        if self.config.index == DcacheIndex::PerDir {
            // Keyed by address: two maps are locked in address order.
            let key = parent as *const Dentry as u64;
            Some(parent.cold.children.write_as(Class::DirChildren, key))
        } else {
            None
        }
    }

    /// Link `d` into bucket `b` (and the parent's map). Bucket lock held.
    /// A `DentryRef`, not a `&Dentry`: the pointer stored in the chain is
    /// the one lookups adopt into references (see `from_counted`).
    fn hash_locked(&self, b: &Bucket, d: &DentryRef, map: Option<ChildMapGuard<'_>>) {
        if let Some(mut m) = map {
            m.insert(d.name_vec().into_boxed_slice(), DPtr(d.as_ptr()));
        }
        // Relaxed: we hold the bucket lock.
        let head = b.head.load(Ordering::Relaxed);
        // Release, not Relaxed: `d` may already be reachable. d_move re-hashes
        // a dentry that lock-free readers may be standing on (it was in its
        // old chain); such a reader follows this link into the new chain with
        // an Acquire load, which must synchronise with this store for the
        // successor's initialisation (by the thread that hashed it, ordered
        // before us by the bucket lock) to happen before its reads. Found by
        // ThreadSanitizer (ci/tsan.sh, rename_races).
        d.hot.next.store(head, Ordering::Release);
        d.set_flag(D_HASHED);
        // Release: publish d's initialised contents to lock-free readers.
        b.head.store(d.as_ptr() as *mut Dentry, Ordering::Release);
    }

    /// Remove `d` from bucket `b`'s chain (and the parent's map). Bucket lock
    /// (and map lock) held. `d`'s own `next` is left intact so readers that
    /// stand on it can continue down the chain.
    fn unhash_locked(&self, b: &Bucket, d: &Dentry, map: Option<&BTreeMap<Box<[u8]>, DPtr>>) {
        let _ = map;
        let target = d as *const Dentry as *mut Dentry;
        let mut link = &b.head;
        loop {
            // Relaxed: chain stable under the bucket lock.
            let p = link.load(Ordering::Relaxed);
            if p.is_null() {
                break;
            }
            if p == target {
                // Release: readers that load the new link see a fully linked successor.
                link.store(d.hot.next.load(Ordering::Relaxed), Ordering::Release);
                break;
            }
            // SAFETY: alive while linked; lock held.
            link = unsafe { &(*p).hot.next };
        }
        d.clear_flag(D_HASHED);
    }

    /// Remove `d` from the lookup index (unlink, rmdir, invalidation). The
    /// caller holds a counted reference; the dentry dies at the last `dput`.
    pub(crate) fn unhash(&self, d: &DentryRef) {
        let _guard = epoch::pin();
        let parent = d.parent_ptr();
        // SAFETY: the parent is kept alive by d's reference on it.
        let pd = unsafe { &*parent };
        let mut map = self.lock_children(pd);
        // Relaxed: the hash changes only in a move (`d_move`, `d_exchange`),
        // and the caller (unlink, rmdir) holds the VFS name stripe of `d`'s
        // name (`VfsInner::name_locks`), which every move of `d` holds too:
        // no move runs until we are done, and that lock orders the last
        // one's store before this load. (So, unlike `evict_last_ref`, no
        // re-check under the bucket's lock.)
        let b = self.bucket(d.hot.hash.load(Ordering::Relaxed));
        {
            let _l = b.lock.lock();
            if d.is_hashed() {
                if let Some(m) = map.as_mut() {
                    m.remove(&d.name_vec()[..]);
                }
                self.unhash_locked(b, d, None);
            }
        }
        drop(map);
        recall_spares(d);
    }

    /// Move `d` to (`new_parent`, `new_name`) in place: the rename of a name
    /// that open files, cwds and children keep pointing at. `target`, if
    /// given, is the dentry currently at the new name: it is unhashed.
    pub(crate) fn d_move(
        &self,
        d: &DentryRef,
        new_parent: &DentryRef,
        new_name: &[u8],
        target: Option<&DentryRef>,
    ) {
        let guard = epoch::pin();
        let new_q = self.qname(new_parent.as_ptr(), new_name);
        // The child's reference on its new parent.
        self.take_parent_ref(new_parent);
        // Only a directory's move changes the ancestry of other dentries
        // (and so what `getcwd` builds): only it takes the global rename
        // lock and writes the global sequence. A file's move writes only
        // its own d_seq and its buckets' lines (issue 16: a rename of an
        // unrelated name writes nothing a walk reads). A directory can only
        // replace a directory, so `target` needs no test of its own.
        let dir = d.flags() & D_DIR != 0;
        let old_parent;
        {
            let _r = dir.then(|| self.rename.lock.lock());
            if dir {
                self.rename.seq.write_begin();
            }
            old_parent = d.parent_ptr();
            // SAFETY: the old parent is kept alive by d's reference on it.
            let op = unsafe { &*old_parent };
            let (mut m1, mut m2) = self.lock_two_maps(op, new_parent);
            // Relaxed (both hashes): only a move changes a dentry's hash,
            // and the caller (`Task::rename`) holds the VFS name stripes of
            // both names, which any other move of `d` or of `target` holds
            // too: none runs meanwhile, and those locks order the last
            // one's store before these loads, made before the buckets are
            // chosen and locked.
            let old_b = d.hot.hash.load(Ordering::Relaxed) as usize & self.mask;
            let new_b = new_q.hash as usize & self.mask;
            let tb = target.map(|t| t.hot.hash.load(Ordering::Relaxed) as usize & self.mask);
            let locks = self.lock_buckets(&[Some(old_b), Some(new_b), tb]);
            if let Some(t) = target {
                if t.is_hashed() {
                    if let Some(m) = m2.as_mut().or(m1.as_mut()) {
                        m.remove(&t.name_vec()[..]);
                    }
                    self.unhash_locked(&self.buckets[tb.unwrap_or(0)], t, None);
                }
            }
            d.hot.seq.write_begin();
            let was_hashed = d.is_hashed();
            if was_hashed {
                if let Some(m) = m1.as_mut() {
                    m.remove(&d.name_vec()[..]);
                }
                self.unhash_locked(&self.buckets[old_b], d, None);
            }
            // Release: the new parent's contents are visible to readers of the pointer.
            d.hot
                .parent
                .store(new_parent.as_ptr() as *mut Dentry, Ordering::Release);
            // Relaxed: under d_seq write; published by its write_end.
            d.hot.hash.store(new_q.hash, Ordering::Relaxed);
            d.store_name(&new_q, Some(&guard));
            if was_hashed {
                let m = if m2.is_some() { m2.take() } else { m1.take() };
                self.hash_locked(&self.buckets[new_b], d, m);
            }
            d.hot.seq.write_end();
            drop(locks);
            if dir {
                self.rename.seq.write_end();
            }
        }
        if let Some(t) = target {
            recall_spares(t);
        }
        // Drop the child's reference on its old parent, outside every lock
        // (that count was owned by d's parent link, now transferred to us).
        put_parent(old_parent as *mut Dentry);
    }

    /// Swap two dentries' (parent, name) in place (RENAME_EXCHANGE).
    pub(crate) fn d_exchange(&self, a: &DentryRef, b: &DentryRef) {
        let guard = epoch::pin();
        // As in d_move: the global lock and sequence for directories only.
        let dir = (a.flags() | b.flags()) & D_DIR != 0;
        let _r = dir.then(|| self.rename.lock.lock());
        if dir {
            self.rename.seq.write_begin();
        }
        let pa = a.parent_ptr();
        let pb = b.parent_ptr();
        // SAFETY: parents are kept alive by their children's references.
        let (pad, pbd) = unsafe { (&*pa, &*pb) };
        let (mut m1, mut m2) = self.lock_two_maps(pad, pbd);
        // Relaxed (both): as in `d_move`, the caller's VFS name stripes of
        // both names keep every other move of `a` and `b` out and order
        // the last one's hash store before these loads.
        let ba = a.hot.hash.load(Ordering::Relaxed) as usize & self.mask;
        let bb = b.hot.hash.load(Ordering::Relaxed) as usize & self.mask;
        let name_a = a.name_vec();
        let name_b = b.name_vec();
        let qa = self.qname(pb, &name_b); // a's new key
        let qb = self.qname(pa, &name_a); // b's new key
        let na = qa.hash as usize & self.mask;
        let nb = qb.hash as usize & self.mask;
        let locks = self.lock_buckets(&[Some(ba), Some(bb), Some(na), Some(nb)]);
        a.hot.seq.write_begin();
        b.hot.seq.write_begin();
        let (ha, hb) = (a.is_hashed(), b.is_hashed());
        if let Some(m) = m1.as_mut() {
            m.remove(&name_a[..]);
        }
        if let Some(m) = m2.as_mut().or(m1.as_mut()) {
            m.remove(&name_b[..]);
        }
        if ha {
            self.unhash_locked(&self.buckets[ba], a, None);
        }
        if hb {
            self.unhash_locked(&self.buckets[bb], b, None);
        }
        // Release: see d_move.
        a.hot.parent.store(pb as *mut Dentry, Ordering::Release);
        b.hot.parent.store(pa as *mut Dentry, Ordering::Release);
        // Relaxed: under d_seq write.
        a.hot.hash.store(qa.hash, Ordering::Relaxed);
        b.hot.hash.store(qb.hash, Ordering::Relaxed);
        a.store_name(&qa, Some(&guard));
        b.store_name(&qb, Some(&guard));
        if let Some(m) = m2.as_mut().or(m1.as_mut()) {
            m.insert(name_b.clone().into_boxed_slice(), DPtr(a.as_ptr()));
        }
        if let Some(m) = m1.as_mut() {
            m.insert(name_a.clone().into_boxed_slice(), DPtr(b.as_ptr()));
        }
        if ha {
            self.hash_locked(&self.buckets[na], a, None);
        }
        if hb {
            self.hash_locked(&self.buckets[nb], b, None);
        }
        b.hot.seq.write_end();
        a.hot.seq.write_end();
        drop(locks);
        if dir {
            self.rename.seq.write_end();
        }
        // Parent references stay balanced: each parent keeps one child.
    }

    fn lock_two_maps<'a>(
        &self,
        a: &'a Dentry,
        b: &'a Dentry,
    ) -> (Option<ChildMapGuard<'a>>, Option<ChildMapGuard<'a>>) {
        if self.config.index != DcacheIndex::PerDir {
            return (None, None);
        }
        if ptr::eq(a, b) {
            return (self.lock_children(a), None);
        }
        // Lock order: by address.
        if (a as *const Dentry) < (b as *const Dentry) {
            let ga = self.lock_children(a);
            let gb = self.lock_children(b);
            (ga, gb)
        } else {
            let gb = self.lock_children(b);
            let ga = self.lock_children(a);
            (ga, gb)
        }
    }

    /// Lock the buckets of a move in index order and open each one's
    /// sequence write section (closed, then unlocked, when the result is
    /// dropped): every chain a move touches is one a concurrent lock-free
    /// miss must not trust (see `lookup_rcu`).
    fn lock_buckets(&self, idx: &[Option<usize>]) -> MoveLocks<'_> {
        let mut v: Vec<usize> = idx.iter().flatten().copied().collect();
        v.sort_unstable();
        v.dedup();
        let guards = v
            .iter()
            .map(|&i| self.buckets[i].lock.lock_key(i as u64))
            .collect();
        for &i in &v {
            self.buckets[i].seq.write_begin();
        }
        MoveLocks {
            dc: self,
            idx: v,
            _guards: guards,
        }
    }

    /// Mark `d` as a mount point (or clear it).
    pub(crate) fn set_mounted(&self, d: &Dentry, on: bool) {
        if on {
            d.set_flag(D_MOUNTED);
        } else {
            d.clear_flag(D_MOUNTED);
        }
    }

    /// Run the CLOCK sweep if the cache is over its limits.
    fn maybe_reclaim(&self) {
        let neg_cap = self.limit / 100 * self.config.negative_percent as usize;
        // The per-thread counters' cheap test first: the slots are only
        // summed near a limit.
        if !self.counts.nr_dentry.above(self.limit)
            && !self.counts.nr_negative.above(neg_cap.max(1))
        {
            return;
        }
        let total = self.len();
        let neg = self.negative_len();
        let slack = self.limit / 16 + 64;
        // Relaxed: a hint; a stale look costs one sweep or skips one.
        let short = self.short_at.load(Ordering::Relaxed);
        if short != 0 && total >= short && total < short + slack && neg <= neg_cap + slack {
            return;
        }
        // One sweeper at a time; others go on (a lookup never waits for it).
        let Some(_s) = self.sweeping.try_lock() else {
            // Unless the sweeper falls behind (descheduled while adders run
            // on): then an adder evicts a batch itself, without the sweeping
            // lock (shrink is safe concurrently), so the limit is a bound.
            if total > self.limit + slack {
                self.shrink(64, false);
            } else if neg > neg_cap + slack {
                self.shrink(64, true);
            }
            return;
        };
        let want = total
            .saturating_sub(self.limit)
            .max(neg.saturating_sub(neg_cap))
            .max(64);
        let evicted = self.shrink(want, neg > neg_cap);
        // Relaxed: a hint (above).
        self.short_at
            .store(if evicted < want { total } else { 0 }, Ordering::Relaxed);
    }

    /// Evict up to `n` unused dentries by a CLOCK sweep; with
    /// `negative_only`, only negative ones. Returns how many were evicted.
    pub fn shrink(&self, n: usize, negative_only: bool) -> usize {
        let mut evicted = self.sweep(n, negative_only);
        // Short of the target: directories may be kept in use only by
        // spare references on them; take those back and sweep again.
        if evicted < n && !negative_only && self.recall_own_spares() > 0 {
            evicted += self.sweep(n - evicted, false);
        }
        lockstat::add(Stat::DcacheReclaim, evicted as u64);
        evicted
    }

    fn sweep(&self, n: usize, negative_only: bool) -> usize {
        let mut evicted = 0;
        let nb = self.buckets.len();
        // Two full turns at most: the first clears referenced bits.
        let mut steps = 0;
        while evicted < n && steps < 2 * nb {
            // Relaxed: the hand position is a hint.
            let i = self.clock_hand.fetch_add(1, Ordering::Relaxed) & self.mask;
            steps += 1;
            evicted += self.sweep_bucket(i, n - evicted, negative_only, false);
        }
        evicted
    }

    /// Take back every thread's spare references on this cache's dentries
    /// (PARENT REFERENCES); returns how many dentries had some.
    fn recall_own_spares(&self) -> usize {
        let back = self.counts.spares.drain();
        let n = back.len();
        for (key, spares) in back {
            put_spares(key, spares);
        }
        n
    }

    /// Evict the unused negative dentries whose parent is no longer hashed
    /// (a removed directory, or one evicted while they still pinned it),
    /// wherever they hash: their references keep the removed directory's
    /// dentry, and so its inode, alive, which on a disk filesystem keeps
    /// the inode allocated (Linux prunes them at rmdir,
    /// `shrink_dcache_parent`; this cache keeps no list of a directory's
    /// children to do that). The whole table, one bucket at a time:
    /// for a caller that needs the inodes back (a name operation that got
    /// ENOSPC, `namei::redo_counted_enospc`), not for a fast path. Returns
    /// how many were evicted.
    pub fn prune_dead_negatives(&self) -> usize {
        let mut evicted = 0;
        for i in 0..self.buckets.len() {
            evicted += self.sweep_bucket_with(i, usize::MAX, Victims::DeadParentNegative);
        }
        lockstat::add(Stat::DcacheReclaim, evicted as u64);
        evicted
    }

    fn sweep_bucket(&self, i: usize, max: usize, negative_only: bool, force: bool) -> usize {
        let which = match (force, negative_only) {
            (true, _) => Victims::Forced,
            (false, true) => Victims::Negative,
            (false, false) => Victims::Any,
        };
        self.sweep_bucket_with(i, max, which)
    }

    fn sweep_bucket_with(&self, i: usize, max: usize, which: Victims) -> usize {
        let force = which == Victims::Forced;
        let negative_only = matches!(which, Victims::Negative | Victims::DeadParentNegative);
        let dead_parent_only = which == Victims::DeadParentNegative;
        let guard = epoch::pin();
        let b = &self.buckets[i];
        // Relaxed: a peek; rechecked under the lock.
        if b.head.load(Ordering::Relaxed).is_null() {
            return 0;
        }
        let mut victims: Vec<*mut Dentry> = Vec::new();
        {
            let _l = b.lock.lock();
            let mut p = b.head.load(Ordering::Relaxed);
            while !p.is_null() && victims.len() < max {
                // SAFETY: alive while linked; lock held.
                let d = unsafe { &*p };
                let next = d.hot.next.load(Ordering::Relaxed);
                let f = d.flags();
                let eligible = (force || f & D_PINNED == 0)
                    && (!negative_only || d.is_negative())
                    && d.lockref().count() == 0
                    // SAFETY: the parent is kept alive by d's reference
                    // (d is linked; the bucket lock is held).
                    && (!dead_parent_only || !unsafe { &*d.parent_ptr() }.is_attached());
                if eligible {
                    // Recently used or not, a child of a removed directory
                    // goes at once (no lookup can reach it).
                    if f & D_REFERENCED != 0 && !force && !dead_parent_only {
                        d.clear_flag(D_REFERENCED);
                    } else {
                        let parent = d.parent_ptr();
                        // SAFETY: parent kept alive by d's reference.
                        let pd = unsafe { &*parent };
                        // Lock order puts the parent's map before the bucket
                        // lock, so here it is only tried; a busy directory's
                        // child is skipped this turn.
                        let map = if self.config.index == DcacheIndex::PerDir {
                            match pd.cold.children.try_write() {
                                Some(m) => Some(m),
                                None => {
                                    p = next;
                                    continue;
                                }
                            }
                        } else {
                            None
                        };
                        // A directory's dentry may be in use without a
                        // count: a name operation's parent (walk.rs,
                        // `ParentWalk`), safe from here once it holds the
                        // directory's lock shared. Killed only with that
                        // lock held exclusively, tried (a busy directory is
                        // skipped this turn).
                        let dir_lock = match d.inode() {
                            Some(i) if i.is_dir() => {
                                match i.dir_lock.try_write_as(Class::DirVictim) {
                                    Some(g) => Some(g),
                                    None => {
                                        p = next;
                                        continue;
                                    }
                                }
                            }
                            _ => None,
                        };
                        let lr = d.lockref();
                        lr.lock();
                        if lr.count() == 0 {
                            lr.mark_dead_locked();
                            lr.unlock();
                            if let Some(mut m) = map {
                                m.remove(&d.name_vec()[..]);
                            }
                            self.unhash_locked(b, d, None);
                            victims.push(p);
                        } else {
                            lr.unlock();
                        }
                        drop(dir_lock);
                    }
                }
                p = next;
            }
        }
        drop(guard);
        let mut n = victims.len();
        for v in victims {
            // SAFETY: v is dead, unhashed and owned by us now.
            let parent = unsafe { (*v).parent_ptr() } as *mut Dentry;
            free_dentry(v);
            // The evicted child's reference on its parent.
            if force {
                n += self.put_parent_evicting(parent);
            } else {
                put_parent(parent);
            }
        }
        n
    }

    /// Teardown (`shrink_all`): drop a dead child's reference on `parent`
    /// and, where it was the last one, evict the parent at once and go on
    /// with its own parent, as Linux's `dentry_kill` hands back the parent
    /// it unpinned. Without it a sweep of the whole table freed one level
    /// of a chain of directories (a tree 100,000 levels deep took 100,000
    /// sweeps: minutes). Returns how many parents were evicted. The same
    /// tried locks as `sweep_bucket`: a busy one leaves the parent cached
    /// for the next sweep.
    fn put_parent_evicting(&self, mut parent: *mut Dentry) -> usize {
        let mut n = 0;
        loop {
            // SAFETY: we hold the dead child's count on `parent`.
            let d = unsafe { &*parent };
            let grand = d.parent_ptr() as *mut Dentry;
            if !self.evict_last_ref(d) {
                put_parent(parent);
                return n;
            }
            free_dentry(parent);
            n += 1;
            if ptr::eq(grand, parent) {
                return n;
            }
            parent = grand;
        }
    }

    /// Evict `d` if the caller's count is its only one and it is hashed;
    /// the count goes with it (the caller then frees `d`, and owns `d`'s
    /// reference on its parent). `false`: nothing changed.
    fn evict_last_ref(&self, d: &Dentry) -> bool {
        let _guard = epoch::pin();
        if !d.is_hashed() || d.lockref().count() != 1 {
            return false;
        }
        // SAFETY: kept alive by d's reference on it.
        let pd = unsafe { &*d.parent_ptr() };
        // Lock order as in `sweep_bucket`: the parent's map (tried), the
        // bucket, the directory's lock (tried), the lockref.
        let map = if self.config.index == DcacheIndex::PerDir {
            match pd.cold.children.try_write() {
                Some(m) => Some(m),
                None => return false,
            }
        } else {
            None
        };
        // Relaxed: rechecked under the bucket's lock, which a move of `d`
        // holds while it changes the hash and the parent.
        let b = self.bucket(d.hot.hash.load(Ordering::Relaxed));
        let _l = b.lock.lock();
        if !d.is_hashed()
            || !ptr::eq(self.bucket(d.hot.hash.load(Ordering::Relaxed)), b)
            || !ptr::eq(d.parent_ptr(), pd)
        {
            return false;
        }
        let _dir_lock = match d.inode() {
            Some(i) if i.is_dir() => match i.dir_lock.try_write_as(Class::DirVictim) {
                Some(g) => Some(g),
                None => return false,
            },
            _ => None,
        };
        let lr = d.lockref();
        lr.lock();
        if lr.count() != 1 {
            lr.unlock();
            return false;
        }
        lr.mark_dead_locked();
        lr.unlock();
        if let Some(mut m) = map {
            m.remove(&d.name_vec()[..]);
        }
        self.unhash_locked(b, d, None);
        true
    }

    /// Run `f` with the rename lock held: no directory changes parent or
    /// name meanwhile (files may). `f` must not pin an epoch guard or take
    /// a dcache lock.
    pub(crate) fn with_rename_lock<R>(&self, f: impl FnOnce() -> R) -> R {
        let _r = self.rename.lock.lock();
        f()
    }

    /// Evict every unused dentry, pinned ones included (teardown).
    pub fn shrink_all(&self) {
        loop {
            // Spare references keep directories in use: take back the ones
            // on this cache's dentries (each pass: evicted children give
            // their references back to the spares of this thread).
            self.recall_own_spares();
            let before = self.len();
            let mut evicted = 0;
            for i in 0..self.buckets.len() {
                evicted += self.sweep_bucket(i, usize::MAX, false, true);
            }
            if evicted == 0 || self.len() >= before {
                break;
            }
        }
        self.recall_own_spares();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reference taken on a dentry found by a lookup (`try_get`) can be
    /// the last one, and the dentry is then freed through its pointer.
    /// Under Miri (Tree Borrows) this was undefined behaviour while
    /// `try_get` adopted a pointer cast from `&Dentry` (a read-only tag) and
    /// `hash_locked` linked such a pointer into the chain. Needs no memfs
    /// removal, so it runs under Miri's precise Tree Borrows mode.
    #[test]
    fn lookup_reference_can_be_the_last_and_free() {
        for index in [DcacheIndex::GlobalHash, DcacheIndex::PerDir] {
            let vfs = crate::Vfs::with_config(crate::VfsConfig {
                dcache: DcacheConfig {
                    index,
                    hash_bits: 4,
                    ..Default::default()
                },
                ..Default::default()
            });
            let root = vfs.root_path();
            let dc = vfs.dcache();
            let base = dc.len();
            for (i, name) in [&b"x"[..], b"a-name-longer-than-the-inline-32-bytes"]
                .into_iter()
                .enumerate()
            {
                let q = dc.qname(root.dentry.as_ptr(), name);
                // Cached at count 0 after this.
                drop(dc.add(&root.dentry, &q, None));
                assert_eq!(dc.len(), base + 1);
                let r = if i == 0 {
                    let g = epoch::pin();
                    let RcuLookup::Hit(p) = dc.lookup_rcu(&root.dentry, &q, &g) else {
                        panic!("cached dentry not found");
                    };
                    DentryRef::try_get(p).expect("not dead")
                } else {
                    dc.lookup_ref(&root.dentry, &q).expect("cached")
                };
                assert_eq!(r.name_vec(), name);
                dc.unhash(&r);
                assert!(dc.lookup_ref(&root.dentry, &q).is_none());
                // The last reference: kills the dentry, frees it after the
                // grace period through the pointer the lookup adopted.
                drop(r);
                assert_eq!(dc.len(), base);
                vfs.flush_deferred();
            }
        }
    }

    /// The walk's one-pass scanner and the plain hash agree on every split.
    #[test]
    fn scan_component_matches_qname() {
        let dc = Dcache::new(DcacheConfig {
            hash_bits: 4,
            ..Default::default()
        });
        // An address only (never dereferenced), without provenance.
        let parent = ptr::null::<Dentry>().wrapping_byte_add(0x1234_5678);
        let names: Vec<Vec<u8>> = (0..70)
            // Under Miri only the lengths around word boundaries.
            .filter(|n| !cfg!(miri) || matches!(n % 8, 0 | 1 | 7))
            .map(|n| (0..n).map(|i| b'a' + ((i * 7 + n) % 26) as u8).collect())
            .collect();
        for name in &names {
            for suffix in [&b""[..], b"/", b"//x", b"/abcdefghijkl"] {
                for prefix in [&b""[..], b"/", b"xy/"] {
                    let mut path = prefix.to_vec();
                    let start = path.len();
                    path.extend_from_slice(name);
                    path.extend_from_slice(suffix);
                    if name.is_empty() {
                        continue;
                    }
                    let (end, hash, words) = dc.scan_component(parent, &path, start);
                    assert_eq!(end, start + name.len());
                    let q = QName::from_parts(&path[start..end], hash, words);
                    let r = dc.qname(parent, name);
                    assert_eq!(q.bytes, &name[..]);
                    assert_eq!(q.hash, r.hash, "{:?}", String::from_utf8_lossy(&path));
                    assert_eq!(q.words, r.words);
                    let fast = dc.rcu_keys().unwrap().scan_fast(parent, &path, start);
                    if name.len() <= INLINE_NAME && name != b"." && name != b".." {
                        assert_eq!(fast, Some((end, r.hash, r.words[0])));
                    } else {
                        assert_eq!(fast, None);
                    }
                }
            }
        }
    }
}
