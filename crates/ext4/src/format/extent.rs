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

/// Check a node's header in `b` (60 bytes of `i_block` for the root, a
/// whole block otherwise): magic, entry counts that fit the space, and
/// the depth (`expect_depth`: what the parent says, `None` for the root).
/// Its entries are not looked at (`check_node` does that).
pub fn check_header(
    b: &[u8],
    what: &dyn Fn() -> String,
    expect_depth: Option<u16>,
) -> Result<Header> {
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
    Ok(h)
}

fn entry(b: &[u8], i: usize) -> &[u8] {
    &b[HEADER_SIZE + i * ENTRY_SIZE..HEADER_SIZE + (i + 1) * ENTRY_SIZE]
}

/// Entry `i` of an interior node whose header `check_header` passed
/// (`i` below its entry count), decoded but not checked (`check_index`).
pub fn index_at(b: &[u8], i: usize) -> Index {
    let e = entry(b, i);
    Index {
        block: le32(e, 0),
        leaf: u64::from(le32(e, 4)) | (u64::from(le16(e, 8)) << 32),
    }
}

/// Entry `i` of a leaf whose header `check_header` passed, decoded but
/// not checked (`check_extent`).
pub fn extent_at(b: &[u8], i: usize) -> Extent {
    let e = entry(b, i);
    let raw_len = le16(e, 4);
    let (len, uninit) = if raw_len > INIT_MAX_LEN {
        (raw_len - INIT_MAX_LEN, true)
    } else {
        (raw_len, false)
    };
    Extent {
        block: le32(e, 0),
        len,
        start: (u64::from(le16(e, 6)) << 32) | u64::from(le32(e, 8)),
        uninit,
    }
}

/// How many of the first `n` entries of node `b` start at or before
/// logical block `lblk` (entries are sorted by their first block: a
/// binary search over the raw entries, as the kernel's
/// ext4_ext_binsearch, without decoding the node).
pub fn search(b: &[u8], n: usize, lblk: u64) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if u64::from(le32(entry(b, mid), 0)) <= lblk {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// An index entry must name a block inside the filesystem.
pub fn check_index(ix: &Index, what: &dyn Fn() -> String, fs_blocks: u64) -> Result<()> {
    if ix.leaf == 0 || ix.leaf >= fs_blocks {
        return Err(corrupt(
            what(),
            format!("extent index -> block {}", ix.leaf),
        ));
    }
    Ok(())
}

/// An extent must be non-empty, end inside the 32-bit logical space and
/// map blocks inside the filesystem.
pub fn check_extent(x: &Extent, what: &dyn Fn() -> String, fs_blocks: u64) -> Result<()> {
    let end = u64::from(x.block) + u64::from(x.len);
    if x.len == 0 || end > 1u64 << 32 {
        return Err(corrupt(what(), format!("extent length {}", x.len)));
    }
    if x.start == 0 || !matches!(x.start.checked_add(u64::from(x.len)), Some(pe) if pe <= fs_blocks)
    {
        return Err(corrupt(
            what(),
            format!("extent -> blocks {}+{}", x.start, x.len),
        ));
    }
    Ok(())
}

/// Check a whole node: its header (`check_header`), its checksum tail
/// (`csum_seed`: `Some` with the inode's seed for a non-root node of a
/// metadata_csum filesystem) and every entry, which must be sorted, not
/// overlap and point inside the filesystem (`fs_blocks`).
pub fn check_node(
    b: &[u8],
    what: &dyn Fn() -> String,
    expect_depth: Option<u16>,
    csum_seed: Option<u32>,
    fs_blocks: u64,
) -> Result<Header> {
    let h = check_header(b, what, expect_depth)?;
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
    let mut prev_end: Option<u64> = None;
    for i in 0..usize::from(h.entries) {
        let (first, end) = if h.depth > 0 {
            let ix = index_at(b, i);
            check_index(&ix, what, fs_blocks)?;
            (u64::from(ix.block), u64::from(ix.block) + 1)
        } else {
            let x = extent_at(b, i);
            check_extent(&x, what, fs_blocks)?;
            (u64::from(x.block), u64::from(x.block) + u64::from(x.len))
        };
        if prev_end.is_some_and(|p| first < p) {
            let m = if h.depth > 0 {
                "extent index out of order"
            } else {
                "extents overlap or out of order"
            };
            return Err(corrupt(what(), m));
        }
        prev_end = Some(end);
    }
    Ok(h)
}

/// Parse a node: `check_node`, then its entries decoded.
pub fn parse_node(
    b: &[u8],
    what: &dyn Fn() -> String,
    expect_depth: Option<u16>,
    csum_seed: Option<u32>,
    fs_blocks: u64,
) -> Result<Node> {
    let h = check_node(b, what, expect_depth, csum_seed, fs_blocks)?;
    let n = usize::from(h.entries);
    Ok(if h.depth > 0 {
        Node::Index(h, (0..n).map(|i| index_at(b, i)).collect())
    } else {
        Node::Leaf(h, (0..n).map(|i| extent_at(b, i)).collect())
    })
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

/// Write extent `e` as entry `i` of the leaf in `b`.
pub fn put_extent(b: &mut [u8], i: usize, e: &Extent) {
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

/// Replace entries `from..to` of the leaf in `b` (which holds `n`) by
/// `new`, in place: the entries after them move (one `memmove`, as the
/// kernel's ext4_ext_insert_extent), the freed room at the end is zeroed
/// and the header's count updated. The caller checked that the result
/// fits the leaf's `max`.
pub fn splice_leaf(b: &mut [u8], n: usize, from: usize, to: usize, new: &[Extent]) {
    let m = n - (to - from) + new.len();
    let at = |i: usize| HEADER_SIZE + i * ENTRY_SIZE;
    b.copy_within(at(to)..at(n), at(from + new.len()));
    for (k, e) in new.iter().enumerate() {
        put_extent(b, from + k, e);
    }
    if m < n {
        b[at(m)..at(n)].fill(0);
    }
    b[2..4].copy_from_slice(&(m as u16).to_le_bytes());
}

/// Write a leaf node (`max` entries of room) into `b`, zeroing the rest of
/// the entry area; the generation word (bytes 8..12) is kept.
pub fn encode_leaf(b: &mut [u8], max: usize, ex: &[Extent]) {
    put_header(b, ex.len(), max, 0);
    b[HEADER_SIZE..HEADER_SIZE + max * ENTRY_SIZE].fill(0);
    for (i, e) in ex.iter().enumerate() {
        put_extent(b, i, e);
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

    /// A leaf block of `ex` (4 KiB, `max` = 340).
    fn leaf_of(ex: &[Extent]) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        encode_leaf(&mut b, entries_per_block(4096), ex);
        b
    }

    fn decode(b: &[u8]) -> Vec<Extent> {
        let n = usize::from(le16(b, 2));
        (0..n).map(|i| extent_at(b, i)).collect()
    }

    /// Sorted extents with gaps, from a seed.
    fn extents(seed: u64, n: usize) -> Vec<Extent> {
        let mut x = seed | 1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut block = 0u32;
        (0..n)
            .map(|_| {
                block += (next() % 3) as u32;
                let len = 1 + (next() % 4) as u16;
                let e = Extent {
                    block,
                    len,
                    start: 1000 + next() % 100_000,
                    uninit: next() % 2 == 0,
                };
                block += u32::from(len);
                e
            })
            .collect()
    }

    proptest::proptest! {
        /// The binary search over raw entries agrees with a search over
        /// the decoded list, for keys before, inside, between and after.
        #[test]
        fn search_matches_the_decoded_list(seed in 0u64..u64::MAX, n in 0usize..=340, key in 0u64..1500) {
            let ex = extents(seed, n);
            let b = leaf_of(&ex);
            let want = ex.partition_point(|e| u64::from(e.block) <= key);
            proptest::prop_assert_eq!(search(&b, n, key), want);
        }

        /// A splice in place leaves what encoding the spliced list gives:
        /// the same entries, the same count, zeros after them.
        #[test]
        fn splice_in_place_equals_a_fresh_encode(
            seed in 0u64..u64::MAX,
            n in 1usize..=340,
            a in 0usize..340,
            k in 0usize..340,
            add in 0usize..6,
        ) {
            let ex = extents(seed, n);
            let from = a % n;
            let to = (from + k % 4).min(n);
            let new = extents(seed ^ 0xABCD, add);
            if n - (to - from) + new.len() > entries_per_block(4096) {
                return Ok(());
            }
            let mut b = leaf_of(&ex);
            splice_leaf(&mut b, n, from, to, &new);
            let mut want = ex.clone();
            want.splice(from..to, new.iter().copied());
            proptest::prop_assert_eq!(decode(&b), want.clone());
            proptest::prop_assert_eq!(b, leaf_of(&want));
        }
    }

    #[test]
    fn check_node_finds_what_parse_node_refused() {
        let w = || "t".to_string();
        let ex = extents(7, 50);
        let mut b = leaf_of(&ex);
        assert!(check_node(&b, &w, Some(0), None, 200_000).is_ok());
        // Entry 20 moved before entry 19: out of order.
        let (e19, e20) = (ex[19], ex[20]);
        put_extent(&mut b, 19, &e20);
        put_extent(&mut b, 20, &e19);
        assert!(check_node(&b, &w, Some(0), None, 200_000).is_err());
        assert!(parse_node(&b, &w, Some(0), None, 200_000).is_err());
        // A checksum over the entries: any change to them is caught.
        let mut b = leaf_of(&ex);
        set_tail(&mut b, entries_per_block(4096), 42);
        assert!(check_node(&b, &w, Some(0), Some(42), 200_000).is_ok());
        b[HEADER_SIZE + 5 * ENTRY_SIZE + 9] ^= 1;
        assert!(check_node(&b, &w, Some(0), Some(42), 200_000).is_err());
    }
}
