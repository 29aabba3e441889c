//! The directory storm through the mount: 4 client threads run mkdir,
//! rmdir, rename, RENAME_EXCHANGE, create and unlink (libc on the mounted
//! path) over a few names in two nested directories. Bounded by an
//! operation count and a time cap; a watchdog fails the test (it does not
//! hang) if no operation completes for several seconds, aborting the FUSE
//! connection so that stuck clients return.
//!
//! Without /dev/fuse (or, as non-root, without fusermount3) the test prints
//! why it is skipped and passes; with `SCALEVFS_REQUIRE_FUSE=1` that is a
//! failure instead (CI sets it).

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use scalevfs::Vfs;
use scalevfs_fuse::{spawn_mount, FuseConfig, MountConfig};

mod common;
use common::*;

const THREADS: usize = 4;
/// Operations per thread (the usual bound; `SCALEVFS_STORM_OPS` overrides,
/// the time cap still applies).
const OPS: u64 = 5_000;
/// Time cap on the whole storm (a slow machine stops early, still passing
/// if every thread made progress).
const CAP: Duration = Duration::from_secs(10);
/// No completed operation for this long: a hang.
const STALL: Duration = Duration::from_secs(8);

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// xorshift64*: a fixed, per-thread sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One random operation; Ok(()) also for the errnos a racing namespace
/// gives, Err with a description for any other.
fn one_op(rng: &mut Rng, names: &[PathBuf]) -> Result<(), String> {
    let a = &names[rng.below(names.len())];
    let b = &names[rng.below(names.len())];
    let (ca, cb) = (cpath(a), cpath(b));
    let op = rng.below(7);
    let (r, what) =
        // SAFETY: every call gets valid NUL-terminated paths (or a zeroed
        // stat buffer it may write); a returned fd is closed at once.
        unsafe {
        match op {
            0 => (libc::mkdir(ca.as_ptr(), 0o755), "mkdir"),
            1 => (libc::rmdir(ca.as_ptr()), "rmdir"),
            2 => (
                libc::renameat(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr()),
                "rename",
            ),
            3 => (
                libc::syscall(
                    libc::SYS_renameat2,
                    libc::AT_FDCWD,
                    ca.as_ptr(),
                    libc::AT_FDCWD,
                    cb.as_ptr(),
                    libc::RENAME_EXCHANGE,
                ) as i32,
                "exchange",
            ),
            4 => {
                let fd = libc::open(ca.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
                if fd >= 0 {
                    libc::close(fd);
                }
                (fd.min(0), "create")
            }
            5 => (libc::unlink(ca.as_ptr()), "unlink"),
            _ => {
                let mut st: libc::stat = std::mem::zeroed();
                (libc::lstat(ca.as_ptr(), &mut st), "lstat")
            }
        }
    };
    if r == 0 {
        return Ok(());
    }
    let e = errno();
    // What a racing namespace may answer: the name is gone or there,
    // directory vs file mismatches, a directory into its own subtree, a
    // non-empty directory.
    let expected = [
        libc::ENOENT,
        libc::EEXIST,
        libc::ENOTEMPTY,
        libc::EISDIR,
        libc::ENOTDIR,
        libc::EINVAL,
    ];
    if expected.contains(&e) {
        Ok(())
    } else {
        Err(format!(
            "{what}({}, {}): unexpected errno {e} ({})",
            a.display(),
            b.display(),
            std::io::Error::from_raw_os_error(e)
        ))
    }
}

/// Abort the FUSE connection of the mount at `dir`, device `dev` (every
/// pending and later request fails with ENOTCONN), so that stuck clients
/// return, and detach the mount. A request the daemon has already read is
/// waited for uninterruptibly, even by a killed process: without the abort
/// the test process could not even exit.
fn abort_connection(dir: &Path, dev: u64) {
    // Through fusectl where it is mounted.
    let minor = libc::minor(dev);
    let _ = fs::write(format!("/sys/fs/fuse/connections/{minor}/abort"), b"1");
    let c = cpath(dir);
    // SAFETY: a valid NUL-terminated path. A forced unmount of a FUSE mount
    // aborts its connection (fuse_umount_begin) even where the unmount
    // itself then fails as busy; the lazy one detaches it.
    unsafe {
        libc::umount2(c.as_ptr(), libc::MNT_FORCE);
        libc::umount2(c.as_ptr(), libc::MNT_DETACH);
    }
}

#[test]
fn directory_storm_through_the_mount() {
    if !fuse_ok("directory_storm_through_the_mount") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("scalevfs-fuse-storm-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let cfg = MountConfig {
        fuse: FuseConfig::default(),
        options: Vec::new(),
        threads: THREADS,
    };
    let m = spawn_mount(Vfs::new(), &dir, &cfg).expect("mount");
    let dev = fs::metadata(&dir).unwrap().dev();
    // Two nested directories that stay; names inside both that come and go.
    let top = dir.join("a");
    let nested = top.join("b");
    fs::create_dir_all(&nested).unwrap();
    let mut names = Vec::new();
    for d in [&top, &nested] {
        for n in ["x", "y", "z"] {
            names.push(d.join(n));
        }
    }
    let names = Arc::new(names);
    let ops: u64 = std::env::var("SCALEVFS_STORM_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(OPS);
    let progress: Arc<Vec<AtomicU64>> = Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for k in 0..THREADS {
        let (names, progress, stop, done_tx) = (
            names.clone(),
            progress.clone(),
            stop.clone(),
            done_tx.clone(),
        );
        // Detached: a thread stuck in the kernel must not keep the test
        // from reporting.
        std::thread::spawn(move || {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (k as u64 + 1));
            let mut err = None;
            for _ in 0..ops {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Err(e) = one_op(&mut rng, &names) {
                    err = Some(e);
                    break;
                }
                // Relaxed: a progress count read by the watchdog; no data
                // is published through it.
                progress[k].fetch_add(1, Ordering::Relaxed);
            }
            let _ = done_tx.send((k, err));
        });
    }
    drop(done_tx);
    let start = Instant::now();
    let mut last_total = 0;
    let mut last_change = Instant::now();
    let mut finished = 0;
    let mut errors = Vec::new();
    while finished < THREADS {
        match done_rx.recv_timeout(Duration::from_millis(200)) {
            Ok((k, err)) => {
                finished += 1;
                if let Some(e) = err {
                    errors.push(format!("thread {k}: {e}"));
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if start.elapsed() > CAP {
            stop.store(true, Ordering::Relaxed);
        }
        // Relaxed: see above.
        let total: u64 = progress.iter().map(|p| p.load(Ordering::Relaxed)).sum();
        if total != last_total {
            last_total = total;
            last_change = Instant::now();
        } else if last_change.elapsed() > STALL {
            stop.store(true, Ordering::Relaxed);
            let per: Vec<u64> = progress.iter().map(|p| p.load(Ordering::Relaxed)).collect();
            abort_connection(&dir, dev);
            // The request threads may be deadlocked in the library: do not
            // wait for them (unmount would join them).
            std::mem::forget(m);
            panic!(
                "no progress for {STALL:?} after {total} operations (per thread {per:?}): \
                 the storm stalled"
            );
        }
    }
    assert!(errors.is_empty(), "{errors:#?}");
    // Relaxed: the threads have finished (joined through the channel).
    let per: Vec<u64> = progress.iter().map(|p| p.load(Ordering::Relaxed)).collect();
    assert!(
        per.iter().all(|&n| n > 0),
        "a thread made no progress: {per:?}"
    );
    eprintln!(
        "storm: {per:?} operations per thread in {:?}",
        start.elapsed()
    );
    // The tree is consistent: every listed name stats, with the type the
    // listing gives, and the directories can be emptied.
    for d in [&top, &nested] {
        for e in fs::read_dir(d).unwrap() {
            let e = e.unwrap();
            let md = fs::symlink_metadata(e.path()).unwrap();
            assert_eq!(md.is_dir(), e.file_type().unwrap().is_dir(), "{e:?}");
        }
    }
    fs::remove_dir_all(&top).unwrap();
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
    m.unmount().unwrap();
    let _ = fs::remove_dir(&dir);
}
