//! The measuring loop, in will-it-scale's shape.
//!
//! One *segment* runs one configured workload instance with `threads`
//! workers:
//!
//! 1. Every worker does its private setup (open its fd, build its path),
//!    then arrives at the start [`Gate`] and spins until the main thread
//!    releases all of them at once.
//! 2. Each worker counts its own iterations in its own cache-padded slot
//!    (a plain load + store: the slot has one writer, so no read-modify-write
//!    and no cache line shared with another worker).
//! 3. The main thread (the sampler) lets the warm-up pass uncounted, then
//!    every `period` reads all slots and records one [`Sample`]: the slowest
//!    and fastest worker and the total, as rates per second (will-it-scale
//!    prints `min:… max:… total:…` once a second; short runs use shorter
//!    periods, scaled to per-second rates).
//! 4. The built-in counters (`scalevfs_sync::lockstat`) are snapshotted at
//!    the start and the end of the measured window, so the per-operation
//!    figures cover exactly the measured iterations (plus whatever an
//!    intruder thread did in that window).
//!
//! The headline number of a segment set is the median of its samples'
//! totals. Variants of one workload are alternated (A B A B ...) by the
//! caller, see [`crate::plan`].

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use scalevfs_sync::lockstat::{self, Snapshot};
use serde::{Deserialize, Serialize};

/// One sampling period of one segment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Milliseconds since the start of the measured window of this
    /// configuration (segments of later rounds continue the count).
    pub t_ms: f64,
    /// Length of the period in seconds.
    pub secs: f64,
    /// Iterations completed by all workers in the period.
    pub ops: u64,
    /// Slowest worker, iterations per second.
    pub min: f64,
    /// Fastest worker, iterations per second.
    pub max: f64,
    /// All workers, iterations per second.
    pub total: f64,
}

impl Sample {
    /// Build a sample from each worker's iterations in a period of `secs`.
    pub fn from_deltas(t_ms: f64, secs: f64, deltas: &[u64]) -> Sample {
        let secs = secs.max(1e-9);
        let ops: u64 = deltas.iter().sum();
        let min = deltas.iter().copied().min().unwrap_or(0) as f64 / secs;
        let max = deltas.iter().copied().max().unwrap_or(0) as f64 / secs;
        Sample {
            t_ms,
            secs,
            ops,
            min,
            max,
            total: ops as f64 / secs,
        }
    }

    /// The will-it-scale line.
    pub fn line(&self) -> String {
        format!(
            "min:{:.0} max:{:.0} total:{:.0}",
            self.min, self.max, self.total
        )
    }
}

/// Median of `v` (mean of the two middle values for an even count); `None`
/// for an empty slice. NaNs sort last.
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// Start/stop signalling shared by the sampler and the workers.
#[derive(Default)]
pub struct Gate {
    ready: CachePadded<AtomicUsize>,
    go: CachePadded<AtomicBool>,
    stop: CachePadded<AtomicBool>,
    failed: CachePadded<AtomicBool>,
}

impl Gate {
    fn arrive(&self) {
        // Relaxed everywhere in the gate: it orders nothing but itself; the
        // workload's shared state was built before the threads were spawned
        // (thread spawn is the synchronisation).
        self.ready.fetch_add(1, Relaxed);
    }
    fn wait_go(&self) {
        while !self.go.load(Relaxed) && !self.stop.load(Relaxed) {
            std::hint::spin_loop();
            std::thread::yield_now();
        }
    }
    /// Whether the workers were told to stop.
    #[inline]
    pub fn stopped(&self) -> bool {
        self.stop.load(Relaxed)
    }
    fn fail(&self) {
        self.failed.store(true, Relaxed);
    }
    fn has_failed(&self) -> bool {
        self.failed.load(Relaxed)
    }
}

/// Set by `bench --traced` (`traced.rs`) around a segment: each worker's
/// [`WorkerCtx::run`] records the lines it uses (trace-lines build) and
/// leaves them, with its iteration count, in [`TRACED`]. Relaxed: set
/// before the segment's threads start and cleared after they are joined
/// (the spawn and join order it).
pub(crate) static TRACING: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// See [`TRACING`].
pub(crate) static TRACED: std::sync::Mutex<Vec<(scalevfs_sync::trace::Lines, u64)>> =
    std::sync::Mutex::new(Vec::new());

/// What a worker gets: its index, the thread count, and [`WorkerCtx::run`].
pub struct WorkerCtx<'a> {
    idx: usize,
    threads: usize,
    slot: &'a CachePadded<AtomicU64Slot>,
    gate: &'a Gate,
    arrived: std::cell::Cell<bool>,
}

/// A worker's iteration counter (one writer: its worker).
#[derive(Default)]
pub struct AtomicU64Slot(std::sync::atomic::AtomicU64);

impl AtomicU64Slot {
    #[inline(always)]
    fn bump(&self) {
        // Relaxed load + store: only the owning worker writes the slot; the
        // sampler reads a value at most one iteration stale.
        self.0.store(self.0.load(Relaxed).wrapping_add(1), Relaxed);
    }
    fn read(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

impl WorkerCtx<'_> {
    /// This worker's index, `0..threads`.
    pub fn index(&self) -> usize {
        self.idx
    }
    /// Number of workers in the segment.
    pub fn threads(&self) -> usize {
        self.threads
    }
    /// Whether the segment is over (for intruder-like loops).
    pub fn stopped(&self) -> bool {
        self.gate.stopped()
    }

    fn arrive_once(&self) {
        if !self.arrived.replace(true) {
            self.gate.arrive();
        }
    }

    /// Wait for the common start, then call `op` until the sampler says
    /// stop, counting one iteration per call. The first error stops the
    /// whole segment and is returned.
    #[inline]
    pub fn run<E: std::fmt::Display>(
        &self,
        mut op: impl FnMut() -> Result<(), E>,
    ) -> Result<(), String> {
        self.arrive_once();
        self.gate.wait_go();
        // `bench --traced` (trace-lines build): record this worker's lines
        // over its iterations, not its setup.
        let traced = scalevfs_sync::trace::ENABLED && TRACING.load(Relaxed);
        if traced {
            scalevfs_sync::trace::start();
        }
        let mut n = 0u64;
        let mut r = Ok(());
        while !self.gate.stopped() {
            if let Err(e) = op() {
                self.gate.fail();
                r = Err(e.to_string());
                break;
            }
            self.slot.bump();
            n += 1;
        }
        if traced {
            let lines = scalevfs_sync::trace::stop();
            TRACED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((lines, n));
        }
        r
    }
}

/// A workload prepared for one segment: shared state built by the
/// workload's setup, a per-worker body, and optionally an intruder.
pub trait Instance: Sync {
    /// The body of worker `ctx.index()`: private setup, then `ctx.run(op)`.
    fn worker(&self, ctx: &WorkerCtx<'_>) -> Result<(), String>;
    /// An extra, uncounted thread calls this every [`Self::intruder_every`]
    /// when [`Self::has_intruder`] says so.
    fn intruder(&self) -> Result<(), String> {
        Ok(())
    }
    /// Interval of the intruder.
    fn intruder_every(&self) -> Duration {
        Duration::from_millis(100)
    }
    /// Whether [`Self::intruder`] is used.
    fn has_intruder(&self) -> bool {
        false
    }
}

/// Timing of one segment.
#[derive(Clone, Copy, Debug)]
pub struct SegmentTiming {
    pub warmup: Duration,
    pub measure: Duration,
    pub period: Duration,
}

/// What one segment measured.
#[derive(Clone, Debug, Default)]
pub struct SegmentResult {
    pub samples: Vec<Sample>,
    /// Counter deltas over the measured window.
    pub counters: Snapshot,
    /// Iterations in the measured window.
    pub ops: u64,
    /// Seconds in the measured window.
    pub secs: f64,
}

impl SegmentResult {
    /// Append a later segment of the same configuration (next round).
    pub fn append(&mut self, mut other: SegmentResult) {
        let offset = self.secs * 1000.0;
        for s in &mut other.samples {
            s.t_ms += offset;
        }
        self.samples.extend(other.samples);
        self.counters.merge(&other.counters);
        self.ops += other.ops;
        self.secs += other.secs;
    }

    /// Median of the sample totals (iterations per second).
    pub fn median_total(&self) -> Option<f64> {
        let v: Vec<f64> = self.samples.iter().map(|s| s.total).collect();
        median(&v)
    }
}

/// Run one segment of `inst` with `threads` workers. `on_sample` sees every
/// sample as it is taken (for the per-second lines).
pub fn run_segment(
    inst: &dyn Instance,
    threads: usize,
    timing: SegmentTiming,
    on_sample: &mut dyn FnMut(&Sample),
) -> Result<SegmentResult, String> {
    assert!(threads > 0, "a segment needs a worker");
    let gate = Gate::default();
    let slots: Vec<CachePadded<AtomicU64Slot>> =
        (0..threads).map(|_| CachePadded::default()).collect();
    let errors: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let push_err = |e: String| errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);

    let result = std::thread::scope(|s| {
        for (idx, slot) in slots.iter().enumerate() {
            let gate = &gate;
            let push_err = &push_err;
            s.spawn(move || {
                let ctx = WorkerCtx {
                    idx,
                    threads,
                    slot,
                    gate,
                    arrived: std::cell::Cell::new(false),
                };
                // A panic is this worker's failure, not the run's: caught,
                // it fails the segment like an error (the sampler waiting
                // for it at the gate would wait forever, and the scope
                // would re-raise it and lose every figure measured so far).
                let r =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inst.worker(&ctx)))
                        .unwrap_or_else(|p| Err(format!("panicked: {}", panic_text(&*p))));
                // A worker that failed (or returned) before reaching the gate
                // still counts as arrived, so the sampler never waits forever.
                ctx.arrive_once();
                if let Err(e) = r {
                    gate.fail();
                    push_err(format!("worker {idx}: {e}"));
                }
            });
        }
        if inst.has_intruder() {
            let gate = &gate;
            let push_err = &push_err;
            let every = inst.intruder_every();
            s.spawn(move || {
                gate.wait_go();
                while !gate.stopped() {
                    let r =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inst.intruder()))
                            .unwrap_or_else(|p| Err(format!("panicked: {}", panic_text(&*p))));
                    if let Err(e) = r {
                        gate.fail();
                        push_err(format!("intruder: {e}"));
                        return;
                    }
                    sleep_unless(gate, every);
                }
            });
        }
        let r = sample_loop(&gate, &slots, timing, on_sample);
        gate.stop.store(true, Relaxed);
        r
    });
    let errs = errors.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = errs.into_iter().next() {
        return Err(e);
    }
    result
}

/// The message of a caught panic.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Sleep `d` in short slices, returning early once the gate stops.
fn sleep_unless(gate: &Gate, d: Duration) {
    let end = Instant::now() + d;
    loop {
        let now = Instant::now();
        if now >= end || gate.stopped() {
            return;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(10)));
    }
}

fn read_slots(slots: &[CachePadded<AtomicU64Slot>]) -> Vec<u64> {
    slots.iter().map(|s| s.read()).collect()
}

fn sample_loop(
    gate: &Gate,
    slots: &[CachePadded<AtomicU64Slot>],
    timing: SegmentTiming,
    on_sample: &mut dyn FnMut(&Sample),
) -> Result<SegmentResult, String> {
    // Wait for every worker's private setup.
    while gate.ready.load(Relaxed) < slots.len() {
        if gate.has_failed() {
            return Err("setup failed".into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    if gate.has_failed() {
        return Err("setup failed".into());
    }
    gate.go.store(true, Relaxed);
    std::thread::sleep(timing.warmup);

    let start = Instant::now();
    let snap0 = lockstat::snapshot();
    let mut last = read_slots(slots);
    let mut last_t = start;
    let mut samples = Vec::new();
    let period = timing.period.max(Duration::from_millis(1));
    let n_periods = ((timing.measure.as_secs_f64() / period.as_secs_f64()).round() as u64).max(1);
    for k in 1..=n_periods {
        let target = start + period * k as u32;
        let now = Instant::now();
        if target > now {
            std::thread::sleep(target - now);
        }
        if gate.has_failed() {
            return Err("a worker failed".into());
        }
        let now = Instant::now();
        let cur = read_slots(slots);
        let deltas: Vec<u64> = cur
            .iter()
            .zip(&last)
            .map(|(c, l)| c.wrapping_sub(*l))
            .collect();
        let s = Sample::from_deltas(
            (now - start).as_secs_f64() * 1000.0,
            (now - last_t).as_secs_f64(),
            &deltas,
        );
        on_sample(&s);
        samples.push(s);
        last = cur;
        last_t = now;
    }
    let snap1 = lockstat::snapshot();
    let ops = samples.iter().map(|s| s.ops).sum();
    Ok(SegmentResult {
        samples,
        counters: snap1.delta(&snap0),
        ops,
        secs: (last_t - start).as_secs_f64(),
    })
}

/// The order in which the segments of `variants` variants and `rounds`
/// rounds run: A B C A B C ... (round-major), so slow drift (thermal, a
/// neighbour's build) hits every variant alike.
pub fn alternation(variants: usize, rounds: usize) -> Vec<(usize, usize)> {
    let mut v = Vec::with_capacity(variants * rounds);
    for r in 0..rounds {
        for i in 0..variants {
            v.push((r, i));
        }
    }
    v
}
