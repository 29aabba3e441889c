//! Lookups racing with create, unlink, rename (cross-directory, NOREPLACE,
//! EXCHANGE, directories with contents) and cache shrinking, on every
//! dcache/LockRef variant.
//!
//! INVARIANTS. Names come in classes and a file only ever sits at a name of
//! its own class, with its class encoded in its size:
//! - `d{k}/c{c}_{j}`: regular files of size `fsize(c)`. Writers publish a
//!   file by creating it under a private staging name, setting its size, and
//!   renaming it in with RENAME_NOREPLACE; they move files only between names
//!   of one class (NOREPLACE or EXCHANGE, never replacing), and unlink them.
//!   So the number of files of a class is exactly created - unlinked.
//! - `d{k}/r_{j}`: the "replace" class: plain renames over each other
//!   (a d_move with a victim); size `RSIZE`.
//! - `d{k}/sub{c}`: directories moved between the `d{k}` (NOREPLACE and
//!   EXCHANGE); each holds `inner` of size `dsize(c)`, so a walk through a
//!   directory that is being moved must find its own `inner` or nothing.
//! - `d{k}/keep` (size 500+k) and `stable/a/b/c/leaf` are never touched:
//!   a lookup of them must never fail, however busy the buckets and
//!   directories around them are.
//!
//! A lookup may answer ENOENT for a churned name, but any file it returns
//! must have the size of the name's class (no phantom, no torn name, no
//! stale inode), and no other errno may appear. At the end every name is
//! checked, counts are compared with what the writers did, and the caches
//! must come to rest: after shrinking, `dcache().len()` is exactly the
//! pinned names (authoritative memfs) or just the root (non-authoritative),
//! and memfs's live inode count is exactly the inodes still named.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Barrier};

use scalevfs::*;

const DIRS: usize = 3;
const CLASSES: usize = 3;
const SLOTS: usize = 3;
const WRITER_OPS: usize = 2000;

fn fsize(c: usize) -> u64 {
    100 + c as u64
}
fn dsize(c: usize) -> u64 {
    1000 + c as u64
}
const RSIZE: u64 = 4242;

/// A tiny deterministic generator (xorshift), so runs are reproducible per
/// seed and no shared RNG state is written.
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

fn cname(k: usize, c: usize, j: usize) -> String {
    format!("/d{k}/c{c}_{j}")
}

struct Counts {
    created: [AtomicI64; CLASSES],
    unlinked: [AtomicI64; CLASSES],
}

fn ok_or_enoent<T>(r: VfsResult<T>, what: &str) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(Errno::ENOENT) => None,
        Err(e) => panic!("{what}: unexpected {e:?}"),
    }
}

fn setup(t: &Task) {
    t.mkdir("/stable", 0o755).unwrap();
    t.mkdir("/stable/a", 0o755).unwrap();
    t.mkdir("/stable/a/b", 0o755).unwrap();
    t.mkdir("/stable/a/b/c", 0o755).unwrap();
    make_file(t, "/stable/a/b/c/leaf", 77);
    t.mkdir("/stage", 0o755).unwrap();
    for k in 0..DIRS {
        t.mkdir(format!("/d{k}").as_str(), 0o755).unwrap();
        make_file(t, &format!("/d{k}/keep"), 500 + k as u64);
    }
    for c in 0..CLASSES {
        let d = format!("/d{}/sub{c}", c % DIRS);
        t.mkdir(d.as_str(), 0o755).unwrap();
        make_file(t, &format!("{d}/inner"), dsize(c));
    }
    for j in 0..SLOTS {
        make_file(t, &format!("/d{}/r_{j}", j % DIRS), RSIZE);
    }
}

fn make_file(t: &Task, path: &str, size: u64) {
    t.mknodat(AT_FDCWD, path, S_IFREG | 0o644, 0).unwrap();
    t.truncate(path, size as i64).unwrap();
}

fn reader(t: Task, seed: u64, done: &AtomicBool) -> usize {
    let mut rng = Rng(seed);
    let mut n = 0;
    while !done.load(Ordering::Acquire) || n < 200 {
        n += 1;
        let k = rng.below(DIRS);
        let c = rng.below(CLASSES);
        let j = rng.below(SLOTS);
        match rng.below(7) {
            0 | 1 => {
                let p = cname(k, c, j);
                if let Some(s) = ok_or_enoent(t.stat(p.as_str()), &p) {
                    assert_eq!(s.mode & S_IFMT, S_IFREG, "{p}");
                    assert_eq!(s.size, fsize(c), "{p} holds a file of another class");
                }
            }
            2 => {
                let p = format!("/d{k}/sub{c}/inner");
                if let Some(s) = ok_or_enoent(t.stat(p.as_str()), &p) {
                    assert_eq!(s.size, dsize(c), "{p}: walked into another directory");
                }
                let d = format!("/d{k}/sub{c}");
                if let Some(s) = ok_or_enoent(t.lstat(d.as_str()), &d) {
                    assert!(s.is_dir(), "{d}");
                }
            }
            3 => {
                let p = format!("/d{k}/r_{j}");
                if let Some(s) = ok_or_enoent(t.lstat(p.as_str()), &p) {
                    assert_eq!(s.size, RSIZE, "{p}");
                }
            }
            4 => {
                let p = format!("/d{k}/keep");
                let s = t.stat(p.as_str()).unwrap_or_else(|e| panic!("{p}: {e:?}"));
                assert_eq!(s.size, 500 + k as u64, "{p}");
                assert_eq!(t.access(p.as_str(), R_OK), Ok(()));
            }
            5 => {
                let s = t.stat("/stable/a/b/../b/./c/leaf").expect("stable path");
                assert_eq!(s.size, 77);
            }
            _ => {
                // A listing returns the untouched entry exactly once.
                let v = t.read_dir(format!("/d{k}").as_str()).unwrap();
                assert_eq!(
                    v.iter().filter(|e| e.name == b"keep").count(),
                    1,
                    "/d{k} listing"
                );
                for e in &v {
                    assert!(
                        e.name.starts_with(b"c")
                            || e.name.starts_with(b"r_")
                            || e.name.starts_with(b"s")
                            || e.name == b"keep"
                            || e.name == b"."
                            || e.name == b"..",
                        "odd name {:?}",
                        e.name
                    );
                }
            }
        }
    }
    n
}

fn file_writer(t: Task, id: usize, seed: u64, counts: &Counts) {
    let mut rng = Rng(seed);
    let stage = format!("/stage/t{id}");
    for _ in 0..WRITER_OPS {
        let (k, c, j) = (rng.below(DIRS), rng.below(CLASSES), rng.below(SLOTS));
        let p = cname(k, c, j);
        match rng.below(3) {
            0 => {
                make_file(&t, &stage, fsize(c));
                match t.renameat2(
                    AT_FDCWD,
                    stage.as_str(),
                    AT_FDCWD,
                    p.as_str(),
                    RENAME_NOREPLACE,
                ) {
                    Ok(()) => {
                        counts.created[c].fetch_add(1, Ordering::Relaxed);
                    }
                    Err(Errno::EEXIST) => t.unlink(stage.as_str()).unwrap(),
                    Err(e) => panic!("publish {p}: {e:?}"),
                }
            }
            1 => match t.unlink(p.as_str()) {
                Ok(()) => {
                    counts.unlinked[c].fetch_add(1, Ordering::Relaxed);
                }
                Err(Errno::ENOENT) => {}
                Err(e) => panic!("unlink {p}: {e:?}"),
            },
            _ => {
                let q = cname(rng.below(DIRS), c, rng.below(SLOTS));
                let flags = if rng.below(2) == 0 {
                    RENAME_NOREPLACE
                } else {
                    RENAME_EXCHANGE
                };
                match t.renameat2(AT_FDCWD, p.as_str(), AT_FDCWD, q.as_str(), flags) {
                    Ok(()) | Err(Errno::ENOENT) | Err(Errno::EEXIST) => {}
                    Err(e) => panic!("rename {p} {q} {flags}: {e:?}"),
                }
            }
        }
    }
}

fn tree_writer(t: Task, seed: u64) {
    let mut rng = Rng(seed);
    for _ in 0..WRITER_OPS {
        let c = rng.below(CLASSES);
        match rng.below(3) {
            0 => {
                // Move a directory with contents to another parent.
                let from = format!("/d{}/sub{c}", rng.below(DIRS));
                let to = format!("/d{}/sub{c}", rng.below(DIRS));
                let f = [0, RENAME_NOREPLACE, RENAME_EXCHANGE][rng.below(3)];
                match t.renameat2(AT_FDCWD, from.as_str(), AT_FDCWD, to.as_str(), f) {
                    Ok(()) | Err(Errno::ENOENT) | Err(Errno::EEXIST) | Err(Errno::ENOTEMPTY) => {}
                    Err(e) => panic!("rename {from} {to} {f}: {e:?}"),
                }
            }
            _ => {
                // Replace one r_ name by another (d_move over a victim).
                let a = format!("/d{}/r_{}", rng.below(DIRS), rng.below(SLOTS));
                let b = format!("/d{}/r_{}", rng.below(DIRS), rng.below(SLOTS));
                match t.rename(a.as_str(), b.as_str()) {
                    Ok(()) => {
                        // Keep the class populated (published whole).
                        make_file(&t, "/stage/tree", RSIZE);
                        if t.renameat2(
                            AT_FDCWD,
                            "/stage/tree",
                            AT_FDCWD,
                            a.as_str(),
                            RENAME_NOREPLACE,
                        )
                        .is_err()
                        {
                            t.unlink("/stage/tree").unwrap();
                        }
                    }
                    Err(Errno::ENOENT) => {}
                    Err(e) => panic!("rename {a} {b}: {e:?}"),
                }
            }
        }
    }
}

/// Walk the final tree: check every name, count names, inodes and files.
fn check_final(t: &Task, counts: &Counts) -> (usize, usize) {
    let mut names = 0;
    let mut inos = std::collections::HashSet::new();
    inos.insert(t.stat("/").unwrap().ino);
    fn walk(t: &Task, dir: &str, names: &mut usize, inos: &mut std::collections::HashSet<u64>) {
        for e in t.read_dir(if dir.is_empty() { "/" } else { dir }).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            *names += 1;
            let p = format!("{dir}/{}", String::from_utf8(e.name).unwrap());
            let s = t.lstat(p.as_str()).unwrap();
            assert_eq!(s.ino, e.ino, "{p}: readdir and stat disagree");
            assert!(inos.insert(s.ino), "{p}: inode named twice");
            if s.is_dir() {
                walk(t, &p, names, inos);
            }
        }
    }
    walk(t, "", &mut names, &mut inos);
    for c in 0..CLASSES {
        let mut n = 0;
        for k in 0..DIRS {
            for j in 0..SLOTS {
                let p = cname(k, c, j);
                if let Ok(s) = t.stat(p.as_str()) {
                    assert_eq!(s.size, fsize(c), "{p}");
                    n += 1;
                }
            }
        }
        let want =
            counts.created[c].load(Ordering::Relaxed) - counts.unlinked[c].load(Ordering::Relaxed);
        assert_eq!(
            n,
            want,
            "class {c}: files lost or duplicated ({:?})",
            t.vfs().config()
        );
    }
    for c in 0..CLASSES {
        let found: Vec<_> = (0..DIRS)
            .filter_map(|k| t.stat(format!("/d{k}/sub{c}/inner").as_str()).ok())
            .collect();
        assert_eq!(found.len(), 1, "sub{c} must exist exactly once");
        assert_eq!(found[0].size, dsize(c));
    }
    (names, inos.len())
}

/// The tests of this file run one at a time: each one's final rest check
/// waits for epoch garbage, which the others' pinned threads would delay.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(cfg: VfsConfig, seed: u64) {
    let auth = cfg.memfs.authoritative;
    let fs = Arc::new(MemFs::new(1, cfg.memfs.clone()));
    let vfs = Vfs::with_root_fs(cfg.clone(), fs.clone());
    let t = vfs.root_task();
    setup(&t);
    let counts = Counts {
        created: Default::default(),
        unlinked: Default::default(),
    };
    let done = AtomicBool::new(false);
    let barrier = Barrier::new(6);
    std::thread::scope(|s| {
        let mut writers = Vec::new();
        for i in 0..2 {
            let (tk, counts, barrier) = (t.fork(), &counts, &barrier);
            writers.push(s.spawn(move || {
                barrier.wait();
                file_writer(tk, i, seed * 31 + i as u64 + 1, counts)
            }));
        }
        {
            let (tk, barrier) = (t.fork(), &barrier);
            writers.push(s.spawn(move || {
                barrier.wait();
                tree_writer(tk, seed * 17 + 5)
            }));
        }
        let mut readers = Vec::new();
        for i in 0..2 {
            let (tk, done, barrier) = (t.fork(), &done, &barrier);
            readers.push(s.spawn(move || {
                barrier.wait();
                reader(tk, seed * 7 + i as u64 + 11, done)
            }));
        }
        let shrinker = {
            let (vfs, done, barrier) = (vfs.clone(), &done, &barrier);
            s.spawn(move || {
                barrier.wait();
                let mut n = 0;
                while !done.load(Ordering::Acquire) {
                    n += vfs.dcache().shrink(32, false);
                    n += vfs.dcache().shrink(8, true);
                    std::thread::yield_now();
                }
                n
            })
        };
        for w in writers {
            w.join().expect("writer panicked");
        }
        done.store(true, Ordering::Release);
        for r in readers {
            assert!(r.join().expect("reader panicked") >= 200);
        }
        let evicted = shrinker.join().expect("shrinker panicked");
        if auth {
            // Authoritative memfs pins every positive dentry; only
            // unhashed leftovers could be evicted, and there are none.
            assert_eq!(evicted, 0, "pinned dentries were evicted");
        }
    });
    let (names, inodes) = check_final(&t, &counts);
    // At rest. Closed files and freed dentries drop their references after
    // an epoch grace period; parents become evictable only once their
    // children are gone. So: run deferred frees, evict, repeat (bounded).
    let dc = vfs.dcache();
    let want = if auth { names + 1 } else { 1 };
    // Epochs advance only when every pinned thread of the process has moved
    // on, so give a busy machine a while; this waits for progress, it does
    // not assert on time.
    for i in 0..5000 {
        vfs.flush_deferred();
        while dc.shrink(usize::MAX, false) > 0 {}
        if dc.len() == want && fs.live_inodes() as usize == inodes {
            break;
        }
        if i >= 100 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    assert_eq!(dc.len(), want, "dentries not at rest ({cfg:?})");
    assert_eq!(dc.negative_len(), 0, "negative dentries left ({cfg:?})");
    assert_eq!(
        fs.live_inodes() as usize,
        inodes,
        "inodes leaked or freed early ({cfg:?})"
    );
    drop(t);
}

fn variants() -> Vec<VfsConfig> {
    let mut v = Vec::new();
    for lr in LockRefVariant::ALL {
        for index in [DcacheIndex::GlobalHash, DcacheIndex::PerDir] {
            for layout in [DentryLayout::Separated, DentryLayout::Packed] {
                let mut c = VfsConfig::default();
                c.dcache.lockref = lr;
                c.dcache.index = index;
                c.dcache.layout = layout;
                // Few buckets: renamed dentries share chains with the
                // stable ones.
                c.dcache.hash_bits = 5;
                v.push(c);
            }
        }
    }
    v
}

#[test]
fn rename_races_authoritative_memfs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (i, cfg) in variants().into_iter().enumerate() {
        run(cfg, i as u64 + 1);
    }
}

#[test]
fn rename_races_non_authoritative_memfs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (i, mut cfg) in variants().into_iter().enumerate() {
        // Lookups go to memfs on a miss, negative dentries are made, and the
        // small limit makes the cache evict during the run.
        cfg.memfs.authoritative = false;
        cfg.dcache.max_entries = 48;
        run(cfg, i as u64 + 101);
    }
}

#[test]
fn rename_races_reference_walk() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The "before" walk and Linux's stat-takes-a-reference shape.
    for (walk, stat_ref) in [(WalkMode::RefOnly, false), (WalkMode::LockFree, true)] {
        for auth in [true, false] {
            let mut c = VfsConfig {
                walk,
                stat_takes_ref: stat_ref,
                ..VfsConfig::default()
            };
            c.memfs.authoritative = auth;
            c.dcache.hash_bits = 5;
            c.dcache.max_entries = 64;
            run(c, 999);
        }
    }
}
