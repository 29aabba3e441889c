//! Linear directory blocks: a chain of `ext4_dir_entry_2` records, and with
//! metadata_csum a 12-byte tail holding the block's checksum.

use super::checksum::crc32c;
use super::{le16, le32, u8_at};
use crate::error::{corrupt, Result};

/// Size of the fixed part of an entry (inode, rec_len, name_len, file_type).
pub const ENTRY_HEADER: usize = 8;
pub const TAIL_SIZE: usize = 12;
pub const TAIL_FT: u8 = 0xDE;
// ext4_dir_entry_tail: inode, rec_len, name_len, file_type, checksum.
const _: () = assert!(TAIL_SIZE == 4 + 2 + 1 + 1 + 4);
const _: () = assert!(ENTRY_HEADER == 4 + 2 + 1 + 1);

// ext4 file type codes in directory entries.
pub const FT_UNKNOWN: u8 = 0;
pub const FT_REG: u8 = 1;
pub const FT_DIR: u8 = 2;
pub const FT_CHR: u8 = 3;
pub const FT_BLK: u8 = 4;
pub const FT_FIFO: u8 = 5;
pub const FT_SOCK: u8 = 6;
pub const FT_SYMLINK: u8 = 7;

/// One directory entry, borrowed from its block.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    /// Byte offset in the block.
    pub offset: usize,
    pub inode: u32,
    pub rec_len: usize,
    pub file_type: u8,
    pub name: &'a [u8],
}

/// `rec_len` as stored, decoded as the kernel's `ext4_rec_len_from_disk`
/// (block sizes of 64 KiB need the two low bits).
pub fn rec_len_from_disk(raw: u16, block_size: usize) -> usize {
    let len = usize::from(raw);
    if block_size < 65536 {
        len
    } else if raw == 65535 || raw == 0 {
        block_size
    } else {
        (len & 65532) | ((len & 3) << 16)
    }
}

/// Whether the block ends in a checksum tail (a fake entry of inode 0,
/// rec_len 12, name_len 0, type 0xDE).
pub fn has_tail(b: &[u8]) -> bool {
    let Some(t) = b.len().checked_sub(TAIL_SIZE).and_then(|o| b.get(o..)) else {
        return false;
    };
    le32(t, 0) == 0 && le16(t, 4) == TAIL_SIZE as u16 && u8_at(t, 6) == 0 && u8_at(t, 7) == TAIL_FT
}

/// Verify a leaf block's tail checksum (metadata_csum). A block without a
/// tail is corrupt on such a filesystem.
pub fn verify_tail(b: &[u8], csum_seed: u32, what: &dyn Fn() -> String) -> Result<()> {
    if !has_tail(b) {
        return Err(corrupt(what(), "directory block has no checksum tail"));
    }
    let off = b.len() - TAIL_SIZE;
    let stored = le32(b, off + 8);
    let c = crc32c(csum_seed, &b[..off]);
    if c != stored {
        return Err(corrupt(
            what(),
            format!("directory block checksum {stored:#010x}, computed {c:#010x}"),
        ));
    }
    Ok(())
}

/// The entries of a linear directory block `b` (the tail excluded when
/// `tail`), each checked: rec_len at least the header plus the name, 4-byte
/// aligned, inside the block. Entries with inode 0 (free space) are kept;
/// callers skip them.
pub fn entries<'a>(
    b: &'a [u8],
    tail: bool,
    filetype: bool,
    what: &dyn Fn() -> String,
) -> Result<Vec<Entry<'a>>> {
    let mut v = Vec::new();
    scan(b, tail, filetype, what, |e| {
        v.push(e);
        false
    })?;
    Ok(v)
}

/// Visit the entries `entries` lists, in order, each checked as it is reached,
/// until `f` returns true (then `Ok(true)`): a search that finds its name
/// neither decodes the rest of the block nor collects it.
pub fn scan<'a>(
    b: &'a [u8],
    tail: bool,
    filetype: bool,
    what: &dyn Fn() -> String,
    mut f: impl FnMut(Entry<'a>) -> bool,
) -> Result<bool> {
    let end = if tail {
        b.len().saturating_sub(TAIL_SIZE)
    } else {
        b.len()
    };
    let mut off = 0;
    while off < end {
        if off + ENTRY_HEADER > end {
            return Err(corrupt(
                what(),
                format!("entry at {off} crosses the block end"),
            ));
        }
        let inode = le32(b, off);
        let rec_len = rec_len_from_disk(le16(b, off + 4), b.len());
        let name_len = usize::from(u8_at(b, off + 6));
        let file_type = if filetype {
            u8_at(b, off + 7)
        } else {
            FT_UNKNOWN
        };
        if rec_len < ENTRY_HEADER
            || rec_len & 3 != 0
            || off + rec_len > end
            || ENTRY_HEADER + name_len > rec_len
        {
            return Err(corrupt(
                what(),
                format!("entry at {off}: rec_len {rec_len} name_len {name_len}"),
            ));
        }
        let e = Entry {
            offset: off,
            inode,
            rec_len,
            file_type,
            name: &b[off + ENTRY_HEADER..off + ENTRY_HEADER + name_len],
        };
        if f(e) {
            return Ok(true);
        }
        off += rec_len;
    }
    Ok(false)
}

/// The rec_len an entry with a `name_len`-byte name needs.
pub fn rec_len_needed(name_len: usize) -> usize {
    (ENTRY_HEADER + name_len + 3) & !3
}

fn put_entry(b: &mut [u8], off: usize, ino: u32, rec_len: usize, name: &[u8], ft: u8) {
    b[off..off + 4].copy_from_slice(&ino.to_le_bytes());
    b[off + 4..off + 6].copy_from_slice(&(rec_len as u16).to_le_bytes());
    b[off + 6] = name.len() as u8;
    b[off + 7] = ft;
    b[off + 8..off + 8 + name.len()].copy_from_slice(name);
}

/// Whether entry `e` (checked by [`scan`]) has room for a new entry of
/// `need` bytes ([`rec_len_needed`]): a free entry that long, or a live one
/// with that much slack after its name. [`insert`] takes the first such.
pub fn has_room(e: &Entry, need: usize) -> bool {
    let used = if e.inode != 0 {
        rec_len_needed(e.name.len())
    } else {
        0
    };
    e.rec_len >= used + need
}

/// Insert an entry into a leaf block whose entries (before `end`: the tail
/// excluded) were checked by [`scan`] up to the first with room
/// ([`has_room`]): into a free entry or the slack after a live one, as the
/// kernel's `ext4_insert_dentry`. False when no entry has room (a rec_len
/// that leaves the block ends the walk). Blocks are below 64 KiB (rec_len
/// stored as is).
pub fn insert(b: &mut [u8], end: usize, ino: u32, name: &[u8], ft: u8) -> bool {
    let need = rec_len_needed(name.len());
    let mut off = 0;
    while off + ENTRY_HEADER <= end {
        let rl = usize::from(le16(b, off + 4));
        if rl < ENTRY_HEADER || off + rl > end {
            return false;
        }
        let live = le32(b, off) != 0;
        let used = if live {
            rec_len_needed(usize::from(b[off + 6]))
        } else {
            0
        };
        if rl >= used + need {
            if live {
                b[off + 4..off + 6].copy_from_slice(&(used as u16).to_le_bytes());
            }
            put_entry(b, off + used, ino, rl - used, name, ft);
            return true;
        }
        off += rl;
    }
    false
}

/// Find the live entry named `name` in a leaf block (entries before
/// `end`, checked by [`entries`] when it was read) and remove it as
/// [`remove`] does, in one pass over the block as it is now: the entry
/// before it is found afresh, so an insert made into the block since it
/// was searched (which may have put a new entry between the two) is
/// respected. False when the block has no such entry or a malformed
/// rec_len stops the walk.
pub fn remove_named(b: &mut [u8], end: usize, name: &[u8]) -> bool {
    match find_named(b, end, name) {
        Some((off, prev)) => {
            remove(b, off, prev);
            true
        }
        None => false,
    }
}

/// The offset of the live entry named `name` among the entries before
/// `end`, and of the entry before it: `None` when there is none or a
/// malformed rec_len stops the walk.
pub fn find_named(b: &[u8], end: usize, name: &[u8]) -> Option<(usize, Option<usize>)> {
    let mut off = 0;
    let mut prev = None;
    while off + ENTRY_HEADER <= end {
        let rl = usize::from(le16(b, off + 4));
        if rl < ENTRY_HEADER || off + rl > end {
            return None;
        }
        let nl = usize::from(b[off + 6]);
        if le32(b, off) != 0
            && off + ENTRY_HEADER + nl <= end
            && &b[off + ENTRY_HEADER..off + ENTRY_HEADER + nl] == name
        {
            return Some((off, prev));
        }
        prev = Some(off);
        off += rl;
    }
    None
}

/// Point the entry at `off` at inode `ino` with file type `ft`.
pub fn retarget(b: &mut [u8], off: usize, ino: u32, ft: u8) {
    b[off..off + 4].copy_from_slice(&ino.to_le_bytes());
    b[off + 7] = ft;
}

/// Remove the live entry at `off` (found by [`scan`]): merged into the
/// previous entry's rec_len, or (first in the block) marked free.
pub fn remove(b: &mut [u8], off: usize, prev: Option<usize>) {
    match prev {
        Some(p) => {
            let merged = le16(b, p + 4) + le16(b, off + 4);
            b[p + 4..p + 6].copy_from_slice(&merged.to_le_bytes());
        }
        None => b[off..off + 4].copy_from_slice(&0u32.to_le_bytes()),
    }
}

/// Make `b` an empty leaf block: one free entry up to the tail (with
/// `tail`) and the tail itself.
pub fn init_block(b: &mut [u8], tail: bool) {
    b.fill(0);
    let end = if tail { b.len() - TAIL_SIZE } else { b.len() };
    b[4..6].copy_from_slice(&(end as u16).to_le_bytes());
    if tail {
        b[end + 4..end + 6].copy_from_slice(&(TAIL_SIZE as u16).to_le_bytes());
        b[end + 7] = TAIL_FT;
    }
}

/// Make `b` the first block of a new directory: `.` and `..` (the latter
/// spanning the rest up to the tail), with file type `ft` (`FT_DIR`, or 0
/// without the filetype feature, as the kernel's `ext4_set_de_type`).
pub fn init_dir_block(b: &mut [u8], ino: u32, parent: u32, tail: bool, ft: u8) {
    init_block(b, tail);
    let end = if tail { b.len() - TAIL_SIZE } else { b.len() };
    put_entry(b, 0, ino, 12, b".", ft);
    put_entry(b, 12, parent, end - 12, b"..", ft);
}

/// Make `b` the one block an inline directory moves out to, as the
/// kernel's `ext4_finish_convert_inline_dir`: `.` (inode `ino`) and `..`
/// of 12 bytes each, then `inline` (the inline space: the parent's number
/// in its first 4 bytes, then entries that fill the rest, as checked when
/// read) copied as it is, so that every entry moves by 20 bytes and keeps
/// its place, and the last entry stretched to the end (before the tail).
/// `ft`: the file type `.` and `..` get (`init_dir_block`).
/// False, with `b` untouched, when `inline` is shorter than its parent
/// field, does not fit, or its entries do not chain to its end.
pub fn from_inline(b: &mut [u8], ino: u32, inline: &[u8], tail: bool, ft: u8) -> bool {
    let end = if tail { b.len() - TAIL_SIZE } else { b.len() };
    let Some(len) = inline.len().checked_sub(4) else {
        return false;
    };
    if len == 0 || 24 + len > end {
        return false;
    }
    // The last entry of the copied run: rec_lens must chain to its end.
    let body = &inline[4..];
    let (mut off, mut last) = (0, 0);
    while off < len {
        let rl = if off + ENTRY_HEADER <= len {
            usize::from(le16(body, off + 4))
        } else {
            0
        };
        if rl < ENTRY_HEADER || off + rl > len {
            return false;
        }
        last = off;
        off += rl;
    }
    let parent = le32(inline, 0);
    init_block(b, tail);
    put_entry(b, 0, ino, 12, b".", ft);
    put_entry(b, 12, parent, 12, b"..", ft);
    b[24..24 + len].copy_from_slice(body);
    let stretched = (end - 24 - last) as u16;
    b[24 + last + 4..24 + last + 6].copy_from_slice(&stretched.to_le_bytes());
    true
}

/// Recompute the checksum in a leaf block's tail.
pub fn set_tail_csum(b: &mut [u8], csum_seed: u32) {
    let off = b.len() - TAIL_SIZE;
    let c = crc32c(csum_seed, &b[..off]);
    b[off + 8..off + 12].copy_from_slice(&c.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn what() -> String {
        "test".into()
    }

    #[test]
    fn bad_rec_len_is_corrupt() {
        let mut b = vec![0u8; 1024];
        // inode 11, rec_len 6 (< header), name_len 1.
        b[0..4].copy_from_slice(&11u32.to_le_bytes());
        b[4..6].copy_from_slice(&6u16.to_le_bytes());
        b[6] = 1;
        assert!(entries(&b, false, true, &what).unwrap_err().is_corrupt());
        // rec_len past the block end.
        b[4..6].copy_from_slice(&2000u16.to_le_bytes());
        assert!(entries(&b, false, true, &what).unwrap_err().is_corrupt());
        // name longer than the record.
        b[4..6].copy_from_slice(&12u16.to_le_bytes());
        b[6] = 9;
        assert!(entries(&b, false, true, &what).unwrap_err().is_corrupt());
        // One entry spanning the block is fine.
        b[4..6].copy_from_slice(&1024u16.to_le_bytes());
        b[6] = 1;
        b[8] = b'a';
        let v = entries(&b, false, true, &what).unwrap();
        assert_eq!((v.len(), v[0].name), (1, &b"a"[..]));
    }

    #[test]
    fn rec_len_encoding_of_64k_blocks() {
        assert_eq!(rec_len_from_disk(12, 4096), 12);
        assert_eq!(rec_len_from_disk(0, 65536), 65536);
        assert_eq!(rec_len_from_disk(65535, 65536), 65536);
        assert_eq!(rec_len_from_disk(0xfffc | 1, 65536), 0xfffc | (1 << 16));
    }

    /// The entry before a name can change between a search and the
    /// removal (an insert into the slack of the entry before it, under
    /// the directory's shared lock): `remove_named` finds it afresh.
    #[test]
    fn remove_named_merges_into_the_entry_now_before_it() {
        let mut b = vec![0u8; 1024];
        init_block(&mut b, true);
        let end = 1024 - TAIL_SIZE;
        assert!(insert(&mut b, end, 12, b"a", FT_REG));
        assert!(insert(&mut b, end, 13, b"b", FT_REG));
        // Free the end of "a"'s record: remove "b" and put it back after
        // a gap, the layout a removal and a later insert leave.
        remove(&mut b, 12, Some(0));
        b[4..6].copy_from_slice(&40u16.to_le_bytes());
        put_entry(&mut b, 40, 13, end - 40, b"b", FT_REG);
        let v = entries(&b, true, true, &what).unwrap();
        assert_eq!((v[1].offset, v[1].name), (40, &b"b"[..]));
        // A search now would say: "b" at 40, after "a" at 0. Another
        // thread inserts "c" into "a"'s slack, between the two.
        assert!(insert(&mut b, end, 14, b"c", FT_REG));
        let v = entries(&b, true, true, &what).unwrap();
        assert_eq!(
            v.iter().map(|e| e.name).collect::<Vec<_>>(),
            [&b"a"[..], b"c", b"b"]
        );
        assert!(remove_named(&mut b, end, b"b"));
        let v = entries(&b, true, true, &what).unwrap();
        let live: Vec<_> = v.iter().filter(|e| e.inode != 0).map(|e| e.name).collect();
        assert_eq!(live, [&b"a"[..], b"c"]);
        assert_eq!(v[1].offset + v[1].rec_len, end, "c's record took b's space");
        assert!(!remove_named(&mut b, end, b"b"), "gone");
        // The first entry of a block is marked free, not merged.
        assert!(remove_named(&mut b, end, b"a"));
        let v = entries(&b, true, true, &what).unwrap();
        assert_eq!((v[0].inode, v[1].name), (0, &b"c"[..]));
    }

    #[test]
    fn insert_uses_slack_then_remove_merges() {
        let mut b = vec![0u8; 1024];
        init_block(&mut b, true);
        let end = 1024 - TAIL_SIZE;
        assert!(insert(&mut b, end, 12, b"a", FT_REG));
        assert!(insert(&mut b, end, 13, b"bb", FT_DIR));
        set_tail_csum(&mut b, 7);
        verify_tail(&b, 7, &|| "t".into()).unwrap();
        let v = entries(&b, true, true, &|| "t".into()).unwrap();
        let live: Vec<_> = v.iter().filter(|e| e.inode != 0).map(|e| e.name).collect();
        assert_eq!(live, [&b"a"[..], b"bb"]);
        assert_eq!(v[1].offset, 12);
        assert_eq!(v[1].rec_len, end - 12);
        remove(&mut b, 12, Some(0));
        let v = entries(&b, true, true, &|| "t".into()).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].rec_len, end);
        // A name that cannot fit is refused, not squeezed in.
        let mut full = vec![0u8; 1024];
        init_block(&mut full, true);
        assert!(insert(&mut full, end, 5, &[b'x'; 255], FT_REG));
        let mut n = 0;
        while insert(&mut full, end, 6, &[b'y'; 255], FT_REG) {
            n += 1;
        }
        assert_eq!(n, 2, "three 264-byte entries fit in 1012 bytes, not four");
    }

    /// An inline directory's space moves into a block entry for entry,
    /// 20 bytes on, the last entry stretched to the tail; a space whose
    /// rec_lens do not chain to its end, or that does not fit, is refused
    /// with the block untouched.
    #[test]
    fn from_inline_keeps_each_entry_in_place() {
        // Parent 2, then 56 bytes: "a" (12), a free 20, "bb" to the end.
        let mut inline = vec![0u8; 60];
        inline[..4].copy_from_slice(&2u32.to_le_bytes());
        put_entry(&mut inline[4..], 0, 12, 12, b"a", FT_REG);
        put_entry(&mut inline[4..], 12, 0, 20, b"", 0);
        put_entry(&mut inline[4..], 32, 13, 24, b"bb", FT_DIR);
        let mut b = vec![0u8; 1024];
        assert!(from_inline(&mut b, 11, &inline, true, FT_DIR));
        let v = entries(&b, true, true, &what).unwrap();
        let got: Vec<_> = v
            .iter()
            .map(|e| (e.offset, e.rec_len, e.inode, e.name))
            .collect();
        assert_eq!(
            got,
            [
                (0, 12, 11, &b"."[..]),
                (12, 12, 2, b".."),
                (24, 12, 12, b"a"),
                (36, 20, 0, b""),
                (56, 1024 - TAIL_SIZE - 56, 13, b"bb"),
            ]
        );
        assert!(has_tail(&b));
        // A rec_len past the end of the space; a space too long.
        let mut bad = inline.clone();
        bad[4 + 32 + 4] = 28;
        let mut b = vec![7u8; 1024];
        assert!(!from_inline(&mut b, 11, &bad, true, FT_DIR));
        assert!(!from_inline(&mut b, 11, &[0u8; 1024], true, FT_DIR));
        assert!(!from_inline(&mut b, 11, &[0u8; 3], true, FT_DIR));
        assert!(b.iter().all(|&x| x == 7), "untouched");
    }

    /// `scan` visits what `entries` lists, in order, and stops where its
    /// visitor says: a name before a corrupt entry is found (as the
    /// kernel's search, which checks entries as it reaches them), while
    /// the whole list, and a search past the corruption, are errors.
    #[test]
    fn scan_stops_at_the_name_and_checks_what_it_reached() {
        let mut b = vec![0u8; 1024];
        init_block(&mut b, true);
        let end = 1024 - TAIL_SIZE;
        for (k, n) in [b"a", b"b", b"c"].iter().enumerate() {
            assert!(insert(&mut b, end, 12 + k as u32, *n, FT_REG));
        }
        let all: Vec<usize> = entries(&b, true, true, &what)
            .unwrap()
            .iter()
            .map(|e| e.offset)
            .collect();
        let mut seen = Vec::new();
        let hit = scan(&b, true, true, &what, |e| {
            seen.push(e.offset);
            e.name == b"b"
        })
        .unwrap();
        assert!(hit);
        let at_b = all.iter().position(|&o| Some(&o) == seen.last()).unwrap();
        assert_eq!(seen, all[..=at_b].to_vec(), "in order, up to the name");
        assert!(!scan(&b, true, true, &what, |_| false).unwrap());
        // "c"'s record made shorter than an entry header: after "b".
        let c = *all.last().unwrap();
        b[c + 4..c + 6].copy_from_slice(&6u16.to_le_bytes());
        assert!(entries(&b, true, true, &what).unwrap_err().is_corrupt());
        assert!(scan(&b, true, true, &what, |e| e.name == b"b").unwrap());
        let miss = scan(&b, true, true, &what, |e| e.name == b"zz");
        assert!(miss.unwrap_err().is_corrupt());
    }

    proptest::proptest! {
        /// `has_room` (what an insert checks before changing a cached
        /// block) agrees with `insert`: a block some entry of which has
        /// room takes the name into the first such entry, and a block none
        /// of which has room refuses it unchanged. Blocks are built by
        /// random inserts and removals.
        #[test]
        fn has_room_agrees_with_insert(
            ops in proptest::collection::vec((0u8..4, 1usize..40), 0..80),
            len in 1usize..256,
        ) {
            let mut b = vec![0u8; 1024];
            init_block(&mut b, true);
            let end = 1024 - TAIL_SIZE;
            let mut next = 12u32;
            for (op, n) in ops {
                if op == 0 {
                    // Remove the n-th live entry, if any.
                    let v = entries(&b, true, true, &what).unwrap();
                    let live: Vec<(usize, Option<usize>)> = v
                        .iter()
                        .enumerate()
                        .filter(|(_, e)| e.inode != 0)
                        .map(|(i, e)| (e.offset, i.checked_sub(1).map(|p| v[p].offset)))
                        .collect();
                    if let Some(&(off, prev)) = live.get(n % live.len().max(1)) {
                        remove(&mut b, off, prev);
                    }
                } else {
                    let name = format!("{next:0n$}");
                    insert(&mut b, end, next, name.as_bytes(), FT_REG);
                    next += 1;
                }
            }
            let need = rec_len_needed(len);
            let mut first = None;
            let room = scan(&b, true, true, &what, |e| {
                let r = has_room(&e, need);
                if r {
                    first = Some(e.offset);
                }
                r
            })
            .unwrap();
            let before = b.clone();
            let name = vec![b'z'; len];
            proptest::prop_assert_eq!(insert(&mut b, end, 999, &name, FT_REG), room);
            if room {
                let v = entries(&b, true, true, &what).unwrap();
                let at = v.iter().find(|e| e.name == &name[..]).unwrap().offset;
                let f = first.unwrap();
                // Into the free entry itself, or the slack after the live one.
                proptest::prop_assert!(at == f || (at > f && before[f..f + 4] != [0; 4]));
                proptest::prop_assert!(v.iter().all(|e| e.offset <= f || e.offset >= at));
            } else {
                proptest::prop_assert_eq!(b, before);
            }
        }
    }
}
