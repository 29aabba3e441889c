//! Extended attributes on disk: in the inode (after `i_extra_isize`, behind
//! the magic 0xEA020000) and in an xattr block (`i_file_acl`: a 32-byte
//! header with magic, refcount, block count and, with metadata_csum, a
//! crc32c; then the entry table growing down and the values growing up
//! from the end). An entry: name length, name index (the prefix), value
//! offset, value inode (`ea_inode`), value size, hash, then the name padded
//! to 4 bytes; the table ends with 4 zero bytes. POSIX ACLs are stored in
//! ext4's own compact format (version 1), which [`acl_to_xattr`] turns into
//! the `posix_acl_xattr` form the VFS returns. Every offset and length is
//! checked against its region: a corrupt image is an error, never a panic.

use super::checksum::crc32c;
use super::{le16, le32, u8_at};
use crate::error::{corrupt, Result};

/// The magic of both the in-inode header and the block header.
pub const XATTR_MAGIC: u32 = 0xEA02_0000;
/// The block header's size; the first entry follows it.
pub const BLOCK_HEADER_LEN: usize = 32;
/// An entry's fixed part; the name follows.
pub const ENTRY_LEN: usize = 16;
/// Largest value Linux accepts (XATTR_SIZE_MAX).
pub const VALUE_MAX: u32 = 65536;

/// The prefix of name index `i` (e2fsprogs' and the kernel's table);
/// `None` for an index nobody defines (such entries are not shown, as
/// Linux shows none without a handler).
pub fn prefix(i: u8) -> Option<&'static [u8]> {
    Some(match i {
        0 => b"",
        1 => b"user.",
        2 => b"system.posix_acl_access",
        3 => b"system.posix_acl_default",
        4 => b"trusted.",
        6 => b"security.",
        7 => b"system.",
        8 => b"system.richacl",
        _ => return None,
    })
}

/// Where an entry's value is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// In the inode or block itself.
    Here(Vec<u8>),
    /// In the data of an `ea_inode` (`size` bytes).
    Inode { ino: u32, size: u32 },
}

/// One attribute: its full name (prefix included) and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub index: u8,
    pub name: Vec<u8>,
    pub value: Value,
}

/// The kernel's `ext4_xattr_hash_entry` (`signed`: the variant that read
/// name bytes as signed chars, which old kernels wrote and new ones
/// accept).
pub fn entry_hash(name: &[u8], value: &[u8], signed: bool) -> u32 {
    let mut h: u32 = 0;
    for &c in name {
        let c = if signed {
            i32::from(c as i8) as u32
        } else {
            u32::from(c)
        };
        h = (h << 5) ^ (h >> 27) ^ c;
    }
    for w in value.chunks(4) {
        let mut b = [0u8; 4];
        b[..w.len()].copy_from_slice(w);
        h = (h << 16) ^ (h >> 16) ^ u32::from_le_bytes(b);
    }
    h
}

/// Parse an entry table: entries from `start` in `b`, values at
/// `value_base + e_value_offs`, all within `b`. `check_hash`: verify each
/// stored hash of a value held here (the block's entries; a stored 0 is
/// accepted, as e2fsck does for in-inode entries).
fn parse_entries(
    b: &[u8],
    start: usize,
    value_base: usize,
    check_hash: bool,
    what: &dyn Fn() -> String,
) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut pos = start;
    loop {
        // The table ends with a zero word; running off the region without
        // one is corruption.
        if pos + 4 > b.len() {
            return Err(corrupt(what(), "entry table runs off its region"));
        }
        if le32(b, pos) == 0 {
            return Ok(out);
        }
        if pos + ENTRY_LEN > b.len() {
            return Err(corrupt(
                what(),
                format!("entry at {pos} runs off its region"),
            ));
        }
        let name_len = usize::from(u8_at(b, pos));
        let index = u8_at(b, pos + 1);
        let value_offs = usize::from(le16(b, pos + 2));
        let value_inum = le32(b, pos + 4);
        let value_size = le32(b, pos + 8);
        let hash = le32(b, pos + 12);
        let name_end = pos + ENTRY_LEN + name_len;
        // A name may be empty: the ACLs' index is their whole name.
        if name_end > b.len() {
            return Err(corrupt(
                what(),
                format!("entry at {pos}: name length {name_len}"),
            ));
        }
        if value_size > VALUE_MAX {
            return Err(corrupt(
                what(),
                format!("entry at {pos}: value size {value_size}"),
            ));
        }
        let value = if value_inum != 0 {
            Value::Inode {
                ino: value_inum,
                size: value_size,
            }
        } else {
            let at = value_base + value_offs;
            let end = at + value_size as usize;
            if value_size != 0 && (at < start || end > b.len()) {
                return Err(corrupt(
                    what(),
                    format!("entry at {pos}: value {value_offs}+{value_size} outside its region"),
                ));
            }
            let v = if value_size == 0 {
                Vec::new()
            } else {
                b[at..end].to_vec()
            };
            if check_hash && hash != 0 {
                let name = &b[pos + ENTRY_LEN..name_end];
                if hash != entry_hash(name, &v, false) && hash != entry_hash(name, &v, true) {
                    return Err(corrupt(
                        what(),
                        format!("entry at {pos}: hash {hash:#010x}"),
                    ));
                }
            }
            Value::Here(v)
        };
        if let Some(p) = prefix(index) {
            let mut name = p.to_vec();
            name.extend_from_slice(&b[pos + ENTRY_LEN..name_end]);
            out.push(Entry { index, name, value });
        }
        // Entries are padded to 4 bytes; each step moves at least 16.
        pos = (name_end + 3) & !3;
    }
}

/// The attributes in an inode's body: `extra` is the inode from byte
/// `128 + i_extra_isize` to its end. No magic there: no attributes.
pub fn parse_ibody(extra: &[u8], ino: u32) -> Result<Vec<Entry>> {
    if extra.len() < 4 || le32(extra, 0) != XATTR_MAGIC {
        return Ok(Vec::new());
    }
    let what = || format!("inode {ino} in-inode xattrs");
    // Values are relative to the first entry, which follows the magic.
    parse_entries(extra, 4, 4, false, &what)
}

/// The attributes of xattr block `blk` (its whole content `b`), checking
/// the header, and with `csum_seed` (metadata_csum: the superblock's seed)
/// the block's checksum.
pub fn parse_block(b: &[u8], blk: u64, csum_seed: Option<u32>) -> Result<Vec<Entry>> {
    let what = || format!("xattr block {blk}");
    if b.len() < BLOCK_HEADER_LEN + 4 {
        return Err(corrupt(what(), "short block"));
    }
    if le32(b, 0) != XATTR_MAGIC {
        return Err(corrupt(what(), format!("magic {:#010x}", le32(b, 0))));
    }
    if le32(b, 8) != 1 {
        return Err(corrupt(what(), format!("h_blocks {}", le32(b, 8))));
    }
    if le32(b, 4) == 0 {
        return Err(corrupt(what(), "reference count 0"));
    }
    if let Some(seed) = csum_seed {
        let stored = le32(b, 0x10);
        let c = block_csum(b, blk, seed);
        if c != stored {
            return Err(corrupt(
                what(),
                format!("checksum {stored:#010x}, computed {c:#010x}"),
            ));
        }
    }
    parse_entries(b, BLOCK_HEADER_LEN, 0, true, &what)
}

/// `ext4_xattr_block_csum`: crc32c over the block number (le64) and the
/// block with `h_checksum` taken as zero.
pub fn block_csum(b: &[u8], blk: u64, seed: u32) -> u32 {
    let mut c = crc32c(seed, &blk.to_le_bytes());
    c = crc32c(c, &b[..0x10]);
    c = crc32c(c, &[0; 4]);
    crc32c(c, &b[0x14..])
}

const EXT4_ACL_VERSION: u32 = 1;
const POSIX_ACL_XATTR_VERSION: u32 = 2;

/// ext4's on-disk ACL (version 1: 4-byte entries for the *_OBJ, MASK and
/// OTHER tags, 8-byte ones with an id for named users and groups) as a
/// `posix_acl_xattr` value (version 2, 8 bytes per entry, id
/// 0xFFFFFFFF where there is none), as `ext4_acl_from_disk` then
/// `posix_acl_to_xattr` give it.
pub fn acl_to_xattr(v: &[u8], what: &dyn Fn() -> String) -> Result<Vec<u8>> {
    if v.len() < 4 || le32(v, 0) != EXT4_ACL_VERSION {
        return Err(corrupt(what(), "ACL header"));
    }
    // At most VALUE_MAX / 4 entries, each 8 bytes out.
    let mut out = Vec::with_capacity(4 + (v.len() - 4) * 2);
    out.extend_from_slice(&POSIX_ACL_XATTR_VERSION.to_le_bytes());
    let mut pos = 4;
    while pos < v.len() {
        if pos + 4 > v.len() {
            return Err(corrupt(what(), "ACL entry runs off the value"));
        }
        let tag = le16(v, pos);
        let perm = le16(v, pos + 2);
        let (id, len) = match tag {
            0x01 | 0x04 | 0x10 | 0x20 => (u32::MAX, 4),
            0x02 | 0x08 => {
                if pos + 8 > v.len() {
                    return Err(corrupt(what(), "ACL entry runs off the value"));
                }
                (le32(v, pos + 4), 8)
            }
            _ => return Err(corrupt(what(), format!("ACL tag {tag:#x}"))),
        };
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
        pos += len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &[u8], index: u8, offs: u16, size: u32, hash: u32) -> Vec<u8> {
        let mut e = vec![name.len() as u8, index];
        e.extend_from_slice(&offs.to_le_bytes());
        e.extend_from_slice(&0u32.to_le_bytes());
        e.extend_from_slice(&size.to_le_bytes());
        e.extend_from_slice(&hash.to_le_bytes());
        e.extend_from_slice(name);
        while e.len() % 4 != 0 {
            e.push(0);
        }
        e
    }

    fn block(hash: Option<u32>) -> Vec<u8> {
        let mut b = vec![0u8; 1024];
        b[0..4].copy_from_slice(&XATTR_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        let h = hash.unwrap_or_else(|| entry_hash(b"k", b"value", false));
        let e = entry(b"k", 1, 1000, 5, h);
        b[32..32 + e.len()].copy_from_slice(&e);
        b[1000..1005].copy_from_slice(b"value");
        b
    }

    #[test]
    fn block_parses_and_checks() {
        let b = block(None);
        let e = parse_block(&b, 7, None).unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].name, b"user.k");
        assert_eq!(e[0].value, Value::Here(b"value".to_vec()));
        // A wrong hash, magic, refcount or checksum is corruption.
        assert!(parse_block(&block(Some(12345)), 7, None).is_err());
        let mut m = block(None);
        m[3] = 0;
        assert!(parse_block(&m, 7, None).is_err());
        let mut r = block(None);
        r[4..8].copy_from_slice(&0u32.to_le_bytes());
        assert!(parse_block(&r, 7, None).is_err());
        let mut c = block(None);
        let sum = block_csum(&c, 7, 99);
        c[0x10..0x14].copy_from_slice(&sum.to_le_bytes());
        assert!(parse_block(&c, 7, Some(99)).is_ok());
        assert!(
            parse_block(&c, 8, Some(99)).is_err(),
            "the block number is in the sum"
        );
    }

    #[test]
    fn ibody_parses() {
        let mut x = vec![0u8; 100];
        x[0..4].copy_from_slice(&XATTR_MAGIC.to_le_bytes());
        let e = entry(b"s", 6, 60, 3, 0);
        x[4..4 + e.len()].copy_from_slice(&e);
        x[64..67].copy_from_slice(b"abc");
        let v = parse_ibody(&x, 12).unwrap();
        assert_eq!(v[0].name, b"security.s");
        assert_eq!(v[0].value, Value::Here(b"abc".to_vec()));
        // No magic: no attributes.
        assert!(parse_ibody(&[0u8; 100], 12).unwrap().is_empty());
    }

    #[test]
    fn corrupt_regions_never_panic() {
        // Every truncation and every single-byte change of a valid block
        // and inode body: an error or a result, never a panic.
        let b = block(None);
        for cut in 0..b.len() {
            let _ = parse_block(&b[..cut], 1, None);
        }
        for at in 0..64 {
            for v in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut m = b.clone();
                m[at] = v;
                let _ = parse_block(&m, 1, None);
                let _ = parse_ibody(&m[28..], 1);
            }
        }
        let w = || "acl".to_string();
        for cut in 0..12 {
            let _ = acl_to_xattr(&[1, 0, 0, 0, 2, 0, 7, 0, 5, 0, 0, 0][..cut], &w);
        }
    }

    #[test]
    fn acl_converts() {
        let w = || "acl".to_string();
        // USER_OBJ rw-, USER 1000 r--, GROUP_OBJ r--, MASK r--, OTHER ---.
        let mut d = 1u32.to_le_bytes().to_vec();
        d.extend_from_slice(&[1, 0, 6, 0]);
        d.extend_from_slice(&[2, 0, 4, 0, 0xe8, 3, 0, 0]);
        d.extend_from_slice(&[4, 0, 4, 0]);
        d.extend_from_slice(&[0x10, 0, 4, 0]);
        d.extend_from_slice(&[0x20, 0, 0, 0]);
        let x = acl_to_xattr(&d, &w).unwrap();
        assert_eq!(x.len(), 4 + 5 * 8);
        assert_eq!(&x[12..20], &[2, 0, 4, 0, 0xe8, 3, 0, 0]);
        assert_eq!(&x[4..12], &[1, 0, 6, 0, 0xff, 0xff, 0xff, 0xff]);
    }
}
