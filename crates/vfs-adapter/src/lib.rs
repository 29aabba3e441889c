//! scalevfs behind the [`vfs`] crate's [`FileSystem`] trait, so a program
//! written against `vfs` (`VfsPath`) can swap it in for `MemoryFS` or
//! `PhysicalFS`:
//!
//! ```
//! use std::io::{Read, Write};
//! use vfs::VfsPath;
//! use scalevfs_vfs_adapter::ScaleFS;
//!
//! let root: VfsPath = ScaleFS::new_memory().into();
//! root.join("dir")?.create_dir()?;
//! write!(root.join("dir/f.txt")?.create_file()?, "hi")?;
//! let mut s = String::new();
//! root.join("dir/f.txt")?.open_file()?.read_to_string(&mut s)?;
//! assert_eq!(s, "hi");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Like `PhysicalFS`, a [`ScaleFS`] serves one directory of the scalevfs
//! namespace as the `vfs` root (by default, the task's `/`), and calls are
//! made through [`scalevfs::fs::Fs`] as its task: permissions, symlinks
//! and errors are those of scalevfs (Linux's). An `io::Error` reaches the
//! `vfs` caller as `VfsErrorKind::IoError` with the errno, except NotFound
//! (`FileNotFound`, as `vfs` maps it) and an existing name given to
//! `create_dir` (`DirectoryExists`/`FileExists`, as `PhysicalFS`).

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use scalevfs::fs::Fs;
use scalevfs::{Timespec, Vfs, AT_FDCWD, UTIME_OMIT};
use vfs::error::VfsErrorKind;
use vfs::{FileSystem, SeekAndRead, SeekAndWrite, VfsError, VfsFileType, VfsMetadata, VfsResult};

/// A `vfs::FileSystem` backed by scalevfs.
#[derive(Clone, Debug)]
pub struct ScaleFS {
    fs: Fs,
    /// The served directory, no trailing slash ("" for the task's root).
    root: String,
}

impl ScaleFS {
    /// Serve the task's whole namespace.
    pub fn new(fs: Fs) -> ScaleFS {
        ScaleFS {
            fs,
            root: String::new(),
        }
    }
    /// Serve the directory `root` (a path of the namespace) as the `vfs`
    /// root, as `PhysicalFS::new(root)` does: by prefixing it. A `vfs` path
    /// with a ".." component is refused (`InvalidPath`; `VfsPath` never
    /// sends one), but, as with `PhysicalFS`, a symlink under `root` may
    /// lead out of it: [`ScaleFS::chrooted`] confines those too.
    pub fn with_root(fs: Fs, root: &str) -> ScaleFS {
        ScaleFS {
            fs,
            root: root.trim_end_matches('/').to_string(),
        }
    }
    /// Serve `root` confined: the calls go through a forked copy of the
    /// task (the caller's cwd and fd table are untouched) chrooted into
    /// `root`, so neither ".." nor a symlink (absolute or relative) leads
    /// out of it. chroot needs a root task: EPERM otherwise.
    pub fn chrooted(fs: &Fs, root: &str) -> std::io::Result<ScaleFS> {
        let t = fs.task().fork();
        t.chroot(root.as_bytes())?;
        t.chdir(b"/")?;
        Ok(ScaleFS::new(Fs::new(t)))
    }
    /// A fresh in-memory scalevfs (memfs root, default variants), served
    /// whole as root: the counterpart of `MemoryFS::new()`.
    pub fn new_memory() -> ScaleFS {
        ScaleFS::new(Fs::new(Vfs::new().root_task()))
    }
    /// The `std::fs`-shaped handle the calls go through.
    pub fn fs(&self) -> &Fs {
        &self.fs
    }

    /// The namespace path of a `vfs` path ("" or "/a/b"); InvalidPath for
    /// one that climbs with "..".
    fn path(&self, p: &str) -> VfsResult<PathBuf> {
        if p.split('/').any(|c| c == "..") {
            return Err(VfsErrorKind::InvalidPath.into());
        }
        let mut s = String::with_capacity(self.root.len() + p.len() + 1);
        s.push_str(&self.root);
        if !p.is_empty() && !p.starts_with('/') {
            s.push('/');
        }
        s.push_str(p);
        if s.is_empty() {
            s.push('/');
        }
        Ok(PathBuf::from(s))
    }

    fn set_times(&self, path: &str, times: [Timespec; 2]) -> VfsResult<()> {
        let p = self.path(path)?;
        self.fs
            .task()
            .utimensat(AT_FDCWD, p.as_os_str().as_encoded_bytes(), Some(times), 0)
            .map_err(|e| VfsError::from(std::io::Error::from(e)))
    }
}

fn timespec(t: SystemTime) -> VfsResult<Timespec> {
    let bad = || VfsError::from(VfsErrorKind::Other("timestamp out of range".into()));
    Ok(match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec {
            sec: i64::try_from(d.as_secs()).map_err(|_| bad())?,
            nsec: i64::from(d.subsec_nanos()),
        },
        Err(e) => {
            // Before the epoch: whole seconds down, nanoseconds up.
            let d = e.duration();
            let mut sec = -i64::try_from(d.as_secs()).map_err(|_| bad())?;
            let mut nsec = i64::from(d.subsec_nanos());
            if nsec > 0 {
                sec = sec.checked_sub(1).ok_or_else(bad)?;
                nsec = 1_000_000_000 - nsec;
            }
            Timespec { sec, nsec }
        }
    })
}

const OMIT: Timespec = Timespec {
    sec: 0,
    nsec: UTIME_OMIT,
};

impl FileSystem for ScaleFS {
    fn read_dir(&self, path: &str) -> VfsResult<Box<dyn Iterator<Item = String> + Send>> {
        let rd = self.fs.read_dir(self.path(path)?)?;
        // An entry that cannot be read ends nothing: it is left out (the
        // trait's iterator has no error item); a non-UTF-8 name is given
        // lossily (`PhysicalFS` panics on one).
        Ok(Box::new(rd.filter_map(|e| {
            e.ok()
                .map(|e| e.file_name_ref().to_string_lossy().into_owned())
        })))
    }

    fn create_dir(&self, path: &str) -> VfsResult<()> {
        let p = self.path(path)?;
        self.fs.create_dir(&p).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                match self.fs.metadata(&p) {
                    Ok(m) if m.is_dir() => VfsErrorKind::DirectoryExists.into(),
                    _ => VfsErrorKind::FileExists.into(),
                }
            } else {
                e.into()
            }
        })
    }

    fn open_file(&self, path: &str) -> VfsResult<Box<dyn SeekAndRead + Send>> {
        Ok(Box::new(self.fs.open(self.path(path)?)?))
    }

    fn create_file(&self, path: &str) -> VfsResult<Box<dyn SeekAndWrite + Send>> {
        Ok(Box::new(self.fs.create(self.path(path)?)?))
    }

    fn append_file(&self, path: &str) -> VfsResult<Box<dyn SeekAndWrite + Send>> {
        Ok(Box::new(
            self.fs.options().append(true).open(self.path(path)?)?,
        ))
    }

    fn metadata(&self, path: &str) -> VfsResult<VfsMetadata> {
        let m = self.fs.metadata(self.path(path)?)?;
        let dir = m.is_dir();
        Ok(VfsMetadata {
            file_type: if dir {
                VfsFileType::Directory
            } else {
                VfsFileType::File
            },
            len: if dir { 0 } else { m.len() },
            modified: m.modified().ok(),
            created: m.created().ok(),
            accessed: m.accessed().ok(),
        })
    }

    fn set_modification_time(&self, path: &str, time: SystemTime) -> VfsResult<()> {
        self.set_times(path, [OMIT, timespec(time)?])
    }

    fn set_access_time(&self, path: &str, time: SystemTime) -> VfsResult<()> {
        self.set_times(path, [timespec(time)?, OMIT])
    }

    fn exists(&self, path: &str) -> VfsResult<bool> {
        Ok(self.fs.exists(self.path(path)?))
    }

    fn remove_file(&self, path: &str) -> VfsResult<()> {
        Ok(self.fs.remove_file(self.path(path)?)?)
    }

    fn remove_dir(&self, path: &str) -> VfsResult<()> {
        Ok(self.fs.remove_dir(self.path(path)?)?)
    }

    fn copy_file(&self, src: &str, dest: &str) -> VfsResult<()> {
        self.fs.copy(self.path(src)?, self.path(dest)?)?;
        Ok(())
    }

    fn move_file(&self, src: &str, dest: &str) -> VfsResult<()> {
        across_mounts(self.fs.rename(self.path(src)?, self.path(dest)?))
    }

    fn move_dir(&self, src: &str, dest: &str) -> VfsResult<()> {
        across_mounts(self.fs.rename(self.path(src)?, self.path(dest)?))
    }
}

/// A rename between two mounts (EXDEV) is `NotSupported`, which `vfs`'s
/// `VfsPath::move_file`/`move_dir` take as "copy, then remove", as they do
/// for `PhysicalFS` (whose `move_dir` maps every failure so); other errors
/// pass as they are.
fn across_mounts(r: std::io::Result<()>) -> VfsResult<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::CrossesDevices => {
            Err(VfsErrorKind::NotSupported.into())
        }
        r => Ok(r?),
    }
}
