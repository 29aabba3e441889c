//! Issue 16: names created, linked, renamed and removed in one shared
//! directory. memfs keeps a directory's size as its entry count (not in the
//! attribute record) and writes its mtime/ctime once per clock tick; these
//! tests check that what `stat` reports is still what POSIX and tmpfs say.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use scalevfs::*;

/// A named step of a test.
type Op = (&'static str, Box<dyn Fn(&Task)>);

fn create(t: &Task, p: &str) {
    let fd = t.open(p, O_CREAT | O_WRONLY | O_EXCL, 0o644).unwrap();
    t.close(fd).unwrap();
}

/// Wait until the clock every timestamp comes from has moved past `t`.
fn next_tick(t: Timespec) {
    while Timespec::now() <= t {
        thread::sleep(Duration::from_millis(1));
    }
}

/// tmpfs's directory size: 20 bytes per entry, `.` and `..` included.
fn tmpfs_size(entries: u64) -> u64 {
    20 * (2 + entries)
}

/// Every name operation in a directory makes its mtime and ctime the
/// current tick, as seen by `stat`, even when the one before it in the
/// same tick wrote no attribute.
#[test]
fn name_operations_advance_the_directory_times() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    t.mkdir("/e", 0o755).unwrap();
    let ops: Vec<Op> = vec![
        ("create", Box::new(|t| create(t, "/d/a"))),
        ("create 2", Box::new(|t| create(t, "/d/b"))),
        ("link", Box::new(|t| t.link("/d/a", "/d/l").unwrap())),
        (
            "rename within",
            Box::new(|t| t.rename("/d/l", "/d/m").unwrap()),
        ),
        (
            "rename out",
            Box::new(|t| t.rename("/d/m", "/e/m").unwrap()),
        ),
        ("rename in", Box::new(|t| t.rename("/e/m", "/d/m").unwrap())),
        ("unlink", Box::new(|t| t.unlink("/d/m").unwrap())),
        ("mkdir", Box::new(|t| t.mkdir("/d/s", 0o755).unwrap())),
        ("rmdir", Box::new(|t| t.rmdir("/d/s").unwrap())),
    ];
    for (what, op) in &ops {
        let before = t.stat("/d").unwrap();
        next_tick(before.mtime.max(before.ctime));
        op(&t);
        let after = t.stat("/d").unwrap();
        assert!(after.mtime > before.mtime, "{what}: mtime");
        assert!(after.ctime > before.ctime, "{what}: ctime");
        // A second change in the same tick (usually) leaves the time as it
        // is, and it is still not before the change.
        let now = Timespec::now();
        create(&t, "/d/x");
        t.unlink("/d/x").unwrap();
        let again = t.stat("/d").unwrap();
        assert!(again.mtime >= after.mtime && again.mtime >= now, "{what}");
    }
}

/// The directory's size follows its entries through every kind of name
/// operation, and after concurrent creates and unlinks by several threads.
#[test]
fn directory_size_counts_entries() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    t.mkdir("/e", 0o755).unwrap();
    let size = |p: &str| t.stat(p).unwrap().size;
    assert_eq!(size("/d"), tmpfs_size(0));
    create(&t, "/d/a");
    create(&t, "/d/b");
    assert_eq!(size("/d"), tmpfs_size(2));
    t.link("/d/a", "/d/l").unwrap();
    assert_eq!(size("/d"), tmpfs_size(3));
    t.rename("/d/l", "/d/m").unwrap();
    assert_eq!(size("/d"), tmpfs_size(3));
    t.rename("/d/m", "/d/b").unwrap(); // over an existing name
    assert_eq!(size("/d"), tmpfs_size(2));
    t.rename("/d/b", "/e/b").unwrap();
    assert_eq!((size("/d"), size("/e")), (tmpfs_size(1), tmpfs_size(1)));
    t.mkdir("/d/s", 0o755).unwrap();
    assert_eq!(size("/d"), tmpfs_size(2));
    create(&t, "/d/s/f");
    assert_eq!(size("/d/s"), tmpfs_size(1));
    assert_eq!(t.rmdir("/d/s"), Err(Errno::ENOTEMPTY));
    t.unlink("/d/s/f").unwrap();
    t.rmdir("/d/s").unwrap();
    t.unlink("/d/a").unwrap();
    assert_eq!(size("/d"), tmpfs_size(0));
    // fstat through an open directory says the same.
    let fd = t.open("/e", O_RDONLY | O_DIRECTORY, 0).unwrap();
    assert_eq!(t.fstat(fd).unwrap().size, tmpfs_size(1));
    t.close(fd).unwrap();

    const THREADS: usize = 4;
    const N: usize = 300;
    let vfs = Arc::new(vfs);
    let hs: Vec<_> = (0..THREADS)
        .map(|k| {
            let vfs = vfs.clone();
            thread::spawn(move || {
                let t = vfs.root_task();
                for i in 0..N {
                    create(&t, &format!("/d/t{k}-{i}"));
                    if i % 3 == 0 {
                        t.unlink(&format!("/d/t{k}-{i}")).unwrap();
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let left = (THREADS * (N - N.div_ceil(3))) as u64;
    assert_eq!(t.stat("/d").unwrap().size, tmpfs_size(left));
    assert_eq!(t.read_dir("/d").unwrap().len() as u64, left + 2);
}

/// Cookies come from per-thread batches (issue 16): with several threads
/// creating in one directory while another lists it, every listing returns
/// each name at most once, every name that existed before the listing
/// started, and positions (`d_off`) that are unique; at the end one
/// listing returns every name exactly once. A listing started after a
/// create (in the same thread) ends before names created after it start.
#[test]
fn cookies_unique_with_concurrent_creates() {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, Ordering};
    const THREADS: usize = 3;
    const N: usize = 1500;
    let vfs = Arc::new(Vfs::new());
    let t = vfs.root_task();
    t.mkdir("/d", 0o777).unwrap();
    for i in 0..100 {
        create(&t, &format!("/d/old{i}"));
    }
    let done = Arc::new(AtomicBool::new(false));
    let hs: Vec<_> = (0..THREADS)
        .map(|k| {
            let vfs = vfs.clone();
            thread::spawn(move || {
                let t = vfs.root_task();
                for i in 0..N {
                    create(&t, &format!("/d/t{k}-{i}"));
                }
            })
        })
        .collect();
    let lister = {
        let (vfs, done) = (vfs.clone(), done.clone());
        thread::spawn(move || {
            let t = vfs.root_task();
            let mut listings = 0;
            while !done.load(Ordering::Relaxed) || listings == 0 {
                let v = t.read_dir("/d").unwrap();
                let names: HashSet<_> = v.iter().map(|e| e.name.clone()).collect();
                let offs: HashSet<_> = v.iter().map(|e| e.next_cookie).collect();
                assert_eq!(names.len(), v.len(), "a name listed twice");
                assert_eq!(offs.len(), v.len(), "a position given twice");
                // In position order (memfs merges its cookie lists).
                assert!(
                    v.windows(2).all(|w| w[0].next_cookie < w[1].next_cookie),
                    "a listing out of position order"
                );
                for i in 0..100 {
                    assert!(names.contains(format!("old{i}").as_bytes()));
                }
                listings += 1;
            }
        })
    };
    for h in hs {
        h.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    lister.join().unwrap();
    let v = t.read_dir("/d").unwrap();
    let names: HashSet<_> = v.iter().map(|e| e.name.clone()).collect();
    assert_eq!(
        (v.len(), names.len()),
        (THREADS * N + 102, THREADS * N + 102)
    );

    // A listing's end holds against later creates of this thread.
    let fd = t.open("/d", O_RDONLY | O_DIRECTORY, 0).unwrap();
    let first = t.getdents(fd, 1).unwrap();
    assert_eq!(first.len(), 1);
    for i in 0..50 {
        create(&t, &format!("/d/late{i}"));
    }
    let mut rest = 0;
    loop {
        let v = t.getdents(fd, 500).unwrap();
        if v.is_empty() {
            break;
        }
        assert!(v.iter().all(|e| !e.name.starts_with(b"late")));
        rest += v.len();
    }
    assert_eq!(rest + 1, THREADS * N + 102);
    t.close(fd).unwrap();
}

/// memfs keeps the names of a directory that one thread filled in one
/// list and spreads them by hash from a second thread's first insert on
/// (`MemDir::names`). Names from before and after the switch are found,
/// renamed in place (either direction), exchanged, listed and removed
/// alike, and the size follows.
#[test]
fn names_from_before_and_after_a_second_thread_work_alike() {
    // Authoritative (the dcache answers lookups) and not (memfs does,
    // after the cache is emptied).
    for authoritative in [true, false] {
        names_across_the_switch(authoritative);
    }
}

fn names_across_the_switch(authoritative: bool) {
    use std::collections::BTreeSet;
    let vfs = Vfs::with_config(VfsConfig {
        memfs: MemFsOptions {
            authoritative,
            ..MemFsOptions::default()
        },
        ..VfsConfig::default()
    });
    let shrink = |vfs: &Vfs| while vfs.dcache().shrink(usize::MAX, false) > 0 {};
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    for i in 0..60 {
        create(&t, &format!("/d/one{i}"));
    }
    // A second thread: from now on new names spread.
    let t2 = t.clone_thread();
    thread::spawn(move || {
        for i in 0..60 {
            create(&t2, &format!("/d/two{i}"));
        }
    })
    .join()
    .unwrap();
    for i in 60..80 {
        create(&t, &format!("/d/one{i}"));
    }
    let listed = |t: &Task| -> BTreeSet<String> {
        t.read_dir("/d")
            .unwrap()
            .into_iter()
            .map(|e| String::from_utf8(e.name).unwrap())
            .filter(|n| n != "." && n != "..")
            .collect()
    };
    let mut want: BTreeSet<String> = (0..80)
        .map(|i| format!("one{i}"))
        .chain((0..60).map(|i| format!("two{i}")))
        .collect();
    assert_eq!(listed(&t), want);
    assert_eq!(t.stat("/d").unwrap().size, tmpfs_size(140));
    shrink(&vfs);
    for n in &want {
        assert!(t.stat(&format!("/d/{n}")).is_ok(), "{n}");
        // An existing name, wherever it lives, is found by an exclusive create.
        assert_eq!(
            t.open(&format!("/d/{n}"), O_CREAT | O_WRONLY | O_EXCL, 0o644),
            Err(Errno::EEXIST),
            "{n}"
        );
    }
    // Renames in place, old names of both kinds to new names, and back.
    for i in (0..60).step_by(3) {
        for (from, to) in [
            (format!("one{i}"), format!("uno{i}")),
            (format!("two{i}"), format!("dos{i}")),
        ] {
            t.rename(&format!("/d/{from}"), &format!("/d/{to}"))
                .unwrap();
            want.remove(&from);
            want.insert(to);
        }
    }
    // Exchanges across the two kinds.
    for i in (1..60).step_by(3) {
        let (a, b) = (format!("/d/one{i}"), format!("/d/two{i}"));
        let ia = t.stat(&a).unwrap().ino;
        let ib = t.stat(&b).unwrap().ino;
        t.renameat2(AT_FDCWD, &a, AT_FDCWD, &b, RENAME_EXCHANGE)
            .unwrap();
        assert_eq!(t.stat(&a).unwrap().ino, ib);
        assert_eq!(t.stat(&b).unwrap().ino, ia);
    }
    assert_eq!(listed(&t), want);
    assert_eq!(t.stat("/d").unwrap().size, tmpfs_size(140));
    shrink(&vfs);
    for n in &want {
        t.unlink(&format!("/d/{n}")).unwrap();
        assert_eq!(t.stat(&format!("/d/{n}")).err(), Some(Errno::ENOENT), "{n}");
    }
    assert!(listed(&t).is_empty());
    assert_eq!(t.stat("/d").unwrap().size, tmpfs_size(0));
    t.rmdir("/d").unwrap();
}
