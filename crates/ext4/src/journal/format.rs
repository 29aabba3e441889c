//! The jbd2 on-disk format: the journal superblock, block headers,
//! descriptor tags, commit and revoke blocks, and their crc32c checksums
//! (csum v2/v3). Every field is big-endian. Layouts follow the kernel's
//! "Journal (jbd2)" section of the ext4 on-disk format documentation.
//!
//! Parsers take a whole journal block and check every count against the
//! block size before they loop; builders (used by the log writer,
//! `writer.rs`, and by tests) produce blocks that these parsers and e2fsck
//! accept.

use crate::error::{corrupt, Error, Result};
use crate::format::checksum::crc32c;

/// `h_magic` of every journal metadata block.
pub const MAGIC: u32 = 0xC03B_3998;

// h_blocktype
pub const DESCRIPTOR_BLOCK: u32 = 1;
pub const COMMIT_BLOCK: u32 = 2;
pub const SUPERBLOCK_V1: u32 = 3;
pub const SUPERBLOCK_V2: u32 = 4;
pub const REVOKE_BLOCK: u32 = 5;

/// Size of `journal_header_t`: magic, blocktype, sequence.
pub const HEADER_SIZE: usize = 12;
/// The journal superblock occupies the first 1024 bytes of journal block 0.
pub const SB_SIZE: usize = 1024;
/// Offset of `s_checksum` in the journal superblock.
const SB_CSUM_OFF: usize = 0xFC;
/// `s_checksum_type` value for crc32c.
pub const CHECKSUM_CRC32C: u8 = 4;

// s_feature_compat
pub const COMPAT_CHECKSUM: u32 = 0x1;
// s_feature_incompat
pub const INCOMPAT_REVOKE: u32 = 0x1;
pub const INCOMPAT_64BIT: u32 = 0x2;
pub const INCOMPAT_ASYNC_COMMIT: u32 = 0x4;
pub const INCOMPAT_CSUM_V2: u32 = 0x8;
pub const INCOMPAT_CSUM_V3: u32 = 0x10;
pub const INCOMPAT_FAST_COMMIT: u32 = 0x20;
/// The incompat features recovery understands (fast commits are refused:
/// their blocks would have to be replayed as ext4 operations).
pub const INCOMPAT_SUPPORTED: u32 =
    INCOMPAT_REVOKE | INCOMPAT_64BIT | INCOMPAT_ASYNC_COMMIT | INCOMPAT_CSUM_V2 | INCOMPAT_CSUM_V3;

// Tag flags (the low 16 bits of t_flags).
/// The block's first four bytes were the magic and are stored zeroed.
pub const FLAG_ESCAPE: u16 = 0x1;
/// No 16-byte UUID follows this tag.
pub const FLAG_SAME_UUID: u16 = 0x2;
pub const FLAG_DELETED: u16 = 0x4;
/// The last tag of the descriptor block.
pub const FLAG_LAST_TAG: u16 = 0x8;

/// `struct jbd2_journal_block_tail`: the crc32c at the end of descriptor
/// and revoke blocks (csum v2/v3).
pub const TAIL_SIZE: usize = 4;
/// Revoke header: journal header plus `r_count`.
pub const REVOKE_HEADER_SIZE: usize = 16;
/// Offsets in a commit block.
const COMMIT_CHKSUM_TYPE: usize = 0xC;
const COMMIT_CHKSUM_SIZE: usize = 0xD;
const COMMIT_CHKSUM0: usize = 0x10;
const COMMIT_SEC: usize = 0x30;
const COMMIT_NSEC: usize = 0x38;

#[inline]
pub fn be32(b: &[u8], off: usize) -> u32 {
    match b.get(off..off + 4) {
        Some(s) => u32::from_be_bytes([s[0], s[1], s[2], s[3]]),
        None => 0,
    }
}

#[inline]
pub fn be16(b: &[u8], off: usize) -> u16 {
    match b.get(off..off + 2) {
        Some(s) => u16::from_be_bytes([s[0], s[1]]),
        None => 0,
    }
}

#[inline]
pub fn be64(b: &[u8], off: usize) -> u64 {
    (u64::from(be32(b, off)) << 32) | u64::from(be32(b, off + 4))
}

#[inline]
fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

/// The journal superblock, checked.
#[derive(Clone, Debug)]
pub struct JournalSuperblock {
    /// SUPERBLOCK_V1 or SUPERBLOCK_V2.
    pub blocktype: u32,
    pub block_size: u32,
    /// Blocks in the journal (the log wraps at this index).
    pub maxlen: u32,
    /// The first log block (block 0 holds this superblock).
    pub first: u32,
    /// The sequence number of the first transaction in the log.
    pub sequence: u32,
    /// Where the log starts; 0 when the journal is empty (clean).
    pub start: u32,
    pub errno: i32,
    pub feature_compat: u32,
    pub feature_incompat: u32,
    pub feature_ro_compat: u32,
    pub uuid: [u8; 16],
    pub checksum_type: u8,
    /// Blocks at the end reserved for fast commits (fast_commit only).
    pub num_fc_blocks: u32,
    /// The raw 1024 bytes, kept so that a rewrite changes only what it means to.
    pub raw: Vec<u8>,
}

impl JournalSuperblock {
    /// Parse and check the journal superblock from (at least) its first
    /// 1024 bytes; `fs_block_size` is the filesystem's block size, which an
    /// internal journal must share; `blocks` is the size of the journal
    /// inode in blocks.
    pub fn parse(b: &[u8], fs_block_size: usize, blocks: u64) -> Result<JournalSuperblock> {
        let what = "journal superblock";
        if b.len() < SB_SIZE {
            return Err(corrupt(what, "short read"));
        }
        let magic = be32(b, 0);
        if magic != MAGIC {
            return Err(corrupt(what, format!("bad magic {magic:#010x}")));
        }
        let blocktype = be32(b, 4);
        if blocktype != SUPERBLOCK_V1 && blocktype != SUPERBLOCK_V2 {
            return Err(corrupt(what, format!("block type {blocktype}")));
        }
        let v2 = blocktype == SUPERBLOCK_V2;
        // Version 1 superblocks have no feature fields.
        let feat = |off: usize| if v2 { be32(b, off) } else { 0 };
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[0x30..0x40]);
        let js = JournalSuperblock {
            blocktype,
            block_size: be32(b, 0xC),
            maxlen: be32(b, 0x10),
            first: be32(b, 0x14),
            sequence: be32(b, 0x18),
            start: be32(b, 0x1C),
            errno: be32(b, 0x20) as i32,
            feature_compat: feat(0x24),
            feature_incompat: feat(0x28),
            feature_ro_compat: feat(0x2C),
            uuid,
            checksum_type: if v2 { b[0x50] } else { 0 },
            num_fc_blocks: if v2 { be32(b, 0x54) } else { 0 },
            raw: b[..SB_SIZE].to_vec(),
        };
        let unknown = js.feature_incompat & !INCOMPAT_SUPPORTED;
        if unknown != 0 {
            let name = if unknown & INCOMPAT_FAST_COMMIT != 0 {
                "fast_commit".to_string()
            } else {
                format!("{unknown:#x}")
            };
            return Err(Error::Incompatible(format!(
                "journal incompat feature {name}: replay it with e2fsck -fy IMAGE"
            )));
        }
        // jbd2 defines no read-only-compatible features: any is unknown,
        // and the kernel and e2fsck refuse to load such a journal.
        if js.feature_ro_compat != 0 {
            return Err(Error::Incompatible(format!(
                "journal ro_compat feature {:#x}: replay it with e2fsck -fy IMAGE",
                js.feature_ro_compat
            )));
        }
        if js.feature_incompat & INCOMPAT_CSUM_V2 != 0
            && js.feature_incompat & INCOMPAT_CSUM_V3 != 0
        {
            return Err(corrupt(what, "both checksum v2 and v3 set"));
        }
        if js.csum_v2or3() {
            if js.checksum_type != CHECKSUM_CRC32C {
                return Err(corrupt(what, format!("checksum type {}", js.checksum_type)));
            }
            let stored = be32(b, SB_CSUM_OFF);
            let c = sb_checksum(&js.raw);
            if c != stored {
                return Err(corrupt(
                    what,
                    format!("checksum {stored:#010x}, computed {c:#010x}"),
                ));
            }
        }
        // s_nr_users: more than one filesystem shares an external journal
        // only (e2fsck repairs or refuses such an internal one).
        let users = be32(b, 0x40);
        if v2 && users > 1 {
            return Err(corrupt(
                what,
                format!("s_nr_users {users} in an internal journal"),
            ));
        }
        if js.block_size as usize != fs_block_size {
            return Err(corrupt(
                what,
                format!(
                    "block size {} differs from the filesystem's {fs_block_size}",
                    js.block_size
                ),
            ));
        }
        if u64::from(js.maxlen) > blocks || js.maxlen < 2 {
            return Err(corrupt(
                what,
                format!(
                    "s_maxlen {} but the journal inode has {blocks} blocks",
                    js.maxlen
                ),
            ));
        }
        if js.first == 0 || js.first >= js.last() {
            return Err(corrupt(
                what,
                format!("s_first {} (s_maxlen {})", js.first, js.maxlen),
            ));
        }
        if js.start != 0 && (js.start < js.first || js.start >= js.last()) {
            return Err(corrupt(
                what,
                format!("s_start {} outside [{}, {})", js.start, js.first, js.last()),
            ));
        }
        Ok(js)
    }

    pub fn has_incompat(&self, f: u32) -> bool {
        self.feature_incompat & f != 0
    }
    /// Checksum v2 or v3: every metadata block carries a crc32c.
    pub fn csum_v2or3(&self) -> bool {
        self.has_incompat(INCOMPAT_CSUM_V2 | INCOMPAT_CSUM_V3)
    }
    pub fn is_64bit(&self) -> bool {
        self.has_incompat(INCOMPAT_64BIT)
    }
    /// One past the last log block (fast-commit blocks, if the feature
    /// is on, are not log; recovery refuses that feature anyway).
    pub fn last(&self) -> u32 {
        if self.has_incompat(INCOMPAT_FAST_COMMIT) {
            self.maxlen.saturating_sub(self.num_fc_blocks)
        } else {
            self.maxlen
        }
    }
    /// Blocks in the circular log.
    pub fn log_len(&self) -> u32 {
        self.last().saturating_sub(self.first)
    }
    /// The seed of every block checksum: crc32c(~0, uuid).
    pub fn csum_seed(&self) -> u32 {
        crc32c(!0, &self.uuid)
    }
    /// Bytes per descriptor tag.
    pub fn tag_bytes(&self) -> usize {
        tag_bytes(self.feature_incompat)
    }
    /// The next log block after `blk`, wrapping at the end of the log.
    pub fn wrap_next(&self, blk: u32) -> u32 {
        let n = blk + 1;
        if n >= self.last() {
            self.first
        } else {
            n
        }
    }

    /// This superblock with the log marked empty (s_start = 0), the next
    /// transaction at `sequence` and s_errno cleared, checksum updated:
    /// what recovery writes back (as e2fsck's journal release does).
    pub fn reset_bytes(&self, sequence: u32) -> Vec<u8> {
        let mut js = self.clone();
        js.sequence = sequence;
        js.start = 0;
        // An aborted journal's error moves to the filesystem's state.
        js.errno = 0;
        js.to_bytes()
    }

    /// The 1024 bytes of this superblock: the raw bytes it was parsed from
    /// with s_sequence, s_start, s_errno, the feature words (v2) and the
    /// checksum type written back, checksum updated.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = self.raw.clone();
        put32(&mut b, 0x18, self.sequence);
        put32(&mut b, 0x1C, self.start);
        put32(&mut b, 0x20, self.errno as u32);
        if self.blocktype == SUPERBLOCK_V2 {
            put32(&mut b, 0x24, self.feature_compat);
            put32(&mut b, 0x28, self.feature_incompat);
            put32(&mut b, 0x2C, self.feature_ro_compat);
            b[0x50] = self.checksum_type;
        }
        if self.csum_v2or3() {
            let c = sb_checksum(&b);
            put32(&mut b, SB_CSUM_OFF, c);
        }
        b
    }
}

/// crc32c(~0, superblock with s_checksum zeroed).
pub fn sb_checksum(b: &[u8]) -> u32 {
    let c = crc32c(!0, &b[..SB_CSUM_OFF]);
    let c = crc32c(c, &[0; 4]);
    crc32c(c, &b[SB_CSUM_OFF + 4..SB_SIZE])
}

/// Bytes per descriptor tag for these incompat features: 16 with csum v3
/// (`journal_block_tag3_t`), else 8, plus 4 with 64bit, plus 2 with csum v2.
pub fn tag_bytes(incompat: u32) -> usize {
    if incompat & INCOMPAT_CSUM_V3 != 0 {
        return 16;
    }
    let mut sz = 12;
    if incompat & INCOMPAT_CSUM_V2 != 0 {
        sz += 2;
    }
    if incompat & INCOMPAT_64BIT != 0 {
        sz
    } else {
        sz - 4
    }
}

/// A journal block header, if `b` starts with the magic.
pub fn header(b: &[u8]) -> Option<(u32, u32)> {
    (be32(b, 0) == MAGIC).then(|| (be32(b, 4), be32(b, 8)))
}

/// crc32c(seed, block with the 4-byte field at `off` zeroed).
fn csum_with_hole(seed: u32, b: &[u8], off: usize) -> u32 {
    let c = crc32c(seed, &b[..off]);
    let c = crc32c(c, &[0; 4]);
    crc32c(c, &b[off + 4..])
}

/// The descriptor/revoke block tail checksum is right (or not used).
pub fn block_tail_ok(js: &JournalSuperblock, b: &[u8]) -> bool {
    if !js.csum_v2or3() {
        return true;
    }
    let off = b.len() - TAIL_SIZE;
    be32(b, off) == csum_with_hole(js.csum_seed(), b, off)
}

/// Set the tail checksum of a descriptor or revoke block.
pub fn set_block_tail(js: &JournalSuperblock, b: &mut [u8]) {
    if js.csum_v2or3() {
        let off = b.len() - TAIL_SIZE;
        let c = csum_with_hole(js.csum_seed(), b, off);
        put32(b, off, c);
    }
}

/// The commit block checksum (h_chksum[0]) is right (or not used).
pub fn commit_ok(js: &JournalSuperblock, b: &[u8]) -> bool {
    if !js.csum_v2or3() {
        return true;
    }
    be32(b, COMMIT_CHKSUM0) == csum_with_hole(js.csum_seed(), b, COMMIT_CHKSUM0)
}

/// Commit time (seconds) of a commit block.
pub fn commit_time(b: &[u8]) -> u64 {
    be64(b, COMMIT_SEC)
}

/// The checksum of a logged block as its tag stores it: crc32c over the
/// big-endian sequence then the block (as stored in the journal).
pub fn data_csum(js: &JournalSuperblock, sequence: u32, data: &[u8]) -> u32 {
    let c = crc32c(js.csum_seed(), &sequence.to_be_bytes());
    crc32c(c, data)
}

/// One descriptor tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    /// Home block number.
    pub blocknr: u64,
    pub flags: u16,
    /// The stored checksum (32 bits with v3, 16 with v2, 0 without).
    pub csum: u32,
}

impl Tag {
    /// The logged block's checksum matches (or checksums are off).
    pub fn csum_ok(&self, js: &JournalSuperblock, sequence: u32, data: &[u8]) -> bool {
        if !js.csum_v2or3() {
            return true;
        }
        let c = data_csum(js, sequence, data);
        if js.has_incompat(INCOMPAT_CSUM_V3) {
            self.csum == c
        } else {
            self.csum == c & 0xFFFF
        }
    }
}

/// The tags of a descriptor block, in order. Stops at the LAST_TAG flag or
/// where the next tag would not fit (before the tail): at most
/// `(block size - 12) / tag_bytes` tags.
pub fn tags(js: &JournalSuperblock, b: &[u8]) -> Vec<Tag> {
    let tb = js.tag_bytes();
    let end = b.len() - if js.csum_v2or3() { TAIL_SIZE } else { 0 };
    let v3 = js.has_incompat(INCOMPAT_CSUM_V3);
    let mut out = Vec::new();
    let mut p = HEADER_SIZE;
    while p + tb <= end {
        // t_flags: be16 at +6 in both layouts (the low half of tag3's be32).
        let flags = be16(b, p + 6);
        let mut blocknr = u64::from(be32(b, p));
        if js.is_64bit() {
            blocknr |= u64::from(be32(b, p + 8)) << 32;
        }
        let csum = if v3 {
            be32(b, p + 12)
        } else if js.has_incompat(INCOMPAT_CSUM_V2) {
            u32::from(be16(b, p + 4))
        } else {
            0
        };
        out.push(Tag {
            blocknr,
            flags,
            csum,
        });
        p += tb;
        if flags & FLAG_SAME_UUID == 0 {
            p += 16;
        }
        if flags & FLAG_LAST_TAG != 0 {
            break;
        }
    }
    out
}

/// The block numbers a revoke block revokes. `r_count` (bytes used,
/// header included) is checked against the block size.
pub fn revoke_records(js: &JournalSuperblock, b: &[u8], what: &str) -> Result<Vec<u64>> {
    let count = be32(b, HEADER_SIZE) as usize;
    let limit = b.len() - if js.csum_v2or3() { TAIL_SIZE } else { 0 };
    if count > limit {
        return Err(corrupt(what, format!("r_count {count} beyond the block")));
    }
    let rl = if js.is_64bit() { 8 } else { 4 };
    let mut out = Vec::with_capacity(count.saturating_sub(REVOKE_HEADER_SIZE) / rl);
    let mut off = REVOKE_HEADER_SIZE;
    while off + rl <= count {
        out.push(if rl == 8 {
            be64(b, off)
        } else {
            u64::from(be32(b, off))
        });
        off += rl;
    }
    Ok(out)
}

// ---- builders ---------------------------------------------------------

fn put_header(b: &mut [u8], blocktype: u32, sequence: u32) {
    put32(b, 0, MAGIC);
    put32(b, 4, blocktype);
    put32(b, 8, sequence);
}

/// How many tags fit in one descriptor block (all but the first with
/// SAME_UUID; the first carries the 16-byte UUID).
pub fn tags_per_descriptor(js: &JournalSuperblock) -> usize {
    let bs = js.block_size as usize;
    let room = bs - HEADER_SIZE - if js.csum_v2or3() { TAIL_SIZE } else { 0 };
    let tb = js.tag_bytes();
    if room < tb + 16 {
        0
    } else {
        1 + (room - tb - 16) / tb
    }
}

/// A descriptor block for `blocks` (home block number, the data as it
/// will be stored in the journal — already escaped — and whether it was).
/// The caller keeps `blocks.len() <= tags_per_descriptor(js)`.
pub fn build_descriptor(
    js: &JournalSuperblock,
    sequence: u32,
    blocks: &[(u64, &[u8], bool)],
) -> Vec<u8> {
    let bs = js.block_size as usize;
    let tb = js.tag_bytes();
    let mut b = vec![0u8; bs];
    put_header(&mut b, DESCRIPTOR_BLOCK, sequence);
    let mut p = HEADER_SIZE;
    for (i, &(home, data, escaped)) in blocks.iter().enumerate() {
        let mut flags = 0u16;
        if escaped {
            flags |= FLAG_ESCAPE;
        }
        if i > 0 {
            flags |= FLAG_SAME_UUID;
        }
        if i + 1 == blocks.len() {
            flags |= FLAG_LAST_TAG;
        }
        put32(&mut b, p, home as u32);
        b[p + 6..p + 8].copy_from_slice(&flags.to_be_bytes());
        if js.is_64bit() {
            put32(&mut b, p + 8, (home >> 32) as u32);
        }
        let c = data_csum(js, sequence, data);
        if js.has_incompat(INCOMPAT_CSUM_V3) {
            put32(&mut b, p + 12, c);
        } else if js.has_incompat(INCOMPAT_CSUM_V2) {
            b[p + 4..p + 6].copy_from_slice(&(c as u16).to_be_bytes());
        }
        p += tb;
        if i == 0 {
            b[p..p + 16].copy_from_slice(&js.uuid);
            p += 16;
        }
    }
    set_block_tail(js, &mut b);
    b
}

/// The journal copy of a data block: a block that starts with the magic
/// is stored with those four bytes zeroed (and its tag says ESCAPE).
pub fn escape(data: &[u8]) -> (Vec<u8>, bool) {
    let mut v = data.to_vec();
    let esc = be32(data, 0) == MAGIC;
    if esc {
        v[..4].fill(0);
    }
    (v, esc)
}

/// A revoke block for `blocks`; the caller keeps them within
/// `revokes_per_block(js)`.
pub fn build_revoke(js: &JournalSuperblock, sequence: u32, blocks: &[u64]) -> Vec<u8> {
    let bs = js.block_size as usize;
    let mut b = vec![0u8; bs];
    put_header(&mut b, REVOKE_BLOCK, sequence);
    let mut off = REVOKE_HEADER_SIZE;
    for &blk in blocks {
        if js.is_64bit() {
            b[off..off + 8].copy_from_slice(&blk.to_be_bytes());
            off += 8;
        } else {
            put32(&mut b, off, blk as u32);
            off += 4;
        }
    }
    put32(&mut b, HEADER_SIZE, off as u32);
    set_block_tail(js, &mut b);
    b
}

/// Revoke records that fit in one revoke block.
pub fn revokes_per_block(js: &JournalSuperblock) -> usize {
    let bs = js.block_size as usize;
    let room = bs - REVOKE_HEADER_SIZE - if js.csum_v2or3() { TAIL_SIZE } else { 0 };
    room / if js.is_64bit() { 8 } else { 4 }
}

/// A commit block for `sequence` at time `sec`.`nsec`.
pub fn build_commit(js: &JournalSuperblock, sequence: u32, sec: u64, nsec: u32) -> Vec<u8> {
    let bs = js.block_size as usize;
    let mut b = vec![0u8; bs];
    put_header(&mut b, COMMIT_BLOCK, sequence);
    b[COMMIT_SEC..COMMIT_SEC + 8].copy_from_slice(&sec.to_be_bytes());
    put32(&mut b, COMMIT_NSEC, nsec);
    if js.csum_v2or3() {
        b[COMMIT_CHKSUM_TYPE] = CHECKSUM_CRC32C;
        b[COMMIT_CHKSUM_SIZE] = 4;
        let c = csum_with_hole(js.csum_seed(), &b, COMMIT_CHKSUM0);
        put32(&mut b, COMMIT_CHKSUM0, c);
    }
    b
}

/// The CRC of checksum v1 (COMPAT_CHECKSUM): the big-endian (MSB-first)
/// CRC-32 with polynomial 0x04C11DB7 and no inversion, as the kernel's
/// `crc32_be(crc, p, len)`; a transaction's starts at !0.
pub fn crc32_be(mut crc: u32, data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = (i as u32) << 24;
            let mut k = 0;
            while k < 8 {
                c = if c & 0x8000_0000 != 0 {
                    (c << 1) ^ 0x04C1_1DB7
                } else {
                    c << 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    for &b in data {
        crc = (crc << 8) ^ TABLE[((crc >> 24) as u8 ^ b) as usize];
    }
    crc
}

/// Checksum v1 is on: one CRC over each transaction's descriptor and data
/// blocks, stored in its commit block.
pub fn v1_checksums(js: &JournalSuperblock) -> bool {
    js.feature_compat & COMPAT_CHECKSUM != 0 && !js.csum_v2or3()
}

/// `h_chksum_type` of a v1 (crc32_be) commit block.
pub const CHECKSUM_CRC32: u8 = 1;

/// The v1 fields of a commit block: (type, size, h_chksum[0]).
pub fn commit_v1(b: &[u8]) -> (u8, u8, u32) {
    (
        b[COMMIT_CHKSUM_TYPE],
        b[COMMIT_CHKSUM_SIZE],
        be32(b, COMMIT_CHKSUM0),
    )
}

/// A commit block carrying the v1 checksum `crc`.
pub fn build_commit_v1(js: &JournalSuperblock, sequence: u32, sec: u64, crc: u32) -> Vec<u8> {
    let mut b = build_commit(js, sequence, sec, 0);
    b[COMMIT_CHKSUM_TYPE] = CHECKSUM_CRC32;
    b[COMMIT_CHKSUM_SIZE] = 4;
    put32(&mut b, COMMIT_CHKSUM0, crc);
    b
}

/// One block of a transaction in the log: built here (descriptor, revoke,
/// commit, or a data block that had to be escaped), or a caller's block
/// written as it is (no copy).
pub enum LogBlock<'a> {
    Built(Vec<u8>),
    Data(&'a [u8]),
}

impl LogBlock<'_> {
    /// The block's bytes as they go into the log.
    pub fn bytes(&self) -> &[u8] {
        match self {
            LogBlock::Built(b) => b,
            LogBlock::Data(d) => d,
        }
    }
}

/// A whole transaction as the journal stores it, in log order: revoke
/// blocks for `revokes`, then for each run of blocks that fits a
/// descriptor, the descriptor and the (escaped) data blocks, then the
/// commit block. `blocks` are (home block, contents of one block).
pub fn build_transaction(
    js: &JournalSuperblock,
    sequence: u32,
    blocks: &[(u64, &[u8])],
    revokes: &[u64],
    commit_sec: u64,
) -> Vec<Vec<u8>> {
    layout_transaction(js, sequence, blocks, revokes, commit_sec)
        .into_iter()
        .map(|b| match b {
            LogBlock::Built(v) => v,
            LogBlock::Data(d) => d.to_vec(),
        })
        .collect()
}

/// Log blocks of a transaction of `blocks` data blocks and `revokes`
/// revoke records, as [`layout_transaction`] lays it out: the revoke
/// blocks, a descriptor per run of data blocks, the data blocks, the
/// commit block.
pub fn transaction_len(js: &JournalSuperblock, blocks: usize, revokes: usize) -> usize {
    let per_revoke = revokes_per_block(js).max(1);
    let per_desc = tags_per_descriptor(js).max(1);
    revokes.div_ceil(per_revoke) + blocks + blocks.div_ceil(per_desc) + 1
}

/// Where data block `i` of such a transaction lies, counted from its first
/// log block: after the revoke blocks, its run's descriptor and the data
/// blocks before it.
pub fn data_block_index(js: &JournalSuperblock, revokes: usize, i: usize) -> usize {
    let per_revoke = revokes_per_block(js).max(1);
    let per_desc = tags_per_descriptor(js).max(1);
    revokes.div_ceil(per_revoke) + i / per_desc + 1 + i
}

/// [`build_transaction`] without copying the data blocks: a data block
/// is borrowed unless it starts with the journal magic and must be
/// escaped (rare: a copy with the first word zeroed).
pub fn layout_transaction<'a>(
    js: &JournalSuperblock,
    sequence: u32,
    blocks: &[(u64, &'a [u8])],
    revokes: &[u64],
    commit_sec: u64,
) -> Vec<LogBlock<'a>> {
    let per_revoke = revokes_per_block(js).max(1);
    let per_desc = tags_per_descriptor(js).max(1);
    let mut out = Vec::with_capacity(
        revokes.len().div_ceil(per_revoke) + blocks.len() + blocks.len().div_ceil(per_desc) + 1,
    );
    for chunk in revokes.chunks(per_revoke) {
        out.push(LogBlock::Built(build_revoke(js, sequence, chunk)));
    }
    for chunk in blocks.chunks(per_desc) {
        let logged: Vec<(LogBlock<'a>, bool)> = chunk
            .iter()
            .map(|&(_, d)| {
                if d.len() >= 4 && be32(d, 0) == MAGIC {
                    (LogBlock::Built(escape(d).0), true)
                } else {
                    (LogBlock::Data(d), false)
                }
            })
            .collect();
        let tags: Vec<(u64, &[u8], bool)> = chunk
            .iter()
            .zip(&logged)
            .map(|(&(home, _), (b, esc))| (home, b.bytes(), *esc))
            .collect();
        let desc = build_descriptor(js, sequence, &tags);
        drop(tags);
        out.push(LogBlock::Built(desc));
        out.extend(logged.into_iter().map(|(b, _)| b));
    }
    if v1_checksums(js) {
        // Descriptors and data blocks, in log order; revoke blocks are not
        // covered.
        let crc = out
            .iter()
            .map(LogBlock::bytes)
            .filter(|b| header(b).is_none_or(|(t, _)| t != REVOKE_BLOCK))
            .fold(!0, crc32_be);
        out.push(LogBlock::Built(build_commit_v1(
            js, sequence, commit_sec, crc,
        )));
    } else {
        out.push(LogBlock::Built(build_commit(js, sequence, commit_sec, 0)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(incompat: u32, bs: u32) -> JournalSuperblock {
        let mut b = vec![0u8; SB_SIZE];
        put_header(&mut b, SUPERBLOCK_V2, 0);
        put32(&mut b, 0xC, bs);
        put32(&mut b, 0x10, 1024);
        put32(&mut b, 0x14, 1);
        put32(&mut b, 0x18, 7);
        put32(&mut b, 0x28, incompat);
        b[0x30..0x40].copy_from_slice(&[9; 16]);
        b[0x50] = CHECKSUM_CRC32C;
        let c = sb_checksum(&b);
        put32(&mut b, SB_CSUM_OFF, c);
        JournalSuperblock::parse(&b, bs as usize, 1024).unwrap()
    }

    #[test]
    fn data_block_index_and_transaction_len_follow_the_layout() {
        for incompat in [INCOMPAT_CSUM_V3 | INCOMPAT_64BIT, INCOMPAT_64BIT, 0] {
            for bs in [1024u32, 4096] {
                let js = sb(incompat | INCOMPAT_REVOKE, bs);
                let per_desc = tags_per_descriptor(&js);
                let per_revoke = revokes_per_block(&js);
                for nblocks in [
                    0,
                    1,
                    2,
                    per_desc - 1,
                    per_desc,
                    per_desc + 1,
                    2 * per_desc + 3,
                ] {
                    for nrevokes in [0, 1, per_revoke, per_revoke + 1] {
                        let data: Vec<Vec<u8>> = (0..nblocks)
                            .map(|i| vec![(i % 251) as u8 + 1; bs as usize])
                            .collect();
                        let blocks: Vec<(u64, &[u8])> = data
                            .iter()
                            .enumerate()
                            .map(|(i, d)| (100 + i as u64, &d[..]))
                            .collect();
                        let revokes: Vec<u64> = (0..nrevokes as u64).map(|r| 5000 + r).collect();
                        let log = layout_transaction(&js, 7, &blocks, &revokes, 0);
                        assert_eq!(log.len(), transaction_len(&js, nblocks, nrevokes));
                        for (i, d) in data.iter().enumerate() {
                            assert_eq!(log[data_block_index(&js, nrevokes, i)].bytes(), &d[..]);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn crc32_be_matches_the_standard_check_value() {
        // CRC-32/MPEG-2 (MSB-first, init !0, no final xor) of "123456789".
        assert_eq!(crc32_be(!0, b"123456789"), 0x0376_E6E7);
    }

    #[test]
    fn tag_sizes_follow_the_features() {
        assert_eq!(tag_bytes(0), 8);
        assert_eq!(tag_bytes(INCOMPAT_64BIT), 12);
        assert_eq!(tag_bytes(INCOMPAT_CSUM_V2), 10);
        assert_eq!(tag_bytes(INCOMPAT_CSUM_V2 | INCOMPAT_64BIT), 14);
        assert_eq!(tag_bytes(INCOMPAT_CSUM_V3), 16);
        assert_eq!(tag_bytes(INCOMPAT_CSUM_V3 | INCOMPAT_64BIT), 16);
    }

    #[test]
    fn descriptor_round_trips_with_every_tag_layout() {
        for inc in [
            0,
            INCOMPAT_64BIT,
            INCOMPAT_CSUM_V2,
            INCOMPAT_CSUM_V3 | INCOMPAT_64BIT,
            INCOMPAT_CSUM_V3,
        ] {
            let js = sb(inc | INCOMPAT_REVOKE, 1024);
            let n = tags_per_descriptor(&js);
            let data: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 1024]).collect();
            let homes: Vec<u64> = (0..n as u64)
                .map(|i| {
                    if js.is_64bit() {
                        (i << 32) | i
                    } else {
                        i + 100
                    }
                })
                .collect();
            let blocks: Vec<(u64, &[u8], bool)> = homes
                .iter()
                .zip(&data)
                .map(|(&h, d)| (h, d.as_slice(), h.is_multiple_of(3)))
                .collect();
            let d = build_descriptor(&js, 7, &blocks);
            assert!(block_tail_ok(&js, &d));
            let t = tags(&js, &d);
            assert_eq!(t.len(), n, "incompat {inc:#x}");
            for (i, tag) in t.iter().enumerate() {
                assert_eq!(tag.blocknr, homes[i]);
                assert_eq!(tag.flags & FLAG_ESCAPE != 0, homes[i].is_multiple_of(3));
                assert!(tag.csum_ok(&js, 7, &data[i]));
                assert_eq!(tag.csum_ok(&js, 8, &data[i]), !js.csum_v2or3());
            }
            let mut bad = d.clone();
            bad[20] ^= 1;
            assert_eq!(block_tail_ok(&js, &bad), !js.csum_v2or3());
        }
    }

    #[test]
    fn revoke_and_commit_round_trip() {
        for inc in [INCOMPAT_CSUM_V3, INCOMPAT_CSUM_V3 | INCOMPAT_64BIT, 0] {
            let js = sb(inc | INCOMPAT_REVOKE, 4096);
            let n = revokes_per_block(&js);
            let v: Vec<u64> = (0..n as u64).map(|i| i * 3 + 1).collect();
            let r = build_revoke(&js, 9, &v);
            assert!(block_tail_ok(&js, &r));
            assert_eq!(revoke_records(&js, &r, "r").unwrap(), v);
            let mut big = r.clone();
            put32(&mut big, HEADER_SIZE, 4096);
            assert_eq!(revoke_records(&js, &big, "r").is_err(), js.csum_v2or3());
            let c = build_commit(&js, 9, 1_700_000_000, 5);
            assert_eq!(header(&c), Some((COMMIT_BLOCK, 9)));
            assert!(commit_ok(&js, &c));
            assert_eq!(commit_time(&c), 1_700_000_000);
            let mut bad = c.clone();
            bad[100] = 1;
            assert_eq!(commit_ok(&js, &bad), !js.csum_v2or3());
        }
    }

    #[test]
    fn superblock_checks() {
        let js = sb(INCOMPAT_CSUM_V3, 1024);
        let mut b = js.raw.clone();
        assert!(
            JournalSuperblock::parse(&b, 4096, 1024).is_err(),
            "block size"
        );
        assert!(JournalSuperblock::parse(&b, 1024, 1000).is_err(), "maxlen");
        b[0x40] = 1; // s_nr_users: covered by the checksum
        assert!(
            JournalSuperblock::parse(&b, 1024, 1024).is_err(),
            "checksum"
        );
        let mut f = js.raw.clone();
        put32(&mut f, 0x28, INCOMPAT_CSUM_V3 | INCOMPAT_FAST_COMMIT);
        let c = sb_checksum(&f);
        put32(&mut f, SB_CSUM_OFF, c);
        let e = JournalSuperblock::parse(&f, 1024, 1024).unwrap_err();
        assert!(e.to_string().contains("fast_commit"), "{e}");
        let r = js.reset_bytes(12);
        let again = JournalSuperblock::parse(&r, 1024, 1024).unwrap();
        assert_eq!((again.sequence, again.start), (12, 0));
    }
}
