//! The namespace side of a read-write mount: inode writeback; create
//! (files, FIFOs, sockets, devices, fast and slow symlinks, directories),
//! link, unlink, rmdir, rename (incl. RENAME_EXCHANGE); linear directory
//! insert/remove and the htree (conversion of a full one-block directory,
//! insert by hash with leaf and index splits); setattr.
//!
//! Not yet (EOPNOTSUPP, never a damaged image): ext2/3 block-mapped
//! directories. See `docs/ext4.md`.

use std::sync::Arc;

use scalevfs::fstype::NewNode;
use scalevfs::inode::Inode;
use scalevfs::types::{FileType, SetAttr};

use crate::error::{corrupt, Result};
use crate::format::dir;
use crate::format::extent::{self, Node as ExtNode};
use crate::format::features::{
    COMPAT_DIR_INDEX, INCOMPAT_EXTENTS, INCOMPAT_FILETYPE, INCOMPAT_LARGEDIR, RO_COMPAT_DIR_NLINK,
};
use crate::format::htree;
use crate::format::inode::{RawInode, FL_EXTENTS, FL_INDEX, FL_INLINE_DATA, I_BLOCK_LEN};
use crate::format::superblock::FLAG_UNSIGNED_HASH;
use crate::fs::{Ext4, Ext4Inode, Mapping};
use crate::util::{errno, now, BlockBuf};
use scalevfs_sync::ordered::Class;

/// Linux's EXT4_LINK_MAX: past it a directory's link count sticks at 1
/// (dir_nlink).
const LINK_MAX: u16 = 65000;

impl Ext4 {
    /// The file type a directory's `.` and `..` entries get: `FT_DIR`,
    /// or 0 without the filetype feature (the kernel's
    /// `ext4_set_de_type`; e2fsck flags a type set there).
    pub(crate) fn dot_ft(&self) -> u8 {
        if self.sb.has_incompat(INCOMPAT_FILETYPE) {
            dir::FT_DIR
        } else {
            0
        }
    }
}

/// A directory's link count with one more subdirectory (dir_nlink): past
/// `LINK_MAX` it sticks at 1, as the kernel's `ext4_inc_count`; computed
/// without overflow (a count of 65535 on an image must not wrap to 0).
fn link_up(n: u16) -> u16 {
    if n >= LINK_MAX {
        1
    } else {
        n + 1
    }
}

/// The `i_extra_isize` new inodes get and short ones grow to in an inode
/// slot of `isz` (> 128) bytes: the kernel's 32 (`s_want_extra_isize`), or
/// the room the slot has.
pub(crate) fn want_extra_isize(isz: usize) -> usize {
    32usize.min(isz - 128)
}

/// Grow the `i_extra_isize` of an existing inode's slot to 32 (the room
/// the slot has, as for new inodes), as the kernel's
/// `ext4_try_to_expand_extra_isize` does when it dirties an inode of an
/// image whose inodes were made smaller (an older mke2fs or kernel): the
/// fields it gains (nanosecond times, crtime, i_checksum_hi) start zeroed
/// and are filled by the encoder, and the in-inode attributes move up to
/// the area's new start, re-encoded. Left as it is where they would not
/// fit the smaller area (the kernel would move some to the xattr block),
/// where the body does not parse, or where `i_extra_isize` is no multiple
/// of 4.
fn grow_extra_isize(slot: &mut [u8], ino: u32) {
    use crate::format::xattr;
    const BASE: usize = 128;
    let isz = slot.len();
    if isz <= BASE {
        return;
    }
    let want = want_extra_isize(isz);
    let old = usize::from(u16::from_le_bytes([slot[0x80], slot[0x81]]));
    if old >= want || old % 4 != 0 || BASE + old > isz {
        return;
    }
    // Without i_extra_isize no body is read or written (the kernel's
    // rule): the bytes past 128 are unused.
    let entries = if old == 0 {
        Vec::new()
    } else {
        match xattr::parse_ibody_raw(&slot[BASE + old..], ino) {
            Ok(v) => v,
            Err(_) => return,
        }
    };
    let Some(body) = xattr::encode_ibody(&entries, isz - BASE - want) else {
        return;
    };
    // The fields i_extra_isize now covers, then the body behind them.
    let from = if old == 0 { 0x80 } else { BASE + old };
    slot[from..].fill(0);
    slot[0x80..0x82].copy_from_slice(&(want as u16).to_le_bytes());
    slot[BASE + want..].copy_from_slice(&body);
}

/// An empty depth-0 extent root for `i_block`.
pub(crate) fn empty_extent_root() -> [u8; I_BLOCK_LEN] {
    let mut b = [0u8; I_BLOCK_LEN];
    b[0..2].copy_from_slice(&extent::EXTENT_MAGIC.to_le_bytes());
    b[4..6].copy_from_slice(&4u16.to_le_bytes());
    b
}

/// Write a depth-0 extent list into `i_block`.
fn put_extents(block: &mut [u8; I_BLOCK_LEN], ex: &[extent::Extent]) {
    let gen = u32::from_le_bytes([block[8], block[9], block[10], block[11]]);
    *block = empty_extent_root();
    block[8..12].copy_from_slice(&gen.to_le_bytes());
    block[2..4].copy_from_slice(&(ex.len() as u16).to_le_bytes());
    for (i, e) in ex.iter().enumerate() {
        let o = extent::HEADER_SIZE + i * extent::ENTRY_SIZE;
        let len = if e.uninit {
            e.len + extent::INIT_MAX_LEN
        } else {
            e.len
        };
        block[o..o + 4].copy_from_slice(&e.block.to_le_bytes());
        block[o + 4..o + 6].copy_from_slice(&len.to_le_bytes());
        block[o + 6..o + 8].copy_from_slice(&((e.start >> 32) as u16).to_le_bytes());
        block[o + 8..o + 12].copy_from_slice(&(e.start as u32).to_le_bytes());
    }
}

fn ft_code(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFREG => dir::FT_REG,
        libc::S_IFDIR => dir::FT_DIR,
        libc::S_IFCHR => dir::FT_CHR,
        libc::S_IFBLK => dir::FT_BLK,
        libc::S_IFIFO => dir::FT_FIFO,
        libc::S_IFSOCK => dir::FT_SOCK,
        libc::S_IFLNK => dir::FT_SYMLINK,
        _ => dir::FT_UNKNOWN,
    }
}

/// Device number in i_block, as the kernel's `ext4_set_inode` (old
/// 16-bit form when it fits, else the new one in word 1).
fn encode_rdev(block: &mut [u8; I_BLOCK_LEN], rdev: u64) {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    if major < 256 && minor < 256 {
        block[0..4].copy_from_slice(&((major << 8) | minor).to_le_bytes());
    } else {
        let new = (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12);
        block[4..8].copy_from_slice(&new.to_le_bytes());
    }
}

fn priv_of(i: &Inode) -> Result<&Ext4Inode> {
    i.private::<Ext4Inode>().ok_or_else(|| errno(libc::EIO))
}

impl Ext4 {
    /// The shared side of a directory's lock on a read-write mount (none
    /// on a read-only one: nothing changes there).
    pub(crate) fn dir_read_lock<'a>(
        &self,
        d: &'a Inode,
    ) -> Option<scalevfs_sync::ordered::RwLockReadGuard<'a, ()>> {
        self.rw.as_ref()?;
        let di = d.private::<Ext4Inode>()?;
        Some(di.dir_lock.read_spin_as(Class::Ext4Dir, d.ino()))
    }

    /// The shared side of `inode_change_lock` on a read-write mount: a
    /// directory's lock for a directory, else the data lock.
    pub(crate) fn inode_read_lock<'a>(
        &self,
        i: &'a Inode,
    ) -> Option<scalevfs_sync::ordered::RwLockReadGuard<'a, ()>> {
        if i.file_type() == FileType::Directory {
            self.dir_read_lock(i)
        } else {
            self.file_read_lock(i)
        }
    }

    /// The shared side of a file's tree lock on a read-write mount.
    pub(crate) fn file_read_lock<'a>(
        &self,
        i: &'a Inode,
    ) -> Option<scalevfs_sync::ordered::RwLockReadGuard<'a, ()>> {
        self.rw.as_ref()?;
        Some(i.private::<Ext4Inode>()?.data.read())
    }

    /// After an insert into directory `dir` failed: if the directory
    /// moved out of its inode on the way (`draw`, the stored copy, is no
    /// longer inline), its cached inode and attributes follow the stored
    /// one, or its names would be read from a stale `i_block` and the
    /// next insert would move it out again, leaking the first block
    /// (review, stop 43). True when it moved. Called under the
    /// directory's lock: the VFS's attributes (whose lock ranks before
    /// it) are the caller's to update after it (`create_node` does; link
    /// and rename leave them to the directory's next change).
    pub(crate) fn keep_moved_out(dir: &Inode, draw: &RawInode) -> bool {
        let Some(di) = dir.private::<Ext4Inode>() else {
            return false;
        };
        let old = di.raw();
        // Moved out of the inode, or made indexed (`dir_insert_grow`):
        // both stored before the insert that failed.
        let moved = (draw.flags & FL_INLINE_DATA == 0 && old.flags & FL_INLINE_DATA != 0)
            || (draw.flags & FL_INDEX != 0 && old.flags & FL_INDEX == 0);
        if moved {
            di.set_raw(draw.clone());
        }
        moved
    }

    /// `file_read_lock` once no collapse or insert of the file is under
    /// way (`Ext4Inode::reshaping`): while one is, the lock is let go and
    /// the reader waits for the VFS data lock, which the fallocate holds
    /// exclusive throughout (a caller that drives the filesystem without
    /// the VFS waits by yielding). No reader holds that lock then: the
    /// fallocate does.
    pub(crate) fn file_read_settled<'a>(
        &self,
        i: &'a Inode,
    ) -> Option<scalevfs_sync::ordered::RwLockReadGuard<'a, ()>> {
        loop {
            let g = self.file_read_lock(i);
            // Relaxed: read under the data lock shared (see the field).
            let busy = g.is_some()
                && i.private::<Ext4Inode>().is_some_and(|e| {
                    e.reshaping
                        .load(scalevfs_sync::primitive::Ordering::Relaxed)
                });
            if !busy {
                return g;
            }
            drop(g);
            i.wait_for_data_writers();
            std::thread::yield_now();
        }
    }

    /// A buffered write into `inode` that ran out of space at `at` (the
    /// write ending at `end`), as the kernel's `ext4_write_begin` fails:
    /// when the folio being written (`folio_end`) reaches past the size,
    /// it drops the file's blocks past the size
    /// (`ext4_truncate_failed_write`: blocks a fallocate with KEEP_SIZE
    /// put there go too) and, when that freed
    /// something, allocates again (`ext4_should_retry_alloc`). True: the
    /// caller writes again. A regular file not inline only; the caller
    /// holds the VFS data lock exclusive (a write).
    pub(crate) fn trim_failed_write(
        &self,
        inode: &Arc<Inode>,
        at: u64,
        end: u64,
    ) -> scalevfs::VfsResult<bool> {
        use scalevfs::Filesystem;
        let raw = Ext4::node(inode)?;
        if raw.flags & FL_INLINE_DATA != 0 || raw.file_type_bits() != libc::S_IFREG {
            return Ok(false);
        }
        if end.min(crate::extent_write::folio_end(at, end)) <= raw.size {
            return Ok(false);
        }
        self.truncate(inode, raw.size)?;
        Ok(Ext4::node(inode)?.blocks < raw.blocks)
    }

    /// Run `f`, a collapse or insert of `inode` that may take several
    /// handles, with its readers held off (`Ext4Inode::reshaping`), also
    /// when it fails or unwinds.
    pub(crate) fn reshaping<R>(&self, inode: &Inode, f: impl FnOnce() -> R) -> R {
        let Some(ei) = inode.private::<Ext4Inode>() else {
            return f();
        };
        let set = |on: bool| {
            let _g = ei.data.write();
            // Relaxed: under the data lock exclusive (see the field).
            ei.reshaping
                .store(on, scalevfs_sync::primitive::Ordering::Relaxed);
        };
        struct Clear<F: Fn(bool)>(F);
        impl<F: Fn(bool)> Drop for Clear<F> {
            fn drop(&mut self) {
                (self.0)(false);
            }
        }
        set(true);
        let _clear = Clear(set);
        f()
    }

    /// Where inode `ino` lies: its inode table block, the slot's offset
    /// in it, the slot's size.
    pub(crate) fn inode_slot(&self, ino: u32) -> Result<(u64, usize, usize)> {
        let ipg = self.sb.inodes_per_group;
        let g = (ino.wrapping_sub(1) / ipg) as usize;
        let idx = (ino.wrapping_sub(1) % ipg) as usize;
        let isz = self.sb.inode_size();
        let off = idx * isz;
        let gd = self
            .groups
            .get(g)
            .filter(|_| ino != 0)
            .ok_or_else(|| corrupt(format!("inode {ino}"), "group out of range"))?;
        Ok((gd.inode_table + (off / self.bs) as u64, off % self.bs, isz))
    }

    /// Write `raw` into its inode table slot (through the cache). `new`:
    /// the slot is a fresh inode (zeroed, `i_extra_isize` set, crtime).
    pub(crate) fn write_inode(&self, raw: &RawInode, new: bool) -> Result<()> {
        let (rw, io) = self.rw()?;
        let (blk, inb, isz) = self.inode_slot(raw.ino)?;
        let sb = &self.sb;
        // An inode on the orphan list is encoded with its chain link.
        self.with_orphan_link(raw, |raw| {
            rw.bufs.modify(io.dev, blk, true, |b| {
                let slot = &mut b[inb..inb + isz];
                let crtime = new.then(|| {
                    slot.fill(0);
                    if isz > 128 {
                        // The kernel's s_want_extra_isize for new inodes.
                        let e = want_extra_isize(isz) as u16;
                        slot[0x80..0x82].copy_from_slice(&e.to_le_bytes());
                    }
                    raw.ctime
                });
                if !new {
                    grow_extra_isize(slot, raw.ino);
                }
                raw.encode(sb, slot, crtime);
            })?;
            Ok(())
        })
    }

    /// Directory `di` (inode `ino`) gained or lost a name at time `t`
    /// under its shared lock: its mtime and ctime become `t`
    /// (`advance_times`).
    fn advance_dir_times(&self, di: &Ext4Inode, ino: u32, t: (i64, i64)) -> Result<()> {
        self.advance_times(di, ino, t, true)
    }

    /// Set inode `ino`'s ctime (with `mtime`, its mtime too) to `t`, in
    /// memory and in its inode table slot, touching no other field: the
    /// slot is decoded, stamped and encoded inside one atomic change of
    /// the cached block, so the slot's other fields stay as whoever owns
    /// them left them (a rename changes only the moved inode's ctime and
    /// takes no lock of that inode, whose size or extents a write may be
    /// changing). `t` is stored as is, as Linux stamps the current time
    /// even over a later one (a directory whose mtime was set in the
    /// future gets the time of the create). Two stamps racing (creates
    /// in one directory under its shared lock) both carry the current
    /// coarse clock tick, nearly always the same value; when they differ
    /// the memory copy and the slot may keep different ones of the two
    /// until the next change.
    fn advance_times(&self, ei: &Ext4Inode, ino: u32, t: (i64, i64), mtime: bool) -> Result<()> {
        let (rw, io) = self.rw()?;
        let (blk, inb, isz) = self.inode_slot(ino)?;
        ei.advance_times(t, mtime);
        let sb = &self.sb;
        let r = rw.bufs.modify(io.dev, blk, true, |b| {
            let slot = &mut b[inb..inb + isz];
            let mut r = RawInode::parse(sb, ino, slot)?;
            // Atomic with the stamp: the layout moves inside this change
            // (after the parse, which checks the old checksum; the encode
            // below stores the new one).
            grow_extra_isize(slot, ino);
            if mtime {
                r.mtime = t;
            }
            r.ctime = t;
            r.encode(sb, slot, None);
            Ok(())
        })?;
        self.check(r)
    }

    /// Give inode `ino`'s slot its full `i_extra_isize` now, if it is
    /// short (an inode written by an older kernel), in its own change of
    /// the slot (the parsed slot encoded again, nothing of the caller's
    /// copy). A path that reads the in-inode xattr area and writes it
    /// back later (inline data: `inline_write`, `uninline`,
    /// `inline_truncate`, `inline_dir_edit`) calls this first, under the
    /// inode's lock, as `xattr_change` does: otherwise a rename's or a
    /// create's time stamp of the inode, which takes none of its locks
    /// (`advance_times`), could grow the area in between, and the write
    /// back found the area moved and stopped all writing on the mount.
    /// Once full the area never moves again.
    pub(crate) fn settle_extra_isize(&self, ino: u32) -> Result<()> {
        let (rw, io) = self.rw()?;
        let (blk, inb, isz) = self.inode_slot(ino)?;
        if isz <= 128 {
            return Ok(());
        }
        let want = want_extra_isize(isz);
        let extra = |b: &[u8]| usize::from(u16::from_le_bytes([b[inb + 0x80], b[inb + 0x81]]));
        // A read first: the common case (a full area) dirties nothing.
        let mut b = BlockBuf::zeroed(self.bs);
        self.read_block(blk, &mut b)?;
        if extra(&b) >= want {
            return Ok(());
        }
        let sb = &self.sb;
        let r = rw.bufs.modify(io.dev, blk, true, |b| {
            if extra(b) >= want {
                return Ok(());
            }
            let slot = &mut b[inb..inb + isz];
            let r = RawInode::parse(sb, ino, slot)?;
            grow_extra_isize(slot, ino);
            r.encode(sb, slot, None);
            Ok(())
        })?;
        self.check(r)
    }

    /// The lock of a directory being removed (rmdir, or replaced by a
    /// rename) or moved to another parent (its `..` rewritten), taken with
    /// the parents' locks held: an emptied link count is set under it, so
    /// a chmod at the same moment cannot store the old count back, and
    /// `..` is rewritten in a layout no create in it is changing. Taken by
    /// trying, never waiting in the lock: its inode number may rank below
    /// a parent's, and whoever holds it (a lookup, listing, create or
    /// unlink in it, a setattr or xattr change of it) takes no other
    /// directory's lock meanwhile; the VFS keeps other cross-directory
    /// renames out (its rename mutex) and creates out of a directory it
    /// is removing. A steady stream of readers in it can delay the taker
    /// (a try is not a queued writer); it cannot deadlock. Its own class,
    /// `Class::Ext4DirRemoved` (try-lock only): what is taken under it is
    /// checked, and no holder of a directory's lock enters the handle gate
    /// or waits for the commit lock (both checked), which a taker spinning
    /// inside its handle would otherwise wait on.
    pub(crate) fn removed_dir_lock<'a>(
        ei: &'a Ext4Inode,
    ) -> scalevfs_sync::ordered::RwLockWriteGuard<'a, ()> {
        let mut spins = 0u32;
        loop {
            if let Some(g) = ei.dir_lock.try_write_as(Class::Ext4DirRemoved) {
                return g;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The lock that orders whole-copy changes of an inode (read its
    /// `raw`, change fields, store it back): a directory's lock for a
    /// directory (whose size, blocks and link count creates and removes
    /// change under it), the data lock for anything else (whose size and
    /// extents writes change under it). Without it a chmod of a directory
    /// beside a create in it stored an old size or link count, and a write
    /// beside the unlink of the file's last name stored its link count
    /// back (`tests/inode_update_races.rs`).
    pub(crate) fn inode_change_lock<'a>(
        &self,
        inode: &Inode,
        ei: &'a Ext4Inode,
    ) -> scalevfs_sync::ordered::RwLockWriteGuard<'a, ()> {
        if inode.file_type() == FileType::Directory {
            ei.dir_lock.write_spin_as(Class::Ext4Dir, inode.ino())
        } else {
            ei.data.write()
        }
    }

    /// Append block `pblk` as logical block `lblk` of `raw` (an extent
    /// inode whose tree is the inode's own root, depth 0).
    pub(crate) fn extent_append(&self, raw: &mut RawInode, lblk: u32, pblk: u64) -> Result<()> {
        if raw.flags & FL_EXTENTS == 0 {
            return Err(errno(libc::EOPNOTSUPP));
        }
        let what = || format!("inode {}", raw.ino);
        let node = extent::parse_node(&raw.block, &what, None, None, self.sb.blocks_count)?;
        self.check_node_not_meta(raw.ino, &node)?;
        let ExtNode::Leaf(_, mut ex) = node else {
            return Err(errno(libc::EOPNOTSUPP));
        };
        let full = ex.len() >= 4;
        match ex.last_mut() {
            Some(e)
                if !e.uninit
                    && u64::from(e.block) + u64::from(e.len) == u64::from(lblk)
                    && e.start + u64::from(e.len) == pblk
                    && e.len < extent::INIT_MAX_LEN =>
            {
                e.len += 1
            }
            Some(e) if u64::from(e.block) + u64::from(e.len) > u64::from(lblk) => {
                return Err(corrupt(what(), "append inside the mapped range"));
            }
            _ if full => return Err(errno(libc::EOPNOTSUPP)),
            _ => ex.push(extent::Extent {
                block: lblk,
                len: 1,
                start: pblk,
                uninit: false,
            }),
        }
        put_extents(&mut raw.block, &ex);
        raw.blocks += self.bs as u64 / 512;
        Ok(())
    }

    /// Add `name` -> `ino` to directory `draw` (its lock held exclusive):
    /// the first leaf block with room, else a new block at the end.
    fn dir_insert(&self, draw: &mut RawInode, name: &[u8], ino: u32, ft: u8) -> Result<()> {
        self.dir_insert_grow(draw, name, ino, ft, true).map(|_| ())
    }

    /// `dir_insert`; without `grow` only into a block the directory has
    /// (no new block, no htree split, no conversion to an index): false
    /// when none has room. That much runs under the directory's lock
    /// held shared (`create_node`): the name goes in with one atomic
    /// change of one cached block, which concurrent inserts into the same
    /// block see (`BufCache::modify`), and the directory's shape (its
    /// size, its index) does not change.
    fn dir_insert_grow(
        &self,
        draw: &mut RawInode,
        name: &[u8],
        ino: u32,
        ft: u8,
        grow: bool,
    ) -> Result<bool> {
        let (rw, io) = self.rw()?;
        let ft = if self.sb.has_incompat(INCOMPAT_FILETYPE) {
            ft
        } else {
            0
        };
        if draw.flags & FL_INLINE_DATA != 0 {
            // Only under the exclusive lock (an inline directory's entries
            // live in its inode): into the inode while it has room, else
            // the directory moves out to a block first, as the kernel's.
            if !grow {
                return Ok(false);
            }
            if self.inline_dir_insert(draw, name, ino, ft)? {
                return Ok(true);
            }
            self.uninline_for_insert(draw)?;
            // Stored moved out: if the insert into the block fails, the
            // caller's copy must be the stored one (`keep_moved_out`).
            let stored = draw.clone();
            let r = self.dir_insert_grow(draw, name, ino, ft, grow);
            if r.is_err() {
                *draw = stored;
            }
            return r;
        }
        if self.is_htree(draw) {
            return self.htree_insert(draw, name, ino, ft, grow);
        }
        let seed = self.csum_seed(draw);
        let end = self.bs - if seed.is_some() { dir::TAIL_SIZE } else { 0 };
        let nblk = self.dir_blocks(draw)?;
        let mut buf = BlockBuf::zeroed(self.bs);
        let mut last = 0;
        for lblk in 0..nblk {
            let pblk = self.dir_pblk(draw, lblk)?;
            last = pblk;
            // Check the block (checksum, the entries up to the place) before
            // changing it; a block without room is left alone.
            let r = self.read_meta(pblk, &mut buf)?;
            if self.leaf_room(draw, lblk, &buf, &r, name.len())? != Some(true) {
                continue;
            }
            if self.insert_cached(pblk, name, ino, ft, seed)? {
                return Ok(true);
            }
        }
        if !grow {
            return Ok(false);
        }
        if nblk == 1 && self.sb.has_compat(COMPAT_DIR_INDEX) {
            // A full one-block directory becomes indexed, as the kernel's
            // make_indexed_dir, and is stored so at once: block 0 is an
            // index now. If the insert then fails (ENOSPC for the leaf's
            // split), the directory stays indexed with its one leaf, as
            // the kernel leaves it, and the caller's copy is the stored
            // one (`keep_moved_out`). Before, the caller dropped its copy
            // and the commit wrote block 0 as an index of a directory the
            // inode still called linear: every name was lost.
            self.make_indexed(draw, last)?;
            if let Err(e) = self.write_inode(draw, false) {
                return Err(self.stop_writes(e));
            }
            let stored = draw.clone();
            let r = self.htree_insert(draw, name, ino, ft, true);
            if r.is_err() {
                *draw = stored;
            }
            return r;
        }
        let pblk = self.dir_append_block(draw, last)?;
        rw.bufs.modify(io.dev, pblk, false, |b| {
            dir::init_block(b, seed.is_some());
            dir::insert(b, end, ino, name, ft);
            if let Some(s) = seed {
                dir::set_tail_csum(b, s);
            }
        })?;
        Ok(true)
    }

    /// Insert `name` -> `ino` into the cached leaf block `pblk` with one
    /// atomic change of the block (`dir::insert`; its tail checksum
    /// resealed): false, nothing changed, when no entry has room (an
    /// insert beside this one may have taken it).
    fn insert_cached(
        &self,
        pblk: u64,
        name: &[u8],
        ino: u32,
        ft: u8,
        seed: Option<u32>,
    ) -> Result<bool> {
        let (rw, io) = self.rw()?;
        let end = self.bs - if seed.is_some() { dir::TAIL_SIZE } else { 0 };
        Ok(rw.bufs.modify_sealed(io.dev, pblk, true, |b| {
            let ok = dir::insert(b, end, ino, name, ft);
            if let (true, Some(s)) = (ok, seed) {
                dir::set_tail_csum(b, s);
            }
            (ok, ok && seed.is_some())
        })?)
    }

    /// Add a block at the end of directory `draw` (`last`: its last
    /// physical block, the allocation goal); returns it. The caller fills it.
    fn dir_append_block(&self, draw: &mut RawInode, last: u64) -> Result<u64> {
        if draw.flags & FL_EXTENTS == 0 {
            // An ext3-style directory keeps its block map, as in the
            // kernel's ext4: the new block (and any indirect block it
            // needs) hooked into it.
            if !crate::fs::block_mapped(draw, self.bs, self.has_ea_inode()) {
                return Err(errno(libc::EOPNOTSUPP));
            }
            let nblk = self.dir_blocks(draw)?;
            let (new, _) = self.map_new_block(draw, u64::from(nblk), last + 1)?;
            draw.size += self.bs as u64;
            return Ok(new[new.len() - 1]);
        }
        let nblk = self.dir_blocks(draw)?;
        let pblk = self.alloc_block(last + 1)?;
        let grown = (|| -> Result<()> {
            let (mut ex, tree) = self.collect_extents(draw)?;
            // The block past the size must be a hole (a size short of
            // the mapped blocks would otherwise get an overlapping extent).
            let at = u64::from(nblk);
            if ex
                .iter()
                .any(|e| u64::from(e.block) <= at && at < u64::from(e.block) + u64::from(e.len))
            {
                return Err(corrupt(
                    format!("directory inode {}", draw.ino),
                    format!("block {nblk} past its size is mapped"),
                ));
            }
            crate::extent_write::insert_extent(
                &mut ex,
                extent::Extent {
                    block: nblk,
                    len: 1,
                    start: pblk,
                    uninit: false,
                },
            );
            let mut r = draw.clone();
            r.blocks += self.bs as u64 / 512;
            self.rebuild_tree(&mut r, &ex, &tree)?;
            *draw = r;
            Ok(())
        })();
        if let Err(e) = grown {
            self.free_block(pblk)?;
            return Err(e);
        }
        draw.size += self.bs as u64;
        Ok(pblk)
    }

    /// The hash of `name` in htree directory `draw` whose root block is
    /// `b0`, with the root's info and entries.
    fn dx_root(
        &self,
        draw: &RawInode,
        b0: &[u8],
        name: &[u8],
    ) -> Result<(u32, usize, htree::DxEntries, u8, u8)> {
        let what = || format!("directory {} htree root", draw.ino);
        let max = if self.sb.has_incompat(INCOMPAT_LARGEDIR) {
            htree::MAX_LEVELS_LARGEDIR
        } else {
            htree::MAX_LEVELS
        };
        let info = htree::parse_root_info(b0, max, &what)?;
        let mut version = info.hash_version;
        if version <= htree::HASH_TEA && self.sb.flags & FLAG_UNSIGNED_HASH != 0 {
            version += 3;
        }
        let hash = htree::dirhash(name, version, &self.sb.hash_seed)
            .ok_or_else(|| corrupt(what(), format!("hash version {version}")))?;
        let count_off = htree::ROOT_INFO_OFF + usize::from(info.info_length);
        let root = htree::parse_entries(b0, count_off, self.csum_seed(draw), &what)?;
        Ok((hash, count_off, root, version, info.indirect_levels))
    }

    /// Turn the one-block linear directory `draw` (block at `pblk0`) into
    /// an indexed one: block 0 becomes the dx_root, the entries move to a
    /// new leaf block 1.
    fn make_indexed(&self, draw: &mut RawInode, pblk0: u64) -> Result<()> {
        let mut b0 = BlockBuf::zeroed(self.bs);
        self.read_block(pblk0, &mut b0)?;
        let v = self
            .leaf_entries(draw, 0, &b0)?
            .ok_or_else(|| errno(libc::EOPNOTSUPP))?;
        let parent = v
            .iter()
            .find(|e| e.name == b"..")
            .map(|e| e.inode)
            .ok_or_else(|| corrupt(format!("directory {}", draw.ino), "no .."))?;
        let moved: Vec<(u32, Vec<u8>, u8)> = v
            .iter()
            .filter(|e| e.inode != 0 && e.name != b"." && e.name != b"..")
            .map(|e| (e.inode, e.name.to_vec(), e.file_type))
            .collect();
        let pblk1 = self.dir_append_block(draw, pblk0)?;
        // From here the change is under way: a failure (an I/O error in
        // the cache) stops writing rather than leave block 1 allocated
        // and unmapped, or block 0 half rewritten.
        self.make_indexed_rest(draw, pblk0, pblk1, &moved, parent)
            .map_err(|e| self.stop_writes(e))
    }

    /// `make_indexed` once block 1 is added: the entries go there, block
    /// 0 becomes the dx_root.
    fn make_indexed_rest(
        &self,
        draw: &mut RawInode,
        pblk0: u64,
        pblk1: u64,
        moved: &[(u32, Vec<u8>, u8)],
        parent: u32,
    ) -> Result<()> {
        let (rw, io) = self.rw()?;
        let seed = self.csum_seed(draw);
        let end = self.bs - if seed.is_some() { dir::TAIL_SIZE } else { 0 };
        rw.bufs.modify(io.dev, pblk1, false, |b| {
            dir::init_block(b, seed.is_some());
            for (i, n, t) in moved {
                dir::insert(b, end, *i, n, *t);
            }
            if let Some(s) = seed {
                dir::set_tail_csum(b, s);
            }
        })?;
        let bs = self.bs;
        let hv = self.sb.def_hash_version;
        let ino = draw.ino;
        let ft = self.dot_ft();
        rw.bufs.modify(io.dev, pblk0, true, |b| {
            b.fill(0);
            dir::init_block(b, false);
            dir::insert(b, bs, ino, b".", ft);
            dir::insert(b, bs, parent, b"..", ft);
            // dx_root_info: reserved, hash version, info length, levels.
            let ri = htree::ROOT_INFO_OFF;
            b[ri..ri + 8].fill(0);
            b[ri + 4] = hv;
            b[ri + 5] = 8;
            let count_off = ri + 8;
            let limit = htree::limit_for(bs, count_off, seed.is_some());
            htree::encode_entries(b, count_off, limit, &[(0, 1)], seed);
        })?;
        draw.flags |= FL_INDEX;
        Ok(())
    }

    /// Insert into an htree directory: the leaf chosen by the hash (through
    /// the root and the index levels below it), split by hash when full.
    /// A full index node splits in two, its parent taking the new half; a
    /// full root moves its entries into a new index node, one level more
    /// (up to 2 index levels below the root with large_dir, else 1; past
    /// that the index is full: ENOSPC, as the kernel's ext4_dx_add_entry).
    /// Every block the change needs is added to the directory before any
    /// index or leaf block is rewritten, so an allocation failure leaves
    /// the index as it was.
    fn htree_insert(
        &self,
        draw: &mut RawInode,
        name: &[u8],
        ino: u32,
        ft: u8,
        grow: bool,
    ) -> Result<bool> {
        let (rw, io) = self.rw()?;
        let seed = self.csum_seed(draw);
        let dino = draw.ino;
        let what = || format!("directory {dino} htree");
        let bs = self.bs;
        let mut b0 = BlockBuf::zeroed(bs);
        self.dir_block(draw, 0, &mut b0)?;
        let (hash, count_off, root, version, levels) = self.dx_root(draw, &b0, name)?;
        let max_levels = if self.sb.has_incompat(INCOMPAT_LARGEDIR) {
            htree::MAX_LEVELS_LARGEDIR
        } else {
            htree::MAX_LEVELS
        };
        let pick = |e: &[(u32, u32)]| e.partition_point(|x| x.0 <= hash).max(1) - 1;
        // The index path, root first: (logical block, count offset, limit,
        // entries, chosen entry).
        type Frame = (u32, usize, u16, Vec<(u32, u32)>, usize);
        let mut path: Vec<Frame> = Vec::new();
        // The limits are what this block size gives (the kernel's dx_probe
        // checks them too): a split halves a full block, so a smaller
        // limit, on a damaged image, could leave an empty one.
        let node_limit = htree::limit_for(bs, htree::NODE_COUNT_OFF, seed.is_some());
        if root.limit != htree::limit_for(bs, count_off, seed.is_some()) {
            return Err(corrupt(what(), format!("root limit {}", root.limit)));
        }
        let at = pick(&root.entries);
        path.push((0, count_off, root.limit, root.entries.clone(), at));
        let mut buf = BlockBuf::zeroed(bs);
        // `levels` < max_levels (checked by dx_root): at most 2 nodes.
        while path.len() <= usize::from(levels) {
            let child = {
                let f = &path[path.len() - 1];
                f.3[f.4].1
            };
            let node = self.dx_node(draw, child, &mut buf)?;
            if node.limit != node_limit {
                return Err(corrupt(
                    what(),
                    format!("node {child} limit {}", node.limit),
                ));
            }
            if path.iter().any(|f| f.0 == child) {
                return Err(corrupt(what(), format!("node {child} in its own path")));
            }
            let at = pick(&node.entries);
            path.push((child, htree::NODE_COUNT_OFF, node.limit, node.entries, at));
        }
        let nblk = self.dir_blocks(draw)?;
        let leaf = {
            let f = &path[path.len() - 1];
            f.3[f.4].1
        };
        if leaf == 0 || leaf >= nblk {
            return Err(corrupt(what(), format!("leaf block {leaf}")));
        }
        let pblk = self.dir_pblk(draw, leaf)?;
        let r = self.read_meta(pblk, &mut buf)?;
        let room = self
            .leaf_room(draw, leaf, &buf, &r, name.len())?
            .ok_or_else(|| corrupt(what(), format!("leaf {leaf} is an index block")))?;
        let end = bs - if seed.is_some() { dir::TAIL_SIZE } else { 0 };
        if room && self.insert_cached(pblk, name, ino, ft, seed)? {
            return Ok(true);
        }
        if !grow {
            return Ok(false);
        }
        // The split works on the whole leaf, checked and decoded as it is
        // now (read again after an insert that did not fit).
        let r = if room {
            self.read_meta(pblk, &mut buf)?
        } else {
            r
        };
        let v = self
            .leaf_entries_at(draw, leaf, &buf, Some(&r))?
            .ok_or_else(|| corrupt(what(), format!("leaf {leaf} is an index block")))?;
        // Split the leaf by hash, the new name among its entries: the upper
        // part moves to a new block (see `htree::split_point`; a run of one
        // hash may be cut, the new leaf's index entry then carries the
        // continuation bit).
        let mut ents: Vec<(u32, u32, Vec<u8>, u8)> = Vec::with_capacity(v.len() + 1);
        ents.push((hash, ino, name.to_vec(), ft));
        for e in v.iter().filter(|e| e.inode != 0) {
            let h = htree::dirhash(e.name, version, &self.sb.hash_seed)
                .ok_or_else(|| corrupt(what(), "hash"))?;
            ents.push((h, e.inode, e.name.to_vec(), e.file_type));
        }
        // Stable: the new name stays first among those of its hash.
        ents.sort_by_key(|e| e.0);
        let sized: Vec<(u32, usize)> = ents
            .iter()
            .map(|e| (e.0, dir::rec_len_needed(e.2.len())))
            .collect();
        let (split, split_hash) = htree::split_point(&sized, end)
            .ok_or_else(|| corrupt(what(), format!("leaf {leaf} has no split that fits")))?;
        // The new leaf's index entry goes into the lowest index block with
        // room; every full one below it splits (top down, each split
        // giving its parent one entry). With none, the root moves down.
        let full = |f: &Frame| f.3.len() >= usize::from(f.2);
        let mut k = path.len() - 1;
        while k > 0 && full(&path[k]) {
            k -= 1;
        }
        let add_level = full(&path[k]);
        if add_level && levels + 1 >= max_levels {
            // The kernel's "Directory index full": no block was added yet.
            return Err(errno(libc::ENOSPC));
        }
        // Frames (indices after a new level is inserted at 1) to split.
        let first_split = if add_level { 2 } else { k + 1 };
        let splits = path.len() + usize::from(add_level) - first_split;
        // Add every block first: (logical, physical). Each starts as an
        // empty leaf until it is written below.
        let mut added: Vec<(u32, u64)> = Vec::with_capacity(splits + 2);
        let before = draw.clone();
        for _ in 0..1 + splits + usize::from(add_level) {
            let step = (|| -> Result<(u32, u64)> {
                let p = self.dir_append_block(draw, self.dir_last_pblk(draw)?)?;
                let l = self.dir_blocks(draw)? - 1;
                rw.bufs.modify(io.dev, p, false, |b| {
                    dir::init_block(b, seed.is_some());
                    if let Some(s) = seed {
                        dir::set_tail_csum(b, s);
                    }
                })?;
                Ok((l, p))
            })();
            match step {
                Ok(a) => added.push(a),
                // Nothing added yet: nothing to undo (`dir_append_block`
                // gives back its own block).
                Err(e) if added.is_empty() => return Err(e),
                // Blocks added to the caller's copy only, its extents in
                // the inode before and after: the copy goes back and the
                // blocks with it, the index untouched.
                Err(e) if extent_depth(&before) == Some(0) && extent_depth(draw) == Some(0) => {
                    *draw = before;
                    for (_, p) in added {
                        self.free_block(p)?;
                    }
                    return Err(e);
                }
                // Tree blocks may have been rewritten for the added ones:
                // stop writing rather than commit half of it.
                Err(e) => return Err(self.stop_writes(e)),
            }
        }
        // The blocks are in the directory: a failure from here on (a
        // block that cannot be read back, the index or the leaf half
        // rewritten) stops writes, so that a half-split index never
        // commits (review, stop 48).
        let r = (|| -> Result<bool> {
            let mut added = added.into_iter();
            let mut next_block = || added.next().ok_or_else(|| corrupt(what(), "block plan"));
            let encode_node = |p: u64, coff: usize, lim: u16, e: &[(u32, u32)]| {
                rw.bufs.modify(io.dev, p, false, |b| {
                    // The fake entry spanning the block that hides the index.
                    b.fill(0);
                    b[4..6].copy_from_slice(&(bs as u16).to_le_bytes());
                    htree::encode_entries(b, coff, lim, e, seed)
                })
            };
            let new_levels = levels + u8::from(add_level);
            if add_level {
                // The root is full: its entries move to a new index node.
                let (nl, np) = next_block()?;
                encode_node(np, htree::NODE_COUNT_OFF, node_limit, &[])?;
                let old = std::mem::replace(&mut path[0].3, vec![(0, nl)]);
                let at = std::mem::replace(&mut path[0].4, 0);
                path.insert(1, (nl, htree::NODE_COUNT_OFF, node_limit, old, at));
            }
            for j in first_split..path.len() {
                // A full index node splits; its parent (with room now) gets
                // the upper half. The half off the path is written here, the
                // one on it with the rest of the path below.
                let (nl, np) = next_block()?;
                let (ol, coff, lim, entries, at) = std::mem::take(&mut path[j]);
                let half = entries.len() / 2;
                let (lower, upper) = (entries[..half].to_vec(), entries[half..].to_vec());
                let pa = path[j - 1].4;
                path[j - 1].3.insert(pa + 1, (upper[0].0, nl));
                if at >= half {
                    path[j - 1].4 = pa + 1;
                    encode_node(self.dir_pblk(draw, ol)?, coff, lim, &lower)?;
                    path[j] = (nl, coff, lim, upper, at - half);
                } else {
                    encode_node(np, coff, lim, &upper)?;
                    path[j] = (ol, coff, lim, lower, at);
                }
            }
            let (newl, newp) = next_block()?;
            // Every entry fits (split_point checked the sizes); `fitted` stays
            // true unless that arithmetic and dir::insert disagree.
            let mut fitted = true;
            let mut fill = |b: &mut [u8], part: &[(u32, u32, Vec<u8>, u8)]| {
                dir::init_block(b, seed.is_some());
                for (_, i, n, t) in part {
                    fitted &= dir::insert(b, end, *i, n, *t);
                }
                if let Some(s) = seed {
                    dir::set_tail_csum(b, s);
                }
            };
            let (lo, hi) = ents.split_at(split);
            rw.bufs.modify(io.dev, pblk, true, |b| fill(b, lo))?;
            rw.bufs.modify(io.dev, newp, false, |b| fill(b, hi))?;
            let f = path.len() - 1;
            let at = path[f].4;
            path[f].3.insert(at + 1, (split_hash, newl));
            for (l, coff, lim, e, _) in &path {
                let p = self.dir_pblk(draw, *l)?;
                if *l == 0 {
                    rw.bufs.modify(io.dev, p, true, |b| {
                        b[htree::ROOT_INFO_OFF + 6] = new_levels;
                        htree::encode_entries(b, *coff, *lim, e, seed)
                    })?;
                } else {
                    encode_node(p, *coff, *lim, e)?;
                }
            }
            if !fitted {
                return Err(corrupt(what(), "no room after a leaf split"));
            }
            Ok(true)
        })();
        r.map_err(|e| self.stop_writes(e))
    }

    /// The physical block of directory block `lblk`.
    fn dir_pblk(&self, draw: &RawInode, lblk: u32) -> Result<u64> {
        match self.map_block(draw, lblk)? {
            Mapping::Data {
                pblk,
                uninit: false,
                ..
            } => Ok(pblk),
            _ => Err(corrupt(
                format!("directory {}", draw.ino),
                format!("block {lblk} unmapped"),
            )),
        }
    }

    /// The physical block of the directory's last block (allocation goal).
    fn dir_last_pblk(&self, draw: &RawInode) -> Result<u64> {
        let n = self.dir_blocks(draw)?;
        self.dir_pblk(draw, n.saturating_sub(1))
    }

    /// `create` of the VFS: a new inode named `name` in `dir`.
    pub(crate) fn create_node(
        &self,
        dir: &Arc<Inode>,
        name: &[u8],
        node: NewNode<'_>,
        owner: (u32, u32),
    ) -> Result<Arc<Inode>> {
        self.rw()?;
        if name.len() > 255 {
            return Err(errno(libc::ENAMETOOLONG));
        }
        let di = dir.private::<Ext4Inode>().ok_or_else(|| errno(libc::EIO))?;
        // The new inode is allocated and written before the directory's
        // lock is taken: nothing can reach it until its name is in the
        // directory, and the one handle (the caller's) keeps all of it in
        // one transaction. Only the name's insertion (and the parent's
        // link count and times) is serialised per directory, so threads
        // creating in one directory overlap the rest.
        let pino = dir.ino() as u32;
        let (mode, is_dir) = match node {
            NewNode::Node { mode, .. } => (mode, false),
            NewNode::Dir { mode } => (libc::S_IFDIR | (mode & 0o7777), true),
            NewNode::Symlink { .. } => (libc::S_IFLNK | 0o777, false),
        };
        // Without dir_nlink a directory's link count cannot pass the limit;
        // with it the count sticks at 1 past it (as ext4_inc_count).
        // Checked before allocating (without the lock: a cheap early
        // refusal) and again under the lock (the count that counts).
        let too_many_links =
            |links: u16| is_dir && !self.sb.has_ro_compat(RO_COMPAT_DIR_NLINK) && links >= LINK_MAX;
        if too_many_links(di.raw().links_count) {
            return Err(errno(libc::EMLINK));
        }
        let ipg = self.sb.inodes_per_group;
        // Orlov-lite: a directory goes to the thread's group (spreading
        // trees), anything else next to its parent.
        let group = (!is_dir).then_some(((pino - 1) / ipg) as usize);
        let ino = self.alloc_inode(group, is_dir)?;
        let t = now();
        let mut raw = self.new_raw(ino, mode, owner, t);
        let csum_seed = raw.csum_seed;
        let mut data_block = None;
        let r = (|| -> Result<()> {
            match node {
                NewNode::Node { mode, rdev } => match mode & libc::S_IFMT {
                    libc::S_IFREG => self.new_map(&mut raw),
                    libc::S_IFCHR | libc::S_IFBLK => encode_rdev(&mut raw.block, rdev),
                    _ => {}
                },
                NewNode::Symlink { target } if target.len() < I_BLOCK_LEN => {
                    raw.block[..target.len()].copy_from_slice(target);
                    raw.size = target.len() as u64;
                }
                NewNode::Symlink { target } => {
                    if target.len() >= self.bs {
                        return Err(errno(libc::ENAMETOOLONG));
                    }
                    let pblk = self.alloc_block(0)?;
                    data_block = Some(pblk);
                    self.new_map(&mut raw);
                    self.map_first(&mut raw, pblk)?;
                    let (rw, io) = self.rw()?;
                    rw.bufs.modify(io.dev, pblk, false, |b| {
                        b[..target.len()].copy_from_slice(target)
                    })?;
                    raw.size = target.len() as u64;
                }
                NewNode::Dir { .. } if self.new_inodes_inline() => {
                    Self::init_inline_dir(&mut raw, pino);
                    raw.links_count = 2;
                    self.write_inode(&raw, true)?;
                    return self.add_inline_attr(&mut raw);
                }
                NewNode::Dir { .. } => {
                    let pblk = self.alloc_block(0)?;
                    data_block = Some(pblk);
                    self.new_map(&mut raw);
                    self.map_first(&mut raw, pblk)?;
                    let tail = self.sb.has_metadata_csum();
                    let ft = self.dot_ft();
                    let (rw, io) = self.rw()?;
                    rw.bufs.modify(io.dev, pblk, false, |b| {
                        dir::init_dir_block(b, ino, pino, tail, ft);
                        if tail {
                            dir::set_tail_csum(b, csum_seed);
                        }
                    })?;
                    raw.size = self.bs as u64;
                    raw.links_count = 2;
                }
            }
            self.write_inode(&raw, true)
        })();
        // Not a directory (the parent's link count stays) and a block of
        // the directory has room: the name goes in under the directory's
        // lock held shared, beside other such creates (`dir_insert_grow`).
        let mut r = r;
        if r.is_ok() && !is_dir {
            let shared = di.dir_lock.read_spin_as(Class::Ext4Dir, dir.ino());
            let mut draw = di.raw();
            match self.dir_insert_grow(&mut draw, name, ino, ft_code(mode), false) {
                Ok(true) => {
                    let r = self.advance_dir_times(di, pino, t);
                    drop(shared);
                    r?;
                    dir.update_attr(|a| {
                        let r = di.raw();
                        (a.mtime_sec, a.mtime_nsec) = r.mtime;
                        (a.ctime_sec, a.ctime_nsec) = r.ctime;
                    });
                    return self.born(ino, mode);
                }
                Ok(false) => {}
                Err(e) => r = Err(e),
            }
        }
        // The exclusive path: a new block, a split, a link count.
        let dl = r
            .is_ok()
            .then(|| di.dir_lock.write_spin_as(Class::Ext4Dir, dir.ino()));
        let mut draw = di.raw();
        let r = r.and_then(|()| {
            if too_many_links(draw.links_count) {
                return Err(errno(libc::EMLINK));
            }
            self.dir_insert(&mut draw, name, ino, ft_code(mode))
        });
        if let Err(e) = r {
            let moved = Self::keep_moved_out(dir, &draw);
            drop(dl);
            if moved {
                dir.update_attr(|a| {
                    a.size = draw.size;
                    a.blocks = draw.blocks;
                });
            }
            // Undo the allocations, unless writing has stopped (a failed
            // commit or check: nothing more reaches the image). A corrupt
            // directory block found on the way (a bad leaf checksum) stops
            // nothing, so its create is undone too: it left an allocated
            // inode with one link and no name (review, stop 47).
            if !self.writes_stopped() {
                if let Some(b) = data_block {
                    let _ = self.free_block(b);
                }
                // The inode may be written already (links 1): it goes back
                // as a deleted one (no links, dtime set, nothing mapped),
                // or e2fsck finds an unattached inode the bitmap calls free.
                raw.links_count = 0;
                raw.dtime = now().0 as u32;
                raw.size = 0;
                raw.blocks = 0;
                if raw.flags & FL_EXTENTS != 0 {
                    raw.block = empty_extent_root();
                } else if crate::fs::block_mapped(&raw, self.bs, self.has_ea_inode()) {
                    raw.block = [0; I_BLOCK_LEN];
                }
                let _ = self.write_inode(&raw, false);
                let _ = self.free_inode(ino, is_dir);
            }
            return Err(e);
        }
        if is_dir {
            draw.links_count = match draw.links_count {
                1 => 1,
                n => link_up(n),
            };
        }
        draw.mtime = t;
        draw.ctime = t;
        // The name is in place (and maybe a new block): the directory's
        // inode must follow, or writes stop (review, stop 48).
        self.write_inode(&draw, false)
            .map_err(|e| self.stop_writes(e))?;
        di.set_raw(draw);
        drop(dl);
        // The attribute writer lock ranks above the directory's: copy the
        // inode inside it, so the last writer always installs the newest.
        dir.update_attr(|a| {
            let r = di.raw();
            a.nlink = u32::from(r.links_count);
            a.size = r.size;
            a.blocks = r.blocks;
            (a.mtime_sec, a.mtime_nsec) = r.mtime;
            (a.ctime_sec, a.ctime_nsec) = r.ctime;
        });
        self.born(ino, mode)
    }

    /// The inode `create_node` made: a regular file on an image whose new
    /// inodes can hold inline data may keep its data inline, as the
    /// kernel's new inodes (`EXT4_STATE_MAY_INLINE_DATA`).
    fn born(&self, ino: u32, mode: u32) -> Result<Arc<Inode>> {
        let i = self.iget(ino)?;
        if mode & libc::S_IFMT == libc::S_IFREG && self.new_inodes_inline() {
            if let Some(ei) = i.private::<Ext4Inode>() {
                // Relaxed: see `Ext4Inode::may_inline`.
                ei.may_inline
                    .store(true, scalevfs_sync::primitive::Ordering::Relaxed);
            }
        }
        Ok(i)
    }

    /// A new inode `ino` (mode with its type bits, owner, all times `t`,
    /// one link, nothing mapped), its generation and checksum seed derived
    /// from its number and `t`.
    /// A new inode's empty map: an extent root, or on an image without
    /// the extent feature (ext2/3) an empty block map, as the kernel's
    /// ext4_new_inode chooses.
    fn new_map(&self, raw: &mut RawInode) {
        if self.sb.has_incompat(INCOMPAT_EXTENTS) {
            raw.flags = FL_EXTENTS;
            raw.block = empty_extent_root();
        } else {
            raw.block = [0; I_BLOCK_LEN];
        }
    }

    /// Map block 0 of a new directory or slow symlink (`new_map`) at
    /// `pblk`; `i_blocks` counts it.
    fn map_first(&self, raw: &mut RawInode, pblk: u64) -> Result<()> {
        if raw.flags & FL_EXTENTS != 0 {
            return self.extent_append(raw, 0, pblk);
        }
        // A block map holds 32-bit pointers.
        let p = u32::try_from(pblk).map_err(|_| errno(libc::ENOSPC))?;
        raw.block[..4].copy_from_slice(&p.to_le_bytes());
        raw.blocks += self.bs as u64 / 512;
        Ok(())
    }

    fn new_raw(&self, ino: u32, mode: u32, owner: (u32, u32), t: (i64, i64)) -> RawInode {
        let generation = new_generation();
        let le = |v: u32| v.to_le_bytes();
        let csum_seed = crate::format::checksum::crc32c(
            crate::format::checksum::crc32c(self.sb.csum_seed(), &le(ino)),
            &le(generation),
        );
        RawInode {
            ino,
            mode: mode as u16,
            uid: owner.0,
            gid: owner.1,
            size: 0,
            links_count: 1,
            blocks: 0,
            flags: 0,
            block: [0; I_BLOCK_LEN],
            generation,
            file_acl: 0,
            atime: t,
            ctime: t,
            mtime: t,
            // Written by the first encode where the inode has room
            // (`i_extra_isize` of a new inode: 32 bytes, past the field).
            crtime: (self.sb.inode_size() >= 160).then_some(t),
            dtime: 0,
            csum_seed,
            ibody_xattrs: false,
        }
    }

    /// O_TMPFILE (the kernel's `ext4_tmpfile`): a regular file with no
    /// name, in the caller's handle: allocated near `dir`, written, then
    /// given up as its last name would be (`forget_inode`: a link count of
    /// 0, an orphan record in the same handle, freed when the VFS lets it
    /// go), so a crash before then cannot leak it. `add_link` can give it
    /// a name later (linkat of a file opened without O_EXCL).
    pub(crate) fn create_unnamed(
        &self,
        dir: &Arc<Inode>,
        perm: u32,
        owner: (u32, u32),
    ) -> Result<Arc<Inode>> {
        self.rw()?;
        let pino = dir.ino() as u32;
        let group = ((pino - 1) / self.sb.inodes_per_group) as usize;
        let ino = self.alloc_inode(Some(group), false)?;
        // Written with one link, so that `iget` takes it (it refuses a
        // free inode); the count drops to 0 below, in this handle.
        let mut raw = self.new_raw(ino, libc::S_IFREG | (perm & 0o7777), owner, now());
        self.new_map(&mut raw);
        if let Err(e) = self.write_inode(&raw, true) {
            if !e.is_corrupt() {
                let _ = self.free_inode(ino, false);
            }
            return Err(e);
        }
        let inode = self.iget(ino)?;
        let ei = inode
            .private::<Ext4Inode>()
            .ok_or_else(|| errno(libc::EIO))?;
        raw.links_count = 0;
        self.write_inode(&raw, false)?;
        ei.set_raw(raw);
        inode.update_attr(|a| a.nlink = 0);
        self.forget_inode(&inode)?;
        Ok(inode)
    }

    /// `setattr` of the VFS: mode, owner, times; a size change only where
    /// no block needs freeing (growing, or a file without blocks).
    /// chattr flags: the `FS_*_FL` bits the core keeps (the same bits in
    /// ext4's `i_flags`) replace those in the inode; the others (extents,
    /// htree index, huge file, ...) stay. The ctime goes with them.
    pub(crate) fn set_chattr_flags(
        &self,
        inode: &Arc<Inode>,
        flags: u32,
        ctime: (i64, i64),
    ) -> Result<()> {
        use scalevfs::inode::FS_FL_SETTABLE;
        self.rw()?;
        let ei = inode
            .private::<Ext4Inode>()
            .ok_or_else(|| errno(libc::EIO))?;
        let _g = self.inode_change_lock(inode, ei);
        let mut raw = ei.raw();
        raw.flags = (raw.flags & !FS_FL_SETTABLE) | (flags & FS_FL_SETTABLE);
        raw.ctime = ctime;
        self.write_inode(&raw, false)?;
        ei.set_raw(raw);
        Ok(())
    }

    /// setattr of everything but the size, in the caller's handle (the
    /// size goes first, through the truncate's own handles: `Ext4::setattr`).
    pub(crate) fn set_attr(&self, inode: &Arc<Inode>, set: &SetAttr) -> Result<()> {
        self.rw()?;
        let ei = inode
            .private::<Ext4Inode>()
            .ok_or_else(|| errno(libc::EIO))?;
        let g = self.inode_change_lock(inode, ei);
        let mut raw = ei.raw();
        if let Some(m) = set.mode {
            raw.mode = ((u32::from(raw.mode) & libc::S_IFMT) | (m & 0o7777)) as u16;
        }
        if let Some(u) = set.uid {
            raw.uid = u;
        }
        if let Some(g) = set.gid {
            raw.gid = g;
        }
        if let Some(t) = set.atime {
            raw.atime = (t.sec, t.nsec);
        }
        if let Some(t) = set.mtime {
            raw.mtime = (t.sec, t.nsec);
        }
        if let Some(t) = set.ctime {
            raw.ctime = (t.sec, t.nsec);
        }
        self.write_inode(&raw, false)?;
        ei.set_raw(raw);
        drop(g);
        inode.update_attr(|a| scalevfs::fstype::apply_setattr(a, set));
        Ok(())
    }

    /// Find the live entry `name` in directory `draw`: (physical block,
    /// offset, previous entry's offset in the block).
    fn dir_find(
        &self,
        draw: &RawInode,
        name: &[u8],
    ) -> Result<Option<(u64, usize, Option<usize>)>> {
        if draw.flags & FL_INLINE_DATA != 0 {
            // Its entries have no block (callers handle inline directories
            // themselves or move them out first).
            return Err(corrupt(
                format!("inline directory {}", draw.ino),
                "searched as a block directory",
            ));
        }
        // An indexed directory: only the leaves the name's hash selects.
        if self.is_htree(draw) {
            return self.htree_search(draw, name, &mut |lblk, b, r| {
                Ok(self
                    .entry_in_block(draw, lblk, b, Some(r), name)?
                    .map(|(e, prev)| (r.pblk, e.offset, prev)))
            });
        }
        let mut buf = BlockBuf::zeroed(self.bs);
        for lblk in 0..self.dir_blocks(draw)? {
            let pblk = self.dir_pblk(draw, lblk)?;
            let r = self.read_meta(pblk, &mut buf)?;
            if let Some((e, prev)) = self.entry_in_block(draw, lblk, &buf, Some(&r), name)? {
                return Ok(Some((pblk, e.offset, prev)));
            }
        }
        Ok(None)
    }

    /// Whether directory `raw` holds nothing but `.` and `..`.
    fn dir_is_empty(&self, raw: &RawInode) -> Result<bool> {
        let mut empty = true;
        self.list(raw, &mut |_, n| {
            if n != b"." && n != b".." {
                empty = false;
            }
            empty
        })?;
        Ok(empty)
    }

    /// `unlink` and `rmdir` of the VFS. The inode's storage is freed when
    /// its last name goes and nothing uses it any more (at the next sync
    /// or at unmount).
    pub(crate) fn remove_name(
        &self,
        dir: &Arc<Inode>,
        name: &[u8],
        inode: &Arc<Inode>,
        is_dir: bool,
    ) -> Result<()> {
        let (rw, io) = self.rw()?;
        let di = dir.private::<Ext4Inode>().ok_or_else(|| errno(libc::EIO))?;
        let ii = inode
            .private::<Ext4Inode>()
            .ok_or_else(|| errno(libc::EIO))?;
        // A file's only name goes under the directory's lock held shared
        // (the directory keeps its shape: the entry leaves its block in
        // one atomic change, found afresh there by `dir::remove_named`,
        // and the times move forward as `advance_dir_times` moves them).
        // With one name no other unlink of the inode runs beside this one
        // (the VFS locks the name; a link into this directory takes the
        // lock exclusive). Anything else takes the exclusive path.
        if !is_dir {
            let shared = di.dir_lock.read_spin_as(Class::Ext4Dir, dir.ino());
            let vg = ii.data.write();
            let mut iraw = ii.raw();
            let draw = di.raw();
            if iraw.links_count == 1 && draw.flags & FL_INLINE_DATA == 0 {
                let Some((pblk, _, _)) = self.dir_find(&draw, name)? else {
                    return Err(errno(libc::ENOENT));
                };
                let seed = self.csum_seed(&draw);
                let end = self.bs - if seed.is_some() { dir::TAIL_SIZE } else { 0 };
                let done = rw.bufs.modify_sealed(io.dev, pblk, true, |b| {
                    let ok = dir::remove_named(b, end, name);
                    if let (true, Some(s)) = (ok, seed) {
                        dir::set_tail_csum(b, s);
                    }
                    (ok, ok && seed.is_some())
                })?;
                if done {
                    let t = now();
                    iraw.links_count = 0;
                    iraw.ctime = t;
                    // The name is gone: a failure now stops writes rather
                    // than commit an inode with a link count and no name
                    // (review, stop 47).
                    (|| -> Result<()> {
                        self.write_inode(&iraw, false)?;
                        ii.set_raw(iraw);
                        self.forget_inode(inode)?;
                        self.advance_dir_times(di, dir.ino() as u32, t)
                    })()
                    .map_err(|e| self.stop_writes(e))?;
                    drop(vg);
                    drop(shared);
                    dir.update_attr(|a| {
                        let r = di.raw();
                        (a.mtime_sec, a.mtime_nsec) = r.mtime;
                        (a.ctime_sec, a.ctime_nsec) = r.ctime;
                    });
                    inode.update_attr(|a| {
                        let r = ii.raw();
                        a.nlink = u32::from(r.links_count);
                        (a.ctime_sec, a.ctime_nsec) = r.ctime;
                    });
                    return Ok(());
                }
            }
        }
        let dl = di.dir_lock.write_spin_as(Class::Ext4Dir, dir.ino());
        // The victim's own lock for its link count.
        let vg = if is_dir {
            Self::removed_dir_lock(ii)
        } else {
            ii.data.write()
        };
        let mut draw = di.raw();
        let mut iraw = ii.raw();
        if is_dir && !self.dir_is_empty(&iraw)? {
            return Err(errno(libc::ENOTEMPTY));
        }
        self.remove_entry(&mut draw, name)?;
        let t = now();
        iraw.links_count = if is_dir {
            0
        } else {
            iraw.links_count.saturating_sub(1)
        };
        iraw.ctime = t;
        if is_dir && draw.links_count > 2 {
            draw.links_count -= 1;
        }
        draw.mtime = t;
        draw.ctime = t;
        // The name is gone (see above).
        (|| -> Result<()> {
            self.write_inode(&draw, false)?;
            di.set_raw(draw);
            self.write_inode(&iraw, false)?;
            let gone = iraw.links_count == 0;
            ii.set_raw(iraw);
            if gone {
                self.forget_inode(inode)?;
            }
            Ok(())
        })()
        .map_err(|e| self.stop_writes(e))?;
        drop(vg);
        drop(dl);
        dir.update_attr(|a| {
            let r = di.raw();
            a.nlink = u32::from(r.links_count);
            (a.mtime_sec, a.mtime_nsec) = r.mtime;
            (a.ctime_sec, a.ctime_nsec) = r.ctime;
        });
        inode.update_attr(|a| {
            let r = ii.raw();
            a.nlink = u32::from(r.links_count);
            (a.ctime_sec, a.ctime_nsec) = r.ctime;
        });
        Ok(())
    }

    /// `link` of the VFS.
    pub(crate) fn add_link(&self, dir: &Arc<Inode>, name: &[u8], inode: &Arc<Inode>) -> Result<()> {
        self.rw()?;
        if name.len() > 255 {
            return Err(errno(libc::ENAMETOOLONG));
        }
        let di = dir.private::<Ext4Inode>().ok_or_else(|| errno(libc::EIO))?;
        let ii = inode
            .private::<Ext4Inode>()
            .ok_or_else(|| errno(libc::EIO))?;
        let dl = di.dir_lock.write_spin_as(Class::Ext4Dir, dir.ino());
        // Never a directory: the file's own lock for its link count.
        let vg = ii.data.write();
        let mut iraw = ii.raw();
        // A file without links gets a name only as an O_TMPFILE file the
        // VFS lets be linked (I_LINKABLE): it leaves the orphans (its
        // record and the list of inodes to free), in this handle. One whose
        // last name went since the VFS looked is on its way to being freed.
        let revived = if iraw.links_count == 0 {
            let (rw, _) = self.rw()?;
            let mut l = rw.unlinked.shard(u64::from(iraw.ino)).lock();
            let Some(k) = l.iter().position(|(i, _, _)| *i == iraw.ino) else {
                return Err(errno(libc::ENOENT));
            };
            Some(l.swap_remove(k))
        } else {
            None
        };
        if iraw.links_count >= LINK_MAX {
            return Err(errno(libc::EMLINK));
        }
        let mut draw = di.raw();
        let inserted = self.dir_insert(&mut draw, name, iraw.ino, ft_code(u32::from(iraw.mode)));
        if let Err(e) = inserted {
            let _ = Self::keep_moved_out(dir, &draw);
            if let (Some(entry), Ok((rw, _))) = (revived, self.rw()) {
                // Still nameless: back on the list of inodes to free.
                rw.unlinked.shard(u64::from(iraw.ino)).lock().push(entry);
            }
            return Err(e);
        }
        // The name is in place: a failure now stops writes rather than
        // commit a name on an inode whose orphan record stays (the next
        // mount would free it under the name) or whose count is one short
        // (review, stop 47).
        (|| -> Result<()> {
            if let Some((_, _, slot)) = revived {
                self.orphan_remove_live(slot, &mut iraw)?;
                self.icache_put(inode);
            }
            let t = now();
            draw.mtime = t;
            draw.ctime = t;
            self.write_inode(&draw, false)?;
            di.set_raw(draw);
            iraw.links_count += 1;
            iraw.ctime = t;
            self.write_inode(&iraw, false)?;
            ii.set_raw(iraw);
            Ok(())
        })()
        .map_err(|e| self.stop_writes(e))?;
        drop(vg);
        drop(dl);
        dir.update_attr(|a| {
            let r = di.raw();
            a.size = r.size;
            a.blocks = r.blocks;
            (a.mtime_sec, a.mtime_nsec) = r.mtime;
            (a.ctime_sec, a.ctime_nsec) = r.ctime;
        });
        inode.update_attr(|a| {
            let r = ii.raw();
            a.nlink = u32::from(r.links_count);
            (a.ctime_sec, a.ctime_nsec) = r.ctime;
        });
        Ok(())
    }

    /// Point the live entry at `off` of directory block `pblk` (of
    /// directory `draw`) at `ino` with type `ft`.
    fn dir_retarget(&self, draw: &RawInode, pblk: u64, off: usize, ino: u32, ft: u8) -> Result<()> {
        let (rw, io) = self.rw()?;
        let seed = self.csum_seed(draw);
        let ft = if self.sb.has_incompat(INCOMPAT_FILETYPE) {
            ft
        } else {
            0
        };
        rw.bufs.modify(io.dev, pblk, true, |b| {
            dir::retarget(b, off, ino, ft);
            if let Some(s) = seed {
                dir::set_tail_csum(b, s);
            }
        })?;
        Ok(())
    }

    /// Whether directory `draw` has a live entry `name` (its lock held).
    fn dir_has(&self, draw: &RawInode, name: &[u8]) -> Result<bool> {
        if draw.flags & FL_INLINE_DATA != 0 {
            return Ok(self.inline_dir(draw)?.1.iter().any(|e| e.name == name));
        }
        Ok(self.dir_find(draw, name)?.is_some())
    }

    /// Point entry `name` of directory `draw` (its lock held exclusive)
    /// at `ino` (file type `ft`): in its block, or in the inode of an
    /// inline directory (`draw` changes; the caller writes it).
    fn retarget_named(&self, draw: &mut RawInode, name: &[u8], ino: u32, ft: u8) -> Result<()> {
        if draw.flags & FL_INLINE_DATA != 0 {
            let ft = if self.sb.has_incompat(INCOMPAT_FILETYPE) {
                ft
            } else {
                0
            };
            return match self.inline_dir_retarget(draw, name, ino, ft)? {
                true => Ok(()),
                false => Err(errno(libc::ENOENT)),
            };
        }
        let (pblk, off, _) = self
            .dir_find(draw, name)?
            .ok_or_else(|| errno(libc::ENOENT))?;
        self.dir_retarget(draw, pblk, off, ino, ft)
    }

    /// Remove entry `name` from directory `draw` (its lock held
    /// exclusive): from its block, or from the inode of an inline
    /// directory (`draw` changes; the caller writes it).
    fn remove_entry(&self, draw: &mut RawInode, name: &[u8]) -> Result<()> {
        if draw.flags & FL_INLINE_DATA != 0 {
            return match self.inline_dir_remove(draw, name)? {
                true => Ok(()),
                false => Err(errno(libc::ENOENT)),
            };
        }
        let (rw, io) = self.rw()?;
        let (pblk, off, prev) = self
            .dir_find(draw, name)?
            .ok_or_else(|| errno(libc::ENOENT))?;
        let seed = self.csum_seed(draw);
        rw.bufs.modify_sealed(io.dev, pblk, true, |b| {
            dir::remove(b, off, prev);
            if let Some(s) = seed {
                dir::set_tail_csum(b, s);
            }
            ((), seed.is_some())
        })?;
        Ok(())
    }

    /// Point the `..` of directory `mi`, which moved, at `parent`: under
    /// its own lock, its layout read afresh (a create in it may split its
    /// index, make it indexed or move it out of its inode meanwhile).
    fn move_dotdot(&self, mi: &Ext4Inode, parent: u32) -> Result<()> {
        let _xg = Self::removed_dir_lock(mi);
        let mut m = mi.raw();
        if m.flags & FL_INLINE_DATA != 0 {
            Self::set_inline_dotdot(&mut m, parent);
            self.write_inode(&m, false)?;
            mi.set_raw(m);
            return Ok(());
        }
        self.set_dotdot(&m, parent)
    }

    /// `rename` of the VFS (not `exchange`), linear directories.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rename_entry(
        &self,
        old_dir: &Arc<Inode>,
        old_name: &[u8],
        new_dir: &Arc<Inode>,
        new_name: &[u8],
        moved: &Arc<Inode>,
        replaced: Option<&Arc<Inode>>,
    ) -> Result<()> {
        self.rw()?;
        if new_name.len() > 255 {
            return Err(errno(libc::ENAMETOOLONG));
        }
        let (od, nd, mi) = (priv_of(old_dir)?, priv_of(new_dir)?, priv_of(moved)?);
        let same = Arc::ptr_eq(old_dir, new_dir);
        // Both directories' locks, lower inode number first.
        let (l1, l2);
        if same {
            l1 = od.dir_lock.write_as(Class::Ext4Dir, old_dir.ino());
            l2 = None;
        } else if old_dir.ino() < new_dir.ino() {
            l1 = od.dir_lock.write_as(Class::Ext4Dir, old_dir.ino());
            l2 = Some(nd.dir_lock.write_as(Class::Ext4Dir, new_dir.ino()));
        } else {
            l1 = nd.dir_lock.write_as(Class::Ext4Dir, new_dir.ino());
            l2 = Some(od.dir_lock.write_as(Class::Ext4Dir, old_dir.ino()));
        }
        let mut odraw = od.raw();
        let mraw = mi.raw();
        let moved_dir = mraw.file_type_bits() == libc::S_IFDIR;
        // The replaced inode's own lock for its link count.
        let rg = match replaced {
            Some(r) if r.file_type() == FileType::Directory => {
                Some(Self::removed_dir_lock(priv_of(r)?))
            }
            Some(r) => Some(priv_of(r)?.data.write()),
            None => None,
        };
        let mut rraw = match replaced {
            Some(r) => {
                let rr = priv_of(r)?.raw();
                if rr.file_type_bits() == libc::S_IFDIR && !self.dir_is_empty(&rr)? {
                    return Err(errno(libc::ENOTEMPTY));
                }
                Some(rr)
            }
            None => None,
        };
        if !self.dir_has(&odraw, old_name)? {
            return Err(errno(libc::ENOENT));
        }
        // A directory moving to a parent at the link limit, without
        // dir_nlink: EMLINK before anything changes (as the kernel's
        // ext4_rename; only when it replaces nothing).
        if moved_dir
            && !same
            && rraw.is_none()
            && !self.sb.has_ro_compat(RO_COMPAT_DIR_NLINK)
            && nd.raw().links_count >= LINK_MAX
        {
            return Err(errno(libc::EMLINK));
        }
        let ft = ft_code(u32::from(mraw.mode));
        let t = now();
        // The new name first (so a failure leaves the old one), then the
        // old name goes.
        if let Some(rr) = &rraw {
            let mut ndraw = if same { odraw.clone() } else { nd.raw() };
            if !self.dir_has(&ndraw, new_name)? {
                return Err(errno(libc::ENOENT));
            }
            if rr.ino == mraw.ino {
                // Two names of one inode: POSIX says do nothing.
                return Ok(());
            }
            self.retarget_named(&mut ndraw, new_name, mraw.ino, ft)?;
            if same {
                odraw = ndraw;
            } else if ndraw.flags & FL_INLINE_DATA != 0 {
                // The entry is in the inode: written now, read back below.
                self.write_inode(&ndraw, false)?;
                nd.set_raw(ndraw);
            }
        } else if same {
            if let Err(e) = self.dir_insert(&mut odraw, new_name, mraw.ino, ft) {
                let _ = Self::keep_moved_out(old_dir, &odraw);
                return Err(e);
            }
        } else {
            let mut ndraw = nd.raw();
            if let Err(e) = self.dir_insert(&mut ndraw, new_name, mraw.ino, ft) {
                let _ = Self::keep_moved_out(new_dir, &ndraw);
                return Err(e);
            }
            self.write_inode(&ndraw, false)
                .map_err(|e| self.stop_writes(e))?;
            nd.set_raw(ndraw);
        }
        // The new name is in place: from here a failure (an I/O error,
        // a damaged block met on the way) stops writes rather than
        // commit both names on one link, or a moved directory's ".."
        // half moved (review, stop 47).
        (|| -> Result<()> {
            // Found afresh: an insert into the same directory may have split
            // its block or moved it out of its inode.
            self.remove_entry(&mut odraw, old_name)?;
            let mut ndraw = if same { None } else { Some(nd.raw()) };
            if moved_dir && !same {
                self.move_dotdot(mi, new_dir.ino() as u32)?;
                if odraw.links_count > 2 {
                    odraw.links_count -= 1;
                }
                if let Some(n) = ndraw.as_mut() {
                    if rraw.is_none() && n.links_count != 1 {
                        n.links_count = link_up(n.links_count);
                    }
                }
            }
            if let Some(rr) = rraw.as_mut() {
                let rdir = rr.file_type_bits() == libc::S_IFDIR;
                rr.links_count = if rdir {
                    0
                } else {
                    rr.links_count.saturating_sub(1)
                };
                rr.ctime = t;
                if rdir && same && odraw.links_count > 2 {
                    // The replaced directory's ".." link goes.
                    odraw.links_count -= 1;
                }
                if rdir && !same {
                    if let Some(n) = ndraw.as_mut() {
                        if n.links_count > 2 && !moved_dir {
                            n.links_count -= 1;
                        }
                    }
                }
                self.write_inode(rr, false)?;
            }
            // Only the moved inode's ctime changes: a stamp of that one field, so a
            // write changing its size or extents meanwhile keeps them.
            self.advance_times(mi, mraw.ino, t, false)?;
            odraw.mtime = t;
            odraw.ctime = t;
            self.write_inode(&odraw, false)?;
            od.set_raw(odraw);
            if let Some(mut n) = ndraw {
                n.mtime = t;
                n.ctime = t;
                self.write_inode(&n, false)?;
                nd.set_raw(n);
            }
            if let (Some(r), Some(rr)) = (replaced, rraw) {
                let ri = priv_of(r)?;
                let gone = rr.links_count == 0;
                ri.set_raw(rr);
                if gone {
                    self.forget_inode(r)?;
                }
            }
            Ok(())
        })()
        .map_err(|e| self.stop_writes(e))?;
        drop(rg);
        drop(l2);
        drop(l1);
        for (i, e) in [(old_dir, od), (new_dir, nd), (moved, mi)] {
            i.update_attr(|a| {
                let r = e.raw();
                a.nlink = u32::from(r.links_count);
                a.size = r.size;
                a.blocks = r.blocks;
                (a.mtime_sec, a.mtime_nsec) = r.mtime;
                (a.ctime_sec, a.ctime_nsec) = r.ctime;
            });
        }
        if let Some(r) = replaced {
            let ri = priv_of(r)?;
            r.update_attr(|a| {
                let x = ri.raw();
                a.nlink = u32::from(x.links_count);
                (a.ctime_sec, a.ctime_nsec) = x.ctime;
            });
        }
        Ok(())
    }

    /// Point a moved directory's ".." at `parent`.
    fn set_dotdot(&self, raw: &RawInode, parent: u32) -> Result<()> {
        if self.is_htree(raw) {
            // ".." lives in the dx_root (entry 1 at byte 12), under the
            // index checksum, which is recomputed.
            let (rw, io) = self.rw()?;
            let mut b0 = BlockBuf::zeroed(self.bs);
            self.dir_block(raw, 0, &mut b0)?;
            let (_, count_off, root, _, _) = self.dx_root(raw, &b0, b"..")?;
            let seed = self.csum_seed(raw);
            let p0 = self.dir_pblk(raw, 0)?;
            rw.bufs.modify(io.dev, p0, true, |b| {
                b[12..16].copy_from_slice(&parent.to_le_bytes());
                htree::encode_entries(b, count_off, root.limit, &root.entries, seed);
            })?;
            return Ok(());
        }
        let pblk = self.dir_pblk(raw, 0)?;
        let mut buf = BlockBuf::zeroed(self.bs);
        self.read_block(pblk, &mut buf)?;
        let v = self
            .leaf_entries(raw, 0, &buf)?
            .ok_or_else(|| errno(libc::EOPNOTSUPP))?;
        let dd = v
            .iter()
            .find(|e| e.name == b"..")
            .map(|e| e.offset)
            .ok_or_else(|| corrupt(format!("directory {}", raw.ino), "no .."))?;
        self.dir_retarget(raw, pblk, dd, parent, dir::FT_DIR)
    }

    /// RENAME_EXCHANGE: the two names swap inodes.
    pub(crate) fn exchange_entries(
        &self,
        old_dir: &Arc<Inode>,
        old_name: &[u8],
        new_dir: &Arc<Inode>,
        new_name: &[u8],
        a: &Arc<Inode>,
        b: &Arc<Inode>,
    ) -> Result<()> {
        self.rw()?;
        let (od, nd, ai, bi) = (
            priv_of(old_dir)?,
            priv_of(new_dir)?,
            priv_of(a)?,
            priv_of(b)?,
        );
        let same = Arc::ptr_eq(old_dir, new_dir);
        let (l1, l2);
        if same {
            l1 = od.dir_lock.write_as(Class::Ext4Dir, old_dir.ino());
            l2 = None;
        } else if old_dir.ino() < new_dir.ino() {
            l1 = od.dir_lock.write_as(Class::Ext4Dir, old_dir.ino());
            l2 = Some(nd.dir_lock.write_as(Class::Ext4Dir, new_dir.ino()));
        } else {
            l1 = nd.dir_lock.write_as(Class::Ext4Dir, new_dir.ino());
            l2 = Some(od.dir_lock.write_as(Class::Ext4Dir, old_dir.ino()));
        }
        let mut odraw = od.raw();
        let mut ndraw = if same { odraw.clone() } else { nd.raw() };
        let (araw, braw) = (ai.raw(), bi.raw());
        let adir = araw.file_type_bits() == libc::S_IFDIR;
        let bdir = braw.file_type_bits() == libc::S_IFDIR;
        if !self.dir_has(&odraw, old_name)? || !self.dir_has(&ndraw, new_name)? {
            return Err(errno(libc::ENOENT));
        }
        // A directory moving one way and not the other gives its new
        // parent a link: at the limit without dir_nlink, EMLINK before
        // anything changes (as the kernel's ext4_cross_rename).
        if !same && adir != bdir && !self.sb.has_ro_compat(RO_COMPAT_DIR_NLINK) {
            let gaining = if adir { &ndraw } else { &odraw };
            if gaining.links_count >= LINK_MAX {
                return Err(errno(libc::EMLINK));
            }
        }
        self.retarget_named(
            &mut odraw,
            old_name,
            braw.ino,
            ft_code(u32::from(braw.mode)),
        )?;
        // The first entry changed: a failure from here on stops writes,
        // as in rename, so that half an exchange (one name swapped, a
        // `..` or a link count not) never commits (review, stop 48).
        let r = (|| -> Result<()> {
            // One directory: both entries in `odraw` (the one written).
            let nd_raw = if same { &mut odraw } else { &mut ndraw };
            self.retarget_named(nd_raw, new_name, araw.ino, ft_code(u32::from(araw.mode)))?;
            let t = now();
            if !same {
                if adir {
                    self.move_dotdot(ai, ndraw.ino)?;
                }
                if bdir {
                    self.move_dotdot(bi, odraw.ino)?;
                }
                // A directory moving one way and not the other moves a link.
                let bump = |r: &mut RawInode, up: bool| {
                    if r.links_count == 1 {
                        return;
                    }
                    if up {
                        r.links_count = link_up(r.links_count);
                    } else if r.links_count > 2 {
                        r.links_count -= 1;
                    }
                };
                if adir && !bdir {
                    bump(&mut odraw, false);
                    bump(&mut ndraw, true);
                } else if bdir && !adir {
                    bump(&mut ndraw, false);
                    bump(&mut odraw, true);
                }
            }
            // Only their ctimes change: stamps of that field (see rename).
            self.advance_times(ai, araw.ino, t, false)?;
            self.advance_times(bi, braw.ino, t, false)?;
            odraw.mtime = t;
            odraw.ctime = t;
            self.write_inode(&odraw, false)?;
            od.set_raw(odraw);
            if !same {
                ndraw.mtime = t;
                ndraw.ctime = t;
                self.write_inode(&ndraw, false)?;
                nd.set_raw(ndraw);
            }
            Ok(())
        })();
        r.map_err(|e| self.stop_writes(e))?;
        drop(l2);
        drop(l1);
        for (i, e) in [(old_dir, od), (new_dir, nd), (a, ai), (b, bi)] {
            i.update_attr(|x| {
                let r = e.raw();
                x.nlink = u32::from(r.links_count);
                (x.mtime_sec, x.mtime_nsec) = r.mtime;
                (x.ctime_sec, x.ctime_nsec) = r.ctime;
            });
        }
        Ok(())
    }
}

/// The depth of `raw`'s extent tree (0: the extents are in the inode),
/// None for a block-mapped or inline inode.
fn extent_depth(raw: &RawInode) -> Option<u16> {
    (raw.flags & FL_EXTENTS != 0 && raw.flags & FL_INLINE_DATA == 0)
        .then(|| u16::from_le_bytes([raw.block[6], raw.block[7]]))
}

/// A new inode's generation: random, as the kernel's ext4
/// (`get_random_u32`), so that a file handle of a removed file does not
/// open the next file given its number. It was a hash of the number and
/// the nanoseconds of the coarse clock, which repeat for a whole tick (4
/// ms on the host, thousands of creates): the inode allocator hands a
/// freed number straight back, so a file created in the same tick got
/// the old file's number and generation. Per thread (a splitmix64
/// sequence from a seed of std's per-process random hash keys): no shared
/// write on the create path (issue 16).
pub(crate) fn new_generation() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    thread_local! {
        static STATE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }
    STATE.with(|s| {
        let mut x = s.get();
        if x == 0 {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(s as *const _ as usize);
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            x = h.finish();
        }
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        s.set(x);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) as u32
    })
}
