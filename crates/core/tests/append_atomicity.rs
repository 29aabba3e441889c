//! Concurrency properties of the data path:
//! - N threads appending with O_APPEND to one file lose no bytes and never
//!   interleave inside one write;
//! - pread racing with truncate (shrink and regrow) sees old or new data,
//!   never bytes that were not in the file;
//! - read and lseek on one shared description keep POSIX semantics: every
//!   record is read exactly once, positions are never torn;
//! - both llseek variants behave the same.

use scalevfs::io::*;
use scalevfs::*;

#[test]
fn o_append_writers_lose_nothing_and_never_interleave() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let threads = 4usize;
    let per = 2000usize;
    std::thread::scope(|s| {
        for k in 0..threads {
            // Each thread its own description (separate opens), all O_APPEND.
            let t = t.clone_thread();
            s.spawn(move || {
                let fd = t
                    .open("/log", O_CREAT | O_WRONLY | O_APPEND, 0o644)
                    .unwrap();
                for i in 0..per {
                    // Record: length varies so records straddle pages.
                    let len = 8 + (i * 13 + k) % 300;
                    let mut rec = vec![b'a' + k as u8; len];
                    rec[0] = b'<';
                    rec[len - 1] = b'>';
                    assert_eq!(t.write(fd, &rec).unwrap(), len);
                }
                t.close(fd).unwrap();
            });
        }
    });
    let fd = t.open("/log", O_RDONLY, 0).unwrap();
    let size = t.fstat(fd).unwrap().size as usize;
    let mut all = vec![0u8; size];
    assert_eq!(t.pread(fd, &mut all, 0).unwrap(), size);
    let mut counts = vec![0usize; threads];
    let mut i = 0;
    while i < size {
        assert_eq!(all[i], b'<', "record start at {i}");
        let c = all[i + 1];
        let k = if c == b'>' {
            usize::MAX
        } else {
            (c - b'a') as usize
        };
        let mut j = i + 1;
        while all[j] != b'>' {
            assert_eq!(all[j], c, "interleaved write at {j}");
            j += 1;
        }
        if k != usize::MAX {
            counts[k] += 1;
        }
        i = j + 1;
    }
    let expected: usize = (0..threads)
        .map(|k| (0..per).map(|i| 8 + (i * 13 + k) % 300).sum::<usize>())
        .sum();
    assert_eq!(size, expected, "bytes lost");
    assert_eq!(counts, vec![per; threads]);
}

#[test]
fn pread_during_truncate_sees_old_or_new_never_garbage() {
    for variant in ["lockless", "locked", "none"] {
        let mut c = VfsConfig::default();
        c.set("orphan", variant).unwrap();
        let vfs = Vfs::with_config(c);
        let t = vfs.root_task();
        let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
        const SIZE: usize = 64 * 1024;
        let pattern: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8 + 1).collect();
        t.pwrite(fd, &pattern, 0).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let tt = t.clone_thread();
            let stop = &stop;
            let pattern = &pattern;
            s.spawn(move || {
                // Shrink to random sizes, then restore the pattern.
                let mut x = 12345u64;
                for _ in 0..3000 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let size = (x >> 33) as usize % SIZE;
                    tt.ftruncate(fd, size as i64).unwrap();
                    if x & 1 == 0 {
                        tt.ftruncate(fd, SIZE as i64).unwrap();
                    }
                    tt.pwrite(fd, &pattern[size..], size as i64).unwrap();
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            for r in 0..3 {
                let tr = t.clone_thread();
                s.spawn(move || {
                    let mut buf = vec![0u8; 10_000];
                    let mut off = r * 777;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        off = (off + 4093) % SIZE;
                        let n = tr.pread(fd, &mut buf, off as i64).unwrap();
                        for (j, &b) in buf[..n].iter().enumerate() {
                            // Old data, or zeros of a regrown hole: nothing else.
                            assert!(
                                b == pattern[off + j] || b == 0,
                                "garbage at {}: {b}",
                                off + j
                            );
                        }
                    }
                });
            }
        });
        let mut all = vec![0u8; SIZE];
        assert_eq!(t.pread(fd, &mut all, 0).unwrap(), SIZE);
        assert!(all == pattern);
        let sb = t.files().get_arc(fd).unwrap().path().mnt.sb().clone();
        assert!(sb.orphans.is_empty());
        t.close(fd).unwrap();
    }
}

#[test]
fn shared_description_reads_each_record_once() {
    for llseek in ["lockless", "locked"] {
        let mut c = VfsConfig::default();
        c.set("llseek", llseek).unwrap();
        let vfs = Vfs::with_config(c);
        let t = vfs.root_task();
        let fd = t.open("/recs", O_CREAT | O_RDWR, 0o644).unwrap();
        const N: u64 = 40_000;
        let data: Vec<u8> = (0..N).flat_map(|i| i.to_le_bytes()).collect();
        t.write(fd, &data).unwrap();
        t.lseek(fd, 0, SEEK_SET).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let got: Vec<Vec<u64>> = std::thread::scope(|s| {
            let seeker = {
                let t = t.clone_thread();
                let stop = &stop;
                s.spawn(move || {
                    let mut last = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        // SEEK_CUR 0 reads the position without moving it.
                        let p = t.lseek(fd, 0, SEEK_CUR).unwrap();
                        assert_eq!(p % 8, 0, "torn position");
                        assert!(p >= last && p <= N * 8, "position went back");
                        last = p;
                    }
                })
            };
            let hs: Vec<_> = (0..3)
                .map(|_| {
                    let t = t.clone_thread();
                    s.spawn(move || {
                        let mut mine = Vec::new();
                        let mut b = [0u8; 8];
                        loop {
                            match t.read(fd, &mut b).unwrap() {
                                0 => break,
                                8 => mine.push(u64::from_le_bytes(b)),
                                n => panic!("short read {n}"),
                            }
                        }
                        mine
                    })
                })
                .collect();
            let r = hs.into_iter().map(|h| h.join().unwrap()).collect();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            seeker.join().unwrap();
            r
        });
        let mut all: Vec<u64> = got.into_iter().flatten().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..N).collect::<Vec<_>>(),
            "{llseek}: a record read twice or never"
        );
        // lseek + read pairs from several threads on one description: every
        // read returns a whole, aligned record.
        std::thread::scope(|s| {
            for k in 0..3u64 {
                let t = t.clone_thread();
                s.spawn(move || {
                    let mut b = [0u8; 8];
                    for i in 0..3000u64 {
                        let rec = (i * 7919 + k * 104_729) % N;
                        assert_eq!(t.lseek(fd, (rec * 8) as i64, SEEK_SET), Ok(rec * 8));
                        let n = t.read(fd, &mut b).unwrap();
                        assert!(n == 8 || n == 0);
                        if n == 8 {
                            assert!(u64::from_le_bytes(b) < N);
                        }
                        let p = t.lseek(fd, 0, SEEK_CUR).unwrap();
                        assert_eq!(p % 8, 0);
                        t.lseek(fd, 8, SEEK_CUR).unwrap();
                    }
                });
            }
        });
    }
}

/// Reads and writes on one shared description (review, stop 48): a write
/// of 16 bytes and a read of 8 that started at one position both moved it,
/// the read's move won, and the next write went over the second half of
/// the first. In any serial order the position only grows, so writes never
/// overlap: every record written must be found whole.
#[test]
fn shared_description_reads_and_writes_do_not_overlap() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let fd = t.open("/rw", O_CREAT | O_RDWR, 0o644).unwrap();
    // A long hole first: every read finds bytes and moves the position.
    t.ftruncate(fd, 1 << 40).unwrap();
    const PER: u64 = 20_000;
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for w in 0..2u64 {
            let (t, done) = (t.clone_thread(), &done);
            s.spawn(move || {
                for i in 0..PER {
                    let id = (1 << 62) | (w << 32) | i;
                    let mut rec = id.to_le_bytes().to_vec();
                    rec.extend_from_slice(&(!id).to_le_bytes());
                    assert_eq!(t.write(fd, &rec), Ok(16));
                }
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            });
        }
        for _ in 0..2 {
            let (t, done) = (t.clone_thread(), &done);
            s.spawn(move || {
                let mut b = [0u8; 8];
                while done.load(std::sync::atomic::Ordering::Relaxed) < 2 {
                    t.read(fd, &mut b).unwrap();
                }
            });
        }
    });
    // Every record lies below the final position.
    let size = t.lseek(fd, 0, SEEK_CUR).unwrap() as usize;
    let mut data = vec![0u8; size];
    assert_eq!(t.pread(fd, &mut data, 0), Ok(size));
    let mut found = 0u64;
    for k in (0..size.saturating_sub(15)).step_by(8) {
        let a = u64::from_le_bytes(data[k..k + 8].try_into().unwrap());
        let b = u64::from_le_bytes(data[k + 8..k + 16].try_into().unwrap());
        if a >> 62 == 1 && b == !a {
            found += 1;
        }
    }
    assert_eq!(found, 2 * PER, "records overwritten ({size} bytes)");
    t.close(fd).unwrap();
}
