//! Rows, ratios, the summary table and `report.json`.
//!
//! `report.json` schema (version `scalevfs-bench/1`): a top-level object
//! with `schema`, `machine` (a one-line description), `machine_detail`,
//! `cores`, `commit`, `date`, `command`, `duration_s`, `rounds`, `rows` and
//! `skipped`. Each row has at least `workload`, `variant` (a peer's name for
//! a peer), `threads`, `ops_per_sec`, `per_thread_ops_per_sec`, `ns_per_op`
//! (per thread), `scaling` (vs the same variant at 1 thread; null without a
//! 1-thread row), `shared_writes_per_op`, `lockref_fallback_ratio`,
//! `seq_retries_per_op` (these three are null for peers, which have no
//! counters), `is_default`, and `depth` on depth rows; plus `ratio_vs_before`,
//! `is_before`, `peer`, `settings`, `walk` (walk outcomes per op), `counters`
//! (every non-zero counter delta), `total_ops`, `measured_s` and `samples`
//! (every sample: `t_ms`, `secs`, `ops`, `min`, `max`, `total`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use scalevfs_sync::lockstat::{Snapshot, Stat};
use serde::{Deserialize, Serialize};

use crate::harness::{Sample, SegmentResult};
use crate::workloads::Variant;

/// Schema tag written into `report.json`.
pub const SCHEMA: &str = "scalevfs-bench/1";

/// Walk outcomes per operation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WalkMix {
    pub handled: f64,
    pub partial: f64,
    pub aborted: f64,
    pub unlazy: f64,
}

/// One measured configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub workload: String,
    pub variant: String,
    pub threads: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    pub ops_per_sec: f64,
    pub per_thread_ops_per_sec: f64,
    pub ns_per_op: f64,
    pub scaling: Option<f64>,
    pub ratio_vs_before: Option<f64>,
    pub shared_writes_per_op: Option<f64>,
    pub lockref_fallback_ratio: Option<f64>,
    pub seq_retries_per_op: Option<f64>,
    pub is_default: bool,
    pub is_before: bool,
    pub peer: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub submount: bool,
    pub settings: BTreeMap<String, String>,
    pub walk: Option<WalkMix>,
    pub counters: BTreeMap<String, u64>,
    pub total_ops: u64,
    pub measured_s: f64,
    pub samples: Vec<Sample>,
}

/// A configuration that could not run (e.g. a variant the core lacks).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    pub workload: String,
    pub variant: String,
    pub threads: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    pub error: String,
}

/// Where the run happened.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub hostname: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_kib: u64,
    pub kernel: String,
}

impl Machine {
    /// Read what Linux tells about this machine (best effort).
    pub fn detect() -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let memory_kib = read("/proc/meminfo")
            .lines()
            .find(|l| l.starts_with("MemTotal"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        Machine {
            hostname: read("/proc/sys/kernel/hostname").trim().to_string(),
            cpu_model,
            cpus: cores(),
            memory_kib,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        }
    }

    /// One line: model, CPUs, memory.
    pub fn line(&self) -> String {
        format!(
            "{} ({} CPUs, {:.1} GiB, Linux {})",
            self.cpu_model,
            self.cpus,
            self.memory_kib as f64 / (1024.0 * 1024.0),
            self.kernel
        )
    }
}

/// Available cores.
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// The whole report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    pub machine: String,
    pub machine_detail: Machine,
    pub cores: usize,
    pub commit: String,
    pub date: String,
    pub command: String,
    /// The program's memory allocator (reports before it was recorded: "").
    #[serde(default)]
    pub allocator: String,
    pub duration_s: f64,
    pub rounds: usize,
    pub rows: Vec<Row>,
    pub skipped: Vec<Skipped>,
}

/// What one configuration measured, before it becomes a [`Row`].
#[derive(Clone, Debug)]
pub struct Measured {
    pub workload: String,
    pub variant: Variant,
    pub depth: Option<u32>,
    pub threads: usize,
    pub result: SegmentResult,
}

fn per_op(n: u64, ops: u64) -> f64 {
    if ops == 0 {
        0.0
    } else {
        n as f64 / ops as f64
    }
}

/// Every non-zero counter of a snapshot, by name.
pub fn counter_map(s: &Snapshot) -> BTreeMap<String, u64> {
    Stat::ALL
        .iter()
        .filter(|st| s.get(**st) != 0)
        .map(|st| (st.name().to_string(), s.get(*st)))
        .collect()
}

impl Measured {
    /// The row (ratios are filled in later by [`fill_ratios`]).
    pub fn row(&self) -> Row {
        let r = &self.result;
        let ops_per_sec = r.median_total().unwrap_or(0.0);
        let per_thread = ops_per_sec / self.threads as f64;
        let c = &r.counters;
        let peer = self.variant.peer.is_some();
        let hw = |v: f64| if peer { None } else { Some(v) };
        let walk = if peer {
            None
        } else {
            Some(WalkMix {
                handled: per_op(c.get(Stat::WalkHandled), r.ops),
                partial: per_op(c.get(Stat::WalkPartial), r.ops),
                aborted: per_op(c.get(Stat::WalkAborted), r.ops),
                unlazy: per_op(c.get(Stat::WalkUnlazy), r.ops),
            })
        };
        Row {
            workload: self.workload.clone(),
            variant: self.variant.name.clone(),
            threads: self.threads,
            depth: self.depth,
            ops_per_sec,
            per_thread_ops_per_sec: per_thread,
            ns_per_op: if per_thread > 0.0 {
                1e9 / per_thread
            } else {
                0.0
            },
            scaling: None,
            ratio_vs_before: None,
            shared_writes_per_op: hw(per_op(c.get(Stat::SharedWrite), r.ops)),
            lockref_fallback_ratio: hw(c.lockref_locked_fraction()),
            seq_retries_per_op: hw(per_op(c.get(Stat::SeqRetry), r.ops)),
            is_default: self.variant.is_default,
            is_before: self.variant.is_before,
            peer,
            submount: self.variant.submount,
            settings: self.variant.settings.iter().cloned().collect(),
            walk,
            counters: if peer {
                BTreeMap::new()
            } else {
                counter_map(c)
            },
            total_ops: r.ops,
            measured_s: r.secs,
            samples: r.samples.clone(),
        }
    }
}

/// Fill `scaling` (vs the same workload/variant/depth at 1 thread) and
/// `ratio_vs_before` (vs the workload's "before" variant at the same
/// threads/depth; none for the before row itself or where there is none).
pub fn fill_ratios(rows: &mut [Row]) {
    let key = |r: &Row| (r.workload.clone(), r.depth);
    let snapshot: Vec<Row> = rows.to_vec();
    for r in rows.iter_mut() {
        let one = snapshot.iter().find(|o| {
            key(o) == key(r) && o.variant == r.variant && o.threads == 1 && o.ops_per_sec > 0.0
        });
        r.scaling = one.map(|o| r.ops_per_sec / o.ops_per_sec);
        let before = snapshot.iter().find(|o| {
            key(o) == key(r) && o.is_before && o.threads == r.threads && o.ops_per_sec > 0.0
        });
        r.ratio_vs_before = match before {
            Some(b) if b.variant != r.variant => Some(r.ops_per_sec / b.ops_per_sec),
            _ => None,
        };
    }
}

/// `12.3M`-style rendering of a rate.
pub fn si(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}K", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

fn workload_label(r: &Row) -> String {
    match r.depth {
        Some(d) => format!("{} {d}", r.workload),
        None => r.workload.clone(),
    }
}

/// Render rows as a Markdown table.
fn table(headers: &[&str], body: &[Vec<String>], right_from: usize) -> String {
    let mut w: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in body {
        for (i, c) in row.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        out.push('|');
        for (i, c) in cells.iter().enumerate() {
            let pad = w[i] - c.chars().count();
            if i >= right_from {
                let _ = write!(out, " {}{} |", " ".repeat(pad), c);
            } else {
                let _ = write!(out, " {}{} |", c, " ".repeat(pad));
            }
        }
        out.push('\n');
    };
    line(headers.iter().map(|s| s.to_string()).collect(), &mut out);
    line(
        w.iter()
            .enumerate()
            .map(|(i, n)| {
                if i >= right_from {
                    format!("{}:", "-".repeat(n - 1))
                } else {
                    "-".repeat(*n)
                }
            })
            .collect(),
        &mut out,
    );
    for row in body {
        line(row.clone(), &mut out);
    }
    out
}

/// The full summary table (every row).
pub fn summary_table(rows: &[Row]) -> String {
    let headers = [
        "workload",
        "variant",
        "thr",
        "ops/s",
        "ops/s/thr",
        "ns/op",
        "scaling",
        "vs before",
        "shw/op",
        "lr-fallback",
        "seq/op",
        "walk h/p/a %",
    ];
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut variant = r.variant.clone();
            if r.is_default {
                variant.push_str(" *");
            }
            if r.is_before {
                variant.push_str(" (before)");
            }
            vec![
                workload_label(r),
                variant,
                r.threads.to_string(),
                si(r.ops_per_sec),
                si(r.per_thread_ops_per_sec),
                format!("{:.1}", r.ns_per_op),
                opt(r.scaling, |v| format!("{v:.2}x")),
                opt(r.ratio_vs_before, |v| format!("{v:.2}x")),
                opt(r.shared_writes_per_op, |v| format!("{v:.2}")),
                opt(r.lockref_fallback_ratio, |v| format!("{:.2}%", v * 100.0)),
                opt(r.seq_retries_per_op, |v| format!("{v:.3}")),
                walk_cell(r),
            ]
        })
        .collect();
    table(&headers, &body, 2)
}

fn walk_cell(r: &Row) -> String {
    match &r.walk {
        Some(w) => {
            let t = w.handled + w.partial + w.aborted;
            if t == 0.0 {
                "-".into()
            } else {
                format!(
                    "{:.0}/{:.0}/{:.0}",
                    100.0 * w.handled / t,
                    100.0 * w.partial / t,
                    100.0 * w.aborted / t
                )
            }
        }
        None => "-".into(),
    }
}

/// The thread count headline figures are read at: the largest measured
/// count not above the cores (oversubscription is shown in the full table).
/// When every count is above the cores, the smallest measured one: a count
/// that was not measured would find no rows and leave the headline empty.
/// 1 only when there are no rows.
pub fn headline_threads(rows: &[Row], cores: usize) -> usize {
    let measured = || rows.iter().map(|r| r.threads);
    measured()
        .filter(|t| *t <= cores)
        .max()
        .or_else(|| measured().min())
        .unwrap_or(1)
}

/// Per workload: the "before" variant against the default, at
/// [`headline_threads`], with the default's scaling and counters.
pub fn headline_table(rows: &[Row], cores: usize) -> String {
    let t = headline_threads(rows, cores);
    let mut body = Vec::new();
    let mut seen = Vec::new();
    for r in rows {
        let k = (r.workload.clone(), r.depth);
        if seen.contains(&k) {
            continue;
        }
        seen.push(k.clone());
        let at = |f: &dyn Fn(&Row) -> bool| {
            rows.iter()
                .find(|o| (o.workload.clone(), o.depth) == k && o.threads == t && f(o))
        };
        let (Some(def), before) = (at(&|o| o.is_default && !o.submount), at(&|o| o.is_before))
        else {
            continue;
        };
        body.push(vec![
            workload_label(def),
            t.to_string(),
            before
                .map(|b| format!("{} {}", b.variant, si(b.ops_per_sec)))
                .unwrap_or_else(|| "-".into()),
            format!("{} {}", def.variant, si(def.ops_per_sec)),
            opt(def.ratio_vs_before, |v| format!("{v:.2}x")),
            opt(def.scaling, |v| format!("{v:.2}x")),
            format!("{:.1}", def.ns_per_op),
            opt(def.shared_writes_per_op, |v| format!("{v:.2}")),
            opt(before.and_then(|b| b.shared_writes_per_op), |v| {
                format!("{v:.2}")
            }),
            opt(def.lockref_fallback_ratio, |v| format!("{:.2}%", v * 100.0)),
        ]);
    }
    table(
        &[
            "workload",
            "thr",
            "before",
            "default",
            "default/before",
            "default scaling",
            "ns/op",
            "shw/op",
            "before shw/op",
            "lr-fallback",
        ],
        &body,
        1,
    )
}

/// depth: ns per stat at 1 thread, scalevfs against every peer.
pub fn depth_table(rows: &[Row]) -> Option<String> {
    let depth_rows: Vec<&Row> = rows
        .iter()
        .filter(|r| r.workload == "depth" && r.threads == 1)
        .collect();
    if depth_rows.is_empty() {
        return None;
    }
    let mut variants: Vec<String> = Vec::new();
    for r in &depth_rows {
        if !variants.contains(&r.variant) {
            variants.push(r.variant.clone());
        }
    }
    let mut depths: Vec<u32> = depth_rows.iter().filter_map(|r| r.depth).collect();
    depths.sort_unstable();
    depths.dedup();
    let mut headers: Vec<String> = vec!["depth".into()];
    headers.extend(variants.iter().map(|v| format!("{v} ns")));
    headers.push("best peer / default".into());
    let body: Vec<Vec<String>> = depths
        .iter()
        .map(|d| {
            let get = |v: &str| {
                depth_rows
                    .iter()
                    .find(|r| r.depth == Some(*d) && r.variant == v)
                    .map(|r| r.ns_per_op)
            };
            let mut row = vec![d.to_string()];
            row.extend(variants.iter().map(|v| opt(get(v), |x| format!("{x:.0}"))));
            let def = depth_rows
                .iter()
                .find(|r| r.depth == Some(*d) && r.is_default)
                .map(|r| r.ns_per_op);
            let best_peer = depth_rows
                .iter()
                .filter(|r| r.depth == Some(*d) && r.peer)
                .map(|r| r.ns_per_op)
                .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.min(x))));
            row.push(match (def, best_peer) {
                (Some(d), Some(p)) if d > 0.0 => format!("{:.2}x", p / d),
                _ => "-".into(),
            });
            row
        })
        .collect();
    let h: Vec<&str> = headers.iter().map(|s| s.as_str()).collect();
    Some(table(&h, &body, 1))
}

impl Report {
    /// Build the report from measured configurations.
    pub fn new(measured: &[Measured], skipped: Vec<Skipped>, meta: Meta) -> Report {
        let mut rows: Vec<Row> = measured.iter().map(Measured::row).collect();
        fill_ratios(&mut rows);
        let machine_detail = Machine::detect();
        Report {
            schema: SCHEMA.into(),
            machine: machine_detail.line(),
            cores: cores(),
            machine_detail,
            commit: meta.commit,
            date: meta.date,
            command: meta.command,
            allocator: meta.allocator,
            duration_s: meta.duration_s,
            rounds: meta.rounds,
            rows,
            skipped,
        }
    }

    /// Everything printed on stdout at the end of a run.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "## scalevfs bench: {}\n", self.machine);
        let _ = writeln!(
            s,
            "commit {}, {}, allocator {}, {} s measured per configuration in {} alternated round(s); `*` = default, ratios vs the `(before)` variant at the same threads.\n",
            self.commit, self.date, self.allocator, self.duration_s, self.rounds
        );
        let _ = writeln!(
            s,
            "### Headline (threads = {})\n",
            headline_threads(&self.rows, self.cores)
        );
        s.push_str(&headline_table(&self.rows, self.cores));
        if let Some(d) = depth_table(&self.rows) {
            let _ = writeln!(s, "\n### depth: ns per stat, 1 thread\n");
            s.push_str(&d);
        }
        let _ = writeln!(s, "\n### All rows\n");
        s.push_str(&summary_table(&self.rows));
        let _ = writeln!(
            s,
            "\nshw/op = writes per op to sync words that threads may share (LockRef, spin lock and sequence-count RMWs/stores, from lockstat: an upper bound; `bench --traced` in the trace-lines build counts only the writes that take a line from another thread); lr-fallback = share of LockRef ops that took the lock; seq/op = sequence retries per op; walk h/p/a = walks handled lock-free / handed over / aborted (% of walks)."
        );
        if !self.skipped.is_empty() {
            let _ = writeln!(s, "\n### Not run\n");
            let mut seen = Vec::new();
            for k in &self.skipped {
                let key = (k.workload.clone(), k.variant.clone(), k.error.clone());
                if !seen.contains(&key) {
                    let _ = writeln!(s, "- {} {}: {}", k.workload, k.variant, k.error);
                    seen.push(key);
                }
            }
        }
        s
    }
}

/// Run metadata.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    pub commit: String,
    pub date: String,
    pub command: String,
    pub allocator: String,
    pub duration_s: f64,
    pub rounds: usize,
}

/// `git describe`-like commit id of the working tree (`unknown` outside git).
pub fn git_commit() -> String {
    let out = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match out(&["rev-parse", "--short=12", "HEAD"]) {
        Some(c) => {
            let dirty = out(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{c}-dirty")
            } else {
                c
            }
        }
        None => "unknown".into(),
    }
}

/// Today's UTC date and time, ISO 8601.
pub fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}
