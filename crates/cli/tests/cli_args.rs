//! Out-of-range numbers on the command line are usage errors (exit 2, a
//! message naming the value), never a panic (exit 101): a duration past
//! what `Duration` holds panicked in `from_secs_f64`, `--rounds 2^32`
//! divided by zero, and `--threads 0` ran nothing and reported success.

use std::process::Command;

fn scalevfs(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_scalevfs"))
        .args(args)
        .output()
        .expect("run scalevfs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn out_of_range_numbers_are_usage_errors() {
    for args in [
        &["bench", "--list", "--duration", "1e30"][..],
        &["stats", "--duration", "1e300"],
        &["bench", "--list", "--rounds", "4294967296"],
        &["bench", "--list", "--rounds", "0"],
        &["bench", "--list", "--threads", "0"],
        &["bench", "--list", "--threads", "1,0"],
        &["bench-fuse", "--threads", "0"],
        &["stats", "--threads", "100000"],
    ] {
        let (code, err) = scalevfs(args);
        assert_eq!(code, 2, "{args:?}: exit {code}, stderr: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(err.contains("invalid value"), "{args:?}: {err}");
    }
    // In range, the same arguments are taken.
    let (code, err) = scalevfs(&["bench", "--list", "--threads", "1,2", "--rounds", "3"]);
    assert_eq!(code, 0, "{err}");
}

/// `mount --stats` without `--foreground` printed nothing (the detached
/// daemon's stderr is /dev/null) and still mounted: now a usage error,
/// refused before anything is checked or mounted. The mount point does not
/// exist, so a regression fails on it (exit 1) and never mounts.
#[test]
fn mount_stats_needs_foreground() {
    let dir = std::env::temp_dir().join(format!("scalevfs-no-such-dir-{}", std::process::id()));
    let d = dir.to_str().unwrap();
    let (code, err) = scalevfs(&["mount", d, "--stats"]);
    assert_eq!(code, 2, "exit {code}, stderr: {err}");
    assert!(err.contains("--stats needs --foreground"), "stderr: {err}");
    // With -f the same arguments get past the check (to the missing mount
    // point).
    let (code, err) = scalevfs(&["mount", d, "--stats", "-f"]);
    assert_eq!(code, 1, "exit {code}, stderr: {err}");
    assert!(!err.contains("--stats"), "stderr: {err}");
}
