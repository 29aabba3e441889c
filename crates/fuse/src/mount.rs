//! Mounting: `scalevfs mount DIR`, an in-process [`spawn_mount`] for
//! embedders and tests, and the kernel notifications about changes made
//! through the library behind the kernel's back: automatic (a
//! [`scalevfs::ChangeListener`] registered by [`spawn_mount`]) and manual
//! (the [`Invalidator`]).

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{INodeNo, MountOption, Notifier, Session, SessionACL, SessionUnmounter};
use scalevfs::{ChangeListener, Task, Vfs, VfsConfig, AT_SYMLINK_NOFOLLOW};

use crate::ops::{FuseConfig, ScaleFs, Shared};

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

/// The default number of request threads: the CPUs, at most 16.
pub fn default_threads() -> usize {
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

    /// Whether write-only opens are served with FOPEN_DIRECT_IO (asked for
    /// by `FuseConfig::direct_write_only` and granted by the kernel).
    pub fn direct_write_only(&self) -> bool {
        self.invalidator.shared.direct_wronly()
    }

    /// Requests served so far, by operation (`lookup`, `getattr`, ...;
    /// operations never seen are left out). For tests and benchmarks: how
    /// many round trips a workload cost.
    pub fn request_counts(&self) -> Vec<(&'static str, u64)> {
        self.invalidator.shared.stats.snapshot()
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
        // The kernel may end a session it was asked to unmount with
        // ECONNABORTED (seen on 6.18 with several request threads; the
        // CLI's `mount` takes it as a clean end too): once our unmount
        // succeeded, that is the end we asked for (tests/mount_rss.rs
        // failed on it once in CI).
        let j = match j {
            Err(e) if r.is_ok() && e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(()),
            j => j,
        };
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
            // Write-only opens with FOPEN_DIRECT_IO (the default; see
            // `FuseConfig::direct_write_only`).
            "direct_wronly" => {
                fuse.direct_write_only = true;
                continue;
            }
            "nodirect_wronly" => {
                fuse.direct_write_only = false;
                continue;
            }
            // File handles of evicted inodes (`FuseConfig::export_handles`).
            "export" => {
                fuse.export_handles = true;
                continue;
            }
            "noexport" => {
                fuse.export_handles = false;
                continue;
            }
            // libfuse's spelling of the cache timeouts (seconds), so that
            // mount(8) and fstab can set them: `-o attr_timeout=1,
            // entry_timeout=1,negative_timeout=0` is the 1 s caching of
            // before issue 14.
            x if x.starts_with("attr_timeout=")
                || x.starts_with("entry_timeout=")
                || x.starts_with("negative_timeout=") =>
            {
                let (k, v) = x.split_once('=').unwrap_or((x, ""));
                let t = timeout_secs(v).map_err(|m| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("-o {k}={v}: {m}"))
                })?;
                match k {
                    "attr_timeout" => fuse.attr_timeout = t,
                    "entry_timeout" => fuse.entry_timeout = t,
                    _ => fuse.negative_timeout = t,
                }
                continue;
            }
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
        // mount(8): the last of a contradicting pair decides (`ro,rw` is
        // read-write, as the CLI's `read_only` reads it); fuser refuses
        // both at once, which came only after the image was opened and
        // the daemon forked. A repeated option counts once.
        let opposite = match opt {
            MountOption::Dev => Some(MountOption::NoDev),
            MountOption::NoDev => Some(MountOption::Dev),
            MountOption::Suid => Some(MountOption::NoSuid),
            MountOption::NoSuid => Some(MountOption::Suid),
            MountOption::RO => Some(MountOption::RW),
            MountOption::RW => Some(MountOption::RO),
            MountOption::Exec => Some(MountOption::NoExec),
            MountOption::NoExec => Some(MountOption::Exec),
            MountOption::Atime => Some(MountOption::NoAtime),
            MountOption::NoAtime => Some(MountOption::Atime),
            MountOption::Sync => Some(MountOption::Async),
            MountOption::Async => Some(MountOption::Sync),
            _ => None,
        };
        c.mount_options
            .retain(|x| *x != opt && Some(x) != opposite.as_ref());
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
        fuse.posix_acl = true;
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

/// A cache timeout in seconds (fractions allowed, at most a year).
fn timeout_secs(v: &str) -> Result<Duration, String> {
    let x: f64 = v.parse().map_err(|_| format!("`{v}` is not a number"))?;
    if !x.is_finite() || !(0.0..=365.0 * 86400.0).contains(&x) {
        return Err("must be 0 to 31536000 seconds".into());
    }
    Ok(Duration::from_secs_f64(x))
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

/// A filesystem mounted but not served yet, for a program that serves it
/// on a thread of its own and decides itself when to stop (the `scalevfs
/// mount` command): [`Mounted::unmounter`] ends it from another thread,
/// [`Mounted::serve`] answers requests until the mount goes.
#[derive(Debug)]
pub struct Mounted {
    session: Session<ScaleFs>,
    mountpoint: PathBuf,
    shared: Arc<Shared>,
}

/// The request counters of a [`Mounted`], readable while it serves and
/// after (`scalevfs mount --stats`).
#[derive(Clone, Debug)]
pub struct RequestCounts(Arc<Shared>);

impl RequestCounts {
    /// Requests served so far, by operation (see
    /// [`FuseMount::request_counts`]).
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        self.0.stats.snapshot()
    }
}

/// Unmounts a [`Mounted`] from another thread: the kernel unmount, or a
/// lazy one (`umount -l`) if the mount is busy.
#[derive(Debug)]
pub struct Unmounter {
    inner: SessionUnmounter,
    mountpoint: PathBuf,
}

impl Unmounter {
    pub fn unmount(&mut self) -> io::Result<()> {
        self.inner
            .unmount()
            .or_else(|_| lazy_unmount(&self.mountpoint))
    }
}

impl Mounted {
    /// A handle on the request counters.
    pub fn request_counts(&self) -> RequestCounts {
        RequestCounts(self.shared.clone())
    }

    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter {
            inner: self.session.unmount_callable(),
            mountpoint: self.mountpoint.clone(),
        }
    }

    /// Serve requests on `cfg.threads` threads until the filesystem is
    /// unmounted. `Ok` when the kernel ended the session (unmount); an
    /// `ECONNABORTED` error means the connection was aborted (the kernel may
    /// also end a session that way when it is unmounted: the caller knows
    /// whether it asked).
    pub fn serve(self) -> io::Result<()> {
        self.session.run()
    }
}

/// Check mount options and timeouts as [`mount`] would, without mounting
/// (so a command can report a bad option before it opens anything).
pub fn check_config(cfg: &MountConfig) -> Result<(), String> {
    session_config(cfg).map(|_| ()).map_err(|e| e.to_string())
}

/// Whether the kernel checks permissions on a mount of `cfg`
/// (`default_permissions`, given or implied by `allow_other`): then its
/// own checks, protected_hardlinks among them (may_linkat asks for read
/// and write permission), are exact before a request arrives. Without,
/// the kernel lets every permission question through and scalevfs alone
/// answers. A bad configuration (which `check_config` reports) counts as
/// checked.
pub fn kernel_checks_permissions(cfg: &MountConfig) -> bool {
    session_config(cfg).map_or(true, |(c, _)| {
        c.mount_options.contains(&MountOption::DefaultPermissions)
    })
}

/// Mount `vfs` at `mountpoint` (an existing directory; canonicalised) without
/// serving it yet: see [`Mounted`]. The errors say which step failed.
pub fn mount(vfs: Vfs, mountpoint: &Path, cfg: &MountConfig) -> Result<Mounted, String> {
    let (scfg, fuse) = session_config(cfg).map_err(|e| e.to_string())?;
    let mountpoint = mountpoint
        .canonicalize()
        .map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    apply_noatime(&vfs, &cfg.options);
    let fs = ScaleFs::new(vfs, fuse)
        .map_err(|e| format!("cannot open the VFS root: {}", e.message()))?;
    let shared = fs.shared.clone();
    let session = Session::new(fs, &mountpoint, &scfg)
        .map_err(|e| format!("mounting {} failed: {e}", mountpoint.display()))?;
    let _ = shared.notifier.set(session.notifier());
    Ok(Mounted {
        session,
        mountpoint,
        shared,
    })
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

    /// Contradicting pairs: the last decides, as mount(8) (fuser refuses
    /// a configuration holding both); repeats count once.
    #[test]
    fn the_last_of_contradicting_options_decides() {
        let (c, _) =
            session_config(&cfg(&["ro", "nodev", "rw", "dev", "nosuid", "nosuid"])).unwrap();
        let has = |o: MountOption| c.mount_options.iter().filter(|x| **x == o).count();
        assert_eq!(has(MountOption::RW), 1);
        assert_eq!(has(MountOption::RO), 0);
        assert_eq!(has(MountOption::Dev), 1);
        assert_eq!(has(MountOption::NoDev), 0);
        assert_eq!(has(MountOption::NoSuid), 1);
        let (c, _) =
            session_config(&cfg(&["rw", "exec", "ro", "noexec", "async", "sync"])).unwrap();
        assert!(c.mount_options.contains(&MountOption::RO));
        assert!(!c.mount_options.contains(&MountOption::RW));
        assert!(c.mount_options.contains(&MountOption::NoExec));
        assert!(!c.mount_options.contains(&MountOption::Exec));
        assert!(c.mount_options.contains(&MountOption::Sync));
        assert!(!c.mount_options.contains(&MountOption::Async));
    }

    /// `-o attr_timeout=,entry_timeout=,negative_timeout=` (libfuse's
    /// spelling) set the caches; bad values are errors; the multi-user
    /// opt-out still forces names uncached whatever `-o` says.
    #[test]
    fn timeout_options() {
        let (_, f) = session_config(&cfg(&[])).unwrap();
        assert_eq!(f.attr_timeout, crate::DEFAULT_TIMEOUT);
        assert_eq!(f.negative_timeout, crate::DEFAULT_TIMEOUT);
        let (c, f) = session_config(&cfg(&[
            "attr_timeout=1",
            "entry_timeout=0.5",
            "negative_timeout=0",
        ]))
        .unwrap();
        assert_eq!(f.attr_timeout, Duration::from_secs(1));
        assert_eq!(f.entry_timeout, Duration::from_millis(500));
        assert!(f.negative_timeout.is_zero());
        assert!(c.mount_options.iter().all(|o| !matches!(
            o,
            MountOption::CUSTOM(x) if x.contains("timeout")
        )));
        assert!(f.direct_write_only);
        let (_, f) = session_config(&cfg(&["nodirect_wronly"])).unwrap();
        assert!(!f.direct_write_only);
        assert!(f.export_handles);
        let (c, f) = session_config(&cfg(&["noexport"])).unwrap();
        assert!(!f.export_handles);
        assert!(c
            .mount_options
            .iter()
            .all(|o| !matches!(o, MountOption::CUSTOM(x) if x.contains("export"))));
        let (_, f) = session_config(&cfg(&["noexport", "export"])).unwrap();
        assert!(f.export_handles);
        for bad in ["attr_timeout=-1", "entry_timeout=x", "negative_timeout=inf"] {
            assert!(session_config(&cfg(&[bad])).is_err(), "{bad}");
        }
        let (_, f) = session_config(&cfg(&[
            "allow_other",
            "no_default_permissions",
            "entry_timeout=5",
            "negative_timeout=5",
        ]))
        .unwrap();
        assert!(f.entry_timeout.is_zero() && f.negative_timeout.is_zero());
    }
}
