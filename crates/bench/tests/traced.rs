//! `bench --traced`: shared-line writes per operation, counted on running
//! workloads. The arithmetic in every build; the recorder itself in the
//! counting build (`cargo test -p scalevfs-bench --features trace-lines
//! --test traced`).

use scalevfs_bench::traced::{self, summarize};
use scalevfs_sync::trace::{Label, Lines};

/// Per-op figures: all writes and the moved ones summed over the workers,
/// divided by all their iterations; lines merged by label, most first.
#[test]
fn summary_divides_by_all_iterations() {
    let mut a = Lines {
        all_writes: 30,
        ..Default::default()
    };
    a.transfers.insert(0x40, (Label::Hint("parent"), 4));
    a.transfers.insert(0x80, (Label::Hint("index"), 1));
    let mut b = Lines {
        all_writes: 10,
        ..Default::default()
    };
    b.transfers.insert(0x40, (Label::Hint("parent"), 2));
    let r = summarize("w", "v", 2, &[(a, 6), (b, 4)]);
    assert_eq!(r.ops, 10);
    assert!((r.writes_per_op - 4.0).abs() < 1e-9, "{r:?}");
    assert!((r.shared_per_op - 0.7).abs() < 1e-9, "{r:?}");
    assert_eq!(r.top[0].0, "parent");
    assert!((r.top[0].1 - 0.6).abs() < 1e-9);
    assert_eq!(r.top[1].0, "index");
    let none = summarize("w", "v", 2, &[]);
    assert_eq!((none.ops, none.shared_per_op), (0, 0.0));
    let md = traced::render(&[r], "cmd");
    assert!(
        md.contains("| w | v | 2 | 10 | 4.00 | 0.70 | parent 0.60; index 0.10 |"),
        "{md}"
    );
}

/// On real workloads (one test: the recorder's ownership map is
/// process-wide): stats of different files move no line; mkdir+rmdir of
/// own names in one directory no longer move the parent dentry's count
/// (each new dentry's reference on its parent comes from its thread's
/// spares, `core/src/spares.rs`: one shared write per batch of 32 at most;
/// the `counted-parent` variant, which takes it on the parent's count, is
/// checked to show that line)
/// nor the parent's attribute record (the link count is counted beside the
/// index lists, the times are written once per clock tick), and stay under
/// issue 16's goal of 2 shared writes per op. How often a line moves
/// depends on how the two workers interleave, which a loaded machine
/// coarsens, so only loose bounds are checked.
#[cfg(feature = "trace-lines")]
#[test]
fn stat_and_mkdir_rmdir_move_no_parent_line() {
    let opts = scalevfs_bench::Options {
        workloads: vec!["stat1".into(), "mkdir-rmdir".into()],
        threads: vec![2],
        duration: std::time::Duration::from_millis(200),
        rounds: 1,
        quiet: true,
        ..Default::default()
    };
    let rows = traced::run(&opts).unwrap();
    let stat = rows.iter().find(|r| r.workload == "wis-fs/stat1").unwrap();
    assert!(stat.ops > 100, "{stat:?}");
    assert!(
        stat.writes_per_op > 0.5,
        "the recorder saw no write: {stat:?}"
    );
    assert!(stat.shared_per_op < 0.01, "{stat:?}");
    let row = |v: &str| {
        rows.iter()
            .find(|r| r.workload == "mkdir-rmdir" && r.variant == v)
            .unwrap()
    };
    // The "before" variant takes each reference on the parent's count: the
    // recorder sees the parent dentry's lines move (summed: under load the
    // moves split between its count and its lock word, 0.28 + 0.21 in one
    // CI run beside a benchmark, 0.17 + 0.13 beside two niced kernel
    // differentials, against about 2 on an idle machine; the "after"
    // variant below stays under 0.2 on every line).
    let counted = row("counted-parent");
    let parent: f64 = counted
        .top
        .iter()
        .filter(|(l, _)| l.contains("core/dcache.rs"))
        .map(|(_, n)| n)
        .sum();
    assert!(parent > 0.15, "{counted:?}");
    let mk = row("default");
    assert!(mk.ops > 100, "{mk:?}");
    assert!(mk.shared_per_op < 2.0, "{mk:?}");
    assert!(
        !mk.top.iter().any(|(l, n)| (l.contains("core/dcache.rs")
            || l.contains("lockref")
            || l.contains("core/inode.rs"))
            && *n > 0.2),
        "{mk:?}"
    );
}
