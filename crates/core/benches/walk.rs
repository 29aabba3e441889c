//! Micro benchmark: ns per stat by path depth, one thread, for the default
//! configuration and the "before" variants (reference walk, ref-taking stat).
//! Prints a table; run with `cargo bench -p scalevfs --bench walk`.

use std::time::Instant;

use scalevfs::{Vfs, VfsConfig};

fn path_of(depth: usize) -> String {
    let mut p = String::new();
    for i in 0..depth.saturating_sub(1) {
        p.push_str(&format!("/d{i}"));
    }
    p.push_str("/file");
    p
}

fn build(cfg: VfsConfig, depth: usize) -> (Vfs, String) {
    let vfs = Vfs::with_config(cfg);
    let t = vfs.root_task();
    let mut p = String::new();
    for i in 0..depth.saturating_sub(1) {
        p.push_str(&format!("/d{i}"));
        t.mkdir(&p, 0o755).unwrap();
    }
    let f = path_of(depth);
    let fd = t
        .open(&f, scalevfs::O_CREAT | scalevfs::O_WRONLY, 0o644)
        .unwrap();
    t.close(fd).unwrap();
    (vfs, f)
}

fn ns_per_stat(cfg: &VfsConfig, depth: usize) -> f64 {
    let (vfs, f) = build(cfg.clone(), depth);
    let t = vfs.root_task();
    let iters = (2_000_000 / depth.max(1)).max(20_000);
    for _ in 0..iters / 10 {
        t.stat(&f).unwrap();
    }
    let mut samples = Vec::new();
    for _ in 0..5 {
        let s = Instant::now();
        for _ in 0..iters {
            std::hint::black_box(t.stat(&f).unwrap());
        }
        samples.push(s.elapsed().as_nanos() as f64 / iters as f64);
    }
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    samples[2]
}

fn main() {
    let variants: Vec<(&str, VfsConfig)> = {
        let mut v = vec![("default", VfsConfig::default())];
        let mut c = VfsConfig::default();
        c.set("stat", "ref").unwrap();
        v.push(("stat=ref", c));
        let mut c = VfsConfig::default();
        c.set("walk", "ref").unwrap();
        v.push(("walk=ref", c));
        let mut c = VfsConfig::default();
        c.set("index", "per-dir").unwrap();
        v.push(("index=per-dir", c));
        let mut c = VfsConfig::default();
        c.dcache.hash_bits = 10;
        v.push(("hash-bits=10", c));
        v
    };
    print!("{:>6}", "depth");
    for (n, _) in &variants {
        print!(" {:>14}", n);
    }
    println!("   (ns per stat, median of 5, 1 thread)");
    for depth in [1usize, 2, 3, 8, 64, 100] {
        print!("{depth:>6}");
        for (_, c) in &variants {
            print!(" {:>14.1}", ns_per_stat(c, depth));
        }
        println!();
    }
}
