//! Overwriting a file's existing pages again and again keeps memory
//! bounded without the caller's help: each overwrite copies the pages it
//! changes and frees the old ones after a grace period, and those frees
//! must keep up. They did not: crossbeam-epoch runs a few bags of deferred
//! frees per 128 pins, a 1 MiB overwrite retires 256 pages, and two
//! processes rewriting one 32 MiB file (xfstests generic/208) grew the
//! memfs daemon by 32 MiB a pass until its 4 GiB cap killed it. One test
//! in its own process, so that no other test allocates meanwhile.

use scalevfs::*;

const MIB: u64 = 1 << 20;

fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

#[test]
fn overwriting_one_file_keeps_memory_bounded() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    let chunk = vec![0x5Au8; MIB as usize];
    for off in (0..32 * MIB).step_by(MIB as usize) {
        t.pwrite(fd, &chunk, off as i64).unwrap();
    }
    t.close(fd).unwrap();
    let base = rss();
    let peak = std::sync::atomic::AtomicU64::new(base);
    // Two threads, 16 passes each over the 32 MiB: 1 GiB of overwrites.
    std::thread::scope(|s| {
        for k in 0..2u8 {
            let t = vfs.root_task();
            let peak = &peak;
            s.spawn(move || {
                let fd = t.open("/f", O_RDWR, 0).unwrap();
                let chunk = vec![k; MIB as usize];
                for _ in 0..16 {
                    for off in (0..32 * MIB).step_by(MIB as usize) {
                        t.pwrite(fd, &chunk, off as i64).unwrap();
                    }
                    // Relaxed: a maximum read after the scope's join.
                    peak.fetch_max(rss(), std::sync::atomic::Ordering::Relaxed);
                }
                t.close(fd).unwrap();
            });
        }
    });
    let grew = peak.into_inner().saturating_sub(base);
    // Without the fix RSS grows by about what was written (1 GiB). With
    // it, the peak depends on how the two writers and the epoch's
    // collection are scheduled: 160-360 MiB on the 2-core VM (a few
    // passes' pages waiting for their grace period; 160 MiB was the bound
    // until runs on an otherwise idle VM went past it half the time,
    // at the stop-34 code as well). Half of what the bug gives.
    assert!(
        grew < 512 * MIB,
        "RSS grew by {} MiB over 1 GiB of overwrites of one 32 MiB file",
        grew / MIB
    );
    // The file holds one writer's last pass, whole pages of it.
    let fd = t.open("/f", O_RDONLY, 0).unwrap();
    let mut b = vec![0u8; MIB as usize];
    assert_eq!(t.pread(fd, &mut b, 5 * MIB as i64).unwrap(), MIB as usize);
    assert!(
        b.iter().all(|&x| x == b[0]) && b[0] < 2,
        "one writer's bytes"
    );
}
