//! Name operations whose parent dentry holds no count (`walk::ParentWalk`)
//! stay correct while the cache evicts that dentry and other threads
//! remove and recreate the directory.
//!
//! A create, unlink, mkdir, rmdir or rename walks to its parent lock-free and takes
//! no reference on it; the parent is checked under its directory lock, and
//! eviction kills a directory's dentry only with that lock held
//! exclusively. Here a cache of 150 entries over a non-authoritative memfs
//! (every unused dentry evictable) is swept all the time by misses, while
//! workers create, check and remove their own names in shared directories,
//! and one thread removes and recreates a directory the others also use.
//! Every answer must be the one the namespace gives: a file just created
//! is found, removed names are gone, a directory that exists is never
//! reported missing, the link counts come out right, and no reference is
//! left behind (a full sweep afterwards leaves only the directories).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use scalevfs::*;

fn small_cache(index: DcacheIndex) -> Vfs {
    let mut c = VfsConfig::default();
    c.dcache.max_entries = 150;
    c.dcache.hash_bits = 8;
    c.dcache.index = index;
    c.memfs.authoritative = false;
    let fs = Arc::new(MemFs::new(1, c.memfs.clone()));
    Vfs::with_root_fs(c, fs)
}

#[test]
fn evicted_parents_never_change_an_answer() {
    for index in [DcacheIndex::GlobalHash, DcacheIndex::PerDir] {
        let vfs = small_cache(index);
        let t = vfs.root_task();
        t.mkdir("/w", 0o755).unwrap();
        for i in 0..4 {
            t.mkdir(format!("/w/d{i}").as_str(), 0o755).unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        std::thread::scope(|s| {
            // Misses: the cache is over its limit and sweeps all the time.
            let tm = t.fork();
            let st = stop.clone();
            s.spawn(move || {
                let mut i = 0u64;
                while !st.load(Ordering::Relaxed) {
                    let p = format!("/w/d{}/miss{}", i % 4, i);
                    assert_eq!(tm.stat(p.as_str()), Err(Errno::ENOENT));
                    i += 1;
                }
            });
            // A directory removed and made again, used by the workers too.
            let tr = t.fork();
            let st = stop.clone();
            s.spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    match tr.rmdir("/w/d3") {
                        Ok(()) | Err(Errno::ENOTEMPTY) | Err(Errno::ENOENT) => {}
                        Err(e) => panic!("rmdir d3: {e:?}"),
                    }
                    match tr.mkdir("/w/d3", 0o755) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => panic!("mkdir d3: {e:?}"),
                    }
                }
            });
            let workers: Vec<_> = (0..3)
                .map(|w| {
                    let tw = t.fork();
                    s.spawn(move || {
                        for k in 0..6000u32 {
                            let d = k % 4;
                            let f = format!("/w/d{d}/f{w}-{k}");
                            let sub = format!("/w/d{d}/s{w}");
                            let r = tw.open(f.as_str(), O_CREAT | O_EXCL | O_WRONLY, 0o644);
                            if d == 3 {
                                // Removed and made again meanwhile: created
                                // or ENOENT, nothing else.
                                match r {
                                    Ok(fd) => {
                                        tw.close(fd).unwrap();
                                        // d3 stays while it holds a name.
                                        let g = format!("/w/d3/g{w}-{k}");
                                        tw.rename(f.as_str(), g.as_str()).unwrap();
                                        tw.unlink(g.as_str()).unwrap();
                                    }
                                    Err(Errno::ENOENT) => {}
                                    Err(e) => panic!("create in d3: {e:?}"),
                                }
                                continue;
                            }
                            let fd = r.unwrap_or_else(|e| panic!("create {f}: {e:?}"));
                            tw.close(fd).unwrap();
                            assert!(tw.stat(f.as_str()).is_ok(), "{f} just made");
                            // Renames (their parents are walked uncounted
                            // too): within the directory, and into d3 and
                            // back when d3 is there.
                            let g = format!("/w/d{d}/g{w}-{k}");
                            tw.rename(f.as_str(), g.as_str())
                                .unwrap_or_else(|e| panic!("rename {f}: {e:?}"));
                            assert_eq!(tw.stat(f.as_str()), Err(Errno::ENOENT));
                            let x = format!("/w/d3/x{w}-{k}");
                            match tw.rename(g.as_str(), x.as_str()) {
                                Ok(()) => tw.rename(x.as_str(), f.as_str()).unwrap(),
                                Err(Errno::ENOENT) => tw.rename(g.as_str(), f.as_str()).unwrap(),
                                Err(e) => panic!("rename {g} to d3: {e:?}"),
                            }
                            tw.mkdir(sub.as_str(), 0o755)
                                .unwrap_or_else(|e| panic!("mkdir {sub}: {e:?}"));
                            tw.unlink(f.as_str())
                                .unwrap_or_else(|e| panic!("unlink {f}: {e:?}"));
                            assert_eq!(tw.stat(f.as_str()), Err(Errno::ENOENT));
                            tw.rmdir(sub.as_str())
                                .unwrap_or_else(|e| panic!("rmdir {sub}: {e:?}"));
                        }
                    })
                })
                .collect();
            for h in workers {
                h.join().unwrap();
            }
            stop.store(true, Ordering::Relaxed);
        });
        // Only the directories are left, each empty, with link count 2.
        for i in 0..3 {
            let p = format!("/w/d{i}");
            let fd = t.open(p.as_str(), O_RDONLY | O_DIRECTORY, 0).unwrap();
            let names: Vec<_> = t
                .getdents(fd, usize::MAX)
                .unwrap()
                .into_iter()
                .filter(|e| e.name != b"." && e.name != b"..")
                .collect();
            t.close(fd).unwrap();
            assert!(names.is_empty(), "{index:?}: {p} keeps {names:?}");
            assert_eq!(t.stat(p.as_str()).unwrap().nlink, 2, "{index:?}: {p}");
        }
        let w = t.stat("/w").unwrap();
        assert!(
            w.nlink == 5 || w.nlink == 6,
            "{index:?}: /w nlink {}",
            w.nlink
        );
        // No reference leaked, an uncounted parent's least of all: once
        // the threads are gone, a full sweep leaves only the directories
        // (/, /w, /w/d0..d3).
        // (Closed files that exited workers retired hold their dentries
        // until their grace period: flushed first.)
        // Up to 2 s: a busy machine may take a while to let every exited
        // worker's epoch bag come due.
        let mut len = usize::MAX;
        for _ in 0..200 {
            flush_deferred_frees();
            vfs.dcache().shrink(usize::MAX, false);
            len = vfs.dcache().len();
            if len <= 6 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(
            len <= 6,
            "{index:?}: {len} dentries left after a full sweep"
        );
    }
}
