//! A directory tree 100,000 levels deep, made by `mkdirat` relative to an
//! fd (no path is ever longer than one name, so nothing stops it: Linux's
//! tmpfs takes such a tree too) and then left in place when the `Vfs` goes.
//! Tearing it down must not recurse once per level: memfs freed a
//! directory's children from inside the directory's own drop (inode ->
//! entry index -> child inode -> ...), a dozen stack frames per level, and
//! the thread that collected the epoch garbage overflowed its stack (one
//! test thread's 2 MiB went at about 20,000 levels). The dentry cache's
//! teardown evicted one level per sweep of the whole hash table (minutes
//! for this tree); it now frees a chain of parents left unused as it goes.
//!
//! One test in its own process, on a thread with a fixed 2 MiB stack; the
//! memory the tree held must come back (so the teardown did run here).

use scalevfs::*;

const DEPTH: usize = 100_000;
const MIB: u64 = 1 << 20;

fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// `/a/d/d/.../d`, `depth` levels below /a, each made relative to an fd on
/// its parent. Returns the fd of the deepest one.
fn deep_tree(t: &Task, depth: usize) -> i32 {
    t.mkdir("/a", 0o755).unwrap();
    let mut fd = t.open("/a", O_RDONLY | O_DIRECTORY, 0).unwrap();
    for _ in 0..depth {
        t.mkdirat(fd, "d", 0o755).unwrap();
        let next = t.openat(fd, "d", O_RDONLY | O_DIRECTORY, 0).unwrap();
        t.close(fd).unwrap();
        fd = next;
    }
    fd
}

#[test]
fn a_deep_tree_is_torn_down_without_recursion() {
    let r = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            let start = rss();
            let vfs = Vfs::new();
            let t = vfs.root_task();
            let fd = deep_tree(&t, DEPTH);
            assert_eq!(t.fstat(fd).unwrap().nlink, 2);
            // The walk and the loop check of a rename see the whole depth.
            assert_eq!(t.renameat2(AT_FDCWD, "/a", fd, "x", 0), Err(Errno::EINVAL));
            t.fchdir(fd).unwrap();
            assert_eq!(t.getcwd(), Err(Errno::ENAMETOOLONG));
            t.close(fd).unwrap();
            let built = rss();
            drop(t);
            drop(vfs);
            // The tree's memory waits for grace periods: flush them here,
            // on this thread (as the next collector would).
            let mut after = rss();
            for _ in 0..200 {
                flush_deferred_frees();
                // The tree is small objects that glibc keeps in its arenas
                // once freed; give them back so that RSS shows the free.
                // SAFETY: malloc_trim has no preconditions.
                unsafe { libc::malloc_trim(0) };
                after = rss();
                if after <= start + (built - start) / 2 {
                    break;
                }
            }
            (start, built, after)
        })
        .unwrap()
        .join()
        .expect("teardown thread");
    let (start, built, after) = r;
    eprintln!(
        "RSS: start {} MiB, tree of {DEPTH} levels {} MiB, after the Vfs went {} MiB",
        start / MIB,
        built / MIB,
        after / MIB
    );
    assert!(built >= start + 16 * MIB, "the tree is resident");
    assert!(
        after <= start + (built - start) / 2,
        "the tree's memory did not come back"
    );
}
