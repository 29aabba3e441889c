//! Memory figures for the dcache (issue: "bytes per cached dentry+inode for
//! 1M files" and "the cache limit holds under 10M lookups of distinct
//! nonexistent names"). Prints a small table; run with
//! `cargo run --release -p scalevfs --example dcache_memory -- [FILES] [LOOKUPS]`.
use scalevfs::{MemFsOptions, Vfs, VfsConfig, O_CREAT, O_WRONLY};

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let files: usize = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let lookups: usize = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);

    let vfs = Vfs::new();
    let t = vfs.root_task();
    let before = rss_bytes();
    let per_dir = 1000;
    for d in 0..files.div_ceil(per_dir) {
        t.mkdir(&format!("/d{d}"), 0o755).unwrap();
        for f in 0..per_dir.min(files - d * per_dir) {
            let fd = t
                .open(&format!("/d{d}/file{f:06}"), O_CREAT | O_WRONLY, 0o644)
                .unwrap();
            t.close(fd).unwrap();
        }
    }
    vfs.flush_deferred();
    let after = rss_bytes();
    println!(
        "{files} files: {} cached dentries, RSS +{:.1} MiB, {:.0} bytes per file \
         (dentry + inode + memfs directory entry)",
        vfs.dcache().len(),
        (after - before) as f64 / (1 << 20) as f64,
        (after - before) as f64 / files as f64
    );
    drop(t);
    drop(vfs);

    let mut cfg = VfsConfig {
        memfs: MemFsOptions {
            authoritative: false,
            ..Default::default()
        },
        ..Default::default()
    };
    cfg.dcache.max_entries = 100_000;
    let vfs = Vfs::with_config(cfg);
    let t = vfs.root_task();
    t.mkdir("/dir", 0o755).unwrap();
    let mut max_len = 0;
    let mut max_neg = 0;
    let start = rss_bytes();
    for i in 0..lookups {
        let _ = t.stat(&format!("/dir/missing{i}"));
        if i % 10_000 == 0 {
            max_len = max_len.max(vfs.dcache().len());
            max_neg = max_neg.max(vfs.dcache().negative_len());
        }
    }
    println!(
        "{lookups} lookups of distinct missing names, max_entries 100000 (negative cap 25%): \
         peak cached {max_len}, peak negative {max_neg}, RSS change {:+.1} MiB",
        (rss_bytes() as f64 - start as f64) / (1 << 20) as f64
    );
}
