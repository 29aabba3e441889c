//! LockRef get+put throughput, every variant, on one shared `LockRef` and on
//! per-thread (cache-padded) `LockRef`s, at several thread counts.
//!
//! `cargo bench -p scalevfs-sync --bench lockref`
//!
//! Each cell runs for `BENCH_MS` milliseconds (default 300); each cell is
//! repeated `BENCH_REPS` times (default 3) with the variants interleaved, and
//! the median is printed. One operation is one `get` plus one `put_or_lock`
//! (the count never reaches 1, so the put never keeps the lock). Thread
//! counts: `BENCH_THREADS` (default `1,2,4`). Lock statistics stay on, as in
//! real use; `BENCH_LOCKSTAT=off` switches them off.
//!
//! Every `LockRef` starts with one base reference, so in per-thread mode
//! the count moves between 1 and 2: `cmpxchg2` (lockless only above 1 for a
//! get, above 2 for a put) then takes the lock on every operation, as the
//! 2013 patch did for a dentry with a single user.
//!
//! Two tables: wall-clock throughput (all threads together), and CPU
//! nanoseconds per get+put pair (each thread's own CPU time divided by its
//! pairs, averaged over threads). The second does not depend on how much CPU
//! other processes take, which matters on a small shared machine; with more
//! threads than CPUs the first mostly measures the scheduler's share.

use crossbeam_utils::CachePadded;
use scalevfs_sync::lockstat::{self, Snapshot};
use scalevfs_sync::{LockRef, LockRefVariant};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Shared,
    PerThread,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Shared => "shared",
            Mode::PerThread => "per-thread",
        }
    }
}

struct Cell {
    mops: f64,
    cpu_ns_per_pair: f64,
    stats: Snapshot,
}

/// CPU time consumed by the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID is
    // supported on Linux. On failure `ts` stays zero, which only skews the
    // benchmark's CPU-time column.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

const BATCH: u64 = 256;

fn run_cell(v: LockRefVariant, mode: Mode, threads: usize, dur: Duration) -> Cell {
    let shared = CachePadded::new(LockRef::new(1));
    let own: Vec<CachePadded<LockRef>> = (0..threads)
        .map(|_| CachePadded::new(LockRef::new(1)))
        .collect();
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    let (ops, cpu_per_pair, stats, elapsed) = thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let lr: &LockRef = match mode {
                    Mode::Shared => &shared,
                    Mode::PerThread => &own[t],
                };
                let (stop, barrier) = (&stop, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let before = lockstat::thread_snapshot();
                    let cpu0 = thread_cpu_ns();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..BATCH {
                            lr.get(v);
                            let ok = lr.put_or_lock(v);
                            debug_assert!(ok);
                        }
                        n += BATCH;
                    }
                    let cpu = thread_cpu_ns() - cpu0;
                    (n, cpu, lockstat::thread_snapshot().delta(&before))
                })
            })
            .collect();
        barrier.wait();
        let t0 = Instant::now();
        thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
        let elapsed = t0.elapsed();
        let mut ops = 0;
        let mut per_pair = 0.0;
        let mut stats = Snapshot::default();
        for h in handles {
            let (n, cpu, st) = h.join().unwrap();
            ops += n;
            per_pair += cpu as f64 / n.max(1) as f64;
            stats.merge(&st);
        }
        (ops, per_pair / threads as f64, stats, elapsed)
    });
    assert_eq!(shared.count(), 1);
    Cell {
        mops: ops as f64 / elapsed.as_secs_f64() / 1e6,
        cpu_ns_per_pair: cpu_per_pair,
        stats,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let ms: u64 = env_or("BENCH_MS", 300);
    let reps: usize = env_or::<usize>("BENCH_REPS", 3).max(1);
    let threads: Vec<usize> = std::env::var("BENCH_THREADS")
        .unwrap_or_else(|_| "1,2,4".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    if std::env::var("BENCH_LOCKSTAT").as_deref() == Ok("off") {
        lockstat::set_enabled(false);
    }
    let dur = Duration::from_millis(ms);
    let cpus = thread::available_parallelism().map_or(0, |n| n.get());
    let variants = LockRefVariant::ALL;

    println!(
        "LockRef get+put, median of {reps} x {ms} ms per cell, {cpus} CPUs, lockstat {}\n",
        if lockstat::enabled() { "on" } else { "off" }
    );

    struct Row {
        mode: Mode,
        threads: usize,
        mops: Vec<f64>,
        cpu_ns: Vec<f64>,
        locked_pct: Vec<f64>,
    }
    let mut rows = Vec::new();
    for mode in [Mode::Shared, Mode::PerThread] {
        for &t in &threads {
            let mut mops: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
            let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
            let mut stats: Vec<Snapshot> = vec![Snapshot::default(); variants.len()];
            for _ in 0..reps {
                for (i, v) in variants.iter().enumerate() {
                    let c = run_cell(*v, mode, t, dur);
                    mops[i].push(c.mops);
                    cpu[i].push(c.cpu_ns_per_pair);
                    stats[i].merge(&c.stats);
                }
            }
            rows.push(Row {
                mode,
                threads: t,
                mops: mops.into_iter().map(median).collect(),
                cpu_ns: cpu.into_iter().map(median).collect(),
                locked_pct: stats
                    .iter()
                    .map(|s| 100.0 * s.lockref_locked_fraction())
                    .collect(),
            });
        }
    }

    let head = |title: &str, ratio: &str| {
        let mut h = format!("{:<11} {:>3} |", "mode", "thr");
        for v in variants {
            h += &format!(" {:>12}", v.name());
        }
        h += " |";
        for v in &variants[1..] {
            h += &format!(" {:>17}", format!("{}{ratio}", v.name()));
        }
        println!("{title}");
        println!("{h}");
        println!("{}", "-".repeat(h.len()));
    };

    head(
        "Throughput: M get+put pairs/s, all threads (ratio: variant / spin, higher is better)",
        "/spin",
    );
    for r in &rows {
        let mut line = format!("{:<11} {:>3} |", r.mode.name(), r.threads);
        for m in &r.mops {
            line += &format!(" {:>12.2}", m);
        }
        line += " |";
        for m in &r.mops[1..] {
            line += &format!(" {:>17.2}", m / r.mops[0]);
        }
        println!("{line}");
    }
    println!();
    head(
        "CPU cost: ns of thread CPU time per get+put pair (ratio: spin / variant, higher is better)",
        " speedup",
    );
    for r in &rows {
        let mut line = format!("{:<11} {:>3} |", r.mode.name(), r.threads);
        for c in &r.cpu_ns {
            line += &format!(" {:>12.1}", c);
        }
        line += " |";
        for c in &r.cpu_ns[1..] {
            line += &format!(" {:>17.2}", r.cpu_ns[0] / c);
        }
        println!("{line}");
    }
    println!();
    let mut h = format!("{:<11} {:>3} |", "mode", "thr");
    for v in variants {
        h += &format!(" {:>12}", v.name());
    }
    println!("Locked fallbacks: % of operations that took the lock (lockstat)");
    println!("{h}");
    println!("{}", "-".repeat(h.len()));
    for r in &rows {
        let mut line = format!("{:<11} {:>3} |", r.mode.name(), r.threads);
        for p in &r.locked_pct {
            line += &format!(" {:>12.4}", p);
        }
        println!("{line}");
    }
}
