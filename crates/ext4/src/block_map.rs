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
use crate::util::BlockBuf;

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

    /// Where one step freeing `raw`'s blocks from logical `keep` on
    /// should start: the lowest `cut >= keep` such that the blocks it
    /// frees (data, and indirect blocks mapping nothing below `cut`) lie
    /// in at most `budget` groups, less a few for the indirect blocks
    /// that stay and change. `keep` when everything fits. A step frees
    /// something whenever anything lies past `keep`.
    pub(crate) fn block_map_cut(&self, raw: &RawInode, keep: u64, budget: usize) -> Result<u64> {
        let (data, map) = self.walk_block_map(raw)?;
        let mut items: Vec<(u64, u64)> = data.into_iter().chain(map).collect();
        items.retain(|&(l, _)| l >= keep);
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
            if self.cut_below(p, level, first, cut, &mut freed)? {
                raw.block[i * 4..i * 4 + 4].fill(0);
            }
        }
        let unit = self.bs as u64 / 512;
        raw.blocks = raw.blocks.saturating_sub(freed * unit);
        Ok(())
    }

    /// `cut_block_map` below pointer `p` (`level` indirect levels, first
    /// logical block `first`); true when `p` was freed (its pointer is to
    /// be zeroed). Depth at most 3; the map was checked by the caller.
    fn cut_below(&self, p: u32, level: u32, first: u64, cut: u64, freed: &mut u64) -> Result<bool> {
        if p == 0 {
            return Ok(false);
        }
        let per = (self.bs / 4) as u64;
        let span = per.pow(level);
        if first.saturating_add(span) <= cut {
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
            if self.cut_below(c, level - 1, first + i as u64 * child, cut, freed)? {
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
