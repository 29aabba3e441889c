//! The jbd2 journal of an ext4 image: its on-disk format ([`format`]),
//! recovery at mount ([`recovery`]) and a log writer ([`writer`]).
//!
//! [`replay_on_open`] is the hook `Ext4::open_device` calls: an image whose
//! superblock says needs_recovery gets its journal replayed — on the device
//! ([`Replay::OnDevice`]) or in a view in memory that leaves the device
//! untouched ([`Replay::InMemory`]) — or is refused as before
//! ([`Replay::Refuse`], the default).

pub mod format;
pub mod recovery;
pub mod writer;

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;

use crate::device::BlockDevice;
use crate::error::{corrupt, Error, Result};
use crate::format::checksum::crc32c;
use crate::format::features::{COMPAT_HAS_JOURNAL, INCOMPAT_RECOVER, RO_COMPAT_METADATA_CSUM};
use crate::format::superblock::{SB_OFFSET, SB_SIZE};
use crate::fs::{Ext4, Ext4Options, Mapping};

use format::JournalSuperblock;
use recovery::{LogRead, Plan};

pub use crate::fs::Replay;

// Fields of the ext4 superblock this module edits.
const SB_WTIME: usize = 0x30;
const SB_WTIME_HI: usize = 0x274;
const SB_STATE: usize = 0x3A;
const SB_COMPAT: usize = 0x5C;
const SB_INCOMPAT: usize = 0x60;
const SB_RO_COMPAT: usize = 0x64;
const SB_JOURNAL_INUM: usize = 0xE0;
const SB_CSUM: usize = 0x3FC;
/// s_state: errors were detected.
const STATE_ERROR_FS: u16 = 0x2;

fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Clear needs_recovery in a superblock image (1024 bytes), mark errors if
/// asked, set the write time to `now` if given (as e2fsck's flush does),
/// and recompute its checksum under metadata_csum.
fn fix_superblock(sb: &mut [u8], errors: bool, now: Option<u64>) {
    if let Some(t) = now {
        sb[SB_WTIME..SB_WTIME + 4].copy_from_slice(&(t as u32).to_le_bytes());
        sb[SB_WTIME_HI] = (t >> 32) as u8;
    }
    let inc = le32(sb, SB_INCOMPAT) & !INCOMPAT_RECOVER;
    sb[SB_INCOMPAT..SB_INCOMPAT + 4].copy_from_slice(&inc.to_le_bytes());
    if errors {
        let st = u16::from_le_bytes([sb[SB_STATE], sb[SB_STATE + 1]]) | STATE_ERROR_FS;
        sb[SB_STATE..SB_STATE + 2].copy_from_slice(&st.to_le_bytes());
    }
    if le32(sb, SB_RO_COMPAT) & RO_COMPAT_METADATA_CSUM != 0 {
        let c = crc32c(!0, &sb[..SB_CSUM]);
        sb[SB_CSUM..SB_CSUM + 4].copy_from_slice(&c.to_le_bytes());
    }
}

/// Set or clear needs_recovery in the primary superblock (checksum
/// redone) and flush.
pub(crate) fn set_needs_recovery(dev: &dyn BlockDevice, on: bool) -> Result<()> {
    let mut sb = vec![0u8; SB_SIZE];
    dev.read_at(SB_OFFSET, &mut sb)?;
    if on {
        let inc = le32(&sb, SB_INCOMPAT) | INCOMPAT_RECOVER;
        sb[SB_INCOMPAT..SB_INCOMPAT + 4].copy_from_slice(&inc.to_le_bytes());
        if le32(&sb, SB_RO_COMPAT) & RO_COMPAT_METADATA_CSUM != 0 {
            let c = crc32c(!0, &sb[..SB_CSUM]);
            sb[SB_CSUM..SB_CSUM + 4].copy_from_slice(&c.to_le_bytes());
        }
    } else {
        fix_superblock(&mut sb, false, None);
    }
    dev.write_at(SB_OFFSET, &sb)?;
    dev.flush()?;
    Ok(())
}

/// Where a block of a [`ReplayView`] comes from.
enum Source {
    /// These bytes (a rewritten superblock).
    Bytes(Box<[u8]>),
    /// A logged copy: physical block `pblk`, magic restored if `escape`.
    Logged { pblk: u64, escape: bool },
}

/// A read-only view of a device with some blocks replaced: the recovered
/// filesystem without writing the device. Writes fail (EROFS).
pub struct ReplayView {
    inner: Arc<dyn BlockDevice>,
    bs: u64,
    blocks: BTreeMap<u64, Source>,
}

impl ReplayView {
    fn block(&self, src: &Source, buf: &mut [u8]) -> io::Result<()> {
        match src {
            Source::Bytes(b) => buf.copy_from_slice(b),
            Source::Logged { pblk, escape } => {
                self.inner.read_at(pblk * self.bs, buf)?;
                if *escape {
                    buf[..4].copy_from_slice(&format::MAGIC.to_be_bytes());
                }
            }
        }
        Ok(())
    }

    /// Blocks replaced in this view.
    pub fn replaced_blocks(&self) -> usize {
        self.blocks.len()
    }
}

impl BlockDevice for ReplayView {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = off
            .checked_add(buf.len() as u64)
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        if buf.is_empty() {
            return Ok(());
        }
        let (first, last) = (off / self.bs, (end - 1) / self.bs);
        if self.blocks.range(first..=last).next().is_none() {
            return self.inner.read_at(off, buf);
        }
        let mut pos = off;
        let mut tmp = vec![0u8; self.bs as usize];
        while pos < end {
            let blk = pos / self.bs;
            let in_blk = (pos % self.bs) as usize;
            let n = ((self.bs as usize) - in_blk).min((end - pos) as usize);
            let dst = &mut buf[(pos - off) as usize..(pos - off) as usize + n];
            match self.blocks.get(&blk) {
                Some(src) => {
                    self.block(src, &mut tmp)?;
                    dst.copy_from_slice(&tmp[in_blk..in_blk + n]);
                }
                None => self.inner.read_at(pos, dst)?,
            }
            pos += n as u64;
        }
        Ok(())
    }
    fn write_at(&self, _off: u64, _buf: &[u8]) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EROFS))
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

/// The journal's log blocks on the device.
struct JournalLog {
    dev: Arc<dyn BlockDevice>,
    bs: usize,
    /// Log block index -> physical block.
    map: Vec<u64>,
}

impl LogRead for JournalLog {
    fn read_log(&self, idx: u32, buf: &mut [u8]) -> Result<()> {
        let p = *self
            .map
            .get(idx as usize)
            .ok_or_else(|| corrupt("journal", format!("log block {idx} beyond the journal")))?;
        self.dev.read_at(p * self.bs as u64, buf)?;
        Ok(())
    }
}

/// What recovery found and did.
#[derive(Clone, Debug)]
pub struct Recovered {
    pub plan: Plan,
    /// The journal superblock before recovery.
    pub journal: JournalSuperblock,
}

/// Everything recovery needs, read and checked: the plan plus the blocks
/// to rewrite.
struct Prepared {
    recovered: Recovered,
    bs: u64,
    journal_map: Vec<u64>,
    /// The block holding the primary superblock and its new contents.
    sb_block: (u64, Vec<u8>),
    /// The superblock's offset in that block.
    sb_off: usize,
    /// Journal superblock's block (log block 0) and its new contents.
    jsb_block: (u64, Vec<u8>),
}

/// Read the journal of the image on `dev` (whose superblock says
/// needs_recovery) and plan its replay; writes nothing.
/// The journal of an image, located and checked.
pub(crate) struct Loaded {
    pub js: JournalSuperblock,
    /// Filesystem block size.
    pub bs: u64,
    pub fs_blocks: u64,
    /// Log block index -> physical block (s_maxlen entries).
    pub map: Vec<u64>,
    /// The block holding the primary superblock, and its offset there.
    pub sbblk: u64,
    pub sboff: usize,
    /// The journal superblock's block as read.
    pub jsb_block: Vec<u8>,
}

/// Locate the journal of the image on `dev` through its inode (read with
/// needs_recovery masked so the reader accepts the image) and check its
/// superblock; writes nothing.
pub(crate) fn load(dev: &Arc<dyn BlockDevice>) -> Result<Loaded> {
    let mut sb = vec![0u8; SB_SIZE];
    dev.read_at(SB_OFFSET, &mut sb)?;
    if le32(&sb, SB_RO_COMPAT) & RO_COMPAT_METADATA_CSUM != 0 {
        let c = crc32c(!0, &sb[..SB_CSUM]);
        if c != le32(&sb, SB_CSUM) {
            return Err(corrupt("superblock", "checksum (before journal recovery)"));
        }
    }
    if le32(&sb, SB_COMPAT) & COMPAT_HAS_JOURNAL == 0 || le32(&sb, SB_JOURNAL_INUM) == 0 {
        return Err(Error::Incompatible(
            "no internal journal (external journals are not supported)".into(),
        ));
    }
    // Read the journal inode through a reader that sees needs_recovery
    // cleared (the rest of the image as it is).
    let mut clean = sb.clone();
    fix_superblock(&mut clean, false, None);
    let bs0 = 1024u64 << le32(&sb, 0x18).min(6);
    let (sbblk, sboff) = (SB_OFFSET / bs0, (SB_OFFSET % bs0) as usize);
    let mut blk = vec![0u8; bs0 as usize];
    dev.read_at(sbblk * bs0, &mut blk)?;
    blk[sboff..sboff + SB_SIZE].copy_from_slice(&clean);
    let view = ReplayView {
        inner: dev.clone(),
        bs: bs0,
        blocks: BTreeMap::from([(sbblk, Source::Bytes(blk.into()))]),
    };
    let fs = Ext4::open_unreplayed(Box::new(view), Ext4Options::default())?;
    let bs = fs.block_size() as u64;
    let fs_blocks = fs.superblock().blocks_count;
    let jino = fs.superblock().journal_inum;
    let raw = fs.read_inode(jino)?;
    let jblocks = raw.size / bs;
    if jblocks < 2 || jblocks > fs_blocks || jblocks > u64::from(u32::MAX) {
        return Err(corrupt(
            format!("journal inode {jino}"),
            format!("size {}", raw.size),
        ));
    }
    // Log block 0 holds the journal superblock.
    let first = match fs.map_block(&raw, 0)? {
        Mapping::Data {
            pblk,
            uninit: false,
            ..
        } => pblk,
        m => {
            return Err(corrupt(
                format!("journal inode {jino}"),
                format!("block 0: {m:?}"),
            ))
        }
    };
    let mut jb = vec![0u8; bs as usize];
    dev.read_at(first * bs, &mut jb)?;
    let js = JournalSuperblock::parse(&jb, bs as usize, jblocks)?;
    // Map every journal block (s_maxlen <= the inode's blocks, checked).
    let maxlen = u64::from(js.maxlen);
    let mut map = Vec::with_capacity(maxlen as usize);
    while (map.len() as u64) < maxlen {
        let l = map.len() as u32;
        match fs.map_block(&raw, l)? {
            Mapping::Data {
                pblk,
                count,
                uninit: false,
            } if count > 0 => {
                let n = count.min(maxlen - map.len() as u64);
                if pblk.checked_add(n).is_none_or(|e| e > fs_blocks) {
                    return Err(corrupt(
                        format!("journal inode {jino}"),
                        "extent beyond the filesystem",
                    ));
                }
                map.extend(pblk..pblk + n);
            }
            m => {
                return Err(corrupt(
                    format!("journal inode {jino}"),
                    format!("block {l}: {m:?} (a journal has no holes)"),
                ))
            }
        }
    }
    drop(fs);
    Ok(Loaded {
        js,
        bs,
        fs_blocks,
        map,
        sbblk,
        sboff,
        jsb_block: jb,
    })
}

fn prepare(dev: &Arc<dyn BlockDevice>) -> Result<Prepared> {
    let Loaded {
        js,
        bs,
        fs_blocks,
        map,
        sbblk,
        sboff,
        jsb_block: jb,
    } = load(dev)?;
    let first = map[0];
    let mut sorted = map.clone();
    sorted.sort_unstable();
    let log = JournalLog {
        dev: dev.clone(),
        bs: bs as usize,
        map,
    };
    let plan = recovery::plan(&js, &log, fs_blocks, &sorted)?;
    // The primary superblock after recovery: the replayed copy if the log
    // holds one, needs_recovery cleared.
    let mut sbb = vec![0u8; bs as usize];
    match plan.writes.get(&sbblk) {
        Some(l) => {
            log.read_log(l.log_block, &mut sbb)?;
            if l.escape {
                sbb[..4].copy_from_slice(&format::MAGIC.to_be_bytes());
            }
        }
        None => dev.read_at(sbblk * bs, &mut sbb)?,
    }
    if plan.writes.contains_key(&sbblk) {
        // As ext4_load_journal: the error area and EXT4_ERROR_FS of the
        // superblock before the replay survive it.
        let mut old = vec![0u8; SB_SIZE];
        dev.read_at(SB_OFFSET, &mut old)?;
        let s = &mut sbb[sboff..sboff + SB_SIZE];
        s[0x194..0x200].copy_from_slice(&old[0x194..0x200]);
        let st = u16::from_le_bytes([s[SB_STATE], s[SB_STATE + 1]])
            | (u16::from_le_bytes([old[SB_STATE], old[SB_STATE + 1]]) & STATE_ERROR_FS);
        s[SB_STATE..SB_STATE + 2].copy_from_slice(&st.to_le_bytes());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    fix_superblock(
        &mut sbb[sboff..sboff + SB_SIZE],
        // e2fsck marks the filesystem as having errors for a corrupt
        // commit block or an aborted journal (s_errno set).
        plan.failed_commit.is_some() || js.errno != 0,
        Some(now),
    );
    let mut jsb = jb;
    jsb[..format::SB_SIZE].copy_from_slice(&js.reset_bytes(plan.next_sequence()));
    let journal_map = log.map;
    Ok(Prepared {
        recovered: Recovered { plan, journal: js },
        bs,
        sb_block: (sbblk, sbb),
        sb_off: sboff,
        jsb_block: (first, jsb),
        journal_map,
    })
}

/// Replay the journal of the image on `dev` onto `dev`: every replayed
/// block, a flush, the journal superblock marked empty, a flush, then the
/// superblock without needs_recovery and a last flush. A crash at any
/// point leaves an image that recovers again to the same state.
pub fn recover(dev: &Arc<dyn BlockDevice>) -> Result<Recovered> {
    let p = prepare(dev)?;
    // The journal superblock goes first, unchanged: a device that cannot
    // be written fails here, before anything changed, with a clear message.
    let mut jsb = vec![0u8; p.bs as usize];
    dev.read_at(p.jsb_block.0 * p.bs, &mut jsb)?;
    dev.write_at(p.jsb_block.0 * p.bs, &jsb).map_err(|e| {
        Error::Incompatible(format!(
            "the journal needs recovery and the device cannot be written ({e}): \
             open it read-write, or replay in memory (Replay::InMemory)"
        ))
    })?;
    // The superblock as it will be (replayed copy, errors marked) but
    // still needing recovery goes out with the home blocks: a crash after
    // the journal is emptied below loses neither.
    let mut early = p.sb_block.1.clone();
    {
        let s = &mut early[p.sb_off..p.sb_off + SB_SIZE];
        let inc = le32(s, SB_INCOMPAT) | INCOMPAT_RECOVER;
        s[SB_INCOMPAT..SB_INCOMPAT + 4].copy_from_slice(&inc.to_le_bytes());
        if le32(s, SB_RO_COMPAT) & RO_COMPAT_METADATA_CSUM != 0 {
            let c = crc32c(!0, &s[..SB_CSUM]);
            s[SB_CSUM..SB_CSUM + 4].copy_from_slice(&c.to_le_bytes());
        }
    }
    dev.write_at(p.sb_block.0 * p.bs, &early)?;
    let mut buf = vec![0u8; p.bs as usize];
    for (&home, l) in &p.recovered.plan.writes {
        if home == p.sb_block.0 {
            continue;
        }
        dev.read_at(p.journal_map[l.log_block as usize] * p.bs, &mut buf)?;
        if l.escape {
            buf[..4].copy_from_slice(&format::MAGIC.to_be_bytes());
        }
        dev.write_at(home * p.bs, &buf)?;
    }
    dev.flush()?;
    dev.write_at(p.jsb_block.0 * p.bs, &p.jsb_block.1)?;
    dev.flush()?;
    dev.write_at(p.sb_block.0 * p.bs, &p.sb_block.1)?;
    dev.flush()?;
    Ok(p.recovered)
}

/// The recovered image as a read-only view over `dev`, which is never
/// written.
pub fn recover_in_memory(dev: Arc<dyn BlockDevice>) -> Result<(ReplayView, Recovered)> {
    let p = prepare(&dev)?;
    let mut blocks = BTreeMap::new();
    for (&home, l) in &p.recovered.plan.writes {
        blocks.insert(
            home,
            Source::Logged {
                pblk: p.journal_map[l.log_block as usize],
                escape: l.escape,
            },
        );
    }
    blocks.insert(p.jsb_block.0, Source::Bytes(p.jsb_block.1.into()));
    blocks.insert(p.sb_block.0, Source::Bytes(p.sb_block.1.into()));
    let view = ReplayView {
        inner: dev,
        bs: p.bs,
        blocks,
    };
    Ok((view, p.recovered))
}

/// The hook of `Ext4::open_device`: `dev` unchanged unless its superblock
/// says needs_recovery and `how` allows a replay; then the device after
/// recovery (on it, or in a view in memory).
pub fn replay_on_open(dev: Box<dyn BlockDevice>, how: Replay) -> Result<Box<dyn BlockDevice>> {
    let mut sb = vec![0u8; SB_SIZE];
    dev.read_at(SB_OFFSET, &mut sb)?;
    // Refuse: the superblock parser refuses it with its own message.
    if how == Replay::Refuse
        || le32(&sb, 0x38) & 0xFFFF != 0xEF53
        || le32(&sb, SB_INCOMPAT) & INCOMPAT_RECOVER == 0
    {
        return Ok(dev);
    }
    let dev: Arc<dyn BlockDevice> = Arc::from(dev);
    if how == Replay::InMemory {
        return Ok(Box::new(recover_in_memory(dev)?.0));
    }
    recover(&dev)?;
    Ok(Box::new(dev))
}
