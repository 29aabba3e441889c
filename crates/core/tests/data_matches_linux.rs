//! Differential test of the open-file and data calls: every scenario runs on
//! the host kernel (a fresh directory under /dev/shm, tmpfs, the filesystem
//! memfs imitates) and on a fresh scalevfs `Vfs`, through one `Sys` trait;
//! each call's result (value or errno, and selected `stat` fields) is logged
//! and the two logs must be equal. Scenarios cover openat flags, read/write,
//! pread/pwrite, readv/writev, lseek (all whences, SEEK_DATA/SEEK_HOLE),
//! sparse files and large offsets, ftruncate/truncate, fallocate, fsync,
//! dup/dup2/dup3, fcntl, and permission errors as a non-root user (host
//! side: a thread with setfsuid/setfsgid, which are per-thread).
//!
//! If /dev/shm is missing or we are not root, the host side is skipped and
//! only the scalevfs side runs (it must still not panic).

use std::ffi::CString;
use std::sync::Once;

use scalevfs::io::*;
use scalevfs::*;

type R = Result<i64, i32>;

trait Sys {
    fn open(&self, p: &str, flags: u32, mode: u32) -> R;
    fn close(&self, fd: i32) -> R;
    fn read(&self, fd: i32, n: usize) -> Result<Vec<u8>, i32>;
    fn pread(&self, fd: i32, n: usize, off: i64) -> Result<Vec<u8>, i32>;
    fn write(&self, fd: i32, b: &[u8]) -> R;
    fn pwrite(&self, fd: i32, b: &[u8], off: i64) -> R;
    fn writev(&self, fd: i32, b: &[&[u8]]) -> R;
    fn readv(&self, fd: i32, sizes: &[usize]) -> Result<Vec<Vec<u8>>, i32>;
    fn lseek(&self, fd: i32, off: i64, wh: u32) -> R;
    fn ftruncate(&self, fd: i32, len: i64) -> R;
    fn truncate(&self, p: &str, len: i64) -> R;
    fn fallocate(&self, fd: i32, mode: u32, off: i64, len: i64) -> R;
    fn fsync(&self, fd: i32) -> R;
    fn fdatasync(&self, fd: i32) -> R;
    /// (mode, nlink, size, blocks)
    fn fstat(&self, fd: i32) -> Result<(u32, u32, u64, u64), i32>;
    fn stat_size(&self, p: &str) -> R;
    fn mkdir(&self, p: &str, mode: u32) -> R;
    fn mkfifo(&self, p: &str) -> R;
    fn symlink(&self, target: &str, p: &str) -> R;
    fn chmod(&self, p: &str, mode: u32) -> R;
    fn dup(&self, fd: i32) -> R;
    fn dup2(&self, a: i32, b: i32) -> R;
    fn dup3(&self, a: i32, b: i32, fl: u32) -> R;
    fn fcntl(&self, fd: i32, cmd: u32, arg: u64) -> R;
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
        if p.starts_with('/') {
            CString::new(p).unwrap()
        } else {
            CString::new(format!("{}/{}", self.dir, p)).unwrap()
        }
    }
}

impl Sys for Host {
    fn open(&self, p: &str, flags: u32, mode: u32) -> R {
        // SAFETY: valid C string.
        cr(unsafe { libc::open(self.path(p).as_ptr(), flags as i32, mode) } as i64)
    }
    fn close(&self, fd: i32) -> R {
        // SAFETY: plain syscall.
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
    fn writev(&self, fd: i32, b: &[&[u8]]) -> R {
        let iov: Vec<libc::iovec> = b
            .iter()
            .map(|s| libc::iovec {
                iov_base: s.as_ptr() as *mut _,
                iov_len: s.len(),
            })
            .collect();
        // SAFETY: iovecs point at live slices.
        cr(unsafe { libc::writev(fd, iov.as_ptr(), iov.len() as i32) } as i64)
    }
    fn readv(&self, fd: i32, sizes: &[usize]) -> Result<Vec<Vec<u8>>, i32> {
        let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
        let iov: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|s| libc::iovec {
                iov_base: s.as_mut_ptr().cast(),
                iov_len: s.len(),
            })
            .collect();
        // SAFETY: iovecs point at live buffers.
        let mut n = cr(unsafe { libc::readv(fd, iov.as_ptr(), iov.len() as i32) } as i64)? as usize;
        for b in bufs.iter_mut() {
            let k = b.len().min(n);
            b.truncate(k);
            n -= k;
        }
        Ok(bufs)
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
    fn fallocate(&self, fd: i32, mode: u32, off: i64, len: i64) -> R {
        // SAFETY: plain syscall.
        cr(unsafe { libc::fallocate(fd, mode as i32, off, len) } as i64)
    }
    fn fsync(&self, fd: i32) -> R {
        // SAFETY: plain syscall.
        cr(unsafe { libc::fsync(fd) } as i64)
    }
    fn fdatasync(&self, fd: i32) -> R {
        // SAFETY: plain syscall.
        cr(unsafe { libc::fdatasync(fd) } as i64)
    }
    fn fstat(&self, fd: i32) -> Result<(u32, u32, u64, u64), i32> {
        // SAFETY: zeroed stat is a valid out buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid out pointer.
        cr(unsafe { libc::fstat(fd, &mut st) } as i64)?;
        Ok((
            st.st_mode,
            st.st_nlink as u32,
            st.st_size as u64,
            st.st_blocks as u64,
        ))
    }
    fn stat_size(&self, p: &str) -> R {
        // SAFETY: zeroed stat is a valid out buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointers.
        cr(unsafe { libc::stat(self.path(p).as_ptr(), &mut st) } as i64)?;
        Ok(st.st_size)
    }
    fn mkdir(&self, p: &str, mode: u32) -> R {
        // SAFETY: valid C string.
        cr(unsafe { libc::mkdir(self.path(p).as_ptr(), mode) } as i64)
    }
    fn mkfifo(&self, p: &str) -> R {
        // SAFETY: valid C string.
        cr(unsafe { libc::mkfifo(self.path(p).as_ptr(), 0o644) } as i64)
    }
    fn symlink(&self, target: &str, p: &str) -> R {
        let t = CString::new(target).unwrap();
        // SAFETY: valid C strings.
        cr(unsafe { libc::symlink(t.as_ptr(), self.path(p).as_ptr()) } as i64)
    }
    fn chmod(&self, p: &str, mode: u32) -> R {
        // SAFETY: valid C string.
        cr(unsafe { libc::chmod(self.path(p).as_ptr(), mode) } as i64)
    }
    fn dup(&self, fd: i32) -> R {
        // SAFETY: plain syscall.
        cr(unsafe { libc::dup(fd) } as i64)
    }
    fn dup2(&self, a: i32, b: i32) -> R {
        // SAFETY: plain syscall.
        cr(unsafe { libc::dup2(a, b) } as i64)
    }
    fn dup3(&self, a: i32, b: i32, fl: u32) -> R {
        // SAFETY: plain syscall.
        cr(unsafe { libc::dup3(a, b, fl as i32) } as i64)
    }
    fn fcntl(&self, fd: i32, cmd: u32, arg: u64) -> R {
        // SAFETY: plain syscall with an integer argument.
        cr(unsafe { libc::fcntl(fd, cmd as i32, arg) } as i64)
    }
}

// ---------------------------------------------------------------------------
// scalevfs
// ---------------------------------------------------------------------------

struct Ours {
    t: Task,
}

fn e(r: Result<impl Into<i64>, Errno>) -> R {
    r.map(Into::into).map_err(|e| e.raw())
}

impl Ours {
    fn path(p: &str) -> String {
        if p.starts_with('/') {
            p.to_string()
        } else {
            format!("/{p}")
        }
    }
}

impl Sys for Ours {
    fn open(&self, p: &str, flags: u32, mode: u32) -> R {
        e(self.t.open(&Ours::path(p), flags, mode))
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
        e(self.t.write(fd, b).map(|n| n as i64))
    }
    fn pwrite(&self, fd: i32, b: &[u8], off: i64) -> R {
        e(self.t.pwrite(fd, b, off).map(|n| n as i64))
    }
    fn writev(&self, fd: i32, b: &[&[u8]]) -> R {
        e(self.t.writev(fd, b).map(|n| n as i64))
    }
    fn readv(&self, fd: i32, sizes: &[usize]) -> Result<Vec<Vec<u8>>, i32> {
        let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
        let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        let mut n = self.t.readv(fd, &mut refs).map_err(|e| e.raw())?;
        for b in bufs.iter_mut() {
            let k = b.len().min(n);
            b.truncate(k);
            n -= k;
        }
        Ok(bufs)
    }
    fn lseek(&self, fd: i32, off: i64, wh: u32) -> R {
        e(self.t.lseek(fd, off, wh).map(|n| n as i64))
    }
    fn ftruncate(&self, fd: i32, len: i64) -> R {
        e(self.t.ftruncate(fd, len).map(|_| 0))
    }
    fn truncate(&self, p: &str, len: i64) -> R {
        e(self.t.truncate(&Ours::path(p), len).map(|_| 0))
    }
    fn fallocate(&self, fd: i32, mode: u32, off: i64, len: i64) -> R {
        e(self.t.fallocate(fd, mode, off, len).map(|_| 0))
    }
    fn fsync(&self, fd: i32) -> R {
        e(self.t.fsync(fd).map(|_| 0))
    }
    fn fdatasync(&self, fd: i32) -> R {
        e(self.t.fdatasync(fd).map(|_| 0))
    }
    fn fstat(&self, fd: i32) -> Result<(u32, u32, u64, u64), i32> {
        let s = self.t.fstat(fd).map_err(|e| e.raw())?;
        Ok((s.mode, s.nlink, s.size, s.blocks))
    }
    fn stat_size(&self, p: &str) -> R {
        e(self.t.stat(&Ours::path(p)).map(|s| s.size as i64))
    }
    fn mkdir(&self, p: &str, mode: u32) -> R {
        e(self.t.mkdir(&Ours::path(p), mode).map(|_| 0))
    }
    fn mkfifo(&self, p: &str) -> R {
        e(self
            .t
            .mknodat(AT_FDCWD, &Ours::path(p), S_IFIFO | 0o644, 0)
            .map(|_| 0))
    }
    fn symlink(&self, target: &str, p: &str) -> R {
        e(self.t.symlink(target, &Ours::path(p)).map(|_| 0))
    }
    fn chmod(&self, p: &str, mode: u32) -> R {
        e(self.t.chmod(&Ours::path(p), mode).map(|_| 0))
    }
    fn dup(&self, fd: i32) -> R {
        e(self.t.dup(fd))
    }
    fn dup2(&self, a: i32, b: i32) -> R {
        e(self.t.dup2(a, b))
    }
    fn dup3(&self, a: i32, b: i32, fl: u32) -> R {
        e(self.t.dup3(a, b, fl))
    }
    fn fcntl(&self, fd: i32, cmd: u32, arg: u64) -> R {
        e(self.t.fcntl(fd, cmd, arg))
    }
}

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// A log of results; fd numbers are recorded as "fd" (they differ between
/// the host process and a fresh task) but kept for use by the scenario.
#[derive(Default)]
struct Log(Vec<String>);

impl Log {
    fn r(&mut self, what: &str, r: R) -> i64 {
        self.0.push(format!("{what} -> {r:?}"));
        r.unwrap_or(-1)
    }
    fn fd(&mut self, what: &str, r: R) -> i32 {
        self.0.push(format!(
            "{what} -> {}",
            match r {
                Ok(_) => "fd".to_string(),
                Err(e) => format!("Err({e})"),
            }
        ));
        r.unwrap_or(-1) as i32
    }
    fn data(&mut self, what: &str, r: Result<Vec<u8>, i32>) {
        self.0.push(format!(
            "{what} -> {:?}",
            r.map(|v| (v.len(), checksum(&v)))
        ));
    }
    fn any<T: std::fmt::Debug>(&mut self, what: &str, v: T) {
        self.0.push(format!("{what} -> {v:?}"));
    }
}

fn checksum(v: &[u8]) -> u64 {
    v.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

fn host_ok() -> bool {
    // SAFETY: plain syscall.
    std::path::Path::new("/dev/shm").is_dir() && unsafe { libc::geteuid() } == 0
}

static UMASK: Once = Once::new();

fn host_dir(name: &str) -> String {
    UMASK.call_once(|| {
        // SAFETY: plain syscall; every test wants the same value.
        unsafe { libc::umask(0o022) };
    });
    let d = format!("/dev/shm/scalevfs-data-{}-{name}", std::process::id());
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    d
}

/// Run `scenario` on both sides and compare logs. `user` runs it with fsuid
/// 1000 after `setup` ran as root.
fn diff(name: &str, setup: fn(&dyn Sys, &mut Log), scenario: fn(&dyn Sys, &mut Log), user: bool) {
    let vfs = Vfs::new();
    let ours_root = Ours { t: vfs.root_task() };
    let mut ol = Log::default();
    setup(&ours_root, &mut ol);
    let ours_user = if user {
        Ours {
            t: vfs.task(Cred::user(1000, 1000)),
        }
    } else {
        ours_root
    };
    scenario(&ours_user, &mut ol);
    if !host_ok() {
        eprintln!("{name}: host side skipped (no /dev/shm or not root)");
        return;
    }
    let dir = host_dir(name);
    let d2 = dir.clone();
    let hl = std::thread::spawn(move || {
        let h = Host { dir: d2 };
        let mut hl = Log::default();
        setup(&h, &mut hl);
        if user {
            // SAFETY: per-thread credential change (raw syscalls, not the
            // glibc wrappers that broadcast to all threads).
            unsafe {
                libc::syscall(libc::SYS_setfsgid, 1000);
                libc::syscall(libc::SYS_setfsuid, 1000);
            }
        }
        scenario(&h, &mut hl);
        hl
    })
    .join()
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    for (i, (a, b)) in hl.0.iter().zip(ol.0.iter()).enumerate() {
        assert_eq!(
            a, b,
            "{name}: step {i} differs (left: Linux, right: scalevfs)"
        );
    }
    assert_eq!(hl.0.len(), ol.0.len(), "{name}: log lengths differ");
}

fn nothing(_: &dyn Sys, _: &mut Log) {}

// ---------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------

fn open_flags(s: &dyn Sys, l: &mut Log) {
    l.r("mkdir d", s.mkdir("d", 0o755));
    let f = l.fd("creat", s.open("d/f", O_CREAT | O_WRONLY, 0o666));
    l.any("mode after umask", s.fstat(f));
    l.r("write", s.write(f, b"hello"));
    l.r("close", s.close(f));
    l.fd(
        "creat excl existing",
        s.open("d/f", O_CREAT | O_EXCL | O_WRONLY, 0o644),
    );
    let f = l.fd("creat existing", s.open("d/f", O_CREAT | O_RDWR, 0o600));
    l.any("not truncated", s.fstat(f));
    l.r("close", s.close(f));
    let f = l.fd("trunc", s.open("d/f", O_WRONLY | O_TRUNC, 0));
    l.any("truncated", s.fstat(f));
    l.r("close", s.close(f));
    l.r("write again", {
        let f = s.open("d/f", O_WRONLY, 0).unwrap_or(-1) as i32;
        let r = s.write(f, b"abc");
        s.close(f).ok();
        r
    });
    let f = l.fd("rdonly trunc", s.open("d/f", O_RDONLY | O_TRUNC, 0));
    l.any("rdonly trunc truncates", s.fstat(f));
    l.r("close", s.close(f));
    l.fd(
        "directory on file",
        s.open("d/f", O_RDONLY | O_DIRECTORY, 0),
    );
    l.fd("file as dir component", s.open("d/f/x", O_RDONLY, 0));
    l.fd("creat under file", s.open("d/f/x", O_CREAT | O_RDWR, 0o644));
    l.fd("wronly dir", s.open("d", O_WRONLY, 0));
    l.fd("rdwr dir", s.open("d", O_RDWR, 0));
    l.fd("rdonly|trunc dir", s.open("d", O_RDONLY | O_TRUNC, 0));
    l.fd("creat on dir", s.open("d", O_CREAT | O_RDONLY, 0o644));
    l.fd(
        "creat|directory",
        s.open("d/new", O_CREAT | O_DIRECTORY | O_RDONLY, 0o644),
    );
    l.fd(
        "creat trailing slash",
        s.open("d/new/", O_CREAT | O_RDWR, 0o644),
    );
    l.fd(
        "creat trailing slash existing",
        s.open("d/f/", O_CREAT | O_RDWR, 0o644),
    );
    l.fd("missing", s.open("d/missing", O_RDONLY, 0));
    let f = l.fd("accmode 3 file", s.open("d/f", O_ACCMODE, 0));
    l.data("read accmode 3", s.read(f, 4));
    l.r("write accmode 3", s.write(f, b"x"));
    l.r("close", s.close(f));
    l.fd("accmode 3 dir", s.open("d", O_ACCMODE, 0));
    let f = l.fd("dir rdonly", s.open("d", O_RDONLY | O_DIRECTORY, 0));
    l.data("read dir", s.read(f, 4));
    l.data("pread dir", s.pread(f, 4, 0));
    l.r("lseek dir set", s.lseek(f, 0, SEEK_SET));
    l.r("lseek dir end", s.lseek(f, 0, SEEK_END));
    l.r("lseek dir neg", s.lseek(f, -1, SEEK_SET));
    l.r("ftruncate dir", s.ftruncate(f, 0));
    l.r("fsync dir", s.fsync(f));
    l.r("close", s.close(f));
    // Symlinks.
    l.r("symlink", s.symlink("f", "d/l"));
    l.fd("nofollow", s.open("d/l", O_RDONLY | O_NOFOLLOW, 0));
    l.fd(
        "nofollow|directory",
        s.open("d/l", O_RDONLY | O_NOFOLLOW | O_DIRECTORY, 0),
    );
    let f = l.fd("path|nofollow", s.open("d/l", O_PATH | O_NOFOLLOW, 0));
    l.any("path fstat", s.fstat(f).map(|x| x.0 & S_IFMT));
    l.any("path getfl", s.fcntl(f, F_GETFL, 0));
    l.data("path read", s.read(f, 1));
    l.r("path write", s.write(f, b"x"));
    l.r("path lseek", s.lseek(f, 0, SEEK_SET));
    l.r("path fsync", s.fsync(f));
    l.r("path ftruncate", s.ftruncate(f, 0));
    l.r("path setfl", s.fcntl(f, F_SETFL, O_APPEND as u64));
    l.r("close", s.close(f));
    l.fd(
        "path|directory on file",
        s.open("d/f", O_PATH | O_DIRECTORY, 0),
    );
    let f = l.fd("follow", s.open("d/l", O_RDONLY, 0));
    l.data("read through link", s.read(f, 10));
    l.r("close", s.close(f));
    l.fd(
        "creat excl on symlink",
        s.open("d/l", O_CREAT | O_EXCL | O_RDWR, 0o644),
    );
    l.r("dangling", s.symlink("target", "d/dl"));
    let f = l.fd(
        "creat through dangling",
        s.open("d/dl", O_CREAT | O_RDWR, 0o640),
    );
    l.r("close", s.close(f));
    l.r("target made", s.stat_size("d/target"));
    l.r("loop a", s.symlink("lb", "d/la"));
    l.r("loop b", s.symlink("la", "d/lb"));
    l.fd("loop", s.open("d/la", O_RDONLY, 0));
    l.fd("creat loop", s.open("d/la", O_CREAT | O_RDONLY, 0o644));
    // Status flags.
    let f = l.fd(
        "flags",
        s.open(
            "d/f",
            O_RDWR | O_NONBLOCK | O_DIRECT | O_CLOEXEC | O_SYNC,
            0,
        ),
    );
    l.r("getfl", s.fcntl(f, F_GETFL, 0));
    l.r("getfd", s.fcntl(f, F_GETFD, 0));
    l.r("setfl", s.fcntl(f, F_SETFL, (O_APPEND | O_RDONLY) as u64));
    l.r("getfl after", s.fcntl(f, F_GETFL, 0));
    l.r("setfd", s.fcntl(f, F_SETFD, 0));
    l.r("getfd after", s.fcntl(f, F_GETFD, 0));
    l.r("close", s.close(f));
    // O_TMPFILE.
    l.fd("tmpfile rdonly", s.open("d", O_TMPFILE | O_RDONLY, 0o600));
    l.fd(
        "tmpfile no dir bit",
        s.open("d", (O_TMPFILE & !O_DIRECTORY) | O_RDWR, 0o600),
    );
    l.fd(
        "tmpfile creat",
        s.open("d", O_TMPFILE | O_CREAT | O_RDWR, 0o600),
    );
    l.fd("tmpfile on file", s.open("d/f", O_TMPFILE | O_RDWR, 0o600));
    l.fd(
        "tmpfile missing",
        s.open("d/nope", O_TMPFILE | O_RDWR, 0o600),
    );
    let f = l.fd("tmpfile", s.open("d", O_TMPFILE | O_RDWR, 0o666));
    l.any("tmpfile stat", s.fstat(f));
    l.r("tmpfile write", s.write(f, b"orphan"));
    l.data("tmpfile pread", s.pread(f, 10, 0));
    l.any("tmpfile stat 2", s.fstat(f));
    l.r("close", s.close(f));
    l.r("closed fd", s.close(f));
    // FIFO.
    l.r("mkfifo", s.mkfifo("d/p"));
    let f = l.fd("fifo rdwr", s.open("d/p", O_RDWR | O_NONBLOCK, 0));
    l.r("fifo lseek", s.lseek(f, 0, SEEK_CUR));
    // ksys_lseek: an unknown whence is EINVAL before the pipe's ESPIPE.
    l.r("fifo lseek bad whence", s.lseek(f, 0, 99));
    l.data("fifo pread", s.pread(f, 1, 0));
    l.r("fifo pwrite", s.pwrite(f, b"x", 0));
    l.r("fifo ftruncate", s.ftruncate(f, 0));
    l.r("fifo fallocate", s.fallocate(f, 0, 0, 1));
    l.r("close", s.close(f));
    l.r("truncate fifo", s.truncate("d/p", 0));
    l.r("truncate dir", s.truncate("d", 0));
    l.r("truncate missing", s.truncate("d/zz", 0));
    l.r("truncate neg", s.truncate("d/f", -1));
    l.r("truncate ok", s.truncate("d/f", 10));
    l.r("size", s.stat_size("d/f"));
}

fn data_io(s: &dyn Sys, l: &mut Log) {
    let f = l.fd("creat", s.open("f", O_CREAT | O_RDWR, 0o644));
    let big: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
    l.r("write", s.write(f, &big));
    l.r("pos", s.lseek(f, 0, SEEK_CUR));
    l.data("read at eof", s.read(f, 10));
    l.r("rewind", s.lseek(f, 0, SEEK_SET));
    l.data("read", s.read(f, 5000));
    l.data("read rest", s.read(f, 6000));
    l.data("pread mid", s.pread(f, 3000, 4090));
    l.data("pread past", s.pread(f, 10, 20_000));
    l.data("pread neg", s.pread(f, 10, -1));
    l.data("pread overflow", s.pread(f, 10, i64::MAX - 5));
    l.r("pwrite neg", s.pwrite(f, b"x", -1));
    l.r("pwrite overflow", s.pwrite(f, b"xy", i64::MAX));
    l.r("pwrite empty at max", s.pwrite(f, b"", i64::MAX));
    l.r("pwrite", s.pwrite(f, b"HOLE", 50_000));
    l.any("stat sparse", s.fstat(f));
    l.data("read hole", s.pread(f, 40_000, 10_000));
    l.r("data 0", s.lseek(f, 0, SEEK_DATA));
    l.r("hole 0", s.lseek(f, 0, SEEK_HOLE));
    l.r("data 12000", s.lseek(f, 12_000, SEEK_DATA));
    l.r("hole 12000", s.lseek(f, 12_000, SEEK_HOLE));
    l.r("data 50003", s.lseek(f, 50_003, SEEK_DATA));
    l.r("hole 50003", s.lseek(f, 50_003, SEEK_HOLE));
    l.r("data eof", s.lseek(f, 50_004, SEEK_DATA));
    l.r("hole eof", s.lseek(f, 50_004, SEEK_HOLE));
    l.r("data neg", s.lseek(f, -1, SEEK_DATA));
    l.r("seek end", s.lseek(f, -4, SEEK_END));
    l.data("read end", s.read(f, 100));
    l.r("seek end neg", s.lseek(f, -100_000, SEEK_END));
    l.r("seek cur neg", s.lseek(f, -100_000, SEEK_CUR));
    l.r("seek bad whence", s.lseek(f, 0, 5));
    l.r("seek huge", s.lseek(f, i64::MAX, SEEK_SET));
    l.r("seek end overflow", s.lseek(f, i64::MAX, SEEK_END));
    l.r("seek cur overflow", s.lseek(f, 1, SEEK_CUR));
    l.r("seek cur", s.lseek(f, -10, SEEK_CUR));
    l.data("read at huge", s.read(f, 4));
    l.r("write at huge", s.write(f, b"abcdefghijklmnop"));
    // Large offsets (sparse).
    l.r("pwrite 1T", s.pwrite(f, b"far", 1 << 40));
    l.any("stat far", s.fstat(f));
    l.data("pread far", s.pread(f, 8, (1 << 40) - 2));
    l.r("data far", s.lseek(f, 60_000, SEEK_DATA));
    // Truncate.
    l.r("ftruncate shrink", s.ftruncate(f, 5000));
    l.any("stat shrink", s.fstat(f));
    l.r("ftruncate grow", s.ftruncate(f, 9000));
    l.data("read grown", s.pread(f, 9000, 0));
    l.r("hole after grow", s.lseek(f, 0, SEEK_HOLE));
    l.r("ftruncate neg", s.ftruncate(f, -1));
    // Fallocate.
    l.r(
        "falloc keep",
        s.fallocate(f, FALLOC_FL_KEEP_SIZE, 8000, 20_000),
    );
    l.any("stat falloc keep", s.fstat(f));
    l.r("falloc grow", s.fallocate(f, 0, 30_000, 5000));
    l.any("stat falloc grow", s.fstat(f));
    l.data("read falloc", s.pread(f, 30_000, 5000));
    l.r("data in falloc", s.lseek(f, 12_289, SEEK_DATA));
    l.r("hole in falloc", s.lseek(f, 12_289, SEEK_HOLE));
    l.r(
        "punch",
        s.fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 6000),
    );
    l.any("stat punch", s.fstat(f));
    l.data("read punch", s.pread(f, 9000, 0));
    l.r("hole after punch", s.lseek(f, 0, SEEK_HOLE));
    l.r("data after punch", s.lseek(f, 4096, SEEK_DATA));
    l.r("punch no keep", s.fallocate(f, FALLOC_FL_PUNCH_HOLE, 0, 10));
    l.r("falloc len 0", s.fallocate(f, 0, 0, 0));
    l.r("falloc neg", s.fallocate(f, 0, -1, 10));
    l.r("falloc efbig", s.fallocate(f, 0, i64::MAX - 10, 100));
    // ZERO_RANGE (0x10) is memfs-only (ext4 semantics, tests/falloc_ranges_ext4.rs).
    l.r("falloc unshare range", s.fallocate(f, 0x40, 0, 10));
    l.r("falloc collapse keep", s.fallocate(f, 0x08 | 0x01, 0, 4096));
    l.r("falloc bad mode", s.fallocate(f, 0x1000, 0, 10));
    l.r("write after", s.pwrite(f, b"tail", 34_998));
    l.any("stat end", s.fstat(f));
    l.r("fsync", s.fsync(f));
    l.r("fdatasync", s.fdatasync(f));
    l.r("close", s.close(f));
    // Access modes.
    let r = l.fd("rdonly", s.open("f", O_RDONLY, 0));
    l.r("write rdonly", s.write(r, b"x"));
    l.r("pwrite rdonly", s.pwrite(r, b"x", 0));
    l.r("ftruncate rdonly", s.ftruncate(r, 0));
    l.r("fallocate rdonly", s.fallocate(r, 0, 0, 10));
    l.r("fsync rdonly", s.fsync(r));
    l.r("close", s.close(r));
    let w = l.fd("wronly|append", s.open("f", O_WRONLY | O_APPEND, 0));
    l.data("read wronly", s.read(w, 1));
    l.data("pread wronly", s.pread(w, 1, 0));
    l.r("append", s.write(w, b"APP"));
    l.r("append pos", s.lseek(w, 0, SEEK_CUR));
    // An empty write does not move an O_APPEND position to the end.
    l.r("seek back", s.lseek(w, 1, SEEK_SET));
    l.r("empty append", s.write(w, b""));
    l.r("pos after empty append", s.lseek(w, 0, SEEK_CUR));
    l.r("empty append writev", s.writev(w, &[b"", b""]));
    l.r("pos after empty writev", s.lseek(w, 0, SEEK_CUR));
    l.r("pwrite append", s.pwrite(w, b"PW", 0));
    l.r("size", s.stat_size("f"));
    l.r("writev", s.writev(w, &[b"ab", b"", b"cde"]));
    l.r("ftruncate append", s.ftruncate(w, 100));
    l.r("close", s.close(w));
    let r = l.fd("rdonly", s.open("f", O_RDONLY, 0));
    l.any("readv", s.readv(r, &[3, 0, 50]));
    l.r("pos after readv", s.lseek(r, 0, SEEK_CUR));
    l.r("close", s.close(r));
    // Bad fds.
    l.data("read bad", s.read(99, 1));
    l.r("write bad", s.write(-1, b"x"));
    l.r("lseek bad", s.lseek(99, 0, SEEK_SET));
    l.r("fsync bad", s.fsync(99));
    l.any("fstat bad", s.fstat(99));
    l.r("fcntl bad", s.fcntl(99, F_GETFL, 0));
    l.r("fallocate bad", s.fallocate(99, 0, 0, 1));
    // A bad fd is EBADF before the arguments are looked at.
    l.r("fallocate bad fd bad range", s.fallocate(99, 0, -1, 0));
    l.r("fallocate bad fd bad mode", s.fallocate(99, 0x4000, 0, 1));
    l.r("ftruncate bad", s.ftruncate(99, 0));
}

fn dups(s: &dyn Sys, l: &mut Log) {
    let f = l.fd("creat", s.open("f", O_CREAT | O_RDWR, 0o644));
    l.r("write", s.write(f, b"0123456789"));
    let g = l.fd("dup", s.dup(f));
    l.r("seek via dup", s.lseek(g, 3, SEEK_SET));
    l.data("read shares pos", s.read(f, 2));
    l.r("pos via dup", s.lseek(g, 0, SEEK_CUR));
    l.r("dup getfd", s.fcntl(g, F_GETFD, 0));
    l.r("dup3 same", s.dup3(f, f, 0));
    l.r("dup3 bad flags", s.dup3(f, 200, 1));
    l.r("dup3 bad old same", s.dup3(999, 999, 0));
    l.fd("dup2 same", s.dup2(f, f));
    l.r("dup2 bad same", s.dup2(999, 999));
    l.r("dup2 bad old", s.dup2(999, 200));
    l.r("dup2 neg", s.dup2(f, -1));
    l.r("dup2 huge", s.dup2(f, 1 << 30));
    l.r("dup2", s.dup2(f, 200));
    l.data("read 200", s.read(200, 2));
    l.r("dup3 cloexec", s.dup3(f, 201, O_CLOEXEC));
    l.r("getfd 201", s.fcntl(201, F_GETFD, 0));
    l.r("dup2 over open", s.dup2(g, 201));
    l.r("getfd 201 after", s.fcntl(201, F_GETFD, 0));
    l.r("dupfd huge", s.fcntl(f, libc::F_DUPFD as u32, 1 << 30));
    l.r("dupfd", s.fcntl(f, libc::F_DUPFD as u32, 300));
    l.r(
        "dupfd cloexec",
        s.fcntl(f, libc::F_DUPFD_CLOEXEC as u32, 300),
    );
    l.r("getfd 301", s.fcntl(301, F_GETFD, 0));
    l.r("close f", s.close(f));
    l.data("200 still open", s.pread(200, 3, 0));
    for fd in [g, 200, 201, 300, 301] {
        l.r("close", s.close(fd));
    }
    l.r("close again", s.close(200));
}

fn perm_setup(s: &dyn Sys, l: &mut Log) {
    let f = l.fd("creat", s.open("ro", O_CREAT | O_WRONLY, 0o644));
    l.r("write", s.write(f, b"data"));
    l.r("close", s.close(f));
    l.r("mkdir", s.mkdir("rodir", 0o755));
}

fn perm_user(s: &dyn Sys, l: &mut Log) {
    let f = l.fd("rdonly ok", s.open("ro", O_RDONLY, 0));
    l.data("read", s.read(f, 10));
    l.r("ftruncate rdonly", s.ftruncate(f, 0));
    l.r("close", s.close(f));
    l.fd("wronly", s.open("ro", O_WRONLY, 0));
    l.fd("rdwr", s.open("ro", O_RDWR, 0));
    l.fd("rdonly|trunc", s.open("ro", O_RDONLY | O_TRUNC, 0));
    l.fd("noatime", s.open("ro", O_RDONLY | O_NOATIME, 0));
    l.r("truncate", s.truncate("ro", 0));
    l.fd("creat in rodir", s.open("rodir/x", O_CREAT | O_RDWR, 0o644));
    l.fd(
        "tmpfile in rodir",
        s.open("rodir", O_TMPFILE | O_RDWR, 0o644),
    );
    let f = l.fd("creat mode 0", s.open("mine", O_CREAT | O_RDWR | O_EXCL, 0));
    l.r("write own mode-0 file", s.write(f, b"ok"));
    l.r("close", s.close(f));
    l.fd("reopen mode 0", s.open("mine", O_RDONLY, 0));
    l.r("chmod", s.chmod("mine", 0o200));
    let f = l.fd("wronly 0200", s.open("mine", O_WRONLY | O_TRUNC, 0));
    l.r("close", s.close(f));
}

#[test]
fn open_flags_match_linux() {
    diff("open_flags", nothing, open_flags, false);
}

#[test]
fn data_calls_match_linux() {
    diff("data_io", nothing, data_io, false);
}

/// Counts over MAX_RW_COUNT near the end of the offsets: Linux checks the
/// count asked for (`rw_verify_area`) before cutting it, so these are
/// EINVAL, not short reads or writes; and an O_APPEND write checks the
/// description's position, not 0. The 3 GiB buffers are never touched
/// (zeroed pages from the allocator), so they cost no memory.
fn huge_counts(s: &dyn Sys, l: &mut Log) {
    const HUGE: usize = 3 << 30;
    let near = i64::MAX - (1 << 31);
    let f = l.fd("creat", s.open("f", O_CREAT | O_RDWR, 0o644));
    l.r("write", s.write(f, b"data"));
    l.data("pread 3 GiB near max", s.pread(f, HUGE, near));
    l.data("pread 3 GiB at 0", s.pread(f, HUGE, 0));
    let zeros = vec![0u8; HUGE];
    l.r("pwrite 3 GiB near max", s.pwrite(f, &zeros, near));
    l.r("seek near max", s.lseek(f, near, SEEK_SET));
    l.r("write 3 GiB near max", s.write(f, &zeros));
    l.data("read 3 GiB near max", s.read(f, HUGE));
    l.any("stat", s.fstat(f));
    l.r("close", s.close(f));
    let a = l.fd("open append", s.open("f", O_WRONLY | O_APPEND, 0));
    l.r("seek append near end", s.lseek(a, i64::MAX - 5, SEEK_SET));
    l.r("append past the offsets", s.write(a, b"0123456789"));
    l.r("append pos", s.lseek(a, 0, SEEK_CUR));
    l.r("seek append 0", s.lseek(a, 0, SEEK_SET));
    l.r("append", s.write(a, b"0123456789"));
    l.any("stat after append", s.fstat(a));
    l.r("close append", s.close(a));
}

#[test]
fn huge_counts_match_linux() {
    diff("huge_counts", nothing, huge_counts, false);
}

#[test]
fn dup_calls_match_linux() {
    diff("dups", nothing, dups, false);
}

#[test]
fn permission_errors_match_linux() {
    diff("perm", perm_setup, perm_user, true);
}

/// EMFILE and fd limits (the host's RLIMIT_NOFILE is process-wide, so these
/// are checked against Linux's documented results rather than live).
#[test]
fn fd_limits_emfile() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.files().set_max(8).unwrap();
    let fds: Vec<i32> = (0..8).map(|_| t.open("/", O_RDONLY, 0).unwrap()).collect();
    assert_eq!(fds, (0..8).collect::<Vec<_>>());
    assert_eq!(t.open("/", O_RDONLY, 0), Err(Errno::EMFILE));
    assert_eq!(t.dup(0), Err(Errno::EMFILE));
    assert_eq!(t.dupfd(0, 0, false), Err(Errno::EMFILE));
    assert_eq!(t.dupfd(0, 8, false), Err(Errno::EINVAL));
    assert_eq!(t.dup2(0, 8), Err(Errno::EBADF));
    assert_eq!(t.open("/nope", O_CREAT | O_RDWR, 0o644), Err(Errno::EMFILE));
    t.close(3).unwrap();
    assert_eq!(t.dup(0), Ok(3));
    // fork copies the table, threads share it; O_CLOEXEC closes on exec.
    t.close(5).unwrap();
    assert_eq!(t.dup3(0, 5, O_CLOEXEC), Ok(5));
    let child = t.fork();
    let thread = t.clone_thread();
    t.close(6).unwrap();
    assert_eq!(thread.fstat(6), Err(Errno::EBADF));
    assert!(child.fstat(6).is_ok());
    child.files().close_on_exec();
    assert_eq!(child.fstat(5), Err(Errno::EBADF));
    assert!(t.fstat(5).is_ok());
}

/// EROFS through a read-only mount, EFBIG through a memfs with a small
/// maximum file size (tmpfs's limit is i64::MAX, so only fallocate reaches
/// it there, which the differential test covers).
#[test]
fn erofs_and_efbig() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.mkdir("/ro", 0o755).unwrap();
    // Not authoritative, so the second (read-only) mount of the same memfs
    // looks names up in it instead of trusting an empty cache.
    let fs = vfs.new_memfs(MemFsOptions {
        authoritative: false,
        ..Default::default()
    });
    t.mount("/rw", fs.clone(), false).unwrap_err();
    t.mkdir("/rw", 0o755).unwrap();
    t.mount("/rw", fs.clone(), false).unwrap();
    let f = t.open("/rw/f", O_CREAT | O_RDWR, 0o644).unwrap();
    t.write(f, b"x").unwrap();
    t.close(f).unwrap();
    t.mount("/ro", fs, true).unwrap();
    assert_eq!(t.open("/ro/f", O_WRONLY, 0), Err(Errno::EROFS));
    assert_eq!(t.open("/ro/f", O_RDONLY | O_TRUNC, 0), Err(Errno::EROFS));
    assert_eq!(
        t.open("/ro/new", O_CREAT | O_RDWR, 0o644),
        Err(Errno::EROFS)
    );
    assert!(t.open("/ro/f", O_CREAT | O_RDONLY, 0o644).is_ok());
    assert_eq!(t.open("/ro", O_TMPFILE | O_RDWR, 0o644), Err(Errno::EROFS));
    assert_eq!(t.truncate("/ro/f", 0), Err(Errno::EROFS));

    let small = MemFsOptions {
        max_file_size: 10_000,
        ..Default::default()
    };
    t.mkdir("/small", 0o755).unwrap();
    t.mount("/small", vfs.new_memfs(small), false).unwrap();
    let f = t.open("/small/f", O_CREAT | O_RDWR, 0o644).unwrap();
    assert_eq!(t.pwrite(f, b"abc", 10_000), Err(Errno::EFBIG));
    assert_eq!(t.pwrite(f, b"abc", 9_999), Ok(1));
    assert_eq!(t.ftruncate(f, 10_001), Err(Errno::EFBIG));
    assert_eq!(t.fallocate(f, 0, 9_000, 2_000), Err(Errno::EFBIG));
    assert_eq!(t.lseek(f, 10_001, SEEK_SET), Err(Errno::EINVAL));
    assert_eq!(t.lseek(f, 10_000, SEEK_SET), Ok(10_000));
    assert_eq!(t.write(f, b"z"), Err(Errno::EFBIG));
}

/// mtime/ctime move on write, truncate and punch; reads leave them alone.
#[test]
fn times_update_on_data_changes() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let f = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    let old = Timespec { sec: 1, nsec: 0 };
    let reset = || t.futimens(f, Some([old, old])).unwrap();
    reset();
    t.write(f, b"abc").unwrap();
    let s = t.fstat(f).unwrap();
    assert!(s.mtime > old && s.ctime > old);
    reset();
    let mut b = [0u8; 3];
    t.pread(f, &mut b, 0).unwrap();
    assert_eq!(t.fstat(f).unwrap().mtime, old);
    t.ftruncate(f, 1).unwrap();
    assert!(t.fstat(f).unwrap().mtime > old);
    reset();
    t.fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 1)
        .unwrap();
    assert!(t.fstat(f).unwrap().mtime > old);
}
