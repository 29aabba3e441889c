//! Positioned overwrites of one file run side by side (memfs: inside one
//! existing page, under the data lock held shared, copy on write published
//! by compare-and-exchange). What POSIX still asks of them: no write is
//! lost and each is atomic, even when several threads write different
//! bytes of the same page at once; a reader never sees half of one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use scalevfs::*;

const THREADS: usize = 4;
const CHUNK: usize = 1024;
const ROUNDS: u32 = 4000;

/// The byte thread writes in round `r` (never 0, the file's first fill).
fn byte(r: u32) -> u8 {
    (r % 251) as u8 + 1
}

/// Four threads each rewrite their own quarter of page 0 (and of page 1,
/// a page apart) with a byte that counts their rounds; a fifth reads the
/// page meanwhile. Every quarter must read uniform (no torn write), and
/// at the end hold its thread's last byte: a write that a concurrent
/// writer of the same page had undone (a copy published over another's)
/// shows as an older byte.
#[test]
fn overwrites_of_one_page_are_neither_lost_nor_torn() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    t.pwrite(fd, &vec![0u8; 2 * 4096], 0).unwrap();
    t.close(fd).unwrap();
    let vfs = Arc::new(vfs);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (vfs, stop) = (vfs.clone(), stop.clone());
        thread::spawn(move || {
            let t = vfs.root_task();
            let fd = t.open("/f", O_RDONLY, 0).unwrap();
            let mut b = vec![0u8; 4096];
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(t.pread(fd, &mut b, 0).unwrap(), 4096);
                for (q, c) in b.chunks(CHUNK).enumerate() {
                    assert!(c.iter().all(|&x| x == c[0]), "quarter {q} torn: {c:?}");
                }
                reads += 1;
            }
            reads
        })
    };
    let go = Arc::new(std::sync::Barrier::new(THREADS));
    let writers: Vec<_> = (0..THREADS)
        .map(|k| {
            let (vfs, go) = (vfs.clone(), go.clone());
            thread::spawn(move || {
                let t = vfs.root_task();
                let fd = t.open("/f", O_WRONLY, 0).unwrap();
                go.wait();
                for r in 0..ROUNDS {
                    for page in 0..2 {
                        let at = (page * 4096 + k * CHUNK) as i64;
                        assert_eq!(t.pwrite(fd, &[byte(r); CHUNK], at).unwrap(), CHUNK);
                    }
                }
                t.close(fd).unwrap();
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    let t = vfs.root_task();
    let fd = t.open("/f", O_RDONLY, 0).unwrap();
    let mut b = vec![0u8; 2 * 4096];
    assert_eq!(t.pread(fd, &mut b, 0).unwrap(), 2 * 4096);
    for (q, c) in b.chunks(CHUNK).enumerate() {
        assert!(
            c.iter().all(|&x| x == byte(ROUNDS - 1)),
            "quarter {q} of page {}: a write was lost ({})",
            q / THREADS,
            c[0]
        );
    }
    // Size, blocks and mtime are those of an overwrite.
    let st = t.fstat(fd).unwrap();
    assert_eq!(st.size, 2 * 4096);
    assert_eq!(st.blocks, 2 * 8);
}

/// Writes that change the size, reach a hole or cross a page boundary take
/// the exclusive path, beside the shared overwrites, and land whole.
#[test]
fn extending_and_straddling_writes_beside_overwrites() {
    let vfs = Arc::new(Vfs::new());
    let t = vfs.root_task();
    let fd = t.open("/g", O_CREAT | O_RDWR, 0o644).unwrap();
    t.pwrite(fd, &[1u8; 4096], 0).unwrap();
    t.close(fd).unwrap();
    let over = {
        let vfs = vfs.clone();
        thread::spawn(move || {
            let t = vfs.root_task();
            let fd = t.open("/g", O_WRONLY, 0).unwrap();
            for r in 0..500u32 {
                t.pwrite(fd, &[(r % 250) as u8 + 2; 100], 0).unwrap();
            }
            t.close(fd).unwrap();
        })
    };
    let t2 = vfs.root_task();
    let fd = t2.open("/g", O_WRONLY | O_APPEND, 0).unwrap();
    for _ in 0..50 {
        // Appends of 1000 bytes: cross page boundaries, extend the size.
        assert_eq!(t2.write(fd, &[9u8; 1000]).unwrap(), 1000);
    }
    t2.close(fd).unwrap();
    over.join().unwrap();
    let fd = t.open("/g", O_RDONLY, 0).unwrap();
    assert_eq!(t.fstat(fd).unwrap().size, 4096 + 50 * 1000);
    let mut b = vec![0u8; 4096 + 50 * 1000];
    assert_eq!(t.pread(fd, &mut b, 0).unwrap(), b.len());
    assert!(b[..100].iter().all(|&x| x == b[0]) && b[0] >= 2);
    assert!(b[100..4096].iter().all(|&x| x == 1));
    assert!(b[4096..].iter().all(|&x| x == 9));
}
