//! `scalevfs bench-fuse`: single operations through FUSE, side by side —
//! scalevfs's memfs mount, `bindfs` over a tmpfs directory (the FUSE peer)
//! and the host's tmpfs directly — with the kernel's attribute and entry
//! caches on (each daemon's defaults) and off (timeouts 0), at 1 and 2
//! client threads.
//!
//! The client is this process (compiled code, plain system calls through
//! `std::fs`), so the figures are the kernel + daemon cost, not an
//! interpreter's. All targets are mounted at once and every round runs
//! each (target, operation, threads) case once, in the same order, so slow
//! phases of a shared machine hit every target alike; the table gives the
//! median of the rounds.
//!
//! Operations (thread `t` works on its own names):
//! - `stat`: stat of `d/f{t}`;
//! - `open+close`: open `d/f{t}` read-only and close it;
//! - `read 4K`: pread of 4 KiB at offset 0 of an open `d/f{t}` (4 KiB long);
//! - `create+close+unlink`: create `d/c{t}-{i}` (O_EXCL), close, unlink;
//! - `readdir`: list a directory of `entries` names (all of it), one op per
//!   listing.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Barrier;
use std::time::Instant;

use serde::Serialize;

use crate::tree::{fuse_available, have, Mounted};

/// What to run.
#[derive(Clone, Debug)]
pub struct FuseOpsOptions {
    /// The scalevfs binary (its `mount` command serves the memfs).
    pub bin: PathBuf,
    pub threads: Vec<usize>,
    pub rounds: usize,
    /// Names in the `readdir` directory.
    pub entries: usize,
    /// Operations per thread per case (readdir: this / 1000, at least 3).
    pub iters: usize,
    /// Work directory (mount points; the tmpfs sources live under /dev/shm).
    pub workdir: PathBuf,
}

/// One measured case.
#[derive(Clone, Debug, Serialize)]
pub struct FuseOpsRow {
    pub target: String,
    pub caches: &'static str,
    pub op: &'static str,
    pub threads: usize,
    /// Time per operation seen by one thread, from the median round time.
    pub us_per_op: f64,
    /// All threads' operations per second, from the same median round time.
    pub ops_per_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct FuseOpsReport {
    pub rows: Vec<FuseOpsRow>,
    /// Targets not run, with the reason.
    pub skipped: Vec<(String, String)>,
}

const OPS: [&str; 5] = [
    "stat",
    "open+close",
    "read 4K",
    "create+close+unlink",
    "readdir",
];

struct Target {
    name: String,
    caches: &'static str,
    root: PathBuf,
    _mount: Option<Mounted>,
}

fn prepare(root: &Path, threads: usize, entries: usize) -> Result<(), String> {
    let d = root.join("d");
    fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    for t in 0..threads {
        fs::write(d.join(format!("f{t}")), vec![b'x'; 4096])
            .map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let big = root.join("big");
    if !big.exists() {
        fs::create_dir(&big).map_err(|e| format!("{}: {e}", big.display()))?;
        for i in 0..entries {
            fs::File::create(big.join(format!("entry-{i:06}")))
                .map_err(|e| format!("{}: {e}", big.display()))?;
        }
    }
    Ok(())
}

/// List `dir` whole, as the `readdir` operation does: every entry must
/// read back without error and the count must be the `expected` names the
/// setup made (a listing cut short by an error, or one that lost or
/// duplicated names, is a wrong answer, not a faster one).
fn list_all(dir: &Path, expected: usize) -> Result<(), String> {
    let e = |x: std::io::Error| format!("readdir {}: {x}", dir.display());
    let mut k = 0;
    for entry in fs::read_dir(dir).map_err(e)? {
        entry.map_err(e)?;
        k += 1;
    }
    if k != expected {
        return Err(format!(
            "{} listed {k} entries, {expected} expected",
            dir.display()
        ));
    }
    Ok(())
}

/// Run `op` on `threads` threads, `n` times each; returns the seconds from
/// the common start (every thread done with its setup) to the last thread's
/// end. `entries`: the names in `big` (checked by `readdir`).
fn case(
    root: &Path,
    op: &str,
    threads: usize,
    n: usize,
    round: usize,
    entries: usize,
) -> Result<f64, String> {
    if !OPS.contains(&op) {
        return Err(format!("unknown operation {op}"));
    }
    let d = root.join("d");
    let big = root.join("big");
    // Every client thread and this one: the clock starts when all threads
    // have spawned and done their setup (the open of `read 4K`), so neither
    // thread start-up nor setup is counted as operations.
    let go = Barrier::new(threads + 1);
    let (el, results): (f64, Vec<Result<(), String>>) = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (d, big, go) = (&d, &big, &go);
                s.spawn(move || -> Result<(), String> {
                    let f = d.join(format!("f{t}"));
                    let e = |x: std::io::Error| format!("{op} {}: {x}", f.display());
                    let setup = match op {
                        "read 4K" => fs::File::open(&f).map(Some).map_err(e),
                        _ => Ok(None),
                    };
                    // Reached even when the setup failed: a thread that
                    // returned before it would leave the others waiting.
                    go.wait();
                    let h = setup?;
                    match (op, h) {
                        ("stat", _) => {
                            for _ in 0..n {
                                fs::metadata(&f).map_err(e)?;
                            }
                        }
                        ("open+close", _) => {
                            for _ in 0..n {
                                drop(fs::File::open(&f).map_err(e)?);
                            }
                        }
                        ("read 4K", Some(h)) => {
                            let mut buf = [0u8; 4096];
                            for _ in 0..n {
                                if h.read_at(&mut buf, 0).map_err(e)? != 4096 {
                                    return Err(format!("short read of {}", f.display()));
                                }
                            }
                        }
                        ("create+close+unlink", _) => {
                            for i in 0..n {
                                let c = d.join(format!("c{t}-{round}-{i}"));
                                drop(
                                    fs::OpenOptions::new()
                                        .write(true)
                                        .create_new(true)
                                        .open(&c)
                                        .map_err(e)?,
                                );
                                fs::remove_file(&c).map_err(e)?;
                            }
                        }
                        ("readdir", _) => {
                            for _ in 0..n {
                                list_all(big, entries)?;
                            }
                        }
                        _ => unreachable!("operations checked against OPS above"),
                    }
                    Ok(())
                })
            })
            .collect();
        go.wait();
        let start = Instant::now();
        let results = hs
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("client thread panicked".into()))
            })
            .collect();
        (start.elapsed().as_secs_f64(), results)
    });
    for r in results {
        r?;
    }
    Ok(el)
}

/// Operations per thread in one case: a `readdir` lists the whole
/// directory, so it runs far fewer times.
fn ops_per_case(op: &str, iters: usize) -> usize {
    if op == "readdir" {
        (iters / 1000).max(3)
    } else {
        iters
    }
}

/// The figures of one case from its rounds' `elapsed` seconds: (time per
/// operation of one thread in µs, all threads' operations per second).
/// Both come from one median time (the harness's: the mean of the two
/// middle rounds for an even count), so they describe the same run and
/// `ops_per_s == threads * 1e6 / us_per_op` always holds; medians taken of
/// each figure separately could come from different rounds.
fn figures(elapsed: &[f64], threads: usize, n: usize) -> (f64, f64) {
    match crate::harness::median(elapsed) {
        Some(el) => (el / n as f64 * 1e6, (threads * n) as f64 / el),
        None => (f64::NAN, f64::NAN),
    }
}

/// Mount every target, run the rounds, unmount.
pub fn run(o: &FuseOpsOptions, progress: &mut dyn FnMut(&str)) -> Result<FuseOpsReport, String> {
    fuse_available()?;
    let maxt = o.threads.iter().copied().max().unwrap_or(1).max(1);
    if o.rounds == 0 || o.iters == 0 || o.entries == 0 || o.entries > 1_000_000 {
        return Err(
            "rounds, iters and entries must be positive (entries at most 1,000,000)".into(),
        );
    }
    let shm = Path::new("/dev/shm").join(format!("scalevfs-bench-fuse-{}", std::process::id()));
    fs::create_dir_all(&o.workdir).map_err(|e| format!("{}: {e}", o.workdir.display()))?;
    let mut targets = Vec::new();
    let mut skipped = Vec::new();
    // The host's tmpfs directly.
    let tmpfs = shm.join("tmpfs");
    fs::create_dir_all(&tmpfs).map_err(|e| format!("{}: {e}", tmpfs.display()))?;
    targets.push(Target {
        name: "tmpfs (no FUSE)".into(),
        caches: "-",
        root: tmpfs,
        _mount: None,
    });
    for (caches, off) in [("on", false), ("off", true)] {
        let mnt = o.workdir.join(format!("scalevfs-{caches}"));
        fs::create_dir_all(&mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
        let mut cmd = Command::new(&o.bin);
        cmd.arg("mount").arg(&mnt).arg("--foreground");
        if off {
            cmd.args(["--attr-timeout", "0", "--entry-timeout", "0"]);
        }
        targets.push(Target {
            name: "scalevfs".into(),
            caches,
            root: mnt.clone(),
            _mount: Some(Mounted::fuse(cmd, &mnt)?),
        });
    }
    if have("bindfs") {
        for (caches, off) in [("on", false), ("off", true)] {
            let src = shm.join(format!("bindfs-src-{caches}"));
            let mnt = o.workdir.join(format!("bindfs-{caches}"));
            fs::create_dir_all(&src).map_err(|e| format!("{}: {e}", src.display()))?;
            fs::create_dir_all(&mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
            let mut cmd = Command::new("bindfs");
            cmd.arg("-f").arg("--no-allow-other").arg("--multithreaded");
            if off {
                cmd.args(["-o", "attr_timeout=0,entry_timeout=0,negative_timeout=0"]);
            }
            cmd.arg(&src).arg(&mnt);
            match Mounted::fuse(cmd, &mnt) {
                Ok(m) => targets.push(Target {
                    name: "bindfs".into(),
                    caches,
                    root: mnt.clone(),
                    _mount: Some(m),
                }),
                Err(e) => skipped.push((format!("bindfs (caches {caches})"), e)),
            }
        }
    } else {
        skipped.push(("bindfs".into(), "not installed (apt install bindfs)".into()));
    }
    for t in &targets {
        progress(&format!("preparing {} (caches {})", t.name, t.caches));
        prepare(&t.root, maxt, o.entries)?;
    }
    // (target, op, threads) -> seconds per round
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); targets.len() * OPS.len() * o.threads.len()];
    for round in 0..o.rounds {
        progress(&format!("round {}/{}", round + 1, o.rounds));
        for (oi, op) in OPS.iter().enumerate() {
            for (ti, &threads) in o.threads.iter().enumerate() {
                let n = ops_per_case(op, o.iters);
                for (gi, t) in targets.iter().enumerate() {
                    let r = case(&t.root, op, threads, n, round, o.entries)?;
                    samples[(gi * OPS.len() + oi) * o.threads.len() + ti].push(r);
                }
            }
        }
    }
    let mut rows = Vec::new();
    for (gi, t) in targets.iter().enumerate() {
        for (oi, op) in OPS.iter().enumerate() {
            for (ti, &threads) in o.threads.iter().enumerate() {
                let n = ops_per_case(op, o.iters);
                let s = &samples[(gi * OPS.len() + oi) * o.threads.len() + ti];
                let (us_per_op, ops_per_s) = figures(s, threads, n);
                rows.push(FuseOpsRow {
                    target: t.name.clone(),
                    caches: t.caches,
                    op,
                    threads,
                    us_per_op,
                    ops_per_s,
                });
            }
        }
    }
    drop(targets);
    let _ = fs::remove_dir_all(&shm);
    Ok(FuseOpsReport { rows, skipped })
}

/// The table: µs per operation (one thread's view) per target, and
/// bindfs's time over scalevfs's (above 1: scalevfs is faster).
pub fn markdown(rep: &FuseOpsReport, threads: &[usize]) -> String {
    let find = |target: &str, caches: &str, op: &str, th: usize| {
        rep.rows
            .iter()
            .find(|r| {
                r.target.starts_with(target) && r.caches == caches && r.op == op && r.threads == th
            })
            .map(|r| r.us_per_op)
    };
    let mut s = String::new();
    s.push_str("| operation | client threads | caches | tmpfs µs | scalevfs µs | bindfs µs | bindfs / scalevfs |\n");
    s.push_str("|---|---:|---|---:|---:|---:|---:|\n");
    for op in OPS {
        for &th in threads {
            for caches in ["on", "off"] {
                let t = find("tmpfs", "-", op, th);
                let v = find("scalevfs", caches, op, th);
                let b = find("bindfs", caches, op, th);
                let f = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.1}"));
                let ratio = match (v, b) {
                    (Some(v), Some(b)) if v > 0.0 => format!("{:.2}x", b / v),
                    _ => "-".into(),
                };
                s.push_str(&format!(
                    "| {op} | {th} | {caches} | {} | {} | {} | {ratio} |\n",
                    f(t),
                    f(v),
                    f(b)
                ));
            }
        }
    }
    for (t, why) in &rep.skipped {
        s.push_str(&format!("\nNot run: {t}: {why}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory of this test's own under the system's temp dir.
    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("scalevfs-fuseops-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn figures_come_from_one_median_time() {
        // Even count: the mean of the two middle rounds (2 s and 3 s), not
        // the upper one.
        let (us, ops) = figures(&[4.0, 1.0, 3.0, 2.0], 2, 1000);
        assert_eq!(us, 2.5 / 1000.0 * 1e6);
        assert_eq!(ops, 2000.0 / 2.5);
        // Odd count: the middle round.
        let (us, ops) = figures(&[9.0, 1.0, 5.0], 1, 10);
        assert_eq!(us, 5.0 / 10.0 * 1e6);
        assert_eq!(ops, 10.0 / 5.0);
        // Both figures describe the same time.
        let (us, ops) = figures(&[0.7, 0.1, 0.3, 0.9, 0.2, 0.4], 3, 77);
        assert!((ops * us - 3.0 * 1e6).abs() < 1e-6 * ops * us, "{us} {ops}");
        let (us, ops) = figures(&[], 1, 1);
        assert!(us.is_nan() && ops.is_nan());
    }

    #[test]
    fn readdir_requires_every_entry() {
        let d = scratch("readdir");
        let big = d.join("big");
        fs::create_dir(&big).unwrap();
        for i in 0..5 {
            fs::File::create(big.join(format!("e{i}"))).unwrap();
        }
        list_all(&big, 5).unwrap();
        let e = list_all(&big, 6).unwrap_err();
        assert!(e.contains("listed 5 entries, 6 expected"), "{e}");
        let e = list_all(&d.join("missing"), 0).unwrap_err();
        assert!(e.contains("readdir"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn cases_run_on_a_plain_directory_and_setup_failures_return() {
        let d = scratch("cases");
        prepare(&d, 2, 7).unwrap();
        for op in OPS {
            let n = ops_per_case(op, 50);
            let el = case(&d, op, 2, n, 0, 7).unwrap_or_else(|e| panic!("{op}: {e}"));
            assert!(el > 0.0, "{op}: {el}");
        }
        // A wrong entry count fails the readdir case.
        let e = case(&d, "readdir", 1, 3, 0, 8).unwrap_err();
        assert!(e.contains("7 entries, 8 expected"), "{e}");
        // Thread 2 has no file to open: its setup fails, yet it still
        // reaches the barrier, so the case returns the error instead of
        // leaving the others waiting.
        let e = case(&d, "read 4K", 3, 10, 0, 7).unwrap_err();
        assert!(e.contains("f2"), "{e}");
        assert!(case(&d, "chmod", 1, 1, 0, 7)
            .unwrap_err()
            .contains("unknown operation"));
        fs::remove_dir_all(&d).unwrap();
    }
}
