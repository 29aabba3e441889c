//! The orphan list on disk (`orphan=list`; seed 002's "before", and what
//! the kernel uses on images without an orphan file; also the fallback of
//! a mount using the orphan file, for inodes that find it full: see
//! `with_orphan_link` for how that mount keeps its unlinks lock-free
//! while the fallback is empty).
//!
//! An inode whose last name goes joins the list in the same transaction:
//! it becomes the head (`s_last_orphan` in the superblock) and its `i_dtime`
//! holds the next inode of the chain (0 ends it). When the inode is freed
//! it leaves the list in the transaction that frees it: its predecessor's
//! `i_dtime` (or the superblock's head) takes its successor. A crash in
//! between leaves the chain for the next mount (or e2fsck) to free.
//!
//! LOCKING. One mutex per list (`Class::Ext4OrphanList`, level 25; a
//! mount has one list at most), as the kernel's `s_orphan_lock`: the whole
//! point of seed 002 is that every unlink of a last name and every free of
//! such an inode takes it (on `orphan=list` mounts). The chain is mirrored
//! in memory (`next`/`prev` maps), so a removal finds its predecessor
//! without reading the chain. Under the mutex, each briefly and one at a
//! time: a buffer-cache shard (`Class::Ext4Buf`, level 28) to change an
//! inode's `i_dtime` in its table block, then the superblock's raw bytes
//! (`sb_raw`, `Class::Ext4Super`, level 29) to change the head; the levels
//! are those of `scalevfs_sync::ordered::Class`.
//!
//! THE LINK LIVES IN THE ENCODING, NOT IN THE INODE COPY. Other threads
//! write a listed inode (an unlinked file still open is still written)
//! from their own copy of its fields, whose `dtime` is 0. So every encode
//! of an inode with no link left goes through [`Ext4::with_orphan_link`],
//! which, under the list mutex, puts the chain's current next pointer in
//! the bytes it writes; a change of the chain patches the stored bytes of
//! the inode it relinks under the same mutex. Both orders of a concurrent
//! write and relink therefore leave the current pointer on disk.
//!
//! The superblock is a journaled block (`Ext4::journal_super`, each
//! commit), so the head and the chain reach the disk in one transaction.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use crate::error::{corrupt, Result};
use crate::format::inode::{RawInode, FL_EXTENTS};
use crate::format::superblock::SB_LAST_ORPHAN;
use crate::fs::Ext4;
use crate::txn::{ListState, OrphanList};

impl Ext4 {
    /// The orphan list, on journaled `orphan=list` mounts.
    pub(crate) fn orphan_list(&self) -> Option<&OrphanList> {
        self.rw.as_ref()?.orphan_list.get()
    }

    /// The fallback orphan list of a mount that records orphans in the
    /// orphan file (inodes that found every slot taken).
    pub(crate) fn orphan_fallback(&self) -> Option<&OrphanList> {
        self.rw.as_ref()?.orphan_fallback.get()
    }

    /// Inodes on the orphan list now: every orphan of an `orphan=list`
    /// mount, else those the full orphan file sent to the fallback list
    /// (0 without either).
    pub fn orphan_list_len(&self) -> usize {
        self.orphan_list()
            .or_else(|| self.orphan_fallback())
            .map_or(0, OrphanList::len)
    }

    /// Put `ino` (its last name went, or a long truncate starts, in the
    /// running handle) at the head of the list. Already on it: one more
    /// record of it (`ListState::extra`), removed by its own
    /// `list_remove_record`.
    pub(crate) fn list_add(&self, l: &OrphanList, ino: u32) -> Result<()> {
        let mut st = l.state.lock();
        if st.next.contains_key(&ino) {
            *st.extra.entry(ino).or_insert(0) += 1;
            return Ok(());
        }
        // SeqCst (and before the inode's stored dtime changes): an encode
        // that found the list empty without the mutex rechecks `adds`
        // after its write (`with_orphan_link`).
        l.adds.fetch_add(1, Ordering::SeqCst);
        let old = st.head;
        self.patch_dtime(ino, old)?;
        st.next.insert(ino, old);
        if old != 0 {
            st.prev.insert(old, ino);
        }
        st.head = ino;
        // SeqCst: read by `with_orphan_link` without the mutex.
        l.len.store(st.next.len(), Ordering::SeqCst);
        self.set_last_orphan(ino);
        Ok(())
    }

    /// Take `ino` off the list, whatever records of it remain (it is
    /// being freed in the running handle, which rewrites its own
    /// `i_dtime`; a freed inode never stays on the chain). `false`: it was
    /// not on it.
    pub(crate) fn list_remove(&self, l: &OrphanList, ino: u32) -> Result<bool> {
        let mut st = l.state.lock();
        st.extra.remove(&ino);
        self.list_remove_locked(l, &mut st, ino)
    }

    /// Remove one record of `ino` (a long truncate's, done): it leaves the
    /// chain only if no other record of it remains (the unlink of the
    /// same inode meanwhile added one). True if it left the chain.
    pub(crate) fn list_remove_record(&self, l: &OrphanList, ino: u32) -> Result<bool> {
        let mut st = l.state.lock();
        if let Some(x) = st.extra.get_mut(&ino) {
            *x -= 1;
            if *x == 0 {
                st.extra.remove(&ino);
            }
            return Ok(false);
        }
        self.list_remove_locked(l, &mut st, ino)
    }

    /// Unlink `ino` from the chain, the list mutex held (`st`).
    fn list_remove_locked(&self, l: &OrphanList, st: &mut ListState, ino: u32) -> Result<bool> {
        let Some(&next) = st.next.get(&ino) else {
            return Ok(false);
        };
        match st.prev.get(&ino).copied() {
            Some(p) => {
                self.patch_dtime(p, next)?;
                st.next.insert(p, next);
                if next != 0 {
                    st.prev.insert(next, p);
                }
            }
            None => {
                st.head = next;
                if next != 0 {
                    st.prev.remove(&next);
                }
                self.set_last_orphan(next);
            }
        }
        st.next.remove(&ino);
        st.prev.remove(&ino);
        // SeqCst: read by `with_orphan_link` without the mutex.
        l.len.store(st.next.len(), Ordering::SeqCst);
        Ok(true)
    }

    /// Run `f` with the inode to encode: for an inode on the orphan list,
    /// a copy whose `dtime` is its next pointer, with the list mutex held
    /// across `f` (see the module comment). Others pass through. A file
    /// that keeps its links is on the list only during a long truncate,
    /// with a non-zero `dtime` in its copy (`Ext4::orphan_add_live`); a
    /// stale copy of it written after it left the list gets `dtime` 0.
    ///
    /// THE FALLBACK LIST (a mount using the orphan file) is usually empty,
    /// and the free of every unlinked inode comes here: it must not take
    /// a filesystem-wide mutex then. An unlinked inode is encoded without
    /// the mutex when the list is empty (`len`), and again under it if an
    /// inode joined meanwhile (`adds` moved). A join patches the inode's
    /// stored bytes after bumping `adds`; if that patch came before our
    /// write (which then overwrote it), the shard lock of the block orders
    /// the bump before our recheck, which sees it and writes the link. If
    /// the recheck sees no bump, the join's patch comes after our write.
    /// Both writes are inside handles, so no commit sees the bytes in
    /// between.
    pub(crate) fn with_orphan_link<R>(
        &self,
        raw: &RawInode,
        mut f: impl FnMut(&RawInode) -> Result<R>,
    ) -> Result<R> {
        if let Some(l) = self.orphan_list() {
            if raw.links_count == 0 || raw.dtime != 0 {
                return self.encode_listed(l, raw, f);
            }
            return f(raw);
        }
        let Some(l) = self.orphan_fallback() else {
            return f(raw);
        };
        if raw.links_count != 0 {
            // A long truncate that found the orphan file full marks its
            // copy (`orphan_add_live`); others are never on the list.
            if raw.dtime != 0 {
                return self.encode_listed(l, raw, f);
            }
            return f(raw);
        }
        // SeqCst (both loads and the recheck): see above.
        let adds = l.adds.load(Ordering::SeqCst);
        if l.len.load(Ordering::SeqCst) != 0 {
            return self.encode_listed(l, raw, f);
        }
        let r = f(raw)?;
        if l.adds.load(Ordering::SeqCst) == adds {
            return Ok(r);
        }
        self.encode_listed(l, raw, f)
    }

    /// `with_orphan_link` on list `l`: under its mutex, `f` gets a copy
    /// with the chain's link when the inode is on it.
    fn encode_listed<R>(
        &self,
        l: &OrphanList,
        raw: &RawInode,
        mut f: impl FnMut(&RawInode) -> Result<R>,
    ) -> Result<R> {
        let st = l.state.lock();
        let want = match st.next.get(&raw.ino) {
            Some(&n) => Some(n),
            None if raw.links_count != 0 => Some(0),
            None => None,
        };
        match want {
            Some(n) if n != raw.dtime => {
                let mut r = raw.clone();
                r.dtime = n;
                f(&r)
            }
            _ => f(raw),
        }
    }

    /// Set the stored `i_dtime` of inode `ino` to `v` (checksum updated),
    /// in its inode table block through the buffer cache.
    fn patch_dtime(&self, ino: u32, v: u32) -> Result<()> {
        let (rw, io) = self.rw()?;
        let s = self.slot_of(ino)?;
        let isz = self.sb.inode_size();
        let sb = &self.sb;
        let r = rw.bufs.modify(io.dev, s.blk, true, |b| {
            let slot = &mut b[s.off..s.off + isz];
            let mut raw = RawInode::parse(sb, ino, slot)?;
            raw.dtime = v;
            raw.encode(sb, slot, None);
            Ok(())
        })?;
        self.check(r)
    }

    /// Set `s_last_orphan` in the superblock copy the next commit logs.
    fn set_last_orphan(&self, ino: u32) {
        if let Some(rw) = &self.rw {
            let mut raw = rw.sb_raw.lock();
            raw[SB_LAST_ORPHAN..SB_LAST_ORPHAN + 4].copy_from_slice(&ino.to_le_bytes());
            // SeqCst: see `Ext4::prepare_commit` (set under `sb_raw`'s
            // lock, inside the handle that changed the head).
            rw.sb_changed.store(true, Ordering::SeqCst);
        }
    }

    /// The chain the superblock starts (a crash left it, or the kernel):
    /// every inode number in range, in use and readable, no loop. Reads
    /// only; a bad chain is an error before anything is written.
    pub(crate) fn scan_orphan_list(&self) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut ino = self.sb.last_orphan;
        let what = "orphan list";
        let (rw, io) = self.rw()?;
        while ino != 0 {
            // The filesystem's own inodes (the orphan file, quota files)
            // are never orphans: freeing one would hand its blocks out
            // while it still uses them.
            if self.is_reserved_ino(ino) || ino > self.sb.inodes_count {
                return Err(corrupt(what, format!("lists inode {ino}")));
            }
            // Each number once: the loop ends after at most
            // `inodes_count` steps.
            if !seen.insert(ino) {
                return Err(corrupt(what, format!("loops back to inode {ino}")));
            }
            if !rw.alloc.inode_in_use(&io, ino)? {
                return Err(corrupt(what, format!("lists inode {ino}, which is free")));
            }
            let raw = self
                .read_inode(ino)
                .map_err(|e| corrupt(what, format!("lists inode {ino}: {e}")))?;
            // Its blocks will be freed: the tree (or block map) must read
            // back first.
            self.check_orphan_map(&raw)
                .map_err(|e| corrupt(what, format!("lists inode {ino}: {e}")))?;
            out.push(ino);
            ino = raw.dtime;
        }
        Ok(out)
    }

    /// At mount (journal installed, before any other change): free each
    /// listed inode that has no link, finish the truncate of each that
    /// has (blocks past its size go, as e2fsck and the kernel do), one
    /// handle per inode, the head moving on in the same handle, so a
    /// crash in the middle leaves a valid shorter chain. Returns (freed,
    /// truncated). An inode too large for one handle loses its blocks a
    /// step per handle first (`orphan_step`).
    pub(crate) fn process_orphan_list(&self) -> Result<(usize, usize)> {
        if self.sb.last_orphan == 0 {
            return Ok((0, 0));
        }
        let chain = self.scan_orphan_list()?;
        let (mut freed, mut truncated) = (0, 0);
        for (k, &ino) in chain.iter().enumerate() {
            let next = chain.get(k + 1).copied().unwrap_or(0);
            // Too large for one handle: a step per handle first, the
            // inode still listed (its dtime, the link, is written back).
            while self.orphan_step(ino)? {}
            let done = self.journaled(|| {
                let (rw, io) = self.rw()?;
                let mut done = None;
                // The orphan file's processing may have freed it already.
                if rw.alloc.inode_in_use(&io, ino)? {
                    let mut raw = self.read_inode(ino)?;
                    if raw.links_count == 0 {
                        self.check(self.release_inode(raw))?;
                        done = Some(true);
                    } else {
                        let is_reg = raw.file_type_bits() == libc::S_IFREG;
                        let mapped = raw.flags & FL_EXTENTS != 0
                            || crate::fs::block_mapped(&raw, self.bs, self.has_ea_inode());
                        if is_reg && mapped {
                            self.check(self.finish_truncate(&mut raw))?;
                        }
                        raw.dtime = 0;
                        self.write_inode(&raw, false)?;
                        done = Some(false);
                    }
                }
                self.set_last_orphan(next);
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
}
