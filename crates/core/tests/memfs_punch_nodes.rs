//! Nodes of a file's page tree that a punch leaves empty are freed. In a
//! binary of its own: it measures the process's resident memory, and in
//! `memfs_limits` beside other tests it read their memory and the backlog
//! of deferred frees their calls made (it failed 1 run in 6 there, with
//! `space_of_a_file_closed_after_its_unlink_comes_back` failing beside it:
//! the 100,000 punches' deferred frees queued ahead of that file's).

mod common;
use common::small_memfs;
use scalevfs::io::*;
use scalevfs::*;

/// This process's resident memory in bytes (/proc/self/statm).
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Nodes of a file's page tree that a punch leaves empty are freed
/// (review, stop 48): kept, a one-byte write and punch per gigabyte left
/// three nodes (~1.6 KB) each, none of it counted by `size=`: memory
/// without bound, measured here as resident memory. (A write failing with
/// ENOSPC prunes the path it made the same way; each such write waits
/// 31 ms for deferred frees, too slow to repeat here.)
#[test]
fn emptied_tree_nodes_are_freed() {
    let vfs = small_memfs(64, 16);
    let t = vfs.root_task();
    let f = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    const N: i64 = 100_000;
    let before = rss();
    for i in 0..N {
        assert_eq!(t.pwrite(f, b"x", i << 30), Ok(1));
        t.fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, i << 30, 4096)
            .unwrap();
    }
    flush_deferred_frees();
    let grown = rss().saturating_sub(before);
    eprintln!("resident memory grew by {} KB", grown >> 10);
    // Kept, the nodes took about 200 MB; what the loop itself needs is
    // far below the bound.
    assert!(
        grown < 48 << 20,
        "resident memory grew by {} MB",
        grown >> 20
    );
    t.close(f).unwrap();
}
