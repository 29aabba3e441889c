//! Durability workloads on ext4 (`scalevfs bench-fsync`, issue 15):
//!
//! - **fsync**: each thread in a loop creates its next file in its own
//!   directory, writes 4 KiB, fsyncs and closes it (and removes the file
//!   it made 1,000 files earlier, to stay inside the image). Ops/s, and for the
//!   scalevfs library the journal's fsyncs per commit (group commit).
//! - **nofsync**: the same without the fsync (commits come from the
//!   commit thread or a full transaction): what durability costs, and how
//!   the work besides the commit scales.
//! - **creat-clo** (seed 002 on disk): each thread creates, closes and
//!   unlinks its own name in one shared directory; every unlink makes an
//!   orphan that the commit frees. The library with the orphan file, with
//!   the orphan list (one mutex, seed 002's "before") and with no orphan
//!   tracking ("none"), beside the kernel.
//! - **randwrite**: each thread preallocates its own 16 MiB file
//!   (fallocate: unwritten extents) and writes 4 KiB blocks at random
//!   block offsets into it, without fsync; every 2,048 writes it truncates
//!   the file and preallocates it again. Each write into an unwritten
//!   extent splits it, so the file's extent tree grows to thousands of
//!   extents in several leaves, as a database's preallocated file does:
//!   what a change to a deep extent tree costs.
//! - **randread**: each thread preallocates its own 16 MiB file and,
//!   before the clock starts, writes every other 4 KiB block of it (4,096
//!   extents, written and unwritten in turn, in a tree of depth 2); then
//!   it reads 4 KiB at random block offsets: what finding a block in a
//!   deep extent tree costs (the kernel serves these from its page cache).
//!
//! Targets, each on a fresh `mkfs.ext4 -O orphan_file` image in the work
//! directory (/dev/shm by default): `lib-ext4` (journal and orphan file,
//! opened with `Ext4::open`: on tmpfs the image mapped into memory and
//! allocated on first write), `lib-ext4-pwrite` (as `lib-ext4` through
//! `pread`/`pwrite`, `FileDevice`),
//! `lib-ext4-list` (journal and orphan list, `orphan=list`),
//! `lib-ext4-none` (journal, no orphan tracking), `lib-ext4-1ms` (as
//! `lib-ext4` on a device whose flush takes 1 ms, as a disk's cache flush
//! does: where group commit shows, through `pwrite`), `lib-ext4-mmap` (as
//! `lib-ext4` on the image mapped with every block allocated at the open,
//! `MmapDevice::open`),
//! `fuse-ext4` (`scalevfs
//! mount --image`), `fuse2fs`, `kernel` (loop mount, root). A target that
//! cannot run here is skipped with the reason.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::tree::{
    fuse_available, have, make_image, need_root, remove_workdir, ImageFile, Mounted,
};

/// Every target, in report order.
pub const TARGETS: &[&str] = &[
    "lib-ext4",
    "lib-ext4-pwrite",
    "lib-ext4-list",
    "lib-ext4-none",
    "lib-ext4-1ms",
    "lib-ext4-mmap",
    "fuse-ext4",
    "fuse2fs",
    "kernel",
];
/// The workloads.
pub const WORKLOADS: &[&str] = &["fsync", "nofsync", "creat-clo", "randwrite", "randread"];

/// randwrite: the file's size and the writes between two refills.
const RAND_FILE: u64 = 16 << 20;
const RAND_CYCLE: u64 = 2048;

/// What to run.
#[derive(Debug, Clone)]
pub struct DurableOptions {
    pub threads: Vec<usize>,
    pub seconds: f64,
    pub targets: Vec<String>,
    pub workloads: Vec<String>,
    pub image_size: u64,
    pub workdir: PathBuf,
    /// This binary (for `fuse-ext4`).
    pub bin: PathBuf,
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct DurableRow {
    pub workload: String,
    pub target: String,
    pub threads: usize,
    pub ops: u64,
    pub secs: f64,
    pub ops_per_sec: f64,
    /// scalevfs library: commits that logged something, and fsync/sync
    /// requests, during the measurement.
    pub commits: Option<u64>,
    pub requests: Option<u64>,
}

/// A target that did not run, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub target: String,
    pub why: String,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct DurableReport {
    pub rows: Vec<DurableRow>,
    pub skipped: Vec<Skipped>,
}

trait Target: Sync {
    fn mkdir(&self, p: &str) -> io::Result<()>;
    /// Create `p`, write `data`, fsync if asked, close.
    fn create(&self, p: &str, data: &[u8], fsync: bool) -> io::Result<()>;
    fn unlink(&self, p: &str) -> io::Result<()>;
    /// Create `p` for randwrite and randread, open for reading and
    /// writing.
    fn open_rand(&self, p: &str) -> io::Result<Box<dyn RandFile + '_>>;
}

/// An open file of the randwrite and randread workloads.
trait RandFile {
    fn pwrite(&self, data: &[u8], off: u64) -> io::Result<()>;
    /// Fill `buf` from `off`.
    fn pread(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// Drop every block, then preallocate `len` bytes (unwritten).
    fn refill(&self, len: u64) -> io::Result<()>;
}

impl RandFile for std::fs::File {
    fn pwrite(&self, data: &[u8], off: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, data, off)
    }
    fn pread(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, off)
    }
    fn refill(&self, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        self.set_len(0)?;
        let len = libc::off_t::try_from(len).map_err(io::Error::other)?;
        // SAFETY: fallocate on an fd this File owns, no pointers.
        let r = unsafe { libc::fallocate(self.as_raw_fd(), 0, 0, len) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

struct Host(PathBuf);

impl Target for Host {
    fn mkdir(&self, p: &str) -> io::Result<()> {
        std::fs::create_dir(self.0.join(p))
    }
    fn create(&self, p: &str, data: &[u8], fsync: bool) -> io::Result<()> {
        let mut f = std::fs::File::create(self.0.join(p))?;
        f.write_all(data)?;
        if fsync {
            f.sync_all()?;
        }
        Ok(())
    }
    fn unlink(&self, p: &str) -> io::Result<()> {
        std::fs::remove_file(self.0.join(p))
    }
    fn open_rand(&self, p: &str) -> io::Result<Box<dyn RandFile + '_>> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(self.0.join(p))?;
        Ok(Box::new(f))
    }
}

struct Lib {
    vfs: scalevfs::Vfs,
    /// Distinguishes this target's tasks from an earlier one's in the
    /// thread-local cache (an address could be reused).
    id: usize,
}

fn next_id() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    // Relaxed: a unique number.
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A device whose flush takes `delay` (a disk's cache flush), for showing
/// group commit where the work directory's flush is free (/dev/shm).
struct SlowFlush {
    inner: scalevfs_ext4::FileDevice,
    delay: Duration,
}

impl scalevfs_ext4::BlockDevice for SlowFlush {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_at(off, buf)
    }
    fn flush(&self) -> io::Result<()> {
        std::thread::sleep(self.delay);
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

thread_local! {
    static TASK: std::cell::RefCell<Option<(usize, scalevfs::Task)>> =
        const { std::cell::RefCell::new(None) };
}

impl Lib {
    fn with<R>(&self, f: impl FnOnce(&scalevfs::Task) -> R) -> R {
        let key = self.id;
        TASK.with(|c| {
            let mut c = c.borrow_mut();
            if !matches!(&*c, Some((k, _)) if *k == key) {
                *c = Some((key, self.vfs.root_task()));
            }
            f(&c.as_ref().expect("set above").1)
        })
    }
}

fn io_err(e: scalevfs::Errno) -> io::Error {
    io::Error::from(e)
}

impl Target for Lib {
    fn mkdir(&self, p: &str) -> io::Result<()> {
        self.with(|t| t.mkdir(&format!("/{p}"), 0o755))
            .map_err(io_err)
    }
    fn create(&self, p: &str, data: &[u8], fsync: bool) -> io::Result<()> {
        self.with(|t| {
            use scalevfs::{O_CREAT, O_TRUNC, O_WRONLY};
            let fd = t.open(&format!("/{p}"), O_CREAT | O_WRONLY | O_TRUNC, 0o644)?;
            let r = (|| {
                t.write(fd, data)?;
                if fsync {
                    t.fsync(fd)?;
                }
                Ok(())
            })();
            t.close(fd)?;
            r
        })
        .map_err(io_err)
    }
    fn unlink(&self, p: &str) -> io::Result<()> {
        self.with(|t| t.unlink(&format!("/{p}"))).map_err(io_err)
    }
    fn open_rand(&self, p: &str) -> io::Result<Box<dyn RandFile + '_>> {
        use scalevfs::{O_CREAT, O_RDWR, O_TRUNC};
        let fd = self
            .with(|t| t.open(&format!("/{p}"), O_CREAT | O_RDWR | O_TRUNC, 0o644))
            .map_err(io_err)?;
        Ok(Box::new(LibFile { lib: self, fd }))
    }
}

/// A file of `Lib` open in the calling thread's task.
struct LibFile<'a> {
    lib: &'a Lib,
    fd: i32,
}

impl RandFile for LibFile<'_> {
    fn pwrite(&self, data: &[u8], off: u64) -> io::Result<()> {
        let off = i64::try_from(off).map_err(io::Error::other)?;
        let n = self
            .lib
            .with(|t| t.pwrite(self.fd, data, off))
            .map_err(io_err)?;
        if n != data.len() {
            return Err(io::Error::other("short write"));
        }
        Ok(())
    }
    fn pread(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let off = i64::try_from(off).map_err(io::Error::other)?;
        let n = self
            .lib
            .with(|t| t.pread(self.fd, buf, off))
            .map_err(io_err)?;
        if n != buf.len() {
            return Err(io::Error::other("short read"));
        }
        Ok(())
    }
    fn refill(&self, len: u64) -> io::Result<()> {
        let len = i64::try_from(len).map_err(io::Error::other)?;
        self.lib
            .with(|t| {
                t.ftruncate(self.fd, 0)?;
                t.fallocate(self.fd, 0, 0, len)
            })
            .map_err(io_err)
    }
}

impl Drop for LibFile<'_> {
    fn drop(&mut self) {
        let _ = self.lib.with(|t| t.close(self.fd));
    }
}

/// Run `workload` on `t` with `threads` threads for `secs`; total ops.
fn measure(t: &dyn Target, workload: &str, threads: usize, secs: f64) -> io::Result<(u64, f64)> {
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let go = Barrier::new(threads + 1);
    let data = vec![0x5Au8; 4096];
    if workload == "creat-clo" {
        match t.mkdir("shared") {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    TASK.with(|c| *c.borrow_mut() = None);
    let mut el = 0.0;
    let res: Vec<io::Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|k| {
                let (stop, total, go, data) = (&stop, &total, &go, &data);
                s.spawn(move || -> io::Result<()> {
                    let dir = format!("t{k}");
                    if workload != "creat-clo" {
                        match t.mkdir(&dir) {
                            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                                go.wait();
                                return Err(e);
                            }
                            _ => {}
                        }
                    }
                    // randread's file is made before the clock starts.
                    let made = (workload == "randread").then(|| -> io::Result<_> {
                        let f = t.open_rand(&format!("{dir}/big"))?;
                        f.refill(RAND_FILE)?;
                        for b in (0..RAND_FILE / 4096).step_by(2) {
                            f.pwrite(data, b * 4096)?;
                        }
                        Ok(f)
                    });
                    go.wait();
                    let mut n = 0u64;
                    let r = (|| {
                        if let Some(f) = made {
                            let f = f?;
                            let mut buf = vec![0u8; 4096];
                            let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (k as u64 + 1);
                            let blocks = RAND_FILE / 4096;
                            // Relaxed: as below.
                            while !stop.load(Ordering::Relaxed) {
                                seed ^= seed << 13;
                                seed ^= seed >> 7;
                                seed ^= seed << 17;
                                let b = seed % blocks;
                                f.pread(&mut buf, b * 4096)?;
                                // Written blocks hold the pattern,
                                // unwritten ones read as zeros.
                                let want = if b.is_multiple_of(2) { data[0] } else { 0 };
                                if buf[0] != want || buf[4095] != want {
                                    return Err(io::Error::other("randread: wrong data"));
                                }
                                n += 1;
                            }
                            return Ok(());
                        }
                        if workload == "randwrite" {
                            let f = t.open_rand(&format!("{dir}/big"))?;
                            let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (k as u64 + 1);
                            let blocks = RAND_FILE / 4096;
                            // Relaxed: as below.
                            while !stop.load(Ordering::Relaxed) {
                                if n.is_multiple_of(RAND_CYCLE) {
                                    f.refill(RAND_FILE)?;
                                }
                                seed ^= seed << 13;
                                seed ^= seed >> 7;
                                seed ^= seed << 17;
                                f.pwrite(data, (seed % blocks) * 4096)?;
                                n += 1;
                            }
                            return Ok(());
                        }
                        // Relaxed: a stop flag; the join orders the rest.
                        while !stop.load(Ordering::Relaxed) {
                            if workload != "creat-clo" {
                                let sync = workload == "fsync";
                                t.create(&format!("{dir}/f{n}"), data, sync)?;
                                // At most 1,000 files per thread, so that a
                                // long run on a fast target stays inside the
                                // image's inodes and blocks.
                                if n >= 1000 {
                                    t.unlink(&format!("{dir}/f{}", n - 1000))?;
                                }
                            } else {
                                let p = format!("shared/f{k}");
                                t.create(&p, &[], false)?;
                                t.unlink(&p)?;
                            }
                            n += 1;
                        }
                        Ok(())
                    })();
                    // Relaxed: summed after the join.
                    total.fetch_add(n, Ordering::Relaxed);
                    TASK.with(|c| *c.borrow_mut() = None);
                    r
                })
            })
            .collect();
        go.wait();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(secs));
        // Relaxed: see above.
        stop.store(true, Ordering::Relaxed);
        let r = hs
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("worker panicked")))
            })
            .collect();
        el = t0.elapsed().as_secs_f64();
        r
    });
    for r in res {
        r?;
    }
    // Relaxed: after the join.
    Ok((total.load(Ordering::Relaxed), el))
}

fn run_one(
    opts: &DurableOptions,
    workload: &str,
    target: &str,
    threads: usize,
) -> Result<DurableRow, String> {
    let image = opts.workdir.join("durable.img");
    let mnt = opts.workdir.join("mnt");
    std::fs::create_dir_all(&mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
    if target == "kernel" {
        need_root()?;
    }
    let _image = ImageFile(&image);
    make_image(&image, opts.image_size)?;
    let err = |e: io::Error| format!("{target}: {e}");
    let mut stats = None;
    let (ops, secs) = match target {
        "lib-ext4" | "lib-ext4-pwrite" | "lib-ext4-list" | "lib-ext4-none" | "lib-ext4-1ms"
        | "lib-ext4-mmap" => {
            let o = scalevfs_ext4::Ext4Options {
                ro: false,
                orphans: match target {
                    "lib-ext4-none" => scalevfs_ext4::OrphanMode::None,
                    "lib-ext4-list" => scalevfs_ext4::OrphanMode::List,
                    _ => scalevfs_ext4::OrphanMode::File,
                },
                ..Default::default()
            };
            let open_err = |e: io::Error| format!("open {}: {e}", image.display());
            let fs = match target {
                "lib-ext4-mmap" => scalevfs_ext4::Ext4::open_device(
                    Box::new(scalevfs_ext4::MmapDevice::open(&image, true).map_err(open_err)?),
                    o,
                ),
                "lib-ext4-pwrite" | "lib-ext4-1ms" => {
                    let dev = scalevfs_ext4::FileDevice::open(&image, true).map_err(open_err)?;
                    let dev: Box<dyn scalevfs_ext4::BlockDevice> = if target == "lib-ext4-1ms" {
                        Box::new(SlowFlush {
                            inner: dev,
                            delay: Duration::from_millis(1),
                        })
                    } else {
                        Box::new(dev)
                    };
                    scalevfs_ext4::Ext4::open_device(dev, o)
                }
                _ => scalevfs_ext4::Ext4::open(&image, o),
            }
            .map_err(|e| format!("open {}: {e}", image.display()))?;
            let lib = Lib {
                vfs: scalevfs::Vfs::with_root_fs(Default::default(), fs.clone()),
                id: next_id(),
            };
            let before = fs.commit_stats();
            let r = measure(&lib, workload, threads, opts.seconds).map_err(err)?;
            let after = fs.commit_stats();
            stats = Some((after.0 - before.0, after.1 - before.1));
            drop(lib);
            fs.unmount().map_err(|e| format!("unmount: {e}"))?;
            r
        }
        "fuse-ext4" | "fuse2fs" => {
            fuse_available()?;
            let mut cmd = if target == "fuse2fs" {
                if !have("fuse2fs") {
                    return Err("fuse2fs is not installed (apt install fuse2fs)".into());
                }
                let mut c = Command::new("fuse2fs");
                c.arg(&image).arg(&mnt).arg("-f");
                c
            } else {
                let mut c = Command::new(&opts.bin);
                c.arg("mount")
                    .arg(&mnt)
                    .arg("--foreground")
                    .arg("--image")
                    .arg(&image);
                c
            };
            let _ = &mut cmd;
            let m = Mounted::fuse(cmd, &mnt)?;
            let r = measure(&Host(mnt.clone()), workload, threads, opts.seconds).map_err(err);
            drop(m);
            r?
        }
        "kernel" => {
            let m = Mounted::kernel(&image, &mnt)?;
            let r = measure(&Host(mnt.clone()), workload, threads, opts.seconds).map_err(err);
            drop(m);
            r?
        }
        other => return Err(format!("unknown target {other:?} ({})", TARGETS.join(", "))),
    };
    Ok(DurableRow {
        workload: workload.into(),
        target: target.into(),
        threads,
        ops,
        secs,
        ops_per_sec: ops as f64 / secs.max(1e-9),
        commits: stats.map(|s| s.0),
        requests: stats.map(|s| s.1),
    })
}

/// Check the options before anything runs: a typo in a workload or target
/// name must fail at once, not minutes into the run (a workload) or as a
/// "skipped" row (a target).
pub fn check_options(opts: &DurableOptions) -> Result<(), String> {
    if opts.threads.is_empty() || opts.threads.iter().any(|&t| t == 0 || t > 1024) {
        return Err("--threads: 1..=1024 each".into());
    }
    if !(0.05..=600.0).contains(&opts.seconds) {
        return Err("--seconds: 0.05..=600".into());
    }
    for w in &opts.workloads {
        if !WORKLOADS.contains(&w.as_str()) {
            return Err(format!("unknown workload {w:?} ({})", WORKLOADS.join(", ")));
        }
    }
    for t in &opts.targets {
        if !TARGETS.contains(&t.as_str()) {
            return Err(format!("unknown target {t:?} ({})", TARGETS.join(", ")));
        }
    }
    Ok(())
}

/// Run every workload on every target at every thread count.
pub fn run(opts: &DurableOptions, progress: &mut dyn FnMut(&str)) -> Result<DurableReport, String> {
    check_options(opts)?;
    let created = !opts.workdir.exists();
    std::fs::create_dir_all(&opts.workdir)
        .map_err(|e| format!("{}: {e}", opts.workdir.display()))?;
    let mut rep = DurableReport {
        rows: Vec::new(),
        skipped: Vec::new(),
    };
    for w in &opts.workloads {
        for t in &opts.targets {
            for &n in &opts.threads {
                progress(&format!("{w} on {t}, {n} thread(s)"));
                match run_one(opts, w, t, n) {
                    Ok(r) => rep.rows.push(r),
                    Err(why) => {
                        progress(&format!("skipped {t}: {why}"));
                        if !rep.skipped.iter().any(|s| s.target == *t) {
                            rep.skipped.push(Skipped {
                                target: t.clone(),
                                why,
                            });
                        }
                        break;
                    }
                }
            }
        }
    }
    remove_workdir(&opts.workdir, created, &opts.workdir.join("durable.img"));
    Ok(rep)
}

/// The report as a Markdown table.
pub fn markdown(rep: &DurableReport) -> String {
    let mut s = format!(
        "Allocator: {}.\n\n| workload | target | threads | ops/s | vs 1 thread | fsyncs per commit |\n|---|---|---:|---:|---:|---:|\n",
        crate::allocator()
    );
    for r in &rep.rows {
        let one = rep
            .rows
            .iter()
            .find(|o| o.workload == r.workload && o.target == r.target && o.threads == 1)
            .map(|o| o.ops_per_sec);
        let scale = one.map_or(String::new(), |o| format!("{:.2}x", r.ops_per_sec / o));
        let per = match (r.commits, r.requests) {
            (Some(c), Some(q)) if c > 0 && r.workload == "fsync" => {
                format!("{:.2}", q as f64 / c as f64)
            }
            _ => String::new(),
        };
        s += &format!(
            "| {} | {} | {} | {:.0} | {scale} | {per} |\n",
            r.workload, r.target, r.threads, r.ops_per_sec
        );
    }
    for k in &rep.skipped {
        s += &format!("\nskipped {}: {}\n", k.target, k.why);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(workdir: PathBuf) -> DurableOptions {
        DurableOptions {
            threads: vec![1, 2],
            seconds: 1.0,
            targets: TARGETS.iter().map(|s| s.to_string()).collect(),
            workloads: WORKLOADS.iter().map(|s| s.to_string()).collect(),
            image_size: 64 << 20,
            workdir,
            bin: PathBuf::from("scalevfs"),
        }
    }

    #[test]
    fn unknown_names_fail_before_anything_runs() {
        let dir =
            std::env::temp_dir().join(format!("scalevfs-durable-names-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let good = opts(dir.clone());
        check_options(&good).unwrap();

        let mut o = good.clone();
        o.workloads.push("fsnyc".into());
        let e = run(&o, &mut |s| panic!("ran {s}")).unwrap_err();
        assert!(e.contains("unknown workload \"fsnyc\""), "{e}");

        // A typo'd target is an error, not a "skipped" row at the end; the
        // last target of the list is checked as well as the first.
        let mut o = good.clone();
        o.targets.push("kernal".into());
        let e = run(&o, &mut |s| panic!("ran {s}")).unwrap_err();
        assert!(e.contains("unknown target \"kernal\""), "{e}");

        let mut o = good;
        o.threads = vec![1, 0];
        assert!(run(&o, &mut |s| panic!("ran {s}")).is_err());
        // Nothing was made: the checks come before the work directory.
        assert!(!dir.exists());
    }
}
