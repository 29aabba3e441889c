//! On-disk encoders for mkfs: superblock, group descriptors, inodes,
//! extent nodes, directory blocks, the jbd2 superblock and orphan-file
//! blocks, each with its metadata_csum checksum. (`format/` only parses.)

use super::{Group, Layout};
use crate::format::checksum::crc32c;
use crate::format::dir::{TAIL_FT, TAIL_SIZE};
use crate::format::extent::{EXTENT_MAGIC, HEADER_SIZE, INIT_MAX_LEN};

fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
fn put32be(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

/// Inode flag: the inode's blocks are mapped by an extent tree.
const EXTENTS_FL: u32 = 0x80000;
/// `i_extra_isize` mke2fs gives new inodes (`s_want_extra_isize`).
const EXTRA_ISIZE: u16 = 32;
/// jbd2 magic, superblock-v2 block type, csum v3 feature, crc32c type.
const JBD2_MAGIC: u32 = 0xC03B_3998;
const JBD2_SUPERBLOCK_V2: u32 = 4;
const JBD2_INCOMPAT_CSUM_V3: u32 = 0x10;
const JBD2_CRC32C: u8 = 4;
/// The orphan-file block tail magic (`EXT4_ORPHAN_BLOCK_MAGIC`).
pub const ORPHAN_BLOCK_MAGIC: u32 = 0x0B10_CA04;
/// Superblock field values.
const EXT4_MAGIC: u16 = 0xEF53;
const DEFM_XATTR_USER: u32 = 0x4;
const DEFM_ACL: u32 = 0x8;
const FLAGS_SIGNED_HASH: u32 = 0x1;
const FLAGS_UNSIGNED_HASH: u32 = 0x2;
const HASH_HALF_MD4: u8 = 1;
const JNL_BACKUP_BLOCKS: u8 = 1;
const CSUM_CRC32C: u8 = 1;

/// The encoder: the layout and the filesystem checksum seed.
pub(super) struct Enc<'a> {
    pub l: &'a Layout,
    pub seed: u32,
}

/// Whole-filesystem figures the superblock carries.
pub(super) struct SuperInfo {
    pub free_blocks: u64,
    pub free_inodes: u32,
    pub journal_iblock: [u8; 60],
    pub orphan_ino: u32,
}

/// A raw inode being built.
pub(super) struct InodeBuf {
    b: Vec<u8>,
    extra: bool,
}

impl InodeBuf {
    /// A zeroed inode; `extra`: with `i_extra_isize` set (mke2fs leaves it
    /// 0 on the reserved inodes it only zeroes).
    pub fn new(l: &Layout, extra: bool) -> InodeBuf {
        let mut b = vec![0u8; usize::from(l.inode_size)];
        let extra = extra && l.inode_size > 128;
        if extra {
            put16(&mut b, 0x80, EXTRA_ISIZE);
        }
        InodeBuf { b, extra }
    }
    pub fn times(&mut self, now: u32, crtime: bool) {
        for off in [0x08, 0x0C, 0x10] {
            put32(&mut self.b, off, now);
        }
        if crtime && self.extra {
            put32(&mut self.b, 0x90, now);
        }
    }
    pub fn mode(&mut self, m: u16) {
        put16(&mut self.b, 0x00, m);
    }
    pub fn links(&mut self, n: u16) {
        put16(&mut self.b, 0x1A, n);
    }
    pub fn size(&mut self, s: u64) {
        put32(&mut self.b, 0x04, s as u32);
        put32(&mut self.b, 0x6C, (s >> 32) as u32);
    }
    /// `i_blocks` in 512-byte sectors.
    pub fn sectors(&mut self, n: u64) {
        put32(&mut self.b, 0x1C, n as u32);
        put16(&mut self.b, 0x74, (n >> 32) as u16);
    }
    /// `i_block[i]` as a block pointer (the resize inode's map).
    pub fn block_ptr(&mut self, i: usize, v: u32) {
        put32(&mut self.b, 0x28 + 4 * i, v);
    }
    /// Map the inode's data through `tree` (its leaf at `leaf` when the
    /// extents do not fit the inode); sets the flag and `i_blocks`.
    pub fn extents(&mut self, tree: &ExtentTree, leaf: Option<u64>) {
        let flags = u32::from_le_bytes(self.b[0x20..0x24].try_into().unwrap_or([0; 4]));
        put32(&mut self.b, 0x20, flags | EXTENTS_FL);
        let ib = &mut self.b[0x28..0x28 + 60];
        match leaf {
            None => {
                header(ib, tree.extents.len() as u16, 4, 0);
                for (i, e) in tree.extents.iter().enumerate() {
                    extent(&mut ib[HEADER_SIZE + 12 * i..], e);
                }
            }
            Some(leaf) => {
                header(ib, 1, 4, 1);
                // Index entry: first logical block 0, leaf block number.
                let e = &mut ib[HEADER_SIZE..HEADER_SIZE + 12];
                put32(e, 0, 0);
                put32(e, 4, leaf as u32);
                put16(e, 8, (leaf >> 32) as u16);
            }
        }
        let blocks: u64 =
            tree.extents.iter().map(|e| u64::from(e.len)).sum::<u64>() + u64::from(leaf.is_some());
        self.sectors(blocks * tree.bs / 512);
    }
    /// The 60 bytes of `i_block`.
    pub fn iblock(&self) -> [u8; 60] {
        let mut out = [0u8; 60];
        out.copy_from_slice(&self.b[0x28..0x28 + 60]);
        out
    }
}

/// One extent: logical start, length, physical start.
#[derive(Debug, Clone, Copy)]
pub(super) struct Extent {
    logical: u32,
    len: u16,
    start: u64,
}

/// A file's extents in logical order.
#[derive(Debug, Clone)]
pub(super) struct ExtentTree {
    extents: Vec<Extent>,
    bs: u64,
}

impl ExtentTree {
    /// Extents for the physical `runs`, split at the initialized-extent
    /// maximum length.
    pub fn plan(runs: &[(u64, u64)], bs: u64) -> ExtentTree {
        let mut extents = Vec::new();
        let mut logical = 0u64;
        for &(mut start, mut len) in runs {
            while len > 0 {
                let n = len.min(u64::from(INIT_MAX_LEN));
                extents.push(Extent {
                    logical: logical as u32,
                    len: n as u16,
                    start,
                });
                logical += n;
                start += n;
                len -= n;
            }
        }
        ExtentTree { extents, bs }
    }

    /// More than the four extents the inode holds.
    pub fn needs_leaf(&self) -> bool {
        self.extents.len() > 4
    }

    /// The tree fits the inode plus at most one leaf block.
    pub fn fits(&self) -> bool {
        self.extents.len() <= (self.bs as usize - HEADER_SIZE) / 12
    }

    /// The leaf block (depth 0) with the extent tail checksum. Callers
    /// keep the extent count within one leaf (it is bounded by the group
    /// count: runs break only at superblock backups).
    pub fn leaf_block(&self, enc: &Enc, ino: u32, bs: u64) -> Vec<u8> {
        let mut b = vec![0u8; bs as usize];
        let max = ((bs as usize - HEADER_SIZE) / 12) as u16;
        let n = self.extents.len().min(usize::from(max));
        header(&mut b, n as u16, max, 0);
        for (i, e) in self.extents.iter().take(n).enumerate() {
            extent(&mut b[HEADER_SIZE + 12 * i..], e);
        }
        let tail = HEADER_SIZE + 12 * usize::from(max);
        let c = crc32c(enc.inode_seed(ino), &b[..tail]);
        put32(&mut b, tail, c);
        b
    }
}

fn header(b: &mut [u8], entries: u16, max: u16, depth: u16) {
    put16(b, 0, EXTENT_MAGIC);
    put16(b, 2, entries);
    put16(b, 4, max);
    put16(b, 6, depth);
    put32(b, 8, 0);
}

fn extent(b: &mut [u8], e: &Extent) {
    put32(b, 0, e.logical);
    put16(b, 4, e.len);
    put16(b, 6, (e.start >> 32) as u16);
    put32(b, 8, e.start as u32);
}

impl Enc<'_> {
    /// The per-inode checksum seed (generation 0).
    pub fn inode_seed(&self, ino: u32) -> u32 {
        crc32c(crc32c(self.seed, &ino.to_le_bytes()), &0u32.to_le_bytes())
    }

    /// Fill in the inode checksum and return the raw inode.
    pub fn finish_inode(&self, ino: u32, i: InodeBuf) -> Vec<u8> {
        let mut b = i.b;
        put16(&mut b, 0x7C, 0);
        let has_hi = b.len() > 128 && u16::from_le_bytes([b[0x80], b[0x81]]) >= 4;
        if has_hi {
            put16(&mut b, 0x82, 0);
        }
        let c = crc32c(self.inode_seed(ino), &b);
        put16(&mut b, 0x7C, c as u16);
        if has_hi {
            put16(&mut b, 0x82, (c >> 16) as u16);
        }
        b
    }

    /// A directory block of `dir` with the checksum tail: `.` and `..`
    /// (when `parent` is given, the first block), `lost+found` (when
    /// `with_lpf`, the root), or one empty entry (later blocks).
    pub fn dir_block(&self, dir: u32, parent: Option<u32>, with_lpf: bool) -> Vec<u8> {
        let bs = self.l.block_size as usize;
        let end = bs - TAIL_SIZE;
        let mut b = vec![0u8; bs];
        let mut entries: Vec<(u32, &[u8], u8)> = Vec::new();
        if let Some(p) = parent {
            entries.push((dir, b".", 2));
            entries.push((p, b"..", 2));
            if with_lpf {
                entries.push((super::LOST_FOUND_INO, b"lost+found", 2));
            }
        } else {
            entries.push((0, b"", 0));
        }
        let mut off = 0;
        let n = entries.len();
        for (i, (ino, name, ft)) in entries.into_iter().enumerate() {
            let rec = if i + 1 == n {
                end - off
            } else {
                (8 + name.len()).next_multiple_of(4)
            };
            put32(&mut b, off, ino);
            put16(&mut b, off + 4, rec as u16);
            b[off + 6] = name.len() as u8;
            b[off + 7] = ft;
            b[off + 8..off + 8 + name.len()].copy_from_slice(name);
            off += rec;
        }
        // The tail: a fake entry (inode 0, rec_len 12, type 0xDE) + crc.
        put16(&mut b, end + 4, TAIL_SIZE as u16);
        b[end + 7] = TAIL_FT;
        let c = crc32c(self.inode_seed(dir), &b[..end]);
        put32(&mut b, end + 8, c);
        b
    }

    /// The jbd2 superblock of a clean, empty internal journal (big-endian;
    /// v2 with csum v3 and its checksum; `s_start` 0: nothing to replay).
    pub fn journal_superblock(&self) -> Vec<u8> {
        let l = self.l;
        let mut b = vec![0u8; l.block_size as usize];
        put32be(&mut b, 0x00, JBD2_MAGIC);
        put32be(&mut b, 0x04, JBD2_SUPERBLOCK_V2);
        put32be(&mut b, 0x0C, l.block_size);
        put32be(&mut b, 0x10, l.journal_blocks);
        put32be(&mut b, 0x14, 1); // s_first
        put32be(&mut b, 0x18, 1); // s_sequence
        put32be(&mut b, 0x28, JBD2_INCOMPAT_CSUM_V3);
        b[0x30..0x40].copy_from_slice(&l.uuid);
        put32be(&mut b, 0x40, 1); // s_nr_users
        b[0x50] = JBD2_CRC32C;
        let c = crc32c(!0, &b[..1024]);
        put32be(&mut b, 0xFC, c);
        b
    }

    /// An empty orphan-file block: zero slots, then the tail (magic,
    /// checksum over inode, generation, physical block and the slots).
    pub fn orphan_block(&self, ino: u32, blk: u64) -> Vec<u8> {
        let bs = self.l.block_size as usize;
        let mut b = vec![0u8; bs];
        put32(&mut b, bs - 8, ORPHAN_BLOCK_MAGIC);
        let mut c = crc32c(self.seed, &ino.to_le_bytes());
        c = crc32c(c, &0u32.to_le_bytes());
        c = crc32c(c, &blk.to_le_bytes());
        c = crc32c(c, &b[..bs - 8]);
        put32(&mut b, bs - 4, c);
        b
    }

    /// One 64-byte group descriptor with its checksum.
    pub fn group_desc(&self, g: u32, gr: &Group, d: &mut [u8]) {
        put32(d, 0x00, gr.block_bitmap as u32);
        put32(d, 0x04, gr.inode_bitmap as u32);
        put32(d, 0x08, gr.inode_table as u32);
        put16(d, 0x0C, gr.free_blocks as u16);
        put16(d, 0x0E, gr.free_inodes as u16);
        put16(d, 0x10, gr.used_dirs as u16);
        put16(d, 0x12, gr.flags);
        put16(d, 0x18, gr.block_bitmap_csum as u16);
        put16(d, 0x1A, gr.inode_bitmap_csum as u16);
        put16(d, 0x1C, gr.itable_unused as u16);
        put32(d, 0x20, (gr.block_bitmap >> 32) as u32);
        put32(d, 0x24, (gr.inode_bitmap >> 32) as u32);
        put32(d, 0x28, (gr.inode_table >> 32) as u32);
        put16(d, 0x2C, (gr.free_blocks >> 16) as u16);
        put16(d, 0x2E, (gr.free_inodes >> 16) as u16);
        put16(d, 0x30, (gr.used_dirs >> 16) as u16);
        put16(d, 0x32, (gr.itable_unused >> 16) as u16);
        put16(d, 0x38, (gr.block_bitmap_csum >> 16) as u16);
        put16(d, 0x3A, (gr.inode_bitmap_csum >> 16) as u16);
        put16(d, 0x1E, 0);
        let c = crc32c(crc32c(self.seed, &g.to_le_bytes()), d);
        put16(d, 0x1E, c as u16);
    }

    /// The 1024-byte superblock as stored in group `g` (its
    /// `s_block_group_nr`), with its checksum.
    pub fn superblock(&self, s: &SuperInfo, g: u32) -> Vec<u8> {
        let l = self.l;
        let f = &l.features;
        let mut b = vec![0u8; 1024];
        put32(&mut b, 0x00, l.inodes_per_group * l.groups);
        put32(&mut b, 0x04, l.blocks as u32);
        put32(&mut b, 0x08, l.reserved_blocks as u32);
        put32(&mut b, 0x0C, s.free_blocks as u32);
        put32(&mut b, 0x10, s.free_inodes);
        put32(&mut b, 0x14, l.first_data_block as u32);
        let log = l.block_size.trailing_zeros() - 10;
        put32(&mut b, 0x18, log);
        put32(&mut b, 0x1C, log);
        put32(&mut b, 0x20, l.blocks_per_group);
        put32(&mut b, 0x24, l.blocks_per_group);
        put32(&mut b, 0x28, l.inodes_per_group);
        put32(&mut b, 0x30, l.now); // s_wtime
        put16(&mut b, 0x36, 0xFFFF); // s_max_mnt_count = -1
        put16(&mut b, 0x38, EXT4_MAGIC);
        put16(&mut b, 0x3A, 1); // clean
        put16(&mut b, 0x3C, 1); // errors: continue
        put32(&mut b, 0x40, l.now); // s_lastcheck
        put32(&mut b, 0x4C, 1); // dynamic revision
        put32(&mut b, 0x54, super::FIRST_INO);
        put16(&mut b, 0x58, l.inode_size);
        put16(&mut b, 0x5A, g as u16);
        put32(&mut b, 0x5C, f.compat);
        put32(&mut b, 0x60, f.incompat);
        put32(&mut b, 0x64, f.ro_compat);
        b[0x68..0x78].copy_from_slice(&l.uuid);
        b[0x78..0x88].copy_from_slice(&l.label);
        put16(&mut b, 0xCE, l.reserved_gdt as u16);
        if l.journal_blocks > 0 {
            put32(&mut b, 0xE0, super::JOURNAL_INO);
            b[0xFD] = JNL_BACKUP_BLOCKS;
            // s_jnl_blocks: the journal inode's i_block, i_size_high, i_size.
            b[0x10C..0x10C + 60].copy_from_slice(&s.journal_iblock);
            let jsize = u64::from(l.journal_blocks) * u64::from(l.block_size);
            put32(&mut b, 0x10C + 60, (jsize >> 32) as u32);
            put32(&mut b, 0x10C + 64, jsize as u32);
        }
        for i in 0..4 {
            b[0xEC + 4 * i..0xEC + 4 * i + 4].copy_from_slice(&l.hash_seed[4 * i..4 * i + 4]);
        }
        b[0xFC] = HASH_HALF_MD4;
        put16(&mut b, 0xFE, 64); // s_desc_size
        put32(&mut b, 0x100, DEFM_XATTR_USER | DEFM_ACL);
        put32(&mut b, 0x108, l.now); // s_mkfs_time
        put32(&mut b, 0x150, (l.blocks >> 32) as u32);
        put32(&mut b, 0x154, (l.reserved_blocks >> 32) as u32);
        put32(&mut b, 0x158, (s.free_blocks >> 32) as u32);
        if f.has("extra_isize") {
            put16(&mut b, 0x15C, EXTRA_ISIZE);
            put16(&mut b, 0x15E, EXTRA_ISIZE);
        }
        // The directory hash signedness follows the host's `char`.
        let signed = (-1i8) as std::ffi::c_char as i32 == -1;
        put32(
            &mut b,
            0x160,
            if signed {
                FLAGS_SIGNED_HASH
            } else {
                FLAGS_UNSIGNED_HASH
            },
        );
        b[0x174] = l.log_flex;
        b[0x175] = CSUM_CRC32C;
        put32(&mut b, 0x280, s.orphan_ino);
        let c = crc32c(!0, &b[..0x3FC]);
        put32(&mut b, 0x3FC, c);
        b
    }
}
