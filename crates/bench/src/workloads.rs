//! Every workload of `shared/BENCHMARKS.md` with its variants.
//!
//! A [`Workload`] names its variants (each a list of `VfsConfig::set`
//! settings, one marked "before" — the historical design the seed measured
//! against — and one marked default) and a setup function that builds a
//! fresh namespace for one segment and returns an [`Instance`].
//!
//! Unless a workload says otherwise, workers are threads of one process
//! ([`Task::clone_thread`]: shared fd table and cwd) running as an
//! unprivileged user (uid 1000), so every directory on a walk really gets its
//! search-permission check.

use std::time::Duration;

use scalevfs::io::SEEK_SET;
use scalevfs::{
    Cred, Errno, MemFsOptions, Task, Vfs, VfsConfig, O_CREAT, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY,
    R_OK,
};

use crate::harness::{Instance, WorkerCtx};

/// A peer filesystem (see the `scalevfs-peers` crate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// The Rust `vfs` crate's MemoryFS.
    VfsMemoryFs,
    /// The host kernel's tmpfs through system calls.
    LinuxTmpfs,
}

impl Peer {
    /// Every peer.
    pub const ALL: [Peer; 2] = [Peer::VfsMemoryFs, Peer::LinuxTmpfs];
    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Peer::VfsMemoryFs => "vfs-memoryfs",
            Peer::LinuxTmpfs => "linux-tmpfs",
        }
    }
}

/// One configuration of a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variant {
    /// Name in reports (a peer's name for a peer).
    pub name: String,
    /// `VfsConfig::set` pairs applied to the default configuration.
    pub settings: Vec<(String, String)>,
    /// The historical design the seed compared against; ratios are vs this.
    pub is_before: bool,
    /// What a user gets without options.
    pub is_default: bool,
    /// Run on a peer instead of scalevfs.
    pub peer: Option<Peer>,
    /// depth: a second memfs mounted on the first directory of the path.
    pub submount: bool,
}

impl Variant {
    fn new(name: &str, settings: &[(&str, &str)]) -> Variant {
        Variant {
            name: name.into(),
            settings: settings
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            is_before: false,
            is_default: false,
            peer: None,
            submount: false,
        }
    }
    fn before(mut self) -> Variant {
        self.is_before = true;
        self
    }
    fn default_(mut self) -> Variant {
        self.is_default = true;
        self
    }
    /// The single variant of a workload that compares nothing.
    pub fn plain() -> Variant {
        Variant::new("default", &[]).default_()
    }
    /// A peer.
    pub fn peer(p: Peer) -> Variant {
        let mut v = Variant::new(p.name(), &[]);
        v.peer = Some(p);
        v
    }
}

/// Builds an instance for (variant, depth, threads).
pub type SetupFn = fn(&Variant, Option<u32>, usize) -> Result<Box<dyn Instance>, String>;

/// A workload: id (as in BENCHMARKS.md), its variants and its setup.
pub struct Workload {
    pub id: &'static str,
    /// Seed or origin.
    pub origin: &'static str,
    /// What one iteration does.
    pub description: &'static str,
    pub variants: Vec<Variant>,
    /// Peers this workload can run on with `--peers`.
    pub peers: bool,
    /// Path depths (the `depth` workload); empty for the others.
    pub depths: Vec<u32>,
    /// A timeline workload (stat-degrade): one long segment per variant
    /// instead of alternated short rounds.
    pub timeline: bool,
    pub setup: SetupFn,
}

impl std::fmt::Debug for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workload")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Workload {
    /// Variants to run: the scalevfs ones plus, with `peers`, the peers.
    pub fn all_variants(&self, peers: bool) -> Vec<Variant> {
        let mut v = self.variants.clone();
        if peers && self.peers {
            v.extend(Peer::ALL.iter().map(|p| Variant::peer(*p)));
        }
        v
    }
}

// ---------------------------------------------------------------------------
// Building blocks
// ---------------------------------------------------------------------------

/// An instance made of shared state and a worker body.
struct FnInstance<S, W> {
    state: S,
    body: W,
}

impl<S, W> Instance for FnInstance<S, W>
where
    S: Sync,
    W: Fn(&S, &WorkerCtx<'_>) -> Result<(), String> + Sync,
{
    fn worker(&self, ctx: &WorkerCtx<'_>) -> Result<(), String> {
        (self.body)(&self.state, ctx)
    }
}

fn instance<S, W>(state: S, body: W) -> Box<dyn Instance>
where
    S: Sync + 'static,
    W: Fn(&S, &WorkerCtx<'_>) -> Result<(), String> + Sync + 'static,
{
    Box::new(FnInstance { state, body })
}

/// The uid/gid the workers run as.
pub const BENCH_UID: u32 = 1000;

fn err<'a>(what: &str, path: &'a str) -> impl Fn(Errno) -> String + 'a {
    let what = what.to_owned();
    move |e| format!("{what} {path}: {e}")
}

/// A `Vfs` with the variant's settings applied to the defaults. An unknown
/// key or value (a variant the core does not offer yet) is a clean error.
pub fn make_vfs(v: &Variant) -> Result<Vfs, String> {
    let mut c = VfsConfig::default();
    for (k, val) in &v.settings {
        c.set(k, val)
            .map_err(|e| format!("variant {}: {k}={val}: {e}", v.name))?;
    }
    Ok(Vfs::with_config(c))
}

/// The namespace of one segment: the Vfs, a root task for setup and a user
/// task the workers clone.
struct Ns {
    root: Task,
    user: Task,
}

impl Ns {
    fn new(v: &Variant) -> Result<Ns, String> {
        let vfs = make_vfs(v)?;
        let root = vfs.root_task();
        let user = vfs.task(Cred::user(BENCH_UID, BENCH_UID));
        Ok(Ns { root, user })
    }

    /// mkdir -p with mode 0755 (root-owned).
    fn mkdirs(&self, path: &str) -> Result<(), String> {
        let mut cur = String::new();
        for c in path.split('/').filter(|c| !c.is_empty()) {
            cur.push('/');
            cur.push_str(c);
            match self.root.mkdir(&cur, 0o755) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(format!("mkdir {cur}: {e}")),
            }
        }
        Ok(())
    }

    /// A directory every worker may create files in (mode 01777).
    fn tmpdir(&self, path: &str) -> Result<(), String> {
        self.mkdirs(path)?;
        self.root.chmod(path, 0o1777).map_err(err("chmod", path))
    }

    /// A regular file of `size` bytes owned by the bench user, mode 0644.
    fn file(&self, path: &str, size: usize) -> Result<(), String> {
        let fd = self
            .root
            .open(path, O_CREAT | O_WRONLY | O_TRUNC, 0o644)
            .map_err(err("create", path))?;
        let r = (|| {
            let buf = vec![0u8; 64 << 10];
            let mut left = size;
            while left > 0 {
                let n = self
                    .root
                    .write(fd, &buf[..left.min(buf.len())])
                    .map_err(err("write", path))?;
                left -= n;
            }
            Ok::<(), String>(())
        })();
        self.root.close(fd).map_err(err("close", path))?;
        r?;
        self.root
            .chown(path, BENCH_UID, BENCH_UID)
            .map_err(err("chown", path))
    }

    /// A worker's task: a thread of the user process.
    fn thread(&self) -> Task {
        self.user.clone_thread()
    }
}

/// Small per-thread PRNG (xorshift64*), for random offsets.
struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn path_at_depth(depth: u32) -> (Vec<String>, String) {
    // depth N = N components: N-1 directories and the leaf.
    let dirs: Vec<String> = (1..depth).map(|i| format!("d{i}")).collect();
    let mut leaf = dirs.join("/");
    if !leaf.is_empty() {
        leaf.push('/');
    }
    leaf.push('f');
    (dirs, leaf)
}

/// A stat loop on a peer: `dirs` (relative paths, parents first) are
/// created, then the `leaves`; worker i stats leaf i mod len.
#[cfg(feature = "peers")]
fn peer_stat_instance(
    p: Peer,
    dirs: &[String],
    leaves: Vec<String>,
) -> Result<Box<dyn Instance>, String> {
    use scalevfs_peers::{LinuxTmpfs, PeerFs, VfsMemoryFs};
    fn build<P: PeerFs + 'static>(
        fs: P,
        dirs: &[String],
        leaves: Vec<String>,
    ) -> Result<Box<dyn Instance>, String> {
        for d in dirs {
            fs.mkdir(d)?;
        }
        let mut paths = Vec::new();
        for l in &leaves {
            fs.create(l)?;
            paths.push(fs.path(l)?);
        }
        Ok(instance((fs, paths), |(fs, paths), ctx| {
            let p = &paths[ctx.index() % paths.len()];
            ctx.run(|| fs.stat(p).map(drop))
        }))
    }
    match p {
        Peer::VfsMemoryFs => build(VfsMemoryFs::new(), dirs, leaves),
        Peer::LinuxTmpfs => build(LinuxTmpfs::new()?, dirs, leaves),
    }
}

#[cfg(not(feature = "peers"))]
fn peer_stat_instance(
    p: Peer,
    _dirs: &[String],
    _leaves: Vec<String>,
) -> Result<Box<dyn Instance>, String> {
    Err(format!("peer {} needs the `peers` feature", p.name()))
}

// ---------------------------------------------------------------------------
// Seed workloads
// ---------------------------------------------------------------------------

const STAT_DIRS: [&str; 3] = ["a", "a/b", "a/b/c"];
const STAT_FILE: &str = "/a/b/c/file";

fn setup_stat_same(v: &Variant, _d: Option<u32>, _t: usize) -> Result<Box<dyn Instance>, String> {
    if let Some(p) = v.peer {
        let dirs: Vec<String> = STAT_DIRS.iter().map(|s| s.to_string()).collect();
        return peer_stat_instance(p, &dirs, vec!["a/b/c/file".into()]);
    }
    let ns = Ns::new(v)?;
    ns.mkdirs("/a/b/c")?;
    ns.file(STAT_FILE, 0)?;
    instance(ns, |ns, ctx| {
        let t = ns.thread();
        ctx.run(|| t.stat(STAT_FILE).map(drop))
    })
    .pipe(Ok)
}

/// stat-same plus an intruder listing the directory every 100 ms.
struct Degrade {
    ns: Ns,
    lister: Task,
}

impl Instance for Degrade {
    fn worker(&self, ctx: &WorkerCtx<'_>) -> Result<(), String> {
        let t = self.ns.thread();
        ctx.run(|| t.stat(STAT_FILE).map(drop))
    }
    fn has_intruder(&self) -> bool {
        true
    }
    fn intruder_every(&self) -> Duration {
        Duration::from_millis(100)
    }
    fn intruder(&self) -> Result<(), String> {
        self.lister
            .read_dir("/a/b/c")
            .map(drop)
            .map_err(err("read_dir", "/a/b/c"))
    }
}

fn setup_stat_degrade(
    v: &Variant,
    _d: Option<u32>,
    _t: usize,
) -> Result<Box<dyn Instance>, String> {
    let ns = Ns::new(v)?;
    ns.mkdirs("/a/b/c")?;
    ns.file(STAT_FILE, 0)?;
    // A few siblings, as in a real /tmp, so the listing locks several dentries.
    for i in 0..8 {
        ns.file(&format!("/a/b/c/sib{i}"), 0)?;
    }
    let lister = ns.root.clone_thread();
    Ok(Box::new(Degrade { ns, lister }))
}

fn setup_dget_parent(
    v: &Variant,
    _d: Option<u32>,
    threads: usize,
) -> Result<Box<dyn Instance>, String> {
    let ns = Ns::new(v)?;
    ns.mkdirs("/a/b/c/d")?;
    for i in 0..threads {
        ns.file(&format!("/a/b/c/d/f{i}"), 0)?;
    }
    instance(ns, |ns, ctx| {
        let t = ns.thread();
        let path = format!("/a/b/c/d/f{}", ctx.index());
        let fd = t.open(&path, O_RDONLY, 0).map_err(err("open", &path))?;
        let file = t.files().get_arc(fd).map_err(err("fd", &path))?;
        let leaf = file.path().dentry.clone();
        let r = ctx.run(|| {
            // dget_parent up to the root, each reference dropped (dput) as
            // the next one is taken: 5 get/put pairs on shared ancestors.
            let mut d = leaf.parent();
            while !d.is_root() {
                d = d.parent();
            }
            Ok::<(), String>(())
        });
        drop(leaf);
        drop(file);
        let _ = t.close(fd);
        r
    })
    .pipe(Ok)
}

fn setup_access_same(v: &Variant, _d: Option<u32>, _t: usize) -> Result<Box<dyn Instance>, String> {
    let ns = Ns::new(v)?;
    ns.mkdirs("/a/b/c")?;
    ns.file(STAT_FILE, 0)?;
    instance(ns, |ns, ctx| {
        let t = ns.thread();
        ctx.run(|| t.access(STAT_FILE, R_OK))
    })
    .pipe(Ok)
}

fn setup_lookup_spread(
    v: &Variant,
    _d: Option<u32>,
    threads: usize,
) -> Result<Box<dyn Instance>, String> {
    let ns = Ns::new(v)?;
    ns.mkdirs("/usr/lib")?;
    // A populated shared directory; worker i stats its own leaf.
    for i in 0..threads.max(64) {
        ns.file(&format!("/usr/lib/lib{i}.so"), 0)?;
    }
    instance(ns, |ns, ctx| {
        let t = ns.thread();
        let p = format!("/usr/lib/lib{}.so", ctx.index());
        ctx.run(|| t.stat(&p).map(drop))
    })
    .pipe(Ok)
}

/// One open file description shared by every worker.
struct SharedFd {
    ns: Ns,
    fd: i32,
}

const LSEEK_FILE_SIZE: usize = 1 << 20;

fn setup_lseek_shared(
    v: &Variant,
    _d: Option<u32>,
    _t: usize,
) -> Result<Box<dyn Instance>, String> {
    let ns = Ns::new(v)?;
    ns.mkdirs("/data")?;
    ns.file("/data/shared", LSEEK_FILE_SIZE)?;
    let fd = ns
        .user
        .open("/data/shared", O_RDONLY, 0)
        .map_err(err("open", "/data/shared"))?;
    instance(SharedFd { ns, fd }, |s, ctx| {
        let t = s.ns.thread();
        let mut rng = Rng::new(ctx.index() as u64 + 1);
        let mut buf = [0u8; 64];
        ctx.run(|| {
            let off = (rng.next() % (LSEEK_FILE_SIZE as u64 - 64)) as i64;
            t.lseek(s.fd, off, SEEK_SET)?;
            t.read(s.fd, &mut buf).map(drop)
        })
    })
    .pipe(Ok)
}

fn setup_orphan_stress(
    v: &Variant,
    _d: Option<u32>,
    _t: usize,
) -> Result<Box<dyn Instance>, String> {
    let ns = Ns::new(v)?;
    ns.tmpdir("/stress")?;
    instance(ns, |ns, ctx| {
        let t = ns.thread();
        let path = format!("/stress/f{}", ctx.index());
        let fd = t
            .open(&path, O_RDWR | O_CREAT | O_TRUNC, 0o644)
            .map_err(err("create", &path))?;
        let block = [0x5au8; 4096];
        let mut size = 0i64;
        let r = ctx.run(|| {
            if size == 0 {
                t.pwrite(fd, &block, 0)?;
                size = block.len() as i64;
            }
            size -= 1;
            t.ftruncate(fd, size)
        });
        let _ = t.close(fd);
        r
    })
    .pipe(Ok)
}

fn setup_creat_clo(v: &Variant, _d: Option<u32>, _t: usize) -> Result<Box<dyn Instance>, String> {
    let ns = Ns::new(v)?;
    ns.tmpdir("/cc")?;
    instance(ns, |ns, ctx| {
        // reaim's clients are processes: each worker has an fd table of
        // its own (threads sharing one table serialise on POSIX's
        // lowest-free-fd rule; `wis-fs/unlink1` measures that case).
        let t = ns.user.fork();
        let path = format!("/cc/f{}", ctx.index());
        ctx.run(|| {
            let fd = t.open(&path, O_CREAT | O_WRONLY | O_TRUNC, 0o644)?;
            t.close(fd)?;
            t.unlink(&path)
        })
    })
    .pipe(Ok)
}

fn setup_mkdir_rmdir(v: &Variant, _d: Option<u32>, _t: usize) -> Result<Box<dyn Instance>, String> {
    let ns = Ns::new(v)?;
    ns.tmpdir("/md")?;
    instance(ns, |ns, ctx| {
        let t = ns.thread();
        let path = format!("/md/d{}", ctx.index());
        ctx.run(|| {
            t.mkdir(&path, 0o755)?;
            t.rmdir(&path)
        })
    })
    .pipe(Ok)
}

/// The machine's line-transfer cost: the workers take turns on one
/// counter, each waiting (spinning) for its turn and passing it on with
/// one store, so every op moves the counter's line to another core. How
/// much a shared line costs the other workloads depends on it: on a VM
/// whose two vCPUs sit on cores that share a cache it is tens of
/// nanoseconds; across chiplets or sockets, hundreds. A worker whose turn
/// does not come (the others stopped) gives up when the segment ends.
fn setup_pingpong(_v: &Variant, _d: Option<u32>, _t: usize) -> Result<Box<dyn Instance>, String> {
    use std::sync::atomic::{AtomicU64, Ordering};
    instance(
        crossbeam_utils::CachePadded::new(AtomicU64::new(0)),
        |turn, ctx| {
            let (me, n) = (ctx.index() as u64, ctx.threads() as u64);
            ctx.run(|| {
                // Acquire/Release: the counter is the only shared datum;
                // the orderings only keep the hand-over a real one.
                loop {
                    let v = turn.load(Ordering::Acquire);
                    if v % n == me {
                        turn.store(v + 1, Ordering::Release);
                        return Ok::<(), Errno>(());
                    }
                    if ctx.stopped() {
                        return Ok(());
                    }
                    std::hint::spin_loop();
                }
            })
        },
    )
    .pipe(Ok)
}

/// The machine's own ceiling: each worker runs 64 steps of a private
/// xorshift generator per op, touching no memory that another thread
/// touches and calling nothing in scalevfs. Its scaling is what the
/// hardware (turbo, shared cores, the hypervisor) allows; read the other
/// workloads' scaling against it.
fn setup_control(_v: &Variant, _d: Option<u32>, _t: usize) -> Result<Box<dyn Instance>, String> {
    instance((), |_, ctx| {
        let mut r = Rng::new(ctx.index() as u64 + 1);
        ctx.run(|| {
            for _ in 0..64 {
                std::hint::black_box(r.next());
            }
            Ok::<(), Errno>(())
        })
    })
    .pipe(Ok)
}

// ---------------------------------------------------------------------------
// will-it-scale fs set
// ---------------------------------------------------------------------------

/// will-it-scale's test name -> (description, setup). "1" = each worker its
/// own file in /tmp, "2" = one shared file (each worker opens its own fd),
/// open2/unlink2 = own file in own directory, open3 = one shared file,
/// pread3 = one shared file, each worker its own 4 KiB-aligned offset.
pub const WIS_TESTS: [(&str, &str); 25] = [
    ("open1", "open+close, own file in /tmp"),
    (
        "open1p",
        "open1 with each worker a process of its own (own fd table), as will-it-scale's open1_processes",
    ),
    (
        "open1a",
        "open1 with O_ANYFD: any free fd, not the lowest (sv6's opt-in), threads sharing one fd table",
    ),
    ("open2", "open+close, own file in own directory"),
    ("open3", "open+close, one shared file"),
    ("unlink1", "creat+close+unlink, own name in /tmp"),
    ("unlink2", "creat+close+unlink, own name in own directory"),
    (
        "unlink1p",
        "unlink1 with each worker a process of its own (own fd table), as will-it-scale's unlink1_processes",
    ),
    (
        "unlink2p",
        "unlink2 with each worker a process of its own (own fd table)",
    ),
    ("lseek1", "lseek(0, SEEK_SET), own file"),
    ("lseek2", "lseek(0, SEEK_SET), shared file, own fd"),
    ("read1", "read 4 KiB (rewind at EOF), own 1 MiB file"),
    (
        "read2",
        "read 4 KiB (rewind at EOF), shared 1 MiB file, own fd",
    ),
    ("pread1", "pread 4 KiB at 0, own file"),
    ("pread2", "pread 4 KiB at 0, shared file, own fd"),
    ("pread3", "pread 4 KiB at 4 KiB*worker, shared file, own fd"),
    ("pwrite1", "pwrite 4 KiB at 0, own file (an overwrite)"),
    ("pwrite2", "pwrite 4 KiB at 0, shared file, own fd (one page, every worker)"),
    (
        "pwrite3",
        "pwrite 4 KiB at 4 KiB*worker, shared file, own fd (a page per worker)",
    ),
    ("fstat1", "fstat, own file"),
    ("fstat2", "fstat, shared file, own fd"),
    ("stat1", "stat, own file in /tmp"),
    ("stat2", "stat, one shared file in /tmp"),
    ("access1", "access(R_OK), own file in /tmp"),
    ("access2", "access(R_OK), one shared file in /tmp"),
];

fn wis_ns(v: &Variant) -> Result<Ns, String> {
    let ns = Ns::new(v)?;
    ns.tmpdir("/tmp")?;
    Ok(ns)
}

/// Own file per worker ("1"), or the shared one ("2").
fn wis_files(
    ns: &Ns,
    threads: usize,
    shared: bool,
    size: usize,
    dirs: bool,
) -> Result<Vec<String>, String> {
    if shared {
        ns.file("/tmp/willitscale", size)?;
        return Ok(vec!["/tmp/willitscale".into()]);
    }
    let mut v = Vec::new();
    for i in 0..threads {
        let p = if dirs {
            ns.tmpdir(&format!("/tmp/wis.{i}"))?;
            format!("/tmp/wis.{i}/willitscale")
        } else {
            format!("/tmp/willitscale.{i}")
        };
        ns.file(&p, size)?;
        v.push(p);
    }
    Ok(v)
}

struct Wis {
    ns: Ns,
    paths: Vec<String>,
}

impl Wis {
    fn path(&self, ctx: &WorkerCtx<'_>) -> &str {
        &self.paths[ctx.index() % self.paths.len()]
    }
}

fn wis_open(shared: bool, dirs: bool) -> SetupFn {
    match (shared, dirs) {
        (false, false) => |v, _, t| wis_open_mk(v, t, false, false, false, 0),
        (false, true) => |v, _, t| wis_open_mk(v, t, false, true, false, 0),
        _ => |v, _, t| wis_open_mk(v, t, true, false, false, 0),
    }
}

/// `procs`: each worker a process of its own (a forked task: its own fd
/// table), else threads of one process sharing the table. `extra`: more
/// open flags (O_ANYFD).
fn wis_open_mk(
    v: &Variant,
    t: usize,
    shared: bool,
    dirs: bool,
    procs: bool,
    extra: u32,
) -> Result<Box<dyn Instance>, String> {
    let ns = wis_ns(v)?;
    let paths = wis_files(&ns, t, shared, 0, dirs)?;
    Ok(instance(
        (Wis { ns, paths }, procs, extra),
        |(w, procs, extra), ctx| {
            let t = if *procs {
                w.ns.user.fork()
            } else {
                w.ns.thread()
            };
            let p = w.path(ctx);
            ctx.run(|| {
                let fd = t.open(p, O_RDWR | *extra, 0)?;
                t.close(fd)
            })
        },
    ))
}

/// `procs`: each worker a process of its own (own fd table), as
/// will-it-scale's `unlink1_processes`.
fn wis_unlink(dirs: bool, procs: bool) -> SetupFn {
    fn mk(v: &Variant, t: usize, dirs: bool, procs: bool) -> Result<Box<dyn Instance>, String> {
        let ns = wis_ns(v)?;
        let paths = wis_files(&ns, t, false, 0, dirs)?;
        for p in &paths {
            ns.root.unlink(p).map_err(err("unlink", p))?;
        }
        Ok(instance((Wis { ns, paths }, procs), |(w, procs), ctx| {
            let t = if *procs {
                w.ns.user.fork()
            } else {
                w.ns.thread()
            };
            let p = w.path(ctx);
            ctx.run(|| {
                let fd = t.open(p, O_RDWR | O_CREAT, 0o600)?;
                t.close(fd)?;
                t.unlink(p)
            })
        }))
    }
    match (dirs, procs) {
        (false, false) => |v, _, t| mk(v, t, false, false),
        (true, false) => |v, _, t| mk(v, t, true, false),
        (false, true) => |v, _, t| mk(v, t, false, true),
        (true, true) => |v, _, t| mk(v, t, true, true),
    }
}

/// Per-fd loops: every worker opens its own fd on its path first.
#[derive(Clone, Copy)]
enum FdOp {
    Lseek,
    Read,
    Pread { spread: bool },
    Pwrite { spread: bool },
    Fstat,
}

fn wis_fd(
    v: &Variant,
    threads: usize,
    shared: bool,
    op: FdOp,
) -> Result<Box<dyn Instance>, String> {
    let ns = wis_ns(v)?;
    let size = match op {
        FdOp::Read => 1 << 20,
        FdOp::Pread { spread: true } | FdOp::Pwrite { spread: true } => 4096 * threads,
        _ => 4096,
    };
    let paths = wis_files(&ns, threads, shared, size, false)?;
    Ok(instance((Wis { ns, paths }, op), |(w, op), ctx| {
        let t = w.ns.thread();
        let p = w.path(ctx);
        let mode = if matches!(op, FdOp::Pwrite { .. }) {
            O_RDWR
        } else {
            O_RDONLY
        };
        let fd = t.open(p, mode, 0).map_err(err("open", p))?;
        let mut buf = vec![0u8; 4096];
        let r = match *op {
            FdOp::Lseek => ctx.run(|| t.lseek(fd, 0, SEEK_SET).map(drop)),
            FdOp::Read => ctx.run(|| {
                if t.read(fd, &mut buf)? == 0 {
                    t.lseek(fd, 0, SEEK_SET)?;
                }
                Ok::<(), Errno>(())
            }),
            FdOp::Pread { spread } => {
                let off = if spread { 4096 * ctx.index() as i64 } else { 0 };
                ctx.run(|| match t.pread(fd, &mut buf, off) {
                    Ok(4096) => Ok(()),
                    Ok(n) => Err(format!("short pread {n}")),
                    Err(e) => Err(e.to_string()),
                })
            }
            FdOp::Pwrite { spread } => {
                let off = if spread { 4096 * ctx.index() as i64 } else { 0 };
                buf.fill(ctx.index() as u8 + 1);
                ctx.run(|| match t.pwrite(fd, &buf, off) {
                    Ok(4096) => Ok(()),
                    Ok(n) => Err(format!("short pwrite {n}")),
                    Err(e) => Err(e.to_string()),
                })
            }
            FdOp::Fstat => ctx.run(|| t.fstat(fd).map(drop)),
        };
        let _ = t.close(fd);
        r
    }))
}

fn wis_path_op(
    v: &Variant,
    threads: usize,
    shared: bool,
    access: bool,
) -> Result<Box<dyn Instance>, String> {
    let ns = wis_ns(v)?;
    let paths = wis_files(&ns, threads, shared, 0, false)?;
    Ok(instance((Wis { ns, paths }, access), |(w, access), ctx| {
        let t = w.ns.thread();
        let p = w.path(ctx);
        if *access {
            ctx.run(|| t.access(p, R_OK))
        } else {
            ctx.run(|| t.stat(p).map(drop))
        }
    }))
}

fn wis_setup(name: &str) -> SetupFn {
    match name {
        "open1" => wis_open(false, false),
        "open1p" => |v, _, t| wis_open_mk(v, t, false, false, true, 0),
        "open1a" => |v, _, t| wis_open_mk(v, t, false, false, false, scalevfs::O_ANYFD),
        "open2" => wis_open(false, true),
        "open3" => wis_open(true, false),
        "unlink1" => wis_unlink(false, false),
        "unlink2" => wis_unlink(true, false),
        "unlink1p" => wis_unlink(false, true),
        "unlink2p" => wis_unlink(true, true),
        "lseek1" => |v, _, t| wis_fd(v, t, false, FdOp::Lseek),
        "lseek2" => |v, _, t| wis_fd(v, t, true, FdOp::Lseek),
        "read1" => |v, _, t| wis_fd(v, t, false, FdOp::Read),
        "read2" => |v, _, t| wis_fd(v, t, true, FdOp::Read),
        "pread1" => |v, _, t| wis_fd(v, t, false, FdOp::Pread { spread: false }),
        "pread2" => |v, _, t| wis_fd(v, t, true, FdOp::Pread { spread: false }),
        "pread3" => |v, _, t| wis_fd(v, t, true, FdOp::Pread { spread: true }),
        "pwrite1" => |v, _, t| wis_fd(v, t, false, FdOp::Pwrite { spread: false }),
        "pwrite2" => |v, _, t| wis_fd(v, t, true, FdOp::Pwrite { spread: false }),
        "pwrite3" => |v, _, t| wis_fd(v, t, true, FdOp::Pwrite { spread: true }),
        "fstat1" => |v, _, t| wis_fd(v, t, false, FdOp::Fstat),
        "fstat2" => |v, _, t| wis_fd(v, t, true, FdOp::Fstat),
        "stat1" => |v, _, t| wis_path_op(v, t, false, false),
        "stat2" => |v, _, t| wis_path_op(v, t, true, false),
        "access1" => |v, _, t| wis_path_op(v, t, false, true),
        "access2" => |v, _, t| wis_path_op(v, t, true, true),
        _ => |_, _, _| Err("unknown will-it-scale test".into()),
    }
}

// ---------------------------------------------------------------------------
// depth
// ---------------------------------------------------------------------------

/// The depths of the `depth` workload.
pub const DEPTHS: [u32; 6] = [1, 2, 3, 8, 64, 100];

fn setup_depth(v: &Variant, depth: Option<u32>, _t: usize) -> Result<Box<dyn Instance>, String> {
    let depth = depth.ok_or("depth workload needs a depth")?.max(1);
    let (dirs, leaf) = path_at_depth(depth);
    if let Some(p) = v.peer {
        // Cumulative directory paths: d1, d1/d2, ...
        let prefixes: Vec<String> = (1..=dirs.len()).map(|n| dirs[..n].join("/")).collect();
        return peer_stat_instance(p, &prefixes, vec![leaf]);
    }
    let ns = Ns::new(v)?;
    let leaf = format!("/{leaf}");
    if v.submount {
        // A second memfs on the first component: every walk crosses a mount
        // (at depth 1 the leaf itself is the mount point).
        ns.mkdirs("/d1")?;
        let fs = ns.root.vfs().new_memfs(MemFsOptions::default());
        ns.root
            .mount("/d1", fs, false)
            .map_err(err("mount", "/d1"))?;
        ns.root.chmod("/d1", 0o755).map_err(err("chmod", "/d1"))?;
    }
    let mut cur = String::new();
    for d in &dirs {
        cur.push('/');
        cur.push_str(d);
        ns.mkdirs(&cur)?;
    }
    let target = if v.submount && depth == 1 {
        "/d1".to_string()
    } else {
        leaf
    };
    if !(v.submount && depth == 1) {
        ns.file(&target, 0)?;
    }
    instance((ns, target), |(ns, p), ctx| {
        let t = ns.thread();
        ctx.run(|| t.stat(p).map(drop))
    })
    .pipe(Ok)
}

// ---------------------------------------------------------------------------
// Registry
// ---------------------------------------------------------------------------

trait Pipe: Sized {
    fn pipe<R>(self, f: impl FnOnce(Self) -> R) -> R {
        f(self)
    }
}
impl<T> Pipe for T {}

fn wl(
    id: &'static str,
    origin: &'static str,
    description: &'static str,
    variants: Vec<Variant>,
    setup: SetupFn,
) -> Workload {
    Workload {
        id,
        origin,
        description,
        variants,
        peers: false,
        depths: Vec::new(),
        timeline: false,
        setup,
    }
}

/// Every workload, in report order.
pub fn all() -> Vec<Workload> {
    let mut v = vec![
        Workload {
            peers: true,
            ..wl(
                "stat-same",
                "seed 001 (Guzik 2024), will-it-scale stat2",
                "stat /a/b/c/file (depth 4) from every worker",
                vec![
                    Variant::new(
                        "ref/packed/lockref",
                        &[
                            ("stat", "ref"),
                            ("layout", "packed"),
                            ("lockref", "lockref"),
                        ],
                    )
                    .before(),
                    Variant::new(
                        "ref/separated/lockref",
                        &[
                            ("stat", "ref"),
                            ("layout", "separated"),
                            ("lockref", "lockref"),
                        ],
                    ),
                    Variant::new(
                        "ref/separated/lockref-wait",
                        &[
                            ("stat", "ref"),
                            ("layout", "separated"),
                            ("lockref", "lockref-wait"),
                        ],
                    ),
                    Variant::new("noref/separated/lockref-wait", &[]).default_(),
                ],
                setup_stat_same,
            )
        },
        Workload {
            timeline: true,
            ..wl(
                "stat-degrade",
                "seed 001 (Guzik 2024)",
                "stat-same with ref-taking stat, plus an intruder listing /a/b/c every 100 ms",
                vec![
                    Variant::new(
                        "lockref+readdir-locking",
                        &[
                            ("stat", "ref"),
                            ("lockref", "lockref"),
                            ("readdir", "locking"),
                        ],
                    )
                    .before(),
                    Variant::new(
                        "lockref-wait+readdir-locking",
                        &[
                            ("stat", "ref"),
                            ("lockref", "lockref-wait"),
                            ("readdir", "locking"),
                        ],
                    ),
                    Variant::new(
                        "lockref+readdir-default",
                        &[("stat", "ref"), ("lockref", "lockref")],
                    ),
                ],
                setup_stat_degrade,
            )
        },
        wl(
            "dget-parent",
            "seed 000 (Long 2013), AIM7 short",
            "from an open file at depth 5, dget_parent up to the root, dput each",
            vec![
                Variant::new("spin", &[("lockref", "spin")]).before(),
                Variant::new("cmpxchg2", &[("lockref", "cmpxchg2")]),
                Variant::new("lockref", &[("lockref", "lockref")]),
                Variant::new("lockref-wait", &[("lockref", "lockref-wait")]).default_(),
            ],
            setup_dget_parent,
        ),
        wl(
            "access-same",
            "seed 004 (Doran 2020)",
            "access(/a/b/c/file, R_OK) from every worker",
            vec![
                Variant::new("per-dir/ref-walk", &[("index", "per-dir"), ("walk", "ref")]).before(),
                Variant::new(
                    "per-dir/lockfree",
                    &[("index", "per-dir"), ("walk", "lockfree")],
                ),
                Variant::new("hash/ref-walk", &[("index", "hash"), ("walk", "ref")]),
                Variant::new("hash/lockfree", &[("index", "hash"), ("walk", "lockfree")])
                    .default_(),
            ],
            setup_access_same,
        ),
        wl(
            "lookup-spread",
            "seed 004 (hash vs tree)",
            "stat /usr/lib/lib<worker>.so: different leaves in one shared, populated directory",
            vec![
                Variant::new("per-dir", &[("index", "per-dir")]).before(),
                Variant::new("hash", &[("index", "hash")]).default_(),
            ],
            setup_lookup_spread,
        ),
        wl(
            "lseek-shared",
            "seed 003 (Joukov 2005)",
            "lseek to a random offset + read 64 B on ONE shared open file",
            vec![
                Variant::new("locked", &[("llseek", "locked")]).before(),
                Variant::new("lockless", &[("llseek", "lockless")]).default_(),
            ],
            setup_lseek_shared,
        ),
        wl(
            "orphan-stress",
            "seed 002 (Kara 2021), stress-orphan",
            "ftruncate own file one byte shorter (refill 4 KiB at 0)",
            vec![
                Variant::new("locked", &[("orphan", "locked")]).before(),
                Variant::new("lockless", &[("orphan", "lockless")]).default_(),
                Variant::new("none", &[("orphan", "none")]),
            ],
            setup_orphan_stress,
        ),
        wl(
            "creat-clo",
            "seed 002 (Kara 2021), reaim creat_clo",
            "creat+close+unlink own name in one shared directory",
            vec![
                Variant::new("locked", &[("orphan", "locked")]).before(),
                Variant::new("lockless", &[("orphan", "lockless")]).default_(),
                Variant::new(
                    "lockless-counted-parent",
                    &[("orphan", "lockless"), ("parent-refs", "counted")],
                ),
            ],
            setup_creat_clo,
        ),
        wl(
            "mkdir-rmdir",
            "issue 16 (commuting creates)",
            "mkdir+rmdir own name in one shared directory",
            vec![
                Variant::new("counted-parent", &[("parent-refs", "counted")]).before(),
                Variant::plain(),
            ],
            setup_mkdir_rmdir,
        ),
        wl(
            "control-pingpong",
            "the machine's cost of moving a cache line between the workers' cores",
            "take one shared counter's turn (counter % workers == own index) and pass it on: one op = one hand-over of the line; ns/op at 2 workers is the line's trip between their cores",
            vec![Variant::plain()],
            setup_pingpong,
        ),
        wl(
            "control",
            "the machine's ceiling (no filesystem)",
            "64 steps of a private PRNG per op: no shared memory, no scalevfs call",
            vec![Variant::plain()],
            setup_control,
        ),
    ];
    for (name, desc) in WIS_TESTS.iter() {
        v.push(wl(
            wis_id(name),
            "will-it-scale",
            desc,
            vec![Variant::plain()],
            wis_setup(name),
        ));
    }
    v.push(Workload {
        peers: true,
        depths: DEPTHS.to_vec(),
        ..wl(
            "depth",
            "gVisor tmpfs benchmark shape",
            "stat a file N components deep (/d1/.../f), with and without a submount",
            vec![
                Variant::plain(),
                Variant {
                    submount: true,
                    ..Variant::new("submount", &[])
                },
            ],
            setup_depth,
        )
    });
    v
}

/// `wis-fs/<test>`: the report id of a will-it-scale test.
pub fn wis_id(name: &str) -> &'static str {
    match name {
        "open1" => "wis-fs/open1",
        "open1p" => "wis-fs/open1p",
        "open1a" => "wis-fs/open1a",
        "open2" => "wis-fs/open2",
        "open3" => "wis-fs/open3",
        "unlink1" => "wis-fs/unlink1",
        "unlink2" => "wis-fs/unlink2",
        "unlink1p" => "wis-fs/unlink1p",
        "unlink2p" => "wis-fs/unlink2p",
        "lseek1" => "wis-fs/lseek1",
        "lseek2" => "wis-fs/lseek2",
        "read1" => "wis-fs/read1",
        "read2" => "wis-fs/read2",
        "pread1" => "wis-fs/pread1",
        "pread2" => "wis-fs/pread2",
        "pread3" => "wis-fs/pread3",
        "pwrite1" => "wis-fs/pwrite1",
        "pwrite2" => "wis-fs/pwrite2",
        "pwrite3" => "wis-fs/pwrite3",
        "fstat1" => "wis-fs/fstat1",
        "fstat2" => "wis-fs/fstat2",
        "stat1" => "wis-fs/stat1",
        "stat2" => "wis-fs/stat2",
        "access1" => "wis-fs/access1",
        "access2" => "wis-fs/access2",
        _ => "wis-fs/unknown",
    }
}

/// Select workloads by id: exact ids, `wis-fs` for the whole set, or a bare
/// will-it-scale name (`open1`). Empty selects all.
pub fn select(names: &[String]) -> Result<Vec<Workload>, String> {
    let all = all();
    if names.is_empty() {
        return Ok(all);
    }
    let mut keep = vec![false; all.len()];
    for n in names {
        let mut hit = false;
        for (i, w) in all.iter().enumerate() {
            let m = w.id == n
                || (n == "wis-fs" && w.id.starts_with("wis-fs/"))
                || w.id.strip_prefix("wis-fs/") == Some(n.as_str());
            if m {
                keep[i] = true;
                hit = true;
            }
        }
        if !hit {
            return Err(format!(
                "unknown workload {n:?} (see `scalevfs bench --list`)"
            ));
        }
    }
    Ok(all
        .into_iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(w, _)| w)
        .collect())
}
