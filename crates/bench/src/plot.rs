//! SVG plots (plotters' SVG backend only: no font or system libraries; text
//! is emitted as SVG `<text>` for the viewer to render) and the generated
//! `README.md` of the report directory.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::report::{headline_threads, Report, Row};

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// One named line.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("plot: {e:?}")
}

/// Draw lines; `log_y` for ranges spanning decades. Returns whether a file
/// was written: with no points at all there is nothing to draw and no file,
/// and the caller must not list one.
fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_y: bool,
) -> Result<bool, String> {
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in pts {
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y0 = y0.min(*y);
        y1 = y1.max(*y);
    }
    if x0 > x1 {
        return Ok(false);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut b = ChartBuilder::on(&root);
    b.caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80);
    let fmt_y = |v: &f64| crate::report::si(*v);
    if log_y {
        let lo = (y0.max(1e-3) / 1.5).max(1e-3);
        let hi = (y1 * 1.5).max(lo * 10.0);
        let mut chart = b
            .build_cartesian_2d(x0..x1, (lo..hi).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .y_label_formatter(&fmt_y)
            .draw()
            .map_err(err)?;
        draw_series(&mut chart, series)?;
    } else {
        let hi = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
        let mut chart = b.build_cartesian_2d(x0..x1, 0f64..hi).map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .y_label_formatter(&fmt_y)
            .draw()
            .map_err(err)?;
        draw_series(&mut chart, series)?;
    }
    root.present().map_err(err)?;
    Ok(true)
}

fn draw_series<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    series: &[Series],
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate<From = (f64, f64)>,
{
    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(s.points.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    Ok(())
}

fn variants_of<'a>(rows: &[&'a Row]) -> Vec<&'a str> {
    let mut v: Vec<&str> = Vec::new();
    for r in rows {
        if !v.contains(&r.variant.as_str()) {
            v.push(&r.variant);
        }
    }
    v
}

fn file_name(workload: &str, suffix: &str) -> String {
    format!("{}{suffix}.svg", workload.replace('/', "-"))
}

/// Write every plot into `dir`; returns the files written.
pub fn write_plots(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut written = Vec::new();
    let mut workloads: Vec<&str> = Vec::new();
    for r in &report.rows {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    for w in workloads {
        let rows: Vec<&Row> = report.rows.iter().filter(|r| r.workload == w).collect();
        if w == "depth" {
            // ns per stat against depth, one line per variant/peer, 1 thread.
            let one: Vec<&Row> = rows.iter().copied().filter(|r| r.threads == 1).collect();
            let series: Vec<Series> = variants_of(&one)
                .into_iter()
                .map(|v| {
                    let mut points: Vec<(f64, f64)> = one
                        .iter()
                        .filter(|r| r.variant == v)
                        .filter_map(|r| r.depth.map(|d| (d as f64, r.ns_per_op)))
                        .collect();
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Series {
                        name: v.to_string(),
                        points,
                    }
                })
                .collect();
            let p = dir.join("depth.svg");
            if line_chart(
                &p,
                "depth: ns per stat, 1 thread (log scale)",
                "path depth (components)",
                "ns per stat",
                &series,
                true,
            )? {
                written.push(p);
            }
            // Throughput against threads at depth 8.
            let d8: Vec<&Row> = rows
                .iter()
                .copied()
                .filter(|r| r.depth == Some(8))
                .collect();
            if !d8.is_empty() {
                let p = dir.join("depth-8-threads.svg");
                if line_chart(
                    &p,
                    "depth 8: stat throughput vs threads",
                    "threads",
                    "ops/s",
                    &thread_series(&d8),
                    true,
                )? {
                    written.push(p);
                }
            }
            continue;
        }
        let p = dir.join(file_name(w, ""));
        if line_chart(
            &p,
            &format!("{w}: throughput vs threads"),
            "threads",
            "ops/s (median of samples)",
            &thread_series(&rows),
            false,
        )? {
            written.push(p);
        }
        if w == "stat-degrade" {
            let t = headline_threads(
                &rows.iter().map(|r| (*r).clone()).collect::<Vec<_>>(),
                report.cores,
            );
            let at: Vec<&Row> = rows.iter().copied().filter(|r| r.threads == t).collect();
            let series: Vec<Series> = at
                .iter()
                .map(|r| Series {
                    name: r.variant.clone(),
                    points: r
                        .samples
                        .iter()
                        .map(|s| (s.t_ms / 1000.0, s.total))
                        .collect(),
                })
                .collect();
            let p = dir.join("stat-degrade-timeline.svg");
            if line_chart(
                &p,
                &format!(
                    "stat-degrade timeline, {t} threads (intruder lists the dir every 100 ms)"
                ),
                "seconds",
                "total ops/s per sample",
                &series,
                false,
            )? {
                written.push(p);
            }
        }
    }
    Ok(written)
}

fn thread_series(rows: &[&Row]) -> Vec<Series> {
    variants_of(rows)
        .into_iter()
        .map(|v| {
            let mut points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.variant == v)
                .map(|r| (r.threads as f64, r.ops_per_sec))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                name: v.to_string(),
                points,
            }
        })
        .collect()
}

/// The generated `README.md` next to the plots.
pub fn readme(report: &Report, plots: &[PathBuf]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# scalevfs bench report\n");
    let _ = writeln!(
        s,
        "Generated by `{}` on {} ({}), commit {}.\n",
        report.command, report.machine, report.date, report.commit
    );
    s.push_str(
        "## Files\n\n\
- `report.json`: every row and every sample (schema `scalevfs-bench/1`, described below).\n\
- `summary.md`: the table printed at the end of the run.\n\
- `<workload>.svg`: throughput (median ops/s over the measured samples) against the\n  number of worker threads, one line per variant. A line that rises with threads scales;\n  a flat or falling one serialises on something shared.\n\
- `depth.svg`: nanoseconds per stat against path depth at 1 thread, scalevfs (with\n  and without a submount on the path) and the peers, log scale. Lower is better.\n\
- `depth-8-threads.svg`: stat throughput at depth 8 against threads.\n\
- `stat-degrade-timeline.svg`: per-sample total ops/s over time for each stat-degrade\n  variant. Under `lockref` with a locking readdir, one listing can tip every\n  worker into the locked path and the line falls and stays down (the cascade of\n  seed 001); `lockref-wait` stays up; the default readdir takes no dentry locks at all.\n\n",
    );
    s.push_str(
        "## How to read the numbers\n\n\
- Every configuration runs its workers released together; each counts its own\n  iterations; a sampler records `min:… max:… total:…` per period (per-second rates).\n  The warm-up is not counted; the headline number is the median sample.\n\
- Variants of one workload run in the same process, alternated A B A B, so drift\n  hits all of them; `vs before` is the ratio to the variant the seed compared\n  against (marked `(before)`), at the same thread count. `*` marks what a user gets\n  by default.\n\
- `scaling` is ops/s at N threads over ops/s of the same variant at 1 thread. On a\n  2-core machine 2 is the ceiling; the oversubscribed point (2x cores) shows\n  whether a design collapses when lock holders get preempted.\n\
- Hardware-independent columns, from the built-in per-thread counters\n  (`scalevfs_sync::lockstat`), per operation over the measured window:\n  - `shared_writes_per_op`: successful writes/RMWs of shared synchronisation\n    words (LockRef CAS, lock acquire/release, sequence bumps). The goal for\n    commuting operations (stat, access, fstat, lseek of own fd, pread) is 0.\n    Reference counts kept in `Arc`s and std locks are not instrumented, so a 0\n    here is a lower bound.\n\
  - `lockref_fallback_ratio`: share of LockRef operations that took the spinlock\n    (0 when none ran).\n\
  - `seq_retries_per_op`: sequence-counter read retries per op.\n\
  - `walk`: lock-free walks handled / handed over to ref-walk (partial) /\n    aborted and restarted, per op.\n\
  Peers have no counters: their columns are null.\n\n",
    );
    if !plots.is_empty() {
        let _ = writeln!(s, "## Plots\n");
        for p in plots {
            if let Some(n) = p.file_name().and_then(|n| n.to_str()) {
                let _ = writeln!(s, "![{n}]({n})\n");
            }
        }
    }
    s
}
