//! The superblock: 1024 bytes at byte 1024 of the device.

use super::checksum::crc32c;
use super::features::*;
use super::{le16, le32, u8_at};
use crate::error::{corrupt, Result};

/// Byte offset of the primary superblock.
pub const SB_OFFSET: u64 = 1024;
/// Size of the on-disk superblock.
pub const SB_SIZE: usize = 1024;
pub const EXT4_MAGIC: u16 = 0xEF53;
/// Offset of `s_checksum`, the last field.
const SB_CSUM_OFF: usize = 0x3FC;
const _: () = assert!(SB_CSUM_OFF + 4 == SB_SIZE);

/// Offset of `s_last_orphan`, the head of the orphan list.
pub const SB_LAST_ORPHAN: usize = 0xE8;

/// s_flags bits.
pub const FLAG_SIGNED_HASH: u32 = 0x1;
pub const FLAG_UNSIGNED_HASH: u32 = 0x2;

/// The fields of the superblock this reader uses, checked.
#[derive(Clone, Debug)]
pub struct Superblock {
    pub inodes_count: u32,
    pub blocks_count: u64,
    pub r_blocks_count: u64,
    pub free_blocks_count: u64,
    pub free_inodes_count: u32,
    pub first_data_block: u32,
    pub log_block_size: u32,
    pub log_cluster_size: u32,
    pub blocks_per_group: u32,
    pub clusters_per_group: u32,
    pub inodes_per_group: u32,
    pub state: u16,
    pub rev_level: u32,
    pub first_ino: u32,
    /// `s_def_resuid`, `s_def_resgid`: who besides root may allocate the
    /// reserved blocks.
    pub def_resuid: u16,
    pub def_resgid: u16,
    pub inode_size: u16,
    pub feature_compat: u32,
    pub feature_incompat: u32,
    pub feature_ro_compat: u32,
    pub uuid: [u8; 16],
    pub reserved_gdt_blocks: u16,
    pub journal_inum: u32,
    /// `s_last_orphan`: the head of the orphan list (0: empty).
    pub last_orphan: u32,
    pub hash_seed: [u32; 4],
    pub def_hash_version: u8,
    pub desc_size: u16,
    pub first_meta_bg: u32,
    pub min_extra_isize: u16,
    pub flags: u32,
    pub log_groups_per_flex: u8,
    pub checksum_type: u8,
    pub overhead_clusters: u32,
    pub backup_bgs: [u32; 2],
    pub checksum_seed: u32,
    pub orphan_file_inum: u32,
    /// `s_usr_quota_inum`, `s_grp_quota_inum`, `s_prj_quota_inum` (0: none).
    pub quota_inums: [u32; 3],
    pub checksum: u32,
}

impl Superblock {
    /// Parse and check a superblock. Refuses unsupported INCOMPAT features
    /// (with their names) and, with metadata_csum, a bad checksum.
    pub fn parse(b: &[u8]) -> Result<Superblock> {
        let what = "superblock";
        if b.len() < SB_SIZE {
            return Err(corrupt(what, "short read"));
        }
        let magic = le16(b, 0x38);
        if magic != EXT4_MAGIC {
            return Err(corrupt(what, format!("bad magic {magic:#06x}")));
        }
        let hi = |off: usize, lo: u32, on: bool| -> u64 {
            u64::from(lo) | if on { u64::from(le32(b, off)) << 32 } else { 0 }
        };
        let incompat = le32(b, 0x60);
        let is64 = incompat & INCOMPAT_64BIT != 0;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[0x68..0x78]);
        let sb = Superblock {
            inodes_count: le32(b, 0x0),
            blocks_count: hi(0x150, le32(b, 0x4), is64),
            r_blocks_count: hi(0x154, le32(b, 0x8), is64),
            free_blocks_count: hi(0x158, le32(b, 0xC), is64),
            free_inodes_count: le32(b, 0x10),
            first_data_block: le32(b, 0x14),
            log_block_size: le32(b, 0x18),
            log_cluster_size: le32(b, 0x1C),
            blocks_per_group: le32(b, 0x20),
            clusters_per_group: le32(b, 0x24),
            inodes_per_group: le32(b, 0x28),
            state: le16(b, 0x3A),
            rev_level: le32(b, 0x4C),
            first_ino: le32(b, 0x54),
            def_resuid: le16(b, 0x50),
            def_resgid: le16(b, 0x52),
            inode_size: le16(b, 0x58),
            feature_compat: le32(b, 0x5C),
            feature_incompat: incompat,
            feature_ro_compat: le32(b, 0x64),
            uuid,
            reserved_gdt_blocks: le16(b, 0xCE),
            journal_inum: le32(b, 0xE0),
            last_orphan: le32(b, SB_LAST_ORPHAN),
            hash_seed: [le32(b, 0xEC), le32(b, 0xF0), le32(b, 0xF4), le32(b, 0xF8)],
            def_hash_version: u8_at(b, 0xFC),
            desc_size: le16(b, 0xFE),
            first_meta_bg: le32(b, 0x104),
            min_extra_isize: le16(b, 0x15C),
            flags: le32(b, 0x160),
            log_groups_per_flex: u8_at(b, 0x174),
            checksum_type: u8_at(b, 0x175),
            overhead_clusters: le32(b, 0x248),
            backup_bgs: [le32(b, 0x24C), le32(b, 0x250)],
            checksum_seed: le32(b, 0x270),
            orphan_file_inum: le32(b, 0x280),
            quota_inums: [le32(b, 0x240), le32(b, 0x244), le32(b, 0x26C)],
            checksum: le32(b, SB_CSUM_OFF),
        };
        if sb.has_ro_compat(RO_COMPAT_METADATA_CSUM) {
            if sb.checksum_type != 1 {
                return Err(corrupt(
                    what,
                    format!("unknown checksum type {}", sb.checksum_type),
                ));
            }
            let c = crc32c(!0, &b[..SB_CSUM_OFF]);
            if c != sb.checksum {
                return Err(corrupt(
                    what,
                    format!("checksum {:#010x}, computed {c:#010x}", sb.checksum),
                ));
            }
        }
        check_incompat(incompat)?;
        sb.check()?;
        Ok(sb)
    }

    fn check(&self) -> Result<()> {
        let bad = |why: String| Err(corrupt("superblock", why));
        // Block sizes 1 KiB .. 64 KiB.
        if self.log_block_size > 6 {
            return bad(format!("log_block_size {}", self.log_block_size));
        }
        if self.has_ro_compat(RO_COMPAT_BIGALLOC) {
            if self.log_cluster_size < self.log_block_size || self.log_cluster_size > 16 + 6 {
                return bad(format!("log_cluster_size {}", self.log_cluster_size));
            }
        } else if self.clusters_per_group != self.blocks_per_group {
            return bad("clusters_per_group != blocks_per_group without bigalloc".into());
        }
        let bs = self.block_size();
        // The block bitmap has one bit per cluster of the group.
        let cpg = u64::from(self.clusters_per_group);
        if cpg == 0
            || cpg > bs as u64 * 8
            || u64::from(self.blocks_per_group) != cpg * self.cluster_ratio()
        {
            return bad(format!(
                "blocks_per_group {} clusters_per_group {cpg}",
                self.blocks_per_group
            ));
        }
        if self.inodes_per_group == 0 || u64::from(self.inodes_per_group) > bs as u64 * 8 {
            return bad(format!("inodes_per_group {}", self.inodes_per_group));
        }
        let isz = self.inode_size();
        if isz < 128 || !isz.is_power_of_two() || isz > bs {
            return bad(format!("inode_size {isz}"));
        }
        if self.is_64bit() && (self.desc_size < 64 || !self.desc_size.is_power_of_two()) {
            return bad(format!("desc_size {}", self.desc_size));
        }
        if usize::from(self.desc_size()) > bs {
            return bad(format!("desc_size {}", self.desc_size));
        }
        if self.blocks_count <= u64::from(self.first_data_block) {
            return bad(format!("blocks_count {}", self.blocks_count));
        }
        // The superblock sits in block 1 of 1 KiB blocks, else in block 0.
        if self.first_data_block > u32::from(bs == 1024) {
            return bad(format!("first_data_block {}", self.first_data_block));
        }
        let groups = self.group_count();
        if u64::from(self.inodes_count) != groups * u64::from(self.inodes_per_group) {
            return bad(format!(
                "inodes_count {} != {groups} groups * {}",
                self.inodes_count, self.inodes_per_group
            ));
        }
        if self.rev_level >= 1 && (self.first_ino < 11 || self.first_ino > self.inodes_count) {
            return bad(format!("first_ino {}", self.first_ino));
        }
        Ok(())
    }

    pub fn has_compat(&self, f: u32) -> bool {
        self.feature_compat & f != 0
    }
    pub fn has_ro_compat(&self, f: u32) -> bool {
        self.feature_ro_compat & f != 0
    }
    pub fn has_incompat(&self, f: u32) -> bool {
        self.feature_incompat & f != 0
    }
    pub fn is_64bit(&self) -> bool {
        self.has_incompat(INCOMPAT_64BIT)
    }
    pub fn has_metadata_csum(&self) -> bool {
        self.has_ro_compat(RO_COMPAT_METADATA_CSUM)
    }

    /// Block size in bytes (checked to be 1 KiB .. 64 KiB).
    pub fn block_size(&self) -> usize {
        1024usize << self.log_block_size.min(6)
    }

    /// Blocks per cluster (1 without bigalloc).
    /// The kernel's `s_resv_clusters` pool, in blocks: 2% of the
    /// filesystem, at most 4096 clusters, and none without extents
    /// (`ext4_calculate_resv_clusters`). Kept from every allocation but
    /// the splits that free space; `statfs` leaves it out of `f_bavail`.
    pub fn resv_blocks(&self) -> u64 {
        if !self.has_incompat(INCOMPAT_EXTENTS) {
            return 0;
        }
        let ratio = self.cluster_ratio();
        ((self.blocks_count / ratio) / 50).min(4096) * ratio
    }

    pub fn cluster_ratio(&self) -> u64 {
        if self.has_ro_compat(RO_COMPAT_BIGALLOC) {
            1u64 << (self.log_cluster_size.saturating_sub(self.log_block_size)).min(16)
        } else {
            1
        }
    }

    /// The on-disk inode size (128 for revision 0).
    pub fn inode_size(&self) -> usize {
        if self.rev_level == 0 {
            128
        } else {
            usize::from(self.inode_size)
        }
    }

    /// Group descriptor size (32 without 64bit).
    pub fn desc_size(&self) -> u16 {
        if self.is_64bit() {
            self.desc_size
        } else {
            32
        }
    }

    /// Number of block groups.
    pub fn group_count(&self) -> u64 {
        let data = self.blocks_count - u64::from(self.first_data_block);
        data.div_ceil(u64::from(self.blocks_per_group.max(1)))
    }

    /// The seed of every metadata checksum: `s_checksum_seed` with
    /// metadata_csum_seed, else crc32c(~0, uuid).
    pub fn csum_seed(&self) -> u32 {
        if self.has_incompat(INCOMPAT_CSUM_SEED) {
            self.checksum_seed
        } else {
            crc32c(!0, &self.uuid)
        }
    }

    /// First inode number not reserved.
    pub fn first_ino(&self) -> u32 {
        if self.rev_level == 0 {
            11
        } else {
            self.first_ino
        }
    }

    /// The blocks at the start of `group` that hold the superblock copy
    /// and descriptor blocks (the kernel's `ext4_num_base_meta_blocks`):
    /// in a group with a superblock copy, the whole descriptor table and
    /// the reserved descriptor blocks; with meta_bg, past the first meta
    /// groups, only its own meta group's descriptor block, which the
    /// first, second and last group of the meta group hold (superblock
    /// copy or not). The boot block of 1 KiB bigalloc images is not
    /// counted (block 1 of group 0, which starts at block 0).
    pub fn base_meta_blocks(&self, group: u64) -> u64 {
        let has_super = self.group_has_super(group);
        let per_block = (self.block_size() / usize::from(self.desc_size())) as u64;
        let meta_bg = self.has_incompat(INCOMPAT_META_BG);
        let mut base = u64::from(has_super);
        if !meta_bg || group < u64::from(self.first_meta_bg).saturating_mul(per_block) {
            if has_super {
                let table = if meta_bg {
                    u64::from(self.first_meta_bg)
                } else {
                    self.group_count().div_ceil(per_block)
                };
                base += table + u64::from(self.reserved_gdt_blocks);
            }
        } else {
            let first = group - group % per_block;
            if group == first || group == first + 1 || group == first + per_block - 1 {
                base += 1;
            }
        }
        base
    }

    /// The quota files' inodes (0 where there is none).
    pub fn quota_inums(&self) -> [u32; 3] {
        self.quota_inums
    }

    /// Whether `group` holds a superblock backup (and so a copy of the
    /// group descriptor table).
    pub fn group_has_super(&self, group: u64) -> bool {
        if group == 0 {
            return true;
        }
        if self.has_compat(COMPAT_SPARSE_SUPER2) {
            return group == u64::from(self.backup_bgs[0])
                || group == u64::from(self.backup_bgs[1]);
        }
        if group <= 1 || !self.has_ro_compat(RO_COMPAT_SPARSE_SUPER) {
            return true;
        }
        if group & 1 == 0 {
            return false;
        }
        [3u64, 5, 7].iter().any(|&p| is_power_of(group, p))
    }
}

/// s_state bits.
pub const STATE_VALID: u16 = 0x1;
pub const STATE_ERROR: u16 = 0x2;

/// The fields a read-write mount updates, written into the raw superblock
/// bytes `b` (which keep every field this reader does not model) with the
/// checksum recomputed.
#[derive(Clone, Copy, Debug)]
pub struct SbUpdate {
    pub state: u16,
    pub mnt_count: u16,
    pub mtime: i64,
    pub wtime: i64,
    pub free_blocks: u64,
    pub free_inodes: u32,
    pub kbytes_written: u64,
}

/// Write `u` into the raw 1024-byte superblock `b`.
pub fn encode_update(b: &mut [u8], u: &SbUpdate, csum: bool) {
    let put32 =
        |b: &mut [u8], off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_le_bytes());
    put32(b, 0x0C, u.free_blocks as u32);
    put32(b, 0x158, (u.free_blocks >> 32) as u32);
    put32(b, 0x10, u.free_inodes);
    put32(b, 0x2C, u.mtime as u32);
    b[0x275] = (u.mtime >> 32) as u8;
    put32(b, 0x30, u.wtime as u32);
    b[0x274] = (u.wtime >> 32) as u8;
    b[0x34..0x36].copy_from_slice(&u.mnt_count.to_le_bytes());
    b[0x3A..0x3C].copy_from_slice(&u.state.to_le_bytes());
    b[0x178..0x180].copy_from_slice(&u.kbytes_written.to_le_bytes());
    if csum {
        let c = crc32c(!0, &b[..SB_CSUM_OFF]);
        put32(b, SB_CSUM_OFF, c);
    }
}

/// `s_mnt_count` and `s_kbytes_written` of the raw superblock.
pub fn mount_fields(b: &[u8]) -> (u16, u64) {
    let mut k = [0u8; 8];
    k.copy_from_slice(&b[0x178..0x180]);
    (le16(b, 0x34), u64::from_le_bytes(k))
}

fn is_power_of(mut n: u64, p: u64) -> bool {
    while n > 1 && n.checked_rem(p) == Some(0) {
        n /= p;
    }
    n == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal valid superblock: 4 KiB blocks, one group.
    fn base() -> Vec<u8> {
        let mut b = vec![0u8; SB_SIZE];
        let put32 =
            |b: &mut Vec<u8>, off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_le_bytes());
        put32(&mut b, 0x0, 128); // inodes
        put32(&mut b, 0x4, 1000); // blocks
        put32(&mut b, 0x18, 2); // log_block_size: 4 KiB
        put32(&mut b, 0x20, 32768);
        put32(&mut b, 0x24, 32768);
        put32(&mut b, 0x28, 128);
        b[0x38..0x3A].copy_from_slice(&EXT4_MAGIC.to_le_bytes());
        put32(&mut b, 0x4C, 1); // dynamic rev
        put32(&mut b, 0x54, 11);
        b[0x58..0x5A].copy_from_slice(&256u16.to_le_bytes());
        b
    }

    #[test]
    fn minimal_superblock_parses() {
        let sb = Superblock::parse(&base()).unwrap();
        assert_eq!(sb.block_size(), 4096);
        assert_eq!(sb.group_count(), 1);
    }

    #[test]
    fn corrupt_fields_are_errors_not_panics() {
        // Each field set to values that once could overflow or divide by 0.
        for (off, v) in [
            (0x18, 99u32),
            (0x20, 0),
            (0x24, 0),
            (0x28, 0),
            (0x4, 0),
            (0x0, 7),
        ] {
            let mut b = base();
            b[off..off + 4].copy_from_slice(&v.to_le_bytes());
            let e = Superblock::parse(&b).unwrap_err();
            assert!(e.is_corrupt(), "{off:#x}={v}: {e}");
        }
    }

    #[test]
    fn unknown_incompat_is_refused_by_name() {
        let mut b = base();
        b[0x60..0x64].copy_from_slice(&(1u32 << 30).to_le_bytes());
        let e = Superblock::parse(&b).unwrap_err();
        assert!(e.to_string().contains("FEATURE_I30"), "{e}");
    }

    #[test]
    fn sparse_super_backups() {
        let mut b = base();
        b[0x64..0x68].copy_from_slice(&RO_COMPAT_SPARSE_SUPER.to_le_bytes());
        let sb = Superblock::parse(&b).unwrap();
        let with: Vec<u64> = (0..50).filter(|&g| sb.group_has_super(g)).collect();
        assert_eq!(with, [0, 1, 3, 5, 7, 9, 25, 27, 49]);
    }
}
