//! Readers never see a COLLAPSE_RANGE or INSERT_RANGE half done. A shift
//! too large for one handle moves a leaf per handle (`shift_step`), and a
//! large collapse punches its range first: between two handles the file
//! is neither as before nor as after. The kernel's readers wait on
//! `invalidate_lock` meanwhile; here they wait on `Ext4Inode::reshaping`.
//! A reader thread reads windows of a file with thousands of extents
//! while another collapses and re-inserts a range, stepped (forced, with
//! small transactions): every read must give the file as before or as
//! after the change, never a mix. Before the wait, reads saw mixes.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::*;
use scalevfs::io::{FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE};
use scalevfs::{O_CREAT, O_RDONLY, O_RDWR};

const BS: u64 = 1024;
/// Extents of one block, at every other block.
const EXTENTS: u64 = 3000;
/// Blocks a reader reads at once (spanning several leaves).
const WINDOW: u64 = 400;
const ROUNDS: usize = 6;

/// Block `i` of the file as first written: its tag (i + 1) in every
/// 4-byte word.
fn block(tag: u32) -> Vec<u8> {
    tag.to_le_bytes().repeat(BS as usize / 4)
}

/// The tags of the blocks read (0: a hole), or a panic on a block that
/// is not one tag throughout.
fn tags(buf: &[u8]) -> Vec<u32> {
    buf.chunks(BS as usize)
        .map(|b| {
            let t = u32::from_le_bytes(b[..4].try_into().unwrap());
            assert!(b.chunks(4).all(|w| w == t.to_le_bytes()), "a torn block");
            t
        })
        .collect()
}

fn window(file: &[u32], at: u64) -> &[u32] {
    let end = (at + WINDOW).min(file.len() as u64) as usize;
    &file[(at as usize).min(end)..end]
}

#[test]
fn readers_never_see_a_collapse_or_insert_half_done() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("shift-readers");
    let img = fresh(&s.0, BS as usize, "64M");
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    // The last block written ends the file.
    let mut before = vec![0u32; 2 * EXTENTS as usize - 1];
    for i in 0..EXTENTS {
        let tag = i as u32 + 1;
        t.pwrite(fd, &block(tag), (2 * i * BS) as i64).unwrap();
        before[2 * i as usize] = tag;
    }
    // The change: blocks [a, a + k) collapsed out, then inserted back
    // (as a hole).
    let (a, k) = (10u64, 4u64);
    let mut after = before[..a as usize].to_vec();
    after.extend_from_slice(&before[(a + k) as usize..]);
    let mut restored = after[..a as usize].to_vec();
    restored.extend(std::iter::repeat_n(0, k as usize));
    restored.extend_from_slice(&after[a as usize..]);
    e.set_stepped_shifts(true);
    e.set_txn_limit(8);
    let commits = e.commit_stats().0;
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let mixed = std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            let t = vfs.root_task();
            let fd = t.open("/f", O_RDONLY, 0).unwrap();
            let mut buf = vec![0u8; (WINDOW * BS) as usize];
            let mut at = 0u64;
            let mut mixed = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let n = t.pread(fd, &mut buf, (at * BS) as i64).unwrap();
                let got = tags(&buf[..n.div_ceil(BS as usize) * BS as usize]);
                reads.fetch_add(1, Ordering::Relaxed);
                let states = [&before, &after, &restored];
                if !states.iter().any(|f| window(f, at) == got.as_slice()) && mixed.len() < 5 {
                    mixed.push(at);
                }
                at = (at + WINDOW / 3) % (2 * EXTENTS - WINDOW);
            }
            t.close(fd).unwrap();
            mixed
        });
        // Let the reader read a few times after each change, so that
        // its reads meet the next one.
        let settle = || {
            let r0 = reads.load(Ordering::Relaxed);
            let t0 = std::time::Instant::now();
            while reads.load(Ordering::Relaxed) < r0 + 3 && t0.elapsed().as_secs() < 10 {
                std::thread::yield_now();
            }
        };
        for _ in 0..ROUNDS {
            settle();
            t.fallocate(
                fd,
                FALLOC_FL_COLLAPSE_RANGE,
                (a * BS) as i64,
                (k * BS) as i64,
            )
            .unwrap();
            settle();
            t.fallocate(fd, FALLOC_FL_INSERT_RANGE, (a * BS) as i64, (k * BS) as i64)
                .unwrap();
        }
        done.store(true, Ordering::Relaxed);
        reader.join().unwrap()
    });
    let steps = e.commit_stats().0 - commits;
    eprintln!(
        "{} reads during {ROUNDS} collapses and inserts ({steps} commits)",
        reads.load(Ordering::Relaxed)
    );
    assert!(
        steps >= 4 * ROUNDS as u64,
        "the shifts were not stepped ({steps} commits)"
    );
    assert!(
        mixed.is_empty(),
        "reads at blocks {mixed:?} saw a file neither before nor after a shift"
    );
    // The file ends as restored: the range a hole where it was.
    let mut buf = vec![0u8; (2 * EXTENTS * BS) as usize];
    let n = t.pread(fd, &mut buf, 0).unwrap();
    assert!(
        tags(&buf[..n]) == restored,
        "the file did not end as restored"
    );
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
}
