//! Read-write mounts of images with inline_data, as the kernel's ext4
//! keeps small directories and moves inline data out when it outgrows
//! the inode.
//!
//! Directories (`ext4_try_create_inline_dir`, `ext4_try_add_inline_entry`,
//! `ext4_delete_inline_entry`): a new directory is made inline when new
//! inodes have room for inline data past `i_block` (`new_inodes_inline`):
//! `i_block` holds the parent's number and then entries, the size is 60
//! and no block is mapped, with an empty `system.data` attribute in the
//! inode body. A new entry goes into `i_block`, else into the
//! `system.data` value, which grows once (while empty) to all the room
//! the body has past the other attributes; when neither has room the
//! directory moves out to one block (`uninline`) and the entry goes
//! there. Removals, renames (the entry pointed at another inode) and a
//! moved directory's `..` change the inode in place. All of it under the
//! directory's lock held exclusive, in the caller's handle: creates into
//! an inline directory never take the shared-lock path.
//!
//! Files (`ext4_try_to_write_inline_data`): a regular file this mount
//! created, or one read inline (`Ext4Inode::may_inline`), takes a write
//! that ends within the inline room into `i_block` and the `system.data`
//! value (`inline_write`); a truncate that cuts an inline file keeps it
//! inline (`inline_truncate`). Any other change (a write past the room,
//! a truncate that grows it, fallocate of any mode, punch) moves the
//! data out to one block first (`file_raw`, `ext4_convert_inline_data`),
//! under its data lock and in the caller's handle; a converted inode
//! stays a block inode. Reads, attribute changes, extended attributes
//! (the `system.data` entry is kept in place in the inode body) and
//! unlinks need no conversion.
//!
//! A converted inode: the inline flag cleared, the extent flag set, an
//! extent root over one block (none for an empty file), `i_size` the
//! file's size or one block for a directory, `i_blocks` counting the
//! block, `system.data` removed from the inode body. The data block is
//! written before the inode that points at it (data=ordered); a
//! directory's block goes through the journal, with `.` and `..` in
//! front of the inline entries and its checksum tail.

use crate::error::{corrupt, Result};
use crate::format::dir;
use crate::format::inode::{RawInode, FL_EXTENTS, FL_INLINE_DATA};
use crate::format::xattr::RawEntry;
use crate::fs::{Ext4, Ext4Inode};
use crate::util::{errno, BlockBuf};

/// `system.data`: the system index (7) and the name after its prefix.
fn is_inline_entry(e: &RawEntry) -> bool {
    e.index == 7 && e.name == b"data"
}

impl Ext4 {
    /// Move inline `raw` (a regular file or a directory) out to a block,
    /// in the caller's handle, the inode's own lock held (the data lock
    /// for a file, the directory lock for a directory). Stores the inode;
    /// `raw` becomes the stored copy. Not inline: nothing to do.
    pub(crate) fn uninline(&self, raw: &mut RawInode) -> Result<()> {
        self.uninline_padded(raw, false)
    }

    /// `uninline` of a directory that an insert found full
    /// (`inline_dir_insert` said no): the kernel's
    /// `ext4_try_add_inline_entry` first grows an empty `system.data`
    /// value to all the room the body has (`ext4_update_inline_dir`, by
    /// more than `MIN_GROWTH`) and only then moves the directory out, so
    /// the block it gets holds that room as a free entry after the
    /// `i_block` entries. The grown value is not stored here: a move
    /// that fails (no block) leaves the directory as it was, where the
    /// kernel's keeps the grown value (a size of 128 instead of 60).
    pub(crate) fn uninline_for_insert(&self, raw: &mut RawInode) -> Result<()> {
        self.uninline_padded(raw, true)
    }

    fn uninline_padded(&self, raw: &mut RawInode, grow: bool) -> Result<()> {
        if raw.flags & FL_INLINE_DATA == 0 {
            return Ok(());
        }
        let (rw, io) = self.rw()?;
        let bs = self.bs;
        let what = || format!("inline inode {}", raw.ino);
        let is_dir = match raw.file_type_bits() {
            libc::S_IFREG => false,
            libc::S_IFDIR => true,
            // Symlinks and the rest never change their data.
            _ => return Err(errno(libc::EOPNOTSUPP)),
        };
        // The area read here is written back below (`settle_extra_isize`).
        self.settle_extra_isize(raw.ino)?;
        let st = self.stored_xattrs(raw)?;
        let body: Vec<RawEntry> = st
            .body
            .iter()
            .filter(|e| !is_inline_entry(e))
            .cloned()
            .collect();
        let block = st
            .block
            .as_ref()
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let mut new = raw.clone();
        new.flags = (new.flags & !FL_INLINE_DATA) | FL_EXTENTS;
        new.block = crate::write::empty_extent_root();
        if is_dir {
            // Checked as entries first; then copied as they are (each
            // keeps its place, 20 bytes on: readdir cookies keep their
            // meaning), as the kernel moves an inline directory out.
            self.inline_dir(raw)?;
            let mut inline = self.inline_bytes(raw)?;
            let room = Self::inline_room(&st);
            if grow && inline.len() == raw.block.len() && room > MIN_GROWTH {
                // The grown value: one free entry over all of it.
                let at = inline.len();
                inline.resize(at + room, 0);
                inline[at + 4..at + 6].copy_from_slice(&(room as u16).to_le_bytes());
            }
            let tail = self.sb.has_metadata_csum();
            let mut b = BlockBuf::zeroed(bs);
            if !dir::from_inline(&mut b, raw.ino, &inline, tail, self.dot_ft()) {
                return Err(corrupt(
                    what(),
                    format!("{} bytes of entries", inline.len()),
                ));
            }
            let pblk = self.alloc_block(0)?;
            let seed = self.csum_seed(raw);
            let stored = (|| -> Result<()> {
                self.extent_append(&mut new, 0, pblk)?;
                rw.bufs.modify(io.dev, pblk, false, |d| {
                    d.copy_from_slice(&b);
                    if let Some(s) = seed {
                        dir::set_tail_csum(d, s);
                    }
                })?;
                new.size = bs as u64;
                self.store_xattrs(&mut new, &st, &body, &block, None)
            })();
            if let Err(e) = stored {
                let _ = self.free_block(pblk);
                return Err(e);
            }
        } else {
            let data = self.inline_file(raw)?;
            if data.len() > bs {
                return Err(corrupt(what(), format!("{} bytes inline", data.len())));
            }
            let mut fresh = None;
            let stored = (|| -> Result<()> {
                if !data.is_empty() {
                    let pblk = self.alloc_block(0)?;
                    fresh = Some(pblk);
                    let mut b = BlockBuf::zeroed(bs);
                    b[..data.len()].copy_from_slice(&data);
                    // The data goes home before the inode that maps it
                    // is logged (data=ordered).
                    self.dev.write_at(pblk * bs as u64, &b)?;
                    self.extent_append(&mut new, 0, pblk)?;
                }
                self.store_xattrs(&mut new, &st, &body, &block, None)
            })();
            if let Err(e) = stored {
                if let Some(p) = fresh {
                    let _ = self.free_block(p);
                }
                return Err(e);
            }
        }
        *raw = new;
        Ok(())
    }
}

/// `EXT4_DIR_REC_LEN(1)`: an inline directory grows into its
/// `system.data` attribute only by more than this (the kernel's
/// `ext4_update_inline_dir`).
const MIN_GROWTH: usize = 12;

/// The bytes of `i_block` after an inline directory's parent number.
const DOTDOT: usize = 4;

/// An empty `system.data` attribute (an inline inode's, before its data
/// passes `i_block`).
fn inline_entry(value: Vec<u8>) -> RawEntry {
    RawEntry {
        index: 7,
        name: b"data".to_vec(),
        value,
        inum: 0,
        inum_size: 0,
        hash: 0,
    }
}

impl Ext4 {
    /// Whether new directories and files may hold inline data, as the kernel's ext4 does
    /// on an inline_data image (`EXT4_STATE_MAY_INLINE_DATA` for every new
    /// inode): the image has the feature and new inodes have an in-inode
    /// attribute area with room for some inline data past `i_block`
    /// (`ext4_get_max_inline_size` is 0 otherwise, and the directory gets
    /// a block).
    pub(crate) fn new_inodes_inline(&self) -> bool {
        self.sb
            .has_incompat(crate::format::features::INCOMPAT_INLINE_DATA)
            && self.fresh_inline_room() > 0
    }

    /// The `system.data` value a new inode's body can hold: its area
    /// (the inode size past 128 bytes and `i_extra_isize`) less the magic,
    /// the entry and the end mark; the kernel's
    /// `get_max_inline_xattr_value_size` for an inode without attributes.
    fn fresh_inline_room(&self) -> usize {
        let isz = self.sb.inode_size();
        if isz <= crate::format::inode::GOOD_OLD_INODE_SIZE {
            return 0;
        }
        let area =
            isz - crate::format::inode::GOOD_OLD_INODE_SIZE - crate::write::want_extra_isize(isz);
        let used = 4 + crate::format::xattr::table_len(&[inline_entry(Vec::new())]);
        area.saturating_sub(used) & !3
    }

    /// The largest `system.data` value the body of the inode `st` was read
    /// from can hold beside its other attributes (the kernel's
    /// `get_max_inline_xattr_value_size`): 0 without a body.
    fn inline_room(st: &crate::xattr_write::Stored) -> usize {
        let Some((_, len)) = st.area else {
            return 0;
        };
        let mut with: Vec<RawEntry> = st
            .body
            .iter()
            .filter(|e| !is_inline_entry(e))
            .cloned()
            .collect();
        with.push(inline_entry(Vec::new()));
        len.saturating_sub(4 + crate::format::xattr::table_len(&with)) & !3
    }

    /// Make the new directory `raw` (inode written by the caller next)
    /// inline, as the kernel's `ext4_try_create_inline_dir`: `i_block`
    /// holds the parent's number and one free entry over the other 56
    /// bytes, the size is 60, no block is mapped.
    pub(crate) fn init_inline_dir(raw: &mut RawInode, parent: u32) {
        raw.flags = (raw.flags & !FL_EXTENTS) | FL_INLINE_DATA;
        raw.block = [0; crate::format::inode::I_BLOCK_LEN];
        raw.block[..DOTDOT].copy_from_slice(&parent.to_le_bytes());
        let rest = (raw.block.len() - DOTDOT) as u16;
        raw.block[DOTDOT + 4..DOTDOT + 6].copy_from_slice(&rest.to_le_bytes());
        raw.size = raw.block.len() as u64;
    }

    /// The empty `system.data` attribute of a new inline directory, after
    /// `write_inode` made its slot.
    pub(crate) fn add_inline_attr(&self, raw: &mut RawInode) -> Result<()> {
        let st = self.stored_xattrs(raw)?;
        let mut body = st.body.clone();
        body.push(inline_entry(Vec::new()));
        self.store_xattrs(raw, &st, &body, &[], None)
    }

    /// Add `name` -> `ino` to inline directory `draw` (its lock held
    /// exclusive; the caller writes the inode), as the kernel's
    /// `ext4_try_add_inline_entry`: into `i_block`, else into the
    /// `system.data` value (grown, while it is empty, to all the room the
    /// inode body has). False, nothing changed, when neither has room:
    /// the caller moves the directory out to a block.
    pub(crate) fn inline_dir_insert(
        &self,
        draw: &mut RawInode,
        name: &[u8],
        ino: u32,
        ft: u8,
    ) -> Result<bool> {
        self.inline_dir_edit(draw, true, &mut |b, end| dir::insert(b, end, ino, name, ft))
    }

    /// Remove the live entry `name` from inline directory `draw` (its
    /// lock held exclusive; the caller writes the inode), as the kernel's
    /// `ext4_delete_inline_entry`: false when neither region holds it.
    pub(crate) fn inline_dir_remove(&self, draw: &mut RawInode, name: &[u8]) -> Result<bool> {
        self.inline_dir_edit(draw, false, &mut |b, end| dir::remove_named(b, end, name))
    }

    /// Point the live entry `name` of inline directory `draw` at `ino`
    /// (file type `ft`, already 0 without the filetype feature; its lock
    /// held exclusive; the caller writes the inode): false when neither
    /// region holds it.
    pub(crate) fn inline_dir_retarget(
        &self,
        draw: &mut RawInode,
        name: &[u8],
        ino: u32,
        ft: u8,
    ) -> Result<bool> {
        self.inline_dir_edit(
            draw,
            false,
            &mut |b, end| match dir::find_named(b, end, name) {
                Some((off, _)) => {
                    dir::retarget(b, off, ino, ft);
                    true
                }
                None => false,
            },
        )
    }

    /// Apply `edit` (a change to the run of entries in its buffer before
    /// the given end; false: it changed nothing) to the entries in
    /// `i_block`, else to those in the `system.data` value, which `grow`
    /// first makes all the room the body has while it is empty (by more
    /// than `MIN_GROWTH`); a changed value is stored (the inode's size
    /// follows it). False, nothing stored, when neither region took the
    /// change.
    fn inline_dir_edit(
        &self,
        draw: &mut RawInode,
        grow: bool,
        edit: &mut dyn FnMut(&mut [u8], usize) -> bool,
    ) -> Result<bool> {
        let mut blk = draw.block;
        let end = blk.len() - DOTDOT;
        if edit(&mut blk[DOTDOT..], end) {
            draw.block = blk;
            return Ok(true);
        }
        self.settle_extra_isize(draw.ino)?;
        let st = self.stored_xattrs(draw)?;
        let Some(cur) = st.body.iter().find(|e| is_inline_entry(e)) else {
            return Ok(false);
        };
        let mut value = cur.value.clone();
        if grow && value.is_empty() {
            let room = Self::inline_room(&st);
            if room <= MIN_GROWTH {
                return Ok(false);
            }
            value = vec![0; room];
            value[4..6].copy_from_slice(&(room as u16).to_le_bytes());
        }
        let vlen = value.len();
        if !edit(&mut value, vlen) {
            // Not stored: the directory moves out next
            // (`uninline_for_insert` copies the grown room into the
            // block as the kernel's would have it).
            return Ok(false);
        }
        self.put_inline_value(draw, &st, value)?;
        Ok(true)
    }

    /// Point the `..` of inline directory `raw` at `parent` (the caller
    /// writes the inode).
    pub(crate) fn set_inline_dotdot(raw: &mut RawInode, parent: u32) {
        raw.block[..DOTDOT].copy_from_slice(&parent.to_le_bytes());
    }

    /// Store `value` as the `system.data` of `raw` (read as `st`); the
    /// size follows it (`i_inline_size`).
    fn put_inline_value(
        &self,
        raw: &mut RawInode,
        st: &crate::xattr_write::Stored,
        value: Vec<u8>,
    ) -> Result<()> {
        raw.size = (raw.block.len() + value.len()) as u64;
        self.store_inline_value(raw, st, value)
    }

    /// `write` of `buf` at `off` into a regular file that may keep its
    /// data inline (`Ext4Inode::may_inline`): into `i_block` and the
    /// `system.data` value when the write ends within the room the inode
    /// has (60 bytes plus the attribute's room), as the kernel's
    /// `ext4_try_to_write_inline_data` decides (the size may be larger:
    /// reads past the inline bytes give zeros). `None`: not this way
    /// (the caller's extent path moves inline data out first). In the
    /// caller's handle.
    pub(crate) fn inline_write(
        &self,
        inode: &scalevfs::inode::Inode,
        off: u64,
        buf: &[u8],
    ) -> Result<Option<usize>> {
        use scalevfs_sync::primitive::Ordering::Relaxed;
        let Some(ei) = inode.private::<Ext4Inode>() else {
            return Ok(None);
        };
        // Relaxed: see `Ext4Inode::may_inline`.
        if !ei.may_inline.load(Relaxed) {
            return Ok(None);
        }
        let g = ei.data.write();
        if !ei.may_inline.load(Relaxed) {
            return Ok(None);
        }
        let mut raw = ei.raw();
        let inline = raw.flags & FL_INLINE_DATA != 0;
        // Not inline yet: only while nothing is mapped (a new file).
        if !inline && (raw.flags & FL_EXTENTS == 0 || !crate::fs::extent_root_empty(&raw)) {
            ei.may_inline.store(false, Relaxed);
            return Ok(None);
        }
        let Some(end) = off.checked_add(buf.len() as u64) else {
            return Ok(None);
        };
        self.settle_extra_isize(raw.ino)?;
        let st = self.stored_xattrs(&raw)?;
        let room = Self::inline_room(&st);
        let i_block = raw.block.len();
        if room == 0 || end > (i_block + room) as u64 {
            return Ok(None);
        }
        let end = end as usize;
        let mut data = if inline {
            self.inline_bytes_stored(&raw, &st)
        } else {
            Vec::new()
        };
        let old_value = data.len().saturating_sub(i_block);
        data.resize(data.len().max(end).max(i_block), 0);
        data[off as usize..end].copy_from_slice(buf);
        // The value only grows (the kernel's ext4_update_inline_data),
        // to hold what passes `i_block`.
        let vlen = old_value.max(end.saturating_sub(i_block));
        data.truncate(i_block + vlen);
        raw.block.copy_from_slice(&data[..i_block]);
        raw.flags = (raw.flags & !FL_EXTENTS) | FL_INLINE_DATA;
        let t = crate::util::now();
        raw.size = raw.size.max(end as u64);
        raw.mtime = t;
        raw.ctime = t;
        self.store_inline_value(&mut raw, &st, data[i_block..].to_vec())?;
        self.publish(inode, ei, g, raw)?;
        Ok(Some(buf.len()))
    }

    /// Truncate of an inline file to `size`, no larger than its size, as
    /// the kernel's `ext4_inline_data_truncate`: the inode keeps its data
    /// inline, the `system.data` value shrinks to what passes `i_block`
    /// and `i_block` past the size is zeroed. The caller holds the data
    /// lock and stores `raw`.
    pub(crate) fn inline_truncate(&self, raw: &mut RawInode, size: u64) -> Result<()> {
        self.settle_extra_isize(raw.ino)?;
        let st = self.stored_xattrs(raw)?;
        let i_block = raw.block.len();
        let data = self.inline_bytes_stored(raw, &st);
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        if size < data.len().max(i_block) {
            if size < i_block {
                raw.block[size..].fill(0);
            }
            if data.len() > i_block {
                let keep = size.saturating_sub(i_block).min(data.len() - i_block);
                self.store_inline_value(raw, &st, data[i_block..i_block + keep].to_vec())?;
            }
        }
        Ok(())
    }

    /// `i_block` and then the `system.data` value of `raw` as stored
    /// (`st`): the inline bytes, whatever the size says.
    fn inline_bytes_stored(&self, raw: &RawInode, st: &crate::xattr_write::Stored) -> Vec<u8> {
        let mut v = raw.block.to_vec();
        if let Some(e) = st.body.iter().find(|e| is_inline_entry(e)) {
            v.extend_from_slice(&e.value);
        }
        v
    }

    /// `put_inline_value` without touching the size (a file's size is its
    /// own), adding the `system.data` entry where it is missing.
    fn store_inline_value(
        &self,
        raw: &mut RawInode,
        st: &crate::xattr_write::Stored,
        value: Vec<u8>,
    ) -> Result<()> {
        let mut body = st.body.clone();
        match body.iter_mut().find(|e| is_inline_entry(e)) {
            Some(e) => *e = inline_entry(value),
            None => body.push(inline_entry(value)),
        }
        let block = st
            .block
            .as_ref()
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        self.store_xattrs(raw, st, &body, &block, None)
    }
}
