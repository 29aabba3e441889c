//! The harness's bookkeeping: sampling, medians, ratios, the JSON schema and
//! the alternation order. No test here looks at a speed.

use std::collections::BTreeMap;
use std::time::Duration;

use scalevfs_bench::harness::{
    alternation, median, run_segment, Instance, Sample, SegmentResult, SegmentTiming, WorkerCtx,
};
use scalevfs_bench::report::{fill_ratios, headline_threads, Measured, Meta, Report, Row};
use scalevfs_bench::workloads::Variant;
use scalevfs_sync::lockstat::{Snapshot, Stat};

#[test]
fn median_of_odd_even_and_empty() {
    assert_eq!(median(&[]), None);
    assert_eq!(median(&[3.0]), Some(3.0));
    assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    // One outlier does not move it.
    assert_eq!(median(&[10.0, 10.0, 1e12, 10.0, 9.0]), Some(10.0));
}

#[test]
fn sample_from_deltas_scales_to_per_second() {
    let s = Sample::from_deltas(500.0, 0.5, &[100, 300]);
    assert_eq!(s.ops, 400);
    assert_eq!(s.min, 200.0);
    assert_eq!(s.max, 600.0);
    assert_eq!(s.total, 800.0);
    assert_eq!(s.line(), "min:200 max:600 total:800");
}

#[test]
fn appending_rounds_continues_time_and_sums() {
    let mut a = SegmentResult {
        samples: vec![Sample::from_deltas(100.0, 0.1, &[10])],
        counters: Snapshot::default(),
        ops: 10,
        secs: 0.1,
    };
    let mut c = Snapshot::default();
    c.stats[Stat::SharedWrite.index()] = 7;
    let b = SegmentResult {
        samples: vec![Sample::from_deltas(100.0, 0.1, &[30])],
        counters: c,
        ops: 30,
        secs: 0.1,
    };
    a.append(b);
    assert_eq!(a.ops, 40);
    assert_eq!(a.samples.len(), 2);
    assert!((a.samples[1].t_ms - 200.0).abs() < 1e-9);
    assert_eq!(a.counters.get(Stat::SharedWrite), 7);
    assert_eq!(a.median_total(), Some(200.0));
}

#[test]
fn alternation_is_round_major() {
    assert_eq!(alternation(2, 2), vec![(0, 0), (0, 1), (1, 0), (1, 1)]);
    assert_eq!(alternation(3, 1), vec![(0, 0), (0, 1), (0, 2)]);
    assert!(alternation(0, 3).is_empty());
    // Every variant appears once per round, and no variant runs twice in a
    // row when there are at least two.
    let a = alternation(3, 4);
    assert_eq!(a.len(), 12);
    for w in a.windows(2) {
        assert_ne!(w[0].1, w[1].1);
    }
}

struct Counting;
impl Instance for Counting {
    fn worker(&self, ctx: &WorkerCtx<'_>) -> Result<(), String> {
        let mut x = 0u64;
        ctx.run(|| {
            x = std::hint::black_box(x + 1);
            Ok::<(), String>(())
        })
    }
}

fn timing() -> SegmentTiming {
    SegmentTiming {
        warmup: Duration::from_millis(5),
        measure: Duration::from_millis(40),
        period: Duration::from_millis(10),
    }
}

#[test]
fn segment_samples_every_period_and_counts() {
    let mut seen = 0;
    let r = run_segment(&Counting, 2, timing(), &mut |_| seen += 1).unwrap();
    assert_eq!(r.samples.len(), 4);
    assert_eq!(seen, 4);
    assert!(r.ops > 0);
    assert_eq!(r.ops, r.samples.iter().map(|s| s.ops).sum::<u64>());
    for s in &r.samples {
        assert!(s.min <= s.max && s.max <= s.total + 1e-9);
    }
    assert!(r.secs > 0.0);
}

struct FailsAfter(u64);
impl Instance for FailsAfter {
    fn worker(&self, ctx: &WorkerCtx<'_>) -> Result<(), String> {
        let mut n = 0;
        ctx.run(|| {
            n += 1;
            if n > self.0 {
                Err("boom")
            } else {
                Ok(())
            }
        })
    }
}

struct FailsInSetup;
impl Instance for FailsInSetup {
    fn worker(&self, ctx: &WorkerCtx<'_>) -> Result<(), String> {
        if ctx.index() == 1 {
            return Err("no such variant".into());
        }
        ctx.run(|| Ok::<(), String>(()))
    }
}

struct PanicsInSetup;
impl Instance for PanicsInSetup {
    fn worker(&self, ctx: &WorkerCtx<'_>) -> Result<(), String> {
        if ctx.index() == 0 {
            panic!("a bug in the code under test");
        }
        ctx.run(|| Ok::<(), String>(()))
    }
}

/// A worker that panics (before the start gate, where the sampler waits
/// for every worker) ends its segment with an error: it hung the run, and
/// a panic after the gate was re-raised and lost the report.
#[test]
fn a_panicking_worker_ends_the_segment_with_an_error() {
    let e = run_segment(&PanicsInSetup, 2, timing(), &mut |_| {}).unwrap_err();
    assert!(e.contains("a bug in the code under test"), "{e}");
    assert!(e.contains("panicked"), "{e}");
    let e = run_segment(&PanicsAfter(500), 2, timing(), &mut |_| {}).unwrap_err();
    assert!(e.contains("late bug"), "{e}");
}

struct PanicsAfter(u64);
impl Instance for PanicsAfter {
    fn worker(&self, ctx: &WorkerCtx<'_>) -> Result<(), String> {
        let mut n = 0;
        ctx.run(|| {
            n += 1;
            if n > self.0 {
                panic!("late bug");
            }
            Ok::<(), String>(())
        })
    }
}

#[test]
fn failures_end_the_segment_with_the_error() {
    let e = run_segment(&FailsAfter(1000), 2, timing(), &mut |_| {}).unwrap_err();
    assert!(e.contains("boom"), "{e}");
    // A worker failing before the start gate must not hang the others.
    let e = run_segment(&FailsInSetup, 3, timing(), &mut |_| {}).unwrap_err();
    assert!(e.contains("no such variant"), "{e}");
}

fn measured(variant: &str, before: bool, default: bool, threads: usize, rate: f64) -> Measured {
    let mut v = Variant::plain();
    v.name = variant.into();
    v.is_before = before;
    v.is_default = default;
    let samples = vec![
        Sample::from_deltas(100.0, 1.0, &[rate as u64 / 2, rate as u64 / 2]),
        Sample::from_deltas(200.0, 1.0, &[rate as u64 * 2]),
        Sample::from_deltas(300.0, 1.0, &[1]),
    ];
    let mut counters = Snapshot::default();
    counters.stats[Stat::SharedWrite.index()] = 2 * samples.iter().map(|s| s.ops).sum::<u64>();
    counters.stats[Stat::LockrefFast.index()] = 3;
    counters.stats[Stat::LockrefLocked.index()] = 1;
    let ops = samples.iter().map(|s| s.ops).sum();
    Measured {
        workload: "stat-same".into(),
        variant: v,
        depth: None,
        threads,
        result: SegmentResult {
            samples,
            counters,
            ops,
            secs: 3.0,
        },
    }
}

#[test]
fn ratios_scaling_and_counters_per_op() {
    let m = [
        measured("old", true, false, 1, 1000.0),
        measured("new", false, true, 1, 2000.0),
        measured("old", true, false, 2, 1500.0),
        measured("new", false, true, 2, 4000.0),
    ];
    let mut rows: Vec<Row> = m.iter().map(Measured::row).collect();
    fill_ratios(&mut rows);
    let get = |v: &str, t: usize| {
        rows.iter()
            .find(|r| r.variant == v && r.threads == t)
            .unwrap()
    };
    // Median of {rate, 2*rate, 1}.
    assert_eq!(get("new", 1).ops_per_sec, 2000.0);
    assert_eq!(get("new", 2).per_thread_ops_per_sec, 2000.0);
    assert!((get("new", 2).ns_per_op - 500_000.0).abs() < 1e-6);
    assert_eq!(get("new", 2).scaling, Some(2.0));
    assert_eq!(get("old", 2).scaling, Some(1.5));
    assert_eq!(get("new", 1).ratio_vs_before, Some(2.0));
    assert_eq!(get("new", 2).ratio_vs_before, Some(4000.0 / 1500.0));
    assert_eq!(get("old", 2).ratio_vs_before, None);
    assert_eq!(get("new", 1).shared_writes_per_op, Some(2.0));
    assert_eq!(get("new", 1).lockref_fallback_ratio, Some(0.25));
    assert_eq!(get("new", 1).seq_retries_per_op, Some(0.0));
}

#[test]
fn json_schema_has_the_agreed_fields() {
    let mut depth = measured("default", false, true, 1, 100.0);
    depth.workload = "depth".into();
    depth.depth = Some(8);
    let mut peer = measured("linux-tmpfs", false, false, 1, 100.0);
    peer.workload = "depth".into();
    peer.depth = Some(8);
    peer.variant.peer = Some(scalevfs_bench::workloads::Peer::LinuxTmpfs);
    let ms = [
        measured("old", true, false, 1, 10.0),
        measured("new", false, true, 1, 20.0),
        depth,
        peer,
    ];
    let report = Report::new(
        &ms,
        Vec::new(),
        Meta {
            commit: "abc".into(),
            ..Meta::default()
        },
    );
    let v: serde_json::Value = serde_json::to_value(&report).unwrap();
    for k in ["machine", "cores", "commit", "rows"] {
        assert!(v.get(k).is_some(), "missing top-level {k}");
    }
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for r in rows {
        for k in [
            "workload",
            "variant",
            "threads",
            "ops_per_sec",
            "per_thread_ops_per_sec",
            "ns_per_op",
            "scaling",
            "shared_writes_per_op",
            "lockref_fallback_ratio",
            "seq_retries_per_op",
            "is_default",
            "samples",
        ] {
            assert!(r.get(k).is_some(), "row lacks {k}: {r}");
        }
        assert!(r["ops_per_sec"].is_number());
        assert!(r["threads"].is_u64());
        assert!(r["is_default"].is_boolean());
        assert!(!r["samples"].as_array().unwrap().is_empty());
        let is_depth = r["workload"] == "depth";
        assert_eq!(
            r.get("depth").is_some(),
            is_depth,
            "depth only on depth rows: {r}"
        );
    }
    let peer = rows.iter().find(|r| r["variant"] == "linux-tmpfs").unwrap();
    assert!(peer["seq_retries_per_op"].is_null());
    assert!(peer["shared_writes_per_op"].is_null());
    assert!(rows[0]["seq_retries_per_op"].is_number());
    // Round trip.
    let back: Report = serde_json::from_value(v).unwrap();
    assert_eq!(back.rows.len(), 4);
    let _: BTreeMap<String, u64> = back.rows[0].counters.clone();
    // The tables render.
    let text = report.render();
    assert!(text.contains("stat-same") && text.contains("depth"));
}

#[test]
fn headline_threads_is_a_measured_count() {
    let rows = |ts: &[usize]| -> Vec<Row> {
        ts.iter()
            .map(|&t| measured("new", false, true, t, 100.0).row())
            .collect()
    };
    // The largest count not above the cores.
    assert_eq!(headline_threads(&rows(&[1, 2, 4, 8]), 4), 4);
    assert_eq!(headline_threads(&rows(&[1, 2, 4, 8]), 3), 2);
    // Every count above the cores: the smallest measured, not an
    // unmeasured 1 (which would find no rows for the headline).
    assert_eq!(headline_threads(&rows(&[8, 4, 16]), 2), 4);
    assert_eq!(headline_threads(&[], 2), 1);
}

#[test]
fn plots_list_only_the_files_they_wrote() {
    // A depth workload measured at 2 threads only: the 1-thread depth plot
    // has no points and is not drawn; the depth-8 one is.
    let mut d = measured("default", false, true, 2, 100.0);
    d.workload = "depth".into();
    d.depth = Some(8);
    let report = Report::new(&[d], Vec::new(), Meta::default());
    let dir = std::env::temp_dir().join(format!("scalevfs-plots-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let written = scalevfs_bench::plot::write_plots(&report, &dir).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["depth-8-threads.svg"]);
    assert!(written.iter().all(|p| p.is_file()), "{written:?}");
    assert!(!dir.join("depth.svg").exists());
    // The README links only what exists.
    let readme = scalevfs_bench::plot::readme(&report, &written);
    assert!(!readme.contains("](depth.svg)"), "{readme}");
    std::fs::remove_dir_all(&dir).unwrap();
}
