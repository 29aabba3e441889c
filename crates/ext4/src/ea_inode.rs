//! Extended attribute values in their own inode (`ea_inode`,
//! INCOMPAT_EA_INODE 0x400) on a read-write mount: creating the value
//! inode, counting its users, freeing it with the last, and reading it.
//!
//! ON DISK (the kernel's `fs/ext4/xattr.c`, e2fsprogs' `ext_attr.c`)
//! - The entry (in the inode body or the xattr block) has `e_value_inum`
//!   set, `e_value_offs` 0 and `e_value_size` the value's length; no
//!   room is taken for the value. Its `e_hash` is the usual entry hash of
//!   the name followed by one 32-bit word: the value inode's hash (also
//!   in the body, where plain values have 0).
//! - The value inode: a regular file (mode 0600, owner 0:0), flags
//!   EXT4_EA_INODE_FL | EXTENTS_FL, one link, in no directory, `i_size`
//!   the value's length, the value in its data blocks. Its value hash,
//!   crc32c(the superblock's checksum seed, value), is in `i_atime`
//!   (seconds); its reference count is split over `i_ctime` (high 32
//!   bits) and `l_i_version` (`osd1`, low 32 bits).
//! - Who counts as a user: each entry naming it, an xattr block counting
//!   once however many inodes share the block. The owner's `i_blocks`
//!   carries the value's size rounded up to whole blocks (the kernel's
//!   quota charge, which e2fsck checks) for every such entry it holds,
//!   including those in a shared block.
//! - A value goes to a value inode when its padded size is over
//!   EXT4_XATTR_MIN_LARGE_EA_SIZE (block size - 56) or when it fits
//!   neither the body nor the block as a plain value; with the feature,
//!   plain values in the block must leave min(block size / 8, 1024) bytes
//!   for entries (`xattr_write.rs`).
//!
//! POLICY
//! - A new value shares a value inode we made for the same value (the
//!   kernel's ea_inode mbcache): `RwState::ea_values` keeps our value
//!   inodes by value hash; a candidate whose value is byte-for-byte the
//!   new one and whose count is 1..u32::MAX gains a user, read and counted
//!   with its cache shard held. Otherwise the value gets a fresh inode with
//!   one user, which joins the cache. The user that takes a count to 0
//!   drops the cache entry (waiting for a sharer looking at it) before it
//!   frees the inode, so a sharer never counts an inode being freed.
//!   Value inodes the kernel wrote (possibly shared already) are counted
//!   down one user at a time and freed only at 0; they join no cache.
//! - The value is written through the metadata cache, as the kernel
//!   journals these blocks: it is part of the handle's transaction and a
//!   freed value block gets its revoke record like any metadata block.
//!   Readers read it through the cache too.
//! - Counts change under the buffer lock of the inode table block (a read,
//!   check and write of the slot in one `BufCache::modify`), so two owners
//!   of a shared value inode dropping it at once both count; the one that
//!   reaches 0 frees it (its blocks through the journal's pending list).
//!
//! LOCKING: no lock of its own; called with the owner's `Ext4Inode::data`
//! held (set/remove) or from the owner's final release.

use crate::error::{corrupt, Result};
use crate::format::checksum::crc32c;
use crate::format::extent::{Extent, INIT_MAX_LEN};
use crate::format::features::{INCOMPAT_EA_INODE, INCOMPAT_EXTENTS};
use crate::format::inode::{RawInode, FL_EA_INODE, FL_EXTENTS, I_BLOCK_LEN};
use crate::format::le32;
use crate::format::xattr::{self, RawEntry};
use crate::fs::{Ext4, Mapping};
use crate::util::{errno, now, BlockBuf};

/// `l_i_version` (osd1): the low 32 bits of a value inode's count.
const I_VERSION_OFF: usize = 0x24;
/// `i_ctime`: the high 32 bits.
const I_CTIME_OFF: usize = 0x0C;

/// EXT4_XATTR_MIN_LARGE_EA_SIZE: a value whose padded size is over this
/// goes to a value inode at once (block size - an entry with a 3-byte
/// name - the block header - the end mark).
pub(crate) fn min_large_value(bs: usize) -> usize {
    bs - xattr::entry_len(3) - xattr::BLOCK_HEADER_LEN - 4
}

/// EXT4_XATTR_BLOCK_RESERVE: with the feature, the bytes a plain value
/// stored in the block must leave below its values for entries.
pub(crate) fn block_reserve(bs: usize) -> usize {
    (bs / 8).min(1024)
}

/// The value inode numbers `entries` name (with repeats: one inode may
/// hold two names of the same value).
pub(crate) fn inums(entries: &[RawEntry]) -> Vec<u32> {
    entries
        .iter()
        .filter(|e| e.inum != 0)
        .map(|e| e.inum)
        .collect()
}

/// The users `old` has that `new` has not (multisets of value inodes).
pub(crate) fn lost(old: &[u32], new: &[u32]) -> Vec<u32> {
    let mut n = new.to_vec();
    let mut out = Vec::new();
    for &o in old {
        match n.iter().position(|&x| x == o) {
            Some(p) => {
                n.swap_remove(p);
            }
            None => out.push(o),
        }
    }
    out
}

thread_local! {
    /// This thread is freeing a value inode (`ea_inode_put`): a value
    /// inode reached from there is named by another one.
    static RELEASING_VALUE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Ext4 {
    pub(crate) fn has_ea_inode(&self) -> bool {
        self.sb.has_incompat(INCOMPAT_EA_INODE)
    }

    /// `ext4_xattr_inode_hash`: crc32c of the value with the superblock's
    /// checksum seed.
    pub(crate) fn ea_value_hash(&self, v: &[u8]) -> u32 {
        crc32c(self.sb.csum_seed(), v)
    }

    /// What the value inodes `entries` name cost their owner in `i_blocks`
    /// (512-byte units): each value's size in whole blocks.
    pub(crate) fn ea_charge(&self, entries: &[RawEntry]) -> u64 {
        let bs = self.bs as u64;
        entries
            .iter()
            .filter(|e| e.inum != 0)
            .map(|e| u64::from(e.inum_size).div_ceil(bs) * (bs / 512))
            .sum()
    }

    /// A new value inode holding `value` (non-empty), one user, near the
    /// owner `owner`. Returns its number and value hash. Nothing is left
    /// allocated on failure.
    pub(crate) fn create_ea_inode(&self, owner: u32, value: &[u8]) -> Result<(u32, u32)> {
        if !self.sb.has_incompat(INCOMPAT_EXTENTS) {
            return Err(errno(libc::EOPNOTSUPP));
        }
        let (rw, io) = self.rw()?;
        let bs = self.bs;
        let group = ((owner - 1) / self.sb.inodes_per_group) as usize;
        let ino = self.alloc_inode(Some(group), false)?;
        let mut data: Vec<u64> = Vec::new();
        let undo = |data: &[u64]| {
            for &b in data {
                let _ = self.free_block(b);
            }
            let _ = self.free_inode(ino, false);
        };
        let mut goal = u64::from(self.sb.first_data_block)
            + group as u64 * u64::from(self.sb.blocks_per_group);
        for _ in 0..value.len().div_ceil(bs) {
            match self.alloc_block(goal) {
                Ok(b) => {
                    data.push(b);
                    goal = b + 1;
                }
                Err(e) => {
                    undo(&data);
                    return Err(e);
                }
            }
        }
        let mut ex: Vec<Extent> = Vec::new();
        for (i, &b) in data.iter().enumerate() {
            match ex.last_mut() {
                Some(e) if e.start + u64::from(e.len) == b && e.len < INIT_MAX_LEN => e.len += 1,
                _ => ex.push(Extent {
                    block: i as u32,
                    len: 1,
                    start: b,
                    uninit: false,
                }),
            }
        }
        let t = now();
        // Random, as every new inode's (`write::new_generation`).
        let generation = crate::write::new_generation();
        let csum_seed = crc32c(
            crc32c(self.sb.csum_seed(), &ino.to_le_bytes()),
            &generation.to_le_bytes(),
        );
        let hash = self.ea_value_hash(value);
        let mut raw = RawInode {
            ino,
            mode: (libc::S_IFREG | 0o600) as u16,
            uid: 0,
            gid: 0,
            size: value.len() as u64,
            links_count: 1,
            blocks: 0,
            flags: FL_EXTENTS | FL_EA_INODE,
            block: [0; I_BLOCK_LEN],
            generation,
            file_acl: 0,
            // The hash is the value of i_atime's seconds (a u32).
            atime: (i64::from(hash), 0),
            ctime: t,
            mtime: t,
            crtime: None,
            dtime: 0,
            csum_seed,
            ibody_xattrs: false,
        };
        if let Err(e) = self.rebuild_tree(&mut raw, &ex, &[]) {
            undo(&data);
            return Err(e);
        }
        raw.blocks += data.len() as u64 * (bs as u64 / 512);
        // From here the inode and its blocks are taken and mapped: a
        // failure stops writes rather than commit them unowned (review,
        // stop 47).
        (|| -> Result<()> {
            // The whole value, each block written whole (its tail zeroed).
            for (chunk, &b) in value.chunks(bs).zip(&data) {
                rw.bufs.modify(io.dev, b, false, |d| {
                    d[..chunk.len()].copy_from_slice(chunk);
                    d[chunk.len()..].fill(0);
                })?;
            }
            // Written new (crtime now), then the count goes over the ctime.
            self.write_inode(&raw, true)?;
            self.ea_ref_update(ino, |_| Ok(1)).map(|_| ())
        })()
        .map_err(|e| self.stop_writes(e))?;
        Ok((ino, hash))
    }

    /// A value inode for `value` (non-empty) with one user more for the
    /// caller: one of ours holding the same value (shared), else a new
    /// one. Returns its number and value hash (see POLICY).
    pub(crate) fn value_inode_for(&self, owner: u32, value: &[u8]) -> Result<(u32, u32)> {
        let (rw, _) = self.rw()?;
        let hash = self.ea_value_hash(value);
        {
            let m = rw.ea_values.shard(hash).lock();
            for &ino in m.get(&hash).into_iter().flatten().rev() {
                let ino = ino as u32;
                if self.ea_twin(ino, value)? {
                    return Ok((ino, hash));
                }
            }
        }
        let (ino, hash) = self.create_ea_inode(owner, value)?;
        rw.ea_values.insert(hash, u64::from(ino));
        Ok((ino, hash))
    }

    /// Whether value inode `ino` (from the cache, its shard held) holds
    /// `value` and, if so, one user more for it (count 1..u32::MAX).
    fn ea_twin(&self, ino: u32, value: &[u8]) -> Result<bool> {
        let ea = self.read_inode(ino)?;
        if ea.flags & FL_EA_INODE == 0 || ea.links_count == 0 || ea.size != value.len() as u64 {
            return Ok(false);
        }
        let what = || format!("value inode {ino}");
        let held = match self.read_ea_value(ino, value.len() as u32, &ea, &what) {
            Ok(v) => v,
            Err(e) if e.is_corrupt() => return Ok(false),
            Err(e) => return Err(e),
        };
        if held != value {
            return Ok(false);
        }
        let mut counted = false;
        self.ea_ref_update(ino, |c| {
            if c == 0 || c >= u64::from(u32::MAX) {
                return Ok(c);
            }
            counted = true;
            Ok(c + 1)
        })?;
        Ok(counted)
    }

    /// Change the count of value inode `ino` to `f(count)`, under the
    /// buffer lock of its inode table block; returns the new count.
    fn ea_ref_update(&self, ino: u32, f: impl FnOnce(u64) -> Result<u64>) -> Result<u64> {
        let (rw, io) = self.rw()?;
        let s = self.slot_of(ino)?;
        let isz = self.sb.inode_size();
        let sb = &self.sb;
        let r = rw.bufs.modify(io.dev, s.blk, true, |b| -> Result<u64> {
            let slot = &mut b[s.off..s.off + isz];
            let raw = RawInode::parse(sb, ino, slot)?;
            if raw.flags & FL_EA_INODE == 0 || raw.links_count == 0 {
                return Err(corrupt(
                    format!("inode {ino}"),
                    "named as an xattr value inode but not one",
                ));
            }
            let old =
                (u64::from(le32(slot, I_CTIME_OFF)) << 32) | u64::from(le32(slot, I_VERSION_OFF));
            let new = f(old)?;
            let mut raw = raw;
            raw.ctime = (i64::from((new >> 32) as u32), 0);
            slot[I_VERSION_OFF..I_VERSION_OFF + 4].copy_from_slice(&(new as u32).to_le_bytes());
            raw.encode(sb, slot, None);
            Ok(new)
        })?;
        self.check(r)
    }

    /// One user more for value inode `ino` (an xattr block copied with
    /// its entries).
    pub(crate) fn ea_inode_get(&self, ino: u32) -> Result<()> {
        self.ea_ref_update(ino, |c| Ok(c.saturating_add(1)))?;
        Ok(())
    }

    /// One user less for value inode `ino`; at 0 it is freed (its blocks,
    /// its tree and the inode).
    pub(crate) fn ea_inode_put(&self, ino: u32) -> Result<()> {
        let left = self.ea_ref_update(ino, |c| {
            c.checked_sub(1)
                .ok_or_else(|| corrupt(format!("inode {ino}"), "xattr value inode count 0"))
        })?;
        if left == 0 {
            let raw = self.read_inode(ino)?;
            // A value inode's own attributes naming value inodes (only a
            // crafted image has them) would free a chain of them here, one
            // stack frame set per link: corruption instead, checked before
            // anything of this inode changes.
            if RELEASING_VALUE.with(|d| d.get()) {
                return Err(self
                    .check::<()>(Err(corrupt(
                        format!("inode {ino}"),
                        "an xattr value inode named by another value inode",
                    )))
                    .unwrap_err());
            }
            // Out of the cache first (POLICY): a sharer holding the shard
            // finishes, and none finds it afterwards.
            if let Some(rw) = &self.rw {
                rw.ea_values.remove(raw.atime.0 as u32, u64::from(ino));
            }
            // Cleared on every way out, a panic included (a thread that
            // caught one must not see later value inodes as nested).
            struct Releasing;
            impl Drop for Releasing {
                fn drop(&mut self) {
                    RELEASING_VALUE.with(|d| d.set(false));
                }
            }
            RELEASING_VALUE.with(|d| d.set(true));
            let guard = Releasing;
            let r = self.release_inode(raw);
            drop(guard);
            self.check(r)?;
        }
        Ok(())
    }

    /// An inode going: the value inodes its body names lose a user (those
    /// of its xattr block go with the block: `drop_xattr_block`).
    pub(crate) fn release_ibody_ea_refs(&self, raw: &RawInode) -> Result<()> {
        if !self.has_ea_inode() {
            return Ok(());
        }
        let Some((_, area)) = self.ibody_area(raw)? else {
            return Ok(());
        };
        for ino in inums(&self.ibody_entries(raw.ino, &area)?) {
            self.ea_inode_put(ino)?;
        }
        Ok(())
    }

    /// The value held by value inode `ino` (`size` bytes, at most 64 KiB)
    /// for attribute owner `owner`, read through the metadata cache (where
    /// a read-write mount writes it). The inode must carry
    /// EXT4_EA_INODE_FL and the size, and the value must hash to the hash
    /// in its `i_atime`, as the kernel's `ext4_xattr_inode_verify_hashes`
    /// checks (EUCLEAN otherwise). The kernel's one exception is kept:
    /// Lustre's early value inodes carry no hash but name their owner in
    /// `i_mtime` with the owner's generation.
    pub(crate) fn read_ea_value(
        &self,
        ino: u32,
        size: u32,
        owner: &RawInode,
        what: &dyn Fn() -> String,
    ) -> Result<Vec<u8>> {
        let ea = self.read_inode(ino)?;
        if ea.flags & FL_EA_INODE == 0 || ea.size != u64::from(size) {
            return Err(corrupt(what(), format!("value inode {ino}")));
        }
        let bs = self.bs;
        // size <= xattr::VALUE_MAX (checked by the parser).
        let mut v = vec![0u8; size as usize];
        let mut b = BlockBuf::zeroed(bs);
        for (i, chunk) in v.chunks_mut(bs).enumerate() {
            match self.map_block(&ea, i as u32)? {
                Mapping::Data {
                    pblk,
                    uninit: false,
                    ..
                } => {
                    self.read_block(pblk, &mut b)?;
                    chunk.copy_from_slice(&b[..chunk.len()]);
                }
                // A hole or an unwritten extent reads as zeros.
                _ => chunk.fill(0),
            }
        }
        // The seconds fields hold 32-bit words (the hash, the owner).
        let stored = ea.atime.0 as u32;
        let hash = self.ea_value_hash(&v);
        let lustre = ea.mtime.0 as u32 == owner.ino && ea.generation == owner.generation;
        if hash != stored && !lustre {
            return Err(corrupt(
                what(),
                format!("value inode {ino}: hash {stored:#010x}, the value hashes to {hash:#010x}"),
            ));
        }
        Ok(v)
    }
}
