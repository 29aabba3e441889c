//! Lock-free walks racing with renames of the directories on their paths
//! and of names beside them (issue 16: the walk validates each step on its
//! own, with the found dentry's d_seq or, for a miss, the hash bucket's
//! sequence, instead of one global rename sequence).
//!
//! WHAT A LOCKED WALK COULD GIVE. The reference walk is a sequence of
//! atomic lookups, one per component. So:
//! - `/x/A/c/f`: `/x/A` and `/x/B` are exchanged (RENAME_EXCHANGE of two
//!   directories) again and again; each holds `c/f`, so the path exists
//!   throughout, and its file is the one of `A` or of `B` (inode `ia` or
//!   `ib`, contents "A" or "B"). The same holds for `/x/A/c/../c/f` (`..`
//!   from `c` goes to `c`'s parent at that instant, which holds `c/f`) and
//!   for `/x/B/c/f`.
//! - `/y/p` and `/y/q`: two files exchanged again and again: both names
//!   exist throughout, each with inode `ip` or `iq`.
//! - `/y/r`: replaced by a rename over it again and again (a new file made
//!   under a staging name, written, renamed over `r`): it exists throughout
//!   and always holds a complete version ("v" and a number); an open of it
//!   reads one whole version.
//! - `getcwd` of a task whose cwd is `/x/A/c` (whichever directory that
//!   is): `/x/A/c` or `/x/B/c`; of one in the renamed `/z/d1`: `/z/d1` or
//!   `/z/d2`.
//! - Beside them, in the same few hash chains (16 buckets), files and a
//!   directory are renamed to and fro (`/y/u{k}` <-> `/y/w{k}`,
//!   `/z/d1` <-> `/z/d2`, the latter with `/z/d?/g` inside): a walker may
//!   find them or not, but what it finds is theirs.
//!
//! Any ENOENT (or other error) for a name that exists throughout, a wrong
//! inode or a torn content fails the test. Run on the authoritative memfs
//! (a validated miss is ENOENT without asking the filesystem: the case the
//! bucket sequence exists for) and on a non-authoritative one.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use scalevfs::*;

/// Renames per renaming thread (each thread also stops at the deadline).
const RENAMES: usize = 20_000;

fn secs() -> Duration {
    let s = std::env::var("SCALEVFS_WALK_RACE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(s)
}

fn write_file(t: &Task, path: &str, data: &[u8]) {
    let fd = t.open(path, O_CREAT | O_WRONLY | O_TRUNC, 0o644).unwrap();
    assert_eq!(t.write(fd, data).unwrap(), data.len());
    t.close(fd).unwrap();
}

fn read_file(t: &Task, path: &str) -> VfsResult<Vec<u8>> {
    let fd = t.open(path, O_RDONLY, 0)?;
    let mut buf = [0u8; 64];
    let n = t.pread(fd, &mut buf, 0);
    t.close(fd).unwrap();
    Ok(buf[..n?].to_vec())
}

fn run(config: VfsConfig) {
    let vfs = Vfs::with_config(config);
    let t = vfs.root_task();
    for d in [
        "/x", "/x/A", "/x/B", "/x/A/c", "/x/B/c", "/y", "/z", "/z/d1",
    ] {
        t.mkdir(d, 0o755).unwrap();
    }
    write_file(&t, "/x/A/c/f", b"A");
    write_file(&t, "/x/B/c/f", b"B");
    write_file(&t, "/y/p", b"p");
    write_file(&t, "/y/q", b"q");
    write_file(&t, "/y/r", b"v0");
    write_file(&t, "/z/d1/g", b"g");
    for k in 0..4 {
        write_file(&t, &format!("/y/u{k}"), format!("u{k}").as_bytes());
    }
    let ia = t.stat("/x/A/c/f").unwrap().ino;
    let ib = t.stat("/x/B/c/f").unwrap().ino;
    let ip = t.stat("/y/p").unwrap().ino;
    let iq = t.stat("/y/q").unwrap().ino;
    let ig = t.stat("/z/d1/g").unwrap().ino;

    let stop = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + secs();
    std::thread::scope(|s| {
        let mut renamers = Vec::new();
        // Directory exchange on the walked paths.
        renamers.push(s.spawn(|| {
            let t = vfs.root_task();
            for _ in 0..RENAMES {
                if Instant::now() > deadline {
                    break;
                }
                t.renameat2(AT_FDCWD, "/x/A", AT_FDCWD, "/x/B", RENAME_EXCHANGE)
                    .unwrap();
            }
        }));
        // File exchange and rename over a name that exists throughout.
        renamers.push(s.spawn(|| {
            let t = vfs.root_task();
            for i in 1..=RENAMES {
                if Instant::now() > deadline {
                    break;
                }
                t.renameat2(AT_FDCWD, "/y/p", AT_FDCWD, "/y/q", RENAME_EXCHANGE)
                    .unwrap();
                write_file(&t, "/y/.stage", format!("v{i}").as_bytes());
                t.rename("/y/.stage", "/y/r").unwrap();
            }
        }));
        // Unrelated names in the same chains: files and a directory moved
        // to and fro.
        renamers.push(s.spawn(|| {
            let t = vfs.root_task();
            let mut flip = false;
            for i in 0..RENAMES {
                if Instant::now() > deadline {
                    break;
                }
                let k = i % 4;
                let (a, b) = (format!("/y/u{k}"), format!("/y/w{k}"));
                if flip {
                    t.rename(&b, &a).unwrap();
                } else {
                    t.rename(&a, &b).unwrap();
                }
                if k == 3 {
                    flip = !flip;
                }
                if i % 2 == 0 {
                    t.rename("/z/d1", "/z/d2").unwrap();
                } else {
                    t.rename("/z/d2", "/z/d1").unwrap();
                }
            }
        }));
        for w in 0..3 {
            let (stop, checked, vfs) = (stop.clone(), checked.clone(), &vfs);
            s.spawn(move || {
                let t = vfs.root_task();
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    // Paths through the exchanged directories.
                    for p in ["/x/A/c/f", "/x/B/c/f", "/x/A/c/../c/f", "/x/B/./c/f"] {
                        match t.stat(p) {
                            Ok(st) => {
                                assert!(st.ino == ia || st.ino == ib, "{p}: inode {}", st.ino)
                            }
                            Err(e) => panic!("stat {p}: {e:?} (exists throughout)"),
                        }
                    }
                    let p = if w % 2 == 0 { "/x/A/c/f" } else { "/x/B/c/f" };
                    match read_file(&t, p) {
                        Ok(b) => assert!(b == b"A" || b == b"B", "{p}: {b:?}"),
                        Err(e) => panic!("open {p}: {e:?} (exists throughout)"),
                    }
                    // The exchanged files and the replaced one.
                    for p in ["/y/p", "/y/q"] {
                        match t.lstat(p) {
                            Ok(st) => {
                                assert!(st.ino == ip || st.ino == iq, "{p}: inode {}", st.ino)
                            }
                            Err(e) => panic!("lstat {p}: {e:?} (exists throughout)"),
                        }
                    }
                    if let Err(e) = t.access("/y/r", R_OK) {
                        panic!("access /y/r: {e:?} (exists throughout)");
                    }
                    match read_file(&t, "/y/r") {
                        Ok(b) => assert!(
                            b.len() >= 2 && b[0] == b'v' && b[1..].iter().all(u8::is_ascii_digit),
                            "/y/r: {b:?}"
                        ),
                        Err(e) => panic!("open /y/r: {e:?} (exists throughout)"),
                    }
                    // Names that come and go: theirs when found.
                    let k = n % 4;
                    for (p, want) in [
                        (format!("/y/u{k}"), format!("u{k}")),
                        (format!("/y/w{k}"), format!("u{k}")),
                    ] {
                        match read_file(&t, &p) {
                            Ok(b) => assert_eq!(b, want.as_bytes(), "{p}"),
                            Err(Errno::ENOENT) => {}
                            Err(e) => panic!("open {p}: {e:?}"),
                        }
                    }
                    for p in ["/z/d1/g", "/z/d2/g", "/z/d1/../d1/g"] {
                        match t.stat(p) {
                            Ok(st) => assert_eq!(st.ino, ig, "{p}"),
                            Err(Errno::ENOENT) => {}
                            Err(e) => panic!("stat {p}: {e:?}"),
                        }
                    }
                    n += 1;
                }
                checked.fetch_add(n, Ordering::Relaxed);
            });
        }
        // getcwd climbs directories that are being moved: it validates with
        // the global rename sequence, which moves of directories (only)
        // write, so it returns a path that existed.
        {
            let (stop, vfs) = (stop.clone(), &vfs);
            s.spawn(move || {
                let t = vfs.root_task();
                t.chdir("/x/A/c").unwrap();
                let u = vfs.root_task();
                // `/z/d1` is being renamed to and fro: into whichever name
                // it has.
                while u.chdir("/z/d1").is_err() && u.chdir("/z/d2").is_err() {}
                while !stop.load(Ordering::Relaxed) {
                    let cwd = t.getcwd().unwrap();
                    assert!(cwd == b"/x/A/c" || cwd == b"/x/B/c", "{cwd:?}");
                    let cwd = u.getcwd().unwrap();
                    assert!(cwd == b"/z/d1" || cwd == b"/z/d2", "{cwd:?}");
                }
            });
        }
        for r in renamers {
            r.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(checked.load(Ordering::Relaxed) > 0);
    // At rest: every name where the last renames left it.
    assert!(t.stat("/x/A/c/f").is_ok() && t.stat("/x/B/c/f").is_ok());
    assert_eq!(t.stat("/y/.stage"), Err(Errno::ENOENT));
    let (a, b) = (t.stat("/z/d1/g"), t.stat("/z/d2/g"));
    assert!(a.is_ok() != b.is_ok(), "{a:?} {b:?}");
}

fn small(auth: bool) -> VfsConfig {
    let mut c = VfsConfig::default();
    c.memfs.authoritative = auth;
    // 16 buckets: the names share chains, so moves re-link dentries
    // through the chains the walkers are reading.
    c.dcache.hash_bits = 4;
    c
}

#[test]
fn walk_rename_races_authoritative() {
    run(small(true));
}

#[test]
fn walk_rename_races_non_authoritative() {
    run(small(false));
}
