//! The extent tree: a 12-byte header followed by 12-byte index entries
//! (interior nodes) or extents (leaves); the root lives in `i_block`, the
//! other nodes in blocks ending in a checksum tail.

use super::checksum::crc32c;
use super::{le16, le32};
use crate::error::{corrupt, Result};

pub const EXTENT_MAGIC: u16 = 0xF30A;
pub const HEADER_SIZE: usize = 12;
pub const ENTRY_SIZE: usize = 12;
/// The kernel refuses deeper trees (EXT4_MAX_EXTENT_DEPTH).
pub const MAX_DEPTH: u16 = 5;
/// Lengths above this mark an uninitialized (unwritten) extent.
pub const INIT_MAX_LEN: u16 = 32768;
// ext4_extent_header, ext4_extent_idx and ext4_extent are all 12 bytes;
// four entries plus the header fill the 60-byte i_block.
const _: () = assert!(HEADER_SIZE == 12 && ENTRY_SIZE == 12);
const _: () = assert!(HEADER_SIZE + 4 * ENTRY_SIZE == super::inode::I_BLOCK_LEN);

/// An extent node's header.
#[derive(Clone, Copy, Debug)]
pub struct Header {
    pub entries: u16,
    pub max: u16,
    pub depth: u16,
}

/// An interior entry: the subtree for logical blocks from `block` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Index {
    pub block: u32,
    pub leaf: u64,
}

/// A leaf entry: `len` logical blocks from `block` map to `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub block: u32,
    pub len: u16,
    pub start: u64,
    pub uninit: bool,
}

/// A parsed node: its header and its entries.
#[derive(Clone, Debug)]
pub enum Node {
    Index(Header, Vec<Index>),
    Leaf(Header, Vec<Extent>),
}

/// Parse a node from `b` (60 bytes of `i_block` for the root, a whole block
/// otherwise). `expect_depth` is the depth the parent says this node has
/// (`None` for the root). `csum_seed` is `Some` (the inode's checksum seed)
/// for a non-root node of a metadata_csum filesystem; `fs_blocks` bounds
/// physical block numbers.
pub fn parse_node(
    b: &[u8],
    what: &dyn Fn() -> String,
    expect_depth: Option<u16>,
    csum_seed: Option<u32>,
    fs_blocks: u64,
) -> Result<Node> {
    if b.len() < HEADER_SIZE {
        return Err(corrupt(what(), "extent node too short"));
    }
    let magic = le16(b, 0);
    if magic != EXTENT_MAGIC {
        return Err(corrupt(what(), format!("extent magic {magic:#06x}")));
    }
    let h = Header {
        entries: le16(b, 2),
        max: le16(b, 4),
        depth: le16(b, 6),
    };
    let room = (b.len() - HEADER_SIZE) / ENTRY_SIZE;
    if usize::from(h.max) > room || h.entries > h.max || h.max == 0 {
        return Err(corrupt(
            what(),
            format!("extent header entries {} max {}", h.entries, h.max),
        ));
    }
    if h.depth > MAX_DEPTH || expect_depth.is_some_and(|d| d != h.depth) {
        return Err(corrupt(what(), format!("extent depth {}", h.depth)));
    }
    if let Some(seed) = csum_seed {
        let off = HEADER_SIZE + usize::from(h.max) * ENTRY_SIZE;
        let Some(tail) = b.get(off..off + 4) else {
            return Err(corrupt(what(), "no room for the extent tail"));
        };
        let stored = le32(tail, 0);
        let c = crc32c(seed, &b[..off]);
        if c != stored {
            return Err(corrupt(
                what(),
                format!("extent block checksum {stored:#010x}, computed {c:#010x}"),
            ));
        }
    }
    let n = usize::from(h.entries);
    let ent = |i: usize| &b[HEADER_SIZE + i * ENTRY_SIZE..HEADER_SIZE + (i + 1) * ENTRY_SIZE];
    let mut prev_end: Option<u64> = None;
    if h.depth > 0 {
        let mut v = Vec::with_capacity(n);
        for i in 0..n {
            let e = ent(i);
            let ix = Index {
                block: le32(e, 0),
                leaf: u64::from(le32(e, 4)) | (u64::from(le16(e, 8)) << 32),
            };
            if ix.leaf == 0 || ix.leaf >= fs_blocks {
                return Err(corrupt(
                    what(),
                    format!("extent index -> block {}", ix.leaf),
                ));
            }
            if prev_end.is_some_and(|p| u64::from(ix.block) < p) {
                return Err(corrupt(what(), "extent index out of order"));
            }
            prev_end = Some(u64::from(ix.block) + 1);
            v.push(ix);
        }
        Ok(Node::Index(h, v))
    } else {
        let mut v = Vec::with_capacity(n);
        for i in 0..n {
            let e = ent(i);
            let raw_len = le16(e, 4);
            let (len, uninit) = if raw_len > INIT_MAX_LEN {
                (raw_len - INIT_MAX_LEN, true)
            } else {
                (raw_len, false)
            };
            let x = Extent {
                block: le32(e, 0),
                len,
                start: (u64::from(le16(e, 6)) << 32) | u64::from(le32(e, 8)),
                uninit,
            };
            let end = u64::from(x.block) + u64::from(x.len);
            if x.len == 0 || end > 1u64 << 32 {
                return Err(corrupt(what(), format!("extent length {raw_len}")));
            }
            if x.start == 0
                || !matches!(x.start.checked_add(u64::from(x.len)), Some(pe) if pe <= fs_blocks)
            {
                return Err(corrupt(
                    what(),
                    format!("extent -> blocks {}+{}", x.start, x.len),
                ));
            }
            if prev_end.is_some_and(|p| u64::from(x.block) < p) {
                return Err(corrupt(what(), "extents overlap or out of order"));
            }
            prev_end = Some(end);
            v.push(x);
        }
        Ok(Node::Leaf(h, v))
    }
}

/// Entries that fit in a tree block of `bs` bytes (with room for the
/// 4-byte checksum tail after them).
pub fn entries_per_block(bs: usize) -> usize {
    (bs - HEADER_SIZE - 4) / ENTRY_SIZE
}

fn put_header(b: &mut [u8], entries: usize, max: usize, depth: u16) {
    b[0..2].copy_from_slice(&EXTENT_MAGIC.to_le_bytes());
    b[2..4].copy_from_slice(&(entries as u16).to_le_bytes());
    b[4..6].copy_from_slice(&(max as u16).to_le_bytes());
    b[6..8].copy_from_slice(&depth.to_le_bytes());
}

/// Write a leaf node (`max` entries of room) into `b`, zeroing the rest of
/// the entry area; the generation word (bytes 8..12) is kept.
pub fn encode_leaf(b: &mut [u8], max: usize, ex: &[Extent]) {
    put_header(b, ex.len(), max, 0);
    b[HEADER_SIZE..HEADER_SIZE + max * ENTRY_SIZE].fill(0);
    for (i, e) in ex.iter().enumerate() {
        let o = HEADER_SIZE + i * ENTRY_SIZE;
        let len = if e.uninit {
            e.len + INIT_MAX_LEN
        } else {
            e.len
        };
        b[o..o + 4].copy_from_slice(&e.block.to_le_bytes());
        b[o + 4..o + 6].copy_from_slice(&len.to_le_bytes());
        b[o + 6..o + 8].copy_from_slice(&((e.start >> 32) as u16).to_le_bytes());
        b[o + 8..o + 12].copy_from_slice(&(e.start as u32).to_le_bytes());
    }
}

/// Write an index node of depth `depth` into `b` (as `encode_leaf`).
pub fn encode_index(b: &mut [u8], max: usize, depth: u16, ix: &[Index]) {
    put_header(b, ix.len(), max, depth);
    b[HEADER_SIZE..HEADER_SIZE + max * ENTRY_SIZE].fill(0);
    for (i, e) in ix.iter().enumerate() {
        let o = HEADER_SIZE + i * ENTRY_SIZE;
        b[o..o + 4].copy_from_slice(&e.block.to_le_bytes());
        b[o + 4..o + 8].copy_from_slice(&(e.leaf as u32).to_le_bytes());
        b[o + 8..o + 10].copy_from_slice(&((e.leaf >> 32) as u16).to_le_bytes());
    }
}

/// Set the checksum tail of a tree block whose header says `max` entries.
pub fn set_tail(b: &mut [u8], max: usize, csum_seed: u32) {
    let off = HEADER_SIZE + max * ENTRY_SIZE;
    let c = crc32c(csum_seed, &b[..off]);
    b[off..off + 4].copy_from_slice(&c.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(depth: u16, entries: u16, max: u16) -> Vec<u8> {
        let mut b = vec![0u8; 60];
        b[0..2].copy_from_slice(&EXTENT_MAGIC.to_le_bytes());
        b[2..4].copy_from_slice(&entries.to_le_bytes());
        b[4..6].copy_from_slice(&max.to_le_bytes());
        b[6..8].copy_from_slice(&depth.to_le_bytes());
        b
    }

    #[test]
    fn bad_headers_are_corrupt() {
        let w = || "t".to_string();
        for (depth, entries, max) in [(6, 0, 4), (0, 5, 4), (0, 1, 5), (0, 0, 0)] {
            let e = parse_node(&node(depth, entries, max), &w, None, None, 100).unwrap_err();
            assert!(e.is_corrupt(), "{depth} {entries} {max}");
        }
        // Wrong depth below a parent.
        assert!(parse_node(&node(1, 0, 4), &w, Some(0), None, 100).is_err());
        assert!(parse_node(&node(0, 0, 4), &w, Some(0), None, 100).is_ok());
    }

    #[test]
    fn extents_beyond_the_fs_or_overlapping_are_corrupt() {
        let w = || "t".to_string();
        let mut b = node(0, 2, 4);
        let put = |b: &mut Vec<u8>, i: usize, lblk: u32, len: u16, start: u32| {
            let o = 12 + 12 * i;
            b[o..o + 4].copy_from_slice(&lblk.to_le_bytes());
            b[o + 4..o + 6].copy_from_slice(&len.to_le_bytes());
            b[o + 8..o + 12].copy_from_slice(&start.to_le_bytes());
        };
        put(&mut b, 0, 0, 10, 50);
        put(&mut b, 1, 5, 1, 70);
        assert!(parse_node(&b, &w, None, None, 100).is_err(), "overlap");
        put(&mut b, 1, 10, 1, 99);
        assert!(parse_node(&b, &w, None, None, 100).is_ok());
        put(&mut b, 1, 10, 2, 99);
        assert!(parse_node(&b, &w, None, None, 100).is_err(), "past the end");
        // Uninitialized: length above 32768.
        put(&mut b, 1, 10, 32768 + 1, 90);
        let Node::Leaf(_, v) = parse_node(&b, &w, None, None, 100).unwrap() else {
            panic!()
        };
        assert!(v[1].uninit && v[1].len == 1);
    }
}
