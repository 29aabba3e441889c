//! Stat one file at a given depth in a loop (for profilers):
//! `cargo run --release -p scalevfs --example stat_loop -- DEPTH ITERS`.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let depth: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100);
    let iters: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let vfs = scalevfs::Vfs::new();
    let t = vfs.root_task();
    let mut p = String::new();
    for i in 0..depth.saturating_sub(1) {
        p.push_str(&format!("/d{i}"));
        t.mkdir(&p, 0o755).unwrap();
    }
    p.push_str("/file");
    let fd = t
        .open(&p, scalevfs::O_CREAT | scalevfs::O_WRONLY, 0o644)
        .unwrap();
    t.close(fd).unwrap();
    for _ in 0..iters {
        std::hint::black_box(t.stat(&p).unwrap());
    }
}
