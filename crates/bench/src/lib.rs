//! `scalevfs bench`: the seeds' experiments and will-it-scale's fs set, run
//! side by side with their "before" variants (and, with `--peers`, other
//! filesystems), reported as tables, `report.json` and SVG plots.
//!
//! - [`commute`]: the Commuter-style conflict matrix (`bench commute`).
//! - [`harness`]: the will-it-scale-shaped measuring loop.
//! - [`workloads`]: every workload of `shared/BENCHMARKS.md` and its variants.
//! - [`report`]: rows, ratios, tables, JSON.
//! - [`plot`]: SVG plots and the report README.
//!
//! [`run`] plans and runs a set of workloads; the `scalevfs` binary is a
//! thin clap layer over [`Options`].

pub mod commute;
pub mod durable;
pub mod fuseops;
pub mod harness;
pub mod plot;
pub mod report;
pub mod traced;
pub mod tree;
pub mod workloads;

use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use harness::{alternation, run_segment, SegmentResult, SegmentTiming};
use report::{Measured, Meta, Report, Skipped};
use workloads::{Variant, Workload};

/// Default measured time per configuration (all rounds together).
pub const DEFAULT_DURATION: Duration = Duration::from_millis(400);
/// Default number of alternated rounds.
pub const DEFAULT_ROUNDS: usize = 2;
/// Minimum length of a timeline (stat-degrade) run per variant.
pub const TIMELINE_MIN: Duration = Duration::from_secs(2);

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Workload ids (empty = all); see [`workloads::select`].
    pub workloads: Vec<String>,
    /// Thread counts (empty = 1..=cores plus 2x cores).
    pub threads: Vec<usize>,
    /// Measured time per configuration, over all rounds.
    pub duration: Duration,
    /// Alternated rounds per configuration.
    pub rounds: usize,
    /// Only variants with these names (empty = all).
    pub variants: Vec<String>,
    /// Also run the peers where a workload has them.
    pub peers: bool,
    /// No progress bar and no per-sample lines.
    pub quiet: bool,
    /// Minimum measured time of a timeline workload (stat-degrade) per
    /// variant: the cascade needs time to show.
    pub timeline_min: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            workloads: Vec::new(),
            threads: Vec::new(),
            duration: DEFAULT_DURATION,
            rounds: DEFAULT_ROUNDS,
            variants: Vec::new(),
            peers: false,
            quiet: false,
            timeline_min: TIMELINE_MIN,
        }
    }
}

/// Default thread counts: 1..=cores, plus 2x cores (oversubscribed).
pub fn default_threads(cores: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (1..=cores.max(1)).collect();
    v.push(cores.max(1) * 2);
    v
}

impl Options {
    fn thread_counts(&self) -> Vec<usize> {
        let mut t = if self.threads.is_empty() {
            default_threads(report::cores())
        } else {
            self.threads.clone()
        };
        t.retain(|n| *n > 0);
        t.sort_unstable();
        t.dedup();
        t
    }

    /// Timing of one segment of a normal (alternated) configuration.
    pub fn segment_timing(&self) -> SegmentTiming {
        let seg = self.duration / u32::try_from(self.rounds.max(1)).unwrap_or(u32::MAX);
        let quarter = (seg / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        SegmentTiming {
            warmup: quarter,
            measure: seg,
            period: quarter,
        }
    }

    /// Timing of a timeline configuration (one segment per variant).
    pub fn timeline_timing(&self) -> SegmentTiming {
        let measure = self.duration.max(self.timeline_min);
        let period = (measure / 20).clamp(Duration::from_millis(10), Duration::from_secs(1));
        SegmentTiming {
            warmup: Duration::from_millis(50).min(measure / 10),
            measure,
            period,
        }
    }

    fn wants(&self, v: &Variant) -> bool {
        self.variants.is_empty() || self.variants.contains(&v.name)
    }
}

/// One configuration to measure: a workload, its variants (alternated), a
/// depth and a thread count.
struct Group<'w> {
    workload: &'w Workload,
    variants: Vec<Variant>,
    depth: Option<u32>,
    threads: usize,
}

fn plan<'w>(opts: &Options, workloads: &'w [Workload]) -> Vec<Group<'w>> {
    let mut out = Vec::new();
    for w in workloads {
        let variants: Vec<Variant> = w
            .all_variants(opts.peers)
            .into_iter()
            .filter(|v| opts.wants(v))
            .collect();
        if variants.is_empty() {
            continue;
        }
        let depths: Vec<Option<u32>> = if w.depths.is_empty() {
            vec![None]
        } else {
            w.depths.iter().map(|d| Some(*d)).collect()
        };
        for depth in depths {
            for &threads in &opts.thread_counts() {
                out.push(Group {
                    workload: w,
                    variants: variants.clone(),
                    depth,
                    threads,
                });
            }
        }
    }
    out
}

/// Progress and per-sample output (stderr, above the bar), silent in quiet
/// mode.
pub struct Progress {
    bar: ProgressBar,
    verbose: bool,
}

impl Progress {
    fn new(len: u64, quiet: bool) -> Progress {
        let bar = if quiet {
            ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden())
        } else {
            let b = ProgressBar::new(len);
            if let Ok(s) = ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} segments {msg}",
            ) {
                b.set_style(s.progress_chars("=> "));
            }
            b
        };
        Progress {
            bar,
            verbose: !quiet,
        }
    }
    fn line(&self, s: &str) {
        if self.verbose {
            self.bar.println(s);
        }
    }
}

/// The result of [`run`]: every measured configuration and what could not run.
pub struct RunOutput {
    pub measured: Vec<Measured>,
    pub skipped: Vec<Skipped>,
}

/// Run the selected workloads. Errors only for a bad selection; a variant
/// that cannot run (e.g. a `VfsConfig` key the core lacks) becomes a
/// [`Skipped`] entry and the run goes on.
pub fn run(opts: &Options) -> Result<RunOutput, String> {
    let workloads = workloads::select(&opts.workloads)?;
    if !opts.variants.is_empty() {
        for n in &opts.variants {
            if !workloads
                .iter()
                .any(|w| w.all_variants(opts.peers).iter().any(|v| v.name == *n))
            {
                return Err(format!("no selected workload has a variant {n:?}"));
            }
        }
    }
    let groups = plan(opts, &workloads);
    let segments: u64 = groups
        .iter()
        .map(|g| {
            (g.variants.len()
                * if g.workload.timeline {
                    1
                } else {
                    opts.rounds.max(1)
                }) as u64
        })
        .sum();
    let progress = Progress::new(segments, opts.quiet);
    let mut measured = Vec::new();
    let mut skipped = Vec::new();
    for g in &groups {
        let (m, s) = run_group(opts, g, &progress);
        measured.extend(m);
        skipped.extend(s);
    }
    progress.bar.finish_and_clear();
    Ok(RunOutput { measured, skipped })
}

fn run_group(opts: &Options, g: &Group<'_>, progress: &Progress) -> (Vec<Measured>, Vec<Skipped>) {
    let (rounds, timing) = if g.workload.timeline {
        (1, opts.timeline_timing())
    } else {
        (opts.rounds.max(1), opts.segment_timing())
    };
    let mut results: Vec<Result<SegmentResult, String>> =
        vec![Ok(SegmentResult::default()); g.variants.len()];
    let depth = g.depth.map(|d| format!(" depth={d}")).unwrap_or_default();
    for (round, vi) in alternation(g.variants.len(), rounds) {
        let v = &g.variants[vi];
        progress.bar.set_message(format!(
            "{} {}{depth} t={}",
            g.workload.id, v.name, g.threads
        ));
        progress.bar.inc(1);
        if results[vi].is_err() {
            continue;
        }
        progress.line(&format!(
            "{} [{}]{depth} threads={} round {}/{}",
            g.workload.id,
            v.name,
            g.threads,
            round + 1,
            rounds
        ));
        let seg = (g.workload.setup)(v, g.depth, g.threads).and_then(|inst| {
            run_segment(&*inst, g.threads, timing, &mut |s| {
                progress.line(&format!("  {}", s.line()))
            })
        });
        match seg {
            Ok(seg) => {
                if let Ok(acc) = &mut results[vi] {
                    acc.append(seg);
                }
            }
            Err(e) => {
                progress.line(&format!("  skipped: {e}"));
                results[vi] = Err(e);
            }
        }
    }
    let mut measured = Vec::new();
    let mut skipped = Vec::new();
    for (v, r) in g.variants.iter().zip(results) {
        match r {
            Ok(result) => measured.push(Measured {
                workload: g.workload.id.to_string(),
                variant: v.clone(),
                depth: g.depth,
                threads: g.threads,
                result,
            }),
            Err(error) => skipped.push(Skipped {
                workload: g.workload.id.to_string(),
                variant: v.name.clone(),
                threads: g.threads,
                depth: g.depth,
                error,
            }),
        }
    }
    (measured, skipped)
}

static ALLOCATOR: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Name the memory allocator of the running program for the reports (the
/// `scalevfs` binary: "mimalloc" or "system"; see its `alloc.rs`). Reports of
/// programs that never call this say "system".
pub fn set_allocator(name: &'static str) {
    let _ = ALLOCATOR.set(name);
}

/// The allocator named by [`set_allocator`] ("system" if none was).
pub fn allocator() -> &'static str {
    ALLOCATOR.get().copied().unwrap_or("system")
}

/// Build the report of a run.
pub fn make_report(opts: &Options, out: RunOutput, command: String) -> Report {
    Report::new(
        &out.measured,
        out.skipped,
        Meta {
            commit: report::git_commit(),
            date: report::now_utc(),
            command,
            allocator: allocator().to_string(),
            duration_s: opts.duration.as_secs_f64(),
            rounds: opts.rounds,
        },
    )
}

/// Write `report.json` (to `json`, default `<dir>/report.json`), the
/// summary, the plots and the README into `dir`. Returns the files written.
pub fn write_report(
    report: &Report,
    dir: &Path,
    json: Option<&Path>,
) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    let json_path = json
        .map(Path::to_path_buf)
        .unwrap_or_else(|| dir.join("report.json"));
    if let Some(parent) = json_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| format!("create {}: {e}", parent.display()))?;
    }
    let text = serde_json::to_string_pretty(report).map_err(|e| format!("json: {e}"))?;
    std::fs::write(&json_path, text).map_err(|e| format!("write {}: {e}", json_path.display()))?;
    files.push(json_path);
    let summary = dir.join("summary.md");
    std::fs::write(&summary, report.render())
        .map_err(|e| format!("write {}: {e}", summary.display()))?;
    files.push(summary);
    let plots = plot::write_plots(report, dir)?;
    let readme = dir.join("README.md");
    std::fs::write(&readme, plot::readme(report, &plots))
        .map_err(|e| format!("write {}: {e}", readme.display()))?;
    files.extend(plots);
    files.push(readme);
    Ok(files)
}
