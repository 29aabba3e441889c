//! Random-operation differential test against the host's tmpfs.
//!
//! A seeded random sequence of namespace and data calls (open with random
//! flags, write/pwrite/read/pread/lseek, ftruncate/truncate, unlink, mkdir,
//! rmdir, rename/renameat2, link, symlink, readlink, chmod, stat/lstat,
//! getdents, close) runs on a fresh scalevfs `Vfs` and, with real syscalls
//! (libc), on a fresh directory under /dev/shm (tmpfs, the filesystem memfs
//! imitates). Every call's result (value or errno, read data, selected stat
//! fields, sorted directory listings) must be equal, and so must the final
//! trees (types, modes, link counts, sizes, contents, link targets).
//!
//! Where `namespace_model.rs` checks against a hand-written model and
//! `errno_matches_linux.rs` / `data_matches_linux.rs` run fixed scripts,
//! this one lets the kernel be the model for sequences nobody wrote down:
//! trailing slashes and "." components, symlinks (relative, so the host
//! side stays inside its directory; dangling, looping, through
//! directories), open fds on renamed and unlinked files, hard links.
//!
//! Paths never contain "..", and symlink targets are relative, so the host
//! side cannot leave its directory. Runs as root on both sides; if /dev/shm
//! is missing or we are not root, only the scalevfs side runs (it must
//! still not panic).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::sync::Once;

use scalevfs::io::*;
use scalevfs::*;

type R = Result<i64, i32>;

/// What one call returned, in a form both sides can produce.
#[derive(Debug, PartialEq, Eq, Clone)]
enum Out {
    Val(i64),
    Data(Vec<u8>),
    /// (type bits and mode, nlink, size) -- for directories the size is
    /// left out (tmpfs counts entries in it, memfs need not).
    Stat(u32, u32, u64),
    Names(Vec<Vec<u8>>),
    Err(i32),
}

trait Sys {
    fn open(&self, p: &str, flags: u32, mode: u32) -> R;
    fn close(&self, fd: i32) -> R;
    fn read(&self, fd: i32, n: usize) -> Result<Vec<u8>, i32>;
    fn pread(&self, fd: i32, n: usize, off: i64) -> Result<Vec<u8>, i32>;
    fn write(&self, fd: i32, b: &[u8]) -> R;
    fn pwrite(&self, fd: i32, b: &[u8], off: i64) -> R;
    fn lseek(&self, fd: i32, off: i64, wh: u32) -> R;
    fn ftruncate(&self, fd: i32, len: i64) -> R;
    fn truncate(&self, p: &str, len: i64) -> R;
    fn unlink(&self, p: &str) -> R;
    fn rmdir(&self, p: &str) -> R;
    fn mkdir(&self, p: &str, mode: u32) -> R;
    fn rename(&self, a: &str, b: &str, flags: u32) -> R;
    fn link(&self, a: &str, b: &str) -> R;
    fn symlink(&self, target: &str, p: &str) -> R;
    fn readlink(&self, p: &str) -> Result<Vec<u8>, i32>;
    fn chmod(&self, p: &str, mode: u32) -> R;
    /// (mode, nlink, size), following symlinks or not.
    fn stat(&self, p: &str, follow: bool) -> Result<(u32, u32, u64), i32>;
    fn fstat(&self, fd: i32) -> Result<(u32, u32, u64), i32>;
    /// Names in the directory (open O_DIRECTORY + getdents), without "." and "..".
    fn list(&self, p: &str) -> Result<Vec<Vec<u8>>, i32>;
}

// ---------------------------------------------------------------------------
// Host
// ---------------------------------------------------------------------------

struct Host {
    dir: String,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn cr(r: i64) -> R {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

impl Host {
    fn path(&self, p: &str) -> CString {
        CString::new(format!("{}/{}", self.dir, p)).unwrap()
    }
}

fn host_stat(st: &libc::stat) -> (u32, u32, u64) {
    (st.st_mode, st.st_nlink as u32, st.st_size as u64)
}

impl Sys for Host {
    fn open(&self, p: &str, flags: u32, mode: u32) -> R {
        // SAFETY: valid C string.
        cr(unsafe { libc::open(self.path(p).as_ptr(), flags as i32, mode) } as i64)
    }
    fn close(&self, fd: i32) -> R {
        // SAFETY: plain syscall on an fd this test opened.
        cr(unsafe { libc::close(fd) } as i64)
    }
    fn read(&self, fd: i32, n: usize) -> Result<Vec<u8>, i32> {
        let mut b = vec![0u8; n];
        // SAFETY: buffer of n bytes.
        let r = cr(unsafe { libc::read(fd, b.as_mut_ptr().cast(), n) } as i64)?;
        b.truncate(r as usize);
        Ok(b)
    }
    fn pread(&self, fd: i32, n: usize, off: i64) -> Result<Vec<u8>, i32> {
        let mut b = vec![0u8; n];
        // SAFETY: buffer of n bytes.
        let r = cr(unsafe { libc::pread(fd, b.as_mut_ptr().cast(), n, off) } as i64)?;
        b.truncate(r as usize);
        Ok(b)
    }
    fn write(&self, fd: i32, b: &[u8]) -> R {
        // SAFETY: valid buffer.
        cr(unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) } as i64)
    }
    fn pwrite(&self, fd: i32, b: &[u8], off: i64) -> R {
        // SAFETY: valid buffer.
        cr(unsafe { libc::pwrite(fd, b.as_ptr().cast(), b.len(), off) } as i64)
    }
    fn lseek(&self, fd: i32, off: i64, wh: u32) -> R {
        // SAFETY: plain syscall.
        cr(unsafe { libc::lseek(fd, off, wh as i32) })
    }
    fn ftruncate(&self, fd: i32, len: i64) -> R {
        // SAFETY: plain syscall.
        cr(unsafe { libc::ftruncate(fd, len) } as i64)
    }
    fn truncate(&self, p: &str, len: i64) -> R {
        // SAFETY: valid C string.
        cr(unsafe { libc::truncate(self.path(p).as_ptr(), len) } as i64)
    }
    fn unlink(&self, p: &str) -> R {
        // SAFETY: valid C string.
        cr(unsafe { libc::unlink(self.path(p).as_ptr()) } as i64)
    }
    fn rmdir(&self, p: &str) -> R {
        // SAFETY: valid C string.
        cr(unsafe { libc::rmdir(self.path(p).as_ptr()) } as i64)
    }
    fn mkdir(&self, p: &str, mode: u32) -> R {
        // SAFETY: valid C string.
        cr(unsafe { libc::mkdir(self.path(p).as_ptr(), mode) } as i64)
    }
    fn rename(&self, a: &str, b: &str, flags: u32) -> R {
        // SAFETY: valid C strings; raw syscall (renameat2 has no glibc
        // wrapper on every libc this builds with).
        cr(unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                self.path(a).as_ptr(),
                libc::AT_FDCWD,
                self.path(b).as_ptr(),
                flags,
            )
        })
    }
    fn link(&self, a: &str, b: &str) -> R {
        // SAFETY: valid C strings.
        cr(unsafe { libc::link(self.path(a).as_ptr(), self.path(b).as_ptr()) } as i64)
    }
    fn symlink(&self, target: &str, p: &str) -> R {
        let t = CString::new(target).unwrap();
        // SAFETY: valid C strings.
        cr(unsafe { libc::symlink(t.as_ptr(), self.path(p).as_ptr()) } as i64)
    }
    fn readlink(&self, p: &str) -> Result<Vec<u8>, i32> {
        let mut b = vec![0u8; 4096];
        // SAFETY: buffer of b.len() bytes.
        let n = cr(
            unsafe { libc::readlink(self.path(p).as_ptr(), b.as_mut_ptr().cast(), b.len()) } as i64,
        )?;
        b.truncate(n as usize);
        Ok(b)
    }
    fn chmod(&self, p: &str, mode: u32) -> R {
        // SAFETY: valid C string.
        cr(unsafe { libc::chmod(self.path(p).as_ptr(), mode) } as i64)
    }
    fn stat(&self, p: &str, follow: bool) -> Result<(u32, u32, u64), i32> {
        // SAFETY: zeroed stat is a valid out buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let c = self.path(p);
        // SAFETY: valid pointers.
        let r = unsafe {
            if follow {
                libc::stat(c.as_ptr(), &mut st)
            } else {
                libc::lstat(c.as_ptr(), &mut st)
            }
        };
        cr(r as i64)?;
        Ok(host_stat(&st))
    }
    fn fstat(&self, fd: i32) -> Result<(u32, u32, u64), i32> {
        // SAFETY: zeroed stat is a valid out buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid out pointer.
        cr(unsafe { libc::fstat(fd, &mut st) } as i64)?;
        Ok(host_stat(&st))
    }
    fn list(&self, p: &str) -> Result<Vec<Vec<u8>>, i32> {
        let fd = self.open(p, (libc::O_RDONLY | libc::O_DIRECTORY) as u32, 0)? as i32;
        let mut names = Vec::new();
        let mut buf = vec![0u8; 4096];
        loop {
            // SAFETY: buffer of buf.len() bytes; fd is open.
            let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
            if n < 0 {
                let e = errno();
                self.close(fd).unwrap();
                return Err(e);
            }
            if n == 0 {
                break;
            }
            let mut off = 0usize;
            while off < n as usize {
                // linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name.
                let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
                let name = &buf[off + 19..off + reclen];
                let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
                names.push(name[..end].to_vec());
                off += reclen;
            }
        }
        self.close(fd).unwrap();
        Ok(clean_names(names))
    }
}

fn clean_names(mut names: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    names.retain(|n| n != b"." && n != b"..");
    names.sort();
    names
}

// ---------------------------------------------------------------------------
// scalevfs
// ---------------------------------------------------------------------------

struct Ours {
    t: Task,
}

fn e<T: TryInto<i64>>(r: Result<T, Errno>) -> R
where
    T::Error: std::fmt::Debug,
{
    r.map(|v| v.try_into().unwrap()).map_err(|e| e.raw())
}

fn op(p: &str) -> String {
    format!("/{p}")
}

impl Sys for Ours {
    fn open(&self, p: &str, flags: u32, mode: u32) -> R {
        e(self.t.open(&op(p), flags, mode))
    }
    fn close(&self, fd: i32) -> R {
        e(self.t.close(fd).map(|_| 0))
    }
    fn read(&self, fd: i32, n: usize) -> Result<Vec<u8>, i32> {
        let mut b = vec![0u8; n];
        let r = self.t.read(fd, &mut b).map_err(|e| e.raw())?;
        b.truncate(r);
        Ok(b)
    }
    fn pread(&self, fd: i32, n: usize, off: i64) -> Result<Vec<u8>, i32> {
        let mut b = vec![0u8; n];
        let r = self.t.pread(fd, &mut b, off).map_err(|e| e.raw())?;
        b.truncate(r);
        Ok(b)
    }
    fn write(&self, fd: i32, b: &[u8]) -> R {
        e(self.t.write(fd, b))
    }
    fn pwrite(&self, fd: i32, b: &[u8], off: i64) -> R {
        e(self.t.pwrite(fd, b, off))
    }
    fn lseek(&self, fd: i32, off: i64, wh: u32) -> R {
        e(self.t.lseek(fd, off, wh))
    }
    fn ftruncate(&self, fd: i32, len: i64) -> R {
        e(self.t.ftruncate(fd, len).map(|_| 0))
    }
    fn truncate(&self, p: &str, len: i64) -> R {
        e(self.t.truncate(&op(p), len).map(|_| 0))
    }
    fn unlink(&self, p: &str) -> R {
        e(self.t.unlink(&op(p)).map(|_| 0))
    }
    fn rmdir(&self, p: &str) -> R {
        e(self.t.rmdir(&op(p)).map(|_| 0))
    }
    fn mkdir(&self, p: &str, mode: u32) -> R {
        e(self.t.mkdir(&op(p), mode).map(|_| 0))
    }
    fn rename(&self, a: &str, b: &str, flags: u32) -> R {
        e(self
            .t
            .renameat2(AT_FDCWD, &op(a), AT_FDCWD, &op(b), flags)
            .map(|_| 0))
    }
    fn link(&self, a: &str, b: &str) -> R {
        e(self.t.link(&op(a), &op(b)).map(|_| 0))
    }
    fn symlink(&self, target: &str, p: &str) -> R {
        e(self.t.symlink(target, &op(p)).map(|_| 0))
    }
    fn readlink(&self, p: &str) -> Result<Vec<u8>, i32> {
        self.t.readlink(&op(p)).map_err(|e| e.raw())
    }
    fn chmod(&self, p: &str, mode: u32) -> R {
        e(self.t.chmod(&op(p), mode).map(|_| 0))
    }
    fn stat(&self, p: &str, follow: bool) -> Result<(u32, u32, u64), i32> {
        let s = if follow {
            self.t.stat(&op(p))
        } else {
            self.t.lstat(&op(p))
        }
        .map_err(|e| e.raw())?;
        Ok((s.mode, s.nlink, s.size))
    }
    fn fstat(&self, fd: i32) -> Result<(u32, u32, u64), i32> {
        let s = self.t.fstat(fd).map_err(|e| e.raw())?;
        Ok((s.mode, s.nlink, s.size))
    }
    fn list(&self, p: &str) -> Result<Vec<Vec<u8>>, i32> {
        let fd = self
            .t
            .open(&op(p), O_RDONLY | O_DIRECTORY, 0)
            .map_err(|e| e.raw())?;
        let mut names = Vec::new();
        loop {
            match self.t.getdents(fd, 4096) {
                Ok(v) if v.is_empty() => break,
                Ok(v) => names.extend(v.into_iter().map(|d| d.name)),
                Err(err) => {
                    self.t.close(fd).unwrap();
                    return Err(err.raw());
                }
            }
        }
        self.t.close(fd).unwrap();
        Ok(clean_names(names))
    }
}

// ---------------------------------------------------------------------------
// Random operations
// ---------------------------------------------------------------------------

/// xorshift64*: small, seeded, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

const SLOTS: usize = 4;

/// Bytes to write; printed as length and first byte, not in full.
#[derive(Clone)]
struct Bytes(Vec<u8>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "<{} bytes from {}>",
            self.0.len(),
            self.0.first().unwrap_or(&0)
        )
    }
}

#[derive(Debug, Clone)]
enum Op {
    Open(String, u32, u32),
    Close(usize),
    Read(usize, usize),
    Pread(usize, usize, i64),
    Write(usize, Bytes),
    Pwrite(usize, Bytes, i64),
    Lseek(usize, i64, u32),
    Ftruncate(usize, i64),
    Fstat(usize),
    Truncate(String, i64),
    Unlink(String),
    Rmdir(String),
    Mkdir(String, u32),
    Rename(String, String, u32),
    Link(String, String),
    Symlink(String, String),
    Readlink(String),
    Chmod(String, u32),
    Stat(String, bool),
    List(String),
}

/// A path of one to three components from a small name set, so calls
/// collide; sometimes with "." components or a trailing slash.
fn gen_path(r: &mut Rng) -> String {
    let depth = 1 + r.below(3) as usize;
    let mut s = String::new();
    for i in 0..depth {
        if i > 0 {
            s.push('/');
        }
        if i > 0 && r.chance(5) {
            s.push_str("./");
        }
        let name: &&str = r.pick(&["a", "b", "c", "d"]);
        s.push_str(name);
    }
    if r.chance(8) {
        s.push('/');
    }
    if r.chance(3) {
        s.push_str("/.");
    }
    s
}

fn gen_data(r: &mut Rng) -> Bytes {
    let n = match r.below(10) {
        0 => 0,
        1 => 4096 + r.below(5000) as usize,
        _ => 1 + r.below(200) as usize,
    };
    let b = r.next() as u8;
    Bytes((0..n).map(|i| b.wrapping_add(i as u8)).collect())
}

fn gen_off(r: &mut Rng) -> i64 {
    match r.below(10) {
        0 => -1,
        1 => 8192 + r.below(10000) as i64,
        _ => r.below(600) as i64,
    }
}

fn gen_op(r: &mut Rng) -> Op {
    let slot = r.below(SLOTS as u64) as usize;
    match r.below(100) {
        0..=14 => {
            let mut flags = *r.pick(&[O_RDONLY, O_WRONLY, O_RDWR, O_RDWR]);
            for (f, pct) in [
                (O_CREAT, 60),
                (O_EXCL, 15),
                (O_TRUNC, 15),
                (O_APPEND, 15),
                (O_DIRECTORY, 8),
                (O_NOFOLLOW, 8),
            ] {
                if r.chance(pct) {
                    flags |= f;
                }
            }
            Op::Open(gen_path(r), flags, *r.pick(&[0o644, 0o600, 0o755, 0o000]))
        }
        15..=20 => Op::Close(slot),
        21..=25 => Op::Read(slot, r.below(300) as usize),
        26..=29 => Op::Pread(slot, r.below(300) as usize, gen_off(r)),
        30..=36 => Op::Write(slot, gen_data(r)),
        37..=41 => Op::Pwrite(slot, gen_data(r), gen_off(r)),
        42..=43 => Op::Lseek(
            slot,
            gen_off(r),
            *r.pick(&[SEEK_SET, SEEK_CUR, SEEK_END, SEEK_DATA, SEEK_HOLE]),
        ),
        44..=46 => Op::Ftruncate(slot, gen_off(r)),
        47..=48 => Op::Fstat(slot),
        49..=50 => Op::Truncate(gen_path(r), gen_off(r)),
        51..=56 => Op::Unlink(gen_path(r)),
        57..=60 => Op::Rmdir(gen_path(r)),
        61..=68 => Op::Mkdir(gen_path(r), *r.pick(&[0o755, 0o700, 0o777])),
        69..=76 => Op::Rename(
            gen_path(r),
            gen_path(r),
            *r.pick(&[0, 0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE]),
        ),
        77..=80 => Op::Link(gen_path(r), gen_path(r)),
        81..=84 => {
            // Relative targets only: the host side stays in its directory.
            let t = if r.chance(20) {
                ".".to_string()
            } else {
                gen_path(r)
            };
            Op::Symlink(t, gen_path(r))
        }
        85..=86 => Op::Readlink(gen_path(r)),
        87..=88 => Op::Chmod(gen_path(r), *r.pick(&[0o644, 0o755, 0o600, 0o4755, 0o1777])),
        89..=95 => Op::Stat(gen_path(r), r.chance(50)),
        _ => Op::List(if r.chance(20) {
            ".".to_string()
        } else {
            gen_path(r)
        }),
    }
}

fn short(o: &Out) -> String {
    match o {
        Out::Data(d) if d.len() > 16 => format!("Data(<{} bytes>)", d.len()),
        o => format!("{o:?}"),
    }
}

fn val(r: R) -> Out {
    match r {
        Ok(v) => Out::Val(v),
        Err(e) => Out::Err(e),
    }
}

fn data(r: Result<Vec<u8>, i32>) -> Out {
    match r {
        Ok(v) => Out::Data(v),
        Err(e) => Out::Err(e),
    }
}

fn st(r: Result<(u32, u32, u64), i32>) -> Out {
    match r {
        Ok((mode, nlink, size)) => {
            let size = if mode & libc::S_IFMT == libc::S_IFDIR {
                0
            } else {
                size
            };
            Out::Stat(mode, nlink, size)
        }
        Err(e) => Out::Err(e),
    }
}

/// One side's state: which fd each slot holds.
struct Side<'a> {
    sys: &'a dyn Sys,
    slots: [Option<i32>; SLOTS],
}

impl Side<'_> {
    fn fd(&self, slot: usize) -> Result<i32, Out> {
        self.slots[slot].ok_or(Out::Err(libc::EBADF))
    }

    fn apply(&mut self, op: &Op) -> Out {
        let s = self.sys;
        let fd_op = |slot: usize, f: &dyn Fn(i32) -> Out| match self.fd(slot) {
            Ok(fd) => f(fd),
            Err(o) => o,
        };
        match op {
            Op::Open(p, flags, mode) => {
                let slot = self.slots.iter().position(Option::is_none);
                let r = s.open(p, *flags, *mode);
                match (r, slot) {
                    (Ok(fd), Some(i)) => {
                        self.slots[i] = Some(fd as i32);
                        Out::Val(0)
                    }
                    (Ok(fd), None) => {
                        s.close(fd as i32).unwrap();
                        Out::Val(0)
                    }
                    (Err(e), _) => Out::Err(e),
                }
            }
            Op::Close(slot) => match self.fd(*slot) {
                Ok(fd) => {
                    self.slots[*slot] = None;
                    val(s.close(fd))
                }
                Err(o) => o,
            },
            Op::Read(slot, n) => fd_op(*slot, &|fd| data(s.read(fd, *n))),
            Op::Pread(slot, n, off) => fd_op(*slot, &|fd| data(s.pread(fd, *n, *off))),
            Op::Write(slot, b) => fd_op(*slot, &|fd| val(s.write(fd, &b.0))),
            Op::Pwrite(slot, b, off) => fd_op(*slot, &|fd| val(s.pwrite(fd, &b.0, *off))),
            Op::Lseek(slot, off, wh) => fd_op(*slot, &|fd| val(s.lseek(fd, *off, *wh))),
            Op::Ftruncate(slot, len) => fd_op(*slot, &|fd| val(s.ftruncate(fd, *len))),
            Op::Fstat(slot) => fd_op(*slot, &|fd| st(s.fstat(fd))),
            Op::Truncate(p, len) => val(s.truncate(p, *len)),
            Op::Unlink(p) => val(s.unlink(p)),
            Op::Rmdir(p) => val(s.rmdir(p)),
            Op::Mkdir(p, m) => val(s.mkdir(p, *m)),
            Op::Rename(a, b, f) => val(s.rename(a, b, *f)),
            Op::Link(a, b) => val(s.link(a, b)),
            Op::Symlink(t, p) => val(s.symlink(t, p)),
            Op::Readlink(p) => data(s.readlink(p)),
            Op::Chmod(p, m) => val(s.chmod(p, *m)),
            Op::Stat(p, follow) => st(s.stat(p, *follow)),
            Op::List(p) => match s.list(p) {
                Ok(v) => Out::Names(v),
                Err(e) => Out::Err(e),
            },
        }
    }

    fn close_all(&mut self) {
        for slot in self.slots.iter_mut() {
            if let Some(fd) = slot.take() {
                self.sys.close(fd).unwrap();
            }
        }
    }
}

/// The whole tree under `p` ("." for the root): path -> (lstat, content or
/// link target).
fn tree(s: &dyn Sys, p: &str, out: &mut BTreeMap<String, (Out, Out)>) {
    for name in s.list(p).unwrap() {
        let name = String::from_utf8(name).unwrap();
        let child = if p == "." {
            name
        } else {
            format!("{p}/{name}")
        };
        let l = s.stat(&child, false).unwrap();
        let content = match l.0 & libc::S_IFMT {
            libc::S_IFLNK => data(s.readlink(&child)),
            libc::S_IFREG => {
                let fd = s.open(&child, O_RDONLY, 0).unwrap() as i32;
                let d = s.pread(fd, l.2 as usize + 1, 0);
                s.close(fd).unwrap();
                data(d)
            }
            _ => Out::Val(0),
        };
        out.insert(child.clone(), (st(Ok(l)), content));
        if l.0 & libc::S_IFMT == libc::S_IFDIR {
            tree(s, &child, out);
        }
    }
}

fn host_ok() -> bool {
    // SAFETY: plain syscall.
    std::path::Path::new("/dev/shm").is_dir() && unsafe { libc::geteuid() } == 0
}

static UMASK: Once = Once::new();

fn run_seed(seed: u64, ops: usize) {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.umask(0o022);
    let ours = Ours { t };
    let host_dir = format!("/dev/shm/scalevfs-random-{}-{seed}", std::process::id());
    let host = if host_ok() {
        UMASK.call_once(|| {
            // SAFETY: plain syscall; every seed wants the same value.
            unsafe { libc::umask(0o022) };
        });
        let _ = std::fs::remove_dir_all(&host_dir);
        std::fs::create_dir(&host_dir).unwrap();
        // As scalevfs's root (a symlink to "." reaches it).
        std::fs::set_permissions(
            &host_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o1777),
        )
        .unwrap();
        Some(Host {
            dir: host_dir.clone(),
        })
    } else {
        eprintln!("seed {seed}: host side skipped (no /dev/shm or not root)");
        None
    };
    let mut a = Side {
        sys: &ours,
        slots: [None; SLOTS],
    };
    let mut b = host.as_ref().map(|h| Side {
        sys: h,
        slots: [None; SLOTS],
    });
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut log: Vec<String> = Vec::new();
    for i in 0..ops {
        let op = gen_op(&mut r);
        let ra = a.apply(&op);
        if let Some(b) = b.as_mut() {
            let rb = b.apply(&op);
            log.push(format!("{i}: {op:?} -> {}", short(&rb)));
            if ra != rb {
                let tail = log[log.len().saturating_sub(40)..].join("\n");
                let _ = std::fs::remove_dir_all(&host_dir);
                panic!(
                    "seed {seed} op {i}: {op:?}\n  scalevfs: {}\n  tmpfs:    {}\n\
                     last ops (tmpfs results):\n{tail}",
                    short(&ra),
                    short(&rb)
                );
            }
        }
    }
    a.close_all();
    let mut ta = BTreeMap::new();
    tree(&ours, ".", &mut ta);
    if let (Some(mut b), Some(h)) = (b, host.as_ref()) {
        b.close_all();
        let mut tb = BTreeMap::new();
        tree(h, ".", &mut tb);
        let _ = std::fs::remove_dir_all(&host_dir);
        assert_eq!(ta, tb, "seed {seed}: final trees differ");
    }
}

const OPS: usize = 1500;

#[test]
fn seeds_1_to_4() {
    for seed in 1..=4 {
        run_seed(seed, OPS);
    }
}

#[test]
fn seeds_5_to_8() {
    for seed in 5..=8 {
        run_seed(seed, OPS);
    }
}

// ---------------------------------------------------------------------------
// Regressions found by the random runs, as fixed scripts: each step's result
// is given (what tmpfs returns) and checked on scalevfs and, where it can
// run, on the host.
// ---------------------------------------------------------------------------

fn script(name: &str, steps: &[(Op, Out)]) {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.umask(0o022);
    let ours = Ours { t };
    let host_dir = format!("/dev/shm/scalevfs-random-{}-{name}", std::process::id());
    let host = host_ok().then(|| {
        let _ = std::fs::remove_dir_all(&host_dir);
        std::fs::create_dir(&host_dir).unwrap();
        Host {
            dir: host_dir.clone(),
        }
    });
    let mut a = Side {
        sys: &ours,
        slots: [None; SLOTS],
    };
    let mut b = host.as_ref().map(|h| Side {
        sys: h,
        slots: [None; SLOTS],
    });
    for (i, (op, want)) in steps.iter().enumerate() {
        let ra = a.apply(op);
        let rb = b.as_mut().map(|b| b.apply(op));
        if rb.as_ref().is_some_and(|rb| rb != want) {
            let _ = std::fs::remove_dir_all(&host_dir);
            panic!("{name} step {i} {op:?}: tmpfs gave {rb:?}, the script says {want:?}");
        }
        if ra != *want {
            let _ = std::fs::remove_dir_all(&host_dir);
            panic!("{name} step {i} {op:?}: scalevfs gave {ra:?}, want {want:?}");
        }
    }
    a.close_all();
    if let Some(mut b) = b {
        b.close_all();
    }
    let _ = std::fs::remove_dir_all(&host_dir);
}

fn s(p: &str) -> String {
    p.to_string()
}

const OK: Out = Out::Val(0);

/// open("dir/.", O_CREAT|O_EXCL) is EEXIST (do_open checks O_EXCL before
/// the directory); without O_EXCL it is EISDIR. scalevfs said EISDIR to both
/// (random seed 7, op 361).
#[test]
fn open_creat_excl_on_dot_is_eexist() {
    let ce = O_CREAT | O_EXCL;
    script(
        "creat-excl-dot",
        &[
            (Op::Mkdir(s("d"), 0o755), OK),
            (Op::Open(s("d/."), ce, 0o644), Out::Err(libc::EEXIST)),
            (
                Op::Open(s("d/."), ce | O_RDWR, 0o644),
                Out::Err(libc::EEXIST),
            ),
            (Op::Open(s("d/.."), ce, 0o644), Out::Err(libc::EEXIST)),
            (Op::Open(s("d/."), O_CREAT, 0o644), Out::Err(libc::EISDIR)),
            (Op::Open(s("d/"), ce, 0o644), Out::Err(libc::EISDIR)),
            (Op::Open(s("x/."), ce, 0o644), Out::Err(libc::ENOENT)),
        ],
    );
}

/// rename's checks in do_renameat2's order: RENAME_NOREPLACE's EEXIST and
/// RENAME_EXCHANGE's missing-target ENOENT come before the trailing-slash
/// ENOTDIR, and with RENAME_EXCHANGE a slash counts only against the name
/// it ends. scalevfs gave ENOTDIR first (random seeds 2 and 7) and refused
/// exchanges Linux allows.
#[test]
fn rename_trailing_slash_order() {
    let (nr, ex) = (RENAME_NOREPLACE, RENAME_EXCHANGE);
    let setup = [
        (Op::Mkdir(s("d"), 0o755), OK),
        (Op::Mkdir(s("e"), 0o755), OK),
        (Op::Open(s("f"), O_CREAT | O_WRONLY, 0o644), OK),
        (Op::Open(s("g"), O_CREAT | O_WRONLY, 0o644), OK),
    ];
    let cases = [
        ("f/", "g", nr, Out::Err(libc::EEXIST)),
        ("f/", "nx/", ex, Out::Err(libc::ENOENT)),
        ("d", "f/", ex, Out::Err(libc::ENOTDIR)),
        ("f/", "d", ex, Out::Err(libc::ENOTDIR)),
        ("f", "nx/", 0, Out::Err(libc::ENOTDIR)),
        ("f", "g/", 0, Out::Err(libc::ENOTDIR)),
        ("d/", "f", ex, OK),
        ("f", "d/", ex, OK),
        ("d/", "e/", 0, OK),
    ];
    for (i, (a, b, f, want)) in cases.into_iter().enumerate() {
        let mut steps = setup.to_vec();
        steps.push((Op::Rename(s(a), s(b), f), want));
        script(&format!("rename-slash-{i}"), &steps);
    }
}
