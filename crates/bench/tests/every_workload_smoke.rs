//! Every workload, every variant (and peer), 1 and 2 threads, a fraction of
//! a second each: each must produce samples and counters, or be skipped only
//! because the core does not offer that variant's setting yet. No speed is
//! asserted.

use std::time::Duration;

use scalevfs_bench::{run, workloads, Options};
use scalevfs_sync::lockstat::Stat;

#[test]
fn every_workload_produces_samples_and_counters() {
    let opts = Options {
        threads: vec![1, 2],
        duration: Duration::from_millis(40),
        rounds: 1,
        peers: true,
        quiet: true,
        timeline_min: Duration::from_millis(60),
        ..Options::default()
    };
    let out = run(&opts).expect("run");
    for s in &out.skipped {
        // Only a setting the core does not accept (yet) may skip a variant.
        assert!(
            s.error.contains("unknown") && s.error.starts_with("variant "),
            "{} [{}] t={} failed: {}",
            s.workload,
            s.variant,
            s.threads,
            s.error
        );
    }
    for w in workloads::all() {
        let depths = if w.depths.is_empty() {
            vec![None]
        } else {
            w.depths.iter().map(|d| Some(*d)).collect()
        };
        for v in w.all_variants(true) {
            for depth in &depths {
                for t in [1, 2] {
                    let m = out.measured.iter().find(|m| {
                        m.workload == w.id
                            && m.variant.name == v.name
                            && m.depth == *depth
                            && m.threads == t
                    });
                    let skipped = out.skipped.iter().any(|s| {
                        s.workload == w.id
                            && s.variant == v.name
                            && s.depth == *depth
                            && s.threads == t
                    });
                    let Some(m) = m else {
                        assert!(
                            skipped,
                            "{} [{}] depth {depth:?} t={t}: neither measured nor skipped",
                            w.id, v.name
                        );
                        continue;
                    };
                    let what = format!("{} [{}] depth {depth:?} t={t}", w.id, v.name);
                    assert!(!m.result.samples.is_empty(), "{what}: no samples");
                    assert!(m.result.ops > 0, "{what}: no iterations");
                    let row = m.row();
                    assert!(
                        row.ops_per_sec >= 0.0 && row.ns_per_op.is_finite(),
                        "{what}"
                    );
                    if v.peer.is_some() {
                        assert!(row.shared_writes_per_op.is_none());
                        continue;
                    }
                    assert!(
                        row.shared_writes_per_op.is_some() && row.seq_retries_per_op.is_some(),
                        "{what}"
                    );
                    let c = &m.result.counters;
                    // Ref-walk counts no walk outcome, but its dcache hits.
                    let walks = c.get(Stat::WalkHandled)
                        + c.get(Stat::WalkPartial)
                        + c.get(Stat::WalkAborted)
                        + c.get(Stat::DcacheHit);
                    let lockrefs = c.get(Stat::LockrefFast) + c.get(Stat::LockrefLocked);
                    match w.id {
                        "stat-same" | "stat-degrade" | "access-same" | "lookup-spread"
                        | "depth" | "wis-fs/stat1" | "wis-fs/stat2" | "wis-fs/access1"
                        | "wis-fs/access2" | "wis-fs/open1" | "wis-fs/open3" => {
                            assert!(walks > 0, "{what}: no walk counted: {c}")
                        }
                        "dget-parent" => {
                            assert!(lockrefs > 0, "{what}: no LockRef op counted: {c}")
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}
