//! Memory of removed files that hold no data goes back to the OS too:
//! 200,000 empty directories, long symlinks and attributes, made and then
//! removed, left the process's RSS where it was after every flush under
//! glibc's malloc (which keeps freed memory in its arenas until a trim:
//! memfs trimmed only after data pages were given back). One test in its
//! own process, on one thread; the library's own flush
//! (`flush_deferred_frees`) is all it calls, as an embedding program would.

use scalevfs::*;

const MIB: u64 = 1 << 20;

fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

#[test]
fn removed_metadata_memory_goes_back() {
    const N: usize = 200_000;
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let target = "t".repeat(200);
    let value = [5u8; 1000];
    let start = rss();
    for i in 0..N {
        match i % 4 {
            0 | 1 => t.mkdir(&format!("/n{i}"), 0o755).unwrap(),
            2 => t.symlink(&target, &format!("/n{i}")).unwrap(),
            _ => {
                t.mkdir(&format!("/n{i}"), 0o755).unwrap();
                t.setxattr(&format!("/n{i}"), "user.v", &value, 0).unwrap();
            }
        }
    }
    let built = rss();
    for i in 0..N {
        match i % 4 {
            2 => t.unlink(&format!("/n{i}")).unwrap(),
            _ => t.rmdir(&format!("/n{i}")).unwrap(),
        }
    }
    let mut after = rss();
    for _ in 0..1000 {
        flush_deferred_frees();
        after = rss();
        if after <= start + (built - start) / 2 {
            break;
        }
    }
    eprintln!(
        "RSS: start {} MiB, {N} inodes {} MiB, after removing them {} MiB",
        start / MIB,
        built / MIB,
        after / MIB
    );
    assert!(built >= start + 64 * MIB, "the inodes are resident");
    assert!(
        after <= start + (built - start) / 2,
        "RSS {} MiB did not fall by half of what the inodes took",
        after / MIB
    );
}
