//! `scalevfs::fs` where a review found it differing from `std::fs` on the
//! host's tmpfs: a directory removed while it is read, `remove_dir_all`
//! racing with another removal, `canonicalize` of a long remainder behind
//! a symlink, the cwd outside a chroot, whole-file reads of huge sparse
//! files, and std's `FileTimes` and `DirBuilder`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use scalevfs::fs::Fs;
use scalevfs::Vfs;

/// The largest allocation this test binary grants: a whole-file read of a
/// huge sparse file must fail at once rather than grow a buffer of zeros
/// (one growing toward the file's size stops here, where without the cap
/// it would take the machine's memory).
const ALLOC_CAP: usize = 64 << 20;

thread_local! {
    /// The largest request of this thread the cap refused, and the largest
    /// it granted (per thread: another test's panic may format a backtrace
    /// with big buffers meanwhile). Const-initialized `Cell`s of plain
    /// integers: using them allocates nothing.
    static BIGGEST_REFUSED: Cell<usize> = const { Cell::new(0) };
    static BIGGEST_GRANTED: Cell<usize> = const { Cell::new(0) };
}

struct CappedAlloc;

impl CappedAlloc {
    fn refuse(size: usize) -> bool {
        let refused = size > ALLOC_CAP;
        let which = if refused {
            &BIGGEST_REFUSED
        } else {
            &BIGGEST_GRANTED
        };
        // try_with: nothing to record on a thread being torn down.
        let _ = which.try_with(|c| c.set(c.get().max(size)));
        refused
    }
}

// SAFETY: every request within the cap is forwarded unchanged to the
// system allocator; one past it gets null, which GlobalAlloc allows.
unsafe impl GlobalAlloc for CappedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if Self::refuse(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if Self::refuse(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from System (every grant above is System's).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if Self::refuse(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` came from System with `layout`; the caller's
        // contract for `realloc` is passed on as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: CappedAlloc = CappedAlloc;

fn new_fs() -> Fs {
    Fs::new(Vfs::new().root_task())
}

/// A fresh directory on the host's tmpfs, removed on drop; `None` where
/// there is no /dev/shm.
struct HostDir(PathBuf);

impl HostDir {
    fn new(tag: &str) -> Option<HostDir> {
        let p = PathBuf::from(format!(
            "/dev/shm/stdfs_review_{tag}_{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).ok()?;
        Some(HostDir(p))
    }
}

impl Drop for HostDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------
// 1. A directory removed while it is read.
// ---------------------------------------------------------------------

#[test]
fn read_dir_of_a_removed_directory_ends() {
    let fs = new_fs();
    fs.create_dir("/d").unwrap();
    let mut rd = fs.read_dir("/d").unwrap();
    fs.remove_dir("/d").unwrap();
    // glibc's readdir takes getdents' ENOENT on a dead directory as the
    // end, so std's iterator just ends.
    assert!(rd.next().is_none());
    assert!(rd.next().is_none());

    // Also after a first batch was read.
    fs.create_dir("/e").unwrap();
    let mut rd = fs.read_dir("/e").unwrap();
    fs.write("/e/f", b"x").unwrap();
    let first = rd.next().unwrap().unwrap();
    assert_eq!(first.file_name(), "f");
    fs.remove_file("/e/f").unwrap();
    fs.remove_dir("/e").unwrap();
    assert!(rd.next().is_none());

    if let Some(h) = HostDir::new("read_dir") {
        let d = h.0.join("d");
        std::fs::create_dir(&d).unwrap();
        let mut rd = std::fs::read_dir(&d).unwrap();
        std::fs::remove_dir(&d).unwrap();
        assert!(rd.next().is_none(), "std on /dev/shm");
    }
}

/// A tree of 10 directories of 10 directories of 3 files under `top`.
fn make_tree(mkdir: impl Fn(&str), write: impl Fn(&str), top: &str) {
    mkdir(top);
    for i in 0..10 {
        mkdir(&format!("{top}/d{i}"));
        for j in 0..10 {
            mkdir(&format!("{top}/d{i}/e{j}"));
            for k in 0..3 {
                write(&format!("{top}/d{i}/e{j}/f{k}"));
            }
        }
    }
}

#[test]
fn remove_dir_all_racing_with_itself() {
    // Two callers removing one tree: each may find entries gone below its
    // top (no error), so the only failure is NotFound of the top itself,
    // and at most one of the two can see that. (Before getdents' ENOENT
    // was taken as the end, the loser failed midway, also with NotFound:
    // `remove_dir_all_ignores_what_vanishes_below_its_top` tells the two
    // apart.)
    let fs = new_fs();
    for round in 0..20 {
        make_tree(
            |p| fs.create_dir(p).unwrap(),
            |p| fs.write(p, b"x").unwrap(),
            "/t",
        );
        let bar = Barrier::new(2);
        let rs: Vec<std::io::Result<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let (fs, bar) = (fs.clone(), &bar);
                    s.spawn(move || {
                        bar.wait();
                        fs.remove_dir_all("/t")
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let failed: Vec<_> = rs.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(failed.len() <= 1, "round {round}: both failed: {failed:?}");
        for e in failed {
            assert_eq!(e.kind(), ErrorKind::NotFound, "round {round}: {e:?}");
        }
        assert!(!fs.exists("/t"), "round {round}");
    }
    assert_eq!(fs.task().files().count(), 0);
}

/// One caller removes `top` while another removes its subdirectories one
/// by one: everything the first finds gone lies below its top, so it must
/// succeed; the second's calls may each find their top gone. Returns the
/// outcomes of the second's calls.
fn nested_race(
    remove_dir_all: impl Fn(&str) -> std::io::Result<()> + Sync,
    exists: impl Fn(&str) -> bool,
    top: &str,
) -> Vec<std::io::Result<()>> {
    let bar = Barrier::new(2);
    let (whole, parts) = std::thread::scope(|s| {
        let whole = s.spawn(|| {
            bar.wait();
            remove_dir_all(top)
        });
        let parts = s.spawn(|| {
            bar.wait();
            (0..10)
                .map(|i| remove_dir_all(&format!("{top}/d{i}")))
                .collect::<Vec<_>>()
        });
        (whole.join().unwrap(), parts.join().unwrap())
    });
    assert!(whole.is_ok(), "{whole:?}");
    assert!(!exists(top));
    parts
}

#[test]
fn remove_dir_all_ignores_what_vanishes_below_its_top() {
    let fs = new_fs();
    for _ in 0..50 {
        make_tree(
            |p| fs.create_dir(p).unwrap(),
            |p| fs.write(p, b"x").unwrap(),
            "/t",
        );
        for r in nested_race(|p| fs.remove_dir_all(p), |p| fs.exists(p), "/t") {
            if let Err(e) = r {
                assert_eq!(e.kind(), ErrorKind::NotFound, "{e:?}");
            }
        }
    }
    assert_eq!(fs.task().files().count(), 0);

    // The same property holds for std on the host's tmpfs.
    if let Some(h) = HostDir::new("nested") {
        let top = h.0.join("t");
        let top = top.to_str().unwrap();
        for _ in 0..5 {
            make_tree(
                |p| std::fs::create_dir(p).unwrap(),
                |p| std::fs::write(p, b"x").unwrap(),
                top,
            );
            for r in nested_race(
                |p| std::fs::remove_dir_all(p),
                |p| Path::new(p).exists(),
                top,
            ) {
                if let Err(e) = r {
                    assert_eq!(e.kind(), ErrorKind::NotFound, "std: {e:?}");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------
// 2. canonicalize with a long remainder behind a symlink.
// ---------------------------------------------------------------------

#[test]
fn canonicalize_long_remainder_after_a_symlink() {
    let fs = new_fs();
    fs.create_dir_all("/x/sub").unwrap();
    fs.symlink("sub", "/x/lsub").unwrap();
    fs.symlink("/x/sub", "/x/abs").unwrap();
    fs.symlink("loop", "/x/loop").unwrap();
    let tail = "./".repeat(100_000);
    let sub = Path::new("/x/sub");
    for p in ["/x/sub/", "/x/lsub/", "/x/abs/", "/x/lsub/../lsub/"] {
        assert_eq!(fs.canonicalize(format!("{p}{tail}")).unwrap(), sub, "{p}");
    }
    fs.set_current_dir("/x").unwrap();
    assert_eq!(fs.canonicalize(format!("lsub/{tail}")).unwrap(), sub);
    // A long remainder of ".." behind a symlink, too.
    assert_eq!(
        fs.canonicalize(format!("lsub/{}", "../".repeat(50_000)))
            .unwrap(),
        Path::new("/")
    );
    // A loop is still ELOOP, with or without a remainder.
    for p in [
        "loop".to_string(),
        format!("loop/{tail}"),
        format!("/x/loop/{tail}"),
    ] {
        let e = fs.canonicalize(&p).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{}", &p[..8]);
    }
}

// ---------------------------------------------------------------------
// 3. The cwd outside a chroot.
// ---------------------------------------------------------------------

#[test]
fn cwd_outside_the_chroot_is_enoent() {
    let fs = new_fs();
    fs.create_dir("/o").unwrap();
    fs.create_dir_all("/r/in").unwrap();
    fs.set_current_dir("/o").unwrap();
    fs.task().chroot("/r").unwrap();
    // The kernel's getcwd says "(unreachable)/o"; glibc's refuses a path
    // not starting with '/' as ENOENT, and realpath(".") uses it.
    for e in [
        fs.current_dir().unwrap_err(),
        fs.canonicalize(".").unwrap_err(),
        fs.canonicalize("x/..").unwrap_err(),
    ] {
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e:?}");
    }
    // Absolute paths resolve inside the new root; a cwd inside it is back
    // to normal.
    assert_eq!(fs.canonicalize("/in/..").unwrap(), Path::new("/"));
    fs.set_current_dir("/in").unwrap();
    assert_eq!(fs.current_dir().unwrap(), Path::new("/in"));
    assert_eq!(fs.canonicalize(".").unwrap(), Path::new("/in"));
}

// ---------------------------------------------------------------------
// 4. Whole-file reads reserve the file's size first.
// ---------------------------------------------------------------------

#[test]
fn whole_file_reads_of_a_huge_sparse_file_are_out_of_memory() {
    let fs = new_fs();
    let size: u64 = 1 << 50;
    fs.create("/big").unwrap().set_len(size).unwrap();
    assert_eq!(fs.metadata("/big").unwrap().len(), size);

    // As std's: the size is reserved before reading, and a reservation
    // that cannot be had is OutOfMemory, at once (no buffer of zeros
    // grows toward it: the cap on allocations would abort the test).
    // Counted from here (making the Vfs allocates its tables).
    BIGGEST_GRANTED.with(|c| c.set(0));
    let oom = |r: std::io::Result<usize>| {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{e:?}");
    };
    oom(fs.read("/big").map(|v| v.len()));
    oom(fs.read_to_string("/big").map(|s| s.len()));
    let mut f = fs.open("/big").unwrap();
    oom(f.read_to_end(&mut Vec::new()));
    oom(f.read_to_string(&mut String::new()));
    oom((&f).read_to_end(&mut Vec::new()));
    // The file's size was asked for, and nothing big was handed out.
    assert!(BIGGEST_REFUSED.with(Cell::get) >= size as usize);
    assert!(BIGGEST_GRANTED.with(Cell::get) < 1 << 20);

    // Only what is left past the position is reserved: the last bytes
    // read as they should, zeros, appended to what the buffer holds.
    f.seek(SeekFrom::Start(size - 10)).unwrap();
    let mut v = b"ab".to_vec();
    assert_eq!(f.read_to_end(&mut v).unwrap(), 10);
    assert_eq!(v, b"ab\0\0\0\0\0\0\0\0\0\0");
    f.seek(SeekFrom::End(-3)).unwrap();
    let mut s = String::from("z");
    assert_eq!(f.read_to_string(&mut s).unwrap(), 3);
    assert_eq!(s, "z\0\0\0");
    // A position past the end reserves nothing and reads nothing.
    f.seek(SeekFrom::Start(size + 5)).unwrap();
    assert_eq!(f.read_to_end(&mut Vec::new()).unwrap(), 0);

    // Small files still read whole.
    fs.write("/small", "héllo").unwrap();
    assert_eq!(fs.read("/small").unwrap(), "héllo".as_bytes());
    assert_eq!(fs.read_to_string("/small").unwrap(), "héllo");
    fs.write("/bad", b"\xff\xfe").unwrap();
    let mut s = String::from("keep");
    let e = fs.open("/bad").unwrap().read_to_string(&mut s).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidData);
    assert_eq!(s, "keep");
}

// ---------------------------------------------------------------------
// 5. FileTimes and DirBuilder.
// ---------------------------------------------------------------------

/// The steps of `file_times_set_what_they_hold`, on any `set_times`; the
/// (accessed, modified) pairs after each.
fn file_time_steps<F>(
    set_times: impl Fn(&F, Option<SystemTime>, Option<SystemTime>) -> std::io::Result<()>,
    times: impl Fn() -> (SystemTime, SystemTime),
    f: &F,
) -> Vec<(SystemTime, SystemTime)> {
    let a = UNIX_EPOCH + Duration::new(1_000_000_000, 500_000_000);
    let m = UNIX_EPOCH + Duration::new(2_000_000_000, 7);
    let old = UNIX_EPOCH - Duration::new(1, 500_000_000);
    let mut out = Vec::new();
    for (sa, sm) in [
        (Some(a), None),
        (None, Some(m)),
        (None, None),
        (Some(m), Some(a)),
        (Some(old), None),
    ] {
        set_times(f, sa, sm).unwrap();
        out.push(times());
    }
    out
}

#[test]
fn file_times_set_what_they_hold() {
    use scalevfs::fs::FileTimes;
    let fs = new_fs();
    fs.write("/f", b"x").unwrap();
    // A read-only file: futimens needs ownership, not write access.
    let f = fs.open("/f").unwrap();
    let got = file_time_steps(
        |f: &scalevfs::fs::File, a, m| {
            let mut t = FileTimes::new();
            if let Some(a) = a {
                t = t.set_accessed(a);
            }
            if let Some(m) = m {
                t = t.set_modified(m);
            }
            f.set_times(t)
        },
        || {
            let md = fs.metadata("/f").unwrap();
            (md.accessed().unwrap(), md.modified().unwrap())
        },
        &f,
    );
    let a = UNIX_EPOCH + Duration::new(1_000_000_000, 500_000_000);
    let m = UNIX_EPOCH + Duration::new(2_000_000_000, 7);
    let old = UNIX_EPOCH - Duration::new(1, 500_000_000);
    assert_eq!(got[1], (a, m));
    assert_eq!(got[2], (a, m), "an empty FileTimes changes nothing");
    assert_eq!(got[3], (m, a));
    assert_eq!(got[4], (old, a));
    // set_modified leaves the access time alone.
    f.set_modified(m).unwrap();
    let md = fs.metadata("/f").unwrap();
    assert_eq!((md.accessed().unwrap(), md.modified().unwrap()), (old, m));

    // std's File::set_times does the same on the host's tmpfs.
    if let Some(h) = HostDir::new("times") {
        let p = h.0.join("f");
        std::fs::write(&p, b"x").unwrap();
        let hf = std::fs::File::open(&p).unwrap();
        let want = file_time_steps(
            |f: &std::fs::File, a, m| {
                let mut t = std::fs::FileTimes::new();
                if let Some(a) = a {
                    t = t.set_accessed(a);
                }
                if let Some(m) = m {
                    t = t.set_modified(m);
                }
                f.set_times(t)
            },
            || {
                let md = std::fs::metadata(&p).unwrap();
                (md.accessed().unwrap(), md.modified().unwrap())
            },
            &hf,
        );
        // The first step leaves the modification time as the write made it.
        assert_eq!(got[0].0, want[0].0);
        assert_eq!(got[1..], want[1..]);
    }
}

#[test]
fn dir_builder_makes_directories_with_its_mode() {
    use scalevfs::fs::{DirBuilder, DirBuilderExt, MetadataExt as _};
    let fs = new_fs();
    fs.task().umask(0o022);
    let mode = |p: &str| fs.metadata(p).unwrap().mode() & 0o7777;

    // Not recursive: mkdir, the parent must exist, the directory not.
    let e = fs.dir_builder().create("/a/b").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    fs.dir_builder().create("/a").unwrap();
    assert_eq!(mode("/a"), 0o755);
    let e = fs.dir_builder().create("/a").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists);

    // Recursive: every missing level with the mode (less the umask), an
    // existing directory is fine, an existing file is not.
    let mut b = DirBuilder::new(&fs);
    b.recursive(true);
    DirBuilderExt::mode(&mut b, 0o1770);
    b.create("/a/b/c/d").unwrap();
    for p in ["/a/b", "/a/b/c", "/a/b/c/d"] {
        assert_eq!(mode(p), 0o1750, "{p}");
    }
    assert_eq!(mode("/a"), 0o755, "an existing level is left alone");
    b.create("/a/b/c/d").unwrap();
    b.create("/a/b/c/d/").unwrap();
    fs.write("/a/f", b"").unwrap();
    let e = b.create("/a/f").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    let e = b.create("/a/f/g").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
    // An empty path is no error for the recursive builder, as std's.
    b.create("").unwrap();
    let e = fs.dir_builder().create("").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    // Relative paths resolve against the task's cwd.
    fs.set_current_dir("/a").unwrap();
    fs.dir_builder()
        .mode(0o700)
        .recursive(true)
        .create("r/s")
        .unwrap();
    assert_eq!(mode("/a/r/s"), 0o700);
}
