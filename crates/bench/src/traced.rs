//! `scalevfs bench --traced`: shared-line writes per operation, counted on
//! the running workloads rather than estimated (the `trace-lines` build).
//!
//! BENCHMARKS.md defines them as the atomic writes to memory that another
//! thread also uses. The normal build's `shw/op` column (lockstat) counts
//! every write to a LockRef, spin lock or sequence count, whether another
//! thread ever sees that word or not (a new dentry's count is written by
//! the one thread that made it), so it is an upper bound. Here every worker
//! records the cache lines its atomics and locks use (`scalevfs_sync::trace`)
//! with ownership tracking on: a write is counted when the line's last user
//! was another worker, which is when the hardware has to move the line or
//! invalidate another core's copy. A line seen for the first time counts
//! as no one's (fresh memory, or left by the set-up). Memory that one
//! thread frees and another reuses counts when the second writes it: that
//! move is real.
//!
//! Not seen, as for the conflict matrix: plain (non-atomic) accesses and the
//! atomics of other crates (`Arc` counts, crossbeam's epoch and skip lists
//! except through memfs's hooks, the allocator). The recorder costs a mutex
//! per access, so these runs are for counting, never for timing.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::harness::{run_segment, TRACED, TRACING};
use crate::workloads;
use crate::Options;

/// One workload, variant and thread count, counted.
#[derive(Clone, Debug)]
pub struct TracedRow {
    pub workload: String,
    pub variant: String,
    pub threads: usize,
    /// Iterations of all workers.
    pub ops: u64,
    /// Every recorded write (atomic store or RMW, lock acquisition) per op.
    pub writes_per_op: f64,
    /// Writes that took their line from another worker, per op.
    pub shared_per_op: f64,
    /// The lines behind them (label, writes per op), most first.
    pub top: Vec<(String, f64)>,
}

/// Run the selected workloads (thread counts of 2 and more) with the line
/// recorder on.
pub fn run(opts: &Options) -> Result<Vec<TracedRow>, String> {
    if !scalevfs_sync::trace::ENABLED {
        return Err("`bench --traced` needs the counting build: \
             cargo build --release --features trace-lines -p scalevfs-cli"
            .into());
    }
    let threads: Vec<usize> = if opts.threads.is_empty() {
        vec![2]
    } else {
        opts.threads.iter().copied().filter(|&t| t >= 2).collect()
    };
    if threads.is_empty() {
        return Err("`bench --traced` counts what threads share: give 2 or more".into());
    }
    let mut rows = Vec::new();
    for w in workloads::select(&opts.workloads)? {
        if w.timeline {
            continue;
        }
        let variants: Vec<_> = w
            .all_variants(false)
            .into_iter()
            .filter(|v| opts.variants.is_empty() || opts.variants.contains(&v.name))
            .collect();
        for v in &variants {
            for &t in &threads {
                let inst = (w.setup)(v, w.depths.first().copied(), t)?;
                TRACED.lock().unwrap_or_else(|p| p.into_inner()).clear();
                scalevfs_sync::trace::track_transfers();
                // Relaxed: see TRACING (the segment's spawns order it).
                TRACING.store(true, std::sync::atomic::Ordering::Relaxed);
                let r = run_segment(&*inst, t, opts.segment_timing(), &mut |_| {});
                TRACING.store(false, std::sync::atomic::Ordering::Relaxed);
                scalevfs_sync::trace::stop_tracking_transfers();
                drop(inst);
                let recs = std::mem::take(&mut *TRACED.lock().unwrap_or_else(|p| p.into_inner()));
                r.map_err(|e| format!("{} [{}] threads={t}: {e}", w.id, v.name))?;
                rows.push(summarize(w.id, &v.name, t, &recs));
            }
        }
    }
    Ok(rows)
}

/// Fold the workers' recordings into one row.
pub fn summarize(
    workload: &str,
    variant: &str,
    threads: usize,
    recs: &[(scalevfs_sync::trace::Lines, u64)],
) -> TracedRow {
    let ops: u64 = recs.iter().map(|r| r.1).sum();
    let writes: u64 = recs.iter().map(|r| r.0.all_writes).sum();
    let mut by: BTreeMap<String, u64> = BTreeMap::new();
    let mut shared = 0u64;
    for (lines, _) in recs {
        for (label, n) in lines.transfers.values() {
            shared += n;
            *by.entry(label.to_string()).or_default() += n;
        }
    }
    let per = |n: u64| if ops == 0 { 0.0 } else { n as f64 / ops as f64 };
    let mut top: Vec<(String, f64)> = by.into_iter().map(|(k, n)| (k, per(n))).collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    top.truncate(5);
    TracedRow {
        workload: workload.to_string(),
        variant: variant.to_string(),
        threads,
        ops,
        writes_per_op: per(writes),
        shared_per_op: per(shared),
        top,
    }
}

/// The rows as a markdown table.
pub fn render(rows: &[TracedRow], command: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Shared-line writes per operation, traced\n");
    let _ = writeln!(s, "Command: `{command}`  ");
    let _ = writeln!(
        s,
        "Counted with the line recorder (trace-lines build): a write counts when its \
         cache line was last used by another worker thread. `writes/op`: every \
         recorded atomic write and lock acquisition. Lines behind them: writes per op.\n"
    );
    let _ = writeln!(
        s,
        "| workload | variant | threads | ops | writes/op | shared writes/op | lines behind them |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---|");
    for r in rows {
        let top: Vec<String> = r
            .top
            .iter()
            .filter(|(_, n)| *n >= 0.005)
            .map(|(l, n)| format!("{l} {n:.2}"))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} | {:.2} | {} |",
            r.workload,
            r.variant,
            r.threads,
            r.ops,
            r.writes_per_op,
            r.shared_per_op,
            if top.is_empty() {
                "—".to_string()
            } else {
                top.join("; ")
            }
        );
    }
    s
}
