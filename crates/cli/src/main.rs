//! `scalevfs`: the command-line front end.
//!
//! - `scalevfs bench [WORKLOAD...]`: the benchmark suite (see
//!   `shared/BENCHMARKS.md`); `scalevfs bench --list` lists workloads and
//!   variants.
//! - `scalevfs bench commute`: the Commuter-style conflict matrix (build
//!   with `--features trace-lines`; `crates/bench/src/commute.rs`).
//! - `scalevfs mount DIR`: serve a scalevfs filesystem through FUSE
//!   (`crates/fuse`).
//! - `scalevfs mkfs IMAGE --size SIZE`: make an empty ext4 image file.
//! - `scalevfs stats`: run a short built-in workload and print the built-in
//!   contention counters (DESIGN section 6).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

mod alloc;
mod mkfs;
mod mount;
use scalevfs_bench::{report, workloads, Options};

#[derive(Parser, Debug)]
#[command(
    name = "scalevfs",
    version,
    about = "A multicore-scalable userspace VFS: benchmarks and tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the benchmark suite: tables on stdout, report.json and SVG plots.
    Bench(BenchArgs),
    /// Run a short workload and print the lock/LockRef/walk counters.
    Stats(StatsArgs),
    /// Serve a scalevfs filesystem at DIR through FUSE.
    Mount(mount::MountArgs),
    /// Make an empty ext4 image file (as mke2fs -t ext4).
    Mkfs(mkfs::MkfsArgs),
    /// Tree workloads (untar-like create, find+stat, read back, delete) on
    /// ext4 images and memfs: the library, the FUSE mount, fuse2fs and the
    /// kernel's ext4 side by side.
    BenchTree(TreeArgs),
    /// Single operations through FUSE (stat, open+close, read 4 KiB,
    /// create+close+unlink, readdir): scalevfs's mount, bindfs over tmpfs
    /// and tmpfs itself, caches on and off, 1 and 2 client threads.
    BenchFuse(FuseArgs),
    /// Durability on ext4: fsync-heavy creates (group commit, fsyncs per
    /// commit) and creat+close+unlink (orphan file vs list vs none), the library,
    /// the FUSE mount, fuse2fs and the kernel's ext4 side by side.
    BenchFsync(FsyncArgs),
}

#[derive(Args, Debug)]
struct FsyncArgs {
    /// Thread counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2", value_parser = parse_threads)]
    threads: Vec<usize>,
    /// Seconds measured per configuration.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Workloads, comma-separated (default: all): fsync, nofsync,
    /// creat-clo, randwrite, randread.
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// Targets, comma-separated (default: all): lib-ext4, lib-ext4-pwrite, lib-ext4-list,
    /// lib-ext4-none, lib-ext4-1ms, lib-ext4-mmap,
    /// fuse-ext4, fuse2fs, kernel.
    #[arg(long, value_delimiter = ',')]
    targets: Vec<String>,
    /// Size of each ext4 image, MiB.
    #[arg(long, default_value_t = 512)]
    image_mib: u64,
    /// Work directory for images and mount points (default: in /dev/shm).
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Directory for fsync.json and fsync.md.
    #[arg(long, default_value = "bench-report")]
    report_dir: PathBuf,
}

#[derive(Args, Debug)]
struct FuseArgs {
    /// Client thread counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2", value_parser = parse_threads)]
    threads: Vec<usize>,
    /// Rounds (every case once per round, targets interleaved); the table
    /// gives medians.
    #[arg(long, default_value_t = 5, value_parser = parse_rounds)]
    rounds: usize,
    /// Operations per thread per case (readdir: this / 1000, at least 3).
    #[arg(long, default_value_t = 20_000)]
    iters: usize,
    /// Entries of the directory that `readdir` lists.
    #[arg(long, default_value_t = 10_000)]
    entries: usize,
    /// Work directory for the mount points.
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Directory for fuse.json and fuse.md.
    #[arg(long, default_value = "bench-report")]
    report_dir: PathBuf,
}

#[derive(Args, Debug)]
struct TreeArgs {
    /// Files in the tree.
    #[arg(long, default_value_t = 20_000)]
    files: usize,
    /// Directories the files are spread over.
    #[arg(long, default_value_t = 200)]
    dirs: usize,
    /// Thread counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2", value_parser = parse_threads)]
    threads: Vec<usize>,
    /// Targets, comma-separated (default: all): lib-memfs, lib-ext4,
    /// lib-ext4-mmap, fuse-memfs, fuse-ext4, fuse2fs, kernel, tmpfs.
    #[arg(long, value_delimiter = ',')]
    targets: Vec<String>,
    /// Size of each ext4 image, MiB.
    #[arg(long, default_value_t = 1024)]
    image_mib: u64,
    /// Work directory for images and mount points (default: in /dev/shm).
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Directory for tree.json and tree.md.
    #[arg(long, default_value = "bench-report")]
    report_dir: PathBuf,
    /// An extra argument for `scalevfs mount` in the fuse-memfs and
    /// fuse-ext4 targets (repeatable), e.g. `--mount-arg=--attr-timeout=1`.
    #[arg(long = "mount-arg", allow_hyphen_values = true)]
    mount_args: Vec<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if !(v > 0.0 && v.is_finite()) {
        return Err(format!("{s:?}: must be a positive number of seconds"));
    }
    // At most a year: longer is a typo (and past u64 seconds, a panic in
    // Duration::from_secs_f64).
    if v > 365.0 * 86400.0 {
        return Err(format!("{s:?}: more than a year"));
    }
    Duration::try_from_secs_f64(v).map_err(|e| format!("{s:?}: {e}"))
}

/// A thread count: 1..=1024, as `bench-tree` and `bench-fsync` check.
fn parse_threads(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        Ok(_) => Err(format!("{s:?}: thread counts must be 1..=1024")),
        Err(e) => Err(format!("{s:?}: {e}")),
    }
}

/// A count of rounds: 1..=100,000.
fn parse_rounds(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=100_000).contains(&n) => Ok(n),
        Ok(_) => Err(format!("{s:?}: rounds must be 1..=100000")),
        Err(e) => Err(format!("{s:?}: {e}")),
    }
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// Workloads to run (ids from --list; `wis-fs` = the whole will-it-scale
    /// set; `open1` = `wis-fs/open1`). Default: all.
    workloads: Vec<String>,
    /// List workloads and variants and exit.
    #[arg(long)]
    list: bool,
    /// Thread counts, comma-separated. Default: 1..=cores plus 2x cores.
    #[arg(long, value_delimiter = ',', value_parser = parse_threads)]
    threads: Vec<usize>,
    /// Measured seconds per configuration (over all rounds; default 0.4).
    /// Timeline workloads (stat-degrade) run at least 2 s per variant.
    /// `bench commute`: the Linux row's time per case (default 0.2).
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Alternated rounds per configuration (A B A B ...).
    #[arg(long, default_value_t = scalevfs_bench::DEFAULT_ROUNDS, value_parser = parse_rounds)]
    rounds: usize,
    /// Only these variants (names from --list), comma-separated or repeated.
    #[arg(long, value_delimiter = ',')]
    variant: Vec<String>,
    /// Where to write report.json (default: <report-dir>/report.json).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Directory for report.json, summary.md, SVG plots and README.md.
    #[arg(long, default_value = "bench-report")]
    report_dir: PathBuf,
    /// `bench commute`: skip the Linux row.
    #[arg(long)]
    no_linux: bool,
    /// `bench commute`: only pairs of these operations, comma-separated.
    #[arg(long, value_delimiter = ',')]
    ops: Vec<String>,
    /// Also run the peers (Rust `vfs` MemoryFS, host tmpfs) where a workload has them.
    #[arg(long)]
    peers: bool,
    /// No progress bar and no per-sample lines (CI).
    #[arg(long, short)]
    quiet: bool,
    /// Count shared-line writes per op instead of timing (the counting
    /// build, `--features trace-lines`): each write whose cache line another
    /// worker used last, with the lines behind them. Threads default to 2;
    /// writes <report-dir>/traced.md.
    #[arg(long)]
    traced: bool,
}

#[derive(Args, Debug)]
struct StatsArgs {
    /// Workload to run (default: stat-degrade, which exercises LockRefs,
    /// dentry locks and the walk).
    #[arg(default_value = "stat-degrade")]
    workload: String,
    /// Variant (default: the workload's first, its "before" variant).
    #[arg(long)]
    variant: Option<String>,
    /// Worker threads (default: cores).
    #[arg(long, value_parser = parse_threads)]
    threads: Option<usize>,
    /// Measured seconds.
    #[arg(long, value_parser = parse_duration, default_value = "1")]
    duration: Duration,
}

fn list() {
    // A closed pipe (`| head`) ends the listing quietly.
    let _ = write_list(&mut std::io::stdout().lock());
}

fn write_list(out: &mut dyn Write) -> std::io::Result<()> {
    for w in workloads::all() {
        writeln!(out, "{:<16} {}", w.id, w.description)?;
        writeln!(out, "{:<16} origin: {}", "", w.origin)?;
        if !w.depths.is_empty() {
            let d: Vec<String> = w.depths.iter().map(|d| d.to_string()).collect();
            writeln!(out, "{:<16} depths: {}", "", d.join(", "))?;
        }
        for v in w.all_variants(true) {
            let mut tags = Vec::new();
            if v.is_default {
                tags.push("default".to_string());
            }
            if v.is_before {
                tags.push("before".to_string());
            }
            if v.peer.is_some() {
                tags.push("peer, --peers".to_string());
            }
            let settings: Vec<String> =
                v.settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
            writeln!(
                out,
                "{:<16}   {:<30} {}{}",
                "",
                v.name,
                settings.join(" "),
                if tags.is_empty() {
                    String::new()
                } else {
                    format!(" [{}]", tags.join(", "))
                }
            )?;
        }
    }
    // Not in `workloads::all()`: `bench` runs it only when named alone.
    writeln!(
        out,
        "{:<16} Commuter-style conflict matrix of operation pairs (needs the \
         counting build: --features trace-lines; not run by default)",
        "commute"
    )?;
    Ok(())
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("scalevfs {}", args.join(" "))
}

fn bench(a: BenchArgs) -> Result<(), String> {
    if a.list {
        list();
        return Ok(());
    }
    if a.workloads.len() == 1 && a.workloads[0] == "commute" {
        return commute(a);
    }
    let opts = Options {
        workloads: a.workloads,
        threads: a.threads,
        duration: a.duration.unwrap_or(scalevfs_bench::DEFAULT_DURATION),
        rounds: a.rounds.max(1),
        variants: a.variant,
        peers: a.peers,
        quiet: a.quiet,
        ..Options::default()
    };
    if a.traced {
        let rows = scalevfs_bench::traced::run(&opts)?;
        let text = scalevfs_bench::traced::render(&rows, &command_line());
        print!("{text}");
        std::fs::create_dir_all(&a.report_dir)
            .and_then(|()| std::fs::write(a.report_dir.join("traced.md"), &text))
            .map_err(|e| format!("{}: {e}", a.report_dir.display()))?;
        return Ok(());
    }
    let out = scalevfs_bench::run(&opts)?;
    let report = scalevfs_bench::make_report(&opts, out, command_line());
    print!("{}", report.render());
    let files = scalevfs_bench::write_report(&report, &a.report_dir, a.json.as_deref())?;
    if !a.quiet {
        eprintln!("wrote {} files to {}", files.len(), a.report_dir.display());
    }
    Ok(())
}

/// `scalevfs bench commute`: the conflict matrix (needs `--features
/// trace-lines`), written to the report directory.
fn commute(a: BenchArgs) -> Result<(), String> {
    use scalevfs_bench::commute;
    let ops = a
        .ops
        .iter()
        .map(|o| commute::Op::parse(o).ok_or_else(|| format!("unknown operation {o}")))
        .collect::<Result<Vec<_>, _>>()?;
    let opts = commute::CommuteOptions {
        duration: if a.no_linux {
            Duration::ZERO
        } else {
            a.duration.unwrap_or(commute::DEFAULT_DURATION)
        },
        ops,
        quiet: a.quiet,
    };
    let m = commute::run(&opts, command_line())?;
    print!("{}", m.markdown());
    let files = m.write(&a.report_dir)?;
    if !a.quiet {
        eprintln!("wrote {} files to {}", files.len(), a.report_dir.display());
    }
    Ok(())
}

fn stats(a: StatsArgs) -> Result<(), String> {
    let ws = workloads::select(std::slice::from_ref(&a.workload))?;
    let w = ws.first().ok_or("no workload")?;
    let variant = match &a.variant {
        Some(v) => v.clone(),
        None => w
            .variants
            .first()
            .map(|v| v.name.clone())
            .ok_or("workload has no variant")?,
    };
    let threads = a.threads.unwrap_or_else(report::cores).max(1);
    let opts = Options {
        workloads: vec![w.id.to_string()],
        threads: vec![threads],
        duration: a.duration,
        rounds: 1,
        variants: vec![variant.clone()],
        peers: false,
        quiet: true,
        timeline_min: a.duration,
    };
    let out = scalevfs_bench::run(&opts)?;
    if let Some(s) = out.skipped.first() {
        return Err(format!("{} [{}]: {}", s.workload, s.variant, s.error));
    }
    for m in &out.measured {
        let row = m.row();
        let depth = m.depth.map(|d| format!(" depth {d}")).unwrap_or_default();
        println!(
            "{} [{}]{depth}, {} threads, {:.2} s: {} ops, {} ops/s (median), {:.1} ns/op per thread",
            m.workload,
            m.variant.name,
            m.threads,
            m.result.secs,
            m.result.ops,
            report::si(row.ops_per_sec),
            row.ns_per_op
        );
        println!(
            "per op: shared-line writes {:.3}, LockRef fallback {:.2}%, seq retries {:.4}\n",
            row.shared_writes_per_op.unwrap_or(0.0),
            100.0 * row.lockref_fallback_ratio.unwrap_or(0.0),
            row.seq_retries_per_op.unwrap_or(0.0)
        );
        print!("{}", m.result.counters);
        println!();
    }
    Ok(())
}

fn bench_tree(a: TreeArgs) -> Result<(), String> {
    use scalevfs_bench::tree;
    let workdir = a
        .workdir
        .unwrap_or_else(|| PathBuf::from(format!("/dev/shm/scalevfs-tree-{}", std::process::id())));
    let image_size = tree::image_size(a.image_mib, &workdir)?;
    let opts = tree::TreeOptions {
        files: a.files,
        dirs: a.dirs,
        threads: a.threads,
        targets: if a.targets.is_empty() {
            tree::TARGETS.iter().map(|s| s.to_string()).collect()
        } else {
            a.targets
        },
        image_size,
        workdir,
        bin: std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?,
        mount_args: a.mount_args,
        seed: 1,
    };
    let rep = tree::run(&opts, &mut |s| eprintln!("bench-tree: {s}"))?;
    write_report(&a.report_dir, "tree", &rep, &tree::markdown(&rep))
}

fn bench_fsync(a: FsyncArgs) -> Result<(), String> {
    use scalevfs_bench::{durable, tree};
    let workdir = a.workdir.unwrap_or_else(|| {
        PathBuf::from(format!("/dev/shm/scalevfs-fsync-{}", std::process::id()))
    });
    let image_size = tree::image_size(a.image_mib, &workdir)?;
    let all = |v: Vec<String>, d: &[&str]| {
        if v.is_empty() {
            d.iter().map(|s| s.to_string()).collect()
        } else {
            v
        }
    };
    let opts = durable::DurableOptions {
        threads: a.threads,
        seconds: a.seconds,
        targets: all(a.targets, durable::TARGETS),
        workloads: all(a.workloads, durable::WORKLOADS),
        image_size,
        workdir,
        bin: std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?,
    };
    let rep = durable::run(&opts, &mut |s| eprintln!("bench-fsync: {s}"))?;
    write_report(&a.report_dir, "fsync", &rep, &durable::markdown(&rep))
}

/// Print `md` and write `<name>.json` (`rep`) and `<name>.md` into `dir`.
fn write_report(
    dir: &std::path::Path,
    name: &str,
    rep: &impl serde::Serialize,
    md: &str,
) -> Result<(), String> {
    print!("{md}");
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let json = serde_json::to_string_pretty(rep).map_err(|e| e.to_string())?;
    for (ext, body) in [("json", json.as_str()), ("md", md)] {
        let p = dir.join(format!("{name}.{ext}"));
        std::fs::write(&p, body).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

fn bench_fuse(a: FuseArgs) -> Result<(), String> {
    use scalevfs_bench::fuseops;
    let opts = fuseops::FuseOpsOptions {
        bin: std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?,
        threads: a.threads.clone(),
        rounds: a.rounds,
        entries: a.entries,
        iters: a.iters,
        workdir: a.workdir.unwrap_or_else(|| {
            PathBuf::from(format!("/tmp/scalevfs-bench-fuse-{}", std::process::id()))
        }),
    };
    let rep = fuseops::run(&opts, &mut |s| eprintln!("bench-fuse: {s}"))?;
    write_report(
        &a.report_dir,
        "fuse",
        &rep,
        &fuseops::markdown(&rep, &a.threads),
    )
}

fn main() -> ExitCode {
    scalevfs_bench::set_allocator(alloc::name());
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Mount(a) => return mount::run(a),
        Command::Bench(a) => bench(a),
        Command::Stats(a) => stats(a),
        Command::BenchTree(a) => bench_tree(a),
        Command::BenchFsync(a) => bench_fsync(a),
        Command::BenchFuse(a) => bench_fuse(a),
        Command::Mkfs(a) => mkfs::run(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scalevfs: {e}");
            ExitCode::FAILURE
        }
    }
}
