//! Hashed directories (htree / dir_index): the dx_root in the directory's
//! block 0, dx_node interior blocks, their checksum tail, and the name
//! hashes (legacy, half_md4, tea; signed or unsigned chars).

use super::checksum::crc32c;
use super::{le16, le32, u8_at};
use crate::error::{corrupt, Result};

pub const HASH_LEGACY: u8 = 0;
pub const HASH_HALF_MD4: u8 = 1;
pub const HASH_TEA: u8 = 2;
pub const HASH_LEGACY_UNSIGNED: u8 = 3;
pub const HASH_HALF_MD4_UNSIGNED: u8 = 4;
pub const HASH_TEA_UNSIGNED: u8 = 5;

/// Offset of dx_root_info in block 0 (after the "." and ".." entries).
pub const ROOT_INFO_OFF: usize = 0x18;
/// Offset of the count/limit header in a dx_node (after its fake entry).
pub const NODE_COUNT_OFF: usize = 8;
pub const DX_ENTRY_SIZE: usize = 8;
pub const DX_TAIL_SIZE: usize = 8;
/// The kernel's limit on index levels (3 with large_dir, else 2).
pub const MAX_LEVELS_LARGEDIR: u8 = 3;
pub const MAX_LEVELS: u8 = 2;
// dx_root: "." (12 bytes) + ".." header (12) before dx_root_info (8),
// then count/limit; a dx_entry is hash + block; dx_tail is reserved + csum.
const _: () = assert!(ROOT_INFO_OFF == 12 + 12);
const _: () = assert!(DX_ENTRY_SIZE == 4 + 4 && DX_TAIL_SIZE == 4 + 4);
const _: () = assert!(NODE_COUNT_OFF == super::dir::ENTRY_HEADER);

/// dx_root_info.
#[derive(Clone, Copy, Debug)]
pub struct RootInfo {
    pub hash_version: u8,
    pub info_length: u8,
    pub indirect_levels: u8,
}

/// An index block's entries: `(hash, block)`, the first with hash 0.
#[derive(Clone, Debug)]
pub struct DxEntries {
    pub limit: u16,
    pub entries: Vec<(u32, u32)>,
}

/// Parse dx_root_info from block 0 of an indexed directory.
pub fn parse_root_info(b: &[u8], max_levels: u8, what: &dyn Fn() -> String) -> Result<RootInfo> {
    let info = RootInfo {
        hash_version: u8_at(b, ROOT_INFO_OFF + 4),
        info_length: u8_at(b, ROOT_INFO_OFF + 5),
        indirect_levels: u8_at(b, ROOT_INFO_OFF + 6),
    };
    if le32(b, ROOT_INFO_OFF) != 0 || info.info_length != 8 {
        return Err(corrupt(what(), "bad dx_root_info"));
    }
    if info.hash_version > HASH_TEA_UNSIGNED {
        return Err(corrupt(
            what(),
            format!("unknown dx hash version {}", info.hash_version),
        ));
    }
    if info.indirect_levels >= max_levels {
        return Err(corrupt(
            what(),
            format!("htree depth {}", info.indirect_levels),
        ));
    }
    Ok(info)
}

/// The count/limit header at `count_off` and its entries, with the dx_tail
/// checksum verified when `csum_seed` is given.
pub fn parse_entries(
    b: &[u8],
    count_off: usize,
    csum_seed: Option<u32>,
    what: &dyn Fn() -> String,
) -> Result<DxEntries> {
    let limit = le16(b, count_off);
    let count = le16(b, count_off + 2);
    let tail = if csum_seed.is_some() { DX_TAIL_SIZE } else { 0 };
    let room = b.len().saturating_sub(count_off + tail) / DX_ENTRY_SIZE;
    if count == 0 || count > limit || usize::from(limit) > room {
        return Err(corrupt(
            what(),
            format!("dx count {count} limit {limit} (room {room})"),
        ));
    }
    if let Some(seed) = csum_seed {
        let size = count_off + usize::from(count) * DX_ENTRY_SIZE;
        let toff = count_off + usize::from(limit) * DX_ENTRY_SIZE;
        let stored = le32(b, toff + 4);
        let mut c = crc32c(seed, &b[..size]);
        // dt_reserved, then dt_checksum counted as zero.
        c = crc32c(c, &b[toff..toff + 4]);
        c = crc32c(c, &[0; 4]);
        if c != stored {
            return Err(corrupt(
                what(),
                format!("htree node checksum {stored:#010x}, computed {c:#010x}"),
            ));
        }
    }
    let mut entries = Vec::with_capacity(usize::from(count));
    let mut prev = 0u32;
    for i in 0..usize::from(count) {
        let off = count_off + i * DX_ENTRY_SIZE;
        // Entry 0 is the count/limit header; its block field follows them.
        let (hash, block) = if i == 0 {
            (0, le32(b, off + 4))
        } else {
            (le32(b, off), le32(b, off + 4))
        };
        if i > 0 && hash < prev {
            return Err(corrupt(what(), "dx hashes out of order"));
        }
        prev = hash;
        entries.push((hash, block));
    }
    Ok(DxEntries { limit, entries })
}

/// Write a count/limit header and `entries` (hash, block; entry 0's hash
/// is not stored) at `count_off`, and with `csum_seed` the dx_tail.
pub fn encode_entries(
    b: &mut [u8],
    count_off: usize,
    limit: u16,
    entries: &[(u32, u32)],
    csum_seed: Option<u32>,
) {
    b[count_off..count_off + 2].copy_from_slice(&limit.to_le_bytes());
    b[count_off + 2..count_off + 4].copy_from_slice(&(entries.len() as u16).to_le_bytes());
    for (i, &(hash, block)) in entries.iter().enumerate() {
        let off = count_off + i * DX_ENTRY_SIZE;
        if i > 0 {
            b[off..off + 4].copy_from_slice(&hash.to_le_bytes());
        }
        b[off + 4..off + 8].copy_from_slice(&block.to_le_bytes());
    }
    if let Some(seed) = csum_seed {
        let size = count_off + entries.len() * DX_ENTRY_SIZE;
        let toff = count_off + usize::from(limit) * DX_ENTRY_SIZE;
        b[toff..toff + 8].fill(0);
        let mut c = crc32c(seed, &b[..size]);
        c = crc32c(c, &b[toff..toff + 4]);
        c = crc32c(c, &[0; 4]);
        b[toff + 4..toff + 8].copy_from_slice(&c.to_le_bytes());
    }
}

/// Entries that fit after `count_off` in a `bs`-byte index block.
pub fn limit_for(bs: usize, count_off: usize, csum: bool) -> u16 {
    ((bs - count_off - if csum { DX_TAIL_SIZE } else { 0 }) / DX_ENTRY_SIZE) as u16
}

/// The (major) hash of `name` as the kernel's `ext4fs_dirhash`, or `None`
/// for an unknown version. `seed` is `s_hash_seed` (all zero: the default).
pub fn dirhash(name: &[u8], version: u8, seed: &[u32; 4]) -> Option<u32> {
    dirhash2(name, version, seed).map(|(major, _)| major)
}

/// `dirhash` with the minor hash (0 for the legacy hash), as the kernel's
/// `ext4fs_dirhash` fills `hinfo->minor_hash`: readdir orders an indexed
/// directory by (major, minor).
pub fn dirhash2(name: &[u8], version: u8, seed: &[u32; 4]) -> Option<(u32, u32)> {
    let mut buf = if seed.iter().all(|&s| s == 0) {
        [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476]
    } else {
        *seed
    };
    let (hash, minor) = match version {
        HASH_LEGACY | HASH_LEGACY_UNSIGNED => {
            (dx_hack_hash(name, version == HASH_LEGACY_UNSIGNED), 0)
        }
        HASH_HALF_MD4 | HASH_HALF_MD4_UNSIGNED => {
            let unsigned = version == HASH_HALF_MD4_UNSIGNED;
            let mut p = name;
            loop {
                let mut input = [0u32; 8];
                str2hashbuf(p, &mut input, unsigned);
                half_md4_transform(&mut buf, &input);
                if p.len() <= 32 {
                    break;
                }
                p = &p[32..];
            }
            (buf[1], buf[2])
        }
        HASH_TEA | HASH_TEA_UNSIGNED => {
            let unsigned = version == HASH_TEA_UNSIGNED;
            let mut p = name;
            loop {
                let mut input = [0u32; 4];
                str2hashbuf(p, &mut input, unsigned);
                tea_transform(&mut buf, &input);
                if p.len() <= 16 {
                    break;
                }
                p = &p[16..];
            }
            (buf[0], buf[1])
        }
        _ => return None,
    };
    let mut hash = hash & !1;
    // EXT4_HTREE_EOF_32BIT << 1 is reserved.
    if hash == 0x7fff_ffff << 1 {
        hash = (0x7fff_ffff - 1) << 1;
    }
    Some((hash, minor))
}

fn char_val(c: u8, unsigned: bool) -> u32 {
    if unsigned {
        u32::from(c)
    } else {
        c as i8 as i32 as u32
    }
}

fn dx_hack_hash(name: &[u8], unsigned: bool) -> u32 {
    let (mut hash0, mut hash1) = (0x12a3_fe2du32, 0x37ab_e8f9u32);
    for &c in name {
        let mut hash = hash1.wrapping_add(hash0 ^ char_val(c, unsigned).wrapping_mul(7_152_373));
        if hash & 0x8000_0000 != 0 {
            hash = hash.wrapping_sub(0x7fff_ffff);
        }
        hash1 = hash0;
        hash0 = hash;
    }
    hash0 << 1
}

/// The kernel's `str2hashbuf`: pack up to `out.len() * 4` bytes of `msg`
/// into words, padded with a word made of the remaining length.
fn str2hashbuf(msg: &[u8], out: &mut [u32], unsigned: bool) {
    let num = out.len();
    let len = msg.len();
    let mut pad = (len as u32) | ((len as u32) << 8);
    pad |= pad << 16;
    let mut val = pad;
    let take = len.min(num * 4);
    let mut w = 0;
    for (i, &c) in msg[..take].iter().enumerate() {
        val = char_val(c, unsigned).wrapping_add(val << 8);
        if i % 4 == 3 {
            out[w] = val;
            w += 1;
            val = pad;
        }
    }
    if w < num {
        out[w] = val;
        w += 1;
    }
    while w < num {
        out[w] = pad;
        w += 1;
    }
}

fn half_md4_transform(buf: &mut [u32; 4], inp: &[u32; 8]) {
    let f = |x: u32, y: u32, z: u32| z ^ (x & (y ^ z));
    let g = |x: u32, y: u32, z: u32| (x & y).wrapping_add((x ^ y) & z);
    let h = |x: u32, y: u32, z: u32| x ^ y ^ z;
    const K1: u32 = 0;
    const K2: u32 = 0o13240474631;
    const K3: u32 = 0o15666365641;
    let [mut a, mut b, mut c, mut d] = *buf;
    macro_rules! round {
        ($f:ident, $a:ident, $b:ident, $c:ident, $d:ident, $x:expr, $s:expr) => {
            $a = $a.wrapping_add($f($b, $c, $d)).wrapping_add($x);
            $a = $a.rotate_left($s);
        };
    }
    round!(f, a, b, c, d, inp[0].wrapping_add(K1), 3);
    round!(f, d, a, b, c, inp[1].wrapping_add(K1), 7);
    round!(f, c, d, a, b, inp[2].wrapping_add(K1), 11);
    round!(f, b, c, d, a, inp[3].wrapping_add(K1), 19);
    round!(f, a, b, c, d, inp[4].wrapping_add(K1), 3);
    round!(f, d, a, b, c, inp[5].wrapping_add(K1), 7);
    round!(f, c, d, a, b, inp[6].wrapping_add(K1), 11);
    round!(f, b, c, d, a, inp[7].wrapping_add(K1), 19);

    round!(g, a, b, c, d, inp[1].wrapping_add(K2), 3);
    round!(g, d, a, b, c, inp[3].wrapping_add(K2), 5);
    round!(g, c, d, a, b, inp[5].wrapping_add(K2), 9);
    round!(g, b, c, d, a, inp[7].wrapping_add(K2), 13);
    round!(g, a, b, c, d, inp[0].wrapping_add(K2), 3);
    round!(g, d, a, b, c, inp[2].wrapping_add(K2), 5);
    round!(g, c, d, a, b, inp[4].wrapping_add(K2), 9);
    round!(g, b, c, d, a, inp[6].wrapping_add(K2), 13);

    round!(h, a, b, c, d, inp[3].wrapping_add(K3), 3);
    round!(h, d, a, b, c, inp[7].wrapping_add(K3), 9);
    round!(h, c, d, a, b, inp[2].wrapping_add(K3), 11);
    round!(h, b, c, d, a, inp[6].wrapping_add(K3), 15);
    round!(h, a, b, c, d, inp[1].wrapping_add(K3), 3);
    round!(h, d, a, b, c, inp[5].wrapping_add(K3), 9);
    round!(h, c, d, a, b, inp[0].wrapping_add(K3), 11);
    round!(h, b, c, d, a, inp[4].wrapping_add(K3), 15);

    buf[0] = buf[0].wrapping_add(a);
    buf[1] = buf[1].wrapping_add(b);
    buf[2] = buf[2].wrapping_add(c);
    buf[3] = buf[3].wrapping_add(d);
}

fn tea_transform(buf: &mut [u32; 4], inp: &[u32; 4]) {
    const DELTA: u32 = 0x9E37_79B9;
    let mut sum = 0u32;
    let (mut b0, mut b1) = (buf[0], buf[1]);
    let [a, b, c, d] = *inp;
    for _ in 0..16 {
        sum = sum.wrapping_add(DELTA);
        b0 = b0.wrapping_add(
            (b1 << 4).wrapping_add(a) ^ b1.wrapping_add(sum) ^ (b1 >> 5).wrapping_add(b),
        );
        b1 = b1.wrapping_add(
            (b0 << 4).wrapping_add(c) ^ b0.wrapping_add(sum) ^ (b0 >> 5).wrapping_add(d),
        );
    }
    buf[0] = buf[0].wrapping_add(b0);
    buf[1] = buf[1].wrapping_add(b1);
}

/// Where a full htree leaf splits. `ents` are the leaf's entries and the
/// one being added, as (hash, rec_len needed), sorted by hash with the new
/// one first among those of its hash; `cap` is the bytes a leaf holds. The
/// answer `(cut, hash)`: `ents[..cut]` stay, `ents[cut..]` move to the new
/// leaf, whose index entry gets `hash`: the first moved entry's, plus the
/// continuation bit when the cut falls inside a run of one hash (the
/// kernel's do_split). Lookups and inserts choose the last index entry at
/// or below a name's hash, so a name of the run's hash goes to the lower
/// leaf; placing the new entry first in its run keeps it on the side its
/// hash leads to. Both halves fit `cap`; among such cuts the one nearest
/// an even split by bytes wins, with a cut inside a run counted half a
/// block worse (a run across leaves costs later lookups a block each).
/// `None` only when no cut fits, which cannot happen for entries that
/// fitted one block plus one more entry of at most a quarter block.
pub fn split_point(ents: &[(u32, usize)], cap: usize) -> Option<(usize, u32)> {
    let total: usize = ents.iter().map(|e| e.1).sum();
    let mut lo = 0usize;
    let mut best: Option<(usize, usize, u32)> = None;
    for cut in 1..ents.len() {
        lo += ents[cut - 1].1;
        let hi = total - lo;
        if lo > cap || hi > cap {
            continue;
        }
        let continued = ents[cut].0 == ents[cut - 1].0;
        let score = lo.abs_diff(hi) + if continued { cap / 2 } else { 0 };
        if best.filter(|b| b.0 <= score).is_none() {
            best = Some((score, cut, ents[cut].0 | u32::from(continued)));
        }
    }
    best.map(|b| (b.1, b.2))
}

#[cfg(test)]
mod tests {
    use super::split_point;

    #[test]
    fn split_prefers_a_boundary_near_the_middle_by_bytes() {
        // Eight short entries below four long ones: a cut by count (at 6)
        // would move 2 short and all 4 long ones, more than a block.
        let mut e: Vec<(u32, usize)> = (0..8).map(|i| (i * 2, 12)).collect();
        e.extend([(100, 264), (102, 264), (104, 264), (106, 264)]);
        let (cut, h) = split_point(&e, 1012).unwrap();
        let lo: usize = e[..cut].iter().map(|x| x.1).sum();
        let hi: usize = e[cut..].iter().map(|x| x.1).sum();
        assert!(lo <= 1012 && hi <= 1012, "{lo} {hi}");
        assert_eq!((cut, h), (10, 104));
    }

    #[test]
    fn one_hash_splits_with_the_continuation_bit() {
        let e = [(40u32, 264usize); 4];
        assert_eq!(split_point(&e, 1012), Some((2, 41)));
        // A boundary wins over a more even cut inside a run unless it is
        // off by more than half a block.
        let e = [(38, 200), (40, 264), (40, 264), (42, 264)];
        assert_eq!(split_point(&e, 1012), Some((3, 42)));
        let e = [(38, 12), (40, 264), (40, 264), (40, 264)];
        assert_eq!(split_point(&e, 1012), Some((2, 41)));
    }

    #[test]
    fn no_cut_when_nothing_fits() {
        assert_eq!(split_point(&[(2, 600), (4, 600)], 500), None);
        assert_eq!(split_point(&[(2, 600)], 1012), None);
    }
}
