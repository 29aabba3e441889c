//! Writing the log: [`LogWriter`] appends transactions to the circular log
//! of an image's journal the way jbd2 commits them (descriptor, data and
//! revoke blocks, a flush, the commit block, a flush) and checkpoints them
//! (home blocks written and flushed, then the log tail moved in the journal
//! superblock). One committer calls it at a time (the ext4 type's commit
//! lock); group commit happens above it, by putting many handles' changes
//! in one transaction.
//!
//! Transactions written at once: [`LogWriter::begin`] (under the commit
//! lock) reserves a transaction's place in the log and gives it a ticket
//! of the writer's [`Turnstile`]; the [`InFlight`] it returns writes the
//! descriptors, data and revoke blocks and flushes without any lock, so
//! the committer of the next transaction can begin meanwhile. Only the
//! commit block waits for the turn: it is written (and flushed) after
//! every earlier transaction's, so a durable commit still means every
//! earlier one is durable, and recovery, which stops at the first
//! transaction without its commit block, never skips one. A checkpoint
//! first waits for every ticket given out.
//!
//! While the log holds transactions the superblock says needs_recovery; a
//! crash at any point leaves an image that recovery (ours, e2fsck's, the
//! kernel's) brings to the state after the last transaction whose commit
//! reached the disk.

use std::collections::VecDeque;
use std::sync::Arc;

use scalevfs_sync::Turnstile;

use super::format::{self, JournalSuperblock};
use super::{load, set_needs_recovery};
use crate::bufcache::Block;
use crate::device::BlockDevice;
use crate::error::{corrupt, Error, Result};
use crate::txn::{HelpSlot, LogWrite, SharedWrite};

/// A committed transaction not yet written home.
struct Live {
    /// Log blocks it occupies.
    len: u32,
    /// Shared with a thread that writes them to the log for the
    /// committer (`txn::SharedWrite`) while it does.
    blocks: Vec<(u64, Block)>,
}

/// Where the log lies: what writing a transaction needs, shared with the
/// threads that write theirs outside the commit lock.
struct Geom {
    dev: Arc<dyn BlockDevice>,
    /// The journal superblock at open (features, size; its start and
    /// sequence are the writer's, not these).
    js: JournalSuperblock,
    bs: u64,
    /// Device block of each log block.
    map: Vec<u64>,
}

impl Geom {
    /// Log block `rel` blocks after `start`, wrapping at the end.
    fn log_index(&self, start: u32, rel: usize) -> u32 {
        let n = u64::from(self.js.log_len());
        let first = u64::from(self.js.first);
        ((u64::from(start) - first + rel as u64) % n + first) as u32
    }

    /// Runs of log blocks (given in log order by index) that are
    /// consecutive both in the log and on the device: (device block, how
    /// many of the items).
    fn runs(&self, idx: impl Iterator<Item = u32>) -> Vec<(u64, usize)> {
        let mut out: Vec<(u64, usize)> = Vec::new();
        let mut prev: Option<u32> = None;
        for i in idx {
            let p = self.map[i as usize];
            match (prev, out.last_mut()) {
                (Some(q), Some(run)) if i == q + 1 && p == self.map[q as usize] + 1 => run.1 += 1,
                _ => out.push((p, 1)),
            }
            prev = Some(i);
        }
        out
    }

    /// The log writes of the data blocks of a transaction starting at log
    /// block `start` (escaped where [`format::layout_transaction`] escapes
    /// them), as a [`SharedWrite`].
    fn data_writes(&self, start: u32, blocks: &[(u64, Block)], revokes: usize) -> SharedWrite {
        let idx = (0..blocks.len())
            .map(|i| self.log_index(start, format::data_block_index(&self.js, revokes, i)));
        let mut it = blocks.iter().map(|(_, d)| {
            if d.len() >= 4 && format::be32(d, 0) == format::MAGIC {
                Block::from(format::escape(d).0)
            } else {
                Block::clone(d)
            }
        });
        let runs = self
            .runs(idx)
            .into_iter()
            .map(|(p, k)| (p * self.bs, it.by_ref().take(k).collect()))
            .collect();
        SharedWrite::new(self.dev.clone(), runs)
    }

    /// Write the blocks of `log` (a transaction from log block `start`
    /// on, its commit block left out) other than the data blocks: the
    /// revoke and descriptor blocks.
    fn write_meta(
        &self,
        start: u32,
        log: &[format::LogBlock<'_>],
        revokes: usize,
        data: usize,
    ) -> Result<()> {
        let mut is_data = vec![false; log.len()];
        for i in 0..data {
            is_data[format::data_block_index(&self.js, revokes, i)] = true;
        }
        let meta: Vec<usize> = (0..log.len()).filter(|&r| !is_data[r]).collect();
        let runs = self.runs(meta.iter().map(|&r| self.log_index(start, r)));
        let mut at = meta.iter();
        let mut bufs: Vec<&[u8]> = Vec::new();
        for (p, k) in runs {
            bufs.clear();
            bufs.extend(at.by_ref().take(k).map(|&r| log[r].bytes()));
            self.dev.write_vectored_at(p * self.bs, &bufs)?;
        }
        Ok(())
    }

    fn write_log(&self, idx: u32, b: &[u8]) -> Result<()> {
        self.dev.write_at(self.map[idx as usize] * self.bs, b)?;
        Ok(())
    }

    /// Write `blocks` to the log from block `at` on, one vectored write
    /// per run of blocks that are consecutive both in the log and on the
    /// device (the journal is usually one extent: a commit is then one
    /// write, not one per block, and no block is copied into a bigger
    /// buffer first). Returns the log block after the last.
    fn write_run(&self, mut at: u32, blocks: &[format::LogBlock<'_>]) -> Result<u32> {
        let mut i = 0;
        let mut bufs: Vec<&[u8]> = Vec::new();
        while i < blocks.len() {
            let first = at;
            bufs.clear();
            bufs.push(blocks[i].bytes());
            i += 1;
            let mut next = self.js.wrap_next(at);
            while i < blocks.len()
                && next == at + 1
                && self.map[next as usize] == self.map[at as usize] + 1
            {
                bufs.push(blocks[i].bytes());
                i += 1;
                at = next;
                next = self.js.wrap_next(at);
            }
            self.dev
                .write_vectored_at(self.map[first as usize] * self.bs, &bufs)?;
            at = next;
        }
        Ok(at)
    }
}

/// A transaction whose place in the log is reserved ([`LogWriter::begin`]):
/// [`LogWrite::write`] writes it and returns when it is durable.
pub(crate) struct InFlight {
    g: Arc<Geom>,
    order: Arc<Turnstile>,
    ticket: u64,
    seq: u32,
    start: u32,
    blocks: Vec<(u64, Block)>,
    revokes: Vec<u64>,
    time: u64,
}

/// Appends transactions to an image's journal.
pub struct LogWriter {
    g: Arc<Geom>,
    js: JournalSuperblock,
    fs_blocks: u64,
    /// The log blocks' device blocks sorted (is a home block inside the
    /// journal?).
    sorted: Vec<u64>,
    /// Next free log block.
    head: u32,
    /// First block of the oldest live transaction (== head when none).
    tail: u32,
    /// Sequence of the next transaction.
    next_seq: u32,
    live: VecDeque<Live>,
    /// The journal superblock on disk says the log is empty.
    sb_empty: bool,
    /// The order in which transactions become durable, and the tickets
    /// given out so far.
    order: Arc<Turnstile>,
    tickets: u64,
}

impl LogWriter {
    /// Open the journal of the image on `dev` for writing. The journal must
    /// be empty (recover it first); `csum_v3` turns on checksum v3 in the
    /// journal superblock. Sets needs_recovery (flushed) as a mount does.
    pub fn open(dev: Arc<dyn BlockDevice>, csum_v3: bool) -> Result<LogWriter> {
        let l = load(&dev)?;
        let mut js = l.js;
        if js.start != 0 {
            return Err(Error::Incompatible(
                "the journal holds transactions: recover it before writing".into(),
            ));
        }
        if csum_v3 {
            js.feature_incompat &= !format::INCOMPAT_CSUM_V2;
            js.feature_incompat |= format::INCOMPAT_CSUM_V3;
            js.checksum_type = format::CHECKSUM_CRC32C;
        }
        // A v1 superblock has no feature words: make it v2. Revoke records
        // are always allowed (the kernel sets the feature at mount).
        js.blocktype = format::SUPERBLOCK_V2;
        js.feature_incompat |= format::INCOMPAT_REVOKE;
        let seq = js.sequence;
        let mut w = LogWriter {
            g: Arc::new(Geom {
                dev,
                js: js.clone(),
                bs: l.bs,
                map: l.map.clone(),
            }),
            js,
            fs_blocks: l.fs_blocks,
            sorted: {
                let mut v = l.map;
                v.sort_unstable();
                v
            },
            head: 0,
            tail: 0,
            next_seq: seq,
            live: VecDeque::new(),
            sb_empty: true,
            order: Arc::new(Turnstile::new()),
            tickets: 0,
        };
        w.head = w.js.first;
        w.tail = w.js.first;
        w.write_jsb(0, seq)?;
        w.g.dev.flush()?;
        set_needs_recovery(&*w.g.dev, true)?;
        Ok(w)
    }

    /// The journal superblock as this writer keeps it.
    pub fn journal(&self) -> &JournalSuperblock {
        &self.js
    }

    /// Sequence number the next commit gets.
    pub fn next_sequence(&self) -> u32 {
        self.next_seq
    }

    /// Log blocks free for new transactions without a checkpoint.
    pub fn room(&self) -> u32 {
        self.js.log_len() - 1 - self.used()
    }

    fn used(&self) -> u32 {
        let n = self.js.log_len();
        (self.head + n - self.tail) % n
    }

    fn write_jsb(&mut self, start: u32, sequence: u32) -> Result<()> {
        self.js.start = start;
        self.js.sequence = sequence;
        let g = &self.g;
        let mut b = vec![0u8; g.bs as usize];
        g.dev.read_at(g.map[0] * g.bs, &mut b)?;
        b[..format::SB_SIZE].copy_from_slice(&self.js.to_bytes());
        g.dev.write_at(g.map[0] * g.bs, &b)?;
        self.sb_empty = start == 0;
        Ok(())
    }

    /// Commit a transaction: `blocks` (home block, new contents of one
    /// block) and `revokes` (home blocks whose logged copies in earlier
    /// transactions must not be replayed). Durable when this returns.
    /// Checkpoints older transactions first if the log lacks room.
    pub fn commit(&mut self, blocks: &[(u64, &[u8])], revokes: &[u64], time: u64) -> Result<u32> {
        let owned = blocks.iter().map(|&(h, d)| (h, Block::from(d))).collect();
        self.commit_owned(owned, revokes, time, None)
    }

    /// [`LogWriter::commit`] taking the blocks by value: they are written
    /// to the log from where they lie and kept for the checkpoint without
    /// another copy. With `help`, the log writes of the data blocks are
    /// offered there (see [`InFlight`]).
    pub(crate) fn commit_owned(
        &mut self,
        blocks: Vec<(u64, Block)>,
        revokes: &[u64],
        time: u64,
        help: Option<&HelpSlot>,
    ) -> Result<u32> {
        let (seq, w) = self.begin(blocks, revokes, time)?;
        w.write(help)?;
        Ok(seq)
    }

    /// Reserve the next transaction's place in the log (checkpointing
    /// first if the log lacks room) and its turn to become durable:
    /// `blocks` (home block, new contents of one block) and `revokes`
    /// (home blocks whose logged copies in earlier transactions must not
    /// be replayed). Returns its sequence and what writes it
    /// ([`InFlight::write`], which may run on any thread, without the
    /// caller's lock).
    pub(crate) fn begin(
        &mut self,
        blocks: Vec<(u64, Block)>,
        revokes: &[u64],
        time: u64,
    ) -> Result<(u32, InFlight)> {
        let bs = self.g.bs as usize;
        for (home, data) in &blocks {
            if *home >= self.fs_blocks || data.len() != bs {
                return Err(corrupt(
                    format!("block {home}"),
                    "cannot be logged (beyond the filesystem or not one block)",
                ));
            }
            if self.sorted.binary_search(home).is_ok() {
                return Err(corrupt(format!("block {home}"), "lies inside the journal"));
            }
        }
        // Without the 64bit feature a tag or revoke record holds 32 bits:
        // a higher block number would be logged truncated, and a replay
        // would write it elsewhere.
        let wide = |b: &u64| *b > u64::from(u32::MAX);
        if !self.js.is_64bit() && (blocks.iter().any(|(h, _)| wide(h)) || revokes.iter().any(wide))
        {
            return Err(Error::Incompatible(
                "a block beyond 2^32 and a journal without the 64bit feature".into(),
            ));
        }
        if !revokes.is_empty() && !self.js.has_incompat(format::INCOMPAT_REVOKE) {
            return Err(Error::Incompatible(
                "the journal lacks the revoke feature".into(),
            ));
        }
        let seq = self.next_seq;
        let n = format::transaction_len(&self.js, blocks.len(), revokes.len()) as u32;
        // One block stays free so that head == tail means empty.
        if n >= self.js.log_len() {
            return Err(Error::Incompatible(format!(
                "a transaction of {n} log blocks does not fit a log of {}",
                self.js.log_len()
            )));
        }
        if self.used() + n >= self.js.log_len() {
            self.checkpoint()?;
        }
        let start = self.head;
        if self.sb_empty {
            // Recovery must find the log: point the superblock at it
            // (before this transaction's first flush, in `write`).
            self.write_jsb(start, seq)?;
        }
        self.head = self.g.log_index(start, n as usize);
        self.next_seq = seq.wrapping_add(1);
        let ticket = self.tickets;
        self.tickets += 1;
        self.live.push_back(Live {
            len: n,
            blocks: blocks.clone(),
        });
        Ok((
            seq,
            InFlight {
                g: self.g.clone(),
                order: self.order.clone(),
                ticket,
                seq,
                start,
                blocks,
                revokes: revokes.to_vec(),
                time,
            },
        ))
    }

    /// Wait until every transaction begun so far is durable (an error if
    /// one failed: the log is then unusable).
    pub fn wait_all(&self) -> Result<()> {
        if self.order.wait_turn(self.tickets) {
            Ok(())
        } else {
            Err(failed_before())
        }
    }

    /// Blocks freed since they were logged: a checkpoint must not write
    /// their logged copies home (a new owner may have put data there), and
    /// the caller logs revoke records for them.
    pub fn forget(&mut self, homes: &[u64]) {
        if homes.is_empty() {
            return;
        }
        let gone: std::collections::HashSet<u64> = homes.iter().copied().collect();
        for t in &mut self.live {
            t.blocks.retain(|(h, _)| !gone.contains(h));
        }
    }

    /// Write every committed transaction home, flush, and move the log
    /// tail past them in the journal superblock (flushed).
    pub fn checkpoint(&mut self) -> Result<()> {
        if self.live.is_empty() {
            return Ok(());
        }
        self.wait_all()?;
        // The newest copy of each block only: a block logged by many
        // transactions (the superblock, a bitmap, a descriptor block:
        // nearly every one) goes home once, not once per transaction.
        let mut home_done = std::collections::HashSet::new();
        for t in self.live.iter().rev() {
            for (home, data) in t.blocks.iter().rev() {
                if home_done.insert(*home) {
                    self.g.dev.write_at(home * self.g.bs, data)?;
                }
            }
        }
        self.g.dev.flush()?;
        for t in self.live.drain(..) {
            self.tail = (self.tail - self.js.first + t.len) % self.js.log_len() + self.js.first;
        }
        // The log is empty from here: the next transaction starts at head.
        self.write_jsb(self.head, self.next_seq)?;
        self.g.dev.flush()?;
        Ok(())
    }

    /// Checkpoint everything, mark the journal empty and clear
    /// needs_recovery: a clean unmount.
    pub fn close(mut self) -> Result<()> {
        self.checkpoint()?;
        let seq = self.next_seq;
        self.write_jsb(0, seq)?;
        self.g.dev.flush()?;
        set_needs_recovery(&*self.g.dev, false)?;
        Ok(())
    }
}

/// The error of a transaction written after one that failed.
fn failed_before() -> Error {
    Error::Io(std::io::Error::other(
        "an earlier journal commit failed; the log takes no more",
    ))
}

impl InFlight {
    fn write_inner(&self, help: Option<&HelpSlot>) -> Result<()> {
        let g = &self.g;
        // Offered before the checksums are computed: a waiter writes the
        // data blocks meanwhile.
        let shared = help.filter(|_| !self.blocks.is_empty()).map(|h| {
            let w = Arc::new(g.data_writes(self.start, &self.blocks, self.revokes.len()));
            h.post(&w);
            (h, w)
        });
        let refs: Vec<(u64, &[u8])> = self.blocks.iter().map(|(h, d)| (*h, &d[..])).collect();
        let log = format::layout_transaction(&g.js, self.seq, &refs, &self.revokes, self.time);
        let body = &log[..log.len() - 1];
        let at = match shared {
            None => g.write_run(self.start, body)?,
            Some((h, w)) => {
                let r = g.write_meta(self.start, body, self.revokes.len(), self.blocks.len());
                // Always waited for, even after an error: no write of
                // this commit may land after it returns.
                let d = w.finish();
                h.withdraw(&w);
                r?;
                d?;
                g.log_index(self.start, body.len())
            }
        };
        // The body is durable before the commit block is written.
        g.dev.flush()?;
        if !self.order.wait_turn(self.ticket) {
            return Err(failed_before());
        }
        g.write_log(at, log[log.len() - 1].bytes())?;
        g.dev.flush()?;
        self.order.pass(self.ticket);
        Ok(())
    }
}

impl LogWrite for InFlight {
    fn write(self: Box<Self>, help: Option<&HelpSlot>) -> Result<()> {
        InFlight::write(*self, help)
    }
}

impl InFlight {
    /// Write the transaction and return when it is durable: the log
    /// blocks, a flush, then (in its turn) the commit block and a flush.
    /// A failure fails every later transaction too.
    pub(crate) fn write(self, help: Option<&HelpSlot>) -> Result<()> {
        let r = self.write_inner(help);
        if r.is_err() {
            self.order.fail();
        }
        r
    }
}

impl crate::txn::LogSink for LogWriter {
    fn begin(
        &mut self,
        blocks: Vec<(u64, Block)>,
        revokes: &[u64],
        time: u64,
    ) -> Result<Box<dyn LogWrite>> {
        let (_, w) = LogWriter::begin(self, blocks, revokes, time)?;
        Ok(Box::new(w))
    }
    fn wait_all(&self) -> Result<()> {
        LogWriter::wait_all(self)
    }
    fn checkpoint(&mut self) -> Result<()> {
        LogWriter::checkpoint(self)
    }
    fn forget(&mut self, homes: &[u64]) {
        LogWriter::forget(self, homes)
    }
    fn room(&self) -> u32 {
        LogWriter::room(self)
    }
    fn capacity(&self) -> u32 {
        self.js.log_len()
    }
    fn tags_per_block(&self) -> u32 {
        format::tags_per_descriptor(&self.js) as u32
    }
    fn close(self: Box<Self>) -> Result<()> {
        LogWriter::close(*self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;
    use crate::mkfs::{self, MkfsOptions};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    fn image(bs: u32) -> Vec<u8> {
        // One file per call: tests run in parallel, and mkfs takes the
        // image's flock.
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "scalevfs-writer-shared-{}-{bs}-{}.img",
            std::process::id(),
            // Relaxed: only uniqueness matters.
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let o = MkfsOptions {
            size: 8 << 20,
            block_size: Some(bs),
            uuid: Some([7; 16]),
            hash_seed: Some([9; 16]),
            now: Some(1_700_000_000),
            ..Default::default()
        };
        mkfs::make(&path, &o).unwrap();
        let b = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        b
    }

    /// A block number past 2^32 cannot be logged in a journal without the
    /// 64bit feature (its tags hold 32 bits): refused, nothing written,
    /// rather than logged truncated for a replay to misplace.
    #[test]
    fn wide_block_numbers_need_the_64bit_journal() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(image(1024)));
        let mut w = LogWriter::open(dev, true).unwrap();
        assert!(!w.journal().is_64bit());
        // As if the filesystem were that large.
        w.fs_blocks = 1 << 33;
        let wide = (1u64 << 32) + 5;
        let data = vec![0u8; 1024];
        let seq = w.next_sequence();
        assert!(matches!(
            w.commit(&[(wide, &data[..])], &[], 0),
            Err(Error::Incompatible(_))
        ));
        assert!(matches!(
            w.commit(&[(100, &data[..])], &[wide], 0),
            Err(Error::Incompatible(_))
        ));
        assert_eq!(
            w.next_sequence(),
            seq,
            "a refused transaction took a sequence"
        );
        // A narrow block still commits.
        w.commit(&[(100, &data[..])], &[], 0).unwrap();
    }

    /// The log writes a waiting thread does for the committer
    /// (`HelpSlot`) leave the same bytes on the device as the committer
    /// writing alone: descriptors and data blocks in their places across
    /// descriptor runs, revoke blocks, an escaped block and the wrap at
    /// the end of the log (with checkpoints).
    #[test]
    fn shared_log_writes_leave_the_same_log() {
        for bs in [1024u32, 4096] {
            let base = image(bs);
            let alone: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(base.clone()));
            let shared: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(base));
            let mut wa = LogWriter::open(alone.clone(), true).unwrap();
            let mut wb = LogWriter::open(shared.clone(), true).unwrap();
            let per_desc = format::tags_per_descriptor(wa.journal());
            let log_len = wa.journal().log_len() as usize;
            // Home blocks outside the journal.
            let homes: Vec<u64> = (100..wa.fs_blocks)
                .filter(|b| wa.sorted.binary_search(b).is_err())
                .take(400)
                .collect();
            let slot = HelpSlot::new();
            let stop = AtomicBool::new(false);
            let helped = AtomicUsize::new(0);
            std::thread::scope(|s| {
                s.spawn(|| {
                    // Relaxed: a stop flag; the scope's join orders the rest.
                    while !stop.load(Ordering::Relaxed) {
                        if slot.help() {
                            helped.fetch_add(1, Ordering::Relaxed);
                        }
                        std::hint::spin_loop();
                    }
                });
                // Stops the helper however this thread leaves (a failed
                // assertion included).
                struct Stop<'a>(&'a AtomicBool);
                impl Drop for Stop<'_> {
                    fn drop(&mut self) {
                        // Relaxed: see the helper.
                        self.0.store(true, Ordering::Relaxed);
                    }
                }
                let _stop = Stop(&stop);
                let mut logged = 0usize;
                let mut t = 0u64;
                // Around the log about three times.
                while logged < 3 * log_len {
                    let n = [1, per_desc, per_desc + 3, 2 * per_desc + 1][t as usize % 4]
                        .min(log_len / 5);
                    let blocks: Vec<(u64, Block)> = (0..n)
                        .map(|i| {
                            let mut d = vec![(t as u8).wrapping_add(i as u8) | 1; bs as usize];
                            if i == 1 || i + 1 == n {
                                // Starts with the journal magic: escaped
                                // (inside and at the end of a commit).
                                d[..4].copy_from_slice(&format::MAGIC.to_be_bytes());
                            }
                            (homes[(t as usize * 7 + i) % 300], Block::from(d))
                        })
                        .collect();
                    let revokes: Vec<u64> = if t % 3 == 2 {
                        vec![homes[300], homes[301 + t as usize % 99]]
                    } else {
                        vec![]
                    };
                    let time = 1_700_000_000 + t;
                    wa.commit_owned(blocks.clone(), &revokes, time, None)
                        .unwrap();
                    wb.commit_owned(blocks, &revokes, time, Some(&slot))
                        .unwrap();
                    logged += format::transaction_len(wa.journal(), n, revokes.len());
                    t += 1;
                }
            });
            let mut a = vec![0u8; alone.size() as usize];
            let mut b = vec![0u8; shared.size() as usize];
            alone.read_at(0, &mut a).unwrap();
            shared.read_at(0, &mut b).unwrap();
            assert!(
                a == b,
                "bs {bs}: the devices differ (helper wrote {} times)",
                helped.load(Ordering::Relaxed)
            );
        }
    }
}
