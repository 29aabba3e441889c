//! Journal recovery at the edges where it used to differ from the
//! kernel's and e2fsck's `recovery.c` (found by review, stop 38; each
//! failed before the fix):
//! - an async_commit journal whose commit fails its checksum: that
//!   commit's time still becomes the last commit time, so a later commit
//!   with an older time ends the log (e2fsck replays the same);
//! - a torn descriptor never committed, whose tags would run past the
//!   log's end, ends the log in the scan instead of refusing it (e2fsck
//!   replays the same);
//! - a crash after the journal is emptied but before the replayed
//!   superblock is written no longer loses that superblock: it goes out
//!   with the home blocks, still marked as needing recovery;
//! - the superblock's error area and EXT4_ERROR_FS survive the replay of
//!   a logged superblock (the kernel's `ext4_load_journal`).

mod common;
#[path = "support/journal_images.rs"]
mod journal_images;

use std::path::Path;
use std::sync::Arc;

use journal_images::*;
use scalevfs_ext4::journal::{self, format as jf};
use scalevfs_ext4::{BlockDevice, FileDevice, MemDevice};

fn our_replay(img: &Path) -> scalevfs_ext4::Result<journal::Recovered> {
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(img, true).unwrap());
    journal::recover(&dev)
}

fn sb_csum(sb: &mut [u8]) {
    let c = scalevfs_ext4::format::checksum::crc32c(!0, &sb[..0x3FC]);
    sb[0x3FC..0x400].copy_from_slice(&c.to_le_bytes());
}

/// Edit the primary superblock in place (checksum redone).
fn edit_sb(img: &Path, f: impl FnOnce(&mut [u8])) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut sb = vec![0u8; 1024];
    file.read_exact_at(&mut sb, 1024).unwrap();
    f(&mut sb);
    sb_csum(&mut sb);
    file.write_all_at(&sb, 1024).unwrap();
}

fn set_needs_recovery(img: &Path) {
    edit_sb(img, |sb| sb[0x60] |= 4);
}

/// Write `log` from the first log block, point `js` at it, needs_recovery.
fn install_log(img: &Img, js: &mut jf::JournalSuperblock, jb: &[u64], log: &[Vec<u8>]) {
    assert!(log.len() <= js.log_len() as usize);
    for (i, b) in log.iter().enumerate() {
        write_block(&img.path, img.bs, jb[js.first as usize + i], b);
    }
    js.start = js.first;
    let mut b = read_block(&img.path, img.bs, jb[0]);
    b[..1024].copy_from_slice(&js.to_bytes());
    write_block(&img.path, img.bs, jb[0], &b);
    set_needs_recovery(&img.path);
}

/// Block numbers and contents of the superblock's block.
fn sb_block(img: &Img) -> (u64, usize) {
    ((1024 / img.bs) as u64, 1024 % img.bs)
}

// ---------------------------------------------------------------------------

/// async_commit + csum v3: T1 good (time 1000), T2's commit fails its
/// checksum (time 3000), T3's commit fails its checksum (time 2000).
///
/// recovery.c: at T2's bad commit end_transaction = T2 and, the journal
/// being async, the scan goes on with last_trans_commit_time = 3000. At
/// T3's bad commit, 2000 < 3000 -> ignore_crc_mismatch -> done: end stays
/// T2, only T1 is replayed.
///
/// Ours (recovery.rs, COMMIT_BLOCK arm): the async branch `continue`s
/// before `last_time = t`, so last_time is still 1000; 2000 >= 1000, so
/// end becomes T3 and T2 (whose commit failed its checksum) is replayed.
#[test]
fn async_bad_commit_updates_last_commit_time() {
    if !tools() {
        return;
    }
    let bs = 1024;
    let img = make(bs, "r38async");
    let (mut js, jb) = journal_sb(&img);
    js.feature_compat &= !jf::COMPAT_CHECKSUM;
    js.feature_incompat &= !jf::INCOMPAT_CSUM_V2;
    js.feature_incompat |= jf::INCOMPAT_CSUM_V3 | jf::INCOMPAT_ASYNC_COMMIT;
    js.checksum_type = jf::CHECKSUM_CRC32C;
    let d = &img.data_blocks;
    let seq = js.sequence;
    let data: Vec<Vec<u8>> = (0..6).map(|i| vec![0x60 + i as u8; bs]).collect();
    let tx = |t: u32, k: usize, time: u64, bad: bool| -> Vec<Vec<u8>> {
        let blocks: Vec<(u64, &[u8])> = (0..2)
            .map(|i| (d[40 + 2 * k + i], data[2 * k + i].as_slice()))
            .collect();
        let mut v = jf::build_transaction(&js, t, &blocks, &[], time);
        if bad {
            let c = v.last_mut().unwrap();
            c[0x10] ^= 0xFF; // commit checksum
        }
        v
    };
    let mut log = tx(seq, 0, 1000, false);
    log.extend(tx(seq + 1, 1, 3000, true));
    log.extend(tx(seq + 2, 2, 2000, true));
    install_log(&img, &mut js, &jb, &log);

    let a = copy(&img.path, "a.img");
    let b = copy(&img.path, "b.img");
    let said = e2fsck_replay(&a);
    let r = our_replay(&b).unwrap();
    eprintln!(
        "ours: end_transaction {} (start {seq}), writes {:?}",
        r.plan.end_transaction,
        r.plan.writes.keys().collect::<Vec<_>>()
    );
    eprintln!(
        "e2fsck: d[42] replayed? {}",
        read_block(&a, bs, d[42]) == data[2]
    );
    let diff = differences(&a, &b);
    assert!(
        diff.is_empty(),
        "we and e2fsck differ at {} bytes, first {:#x?}; e2fsck said: {said}",
        diff.len(),
        &diff[..diff.len().min(4)]
    );
    assert_eq!(r.plan.end_transaction, seq + 1, "T2 is the end of the log");
}

/// A log whose committed transactions fill most of the journal (as the
/// kernel's do: it keeps only ~32 blocks free), followed by the torn
/// descriptor of an uncommitted transaction whose garbage tag area (no
/// LAST_TAG) counts more tags than the blocks left before the log's start.
///
/// recovery.c: the scan skips count_tags() blocks (wrapping), reads a block
/// of the old log, its sequence does not match -> end of the log, success;
/// every committed transaction is replayed.
///
/// Ours: `used + n > log_len` -> Err("tags run past the end of the log"):
/// the mount is refused although the log is fine.
#[test]
fn torn_uncommitted_descriptor_past_the_log_end() {
    if !tools() {
        return;
    }
    let bs = 1024;
    let img = make(bs, "r38torn");
    let (mut js, jb) = journal_sb(&img);
    js.feature_compat &= !jf::COMPAT_CHECKSUM;
    js.feature_incompat &= !(jf::INCOMPAT_CSUM_V2 | jf::INCOMPAT_CSUM_V3 | jf::INCOMPAT_64BIT);
    let log_len = js.log_len() as usize;
    let d = &img.data_blocks;
    let seq = js.sequence;
    // Transactions of 60 blocks (62 log blocks) while 80 blocks stay free.
    let mut log = Vec::new();
    let mut t = seq;
    while log.len() + 62 + 80 <= log_len {
        let k = (t - seq) as u8;
        let data: Vec<Vec<u8>> = (0..60)
            .map(|i| vec![k ^ (i as u8).wrapping_mul(7); bs])
            .collect();
        let blocks: Vec<(u64, &[u8])> = (0..60).map(|i| (d[100 + i], data[i].as_slice())).collect();
        log.extend(jf::build_transaction(
            &js,
            t,
            &blocks,
            &[],
            1_700_000_000 + u64::from(t),
        ));
        t += 1;
    }
    // The torn descriptor: a good header, then tags all SAME_UUID without
    // LAST_TAG (count_tags: (bs - 12) / 8 = 126 tags).
    let mut desc = vec![0u8; bs];
    desc[..4].copy_from_slice(&jf::MAGIC.to_be_bytes());
    desc[4..8].copy_from_slice(&jf::DESCRIPTOR_BLOCK.to_be_bytes());
    desc[8..12].copy_from_slice(&t.to_be_bytes());
    let mut p = 12;
    while p + 8 <= bs {
        desc[p..p + 4].copy_from_slice(&(d[300] as u32).to_be_bytes());
        desc[p + 6..p + 8].copy_from_slice(&jf::FLAG_SAME_UUID.to_be_bytes());
        p += 8;
    }
    log.push(desc);
    eprintln!(
        "log_len {log_len}, committed log blocks {}, transactions {seq}..{t}",
        log.len() - 1
    );
    assert!(log.len() + 126 > log_len);
    install_log(&img, &mut js, &jb, &log);

    let a = copy(&img.path, "a.img");
    let b = copy(&img.path, "b.img");
    let said = e2fsck_replay(&a);
    let r = our_replay(&b);
    let r = r.unwrap_or_else(|e| panic!("ours refused: {e}; e2fsck replayed it: {said}"));
    assert_eq!(r.plan.end_transaction, t);
    assert!(differences(&a, &b).is_empty());
}

/// The log holds a copy of the superblock's block (a new volume name) and
/// the journal was aborted (s_errno -5). recover() writes the home blocks
/// *except* the superblock's, flushes, writes the journal superblock
/// emptied (s_start 0, s_errno 0), flushes, and only then the superblock.
/// A crash before that last write leaves needs_recovery set and an empty
/// journal: the next recovery has nothing to replay, so the logged
/// superblock is lost (old volume name next to replayed metadata) and so
/// is the error the aborted journal carried (EXT2_ERROR_FS never set).
/// The kernel (and e2fsck) write the replayed superblock with the other
/// home blocks, and move s_errno to the superblock before clearing it.
#[test]
fn a_crash_before_the_superblock_write_keeps_the_replayed_superblock() {
    if !tools() {
        return;
    }
    for bs in [1024, 4096] {
        let img = make(bs, "r38crash");
        let (mut js, jb) = journal_sb(&img);
        let (sbblk, sboff) = sb_block(&img);
        let mut blk = read_block(&img.path, bs, sbblk);
        blk[sboff + 0x78..sboff + 0x78 + 8].copy_from_slice(b"REPLAYED");
        sb_csum(&mut blk[sboff..sboff + 1024]);
        let v = vec![0x5Au8; bs];
        let d = &img.data_blocks;
        let log = jf::build_transaction(
            &js,
            js.sequence,
            &[(sbblk, &blk), (d[7], &v)],
            &[],
            1_700_000_000,
        );
        js.errno = -5;
        install_log(&img, &mut js, &jb, &log);
        let base = std::fs::read(&img.path).unwrap();

        // Uninterrupted: the reference.
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(base.clone()));
        journal::recover(&dev).unwrap();
        let want = snapshot(&*dev);
        assert_eq!(&want[1024 + 0x78..1024 + 0x80], b"REPLAYED");
        assert_ne!(want[1024 + 0x3A] & 2, 0, "EXT2_ERROR_FS from s_errno");

        // Crash just before the superblock's write, then recover again.
        // The write of the superblock's block fails (a crash just before it).
        let mut crashing = common::Hooked::new(MemDevice::new(base.clone()));
        let at = sbblk * bs as u64;
        crashing.on_write = Box::new(move |off, _| {
            if off == at {
                return Err(std::io::Error::other("crash"));
            }
            Ok(())
        });
        let dev: Arc<dyn BlockDevice> = Arc::new(crashing);
        assert!(journal::recover(&dev).is_err());
        let state = snapshot(&*dev);
        assert_ne!(state[1024 + 0x60] & 4, 0, "still needs_recovery");
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(state));
        journal::recover(&dev).unwrap();
        let got = snapshot(&*dev);
        assert_eq!(
            &got[d[7] as usize * bs..][..bs],
            &v[..],
            "data block replayed"
        );
        assert_eq!(
            String::from_utf8_lossy(&got[1024 + 0x78..1024 + 0x80]),
            "REPLAYED",
            "bs {bs}: the logged superblock was lost by the crash"
        );
        assert_ne!(
            got[1024 + 0x3A] & 2,
            0,
            "bs {bs}: the aborted journal's error was lost by the crash"
        );
    }
}

/// The superblock on disk says EXT2_ERROR_FS (and carries error info:
/// s_error_count, s_first_error_*), written there directly by the kernel's
/// error path (ext4_commit_super, not through the journal); the log holds
/// an older copy of the superblock's block without them.
///
/// Kernel (fs/ext4/super.c ext4_load_journal): saves the error area
/// [EXT4_S_ERR_START, +EXT4_S_ERR_LEN) = 0x194..0x200 before
/// jbd2_journal_load and copies it back after, and ORs the pre-replay
/// s_state's EXT4_ERROR_FS back in, then commits the superblock.
/// e2fsck >= 1.47.1 (commit 6ab579ee "e2fsck: save EXT2_ERROR_FS flag
/// during journal replay") keeps EXT2_ERROR_FS too. (The e2fsck 1.47.0
/// installed here predates that, so it is no referee for this test.)
///
/// Ours: the replayed copy wins, the error marker is gone.
#[test]
fn replay_keeps_the_error_state_of_the_superblock() {
    if !tools() {
        return;
    }
    let bs = 4096;
    let img = make(bs, "r38errfs");
    let (mut js, jb) = journal_sb(&img);
    let (sbblk, _) = sb_block(&img);
    // The logged copy: the superblock as it is (no errors).
    let blk = read_block(&img.path, bs, sbblk);
    let log = jf::build_transaction(&js, js.sequence, &[(sbblk, &blk)], &[], 1_700_000_000);
    install_log(&img, &mut js, &jb, &log);
    // Then the kernel's error path writes the superblock directly.
    edit_sb(&img.path, |sb| {
        sb[0x3A] |= 2; // s_state |= EXT2_ERROR_FS
        sb[0x194..0x198].copy_from_slice(&3u32.to_le_bytes()); // s_error_count
        sb[0x198..0x19C].copy_from_slice(&1_700_000_100u32.to_le_bytes()); // s_first_error_time
    });
    let b = copy(&img.path, "b.img");
    our_replay(&b).unwrap();
    let got = read_block(&b, bs, 0);
    assert_ne!(
        got[1024 + 0x3A] & 2,
        0,
        "EXT2_ERROR_FS dropped by the replay"
    );
    assert_eq!(
        u32::from_le_bytes(got[1024 + 0x194..1024 + 0x198].try_into().unwrap()),
        3,
        "s_error_count dropped by the replay"
    );
}
