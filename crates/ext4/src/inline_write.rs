//! Read-write mounts of images with inline_data: an inline file or
//! directory (its bytes in `i_block` and the in-inode `system.data`
//! attribute) is moved out to one data block the first time it changes,
//! as the kernel's `ext4_convert_inline_data` / `ext4_convert_inline_dir`
//! do when inline data no longer fits. New files and directories are
//! never made inline, and a converted inode stays a block inode, so every
//! change after the conversion runs the ordinary extent paths.
//!
//! - A file: a write, truncate, fallocate or punch (`file_raw`) converts
//!   it first, under its data lock and in the caller's handle.
//! - A directory: a create, link, unlink, rmdir or rename in it, and a
//!   rename that moves it to another parent (its `..`), convert it first
//!   (`uninline_dirs`), in a handle of its own under its directory lock.
//! - Reads, attribute changes, extended attributes (the `system.data`
//!   entry is kept in place in the inode body), unlinks of an inline file
//!   and removals of an empty inline directory need no conversion: the
//!   inode is freed with nothing but its attributes to release.
//!
//! The converted inode: the inline flag cleared, the extent flag set, an
//! extent root over one block (none for an empty file), `i_size` the
//! file's size or one block for a directory, `i_blocks` counting the
//! block, `system.data` removed from the inode body. The data block is
//! written before the inode that points at it (data=ordered); a
//! directory's block goes through the journal, with `.` and `..` in
//! front of the inline entries and its checksum tail.

use std::sync::Arc;

use scalevfs::inode::Inode;

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
            let (parent, entries) = self.inline_dir(raw)?;
            let tail = self.sb.has_metadata_csum();
            let end = bs - if tail { dir::TAIL_SIZE } else { 0 };
            // `.` and `..` (12 bytes each) and every entry at its least
            // length: checked before anything is allocated.
            let need: usize = 24
                + entries
                    .iter()
                    .map(|e| dir::rec_len_needed(e.name.len()))
                    .sum::<usize>();
            if need > end {
                return Err(corrupt(what(), format!("{need} bytes of entries")));
            }
            let pblk = self.alloc_block(0)?;
            let seed = self.csum_seed(raw);
            let filetype = self
                .sb
                .has_incompat(crate::format::features::INCOMPAT_FILETYPE);
            let stored = (|| -> Result<()> {
                self.extent_append(&mut new, 0, pblk)?;
                rw.bufs.modify(io.dev, pblk, false, |b| {
                    dir::init_dir_block(b, raw.ino, parent, tail);
                    for e in &entries {
                        let ft = if filetype { e.file_type } else { 0 };
                        // Fits: the room was counted above.
                        dir::insert(b, end, e.inode, &e.name, ft);
                    }
                    if let Some(s) = seed {
                        dir::set_tail_csum(b, s);
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

    /// Convert each inline directory among `dirs` (`uninline`), each in a
    /// handle of its own under its directory lock held exclusive; the
    /// VFS's copy of its size and blocks follows. Cheap when nothing is
    /// inline: one flag test per inode.
    pub(crate) fn uninline_dirs(&self, dirs: &[&Arc<Inode>]) -> Result<()> {
        for d in dirs {
            let Some(di) = d.private::<Ext4Inode>() else {
                continue;
            };
            if !d.is_dir() || di.raw().flags & FL_INLINE_DATA == 0 {
                continue;
            }
            self.journaled(|| {
                let _dl = di
                    .dir_lock
                    .write_spin_as(scalevfs_sync::ordered::Class::Ext4Dir, d.ino());
                let mut raw = di.raw();
                if raw.flags & FL_INLINE_DATA == 0 {
                    // Another thread converted it meanwhile.
                    return Ok(());
                }
                self.check(self.uninline(&mut raw))?;
                di.set_raw(raw);
                Ok(())
            })?;
            d.update_attr(|a| {
                let r = di.raw();
                a.size = r.size;
                a.blocks = r.blocks;
            });
        }
        Ok(())
    }
}
