//! Mounting: `scalevfs mount DIR`, an in-process [`spawn_mount`] for
//! embedders and tests, and the kernel notifications about changes made
//! through the library behind the kernel's back: automatic (a
//! [`scalevfs::ChangeListener`] registered by [`spawn_mount`]) and manual
//! (the [`Invalidator`]).

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{INodeNo, MountOption, Notifier, Session, SessionACL, SessionUnmounter};
use scalevfs::{ChangeListener, Task, Vfs, VfsConfig, AT_SYMLINK_NOFOLLOW};

use crate::ops::{FuseConfig, ScaleFs, Shared};

/// `scalevfs mount` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct MountArgs {
    /// Mount point: an existing, empty directory.
    pub dir: PathBuf,
    /// Filesystem type to serve: `memfs`, or `ext4` (implied by `--image`).
    #[arg(long = "fs", default_value = "memfs")]
    pub fs: String,
    /// Serve this ext4 image (or block device) instead of a memfs;
    /// read-write unless `-o ro`.
    #[arg(long)]
    pub image: Option<PathBuf>,
    /// Mount options, comma separated (allow_other, allow_root,
    /// default_permissions, no_default_permissions, ro, auto_unmount,
    /// fsname=..., dev, suid, ...), and memfs's limits as tmpfs spells
    /// them: size=BYTES[k|m|g|t] or size=N% of RAM (default 50%),
    /// nr_inodes=N[k|m|g].
    ///
    /// Safe by default: a mount other users can reach (allow_other,
    /// allow_root) gets default_permissions (the kernel checks permissions
    /// before scalevfs does), since the kernel reuses cached names without
    /// asking scalevfs, which would let a user open a file in a directory
    /// they may not search. no_default_permissions opts out: scalevfs alone
    /// checks, and the kernel then caches no names (--entry-timeout and
    /// --negative-timeout become 0).
    #[arg(short = 'o', value_delimiter = ',', verbatim_doc_comment)]
    pub options: Vec<String>,
    /// Request threads (default: the number of CPUs, at most 16).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Stay in the foreground (default: detach once mounted).
    #[arg(short = 'f', long)]
    pub foreground: bool,
    /// Seconds the kernel may cache attributes (0: always ask).
    #[arg(long, default_value_t = 1.0)]
    pub attr_timeout: f64,
    /// Seconds the kernel may cache names.
    #[arg(long, default_value_t = 1.0)]
    pub entry_timeout: f64,
    /// Seconds the kernel may cache "no such file" (0: never).
    #[arg(long, default_value_t = 0.0)]
    pub negative_timeout: f64,
    /// Do not offer READDIRPLUS.
    #[arg(long)]
    pub no_readdirplus: bool,
    /// Capacity of the memfs, as `-o size=`: file data past it gives ENOSPC
    /// (bytes with a k, m, g, t suffix, or N% of RAM). Default 50% of RAM.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// VFS variant settings, KEY=VALUE (as `VfsConfig::set`: lockref=spin,
    /// walk=ref, index=per-dir, ...). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// Everything [`spawn_mount`] needs besides the `Vfs`.
#[derive(Clone, Debug)]
pub struct MountConfig {
    pub fuse: FuseConfig,
    /// `-o` options as `mount.fuse` spells them.
    pub options: Vec<String>,
    /// Request threads (each with its own /dev/fuse clone).
    pub threads: usize,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            fuse: FuseConfig::default(),
            options: Vec::new(),
            threads: default_threads(),
        }
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 16)
}

/// A mounted scalevfs: unmounts (and waits for the request threads) when
/// dropped or on [`FuseMount::unmount`].
#[derive(Debug)]
pub struct FuseMount {
    mountpoint: PathBuf,
    unmounter: SessionUnmounter,
    thread: Option<JoinHandle<io::Result<()>>>,
    invalidator: Invalidator,
    /// The listener registered on `vfs`, removed on unmount.
    listener: Option<Arc<KernelInval>>,
    vfs: Vfs,
}

impl FuseMount {
    /// The handle that tells the kernel about changes made through the
    /// library (clone it freely).
    pub fn invalidator(&self) -> Invalidator {
        self.invalidator.clone()
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Number of node ids the kernel holds (for tests of lookup counting).
    pub fn live_nodes(&self) -> usize {
        self.invalidator.shared.nodes.len()
    }

    /// Unmount and wait for the request threads to finish.
    pub fn unmount(mut self) -> io::Result<()> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> io::Result<()> {
        if let Some(l) = self.listener.take() {
            let l: Arc<dyn ChangeListener> = l;
            self.vfs.remove_change_listener(&l);
        }
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        let r = self
            .unmounter
            .unmount()
            .or_else(|_| lazy_unmount(&self.mountpoint));
        let j = thread
            .join()
            .map_err(|_| io::Error::other("FUSE request thread panicked"))?;
        r.and(j)
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        let _ = self.unmount_inner();
    }
}

/// Detach a busy mount (`umount -l`): as root directly, else through
/// `fusermount3 -u -z`.
fn lazy_unmount(dir: &Path) -> io::Result<()> {
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let st = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg("--")
        .arg(dir)
        .status()?;
    if st.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "fusermount3 -u -z {} failed",
            dir.display()
        )))
    }
}

/// The automatic notifications: registered on the `Vfs` by [`spawn_mount`],
/// told by the core about every change a (non-quiet) [`Task`] makes, after
/// the change and with no core lock held. The adapter's own tasks are quiet,
/// so this runs only on the threads of the embedding program, never inside
/// a FUSE request (notifying the kernel from there could deadlock).
struct KernelInval {
    notifier: Notifier,
    /// Weak: the `Vfs` holds the listener and `Shared` holds the `Vfs`.
    shared: Weak<Shared>,
}

impl std::fmt::Debug for KernelInval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelInval").finish_non_exhaustive()
    }
}

impl ChangeListener for KernelInval {
    fn entry_changed(&self, parent_ino: u64, dev: u64, name: &[u8]) {
        let Some(s) = self.shared.upgrade() else {
            return;
        };
        // The node table's lock is released inside `known_nodeid`: none is
        // held across the notification. Errors (the kernel forgot the
        // directory meanwhile, or the mount is gone) mean nothing is cached.
        if let Some(id) = s.known_nodeid(dev, parent_ino) {
            let _ = self
                .notifier
                .inval_entry(INodeNo(id), OsStr::from_bytes(name));
        }
    }

    fn inode_changed(&self, ino: u64, dev: u64) {
        let Some(s) = self.shared.upgrade() else {
            return;
        };
        if let Some(id) = s.known_nodeid(dev, ino) {
            let _ = self.notifier.inval_inode(INodeNo(id), 0, 0);
        }
    }
}

/// Tells the kernel that something changed behind its back (a change made
/// through the library API by a program that also serves the mount).
///
/// The kernel caches names and attributes for the configured timeouts and
/// file data across opens; a change made through the mount invalidates
/// those itself. A change made through a [`Task`] of the mounted `Vfs` is
/// reported to the kernel automatically while the [`FuseMount`] lives; this
/// handle is for changes the core cannot see, or made by a task with
/// [`Task::set_quiet_changes`]. Call [`Invalidator::changed`] after such a
/// change (creation, removal, rename: both names; write, truncate, chmod,
/// ...).
#[derive(Clone, Debug)]
pub struct Invalidator {
    notifier: Notifier,
    shared: Arc<Shared>,
}

impl Invalidator {
    /// Drop the kernel's cached entry `name` in the directory at `dir` (a
    /// path in the `Vfs`, resolved by `task`). A no-op if the kernel does
    /// not know the directory.
    pub fn inval_entry(&self, task: &Task, dir: &[u8], name: &[u8]) -> io::Result<()> {
        let Ok(st) = task.fstatat(scalevfs::AT_FDCWD, dir, 0) else {
            return Ok(());
        };
        let Ok(id) = self.shared.nodeid(&st) else {
            return Ok(());
        };
        if !self.shared.nodes.contains(id) {
            return Ok(());
        }
        self.notifier
            .inval_entry(INodeNo(id), OsStr::from_bytes(name))
    }

    /// Drop the kernel's cached attributes and data of the inode at `path`.
    /// A no-op if the kernel does not know it.
    pub fn inval_inode(&self, task: &Task, path: &[u8]) -> io::Result<()> {
        let Ok(st) = task.fstatat(scalevfs::AT_FDCWD, path, AT_SYMLINK_NOFOLLOW) else {
            return Ok(());
        };
        let Ok(id) = self.shared.nodeid(&st) else {
            return Ok(());
        };
        if !self.shared.nodes.contains(id) {
            return Ok(());
        }
        self.notifier.inval_inode(INodeNo(id), 0, 0)
    }

    /// `path` was created, removed, renamed to or from, or modified: drop
    /// both the kernel's entry for it and its cached inode, and the cached
    /// attributes of its directory (size, times).
    pub fn changed(&self, task: &Task, path: &[u8]) -> io::Result<()> {
        let trimmed = trim_slashes(path);
        let (dir, name) = match trimmed.iter().rposition(|&c| c == b'/') {
            Some(0) => (&b"/"[..], &trimmed[1..]),
            Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
            None => (&b"."[..], trimmed),
        };
        self.inval_inode(task, path)?;
        if !name.is_empty() {
            self.inval_entry(task, dir, name)?;
            self.inval_inode(task, dir)?;
        }
        Ok(())
    }
}

fn trim_slashes(p: &[u8]) -> &[u8] {
    let mut end = p.len();
    while end > 1 && p[end - 1] == b'/' {
        end -= 1;
    }
    &p[..end]
}

/// Who checks permissions on a mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PermChecks {
    /// The kernel (`default_permissions`), then scalevfs again.
    Kernel,
    /// scalevfs only; names are not cached if other users can reach the
    /// mount (each path walk must reach scalevfs with the caller's
    /// credentials).
    ScalevfsOnly,
}

/// fuser's session configuration for `cfg`, and the kernel-cache settings
/// the mount really uses.
///
/// Safe by default: the kernel reuses a cached name without asking the
/// filesystem, so without `default_permissions` a user could reach a file
/// through a directory they may not search once another user has looked
/// the name up. Hence a mount other users can reach (`allow_other`,
/// `allow_root`) gets `default_permissions` unless `no_default_permissions`
/// is given, and then the kernel caches no names (entry and negative
/// timeouts 0).
fn session_config(cfg: &MountConfig) -> io::Result<(fuser::Config, FuseConfig)> {
    let mut c = fuser::Config::default();
    let mut fuse = cfg.fuse.clone();
    let mut fsname = false;
    let mut subtype = false;
    let mut default_permissions = false;
    let mut no_default_permissions = false;
    for o in cfg
        .options
        .iter()
        .map(|o| o.trim())
        .filter(|o| !o.is_empty())
    {
        let opt = match o {
            "allow_other" => {
                c.acl = SessionACL::All;
                continue;
            }
            "allow_root" => {
                c.acl = SessionACL::RootAndOwner;
                continue;
            }
            "default_permissions" => {
                default_permissions = true;
                continue;
            }
            "no_default_permissions" => {
                no_default_permissions = true;
                continue;
            }
            "auto_unmount" => MountOption::AutoUnmount,
            "dev" => MountOption::Dev,
            "nodev" => MountOption::NoDev,
            "suid" => MountOption::Suid,
            "nosuid" => MountOption::NoSuid,
            "ro" => MountOption::RO,
            "rw" => MountOption::RW,
            "exec" => MountOption::Exec,
            "noexec" => MountOption::NoExec,
            "atime" => MountOption::Atime,
            "noatime" => MountOption::NoAtime,
            "dirsync" => MountOption::DirSync,
            "sync" => MountOption::Sync,
            "async" => MountOption::Async,
            x if x.starts_with("fsname=") => {
                fsname = true;
                MountOption::FSName(x["fsname=".len()..].to_string())
            }
            x if x.starts_with("subtype=") => {
                subtype = true;
                MountOption::Subtype(x["subtype=".len()..].to_string())
            }
            x => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("unknown mount option `{x}`"),
                ))
            }
        };
        c.mount_options.push(opt);
    }
    if default_permissions && no_default_permissions {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "default_permissions and no_default_permissions contradict each other",
        ));
    }
    let multi_user = c.acl != SessionACL::Owner;
    let checks = if default_permissions || (multi_user && !no_default_permissions) {
        PermChecks::Kernel
    } else {
        PermChecks::ScalevfsOnly
    };
    if checks == PermChecks::Kernel {
        c.mount_options.push(MountOption::DefaultPermissions);
    } else if multi_user {
        fuse.entry_timeout = Duration::ZERO;
        fuse.negative_timeout = Duration::ZERO;
    }
    if !fsname {
        c.mount_options.push(MountOption::FSName("scalevfs".into()));
    }
    if !subtype {
        c.mount_options
            .push(MountOption::Subtype("scalevfs".into()));
    }
    c.n_threads = Some(cfg.threads.max(1));
    // One /dev/fuse descriptor per thread: no shared read queue lock.
    c.clone_fd = true;
    Ok((c, fuse))
}

/// `-o noatime`: the kernel leaves atime to the filesystem, so the core's
/// root mount must know not to update it on reads (xfstests generic/120).
fn apply_noatime(vfs: &Vfs, options: &[String]) {
    let mut noatime = false;
    for o in options.iter().map(|o| o.trim()) {
        match o {
            "noatime" => noatime = true,
            "atime" | "relatime" | "strictatime" => noatime = false,
            _ => {}
        }
    }
    if noatime {
        // The root task is root and "/" is the root mount's root: this
        // cannot fail.
        let _ = vfs.root_task().set_noatime("/", true);
    }
}

/// Mount `vfs` at `mountpoint` and serve it from background threads.
pub fn spawn_mount(vfs: Vfs, mountpoint: &Path, cfg: &MountConfig) -> io::Result<FuseMount> {
    let (scfg, fuse) = session_config(cfg)?;
    apply_noatime(&vfs, &cfg.options);
    let fs = ScaleFs::new(vfs, fuse)
        .map_err(|e| io::Error::other(format!("cannot open the VFS root: {}", e.message())))?;
    let shared = fs.shared.clone();
    let mountpoint = mountpoint.canonicalize()?;
    let vfs = shared.vfs.clone();
    let mut session = Session::new(fs, &mountpoint, &scfg)?;
    let notifier = session.notifier();
    let _ = shared.notifier.set(notifier.clone());
    let unmounter = session.unmount_callable();
    let thread = std::thread::Builder::new()
        .name("scalevfs-fuse".into())
        .spawn(move || session.run())?;
    let listener = Arc::new(KernelInval {
        notifier: notifier.clone(),
        shared: Arc::downgrade(&shared),
    });
    vfs.add_change_listener(listener.clone());
    Ok(FuseMount {
        mountpoint,
        unmounter,
        thread: Some(thread),
        invalidator: Invalidator { notifier, shared },
        listener: Some(listener),
        vfs,
    })
}

// ---------------------------------------------------------------------
// `scalevfs mount`
// ---------------------------------------------------------------------

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("scalevfs mount: {msg}");
    ExitCode::FAILURE
}

fn secs(name: &str, v: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(v)
        .map_err(|_| format!("--{name} must be a non-negative number of seconds"))
}

/// `--size`: the same as `-o size=` (bytes with a k, m, g, t suffix, or
/// N% of RAM), one parser for both.
fn parse_size(s: &str) -> Result<u64, String> {
    scalevfs::MemFsOptions::parse_size(s.trim())
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

/// Everything that can be checked before mounting, with a clear message.
fn preflight(args: &MountArgs) -> Result<(), String> {
    match (args.fs.as_str(), &args.image) {
        ("memfs" | "ext4", Some(_)) => {}
        ("ext4", None) => return Err("--fs ext4 needs --image IMAGE".into()),
        ("memfs", None) => {}
        (other, _) => {
            return Err(format!(
                "unsupported --fs `{other}` (this build serves `memfs` and `ext4`)"
            ))
        }
    }
    let dir = &args.dir;
    let md = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !md.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let mut entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if entries.next().is_some() {
        return Err(format!("{} is not empty", dir.display()));
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(
            "/dev/fuse is missing: load the fuse module (modprobe fuse) or give the container the \
                        device (--device /dev/fuse)"
                .into(),
        ),
        Err(e) => return Err(format!("cannot open /dev/fuse: {e}")),
    }
    if let Some(p) = std::env::var_os("FUSERMOUNT_PATH") {
        if p.to_str().is_none() {
            return Err("FUSERMOUNT_PATH is not valid UTF-8".into());
        }
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let needs_helper = !root || args.options.iter().any(|o| o == "auto_unmount");
    if needs_helper
        && std::env::var_os("FUSERMOUNT_PATH").is_none()
        && !on_path("fusermount3")
        && !on_path("fusermount")
    {
        return Err("fusermount3 not found: install fuse3 (apt-get install fuse3)".into());
    }
    Ok(())
}

/// Make sure fds 0-2 are open (fuser refuses a /dev/fuse fd below 3).
fn ensure_std_fds() {
    for fd in 0..3 {
        // SAFETY: F_GETFD on any integer is harmless.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            // SAFETY: opening /dev/null with a static NUL-terminated path.
            unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
        }
    }
}

/// Block the termination signals in this thread (threads created later
/// inherit the mask) and return the set, for `sigwait`.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    set
}

/// Detach from the terminal: the parent returns once the child reports the
/// mount's outcome on a pipe (so `scalevfs mount` returns only when the
/// mount is usable, or with the child's error). Returns the write end in
/// the child; `Err` carries the parent's exit code.
fn daemonize() -> Result<i32, ExitCode> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors pipe writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(fail(format!("pipe: {}", io::Error::last_os_error())));
    }
    // SAFETY: called before this process starts any thread (run_mount forks
    // before creating the Vfs or the session), so the child is a complete
    // copy.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(fail(format!("fork: {}", io::Error::last_os_error())));
    }
    if pid > 0 {
        // SAFETY: closing our copy of the write end.
        unsafe { libc::close(fds[1]) };
        let mut msg = Vec::new();
        let mut buf = [0u8; 512];
        loop {
            // SAFETY: reading into a live buffer of the given length.
            let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            msg.extend_from_slice(&buf[..n as usize]);
        }
        return Err(match msg.first() {
            Some(0) => ExitCode::SUCCESS,
            Some(_) => fail(String::from_utf8_lossy(&msg[1..])),
            None => fail("the daemon died before mounting"),
        });
    }
    // SAFETY: closing the child's copy of the read end; setsid has no
    // preconditions.
    unsafe {
        libc::close(fds[0]);
        libc::setsid();
    }
    Ok(fds[1])
}

fn report(fd: i32, ok: bool, msg: &str) {
    let mut b = vec![if ok { 0u8 } else { 1u8 }];
    b.extend_from_slice(msg.as_bytes());
    // SAFETY: writing from a live buffer; closing our own descriptor.
    unsafe {
        libc::write(fd, b.as_ptr().cast(), b.len());
        libc::close(fd);
    }
}

fn detach_stdio() {
    // SAFETY: redirecting 0-2 to /dev/null; the fd from open is ours.
    unsafe {
        let n = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if n >= 0 {
            libc::dup2(n, 0);
            libc::dup2(n, 1);
            libc::dup2(n, 2);
            if n > 2 {
                libc::close(n);
            }
        }
    }
}

/// Apply the filesystem's own `-o` options (tmpfs's `size=` and
/// `nr_inodes=`) to `vcfg`; returns the others, the FUSE mount options.
pub fn fs_options(options: &[String], vcfg: &mut VfsConfig) -> Result<Vec<String>, String> {
    let mut rest = Vec::new();
    for o in options {
        match o.trim().split_once('=') {
            Some((k @ ("size" | "nr_inodes"), v)) => {
                vcfg.set(k, v).map_err(|m| format!("-o {o}: {m}"))?;
            }
            _ => rest.push(o.clone()),
        }
    }
    Ok(rest)
}

/// `scalevfs mount DIR ...`: mount, serve until unmounted (`fusermount3
/// -u`, `umount`, SIGINT, SIGTERM or SIGHUP), then exit.
pub fn run_mount(args: MountArgs) -> ExitCode {
    ensure_std_fds();
    if let Err(m) = preflight(&args) {
        return fail(m);
    }
    let fuse = match (|| -> Result<FuseConfig, String> {
        Ok(FuseConfig {
            attr_timeout: secs("attr-timeout", args.attr_timeout)?,
            entry_timeout: secs("entry-timeout", args.entry_timeout)?,
            negative_timeout: secs("negative-timeout", args.negative_timeout)?,
            readdirplus: !args.no_readdirplus,
        })
    })() {
        Ok(f) => f,
        Err(m) => return fail(m),
    };
    // The kernel applies its own fs.protected_hardlinks (may_linkat in
    // linkat(2)) before it sends LINK, for every filesystem; checking again
    // here would refuse links the host's sysctl allows (xfstests
    // generic/597). `--set protected-hardlinks=1` restores it.
    let mut vcfg = VfsConfig {
        protected_hardlinks_off: true,
        ..VfsConfig::default()
    };
    if let Some(size) = args.size {
        vcfg.memfs.max_bytes = size;
    }
    for kv in &args.set {
        let Some((k, v)) = kv.split_once('=') else {
            return fail(format!("--set wants KEY=VALUE, got `{kv}`"));
        };
        if let Err(m) = vcfg.set(k, v) {
            return fail(format!("--set {kv}: {m}"));
        }
    }
    let options = match fs_options(&args.options, &mut vcfg) {
        Ok(o) => o,
        Err(m) => return fail(m),
    };
    let cfg = MountConfig {
        fuse,
        options,
        threads: args.threads.unwrap_or_else(default_threads),
    };
    let (scfg, fuse) = match session_config(&cfg) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let dir = match args.dir.canonicalize() {
        Ok(d) => d,
        Err(e) => return fail(format!("{}: {e}", args.dir.display())),
    };
    // Open the image before detaching, so its errors reach the terminal.
    let ext4 = match &args.image {
        Some(img) => {
            let o = scalevfs_ext4::Ext4Options {
                ro: args.options.iter().any(|o| o == "ro"),
                ..Default::default()
            };
            match scalevfs_ext4::Ext4::open(img, o) {
                Ok(fs) => Some(fs),
                Err(e) => return fail(format!("{}: {e}", img.display())),
            }
        }
        None => None,
    };
    let root_fs: Option<Arc<dyn scalevfs::Filesystem>> =
        ext4.clone().map(|e| e as Arc<dyn scalevfs::Filesystem>);
    let status_fd = if args.foreground {
        None
    } else {
        match daemonize() {
            Ok(fd) => Some(fd),
            Err(code) => return code,
        }
    };
    let sigs = block_signals();
    let vfs = match root_fs {
        Some(fs) => Vfs::with_root_fs(vcfg, fs),
        None => Vfs::with_config(vcfg),
    };
    apply_noatime(&vfs, &args.options);
    let fs = match ScaleFs::new(vfs, fuse) {
        Ok(fs) => fs,
        Err(e) => {
            let m = format!("cannot open the VFS root: {}", e.message());
            if let Some(fd) = status_fd {
                report(fd, false, &m);
            }
            return fail(m);
        }
    };
    let shared = fs.shared.clone();
    let mut session = match Session::new(fs, &dir, &scfg) {
        Ok(s) => s,
        Err(e) => {
            let m = format!("mounting {} failed: {e}", dir.display());
            if let Some(fd) = status_fd {
                report(fd, false, &m);
            }
            return fail(m);
        }
    };
    let _ = shared.notifier.set(session.notifier());
    drop(shared);
    let mut unmounter = session.unmount_callable();
    let sig_dir = dir.clone();
    // Set before the signal thread unmounts: the kernel may then end the
    // session with ECONNABORTED instead of ENODEV (it aborts the connection
    // as the superblock goes), which is the end we asked for, not an error.
    let asked = Arc::new(AtomicBool::new(false));
    let asked2 = asked.clone();
    let spawned = std::thread::Builder::new()
        .name("scalevfs-signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: `sigs` is an initialised set and `sig` a valid out slot.
            if unsafe { libc::sigwait(&sigs, &mut sig) } == 0 {
                // SeqCst: read by the main thread after the session ends.
                asked2.store(true, Ordering::SeqCst);
                if unmounter.unmount().is_err() {
                    let _ = lazy_unmount(&sig_dir);
                }
            }
        });
    if let Err(e) = spawned {
        return fail(format!("cannot start the signal thread: {e}"));
    }
    match status_fd {
        Some(fd) => {
            report(fd, true, "");
            detach_stdio();
            // Do not keep the caller's cwd busy.
            let _ = std::env::set_current_dir("/");
        }
        None => eprintln!(
            "scalevfs: serving {} (Ctrl-C or fusermount3 -u to unmount)",
            dir.display()
        ),
    }
    let r = session.run();
    // Write a read-write image back and mark it clean (the VFS may drop
    // its filesystem late).
    if let Some(e) = &ext4 {
        if let Err(x) = e.unmount() {
            return fail(format!("writing the image back failed: {x}"));
        }
    }
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e)
            if e.raw_os_error() == Some(libc::ECONNABORTED) && asked.load(Ordering::SeqCst) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("FUSE session ended with an error: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `-o size=...,nr_inodes=...` sets the memfs limits and is not passed
    /// to FUSE; a bad value is an error.
    #[test]
    fn size_and_nr_inodes_options() {
        let mut v = VfsConfig::default();
        let opts: Vec<String> = ["allow_other", "size=64k", "nr_inodes=4", "ro"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let rest = fs_options(&opts, &mut v).unwrap();
        assert_eq!(rest, ["allow_other", "ro"]);
        assert_eq!(v.memfs.max_bytes, 65536);
        assert_eq!(v.memfs.max_inodes, 4);
        assert!(fs_options(&["size=lots".to_string()], &mut v).is_err());
        assert!(session_config(&MountConfig {
            options: vec!["size=64k".into()],
            ..MountConfig::default()
        })
        .is_err());
    }

    fn cfg(options: &[&str]) -> MountConfig {
        MountConfig {
            options: options.iter().map(|s| s.to_string()).collect(),
            ..MountConfig::default()
        }
    }

    fn has_default_permissions(c: &fuser::Config) -> bool {
        c.mount_options.contains(&MountOption::DefaultPermissions)
    }

    #[test]
    fn other_users_get_default_permissions_unless_opted_out() {
        let (c, f) = session_config(&cfg(&[])).unwrap();
        assert!(!has_default_permissions(&c));
        assert_eq!(f.entry_timeout, FuseConfig::default().entry_timeout);
        for o in ["allow_other", "allow_root"] {
            let (c, f) = session_config(&cfg(&[o])).unwrap();
            assert!(has_default_permissions(&c), "{o}");
            assert_eq!(f.entry_timeout, FuseConfig::default().entry_timeout);
            let (c, f) = session_config(&cfg(&[o, "no_default_permissions"])).unwrap();
            assert!(!has_default_permissions(&c), "{o}");
            assert!(f.entry_timeout.is_zero() && f.negative_timeout.is_zero());
        }
        let (c, _) = session_config(&cfg(&["default_permissions"])).unwrap();
        assert!(has_default_permissions(&c));
        // Only the owner: the opt-out keeps the caching it was given.
        let (c, f) = session_config(&cfg(&["no_default_permissions"])).unwrap();
        assert!(!has_default_permissions(&c));
        assert!(!f.entry_timeout.is_zero());
        assert!(session_config(&cfg(&["default_permissions", "no_default_permissions"])).is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("3m"), Ok(3 << 20));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert!(parse_size("0").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("-1K").is_err());
        assert!(parse_size("16777216T").is_err());
        assert_eq!(
            parse_size("5000"),
            Ok(8192),
            "rounded up to pages, as tmpfs"
        );
    }
}
