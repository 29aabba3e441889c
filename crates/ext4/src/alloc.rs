//! Block and inode allocation of a read-write mount.
//!
//! DESIGN
//! - Per block group: each group's descriptor (free counts, flags, bitmap
//!   checksums) lives behind its own lock (`Class::Ext4Group`); there is
//!   no allocator-wide lock. The bitmaps themselves are blocks in the
//!   [`BufCache`], changed under the group's lock.
//! - Threads spread over groups: an allocation with no goal starts at a
//!   group picked from the calling thread's number (Orlov-lite: a new
//!   directory's inode goes to a thread-chosen group, a file's inode and
//!   blocks near its parent's or its own group), then walks the groups in
//!   order, skipping full ones without taking their lock. The thread's
//!   group is its number with the bits reversed, scaled to the group
//!   count (`spread`): threads 0, 1, 2, 3 start at 0, 1/2, 1/4, 3/4 of
//!   the groups, so any two threads numbered 2k and 2k + 1 start half the
//!   groups apart and a thread whose group fills walks on into groups no
//!   other thread started in. (It was `7 * number mod groups`: with 8
//!   groups thread k + 1 started right below thread k, so a thread that
//!   filled its group spilled into its neighbour's, and from then on the
//!   two shared a group lock, its bitmaps and its inode table blocks.)
//! - The group locks and the free-count mirrors are one cache line each:
//!   side by side, two threads in neighbouring groups wrote the same line
//!   at every allocation.
//! - Bitmap checksums (metadata_csum) are computed when a changed
//!   group's descriptor is encoded (`write_descs`: once per group and
//!   commit, under the group's lock), not at every allocation.
//! - Free counts: the group descriptors are the exact counts; a lock-free
//!   per-group mirror (`free_blocks`, `free_inodes`) lets a search skip
//!   full groups and `statfs` sum without locks. The superblock's totals
//!   are the sums, folded in at writeback.
//! - `BLOCK_UNINIT`/`INODE_UNINIT` groups are initialised on first use
//!   (the bitmap built from the group's layout and checked against the
//!   descriptor's free count before anything is taken from it), the flag
//!   cleared; inode table blocks past `bg_itable_unused` are zeroed before
//!   use unless the group is `ITABLE_ZEROED`.
//! - Reserved blocks: only a caller that may use them (`root`) allocates
//!   the last `s_r_blocks_count` blocks. Exact at the limit: every
//!   allocation first counts a block in `claimed` (blocks claimed since
//!   mount, less those freed), a per-thread reservation counter (the
//!   core's `percpu::LimitedCounter`: a thread takes units from its own
//!   slot and touches the shared total once per batch; near the limit it
//!   takes every slot's reservation back, so nothing is granted past it),
//!   and gives it back if no group has the block.
//! - Blocks freed by a commit are held until that commit is durable
//!   (`free_block_held`, `set_durable`): the bitmap in the transaction
//!   shows them free, but the allocator skips them until then. Otherwise
//!   a handle of the next transaction could take one and write its data
//!   home (ordered data goes home before the handle ends) while the
//!   transaction that freed it may still be lost in a crash, which would
//!   leave the old owner pointing at the new owner's bytes (ext4 keeps such
//!   blocks out of its buddy cache until the commit callback, for the same
//!   reason). The held blocks are kept with their group, under its lock,
//!   as runs (a file's blocks freed in order are one entry); a group's
//!   runs of durable commits go at its next allocation or free. So a group
//!   holds at most the runs of its last freeing commit plus those of
//!   commits not yet durable, not one entry per block ever freed.

use std::cell::Cell;

use crossbeam_utils::CachePadded;
use scalevfs::percpu::LimitedCounter;
use scalevfs_sync::ordered::{Class, Mutex};
use scalevfs_sync::primitive::{AtomicU32, AtomicU64, Ordering};

use crate::bufcache::BufCache;
use crate::device::BlockDevice;
use crate::error::{corrupt, Error, Result};
use crate::format::group_desc::{
    self, GroupDesc, BG_BLOCK_UNINIT, BG_INODE_UNINIT, BG_INODE_ZEROED,
};
use crate::format::superblock::Superblock;

/// What the allocator reads and writes through.
pub struct Io<'a> {
    pub sb: &'a Superblock,
    pub dev: &'a dyn BlockDevice,
    pub bufs: &'a BufCache,
}

/// Out of space (blocks or inodes).
pub fn enospc() -> Error {
    Error::Io(std::io::Error::from_raw_os_error(libc::ENOSPC))
}

/// A group's descriptor and the blocks of it held back from allocation
/// until the commit that freed them is durable.
#[derive(Clone)]
struct GroupState {
    gd: GroupDesc,
    /// In the order they were freed, which is commit order (a commit's
    /// frees run before the next commit's handles start).
    held: std::collections::VecDeque<HeldRun>,
    /// The blocks in `held`.
    held_blocks: u32,
}

/// Blocks `start..start + len` of a group, freed by commit `commit`.
#[derive(Clone, Copy, Debug)]
struct HeldRun {
    commit: u64,
    start: u32,
    len: u32,
}

impl HeldRun {
    fn bits(self) -> std::ops::Range<usize> {
        self.start as usize..self.start as usize + self.len as usize
    }
}

impl GroupState {
    /// Drop the runs of commits up to `durable`; how many blocks they held.
    fn prune(&mut self, durable: u64) -> u32 {
        let before = self.held_blocks;
        self.held.retain(|r| r.commit > durable);
        self.held_blocks = self.held.iter().map(|r| r.len).sum();
        before - self.held_blocks
    }

    /// `prune` of the oldest runs only, as far as they are durable: what a
    /// free does, in time independent of how many runs are held (they are
    /// in commit order; `prune`, at the next allocation here, catches any
    /// that are not).
    fn prune_front(&mut self, durable: u64) -> u32 {
        let mut gone = 0;
        while let Some(r) = self.held.front() {
            if r.commit > durable {
                break;
            }
            gone += r.len;
            self.held.pop_front();
        }
        self.held_blocks -= gone;
        gone
    }

    /// Hold bit `i` for commit `commit`: the last run grows when `i` is
    /// next to it, else a new run starts.
    fn hold(&mut self, commit: u64, i: u32) {
        self.held_blocks += 1;
        if let Some(r) = self.held.back_mut() {
            if r.commit == commit && r.start.checked_add(r.len) == Some(i) {
                r.len += 1;
                return;
            }
            if r.commit == commit && i.checked_add(1) == Some(r.start) {
                r.start = i;
                r.len += 1;
                return;
            }
        }
        self.held.push_back(HeldRun {
            commit,
            start: i,
            len: 1,
        });
    }
}

impl std::ops::Deref for GroupState {
    type Target = GroupDesc;
    fn deref(&self) -> &GroupDesc {
        &self.gd
    }
}

impl std::ops::DerefMut for GroupState {
    fn deref_mut(&mut self) -> &mut GroupDesc {
        &mut self.gd
    }
}

/// The allocator (see the module comment).
pub struct Alloc {
    groups: Vec<CachePadded<Mutex<GroupState>>>,
    /// The last commit known durable: blocks held by it and earlier are
    /// free for use.
    durable: AtomicU64,
    /// Held blocks in all groups (a hint for the ENOSPC retry).
    held: AtomicU64,
    /// One bit per group whose descriptor changed since `write_descs` last
    /// encoded it: a commit re-encodes (and logs) only those, not every
    /// descriptor of the image.
    dirty: Box<[AtomicU64]>,
    free_blocks: Vec<CachePadded<AtomicU32>>,
    free_inodes: Vec<CachePadded<AtomicU32>>,
    /// Blocks claimed since mount, less those freed (see the module doc).
    claimed: LimitedCounter,
    /// Free blocks at mount: the limit of `claimed` is this less the
    /// reserve.
    free_at_mount: u64,
}

impl std::fmt::Debug for Alloc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Alloc")
            .field("groups", &self.groups.len())
            .finish()
    }
}

static THREADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
thread_local! {
    static THREAD_NO: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// This thread's number (assigned at first use).
fn thread_no() -> usize {
    THREAD_NO.with(|c| {
        if c.get() == usize::MAX {
            // Relaxed: only uniqueness of the number matters.
            c.set(THREADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        }
        c.get()
    })
}

/// Thread number `n`'s starting group among `ng`: `n`'s low bits reversed
/// (a van der Corput sequence: 0, 1/2, 1/4, 3/4, 1/8, ...) scaled to `ng`,
/// so that the first `2^k` threads start as far apart as `ng` allows.
pub fn spread(n: usize, ng: usize) -> usize {
    if ng <= 1 {
        return 0;
    }
    let bits = ng.next_power_of_two().trailing_zeros();
    let r = (n as u64).reverse_bits() >> (64 - bits);
    // r < 2^bits; scaled down to 0..ng (exact for a power of two).
    ((r as u128 * ng as u128) >> bits) as usize
}

fn test_bit(b: &[u8], i: usize) -> bool {
    b[i / 8] & (1 << (i % 8)) != 0
}
fn set_bit(b: &mut [u8], i: usize) {
    b[i / 8] |= 1 << (i % 8);
}
fn clear_bit(b: &mut [u8], i: usize) {
    b[i / 8] &= !(1 << (i % 8));
}

/// First clear bit in `b[..n]` at or after `from`, wrapping around.
fn find_zero(b: &[u8], n: usize, from: usize) -> Option<usize> {
    let from = if from < n { from } else { 0 };
    first_zero_in(b, from, n).or_else(|| first_zero_in(b, 0, from))
}

/// First clear bit in bits `lo..hi` of `b` (`hi <= 8 * b.len()`): a word
/// (64 bits) at a time where it can, so a mostly full bitmap costs a few
/// hundred loads, not a test per bit (a create in a group with 30,000 used
/// blocks scanned them one by one).
fn first_zero_in(b: &[u8], lo: usize, hi: usize) -> Option<usize> {
    let hi = hi.min(b.len() * 8);
    let mut i = lo;
    while i < hi && !i.is_multiple_of(8) {
        if !test_bit(b, i) {
            return Some(i);
        }
        i += 1;
    }
    while i + 64 <= hi {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i / 8..i / 8 + 8]);
        let w = u64::from_le_bytes(w);
        if w != u64::MAX {
            return Some(i + (!w).trailing_zeros() as usize);
        }
        i += 64;
    }
    while i < hi {
        if !test_bit(b, i) {
            return Some(i);
        }
        i += 1;
    }
    None
}

impl Alloc {
    pub fn new(groups: &[GroupDesc]) -> Alloc {
        Alloc {
            free_blocks: groups
                .iter()
                .map(|g| CachePadded::new(AtomicU32::new(g.free_blocks_count)))
                .collect(),
            free_inodes: groups
                .iter()
                .map(|g| CachePadded::new(AtomicU32::new(g.free_inodes_count)))
                .collect(),
            claimed: LimitedCounter::default(),
            dirty: (0..groups.len().div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            free_at_mount: groups.iter().map(|g| u64::from(g.free_blocks_count)).sum(),
            groups: groups
                .iter()
                .map(|g| {
                    CachePadded::new(Mutex::new(
                        Class::Ext4Group,
                        GroupState {
                            gd: g.clone(),
                            held: Default::default(),
                            held_blocks: 0,
                        },
                    ))
                })
                .collect(),
            durable: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// True with no groups (never for a mounted filesystem).
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Free blocks, summed without locks.
    pub fn free_blocks(&self) -> u64 {
        // Relaxed: a statistic; each slot is exact under its group lock.
        self.free_blocks
            .iter()
            .map(|a| u64::from(a.load(Ordering::Relaxed)))
            .sum()
    }

    /// Free inodes, summed without locks.
    pub fn free_inodes(&self) -> u64 {
        // Relaxed: as free_blocks.
        self.free_inodes
            .iter()
            .map(|a| u64::from(a.load(Ordering::Relaxed)))
            .sum()
    }

    /// A copy of group `g`'s descriptor.
    pub fn desc(&self, g: usize) -> GroupDesc {
        self.groups[g].lock().gd.clone()
    }

    /// The group of block `blk` (tests).
    #[cfg(test)]
    pub(crate) fn group_of(&self, io: &Io, blk: u64) -> usize {
        ((blk - u64::from(io.sb.first_data_block)) / u64::from(io.sb.blocks_per_group)) as usize
    }

    /// Group `g`'s held runs and blocks (tests).
    #[cfg(test)]
    pub(crate) fn held_runs(&self, g: usize) -> (usize, u32) {
        let gs = self.groups[g].lock();
        (gs.held.len(), gs.held_blocks)
    }

    /// Commit `n` is durable: the blocks it freed may be used again.
    pub fn set_durable(&self, n: u64) {
        // Release: pairs with the Acquire in `alloc_block_claimed`, which
        // then uses a block freed by a commit whose flushes came before.
        self.durable.fetch_max(n, Ordering::Release);
    }

    /// The last commit known durable (`set_durable`).
    pub(crate) fn durable(&self) -> u64 {
        // Acquire: pairs with `set_durable`'s Release: a block freed by a
        // commit up to this one is used after that commit's flushes.
        self.durable.load(Ordering::Acquire)
    }

    /// Whether blocks freed by a commit not yet durable are held back
    /// (an allocation that failed may succeed after the next commit).
    pub fn holds_blocks(&self) -> bool {
        // Relaxed: a hint for a retry after a commit.
        self.held.load(Ordering::Relaxed) != 0
    }

    /// The group a thread with no goal starts at (see the module comment).
    pub fn thread_group(&self) -> usize {
        spread(thread_no(), self.groups.len())
    }

    fn group_first_block(sb: &Superblock, g: usize) -> u64 {
        u64::from(sb.first_data_block) + g as u64 * u64::from(sb.blocks_per_group)
    }

    fn group_nblocks(sb: &Superblock, g: usize) -> usize {
        let first = Self::group_first_block(sb, g);
        (sb.blocks_count - first).min(u64::from(sb.blocks_per_group)) as usize
    }

    /// Build the block bitmap of a BLOCK_UNINIT group (as the kernel's
    /// `ext4_init_block_bitmap`) and check it against the free count.
    fn init_block_bitmap(io: &Io, g: usize, gd: &GroupDesc, b: &mut [u8]) -> Result<()> {
        let sb = io.sb;
        let what = || format!("group {g} (BLOCK_UNINIT)");
        b.fill(0);
        let first = Self::group_first_block(sb, g);
        let n = Self::group_nblocks(sb, g);
        // The superblock copy and descriptor blocks (with meta_bg, the meta
        // group's own descriptor block, which groups without a superblock
        // copy hold too).
        let meta = usize::try_from(sb.base_meta_blocks(g as u64)).unwrap_or(usize::MAX);
        for i in 0..meta.min(n) {
            set_bit(b, i);
        }
        let itb = group_desc::inode_table_blocks(sb);
        let mut own = vec![gd.block_bitmap, gd.inode_bitmap];
        own.extend((0..itb).map(|i| gd.inode_table + i));
        for blk in own {
            if blk >= first && blk < first + n as u64 {
                set_bit(b, (blk - first) as usize);
            }
        }
        for i in n..b.len() * 8 {
            set_bit(b, i);
        }
        let free = (0..n).filter(|&i| !test_bit(b, i)).count();
        if free != gd.free_blocks_count as usize {
            return Err(corrupt(
                what(),
                format!(
                    "{free} free blocks in its layout, the descriptor says {}",
                    gd.free_blocks_count
                ),
            ));
        }
        Ok(())
    }

    /// Take one block, preferably in group `goal_group` near `goal`
    /// (a block number, 0 for none), leaving at least `keep` free
    /// (the reserves the caller may not use: `Ext4::alloc_block`).
    pub fn alloc_block(&self, io: &Io, goal: u64, keep: u64) -> Result<u64> {
        // Signed: a filesystem mounted with less free than the reserve
        // (`keep`) has a limit below 0, and after frees the count is below
        // 0 too; a saturated limit of 0 would let a non-root caller take
        // what root freed while the free space is still inside the reserve.
        let limit = i64::try_from(self.free_at_mount)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(keep).unwrap_or(i64::MAX));
        if !self.claimed.try_inc_signed(limit) {
            return Err(enospc());
        }
        let r = self.alloc_block_claimed(io, goal);
        if r.is_err() {
            self.claimed.dec();
        }
        r
    }

    fn alloc_block_claimed(&self, io: &Io, goal: u64) -> Result<u64> {
        let sb = io.sb;
        let ng = self.groups.len();
        let (start, goal_off) = if goal >= u64::from(sb.first_data_block) && goal < sb.blocks_count
        {
            let rel = goal - u64::from(sb.first_data_block);
            let bpg = u64::from(sb.blocks_per_group);
            ((rel / bpg) as usize, (rel % bpg) as usize)
        } else {
            (self.thread_group(), 0)
        };
        for k in 0..ng {
            let g = (start + k) % ng;
            // Relaxed: a hint; rechecked under the lock.
            if self.free_blocks[g].load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut gd = self.groups[g].lock();
            if gd.free_blocks_count == 0 {
                continue;
            }
            if !gd.held.is_empty() {
                let gone = gd.prune(self.durable());
                // Relaxed: see `holds_blocks`.
                self.held.fetch_sub(u64::from(gone), Ordering::Relaxed);
                if gd.held_blocks >= gd.free_blocks_count {
                    continue;
                }
            }
            self.mark(g);
            let uninit = gd.flags & BG_BLOCK_UNINIT != 0;
            let n = Self::group_nblocks(sb, g);
            let from = if k == 0 { goal_off } else { 0 };
            // Build an uninitialised group's bitmap before caching anything,
            // so a failed check leaves nothing dirty.
            let mut fresh = Vec::new();
            if uninit {
                fresh = vec![0u8; sb.block_size()];
                Self::init_block_bitmap(io, g, &gd, &mut fresh)?;
            }
            let held = &gd.held;
            let found = io.bufs.modify(io.dev, gd.block_bitmap, !uninit, |b| {
                if uninit {
                    b.copy_from_slice(&fresh);
                }
                // Held blocks look used to the search: set for it, cleared
                // again before anyone else sees the block (this closure
                // has it alone).
                for i in held.iter().flat_map(|r| r.bits()) {
                    set_bit(b, i);
                }
                let bit = find_zero(b, n, from);
                for i in held.iter().flat_map(|r| r.bits()) {
                    clear_bit(b, i);
                }
                if let Some(i) = bit {
                    set_bit(b, i);
                }
                bit
            })?;
            let bit = found;
            gd.flags &= !BG_BLOCK_UNINIT;
            let Some(i) = bit else {
                return Err(corrupt(
                    format!("group {g}"),
                    format!("{} free blocks but a full bitmap", gd.free_blocks_count),
                ));
            };
            gd.free_blocks_count -= 1;
            // Relaxed: mirror of the count just changed under the lock.
            self.free_blocks[g].store(gd.free_blocks_count, Ordering::Relaxed);
            return Ok(Self::group_first_block(sb, g) + i as u64);
        }
        Err(enospc())
    }

    /// Return block `blk` to its group.
    pub fn free_block(&self, io: &Io, blk: u64) -> Result<()> {
        self.free_block_held(io, blk, 0)
    }

    /// Free `blk` in the bitmap of commit `commit` (0: at once), holding
    /// it back from allocation until that commit is durable.
    pub fn free_block_held(&self, io: &Io, blk: u64, commit: u64) -> Result<()> {
        let sb = io.sb;
        if blk < u64::from(sb.first_data_block) || blk >= sb.blocks_count {
            return Err(corrupt(
                format!("block {blk}"),
                "freeing a block outside the fs",
            ));
        }
        let rel = blk - u64::from(sb.first_data_block);
        let g = (rel / u64::from(sb.blocks_per_group)) as usize;
        let i = (rel % u64::from(sb.blocks_per_group)) as usize;
        io.bufs.forget(blk);
        let mut gd = self.groups[g].lock();
        self.mark(g);
        if gd.flags & BG_BLOCK_UNINIT != 0 {
            return Err(corrupt(
                format!("block {blk}"),
                "freeing a block of an uninitialised group",
            ));
        }
        let was = io.bufs.modify(io.dev, gd.block_bitmap, true, |b| {
            let was = test_bit(b, i);
            clear_bit(b, i);
            was
        })?;
        if !was {
            return Err(corrupt(format!("block {blk}"), "freeing a free block"));
        }
        gd.free_blocks_count += 1;
        // Relaxed: mirror of the count just changed under the lock.
        self.free_blocks[g].store(gd.free_blocks_count, Ordering::Relaxed);
        // Relaxed: a hint (`durable` orders the use of the block).
        let durable = self.durable.load(Ordering::Relaxed);
        if !gd.held.is_empty() {
            let gone = gd.prune_front(durable);
            // Relaxed: see `holds_blocks`.
            self.held.fetch_sub(u64::from(gone), Ordering::Relaxed);
        }
        if commit > durable {
            gd.hold(commit, i as u32);
            self.held.fetch_add(1, Ordering::Relaxed);
        }
        self.claimed.dec();
        Ok(())
    }

    /// Take an inode number, preferably in group `goal_group` (`None`:
    /// the thread's group). The inode's on-disk slot is zeroed if the group
    /// never used it.
    /// Whether inode `ino` is marked in use in its group's bitmap (false
    /// for a group still INODE_UNINIT). Reads only.
    pub fn inode_in_use(&self, io: &Io, ino: u32) -> Result<bool> {
        let ipg = io.sb.inodes_per_group.max(1);
        if ino == 0 || ino > io.sb.inodes_count {
            return Ok(false);
        }
        let g = ((ino - 1) / ipg) as usize;
        let i = ((ino - 1) % ipg) as usize;
        let Some(m) = self.groups.get(g) else {
            return Ok(false);
        };
        let gd = m.lock().clone();
        if gd.flags & BG_INODE_UNINIT != 0 {
            return Ok(false);
        }
        let mut b = crate::util::BlockBuf::zeroed(io.sb.block_size());
        io.bufs.read(io.dev, gd.inode_bitmap, &mut b)?;
        Ok(test_bit(&b, i))
    }

    pub fn alloc_inode(&self, io: &Io, goal_group: Option<usize>, dir: bool) -> Result<u32> {
        let sb = io.sb;
        let ipg = sb.inodes_per_group as usize;
        let ng = self.groups.len();
        let start = goal_group
            .filter(|&g| g < ng)
            .unwrap_or_else(|| self.thread_group());
        for k in 0..ng {
            let g = (start + k) % ng;
            // Relaxed: a hint; rechecked under the lock.
            if self.free_inodes[g].load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut gd = self.groups[g].lock();
            if gd.free_inodes_count == 0 {
                continue;
            }
            self.mark(g);
            let uninit = gd.flags & BG_INODE_UNINIT != 0;
            if uninit && gd.free_inodes_count as usize != ipg {
                return Err(corrupt(
                    format!("group {g}"),
                    "INODE_UNINIT with inodes in use",
                ));
            }
            // Lowest free slot: keeps the used part of the table contiguous.
            let bit = io.bufs.modify(io.dev, gd.inode_bitmap, !uninit, |b| {
                if uninit {
                    b.fill(0);
                    for i in ipg..b.len() * 8 {
                        set_bit(b, i);
                    }
                }
                let bit = find_zero(b, ipg, 0);
                if let Some(i) = bit {
                    set_bit(b, i);
                }
                bit
            })?;
            gd.flags &= !BG_INODE_UNINIT;
            let Some(i) = bit else {
                return Err(corrupt(
                    format!("group {g}"),
                    format!("{} free inodes but a full bitmap", gd.free_inodes_count),
                ));
            };
            let ino = (g * ipg + i + 1) as u32;
            if ino < sb.first_ino() {
                return Err(corrupt(format!("group {g}"), "reserved inode marked free"));
            }
            let used = ipg - (gd.itable_unused as usize).min(ipg);
            if i >= used {
                if gd.flags & BG_INODE_ZEROED == 0 {
                    if let Err(e) = Self::zero_inodes(io, &gd, used, i + 1) {
                        // The slot goes back (its bit was set above, its
                        // count not taken yet; the descriptor copy is not
                        // stored): a bit set with the count unchanged is
                        // what e2fsck calls bitmap differences (review,
                        // stop 47).
                        let _ = io
                            .bufs
                            .modify(io.dev, gd.inode_bitmap, true, |b| clear_bit(b, i));
                        return Err(e);
                    }
                }
                gd.itable_unused = (ipg - i - 1) as u32;
            }
            gd.free_inodes_count -= 1;
            if dir {
                gd.used_dirs_count += 1;
            }
            // Relaxed: mirror of the count just changed under the lock.
            self.free_inodes[g].store(gd.free_inodes_count, Ordering::Relaxed);
            return Ok(ino);
        }
        Err(enospc())
    }

    /// Zero inode slots `from..to` of a group's table.
    fn zero_inodes(io: &Io, gd: &GroupDesc, from: usize, to: usize) -> Result<()> {
        let isz = io.sb.inode_size();
        let bs = io.sb.block_size();
        let mut i = from;
        while i < to {
            let off = i * isz;
            let blk = gd.inode_table + (off / bs) as u64;
            let inb = off % bs;
            let n = ((bs - inb) / isz).min(to - i);
            io.bufs
                .modify(io.dev, blk, true, |b| b[inb..inb + n * isz].fill(0))?;
            i += n;
        }
        Ok(())
    }

    /// Return inode `ino` to its group.
    pub fn free_inode(&self, io: &Io, ino: u32, dir: bool) -> Result<()> {
        let sb = io.sb;
        if ino < sb.first_ino() || ino > sb.inodes_count {
            return Err(corrupt(format!("inode {ino}"), "freeing a reserved inode"));
        }
        let ipg = sb.inodes_per_group as usize;
        let g = (ino as usize - 1) / ipg;
        let i = (ino as usize - 1) % ipg;
        let mut gd = self.groups[g].lock();
        self.mark(g);
        if gd.flags & BG_INODE_UNINIT != 0 {
            return Err(corrupt(
                format!("inode {ino}"),
                "freeing an inode of an uninitialised group",
            ));
        }
        let was = io.bufs.modify(io.dev, gd.inode_bitmap, true, |b| {
            let was = test_bit(b, i);
            clear_bit(b, i);
            was
        })?;
        if !was {
            return Err(corrupt(format!("inode {ino}"), "freeing a free inode"));
        }
        gd.free_inodes_count += 1;
        if dir {
            gd.used_dirs_count = gd.used_dirs_count.saturating_sub(1);
        }
        // Relaxed: mirror of the count just changed under the lock.
        self.free_inodes[g].store(gd.free_inodes_count, Ordering::Relaxed);
        Ok(())
    }

    /// Note that group `g`'s descriptor is about to change (called with
    /// its lock held, before `write_descs` could read it).
    fn mark(&self, g: usize) {
        let (w, bit) = (&self.dirty[g / 64], 1u64 << (g % 64));
        // Relaxed: the bit only has to be seen by the next commit, which
        // runs after every handle that changed the group has left (the
        // journal gate orders that); a group changed outside a handle is
        // written by a later commit (the bit stays set until a commit clears
        // it, before reading the descriptor). Loaded first: the word is
        // shared by 64 groups, so it is written once per commit, not once
        // per allocation.
        if w.load(Ordering::Relaxed) & bit == 0 {
            w.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Write the group descriptors that changed since the last call (every
    /// one with `all`) into their table blocks (through the cache), with
    /// their checksums.
    pub fn write_descs(&self, io: &Io, gdt_block: impl Fn(u64) -> u64, all: bool) -> Result<()> {
        let dsz = usize::from(io.sb.desc_size());
        let per_block = (io.sb.block_size() / dsz) as u64;
        for (wi, w) in self.dirty.iter().enumerate() {
            // Relaxed: see `mark`. Cleared before the descriptors are read, so
            // a change after the read marks its group again.
            let mut bits = w.swap(0, Ordering::Relaxed);
            if all {
                bits = u64::MAX;
            }
            while bits != 0 {
                let g = wi * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let Some(m) = self.groups.get(g) else { break };
                self.write_desc(io, &gdt_block, per_block, dsz, g, m)?;
            }
        }
        Ok(())
    }

    fn write_desc(
        &self,
        io: &Io,
        gdt_block: &impl Fn(u64) -> u64,
        per_block: u64,
        dsz: usize,
        g: usize,
        m: &CachePadded<Mutex<GroupState>>,
    ) -> Result<()> {
        {
            // The bitmaps' checksums are computed here, once per changed
            // group and commit, not at every allocation (a crc32c of a
            // whole bitmap block per block allocated was 5 % of a create
            // workload): under the group lock, which every bitmap change
            // holds, so the bitmap read is the one the descriptor goes with.
            let gd = {
                let mut gd = m.lock();
                let mut b = crate::util::BlockBuf::zeroed(io.sb.block_size());
                if gd.flags & BG_BLOCK_UNINIT == 0 {
                    io.bufs.read(io.dev, gd.block_bitmap, &mut b)?;
                    gd.block_bitmap_csum = group_desc::block_bitmap_csum(io.sb, &b);
                }
                if gd.flags & BG_INODE_UNINIT == 0 {
                    io.bufs.read(io.dev, gd.inode_bitmap, &mut b)?;
                    gd.inode_bitmap_csum = group_desc::inode_bitmap_csum(io.sb, &b);
                }
                gd.clone()
            };
            let g = g as u64;
            let blk = gdt_block(g / per_block);
            let off = (g % per_block) as usize * dsz;
            io.bufs.modify(io.dev, blk, true, |b| {
                group_desc::encode(io.sb, g, &gd, &mut b[off..off + dsz])
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod find_zero_tests {
    use super::*;

    /// Threads start in distinct groups while there are groups enough, the
    /// first two half the groups apart, and every start is a group.
    #[test]
    fn spread_puts_threads_far_apart() {
        assert_eq!(
            (0..8).map(|n| spread(n, 8)).collect::<Vec<_>>(),
            [0, 4, 2, 6, 1, 5, 3, 7]
        );
        for ng in 1..70usize {
            for n in 0..200usize {
                assert!(spread(n, ng) < ng, "n {n} ng {ng}");
            }
            // Any 2k and 2k + 1 start at least half the groups apart.
            for k in 0..50usize {
                let (a, b) = (spread(2 * k, ng), spread(2 * k + 1, ng));
                assert!(a.abs_diff(b) >= ng / 2, "k {k} ng {ng}: {a} {b}");
            }
            // The first min(ng, power of two) threads all differ.
            let p = if ng.is_power_of_two() {
                ng
            } else {
                ng.next_power_of_two() / 2
            };
            let firsts: std::collections::HashSet<_> = (0..p).map(|n| spread(n, ng)).collect();
            assert_eq!(firsts.len(), p, "ng {ng}");
        }
    }

    /// The word-at-a-time search finds what a test of every bit finds.
    #[test]
    fn find_zero_matches_a_bit_by_bit_search() {
        let naive = |b: &[u8], n: usize, from: usize| {
            let from = if from < n { from } else { 0 };
            (from..n).chain(0..from).find(|&i| !test_bit(b, i))
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2000 {
            let len = (next() % 80) as usize + 1;
            let full = next() % 4;
            let b: Vec<u8> = (0..len)
                .map(|_| {
                    if next() % 8 < full * 2 + 1 {
                        0xff
                    } else {
                        next() as u8
                    }
                })
                .collect();
            let n = (next() as usize) % (len * 8 + 1);
            let from = (next() as usize) % (len * 8 + 2);
            assert_eq!(
                find_zero(&b, n, from),
                naive(&b, n, from),
                "len {len} n {n} from {from}"
            );
        }
        let all = vec![0xffu8; 512];
        assert_eq!(find_zero(&all, 4096, 100), None);
        let mut one = all.clone();
        clear_bit(&mut one, 77);
        assert_eq!(find_zero(&one, 4096, 100), Some(77));
        assert_eq!(find_zero(&one, 4096, 0), Some(77));
    }
}
