//! The on-disk inode: 128 bytes plus `i_extra_isize` extra bytes.

use super::checksum::crc32c;
use super::features::{RO_COMPAT_HUGE_FILE, RO_COMPAT_LARGE_FILE};
use super::superblock::Superblock;
use super::{le16, le32};
use crate::error::{corrupt, Result};

pub const GOOD_OLD_INODE_SIZE: usize = 128;
/// `i_block`: 15 32-bit words at 0x28.
pub const I_BLOCK_OFF: usize = 0x28;
pub const I_BLOCK_LEN: usize = 60;
const _: () = assert!(I_BLOCK_OFF + I_BLOCK_LEN == 0x64);
const CSUM_LO_OFF: usize = 0x7C;
const CSUM_HI_OFF: usize = 0x82;
/// `i_extra_isize` must reach past `i_checksum_hi` for it to exist.
const CSUM_HI_EXTRA_END: usize = CSUM_HI_OFF + 2 - GOOD_OLD_INODE_SIZE;
const _: () = assert!(CSUM_HI_EXTRA_END == 4);
// osd2 (12 bytes at 0x74) ends the 128-byte base inode.
const _: () = assert!(CSUM_LO_OFF + 2 + 2 == GOOD_OLD_INODE_SIZE);

// i_flags
pub const FL_INDEX: u32 = 0x1000;
pub const FL_HUGE_FILE: u32 = 0x40000;
pub const FL_EXTENTS: u32 = 0x80000;
pub const FL_EA_INODE: u32 = 0x200000;
pub const FL_INLINE_DATA: u32 = 0x1000_0000;

pub const ROOT_INO: u32 = 2;

/// A checked inode.
#[derive(Clone, Debug)]
pub struct RawInode {
    pub ino: u32,
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub links_count: u16,
    /// 512-byte sectors.
    pub blocks: u64,
    pub flags: u32,
    pub block: [u8; I_BLOCK_LEN],
    pub generation: u32,
    pub file_acl: u64,
    pub atime: (i64, i64),
    pub ctime: (i64, i64),
    pub mtime: (i64, i64),
    /// `i_crtime` where the inode holds it (`i_extra_isize` reaches it):
    /// read only; `encode` writes it for a new inode from its argument.
    pub crtime: Option<(i64, i64)>,
    pub dtime: u32,
    /// The seed of this inode's extent, directory and htree checksums.
    pub csum_seed: u32,
    /// The inode's body held extended attributes (their magic after
    /// `i_extra_isize`) when it was read: not written back, a hint for
    /// loading the ACL cache (`Ext4::iget`).
    pub ibody_xattrs: bool,
}

/// Seconds and nanoseconds of an inode time: the signed 32-bit base plus
/// the 2 epoch bits and 30 nanosecond bits of its `_extra` word, if any.
pub fn decode_time(base: u32, extra: Option<u32>) -> (i64, i64) {
    let mut sec = i64::from(base as i32);
    let mut nsec = 0;
    if let Some(x) = extra {
        sec += i64::from(x & 3) << 32;
        nsec = i64::from(x >> 2).min(999_999_999);
    }
    (sec, nsec)
}

/// The base word and `_extra` word of an inode time (as the kernel's
/// `ext4_encode_extra_time`: 2 epoch bits and 30 nanosecond bits).
pub fn encode_time((sec, nsec): (i64, i64)) -> (u32, u32) {
    let lo = sec as u32;
    let epoch = ((sec - i64::from(lo as i32)) >> 32) as u32 & 3;
    (lo, epoch | ((nsec.clamp(0, 999_999_999) as u32) << 2))
}

impl RawInode {
    /// Parse inode `ino` from its `inode_size` bytes, verifying the
    /// metadata_csum checksum.
    pub fn parse(sb: &Superblock, ino: u32, b: &[u8]) -> Result<RawInode> {
        let what = || format!("inode {ino}");
        let isz = sb.inode_size();
        if b.len() < isz || isz < GOOD_OLD_INODE_SIZE {
            return Err(corrupt(what(), "short inode"));
        }
        let b = &b[..isz];
        let extra_isize = if isz > GOOD_OLD_INODE_SIZE {
            let e = usize::from(le16(b, 0x80));
            if GOOD_OLD_INODE_SIZE + e > isz || e & 3 != 0 {
                return Err(corrupt(what(), format!("i_extra_isize {e}")));
            }
            e
        } else {
            0
        };
        let generation = le32(b, 0x64);
        let mut csum_seed = 0;
        if sb.has_metadata_csum() {
            let le_ino = ino.to_le_bytes();
            let le_gen = generation.to_le_bytes();
            csum_seed = crc32c(crc32c(sb.csum_seed(), &le_ino), &le_gen);
            let has_hi = extra_isize >= CSUM_HI_EXTRA_END;
            let stored = u32::from(le16(b, CSUM_LO_OFF))
                | if has_hi {
                    u32::from(le16(b, CSUM_HI_OFF)) << 16
                } else {
                    0
                };
            let mut c = crc32c(csum_seed, &b[..CSUM_LO_OFF]);
            c = crc32c(c, &[0, 0]);
            if has_hi {
                c = crc32c(c, &b[CSUM_LO_OFF + 2..CSUM_HI_OFF]);
                c = crc32c(c, &[0, 0]);
                c = crc32c(c, &b[CSUM_HI_OFF + 2..]);
            } else {
                c = crc32c(c, &b[CSUM_LO_OFF + 2..]);
                c &= 0xFFFF;
            }
            if c != stored {
                return Err(corrupt(
                    what(),
                    format!("checksum {stored:#010x}, computed {c:#010x}"),
                ));
            }
        }
        // An _extra field exists when i_extra_isize reaches its end.
        let extra =
            |off: usize| (off + 4 - GOOD_OLD_INODE_SIZE <= extra_isize).then(|| le32(b, off));
        let mode = le16(b, 0x0);
        let size_hi = le32(b, 0x6C);
        // As ext4_isize: the high word is i_dir_acl on old directories, so
        // only regular files (and everything with large_dir) use it.
        let wide = sb.has_incompat(super::features::INCOMPAT_LARGEDIR)
            || u32::from(mode) & 0o170000 == 0o100000;
        let size = u64::from(le32(b, 0x4)) | if wide { u64::from(size_hi) << 32 } else { 0 };
        let flags = le32(b, 0x20);
        let blocks_lo = u64::from(le32(b, 0x1C));
        let blocks = if sb.has_ro_compat(RO_COMPAT_HUGE_FILE) {
            let raw = blocks_lo | (u64::from(le16(b, 0x74)) << 32);
            if flags & FL_HUGE_FILE != 0 {
                raw.saturating_mul(sb.block_size() as u64 / 512)
            } else {
                raw
            }
        } else {
            blocks_lo
        };
        let mut block = [0u8; I_BLOCK_LEN];
        block.copy_from_slice(&b[I_BLOCK_OFF..I_BLOCK_OFF + I_BLOCK_LEN]);
        let ino_struct = RawInode {
            ino,
            mode,
            uid: u32::from(le16(b, 0x2)) | (u32::from(le16(b, 0x78)) << 16),
            gid: u32::from(le16(b, 0x18)) | (u32::from(le16(b, 0x7A)) << 16),
            size,
            links_count: le16(b, 0x1A),
            blocks,
            flags,
            block,
            generation,
            // The high half only with 64bit, as the kernel and e2fsprogs
            // read it (other layouts keep other things there).
            file_acl: u64::from(le32(b, 0x68))
                | if sb.is_64bit() {
                    u64::from(le16(b, 0x76)) << 32
                } else {
                    0
                },
            atime: decode_time(le32(b, 0x8), extra(0x8C)),
            ctime: decode_time(le32(b, 0xC), extra(0x84)),
            mtime: decode_time(le32(b, 0x10), extra(0x88)),
            crtime: extra(0x90).map(|lo| decode_time(lo, extra(0x94))),
            dtime: le32(b, 0x14),
            csum_seed,
            // parse checked 128 + extra_isize <= the inode size.
            ibody_xattrs: extra_isize > 0
                && GOOD_OLD_INODE_SIZE + extra_isize + 4 <= b.len()
                && le32(b, GOOD_OLD_INODE_SIZE + extra_isize) == 0xEA02_0000,
        };
        if size > i64::MAX as u64 {
            return Err(corrupt(what(), format!("size {size}")));
        }
        if !sb.has_ro_compat(RO_COMPAT_LARGE_FILE) && size_hi != 0 && mode & 0o170000 == 0o100000 {
            return Err(corrupt(what(), "large size without large_file"));
        }
        Ok(ino_struct)
    }

    /// Write this inode's fields into its on-disk bytes `b` (`inode_size`
    /// long) and set the checksum. Bytes this type does not model (the
    /// in-inode xattr area after `i_extra_isize`, osd fields) are kept.
    /// `crtime`: set the creation time too (a new inode).
    pub fn encode(&self, sb: &Superblock, b: &mut [u8], crtime: Option<(i64, i64)>) {
        let isz = sb.inode_size().min(b.len());
        let b = &mut b[..isz];
        let put16 =
            |b: &mut [u8], off: usize, v: u16| b[off..off + 2].copy_from_slice(&v.to_le_bytes());
        let put32 =
            |b: &mut [u8], off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_le_bytes());
        let extra_isize = if isz > GOOD_OLD_INODE_SIZE {
            usize::from(le16(b, 0x80)).min(isz - GOOD_OLD_INODE_SIZE)
        } else {
            0
        };
        let has = |off: usize| off + 4 - GOOD_OLD_INODE_SIZE <= extra_isize;
        put16(b, 0x0, self.mode);
        put16(b, 0x2, self.uid as u16);
        put16(b, 0x78, (self.uid >> 16) as u16);
        put16(b, 0x18, self.gid as u16);
        put16(b, 0x7A, (self.gid >> 16) as u16);
        put32(b, 0x4, self.size as u32);
        put32(b, 0x6C, (self.size >> 32) as u32);
        for (t, base, extra) in [
            (self.atime, 0x8, 0x8C),
            (self.ctime, 0xC, 0x84),
            (self.mtime, 0x10, 0x88),
        ]
        .into_iter()
        .chain(crtime.map(|t| (t, 0x90, 0x94)))
        {
            // Without its `_extra` word a time is 32-bit signed seconds:
            // clamped to that range (the kernel's EXT4_INODE_SET_XTIME),
            // not wrapped (2040 would read back as 1904). Not an xattr
            // value inode's: its atime and ctime words hold the value's
            // hash and reference count, 32 bits as they are.
            let t = if has(extra) || self.flags & FL_EA_INODE != 0 {
                t
            } else {
                (t.0.clamp(i64::from(i32::MIN), i64::from(i32::MAX)), t.1)
            };
            let (lo, hi) = encode_time(t);
            if base == 0x90 {
                if has(0x90) {
                    put32(b, 0x90, lo);
                }
            } else {
                put32(b, base, lo);
            }
            if has(extra) {
                put32(b, extra, hi);
            }
        }
        put32(b, 0x14, self.dtime);
        put16(b, 0x1A, self.links_count);
        // i_blocks in 512-byte units (no HUGE_FILE flag: 2^48 sectors).
        put32(b, 0x1C, self.blocks as u32);
        put16(b, 0x74, (self.blocks >> 32) as u16);
        put32(b, 0x20, self.flags & !FL_HUGE_FILE);
        b[I_BLOCK_OFF..I_BLOCK_OFF + I_BLOCK_LEN].copy_from_slice(&self.block);
        put32(b, 0x64, self.generation);
        put32(b, 0x68, self.file_acl as u32);
        put16(b, 0x76, (self.file_acl >> 32) as u16);
        if sb.has_metadata_csum() {
            let le_ino = self.ino.to_le_bytes();
            let le_gen = self.generation.to_le_bytes();
            let seed = crc32c(crc32c(sb.csum_seed(), &le_ino), &le_gen);
            let has_hi = extra_isize >= CSUM_HI_EXTRA_END;
            let mut c = crc32c(seed, &b[..CSUM_LO_OFF]);
            c = crc32c(c, &[0, 0]);
            if has_hi {
                c = crc32c(c, &b[CSUM_LO_OFF + 2..CSUM_HI_OFF]);
                c = crc32c(c, &[0, 0]);
                c = crc32c(c, &b[CSUM_HI_OFF + 2..]);
                put16(b, CSUM_HI_OFF, (c >> 16) as u16);
            } else {
                c = crc32c(c, &b[CSUM_LO_OFF + 2..]);
            }
            put16(b, CSUM_LO_OFF, c as u16);
        }
    }

    pub fn file_type_bits(&self) -> u32 {
        u32::from(self.mode) & 0o170000
    }

    /// The i_block word `i` (block map pointers, device numbers).
    pub fn block_word(&self, i: usize) -> u32 {
        le32(&self.block, i * 4)
    }

    /// Device number of a character or block device, in Linux's encoding.
    pub fn rdev(&self) -> u64 {
        let old = self.block_word(0);
        let (major, minor) = if old != 0 {
            ((old >> 8) & 0xff, old & 0xff)
        } else {
            let new = self.block_word(1);
            ((new & 0xfff00) >> 8, (new & 0xff) | ((new >> 12) & 0xfff00))
        };
        libc::makedev(major, minor)
    }
}
