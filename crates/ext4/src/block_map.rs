//! Block-mapped (ext2/3-style) files on a read-write mount: reading the
//! map whole (checked), and cutting it from a logical block on — what a
//! truncate, or freeing an unlinked inode, does to such a file without
//! turning it into an extent file first. Cutting allocates nothing (the
//! kernel's `ext4_ind_truncate`): on a full filesystem, or at mount while
//! finishing a truncate a crash cut short, it cannot fail for space.
//!
//! A map has 12 direct pointers, then a single, double and triple
//! indirect block (`i_block[12..15]`), each indirect block holding
//! `block size / 4` pointers; 0 is a hole.

use crate::error::{corrupt, Result};
use crate::format::inode::RawInode;
use crate::fs::Ext4;
use crate::util::{errno, BlockBuf};

/// A block map's blocks as (first logical block it maps, physical): its
/// data blocks, in logical order, and its indirect blocks.
pub(crate) type BlockMap = (Vec<(u64, u64)>, Vec<(u64, u64)>);

impl Ext4 {
    /// Every block a block-mapped (ext2/3) inode holds: its data blocks and
    /// the indirect blocks that map them (12 direct pointers, then single,
    /// double and triple indirect). A pointer outside the image, or a block
    /// met twice, is corruption: each block is read at most once, so the
    /// walk ends within the image's size.
    pub(crate) fn collect_block_map(&self, raw: &RawInode) -> Result<Vec<u64>> {
        let (data, map) = self.walk_block_map(raw)?;
        Ok(data.into_iter().chain(map).map(|(_, b)| b).collect())
    }

    /// The block map of `raw` (see `collect_block_map`): its data blocks
    /// and its indirect blocks, each with the first logical block it maps.
    pub(crate) fn walk_block_map(&self, raw: &RawInode) -> Result<BlockMap> {
        let what = || format!("inode {} block map", raw.ino);
        let per = (self.bs / 4) as u64;
        let first = u64::from(self.sb.first_data_block);
        let (mut data, mut map) = (Vec::new(), Vec::new());
        let mut seen = std::collections::HashSet::new();
        let mut buf = BlockBuf::zeroed(self.bs);
        // (pointer, levels of indirect blocks at and below it, the first
        // logical block it maps)
        let mut todo: Vec<(u32, u32, u64)> =
            (0..12).map(|i| (raw.block_word(i), 0, i as u64)).collect();
        todo.extend([
            (raw.block_word(12), 1, 12),
            (raw.block_word(13), 2, 12 + per),
            (raw.block_word(14), 3, 12 + per + per * per),
        ]);
        while let Some((p, level, lblk)) = todo.pop() {
            if p == 0 {
                continue;
            }
            let b = u64::from(p);
            if b < first || b >= self.sb.blocks_count {
                return Err(corrupt(what(), format!("block pointer {p}")));
            }
            self.check_not_meta(raw.ino, b, 1)?;
            if !seen.insert(b) {
                return Err(corrupt(what(), format!("block {p} mapped twice")));
            }
            if level == 0 {
                data.push((lblk, b));
                continue;
            }
            map.push((lblk, b));
            self.read_block(b, &mut buf)?;
            let span = per.pow(level - 1);
            todo.extend((0..per as usize).map(|i| {
                (
                    crate::format::le32(&buf, i * 4),
                    level - 1,
                    lblk + i as u64 * span,
                )
            }));
        }
        data.sort_unstable();
        Ok((data, map))
    }

    /// Where logical block `lblk` sits in a block map: the `i_block` slot
    /// holding its root pointer, and the index into each indirect block
    /// on the way down from there (none for a direct block). None past
    /// the triple indirect block's reach.
    fn map_route(&self, lblk: u64) -> Option<(usize, Vec<usize>)> {
        let per = (self.bs / 4) as u64;
        if lblk < 12 {
            return Some((lblk as usize, Vec::new()));
        }
        let mut l = lblk - 12;
        for (slot, level) in [(12usize, 1u32), (13, 2), (14, 3)] {
            let span = per.pow(level);
            if l < span {
                let route = (0..level)
                    .rev()
                    .map(|k| ((l / per.pow(k)) % per) as usize)
                    .collect();
                return Some((slot, route));
            }
            l -= span;
        }
        None
    }

    /// Give the hole at logical block `lblk` of the block-mapped `raw` a
    /// new data block, with the indirect blocks missing on its way (the
    /// kernel's `ext4_alloc_branch`): returns every block allocated, the
    /// data block last, and the indirect block already in the map that
    /// the new branch was hooked into (changed through the journal), if
    /// any. All of them are allocated first,
    /// near `goal` and in the first 2^32 blocks (a map holds 32-bit
    /// pointers; past that, ENOSPC); then the new indirect blocks are
    /// filled (zeroed but for the pointer down) and the branch hooked into
    /// the map, through the journal. `raw` gets the new root pointer, if
    /// any, and `i_blocks`; the caller writes the data and stores `raw`.
    /// On failure nothing is left allocated or changed.
    pub(crate) fn map_new_block(
        &self,
        raw: &mut RawInode,
        lblk: u64,
        goal: u64,
    ) -> Result<(Vec<u64>, Option<u64>)> {
        let what = || format!("inode {} block map", raw.ino);
        let (slot, route) = self.map_route(lblk).ok_or_else(|| errno(libc::EFBIG))?;
        let first = u64::from(self.sb.first_data_block);
        // The indirect blocks already on the way, top down.
        let mut chain: Vec<u64> = Vec::with_capacity(route.len());
        let mut buf = BlockBuf::zeroed(self.bs);
        let mut p = raw.block_word(slot);
        for &idx in &route {
            if p == 0 {
                break;
            }
            let b = u64::from(p);
            if b < first || b >= self.sb.blocks_count || chain.contains(&b) {
                return Err(corrupt(what(), format!("block pointer {p}")));
            }
            self.check_not_meta(raw.ino, b, 1)?;
            chain.push(b);
            self.read_block(b, &mut buf)?;
            p = crate::format::le32(&buf, idx * 4);
        }
        if p != 0 {
            return Err(corrupt(what(), format!("logical block {lblk} is mapped")));
        }
        // New indirect blocks for the levels below `chain`, then the data
        // block: each allocated after the one before it.
        let need = route.len() - chain.len() + 1;
        let mut new: Vec<u64> = Vec::with_capacity(need);
        let undo = |new: &[u64]| {
            for &b in new {
                let _ = self.free_block(b);
            }
        };
        let mut at = goal;
        while new.len() < need {
            match self.alloc_block(at) {
                Ok(b) if b <= u64::from(u32::MAX) => {
                    new.push(b);
                    at = b + 1;
                }
                Ok(b) => {
                    new.push(b);
                    undo(&new);
                    return Err(errno(libc::ENOSPC));
                }
                Err(e) => {
                    undo(&new);
                    return Err(e);
                }
            }
        }
        let hooked = (|| -> Result<()> {
            let (rw, io) = self.rw()?;
            for (k, w) in new.windows(2).enumerate() {
                let idx = route[chain.len() + k];
                rw.bufs.modify(io.dev, w[0], false, |x| {
                    x.fill(0);
                    x[idx * 4..idx * 4 + 4].copy_from_slice(&(w[1] as u32).to_le_bytes());
                })?;
            }
            let top = (new[0] as u32).to_le_bytes();
            match chain.last() {
                None => raw.block[slot * 4..slot * 4 + 4].copy_from_slice(&top),
                Some(&b) => {
                    let idx = route[chain.len() - 1];
                    rw.bufs.modify(io.dev, b, true, |x| {
                        x[idx * 4..idx * 4 + 4].copy_from_slice(&top)
                    })?;
                }
            }
            Ok(())
        })();
        if let Err(e) = hooked {
            undo(&new);
            return Err(e);
        }
        raw.blocks += need as u64 * (self.bs as u64 / 512);
        Ok((new, chain.last().copied()))
    }

    /// Where one step freeing `raw`'s blocks from logical `keep` on
    /// should start: the lowest `cut >= keep` such that the blocks it
    /// frees (data, and indirect blocks mapping nothing below `cut`) lie
    /// in at most `budget` groups, less a few for the indirect blocks
    /// that stay and change. `keep` when everything fits. A step frees
    /// something whenever anything lies past `keep`.
    pub(crate) fn block_map_cut(&self, raw: &RawInode, keep: u64, budget: usize) -> Result<u64> {
        self.block_map_cut_range(raw, keep, u64::MAX, budget)
    }

    /// `block_map_cut` for the range `keep..end` only (a punched hole,
    /// freed from its end): the lowest `cut >= keep` whose part
    /// `cut..end` fits the budget.
    pub(crate) fn block_map_cut_range(
        &self,
        raw: &RawInode,
        keep: u64,
        end: u64,
        budget: usize,
    ) -> Result<u64> {
        let (data, map) = self.walk_block_map(raw)?;
        let mut items: Vec<(u64, u64)> = data.into_iter().chain(map).collect();
        items.retain(|&(l, _)| l >= keep && l < end);
        items.sort_unstable_by(|a, b| b.cmp(a));
        // At most four items start at one logical block (a triple, double
        // and single indirect block and a data block), so a budget of four
        // groups always frees the last of them.
        let left = budget.saturating_sub(8).max(4);
        let mut groups = std::collections::HashSet::new();
        for &(l, b) in &items {
            groups.insert(self.group_of(b));
            if groups.len() > left {
                return Ok(l + 1);
            }
        }
        Ok(keep)
    }

    /// Free every block `raw`'s map holds at logical `cut` and past: data
    /// blocks, and indirect blocks that then map nothing; the indirect
    /// blocks that stay get those pointers zeroed (through the journal).
    /// `i_blocks` follows; `raw` is changed, the caller stores it. Nothing
    /// is allocated. The map is read back whole and checked first
    /// (`walk_block_map`), so a corrupt map changes nothing.
    pub(crate) fn cut_block_map(&self, raw: &mut RawInode, cut: u64) -> Result<()> {
        self.cut_block_map_range(raw, cut, u64::MAX)
    }

    /// `cut_block_map` of the logical blocks `cut..end` only (a punched
    /// hole, as the kernel's `ext4_ind_remove_space`): data blocks in the
    /// range go, and indirect blocks left mapping nothing.
    pub(crate) fn cut_block_map_range(&self, raw: &mut RawInode, cut: u64, end: u64) -> Result<()> {
        self.walk_block_map(raw)?;
        let per = (self.bs / 4) as u64;
        let mut freed = 0u64;
        let roots = [
            (12, 1, 12),
            (13, 2, 12 + per),
            (14, 3, 12 + per + per * per),
        ];
        for (i, level, first) in (0..12).map(|i| (i, 0, i as u64)).chain(roots) {
            let p = raw.block_word(i);
            if self.cut_below(p, level, first, (cut, end), &mut freed)? {
                raw.block[i * 4..i * 4 + 4].fill(0);
            }
        }
        let unit = self.bs as u64 / 512;
        raw.blocks = raw.blocks.saturating_sub(freed * unit);
        Ok(())
    }

    /// `cut_block_map_range` below pointer `p` (`level` indirect levels,
    /// first logical block `first`) for the logical range `cut..end`;
    /// true when `p` was freed (its pointer is to be zeroed). Depth at
    /// most 3; the map was checked by the caller.
    fn cut_below(
        &self,
        p: u32,
        level: u32,
        first: u64,
        (cut, end): (u64, u64),
        freed: &mut u64,
    ) -> Result<bool> {
        if p == 0 {
            return Ok(false);
        }
        let per = (self.bs / 4) as u64;
        let span = per.pow(level);
        if first.saturating_add(span) <= cut || first >= end {
            return Ok(false);
        }
        let b = u64::from(p);
        if level == 0 {
            self.free_block(b)?;
            *freed += 1;
            return Ok(true);
        }
        let mut buf = BlockBuf::zeroed(self.bs);
        self.read_block(b, &mut buf)?;
        let child = per.pow(level - 1);
        let (mut changed, mut left) = (false, false);
        for i in 0..per as usize {
            let c = crate::format::le32(&buf, i * 4);
            if c == 0 {
                continue;
            }
            let at = first + i as u64 * child;
            if self.cut_below(c, level - 1, at, (cut, end), freed)? {
                buf[i * 4..i * 4 + 4].fill(0);
                changed = true;
            } else {
                left = true;
            }
        }
        if !left {
            // Maps nothing now (or only holes below `cut`): it goes too.
            self.free_block(b)?;
            *freed += 1;
            return Ok(true);
        }
        if changed {
            let (rw, io) = self.rw()?;
            rw.bufs
                .modify(io.dev, b, true, |x| x.copy_from_slice(&buf))?;
        }
        Ok(false)
    }
}
