//! Peers for `scalevfs bench --peers`: other filesystems measured on the same
//! workloads in the same process.
//!
//! - [`VfsMemoryFs`] (`vfs-memoryfs`): the Rust `vfs` crate's `MemoryFS`. It
//!   keeps one `HashMap<String, file>` of whole paths under one `RwLock`, so a
//!   "stat" is one read-lock plus one hash of the whole path string: no
//!   component walk and no permission check.
//! - [`LinuxTmpfs`] (`linux-tmpfs`): the host kernel's tmpfs through real
//!   system calls (`mkdirat`, `openat`, `fstatat`) on a private directory under
//!   `/dev/shm`. Paths are resolved relative to a directory fd, so a depth-N
//!   path really walks N components. It is the semantic reference and a
//!   sanity anchor for speed (each call pays a user/kernel crossing).
//!
//! Both implement [`PeerFs`]; the bench crate drives them with the same
//! worker loop it uses for scalevfs. Nothing here knows about scalevfs, and
//! scalevfs does not depend on this crate.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use vfs::FileSystem;

/// A filesystem the bench can build a tree in and stat paths of.
pub trait PeerFs: Send + Sync {
    /// A path prepared once so the timed loop does no formatting.
    type Path: Send + Sync;
    /// The peer's name in reports.
    fn name(&self) -> &'static str;
    /// Create directory `rel` (relative to the peer's root, `/`-separated).
    fn mkdir(&self, rel: &str) -> Result<(), String>;
    /// Create an empty regular file `rel`.
    fn create(&self, rel: &str) -> Result<(), String>;
    /// Prepare `rel` for [`PeerFs::stat`].
    fn path(&self, rel: &str) -> Result<Self::Path, String>;
    /// Stat a prepared path; returns the file size.
    fn stat(&self, p: &Self::Path) -> Result<u64, String>;
}

/// The Rust `vfs` crate's in-memory filesystem.
pub struct VfsMemoryFs {
    fs: vfs::MemoryFS,
}

impl VfsMemoryFs {
    /// An empty filesystem.
    pub fn new() -> VfsMemoryFs {
        VfsMemoryFs {
            fs: vfs::MemoryFS::new(),
        }
    }
}

impl Default for VfsMemoryFs {
    fn default() -> Self {
        VfsMemoryFs::new()
    }
}

fn abs(rel: &str) -> String {
    format!("/{}", rel.trim_start_matches('/'))
}

impl PeerFs for VfsMemoryFs {
    type Path = String;
    fn name(&self) -> &'static str {
        "vfs-memoryfs"
    }
    fn mkdir(&self, rel: &str) -> Result<(), String> {
        self.fs
            .create_dir(&abs(rel))
            .map_err(|e| format!("vfs mkdir {rel}: {e}"))
    }
    fn create(&self, rel: &str) -> Result<(), String> {
        self.fs
            .create_file(&abs(rel))
            .map(drop)
            .map_err(|e| format!("vfs create {rel}: {e}"))
    }
    fn path(&self, rel: &str) -> Result<String, String> {
        Ok(abs(rel))
    }
    #[inline]
    fn stat(&self, p: &String) -> Result<u64, String> {
        self.fs
            .metadata(p)
            .map(|m| m.len)
            .map_err(|e| format!("vfs metadata {p}: {e}"))
    }
}

/// The host kernel's tmpfs, through system calls, in a private directory
/// that is removed on drop.
pub struct LinuxTmpfs {
    dir: PathBuf,
    dirfd: OwnedFd,
}

fn cstr(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("NUL in path {s:?}"))
}

fn last_err(what: &str, rel: &str) -> String {
    format!("{what} {rel}: {}", std::io::Error::last_os_error())
}

impl LinuxTmpfs {
    /// A fresh directory under `/dev/shm` (tmpfs on Linux).
    pub fn new() -> Result<LinuxTmpfs, String> {
        Self::new_in(Path::new("/dev/shm"))
    }

    /// A fresh directory under `base`.
    pub fn new_in(base: &Path) -> Result<LinuxTmpfs, String> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static SEQ: AtomicU64 = AtomicU64::new(0);
        // Relaxed: only uniqueness matters.
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("scalevfs-bench-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let c = cstr(dir.to_str().ok_or("non-UTF-8 base directory")?)?;
        // SAFETY: `c` is a valid NUL-terminated string; open has no other
        // preconditions.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = last_err("open", dir.to_str().unwrap_or("?"));
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        // SAFETY: `fd` was just returned by open and is owned by nobody else.
        let dirfd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(LinuxTmpfs { dir, dirfd })
    }

    /// The directory the tree lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for LinuxTmpfs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PeerFs for LinuxTmpfs {
    type Path = CString;
    fn name(&self) -> &'static str {
        "linux-tmpfs"
    }
    fn mkdir(&self, rel: &str) -> Result<(), String> {
        let c = cstr(rel.trim_start_matches('/'))?;
        // SAFETY: valid dirfd (owned by self) and NUL-terminated path.
        let r = unsafe { libc::mkdirat(self.dirfd.as_raw_fd(), c.as_ptr(), 0o755) };
        if r != 0 {
            return Err(last_err("mkdirat", rel));
        }
        Ok(())
    }
    fn create(&self, rel: &str) -> Result<(), String> {
        let c = cstr(rel.trim_start_matches('/'))?;
        // SAFETY: valid dirfd (owned by self) and NUL-terminated path.
        let fd = unsafe {
            libc::openat(
                self.dirfd.as_raw_fd(),
                c.as_ptr(),
                libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(last_err("openat", rel));
        }
        // SAFETY: `fd` was just returned by openat and is owned by us.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(())
    }
    fn path(&self, rel: &str) -> Result<CString, String> {
        cstr(rel.trim_start_matches('/'))
    }
    #[inline]
    fn stat(&self, p: &CString) -> Result<u64, String> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: valid dirfd, NUL-terminated path, and `st` points to
        // writable memory of the right size.
        let r = unsafe { libc::fstatat(self.dirfd.as_raw_fd(), p.as_ptr(), st.as_mut_ptr(), 0) };
        if r != 0 {
            return Err(last_err("fstatat", p.to_str().unwrap_or("?")));
        }
        // SAFETY: fstatat returned 0, so it filled `st`.
        let st = unsafe { st.assume_init() };
        Ok(st.st_size as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree<P: PeerFs>(p: &P) {
        p.mkdir("a").unwrap();
        p.mkdir("a/b").unwrap();
        p.create("a/b/f").unwrap();
        let path = p.path("a/b/f").unwrap();
        assert_eq!(p.stat(&path).unwrap(), 0);
        assert!(p.stat(&p.path("a/nope").unwrap()).is_err());
    }

    #[test]
    fn memoryfs_builds_and_stats() {
        tree(&VfsMemoryFs::new());
    }

    #[test]
    fn tmpfs_builds_and_stats() {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let t = LinuxTmpfs::new_in(&base).unwrap();
        let dir = t.dir().to_path_buf();
        tree(&t);
        drop(t);
        assert!(!dir.exists());
    }
}
