//! Differential test of read-only remount (issue 13, item 5; xfstests
//! generic/294, 306): `Task::remount` against `mount -o remount,ro` of a
//! tmpfs on the host (mounted under /mnt/ops-remount-*). EBUSY while a file
//! is open for writing, then EROFS for every change, reads still fine, and
//! read-write again after `remount,rw`. Each result (value or errno) is
//! logged on both sides and the logs must be equal. Without root or a
//! tmpfs mount the host side is skipped (reason printed).

use std::ffi::CString;

use scalevfs::*;

type R = Result<i64, i32>;

trait Sys {
    fn remount(&self, p: &str, ro: bool) -> R;
    fn open(&self, p: &str, flags: u32) -> R;
    fn close(&self, fd: i32) -> R;
    fn read(&self, fd: i32) -> R;
    fn unlink(&self, p: &str) -> R;
    fn mkdir(&self, p: &str) -> R;
    fn rename(&self, a: &str, b: &str) -> R;
    fn link(&self, a: &str, b: &str) -> R;
    fn symlink(&self, a: &str, b: &str) -> R;
    fn chmod(&self, p: &str, m: u32) -> R;
    fn truncate(&self, p: &str, n: i64) -> R;
    fn utimes(&self, p: &str) -> R;
    fn mkfifo(&self, p: &str) -> R;
}

struct Host {
    dir: String,
}

impl Host {
    fn c(&self, p: &str) -> CString {
        CString::new(format!("{}/{p}", self.dir)).unwrap()
    }
}

fn cr(r: i64) -> R {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}

impl Sys for Host {
    fn remount(&self, p: &str, ro: bool) -> R {
        let fl = libc::MS_REMOUNT | if ro { libc::MS_RDONLY } else { 0 };
        let t = CString::new("tmpfs").unwrap();
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe {
            libc::mount(
                t.as_ptr(),
                self.c(p).as_ptr(),
                t.as_ptr(),
                fl,
                std::ptr::null(),
            )
        } as i64)
    }
    fn open(&self, p: &str, flags: u32) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::open(self.c(p).as_ptr(), flags as i32, 0o644) } as i64)
    }
    fn close(&self, fd: i32) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::close(fd) } as i64)
    }
    fn read(&self, fd: i32) -> R {
        let mut b = [0u8; 16];
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::pread(fd, b.as_mut_ptr().cast(), 16, 0) } as i64)
    }
    fn unlink(&self, p: &str) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::unlink(self.c(p).as_ptr()) } as i64)
    }
    fn mkdir(&self, p: &str) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::mkdir(self.c(p).as_ptr(), 0o755) } as i64)
    }
    fn rename(&self, a: &str, b: &str) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::rename(self.c(a).as_ptr(), self.c(b).as_ptr()) } as i64)
    }
    fn link(&self, a: &str, b: &str) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::link(self.c(a).as_ptr(), self.c(b).as_ptr()) } as i64)
    }
    fn symlink(&self, a: &str, b: &str) -> R {
        let a = CString::new(a).unwrap();
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::symlink(a.as_ptr(), self.c(b).as_ptr()) } as i64)
    }
    fn chmod(&self, p: &str, m: u32) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::chmod(self.c(p).as_ptr(), m) } as i64)
    }
    fn truncate(&self, p: &str, n: i64) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::truncate(self.c(p).as_ptr(), n) } as i64)
    }
    fn utimes(&self, p: &str) -> R {
        cr(
            // SAFETY: a plain syscall on valid pointers that outlive it.
            unsafe { libc::utimensat(libc::AT_FDCWD, self.c(p).as_ptr(), std::ptr::null(), 0) }
                as i64,
        )
    }
    fn mkfifo(&self, p: &str) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::mkfifo(self.c(p).as_ptr(), 0o644) } as i64)
    }
}

struct Ours {
    t: Task,
}

fn e<T: Into<i64>>(r: Result<T, Errno>) -> R {
    r.map(Into::into).map_err(|e| e.raw())
}

fn q(p: &str) -> String {
    format!("/m/{p}")
}

impl Sys for Ours {
    fn remount(&self, p: &str, ro: bool) -> R {
        e(self.t.remount(&q(p), ro).map(|_| 0))
    }
    fn open(&self, p: &str, flags: u32) -> R {
        e(self.t.open(&q(p), flags, 0o644))
    }
    fn close(&self, fd: i32) -> R {
        e(self.t.close(fd).map(|_| 0))
    }
    fn read(&self, fd: i32) -> R {
        let mut b = [0u8; 16];
        e(self.t.pread(fd, &mut b, 0).map(|n| n as i64))
    }
    fn unlink(&self, p: &str) -> R {
        e(self.t.unlink(&q(p)).map(|_| 0))
    }
    fn mkdir(&self, p: &str) -> R {
        e(self.t.mkdir(&q(p), 0o755).map(|_| 0))
    }
    fn rename(&self, a: &str, b: &str) -> R {
        e(self.t.rename(&q(a), &q(b)).map(|_| 0))
    }
    fn link(&self, a: &str, b: &str) -> R {
        e(self.t.link(&q(a), &q(b)).map(|_| 0))
    }
    fn symlink(&self, a: &str, b: &str) -> R {
        e(self.t.symlink(a, &q(b)).map(|_| 0))
    }
    fn chmod(&self, p: &str, m: u32) -> R {
        e(self.t.chmod(&q(p), m).map(|_| 0))
    }
    fn truncate(&self, p: &str, n: i64) -> R {
        e(self.t.truncate(&q(p), n).map(|_| 0))
    }
    fn utimes(&self, p: &str) -> R {
        e(self.t.utimensat(AT_FDCWD, &q(p), None, 0).map(|_| 0))
    }
    fn mkfifo(&self, p: &str) -> R {
        e(self
            .t
            .mknodat(AT_FDCWD, &q(p), S_IFIFO | 0o644, 0)
            .map(|_| 0))
    }
}

#[derive(Default, Debug)]
struct Log(Vec<String>);

impl Log {
    fn r(&mut self, what: &str, r: R) {
        self.0.push(format!("{what}: {r:?}"));
    }
}

const RO: u32 = libc::O_RDONLY as u32;
const WO: u32 = libc::O_WRONLY as u32;
const RW: u32 = libc::O_RDWR as u32;
const CREAT: u32 = (libc::O_CREAT | libc::O_WRONLY) as u32;
const TRUNC: u32 = libc::O_TRUNC as u32;

fn scenario(s: &dyn Sys, l: &mut Log) {
    let w = s.open("f", CREAT).unwrap() as i32;
    l.r("mkdir", s.mkdir("d"));
    l.r("mkfifo", s.mkfifo("p"));
    l.r("remount ro, file open for writing", s.remount("", true));
    l.r("remount not a mount root", s.remount("d", true));
    l.r("close", s.close(w));
    // A read-only or a fifo open does not hold the mount writable.
    let r = s.open("f", RO).unwrap() as i32;
    let pf = s.open("p", RW | libc::O_NONBLOCK as u32).unwrap() as i32;
    l.r("remount ro", s.remount("", true));
    l.r("remount ro again", s.remount("", true));
    l.r("read", s.read(r));
    l.r("open ro", s.open("f", RO).map(|_| 0));
    l.r("open wr", s.open("f", WO));
    l.r("open rw", s.open("f", RW));
    l.r("open ro trunc", s.open("f", RO | TRUNC));
    l.r("create", s.open("g", CREAT));
    l.r(
        "open fifo for writing",
        s.open("p", WO | libc::O_NONBLOCK as u32).map(|_| 0),
    );
    l.r("mkdir", s.mkdir("e"));
    l.r("unlink", s.unlink("f"));
    l.r("rmdir via rename", s.rename("d", "d2"));
    l.r("link", s.link("f", "h"));
    l.r("symlink", s.symlink("f", "s"));
    l.r("chmod", s.chmod("f", 0o600));
    l.r("truncate", s.truncate("f", 0));
    l.r("utimes", s.utimes("f"));
    l.r("mkfifo", s.mkfifo("q"));
    l.r("remount rw", s.remount("", false));
    l.r("create after rw", s.open("g", CREAT).map(|_| 0));
    l.r("unlink after rw", s.unlink("g"));
    l.r("close", s.close(r));
    l.r("close", s.close(pf));
}

#[test]
fn remount_read_only_matches_linux() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.mkdir("/m", 0o755).unwrap();
    t.mount("/m", vfs.new_memfs(MemFsOptions::default()), false)
        .unwrap();
    let mut ol = Log::default();
    scenario(&Ours { t }, &mut ol);
    assert!(ol.0.iter().any(|s| s == "remount ro: Ok(0)"), "{ol:?}");
    assert!(ol.0.iter().any(|s| s == "create: Err(30)"), "{ol:?}");
    // Not root: EPERM.
    let u = vfs.task(Cred::user(1000, 1000));
    assert_eq!(u.remount("/m", true), Err(Errno::EPERM));

    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("host side skipped: not root");
        return;
    }
    let dir = format!("/mnt/ops-remount-{}", std::process::id());
    std::fs::create_dir_all(&dir).unwrap();
    let (c, t) = (
        CString::new(dir.clone()).unwrap(),
        CString::new("tmpfs").unwrap(),
    );
    // SAFETY: plain syscall on valid C strings.
    if unsafe { libc::mount(t.as_ptr(), c.as_ptr(), t.as_ptr(), 0, std::ptr::null()) } != 0 {
        eprintln!(
            "host side skipped: mount tmpfs: {}",
            std::io::Error::last_os_error()
        );
        let _ = std::fs::remove_dir(&dir);
        return;
    }
    let mut hl = Log::default();
    scenario(&Host { dir: dir.clone() }, &mut hl);
    // Lazily: the scenario leaves descriptors open (MNT_DETACH detaches the
    // mount now; the last close frees it).
    // SAFETY: plain syscall.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    let _ = std::fs::remove_dir(&dir);
    if std::env::var_os("OPS_SHOW").is_some() {
        eprintln!("{hl:#?}");
    }
    for (a, b) in hl.0.iter().zip(ol.0.iter()) {
        assert_eq!(a, b, "Linux tmpfs (left) and scalevfs (right) differ");
    }
    assert_eq!(hl.0.len(), ol.0.len());
}
