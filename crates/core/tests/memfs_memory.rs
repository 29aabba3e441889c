//! Issue 12 (3): memory of deleted files goes back to the OS. One test in
//! its own process (so no other test allocates meanwhile), run on one
//! thread: the resident set size from /proc/self/statm before a 512 MiB
//! write, after it, and after the file is deleted and the epoch garbage
//! (freed pages wait for a grace period) has been flushed.

use scalevfs::*;

const MIB: u64 = 1 << 20;

fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// Flush until `cond` holds or a bound is reached: deferred frees run only
/// once the global epoch has advanced past them, and this thread's own
/// (a deleted file's last counts, `limbo.rs`) when it flushes them:
/// `flush_deferred_frees`, as a library user would call it.
fn settle(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..10_000 {
        if cond() {
            return true;
        }
        flush_deferred_frees();
    }
    cond()
}

fn write_file(t: &Task, path: &str, bytes: u64, chunk: &[u8]) {
    let f = t.open(path, O_CREAT | O_WRONLY, 0o644).unwrap();
    let mut done = 0;
    while done < bytes {
        done += t.write(f, chunk).unwrap() as u64;
    }
    t.close(f).unwrap();
}

#[test]
fn deleted_file_memory_goes_back() {
    let mut cfg = VfsConfig::default();
    cfg.set("size", "1g").unwrap();
    let vfs = Vfs::with_config(cfg);
    let t = vfs.root_task();
    let chunk: Vec<u8> = (0..MIB).map(|i| (i % 253) as u8 | 1).collect();
    // Warm up the allocators and caches once, so the baseline holds them.
    write_file(&t, "/warm", 4 * MIB, &chunk);
    t.unlink("/warm").unwrap();
    settle(|| vfs.root_task().statfs("/").unwrap().bfree == (1 << 30) / 4096);

    let start = rss();
    write_file(&t, "/big", 512 * MIB, &chunk);
    let written = rss();
    assert_eq!(t.stat("/big").unwrap().size, 512 * MIB);
    t.unlink("/big").unwrap();
    let freed = settle(|| rss() <= start + 16 * MIB);
    let after = rss();
    eprintln!(
        "RSS: start {} MiB, after writing 512 MiB {} MiB, after deleting {} MiB",
        start / MIB,
        written / MIB,
        after / MIB
    );
    assert!(written >= start + 500 * MIB, "the write is resident");
    assert!(freed, "RSS {after} did not fall back to {start} + 16 MiB");
    assert_eq!(t.statfs("/").unwrap().bfree, (1 << 30) / 4096);
}
