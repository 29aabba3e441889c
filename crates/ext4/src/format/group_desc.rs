//! Block group descriptors: 32 bytes, or `s_desc_size` (>= 64) with 64bit.

use super::checksum::{crc16, crc32c};
use super::superblock::Superblock;
use super::{le16, le32};
use crate::error::{corrupt, Result};

pub const GD_SIZE_32: usize = 32;
pub const GD_SIZE_64: usize = 64;
/// Offset of `bg_checksum`.
const GD_CSUM_OFF: usize = 0x1E;
const _: () = assert!(GD_CSUM_OFF + 2 == GD_SIZE_32);

/// bg_flags bits.
pub const BG_INODE_UNINIT: u16 = 0x1;
pub const BG_BLOCK_UNINIT: u16 = 0x2;
pub const BG_INODE_ZEROED: u16 = 0x4;

/// A checked group descriptor.
#[derive(Clone, Debug, Default)]
pub struct GroupDesc {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
    pub free_blocks_count: u32,
    pub free_inodes_count: u32,
    pub used_dirs_count: u32,
    pub flags: u16,
    pub itable_unused: u32,
    pub block_bitmap_csum: u32,
    pub inode_bitmap_csum: u32,
    pub checksum: u16,
}

impl GroupDesc {
    /// Parse descriptor `group` from its `desc_size()` bytes, verifying its
    /// checksum (metadata_csum or gdt_csum) and that its tables lie inside
    /// the filesystem.
    pub fn parse(sb: &Superblock, group: u64, b: &[u8]) -> Result<GroupDesc> {
        let what = || format!("group descriptor {group}");
        let size = usize::from(sb.desc_size());
        if b.len() < size || size < GD_SIZE_32 {
            return Err(corrupt(what(), "short descriptor"));
        }
        let b = &b[..size];
        let wide = sb.is_64bit() && size >= GD_SIZE_64;
        let hi16 = |off: usize| {
            if wide {
                u32::from(le16(b, off)) << 16
            } else {
                0
            }
        };
        let hi32 = |off: usize| {
            if wide {
                u64::from(le32(b, off)) << 32
            } else {
                0
            }
        };
        let gd = GroupDesc {
            block_bitmap: u64::from(le32(b, 0x0)) | hi32(0x20),
            inode_bitmap: u64::from(le32(b, 0x4)) | hi32(0x24),
            inode_table: u64::from(le32(b, 0x8)) | hi32(0x28),
            free_blocks_count: u32::from(le16(b, 0xC)) | hi16(0x2C),
            free_inodes_count: u32::from(le16(b, 0xE)) | hi16(0x2E),
            used_dirs_count: u32::from(le16(b, 0x10)) | hi16(0x30),
            flags: le16(b, 0x12),
            itable_unused: u32::from(le16(b, 0x1C)) | hi16(0x32),
            block_bitmap_csum: u32::from(le16(b, 0x18)) | hi16(0x38),
            inode_bitmap_csum: u32::from(le16(b, 0x1A)) | hi16(0x3A),
            checksum: le16(b, GD_CSUM_OFF),
        };
        if let Some(c) = checksum(sb, group, b) {
            if c != gd.checksum {
                return Err(corrupt(
                    what(),
                    format!("checksum {:#06x}, computed {c:#06x}", gd.checksum),
                ));
            }
        }
        let itb = inode_table_blocks(sb);
        let end = gd.inode_table.checked_add(itb);
        if gd.inode_table == 0 || !matches!(end, Some(e) if e <= sb.blocks_count) {
            return Err(corrupt(
                what(),
                format!("inode table at {}", gd.inode_table),
            ));
        }
        for (n, blk) in [("block", gd.block_bitmap), ("inode", gd.inode_bitmap)] {
            if blk >= sb.blocks_count {
                return Err(corrupt(what(), format!("{n} bitmap at {blk}")));
            }
        }
        check_placement(sb, group, &gd, itb).map_err(|m| corrupt(what(), m))?;
        if gd.free_inodes_count > sb.inodes_per_group {
            return Err(corrupt(
                what(),
                format!("free inodes {}", gd.free_inodes_count),
            ));
        }
        Ok(gd)
    }
}

/// The kernel's `ext4_check_descriptors` placement rules: a group's
/// bitmaps and inode table lie inside the group (anywhere in the
/// filesystem with flex_bg) and not on the superblock or group 0's
/// descriptor blocks. Without them a crafted descriptor could make the
/// allocator set bits in the superblock or the descriptor table. (The
/// kernel lets a read-only mount through with a warning for the two
/// overlaps; this refuses every mount of such an image.)
fn check_placement(
    sb: &Superblock,
    group: u64,
    gd: &GroupDesc,
    itb: u64,
) -> std::result::Result<(), String> {
    let bpg = u64::from(sb.blocks_per_group);
    let first_data = u64::from(sb.first_data_block);
    let (first, last) = if sb.has_incompat(super::features::INCOMPAT_FLEX_BG) {
        (first_data, sb.blocks_count.saturating_sub(1))
    } else {
        let f = group
            .checked_mul(bpg)
            .and_then(|o| o.checked_add(first_data))
            .ok_or("group past the block count")?;
        (
            f,
            f.saturating_add(bpg - 1)
                .min(sb.blocks_count.saturating_sub(1)),
        )
    };
    // The superblock's block, and group 0's descriptor blocks after it
    // (`ext4_bg_num_gdb(sb, 0)`: the whole table, or with meta_bg the
    // first meta groups' blocks, or one).
    let sb_block = 1024 / sb.block_size() as u64;
    let per_block = (sb.block_size() / usize::from(sb.desc_size())) as u64;
    let gdb0 = if !sb.has_incompat(super::features::INCOMPAT_META_BG) {
        sb.group_count().div_ceil(per_block)
    } else if sb.first_meta_bg > 0 {
        u64::from(sb.first_meta_bg)
    } else {
        1
    };
    let last_gdb = sb_block + gdb0;
    let check = |what: &str, start: u64, end: u64| -> std::result::Result<(), String> {
        if start == sb_block {
            return Err(format!("{what} at {start} overlaps the superblock"));
        }
        if start > sb_block && start <= last_gdb {
            return Err(format!("{what} at {start} overlaps the group descriptors"));
        }
        if start < first || end > last {
            return Err(format!("{what} at {start} not in group ({first}..={last})"));
        }
        Ok(())
    };
    check("block bitmap", gd.block_bitmap, gd.block_bitmap)?;
    check("inode bitmap", gd.inode_bitmap, gd.inode_bitmap)?;
    check(
        "inode table",
        gd.inode_table,
        gd.inode_table + itb.max(1) - 1,
    )
}

/// Write the mutable fields of `gd` (counts, flags, bitmap checksums) into
/// descriptor `group`'s `desc_size()` bytes `b` and set its checksum. The
/// table locations and unknown fields are left as they are.
pub fn encode(sb: &Superblock, group: u64, gd: &GroupDesc, b: &mut [u8]) {
    let size = usize::from(sb.desc_size()).min(b.len());
    let b = &mut b[..size];
    let wide = sb.is_64bit() && size >= GD_SIZE_64;
    let put16 = |b: &mut [u8], lo: usize, hi: usize, v: u32| {
        b[lo..lo + 2].copy_from_slice(&(v as u16).to_le_bytes());
        if wide {
            b[hi..hi + 2].copy_from_slice(&((v >> 16) as u16).to_le_bytes());
        }
    };
    put16(b, 0xC, 0x2C, gd.free_blocks_count);
    put16(b, 0xE, 0x2E, gd.free_inodes_count);
    put16(b, 0x10, 0x30, gd.used_dirs_count);
    put16(b, 0x1C, 0x32, gd.itable_unused);
    if sb.has_metadata_csum() {
        put16(b, 0x18, 0x38, gd.block_bitmap_csum);
        put16(b, 0x1A, 0x3A, gd.inode_bitmap_csum);
    }
    b[0x12..0x14].copy_from_slice(&gd.flags.to_le_bytes());
    if let Some(c) = checksum(sb, group, b) {
        b[GD_CSUM_OFF..GD_CSUM_OFF + 2].copy_from_slice(&c.to_le_bytes());
    }
}

/// The metadata_csum checksum of a block bitmap (its first
/// `clusters_per_group / 8` bytes).
pub fn block_bitmap_csum(sb: &Superblock, bitmap: &[u8]) -> u32 {
    let n = (sb.clusters_per_group as usize / 8).min(bitmap.len());
    crc32c(sb.csum_seed(), &bitmap[..n])
}

/// The metadata_csum checksum of an inode bitmap (its first
/// `inodes_per_group / 8` bytes).
pub fn inode_bitmap_csum(sb: &Superblock, bitmap: &[u8]) -> u32 {
    let n = (sb.inodes_per_group as usize / 8).min(bitmap.len());
    crc32c(sb.csum_seed(), &bitmap[..n])
}

/// Blocks of one group's inode table.
pub fn inode_table_blocks(sb: &Superblock) -> u64 {
    (u64::from(sb.inodes_per_group) * sb.inode_size() as u64).div_ceil(sb.block_size() as u64)
}

/// The checksum descriptor `group` should carry, or `None` when the image
/// has no group descriptor checksums.
pub fn checksum(sb: &Superblock, group: u64, b: &[u8]) -> Option<u16> {
    let le_group = (group as u32).to_le_bytes();
    let head = b.get(..GD_CSUM_OFF)?;
    let tail = b.get(GD_CSUM_OFF + 2..).unwrap_or(&[]);
    if sb.has_metadata_csum() {
        let mut c = crc32c(sb.csum_seed(), &le_group);
        c = crc32c(c, head);
        c = crc32c(c, &[0, 0]);
        c = crc32c(c, tail);
        Some((c & 0xFFFF) as u16)
    } else if sb.has_ro_compat(super::features::RO_COMPAT_GDT_CSUM) {
        let mut c = crc16(!0, &sb.uuid);
        c = crc16(c, &le_group);
        c = crc16(c, head);
        if sb.is_64bit() {
            c = crc16(c, tail);
        }
        Some(c)
    } else {
        None
    }
}
