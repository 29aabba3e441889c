//! A `std::fs`-shaped API over a [`Task`]: [`Fs`] has the functions of
//! `std::fs` as methods, [`File`] implements `Read`, `Write` and `Seek`
//! (also for `&File`, as std does), [`OpenOptions`] builds opens.
//!
//! Errors are `std::io::Error`s whose `raw_os_error()` is the Linux errno
//! (where std's own error has none, e.g. an `OpenOptions` with no access
//! mode, the error kind and the absence of a code match std's). Paths are
//! `AsRef<Path>`; their bytes (`OsStrExt`) are handed to the core, so a
//! relative path resolves against the task's cwd as std's does against the
//! process's. Each method does what std's function does on Linux, in the
//! same system calls: `create_dir_all` and `remove_dir_all` tolerate the
//! same races as std's and `remove_dir_all` never follows a symlink.
//!
//! ```
//! use std::io::{Read, Seek, SeekFrom, Write};
//! use scalevfs::fs::Fs;
//!
//! let vfs = scalevfs::Vfs::new();
//! let fs = Fs::new(vfs.root_task()); // methods mirror std::fs's functions
//! fs.create_dir_all("/a/b")?;
//! fs.write("/a/b/f", b"hello")?;
//! let mut f = fs.options().read(true).write(true).create(true).open("/a/b/g")?;
//! f.write_all(b"world")?;
//! f.seek(SeekFrom::Start(0))?;
//! let mut s = String::new();
//! f.read_to_string(&mut s)?;
//! assert_eq!(s, "world");
//! for e in fs.read_dir("/a/b")? {
//!     let e = e?;
//!     println!("{:?} {}", e.file_name(), e.metadata()?.len());
//! }
//! assert_eq!(fs.read_to_string("/a/b/f")?, "hello");
//! assert_eq!(fs.metadata("/nope").unwrap_err().kind(), std::io::ErrorKind::NotFound);
//! fs.remove_dir_all("/a")?;
//! assert!(!fs.exists("/a"));
//! # Ok::<(), std::io::Error>(())
//! ```

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::errno::Errno;
use crate::io::{SEEK_CUR, SEEK_END, SEEK_SET};
use crate::task::Task;
use crate::types::{self, *};

pub use std::fs::Permissions;

/// How many entries one `getdents` call of a directory iterator fetches.
const DIR_BATCH: usize = 64;
/// The buffer of `read`/`copy`.
const COPY_BUF: usize = 64 * 1024;

fn err(e: Errno) -> io::Error {
    e.into()
}

/// The bytes of a path, refused (as std refuses it) if it holds a NUL.
fn path_bytes(p: &Path) -> io::Result<&[u8]> {
    let b = p.as_os_str().as_bytes();
    if b.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "file name contained an unexpected NUL byte",
        ));
    }
    Ok(b)
}

fn time(t: Timespec) -> io::Result<SystemTime> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "timestamp out of range");
    let nsec = u32::try_from(t.nsec)
        .ok()
        .filter(|n| *n < 1_000_000_000)
        .ok_or_else(bad)?;
    if t.sec >= 0 {
        UNIX_EPOCH
            .checked_add(Duration::new(t.sec as u64, nsec))
            .ok_or_else(bad)
    } else {
        // sec < 0: the instant is `-sec` seconds before the epoch, plus nsec.
        UNIX_EPOCH
            .checked_sub(Duration::from_secs(t.sec.unsigned_abs()))
            .and_then(|s| s.checked_add(Duration::from_nanos(u64::from(nsec))))
            .ok_or_else(bad)
    }
}

/// A handle on a task's filesystem view with the functions of `std::fs`.
/// Cheap to clone (the clones share the task: its cwd, umask and fd table).
#[derive(Clone, Debug)]
pub struct Fs {
    task: Arc<Task>,
}

impl Fs {
    /// A handle issuing its calls as `task`.
    pub fn new(task: Task) -> Fs {
        Fs {
            task: Arc::new(task),
        }
    }
    /// A handle on a shared task.
    pub fn from_arc(task: Arc<Task>) -> Fs {
        Fs { task }
    }
    /// The task the calls are made as (for the POSIX-shaped calls).
    pub fn task(&self) -> &Arc<Task> {
        &self.task
    }

    /// A builder for opens (`std::fs::OpenOptions::new()`).
    pub fn options(&self) -> OpenOptions {
        OpenOptions::new(self)
    }
    /// A builder for directories (`std::fs::DirBuilder::new()`).
    pub fn dir_builder(&self) -> DirBuilder {
        DirBuilder::new(self)
    }
    /// `File::open`: read-only.
    pub fn open<P: AsRef<Path>>(&self, path: P) -> io::Result<File> {
        self.options().read(true).open(path)
    }
    /// `File::create`: write-only, created or truncated.
    pub fn create<P: AsRef<Path>>(&self, path: P) -> io::Result<File> {
        self.options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
    }
    /// `File::create_new`: write-only, must not exist.
    pub fn create_new<P: AsRef<Path>>(&self, path: P) -> io::Result<File> {
        self.options().write(true).create_new(true).open(path)
    }

    /// `std::fs::read`. As std's, the buffer gets the file's size
    /// (fstat) before the first read, and OutOfMemory if that cannot be
    /// had: a huge (sparse) file fails at once instead of growing a buffer
    /// toward its size until memory runs out.
    pub fn read<P: AsRef<Path>>(&self, path: P) -> io::Result<Vec<u8>> {
        let f = self.open(path)?;
        let mut v = Vec::new();
        v.try_reserve_exact(f.size_hint())?;
        Unreserved(&f).read_to_end(&mut v)?;
        Ok(v)
    }
    /// `std::fs::read_to_string`: InvalidData if the content is not UTF-8;
    /// the size reserved first, as [`Fs::read`].
    pub fn read_to_string<P: AsRef<Path>>(&self, path: P) -> io::Result<String> {
        let f = self.open(path)?;
        let mut s = String::new();
        s.try_reserve_exact(f.size_hint())?;
        Unreserved(&f).read_to_string(&mut s)?;
        Ok(s)
    }
    /// `std::fs::write`: create or truncate, then write everything.
    pub fn write<P: AsRef<Path>, C: AsRef<[u8]>>(&self, path: P, contents: C) -> io::Result<()> {
        self.create(path)?.write_all(contents.as_ref())
    }

    /// `std::fs::create_dir` (mode 0777 less the umask).
    pub fn create_dir<P: AsRef<Path>>(&self, path: P) -> io::Result<()> {
        self.mkdir(path.as_ref(), 0o777)
    }
    fn mkdir(&self, path: &Path, mode: u32) -> io::Result<()> {
        self.task.mkdir(path_bytes(path)?, mode).map_err(err)
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.metadata(path).map(|m| m.is_dir()).unwrap_or(false)
    }

    /// `std::fs::create_dir_all`: every missing ancestor too. An entry
    /// that exists as a directory (made by a racing caller or not) is no
    /// error. Iterative: a deep path costs no stack.
    pub fn create_dir_all<P: AsRef<Path>>(&self, path: P) -> io::Result<()> {
        self.create_dir_all_mode(path.as_ref(), 0o777)
    }
    fn create_dir_all_mode(&self, path: &Path, mode: u32) -> io::Result<()> {
        if path == Path::new("") {
            return Ok(());
        }
        // Climb to the deepest ancestor that exists (or is made now), as
        // std's recursion does, then make the rest on the way down.
        let mut missing: Vec<&Path> = Vec::new();
        let mut cur = path;
        loop {
            match self.mkdir(cur, mode) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(_) if self.is_dir(cur) => break,
                Err(e) => return Err(e),
            }
            missing.push(cur);
            match cur.parent() {
                Some(p) if p != Path::new("") => cur = p,
                Some(_) => break,
                None => {
                    // std's kind here is internal ("Uncategorized").
                    return Err(io::Error::other("failed to create whole tree"));
                }
            }
        }
        while let Some(p) = missing.pop() {
            match self.mkdir(p, mode) {
                Ok(()) => {}
                Err(_) if self.is_dir(p) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// `std::fs::remove_file` (unlink).
    pub fn remove_file<P: AsRef<Path>>(&self, path: P) -> io::Result<()> {
        self.task.unlink(path_bytes(path.as_ref())?).map_err(err)
    }
    /// `std::fs::remove_dir` (rmdir).
    pub fn remove_dir<P: AsRef<Path>>(&self, path: P) -> io::Result<()> {
        self.task.rmdir(path_bytes(path.as_ref())?).map_err(err)
    }

    /// `std::fs::remove_dir_all`: a symlink is removed, never followed (at
    /// the top or inside); entries that vanish meanwhile are no error; a
    /// non-directory at the top is ENOTDIR. Works through directory fds
    /// (`openat(O_NOFOLLOW | O_DIRECTORY)` and `unlinkat`) as std's does,
    /// iteratively: one open fd per level of the tree, so a tree deeper
    /// than the fd table allows fails with EMFILE rather than overflowing
    /// the stack.
    pub fn remove_dir_all<P: AsRef<Path>>(&self, path: P) -> io::Result<()> {
        let path = path_bytes(path.as_ref())?;
        let st = self
            .task
            .fstatat(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW)
            .map_err(err)?;
        if st.mode & S_IFMT == S_IFLNK {
            return self.task.unlink(path).map_err(err);
        }
        let t = &*self.task;
        let top = t
            .openat(AT_FDCWD, path, DIR_OPEN | O_NOFOLLOW, 0)
            .map_err(err)?;
        // The directories being emptied, outermost first: each with its fd,
        // its name in the one before (the top's is `path`, from the cwd)
        // and the entries read but not yet handled.
        struct Level<'t> {
            fd: FdGuard<'t>,
            name: Vec<u8>,
            pending: VecDeque<types::DirEntry>,
            done: bool,
        }
        let mut stack = vec![Level {
            fd: FdGuard(t, top),
            name: path.to_vec(),
            pending: VecDeque::new(),
            done: false,
        }];
        while let Some(lv) = stack.last_mut() {
            let dfd = lv.fd.1;
            if lv.pending.is_empty() && !lv.done {
                let batch = match t.getdents(dfd, DIR_BATCH) {
                    Ok(b) => b,
                    // Removed by someone else since it was opened: Linux's
                    // getdents says ENOENT, which glibc's readdir (and so
                    // std's walk) takes as the end of the directory.
                    Err(Errno::ENOENT) => Vec::new(),
                    Err(x) => return Err(err(x)),
                };
                lv.done = batch.is_empty();
                lv.pending.extend(
                    batch
                        .into_iter()
                        .filter(|e| e.name != b"." && e.name != b".."),
                );
            }
            if let Some(e) = lv.pending.pop_front() {
                let r = if e.file_type == types::FileType::Directory {
                    match t.openat(dfd, &e.name, DIR_OPEN | O_NOFOLLOW, 0) {
                        Ok(fd) => {
                            stack.push(Level {
                                fd: FdGuard(t, fd),
                                name: e.name,
                                pending: VecDeque::new(),
                                done: false,
                            });
                            continue;
                        }
                        // Replaced by a non-directory meanwhile.
                        Err(Errno::ENOTDIR) | Err(Errno::ELOOP) => t.unlinkat(dfd, &e.name, 0),
                        Err(x) => Err(x),
                    }
                } else {
                    t.unlinkat(dfd, &e.name, 0)
                };
                match r {
                    Ok(()) | Err(Errno::ENOENT) => {}
                    Err(x) => return Err(err(x)),
                }
                continue;
            }
            if !lv.done {
                continue;
            }
            // Emptied: close it, remove it from its parent.
            let lv = stack.pop().expect("stack is not empty here");
            drop(lv.fd);
            let parent = stack.last().map_or(AT_FDCWD, |p| p.fd.1);
            match t.unlinkat(parent, &lv.name, AT_REMOVEDIR) {
                Ok(()) => {}
                // Removed by someone else meanwhile: the goal is met (std
                // ignores NotFound here too, at every level).
                Err(Errno::ENOENT) => {}
                Err(x) => return Err(err(x)),
            }
        }
        Ok(())
    }

    /// `std::fs::read_dir`: the entries, without "." and "..", read lazily
    /// through an open directory fd that the iterator and its entries share.
    pub fn read_dir<P: AsRef<Path>>(&self, path: P) -> io::Result<ReadDir> {
        let p = path.as_ref();
        let fd = self
            .task
            .openat(AT_FDCWD, path_bytes(p)?, DIR_OPEN, 0)
            .map_err(err)?;
        Ok(ReadDir {
            dir: Arc::new(DirHandle {
                task: self.task.clone(),
                fd,
                root: p.to_path_buf(),
            }),
            pending: VecDeque::new(),
            end: false,
        })
    }

    /// `std::fs::metadata` (stat, following symlinks).
    pub fn metadata<P: AsRef<Path>>(&self, path: P) -> io::Result<Metadata> {
        let st = self
            .task
            .statx(AT_FDCWD, path_bytes(path.as_ref())?, 0)
            .map_err(err)?;
        Ok(Metadata::of(st))
    }
    /// `std::fs::symlink_metadata` (lstat).
    pub fn symlink_metadata<P: AsRef<Path>>(&self, path: P) -> io::Result<Metadata> {
        let st = self
            .task
            .statx(AT_FDCWD, path_bytes(path.as_ref())?, AT_SYMLINK_NOFOLLOW)
            .map_err(err)?;
        Ok(Metadata::of(st))
    }

    /// `std::fs::rename`.
    pub fn rename<P: AsRef<Path>, Q: AsRef<Path>>(&self, from: P, to: Q) -> io::Result<()> {
        let (f, t) = (path_bytes(from.as_ref())?, path_bytes(to.as_ref())?);
        self.task.rename(f, t).map_err(err)
    }
    /// `std::fs::hard_link` (linkat without following `original` if it is
    /// a symlink, as std does on Linux).
    pub fn hard_link<P: AsRef<Path>, Q: AsRef<Path>>(
        &self,
        original: P,
        link: Q,
    ) -> io::Result<()> {
        let (o, l) = (path_bytes(original.as_ref())?, path_bytes(link.as_ref())?);
        self.task.linkat(AT_FDCWD, o, AT_FDCWD, l, 0).map_err(err)
    }
    /// `std::os::unix::fs::symlink`: `link` becomes a symlink to `original`.
    pub fn soft_link<P: AsRef<Path>, Q: AsRef<Path>>(
        &self,
        original: P,
        link: Q,
    ) -> io::Result<()> {
        let (o, l) = (path_bytes(original.as_ref())?, path_bytes(link.as_ref())?);
        self.task.symlink(o, l).map_err(err)
    }
    /// Same as [`Fs::soft_link`], under the name of `std::os::unix::fs`.
    pub fn symlink<P: AsRef<Path>, Q: AsRef<Path>>(&self, original: P, link: Q) -> io::Result<()> {
        self.soft_link(original, link)
    }
    /// `std::fs::read_link`.
    pub fn read_link<P: AsRef<Path>>(&self, path: P) -> io::Result<PathBuf> {
        let v = self
            .task
            .readlink(path_bytes(path.as_ref())?)
            .map_err(err)?;
        Ok(PathBuf::from(OsString::from_vec(v)))
    }

    /// `std::fs::canonicalize` (realpath): the absolute path, from the
    /// task's root, with every symlink, "." and ".." resolved. Resolves
    /// component by component as glibc's realpath does: ELOOP after 40
    /// symlinks, ENOTDIR for a non-directory followed by "/",
    /// ENAMETOOLONG past PATH_MAX.
    pub fn canonicalize<P: AsRef<Path>>(&self, path: P) -> io::Result<PathBuf> {
        let p = path_bytes(path.as_ref())?;
        if p.is_empty() {
            return Err(err(Errno::ENOENT));
        }
        let t = &*self.task;
        let mut out: Vec<u8> = if p[0] == b'/' {
            b"/".to_vec()
        } else {
            self.getcwd()?
        };
        // What is left to resolve; a symlink's target is put in front.
        let mut rest: Vec<u8> = p.to_vec();
        let mut links = 0u32;
        let mut start = 0usize;
        loop {
            while rest.get(start) == Some(&b'/') {
                start += 1;
            }
            if start >= rest.len() {
                break;
            }
            let end = rest[start..]
                .iter()
                .position(|&c| c == b'/')
                .map_or(rest.len(), |i| start + i);
            let name = &rest[start..end];
            if name == b"." {
                start = end;
                continue;
            }
            if name == b".." {
                if let Some(i) = out.iter().rposition(|&c| c == b'/') {
                    out.truncate(i.max(1));
                }
                start = end;
                continue;
            }
            let keep = out.len();
            if !out.ends_with(b"/") {
                out.push(b'/');
            }
            out.extend_from_slice(name);
            if out.len() >= PATH_MAX {
                return Err(err(Errno::ENAMETOOLONG));
            }
            let st = t
                .fstatat(AT_FDCWD, &out[..], AT_SYMLINK_NOFOLLOW)
                .map_err(err)?;
            if st.mode & S_IFMT == S_IFLNK {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(err(Errno::ELOOP));
                }
                let target = t.readlink(&out[..]).map_err(err)?;
                out.truncate(keep);
                if target.first() == Some(&b'/') {
                    out.clear();
                    out.push(b'/');
                }
                // No bound on the new remainder (glibc has none either): the
                // part after the link is the caller's own path, already
                // allocated, and what links add is bounded by MAX_SYMLINKS
                // targets of under PATH_MAX bytes each; the resolved path
                // `out` keeps its PATH_MAX limit above.
                let mut next = target;
                next.extend_from_slice(&rest[end..]);
                rest = next;
                start = 0;
                continue;
            }
            if st.mode & S_IFMT != S_IFDIR && end < rest.len() {
                return Err(err(Errno::ENOTDIR));
            }
            start = end;
        }
        Ok(PathBuf::from(OsString::from_vec(out)))
    }

    /// `std::fs::copy`: the content and permission bits of a regular file
    /// (following symlinks) to `to`, created or truncated; the byte count.
    pub fn copy<P: AsRef<Path>, Q: AsRef<Path>>(&self, from: P, to: Q) -> io::Result<u64> {
        let mut r = self.open(from)?;
        let m = r.metadata()?;
        if !m.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the source path is neither a regular file nor a symlink to a regular file",
            ));
        }
        let perm = m.permissions();
        let mut w = self
            .options()
            .mode(perm.mode())
            .write(true)
            .create(true)
            .truncate(true)
            .open(to)?;
        if w.metadata()?.is_file() {
            w.set_permissions(perm)?;
        }
        let mut buf = vec![0u8; COPY_BUF];
        let mut n = 0u64;
        loop {
            let k = match r.read(&mut buf) {
                Ok(0) => return Ok(n),
                Ok(k) => k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            w.write_all(&buf[..k])?;
            n += k as u64;
        }
    }

    /// `std::fs::set_permissions` (chmod, following symlinks).
    pub fn set_permissions<P: AsRef<Path>>(&self, path: P, perm: Permissions) -> io::Result<()> {
        self.task
            .chmod(path_bytes(path.as_ref())?, perm.mode())
            .map_err(err)
    }

    /// `std::env::current_dir`: the task's cwd (getcwd); ENOENT for a cwd
    /// outside the task's root, as glibc's getcwd.
    pub fn current_dir(&self) -> io::Result<PathBuf> {
        Ok(PathBuf::from(OsString::from_vec(self.getcwd()?)))
    }
    /// getcwd as glibc's wrapper returns it: the kernel's answer for a cwd
    /// outside the root (after a chroot) is "(unreachable)/..." and names
    /// nothing from the root, so glibc refuses any result not starting
    /// with '/' as ENOENT (and realpath of a relative path with it).
    fn getcwd(&self) -> io::Result<Vec<u8>> {
        let v = self.task.getcwd().map_err(err)?;
        if v.first() != Some(&b'/') {
            return Err(err(Errno::ENOENT));
        }
        Ok(v)
    }
    /// `std::env::set_current_dir`: the task's cwd (chdir); shared by the
    /// clones of this `Fs` and by the task's threads.
    pub fn set_current_dir<P: AsRef<Path>>(&self, path: P) -> io::Result<()> {
        self.task.chdir(path_bytes(path.as_ref())?).map_err(err)
    }

    /// `Path::exists`: whether `metadata` succeeds.
    pub fn exists<P: AsRef<Path>>(&self, path: P) -> bool {
        self.metadata(path).is_ok()
    }
    /// `std::fs::exists` / `Path::try_exists`: `Ok(false)` on NotFound,
    /// the error for anything else (EACCES, ENOTDIR, ELOOP...).
    pub fn try_exists<P: AsRef<Path>>(&self, path: P) -> io::Result<bool> {
        match self.metadata(path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

const DIR_OPEN: u32 = O_RDONLY | O_DIRECTORY | O_CLOEXEC;

/// Closes an fd of `remove_dir_all`'s on every way out.
struct FdGuard<'t>(&'t Task, i32);
impl Drop for FdGuard<'_> {
    fn drop(&mut self) {
        let _ = self.0.close(self.1);
    }
}

// ---------------------------------------------------------------------
// OpenOptions
// ---------------------------------------------------------------------

/// `std::fs::OpenOptions`, made by [`Fs::options`].
#[derive(Clone, Debug)]
pub struct OpenOptions {
    task: Arc<Task>,
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    custom_flags: u32,
    mode: u32,
}

/// `std::os::unix::fs::OpenOptionsExt` for [`OpenOptions`].
pub trait OpenOptionsExt {
    /// The mode of a file the open creates (default 0o666, less the umask).
    fn mode(&mut self, mode: u32) -> &mut Self;
    /// More `O_*` flags (the access mode bits are ignored, as in std).
    fn custom_flags(&mut self, flags: i32) -> &mut Self;
}

impl OpenOptionsExt for OpenOptions {
    fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }
    fn custom_flags(&mut self, flags: i32) -> &mut Self {
        self.custom_flags = flags as u32;
        self
    }
}

impl OpenOptions {
    /// All options off, mode 0o666 (as `std::fs::OpenOptions::new`).
    pub fn new(fs: &Fs) -> OpenOptions {
        OpenOptions {
            task: fs.task.clone(),
            read: false,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            custom_flags: 0,
            mode: 0o666,
        }
    }
    pub fn read(&mut self, on: bool) -> &mut Self {
        self.read = on;
        self
    }
    pub fn write(&mut self, on: bool) -> &mut Self {
        self.write = on;
        self
    }
    pub fn append(&mut self, on: bool) -> &mut Self {
        self.append = on;
        self
    }
    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.truncate = on;
        self
    }
    pub fn create(&mut self, on: bool) -> &mut Self {
        self.create = on;
        self
    }
    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.create_new = on;
        self
    }
    /// Same as [`OpenOptionsExt::mode`], without importing the trait.
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }

    /// The open(2) flags std would pass, or std's error for a contradictory
    /// set of options.
    fn flags(&self) -> io::Result<u32> {
        let need_write = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "creating or truncating a file requires write or append access",
            )
        };
        let access = match (self.read, self.write, self.append) {
            (true, false, false) => O_RDONLY,
            (false, true, false) => O_WRONLY,
            (true, true, false) => O_RDWR,
            (false, _, true) => O_WRONLY | O_APPEND,
            (true, _, true) => O_RDWR | O_APPEND,
            (false, false, false) => {
                return Err(if self.create || self.create_new || self.truncate {
                    need_write()
                } else {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "must specify at least one of read, write, or append access",
                    )
                })
            }
        };
        match (self.write, self.append) {
            (true, false) => {}
            (false, false) => {
                if self.truncate || self.create || self.create_new {
                    return Err(need_write());
                }
            }
            (_, true) => {
                if self.truncate && !self.create_new {
                    return Err(need_write());
                }
            }
        }
        let creation = match (self.create, self.truncate, self.create_new) {
            (false, false, false) => 0,
            (true, false, false) => O_CREAT,
            (false, true, false) => O_TRUNC,
            (true, true, false) => O_CREAT | O_TRUNC,
            (_, _, true) => O_CREAT | O_EXCL,
        };
        Ok(O_CLOEXEC | access | creation | (self.custom_flags & !O_ACCMODE))
    }

    /// Open `path` with these options.
    pub fn open<P: AsRef<Path>>(&self, path: P) -> io::Result<File> {
        let flags = self.flags()?;
        let fd = self
            .task
            .openat(AT_FDCWD, path_bytes(path.as_ref())?, flags, self.mode)
            .map_err(err)?;
        Ok(File {
            task: self.task.clone(),
            fd,
        })
    }
}

// ---------------------------------------------------------------------
// DirBuilder
// ---------------------------------------------------------------------

/// `std::fs::DirBuilder`, made by [`Fs::dir_builder`]: `mkdir` with a
/// mode, optionally of every missing ancestor too.
#[derive(Debug)]
pub struct DirBuilder {
    fs: Fs,
    mode: u32,
    recursive: bool,
}

/// `std::os::unix::fs::DirBuilderExt` for [`DirBuilder`].
pub trait DirBuilderExt {
    /// The mode of the directories made (default 0o777, less the umask).
    fn mode(&mut self, mode: u32) -> &mut Self;
}

impl DirBuilderExt for DirBuilder {
    fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }
}

impl DirBuilder {
    /// Not recursive, mode 0o777 (as `std::fs::DirBuilder::new`).
    pub fn new(fs: &Fs) -> DirBuilder {
        DirBuilder {
            fs: fs.clone(),
            mode: 0o777,
            recursive: false,
        }
    }
    /// Whether `create` makes the missing ancestors too (each with the
    /// mode), and takes an existing directory as success.
    pub fn recursive(&mut self, recursive: bool) -> &mut Self {
        self.recursive = recursive;
        self
    }
    /// Same as [`DirBuilderExt::mode`], without importing the trait.
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }
    /// Make the directory: as `Fs::create_dir` (AlreadyExists if it is
    /// there), or, recursive, as `Fs::create_dir_all`; with the mode.
    pub fn create<P: AsRef<Path>>(&self, path: P) -> io::Result<()> {
        if self.recursive {
            self.fs.create_dir_all_mode(path.as_ref(), self.mode)
        } else {
            self.fs.mkdir(path.as_ref(), self.mode)
        }
    }
}

// ---------------------------------------------------------------------
// File
// ---------------------------------------------------------------------

/// An open file (`std::fs::File`): an fd of the task, closed on drop.
pub struct File {
    task: Arc<Task>,
    fd: i32,
}

impl fmt::Debug for File {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("File").field("fd", &self.fd).finish()
    }
}

impl Drop for File {
    fn drop(&mut self) {
        // As std: an error of close is not reported.
        let _ = self.task.close(self.fd);
    }
}

impl File {
    /// The fd in the task's table (`AsRawFd::as_raw_fd`), for the
    /// POSIX-shaped calls; it stays owned by this `File`.
    pub fn as_raw_fd(&self) -> i32 {
        self.fd
    }
    /// The task the fd belongs to.
    pub fn task(&self) -> &Arc<Task> {
        &self.task
    }
    /// `File::metadata` (fstat).
    pub fn metadata(&self) -> io::Result<Metadata> {
        self.task.fstatx(self.fd).map(Metadata::of).map_err(err)
    }
    /// `File::set_len` (ftruncate): InvalidInput past `i64::MAX`, as std.
    pub fn set_len(&self, size: u64) -> io::Result<()> {
        let size =
            i64::try_from(size).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.task.ftruncate(self.fd, size).map_err(err)
    }
    /// `File::sync_all` (fsync).
    pub fn sync_all(&self) -> io::Result<()> {
        self.task.fsync(self.fd).map_err(err)
    }
    /// `File::sync_data` (fdatasync).
    pub fn sync_data(&self) -> io::Result<()> {
        self.task.fdatasync(self.fd).map_err(err)
    }
    /// `File::try_clone`: a new fd on the same open file description
    /// (shared position and flags), as `F_DUPFD_CLOEXEC`.
    pub fn try_clone(&self) -> io::Result<File> {
        let fd = self.task.dupfd(self.fd, 3, true).map_err(err)?;
        Ok(File {
            task: self.task.clone(),
            fd,
        })
    }
    /// `File::set_permissions` (fchmod).
    pub fn set_permissions(&self, perm: Permissions) -> io::Result<()> {
        self.task.fchmod(self.fd, perm.mode()).map_err(err)
    }
    /// The file's size (fstat), 0 if it cannot be had (std's `fs::read`
    /// goes on without a reservation then). A size past `usize::MAX` is
    /// `usize::MAX`, which no reservation gets.
    fn size_hint(&self) -> usize {
        self.task
            .fstat(self.fd)
            .map_or(0, |st| usize::try_from(st.size).unwrap_or(usize::MAX))
    }
    /// What a read to the end still needs (std's `buffer_capacity_required`):
    /// the size less the position, 0 if either cannot be had.
    fn remaining_hint(&self) -> usize {
        let (Ok(st), Ok(pos)) = (
            self.task.fstat(self.fd),
            self.task.lseek(self.fd, 0, SEEK_CUR),
        ) else {
            return 0;
        };
        usize::try_from(st.size.saturating_sub(pos)).unwrap_or(usize::MAX)
    }
    /// `File::set_times` (futimens): the times `times` has, the others
    /// left as they are (UTIME_OMIT). InvalidInput for a time the kernel's
    /// timespec cannot hold, before any call, as std's.
    pub fn set_times(&self, times: FileTimes) -> io::Result<()> {
        let ts = |t: Option<SystemTime>| match t {
            Some(t) => to_timespec(t),
            None => Ok(Timespec {
                sec: 0,
                nsec: UTIME_OMIT,
            }),
        };
        let both = [ts(times.accessed)?, ts(times.modified)?];
        self.task.futimens(self.fd, Some(both)).map_err(err)
    }
    /// `File::set_modified` (futimens; the access time is left as it is).
    pub fn set_modified(&self, t: SystemTime) -> io::Result<()> {
        self.set_times(FileTimes::new().set_modified(t))
    }
    /// `File::lock` (flock `LOCK_EX`): waits until no other open file
    /// description holds a lock on the file. The lock belongs to this
    /// description (shared with `try_clone`s) and goes with [`File::unlock`]
    /// or when its last fd closes.
    pub fn lock(&self) -> io::Result<()> {
        self.task.flock(self.fd, LOCK_EX).map_err(err)
    }
    /// `File::lock_shared` (flock `LOCK_SH`): waits until no other
    /// description holds an exclusive lock.
    pub fn lock_shared(&self) -> io::Result<()> {
        self.task.flock(self.fd, LOCK_SH).map_err(err)
    }
    /// `File::try_lock` (flock `LOCK_EX | LOCK_NB`):
    /// [`TryLockError::WouldBlock`] if another description holds a lock.
    pub fn try_lock(&self) -> Result<(), TryLockError> {
        try_flock(self.task.flock(self.fd, LOCK_EX | LOCK_NB))
    }
    /// `File::try_lock_shared` (flock `LOCK_SH | LOCK_NB`):
    /// [`TryLockError::WouldBlock`] if another description holds the
    /// exclusive lock.
    pub fn try_lock_shared(&self) -> Result<(), TryLockError> {
        try_flock(self.task.flock(self.fd, LOCK_SH | LOCK_NB))
    }
    /// `File::unlock` (flock `LOCK_UN`): nothing if no lock is held.
    pub fn unlock(&self) -> io::Result<()> {
        self.task.flock(self.fd, LOCK_UN).map_err(err)
    }
}

fn try_flock(r: Result<(), Errno>) -> Result<(), TryLockError> {
    match r {
        Ok(()) => Ok(()),
        Err(Errno::EAGAIN) => Err(TryLockError::WouldBlock),
        Err(e) => Err(TryLockError::Error(err(e))),
    }
}

/// `std::fs::TryLockError` (std 1.89), mirrored: the crate's minimum Rust
/// (1.80) predates it. Converts into an `io::Error` as std's does (with
/// EWOULDBLOCK as its `raw_os_error()`, kind `WouldBlock`).
#[derive(Debug)]
pub enum TryLockError {
    /// The lock could not be taken for another reason than a conflict.
    Error(io::Error),
    /// Another open file description holds a conflicting lock.
    WouldBlock,
}

impl fmt::Display for TryLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryLockError::Error(e) => fmt::Display::fmt(e, f),
            TryLockError::WouldBlock => {
                f.write_str("lock acquisition failed because the operation would block")
            }
        }
    }
}

impl std::error::Error for TryLockError {}

impl From<TryLockError> for io::Error {
    fn from(e: TryLockError) -> io::Error {
        match e {
            TryLockError::Error(e) => e,
            TryLockError::WouldBlock => err(Errno::EAGAIN),
        }
    }
}

/// `std::fs::FileTimes`: the times [`File::set_times`] sets; one not set
/// is left as the file has it. (std's `set_created` exists on Apple and
/// Windows only; Linux cannot set a birth time.)
#[derive(Clone, Copy, Debug, Default)]
pub struct FileTimes {
    accessed: Option<SystemTime>,
    modified: Option<SystemTime>,
}

impl FileTimes {
    /// No times: `set_times` with it changes nothing.
    pub fn new() -> FileTimes {
        FileTimes::default()
    }
    /// The last access time to set.
    pub fn set_accessed(mut self, t: SystemTime) -> FileTimes {
        self.accessed = Some(t);
        self
    }
    /// The last modification time to set.
    pub fn set_modified(mut self, t: SystemTime) -> FileTimes {
        self.modified = Some(t);
        self
    }
}

/// `std::os::unix::fs::FileExt` for [`File`]: positioned I/O (pread,
/// pwrite) that leaves the file position alone.
pub trait FileExt {
    /// `pread`: EINVAL past `i64::MAX` (the offset wraps negative, as std's).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// `pwrite` (with O_APPEND, Linux appends whatever the offset).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize>;
    /// All of `buf` from `offset`; UnexpectedEof if the file ends first.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset) {
                Ok(0) => break,
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset = offset.saturating_add(n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if buf.is_empty() {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "failed to fill whole buffer",
            ))
        }
    }
    /// All of `buf` at `offset`; WriteZero if a write takes nothing.
    fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.write_at(buf, offset) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "failed to write whole buffer",
                    ))
                }
                Ok(n) => {
                    buf = &buf[n..];
                    offset = offset.saturating_add(n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl FileExt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.task.pread(self.fd, buf, offset as i64).map_err(err)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.task.pwrite(self.fd, buf, offset as i64).map_err(err)
    }
}

fn to_timespec(t: SystemTime) -> io::Result<Timespec> {
    let bad = || io::Error::new(io::ErrorKind::InvalidInput, "timestamp out of range");
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

impl Read for &File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.task.read(self.fd, buf).map_err(err)
    }
    /// As std's: room for the rest of the file (size less position) is
    /// reserved first, OutOfMemory if it cannot be had.
    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        buf.try_reserve(self.remaining_hint())?;
        Unreserved(self).read_to_end(buf)
    }
    /// As `read_to_end`; InvalidData (and `buf` as it was) if what is read
    /// is not UTF-8.
    fn read_to_string(&mut self, buf: &mut String) -> io::Result<usize> {
        buf.try_reserve(self.remaining_hint())?;
        Unreserved(self).read_to_string(buf)
    }
}

/// A [`File`] read through `read` alone, so that `Read`'s provided
/// `read_to_end`/`read_to_string` (std's `default_read_to_end`, which is
/// not public) do the reading once `File`'s own have reserved the room.
struct Unreserved<'a>(&'a File);

impl Read for Unreserved<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.task.read(self.0.fd, buf).map_err(err)
    }
}
impl Write for &File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.task.write(self.fd, buf).map_err(err)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
impl Seek for &File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        // As std: an offset past i64::MAX wraps negative and lseek says
        // EINVAL.
        let (off, whence) = match pos {
            SeekFrom::Start(n) => (n as i64, SEEK_SET),
            SeekFrom::Current(n) => (n, SEEK_CUR),
            SeekFrom::End(n) => (n, SEEK_END),
        };
        self.task.lseek(self.fd, off, whence).map_err(err)
    }
}
impl Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        (&*self).read_to_end(buf)
    }
    fn read_to_string(&mut self, buf: &mut String) -> io::Result<usize> {
        (&*self).read_to_string(buf)
    }
}
impl Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
impl Seek for File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        (&*self).seek(pos)
    }
}

// ---------------------------------------------------------------------
// Metadata, FileType
// ---------------------------------------------------------------------

/// `std::fs::Metadata`: a `statx` result (std's comes from statx too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metadata(Stat, Option<Timespec>);

impl Metadata {
    fn of(x: Statx) -> Metadata {
        Metadata(x.stat, x.btime)
    }
    /// The core's `stat` fields.
    pub fn stat(&self) -> &Stat {
        &self.0
    }
    pub fn file_type(&self) -> FileType {
        FileType(self.0.mode & S_IFMT)
    }
    pub fn is_dir(&self) -> bool {
        self.file_type().is_dir()
    }
    pub fn is_file(&self) -> bool {
        self.file_type().is_file()
    }
    pub fn is_symlink(&self) -> bool {
        self.file_type().is_symlink()
    }
    pub fn len(&self) -> u64 {
        self.0.size
    }
    /// Whether the length is 0 (std has no such method; clippy wants it).
    pub fn is_empty(&self) -> bool {
        self.0.size == 0
    }
    /// The whole `st_mode`, type bits included, as std's.
    pub fn permissions(&self) -> Permissions {
        Permissions::from_mode(self.0.mode)
    }
    pub fn modified(&self) -> io::Result<SystemTime> {
        time(self.0.mtime)
    }
    pub fn accessed(&self) -> io::Result<SystemTime> {
        time(self.0.atime)
    }
    /// The birth time (`Stat::btime`); Unsupported where the filesystem
    /// keeps none (ext4 inodes of 128 bytes), as std's (its message).
    pub fn created(&self) -> io::Result<SystemTime> {
        match self.1 {
            Some(t) => time(t),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "creation time is not available for the filesystem",
            )),
        }
    }
}

/// `std::os::unix::fs::MetadataExt` for [`Metadata`].
pub trait MetadataExt {
    fn dev(&self) -> u64;
    fn ino(&self) -> u64;
    fn mode(&self) -> u32;
    fn nlink(&self) -> u64;
    fn uid(&self) -> u32;
    fn gid(&self) -> u32;
    fn rdev(&self) -> u64;
    fn size(&self) -> u64;
    fn atime(&self) -> i64;
    fn atime_nsec(&self) -> i64;
    fn mtime(&self) -> i64;
    fn mtime_nsec(&self) -> i64;
    fn ctime(&self) -> i64;
    fn ctime_nsec(&self) -> i64;
    fn blksize(&self) -> u64;
    fn blocks(&self) -> u64;
}

impl MetadataExt for Metadata {
    fn dev(&self) -> u64 {
        self.0.dev
    }
    fn ino(&self) -> u64 {
        self.0.ino
    }
    fn mode(&self) -> u32 {
        self.0.mode
    }
    fn nlink(&self) -> u64 {
        u64::from(self.0.nlink)
    }
    fn uid(&self) -> u32 {
        self.0.uid
    }
    fn gid(&self) -> u32 {
        self.0.gid
    }
    fn rdev(&self) -> u64 {
        self.0.rdev
    }
    fn size(&self) -> u64 {
        self.0.size
    }
    fn atime(&self) -> i64 {
        self.0.atime.sec
    }
    fn atime_nsec(&self) -> i64 {
        self.0.atime.nsec
    }
    fn mtime(&self) -> i64 {
        self.0.mtime.sec
    }
    fn mtime_nsec(&self) -> i64 {
        self.0.mtime.nsec
    }
    fn ctime(&self) -> i64 {
        self.0.ctime.sec
    }
    fn ctime_nsec(&self) -> i64 {
        self.0.ctime.nsec
    }
    fn blksize(&self) -> u64 {
        u64::from(self.0.blksize)
    }
    fn blocks(&self) -> u64 {
        self.0.blocks
    }
}

/// `std::fs::FileType` (with `std::os::unix::fs::FileTypeExt`'s methods):
/// the `S_IFMT` bits of a mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileType(u32);

impl FileType {
    fn from_core(t: types::FileType) -> FileType {
        FileType(t.mode_bits() & S_IFMT)
    }
    pub fn is_dir(&self) -> bool {
        self.0 == S_IFDIR
    }
    pub fn is_file(&self) -> bool {
        self.0 == S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.0 == S_IFLNK
    }
    pub fn is_block_device(&self) -> bool {
        self.0 == S_IFBLK
    }
    pub fn is_char_device(&self) -> bool {
        self.0 == S_IFCHR
    }
    pub fn is_fifo(&self) -> bool {
        self.0 == S_IFIFO
    }
    pub fn is_socket(&self) -> bool {
        self.0 == S_IFSOCK
    }
}

// ---------------------------------------------------------------------
// read_dir
// ---------------------------------------------------------------------

/// An open directory: the fd that a [`ReadDir`] reads and its entries'
/// `metadata` stats relative to (so a rename of the directory does not
/// change what they name, as with std's).
struct DirHandle {
    task: Arc<Task>,
    fd: i32,
    root: PathBuf,
}

impl Drop for DirHandle {
    fn drop(&mut self) {
        let _ = self.task.close(self.fd);
    }
}

/// The iterator `Fs::read_dir` returns (`std::fs::ReadDir`).
pub struct ReadDir {
    dir: Arc<DirHandle>,
    pending: VecDeque<types::DirEntry>,
    end: bool,
}

impl fmt::Debug for ReadDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ReadDir").field(&self.dir.root).finish()
    }
}

impl Iterator for ReadDir {
    type Item = io::Result<DirEntry>;
    fn next(&mut self) -> Option<io::Result<DirEntry>> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                return Some(Ok(DirEntry {
                    dir: self.dir.clone(),
                    name: OsString::from_vec(e.name),
                    ino: e.ino,
                    file_type: FileType::from_core(e.file_type),
                }));
            }
            if self.end {
                return None;
            }
            match self.dir.task.getdents(self.dir.fd, DIR_BATCH) {
                Ok(v) if v.is_empty() => self.end = true,
                Ok(v) => self.pending.extend(v),
                // The directory was removed: Linux's getdents says ENOENT,
                // which glibc's readdir takes as the end (POSIX: a removed
                // directory lists nothing), so std's iterator just ends.
                Err(Errno::ENOENT) => self.end = true,
                Err(e) => {
                    // As std: the error once, then the end.
                    self.end = true;
                    return Some(Err(err(e)));
                }
            }
        }
    }
}

/// An entry of a directory listing (`std::fs::DirEntry`).
pub struct DirEntry {
    dir: Arc<DirHandle>,
    name: OsString,
    ino: u64,
    file_type: FileType,
}

impl fmt::Debug for DirEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DirEntry").field(&self.path()).finish()
    }
}

impl DirEntry {
    /// The directory's path as given to `read_dir`, joined with the name.
    pub fn path(&self) -> PathBuf {
        self.dir.root.join(&self.name)
    }
    pub fn file_name(&self) -> OsString {
        self.name.clone()
    }
    /// The name without a copy (`DirEntryExt2::file_name_ref`).
    pub fn file_name_ref(&self) -> &OsStr {
        &self.name
    }
    /// lstat of the entry, relative to the open directory (as std's:
    /// `fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW)`).
    pub fn metadata(&self) -> io::Result<Metadata> {
        self.dir
            .task
            .statx(self.dir.fd, self.name.as_bytes(), AT_SYMLINK_NOFOLLOW)
            .map(Metadata::of)
            .map_err(err)
    }
    /// The type the directory reports for the entry (d_type): no call.
    pub fn file_type(&self) -> io::Result<FileType> {
        Ok(self.file_type)
    }
    /// The inode number the directory reports (`DirEntryExt::ino`).
    pub fn ino(&self) -> u64 {
        self.ino
    }
}
