//! What the FUSE mount tests share: whether FUSE can be used here (and
//! the `SCALEVFS_REQUIRE_FUSE=1` rule that turns a skip into a failure),
//! scratch mount points, an in-process mount that unmounts on drop, and
//! small libc helpers. Each test file uses the part it needs.
#![allow(dead_code)]

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use scalevfs::Vfs;
use scalevfs_fuse::{spawn_mount, FuseConfig, FuseMount, MountConfig};

/// Why FUSE cannot be used here, if it cannot: /dev/fuse must open, and a
/// non-root process needs fusermount3.
pub fn fuse_unavailable() -> Option<String> {
    if let Err(e) = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Some(format!("/dev/fuse cannot be opened: {e}"));
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let helper = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").is_file()))
        .unwrap_or(false);
    if !root && !helper {
        return Some("not root and no fusermount3 on PATH".into());
    }
    None
}

/// Whether `test` runs: false (with the reason printed) where `why_not`
/// names a missing requirement; a panic instead if SCALEVFS_REQUIRE_FUSE=1.
pub fn requirement_ok(test: &str, why_not: Option<String>) -> bool {
    match why_not {
        None => true,
        Some(why) => {
            if std::env::var("SCALEVFS_REQUIRE_FUSE").as_deref() == Ok("1") {
                panic!("{test}: FUSE required (SCALEVFS_REQUIRE_FUSE=1) but unavailable: {why}");
            }
            eprintln!("SKIPPED {test}: {why}");
            false
        }
    }
}

/// Whether a FUSE test can run here (see [`requirement_ok`]).
pub fn fuse_ok(test: &str) -> bool {
    requirement_ok(test, fuse_unavailable())
}

/// A fresh directory under the temporary directory, mode 0755 (other
/// users can reach a mount on it).
pub fn scratch_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "scalevfs-fuse-{}-{}-{}",
        tag,
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// A memfs mounted in-process on a scratch directory; unmounted (and the
/// directory removed) on drop.
pub struct Mounted {
    pub m: Option<FuseMount>,
    pub dir: PathBuf,
    pub vfs: Vfs,
}

impl Mounted {
    /// `-o allow_other`, 4 threads.
    pub fn new(tag: &str, fuse: FuseConfig) -> Mounted {
        Mounted::with(tag, &["allow_other"], fuse, 4)
    }
    pub fn with(tag: &str, options: &[&str], fuse: FuseConfig, threads: usize) -> Mounted {
        let dir = scratch_dir(tag);
        let vfs = Vfs::new();
        let cfg = MountConfig {
            fuse,
            options: options.iter().map(|s| s.to_string()).collect(),
            threads,
        };
        let m = spawn_mount(vfs.clone(), &dir, &cfg).expect("mount");
        Mounted {
            m: Some(m),
            dir,
            vfs,
        }
    }
    pub fn p(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }
    pub fn mount(&self) -> &FuseMount {
        self.m.as_ref().unwrap()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(m) = self.m.take() {
            let _ = m.unmount();
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

pub fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// Requests of operation `op` the daemon has served.
pub fn served(m: &FuseMount, op: &str) -> u64 {
    m.request_counts()
        .iter()
        .find(|c| c.0 == op)
        .map_or(0, |c| c.1)
}
