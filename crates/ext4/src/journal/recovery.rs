//! Journal recovery as jbd2 does it, in three passes over the circular
//! log: *scan* finds the end of the log (the first transaction without a
//! valid commit block), *revoke* collects the revoke records with their
//! sequence numbers, *replay* maps every logged block that no later (or
//! the same) transaction revoked to its home location.
//!
//! The result is a [`Plan`]: nothing is written here. Every check (block
//! checksums, tags, home block numbers) passes before the caller writes
//! a single block home, so a corrupt journal leaves the image untouched.
//! Every walk is bounded by the log's length: a log that claims more
//! blocks than the journal holds is corruption, never a loop.

use std::collections::{BTreeMap, HashMap};

use super::format::{self, JournalSuperblock};
use crate::error::{corrupt, Result};

/// Reads log block `idx` (0 ..= s_maxlen - 1) of the journal.
pub trait LogRead {
    fn read_log(&self, idx: u32, buf: &mut [u8]) -> Result<()>;
}

/// Where the newest copy of a home block lies in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Logged {
    /// Log block index (within the journal).
    pub log_block: u32,
    /// Restore the magic in the first four bytes.
    pub escape: bool,
}

/// What recovery would do.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// The first transaction in the log.
    pub start_transaction: u32,
    /// The first transaction *not* replayed (the end of the valid log).
    pub end_transaction: u32,
    /// Home block -> its newest logged copy, in block order.
    pub writes: BTreeMap<u64, Logged>,
    /// Tags replayed (a block logged twice counts twice, as jbd2 counts).
    pub replays: u64,
    /// Tags skipped because a revoke record covered them.
    pub revoke_hits: u64,
    /// Revoke records read.
    pub revokes: u64,
    /// A transaction whose commit block failed its checksum (the log ends
    /// there; e2fsck flags the filesystem with errors).
    pub failed_commit: Option<u32>,
}

impl Plan {
    /// The s_sequence the journal superblock gets after recovery.
    pub fn next_sequence(&self) -> u32 {
        self.end_transaction.wrapping_add(1)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pass {
    Scan,
    Revoke,
    Replay,
}

/// Transaction ids wrap: a is after b when the signed difference is positive.
fn tid_gt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

fn tid_geq(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

struct Walk<'a> {
    js: &'a JournalSuperblock,
    log: &'a dyn LogRead,
    /// Blocks of the filesystem (home blocks must lie below).
    fs_blocks: u64,
    /// The journal's own physical blocks, sorted (a home block among them
    /// would overwrite the log being replayed).
    journal_blocks: &'a [u64],
    end: Option<u32>,
    revoked: HashMap<u64, u32>,
    plan: Plan,
}

/// Plan the recovery of the journal described by `js`, whose log blocks
/// `log` reads. `journal_blocks` is the sorted list of physical blocks the
/// journal occupies.
pub fn plan(
    js: &JournalSuperblock,
    log: &dyn LogRead,
    fs_blocks: u64,
    journal_blocks: &[u64],
) -> Result<Plan> {
    let mut w = Walk {
        js,
        log,
        fs_blocks,
        journal_blocks,
        end: None,
        revoked: HashMap::new(),
        plan: Plan {
            start_transaction: js.sequence,
            end_transaction: js.sequence,
            ..Plan::default()
        },
    };
    if js.start == 0 {
        // Clean: nothing to replay.
        return Ok(w.plan);
    }
    w.pass(Pass::Scan)?;
    w.pass(Pass::Revoke)?;
    w.pass(Pass::Replay)?;
    w.plan.end_transaction = w.end.unwrap_or(js.sequence);
    Ok(w.plan)
}

impl Walk<'_> {
    fn pass(&mut self, pass: Pass) -> Result<()> {
        let js = self.js;
        let bs = js.block_size as usize;
        let log_len = u64::from(js.log_len());
        let mut seq = js.sequence;
        let mut blk = js.start;
        // Log blocks consumed so far: a valid log fits in the journal.
        let mut used: u64 = 0;
        let mut need_check_time = false;
        // The running checksum v1 of the current transaction.
        let mut crc: u32 = !0;
        let mut last_time = 0u64;
        let mut b = vec![0u8; bs];
        let mut data = vec![0u8; bs];
        let what = |blk: u32| format!("journal block {blk}");
        loop {
            if pass != Pass::Scan && self.end.is_some_and(|e| tid_geq(seq, e)) {
                break;
            }
            used += 1;
            if used > log_len {
                if pass == Pass::Scan {
                    // jbd2 reads on (the log's first block, whose sequence
                    // cannot match): the log ends here.
                    break;
                }
                return Err(corrupt(
                    "journal",
                    format!("the log runs past its {log_len} blocks without ending"),
                ));
            }
            let here = blk;
            self.log.read_log(here, &mut b)?;
            blk = js.wrap_next(blk);
            let Some((blocktype, hseq)) = format::header(&b) else {
                break;
            };
            if hseq != seq {
                break;
            }
            match blocktype {
                format::DESCRIPTOR_BLOCK => {
                    if !format::block_tail_ok(js, &b) {
                        // The scan may meet stale blocks of an older log
                        // (judged at the commit); later passes never should.
                        if pass != Pass::Scan {
                            return Err(corrupt(what(here), "descriptor block checksum"));
                        }
                        need_check_time = true;
                    }
                    let tags = format::tags(js, &b);
                    let n = tags.len() as u64;
                    if used + n > log_len {
                        if pass == Pass::Scan {
                            // No room for it: never committed (a torn or
                            // stale descriptor); jbd2 skips its count and
                            // finds no commit. The log ends here.
                            break;
                        }
                        return Err(corrupt(
                            what(here),
                            format!("{n} tags run past the end of the log"),
                        ));
                    }
                    if pass == Pass::Scan
                        && format::v1_checksums(js)
                        && !need_check_time
                        && self.end.is_none()
                    {
                        // Checksum v1 covers the descriptor and its data.
                        crc = format::crc32_be(crc, &b);
                        for _ in 0..n {
                            self.log.read_log(blk, &mut data)?;
                            crc = format::crc32_be(crc, &data);
                            blk = js.wrap_next(blk);
                        }
                        used += n;
                        continue;
                    }
                    if pass != Pass::Replay {
                        used += n;
                        let off = u64::from(blk - js.first) + n;
                        blk = js.first + (off % log_len) as u32;
                        continue;
                    }
                    for tag in tags {
                        let io = blk;
                        blk = js.wrap_next(blk);
                        used += 1;
                        if self.is_revoked(tag.blocknr, seq) {
                            self.plan.revoke_hits += 1;
                            continue;
                        }
                        self.log.read_log(io, &mut data)?;
                        if !tag.csum_ok(js, seq, &data) {
                            return Err(corrupt(
                                what(io),
                                format!(
                                    "checksum of the logged copy of block {} (transaction {seq})",
                                    tag.blocknr
                                ),
                            ));
                        }
                        if tag.blocknr >= self.fs_blocks {
                            return Err(corrupt(
                                what(io),
                                format!("home block {} beyond the filesystem", tag.blocknr),
                            ));
                        }
                        if self.journal_blocks.binary_search(&tag.blocknr).is_ok() {
                            return Err(corrupt(
                                what(io),
                                format!("home block {} lies inside the journal", tag.blocknr),
                            ));
                        }
                        self.plan.writes.insert(
                            tag.blocknr,
                            Logged {
                                log_block: io,
                                escape: tag.flags & format::FLAG_ESCAPE != 0,
                            },
                        );
                        self.plan.replays += 1;
                    }
                }
                format::COMMIT_BLOCK => {
                    if pass == Pass::Scan {
                        let t = format::commit_time(&b);
                        if need_check_time {
                            if t >= last_time {
                                return Err(corrupt(
                                    what(here),
                                    format!(
                                        "a block of committed transaction {seq} fails its checksum"
                                    ),
                                ));
                            }
                            // An older log's leftovers: the log ends here.
                            break;
                        }
                        let mut bad = !format::commit_ok(js, &b);
                        if format::v1_checksums(js) {
                            if let Some(e) = self.end {
                                // After an async commit's bad checksum: the
                                // next commit ends the scan.
                                self.plan.failed_commit = Some(e);
                                break;
                            }
                            let (ty, size, found) = format::commit_v1(&b);
                            let ok = crc == found && ty == format::CHECKSUM_CRC32 && size == 4;
                            // Commits written without checksums (all zero) pass.
                            let unchecked = ty == 0 && size == 0 && found == 0;
                            bad |= !(ok || unchecked);
                            crc = !0;
                        }
                        if bad {
                            if t < last_time {
                                break;
                            }
                            self.end = Some(seq);
                            if !js.has_incompat(format::INCOMPAT_ASYNC_COMMIT) {
                                self.plan.failed_commit = Some(seq);
                                break;
                            }
                            // As jbd2: the scan goes on, and this commit's
                            // time becomes last_trans_commit_time.
                        }
                        last_time = t;
                    }
                    seq = seq.wrapping_add(1);
                }
                format::REVOKE_BLOCK => {
                    let ok = format::block_tail_ok(js, &b);
                    if pass == Pass::Scan && !ok {
                        need_check_time = true;
                    }
                    if pass != Pass::Revoke {
                        continue;
                    }
                    if !ok {
                        return Err(corrupt(what(here), "revoke block checksum"));
                    }
                    for r in format::revoke_records(js, &b, &what(here))? {
                        let e = self.revoked.entry(r).or_insert(seq);
                        if tid_gt(seq, *e) {
                            *e = seq;
                        }
                        self.plan.revokes += 1;
                    }
                }
                // Unknown block types (fast-commit blocks included) end the log.
                _ => break,
            }
        }
        match pass {
            Pass::Scan => {
                if self.end.is_none() {
                    self.end = Some(seq);
                }
            }
            _ => {
                if self.end != Some(seq) {
                    return Err(corrupt(
                        "journal",
                        format!(
                            "recovery pass {pass:?} ended at transaction {seq}, the scan at {:?}",
                            self.end
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// A revoke record from transaction `seq` or later covers `blk`.
    fn is_revoked(&self, blk: u64, seq: u32) -> bool {
        self.revoked.get(&blk).is_some_and(|&r| !tid_gt(seq, r))
    }
}
