//! The `scalevfs` binary's allocator switch (`src/alloc.rs`): mimalloc by
//! default, the C library's malloc with `SCALEVFS_ALLOC=system`, and the
//! reports say which one ran.

use std::process::Command;

/// Run a tiny benchmark; return (stdout, report.json's "allocator").
fn run(env: Option<&str>) -> (String, String) {
    let dir = std::env::temp_dir().join(format!(
        "scalevfs-alloc-test-{}-{}",
        std::process::id(),
        env.unwrap_or("default")
    ));
    let mut c = Command::new(env!("CARGO_BIN_EXE_scalevfs"));
    c.args([
        "bench",
        "control",
        "creat-clo",
        "--threads",
        "1,2",
        "--duration",
        "0.05",
        "--rounds",
        "1",
        "-q",
    ])
    .arg("--report-dir")
    .arg(&dir);
    c.env_remove("SCALEVFS_ALLOC");
    if let Some(v) = env {
        c.env("SCALEVFS_ALLOC", v);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = std::fs::read_to_string(dir.join("report.json")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    (
        String::from_utf8(out.stdout).unwrap(),
        v["allocator"].as_str().unwrap_or("").to_string(),
    )
}

#[test]
fn default_is_mimalloc_and_reported() {
    let (stdout, alloc) = run(None);
    assert_eq!(alloc, "mimalloc");
    assert!(stdout.contains("allocator mimalloc"), "{stdout}");
    // Creates that free on other threads (epoch) ran to the end under it.
    assert!(stdout.contains("creat-clo"), "{stdout}");
}

#[test]
fn system_by_environment() {
    let (stdout, alloc) = run(Some("system"));
    assert_eq!(alloc, "system");
    assert!(stdout.contains("allocator system"), "{stdout}");
    // Anything else keeps the default.
    let (_, alloc) = run(Some("jemalloc"));
    assert_eq!(alloc, "mimalloc");
}
