//! `scalevfs::fs` against `std::fs` on the host: each scenario is a
//! table of steps run once with std in a fresh directory of the host's
//! tmpfs (`/dev/shm`) and once with `stdfs::Fs` over a fresh `Vfs`; every
//! step's outcome (a value, or the error's kind and raw errno) must match.
//! Paths in the steps are relative to the scenario's base directory, which
//! holds `w/` (the work tree) and `outside/`; a symlink target starting
//! with `/` is rooted at the base, and a path a call returns is shown with
//! the base stripped.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use scalevfs::fs::{self as stdfs, MetadataExt as _};
use scalevfs::Vfs;

#[derive(Clone, Copy, Debug, Default)]
struct Opts {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    mode: Option<u32>,
}

const R: Opts = Opts {
    read: true,
    write: false,
    append: false,
    truncate: false,
    create: false,
    create_new: false,
    mode: None,
};
const RW: Opts = Opts { write: true, ..R };
const RWC: Opts = Opts { create: true, ..RW };
const WC: Opts = Opts { read: false, ..RWC };
const WCT: Opts = Opts {
    truncate: true,
    ..WC
};
const A: Opts = Opts {
    read: false,
    append: true,
    create: true,
    ..R
};
const NEW: Opts = Opts {
    read: false,
    write: true,
    create_new: true,
    ..R
};
const NONE: Opts = Opts { read: false, ..R };

#[derive(Clone, Copy, Debug)]
enum Step {
    CreateDir(&'static str),
    CreateDirAll(&'static str),
    RemoveDir(&'static str),
    RemoveFile(&'static str),
    RemoveDirAll(&'static str),
    Write(&'static str, &'static [u8]),
    Read(&'static str),
    ReadToString(&'static str),
    Metadata(&'static str),
    SymlinkMetadata(&'static str),
    /// The names, sorted, with each entry's file type and lstat summary.
    ReadDir(&'static str),
    /// The entries' `path()`s, sorted.
    ReadDirPaths(&'static str),
    Rename(&'static str, &'static str),
    Copy(&'static str, &'static str),
    HardLink(&'static str, &'static str),
    Symlink(&'static str, &'static str),
    ReadLink(&'static str),
    Canonicalize(&'static str),
    SetPerm(&'static str, u32),
    Exists(&'static str),
    TryExists(&'static str),
    Open(usize, Opts, &'static str),
    FWrite(usize, &'static [u8]),
    FRead(usize, usize),
    FReadToEnd(usize),
    FSeek(usize, SeekFrom),
    FSetLen(usize, u64),
    FMetadata(usize),
    FClone(usize, usize),
    FSetPerm(usize, u32),
    FSync(usize),
    FReadAt(usize, usize, u64),
    FWriteAt(usize, &'static [u8], u64),
    Close(usize),
}
use Step::*;

/// What a step gave: a value, or (kind, errno).
type Outcome = Result<String, String>;

fn e(x: std::io::Error) -> String {
    format!("{:?}/{:?}", x.kind(), x.raw_os_error())
}

fn meta_str(ft: &str, len: u64, mode: u32, nlink: u64) -> String {
    // Directory sizes are filesystem-specific (tmpfs counts entries); a
    // symlink's is its target's length, which holds the base for an
    // absolute one (read_link compares targets).
    let len = if ft == "dir" || ft == "symlink" {
        0
    } else {
        len
    };
    format!("{ft} len={len} mode={mode:o} nlink={nlink}")
}

fn kind(d: bool, f: bool, l: bool) -> &'static str {
    match (d, f, l) {
        (true, _, _) => "dir",
        (_, true, _) => "file",
        (_, _, true) => "symlink",
        _ => "other",
    }
}

trait Backend {
    /// The base directory's absolute path, as the backend names it.
    fn base(&self) -> PathBuf;
    fn run(&mut self, s: Step) -> Outcome;
    fn p(&self, rel: &str) -> PathBuf {
        self.base().join(rel)
    }
    fn strip(&self, p: &Path) -> String {
        match p.strip_prefix(self.base()) {
            Ok(r) => format!("@/{}", r.display()),
            Err(_) => p.display().to_string(),
        }
    }
    fn target(&self, t: &str) -> PathBuf {
        match t.strip_prefix('/') {
            Some(r) => self.p(r),
            None => PathBuf::from(t),
        }
    }
}

struct Host {
    base: PathBuf,
    files: Vec<Option<std::fs::File>>,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl Host {
    fn new() -> Host {
        let root = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        // Relaxed: a unique counter.
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let base = root.join(format!("stdfs-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir(&base).unwrap();
        let base = std::fs::canonicalize(base).unwrap();
        std::fs::create_dir(base.join("w")).unwrap();
        std::fs::create_dir(base.join("outside")).unwrap();
        Host {
            base,
            files: (0..8).map(|_| None).collect(),
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

impl Backend for Host {
    fn base(&self) -> PathBuf {
        self.base.clone()
    }
    fn run(&mut self, s: Step) -> Outcome {
        use std::fs;
        let m = |m: fs::Metadata| {
            let ft = kind(m.is_dir(), m.is_file(), m.is_symlink());
            meta_str(ft, m.len(), m.permissions().mode(), m.nlink())
        };
        let f = |v: &mut Vec<Option<fs::File>>, i: usize| v[i].take().expect("slot is open");
        Ok(match s {
            CreateDir(p) => fs::create_dir(self.p(p))
                .map(|_| String::new())
                .map_err(e)?,
            CreateDirAll(p) => fs::create_dir_all(self.p(p))
                .map(|_| String::new())
                .map_err(e)?,
            RemoveDir(p) => fs::remove_dir(self.p(p))
                .map(|_| String::new())
                .map_err(e)?,
            RemoveFile(p) => fs::remove_file(self.p(p))
                .map(|_| String::new())
                .map_err(e)?,
            RemoveDirAll(p) => fs::remove_dir_all(self.p(p))
                .map(|_| String::new())
                .map_err(e)?,
            Write(p, d) => fs::write(self.p(p), d).map(|_| String::new()).map_err(e)?,
            Read(p) => format!("{:?}", fs::read(self.p(p)).map_err(e)?),
            ReadToString(p) => fs::read_to_string(self.p(p)).map_err(e)?,
            Metadata(p) => m(fs::metadata(self.p(p)).map_err(e)?),
            SymlinkMetadata(p) => m(fs::symlink_metadata(self.p(p)).map_err(e)?),
            ReadDir(p) => {
                let mut v = Vec::new();
                for x in fs::read_dir(self.p(p)).map_err(e)? {
                    let x = x.map_err(e)?;
                    let t = x.file_type().map_err(e)?;
                    let ft = kind(t.is_dir(), t.is_file(), t.is_symlink());
                    let md = m(x.metadata().map_err(e)?);
                    v.push(format!("{:?}:{ft}:{md}", x.file_name()));
                }
                v.sort();
                v.join(",")
            }
            ReadDirPaths(p) => {
                let mut v = Vec::new();
                for x in fs::read_dir(self.p(p)).map_err(e)? {
                    v.push(self.strip(&x.map_err(e)?.path()));
                }
                v.sort();
                v.join(",")
            }
            Rename(a, b) => fs::rename(self.p(a), self.p(b))
                .map(|_| String::new())
                .map_err(e)?,
            Copy(a, b) => fs::copy(self.p(a), self.p(b))
                .map(|n| n.to_string())
                .map_err(e)?,
            HardLink(a, b) => fs::hard_link(self.p(a), self.p(b))
                .map(|_| String::new())
                .map_err(e)?,
            Symlink(t, l) => std::os::unix::fs::symlink(self.target(t), self.p(l))
                .map(|_| String::new())
                .map_err(e)?,
            ReadLink(p) => self.strip(&fs::read_link(self.p(p)).map_err(e)?),
            Canonicalize(p) => self.strip(&fs::canonicalize(self.p(p)).map_err(e)?),
            SetPerm(p, mode) => fs::set_permissions(self.p(p), fs::Permissions::from_mode(mode))
                .map(|_| String::new())
                .map_err(e)?,
            Exists(p) => self.p(p).exists().to_string(),
            TryExists(p) => self.p(p).try_exists().map_err(e)?.to_string(),
            Open(i, o, p) => {
                let mut oo = fs::OpenOptions::new();
                oo.read(o.read)
                    .write(o.write)
                    .append(o.append)
                    .truncate(o.truncate)
                    .create(o.create)
                    .create_new(o.create_new);
                if let Some(mode) = o.mode {
                    oo.mode(mode);
                }
                self.files[i] = Some(oo.open(self.p(p)).map_err(e)?);
                String::new()
            }
            FWrite(i, d) => {
                let mut fl = f(&mut self.files, i);
                let r = fl.write(d);
                self.files[i] = Some(fl);
                r.map_err(e)?.to_string()
            }
            FRead(i, n) => {
                let mut fl = f(&mut self.files, i);
                let mut b = vec![0; n];
                let r = fl.read(&mut b);
                self.files[i] = Some(fl);
                let k = r.map_err(e)?;
                format!("{:?}", &b[..k])
            }
            FReadToEnd(i) => {
                // Through `&File`, as std allows.
                let fl = f(&mut self.files, i);
                let mut b = Vec::new();
                let r = (&fl).read_to_end(&mut b);
                self.files[i] = Some(fl);
                r.map_err(e)?;
                format!("{b:?}")
            }
            FSeek(i, pos) => {
                let fl = f(&mut self.files, i);
                let r = (&fl).seek(pos);
                self.files[i] = Some(fl);
                r.map_err(e)?.to_string()
            }
            FSetLen(i, n) => {
                let fl = f(&mut self.files, i);
                let r = fl.set_len(n);
                self.files[i] = Some(fl);
                r.map_err(e)?;
                String::new()
            }
            FMetadata(i) => {
                let fl = f(&mut self.files, i);
                let r = fl.metadata();
                self.files[i] = Some(fl);
                m(r.map_err(e)?)
            }
            FClone(i, j) => {
                let fl = f(&mut self.files, i);
                let r = fl.try_clone();
                self.files[i] = Some(fl);
                self.files[j] = Some(r.map_err(e)?);
                String::new()
            }
            FSetPerm(i, mode) => {
                let fl = f(&mut self.files, i);
                let r = fl.set_permissions(fs::Permissions::from_mode(mode));
                self.files[i] = Some(fl);
                r.map_err(e)?;
                String::new()
            }
            FSync(i) => {
                let fl = f(&mut self.files, i);
                let r = fl.sync_all().and_then(|_| fl.sync_data());
                self.files[i] = Some(fl);
                r.map_err(e)?;
                String::new()
            }
            FReadAt(i, n, off) => {
                let fl = f(&mut self.files, i);
                let mut b = vec![0; n];
                let r = std::os::unix::fs::FileExt::read_at(&fl, &mut b, off);
                self.files[i] = Some(fl);
                let k = r.map_err(e)?;
                format!("{:?}", &b[..k])
            }
            FWriteAt(i, d, off) => {
                let fl = f(&mut self.files, i);
                let r = std::os::unix::fs::FileExt::write_at(&fl, d, off);
                self.files[i] = Some(fl);
                r.map_err(e)?.to_string()
            }
            Close(i) => {
                drop(f(&mut self.files, i));
                String::new()
            }
        })
    }
}

struct Scale {
    fs: stdfs::Fs,
    files: Vec<Option<stdfs::File>>,
}

impl Scale {
    fn new() -> Scale {
        Scale::with_user(None)
    }
    /// `user`: the work dir `w` is chowned to it and the calls are made
    /// as it (no supplementary groups).
    fn with_user(user: Option<u32>) -> Scale {
        let vfs = Vfs::new();
        let root = vfs.root_task();
        root.mkdir("/b", 0o755).unwrap();
        root.mkdir("/b/w", 0o755).unwrap();
        root.mkdir("/b/outside", 0o755).unwrap();
        let t = match user {
            Some(u) => {
                root.chown("/b/w", u, u).unwrap();
                vfs.task(scalevfs::Cred::user(u, u))
            }
            None => root,
        };
        // SAFETY: umask(2) cannot fail; it is set back at once (the host
        // side creates its files with the process's umask).
        let host_umask = unsafe { libc::umask(0o022) };
        // SAFETY: as above.
        unsafe { libc::umask(host_umask) };
        t.umask(host_umask);
        let fs = stdfs::Fs::new(t);
        Scale {
            fs,
            files: (0..8).map(|_| None).collect(),
        }
    }
}

impl Backend for Scale {
    fn base(&self) -> PathBuf {
        PathBuf::from("/b")
    }
    fn run(&mut self, s: Step) -> Outcome {
        let fs = &self.fs;
        let m = |m: stdfs::Metadata| {
            let ft = kind(m.is_dir(), m.is_file(), m.is_symlink());
            meta_str(ft, m.len(), m.permissions().mode(), m.nlink())
        };
        let f = |v: &mut Vec<Option<stdfs::File>>, i: usize| v[i].take().expect("slot is open");
        Ok(match s {
            CreateDir(p) => fs.create_dir(self.p(p)).map(|_| String::new()).map_err(e)?,
            CreateDirAll(p) => fs
                .create_dir_all(self.p(p))
                .map(|_| String::new())
                .map_err(e)?,
            RemoveDir(p) => fs.remove_dir(self.p(p)).map(|_| String::new()).map_err(e)?,
            RemoveFile(p) => fs
                .remove_file(self.p(p))
                .map(|_| String::new())
                .map_err(e)?,
            RemoveDirAll(p) => fs
                .remove_dir_all(self.p(p))
                .map(|_| String::new())
                .map_err(e)?,
            Write(p, d) => fs.write(self.p(p), d).map(|_| String::new()).map_err(e)?,
            Read(p) => format!("{:?}", fs.read(self.p(p)).map_err(e)?),
            ReadToString(p) => fs.read_to_string(self.p(p)).map_err(e)?,
            Metadata(p) => m(fs.metadata(self.p(p)).map_err(e)?),
            SymlinkMetadata(p) => m(fs.symlink_metadata(self.p(p)).map_err(e)?),
            ReadDir(p) => {
                let mut v = Vec::new();
                for x in fs.read_dir(self.p(p)).map_err(e)? {
                    let x = x.map_err(e)?;
                    let t = x.file_type().map_err(e)?;
                    let ft = kind(t.is_dir(), t.is_file(), t.is_symlink());
                    let md = m(x.metadata().map_err(e)?);
                    v.push(format!("{:?}:{ft}:{md}", x.file_name()));
                }
                v.sort();
                v.join(",")
            }
            ReadDirPaths(p) => {
                let mut v = Vec::new();
                for x in fs.read_dir(self.p(p)).map_err(e)? {
                    v.push(self.strip(&x.map_err(e)?.path()));
                }
                v.sort();
                v.join(",")
            }
            Rename(a, b) => fs
                .rename(self.p(a), self.p(b))
                .map(|_| String::new())
                .map_err(e)?,
            Copy(a, b) => fs
                .copy(self.p(a), self.p(b))
                .map(|n| n.to_string())
                .map_err(e)?,
            HardLink(a, b) => fs
                .hard_link(self.p(a), self.p(b))
                .map(|_| String::new())
                .map_err(e)?,
            Symlink(t, l) => fs
                .soft_link(self.target(t), self.p(l))
                .map(|_| String::new())
                .map_err(e)?,
            ReadLink(p) => self.strip(&fs.read_link(self.p(p)).map_err(e)?),
            Canonicalize(p) => self.strip(&fs.canonicalize(self.p(p)).map_err(e)?),
            SetPerm(p, mode) => fs
                .set_permissions(self.p(p), stdfs::Permissions::from_mode(mode))
                .map(|_| String::new())
                .map_err(e)?,
            Exists(p) => fs.exists(self.p(p)).to_string(),
            TryExists(p) => fs.try_exists(self.p(p)).map_err(e)?.to_string(),
            Open(i, o, p) => {
                let mut oo = fs.options();
                oo.read(o.read)
                    .write(o.write)
                    .append(o.append)
                    .truncate(o.truncate)
                    .create(o.create)
                    .create_new(o.create_new);
                if let Some(mode) = o.mode {
                    stdfs::OpenOptionsExt::mode(&mut oo, mode);
                }
                self.files[i] = Some(oo.open(self.p(p)).map_err(e)?);
                String::new()
            }
            FWrite(i, d) => {
                let mut fl = f(&mut self.files, i);
                let r = fl.write(d);
                self.files[i] = Some(fl);
                r.map_err(e)?.to_string()
            }
            FRead(i, n) => {
                let mut fl = f(&mut self.files, i);
                let mut b = vec![0; n];
                let r = fl.read(&mut b);
                self.files[i] = Some(fl);
                let k = r.map_err(e)?;
                format!("{:?}", &b[..k])
            }
            FReadToEnd(i) => {
                let fl = f(&mut self.files, i);
                let mut b = Vec::new();
                let r = (&fl).read_to_end(&mut b);
                self.files[i] = Some(fl);
                r.map_err(e)?;
                format!("{b:?}")
            }
            FSeek(i, pos) => {
                let fl = f(&mut self.files, i);
                let r = (&fl).seek(pos);
                self.files[i] = Some(fl);
                r.map_err(e)?.to_string()
            }
            FSetLen(i, n) => {
                let fl = f(&mut self.files, i);
                let r = fl.set_len(n);
                self.files[i] = Some(fl);
                r.map_err(e)?;
                String::new()
            }
            FMetadata(i) => {
                let fl = f(&mut self.files, i);
                let r = fl.metadata();
                self.files[i] = Some(fl);
                m(r.map_err(e)?)
            }
            FClone(i, j) => {
                let fl = f(&mut self.files, i);
                let r = fl.try_clone();
                self.files[i] = Some(fl);
                self.files[j] = Some(r.map_err(e)?);
                String::new()
            }
            FSetPerm(i, mode) => {
                let fl = f(&mut self.files, i);
                let r = fl.set_permissions(stdfs::Permissions::from_mode(mode));
                self.files[i] = Some(fl);
                r.map_err(e)?;
                String::new()
            }
            FSync(i) => {
                let fl = f(&mut self.files, i);
                let r = fl.sync_all().and_then(|_| fl.sync_data());
                self.files[i] = Some(fl);
                r.map_err(e)?;
                String::new()
            }
            FReadAt(i, n, off) => {
                let fl = f(&mut self.files, i);
                let mut b = vec![0; n];
                let r = stdfs::FileExt::read_at(&fl, &mut b, off);
                self.files[i] = Some(fl);
                let k = r.map_err(e)?;
                format!("{:?}", &b[..k])
            }
            FWriteAt(i, d, off) => {
                let fl = f(&mut self.files, i);
                let r = stdfs::FileExt::write_at(&fl, d, off);
                self.files[i] = Some(fl);
                r.map_err(e)?.to_string()
            }
            Close(i) => {
                drop(f(&mut self.files, i));
                String::new()
            }
        })
    }
}

/// Run `steps` on both and compare step by step; returns the outcomes so
/// a scenario can also assert what they are.
fn check(steps: &[Step]) -> Vec<Outcome> {
    let mut h = Host::new();
    let mut s = Scale::new();
    let mut out = Vec::new();
    for (i, st) in steps.iter().enumerate() {
        let a = h.run(*st);
        let b = s.run(*st);
        assert_eq!(b, a, "step {i} {st:?}: scalevfs (left) vs std (right)");
        out.push(a);
    }
    out
}

/// As `check`, with the calls made as an unprivileged user that owns `w`:
/// on the host by a thread whose fsuid/fsgid are that user's (Linux keeps
/// them per thread, and a nonzero fsuid drops the thread's DAC override).
fn check_as_user(steps: &'static [Step]) -> Vec<Outcome> {
    const NOBODY: u32 = 65534;
    let h = Host::new();
    let c = std::ffi::CString::new(h.base.join("w").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; chown has no memory effects.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), NOBODY, NOBODY) }, 0);
    let mut s = Scale::with_user(Some(NOBODY));
    let (h, host) = std::thread::spawn(move || {
        let mut h = h;
        // SAFETY: setfsgid/setfsuid change this thread's filesystem ids
        // only (the raw syscalls are per thread; glibc does not broadcast
        // them); the thread ends after the steps.
        unsafe {
            libc::setfsgid(NOBODY);
            libc::setfsuid(NOBODY);
        }
        let out: Vec<Outcome> = steps.iter().map(|st| h.run(*st)).collect();
        // Clean up as root again (Host's drop removes the tree).
        // SAFETY: as above.
        unsafe {
            libc::setfsuid(0);
            libc::setfsgid(0);
        }
        (h, out)
    })
    .join()
    .unwrap();
    drop(h);
    for (i, st) in steps.iter().enumerate() {
        let b = s.run(*st);
        assert_eq!(
            b, host[i],
            "step {i} {st:?}: scalevfs (left) vs std (right)"
        );
    }
    host
}

fn err_of(o: &Outcome) -> &str {
    o.as_ref().expect_err("an error")
}

#[test]
fn dirs_create_and_remove() {
    let o = check(&[
        CreateDir("w/a"),
        CreateDir("w/a"),          // AlreadyExists
        CreateDir("w/x/y"),        // NotFound
        CreateDirAll("w/a/b/c/d"), // partly existing
        CreateDirAll("w/a/b/c/d"), // all there: fine
        CreateDirAll("w/a/./b/../b/e"),
        CreateDirAll(""),
        Write("w/f", b"x"),
        CreateDirAll("w/f/g"), // ENOTDIR
        CreateDirAll("w/f"),   // a file: AlreadyExists
        CreateDir("w/f/g"),
        RemoveDir("w/a"),  // ENOTEMPTY
        RemoveDir("w/f"),  // ENOTDIR
        RemoveFile("w/a"), // EISDIR
        RemoveFile("w/nope"),
        RemoveDir("w/nope"),
        ReadDir("w/a/b"),
        RemoveDir("w/a/b/c/d"),
        ReadDir("w/a/b"),
        RemoveDirAll("w/f"), // not a directory
        RemoveDirAll("w/nope"),
        RemoveDirAll("w/a"),
        Exists("w/a"),
        TryExists("w/a"),
        TryExists("w/f/x"), // ENOTDIR is an error, not false
        Exists("w/f"),
        ReadDir("w"),
        ReadDir("w/f"),
        ReadDir("w/nope"),
    ]);
    assert!(err_of(&o[1]).starts_with("AlreadyExists/Some(17)"));
    assert!(err_of(&o[2]).starts_with("NotFound/Some(2)"));
    assert!(err_of(&o[8]).contains("Some(20)"));
    assert!(err_of(&o[11]).contains("Some(39)"));
    assert!(err_of(&o[13]).contains("Some(21)"));
    assert!(err_of(&o[19]).contains("Some(20)"));
    assert_eq!(o[22], Ok("false".into()));
}

#[test]
fn remove_dir_all_does_not_follow_symlinks() {
    let o = check(&[
        CreateDirAll("outside/keep/sub"),
        Write("outside/keep/file", b"precious"),
        CreateDirAll("w/t/d1/d2"),
        Write("w/t/d1/d2/f", b"1"),
        Write("w/t/f", b"2"),
        Symlink("/outside/keep", "w/t/link-dir"),
        Symlink("/outside/keep", "w/t/d1/link-dir"),
        Symlink("/outside/keep/file", "w/t/d1/d2/link-file"),
        Symlink("dangling", "w/t/dangling"),
        ReadDir("w/t"),
        ReadDir("w/t/link-dir"),
        Symlink("/outside/keep", "w/top-link"),
        RemoveDirAll("w/top-link"), // the link itself goes
        Exists("w/top-link"),
        RemoveDirAll("w/t"),
        Exists("w/t"),
        ReadDir("outside/keep"),
        Read("outside/keep/file"),
        ReadDir("w"),
    ]);
    assert_eq!(o[15], Ok("false".into()));
    assert!(o[16].as_ref().unwrap().contains("\"sub\""));
    assert_eq!(o[17], Ok(format!("{:?}", b"precious")));
}

#[test]
fn read_write_seek() {
    let o = check(&[
        Write("w/f", b"hello world"),
        Read("w/f"),
        ReadToString("w/f"),
        Open(0, R, "w/f"),
        FRead(0, 5),
        FSeek(0, SeekFrom::Current(1)),
        FRead(0, 100),
        FRead(0, 100), // at EOF: 0 bytes
        FSeek(0, SeekFrom::Start(100)),
        FRead(0, 10),                      // past EOF: 0 bytes
        FSeek(0, SeekFrom::Current(-200)), // EINVAL
        FSeek(0, SeekFrom::End(-5)),
        FReadToEnd(0),
        FSeek(0, SeekFrom::Start(u64::MAX)), // wraps negative: EINVAL
        FWrite(0, b"x"),                     // read-only: EBADF
        FSetLen(0, 1),                       // EINVAL (not open for writing)
        Open(1, RW, "w/f"),
        FWrite(1, b"HE"),
        FSeek(1, SeekFrom::End(3)),
        FWrite(1, b"!"),
        FMetadata(1),
        Read("w/f"),
        FSetLen(1, 4),
        FSetLen(1, u64::MAX), // InvalidInput, no errno
        Read("w/f"),
        FClone(1, 2),
        FSeek(2, SeekFrom::Start(1)),
        FSeek(1, SeekFrom::Current(0)), // shared position
        FSync(1),
        FWriteAt(1, b"at", 6),
        FReadAt(1, 100, 1),
        FReadAt(1, 10, 100),
        FReadAt(1, 10, u64::MAX),       // EINVAL
        FSeek(1, SeekFrom::Current(0)), // untouched by pread/pwrite
        FWriteAt(0, b"x", 0),           // read-only: EBADF
        Close(1),
        FRead(2, 10),
        Close(2),
        Close(0),
        Open(3, RW, "w"), // EISDIR
        Open(3, R, "w"),
        FRead(3, 1), // EISDIR
        FMetadata(3),
        Close(3),
        Write("w/bin", &[0xff, 0xfe]),
        ReadToString("w/bin"), // InvalidData
        Read("w/nope"),
        Write("w/nope/f", b""),
        Write("w", b""),
    ]);
    assert_eq!(o[7], Ok("[]".into()));
    assert!(err_of(&o[10]).contains("Some(22)"));
    assert!(err_of(&o[23]).starts_with("InvalidInput/None"));
    assert!(err_of(&o[45]).starts_with("InvalidData"));
    assert!(err_of(&o[32]).contains("Some(22)"));
    assert!(err_of(&o[34]).contains("Some(9)"));
}

#[test]
fn open_options() {
    let o = check(&[
        Open(0, NONE, "w/f"),                       // no access mode: InvalidInput
        Open(0, Opts { create: true, ..R }, "w/f"), // create needs write
        Open(
            0,
            Opts {
                truncate: true,
                ..A
            },
            "w/f",
        ), // append + truncate
        Open(0, R, "w/f"),                          // NotFound
        Open(0, NEW, "w/f"),
        FWrite(0, b"abc"),
        Close(0),
        Open(0, NEW, "w/f"), // create_new twice: AlreadyExists
        Open(0, A, "w/f"),
        FSeek(0, SeekFrom::Start(0)),
        FWrite(0, b"def"), // appends anyway
        FSeek(0, SeekFrom::Current(0)),
        Close(0),
        Read("w/f"),
        Open(0, WCT, "w/f"),
        FMetadata(0),
        Close(0),
        Open(
            0,
            Opts {
                mode: Some(0o600),
                ..WC
            },
            "w/g",
        ),
        FMetadata(0),
        FSetPerm(0, 0o640),
        FMetadata(0),
        Close(0),
        Open(0, RWC, "w/g"), // exists: mode untouched
        Metadata("w/g"),
        Close(0),
        Symlink("f", "w/l"),
        Open(0, NEW, "w/l"), // create_new on a symlink: EEXIST
        Open(0, RWC, "w/dangling-target/x"),
        Symlink("nowhere", "w/dl"),
        Open(0, RWC, "w/dl"), // creates the target
        Close(0),
        Exists("w/nowhere"),
    ]);
    assert!(err_of(&o[0]).starts_with("InvalidInput/None"));
    assert!(err_of(&o[7]).starts_with("AlreadyExists/Some(17)"));
    assert_eq!(o[11], Ok("6".into()));
    assert_eq!(o[13], Ok(format!("{:?}", b"abcdef")));
}

#[test]
fn metadata_links_rename_copy() {
    let o = check(&[
        Write("w/f", b"12345"),
        Metadata("w/f"),
        SetPerm("w/f", 0o600),
        Metadata("w/f"),
        Metadata("w"),
        SymlinkMetadata("w"),
        Symlink("f", "w/l"),
        Metadata("w/l"),
        SymlinkMetadata("w/l"),
        ReadLink("w/l"),
        ReadLink("w/f"), // EINVAL
        Symlink("/w/f", "w/abs"),
        ReadLink("w/abs"),
        HardLink("w/f", "w/h"),
        Metadata("w/f"),
        HardLink("w/f", "w/h"), // EEXIST
        HardLink("w/nope", "w/h2"),
        HardLink("w/l", "w/hl"), // links the symlink itself
        SymlinkMetadata("w/hl"),
        Copy("w/f", "w/c"),
        Metadata("w/c"),
        Read("w/c"),
        Copy("w", "w/c2"), // not a regular file
        Copy("w/nope", "w/c3"),
        Copy("w/l", "w/c4"), // follows the symlink
        Metadata("w/c4"),
        Rename("w/c", "w/r"),
        Exists("w/c"),
        Read("w/r"),
        CreateDirAll("w/d/e"),
        Rename("w/r", "w/d"),     // EISDIR
        Rename("w/d", "w/r"),     // ENOTDIR
        Rename("w/d", "w/d/e/x"), // EINVAL
        Rename("w/nope", "w/x"),
        Write("w/d/e/g", b""),
        Rename("w/d/e", "w/e2"),
        ReadDir("w"),
        ReadDirPaths("w"),
        ReadDir("w/e2"),
        Symlink("d/../e2", "w/rel"),
        Symlink("/w/rel/g", "w/deep"),
        Canonicalize("w/deep"),
        Canonicalize("w/./d/../e2/"),
        Canonicalize("w/f/"), // ENOTDIR
        Canonicalize("w/nope"),
        Symlink("loop", "w/loop"),
        Canonicalize("w/loop"), // ELOOP
        Metadata("w/loop"),
        Exists("w/loop"),
        TryExists("w/loop"),
    ]);
    assert_eq!(o[19], Ok("5".into()));
    assert!(err_of(&o[22]).starts_with("InvalidInput/None"));
    assert_eq!(o[41], Ok("@/w/e2/g".into()));
    assert!(err_of(&o[46]).contains("Some(40)"));
}

#[test]
fn relative_paths_use_the_task_cwd() {
    let fs = stdfs::Fs::new(Vfs::new().root_task());
    fs.create_dir_all("/x/y").unwrap();
    fs.set_current_dir("/x/y/..").unwrap();
    assert_eq!(fs.current_dir().unwrap(), Path::new("/x"));
    assert_eq!(
        fs.set_current_dir("/nope").unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
    fs.write("y/f", b"rel").unwrap();
    assert_eq!(fs.read("/x/y/f").unwrap(), b"rel");
    assert_eq!(fs.canonicalize("y/../y/f").unwrap(), Path::new("/x/y/f"));
    let names: Vec<_> = fs
        .read_dir("y")
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(names, vec![PathBuf::from("y/f")]);
    fs.create_dir_all("p/q").unwrap();
    assert!(fs.metadata("/x/p/q").unwrap().is_dir());
    fs.remove_dir_all("p").unwrap();
    assert!(!fs.exists("/x/p"));
}

#[test]
fn file_closes_its_fd_on_drop_and_metadata_ext() {
    let fs = stdfs::Fs::new(Vfs::new().root_task());
    let before = fs.task().files().count();
    {
        let f = fs.create("/f").unwrap();
        let g = f.try_clone().unwrap();
        let _d = fs.read_dir("/").unwrap();
        assert_eq!(fs.task().files().count(), before + 3);
        drop(g);
        (&f).write_all(b"abc").unwrap();
    }
    assert_eq!(fs.task().files().count(), before);
    let m = fs.metadata("/f").unwrap();
    assert_eq!((m.len(), m.nlink(), m.uid(), m.gid()), (3, 1, 0, 0));
    assert_eq!(m.mode() & 0o170777, 0o100644);
    assert_ne!(m.ino(), fs.metadata("/").unwrap().ino());
    assert_eq!(m.dev(), fs.metadata("/").unwrap().dev());
    assert!(m.modified().unwrap() > std::time::UNIX_EPOCH);
    // A birth time, as std's on tmpfs (statx's btime).
    assert!(m.created().unwrap() <= m.modified().unwrap());
    let d = fs.read_dir("/").unwrap().next().unwrap().unwrap();
    assert_eq!(d.file_name(), "f");
    assert_eq!(d.ino(), m.ino());
    let nul = fs.metadata(Path::new(std::ffi::OsStr::from_bytes(b"/a\0b")));
    assert_eq!(nul.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
}

#[test]
fn create_dir_all_and_remove_dir_all_race() {
    // Several callers making the same deep tree: all succeed (each other's
    // EEXIST is fine); then several removing it at once: each succeeds or
    // finds it gone already, and nothing is left.
    let fs = stdfs::Fs::new(Vfs::new().root_task());
    for round in 0..20 {
        std::thread::scope(|s| {
            for t in 0..4 {
                let fs = fs.clone();
                s.spawn(move || {
                    fs.create_dir_all("/r/a/b/c/d/e").unwrap();
                    fs.write(format!("/r/a/b/c/f{t}"), b"x").unwrap();
                    fs.create_dir_all(format!("/r/a/b/c/d/e/t{t}/u")).unwrap();
                });
            }
        });
        assert_eq!(fs.read_dir("/r/a/b/c/d/e").unwrap().count(), 4);
        std::thread::scope(|s| {
            for _ in 0..3 {
                let fs = fs.clone();
                s.spawn(move || match fs.remove_dir_all("/r") {
                    Ok(()) => {}
                    Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "round {round}"),
                });
            }
        });
        assert!(!fs.exists("/r"), "round {round}");
    }
    assert_eq!(fs.task().files().count(), 0);
}

#[test]
fn remove_dir_all_deeper_than_the_fd_table() {
    // One fd per level: a tree deeper than the table fails with EMFILE
    // (no stack overflow, no leaked fd), and a shallower one goes.
    let fs = stdfs::Fs::new(Vfs::new().root_task());
    fs.task().files().set_max(64).unwrap();
    let max = fs.task().files().max();
    fs.create_dir("/deep").unwrap();
    fs.task().chdir("/deep").unwrap();
    for _ in 0..max + 2 {
        fs.create_dir("d").unwrap();
        fs.task().chdir("d").unwrap();
    }
    fs.task().chdir("/").unwrap();
    let e = fs.remove_dir_all("/deep").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EMFILE));
    assert_eq!(fs.task().files().count(), 0);
    assert!(fs.exists("/deep"));
}

#[test]
fn empty_path_and_thread_safety() {
    let fs = stdfs::Fs::new(Vfs::new().root_task());
    for (a, b) in [
        (
            fs.metadata("").map(|_| ()),
            std::fs::metadata("").map(|_| ()),
        ),
        (fs.create_dir(""), std::fs::create_dir("")),
        (fs.remove_dir_all(""), std::fs::remove_dir_all("")),
        (
            fs.read_dir("").map(|_| ()),
            std::fs::read_dir("").map(|_| ()),
        ),
    ] {
        let (a, b) = (a.unwrap_err(), b.unwrap_err());
        assert_eq!((a.kind(), a.raw_os_error()), (b.kind(), b.raw_os_error()));
    }
    fn send_sync<T: Send + Sync>() {}
    send_sync::<stdfs::Fs>();
    send_sync::<stdfs::File>();
    send_sync::<stdfs::ReadDir>();
    send_sync::<stdfs::DirEntry>();
    send_sync::<stdfs::Metadata>();
    send_sync::<stdfs::OpenOptions>();
}

#[test]
fn permission_errors_as_an_unprivileged_user() {
    let o = check_as_user(&[
        CreateDirAll("w/a/b"),
        SetPerm("w/a", 0o555),
        CreateDir("w/a/c"),        // EACCES
        CreateDirAll("w/a/c/d"),   // EACCES
        CreateDirAll("w/a/b"),     // exists: fine
        Write("w/a/b/f", b"data"), // b is writable
        RemoveDirAll("w/a"),       // cannot unlink b from a: EACCES
        Exists("w/a/b/f"),
        SetPerm("w/a", 0o755),
        SetPerm("w/a/b", 0o000),
        Canonicalize("w/a/b/f"), // EACCES
        ReadDir("w/a/b"),        // EACCES
        Metadata("w/a/b/f"),     // EACCES
        Exists("w/a/b/f"),
        TryExists("w/a/b/f"), // an error, not false
        RemoveDirAll("w/a"),  // cannot open b: EACCES
        SetPerm("w/a/b", 0o700),
        RemoveDirAll("w/a"),
        Exists("w/a"),
        SetPerm("outside", 0o777), // EPERM: not the owner
        Write("outside/x", b""),   // EACCES
        CreateDirAll("outside/y/z"),
        Write("w/wo", b"secret"),
        SetPerm("w/wo", 0o200),
        Read("w/wo"),                 // EACCES
        Open(0, RW, "w/wo"),          // EACCES
        Copy("w/wo", "w/copy"),       // EACCES
        Rename("w/wo", "outside/wo"), // EACCES
        HardLink("outside", "w/hl"),  // EPERM: a directory
    ]);
    assert!(err_of(&o[2]).starts_with("PermissionDenied/Some(13)"));
    assert!(err_of(&o[6]).contains("Some(13)"));
    assert_eq!(o[13], Ok("false".into()));
    assert!(err_of(&o[14]).contains("Some(13)"));
    assert!(err_of(&o[19]).contains("Some(1)"));
}
