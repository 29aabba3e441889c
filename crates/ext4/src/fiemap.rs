//! `FS_IOC_FIEMAP` on ext4 (read side; any mount): the extents of a file
//! or directory as the kernel's `ext4_fiemap` reports them through iomap.
//!
//! - The range is clipped to the file's maximum size (`fiemap_check`), then walked at block
//!   granularity: the first extent reported starts at the block holding
//!   `start`, the last one ends with the block holding `start + len - 1`
//!   (iomap asks ext4_map_blocks for those blocks only). Holes are
//!   skipped.
//! - One entry per on-disk extent (ext4_map_blocks stops at an extent's
//!   end); unwritten extents carry FIEMAP_EXTENT_UNWRITTEN; the last entry
//!   of the answer carries FIEMAP_EXTENT_LAST (iomap's rule: the last one
//!   found in the range, not the file's last extent).
//! - Block-mapped (ext2/3-style) files: runs of physically contiguous
//!   blocks, flagged FIEMAP_EXTENT_MERGED, stopping at the end of the
//!   direct pointers and of each indirect block (as ext4_ind_map_blocks);
//!   walked block by block up to EOF (slow for huge sparse ones).
//! - Flags: FIEMAP_FLAG_SYNC (nothing to do: data is written through, no
//!   page cache of ours holds dirty data) and FIEMAP_FLAG_CACHE (ext4's
//!   "precache the tree": nothing to do). FIEMAP_FLAG_XATTR (the xattr
//!   block's or in-inode area's place) is not done: EBADR, as for any
//!   unknown flag.
//! - Known difference: the kernel's extent status cache may join two
//!   extents (or block-map runs) that continue each other once both are
//!   cached (a second FIEMAP, or one after a read); we report the on-disk
//!   extents, which our writer keeps joined where it can.
//!
//! The caller holds the file's tree lock shared (read-write mounts).

use scalevfs::fstype::{
    FiemapExtent, FIEMAP_EXTENT_LAST, FIEMAP_EXTENT_MERGED, FIEMAP_EXTENT_UNWRITTEN,
    FIEMAP_FLAG_CACHE, FIEMAP_FLAG_SYNC,
};

use scalevfs::{Errno, VfsResult};

use crate::error::Result;
use crate::format::inode::{RawInode, FL_EXTENTS, FL_INLINE_DATA};
use crate::fs::{Ext4, Mapping};

/// EXT4_MAX_LOGICAL_BLOCK: the last logical block a request maps.
const MAX_LOGICAL_BLOCK: u64 = 0xFFFF_FFFE;

/// FIEMAP flags of an inline extent (linux/fiemap.h).
const FIEMAP_EXTENT_NOT_ALIGNED: u32 = 0x100;
const FIEMAP_EXTENT_DATA_INLINE: u32 = 0x200;
/// Where `i_block` lies in an inode.
const I_BLOCK_OFFSET: u64 = 0x28;

impl Ext4 {
    /// The checks of ext4_fiemap_check_ranges, then fiemap_prep's, in the
    /// kernel's order; returns `len` clipped. The first limit is the
    /// file's own (`s_bitmap_maxbytes` without the extent flag: block
    /// mapped or inline): `len` 0 is EINVAL, `start` past it EFBIG, the
    /// range cut at it. Then the filesystem's (`s_maxbytes`): a `len` cut
    /// to 0 is EINVAL, `start` at or past it EFBIG. Last, an unsupported
    /// flag is EBADR. (Host kernel, 4 KiB blocks: `start` = s_maxbytes
    /// is EINVAL on an extent file, 8 TiB is EFBIG on a block-mapped one.)
    pub(crate) fn fiemap_check(
        &self,
        raw: &RawInode,
        start: u64,
        len: u64,
        flags: u32,
    ) -> VfsResult<u64> {
        let clip = |len: u64, max: u64| {
            if len > max || max - len < start {
                max - start
            } else {
                len
            }
        };
        let own = if raw.flags & FL_EXTENTS != 0 {
            self.max_size()
        } else {
            self.bitmap_max_size()
        };
        if len == 0 {
            return Err(Errno::EINVAL);
        }
        if start > own {
            return Err(Errno::EFBIG);
        }
        let len = clip(len, own);
        let max = self.max_size();
        if len == 0 {
            return Err(Errno::EINVAL);
        }
        if start >= max {
            return Err(Errno::EFBIG);
        }
        let len = clip(len, max);
        if flags & !(FIEMAP_FLAG_SYNC | FIEMAP_FLAG_CACHE) != 0 {
            return Err(Errno::EBADR);
        }
        Ok(len)
    }

    /// The FIEMAP answer for `raw` over `[start, start + len)`, checked by
    /// `fiemap_check` (see the module comment).
    pub(crate) fn fiemap_raw(
        &self,
        raw: &RawInode,
        start: u64,
        len: u64,
    ) -> Result<Vec<FiemapExtent>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let bs = self.bs as u64;
        let first = start / bs;
        let last = (start.saturating_add(len - 1) / bs).min(MAX_LOGICAL_BLOCK);
        let mut out: Vec<FiemapExtent> = Vec::new();
        let mut push = |lblk: u64, pblk: u64, n: u64, fl: u32| {
            out.push(FiemapExtent {
                logical: lblk * bs,
                physical: pblk * bs,
                length: n * bs,
                flags: fl,
            })
        };
        if raw.flags & FL_INLINE_DATA != 0 {
            // One extent: the data in the inode, addressed at its
            // `i_block` (the kernel's `ext4_inline_data_iomap`).
            // As long as the inline room (`i_block` and the attribute's
            // value) where the size passes it, as the kernel's.
            let length = (self.inline_bytes(raw)?.len() as u64).min(raw.size);
            if start < length {
                let (blk, inb, _) = self.inode_slot(raw.ino)?;
                out.push(FiemapExtent {
                    logical: 0,
                    physical: blk * bs + inb as u64 + I_BLOCK_OFFSET,
                    length,
                    flags: FIEMAP_EXTENT_DATA_INLINE | FIEMAP_EXTENT_NOT_ALIGNED,
                });
            }
        } else if raw.flags & FL_EXTENTS != 0 {
            let (ex, _) = self.collect_extents(raw)?;
            let i = ex.partition_point(|e| u64::from(e.block) + u64::from(e.len) <= first);
            for e in &ex[i..] {
                let (s, t) = (u64::from(e.block), u64::from(e.block) + u64::from(e.len));
                if s > last {
                    break;
                }
                let (a, b) = (s.max(first), t.min(last + 1));
                let fl = if e.uninit { FIEMAP_EXTENT_UNWRITTEN } else { 0 };
                push(a, e.start + (a - s), b - a, fl);
            }
        } else {
            // Block maps hold no blocks past EOF: walk up to it. A run
            // stops where the kernel's lookup does: at the end of the 12
            // direct pointers and of each indirect block.
            let per = bs / 4;
            let boundary = |l: u64| l == 12 || (l > 12 && (l - 12).is_multiple_of(per));
            let end = last.min(raw.size.div_ceil(bs).saturating_sub(1));
            let mut lblk = first;
            let mut run: Option<(u64, u64, u64)> = None;
            while lblk <= end && raw.size > 0 {
                let Ok(l) = u32::try_from(lblk) else { break };
                match self.map_block(raw, l)? {
                    Mapping::Data { pblk, count, .. } => {
                        let n = count.max(1).min(end + 1 - lblk);
                        run = match run {
                            Some((rl, rp, rn))
                                if rl + rn == lblk && rp + rn == pblk && !boundary(lblk) =>
                            {
                                Some((rl, rp, rn + n))
                            }
                            Some((rl, rp, rn)) => {
                                push(rl, rp, rn, FIEMAP_EXTENT_MERGED);
                                Some((lblk, pblk, n))
                            }
                            None => Some((lblk, pblk, n)),
                        };
                        lblk += n;
                    }
                    Mapping::Hole { count } => lblk += count.max(1),
                }
            }
            if let Some((rl, rp, rn)) = run {
                push(rl, rp, rn, FIEMAP_EXTENT_MERGED);
            }
        }
        if let Some(l) = out.last_mut() {
            l.flags |= FIEMAP_EXTENT_LAST;
        }
        Ok(out)
    }
}
