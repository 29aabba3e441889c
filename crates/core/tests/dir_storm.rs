//! Regression for issue 12 (rmdir against rename deadlock): four threads
//! doing mkdir, rmdir, rename, RENAME_EXCHANGE, create and unlink over seven
//! names in two nested directories (`/a` and `/a/b`, where `b` is itself one
//! of the names, so it is removed, renamed and exchanged too and the same
//! directory is a parent in one call and a victim in another).
//!
//! The old order (victim directory locked after the name stripes, parents'
//! `dir_lock` before the stripes) stalled for good within a second or two.
//! A watchdog fails the test when no thread has finished an operation for
//! `STALL` (it does not hang: the stuck threads are left behind and die with
//! the process). Runs for 5 s by default; `SCALEVFS_STORM_SECS=30` for longer.
//! In debug builds the lock-order checker runs under the storm as well.
//!
//! At the end the tree must be a tree: every name `read_dir` lists is
//! `lstat`-able with the listed type, every directory's link count is 2 plus
//! its subdirectories, and a directory's `..` is its parent.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use scalevfs::*;

const NAMES: [&str; 7] = ["b", "c", "d", "e", "f", "g", "h"];
const THREADS: usize = 4;
const STALL: Duration = Duration::from_secs(5);

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as usize
    }
    fn below(&mut self, n: usize) -> usize {
        self.next() % n
    }
}

fn path(rng: &mut Rng) -> String {
    let n = NAMES[rng.below(NAMES.len())];
    if rng.below(2) == 0 {
        format!("/a/{n}")
    } else {
        format!("/a/b/{n}")
    }
}

/// Errnos the storm may legitimately see; anything else fails the test.
fn allowed(e: Errno) -> bool {
    matches!(
        e,
        Errno::ENOENT
            | Errno::EEXIST
            | Errno::ENOTEMPTY
            | Errno::ENOTDIR
            | Errno::EISDIR
            | Errno::EINVAL
            | Errno::EBUSY
    )
}

fn one_op(t: &Task, rng: &mut Rng) {
    let p = path(rng);
    let q = path(rng);
    let r = match rng.below(7) {
        0 => t.mkdir(p.as_str(), 0o755),
        1 => t.rmdir(p.as_str()),
        2 => t.rename(p.as_str(), q.as_str()),
        3 => t.renameat2(AT_FDCWD, p.as_str(), AT_FDCWD, q.as_str(), RENAME_EXCHANGE),
        4 => t
            .open(p.as_str(), O_CREAT | O_WRONLY, 0o644)
            .and_then(|fd| t.close(fd)),
        5 => t.unlink(p.as_str()),
        _ => t.mkdir("/a/b", 0o755),
    };
    if let Err(e) = r {
        assert!(allowed(e), "unexpected {e:?} ({p}, {q})");
    }
}

fn storm_secs() -> u64 {
    std::env::var("SCALEVFS_STORM_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
}

/// Check that the tree under `dir` is a tree: each directory is reached
/// once, its `..` is the directory it was listed in, its link count is 2
/// plus its subdirectories, every listed name is `lstat`-able with the
/// listed inode, and every file has one link. Walks with `chdir`, so depth
/// (renames can nest the directories deeply) is no limit. Returns the
/// number of names.
fn check_tree(t: &Task, dir: &str) -> usize {
    let mut seen = std::collections::HashSet::new();
    let mut names = 0;
    let mut visit = |names: &mut usize| -> (u64, Vec<String>) {
        let st = t.lstat(".").unwrap();
        assert!(seen.insert(st.ino), "directory {} reached twice", st.ino);
        let mut subdirs = Vec::new();
        for e in t.read_dir(".").unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            *names += 1;
            let name = String::from_utf8(e.name.clone()).unwrap();
            let s = t
                .lstat(name.as_str())
                .unwrap_or_else(|err| panic!("{name} in {}: {err:?}", st.ino));
            assert_eq!(s.ino, e.ino, "{name}: listed inode differs from the name's");
            if s.is_dir() {
                assert_eq!(e.file_type, FileType::Directory, "{name}");
                subdirs.push(name);
            } else {
                assert_eq!(s.nlink, 1, "{name}");
            }
        }
        assert_eq!(
            st.nlink as usize,
            2 + subdirs.len(),
            "directory {}: link count",
            st.ino
        );
        (st.ino, subdirs)
    };
    t.chdir(dir).unwrap();
    let mut stack = vec![visit(&mut names)];
    while let Some((ino, subdirs)) = stack.last_mut() {
        if let Some(n) = subdirs.pop() {
            let parent = *ino;
            t.chdir(n.as_str()).unwrap();
            assert_eq!(
                t.lstat("..").unwrap().ino,
                parent,
                "{n}/.. is not its parent"
            );
            stack.push(visit(&mut names));
        } else {
            stack.pop();
            t.chdir("..").unwrap();
        }
    }
    t.chdir("/").unwrap();
    names
}

#[test]
fn dir_storm_makes_progress() {
    let vfs = Vfs::new();
    let root = vfs.root_task();
    root.mkdir("/a", 0o755).unwrap();
    root.mkdir("/a/b", 0o755).unwrap();
    let secs = storm_secs();
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let mut hs = Vec::new();
    for i in 0..THREADS {
        let t = root.clone_thread();
        let (stop, ops) = (stop.clone(), ops.clone());
        hs.push(std::thread::spawn(move || {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((i as u64 + 1) * 0x1234_5678_9ABC));
            // Relaxed: a stop flag and a progress counter; no data hangs off
            // either (the final checks run after `join`).
            while !stop.load(Ordering::Relaxed) {
                one_op(&t, &mut rng);
                ops.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let start = Instant::now();
    let mut last = (0, Instant::now());
    // Watch until every thread has stopped: a deadlocked thread must fail
    // the test during the storm and while the others drain.
    while !hs.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        if start.elapsed() >= Duration::from_secs(secs) || hs.iter().any(|h| h.is_finished()) {
            // Time is up, or a thread panicked (join reports it below).
            stop.store(true, Ordering::Relaxed);
        }
        let n = ops.load(Ordering::Relaxed);
        if n != last.0 {
            last = (n, Instant::now());
        } else if last.1.elapsed() > STALL {
            // Leave the stuck threads; they die with the process.
            panic!(
                "no operation finished for {STALL:?} after {n} ops in {:?}: deadlock",
                start.elapsed()
            );
        }
    }
    for h in hs {
        h.join().expect("storm thread panicked");
    }
    let n = ops.load(Ordering::Relaxed);
    eprintln!(
        "dir_storm: {n} ops by {THREADS} threads in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(n > 0);
    let names = check_tree(&root, "/a");
    eprintln!("dir_storm: {names} names at the end");
}
