//! Figures for the FUSE front end: single-client ops/s of stat, open+close,
//! create+unlink, 4 KiB pread and 4 KiB pwrite, on the host's tmpfs, through
//! a scalevfs mount, and through a `bindfs` mount of a tmpfs directory,
//! with the kernel's attribute/entry caching off (timeouts 0) and on (1 s).
//!
//!     cargo run --release -p scalevfs-fuse --example fuse_bench [SECONDS]
//!
//! Needs root (or fusermount3), /dev/fuse and, for the bindfs column,
//! `bindfs` on PATH (apt bindfs); a missing peer is reported as "-".
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use scalevfs::Vfs;
use scalevfs_fuse::{spawn_mount, FuseConfig, MountConfig};

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().to_str().unwrap()).unwrap()
}

/// Run `op` repeatedly for `secs`; ops per second.
fn rate(secs: f64, mut op: impl FnMut()) -> f64 {
    for _ in 0..200 {
        op();
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        for _ in 0..100 {
            op();
        }
        n += 100;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

const OPS: [&str; 5] = [
    "stat",
    "open+close",
    "create+unlink",
    "read 4 KiB",
    "write 4 KiB",
];

fn run_all(dir: &Path, secs: f64) -> Vec<f64> {
    let f = dir.join("bench-file");
    std::fs::write(&f, vec![7u8; 1 << 16]).unwrap();
    let fc = c(&f);
    let xc = c(&dir.join("bench-new"));
    let mut st: libc::stat = unsafe_zeroed();
    let mut buf = vec![0u8; 4096];
    let mut out = Vec::new();
    // SAFETY: a valid NUL-terminated path and a live stat buffer.
    out.push(rate(secs, || unsafe {
        libc::stat(fc.as_ptr(), &mut st);
    }));
    // SAFETY: a valid path; the fd opened is closed at once.
    out.push(rate(secs, || unsafe {
        let fd = libc::open(fc.as_ptr(), libc::O_RDONLY);
        libc::close(fd);
    }));
    // SAFETY: as above.
    out.push(rate(secs, || unsafe {
        let fd = libc::open(xc.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
        libc::close(fd);
        libc::unlink(xc.as_ptr());
    }));
    // SAFETY: as above.
    let fd = unsafe { libc::open(fc.as_ptr(), libc::O_RDWR) };
    // SAFETY: our fd and a live 4 KiB buffer.
    out.push(rate(secs, || unsafe {
        libc::pread(fd, buf.as_mut_ptr().cast(), 4096, 0);
    }));
    // SAFETY: as above.
    out.push(rate(secs, || unsafe {
        libc::pwrite(fd, buf.as_ptr().cast(), 4096, 4096);
    }));
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
    let _ = std::fs::remove_file(&f);
    out
}

fn unsafe_zeroed() -> libc::stat {
    // SAFETY: struct stat is plain data.
    unsafe { std::mem::zeroed() }
}

fn wait_mounted(dir: &Path) -> bool {
    for _ in 0..100 {
        if Command::new("mountpoint")
            .arg("-q")
            .arg(dir)
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn scalevfs_col(base: &Path, caching: bool, secs: f64) -> Option<Vec<f64>> {
    let dir = base.join(if caching { "svfs-on" } else { "svfs-off" });
    std::fs::create_dir_all(&dir).ok()?;
    let t = if caching {
        Duration::from_secs(1)
    } else {
        Duration::ZERO
    };
    let fuse = FuseConfig {
        attr_timeout: t,
        entry_timeout: t,
        ..FuseConfig::default()
    };
    let cfg = MountConfig {
        fuse,
        options: vec![],
        threads: 4,
    };
    let m = spawn_mount(Vfs::new(), &dir, &cfg)
        .map_err(|e| eprintln!("scalevfs mount: {e}"))
        .ok()?;
    let r = run_all(&dir, secs);
    let _ = m.unmount();
    Some(r)
}

fn bindfs_col(base: &Path, tmpfs: &Path, caching: bool, secs: f64) -> Option<Vec<f64>> {
    let src = tmpfs.join(if caching { "bindsrc-on" } else { "bindsrc-off" });
    let dir = base.join(if caching { "bindfs-on" } else { "bindfs-off" });
    std::fs::create_dir_all(&src).ok()?;
    std::fs::create_dir_all(&dir).ok()?;
    let t = if caching { "1" } else { "0" };
    let st = Command::new("bindfs")
        .arg("--multithreaded")
        .arg("-o")
        .arg(format!("attr_timeout={t},entry_timeout={t}"))
        .arg(&src)
        .arg(&dir)
        .status()
        .ok()?;
    if !st.success() || !wait_mounted(&dir) {
        eprintln!("bindfs failed");
        return None;
    }
    let r = run_all(&dir, secs);
    let _ = Command::new("fusermount3").arg("-u").arg(&dir).status();
    let _ = std::fs::remove_dir(&src);
    Some(r)
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.5);
    let base = std::env::temp_dir().join(format!("scalevfs-fuse-bench-{}", std::process::id()));
    let tmpfs = PathBuf::from(format!(
        "/dev/shm/scalevfs-fuse-bench-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&base).unwrap();
    std::fs::create_dir_all(&tmpfs).unwrap();
    let cols: Vec<(&str, Option<Vec<f64>>)> = vec![
        ("tmpfs", Some(run_all(&tmpfs, secs))),
        ("scalevfs off", scalevfs_col(&base, false, secs)),
        ("bindfs off", bindfs_col(&base, &tmpfs, false, secs)),
        ("scalevfs on", scalevfs_col(&base, true, secs)),
        ("bindfs on", bindfs_col(&base, &tmpfs, true, secs)),
    ];
    println!("ops/s, one client thread, {secs} s per cell; off/on = attribute+entry caching (timeouts 0 / 1 s)\n");
    print!("| {:<14}", "operation");
    for (name, _) in &cols {
        print!(" | {name:>12}");
    }
    println!(" |");
    print!("|{:-<16}", "");
    for _ in &cols {
        print!("|{:->14}", "");
    }
    println!("|");
    for (i, op) in OPS.iter().enumerate() {
        print!("| {op:<14}");
        for (_, v) in &cols {
            match v {
                Some(v) => print!(" | {:>12.0}", v[i]),
                None => print!(" | {:>12}", "-"),
            }
        }
        println!(" |");
    }
    let _ = std::fs::remove_dir_all(&base);
    let _ = std::fs::remove_dir_all(&tmpfs);
}
