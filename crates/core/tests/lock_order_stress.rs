//! Random namespace and file operations on four threads with the lock-order
//! checker on (debug builds): every lock of the core is taken under the
//! checker's eye, in every combination a random mix reaches, on the default
//! configuration and on the per-dir index with a non-authoritative memfs, a
//! tiny dcache (reclaim sweeps run inside the operations), locking readdir
//! and the locked llseek. Bounded by an operation count, not by time.
//!
//! The end state is checked: the tree is a tree (each directory reached
//! once, `..` is the parent, link counts are 2 + subdirectories), every
//! listed name is `lstat`-able with the listed inode, every non-directory's
//! link count is the number of names it has; and, once every fd is closed,
//! the caches come to rest: the dcache holds exactly the named dentries
//! (authoritative) or only the root (non-authoritative), memfs holds exactly
//! the named inodes, and the orphan file is empty.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use scalevfs::*;

const NAMES: [&str; 5] = ["p", "q", "r", "s", "t"];
const THREADS: usize = 4;
const OPS: usize = 3000;

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
    let a = NAMES[rng.below(NAMES.len())];
    let b = NAMES[rng.below(NAMES.len())];
    match rng.below(3) {
        0 => format!("/w/{a}"),
        1 => format!("/w/{a}/{b}"),
        _ => format!("/w/p/{b}"),
    }
}

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
            | Errno::EPERM
            | Errno::ELOOP
            | Errno::EMFILE
    )
}

fn worker(t: Task, vfs: &Vfs, seed: u64) {
    let mut rng = Rng(seed);
    let mut fds: Vec<i32> = Vec::new();
    for _ in 0..OPS {
        let p = path(&mut rng);
        let q = path(&mut rng);
        let r: VfsResult<()> = match rng.below(17) {
            0 => t.mkdir(p.as_str(), 0o755),
            1 => t.rmdir(p.as_str()),
            2 => t.rename(p.as_str(), q.as_str()),
            3 => t.renameat2(AT_FDCWD, p.as_str(), AT_FDCWD, q.as_str(), RENAME_EXCHANGE),
            4 => t.renameat2(AT_FDCWD, p.as_str(), AT_FDCWD, q.as_str(), RENAME_NOREPLACE),
            5 => t.link(p.as_str(), q.as_str()),
            6 => t.unlink(p.as_str()),
            7 => t.symlink("../q", p.as_str()),
            8 => t.open(p.as_str(), O_CREAT | O_RDWR, 0o644).map(|fd| {
                fds.push(fd);
                if fds.len() > 4 {
                    t.close(fds.remove(0)).unwrap();
                }
            }),
            9 => match fds.last() {
                Some(&fd) => t.write(fd, b"0123456789").map(|_| ()),
                None => Ok(()),
            },
            10 => match fds.first() {
                Some(&fd) => t.ftruncate(fd, rng.below(64) as i64),
                None => t.truncate(p.as_str(), 3),
            },
            11 => t.chmod(p.as_str(), 0o700 | rng.below(0o100) as u32),
            12 => t.lstat(p.as_str()).map(|_| ()),
            13 => t.read_dir(p.as_str()).map(|_| ()),
            14 => t.chdir(p.as_str()).and_then(|()| t.chdir("/")),
            15 => match fds.pop() {
                Some(fd) => t.close(fd),
                None => Ok(()),
            },
            _ => t
                .open(p.as_str(), O_RDONLY | O_DIRECTORY, 0)
                .and_then(|fd| {
                    let r = t.lseek(fd, 0, scalevfs::io::SEEK_SET).map(|_| ());
                    t.close(fd).unwrap();
                    r
                }),
        };
        if let Err(e) = r {
            assert!(allowed(e), "unexpected {e:?} ({p}, {q})");
        }
        if rng.below(64) == 0 {
            vfs.dcache().shrink(16, false);
        }
    }
    for fd in fds {
        t.close(fd).unwrap();
    }
}

/// Walk the whole tree with `chdir` and check it (see the file comment).
/// Returns (names, distinct inodes including the root's).
fn check_tree(t: &Task) -> (usize, usize) {
    let mut seen_dirs = HashSet::new();
    let mut links: HashMap<u64, (u32, u32)> = HashMap::new(); // ino -> (nlink, names)
    let mut names = 0;
    let mut visit = |names: &mut usize| -> (u64, Vec<String>) {
        let st = t.lstat(".").unwrap();
        assert!(
            seen_dirs.insert(st.ino),
            "directory {} reached twice",
            st.ino
        );
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
                subdirs.push(name);
            } else {
                links.entry(s.ino).or_insert((s.nlink, 0)).1 += 1;
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
    t.chdir("/").unwrap();
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
    for (ino, (nlink, n)) in &links {
        assert_eq!(*nlink, *n, "inode {ino}: link count vs names");
    }
    // Units of nr_inodes in use: one per inode, and one per name of a
    // file past its first (memfs charges hard links as tmpfs does).
    let extra: usize = links.values().map(|&(_, n)| n as usize - 1).sum();
    (names, seen_dirs.len() + links.len() + extra)
}

fn run(cfg: VfsConfig, seed: u64) {
    let auth = cfg.memfs.authoritative;
    let fs = Arc::new(MemFs::new(1, cfg.memfs.clone()));
    let vfs = Vfs::with_root_fs(cfg.clone(), fs.clone());
    let root = vfs.root_task();
    root.mkdir("/w", 0o755).unwrap();
    root.mkdir("/w/p", 0o755).unwrap();
    std::thread::scope(|s| {
        for i in 0..THREADS {
            let t = if i % 2 == 0 {
                root.fork()
            } else {
                root.clone_thread()
            };
            let vfs = &vfs;
            s.spawn(move || {
                worker(
                    t,
                    vfs,
                    seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                )
            });
        }
    });
    let (names, inodes) = check_tree(&root);
    // At rest: deferred frees run after a grace period, parents become
    // evictable after their children (bounded retries, no timing asserted).
    let dc = vfs.dcache();
    let want = if auth { names + 1 } else { 1 };
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
    assert_eq!(fs.live_inodes() as usize, inodes, "inodes leaked ({cfg:?})");
    let fd = root.open("/", O_RDONLY | O_DIRECTORY, 0).unwrap();
    let sb = root.files().get_arc(fd).unwrap().path().mnt.sb().clone();
    root.close(fd).unwrap();
    assert!(sb.orphans.is_empty(), "orphans left ({cfg:?})");
}

/// One at a time: each run's rest check waits for epoch garbage, which the
/// other's pinned threads would delay.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn random_ops_default_config() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    run(VfsConfig::default(), 0x5EED_0001);
}

#[test]
fn random_ops_per_dir_non_authoritative_small_cache() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cfg = VfsConfig::default();
    for (k, v) in [
        ("index", "per-dir"),
        ("readdir", "locking"),
        ("llseek", "locked"),
        ("max-entries", "48"),
        ("orphan", "locked"),
    ] {
        cfg.set(k, v).unwrap();
    }
    cfg.memfs.authoritative = false;
    run(cfg, 0x5EED_0002);
}
