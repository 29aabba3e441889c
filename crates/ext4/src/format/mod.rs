//! The on-disk structures of ext4 as checked parsers: each takes bytes and
//! returns a struct, checking every field that later code relies on. One file
//! per structure. Layouts follow the kernel's `Documentation/filesystems/ext4`
//! and e2fsprogs' `ext2_fs.h`.

pub mod checksum;
pub mod dir;
pub mod extent;
pub mod features;
pub mod group_desc;
pub mod htree;
pub mod inode;
pub mod superblock;
pub mod xattr;

/// Little-endian field readers. Callers check the slice length first (each
/// parser checks its structure's size once); out-of-range offsets read as 0
/// rather than panic.
#[inline]
pub(crate) fn le16(b: &[u8], off: usize) -> u16 {
    match b.get(off..off + 2) {
        Some(s) => u16::from_le_bytes([s[0], s[1]]),
        None => 0,
    }
}

#[inline]
pub(crate) fn le32(b: &[u8], off: usize) -> u32 {
    match b.get(off..off + 4) {
        Some(s) => u32::from_le_bytes([s[0], s[1], s[2], s[3]]),
        None => 0,
    }
}

#[inline]
pub(crate) fn u8_at(b: &[u8], off: usize) -> u8 {
    b.get(off).copied().unwrap_or(0)
}
