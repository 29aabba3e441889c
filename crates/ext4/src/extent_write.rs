//! File data on a read-write mount: write (allocating blocks, merging with
//! the neighbouring extent when contiguous), truncate (shrink frees data
//! and zeroes the partial last block; grow leaves a hole), punch hole, and
//! fallocate's other modes: allocate (unwritten extents), ZERO_RANGE
//! (whole blocks turned unwritten in place), COLLAPSE_RANGE and
//! INSERT_RANGE (every later extent shifted in the list, then the tree
//! rewritten: any depth, one handle, so one transaction; a tree too large
//! for that is shifted in place a leaf per handle, `shift_step`; see
//! "Size" for what runs as several).
//!
//! DESIGN
//! - A change works on the file's whole extent list: the tree is read
//!   into a sorted `Vec<Extent>`, the list changed, and — when it changed —
//!   the tree written again from it: in the inode while it holds four
//!   extents, else leaves of `entries_per_block` extents under index
//!   levels (depth up to 5), each block with its checksum tail. New tree
//!   blocks are allocated before the old ones are freed, so a failure
//!   leaves the old tree intact. Cost is linear in the extent count per
//!   changing call, except for writes: a write inside one leaf of a
//!   deeper tree reads only the path to that leaf (`leaf_window`) and changes
//!   only that path: the leaf in place when its extents still fit and its
//!   first block stays (so no key above changes); else the leaf splits,
//!   and every index node above it that overflows, up to the root, which
//!   grows a level (`split_path`, the kernel's ext4_ext_insert_extent),
//!   with the keys above corrected. Inside the leaf only the window of
//!   entries the change can touch is decoded (`leaf_window`) and, where
//!   the leaf keeps its first block and room (and a header with the usual
//!   `eh_max`), spliced back in place
//!   (`extent::splice_leaf`). So a write costs O(depth) tree blocks
//!   however many extents the file has; a write that goes past its leaf
//!   ends there, and the caller writes the rest in a new handle. The
//!   same leaf-by-leaf change serves fallocate and ZERO_RANGE (a leaf
//!   per handle), punch hole and truncate (from the end, a leaf at a
//!   time: a leaf left empty is freed and leaves its parent,
//!   `split_path`). The whole rewrite remains for collapse and insert
//!   (which shift every later extent), a tree of depth 0, a tree whose
//!   keys do not match its nodes, and steps of a long truncate or punch
//!   that empty leaves.
//! - Data blocks bypass the metadata cache (the device directly); a block
//!   freed as metadata was dropped from the cache, so nothing stale is
//!   written over data.
//! - The VFS holds the inode's data lock exclusively around write and
//!   truncate: one changer per file.
//! - Size (`txn.rs`): a change whose block bitmaps would not fit one
//!   handle's share of the log runs as steps, a handle each, with the VFS's
//!   data lock held throughout: truncate and unlink free from the end (the
//!   inode an orphan until the last step: `file_truncate`,
//!   `truncate_rest`, `release_step`, `orphan_step`), punch hole from the
//!   end of the hole (`punch_rest`), fallocate, ZERO_RANGE and write
//!   allocate at most `step_groups` groups per handle. Each step leaves
//!   the tree, `i_blocks` and the frees consistent. INSERT_RANGE and
//!   COLLAPSE_RANGE over a tree too large to rewrite in one transaction
//!   shift it in place, a leaf per handle (`shift_step`, as the kernel's
//!   ext4_ext_shift_extents). Not split: another rewrite of a whole
//!   extent tree (a tree that changes shape), whose size grows with the
//!   extent count: one too large for a transaction fails with ENOSPC
//!   before anything changes (`check_tree_rewrite`).

use std::sync::Arc;

use scalevfs::inode::Inode;

use crate::error::{corrupt, Result};
use crate::format::extent::{self, Extent, Index, Node as ExtNode, INIT_MAX_LEN};
use crate::format::inode::{RawInode, FL_EXTENTS, FL_INLINE_DATA, I_BLOCK_LEN};
use crate::fs::{Ext4, Ext4Inode, Release};
use crate::util::{errno, now, BlockBuf};
use scalevfs_orphan::OrphanSlot;
use scalevfs_sync::ordered::RwLockWriteGuard;
use scalevfs_sync::primitive::Ordering;

/// What `Ext4::file_raw` does with a block-mapped (ext2/3-style) file.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum OnMap {
    /// Leave its block map: the caller changes the map (write, truncate,
    /// punch hole; `block_map.rs`).
    Keep,
    /// EOPNOTSUPP (extent-only operations).
    Refuse,
}

/// Whether `b` continues `a` (logically and physically, same state) and
/// the two fit one extent: unwritten extents hold at most
/// INIT_MAX_LEN - 1 blocks.
fn joins(a: &Extent, b: &Extent) -> bool {
    a.uninit == b.uninit
        && u64::from(a.block) + u64::from(a.len) == u64::from(b.block)
        && a.start + u64::from(a.len) == b.start
        && u32::from(a.len) + u32::from(b.len) <= u32::from(INIT_MAX_LEN) - u32::from(a.uninit)
}

/// The end of the folio that the kernel's buffered write of a range
/// ending at `end` puts `pos` in, when none of the range is in its page
/// cache (6.16 and later, ext4's large folios; checked on 6.18). Its
/// `generic_perform_write` goes in chunks of the largest folio (2 MiB,
/// `MAX_PAGECACHE_ORDER` on x86-64), and `__filemap_get_folio` takes a
/// folio of the order of the chunk's length (`fgf_set_order`), lowered to
/// the page index's alignment, one page where the write starts inside
/// it. A folio whose blocks cannot all be mapped gets none of the data: a
/// write that runs out of space ends at a folio's start (random kernel
/// differential seeds 1148 and 1371 at 1 KiB: the kernel's 13 MiB write
/// ended at 12.5 MiB, in a 256 KiB folio). Where the kernel has pages of
/// the range cached, its folios are those pages' and may be smaller; that
/// history is not modelled.
pub(crate) fn folio_end(pos: u64, end: u64) -> u64 {
    const PAGE_SHIFT: u32 = 12;
    const MAX_ORDER: u32 = 9;
    let chunk = 1u64 << (PAGE_SHIFT + MAX_ORDER);
    let bytes = (chunk - (pos & (chunk - 1)))
        .min(end.saturating_sub(pos))
        .max(1);
    let shift = bytes.ilog2();
    let mut order = shift.saturating_sub(PAGE_SHIFT).min(MAX_ORDER);
    let index = pos >> PAGE_SHIFT;
    if pos & ((1 << PAGE_SHIFT) - 1) != 0 {
        // A write that starts inside a page gets that page alone (seen
        // on 6.18: 4 KiB blocks, one free, 8 KiB at offset 5 wrote 4091
        // bytes, at offset 0 failed; at 8197 wrote 4091).
        order = 0;
    } else if index & ((1u64 << order) - 1) != 0 {
        order = index.trailing_zeros();
    }
    // `order` is at most MAX_ORDER: the shift stays in range.
    ((index >> order) + 1).saturating_mul(1u64 << (order + PAGE_SHIFT))
}

/// Undo, for the logical blocks at or past `from`, what a write did to
/// `ex` before its data failed to reach them: each block of `changed` (in
/// the order the write mapped them) that the write took from `fresh`
/// leaves the list (returned, for the caller to free); one it turned
/// written (an unwritten block) is unwritten again.
fn unmap_unwritten(ex: &mut Vec<Extent>, changed: &[u64], fresh: &[u64], from: u64) -> Vec<u64> {
    let fresh: std::collections::HashSet<u64> = fresh.iter().copied().collect();
    let mut back = Vec::new();
    let mut undo: Vec<u64> = changed.iter().copied().filter(|&l| l >= from).collect();
    undo.sort_unstable();
    undo.dedup();
    // A run of consecutive logical blocks at a time: `remove_range` gives
    // back their physical blocks in logical order.
    let mut i = 0;
    while i < undo.len() {
        let mut j = i + 1;
        while j < undo.len() && undo[j] == undo[j - 1] + 1 {
            j += 1;
        }
        let mut l = undo[i];
        for (p0, n) in remove_range(ex, undo[i], undo[j - 1] + 1) {
            for p in p0..p0 + n {
                if fresh.contains(&p) {
                    back.push(p);
                } else {
                    insert_extent(
                        ex,
                        Extent {
                            block: l as u32,
                            len: 1,
                            start: p,
                            uninit: true,
                        },
                    );
                }
                l += 1;
            }
        }
        i = j;
    }
    back
}

/// Merge `e` into the sorted list `ex` (which has no block of its range).
pub(crate) fn insert_extent(ex: &mut Vec<Extent>, e: Extent) {
    let i = ex.partition_point(|x| x.block < e.block);
    if i > 0 && joins(&ex[i - 1], &e) {
        ex[i - 1].len += e.len;
        if i < ex.len() && joins(&ex[i - 1], &ex[i]) {
            ex[i - 1].len += ex[i].len;
            ex.remove(i);
        }
    } else if i < ex.len() && joins(&e, &ex[i]) {
        ex[i].block = e.block;
        ex[i].start = e.start;
        ex[i].len += e.len;
    } else {
        ex.insert(i, e);
    }
}

/// The first logical block at or after `at` that `ex` does not map.
fn first_hole(ex: &[Extent], mut at: u64) -> u64 {
    let i = ex.partition_point(|e| u64::from(e.block) + u64::from(e.len) <= at);
    for e in &ex[i..] {
        if u64::from(e.block) > at {
            break;
        }
        at = u64::from(e.block) + u64::from(e.len);
    }
    at
}

/// Remove logical blocks `from..to` from `ex`; returns the freed physical
/// runs (start, count).
fn remove_range(ex: &mut Vec<Extent>, from: u64, to: u64) -> Vec<(u64, u64)> {
    let mut freed = Vec::new();
    let mut out = Vec::with_capacity(ex.len() + 1);
    for e in ex.drain(..) {
        let (s, t) = (u64::from(e.block), u64::from(e.block) + u64::from(e.len));
        if t <= from || s >= to {
            out.push(e);
            continue;
        }
        if s < from {
            out.push(Extent {
                len: (from - s) as u16,
                ..e
            });
        }
        let (a, b) = (s.max(from), t.min(to));
        freed.push((e.start + (a - s), b - a));
        if t > to {
            out.push(Extent {
                block: to as u32,
                len: (t - to) as u16,
                start: e.start + (to - s),
                uninit: e.uninit,
            });
        }
    }
    *ex = out;
    freed
}

/// Make logical block `lblk`, inside the unwritten extent `ex[i]`,
/// written: the extent splits around it and the written block joins a
/// written neighbour where `joins` allows. The same as removing the block
/// and inserting it written (`remove_range`, `insert_extent`), without
/// copying the list.
fn convert_block(ex: &mut Vec<Extent>, i: usize, lblk: u64) {
    let e = ex[i];
    let off = lblk - u64::from(e.block);
    let mut pieces = [e; 3];
    let mut n = 0;
    if off > 0 {
        pieces[n].len = off as u16;
        n += 1;
    }
    pieces[n] = Extent {
        block: lblk as u32,
        len: 1,
        start: e.start + off,
        uninit: false,
    };
    let mut w = i + n;
    n += 1;
    if off + 1 < u64::from(e.len) {
        pieces[n] = Extent {
            block: lblk as u32 + 1,
            len: e.len - off as u16 - 1,
            start: e.start + off + 1,
            uninit: true,
        };
        n += 1;
    }
    ex.splice(i..=i, pieces[..n].iter().copied());
    if w > 0 && joins(&ex[w - 1], &ex[w]) {
        ex[w - 1].len += ex[w].len;
        ex.remove(w);
        w -= 1;
    }
    if w + 1 < ex.len() && joins(&ex[w], &ex[w + 1]) {
        ex[w].len += ex[w + 1].len;
        ex.remove(w + 1);
    }
}

/// Split the extent holding logical block `at` in two at `at` (nothing
/// if `at` starts an extent or lies in a hole).
fn split_at(ex: &mut Vec<Extent>, at: u64) {
    let i = ex.partition_point(|e| u64::from(e.block) < at);
    let Some(e) = i.checked_sub(1).map(|j| ex[j]) else {
        return;
    };
    let (s, t) = (u64::from(e.block), u64::from(e.block) + u64::from(e.len));
    if at > s && at < t {
        ex[i - 1].len = (at - s) as u16;
        ex.insert(
            i,
            Extent {
                block: at as u32,
                len: (t - at) as u16,
                start: e.start + (at - s),
                uninit: e.uninit,
            },
        );
    }
}

/// Join the neighbours of the sorted list `ex` that `joins` allows (after
/// a shift or a conversion, as the kernel's ext4_ext_try_to_merge).
fn merge_adjacent(ex: &mut Vec<Extent>) {
    let mut out: Vec<Extent> = Vec::with_capacity(ex.len());
    for e in ex.drain(..) {
        match out.last_mut() {
            Some(l) if joins(l, &e) => l.len += e.len,
            _ => out.push(e),
        }
    }
    *ex = out;
}

/// Mark the written blocks of logical `from..to` unwritten (ZERO_RANGE's
/// whole blocks: they read as zeros from now on and keep their physical
/// blocks, as ext4_ext_convert_initialized_extent). True if any changed.
fn mark_unwritten(ex: &mut Vec<Extent>, from: u64, to: u64) -> bool {
    if from >= to {
        return false;
    }
    split_at(ex, from);
    split_at(ex, to);
    let mut changed = false;
    let mut out = Vec::with_capacity(ex.len() + 1);
    for e in ex.drain(..) {
        let s = u64::from(e.block);
        if e.uninit || s < from || s >= to {
            out.push(e);
            continue;
        }
        changed = true;
        // A written extent of INIT_MAX_LEN blocks is one too long for an
        // unwritten one: two pieces.
        let max = INIT_MAX_LEN - 1;
        let mut done = 0u16;
        while done < e.len {
            let n = (e.len - done).min(max);
            out.push(Extent {
                block: e.block + u32::from(done),
                len: n,
                start: e.start + u64::from(done),
                uninit: true,
            });
            done += n;
        }
    }
    *ex = out;
    merge_adjacent(ex);
    changed
}

/// A shift of every logical block from `a` on by `k` blocks, right
/// (INSERT_RANGE) or left (COLLAPSE_RANGE, whose range `a..a + k` holds
/// no block any more), done a leaf at a time (`Ext4::shift_step`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shift {
    pub(crate) a: u64,
    pub(crate) k: u64,
    pub(crate) right: bool,
}

impl Shift {
    /// Where logical block (or index key) `x` goes. Left, a key inside the
    /// removed range (one below its subtree's first extent) goes to `a`:
    /// it still bounds its subtree from below and its left neighbour's
    /// from above.
    fn map(&self, x: u64) -> u64 {
        if self.right {
            if x >= self.a {
                x + self.k
            } else {
                x
            }
        } else if x >= self.a + self.k {
            x - self.k
        } else if x >= self.a {
            self.a
        } else {
            x
        }
    }
}

/// The leaf of an extent tree (depth >= 1) that covers a logical block:
/// its block, its extents, the logical range `[lo, hi)` its parents'
/// keys give it (a write inside the range changes only this leaf), and
/// the index nodes above it.
#[derive(Clone)]
pub(crate) struct LeafAt {
    pub(crate) block: u64,
    /// The leaf's extents; with `win`, only those of the window.
    pub(crate) ex: Vec<Extent>,
    pub(crate) lo: u64,
    pub(crate) hi: u64,
    /// The index nodes from the root (in the inode) down to the leaf's
    /// parent.
    path: Vec<PathNode>,
    /// As `leaf_window` returns it, `Some`: `ex` is entries `from..to`
    /// of the leaf alone. `None` once `store_leaf` decoded the whole leaf
    /// into `ex` (for a split or a rewrite).
    win: Option<Window>,
}

impl LeafAt {
    /// Whether the leaf holds an extent with a block outside `from..to`.
    fn holds_outside(&self, from: u64, to: u64) -> bool {
        self.win.as_ref().is_some_and(|w| w.from > 0 || w.to < w.n)
            || self
                .ex
                .iter()
                .any(|e| u64::from(e.block) < from || u64::from(e.block) + u64::from(e.len) > to)
    }

    /// How many extents the leaf holds once `ex` (of `extents_of`)
    /// replaces what this holds.
    fn count_after(&self, ex: &[Extent]) -> usize {
        self.win
            .as_ref()
            .map_or(ex.len(), |w| w.n - (w.to - w.from) + ex.len())
    }
}

/// The part of a leaf a change of a few blocks decodes (`leaf_window`):
/// the leaf's `n` raw entries in `buf`, and the window `from..to` of them
/// that the change can touch. `store_leaf` writes a changed window back
/// into the leaf in place (`extent::splice_leaf`), so a write into a leaf
/// of 340 extents decodes and encodes a handful, not all.
#[derive(Clone)]
struct Window {
    buf: BlockBuf,
    n: usize,
    /// The header's room (`eh_max`): `entries_per_block` as we and
    /// mkfs write it, less in leaves other tools wrote.
    max: usize,
    from: usize,
    to: usize,
}

/// An index node on the way to a leaf: its block (`None`: the root in
/// `i_block`), its depth, its entries and which one the path follows.
#[derive(Clone)]
struct PathNode {
    block: Option<u64>,
    depth: u16,
    ix: Vec<Index>,
    at: usize,
}

/// Sizes of the pieces a node of `n` entries splits into when it holds
/// at most `max`: none for no entries (the node goes); one piece if it
/// fits; else, when the entries grew at
/// the right end of the tree (`append`: a file growing), full pieces then
/// the rest, so that appends leave full nodes behind (as the kernel's
/// ext4_ext_split, which moves nothing when inserting past the last
/// entry); else pieces of equal size, so both halves of a split leaf
/// have room again.
fn split_sizes(n: usize, max: usize, append: bool) -> Vec<usize> {
    let max = max.max(1);
    if n == 0 {
        return Vec::new();
    }
    if n <= max {
        return vec![n];
    }
    let k = n.div_ceil(max);
    if append {
        let mut v = vec![max; n / max];
        if !n.is_multiple_of(max) {
            v.push(n % max);
        }
        return v;
    }
    (0..k).map(|i| n / k + usize::from(i < n % k)).collect()
}

impl Ext4 {
    /// The leaf of a tree of depth >= 1 (`None`: the extents are in the
    /// inode) for a change of logical blocks `first..=last` (which may go
    /// past the leaf): the leaf holding `first`, and of its extents those
    /// that the change can
    /// touch or merge with are decoded, the entry holding or preceding
    /// each block of the range and one neighbour on either side (the
    /// merges of `insert_extent`, `convert_block` and `merge_adjacent`
    /// reach no further). A leaf checked whole once per cached
    /// generation (checksum, order, bounds) is then found by a binary
    /// search over its raw entries, and only the window's entries are
    /// decoded and checked.
    pub(crate) fn leaf_window(
        &self,
        raw: &RawInode,
        first: u64,
        last: u64,
    ) -> Result<Option<LeafAt>> {
        self.descend(raw, first, (first, last.max(first)))
    }

    /// The walk of `leaf_window`, one block read per level: the leaf
    /// holding `lblk`, and its window for a change of `win` (first and
    /// last logical block, cut to the leaf's range).
    fn descend(&self, raw: &RawInode, lblk: u64, win: (u64, u64)) -> Result<Option<LeafAt>> {
        let what = || format!("inode {}", raw.ino);
        let fs_blocks = self.sb.blocks_count;
        let seed = self.sb.has_metadata_csum().then_some(raw.csum_seed);
        let mut node = extent::parse_node(&raw.block, &what, None, None, fs_blocks)?;
        self.check_node_not_meta(raw.ino, &node)?;
        let (mut lo, mut hi) = (0u64, 1u64 << 32);
        let mut at = None;
        let mut path = Vec::new();
        let mut buf = BlockBuf::zeroed(self.bs);
        // One index level per step; parse_node checks that the depths
        // count down, so this ends after at most MAX_DEPTH reads.
        loop {
            match node {
                // Only the root: below, the walk ends at depth 1.
                ExtNode::Leaf(..) => return Ok(None),
                ExtNode::Index(h, v) => {
                    if v.is_empty() || h.depth == 0 {
                        return Err(corrupt(what(), "an empty extent index"));
                    }
                    let i = v.partition_point(|x| u64::from(x.block) <= lblk).max(1) - 1;
                    if i > 0 {
                        lo = lo.max(u64::from(v[i].block));
                    }
                    if let Some(n) = v.get(i + 1) {
                        hi = hi.min(u64::from(n.block));
                    }
                    let blk = v[i].leaf;
                    let r = self.read_meta(blk, &mut buf)?;
                    let w = || format!("inode {} extent block {blk}", raw.ino);
                    if h.depth == 1 {
                        let (wfirst, wlast) = win;
                        path.push(PathNode {
                            block: at,
                            depth: h.depth,
                            ix: v,
                            at: i,
                        });
                        let hd = if r.verified {
                            extent::check_header(&buf, &w, Some(0))?
                        } else {
                            let hd = extent::check_node(&buf, &w, Some(0), seed, fs_blocks)?;
                            self.verified_meta(&r);
                            hd
                        };
                        let n = usize::from(hd.entries);
                        let from = extent::search(&buf, n, wfirst.max(lo)).saturating_sub(2);
                        let to = (extent::search(&buf, n, wlast) + 1).min(n);
                        let ex: Vec<Extent> =
                            (from..to).map(|k| extent::extent_at(&buf, k)).collect();
                        // The window's extents checked as `check_node`
                        // would (a leaf checked whole is sorted, so its
                        // first and last extent bound the rest).
                        let mut prev = lo;
                        let ends = [0, n.saturating_sub(1)].map(|k| extent::extent_at(&buf, k));
                        for e in ex.iter().chain(ends.iter().take(if n > 0 { 2 } else { 0 })) {
                            extent::check_extent(e, &w, fs_blocks)?;
                            self.check_not_meta(raw.ino, e.start, u64::from(e.len))?;
                            if u64::from(e.block) < lo || u64::from(e.block) + u64::from(e.len) > hi
                            {
                                return Err(corrupt(what(), "an extent outside its index range"));
                            }
                        }
                        for e in &ex {
                            if u64::from(e.block) < prev {
                                return Err(corrupt(w(), "extents overlap or out of order"));
                            }
                            prev = u64::from(e.block) + u64::from(e.len);
                        }
                        return Ok(Some(LeafAt {
                            block: blk,
                            ex,
                            lo,
                            hi,
                            path,
                            win: Some(Window {
                                buf,
                                n,
                                max: usize::from(hd.max),
                                from,
                                to,
                            }),
                        }));
                    }
                    // An index node: decoded whole (the path keeps it).
                    // A cached generation checked once is not checked
                    // again (its checksum; the structure is cheap to check
                    // here, where every entry is decoded anyway).
                    let check = seed.filter(|_| !r.verified);
                    let next = extent::parse_node(&buf, &w, Some(h.depth - 1), check, fs_blocks)?;
                    self.check_node_not_meta(raw.ino, &next)?;
                    if !r.verified {
                        self.verified_meta(&r);
                    }
                    path.push(PathNode {
                        block: at,
                        depth: h.depth,
                        ix: v,
                        at: i,
                    });
                    node = next;
                    at = Some(blk);
                }
            }
        }
    }

    /// Write a tree block of `raw`'s extent tree: `fill` encodes the
    /// node (`load`: the block is read first where not cached, to keep
    /// what `fill` does not write), then the checksum tail with the
    /// inode's `seed` where the fs has metadata_csum. The cached copy then
    /// counts as verified, so the next read does not check it again.
    fn store_node<R>(
        &self,
        blk: u64,
        load: bool,
        seed: u32,
        fill: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        let (rw, io) = self.rw()?;
        let per = extent::entries_per_block(self.bs);
        let csum = self.sb.has_metadata_csum();
        // Sealed whatever the features: what we encode is well formed,
        // so the next read skips `check_node` (and the checksum with
        // metadata_csum).
        Ok(rw.bufs.modify_sealed(io.dev, blk, load, |d| {
            let r = fill(d);
            if csum {
                extent::set_tail(d, per, seed);
            }
            (r, true)
        })?)
    }

    /// Write leaf `l` (its extents changed) back in place, its checksum
    /// tail updated.
    pub(crate) fn write_leaf(&self, raw: &RawInode, l: &LeafAt) -> Result<()> {
        let per = extent::entries_per_block(self.bs);
        self.store_node(l.block, true, raw.csum_seed, |d| {
            extent::encode_leaf(d, per, &l.ex);
        })
    }

    /// Store the new extents `ex` of leaf `l` (all inside its range): in
    /// place when they fit and the leaf's first logical block is unchanged
    /// (the parents' keys stay right); else by changing the path to it
    /// (`split_path`: the leaf splits or goes, the keys above follow);
    /// else (a tree whose keys do not match its nodes, no room for more
    /// depth) by rewriting the whole tree with the leaf's old extents
    /// replaced.
    fn store_leaf(&self, raw: &mut RawInode, l: LeafAt, ex: Vec<Extent>) -> Result<()> {
        let r = self.store_leaf_inner(raw, l, ex);
        self.stop_unless_enospc(r)
    }

    /// A tree change that failed: ENOSPC comes before anything changed
    /// (every block is allocated first); any other error (a parent index
    /// block that cannot be read back, say) may come after a leaf or a
    /// node was rewritten in the buffer cache, so writes stop and the
    /// half-made tree never commits (`stop_writes`), whichever path asked.
    fn stop_unless_enospc(&self, r: Result<()>) -> Result<()> {
        r.map_err(|e| {
            if e.errno() == scalevfs::Errno::ENOSPC {
                e
            } else {
                self.stop_writes(e)
            }
        })
    }

    fn store_leaf_inner(
        &self,
        raw: &mut RawInode,
        mut l: LeafAt,
        mut ex: Vec<Extent>,
    ) -> Result<()> {
        let per = extent::entries_per_block(self.bs);
        let first = |v: &[Extent]| v.first().map(|e| e.block);
        let one_leaf = l.path.len() == 1 && l.path[0].ix.len() == 1;
        if let Some(w) = l.win.take() {
            // A window: spliced into the leaf in place when the leaf's
            // first block stays and the result fits (and is not small
            // enough to move into the inode), in a leaf with the usual
            // room (a smaller `eh_max` puts the checksum tail elsewhere;
            // the rewrite below gives it the usual room); else the whole
            // leaf is decoded and goes the ways below.
            let m = w.n - (w.to - w.from) + ex.len();
            let keeps_first = w.from > 0 || (!ex.is_empty() && first(&ex) == first(&l.ex));
            if m <= per && w.max == per && keeps_first && !(one_leaf && m <= 4) {
                let n = w.n as u16;
                let ok = self.store_node(l.block, true, raw.csum_seed, |d| {
                    // (The leaf changes under the data lock alone, which
                    // the caller holds since it read it.)
                    let same = d[2..4] == n.to_le_bytes();
                    if same {
                        extent::splice_leaf(d, w.n, w.from, w.to, &ex);
                    }
                    same
                })?;
                if !ok {
                    return Err(corrupt(
                        format!("inode {} extent block {}", raw.ino, l.block),
                        "the leaf changed during a change",
                    ));
                }
                return Ok(());
            }
            let old: Vec<Extent> = (0..w.n).map(|k| extent::extent_at(&w.buf, k)).collect();
            let mut all = old.clone();
            all.splice(w.from..w.to, ex);
            l.ex = old;
            ex = all;
        }
        if ex.len() <= per && first(&ex) == first(&l.ex) && !(one_leaf && ex.len() <= 4) {
            l.ex = ex;
            return self.write_leaf(raw, &l);
        }
        if self.split_path(raw, &l, &ex)? {
            return Ok(());
        }
        let (mut all, tree) = self.collect_extents(raw)?;
        all.retain(|e| u64::from(e.block) < l.lo || u64::from(e.block) >= l.hi);
        let at = all.partition_point(|e| u64::from(e.block) < l.lo);
        all.splice(at..at, ex);
        self.rebuild_tree(raw, &all, &tree)
    }

    /// Store the leaf `l`'s new extents `ex` by changing only the path to
    /// it, as the kernel's ext4_ext_insert_extent does: the leaf keeps its
    /// block and the first piece of `ex`, further pieces (`split_sizes`)
    /// go to new blocks whose index entries join the parent; a parent that
    /// overflows splits the same way, up to the root, which grows the
    /// tree one level deeper when its four entries do not suffice. A leaf
    /// left without extents is freed and its entry leaves the parent, and
    /// so on up (the kernel's ext4_ext_rm_idx); the root left without
    /// entries becomes an empty leaf (depth 0), and so does the root of a
    /// one-leaf tree whose leaf is down to four extents (they move into
    /// the inode, as the kernel's ext4_ext_try_to_merge_up does). Every
    /// index entry keeps the first logical block of its child as key
    /// (e2fsck checks that), so a changed first block is carried up while
    /// it is a node's first entry. New blocks are all allocated before any
    /// node changes, so an allocation failure leaves the tree as it was.
    /// `Ok(false)`, with nothing changed, where this does not apply: a key
    /// on the path that is not its child's first block (left to the whole
    /// rewrite, which builds a clean tree), or a tree already at the
    /// deepest depth.
    fn split_path(&self, raw: &mut RawInode, l: &LeafAt, ex: &[Extent]) -> Result<bool> {
        let per = extent::entries_per_block(self.bs);
        let Some(top) = l.path.first() else {
            return Ok(false);
        };
        if top.block.is_some() {
            return Ok(false);
        }
        let unit = self.bs as u64 / 512;
        if l.path.len() == 1 && top.ix.len() == 1 && ex.len() <= 4 {
            // The only leaf of a depth-1 tree, down to what the inode
            // holds: the extents move into the inode and the leaf goes
            // (the kernel's ext4_ext_try_to_merge_up).
            let gen = raw.block[8..12].to_vec();
            let mut root = [0u8; I_BLOCK_LEN];
            extent::encode_leaf(&mut root, 4, ex);
            root[8..12].copy_from_slice(&gen);
            raw.block = root;
            self.free_block(l.block)?;
            raw.blocks = raw.blocks.saturating_sub(unit);
            return Ok(true);
        }
        // The keys must match their children along the path.
        let child_first = |d: usize| -> Option<u32> {
            match l.path.get(d + 1) {
                Some(p) => p.ix.first().map(|x| x.block),
                None => l.ex.first().map(|e| e.block),
            }
        };
        for (d, p) in l.path.iter().enumerate() {
            if p.at >= p.ix.len() || Some(p.ix[p.at].block) != child_first(d) {
                return Ok(false);
            }
        }
        // Growing at the right end of the file: the leaf is the last one
        // and the last extent is new.
        let append = l.hi == 1 << 32 && ex.last().map(|e| e.block) > l.ex.last().map(|e| e.block);
        // Plan: the pieces of each level, bottom up, before anything
        // changes. `pieces[0]` are the leaf's, then each index level's.
        let leaf_sizes = split_sizes(ex.len(), per, append);
        let mut new_needed = leaf_sizes.len().saturating_sub(1);
        let mut carry = leaf_sizes.len();
        let mut level_sizes: Vec<Vec<usize>> = Vec::new();
        for p in l.path.iter().rev() {
            let n = p.ix.len() - 1 + carry;
            let max = if p.block.is_none() { 4 } else { per };
            if p.block.is_none() && n == 0 {
                // The last extent went: the root becomes an empty leaf.
                level_sizes.push(Vec::new());
                break;
            }
            if p.block.is_none() && n > max {
                // The root grows: its entries move to new blocks.
                let sizes = split_sizes(n, per, append);
                if sizes.len() > 4 || p.depth >= extent::MAX_DEPTH {
                    return Ok(false);
                }
                new_needed += sizes.len();
                level_sizes.push(sizes);
                break;
            }
            let sizes = split_sizes(n, max, append);
            new_needed += sizes.len().saturating_sub(1);
            carry = sizes.len();
            level_sizes.push(sizes);
        }
        // One handle must fit the log (jbd2 refuses a larger one): a split
        // that changes more nodes than a handle may is ENOSPC before
        // anything changes, and the write gives back its last folio and
        // stores less (a step of a fragmented append on a small journal
        // could add hundreds of leaves; rebuild_tree checks alike).
        if self
            .journal()
            .is_some_and(|j| new_needed + l.path.len() + 1 > j.handle_room())
        {
            return Err(errno(libc::ENOSPC));
        }
        let goal = l.block;
        let mut fresh = Vec::with_capacity(new_needed);
        for _ in 0..new_needed {
            match self.alloc_block(goal) {
                Ok(b) => fresh.push(b),
                Err(e) => {
                    for b in fresh {
                        let _ = self.free_block(b);
                    }
                    return Err(e);
                }
            }
        }
        let seed = raw.csum_seed;
        let mut fresh = fresh.into_iter();
        // Nodes left without entries: freed at the end.
        let mut dropped = Vec::new();
        if leaf_sizes.is_empty() {
            dropped.push(l.block);
        }
        // The leaf's pieces: the first in the leaf's block.
        let mut repl: Vec<Index> = Vec::new();
        let mut off = 0;
        for (k, &n) in leaf_sizes.iter().enumerate() {
            let piece = &ex[off..off + n];
            off += n;
            let b = if k == 0 {
                l.block
            } else {
                fresh.next().ok_or_else(|| errno(libc::EIO))?
            };
            self.store_node(b, k == 0, seed, |d| {
                extent::encode_leaf(d, per, piece);
            })?;
            repl.push(Index {
                block: piece[0].block,
                leaf: b,
            });
        }
        // Up the path: each node takes its child's pieces in place of the
        // child's one entry.
        for (p, sizes) in l.path.iter().rev().zip(&level_sizes) {
            let mut ix = p.ix.clone();
            ix.splice(p.at..=p.at, repl.iter().copied());
            if ix == p.ix {
                break;
            }
            match p.block {
                None if ix.is_empty() => {
                    let gen = raw.block[8..12].to_vec();
                    let mut root = [0u8; I_BLOCK_LEN];
                    extent::encode_leaf(&mut root, 4, &[]);
                    root[8..12].copy_from_slice(&gen);
                    raw.block = root;
                }
                None if ix.len() <= 4 => {
                    let gen = raw.block[8..12].to_vec();
                    let mut root = [0u8; I_BLOCK_LEN];
                    extent::encode_index(&mut root, 4, p.depth, &ix);
                    root[8..12].copy_from_slice(&gen);
                    raw.block = root;
                }
                None => {
                    // One level deeper: the root's entries in new blocks
                    // at the root's old depth, the root over them.
                    let mut top = Vec::new();
                    let mut off = 0;
                    for &n in sizes {
                        let piece = &ix[off..off + n];
                        off += n;
                        let b = fresh.next().ok_or_else(|| errno(libc::EIO))?;
                        self.store_node(b, false, seed, |d| {
                            extent::encode_index(d, per, p.depth, piece);
                        })?;
                        top.push(Index {
                            block: piece[0].block,
                            leaf: b,
                        });
                    }
                    let gen = raw.block[8..12].to_vec();
                    let mut root = [0u8; I_BLOCK_LEN];
                    extent::encode_index(&mut root, 4, p.depth + 1, &top);
                    root[8..12].copy_from_slice(&gen);
                    raw.block = root;
                }
                Some(own) if sizes.is_empty() => {
                    dropped.push(own);
                    repl = Vec::new();
                    continue;
                }
                Some(own) => {
                    let mut next = Vec::new();
                    let mut off = 0;
                    for (k, &n) in sizes.iter().enumerate() {
                        let piece = &ix[off..off + n];
                        off += n;
                        let b = if k == 0 {
                            own
                        } else {
                            fresh.next().ok_or_else(|| errno(libc::EIO))?
                        };
                        self.store_node(b, k == 0, seed, |d| {
                            extent::encode_index(d, per, p.depth, piece);
                        })?;
                        next.push(Index {
                            block: piece[0].block,
                            leaf: b,
                        });
                    }
                    repl = next;
                    continue;
                }
            }
            break;
        }
        // The plan used every new block (a leftover would be a planning
        // bug: given back rather than leaked).
        let mut used = new_needed;
        for b in fresh {
            debug_assert!(false, "extent split: block {b} planned, not used");
            used -= 1;
            self.free_block(b)?;
        }
        for &b in &dropped {
            self.free_block(b)?;
        }
        raw.blocks = (raw.blocks + used as u64 * unit).saturating_sub(dropped.len() as u64 * unit);
        Ok(true)
    }

    /// A depth-1 tree whose leaves (at most four) hold four extents or
    /// fewer in all moves into the inode, its leaves freed: what a
    /// rewrite of the whole tree would leave after a punch or truncate.
    /// Reads at most four leaves; called when a removal left a leaf that
    /// small.
    fn shrink_small_tree(&self, raw: &mut RawInode) -> Result<()> {
        let what = || format!("inode {}", raw.ino);
        match extent::parse_node(&raw.block, &what, None, None, self.sb.blocks_count)? {
            ExtNode::Index(h, _) if h.depth == 1 => {
                let (all, tree) = self.collect_extents(raw)?;
                if all.len() <= 4 {
                    self.rebuild_tree(raw, &all, &tree)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// For a change of logical blocks `first..=last`: in a tree deeper
    /// than the inode, the leaf holding `first`, `last` cut to that leaf's
    /// end, and where the rest starts (`Some(hi)`: the caller goes on from
    /// there in a new handle, as after a step).
    fn clip_to_leaf(
        &self,
        raw: &RawInode,
        first: u64,
        last: u64,
    ) -> Result<(Option<LeafAt>, u64, Option<u64>)> {
        let leaf = self
            .leaf_window(raw, first, last)?
            .filter(|l| first >= l.lo);
        Ok(match &leaf {
            Some(l) if last >= l.hi => {
                let hi = l.hi;
                (leaf, hi - 1, Some(hi))
            }
            _ => (leaf, last, None),
        })
    }

    /// The extents a change works on: the leaf's (`Some`), or the whole
    /// list with the tree blocks holding it; and the tree blocks a step's
    /// budget counts for the change (one for a leaf, see `tail_cut`).
    fn extents_of(
        &self,
        raw: &RawInode,
        leaf: &Option<LeafAt>,
    ) -> Result<(Vec<Extent>, Vec<u64>, usize)> {
        Ok(match leaf {
            Some(l) => (l.ex.clone(), Vec::new(), 1),
            None => {
                let (ex, tree) = self.collect_extents(raw)?;
                let n = tree.len();
                (ex, tree, n)
            }
        })
    }

    /// Store the changed extents `ex` of `extents_of`: the leaf's
    /// (`store_leaf`), or the whole tree replacing the blocks `tree`.
    fn store_extents(
        &self,
        raw: &mut RawInode,
        leaf: Option<LeafAt>,
        ex: Vec<Extent>,
        tree: &[u64],
    ) -> Result<()> {
        match leaf {
            Some(l) => self.store_leaf(raw, l, ex),
            None => self.rebuild_tree(raw, &ex, tree),
        }
    }

    /// The extent list of `raw` and the tree blocks holding it. Each tree
    /// block is read once (one named twice is corruption: a few blocks
    /// naming each other could otherwise stand for billions of extents),
    /// and the extents must come in order as they are gathered, so what
    /// this holds is bounded by the tree's real blocks.
    pub(crate) fn collect_extents(&self, raw: &RawInode) -> Result<(Vec<Extent>, Vec<u64>)> {
        let what = || format!("inode {}", raw.ino);
        let fs_blocks = self.sb.blocks_count;
        let seed = self.sb.has_metadata_csum().then_some(raw.csum_seed);
        let mut ex: Vec<Extent> = Vec::new();
        let mut tree = Vec::new();
        let mut seen = std::collections::HashSet::new();
        // The end of the last extent gathered.
        let mut end = 0u64;
        // (node bytes, depth expected): the root first.
        let root = extent::parse_node(&raw.block, &what, None, None, fs_blocks)?;
        let mut stack = vec![root];
        let mut buf = BlockBuf::zeroed(self.bs);
        while let Some(n) = stack.pop() {
            match n {
                ExtNode::Leaf(_, v) => {
                    if ex.len() + v.len() > fs_blocks as usize {
                        return Err(corrupt(what(), "more extents than blocks"));
                    }
                    for x in v {
                        if u64::from(x.block) < end {
                            return Err(corrupt(what(), "extents overlap or out of order"));
                        }
                        end = u64::from(x.block) + u64::from(x.len);
                        self.check_not_meta(raw.ino, x.start, u64::from(x.len))?;
                        ex.push(x);
                    }
                }
                ExtNode::Index(h, v) => {
                    // Children pushed in reverse so they pop in order.
                    for ix in v.iter().rev() {
                        if tree.len() as u64 >= fs_blocks {
                            return Err(corrupt(what(), "extent tree larger than the fs"));
                        }
                        if !seen.insert(ix.leaf) {
                            return Err(corrupt(
                                what(),
                                format!("extent block {} named twice", ix.leaf),
                            ));
                        }
                        self.check_not_meta(raw.ino, ix.leaf, 1)?;
                        tree.push(ix.leaf);
                        let r = self.read_meta(ix.leaf, &mut buf)?;
                        let w = || format!("inode {} extent block {}", raw.ino, ix.leaf);
                        let check = seed.filter(|_| !r.verified);
                        stack.push(extent::parse_node(
                            &buf,
                            &w,
                            Some(h.depth - 1),
                            check,
                            fs_blocks,
                        )?);
                        if check.is_some() {
                            self.verified_meta(&r);
                        }
                    }
                }
            }
        }
        Ok((ex, tree))
    }

    /// Blocks a rewrite of a whole tree for `n` extents, replacing `old`
    /// tree blocks, adds to the running transaction (an upper estimate):
    /// the new tree's blocks, a block bitmap and a descriptor block per
    /// group its blocks may land in and the old ones go back to, the
    /// inode's block and the superblock.
    pub(crate) fn tree_rewrite_blocks(&self, n: usize, old: usize) -> usize {
        let per = extent::entries_per_block(self.bs).max(2);
        let mut new = 0;
        let mut level = n;
        while level > 4 {
            level = level.div_ceil(per);
            new += level;
        }
        let groups = self.groups.len().max(1);
        new + 2 * new.min(groups) + 2 * old.min(groups) + 2
    }

    /// Whether rewriting the whole tree for `n` extents (replacing `old`
    /// tree blocks) fits one transaction (`check_tree_rewrite`).
    pub(crate) fn tree_rewrite_fits(&self, n: usize, old: usize) -> bool {
        // Relaxed: a test's setting (`Ext4::set_stepped_shifts`).
        let forced = self
            .journal()
            .is_some_and(|j| j.stepped_shifts.load(Ordering::Relaxed));
        !forced && self.check_tree_rewrite(n, old).is_ok()
    }

    /// ENOSPC, before anything changes, when rewriting the whole tree for
    /// `n` extents (replacing `old` tree blocks) cannot fit one
    /// transaction (`Journal::handle_room`), as jbd2 refuses a handle
    /// that asks for more credits than a transaction holds. Without the
    /// check the commit found it too large, failed (EUCLEAN) and the mount
    /// stopped writing.
    pub(crate) fn check_tree_rewrite(&self, n: usize, old: usize) -> Result<()> {
        match self.journal() {
            Some(j) if self.tree_rewrite_blocks(n, old) > j.handle_room() => {
                Err(errno(libc::ENOSPC))
            }
            _ => Ok(()),
        }
    }

    /// Write the tree for `ex` (see the module comment), replacing the
    /// blocks `old`; `raw.blocks` follows the tree's size. ENOSPC with
    /// nothing changed when the rewrite cannot fit one transaction
    /// (`check_tree_rewrite`).
    pub(crate) fn rebuild_tree(
        &self,
        raw: &mut RawInode,
        ex: &[Extent],
        old: &[u64],
    ) -> Result<()> {
        let r = self.rebuild_tree_inner(raw, ex, old);
        self.stop_unless_enospc(r)
    }

    fn rebuild_tree_inner(&self, raw: &mut RawInode, ex: &[Extent], old: &[u64]) -> Result<()> {
        self.check_tree_rewrite(ex.len(), old.len())?;
        let per = extent::entries_per_block(self.bs);
        let seed = raw.csum_seed;
        let goal = ex.first().map_or(0, |e| e.start);
        // Nodes per level, leaves first (none: the extents fit the inode).
        let mut levels = Vec::new();
        if ex.len() > 4 {
            let mut n = ex.len().div_ceil(per);
            levels.push(n);
            while n > 4 {
                if levels.len() >= usize::from(extent::MAX_DEPTH) {
                    return Err(errno(libc::EFBIG));
                }
                n = n.div_ceil(per);
                levels.push(n);
            }
        }
        let need: usize = levels.iter().sum();
        // The old tree's blocks hold the new nodes first (rewritten in
        // this transaction, as the kernel changes tree blocks in place), so
        // a tree that shrinks, as freeing from the end makes it, needs no
        // new block: deleting a file works on a full filesystem. Only what
        // the old blocks cannot hold is allocated, all of it before any
        // node changes, so ENOSPC leaves the tree as it was.
        let reuse = need.min(old.len());
        let mut fresh = Vec::with_capacity(need - reuse);
        while fresh.len() < need - reuse {
            match self.alloc_block(goal) {
                Ok(b) => fresh.push(b),
                Err(e) => {
                    for b in fresh {
                        let _ = self.free_block(b);
                    }
                    return Err(e);
                }
            }
        }
        let mut blocks = old[..reuse].iter().copied().chain(fresh.iter().copied());
        let mut level: Vec<Index> = Vec::new();
        let mut depth = 0u16;
        if !levels.is_empty() {
            for chunk in ex.chunks(per) {
                let b = blocks.next().expect("counted above");
                self.store_node(b, false, seed, |d| {
                    extent::encode_leaf(d, per, chunk);
                })?;
                level.push(Index {
                    block: chunk[0].block,
                    leaf: b,
                });
            }
            depth = 1;
            while level.len() > 4 {
                let mut up = Vec::new();
                for chunk in level.chunks(per) {
                    let b = blocks.next().expect("counted above");
                    self.store_node(b, false, seed, |d| {
                        extent::encode_index(d, per, depth, chunk);
                    })?;
                    up.push(Index {
                        block: chunk[0].block,
                        leaf: b,
                    });
                }
                level = up;
                depth += 1;
            }
        }
        for &b in &old[reuse..] {
            self.free_block(b)?;
        }
        let unit = self.bs as u64 / 512;
        raw.blocks = raw.blocks.saturating_sub(old.len() as u64 * unit) + need as u64 * unit;
        let gen = raw.block[8..12].to_vec();
        let mut root = [0u8; I_BLOCK_LEN];
        if depth == 0 {
            extent::encode_leaf(&mut root, 4, ex);
        } else {
            extent::encode_index(&mut root, 4, depth, &level);
        }
        root[8..12].copy_from_slice(&gen);
        raw.block = root;
        Ok(())
    }

    /// The file's private part, its tree lock held exclusively, and its
    /// inode copy. A block-mapped (ext2/3-style) file stays as it is with
    /// [`OnMap::Keep`] (write, truncate, punch hole: the caller changes
    /// its map, as the kernel's ext4 does, `ext4_ind_map_blocks`,
    /// `ext4_ind_truncate`, `ext4_ind_remove_space`); else (fallocate's
    /// other modes, extent-only in the kernel's ext4 too) it is
    /// EOPNOTSUPP. An inline file moves out to a block first
    /// (`uninline`), for every change.
    fn file_raw<'a>(
        &self,
        inode: &'a Inode,
        on_map: OnMap,
    ) -> Result<(&'a Ext4Inode, RwLockWriteGuard<'a, ()>, RawInode)> {
        let ei = inode
            .private::<Ext4Inode>()
            .ok_or_else(|| errno(libc::EIO))?;
        let mut g = ei.data.write();
        // The data leaves the inode or gets blocks (the kernel's
        // ext4_convert_inline_data clears EXT4_STATE_MAY_INLINE_DATA).
        // Relaxed: see `Ext4Inode::may_inline`.
        ei.may_inline.store(false, Ordering::Relaxed);
        let mut raw = ei.raw();
        if raw.flags & FL_INLINE_DATA != 0 {
            // Inline data moves out to a block first, whatever the change
            // (the kernel's ext4 converts for fallocate too).
            self.check(self.uninline(&mut raw))?;
            ei.set_raw(raw.clone());
            // The VFS's st_blocks counts the new block now, also when the
            // caller then returns without a change of its own (a punch
            // past EOF; review, stop 43). The attribute lock ranks before
            // this one, as in `publish`; the caller's VFS data lock keeps
            // other changers out meanwhile.
            drop(g);
            inode.update_attr(|a| a.blocks = raw.blocks);
            g = ei.data.write();
            raw = ei.raw();
        }
        if raw.flags & FL_EXTENTS == 0
            && (on_map == OnMap::Refuse
                || raw.file_type_bits() != libc::S_IFREG
                || !crate::fs::block_mapped(&raw, self.bs, self.has_ea_inode()))
        {
            return Err(errno(libc::EOPNOTSUPP));
        }
        Ok((ei, g, raw))
    }

    /// Store `raw` (on disk and in the inode), drop the tree lock `g`,
    /// then publish the attributes (whose lock ranks above it). Every
    /// caller has changed the tree or the bitmaps for `raw` by now (blocks
    /// freed for a truncate, mapped for a write): a failure storing it (an
    /// I/O error reading the inode table block) stops writes, so that the
    /// half-made change never commits (freed blocks still mapped by the
    /// stored inode could be handed out again; review, stop 47).
    pub(crate) fn publish(
        &self,
        inode: &Inode,
        ei: &Ext4Inode,
        g: RwLockWriteGuard<'_, ()>,
        raw: RawInode,
    ) -> Result<()> {
        self.write_inode(&raw, false)
            .map_err(|e| self.stop_writes(e))?;
        ei.set_raw(raw);
        drop(g);
        inode.update_attr(|a| {
            let r = ei.raw();
            a.size = r.size;
            a.blocks = r.blocks;
            (a.mtime_sec, a.mtime_nsec) = r.mtime;
            (a.ctime_sec, a.ctime_nsec) = r.ctime;
        });
        Ok(())
    }

    /// `write` of the VFS.
    pub(crate) fn file_write(&self, inode: &Arc<Inode>, off: u64, buf: &[u8]) -> Result<usize> {
        self.rw()?;
        if buf.is_empty() {
            return Ok(0);
        }
        if let Some(n) = self.inline_write(inode, off, buf)? {
            return Ok(n);
        }
        let (ei, g, mut raw) = self.file_raw(inode, OnMap::Keep)?;
        if raw.flags & FL_EXTENTS == 0 {
            return self.write_mapped(inode, ei, g, raw, off, buf);
        }
        let bs = self.bs as u64;
        let end = off
            .checked_add(buf.len() as u64)
            .ok_or_else(|| errno(libc::EFBIG))?;
        if (end - 1) / bs >= u64::from(u32::MAX) {
            return Err(errno(libc::EFBIG));
        }
        // In a deeper tree a write works on the leaf holding its first
        // block alone (an overwrite reads one block per level and writes
        // no tree block; an insert changes the leaf in place or splits
        // it, `store_leaf`) and ends short at that leaf's end: the caller
        // writes the rest in a new handle, as after a step. A tree in the
        // inode is changed as a whole.
        let first = off / bs;
        let leaf = self
            .leaf_window(&raw, first, (end - 1) / bs)?
            .filter(|l| first >= l.lo);
        let buf = match &leaf {
            Some(l) if end > l.hi * bs => &buf[..(l.hi * bs - off) as usize],
            _ => buf,
        };
        let (mut ex, tree, tree_len) = self.extents_of(&raw, &leaf)?;
        let mut fresh: Vec<u64> = Vec::new();
        let mut converted = false;
        // The logical blocks this call mapped (fresh) or turned written
        // (converted), in order: a block whose data write fails leaves
        // the map as it was (`unmap_unwritten`).
        let mut changed: Vec<u64> = Vec::new();
        let mut done = 0usize;
        let mut err = None;
        // The first block of a folio the step had no room for.
        let mut stopped: Option<u64> = None;
        // One step (`step_groups`) per call: a write whose allocations
        // reach that many groups ends short, and the caller writes the
        // rest in a new handle (as the kernel maps a write extent by
        // extent, a handle each).
        let budget = self
            .step_groups()
            .map(|b| b.saturating_sub(2 * tree_len + 2).max(1));
        let mut groups = std::collections::HashSet::new();
        let mut blockbuf = BlockBuf::zeroed(self.bs);
        let ipg_group = ((raw.ino - 1) / self.sb.inodes_per_group) as u64;
        let group_goal =
            u64::from(self.sb.first_data_block) + ipg_group * u64::from(self.sb.blocks_per_group);
        // Whole blocks that follow each other on the device go out in one
        // `write_at` (one `pwrite` through `FileDevice`): each call takes
        // the image file's inode lock in the host kernel, which every
        // writing thread shares. `run` is (first block, bytes), ending at
        // `done` in `buf`; `flush` writes it.
        let mut run: Option<(u64, usize)> = None;
        // On failure: the run's length (none of it counts as written).
        let flush = |run: &mut Option<(u64, usize)>,
                     end: usize|
         -> std::result::Result<(), (usize, crate::error::Error)> {
            if let Some((p, len)) = run.take() {
                self.dev
                    .write_at(p * bs, &buf[end - len..end])
                    .map_err(|e| (len, e.into()))?;
            }
            Ok(())
        };
        // A write goes a folio at a time, as the kernel's
        // (`generic_perform_write`: `ext4_write_begin` maps every block
        // of the folio's part before any byte is copied; `folio_end`). A
        // folio whose mapping fails gets none of the data and ends the
        // write at the folio's start; the blocks it mapped stay, as
        // zeros, where they lie inside the size (checked on 6.18, 1 KiB
        // blocks, delalloc and nodelalloc: a 4 KiB write into a hole with
        // 2 blocks free failed with ENOSPC and left 2 zeroed blocks).
        // `failed`: the first block of that folio. Folios are placed by
        // the whole write's end (`end`), so a write that ends short at a
        // leaf and goes on in the next call sees the same ones.
        let mut failed: Option<u64> = None;
        // The folios written whole: (first block, bytes written before).
        let mut parts: Vec<(u64, usize)> = Vec::new();
        // The folio part's blocks: (logical, physical, new).
        let mut maps: Vec<(u64, u64, bool)> = Vec::new();
        'pages: while done < buf.len() {
            let pos = off + done as u64;
            let part_end = folio_end(pos, end).min(off + buf.len() as u64);
            let first_l = pos / bs;
            let before = done;
            maps.clear();
            for lblk in first_l..=(part_end - 1) / bs {
                let i = ex.partition_point(|e| u64::from(e.block) <= lblk);
                let hit = (i > 0)
                    .then(|| ex[i - 1])
                    .filter(|e| lblk < u64::from(e.block) + u64::from(e.len));
                let (pblk, new) = match hit {
                    Some(e) if e.uninit => {
                        // Written from now on: this block leaves the
                        // unwritten extent (which splits around it).
                        let p = e.start + (lblk - u64::from(e.block));
                        convert_block(&mut ex, i - 1, lblk);
                        converted = true;
                        changed.push(lblk);
                        (p, true)
                    }
                    Some(e) => (e.start + (lblk - u64::from(e.block)), false),
                    // The step is full: the write ends before this folio
                    // (what the folio mapped so far is undone below).
                    None if done > 0 && budget.is_some_and(|b| groups.len() >= b) => {
                        stopped = Some(first_l);
                        break 'pages;
                    }
                    None => {
                        let goal = if i > 0 {
                            ex[i - 1].start + u64::from(ex[i - 1].len)
                        } else {
                            group_goal
                        };
                        match self.alloc_block(goal) {
                            Ok(p) => {
                                fresh.push(p);
                                changed.push(lblk);
                                if budget.is_some() {
                                    groups.insert(self.group_of(p));
                                }
                                insert_extent(
                                    &mut ex,
                                    Extent {
                                        block: lblk as u32,
                                        len: 1,
                                        start: p,
                                        uninit: false,
                                    },
                                );
                                (p, true)
                            }
                            Err(e) => {
                                err = Some(e);
                                failed = Some(first_l);
                                break 'pages;
                            }
                        }
                    }
                };
                maps.push((lblk, pblk, new));
            }
            for &(_, pblk, new) in &maps {
                let pos = off + done as u64;
                let inb = (pos % bs) as usize;
                let n = (self.bs - inb).min(buf.len() - done);
                if n == self.bs {
                    // A whole block: joins the run being gathered when it
                    // follows it on the device (it follows it in `buf`).
                    match &mut run {
                        Some((p, len)) if *p + (*len / self.bs) as u64 == pblk => *len += n,
                        _ => {
                            if let Err((len, e)) = flush(&mut run, done) {
                                done -= len;
                                err = Some(e);
                                break 'pages;
                            }
                            run = Some((pblk, n));
                        }
                    }
                    done += n;
                    continue;
                }
                if let Err((len, e)) = flush(&mut run, done) {
                    done -= len;
                    err = Some(e);
                    break 'pages;
                }
                let chunk = &buf[done..done + n];
                let r = {
                    if new {
                        blockbuf.fill(0);
                    } else if let Err(e) = self.dev.read_at(pblk * bs, &mut blockbuf) {
                        err = Some(e.into());
                        break 'pages;
                    }
                    blockbuf[inb..inb + n].copy_from_slice(chunk);
                    self.dev.write_at(pblk * bs, &blockbuf)
                };
                if let Err(e) = r {
                    err = Some(e.into());
                    break 'pages;
                }
                done += n;
            }
            parts.push((first_l, before));
        }
        // The run gathered last goes out after the loop, also when the
        // loop ended at a folio the step had no room for (`stopped`) or
        // could not map (`failed`): if it fails, its blocks lie before
        // that folio, and the undo must start at the run.
        let mut last_run_failed = false;
        if let Err((len, e)) = flush(&mut run, done) {
            done -= len;
            err.get_or_insert(e);
            last_run_failed = true;
        }
        if err.is_some() || stopped.is_some() {
            // Blocks past what was written keep no mapping of this call:
            // a fresh block would show what its last owner left there (a
            // deleted file's data), an unwritten one would stop reading
            // as zeros. As the kernel's ext4, whose new blocks stay
            // unwritten until their data is on disk.
            // A call that wrote nothing undoes its first block too (a
            // partial one: `off` is not on a block boundary); else the
            // written bytes end on a boundary or at the end of the buffer,
            // and the block they end in was written whole.
            // A folio that could not be mapped whole (`failed`) keeps the
            // blocks it mapped inside the size, written as zeros (the
            // kernel's `folio_zero_new_buffers`); the rest goes (its
            // `ext4_truncate_failed_write`). A folio the step had no room
            // for (`stopped`) goes whole.
            let written_to = if done == 0 {
                off / bs
            } else {
                (off + done as u64).div_ceil(bs)
            };
            let from = if let Some(first) = stopped {
                first
            } else if let Some(first) = failed {
                self.keep_failed_folio(&maps, first, raw.size, off, done)
            } else {
                written_to
            };
            // (A failed last run: from its first block, which lies before
            // the stopped or failed folio.)
            let from = if last_run_failed {
                from.min(written_to)
            } else {
                from
            };
            let back = unmap_unwritten(&mut ex, &changed, &fresh, from);
            if changed.iter().all(|&l| l >= from) {
                // Everything undone: the tree stays as it was.
                converted = false;
            }
            for &p in &back {
                let _ = self.free_fresh_block(p);
            }
            let back: std::collections::HashSet<u64> = back.into_iter().collect();
            fresh.retain(|p| !back.contains(p));
        }
        let mut stored = !fresh.is_empty() || converted;
        let base = raw.clone();
        while stored {
            let mut next = base.clone();
            next.blocks += fresh.len() as u64 * (bs / 512);
            // Tree blocks for the split of an unwritten extent the write
            // converts may take every free block, the reserved pool too:
            // the kernel converts at I/O completion, where its splits
            // cannot fail (EXT4_GET_BLOCKS_METADATA_NOFAIL; checked on
            // 6.18: with the pool all that was free, a write into the
            // middle of an unwritten extent took a leaf from it).
            let r = if converted {
                crate::fs::nofail(|| self.store_extents(&mut next, leaf.clone(), ex.clone(), &tree))
            } else {
                self.store_extents(&mut next, leaf.clone(), ex.clone(), &tree)
            };
            let e = match r {
                Ok(()) => {
                    raw = next;
                    break;
                }
                Err(e) => e,
            };
            // The tree found no block: the data took the last ones, where
            // the kernel's write takes its tree blocks as it goes. The
            // write gives back its last folio (blocks free at once) and
            // tries again, ending there.
            parts.retain(|&(_, b)| b < done);
            match parts.pop() {
                Some((first, before)) if before > 0 && e.errno() == scalevfs::Errno::ENOSPC => {
                    done = before;
                    let back = unmap_unwritten(&mut ex, &changed, &fresh, first);
                    changed.retain(|&l| l < first);
                    for &p in &back {
                        let _ = self.free_fresh_block(p);
                    }
                    let back: std::collections::HashSet<u64> = back.into_iter().collect();
                    fresh.retain(|p| !back.contains(p));
                    stored = !changed.is_empty();
                }
                _ => {
                    for b in fresh {
                        let _ = self.free_fresh_block(b);
                    }
                    return Err(e);
                }
            }
        }
        let t = now();
        if done == 0 {
            let e = err.unwrap_or_else(|| errno(libc::EIO));
            if stored {
                // Blocks of a folio that failed stay (zeros): the times
                // change as the kernel's, which stamps before writing.
                raw.mtime = t;
                raw.ctime = t;
                self.publish(inode, ei, g, raw)?;
            }
            return Err(e);
        }
        if let Ok((rw, _)) = self.rw() {
            // Relaxed: a statistic (s_kbytes_written).
            rw.written.fetch_add(done as u64, Ordering::Relaxed);
        }
        raw.size = raw.size.max(off + done as u64);
        raw.mtime = t;
        raw.ctime = t;
        self.publish(inode, ei, g, raw)?;
        Ok(done)
    }

    /// A folio that could not be mapped whole (its blocks `maps`: logical,
    /// physical, new; its first block `first`), as the kernel's
    /// `folio_zero_new_buffers` then `ext4_truncate_failed_write` leave
    /// it: its new blocks inside the size stay, written as zeros. The
    /// size is the file's (`size`) grown by the `done` bytes the write put
    /// at `off` before this folio. Returns the first block that leaves
    /// the map (a block whose zeros could not be written goes too).
    fn keep_failed_folio(
        &self,
        maps: &[(u64, u64, bool)],
        first: u64,
        size: u64,
        off: u64,
        done: usize,
    ) -> u64 {
        let bs = self.bs as u64;
        let size = if done > 0 {
            size.max(off + done as u64)
        } else {
            size
        };
        let mut cut = size.div_ceil(bs).max(first);
        let zeros = BlockBuf::zeroed(self.bs);
        for &(l, p, new) in maps {
            if new && l < cut && self.dev.write_at(p * bs, &zeros).is_err() {
                cut = l;
            }
        }
        cut
    }

    /// `file_write` for a block-mapped (ext2/3-style) file, which keeps its
    /// map, as in the kernel's ext4 (`ext4_ind_map_blocks`): a block
    /// already mapped is written in place; a hole gets a new block, with
    /// the indirect blocks missing on its way (`map_new_block`). A write
    /// at or past `bitmap_max_size` is EFBIG, one reaching past it ends
    /// there (the kernel's ext4_generic_write_checks). One step per call,
    /// as `file_write`: the write ends short once its allocations reach
    /// `step_groups` groups, each indirect block it fills or changes
    /// (a journaled block) counted as one more.
    fn write_mapped(
        &self,
        inode: &Inode,
        ei: &Ext4Inode,
        g: RwLockWriteGuard<'_, ()>,
        mut raw: RawInode,
        off: u64,
        buf: &[u8],
    ) -> Result<usize> {
        let bs = self.bs as u64;
        let max = self.bitmap_max_size();
        if off >= max {
            return Err(errno(libc::EFBIG));
        }
        let buf = &buf[..(max - off).min(buf.len() as u64) as usize];
        let budget = self.step_groups();
        let mut groups = std::collections::HashSet::new();
        // The indirect blocks this step filled or changed.
        let mut logged = std::collections::HashSet::new();
        let ipg_group = ((raw.ino - 1) / self.sb.inodes_per_group) as u64;
        let mut goal =
            u64::from(self.sb.first_data_block) + ipg_group * u64::from(self.sb.blocks_per_group);
        let mut blockbuf = BlockBuf::zeroed(self.bs);
        let (mut done, mut added, mut err) = (0usize, false, None);
        // A folio at a time (`folio_end`), its blocks mapped before any
        // byte goes out, as `file_write`; `failed`: the first block of a
        // folio that could not be mapped whole. The step's room is
        // checked at each folio's start (a folio's blocks, at most 2 MiB,
        // and their indirect blocks fit in the half handle it keeps).
        let end = off + buf.len() as u64;
        let mut failed: Option<u64> = None;
        let mut maps: Vec<(u64, u64, bool)> = Vec::new();
        'pages: while done < buf.len() {
            let pos = off + done as u64;
            let part_end = folio_end(pos, end).min(off + buf.len() as u64);
            let first_l = pos / bs;
            maps.clear();
            // Below `bitmap_max_size`, so within 32 bits.
            for lblk in first_l..=(part_end - 1) / bs {
                let found = match u32::try_from(lblk) {
                    Ok(l) => self.map_block(&raw, l),
                    Err(_) => Err(errno(libc::EFBIG)),
                };
                let (pblk, new) = match found {
                    Ok(crate::fs::Mapping::Data { pblk, .. }) => (pblk, false),
                    Ok(_)
                        if done > 0
                            && lblk == first_l
                            && budget.is_some_and(|b| groups.len() + logged.len() >= b) =>
                    {
                        break 'pages
                    }
                    Ok(_) => match self.map_new_block(&mut raw, lblk, goal) {
                        Ok((new, hooked)) => {
                            added = true;
                            if budget.is_some() {
                                groups.extend(new.iter().map(|&b| self.group_of(b)));
                                logged.extend(new[..new.len() - 1].iter().copied().chain(hooked));
                            }
                            (new[new.len() - 1], true)
                        }
                        Err(e) => {
                            err = Some(e);
                            failed = Some(first_l);
                            break 'pages;
                        }
                    },
                    Err(e) => {
                        err = Some(e);
                        failed = Some(first_l);
                        break 'pages;
                    }
                };
                goal = pblk + 1;
                maps.push((lblk, pblk, new));
            }
            for k in 0..maps.len() {
                let (_, pblk, new) = maps[k];
                let pos = off + done as u64;
                let inb = (pos % bs) as usize;
                let n = (self.bs - inb).min(buf.len() - done);
                let chunk = &buf[done..done + n];
                let r = if n == self.bs {
                    self.dev.write_at(pblk * bs, chunk)
                } else {
                    let r = if new {
                        blockbuf.fill(0);
                        Ok(())
                    } else {
                        self.dev.read_at(pblk * bs, &mut blockbuf)
                    };
                    r.and_then(|()| {
                        blockbuf[inb..inb + n].copy_from_slice(chunk);
                        self.dev.write_at(pblk * bs, &blockbuf)
                    })
                };
                if let Err(e) = r {
                    err = Some(e.into());
                    // The blocks just hooked in from here leave the map
                    // again (with the indirect blocks they brought): they
                    // hold what their last owner left there, not this
                    // write's data.
                    for &(l, _, new) in &maps[k..] {
                        if new {
                            self.check(self.cut_block_map_range(&mut raw, l, l + 1))
                                .map_err(|e| self.stop_writes(e))?;
                        }
                    }
                    break 'pages;
                }
                done += n;
            }
        }
        if let Some(first) = failed {
            let cut = self.keep_failed_folio(&maps, first, raw.size, off, done);
            if let Some(&(last, _, _)) = maps.last() {
                if last >= cut {
                    self.check(self.cut_block_map_range(&mut raw, cut, last + 1))
                        .map_err(|e| self.stop_writes(e))?;
                }
            }
        }
        if done == 0 && !added {
            return Err(err.unwrap_or_else(|| errno(libc::EIO)));
        }
        if let Ok((rw, _)) = self.rw() {
            // Relaxed: a statistic (s_kbytes_written).
            rw.written.fetch_add(done as u64, Ordering::Relaxed);
        }
        // The map changed (blocks hooked in) whether or not their data
        // went out: stored in any case.
        // A write that wrote nothing leaves the size as it was.
        let t = now();
        if done > 0 {
            raw.size = raw.size.max(off + done as u64);
        }
        raw.mtime = t;
        raw.ctime = t;
        self.publish(inode, ei, g, raw)?;
        match err {
            Some(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    /// Zero the byte ranges `zero` (each inside one block) where `ex` maps
    /// them to written blocks (holes and unwritten blocks read as zeros).
    fn zero_written(&self, ex: &[Extent], zero: &[(u64, u64)]) -> Result<()> {
        let bs = self.bs as u64;
        let mut buf = BlockBuf::zeroed(self.bs);
        for &(a, b) in zero {
            if a >= b {
                continue;
            }
            let lblk = a / bs;
            let i = ex.partition_point(|e| u64::from(e.block) <= lblk);
            if let Some(e) = (i > 0)
                .then(|| ex[i - 1])
                .filter(|e| !e.uninit && lblk < u64::from(e.block) + u64::from(e.len))
            {
                let p = e.start + (lblk - u64::from(e.block));
                self.dev.read_at(p * bs, &mut buf)?;
                buf[(a % bs) as usize..((b - 1) % bs + 1) as usize].fill(0);
                self.dev.write_at(p * bs, &buf)?;
            }
        }
        Ok(())
    }

    /// Bitmap groups one step of a long operation may touch (see the
    /// module comment): half of the handle limit, so that a step added to
    /// a running transaction just under the limit still fits the log;
    /// fewer (at least one) while other threads' steps hold the rest of
    /// the log's room. Inside a handle the first call reserves the log
    /// blocks of a step and of the reap that may follow it in the same
    /// handle, until the handle ends (`Journal::reserve_step`); later
    /// calls in the handle get the same size. `None` without a journal:
    /// one step does everything.
    pub(crate) fn step_groups(&self) -> Option<usize> {
        let j = self.journal()?;
        let full = (j.limit() / 2).max(1);
        if !crate::txn::Handle::nested(j) {
            return Some(full);
        }
        let est = self
            .rw
            .as_ref()
            .map_or(0, |rw| j.txn_estimate(rw.bufs.dirty_count()));
        Some(j.reserve_step(est, full))
    }

    /// Group of physical block `p`.
    pub(crate) fn group_of(&self, p: u64) -> u64 {
        p.saturating_sub(u64::from(self.sb.first_data_block))
            / u64::from(self.sb.blocks_per_group).max(1)
    }

    /// Where one step freeing the blocks of logical `from..to` from the end
    /// should start: the lowest `cut >= from` such that the blocks mapped
    /// in `cut..to` lie in at most `budget` groups, less what rewriting a
    /// tree of `tree` blocks may need (its blocks' bitmaps, its new
    /// blocks). `from` when everything fits.
    fn tail_cut(&self, ex: &[Extent], tree: usize, from: u64, to: u64, budget: usize) -> u64 {
        let left = budget.saturating_sub(2 * tree + 2).max(1);
        let bpg = u64::from(self.sb.blocks_per_group).max(1);
        let fdb = u64::from(self.sb.first_data_block);
        let mut groups = std::collections::HashSet::new();
        for e in ex.iter().rev() {
            let (eb, ee) = (u64::from(e.block), u64::from(e.block) + u64::from(e.len));
            if ee <= from {
                break;
            }
            if eb >= to {
                continue;
            }
            let lo = eb.max(from);
            let mut hi = ee.min(to);
            // One run of the extent per group, from its end.
            while hi > lo {
                let g = self.group_of(e.start + (hi - 1 - eb));
                if groups.insert(g) && groups.len() > left {
                    return hi;
                }
                let gstart = fdb + g * bpg;
                hi = (eb + gstart.saturating_sub(e.start)).max(lo);
            }
        }
        from
    }

    /// Remove the data of logical blocks `from..to` and zero the bytes
    /// `zero` (a byte range inside the file's partial blocks), in the
    /// caller's handle.
    pub(crate) fn drop_range(
        &self,
        raw: &mut RawInode,
        from: u64,
        mut to: u64,
        zero: &[(u64, u64)],
    ) -> Result<()> {
        let mut zero = zero;
        let mut first = true;
        loop {
            let cut = match self.drop_range_step(raw, from, to, zero, None) {
                Ok(cut) => cut,
                // A failure after earlier rounds changed the tree, the
                // bitmaps and `raw`, which the caller will not store: the
                // filesystem stops writing, so that this half-made change
                // never commits (the kernel's ext4_error).
                Err(e) if !first => return Err(self.stop_writes(e)),
                Err(e) => return Err(e),
            };
            if cut <= from {
                return Ok(());
            }
            (to, zero, first) = (cut, &[], false);
        }
    }

    /// Zero the byte ranges `zero` (each inside one block) where the file
    /// maps them to written blocks (holes and unwritten blocks read as
    /// zeros), looking each block up in the tree.
    fn zero_mapped(&self, raw: &RawInode, zero: &[(u64, u64)]) -> Result<()> {
        let bs = self.bs as u64;
        let mut buf = BlockBuf::zeroed(self.bs);
        for &(a, b) in zero {
            let lblk = a / bs;
            if a >= b || lblk >= u64::from(u32::MAX) {
                continue;
            }
            if let crate::fs::Mapping::Data {
                pblk,
                uninit: false,
                ..
            } = self.map_block(raw, lblk as u32)?
            {
                self.dev.read_at(pblk * bs, &mut buf)?;
                buf[(a % bs) as usize..((b - 1) % bs + 1) as usize].fill(0);
                self.dev.write_at(pblk * bs, &buf)?;
            }
        }
        Ok(())
    }

    /// One step of `drop_range`: only the end `cut..to` of the range, and
    /// returns `cut` (`from`: all done). The step ends at the last leaf
    /// the range touches when that leaf keeps some extents (in a tree of
    /// depth >= 1): that leaf alone changes (`store_leaf`: in place, or
    /// split, its keys above corrected), not the whole tree; a range
    /// that empties leaves rewrites the whole tree once. With a `budget`
    /// (`step_groups`), also only as much as frees blocks in at most that
    /// many groups (`tail_cut`). The tree, `i_blocks` and the freed blocks
    /// agree after each step, so a transaction boundary between steps
    /// leaves a valid file. `zero` is zeroed first, whatever the step.
    pub(crate) fn drop_range_step(
        &self,
        raw: &mut RawInode,
        from: u64,
        to: u64,
        zero: &[(u64, u64)],
        budget: Option<usize>,
    ) -> Result<u64> {
        // The splits of a removal may take every free block.
        let _nofail = crate::fs::NofailScope::enter();
        let bs = self.bs as u64;
        self.zero_mapped(raw, zero)?;
        if from >= to {
            return Ok(from);
        }
        // With a budget, a range that empties leaves goes the whole-tree
        // way, whose steps reach further (each step of the callers reads
        // the whole list anyway), where the tree's rewrite fits one
        // transaction; a larger tree (a small log, tens of thousands of
        // extents) goes leaf by leaf, as in one handle, or a truncate to 0
        // or an unlink of it failed with ENOSPC at every step.
        let leaf = match self.descend(raw, to - 1, (from, to - 1))? {
            Some(l) if budget.is_some() && !l.holds_outside(from.max(l.lo), to) => {
                let (ex, tree) = self.collect_extents(raw)?;
                if self.tree_rewrite_fits(ex.len(), tree.len()) {
                    None
                } else {
                    Some(l)
                }
            }
            l => l,
        };
        let (mut ex, tree, tree_len) = self.extents_of(raw, &leaf)?;
        let from = leaf.as_ref().map_or(from, |l| from.max(l.lo));
        let cut = budget.map_or(from, |b| self.tail_cut(&ex, tree_len, from, to, b));
        let before = ex.len();
        let freed = remove_range(&mut ex, cut, to);
        if freed.is_empty() && before == ex.len() {
            return Ok(cut);
        }
        // The new tree first (it may need a block: a split extent), then
        // the data blocks go back. ENOSPC comes before anything changed;
        // any other failure may come after part of it, which the caller
        // will not store: the filesystem then stops writing.
        let r = (|| -> Result<u64> {
            let mut n = 0;
            match leaf {
                Some(l) => {
                    let small = l.count_after(&ex) <= 4;
                    self.store_leaf(raw, l, ex)?;
                    if small {
                        self.shrink_small_tree(raw)?;
                    }
                }
                None => self.rebuild_tree(raw, &ex, &tree)?,
            }
            for (s, c) in freed {
                for b in s..s + c {
                    self.free_block(b)?;
                    n += 1;
                }
            }
            raw.blocks = raw.blocks.saturating_sub(n * (bs / 512));
            Ok(cut)
        })();
        match r {
            Err(e) if e.errno() != scalevfs::Errno::ENOSPC => Err(self.stop_writes(e)),
            r => r,
        }
    }

    /// Whether freeing the blocks of `from..to` needs more than one step.
    fn needs_steps(&self, raw: &RawInode, from: u64, to: u64) -> Result<bool> {
        let Some(b) = self.step_groups() else {
            return Ok(false);
        };
        // The range inside the leaf holding its last block (a truncate
        // near the end of a deep tree): that leaf's extents say.
        if to > from {
            let l = self.descend(raw, to - 1, (from, to - 1))?;
            if let Some(l) = l.filter(|l| from >= l.lo) {
                return Ok(self.tail_cut(&l.ex, 1, from, to, b) > from);
            }
        }
        let (ex, tree) = self.collect_extents(raw)?;
        Ok(self.tail_cut(&ex, tree.len(), from, to, b) > from)
    }

    /// `truncate` of the VFS (and setattr's size). A shrink whose frees
    /// do not fit one step (`step_groups`) only starts here, as
    /// ext4_truncate with handle restarts: in this handle the partial last
    /// block is zeroed, the new size stored and the inode recorded as an
    /// orphan (orphan file slot or orphan list); the caller then runs
    /// `truncate_rest` outside this handle. Returns the orphan record of
    /// such a long truncate.
    pub(crate) fn file_truncate(
        &self,
        inode: &Arc<Inode>,
        size: u64,
    ) -> Result<Option<OrphanSlot>> {
        self.rw()?;
        if size > self.max_size() {
            return Err(errno(libc::EFBIG));
        }
        let ei = inode
            .private::<Ext4Inode>()
            .ok_or_else(|| errno(libc::EIO))?;
        // An inline file cut (or kept) stays inline, as the kernel's
        // ext4_inline_data_truncate; one that grows moves out first
        // (`file_raw`). A file that is not inline but may take inline data
        // keeps that through a truncate (the kernel's state survives it).
        let keep_may_inline = {
            let g = ei.data.write();
            let mut raw = ei.raw();
            let inline = raw.flags & FL_INLINE_DATA != 0;
            if inline && size <= raw.size {
                self.inline_truncate(&mut raw, size)?;
                let t = now();
                raw.size = size;
                raw.mtime = t;
                raw.ctime = t;
                self.publish(inode, ei, g, raw)?;
                return Ok(None);
            }
            // Relaxed: see `Ext4Inode::may_inline`.
            !inline && ei.may_inline.load(Ordering::Relaxed)
        };
        let (ei, g, mut raw) = self.file_raw(inode, OnMap::Keep)?;
        if keep_may_inline {
            ei.may_inline.store(true, Ordering::Relaxed);
        }
        let bs = self.bs as u64;
        let mut long = None;
        // As ext4_setattr: ext4_truncate runs even when the size does not
        // change, freeing blocks preallocated past EOF (the EOF block's
        // tail is already zeros then).
        if size <= raw.size {
            let keep = size.div_ceil(bs);
            let zero = if !size.is_multiple_of(bs) && size < raw.size {
                vec![(size, keep * bs)]
            } else {
                vec![]
            };
            if raw.flags & FL_EXTENTS == 0 {
                // Block-mapped: its map cut, nothing allocated (the
                // kernel's ext4_ind_truncate), a step per handle when it
                // does not fit one (`truncate_rest`).
                self.zero_mapped(&raw, &zero)?;
                let cut = match self.step_groups() {
                    Some(b) => self.block_map_cut(&raw, keep, b)?,
                    None => keep,
                };
                if cut > keep {
                    long = Some(self.orphan_add_live(&mut raw)?);
                } else {
                    self.check(self.cut_block_map(&mut raw, keep))
                        .map_err(|e| self.stop_writes(e))?;
                }
            } else if self.needs_steps(&raw, keep, 1 << 32)? {
                self.drop_range(&mut raw, keep, keep, &zero)?;
                long = Some(self.orphan_add_live(&mut raw)?);
            } else {
                self.drop_range(&mut raw, keep, 1 << 32, &zero)?;
            }
        }
        let t = now();
        raw.size = size;
        raw.mtime = t;
        raw.ctime = t;
        self.publish(inode, ei, g, raw)?;
        Ok(long)
    }

    /// The rest of a long truncate (`file_truncate` returned its orphan
    /// record `slot`), outside any handle, the VFS's data lock held: free
    /// the blocks past the size from the end, one handle per step (each
    /// may commit the running transaction first, `Ext4::handle`), the
    /// tree, `i_blocks` and the frees consistent at each step; the last
    /// step removes the orphan record. A crash between steps leaves an
    /// orphan at its new size, which the next mount (or e2fsck) truncates.
    pub(crate) fn truncate_rest(&self, inode: &Arc<Inode>, slot: OrphanSlot) -> Result<()> {
        let bs = self.bs as u64;
        loop {
            let done = self.journaled(|| {
                let (ei, g, mut raw) = self.file_raw(inode, OnMap::Keep)?;
                let keep = raw.size.div_ceil(bs);
                let cut = if raw.flags & FL_EXTENTS == 0 {
                    let cut = match self.step_groups() {
                        Some(b) => self.block_map_cut(&raw, keep, b)?,
                        None => keep,
                    };
                    self.check(self.cut_block_map(&mut raw, cut))
                        .map_err(|e| self.stop_writes(e))?;
                    cut
                } else {
                    self.drop_range_step(&mut raw, keep, 1 << 32, &[], self.step_groups())?
                };
                let done = cut <= keep;
                // The step is made: a failure storing it stops writes.
                (|| {
                    if done {
                        self.orphan_remove_live(slot, &mut raw)?;
                    }
                    self.publish(inode, ei, g, raw)
                })()
                .map_err(|e| self.stop_writes(e))?;
                Ok(done)
            })?;
            if done {
                return Ok(());
            }
        }
    }

    /// fallocate PUNCH_HOLE|KEEP_SIZE.
    /// A hole whose frees do not fit one step (`step_groups`) is punched
    /// from its end, this handle taking the first step: returns the rest
    /// `(from, to)` for `punch_rest`. (A crash between steps leaves part
    /// of the hole punched, a valid file, as the kernel's punch would.)
    pub(crate) fn file_punch(
        &self,
        inode: &Arc<Inode>,
        off: u64,
        len: u64,
    ) -> Result<Option<(u64, u64)>> {
        self.rw()?;
        let (ei, g, mut raw) = self.file_raw(inode, OnMap::Keep)?;
        let bs = self.bs as u64;
        if off >= raw.size {
            return Ok(None);
        }
        // As ext4_punch_hole: a hole reaching past EOF ends at the end of
        // the page holding EOF instead (the kernel's PAGE_SIZE, 4 KiB on
        // x86), so the EOF block goes whole, and with 1 KiB blocks also the
        // (preallocated) blocks after it up to that page's end.
        let page = bs.max(4096);
        let mut end = off.saturating_add(len);
        if end > raw.size {
            end = raw.size.div_ceil(page).saturating_mul(page);
        }
        let first_full = off.div_ceil(bs);
        let last_full = end / bs;
        let mut zero = Vec::new();
        if first_full > last_full {
            zero.push((off, end));
        } else {
            zero.push((off, first_full * bs));
            zero.push((last_full * bs, end));
        }
        let to = last_full.max(first_full);
        let cut = if raw.flags & FL_EXTENTS == 0 {
            self.zero_mapped(&raw, &zero)?;
            self.punch_mapped_step(&mut raw, first_full, to)?
        } else {
            self.drop_range_step(&mut raw, first_full, to, &zero, self.step_groups())?
        };
        let t = now();
        raw.mtime = t;
        raw.ctime = t;
        self.publish(inode, ei, g, raw)?;
        Ok((cut > first_full).then_some((first_full, cut)))
    }

    /// One step of a punch of logical blocks `from..to` of a block-mapped
    /// file (the kernel's `ext4_ind_remove_space`), from the end: frees
    /// what lies in `cut..to`, the most that fits one step
    /// (`block_map_cut_range`), and returns `cut` (`from`: all done).
    /// Nothing is allocated. A failure once something was freed stops
    /// writes (the step would commit half made).
    fn punch_mapped_step(&self, raw: &mut RawInode, from: u64, to: u64) -> Result<u64> {
        if to <= from {
            return Ok(from);
        }
        let cut = match self.step_groups() {
            Some(b) => self.block_map_cut_range(raw, from, to, b)?,
            None => from,
        };
        self.check(self.cut_block_map_range(raw, cut, to))
            .map_err(|e| self.stop_writes(e))?;
        Ok(cut)
    }

    /// The rest of a long punch (`file_punch`): logical blocks
    /// `from..to` freed from the end, one handle per step, outside any
    /// handle (the VFS's data lock held).
    pub(crate) fn punch_rest(&self, inode: &Arc<Inode>, from: u64, mut to: u64) -> Result<()> {
        while to > from {
            to = self.journaled(|| {
                let (ei, g, mut raw) = self.file_raw(inode, OnMap::Keep)?;
                let cut = if raw.flags & FL_EXTENTS == 0 {
                    self.punch_mapped_step(&mut raw, from, to)?
                } else {
                    self.drop_range_step(&mut raw, from, to, &[], self.step_groups())?
                };
                raw.ctime = now();
                raw.mtime = raw.ctime;
                // The step is made: a failure storing it stops writes.
                self.publish(inode, ei, g, raw)
                    .map_err(|e| self.stop_writes(e))?;
                Ok(cut)
            })?;
        }
        Ok(())
    }

    /// fallocate mode 0: unwritten extents over the holes of the range
    /// (read as zeros until written; the VFS grows the size unless
    /// KEEP_SIZE). One step (`step_groups`) per call: returns the byte
    /// offset where the rest of the range starts when the allocations
    /// reached that many groups, for the caller to continue in a new
    /// handle. On ENOSPC the blocks taken so far stay allocated, as the
    /// kernel's ext4_alloc_file_blocks leaves the chunks it mapped (and the
    /// VFS grows the size over them unless KEEP_SIZE).
    pub(crate) fn file_fallocate(
        &self,
        inode: &Arc<Inode>,
        off: u64,
        len: u64,
    ) -> Result<Option<u64>> {
        self.rw()?;
        let (ei, g, mut raw) = self.file_raw(inode, OnMap::Refuse)?;
        let bs = self.bs as u64;
        let end = off.checked_add(len).ok_or_else(|| errno(libc::EFBIG))?;
        if len == 0 {
            return Err(errno(libc::EINVAL));
        }
        let (first, last) = (off / bs, (end - 1) / bs);
        if last >= u64::from(u32::MAX) {
            return Err(errno(libc::EFBIG));
        }
        // In a deeper tree, this call fills the holes of the leaf holding
        // `first` only, and only that leaf's path changes (as
        // `file_write`); the caller goes on from the next leaf in a new
        // handle, as it does after a step.
        let (leaf, last, clipped) = self.clip_to_leaf(&raw, first, last)?;
        let (mut ex, tree, tree_len) = self.extents_of(&raw, &leaf)?;
        let mut fresh = Vec::new();
        let budget = self
            .step_groups()
            .map(|b| b.saturating_sub(2 * tree_len + 2).max(1));
        // Out of space part way: the blocks taken so far stay, as the
        // kernel's ext4_alloc_file_blocks keeps the chunks it mapped (the
        // VFS grows the size over them); the error is returned after.
        let mut short = None;
        let r = match self.fill_holes(&mut ex, first, last, &mut fresh, budget) {
            Err(e) if e.errno() == scalevfs::Errno::ENOSPC && !fresh.is_empty() => {
                short = Some(e);
                Ok(None)
            }
            r => r,
        };
        let r = match r {
            Ok(rest) if fresh.is_empty() => Ok(rest.or(clipped)),
            Ok(rest) if short.is_some() => self
                .store_short(&mut raw, leaf, ex, &tree, &mut fresh)
                .map(|()| rest.or(clipped)),
            Ok(rest) => {
                raw.blocks += fresh.len() as u64 * (bs / 512);
                self.store_extents(&mut raw, leaf, ex, &tree)
                    .map(|()| rest.or(clipped))
            }
            Err(e) => Err(e),
        };
        let rest = match r {
            Ok(rest) => rest,
            Err(e) => {
                for b in fresh {
                    let _ = self.free_block(b);
                }
                return Err(e);
            }
        };
        // mtime too, as the kernel's ext4_fallocate (file_modified) for
        // every mode.
        raw.ctime = now();
        raw.mtime = raw.ctime;
        self.publish(inode, ei, g, raw)?;
        match short {
            Some(e) => Err(e),
            None => Ok(rest.map(|l| l * bs)),
        }
    }

    /// Store the extents of a fallocate that ran out of space part way
    /// (`fresh`: the data blocks it took, in logical order). The tree may
    /// need blocks (a leaf, an index level) that are no longer free, so
    /// the last data blocks taken become the tree's instead, as few as
    /// will do (`fs::with_spares`; a failed try changes nothing and gives
    /// its blocks back to the spares). The kernel inserts each chunk as it
    /// allocates it and so takes its tree blocks on the way; either way
    /// the space ends used up, and a later write sees ENOSPC alike. On
    /// success `fresh` holds the data blocks kept; on failure every block
    /// taken, for the caller to free.
    fn store_short(
        &self,
        raw: &mut RawInode,
        leaf: Option<LeafAt>,
        mut ex: Vec<Extent>,
        tree: &[u64],
        fresh: &mut Vec<u64>,
    ) -> Result<()> {
        // The deepest tree needs a leaf and an index block per level, and
        // a new root level: more than that is not a want of tree blocks.
        const MOST: usize = extent::MAX_DEPTH as usize + 2;
        let unit = self.bs as u64 / 512;
        let mut spares: Vec<u64> = Vec::new();
        loop {
            let (r, unused) = crate::fs::with_spares(spares.clone(), || {
                let mut r2 = raw.clone();
                r2.blocks += (fresh.len() as u64) * unit;
                self.store_extents(&mut r2, leaf.clone(), ex.clone(), tree)
                    .map(|()| r2)
            });
            let e = match r {
                Ok(r2) => {
                    *raw = r2;
                    // A spare the tree did not take (its need fell as the
                    // data shrank) goes back; `raw.blocks` never counted
                    // it (the tree counts the blocks it takes).
                    for b in unused {
                        self.free_block(b)?;
                    }
                    return Ok(());
                }
                Err(e) => e,
            };
            let more = e.errno() == scalevfs::Errno::ENOSPC && spares.len() < MOST;
            // Popped only when it will be tried: a block popped and then
            // dropped would be in neither list, allocated and never
            // freed (a leak e2fsck reports, seen with three threads
            // filling the filesystem at once).
            let Some(p) = (if more { fresh.pop() } else { None }) else {
                fresh.extend(spares);
                return Err(e);
            };
            // Its logical block leaves the new extents.
            let l = ex
                .iter()
                .find(|x| p >= x.start && p < x.start + u64::from(x.len))
                .map(|x| u64::from(x.block) + (p - x.start));
            match l {
                Some(l) => {
                    remove_range(&mut ex, l, l + 1);
                }
                None => {
                    fresh.push(p);
                    fresh.extend(spares);
                    return Err(e);
                }
            }
            spares.push(p);
        }
    }

    /// Unwritten extents of new blocks over the holes of logical blocks
    /// `first..=last` of `ex`; the blocks taken are pushed on `fresh`
    /// (the caller frees them if it fails). With `budget`, stops once the
    /// blocks taken lie in that many groups: returns the next logical
    /// block then.
    fn fill_holes(
        &self,
        ex: &mut Vec<Extent>,
        first: u64,
        last: u64,
        fresh: &mut Vec<u64>,
        budget: Option<usize>,
    ) -> Result<Option<u64>> {
        let mut goal = 0;
        let mut groups = std::collections::HashSet::new();
        for lblk in first..=last {
            // Stop before a block that would likely land in one group more
            // than the budget (the allocator starts at `goal`), and in any
            // case past it: the allocator may move on to another group
            // while `goal`'s is counted, so a step touches at most one
            // group more than the budget.
            if budget.is_some_and(|b| {
                groups.len() > b || (groups.len() >= b && !groups.contains(&self.group_of(goal)))
            }) {
                return Ok(Some(lblk));
            }
            let i = ex.partition_point(|e| u64::from(e.block) <= lblk);
            if let Some(e) = i.checked_sub(1).map(|j| ex[j]) {
                if lblk < u64::from(e.block) + u64::from(e.len) {
                    goal = e.start + (lblk - u64::from(e.block)) + 1;
                    continue;
                }
                if goal == 0 {
                    goal = e.start + u64::from(e.len);
                }
            }
            let p = self.alloc_block(goal)?;
            fresh.push(p);
            if budget.is_some() {
                groups.insert(self.group_of(p));
            }
            goal = p + 1;
            insert_extent(
                ex,
                Extent {
                    block: lblk as u32,
                    len: 1,
                    start: p,
                    uninit: true,
                },
            );
        }
        Ok(None)
    }

    /// fallocate ZERO_RANGE (the VFS grows the size afterwards unless
    /// KEEP_SIZE), as ext4_zero_range: every block the range touches is
    /// allocated (unwritten extents over its holes), the written blocks
    /// wholly inside it become unwritten in place (same physical blocks,
    /// nothing freed), and the bytes of the partial blocks at its ends are
    /// zeroed where those blocks are written. ENOSPC changes nothing: the
    /// blocks and the new tree come first, the partial blocks' data last.
    ///
    /// One step (`step_groups`) of allocation per call, as `file_fallocate`:
    /// returns the (block-aligned) byte offset where the rest starts, for
    /// the caller to continue in a new handle.
    pub(crate) fn file_zero_range(
        &self,
        inode: &Arc<Inode>,
        off: u64,
        len: u64,
    ) -> Result<Option<u64>> {
        self.rw()?;
        let (ei, g, mut raw) = self.file_raw(inode, OnMap::Refuse)?;
        let bs = self.bs as u64;
        if len == 0 {
            return Err(errno(libc::EINVAL));
        }
        let end = off.checked_add(len).ok_or_else(|| errno(libc::EFBIG))?;
        let (first, last) = (off / bs, (end - 1) / bs);
        if last >= u64::from(u32::MAX) {
            return Err(errno(libc::EFBIG));
        }
        // In a deeper tree, one leaf per call (as `file_fallocate`).
        let (leaf, last, clipped) = self.clip_to_leaf(&raw, first, last)?;
        let (mut ex, tree, tree_len) = self.extents_of(&raw, &leaf)?;
        let mut fresh = Vec::new();
        let budget = self
            .step_groups()
            .map(|b| b.saturating_sub(2 * tree_len + 2).max(1));
        let mut stop = None;
        let r = self
            .fill_holes(&mut ex, first, last, &mut fresh, budget)
            .map(|s| stop = s.or(clipped));
        if let Err(e) = r {
            if e.errno() == scalevfs::Errno::ENOSPC && !fresh.is_empty() {
                return self.zero_range_short(
                    inode,
                    ei,
                    g,
                    raw,
                    (off, end),
                    leaf,
                    ex,
                    &tree,
                    fresh,
                    e,
                );
            }
            for b in fresh {
                let _ = self.free_block(b);
            }
            return Err(e);
        }
        let mut r = Ok(());
        let ex_zero = ex.clone();
        {
            let (from, to) = (off.div_ceil(bs), stop.map_or(end / bs, |s| s.min(end / bs)));
            let converted = from < to && mark_unwritten(&mut ex, from, to);
            if converted || !fresh.is_empty() {
                raw.blocks += fresh.len() as u64 * (bs / 512);
                r = self.store_extents(&mut raw, leaf, ex, &tree);
            }
        }
        if let Err(e) = r {
            for b in fresh {
                let _ = self.free_block(b);
            }
            return Err(e);
        }
        // The partial blocks at the ends (one if the range is inside one);
        // the end's in the last step only.
        let mut zero = Vec::new();
        if !off.is_multiple_of(bs) {
            zero.push((off, end.min((first + 1) * bs)));
        }
        if stop.is_none() && !end.is_multiple_of(bs) && (last != first || off.is_multiple_of(bs)) {
            zero.push((off.max(last * bs), end));
        }
        // (The partial blocks keep their state: the mapping before the
        // conversion says where they are written.)
        let r = self.zero_written(&ex_zero, &zero);
        let t = now();
        raw.mtime = t;
        raw.ctime = t;
        // The tree changed whatever the data write did: store it.
        self.publish(inode, ei, g, raw)?;
        r.map(|()| stop.map(|s| s * bs))
    }

    /// ZERO_RANGE out of space part way (`fresh` non-empty), as the
    /// kernel's ext4_zero_range, whose ext4_alloc_file_blocks keeps the
    /// chunks it mapped before the failure: the blocks taken stay
    /// (`store_short`), the written blocks before the first hole left
    /// become unwritten if the range is block-aligned (the kernel
    /// converts chunk by chunk; with unaligned ends its first pass only
    /// allocates, and fails there), no partial block is zeroed (that
    /// comes last), and ENOSPC is returned; the VFS grows the size over
    /// what was mapped.
    #[allow(clippy::too_many_arguments)]
    fn zero_range_short(
        &self,
        inode: &Arc<Inode>,
        ei: &Ext4Inode,
        g: RwLockWriteGuard<'_, ()>,
        mut raw: RawInode,
        (off, end): (u64, u64),
        leaf: Option<LeafAt>,
        mut ex: Vec<Extent>,
        tree: &[u64],
        mut fresh: Vec<u64>,
        e: crate::Error,
    ) -> Result<Option<u64>> {
        let bs = self.bs as u64;
        if off.is_multiple_of(bs) && end.is_multiple_of(bs) {
            let hole = first_hole(&ex, off / bs);
            let from = off / bs;
            if from < hole {
                mark_unwritten(&mut ex, from, hole);
            }
        }
        if let Err(e2) = self.store_short(&mut raw, leaf, ex, tree, &mut fresh) {
            for b in fresh {
                let _ = self.free_block(b);
            }
            return Err(e2);
        }
        let t = now();
        raw.mtime = t;
        raw.ctime = t;
        self.publish(inode, ei, g, raw)?;
        Err(e)
    }

    /// Before a COLLAPSE_RANGE whose frees do not fit one step: the range
    /// to punch first, a step per handle (`punch_rest`), so that the
    /// collapse itself only shifts. `None`: the collapse fits one handle
    /// (or is invalid: `file_collapse` says so).
    pub(crate) fn collapse_prefree(
        &self,
        inode: &Arc<Inode>,
        off: u64,
        len: u64,
    ) -> Result<Option<(u64, u64)>> {
        let (_ei, _g, raw) = self.file_raw(inode, OnMap::Refuse)?;
        let bs = self.bs as u64;
        let valid = off.is_multiple_of(bs)
            && len.is_multiple_of(bs)
            && len != 0
            && matches!(off.checked_add(len), Some(e) if e < raw.size);
        if !valid {
            return Ok(None);
        }
        let (a, b) = (off / bs, (off + len) / bs);
        Ok(self.needs_steps(&raw, a, b)?.then_some((a, b)))
    }

    /// fallocate COLLAPSE_RANGE, as ext4_collapse_range: `off` and `len`
    /// block-aligned and the range ending before EOF (EINVAL); its blocks
    /// are freed (pending until the commit) and every extent after it
    /// moves down by `len` blocks, joined with its new left neighbour
    /// where they continue each other; the size shrinks by `len`. One
    /// handle: a crash leaves the file as before or as after, when the
    /// range's frees fit one step; a larger range is punched first, a
    /// step per handle (`collapse_prefree`), as the kernel's collapse
    /// restarts its handle while removing the range. `false`, with
    /// nothing changed, when the tree is too large to rewrite in one
    /// handle (then `collapse_stepped`).
    pub(crate) fn file_collapse(&self, inode: &Arc<Inode>, off: u64, len: u64) -> Result<bool> {
        self.rw()?;
        let (ei, g, mut raw) = self.file_raw(inode, OnMap::Refuse)?;
        let bs = self.bs as u64;
        if !off.is_multiple_of(bs) || !len.is_multiple_of(bs) || len == 0 {
            return Err(errno(libc::EINVAL));
        }
        if !matches!(off.checked_add(len), Some(e) if e < raw.size) {
            return Err(errno(libc::EINVAL));
        }
        // Below the size, so below 2^32 blocks.
        let (a, k) = (off / bs, len / bs);
        let (mut ex, tree) = self.collect_extents(&raw)?;
        let before = ex.clone();
        let freed = remove_range(&mut ex, a, a + k);
        for e in ex.iter_mut().filter(|e| u64::from(e.block) >= a + k) {
            e.block -= k as u32;
        }
        merge_adjacent(&mut ex);
        if ex != before {
            if !self.tree_rewrite_fits(ex.len(), tree.len()) {
                // Too large for one transaction: nothing changed; the
                // caller punches and shifts leaf by leaf (`shift_step`).
                return Ok(false);
            }
            self.rebuild_tree(&mut raw, &ex, &tree)?;
        }
        let mut n = 0;
        for (s, c) in freed {
            for b in s..s + c {
                self.free_block(b)?;
                n += 1;
            }
        }
        raw.blocks = raw.blocks.saturating_sub(n * (bs / 512));
        raw.size -= len;
        let t = now();
        raw.mtime = t;
        raw.ctime = t;
        self.publish(inode, ei, g, raw)?;
        Ok(true)
    }

    /// fallocate INSERT_RANGE, as ext4_insert_range: `off` and `len`
    /// block-aligned (EINVAL), the new size within the maximum (EFBIG),
    /// `off` below the size (EINVAL); the extent holding `off` splits
    /// there and every extent from `off` on moves up by `len` blocks,
    /// leaving a hole; the size grows by `len`. One handle; `false`, with
    /// nothing changed, when the tree is too large to rewrite in one
    /// (then `insert_stepped`).
    pub(crate) fn file_insert(&self, inode: &Arc<Inode>, off: u64, len: u64) -> Result<bool> {
        self.rw()?;
        let (ei, g, mut raw) = self.file_raw(inode, OnMap::Refuse)?;
        let bs = self.bs as u64;
        if !off.is_multiple_of(bs) || !len.is_multiple_of(bs) || len == 0 {
            return Err(errno(libc::EINVAL));
        }
        if len > self.max_size().saturating_sub(raw.size) {
            return Err(errno(libc::EFBIG));
        }
        if off >= raw.size {
            return Err(errno(libc::EINVAL));
        }
        let (a, k) = (off / bs, len / bs);
        let (mut ex, tree) = self.collect_extents(&raw)?;
        // The whole tree is rewritten in this one handle (the split may
        // add an extent): one too large for a transaction goes leaf by
        // leaf instead (`insert_prepare`, `shift_step`), nothing changed
        // here.
        if !self.tree_rewrite_fits(ex.len() + 1, tree.len()) {
            return Ok(false);
        }
        split_at(&mut ex, a);
        // Blocks preallocated past EOF move too: they must stay below the
        // last logical block.
        if let Some(l) = ex.last().filter(|l| u64::from(l.block) >= a) {
            // EINVAL, as the kernel's ext4_ext_shift_extents.
            if u64::from(l.block) + u64::from(l.len) + k > u64::from(u32::MAX) {
                return Err(errno(libc::EINVAL));
            }
        }
        let mut moved = false;
        for e in ex.iter_mut().filter(|e| u64::from(e.block) >= a) {
            e.block += k as u32;
            moved = true;
        }
        if moved {
            self.rebuild_tree(&mut raw, &ex, &tree)?;
        }
        raw.size += len;
        let t = now();
        raw.mtime = t;
        raw.ctime = t;
        self.publish(inode, ei, g, raw)?;
        Ok(true)
    }

    /// The first handle of an INSERT_RANGE too large for one
    /// (`file_insert` said so): the extent holding logical block `a`
    /// splits there (in its leaf: `store_leaf`), the size grows by `k`
    /// blocks and the times change, as the kernel's ext4_insert_range
    /// does before it shifts. The shift follows, a leaf per handle, from
    /// the last leaf down (`shift_step`). Checks as `file_insert`.
    pub(crate) fn insert_prepare(&self, inode: &Arc<Inode>, a: u64, k: u64) -> Result<()> {
        self.rw()?;
        let (ei, g, mut raw) = self.file_raw(inode, OnMap::Refuse)?;
        let bs = self.bs as u64;
        if k * bs > self.max_size().saturating_sub(raw.size) {
            return Err(errno(libc::EFBIG));
        }
        if a * bs >= raw.size {
            return Err(errno(libc::EINVAL));
        }
        // The last extent must stay below the last logical block
        // (EINVAL, as `file_insert` and the kernel's
        // ext4_ext_shift_extents): what of it lies at or past `a` moves,
        // after the split too when it holds `a`.
        let last = match self.descend(&raw, u64::from(u32::MAX), (0, 0))? {
            Some(l) => {
                let w = l.win.as_ref().ok_or_else(|| errno(libc::EIO))?;
                w.n.checked_sub(1).map(|i| extent::extent_at(&w.buf, i))
            }
            // The extents in the inode (a forced stepped shift).
            None => self.collect_extents(&raw)?.0.last().copied(),
        };
        if let Some(e) = last {
            let end = u64::from(e.block) + u64::from(e.len);
            if end > a && end + k > u64::from(u32::MAX) {
                return Err(errno(libc::EINVAL));
            }
        }
        let leaf = self.leaf_window(&raw, a, a)?;
        let (mut ex, tree, _) = self.extents_of(&raw, &leaf)?;
        let before = ex.clone();
        split_at(&mut ex, a);
        if ex != before {
            self.store_extents(&mut raw, leaf, ex, &tree)?;
        }
        raw.size += k * bs;
        let t = now();
        raw.mtime = t;
        raw.ctime = t;
        self.publish(inode, ei, g, raw)
    }

    /// INSERT_RANGE of `len` bytes at `off` on a file whose tree is too
    /// large to rewrite in one transaction (`file_insert` said so): the
    /// split and the new size in one handle, then the shift a leaf per
    /// handle from the end.
    pub(crate) fn insert_stepped(&self, inode: &Arc<Inode>, off: u64, len: u64) -> Result<()> {
        let bs = self.bs as u64;
        let s = Shift {
            a: off / bs,
            k: len / bs,
            right: true,
        };
        self.journaled(|| self.insert_prepare(inode, s.a, s.k))?;
        let mut at = Some(u64::from(u32::MAX));
        while let Some(x) = at {
            at = self.journaled(|| self.shift_step(inode, s, x))?;
        }
        Ok(())
    }

    /// COLLAPSE_RANGE of `len` bytes at `off` on a file whose tree is too
    /// large to rewrite in one transaction (`file_collapse` said so): the
    /// range punched (a step per handle), the later extents shifted down
    /// a leaf per handle, then the size.
    pub(crate) fn collapse_stepped(&self, inode: &Arc<Inode>, off: u64, len: u64) -> Result<()> {
        if let Some((from, to)) = self.journaled(|| self.file_punch(inode, off, len))? {
            self.punch_rest(inode, from, to)?;
        }
        let bs = self.bs as u64;
        let s = Shift {
            a: off / bs,
            k: len / bs,
            right: false,
        };
        let mut at = Some(s.a);
        while let Some(x) = at {
            at = self.journaled(|| self.shift_step(inode, s, x))?;
        }
        self.journaled(|| self.collapse_finish(inode, len))
    }

    /// The last handle of a COLLAPSE_RANGE done leaf by leaf: the size
    /// shrinks by `len` and the times change.
    pub(crate) fn collapse_finish(&self, inode: &Arc<Inode>, len: u64) -> Result<()> {
        self.rw()?;
        let (ei, g, mut raw) = self.file_raw(inode, OnMap::Refuse)?;
        raw.size = raw.size.saturating_sub(len);
        let t = now();
        raw.mtime = t;
        raw.ctime = t;
        self.publish(inode, ei, g, raw)
    }

    /// One leaf of a shift too large for one handle (INSERT_RANGE and
    /// COLLAPSE_RANGE over trees with more blocks than a transaction
    /// holds), as the kernel's ext4_ext_shift_extents moves a leaf per
    /// credit check: the leaf holding logical block `at` has its extents
    /// moved (`Shift::map`), and the keys above it that name its first
    /// block follow (its parent's entry for it, and further up while it
    /// is the first child). Right shifts go from the last leaf down,
    /// left shifts (after the range was punched) from the range on up,
    /// so that between two handles every key still bounds its subtree:
    /// e2fsck passes the tree at every step, and a crash leaves the file
    /// partly shifted, as the kernel's would. Returns where the next
    /// step starts, `None` when done.
    pub(crate) fn shift_step(&self, inode: &Arc<Inode>, s: Shift, at: u64) -> Result<Option<u64>> {
        self.rw()?;
        let (ei, g, mut raw) = self.file_raw(inode, OnMap::Refuse)?;
        let seed = raw.csum_seed;
        let per = extent::entries_per_block(self.bs);
        let Some(l) = self.descend(&raw, at, (at, at))? else {
            // The extents fit the inode: all of them at once.
            let (mut ex, _) = self.collect_extents(&raw)?;
            for e in &mut ex {
                e.block = s.map(u64::from(e.block)) as u32;
            }
            let gen = raw.block[8..12].to_vec();
            let mut root = [0u8; I_BLOCK_LEN];
            extent::encode_leaf(&mut root, 4, &ex);
            root[8..12].copy_from_slice(&gen);
            raw.block = root;
            self.publish(inode, ei, g, raw)?;
            return Ok(None);
        };
        let w = l.win.as_ref().ok_or_else(|| errno(libc::EIO))?;
        let mut ex: Vec<Extent> = (0..w.n).map(|i| extent::extent_at(&w.buf, i)).collect();
        if ex
            .iter()
            .any(|e| s.map(u64::from(e.block)) != u64::from(e.block))
        {
            for e in &mut ex {
                e.block = s.map(u64::from(e.block)) as u32;
            }
            self.store_node(l.block, true, seed, |d| extent::encode_leaf(d, per, &ex))?;
        }
        for p in l.path.iter().rev() {
            let old = p.ix[p.at].block;
            let new = s.map(u64::from(old)) as u32;
            if new != old {
                let mut ix = p.ix.clone();
                ix[p.at].block = new;
                match p.block {
                    Some(b) => {
                        // The leaf (or a lower node) has its new keys
                        // already: a failure here leaves keys that no
                        // longer match their first extents.
                        self.store_node(b, true, seed, |d| {
                            extent::encode_index(d, per, p.depth, &ix);
                        })
                        .map_err(|e| self.stop_writes(e))?;
                    }
                    None => {
                        let gen = raw.block[8..12].to_vec();
                        let mut root = [0u8; I_BLOCK_LEN];
                        extent::encode_index(&mut root, 4, p.depth, &ix);
                        root[8..12].copy_from_slice(&gen);
                        raw.block = root;
                    }
                }
            }
            if p.at != 0 {
                break;
            }
        }
        self.publish(inode, ei, g, raw)?;
        Ok(if s.right {
            (l.lo > s.a).then(|| l.lo - 1)
        } else {
            (l.hi < 1 << 32).then_some(l.hi)
        })
    }

    /// At most one step of freeing the blocks of inode `ino` past
    /// logical block `keep` (0 for an inode with no link left; else its
    /// size), in a handle of its own, when more than one step remains: the
    /// caller's final step (freeing the inode, or the last blocks) then
    /// fits one handle. Used for orphans: the record stays until that
    /// final step. True if it freed something (call again).
    pub(crate) fn orphan_step(&self, ino: u32) -> Result<bool> {
        if self.journal().is_none() {
            return Ok(false);
        }
        self.journaled(|| {
            // Inside the handle: the step's log room is reserved there.
            let b = self.step_groups().unwrap_or(1);
            let (rw, io) = self.rw()?;
            if !rw.alloc.inode_in_use(&io, ino)? {
                return Ok(false);
            }
            let mut raw = self.read_inode(ino)?;
            let mapped = raw.flags & FL_EXTENTS == 0
                && crate::fs::block_mapped(&raw, self.bs, self.has_ea_inode());
            if raw.flags & FL_EXTENTS == 0 && !mapped {
                return Ok(false);
            }
            let keep = if raw.links_count == 0 && raw.mode == 0 {
                // No type: `process_orphans` leaves such an inode alone
                // (the kernel's iget refuses it: ESTALE), so its blocks
                // stay too, not freed under an inode still in use.
                return Ok(false);
            } else if raw.links_count == 0 {
                0
            } else if raw.file_type_bits() == libc::S_IFREG {
                raw.size.div_ceil(self.bs as u64)
            } else {
                return Ok(false);
            };
            if mapped {
                // An ext2/3-style file: its map cut from the end, a step
                // per handle (the kernel's ext4_ind_truncate restarts its
                // handle likewise), nothing allocated.
                let cut = self.block_map_cut(&raw, keep, b)?;
                if cut <= keep {
                    return Ok(false);
                }
                self.cut_block_map(&mut raw, cut)
                    .and_then(|()| self.write_inode(&raw, false))
                    .map_err(|e| self.stop_writes(e))?;
                return Ok(true);
            }
            let (ex, tree) = self.collect_extents(&raw)?;
            if self.tail_cut(&ex, tree.len(), keep, 1 << 32, b) <= keep {
                return Ok(false);
            }
            self.check(self.drop_range_step(&mut raw, keep, 1 << 32, &[], Some(b)))?;
            self.write_inode(&raw, false)
                .map_err(|e| self.stop_writes(e))?;
            Ok(true)
        })
    }

    /// Whether freeing everything `raw` holds needs more than one step;
    /// if so, and `may_step`, free one step's worth (from the end) into
    /// `raw` and store it: the inode stays an orphan for the next step
    /// ([`Release::Stepped`]; without `may_step` nothing changes:
    /// [`Release::Later`]). Else the bitmap groups freeing it all changes
    /// ([`Release::Fits`]; none listed without a journal, where they do
    /// not matter).
    pub(crate) fn release_step(&self, raw: &mut RawInode, may_step: bool) -> Result<Release> {
        let Some(b) = self.step_groups() else {
            return Ok(Release::Fits(Vec::new()));
        };
        if raw.flags & FL_EXTENTS == 0 {
            if !crate::fs::block_mapped(raw, self.bs, self.has_ea_inode()) {
                return Ok(Release::Fits(self.groups_of(std::iter::empty(), raw)));
            }
            // An ext2/3-style file: freed whole (`release_inode`) when it
            // fits a step, else its map cut from the end a step at a time.
            let cut = self.block_map_cut(raw, 0, b)?;
            if cut == 0 {
                let blocks = self.collect_block_map(raw)?;
                return Ok(Release::Fits(self.groups_of(blocks.into_iter(), raw)));
            }
            if !may_step {
                return Ok(Release::Later);
            }
            // Made in part, a failure must not commit (`reap_some` would
            // requeue the inode and free the same blocks again).
            self.cut_block_map(raw, cut)
                .and_then(|()| self.write_inode(raw, false))
                .map_err(|e| self.stop_writes(e))?;
            return Ok(Release::Stepped);
        }
        let (ex, tree) = self.collect_extents(raw)?;
        if self.tail_cut(&ex, tree.len(), 0, 1 << 32, b) == 0 {
            let data = ex.iter().filter(|e| e.len > 0).flat_map(|e| {
                // One block per group an extent crosses is enough to count it.
                let bpg = u64::from(self.sb.blocks_per_group).max(1);
                let (s, n) = (e.start, u64::from(e.len));
                std::iter::once(s)
                    .chain((1..n.div_ceil(bpg) + 1).map(move |k| (s + k * bpg).min(s + n - 1)))
            });
            return Ok(Release::Fits(self.groups_of(data.chain(tree), raw)));
        }
        if !may_step {
            return Ok(Release::Later);
        }
        self.drop_range_step(raw, 0, 1 << 32, &[], Some(b))?;
        // The step is made (see above).
        self.write_inode(raw, false)
            .map_err(|e| self.stop_writes(e))?;
        Ok(Release::Stepped)
    }

    /// The bitmaps freeing `raw` changes: the groups of `blocks` and of
    /// its xattr block, and (as `u64::MAX - group`, apart from block
    /// groups) its inode's group; sorted, without repeats.
    pub(crate) fn groups_of(&self, blocks: impl Iterator<Item = u64>, raw: &RawInode) -> Vec<u64> {
        let ipg = u64::from(self.sb.inodes_per_group).max(1);
        let mut g: Vec<u64> = blocks
            .chain((raw.file_acl != 0).then_some(raw.file_acl))
            .map(|b| self.group_of(b))
            .chain([u64::MAX - u64::from(raw.ino.saturating_sub(1)) / ipg])
            .collect();
        g.sort_unstable();
        g.dedup();
        g
    }

    /// At mount, finish the truncate of linked regular file `raw` that a
    /// crash cut short (it is an orphan): the blocks past its size go.
    /// Block-mapped (ext2/3-style) files keep their map, cut without
    /// allocating (`cut_block_map`), so a full filesystem or a tiny
    /// journal cannot fail the mount; `orphan_step` has already brought
    /// what is left within one handle.
    pub(crate) fn finish_truncate(&self, raw: &mut RawInode) -> Result<()> {
        let keep = raw.size.div_ceil(self.bs as u64);
        if raw.flags & FL_EXTENTS == 0 {
            return self.cut_block_map(raw, keep);
        }
        self.drop_range(raw, keep, 1 << 32, &[])
    }

    /// Check, before a mount writes anything, what recovering orphan
    /// `raw` will walk: its extent tree, or its block map (an ext2/3-style
    /// file), read back whole (bounded: each block once).
    pub(crate) fn check_orphan_map(&self, raw: &RawInode) -> Result<()> {
        if raw.flags & FL_EXTENTS != 0 {
            self.collect_extents(raw)?;
        } else if crate::fs::block_mapped(raw, self.bs, self.has_ea_inode()) {
            self.collect_block_map(raw)?;
        }
        Ok(())
    }

    /// Free everything an inode with no links holds: data, tree blocks, its
    /// share of an xattr block and of the value inodes its attributes name
    /// (`ea_inode.rs`) and the inode itself (dtime set).
    pub(crate) fn release_inode(&self, mut raw: RawInode) -> Result<()> {
        let is_dir = raw.file_type_bits() == libc::S_IFDIR;
        if raw.flags & FL_EXTENTS == 0
            && crate::fs::block_mapped(&raw, self.bs, self.has_ea_inode())
        {
            // An ext2/3-style file (an image that got the extent feature
            // later keeps its old files so): its data and map blocks.
            for b in self.collect_block_map(&raw)? {
                self.free_block(b)?;
            }
            raw.block = [0u8; I_BLOCK_LEN];
        } else if raw.flags & FL_EXTENTS != 0 {
            let (ex, tree) = self.collect_extents(&raw)?;
            for e in ex {
                for b in e.start..e.start + u64::from(e.len) {
                    self.free_block(b)?;
                }
            }
            for b in tree {
                self.free_block(b)?;
            }
            let gen = raw.block[8..12].to_vec();
            let mut root = [0u8; I_BLOCK_LEN];
            extent::encode_leaf(&mut root, 4, &[]);
            root[8..12].copy_from_slice(&gen);
            raw.block = root;
        }
        self.release_ibody_ea_refs(&raw)?;
        self.release_xattr_block(&mut raw)?;
        raw.blocks = 0;
        raw.size = 0;
        raw.links_count = 0;
        raw.dtime = now().0 as u32;
        self.write_inode(&raw, false)?;
        self.free_inode(raw.ino, is_dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(block: u32, len: u16, start: u64) -> Extent {
        Extent {
            block,
            len,
            start,
            uninit: false,
        }
    }

    #[test]
    fn insert_merges_both_sides() {
        let mut v = vec![x(0, 2, 100), x(3, 1, 103)];
        insert_extent(&mut v, x(2, 1, 102));
        assert_eq!(v, [x(0, 4, 100)]);
        insert_extent(&mut v, x(10, 1, 50));
        insert_extent(&mut v, x(9, 1, 49));
        assert_eq!(v, [x(0, 4, 100), x(9, 2, 49)]);
        // Not contiguous on disk: a separate extent.
        insert_extent(&mut v, x(4, 1, 7));
        assert_eq!(v, [x(0, 4, 100), x(4, 1, 7), x(9, 2, 49)]);
    }

    #[test]
    fn split_at_cuts_only_inside_an_extent() {
        let mut v = vec![x(0, 10, 100), x(20, 5, 300)];
        split_at(&mut v, 0);
        split_at(&mut v, 15);
        split_at(&mut v, 20);
        assert_eq!(v, [x(0, 10, 100), x(20, 5, 300)]);
        split_at(&mut v, 4);
        assert_eq!(v, [x(0, 4, 100), x(4, 6, 104), x(20, 5, 300)]);
        merge_adjacent(&mut v);
        assert_eq!(v, [x(0, 10, 100), x(20, 5, 300)]);
    }

    #[test]
    fn mark_unwritten_splits_and_respects_the_unwritten_limit() {
        let mut v = vec![x(0, 10, 100), x(10, INIT_MAX_LEN, 1000)];
        assert!(mark_unwritten(&mut v, 3, 5));
        let u = |block, len, start| Extent {
            uninit: true,
            ..x(block, len, start)
        };
        assert_eq!(
            v,
            [
                x(0, 3, 100),
                u(3, 2, 103),
                x(5, 5, 105),
                x(10, INIT_MAX_LEN, 1000)
            ]
        );
        // Already unwritten: nothing changes.
        assert!(!mark_unwritten(&mut v, 3, 5));
        // A whole INIT_MAX_LEN extent: two unwritten pieces.
        assert!(mark_unwritten(&mut v, 10, 10 + u64::from(INIT_MAX_LEN)));
        assert_eq!(
            v[3..],
            [
                u(10, INIT_MAX_LEN - 1, 1000),
                u(
                    10 + u32::from(INIT_MAX_LEN) - 1,
                    1,
                    1000 + u64::from(INIT_MAX_LEN) - 1
                )
            ]
        );
    }

    #[test]
    fn convert_block_matches_remove_then_insert() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..2000 {
            // A run of extents, written and unwritten, some contiguous on
            // disk, some reaching the unwritten length limit.
            let mut v: Vec<Extent> = Vec::new();
            let (mut lb, mut pb) = (rnd(3) as u32, 100 + rnd(3));
            for _ in 0..1 + rnd(6) {
                let big = rnd(8) == 0;
                let len = if big {
                    INIT_MAX_LEN - 1
                } else {
                    1 + rnd(5) as u16
                };
                v.push(Extent {
                    block: lb,
                    len,
                    start: pb,
                    uninit: rnd(2) == 0,
                });
                lb += u32::from(len) + rnd(2) as u32;
                pb += u64::from(len) + rnd(2);
            }
            let us: Vec<usize> = (0..v.len()).filter(|&k| v[k].uninit).collect();
            if us.is_empty() {
                continue;
            }
            let i = us[rnd(us.len() as u64) as usize];
            let lblk = u64::from(v[i].block) + rnd(u64::from(v[i].len));
            let p = v[i].start + (lblk - u64::from(v[i].block));
            let mut want = v.clone();
            remove_range(&mut want, lblk, lblk + 1);
            insert_extent(&mut want, x(lblk as u32, 1, p));
            let mut got = v.clone();
            convert_block(&mut got, i, lblk);
            assert_eq!(got, want, "from {v:?}, block {lblk}");
        }
    }

    #[test]
    fn remove_splits_and_reports_freed_runs() {
        let mut v = vec![x(0, 10, 100)];
        let f = remove_range(&mut v, 3, 5);
        assert_eq!(f, [(103, 2)]);
        assert_eq!(v, [x(0, 3, 100), x(5, 5, 105)]);
        let f = remove_range(&mut v, 4, 1 << 32);
        assert_eq!(f, [(105, 5)]);
        assert_eq!(v, [x(0, 3, 100)]);
    }
}
