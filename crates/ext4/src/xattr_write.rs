//! Extended attribute writes on a read-write mount: `setxattr` and
//! `removexattr` in the inode body and the xattr block (the encoders are
//! in `format/xattr.rs`), and the block's release when an inode goes.
//!
//! PLACEMENT (the kernel's `ext4_xattr_set_handle`)
//! - A value goes in the inode body if the body's entries with it fit;
//!   then a copy in the block goes. Otherwise it goes in the block (a new
//!   one if there is none) and a copy in the body goes. If it fits in
//!   neither: ENOSPC, and nothing changed.
//! - With `ea_inode` (`ea_inode.rs`): a value whose padded size is over
//!   block size - 56 is stored in a value inode of its own and only its
//!   entry goes in the body or the block (by the same rule); a smaller
//!   one that fits neither place is tried that way too; a plain value in
//!   the block must leave min(block size / 8, 1024) bytes below the
//!   values. A replaced or removed value's inode loses a user (freed at
//!   0), and so do those of a freed block.
//! - The block's entries are kept sorted (name index, name length, name),
//!   as the kernel's lookup expects; each carries its hash, the header the
//!   rolled hash of all and, with metadata_csum, the checksum.
//! - A block several inodes share (`h_refcount` > 1, made by mke2fs -d,
//!   e2fsck or the kernel's mbcache) is never changed in place: the
//!   changed copy goes to a new block and the old block's count drops by
//!   one. A block whose count would reach 0 is freed (through the
//!   journal's pending list, as every freed block) and `i_file_acl`
//!   cleared; `i_blocks` counts the block while the inode refers to it.
//! - Sharing (the kernel's mbcache): every block we write whose entries
//!   name no value inode and whose header hash is not 0 goes into
//!   `XattrBlockCache` (`xattr_cache.rs`) under that hash. A block about to be written (new,
//!   or this inode's own changed in place) whose twin is there (the same
//!   bytes but for count and checksum, count 1..1023) is not written: the
//!   twin's count goes up by one and this inode uses it (its own old block
//!   loses a user). So files given one attribute set, a default ACL for
//!   instance, share one block as the kernel's would. Blocks the kernel,
//!   mke2fs or e2fsck wrote are shared only once we have written them.
//!   The twin is checked and counted with its cache shard locked; the last
//!   user of a block sets its count to 0 under the buffer's lock, then
//!   drops its cache entry (waiting for a sharer looking at it), then frees
//!   it: a sharer never counts a block that is being freed, nor reads one
//!   already freed. A block changed in place loses its entry under its old
//!   contents at once (only the entry under its last contents would go
//!   when it is freed).
//! - Everything (block writes, allocation, freeing, the inode) runs in
//!   the caller's journal handle and goes through the buffer cache, so a
//!   commit carries all of a change or none of it. Failures that can
//!   happen (ENOSPC from the allocator) come before the first change.
//!
//! CHECKS (a corrupt image: EUCLEAN for that inode, logged, and nothing
//! written for it; the kernel's `ext4_xattr_check_block`,
//! `ext4_inode_block_valid` and `check_xattrs`)
//! - Every reader and writer gets an inode's attributes from
//!   [`Ext4::stored_xattrs`]: the body's and the block's tables pass the
//!   parser's checks (`format/xattr.rs`), and no entry names a value inode
//!   the image cannot have (none at all without `ea_inode`), before
//!   anything is followed, shown or changed.
//! - `i_file_acl` must name a block of the data area: past the first data
//!   block, before the end, and in no filesystem metadata (superblock and
//!   descriptor copies with the reserved descriptor blocks, bitmaps, inode
//!   tables, the journal: [`MetaZone`]). Else the block is not read as an
//!   xattr block and never written, counted down or freed: a setxattr or
//!   removexattr fails before its first change, and the release of an
//!   unlinked inode fails (the filesystem stops writing, so the part of
//!   that release already made never commits).
//!
//! LOCKING: the VFS serialises writers of one inode's attributes (its
//! data lock); the inode's `Ext4Inode::data` lock is held exclusive while
//! the body and the block change and shared by `getxattr`/`listxattr`, so
//! a reader never sees a value in both places or in neither. No new lock.

use std::sync::Arc;

use scalevfs::inode::Inode;

use crate::ea_inode;
use crate::error::{corrupt, Error, Result};
use crate::format::features::{COMPAT_HAS_JOURNAL, COMPAT_ORPHAN_FILE, COMPAT_RESIZE_INODE};
use crate::format::group_desc;
use crate::format::inode::{RawInode, GOOD_OLD_INODE_SIZE};
use crate::format::xattr::{self, RawEntry};
use crate::fs::{Ext4, Ext4Inode, Mapping};
use crate::meta_zone::MetaZone;
use crate::util::{errno, BlockBuf};

const XATTR_CREATE: u32 = 1;
const XATTR_REPLACE: u32 = 2;

/// The kernel's EXT4_XATTR_REFCOUNT_MAX: a block is shared by at most
/// this many inodes.
const REFCOUNT_MAX: u32 = 1024;

/// A block's header hash (`h_hash`).
fn header_hash(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[12], b[13], b[14], b[15]])
}

/// Whether two xattr blocks hold the same attributes: every byte but the
/// count (4..8) and the checksum (16..20).
fn same_block(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a[..4] == b[..4] && a[8..16] == b[8..16] && a[20..] == b[20..]
}

/// Where an inode's slot is: (inode table block, offset in it).
pub(crate) struct Slot {
    pub(crate) blk: u64,
    pub(crate) off: usize,
}

/// An inode's attributes as stored.
pub(crate) struct Stored {
    /// The in-inode area (offset in the slot, length); `None` without one.
    pub(crate) area: Option<(usize, usize)>,
    pub(crate) body: Vec<RawEntry>,
    /// The xattr block's refcount and entries (none: `i_file_acl` is 0).
    pub(crate) block: Option<(u32, Vec<RawEntry>)>,
}

fn same(e: &RawEntry, index: u8, name: &[u8]) -> bool {
    e.index == index && e.name == name
}

/// Corrupt xattr reports logged so far; past `LOG_MAX` they are not (an
/// image read in a loop must not flood the log; the errno still tells).
static LOGGED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
const LOG_MAX: usize = 100;

impl Ext4 {
    pub(crate) fn slot_of(&self, ino: u32) -> Result<Slot> {
        let ipg = self.sb.inodes_per_group;
        let g = ((ino - 1) / ipg) as usize;
        let gd = self
            .groups
            .get(g)
            .ok_or_else(|| corrupt(format!("inode {ino}"), "group out of range"))?;
        let off = ((ino - 1) % ipg) as usize * self.sb.inode_size();
        Ok(Slot {
            blk: gd.inode_table + (off / self.bs) as u64,
            off: off % self.bs,
        })
    }

    /// The in-inode attribute area of `raw`'s slot: its offset in the
    /// slot and the area's bytes (`None`: 128-byte inodes, `i_extra_isize`
    /// 0, or no room for the magic).
    pub(crate) fn ibody_area(&self, raw: &RawInode) -> Result<Option<(usize, Vec<u8>)>> {
        let Some((b, off, extra)) = self.read_slot(raw)? else {
            return Ok(None);
        };
        let isz = self.sb.inode_size();
        let slot = &b[off..off + isz];
        let start = GOOD_OLD_INODE_SIZE + extra;
        // RawInode::parse checked 128 + extra <= isz; the magic needs 4.
        // Without i_extra_isize the kernel neither reads nor writes a body.
        if extra == 0 || start + 4 > isz {
            return Ok(None);
        }
        Ok(Some((start, slot[start..].to_vec())))
    }

    /// Whether `raw`'s slot has an `i_extra_isize` below the 32 bytes
    /// (or the room the slot has) that `write_inode` grows it to.
    fn extra_isize_short(&self, raw: &RawInode) -> Result<bool> {
        Ok(self.read_slot(raw)?.is_some_and(|(_, _, extra)| {
            extra < crate::write::want_extra_isize(self.sb.inode_size())
        }))
    }

    /// The inode table block holding `raw`'s slot, the slot's offset in
    /// it and its `i_extra_isize` (`None`: 128-byte inodes, no extra part).
    fn read_slot(&self, raw: &RawInode) -> Result<Option<(BlockBuf, usize, usize)>> {
        let isz = self.sb.inode_size();
        if isz <= GOOD_OLD_INODE_SIZE {
            return Ok(None);
        }
        let s = self.slot_of(raw.ino)?;
        let mut b = BlockBuf::zeroed(self.bs);
        self.read_block(s.blk, &mut b)?;
        let extra = usize::from(u16::from_le_bytes([b[s.off + 0x80], b[s.off + 0x81]]));
        Ok(Some((b, s.off, extra)))
    }

    fn xattr_csum_seed(&self) -> Option<u32> {
        self.sb.has_metadata_csum().then(|| self.sb.csum_seed())
    }

    /// What this image lets an entry name as its value inode.
    pub(crate) fn value_inodes(&self) -> xattr::ValueInodes {
        xattr::ValueInodes {
            enabled: self.has_ea_inode(),
            first_ino: self.sb.first_ino(),
            inodes_count: self.sb.inodes_count,
        }
    }

    /// `r`, with a corruption it carries logged (up to `LOG_MAX` reports
    /// per process).
    fn logged<T>(r: Result<T>) -> Result<T> {
        if let Err(e @ Error::Corrupt { .. }) = &r {
            // Relaxed: a counter that only bounds the log.
            if LOGGED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < LOG_MAX {
                eprintln!("scalevfs-ext4: {e}");
            }
        }
        r
    }

    /// The filesystem's metadata blocks ([`MetaZone`]), built at the first
    /// call (a failure, a journal inode that cannot be mapped, is returned
    /// and the next call tries again).
    pub(crate) fn meta_zone(&self) -> Result<&MetaZone> {
        if let Some(z) = self.meta_zone.get() {
            return Ok(z);
        }
        let z = self.build_meta_zone(0)?;
        // Two first callers build the same zone; one is kept.
        Ok(self.meta_zone.get_or_init(move || z))
    }

    /// The zone, without the data blocks of inode `skip` (the orphan
    /// file's own check of its map: `load_orphan_file`; 0: none skipped).
    pub(crate) fn build_meta_zone(&self, skip: u32) -> Result<MetaZone> {
        /// The resize inode's number (EXT2_RESIZE_INO).
        const RESIZE_INO: u32 = 7;
        let sb = &self.sb;
        let first_data = u64::from(sb.first_data_block);
        let bpg = u64::from(sb.blocks_per_group);
        let itb = group_desc::inode_table_blocks(sb);
        // The boot block and the superblock's (the kernel's
        // `start_blk <= s_first_data_block`).
        let mut v = vec![(0, first_data + 1)];
        for (g, gd) in self.groups.iter().enumerate() {
            let g = g as u64;
            // `ext4_num_base_meta_blocks`: the superblock copy, the
            // descriptor blocks (of the whole table, or with meta_bg the
            // group's own meta group's) and the reserved ones.
            let mut base = sb.base_meta_blocks(g);
            // 1 KiB blocks with bigalloc: the superblock is in block 1 of
            // group 0, which starts at block 0 (`gdt_block`).
            if g == 0 && self.bs == 1024 && first_data == 0 {
                base += 1;
            }
            let start = first_data + g * bpg;
            v.push((start, start + base));
            v.push((gd.block_bitmap, gd.block_bitmap + 1));
            v.push((gd.inode_bitmap, gd.inode_bitmap + 1));
            v.push((gd.inode_table, gd.inode_table + itb));
        }
        if sb.has_compat(COMPAT_RESIZE_INODE) {
            // The resize inode's double indirect block (the blocks below
            // it are the reserved descriptor blocks, counted above).
            let r = self.read_inode(RESIZE_INO)?;
            let dind = u64::from(r.block_word(13));
            if dind != 0 {
                v.push((dind, dind + 1));
            }
        }
        // The journal's and the orphan file's data blocks
        // (`ext4_protect_reserved_inode`); each step covers a whole extent
        // or hole (at least one block).
        let own = [
            (sb.has_compat(COMPAT_HAS_JOURNAL), sb.journal_inum),
            (sb.has_compat(COMPAT_ORPHAN_FILE), sb.orphan_file_inum),
        ];
        for (_, ino) in own
            .into_iter()
            .filter(|&(on, ino)| on && ino != 0 && ino != skip)
        {
            let j = self.read_inode(ino)?;
            let n = j
                .size
                .div_ceil(self.bs as u64)
                .min(sb.blocks_count)
                .min(u64::from(u32::MAX));
            let mut l = 0u64;
            while l < n {
                let step = match self.map_block(&j, l as u32)? {
                    Mapping::Data { pblk, count, .. } => {
                        let count = count.clamp(1, n - l);
                        v.push((pblk, pblk.saturating_add(count)));
                        count
                    }
                    Mapping::Hole { count } => count.max(1),
                };
                l += step;
            }
        }
        Ok(MetaZone::new(v))
    }

    /// Whether `blk`, the xattr block `i_file_acl` of inode `ino` names,
    /// may be one: in the data area, in no metadata (module doc, CHECKS).
    fn check_xattr_block_no(&self, ino: u32, blk: u64) -> Result<()> {
        let what = || format!("inode {ino}");
        if blk <= u64::from(self.sb.first_data_block) || blk >= self.sb.blocks_count {
            return Err(corrupt(
                what(),
                format!("xattr block {blk} outside the data area"),
            ));
        }
        if self.meta_zone()?.contains(blk) {
            return Err(corrupt(
                what(),
                format!("xattr block {blk} is filesystem metadata"),
            ));
        }
        Ok(())
    }

    /// `raw`'s xattr block, checked (its number, header, checksum, table
    /// and value inodes): its count and entries; `None` when `i_file_acl`
    /// is 0.
    fn xattr_block(&self, raw: &RawInode) -> Result<Option<(u32, Vec<RawEntry>)>> {
        let blk = raw.file_acl;
        if blk == 0 {
            return Ok(None);
        }
        self.check_xattr_block_no(raw.ino, blk)?;
        let mut b = BlockBuf::zeroed(self.bs);
        self.read_block(blk, &mut b)?;
        let (count, entries) = xattr::parse_block_raw(&b, blk, self.xattr_csum_seed())?;
        xattr::check_value_inodes(&entries, self.value_inodes(), &|| {
            format!("xattr block {blk}")
        })?;
        Ok(Some((count, entries)))
    }

    /// The entries of `raw`'s in-inode area, checked (table and value
    /// inodes).
    pub(crate) fn ibody_entries(&self, ino: u32, area: &[u8]) -> Result<Vec<RawEntry>> {
        let body = xattr::parse_ibody_raw(area, ino)?;
        xattr::check_value_inodes(&body, self.value_inodes(), &|| {
            format!("inode {ino} in-inode xattrs")
        })?;
        Ok(body)
    }

    /// `raw`'s attributes as stored, all checked (module doc, CHECKS);
    /// a corruption is logged.
    pub(crate) fn stored_xattrs(&self, raw: &RawInode) -> Result<Stored> {
        Self::logged((|| {
            let (area, body) = match self.ibody_area(raw)? {
                Some((start, bytes)) => (
                    Some((start, bytes.len())),
                    self.ibody_entries(raw.ino, &bytes)?,
                ),
                None => (None, Vec::new()),
            };
            let block = self.xattr_block(raw)?;
            Ok(Stored { area, body, block })
        })())
    }

    /// `setxattr` (`value` Some) or `removexattr` (None) of the VFS, in the
    /// caller's handle. `flags`: XATTR_CREATE / XATTR_REPLACE.
    pub(crate) fn xattr_change(
        &self,
        inode: &Arc<Inode>,
        name: &[u8],
        value: Option<&[u8]>,
        flags: u32,
    ) -> Result<()> {
        self.rw()?;
        let (index, suffix) = xattr::writable_name(name).ok_or_else(|| errno(libc::EOPNOTSUPP))?;
        if suffix.len() > 255 {
            return Err(errno(libc::ERANGE));
        }
        // ACLs are stored in ext4's compact form; one without entries is
        // a removal (which then finds nothing to remove without error).
        let mut quiet_absent = false;
        let conv;
        let value = match (index, value) {
            (2 | 3, Some(v)) => {
                conv = xattr::acl_from_xattr(v).map_err(|()| errno(libc::EINVAL))?;
                quiet_absent = conv.is_none() && flags & XATTR_REPLACE == 0;
                conv.as_deref()
            }
            (_, v) => v,
        };
        if value.is_some_and(|v| v.len() > xattr::VALUE_MAX as usize) {
            return Err(errno(libc::E2BIG));
        }
        let ei = inode
            .private::<Ext4Inode>()
            .ok_or_else(|| errno(libc::EIO))?;
        let g = self.inode_change_lock(inode, ei);
        let mut raw = ei.raw();
        if self.extra_isize_short(&raw)? {
            // An inode of an older layout gets its full i_extra_isize
            // first (`write_inode` grows it), so that the area read below
            // is the one written back; its attributes are checked before
            // that write (nothing is written for a corrupt inode).
            self.check(self.stored_xattrs(&raw))?;
            self.write_inode(&raw, false)?;
        }
        let st = self.check(self.stored_xattrs(&raw))?;
        let in_body = st.body.iter().position(|e| same(e, index, suffix));
        let in_block = st
            .block
            .as_ref()
            .and_then(|(_, v)| v.iter().position(|e| same(e, index, suffix)));
        let found = in_body.is_some() || in_block.is_some();
        if found && flags & XATTR_CREATE != 0 {
            return Err(errno(libc::EEXIST));
        }
        if !found {
            if value.is_none() && quiet_absent {
                return Ok(());
            }
            if value.is_none() || flags & XATTR_REPLACE != 0 {
                return Err(errno(libc::ENODATA));
            }
        }
        let mut body = st.body.clone();
        let mut block = st
            .block
            .as_ref()
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        // A value inode made for this value (freed again if a later step
        // fails).
        let mut fresh = None;
        if let Some(v) = value {
            // The same value already stored: nothing to write (the kernel
            // bails out too; never for a value in a value inode).
            let old = in_body
                .map(|p| &st.body[p])
                .or_else(|| in_block.and_then(|p| st.block.as_ref().map(|(_, b)| &b[p])));
            if old.is_some_and(|e| e.inum == 0 && e.value == v) {
                return Ok(());
            }
            let ea = self.has_ea_inode();
            // With ea_inode, a large value goes to a value inode at once;
            // one that fits neither place as a plain value is tried there
            // next (`ext4_xattr_set_handle`'s retry).
            let large = ea && (v.len() + 3) & !3 > ea_inode::min_large_value(self.bs);
            let tries: &[bool] = if large {
                &[true]
            } else if ea && !v.is_empty() {
                &[false, true]
            } else {
                &[false]
            };
            let mut placed = None;
            for &in_inode in tries {
                let new = RawEntry {
                    index,
                    name: suffix.to_vec(),
                    value: if in_inode { Vec::new() } else { v.to_vec() },
                    // Its number and hash are set once it exists.
                    inum: if in_inode { u32::MAX } else { 0 },
                    inum_size: if in_inode { v.len() as u32 } else { 0 },
                    hash: 0,
                };
                // In the body if it fits there (in its place, or
                // appended, as the kernel's unsorted body), else in the
                // block.
                let mut b2 = body.clone();
                match in_body {
                    Some(p) => b2[p] = new.clone(),
                    None => b2.push(new.clone()),
                }
                if st
                    .area
                    .is_some_and(|(_, len)| xattr::table_len(&b2) + 4 <= len)
                {
                    let mut k2 = block.clone();
                    k2.retain(|e| !same(e, index, suffix));
                    placed = Some((in_inode, b2, k2));
                    break;
                }
                let mut k2 = block.clone();
                k2.retain(|e| !same(e, index, suffix));
                k2.push(new);
                xattr::sort_block_entries(&mut k2);
                let fits = xattr::BLOCK_HEADER_LEN + xattr::table_len(&k2) <= self.bs;
                // With ea_inode a plain value must leave room for entries
                // (EXT4_XATTR_BLOCK_RESERVE).
                let reserve_ok = !ea
                    || in_inode
                    || v.is_empty()
                    || self.bs.saturating_sub(xattr::values_len(&k2))
                        >= ea_inode::block_reserve(self.bs);
                if fits && reserve_ok {
                    let mut b2 = body.clone();
                    b2.retain(|e| !same(e, index, suffix));
                    placed = Some((in_inode, b2, k2));
                    break;
                }
            }
            let Some((in_inode, b2, k2)) = placed else {
                // Too large for the inode's room and a block whatever is
                // freed: no retry (`scalevfs::enospc_final`).
                scalevfs::enospc_final();
                return Err(errno(libc::ENOSPC));
            };
            body = b2;
            block = k2;
            if in_inode {
                let (ino, vhash) = self.value_inode_for(raw.ino, v)?;
                fresh = Some(ino);
                let hash = xattr::entry_hash(suffix, &vhash.to_le_bytes(), false);
                for e in body.iter_mut().chain(block.iter_mut()) {
                    if same(e, index, suffix) {
                        e.inum = ino;
                        e.hash = hash;
                    }
                }
                // The value inode the entry already named (the same value
                // set again, or one another name shares): the entry and
                // everything else are as stored, so the user just counted
                // is one too many (the kernel counts the new one up and
                // the old one down). Nothing else to write.
                let old_block = st.block.as_ref().map_or(&[][..], |(_, b)| &b[..]);
                if body == st.body && block == old_block {
                    return self.ea_inode_put(ino).map_err(|e| self.stop_writes(e));
                }
            }
        } else {
            body.retain(|e| !same(e, index, suffix));
            block.retain(|e| !same(e, index, suffix));
        }
        let r = self.store_xattrs(&mut raw, &st, &body, &block, fresh);
        if let Err(e) = r {
            // ENOSPC comes before anything changed (the encodings, the
            // block's allocation). Any other failure may come after part
            // of the change (a new block written, the old one's count
            // dropped): the filesystem stops writing, so that half of it
            // never commits.
            if e.errno() != scalevfs::Errno::ENOSPC {
                return Err(self.stop_writes(e));
            }
            if let Some(ino) = fresh {
                let _ = self.ea_inode_put(ino);
            }
            return Err(e);
        }
        ei.set_raw(raw.clone());
        drop(g);
        inode.update_attr(|a| a.blocks = raw.blocks);
        if value.is_some() {
            self.note_ext_attr();
        }
        Ok(())
    }

    /// Store `body` and `block` as `raw`'s attributes (were `st`): the
    /// block first (its allocation is the only step that can fail for
    /// want of space), then the value inodes no longer named lose a user,
    /// then the inode with its body, `i_file_acl` and `i_blocks` (which
    /// carries the value inodes' sizes). `fresh`: a value inode just made
    /// for this change (it has its user already).
    pub(crate) fn store_xattrs(
        &self,
        raw: &mut RawInode,
        st: &Stored,
        body: &[RawEntry],
        block: &[RawEntry],
        fresh: Option<u32>,
    ) -> Result<()> {
        let area = match st.area {
            Some((start, len)) if body != st.body.as_slice() => {
                let bytes = xattr::encode_ibody(body, len).ok_or_else(|| errno(libc::ENOSPC))?;
                Some((start, bytes))
            }
            _ => None,
        };
        let old_block = st.block.as_ref().map(|(_, v)| &v[..]);
        if old_block.map_or(!block.is_empty(), |o| o != block) {
            let refcount = st.block.as_ref().map_or(0, |(r, _)| *r);
            self.check(self.put_xattr_block(
                raw,
                refcount,
                old_block.unwrap_or(&[]),
                block,
                fresh,
            ))?;
        }
        for ino in ea_inode::lost(&ea_inode::inums(&st.body), &ea_inode::inums(body)) {
            self.ea_inode_put(ino)?;
        }
        let old_charge = self.ea_charge(&st.body) + old_block.map_or(0, |o| self.ea_charge(o));
        raw.blocks =
            (raw.blocks + self.ea_charge(body) + self.ea_charge(block)).saturating_sub(old_charge);
        self.write_inode_area(raw, area.as_ref().map(|(s, b)| (*s, &b[..])))
    }

    /// Replace the xattr block of `raw` (whose count is `refcount`, 0 for
    /// none) by one holding `entries`: in place if only this inode uses
    /// it, else in a new block; none at all when `entries` is empty.
    /// Updates `raw.file_acl` and `raw.blocks`.
    fn put_xattr_block(
        &self,
        raw: &mut RawInode,
        refcount: u32,
        old_entries: &[RawEntry],
        entries: &[RawEntry],
        fresh: Option<u32>,
    ) -> Result<()> {
        let (rw, io) = self.rw()?;
        let sectors = self.bs as u64 / 512;
        let old = raw.file_acl;
        if entries.is_empty() {
            if old != 0 {
                self.drop_xattr_block(raw.ino, old)?;
                raw.file_acl = 0;
                raw.blocks = raw.blocks.saturating_sub(sectors);
            }
            return Ok(());
        }
        let mut b = xattr::encode_block(entries, 1, self.bs).ok_or_else(|| errno(libc::ENOSPC))?;
        let shareable = header_hash(&b) != 0 && ea_inode::inums(entries).is_empty();
        if shareable {
            if let Some(twin) = self.share_twin(&b, old)? {
                if old != 0 {
                    // Its values (if it named value inodes) lose it when
                    // it goes.
                    self.drop_xattr_block(raw.ino, old)?;
                } else {
                    raw.blocks += sectors;
                }
                raw.file_acl = twin;
                return Ok(());
            }
        }
        // Near the inode's group, as the kernel's goal.
        let alloc = || {
            let g = u64::from((raw.ino - 1) / self.sb.inodes_per_group);
            let goal =
                u64::from(self.sb.first_data_block) + g * u64::from(self.sb.blocks_per_group);
            self.alloc_block(goal)
        };
        let seed = self.xattr_csum_seed();
        let mut blk = old;
        let mut in_place = false;
        if old != 0 && refcount == 1 {
            // Changed in place only if still ours alone: `refcount` was
            // read before, and another inode with the same attributes may
            // have joined the block since (`share_twin`, which counts
            // under the buffer's lock and checks the contents there: after
            // this write, none joins). Its old contents' cache entry goes
            // (the block may later be freed and hold anything, and only
            // the entry under its last contents is dropped then). As the
            // kernel's ext4_xattr_block_set checks h_refcount again under
            // lock_buffer.
            if let Some(seed) = seed {
                xattr::set_block_csum(&mut b, blk, seed);
            }
            let before = rw.bufs.modify(io.dev, blk, true, |d| {
                let r = u32::from_le_bytes([d[4], d[5], d[6], d[7]]);
                (r == 1).then(|| {
                    let h = header_hash(d);
                    d.copy_from_slice(&b);
                    h
                })
            })?;
            if let Some(h) = before {
                rw.xattr_blocks.remove(h, blk);
                in_place = true;
            }
        }
        if !in_place {
            // A new block (copy on write when the old one is shared): the
            // whole block is written, nothing to read first.
            blk = alloc()?;
            if let Some(seed) = seed {
                xattr::set_block_csum(&mut b, blk, seed);
            }
            rw.bufs
                .modify(io.dev, blk, false, |d| d.copy_from_slice(&b))?;
        }
        if shareable {
            rw.xattr_blocks.insert(header_hash(&b), blk);
        }
        if blk != old {
            // A new block: the value inodes it names (but the fresh one)
            // gain it as a user; the old one keeps its own.
            for ino in ea_inode::inums(entries) {
                if Some(ino) != fresh {
                    self.ea_inode_get(ino)?;
                }
            }
            if old != 0 {
                // The shared block keeps its other users.
                self.drop_xattr_block(raw.ino, old)?;
            } else {
                raw.blocks += sectors;
            }
            raw.file_acl = blk;
        } else {
            // Changed in place: the values it no longer names lose it.
            for ino in ea_inode::lost(&ea_inode::inums(old_entries), &ea_inode::inums(entries)) {
                self.ea_inode_put(ino)?;
            }
        }
        Ok(())
    }

    /// A block with the attributes of `b` (an encoded block) other than
    /// `not`, found in the cache and given one user more (count below
    /// `REFCOUNT_MAX`), or `None`. Looked at and counted with the cache
    /// shard held, so that it cannot be freed meanwhile (module doc).
    fn share_twin(&self, b: &[u8], not: u64) -> Result<Option<u64>> {
        let (rw, io) = self.rw()?;
        let seed = self.xattr_csum_seed();
        let hash = header_hash(b);
        let m = rw.xattr_blocks.shard(hash).lock();
        let Some(cands) = m.get(&hash) else {
            return Ok(None);
        };
        let mut cur = BlockBuf::zeroed(self.bs);
        for &c in cands.iter().rev() {
            if c == not {
                continue;
            }
            // A look first, so that only the twin is dirtied (and logged).
            rw.bufs.read(io.dev, c, &mut cur)?;
            if !same_block(&cur, b) {
                continue;
            }
            let counted = rw.bufs.modify(io.dev, c, true, |d| {
                let r = u32::from_le_bytes([d[4], d[5], d[6], d[7]]);
                if !same_block(d, b) || r == 0 || r >= REFCOUNT_MAX {
                    return false;
                }
                xattr::set_refcount(d, r + 1);
                if let Some(seed) = seed {
                    xattr::set_block_csum(d, c, seed);
                }
                true
            })?;
            if counted {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    /// One user less for xattr block `blk`: its count (and checksum)
    /// rewritten, or the block freed at the last, and with it a user of
    /// each value inode it names. The count is read and changed under the
    /// buffer's lock, so two inodes sharing the block that drop it at once
    /// (a copy on write, an unlink) both count.
    fn drop_xattr_block(&self, ino: u32, blk: u64) -> Result<()> {
        let (rw, io) = self.rw()?;
        // Checked when it was read; again here, as nothing else stands
        // between a metadata block and its release.
        self.check(self.check_xattr_block_no(ino, blk))?;
        let seed = self.xattr_csum_seed();
        let allowed = self.value_inodes();
        let last = rw
            .bufs
            .modify(io.dev, blk, true, |d| -> Result<Option<(u32, Vec<u32>)>> {
                let r = u32::from_le_bytes([d[4], d[5], d[6], d[7]]);
                if r <= 1 {
                    // Checked when it was read; the count only matters here.
                    let (_, entries) = xattr::parse_block_raw(d, blk, None)?;
                    xattr::check_value_inodes(&entries, allowed, &|| format!("xattr block {blk}"))?;
                    // Count 0: no sharer takes it from here on (module doc).
                    xattr::set_refcount(d, 0);
                    return Ok(Some((header_hash(d), ea_inode::inums(&entries))));
                }
                xattr::set_refcount(d, r - 1);
                if let Some(seed) = seed {
                    xattr::set_block_csum(d, blk, seed);
                }
                Ok(None)
            })?;
        if let Some((hash, values)) = self.check(last)? {
            // Waits for a sharer looking at it; none finds it afterwards.
            rw.xattr_blocks.remove(hash, blk);
            self.free_block(blk)?;
            for ino in values {
                self.ea_inode_put(ino)?;
            }
        }
        Ok(())
    }

    /// An inode with no links goes: its xattr block loses a user.
    pub(crate) fn release_xattr_block(&self, raw: &mut RawInode) -> Result<()> {
        // Checked (where it lies, its contents) before its count is
        // trusted.
        if Self::logged(self.xattr_block(raw))?.is_none() {
            return Ok(());
        }
        self.drop_xattr_block(raw.ino, raw.file_acl)?;
        raw.file_acl = 0;
        Ok(())
    }

    /// `write_inode` with the in-inode attribute area replaced by `area`
    /// (its offset in the slot and its bytes), the checksum over both.
    fn write_inode_area(&self, raw: &RawInode, area: Option<(usize, &[u8])>) -> Result<()> {
        let Some((start, bytes)) = area else {
            return self.write_inode(raw, false);
        };
        let (rw, io) = self.rw()?;
        let s = self.slot_of(raw.ino)?;
        let isz = self.sb.inode_size();
        let sb = &self.sb;
        // An inode on the orphan list is encoded with its chain link.
        let ok = self.with_orphan_link(raw, |raw| {
            Ok(rw.bufs.modify(io.dev, s.blk, true, |b| {
                let slot = &mut b[s.off..s.off + isz];
                // The area as found when it was read (i_extra_isize is fixed
                // once the inode exists).
                let extra = usize::from(u16::from_le_bytes([slot[0x80], slot[0x81]]));
                if GOOD_OLD_INODE_SIZE + extra != start || start + bytes.len() != isz {
                    return false;
                }
                slot[start..].copy_from_slice(bytes);
                raw.encode(sb, slot, None);
                true
            })?)
        })?;
        if !ok {
            return self.check(Err(corrupt(
                format!("inode {}", raw.ino),
                "i_extra_isize changed under an xattr write",
            )));
        }
        Ok(())
    }
}
