//! The orphan file on disk (seed 002; `COMPAT_ORPHAN_FILE`): an inode whose
//! last name goes is recorded in a slot of the orphan file inside the same
//! transaction, and its slot is cleared in the transaction that frees it,
//! so a crash in between cannot leak it: the next read-write mount (or
//! e2fsck) finds it there and frees it.
//!
//! Slots are claimed with `scalevfs_orphan::OrphanFile` (lock-free: a
//! per-block free count and a compare-exchange on the slot, each thread
//! starting at its own block), then written into the block through the
//! buffer cache (journaled metadata), whose shard lock serialises the
//! bytes of one block. The tail checksum is recomputed by the commit for
//! each block changed in the transaction (as the kernel's jbd2 trigger
//! does): crc32c over the le64 physical block number and the slots, seeded with
//! the filesystem seed, the orphan file's inode number and generation.
//!
//! `RO_COMPAT_ORPHAN_PRESENT` is set while mounted (as the kernel does)
//! and cleared at a clean unmount.
//!
//! A FULL FILE. An inode that finds every slot taken goes on the orphan
//! list (`orphan_list.rs`: `s_last_orphan`, chained through `i_dtime`)
//! instead, as the kernel's `ext4_orphan_add` falls back to it; its record
//! is `OrphanSlot::Overflow`, and `orphan_remove` takes it off that list.
//! The list is the mount's fallback (`Ext4::orphan_fallback`), separate
//! from the `orphan=list` scheme's (`Ext4::orphan_list`), which would put
//! every orphan on it. Mount-time processing (ours, the kernel's,
//! e2fsck's) frees what both hold.

use std::sync::atomic::{AtomicU64, Ordering};

use scalevfs_orphan::{OrphanFile, OrphanSlot, OrphanVariant};

use crate::error::{corrupt, Result};
use crate::format::checksum::crc32c;
use crate::format::features::COMPAT_ORPHAN_FILE;
use crate::format::inode::RawInode;
use crate::format::inode::FL_EXTENTS;
use crate::fs::{Ext4, Mapping};
use crate::txn::OrphanDisk;

/// `EXT4_ORPHAN_BLOCK_MAGIC`.
const MAGIC: u32 = 0x0B10_CA04;

impl Ext4 {
    /// Read the orphan file's layout (read-write journaled mounts of images
    /// with one). `None`: the image has none.
    pub(crate) fn load_orphan_file(&self) -> Result<Option<OrphanDisk>> {
        let sb = &self.sb;
        if sb.feature_compat & COMPAT_ORPHAN_FILE == 0 || sb.orphan_file_inum == 0 {
            return Ok(None);
        }
        let raw = self.read_inode(sb.orphan_file_inum)?;
        let bs = self.bs as u64;
        let what = || format!("orphan file (inode {})", sb.orphan_file_inum);
        if raw.file_type_bits() != libc::S_IFREG {
            return Err(corrupt(what(), format!("mode {:#o}", raw.mode)));
        }
        if raw.size % bs != 0 || raw.size == 0 || raw.size / bs > 1 << 16 {
            return Err(corrupt(what(), format!("size {}", raw.size)));
        }
        let n = (raw.size / bs) as u32;
        let mut blocks = Vec::with_capacity(n as usize);
        // Not over other metadata (bitmaps, inode tables, the journal):
        // records written there would corrupt it.
        let zone = self.build_meta_zone(sb.orphan_file_inum)?;
        for l in 0..n {
            match self.map_block(&raw, l)? {
                Mapping::Data {
                    pblk,
                    uninit: false,
                    ..
                } if pblk < sb.blocks_count && !zone.contains(pblk) => blocks.push(pblk),
                _ => return Err(corrupt(what(), format!("block {l} is not mapped"))),
            }
        }
        // Two slots of one disk word would overwrite each other's record
        // (a crash then leaks an inode); the kernel's file never maps a
        // block twice.
        let mut sorted = blocks.clone();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(corrupt(what(), format!("block {} is mapped twice", w[0])));
        }
        let seed = sb.has_metadata_csum().then(|| {
            let s = crc32c(sb.csum_seed(), &sb.orphan_file_inum.to_le_bytes());
            crc32c(s, &raw.generation.to_le_bytes())
        });
        let slots = (self.bs - 8) / 4;
        Ok(Some(OrphanDisk {
            file: OrphanFile::with_geometry(OrphanVariant::Lockless, blocks.len(), slots),
            touched: (0..blocks.len().div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            blocks,
            seed,
        }))
    }

    fn orphan_tail(od: &OrphanDisk, pblk: u64, b: &mut [u8]) {
        let bs = b.len();
        b[bs - 8..bs - 4].copy_from_slice(&MAGIC.to_le_bytes());
        let c = match od.seed {
            Some(seed) => {
                let c = crc32c(seed, &pblk.to_le_bytes());
                crc32c(c, &b[..bs - 8])
            }
            None => 0,
        };
        b[bs - 4..].copy_from_slice(&c.to_le_bytes());
    }

    fn orphan_store(&self, od: &OrphanDisk, slot: OrphanSlot, value: u32) -> Result<()> {
        let OrphanSlot::Slot { block, index } = slot else {
            return Ok(());
        };
        let Some(&pblk) = od.blocks.get(block as usize) else {
            return Ok(());
        };
        let (rw, io) = self.rw()?;
        let off = index as usize * 4;
        // Relaxed: read by the commit with the gate closed, which every
        // handle that stored here passed through (the gate orders it).
        // Set once per block and transaction: later stores only read the
        // word, so threads storing in different blocks of one word do not
        // write its line on every unlink.
        let (word, bit) = (&od.touched[block as usize / 64], 1u64 << (block % 64));
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, Ordering::Relaxed);
        }
        // The tail checksum is computed by the commit (`orphan_tails`),
        // once per changed block and transaction, not once per change.
        rw.bufs.modify(io.dev, pblk, true, |b| {
            b[off..off + 4].copy_from_slice(&value.to_le_bytes());
        })?;
        Ok(())
    }

    /// At a commit (gate closed): recompute the tail of every orphan block
    /// changed in this transaction.
    pub(crate) fn orphan_tails(&self) {
        let (Some(od), Some(rw)) = (self.orphan_disk(), self.rw.as_ref()) else {
            return;
        };
        for (w, word) in od.touched.iter().enumerate() {
            // Relaxed: the gate is closed (see `orphan_store`).
            let mut bits = word.swap(0, Ordering::Relaxed);
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if let Some(&pblk) = od.blocks.get(i) {
                    rw.bufs
                        .fix_if_dirty(pblk, |b| Self::orphan_tail(od, pblk, b));
                }
            }
        }
    }

    /// Record `ino` (its last name went, in the running handle).
    pub(crate) fn orphan_add(&self, ino: u32) -> Result<OrphanSlot> {
        if let Some(l) = self.orphan_list() {
            self.list_add(l, ino)?;
            return Ok(OrphanSlot::Untracked);
        }
        let Some(od) = self.orphan_disk() else {
            return Ok(OrphanSlot::Untracked);
        };
        if self.rw.as_ref().is_some_and(|r| {
            // Relaxed: set once at mount.
            r.orphans_off.load(std::sync::atomic::Ordering::Relaxed)
        }) {
            return Ok(OrphanSlot::Untracked);
        }
        match od
            .file
            .try_add(u64::from(ino), scalevfs_orphan::thread_hint())
        {
            Some(slot) => {
                self.orphan_store(od, slot, ino)?;
                Ok(slot)
            }
            None => self.orphan_add_fallback(ino),
        }
    }

    /// Every slot of the orphan file is taken: put `ino` on the orphan
    /// list instead (`s_last_orphan`, chained through `i_dtime`), as the
    /// kernel's `ext4_orphan_add` falls back to it. Its record is then
    /// `OrphanSlot::Overflow`. Mount-time processing (ours, the kernel's,
    /// e2fsck's) frees both the list and the file.
    #[cold]
    fn orphan_add_fallback(&self, ino: u32) -> Result<OrphanSlot> {
        // Set once the mount's own orphan processing is done; nothing
        // records an orphan before.
        let Some(l) = self.orphan_fallback() else {
            return Ok(OrphanSlot::Untracked);
        };
        self.list_add(l, ino)?;
        Ok(OrphanSlot::Overflow)
    }

    /// Record a file that keeps its links as an orphan (a long truncate,
    /// `Ext4::file_truncate`): its record says "blocks past `i_size` may
    /// remain". On an orphan list (`orphan=list`, or the fallback when the
    /// orphan file is full) its in-memory `dtime` is set non-zero, so
    /// every encode of it takes the chain's link (`with_orphan_link`).
    pub(crate) fn orphan_add_live(&self, raw: &mut RawInode) -> Result<OrphanSlot> {
        let slot = self.orphan_add(raw.ino)?;
        if self.orphan_list().is_some() || slot == OrphanSlot::Overflow {
            raw.dtime = raw.dtime.max(1);
        }
        Ok(slot)
    }

    /// Remove the record `orphan_add_live` made (the truncate is done), in
    /// the running handle. On an orphan list the inode stays if its unlink
    /// added a record of it meanwhile (`list_remove_record`): the list
    /// then records the unlinked inode.
    pub(crate) fn orphan_remove_live(&self, slot: OrphanSlot, raw: &mut RawInode) -> Result<()> {
        let l = match (self.orphan_list(), slot) {
            (Some(l), _) => l,
            (None, OrphanSlot::Overflow) => match self.orphan_fallback() {
                Some(l) => l,
                None => return Ok(()),
            },
            (None, _) => {
                self.orphan_remove(slot, raw.ino)?;
                return Ok(());
            }
        };
        if self.list_remove_record(l, raw.ino)? {
            raw.dtime = 0;
        }
        Ok(())
    }

    /// Clear the record of `ino` (it is being freed, in the same handle or
    /// commit). `true`: it was on an orphan list.
    pub(crate) fn orphan_remove(&self, slot: OrphanSlot, ino: u32) -> Result<bool> {
        if let Some(l) = self.orphan_list() {
            return self.list_remove(l, ino);
        }
        if slot == OrphanSlot::Overflow {
            return match self.orphan_fallback() {
                Some(l) => self.list_remove(l, ino),
                None => Ok(false),
            };
        }
        let Some(od) = self.orphan_disk() else {
            return Ok(false);
        };
        // Zero the bytes before the slot is given back: another thread may
        // claim it as soon as `remove` returns.
        self.orphan_store(od, slot, 0)?;
        od.file.remove(slot, u64::from(ino));
        Ok(false)
    }

    /// At mount: free every inode the orphan file lists with no link
    /// left (a crash after its last name went), finish the truncate of
    /// each regular file that has links (a crash in a long truncate:
    /// blocks past its size go, as the kernel and e2fsck do), clear every
    /// slot. An inode too large for one handle loses its blocks a step
    /// per handle first (`orphan_step`); its slot is cleared in the handle
    /// of the last step. Returns how many inodes were (freed, truncated).
    /// Checked before anything is changed: a block whose magic or checksum
    /// is wrong stops the mount.
    pub(crate) fn process_orphans(&self) -> Result<(usize, usize)> {
        let Some(od) = self.orphan_disk() else {
            return Ok((0, 0));
        };
        // A block at a time (checked again as it is read; the whole file
        // was checked at open, before the first write): the listed
        // inodes of a big orphan file are never all in memory at once.
        let (mut freed, mut truncated) = (0, 0);
        for block in 0..od.blocks.len() {
            let mut listed = Vec::new();
            self.scan_orphan_blocks(od, block..block + 1, |pblk, k, ino, in_use| {
                listed.push((pblk, k, ino, in_use));
                Ok(())
            })?;
            let (f, t) = self.process_orphan_block(od, listed)?;
            freed += f;
            truncated += t;
        }
        Ok((freed, truncated))
    }

    /// `process_orphans` for the slots of one block.
    fn process_orphan_block(
        &self,
        od: &OrphanDisk,
        listed: Vec<(u64, usize, u32, bool)>,
    ) -> Result<(usize, usize)> {
        let (mut freed, mut truncated) = (0, 0);
        for (pblk, k, ino, in_use) in listed {
            while in_use && self.orphan_step(ino)? {}
            let done = self.journaled(|| {
                let (rw, io) = self.rw()?;
                let mut done = None;
                // An earlier slot may have listed it too and freed it.
                if in_use && rw.alloc.inode_in_use(&io, ino)? {
                    let mut raw = self.read_inode(ino)?;
                    // Whatever its dtime, as the kernel (`ext4_orphan_get`
                    // takes a link count of 0 while processing orphans)
                    // and e2fsck free it.
                    if raw.links_count == 0 && raw.mode != 0 {
                        self.check(self.release_inode(raw))?;
                        done = Some(true);
                    } else if raw.links_count > 0
                        && raw.file_type_bits() == libc::S_IFREG
                        && (raw.flags & FL_EXTENTS != 0
                            || crate::fs::block_mapped(&raw, self.bs, self.has_ea_inode()))
                    {
                        self.check(self.finish_truncate(&mut raw))?;
                        self.write_inode(&raw, false)?;
                        done = Some(false);
                    }
                }
                rw.bufs.modify(io.dev, pblk, true, |b| {
                    b[k * 4..k * 4 + 4].fill(0);
                    Self::orphan_tail(od, pblk, b);
                })?;
                Ok(done)
            })?;
            match done {
                Some(true) => freed += 1,
                Some(false) => truncated += 1,
                None => {}
            }
        }
        Ok((freed, truncated))
    }

    /// Read and check every orphan block (magic, checksum, inode numbers
    /// in range and not the filesystem's own, in-use ones readable).
    /// Reads only.
    pub(crate) fn scan_orphans(&self, od: &OrphanDisk) -> Result<()> {
        self.scan_orphan_blocks(od, 0..od.blocks.len(), |_, _, _, _| Ok(()))
    }

    /// Check the orphan blocks `range` as `scan_orphans` does, and give
    /// `each` every listed inode as (block, slot, inode, in use).
    fn scan_orphan_blocks(
        &self,
        od: &OrphanDisk,
        range: std::ops::Range<usize>,
        mut each: impl FnMut(u64, usize, u32, bool) -> Result<()>,
    ) -> Result<()> {
        let bs = self.bs;
        let mut b = vec![0u8; bs];
        for i in range {
            let Some(&pblk) = od.blocks.get(i) else {
                break;
            };
            self.read_block(pblk, &mut b)?;
            let what = || format!("orphan file block {i}");
            let magic = u32::from_le_bytes(b[bs - 8..bs - 4].try_into().expect("4 bytes"));
            if magic != MAGIC {
                return Err(corrupt(what(), format!("magic {magic:#x}")));
            }
            let mut c = b.clone();
            Self::orphan_tail(od, pblk, &mut c);
            if od.seed.is_some() && c[bs - 4..] != b[bs - 4..] {
                return Err(corrupt(what(), "checksum"));
            }
            for (k, s) in b[..bs - 8].chunks_exact(4).enumerate() {
                let ino = u32::from_le_bytes(s.try_into().expect("4 bytes"));
                if ino == 0 {
                    continue;
                }
                // The filesystem's own inodes (the orphan file itself,
                // quota files) are never orphans: freeing one would hand
                // its blocks out while it still uses them.
                if self.is_reserved_ino(ino) || ino > self.sb.inodes_count {
                    return Err(corrupt(what(), format!("lists inode {ino}")));
                }
                // An inode not in use is only cleared from the slot (as
                // e2fsck does); one in use must read back (checksum,
                // fields) before the mount writes anything.
                let (rw, io) = self.rw()?;
                let in_use = rw.alloc.inode_in_use(&io, ino)?;
                if in_use {
                    // It may be freed or truncated: it and its extent
                    // tree (or block map) must read back.
                    let r = self
                        .read_inode(ino)
                        .and_then(|raw| self.check_orphan_map(&raw));
                    if let Err(e) = r {
                        return Err(corrupt(what(), format!("lists inode {ino}: {e}")));
                    }
                }
                each(pblk, k, ino, in_use)?;
            }
        }
        Ok(())
    }
}
