//! `scalevfs mount`: the command around the FUSE front end's library
//! (`scalevfs_fuse::mount`): its arguments, the checks before mounting with
//! clear messages, opening an ext4 image, detaching from the terminal (the
//! parent returns once the mount is usable), the signals that unmount, and
//! writing an image back at the end.

use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use scalevfs::{Vfs, VfsConfig};
use scalevfs_fuse::{FuseConfig, MountConfig};

/// `scalevfs mount` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct MountArgs {
    /// Mount point: an existing, empty directory.
    pub dir: PathBuf,
    /// Filesystem type to serve: `memfs` (the default), or `ext4` (implied
    /// by `--image`).
    #[arg(long = "fs")]
    pub fs: Option<String>,
    /// Serve this ext4 image (or block device) instead of a memfs;
    /// read-write unless `-o ro`.
    #[arg(long)]
    pub image: Option<PathBuf>,
    /// Mount options, comma separated (allow_other, allow_root,
    /// default_permissions, no_default_permissions, ro, auto_unmount,
    /// fsname=..., dev, suid, ...), the kernel's cache timeouts as libfuse
    /// spells them (attr_timeout=S, entry_timeout=S, negative_timeout=S;
    /// default 60 s each), nodirect_wronly (write-only opens through the
    /// page cache, as before issue 14), noexport (no file handles of
    /// evicted inodes; for overlayfs over this mount, see
    /// docs/fuse-compat.md), ext4's orphan=auto|file|list|none,
    /// commit=SECONDS (default 5; 0 means 5, as for the kernel's ext4),
    /// mmap (the image mapped into memory, every block
    /// allocated first) and pwrite (the image written with pwrite, not
    /// through the default mapping allocated 1 MiB at a time on first
    /// write, which is used for image files on tmpfs, ext4 and XFS), with
    /// --image; and memfs's limits as tmpfs spells
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
    /// Seconds the kernel may cache attributes (0: always ask). Default 60:
    /// the kernel learns of every change (see docs/fuse-compat.md,
    /// "Caching"). Also `-o attr_timeout=`, which wins.
    #[arg(long)]
    pub attr_timeout: Option<f64>,
    /// Seconds the kernel may cache names. Default 60; `-o entry_timeout=`.
    #[arg(long)]
    pub entry_timeout: Option<f64>,
    /// Seconds the kernel may cache "no such file" (0: never). Default 60;
    /// `-o negative_timeout=`.
    #[arg(long)]
    pub negative_timeout: Option<f64>,
    /// Print the requests served, by operation, on stderr at unmount.
    /// Needs --foreground (refused without it: a detached daemon has no
    /// stderr).
    #[arg(long)]
    pub stats: bool,
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
    match (args.fs.as_deref().unwrap_or("memfs"), &args.image) {
        ("memfs", Some(_)) if args.fs.is_some() => {
            return Err("--fs memfs and --image: an image is served as ext4".into())
        }
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
pub(crate) fn block_signals() -> libc::sigset_t {
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
    // before opening an image, whose commit thread a fork would not copy,
    // and before creating the Vfs or the session), so the child is a
    // complete copy.
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

/// Tell the waiting parent how the mount went; false if it is gone (it
/// was interrupted, Ctrl-C, while the daemon opened the image: the
/// daemon then must not serve a mount nobody asked for any more).
fn report(fd: i32, ok: bool, msg: &str) -> bool {
    let mut b = vec![if ok { 0u8 } else { 1u8 }];
    b.extend_from_slice(msg.as_bytes());
    // SAFETY: writing from a live buffer; closing our own descriptor.
    // (SIGPIPE is ignored by the Rust runtime: a gone reader is EPIPE.)
    unsafe {
        let n = libc::write(fd, b.as_ptr().cast(), b.len());
        libc::close(fd);
        n == b.len() as isize
    }
}

/// A failure before serving: reported to the parent, which prints it
/// (the daemon printing it too would show it twice), or printed here in
/// the foreground.
fn fail_early(status_fd: Option<i32>, m: String) -> ExitCode {
    match status_fd {
        Some(fd) => {
            report(fd, false, &m);
            ExitCode::FAILURE
        }
        None => fail(m),
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

/// `scalevfs mount DIR ...`: mount, serve until unmounted (`fusermount3
/// -u`, `umount`, SIGINT, SIGTERM or SIGHUP), then exit.
/// Whether `-o` asks for a read-only mount: the last of `ro` and `rw`
/// (mount(8) reads options left to right).
fn read_only(options: &[String]) -> bool {
    options
        .iter()
        .rev()
        .find(|o| *o == "ro" || *o == "rw")
        .is_some_and(|o| o == "ro")
}

pub fn run(mut args: MountArgs) -> ExitCode {
    ensure_std_fds();
    // `-o "allow_other, ro"`: each option as the kernel would read it, so
    // that every check below sees `ro` (an untrimmed " ro" once opened
    // the image read-write while the kernel side was read-only).
    for o in &mut args.options {
        *o = o.trim().to_string();
    }
    args.options.retain(|o| !o.is_empty());
    // A detached daemon's stderr is /dev/null: --stats alone would print
    // nothing, so it is a usage error (exit 2, as clap's).
    if args.stats && !args.foreground {
        eprintln!(
            "scalevfs mount: --stats needs --foreground (-f): a detached daemon has no \
             terminal to print the counts on"
        );
        return ExitCode::from(2);
    }
    if let Err(m) = preflight(&args) {
        return fail(m);
    }
    let fuse = match (|| -> Result<FuseConfig, String> {
        let d = FuseConfig::default();
        let or = |name, v: Option<f64>, dflt| v.map_or(Ok(dflt), |v| secs(name, v));
        Ok(FuseConfig {
            attr_timeout: or("attr-timeout", args.attr_timeout, d.attr_timeout)?,
            entry_timeout: or("entry-timeout", args.entry_timeout, d.entry_timeout)?,
            negative_timeout: or(
                "negative-timeout",
                args.negative_timeout,
                d.negative_timeout,
            )?,
            readdirplus: !args.no_readdirplus,
            ..d
        })
    })() {
        Ok(f) => f,
        Err(m) => return fail(m),
    };
    // The kernel applies its own fs.protected_hardlinks (may_linkat in
    // linkat(2)) before it sends LINK, for every filesystem; checking again
    // here would refuse links the host's sysctl allows (xfstests
    // generic/597). `--set protected-hardlinks=1` restores it. (Without
    // default_permissions it is the host's setting: below.)
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
    // ext4 options (`--image` only): orphan=auto|file|list|none,
    // commit=SECONDS.
    let mut ext4_opts = scalevfs_ext4::Ext4Options::default();
    let mut fuse_opts = Vec::new();
    let mut mmap = false;
    for o in &args.options {
        if o.trim() == "mmap" || o.trim() == "pwrite" {
            if args.image.is_none() {
                return fail(format!(
                    "-o {} applies to ext4 images (--image) only",
                    o.trim()
                ));
            }
            if o.trim() == "mmap" {
                mmap = true;
            } else {
                ext4_opts.io = scalevfs_ext4::IoMode::Pwrite;
            }
            continue;
        }
        let r = match o.trim().split_once('=') {
            Some(("orphan", v)) => v.parse().map(|m| ext4_opts.orphans = m),
            // As the kernel's ext4: 0 is the default (5 s), and more than
            // INT_MAX / HZ (HZ = 1000) seconds is refused.
            Some(("commit", v)) => match v.parse::<u64>() {
                Ok(0) => {
                    ext4_opts.commit_interval = 5;
                    Ok(())
                }
                Ok(n) if n <= 2_147_483 => {
                    ext4_opts.commit_interval = n;
                    Ok(())
                }
                Ok(_) => Err(format!("commit={v}: at most 2147483 seconds")),
                Err(_) => Err(format!("commit={v}: expected seconds")),
            },
            _ => {
                fuse_opts.push(o.clone());
                continue;
            }
        };
        if let Err(m) = r {
            return fail(format!("-o {m}"));
        }
        if args.image.is_none() {
            return fail(format!("-o {o} applies to ext4 images (--image) only"));
        }
    }
    // memfs's limits mean nothing to an image (its size is its own): an
    // error rather than a silent no-op.
    if args.image.is_some() {
        let memfs_only = fuse_opts
            .iter()
            .find(|o| o.starts_with("size=") || o.starts_with("nr_inodes="));
        if let Some(o) = memfs_only {
            return fail(format!("-o {o} applies to memfs only, not to --image"));
        }
        if args.size.is_some() {
            return fail("--size applies to memfs only, not to --image".to_string());
        }
    }
    let options = match scalevfs_fuse::mount::fs_options(&fuse_opts, &mut vcfg) {
        Ok(o) => o,
        Err(m) => return fail(m),
    };
    let cfg = MountConfig {
        fuse,
        options,
        threads: args.threads.unwrap_or_else(scalevfs_fuse::default_threads),
    };
    if let Err(m) = scalevfs_fuse::check_config(&cfg) {
        return fail(m);
    }
    // Without default_permissions the kernel's may_linkat finds every
    // file readable and writable (it asks the filesystem, which lets it
    // through): the host's fs.protected_hardlinks is then applied here,
    // unless `--set protected-hardlinks=` said otherwise.
    let explicit = args
        .set
        .iter()
        .any(|kv| kv.starts_with("protected-hardlinks="));
    if !explicit && !scalevfs_fuse::mount::kernel_checks_permissions(&cfg) {
        vcfg.protected_hardlinks_off = std::fs::read_to_string("/proc/sys/fs/protected_hardlinks")
            .is_ok_and(|v| v.trim() == "0");
    }
    // Detach before the image is opened: opening it starts its commit
    // thread (which a fork would not copy) and takes its claim (flock),
    // and a parent holding an open image would unmount it on its way
    // out (a final commit, the journal marked clean, the claim let go)
    // under the daemon that serves it. Errors opening it reach the
    // terminal through the status pipe.
    let status_fd = if args.foreground {
        None
    } else {
        match daemonize() {
            Ok(fd) => Some(fd),
            Err(code) => return code,
        }
    };
    // Before any thread starts (the image's commit thread, the FUSE
    // workers): every thread inherits the blocked set, and SIGINT, SIGTERM
    // and SIGHUP reach only the signal thread's sigwait, which unmounts.
    // A thread started before (the commit thread was) could take one and
    // the default action end the process with the image not written back
    // and the mount left dead.
    let sigs = block_signals();
    let ext4 = match &args.image {
        Some(img) => {
            // The last of `ro` and `rw` decides, as for the kernel side.
            let ro = read_only(&args.options);
            // A journal left by a crash is replayed as the kernel does at
            // mount: onto the image read-write, in memory read-only.
            let o = scalevfs_ext4::Ext4Options {
                ro,
                orphans: ext4_opts.orphans,
                commit_interval: ext4_opts.commit_interval,
                io: ext4_opts.io,
                replay: if ro {
                    scalevfs_ext4::journal::Replay::InMemory
                } else {
                    scalevfs_ext4::journal::Replay::OnDevice
                },
                ..Default::default()
            };
            let open = || {
                if mmap {
                    scalevfs_ext4::MmapDevice::open(img, !ro)
                        .map_err(scalevfs_ext4::Error::Io)
                        .and_then(|d| scalevfs_ext4::Ext4::open_device(Box::new(d), o.clone()))
                } else {
                    scalevfs_ext4::Ext4::open(img, o.clone())
                }
            };
            // `umount` returns before the previous mount's daemon has
            // written the image back and let go of its claim (flock): wait
            // for that a while rather than fail at once.
            let busy = |r: &Result<_, scalevfs_ext4::Error>| {
                matches!(r, Err(scalevfs_ext4::Error::Io(e))
                    if e.kind() == std::io::ErrorKind::WouldBlock)
            };
            let mut opened = open();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            if busy(&opened) {
                eprintln!(
                    "scalevfs: {} is open read-write elsewhere; waiting up to 10 s for it to be let go",
                    img.display()
                );
                while busy(&opened) && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    opened = open();
                }
            }
            match opened {
                Ok(fs) => Some(fs),
                Err(e) => return fail_early(status_fd, format!("{}: {e}", img.display())),
            }
        }
        None => None,
    };
    let root_fs: Option<Arc<dyn scalevfs::Filesystem>> =
        ext4.clone().map(|e| e as Arc<dyn scalevfs::Filesystem>);
    let vfs = match root_fs {
        Some(fs) => Vfs::with_root_fs(vcfg, fs),
        None => Vfs::with_config(vcfg),
    };
    let mut mounted = match scalevfs_fuse::mount(vfs, &args.dir, &cfg) {
        Ok(m) => m,
        Err(m) => {
            // Leave a read-write image clean: nothing was served.
            if let Some(e) = &ext4 {
                let _ = e.unmount();
            }
            return fail_early(status_fd, m);
        }
    };
    let mut unmounter = mounted.unmounter();
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
                let _ = unmounter.unmount();
            }
        });
    if let Err(e) = spawned {
        return fail_early(status_fd, format!("cannot start the signal thread: {e}"));
    }
    let dir = args.dir.canonicalize().unwrap_or_else(|_| args.dir.clone());
    match status_fd {
        Some(fd) => {
            if !report(fd, true, "") {
                // The parent is gone: unmount through the signal thread,
                // as a Ctrl-C would; `serve` below then ends and the
                // image is written back as at any unmount.
                // SAFETY: sending a signal to ourselves.
                unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
            }
            detach_stdio();
            // Do not keep the caller's cwd busy.
            let _ = std::env::set_current_dir("/");
        }
        None => eprintln!(
            "scalevfs: serving {} (Ctrl-C or fusermount3 -u to unmount)",
            dir.display()
        ),
    }
    let counts = mounted.request_counts();
    let r = mounted.serve();
    if args.stats {
        eprintln!(
            "scalevfs: {}",
            scalevfs_fuse::format_counts(&counts.snapshot())
        );
    }
    // Write a read-write image back and mark it clean (the VFS may drop
    // its filesystem late).
    if let Some(e) = &ext4 {
        if let Err(x) = e.unmount() {
            return fail(format!("writing the image back failed: {x}"));
        }
    }
    match r {
        Ok(()) => ExitCode::SUCCESS,
        // An unmount by someone else (fusermount3 -u, umount) may end
        // the session the same way (seen on kernel 6.18 with several
        // reader threads): the mount being gone tells it from an abort
        // through /sys/fs/fuse/connections, which leaves the mount in
        // place (ENOTCONN) until it is unmounted.
        Err(e)
            if e.raw_os_error() == Some(libc::ECONNABORTED)
                && (asked.load(Ordering::SeqCst) || !mounted_at(&dir)) =>
        {
            if !asked.load(Ordering::SeqCst) {
                eprintln!("scalevfs: unmounted (the kernel ended the session with ECONNABORTED)");
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("FUSE session ended with an error: {e}")),
    }
}

/// Whether `/proc/self/mountinfo` lists a mount at `dir` (an absolute,
/// canonical path). Unknown (no /proc): assumed mounted, so an abort is
/// reported as one.
fn mounted_at(dir: &std::path::Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return true;
    };
    mountinfo_has(&info, dir)
}

/// `mounted_at` on the text of a mountinfo file: the fifth field of a
/// line is the mount point, with space, tab, newline and backslash
/// written as three octal digits after a backslash.
fn mountinfo_has(info: &str, dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let want = dir.as_os_str().as_bytes();
    info.lines().any(|l| {
        let Some(field) = l.split(' ').nth(4) else {
            return false;
        };
        let b = field.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            let oct = b
                .get(i + 1..i + 4)
                .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
            match (b[i], oct) {
                (b'\\', Some(d)) => {
                    let v = d.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
                    out.push(v as u8);
                    i += 4;
                }
                (c, _) => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        out == want
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_mount_points() {
        let info = "22 1 0:21 / / rw,relatime - ext4 /dev/root rw\n\
                    40 22 0:40 / /tmp/a\\040b rw - fuse.scalevfs scalevfs rw\n\
                    41 22 0:41 / /mnt/x rw - tmpfs tmpfs rw\n";
        assert!(mountinfo_has(info, std::path::Path::new("/tmp/a b")));
        assert!(mountinfo_has(info, std::path::Path::new("/mnt/x")));
        assert!(!mountinfo_has(info, std::path::Path::new("/tmp/a")));
        assert!(!mountinfo_has(info, std::path::Path::new("/mnt/x/y")));
        assert!(!mountinfo_has("garbage\n\n", std::path::Path::new("/")));
    }

    #[test]
    fn read_only_is_the_last_of_ro_and_rw() {
        let o = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(read_only(&o(&["allow_other", "ro"])));
        assert!(!read_only(&o(&["ro", "rw"])));
        assert!(read_only(&o(&["rw", "noatime", "ro"])));
        assert!(!read_only(&o(&["allow_other"])));
        // `run` trims first: " ro" is `ro` by then.
        assert!(!read_only(&o(&[" ro"])));
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
