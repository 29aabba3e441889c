//! Tree workloads: the life of a source tree on one filesystem, measured
//! phase by phase and target by target in one run (`scalevfs bench-tree`).
//!
//! Phases (each timed separately, files split over the threads by
//! directory, so threads never share a directory):
//! 1. **create** — untar-like: make the directories, then write every file
//!    (mixed sizes, most small, a few up to 256 KiB);
//! 2. **find+stat** — list every directory and `stat` every entry;
//! 3. **read** — read every file back and compare it with what was written;
//! 4. **delete** — remove every file, then every directory.
//!
//! Targets (each on a fresh filesystem):
//! - `lib-memfs`, `lib-ext4`: the scalevfs library, called in-process through
//!   its `std::fs`-shaped API (`scalevfs::fs`); ext4 on an image made by
//!   `mkfs.ext4` in the work directory, opened with `Ext4::open` (on tmpfs,
//!   ext4 or XFS: mapped into memory, allocated 1 MiB at a time on first
//!   write, `MmapDevice::open_lazy`);
//! - `lib-ext4-pwrite`: the same through `pread`/`pwrite` (`FileDevice`):
//!   every `pwrite` to one image file takes that file's inode lock in the
//!   host kernel, and on tmpfs also allocates the page it first writes,
//!   under that lock;
//! - `lib-ext4-mmap`: the same through `MmapDevice::open` (every block
//!   allocated at the open, which the "open image ms" column shows);
//! - `fuse-memfs`, `fuse-ext4`: the same through `scalevfs mount` (this
//!   binary), used with `std::fs` as any program would;
//! - `fuse2fs`: e2fsprogs' FUSE ext4 on the same kind of image (the peer);
//! - `kernel`: the kernel's ext4 on a loop device of such an image (root);
//! - `tmpfs`: the host's tmpfs directly (a reference, not a peer).
//!
//! A target that cannot run here (no root for a loop mount, no fuse2fs, no
//! /dev/fuse, an ext4 image scalevfs cannot write yet) is reported with the
//! reason and skipped; it never fails the others.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

/// Every target, in report order.
pub const TARGETS: &[&str] = &[
    "lib-memfs",
    "lib-ext4",
    "lib-ext4-pwrite",
    "lib-ext4-mmap",
    "fuse-memfs",
    "fuse-ext4",
    "fuse2fs",
    "kernel",
    "tmpfs",
];

/// The four phases, in order.
pub const PHASES: &[&str] = &["create", "find+stat", "read", "delete"];

/// What to run.
#[derive(Debug, Clone)]
pub struct TreeOptions {
    pub files: usize,
    pub dirs: usize,
    pub threads: Vec<usize>,
    pub targets: Vec<String>,
    /// Size of each ext4 image (bytes).
    pub image_size: u64,
    /// Where images, mount points and the tmpfs tree go (default: a
    /// directory in /dev/shm, so the image's "disk" is memory).
    pub workdir: PathBuf,
    /// The `scalevfs` binary for the FUSE targets.
    pub bin: PathBuf,
    /// Extra arguments for `scalevfs mount` (the `fuse-memfs` and
    /// `fuse-ext4` targets), e.g. `--attr-timeout=1` to compare cache
    /// settings with one binary.
    pub mount_args: Vec<String>,
    pub seed: u64,
}

/// One measured (target, threads) run.
#[derive(Debug, Clone, Serialize)]
pub struct TreeRow {
    pub target: String,
    pub threads: usize,
    /// Seconds per phase, in `PHASES` order.
    pub secs: Vec<f64>,
    /// Files (create, read, delete) or entries (find+stat) per second.
    pub per_sec: Vec<f64>,
    /// Time to open the image (library ext4 only), milliseconds.
    pub mount_ms: Option<f64>,
}

/// A target that did not run, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub target: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct TreeReport {
    pub files: usize,
    pub dirs: usize,
    pub bytes: u64,
    pub image_size: u64,
    /// Extra `scalevfs mount` arguments of the FUSE targets.
    pub mount_args: Vec<String>,
    pub rows: Vec<TreeRow>,
    pub skipped: Vec<Skipped>,
}

/// The file set: sizes and contents are functions of the index, so every
/// target writes and checks the same bytes without storing them twice.
struct FileSet {
    files: usize,
    dirs: usize,
    pool: Vec<u8>,
    seed: u64,
}

/// Largest file of the set.
const MAX_FILE: usize = 256 << 10;

impl FileSet {
    fn new(files: usize, dirs: usize, seed: u64) -> FileSet {
        let mut x = seed | 1;
        let pool = (0..MAX_FILE + 4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        FileSet {
            files,
            dirs,
            pool,
            seed,
        }
    }
    fn hash(&self, i: usize) -> u64 {
        let mut h = (i as u64 ^ self.seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 29;
        h.wrapping_mul(0xBF58_476D_1CE4_E5B9)
    }
    /// 40 % under 1 KiB, 40 % 1–8 KiB, 18 % 8–64 KiB, 2 % 64–256 KiB.
    fn size(&self, i: usize) -> usize {
        let h = self.hash(i);
        let (lo, hi) = match h % 100 {
            0..=39 => (0, 1 << 10),
            40..=79 => (1 << 10, 8 << 10),
            80..=97 => (8 << 10, 64 << 10),
            _ => (64 << 10, MAX_FILE),
        };
        lo + ((h >> 8) as usize % (hi - lo))
    }
    fn data(&self, i: usize) -> &[u8] {
        let off = (self.hash(i) >> 20) as usize % 4096;
        &self.pool[off..off + self.size(i)]
    }
    fn dir(&self, d: usize) -> String {
        format!("/d{d:03}")
    }
    fn path(&self, i: usize) -> String {
        format!("{}/f{i:05}", self.dir(i % self.dirs))
    }
    fn bytes(&self) -> u64 {
        (0..self.files).map(|i| self.size(i) as u64).sum()
    }
    /// The files of directory `d`.
    fn files_in(&self, d: usize) -> impl Iterator<Item = usize> + '_ {
        (d..self.files).step_by(self.dirs)
    }
}

/// The operations a phase needs, on a path relative to the target's root.
trait Target: Sync {
    fn mkdir(&self, p: &str) -> io::Result<()>;
    fn write(&self, p: &str, data: &[u8]) -> io::Result<()>;
    /// (name, is_dir) of every entry but `.` and `..`.
    fn list(&self, p: &str) -> io::Result<Vec<(String, bool)>>;
    fn stat_len(&self, p: &str) -> io::Result<u64>;
    fn read(&self, p: &str, buf: &mut Vec<u8>) -> io::Result<()>;
    fn remove_file(&self, p: &str) -> io::Result<()>;
    fn remove_dir(&self, p: &str) -> io::Result<()>;
}

/// A directory of the host (a mount point or tmpfs), through `std::fs`.
struct Host(PathBuf);

impl Host {
    fn p(&self, p: &str) -> PathBuf {
        self.0.join(p.trim_start_matches('/'))
    }
}

impl Target for Host {
    fn mkdir(&self, p: &str) -> io::Result<()> {
        std::fs::create_dir(self.p(p))
    }
    fn write(&self, p: &str, data: &[u8]) -> io::Result<()> {
        let mut f = std::fs::File::create(self.p(p))?;
        f.write_all(data)
    }
    fn list(&self, p: &str) -> io::Result<Vec<(String, bool)>> {
        let mut v = Vec::new();
        for e in std::fs::read_dir(self.p(p))? {
            let e = e?;
            v.push((
                e.file_name().to_string_lossy().into_owned(),
                e.file_type()?.is_dir(),
            ));
        }
        Ok(v)
    }
    fn stat_len(&self, p: &str) -> io::Result<u64> {
        Ok(std::fs::symlink_metadata(self.p(p))?.len())
    }
    fn read(&self, p: &str, buf: &mut Vec<u8>) -> io::Result<()> {
        buf.clear();
        std::fs::File::open(self.p(p))?.read_to_end(buf)?;
        Ok(())
    }
    fn remove_file(&self, p: &str) -> io::Result<()> {
        std::fs::remove_file(self.p(p))
    }
    fn remove_dir(&self, p: &str) -> io::Result<()> {
        std::fs::remove_dir(self.p(p))
    }
}

/// The scalevfs library: one `scalevfs::fs::Fs` (its own task) per thread.
struct Library {
    vfs: scalevfs::Vfs,
}

thread_local! {
    static LIB_FS: std::cell::RefCell<Option<(usize, Arc<scalevfs::fs::Fs>)>> =
        const { std::cell::RefCell::new(None) };
}

impl Library {
    /// This thread's `Fs` on this target's `Vfs` (a task of its own, as a
    /// program's threads would each have).
    fn fs(&self) -> Arc<scalevfs::fs::Fs> {
        let key = self as *const Library as usize;
        LIB_FS.with(|c| {
            let mut c = c.borrow_mut();
            match &*c {
                Some((k, fs)) if *k == key => fs.clone(),
                _ => {
                    let fs = Arc::new(scalevfs::fs::Fs::new(self.vfs.root_task()));
                    *c = Some((key, fs.clone()));
                    fs
                }
            }
        })
    }
}

impl Target for Library {
    fn mkdir(&self, p: &str) -> io::Result<()> {
        self.fs().create_dir(p)
    }
    fn write(&self, p: &str, data: &[u8]) -> io::Result<()> {
        self.fs().write(p, data)
    }
    fn list(&self, p: &str) -> io::Result<Vec<(String, bool)>> {
        let mut v = Vec::new();
        for e in self.fs().read_dir(p)? {
            let e = e?;
            v.push((
                e.file_name().to_string_lossy().into_owned(),
                e.file_type()?.is_dir(),
            ));
        }
        Ok(v)
    }
    fn stat_len(&self, p: &str) -> io::Result<u64> {
        Ok(self.fs().symlink_metadata(p)?.len())
    }
    fn read(&self, p: &str, buf: &mut Vec<u8>) -> io::Result<()> {
        buf.clear();
        self.fs().open(p)?.read_to_end(buf)?;
        Ok(())
    }
    fn remove_file(&self, p: &str) -> io::Result<()> {
        self.fs().remove_file(p)
    }
    fn remove_dir(&self, p: &str) -> io::Result<()> {
        self.fs().remove_dir(p)
    }
}

fn clear_thread_fs() {
    LIB_FS.with(|c| *c.borrow_mut() = None);
}

/// Run `f(k)` on `threads` threads (k = 0..threads) and time the whole.
fn timed(
    threads: usize,
    f: impl Fn(usize) -> io::Result<u64> + Sync,
) -> io::Result<(Duration, u64)> {
    let start = Instant::now();
    let results: Vec<io::Result<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|k| {
                let f = &f;
                s.spawn(move || {
                    let r = f(k);
                    clear_thread_fs();
                    r
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("worker panicked")))
            })
            .collect()
    });
    let el = start.elapsed();
    let mut n = 0;
    for r in results {
        n += r?;
    }
    Ok((el, n))
}

fn ctx(what: &str, p: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {p}: {e}"))
}

/// The four phases on `t` with `threads` threads; seconds and counts.
fn phases(t: &dyn Target, set: &FileSet, threads: usize) -> io::Result<(Vec<f64>, Vec<f64>)> {
    let mine = |k: usize| (0..set.dirs).filter(move |d| d % threads == k);
    let mut secs = Vec::new();
    let mut rate = Vec::new();
    let mut record = |(el, n): (Duration, u64)| {
        secs.push(el.as_secs_f64());
        rate.push(n as f64 / el.as_secs_f64().max(1e-9));
    };
    record(timed(threads, |k| {
        let mut n = 0;
        for d in mine(k) {
            let dp = set.dir(d);
            t.mkdir(&dp).map_err(|e| ctx("mkdir", &dp, e))?;
            for i in set.files_in(d) {
                let p = set.path(i);
                t.write(&p, set.data(i)).map_err(|e| ctx("write", &p, e))?;
                n += 1;
            }
        }
        Ok(n)
    })?);
    record(timed(threads, |k| {
        let mut n = 0;
        for d in mine(k) {
            let dp = set.dir(d);
            let entries = t.list(&dp).map_err(|e| ctx("list", &dp, e))?;
            let want = set.files_in(d).count();
            if entries.len() != want {
                return Err(io::Error::other(format!(
                    "{dp}: {} entries listed, {want} written",
                    entries.len()
                )));
            }
            for (name, _) in entries {
                let p = format!("{dp}/{name}");
                t.stat_len(&p).map_err(|e| ctx("stat", &p, e))?;
                n += 1;
            }
        }
        Ok(n)
    })?);
    record(timed(threads, |k| {
        let mut n = 0;
        let mut buf = Vec::with_capacity(MAX_FILE);
        for d in mine(k) {
            for i in set.files_in(d) {
                let p = set.path(i);
                t.read(&p, &mut buf).map_err(|e| ctx("read", &p, e))?;
                if buf != set.data(i) {
                    return Err(io::Error::other(format!("{p}: read back differs")));
                }
                n += 1;
            }
        }
        Ok(n)
    })?);
    record(timed(threads, |k| {
        let mut n = 0;
        for d in mine(k) {
            for i in set.files_in(d) {
                let p = set.path(i);
                t.remove_file(&p).map_err(|e| ctx("unlink", &p, e))?;
                n += 1;
            }
            let dp = set.dir(d);
            t.remove_dir(&dp).map_err(|e| ctx("rmdir", &dp, e))?;
        }
        Ok(n)
    })?);
    Ok((secs, rate))
}

fn run_cmd(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{:?} failed: {}",
            cmd.get_program(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A fresh ext4 image from e2fsprogs' mkfs.ext4 (default features plus the
/// orphan file, as the ext4 tests use).
pub(crate) fn make_image(path: &Path, size: u64) -> Result<(), String> {
    let _ = std::fs::remove_file(path);
    run_cmd(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-O", "orphan_file"])
            .arg(path)
            .arg(format!("{}k", size / 1024)),
    )
}

fn is_mounted(dir: &Path) -> bool {
    Command::new("mountpoint")
        .arg("-q")
        .arg(dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Why `dir` cannot take a new mount for a run: it is already a mount
/// point (one an earlier run left, say). The wait for the new mount
/// (`is_mounted`) would end at once, before the new filesystem is up, and
/// the run would measure the old one under the new name.
fn already_mounted(dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let busy = |why: &str| {
        Some(format!(
            "{} is already a mount point ({why}): unmount it first (fusermount3 -u or umount)",
            dir.display()
        ))
    };
    if is_mounted(dir) {
        return busy("left from an earlier run?");
    }
    // Without `mountpoint` or where it cannot tell: a dead FUSE mount
    // answers ENOTCONN, and a mount of another filesystem has another
    // device than its parent directory.
    match std::fs::metadata(dir) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => busy("its FUSE daemon is gone"),
        Ok(m) => match dir.parent().map(std::fs::metadata) {
            Some(Ok(p)) if p.dev() != m.dev() => busy("another device than its parent"),
            _ => None,
        },
        Err(_) => None,
    }
}

/// An unnamed file for a daemon's stderr, in `dir` (the run's scratch
/// directory): unlike a pipe no one reads once the mount is up, it never
/// fills and blocks a chatty daemon, and being unlinked at once it is
/// gone with the run, however it ends. Returns the daemon's end and the
/// one read back for an error message.
fn daemon_log(dir: &Path) -> io::Result<(std::fs::File, std::fs::File)> {
    let path = dir.join(format!(".scalevfs-daemon-{}.log", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    let daemon = f.try_clone()?;
    Ok((daemon, f))
}

/// The end of what a daemon wrote to its log (`daemon_log`), at most
/// 4 KiB of it, for an error message.
fn log_tail(log: &std::fs::File) -> String {
    use std::os::unix::fs::FileExt;
    let len = log.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(4096);
    let mut buf = vec![0u8; (len - from) as usize];
    let n = log.read_at(&mut buf, from).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).trim().to_string()
}

/// A mount made for one run: unmounted (and its daemon reaped) on drop.
pub(crate) struct Mounted {
    dir: PathBuf,
    daemon: Option<Child>,
    kernel: bool,
}

impl Mounted {
    /// Start `cmd` (a foreground FUSE daemon) and wait for `dir` to be a
    /// mount point. `dir` must not be one already (`already_mounted`).
    /// The daemon's stderr goes to an unnamed file in `dir`'s parent (the
    /// run's scratch directory), read back if it exits before mounting.
    pub(crate) fn fuse(mut cmd: Command, dir: &Path) -> Result<Mounted, String> {
        if let Some(e) = already_mounted(dir) {
            return Err(e);
        }
        let scratch = dir.parent().unwrap_or(Path::new("."));
        let (to_daemon, log) =
            daemon_log(scratch).map_err(|e| format!("daemon log in {}: {e}", scratch.display()))?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(to_daemon)
            .spawn()
            .map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !is_mounted(dir) {
            if let Ok(Some(st)) = child.try_wait() {
                return Err(format!(
                    "{:?} exited ({st}): {}",
                    cmd.get_program(),
                    log_tail(&log)
                ));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                let said = log_tail(&log);
                return Err(if said.is_empty() {
                    format!("{:?}: no mount after 10 s", cmd.get_program())
                } else {
                    format!("{:?}: no mount after 10 s: {said}", cmd.get_program())
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Mounted {
            dir: dir.to_path_buf(),
            daemon: Some(child),
            kernel: false,
        })
    }
    pub(crate) fn kernel(image: &Path, dir: &Path) -> Result<Mounted, String> {
        need_root()?;
        // Mounted over an old mount, the unmount on drop would leave the
        // old one for the next run to trip on.
        if let Some(e) = already_mounted(dir) {
            return Err(e);
        }
        run_cmd(
            Command::new("mount")
                .args(["-t", "ext4", "-o", "loop"])
                .arg(image)
                .arg(dir),
        )?;
        Ok(Mounted {
            dir: dir.to_path_buf(),
            daemon: None,
            kernel: true,
        })
    }
}

/// Unmount `dir` (a kernel mount, else FUSE). A mount can be busy for a
/// moment after a run (a file the kernel or a daemon thread still holds
/// as the last references go): retried for about a second, then detached
/// lazily, so that it is never left mounted for the next run (or for
/// `remove_workdir`, which leaves a mounted work directory alone).
fn unmount(dir: &Path, kernel: bool) {
    let quiet = |c: &mut Command| {
        c.stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    let plain = || {
        if kernel {
            quiet(Command::new("umount").arg(dir))
        } else {
            quiet(Command::new("fusermount3").arg("-u").arg(dir))
        }
    };
    for _ in 0..10 {
        // Unmounted, or not mounted any more (a failure for another
        // reason than a busy mount): nothing to retry.
        if plain() || !is_mounted(dir) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let lazy = if kernel {
        quiet(Command::new("umount").arg("-l").arg(dir))
    } else {
        quiet(Command::new("fusermount3").args(["-u", "-z"]).arg(dir))
            || quiet(Command::new("umount").arg("-l").arg(dir))
    };
    if !lazy {
        eprintln!(
            "warning: {} is still mounted; unmount it by hand (fusermount3 -u -z or umount -l)",
            dir.display()
        );
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        unmount(&self.dir, self.kernel);
        if let Some(mut c) = self.daemon.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The `kernel` targets loop-mount their image, which needs root: checked
/// before the image is made, so a run without root spends no mkfs on it.
pub(crate) fn need_root() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("a loop mount needs root".into());
    }
    Ok(())
}

/// Removes a run's image file when dropped, so that every way out of a run
/// (an error as well as success) leaves no image behind. Declare it before
/// the mount or library that uses the image, so that it drops after them.
pub(crate) struct ImageFile<'a>(pub(crate) &'a Path);

impl Drop for ImageFile<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// Clean up after a run in `workdir`. A work directory the run `created`
/// goes whole (`remove_dir_all`: whatever a failed run left in it). One
/// that existed before (a `--workdir` the user named) may hold the user's
/// files, so there only the run's own `image` and empty mount point go.
/// Nothing is removed while `workdir/mnt` is still a mount point: that
/// would delete files inside the mounted filesystem.
pub(crate) fn remove_workdir(workdir: &Path, created: bool, image: &Path) {
    let mnt = workdir.join("mnt");
    if is_mounted(&mnt) {
        return;
    }
    if created {
        let _ = std::fs::remove_dir_all(workdir);
    } else {
        let _ = std::fs::remove_file(image);
        let _ = std::fs::remove_dir(&mnt);
    }
}

/// Free bytes for an unprivileged user on the filesystem that holds `dir`
/// (or, when `dir` does not exist yet, its nearest existing ancestor).
fn free_bytes(dir: &Path) -> Result<u64, String> {
    use std::os::unix::ffi::OsStrExt;
    let dir = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| format!("current directory: {e}"))?
            .join(dir)
    };
    let at = dir
        .ancestors()
        .find(|a| a.exists())
        .ok_or_else(|| format!("{}: no existing ancestor", dir.display()))?;
    let c = std::ffi::CString::new(at.as_os_str().as_bytes())
        .map_err(|e| format!("{}: {e}", at.display()))?;
    // SAFETY: all-zero bytes are a valid `statvfs` (integers only).
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statvfs
    // that outlives the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(format!(
            "statvfs {}: {}",
            at.display(),
            io::Error::last_os_error()
        ));
    }
    #[allow(clippy::unnecessary_cast)] // the field types differ by target
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// `--image-mib` in bytes, checked: at least 16 MiB (mkfs.ext4's journal
/// needs room) and at most the free space of the work directory's
/// filesystem. The runs make one image at a time there, and the mmap
/// targets allocate all of it, so a larger image would fail minutes into
/// the run, or fill the filesystem (on /dev/shm: memory).
pub fn image_size(image_mib: u64, workdir: &Path) -> Result<u64, String> {
    let size = image_mib
        .checked_mul(1 << 20)
        .filter(|&s| s >= 16 << 20)
        .ok_or("--image-mib must be at least 16 (and fit in 64 bits as bytes)")?;
    let free = free_bytes(workdir)?;
    if size > free {
        return Err(format!(
            "--image-mib {image_mib}: larger than the {} MiB free where the work directory {} is",
            free >> 20,
            workdir.display()
        ));
    }
    Ok(size)
}

pub(crate) fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

pub(crate) fn fuse_available() -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map(|_| ())
        .map_err(|e| format!("/dev/fuse: {e}"))?;
    if !have("fusermount3") {
        return Err("fusermount3 is not installed (apt install fuse3)".into());
    }
    Ok(())
}

/// Set up `target`, run the phases at `threads`, tear it down.
fn run_one(
    target: &str,
    threads: usize,
    set: &FileSet,
    opts: &TreeOptions,
) -> Result<TreeRow, String> {
    let image = opts.workdir.join("tree.img");
    let mnt = opts.workdir.join("mnt");
    std::fs::create_dir_all(&mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
    let _image = ImageFile(&image);
    let mut mount_ms = None;
    let err = |e: io::Error| format!("{target}: {e}");
    let (secs, per_sec) = match target {
        "lib-memfs" => {
            let lib = Library {
                vfs: scalevfs::Vfs::new(),
            };
            phases(&lib, set, threads).map_err(err)?
        }
        "lib-ext4" | "lib-ext4-pwrite" | "lib-ext4-mmap" => {
            make_image(&image, opts.image_size)?;
            let t0 = Instant::now();
            let open_err = |e: io::Error| format!("open {}: {e}", image.display());
            let o = scalevfs_ext4::Ext4Options {
                ro: false,
                ..Default::default()
            };
            let fs = match target {
                "lib-ext4-mmap" => scalevfs_ext4::Ext4::open_device(
                    Box::new(scalevfs_ext4::MmapDevice::open(&image, true).map_err(open_err)?),
                    o,
                ),
                "lib-ext4-pwrite" => scalevfs_ext4::Ext4::open_device(
                    Box::new(scalevfs_ext4::FileDevice::open(&image, true).map_err(open_err)?),
                    o,
                ),
                _ => scalevfs_ext4::Ext4::open(&image, o),
            }
            .map_err(|e| format!("open {}: {e}", image.display()))?;
            mount_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
            let lib = Library {
                vfs: scalevfs::Vfs::with_root_fs(Default::default(), fs),
            };
            phases(&lib, set, threads).map_err(err)?
        }
        "fuse-memfs" | "fuse-ext4" => {
            fuse_available()?;
            let mut cmd = Command::new(&opts.bin);
            cmd.arg("mount").arg(&mnt).arg("--foreground");
            cmd.args(&opts.mount_args);
            if target == "fuse-ext4" {
                make_image(&image, opts.image_size)?;
                cmd.arg("--image").arg(&image);
            }
            let m = Mounted::fuse(cmd, &mnt)?;
            let r = phases(&Host(m.dir.clone()), set, threads).map_err(err);
            drop(m);
            r?
        }
        "fuse2fs" => {
            fuse_available()?;
            if !have("fuse2fs") {
                return Err("fuse2fs is not installed (apt install fuse2fs)".into());
            }
            make_image(&image, opts.image_size)?;
            let mut cmd = Command::new("fuse2fs");
            cmd.arg(&image).arg(&mnt).arg("-f");
            let m = Mounted::fuse(cmd, &mnt)?;
            let r = phases(&Host(m.dir.clone()), set, threads).map_err(err);
            drop(m);
            r?
        }
        "kernel" => {
            need_root()?;
            make_image(&image, opts.image_size)?;
            let m = Mounted::kernel(&image, &mnt)?;
            let r = phases(&Host(m.dir.clone()), set, threads).map_err(err);
            drop(m);
            r?
        }
        "tmpfs" => {
            let dir = opts.workdir.join("tmpfs-tree");
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let r = phases(&Host(dir.clone()), set, threads).map_err(err);
            let _ = std::fs::remove_dir_all(&dir);
            r?
        }
        other => {
            return Err(format!(
                "unknown target {other:?} (targets: {})",
                TARGETS.join(", ")
            ))
        }
    };
    Ok(TreeRow {
        target: target.to_string(),
        threads,
        secs,
        per_sec,
        mount_ms,
    })
}

/// Run every target at every thread count; `progress` hears each step.
pub fn run(opts: &TreeOptions, progress: &mut dyn FnMut(&str)) -> Result<TreeReport, String> {
    if opts.files == 0 || opts.dirs == 0 || opts.dirs > opts.files {
        return Err("need 0 < --dirs <= --files".into());
    }
    if opts.files > 10_000_000 {
        return Err("--files above 10,000,000 is not supported".into());
    }
    if opts.threads.is_empty() || opts.threads.iter().any(|&t| t == 0 || t > 1024) {
        return Err("thread counts must be 1..=1024".into());
    }
    for t in &opts.targets {
        if !TARGETS.contains(&t.as_str()) {
            return Err(format!(
                "unknown target {t:?} (targets: {})",
                TARGETS.join(", ")
            ));
        }
    }
    let created = !opts.workdir.exists();
    std::fs::create_dir_all(&opts.workdir)
        .map_err(|e| format!("{}: {e}", opts.workdir.display()))?;
    let set = FileSet::new(opts.files, opts.dirs, opts.seed);
    let mut rep = TreeReport {
        files: opts.files,
        dirs: opts.dirs,
        bytes: set.bytes(),
        image_size: opts.image_size,
        mount_args: opts.mount_args.clone(),
        ..Default::default()
    };
    for target in &opts.targets {
        for &threads in &opts.threads {
            progress(&format!("{target}, {threads} thread(s)"));
            match run_one(target, threads, &set, opts) {
                Ok(row) => rep.rows.push(row),
                Err(reason) => {
                    progress(&format!("{target}: skipped: {reason}"));
                    rep.skipped.push(Skipped {
                        target: target.clone(),
                        reason,
                    });
                    break;
                }
            }
        }
    }
    remove_workdir(&opts.workdir, created, &opts.workdir.join("tree.img"));
    Ok(rep)
}

/// The report as a markdown table: seconds per phase, then the ratios the
/// issue's goals are stated in.
pub fn markdown(rep: &TreeReport) -> String {
    let mut s = format!(
        "{} files ({:.1} MiB) in {} directories; ext4 images of {} MiB in the work directory; allocator {}.\n\n",
        rep.files,
        rep.bytes as f64 / (1 << 20) as f64,
        rep.dirs,
        rep.image_size >> 20,
        crate::allocator()
    );
    if !rep.mount_args.is_empty() {
        s.push_str(&format!(
            "`scalevfs mount` arguments of the FUSE targets: `{}`.\n\n",
            rep.mount_args.join(" ")
        ));
    }
    s.push_str("| target | threads | create s | find+stat s | read s | delete s | files/s create | open image ms |\n");
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in &rep.rows {
        s.push_str(&format!(
            "| {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} | {} |\n",
            r.target,
            r.threads,
            r.secs[0],
            r.secs[1],
            r.secs[2],
            r.secs[3],
            r.per_sec[0],
            r.mount_ms.map(|m| format!("{m:.1}")).unwrap_or_default()
        ));
    }
    let find = |t: &str, n: usize| rep.rows.iter().find(|r| r.target == t && r.threads == n);
    let mut ratios = String::new();
    let threads: Vec<usize> = {
        let mut v: Vec<usize> = rep.rows.iter().map(|r| r.threads).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    for &n in &threads {
        for (a, b, what) in [
            (
                "fuse-ext4",
                "fuse2fs",
                "fuse2fs s / scalevfs ext4 FUSE s (goal >= 4)",
            ),
            (
                "fuse-ext4",
                "fuse-memfs",
                "scalevfs ext4 FUSE s / memfs FUSE s (goal <= 1.25)",
            ),
            (
                "lib-ext4",
                "kernel",
                "kernel s / scalevfs ext4 library s (goal >= 1)",
            ),
        ] {
            if let (Some(x), Some(y)) = (find(a, n), find(b, n)) {
                let r: Vec<String> = (0..PHASES.len())
                    .map(|i| {
                        let v = if b == "fuse-memfs" {
                            x.secs[i] / y.secs[i]
                        } else {
                            y.secs[i] / x.secs[i]
                        };
                        format!("{v:.2}")
                    })
                    .collect();
                ratios.push_str(&format!("| {what} | {n} | {} |\n", r.join(" | ")));
            }
        }
    }
    for t in TARGETS {
        if let (Some(one), Some(two)) = (find(t, 1), find(t, 2)) {
            let r: Vec<String> = (0..PHASES.len())
                .map(|i| format!("{:.2}", one.secs[i] / two.secs[i]))
                .collect();
            ratios.push_str(&format!(
                "| {t}: 1 thread s / 2 threads s | - | {} |\n",
                r.join(" | ")
            ));
        }
    }
    if !ratios.is_empty() {
        s.push_str("\n| ratio | threads | create | find+stat | read | delete |\n|---|---:|---:|---:|---:|---:|\n");
        s.push_str(&ratios);
    }
    for k in &rep.skipped {
        s.push_str(&format!("\nskipped {}: {}\n", k.target, k.reason));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_point_in_use_is_refused() {
        // /proc is a mount point wherever these tests run.
        let proc_dir = Path::new("/proc");
        assert!(already_mounted(proc_dir).is_some());
        // The daemon (here `true`, which mounts nothing) is not started:
        // the old mount would pass for the new one at once.
        match Mounted::fuse(Command::new("true"), proc_dir) {
            Err(e) => assert!(e.contains("already a mount point"), "{e}"),
            Ok(m) => {
                // Not dropped: its drop would unmount /proc.
                std::mem::forget(m);
                panic!("a mount over /proc was taken for the new one");
            }
        }
        let d = std::env::temp_dir().join(format!("scalevfs-tree-mnt-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert_eq!(already_mounted(&d), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_daemon_that_fails_is_quoted_from_its_log() {
        let d = std::env::temp_dir().join(format!("scalevfs-tree-log-{}", std::process::id()));
        let mnt = d.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        // Far more than a pipe holds (64 KiB), then an error and exit:
        // with a pipe no one reads, this daemon would block, not exit.
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "i=0; while [ $i -lt 2000 ]; do echo 'chatter chatter chatter chatter chatter chatter' >&2; i=$((i+1)); done; echo 'fuse: bad mount point' >&2; exit 3",
        ]);
        let e = match Mounted::fuse(cmd, &mnt) {
            Err(e) => e,
            Ok(m) => {
                std::mem::forget(m);
                panic!("mounted");
            }
        };
        assert!(e.contains("exited") && e.contains("bad mount point"), "{e}");
        // The log was unlinked at once: only the mount point is left.
        let left: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
        assert_eq!(left.len(), 1);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn image_size_is_bounded_by_free_space() {
        let dir = std::env::temp_dir();
        assert_eq!(image_size(16, &dir).unwrap(), 16 << 20);
        assert!(image_size(15, &dir).unwrap_err().contains("at least 16"));
        // Overflows u64 as bytes.
        assert!(image_size(u64::MAX >> 10, &dir)
            .unwrap_err()
            .contains("at least 16"));
        // 2^43 MiB = 8 EiB: more than any filesystem here has free.
        let e = image_size(1 << 43, &dir).unwrap_err();
        assert!(e.contains("MiB free"), "{e}");
        // A work directory not made yet is judged by its nearest ancestor.
        let later = dir.join("scalevfs-not-made-yet").join("deeper");
        assert_eq!(image_size(16, &later).unwrap(), 16 << 20);
        assert!(image_size(1 << 43, &later).is_err());
    }

    #[test]
    fn cleanup_empties_only_a_work_directory_it_made() {
        let base = std::env::temp_dir().join(format!("scalevfs-tree-clean-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        for created in [true, false] {
            let w = base.join(format!("created-{created}"));
            std::fs::create_dir_all(w.join("mnt")).unwrap();
            std::fs::write(w.join("users-file"), b"keep").unwrap();
            let image = w.join("tree.img");
            {
                // An image left by a run that failed part-way...
                let _guard = ImageFile(&image);
                std::fs::write(&image, b"image").unwrap();
            }
            // ...is removed on the way out.
            assert!(!image.exists());
            std::fs::write(&image, b"image").unwrap();
            remove_workdir(&w, created, &image);
            assert!(!image.exists(), "created {created}");
            if created {
                assert!(!w.exists());
            } else {
                assert!(!w.join("mnt").exists());
                assert_eq!(std::fs::read(w.join("users-file")).unwrap(), b"keep");
            }
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn file_set_is_deterministic_and_mixed() {
        let a = FileSet::new(2000, 20, 7);
        let b = FileSet::new(2000, 20, 7);
        assert_eq!(a.bytes(), b.bytes());
        assert_eq!(a.data(1234), b.data(1234));
        let small = (0..2000).filter(|&i| a.size(i) < 1024).count();
        let big = (0..2000).filter(|&i| a.size(i) >= 64 << 10).count();
        assert!((600..1000).contains(&small), "{small} small files");
        assert!((10..100).contains(&big), "{big} big files");
        assert!((0..2000).all(|i| a.size(i) <= MAX_FILE));
        // Every file belongs to exactly one directory.
        let n: usize = (0..20).map(|d| a.files_in(d).count()).sum();
        assert_eq!(n, 2000);
    }

    #[test]
    fn phases_on_the_library_check_what_they_read() {
        let set = FileSet::new(300, 7, 1);
        let lib = Library {
            vfs: scalevfs::Vfs::new(),
        };
        for threads in [1, 3] {
            let (secs, rate) = phases(&lib, &set, threads).unwrap();
            assert_eq!(secs.len(), 4);
            assert!(rate.iter().all(|r| *r > 0.0));
        }
        // A corrupted file is found by the read phase.
        let lib = Library {
            vfs: scalevfs::Vfs::new(),
        };
        struct Corrupting<'a>(&'a Library);
        impl Target for Corrupting<'_> {
            fn mkdir(&self, p: &str) -> io::Result<()> {
                self.0.mkdir(p)
            }
            fn write(&self, p: &str, d: &[u8]) -> io::Result<()> {
                if p.ends_with("f00042") {
                    let mut v = d.to_vec();
                    v.push(0);
                    return self.0.write(p, &v);
                }
                self.0.write(p, d)
            }
            fn list(&self, p: &str) -> io::Result<Vec<(String, bool)>> {
                self.0.list(p)
            }
            fn stat_len(&self, p: &str) -> io::Result<u64> {
                self.0.stat_len(p)
            }
            fn read(&self, p: &str, b: &mut Vec<u8>) -> io::Result<()> {
                self.0.read(p, b)
            }
            fn remove_file(&self, p: &str) -> io::Result<()> {
                self.0.remove_file(p)
            }
            fn remove_dir(&self, p: &str) -> io::Result<()> {
                self.0.remove_dir(p)
            }
        }
        let e = phases(&Corrupting(&lib), &set, 2).unwrap_err();
        assert!(e.to_string().contains("f00042"), "{e}");
    }
}
