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
//!
//! CONTRACT of the parsers: an entry table that passes holds entries and
//! an end mark inside its region, names without NUL bytes, and values
//! (padded to 4) that lie between the end mark and the region's end and
//! overlap neither each other nor the table (`parse_entries`). The parsers
//! know no superblock: the value inodes an entry names are checked
//! against the image by [`check_value_inodes`], which every caller that
//! may follow one runs first (`Ext4::stored_xattrs`); where the xattr
//! block may lie is the caller's check too (`xattr_write.rs`).

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
/// `None` for an index Linux's ext4 has no handler for (such entries are
/// not shown, as Linux shows none): 0 (no prefix: an entry whose stored
/// name is "user.x" must not answer for `user.x`) and 8 (richacl, never
/// merged) among them.
pub fn prefix(i: u8) -> Option<&'static [u8]> {
    Some(match i {
        1 => b"user.",
        2 => b"system.posix_acl_access",
        3 => b"system.posix_acl_default",
        4 => b"trusted.",
        6 => b"security.",
        7 => b"system.",
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

/// One entry as stored, whatever its name index (the write side keeps
/// entries it cannot name, such as inline data's `system.data`, as they
/// are).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawEntry {
    pub index: u8,
    /// The name after the prefix (empty for the ACLs).
    pub name: Vec<u8>,
    /// The value held here (empty when `inum` is set).
    pub value: Vec<u8>,
    /// The `ea_inode` holding the value (0: none), and its size.
    pub inum: u32,
    pub inum_size: u32,
    /// The stored hash.
    pub hash: u32,
}

impl RawEntry {
    /// The entry as the reader shows it; `None` for an unknown index.
    fn named(&self) -> Option<Entry> {
        let mut name = prefix(self.index)?.to_vec();
        name.extend_from_slice(&self.name);
        let value = if self.inum != 0 {
            Value::Inode {
                ino: self.inum,
                size: self.inum_size,
            }
        } else {
            Value::Here(self.value.clone())
        };
        Some(Entry {
            index: self.index,
            name,
            value,
        })
    }
}

/// Parse an entry table: entries from `start` in `b`, values at
/// `value_base + e_value_offs`, all within `b`. `check_hash`: verify each
/// stored hash of a value held here (the block's entries; a stored 0 is
/// accepted, as e2fsck does for in-inode entries).
///
/// The checks (the kernel's `check_xattrs`, e2fsck's `check_ext_attr`),
/// all made before any value is copied:
/// - the table: every entry's fixed part and name inside the region, the
///   end mark (a zero word) too; a name holds no NUL byte (the kernel's
///   `strnlen` check); a value size at most `VALUE_MAX`;
/// - the values held here (size not 0, no value inode): each, padded to
///   4 bytes, between the end mark and the region's end, so never over
///   the entry table or past the region; and no two overlap (e2fsck's
///   region check), so the values copied out total at most the region.
///
/// Bounded: each entry takes at least 16 bytes of the region, so the
/// table has at most `b.len() / 16` entries.
fn parse_entries(
    b: &[u8],
    start: usize,
    value_base: usize,
    check_hash: bool,
    what: &dyn Fn() -> String,
) -> Result<Vec<RawEntry>> {
    /// An entry's fixed part, as read (its name is `b[pos + 16..name_end]`).
    struct Fixed {
        pos: usize,
        name_end: usize,
        index: u8,
        value_offs: usize,
        value_inum: u32,
        value_size: u32,
        hash: u32,
    }
    let mut table = Vec::new();
    let mut pos = start;
    // The table, up to and including its end mark.
    let table_end = loop {
        // The table ends with a zero word; running off the region without
        // one is corruption.
        if pos.checked_add(4).is_none_or(|e| e > b.len()) {
            return Err(corrupt(what(), "entry table runs off its region"));
        }
        if le32(b, pos) == 0 {
            break pos + 4;
        }
        if pos + ENTRY_LEN > b.len() {
            return Err(corrupt(
                what(),
                format!("entry at {pos} runs off its region"),
            ));
        }
        let name_len = usize::from(u8_at(b, pos));
        let name_end = pos + ENTRY_LEN + name_len;
        // A name may be empty: the ACLs' index is their whole name.
        if name_end > b.len() {
            return Err(corrupt(
                what(),
                format!("entry at {pos}: name length {name_len} runs off its region"),
            ));
        }
        if b[pos + ENTRY_LEN..name_end].contains(&0) {
            return Err(corrupt(
                what(),
                format!("entry at {pos}: a NUL byte in its name"),
            ));
        }
        let value_size = le32(b, pos + 8);
        if value_size > VALUE_MAX {
            return Err(corrupt(
                what(),
                format!("entry at {pos}: value size {value_size}"),
            ));
        }
        table.push(Fixed {
            pos,
            name_end,
            index: u8_at(b, pos + 1),
            value_offs: usize::from(le16(b, pos + 2)),
            value_inum: le32(b, pos + 4),
            value_size,
            hash: le32(b, pos + 12),
        });
        // Entries are padded to 4 bytes; each step moves at least 16.
        pos = (name_end + 3) & !3;
    };
    // The values held here: [start, end) of each, padded.
    let mut areas: Vec<(usize, usize, usize)> = Vec::new();
    for f in &table {
        if f.value_inum != 0 || f.value_size == 0 {
            continue;
        }
        // value_base + a u16 + at most VALUE_MAX + 3: no overflow.
        let at = value_base + f.value_offs;
        let end = at + ((f.value_size as usize + 3) & !3);
        if at < table_end || end > b.len() {
            return Err(corrupt(
                what(),
                format!(
                    "entry at {}: value {}+{} outside the value area {}..{}",
                    f.pos,
                    f.value_offs,
                    f.value_size,
                    table_end - value_base,
                    b.len() - value_base
                ),
            ));
        }
        areas.push((at, end, f.pos));
    }
    areas.sort_unstable();
    for w in areas.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(corrupt(
                what(),
                format!(
                    "the values of the entries at {} and {} overlap",
                    w[0].2, w[1].2
                ),
            ));
        }
    }
    let mut out = Vec::with_capacity(table.len());
    for f in table {
        let name = b[f.pos + ENTRY_LEN..f.name_end].to_vec();
        let mut value = Vec::new();
        if f.value_inum == 0 {
            if f.value_size != 0 {
                let at = value_base + f.value_offs;
                value = b[at..at + f.value_size as usize].to_vec();
            }
            if check_hash
                && f.hash != 0
                && f.hash != entry_hash(&name, &value, false)
                && f.hash != entry_hash(&name, &value, true)
            {
                return Err(corrupt(
                    what(),
                    format!("entry at {}: hash {:#010x}", f.pos, f.hash),
                ));
            }
        }
        out.push(RawEntry {
            index: f.index,
            name,
            value,
            inum: f.value_inum,
            inum_size: if f.value_inum != 0 { f.value_size } else { 0 },
            hash: f.hash,
        });
    }
    Ok(out)
}

/// What the image lets an entry's `e_value_inum` name (from the
/// superblock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueInodes {
    /// INCOMPAT_EA_INODE: without it no entry may name a value inode.
    pub enabled: bool,
    /// The first inode number not reserved (`s_first_ino`).
    pub first_ino: u32,
    /// `s_inodes_count`.
    pub inodes_count: u32,
}

/// The value inodes `entries` name, checked against what the image
/// allows, as the kernel's `check_xattrs` does before any is followed: an
/// entry naming a value inode on an image without `ea_inode`, or an inode
/// number no value inode can have (reserved, the root, past the last),
/// is corruption.
pub fn check_value_inodes(
    entries: &[RawEntry],
    allowed: ValueInodes,
    what: &dyn Fn() -> String,
) -> Result<()> {
    for e in entries.iter().filter(|e| e.inum != 0) {
        if !allowed.enabled {
            return Err(corrupt(
                what(),
                format!("a value in inode {} without the ea_inode feature", e.inum),
            ));
        }
        if e.inum < allowed.first_ino || e.inum > allowed.inodes_count {
            return Err(corrupt(
                what(),
                format!("value inode {} out of range", e.inum),
            ));
        }
    }
    Ok(())
}

/// The entries as the reader shows them (those of an unknown index left
/// out).
pub fn named_entries(v: &[RawEntry]) -> Vec<Entry> {
    v.iter().filter_map(RawEntry::named).collect()
}

fn named(v: Vec<RawEntry>) -> Vec<Entry> {
    named_entries(&v)
}

/// The attributes in an inode's body: `extra` is the inode from byte
/// `128 + i_extra_isize` to its end. No magic there: no attributes.
pub fn parse_ibody(extra: &[u8], ino: u32) -> Result<Vec<Entry>> {
    parse_ibody_raw(extra, ino).map(named)
}

/// [`parse_ibody`]'s entries as stored.
pub fn parse_ibody_raw(extra: &[u8], ino: u32) -> Result<Vec<RawEntry>> {
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
    parse_block_raw(b, blk, csum_seed).map(|(_, v)| named(v))
}

/// [`parse_block`]'s entries as stored, with the block's `h_refcount`.
pub fn parse_block_raw(b: &[u8], blk: u64, csum_seed: Option<u32>) -> Result<(u32, Vec<RawEntry>)> {
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
    Ok((
        le32(b, 4),
        parse_entries(b, BLOCK_HEADER_LEN, 0, true, &what)?,
    ))
}

/// `ext4_xattr_block_csum`: crc32c over the block number (le64) and the
/// block with `h_checksum` taken as zero.
pub fn block_csum(b: &[u8], blk: u64, seed: u32) -> u32 {
    let mut c = crc32c(seed, &blk.to_le_bytes());
    c = crc32c(c, &b[..0x10]);
    c = crc32c(c, &[0; 4]);
    crc32c(c, &b[0x14..])
}

// ---- The write side: names, sizes, encoders ----

/// The name index and the name after the prefix of an attribute the
/// writer stores (`user.`, `trusted.`, `security.`, the two ACLs); `None`
/// for any other name (`system.data` and the like are ext4's own).
pub fn writable_name(name: &[u8]) -> Option<(u8, &[u8])> {
    match name {
        b"system.posix_acl_access" => return Some((2, b"")),
        b"system.posix_acl_default" => return Some((3, b"")),
        _ => {}
    }
    for (index, p) in [(1u8, &b"user."[..]), (4, b"trusted."), (6, b"security.")] {
        if let Some(rest) = name.strip_prefix(p) {
            return Some((index, rest));
        }
    }
    None
}

/// `EXT4_XATTR_LEN`: an entry with a name of `name_len` bytes, padded to 4.
pub fn entry_len(name_len: usize) -> usize {
    (ENTRY_LEN + name_len + 3) & !3
}

/// `EXT4_XATTR_SIZE`: a value's room, padded to 4 (none for a value held
/// in an `ea_inode`).
fn value_room(e: &RawEntry) -> usize {
    if e.inum != 0 {
        0
    } else {
        (e.value.len() + 3) & !3
    }
}

/// Bytes `entries` take in a table: the entries, the 4-byte end mark and
/// the values.
pub fn table_len(entries: &[RawEntry]) -> usize {
    entries
        .iter()
        .map(|e| entry_len(e.name.len()) + value_room(e))
        .sum::<usize>()
        + 4
}

/// Bytes the values held here take in a table (each padded to 4).
pub fn values_len(entries: &[RawEntry]) -> usize {
    entries.iter().map(value_room).sum()
}

/// The block's order (the kernel's `ext4_xattr_find_entry` stops at the
/// first entry not below the name it seeks): name index, name length,
/// name bytes.
pub fn sort_block_entries(entries: &mut [RawEntry]) {
    entries.sort_by(|a, b| (a.index, a.name.len(), &a.name).cmp(&(b.index, b.name.len(), &b.name)));
}

/// Write the entry table of `entries` into `region` (zeroed by the
/// caller) from `start`: entries grow up, values down from the end. A
/// value's offset is from `value_base`; `hash`: store each entry's hash
/// (the block's), else 0 (the inode's, as the kernel writes them).
/// `None` when they do not fit or an offset would not fit in 16 bits.
fn put_entries(
    region: &mut [u8],
    start: usize,
    value_base: usize,
    entries: &[RawEntry],
    hash: bool,
) -> Option<()> {
    if start.checked_add(table_len(entries))? > region.len() {
        return None;
    }
    let mut pos = start;
    let mut vend = region.len();
    for e in entries {
        let name_len = u8::try_from(e.name.len()).ok()?;
        let (offs, size, h) = if e.inum != 0 {
            (0u16, e.inum_size, e.hash)
        } else {
            let room = value_room(e);
            let offs = if e.value.is_empty() {
                0
            } else {
                vend -= room;
                region[vend..vend + e.value.len()].copy_from_slice(&e.value);
                u16::try_from(vend - value_base).ok()?
            };
            let h = if hash {
                entry_hash(&e.name, &e.value, false)
            } else {
                0
            };
            (offs, u32::try_from(e.value.len()).ok()?, h)
        };
        region[pos] = name_len;
        region[pos + 1] = e.index;
        region[pos + 2..pos + 4].copy_from_slice(&offs.to_le_bytes());
        region[pos + 4..pos + 8].copy_from_slice(&e.inum.to_le_bytes());
        region[pos + 8..pos + 12].copy_from_slice(&size.to_le_bytes());
        region[pos + 12..pos + 16].copy_from_slice(&h.to_le_bytes());
        region[pos + ENTRY_LEN..pos + ENTRY_LEN + e.name.len()].copy_from_slice(&e.name);
        pos += entry_len(e.name.len());
    }
    // The end mark (zero) is already there; table_len counted it.
    debug_assert!(pos + 4 <= vend);
    Some(())
}

/// The in-inode area (`len` bytes after `128 + i_extra_isize`) holding
/// `entries`: the magic, the table, the values at the end; all zeros (no
/// magic) without entries, as the kernel clears it. `None`: no room.
pub fn encode_ibody(entries: &[RawEntry], len: usize) -> Option<Vec<u8>> {
    let mut r = vec![0u8; len];
    if entries.is_empty() {
        return Some(r);
    }
    if len < 4 {
        return None;
    }
    r[0..4].copy_from_slice(&XATTR_MAGIC.to_le_bytes());
    // Values are relative to the first entry.
    put_entries(&mut r, 4, 4, entries, false)?;
    Some(r)
}

/// An xattr block of `bs` bytes holding `entries` (in the block's order)
/// with `h_refcount` `refcount`: header, entry hashes, the header hash
/// (`ext4_xattr_rehash`); the checksum is [`set_block_csum`]'s. `None`:
/// no room.
pub fn encode_block(entries: &[RawEntry], refcount: u32, bs: usize) -> Option<Vec<u8>> {
    let mut b = vec![0u8; bs];
    put_entries(&mut b, BLOCK_HEADER_LEN, 0, entries, true)?;
    b[0..4].copy_from_slice(&XATTR_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&refcount.to_le_bytes());
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    let h = block_hash(&b);
    b[12..16].copy_from_slice(&h.to_le_bytes());
    Some(b)
}

/// `ext4_xattr_rehash`: the entries' hashes rolled 16 bits at a time; 0
/// if any entry's hash is 0.
fn block_hash(b: &[u8]) -> u32 {
    let mut h: u32 = 0;
    let mut pos = BLOCK_HEADER_LEN;
    while pos + ENTRY_LEN <= b.len() && le32(b, pos) != 0 {
        let eh = le32(b, pos + 12);
        if eh == 0 {
            return 0;
        }
        h = (h << 16) ^ (h >> 16) ^ eh;
        pos = entry_len(usize::from(u8_at(b, pos))) + pos;
    }
    h
}

/// Store the block's checksum (metadata_csum) for block number `blk`.
pub fn set_block_csum(b: &mut [u8], blk: u64, seed: u32) {
    let c = block_csum(b, blk, seed);
    b[0x10..0x14].copy_from_slice(&c.to_le_bytes());
}

/// Set a block's `h_refcount` (the checksum is then stale).
pub fn set_refcount(b: &mut [u8], refcount: u32) {
    b[4..8].copy_from_slice(&refcount.to_le_bytes());
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

/// The inverse of [`acl_to_xattr`] (`posix_acl_from_xattr` then
/// `ext4_acl_to_disk`): a `posix_acl_xattr` value (version 2) in ext4's
/// compact form. `Err(())` for a malformed value (EINVAL), `Ok(None)`
/// for an ACL without entries (which Linux takes as a removal).
#[allow(clippy::result_unit_err)]
pub fn acl_from_xattr(v: &[u8]) -> std::result::Result<Option<Vec<u8>>, ()> {
    if v.len() < 4 || le32(v, 0) != POSIX_ACL_XATTR_VERSION || !(v.len() - 4).is_multiple_of(8) {
        return Err(());
    }
    if v.len() == 4 {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(v.len());
    out.extend_from_slice(&EXT4_ACL_VERSION.to_le_bytes());
    for e in v[4..].chunks_exact(8) {
        let tag = le16(e, 0);
        out.extend_from_slice(&e[0..4]);
        match tag {
            0x01 | 0x04 | 0x10 | 0x20 => {}
            0x02 | 0x08 => out.extend_from_slice(&e[4..8]),
            _ => return Err(()),
        }
    }
    Ok(Some(out))
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
    fn entries_without_a_linux_handler_are_not_shown() {
        // Index 0 with the stored name "user.x", index 8 (richacl) and an
        // undefined 5, beside a plain user.k: only user.k is shown.
        let mut b = vec![0u8; 1024];
        b[0..4].copy_from_slice(&XATTR_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        let mut pos = 32;
        for (k, (name, index)) in [(&b"k"[..], 1u8), (b"user.x", 0), (b"r", 8), (b"u", 5)]
            .into_iter()
            .enumerate()
        {
            let offs = 1000 - 8 * k as u16;
            let e = entry(name, index, offs, 1, entry_hash(name, b"v", false));
            b[pos..pos + e.len()].copy_from_slice(&e);
            pos += e.len();
            b[usize::from(offs)] = b'v';
        }
        let e = parse_block(&b, 7, None).unwrap();
        let names: Vec<&[u8]> = e.iter().map(|e| &e.name[..]).collect();
        assert_eq!(names, [&b"user.k"[..]]);
    }

    /// A block of `entries` (name, offset, value bytes written there):
    /// the table from 32, each value at its offset, hashes right.
    fn block_of(entries: &[(&[u8], u16, &[u8])]) -> Vec<u8> {
        let mut b = vec![0u8; 1024];
        b[0..4].copy_from_slice(&XATTR_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        let mut pos = 32;
        for &(name, offs, v) in entries {
            let h = entry_hash(name, v, false);
            let e = entry(name, 1, offs, v.len() as u32, h);
            b[pos..pos + e.len()].copy_from_slice(&e);
            pos += e.len();
            let at = usize::from(offs);
            let n = v.len().min(1024usize.saturating_sub(at));
            b[at..at + n].copy_from_slice(&v[..n]);
        }
        b
    }

    #[test]
    fn values_stay_in_their_area_and_apart() {
        let ok = block_of(&[(b"a", 1000, b"one"), (b"b", 1004, b"two")]);
        assert_eq!(parse_block(&ok, 7, None).unwrap().len(), 2);
        // Two values sharing bytes.
        let overlap = block_of(&[(b"a", 1000, b"abcdef"), (b"b", 1004, b"two")]);
        assert!(parse_block(&overlap, 7, None).is_err());
        let same = block_of(&[(b"a", 1000, b"one"), (b"b", 1000, b"one")]);
        assert!(parse_block(&same, 7, None).is_err());
        // A value over the entry table (the second entry's bytes), or
        // over the end mark.
        let table = block_of(&[(b"a", 52, b"xy")]);
        assert!(parse_block(&table, 7, None).is_err());
        let mark = block_of(&[(b"a", 52, b"")]);
        assert!(
            parse_block(&mark, 7, None).is_ok(),
            "an empty value has no area"
        );
        let mark = block_of(&[(b"a", 54, b"v")]);
        assert!(parse_block(&mark, 7, None).is_err());
        // Right after the end mark is fine.
        let after = block_of(&[(b"a", 56, b"v")]);
        assert!(parse_block(&after, 7, None).is_ok());
        // Past the end once padded (1022 + 2 fits, padded to 4 it does not).
        let pad = block_of(&[(b"a", 1022, b"xy")]);
        assert!(parse_block(&pad, 7, None).is_err());
        let pad = block_of(&[(b"a", 1020, b"xyzw")]);
        assert!(parse_block(&pad, 7, None).is_ok());
        // A size larger than the block.
        let mut big = block_of(&[(b"a", 1000, b"v")]);
        big[40..44].copy_from_slice(&4096u32.to_le_bytes());
        assert!(parse_block(&big, 7, None).is_err());
        // A NUL in a name; a name running off the block.
        let nul = block_of(&[(b"a\0b", 1000, b"v")]);
        assert!(parse_block(&nul, 7, None).is_err());
        let mut long = block_of(&[(b"a", 1000, b"v")]);
        long[1000..].fill(b'n');
        long[32] = 255;
        long[48..1000].fill(b'n');
        assert!(parse_block(&long, 7, None).is_err());
        // The same in the inode body: values relative to the first entry.
        let mut x = vec![0u8; 64];
        x[0..4].copy_from_slice(&XATTR_MAGIC.to_le_bytes());
        let e = entry(b"s", 6, 20, 4, 0);
        x[4..24].copy_from_slice(&e);
        let e = entry(b"t", 6, 20, 4, 0);
        x[24..44].copy_from_slice(&e);
        // 20 from the first entry is byte 24: the second entry.
        assert!(parse_ibody(&x, 12).is_err());
        // The end mark is bytes 44..48, offsets 40..44.
        x[6..8].copy_from_slice(&40u16.to_le_bytes());
        x[26..28].copy_from_slice(&48u16.to_le_bytes());
        assert!(parse_ibody(&x, 12).is_err(), "a value over the end mark");
        x[6..8].copy_from_slice(&44u16.to_le_bytes());
        assert!(parse_ibody(&x, 12).is_ok());
        x[26..28].copy_from_slice(&46u16.to_le_bytes());
        assert!(parse_ibody(&x, 12).is_err(), "overlapping values");
        x[26..28].copy_from_slice(&58u16.to_le_bytes());
        assert!(parse_ibody(&x, 12).is_err(), "past the area");
    }

    #[test]
    fn value_inodes_need_the_feature_and_a_valid_number() {
        let w = || "t".to_string();
        let mut e = raw(1, b"v", b"");
        e.inum = 20;
        e.inum_size = 3000;
        let mut on = ValueInodes {
            enabled: true,
            first_ino: 11,
            inodes_count: 100,
        };
        assert!(check_value_inodes(std::slice::from_ref(&e), on, &w).is_ok());
        on.enabled = false;
        assert!(check_value_inodes(std::slice::from_ref(&e), on, &w).is_err());
        on.enabled = true;
        for bad in [2, 7, 10, 101, u32::MAX] {
            e.inum = bad;
            assert!(check_value_inodes(std::slice::from_ref(&e), on, &w).is_err());
        }
        // Plain values need nothing.
        on.enabled = false;
        assert!(check_value_inodes(&[raw(1, b"v", b"x")], on, &w).is_ok());
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

    fn raw(index: u8, name: &[u8], value: &[u8]) -> RawEntry {
        RawEntry {
            index,
            name: name.to_vec(),
            value: value.to_vec(),
            inum: 0,
            inum_size: 0,
            hash: 0,
        }
    }

    #[test]
    fn block_round_trips_sorted_with_hashes() {
        let mut v = vec![
            raw(6, b"selinux", b"ctx"),
            raw(1, b"zz", b""),
            raw(1, b"b", &[7; 300]),
            raw(1, b"a", b"xyz"),
            raw(2, b"", &[1, 0, 0, 0, 1, 0, 6, 0]),
        ];
        sort_block_entries(&mut v);
        let order: Vec<(u8, &[u8])> = v.iter().map(|e| (e.index, &e.name[..])).collect();
        assert_eq!(
            order,
            [
                (1, &b"a"[..]),
                (1, b"b"),
                (1, b"zz"),
                (2, b""),
                (6, b"selinux")
            ]
        );
        let mut b = encode_block(&v, 1, 1024).unwrap();
        set_block_csum(&mut b, 77, 5);
        let (rc, back) = parse_block_raw(&b, 77, Some(5)).unwrap();
        assert_eq!(rc, 1);
        for (x, y) in back.iter().zip(&v) {
            assert_eq!((x.index, &x.name, &x.value), (y.index, &y.name, &y.value));
            assert_eq!(x.hash, entry_hash(&x.name, &x.value, false));
        }
        // The header hash rolls the entries' hashes.
        let mut h = 0u32;
        for e in &back {
            h = (h << 16) ^ (h >> 16) ^ e.hash;
        }
        assert_eq!(le32(&b, 12), h);
        // Too much for the block: no encoding.
        assert!(encode_block(&[raw(1, b"x", &[0; 1000])], 1, 1024).is_none());
        assert!(encode_block(&[raw(1, b"x", &[0; 968])], 1, 1024).is_some());
    }

    #[test]
    fn ibody_round_trips() {
        let v = vec![raw(1, b"s", b"hi"), raw(4, b"t", b""), raw(6, b"l", b"x")];
        let area = encode_ibody(&v, 96).unwrap();
        let back = parse_ibody_raw(&area, 12).unwrap();
        assert_eq!(back.len(), 3);
        for (x, y) in back.iter().zip(&v) {
            assert_eq!((x.index, &x.name, &x.value), (y.index, &y.name, &y.value));
            assert_eq!(x.hash, 0);
        }
        assert_eq!(encode_ibody(&[], 96).unwrap(), vec![0; 96]);
        assert!(encode_ibody(&[raw(1, b"s", &[1; 80])], 96).is_none());
        // 4 magic + 20 entry + 4 end + 68 value = 96.
        assert!(encode_ibody(&[raw(1, b"s", &[1; 68])], 96).is_some());
    }

    #[test]
    fn acl_from_xattr_inverts_acl_to_xattr() {
        let w = || "acl".to_string();
        let mut x = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in [
            (1u16, 6u16, u32::MAX),
            (2, 4, 1000),
            (4, 4, u32::MAX),
            (8, 5, 50),
            (0x10, 7, u32::MAX),
            (0x20, 0, u32::MAX),
        ] {
            x.extend_from_slice(&tag.to_le_bytes());
            x.extend_from_slice(&perm.to_le_bytes());
            x.extend_from_slice(&id.to_le_bytes());
        }
        let d = acl_from_xattr(&x).unwrap().unwrap();
        assert_eq!(d.len(), 4 + 4 * 4 + 2 * 8);
        assert_eq!(acl_to_xattr(&d, &w).unwrap(), x);
        assert_eq!(acl_from_xattr(&2u32.to_le_bytes()), Ok(None));
        assert!(acl_from_xattr(&x[..x.len() - 1]).is_err());
        assert!(acl_from_xattr(&1u32.to_le_bytes()).is_err());
        for cut in 0..x.len() {
            let _ = acl_from_xattr(&x[..cut]);
        }
    }

    #[test]
    fn writable_names() {
        assert_eq!(writable_name(b"user.a"), Some((1, &b"a"[..])));
        assert_eq!(writable_name(b"trusted.x"), Some((4, &b"x"[..])));
        assert_eq!(
            writable_name(b"security.selinux"),
            Some((6, &b"selinux"[..]))
        );
        assert_eq!(
            writable_name(b"system.posix_acl_access"),
            Some((2, &b""[..]))
        );
        assert_eq!(
            writable_name(b"system.posix_acl_default"),
            Some((3, &b""[..]))
        );
        assert_eq!(writable_name(b"system.data"), None);
        assert_eq!(writable_name(b"other.x"), None);
    }
}
