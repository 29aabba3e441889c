//! Crash testing with threads at once (issue 15): three threads share one
//! directory. Each creates its own files there, writes them, fsyncs and
//! closes them, and between those makes noise in the same directory
//! (small files created, renamed over each other, unlinked, one unlinked
//! while open and written after), so that their fsyncs share commits and
//! their changes share directory, bitmap and inode-table blocks. The
//! recording device logs every write and flush the threads caused, in the
//! order the device saw them.
//!
//! For every crash state a disk could be left in (each prefix ending at a
//! flush, plus random subsets of the writes in flight since it), recovered
//! as a mount does:
//! - `e2fsck -fn` passes (only the superblock's free totals may lag, as
//!   the kernel's do);
//! - every file whose fsync had returned before the crash is there with
//!   exactly the bytes written;
//! - a file whose fsync had not returned is absent, empty or whole, never
//!   a torn write or another file's bytes (data=ordered).
//!
//! A sample of the states is also replayed by `e2fsck -fy`, and the files
//! it leaves must be the ones ours leaves.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{e2fsck, fresh, have_tools, rw_journaled, Scratch, SlowFlush};
use scalevfs::fs::Fs;
use scalevfs::{Vfs, O_CREAT, O_RDWR, O_TRUNC, O_WRONLY};
use scalevfs_ext4::crashdev::{CrashLog, RecordingDevice};
use scalevfs_ext4::{BlockDevice, Ext4, MemDevice};

const THREADS: usize = 3;
const FILES: usize = 10;

/// Thread `k`'s file `i` and its bytes (a length from 1 byte to 3 blocks).
fn own(k: usize, i: usize) -> String {
    format!("/d/t{k}_{i}")
}

fn content(k: usize, i: usize, bs: usize) -> Vec<u8> {
    let len = 1 + (k * 7919 + i * 104_729) % (3 * bs);
    (0..len)
        .map(|n| (n * 31 + k * 101 + i * 7) as u8 ^ (n / bs) as u8)
        .collect()
}

/// Every thread's own files present under /d, with their bytes.
fn own_files(vfs: &Vfs) -> BTreeMap<String, Vec<u8>> {
    let fs = Fs::new(vfs.root_task());
    let mut out = BTreeMap::new();
    let Ok(rd) = fs.read_dir("/d") else {
        return out;
    };
    for e in rd {
        let name = e.unwrap().file_name().to_str().unwrap().to_string();
        if name.starts_with('t') {
            let p = format!("/d/{name}");
            out.insert(p.clone(), fs.read(&p).unwrap());
        }
    }
    out
}

/// Runs the threads; returns (writes recorded when the fsync of a file
/// returned, that file) for every own file.
fn workload(rec: &Arc<RecordingDevice<MemDevice>>, bs: usize) -> Vec<(usize, String)> {
    // At 4 KiB, commits begin while the one before still writes its log,
    // which takes a while (a flush sleeps 0 to 300 µs, varying): the
    // threads' commits overlap and often end out of order, and must still
    // become durable in order. At 1 KiB, the default.
    let dev: Box<dyn BlockDevice> = if bs == 4096 {
        Box::new(SlowFlush::new(
            rec.clone(),
            Duration::from_micros(100),
            true,
        ))
    } else {
        Box::new(rec.clone())
    };
    let e = Ext4::open_device(dev, rw_journaled()).unwrap();
    if bs == 4096 {
        e.set_pipelined(Some(true));
    }
    let vfs = Arc::new(Vfs::with_root_fs(Default::default(), e.clone()));
    vfs.root_task().mkdir("/d", 0o755).unwrap();
    let done = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for k in 0..THREADS {
            let (vfs, done) = (vfs.clone(), &done);
            s.spawn(move || {
                let t = vfs.root_task();
                for i in 0..FILES {
                    let p = own(k, i);
                    let fd = t.open(&p, O_CREAT | O_WRONLY, 0o644).unwrap();
                    t.write(fd, &content(k, i, bs)).unwrap();
                    t.fsync(fd).unwrap();
                    done.lock().unwrap().push((rec.writes(), p));
                    t.close(fd).unwrap();
                    // Noise in the same directory, never fsynced.
                    let x = |j: usize| format!("/d/x{}", (k + i + j) % 8);
                    if let Ok(fd) = t.open(&x(0), O_CREAT | O_RDWR | O_TRUNC, 0o600) {
                        let _ = t.write(fd, &vec![0xEE; (i + 1) * bs / 2]);
                        if i % 3 == 0 {
                            // Unlinked while open, written after: an orphan.
                            let _ = t.unlink(&x(0));
                            let _ = t.write(fd, &vec![0xDD; bs]);
                        }
                        t.close(fd).unwrap();
                    }
                    let _ = t.rename(&x(1), &x(2));
                    let _ = t.unlink(&x(3));
                }
            });
        }
    });
    drop(vfs);
    e.unmount().unwrap();
    done.into_inner().unwrap()
}

#[test]
fn concurrent_fsyncs_survive_every_crash_state() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("crashconc");
    let mut total = 0;
    for bs in [1024usize, 4096] {
        let img = fresh(&s.0, bs, "8M");
        let base = std::fs::read(&img).unwrap();
        let rec = Arc::new(RecordingDevice::new(MemDevice::new(base.clone()), 400_000));
        let synced = workload(&rec, bs);
        assert_eq!(synced.len(), THREADS * FILES);
        let log = CrashLog {
            base,
            ops: rec.ops(),
        };
        let state_img = s.0.join(format!("state{bs}"));
        let (mut n, mut sampled, mut durable_max) = (0, 0, 0);
        log.states(2, bs as u64 + 11, &mut |st| {
            n += 1;
            let what = format!(
                "bs {bs}, crash state {n} (flushed {}, in flight {:?})",
                st.flushed_writes, st.in_flight
            );
            let (img_after, files) = common::recover(st.image.clone(), own_files);
            let mut durable = 0;
            for (w, p) in &synced {
                let (k, i) = p[4..]
                    .split_once('_')
                    .map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap()))
                    .unwrap();
                let want = content(k, i, bs);
                match files.get(p) {
                    Some(got) if *got == want => durable += usize::from(*w <= st.flushed_writes),
                    Some(got) if got.is_empty() && *w > st.flushed_writes => {}
                    None if *w > st.flushed_writes => {}
                    got => panic!(
                        "{what}: {p} (fsync returned after write {w}) reads {:?} bytes",
                        got.map(Vec::len)
                    ),
                }
            }
            durable_max = durable_max.max(durable);
            std::fs::write(&state_img, &img_after).unwrap();
            common::fsck_ok_but_free_totals(&state_img, &what);
            // The referee's own replay on every 6th state that needs one.
            if st.image[1024 + 0x60] & 4 != 0 && n % 6 == 0 {
                std::fs::write(&state_img, &st.image).unwrap();
                let (code, text) = e2fsck(&state_img, "-fy");
                assert!(code <= 1, "{what}: e2fsck -fy exit {code}:\n{text}");
                let theirs = std::fs::read(&state_img).unwrap();
                let (_, their_files) = common::recover(theirs, own_files);
                assert!(
                    their_files == files,
                    "{what}: e2fsck's replay leaves other files"
                );
                sampled += 1;
            }
            true
        });
        eprintln!(
            "bs {bs}: {n} crash states of {THREADS} threads' {} fsyncs, each recovered and \
             checked; {sampled} also replayed by e2fsck -fy",
            synced.len()
        );
        assert!(n > 20, "only {n} crash states");
        assert_eq!(durable_max, synced.len(), "the last state lost files");
        total += n;
    }
    eprintln!("concurrent crash test: {total} crash states");
}
