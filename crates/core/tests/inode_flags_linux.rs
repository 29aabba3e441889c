//! Differential test of chattr-style inode flags (issue 13, item 5):
//! `FS_IOC_GETFLAGS`/`FS_IOC_SETFLAGS` and what FS_IMMUTABLE_FL and
//! FS_APPEND_FL forbid, against the host's tmpfs (/dev/shm; tmpfs keeps
//! these flags). Each call's result (value or errno) is logged on both
//! sides and the logs must be equal. The unprivileged part runs on the host
//! in a thread that dropped to uid 1000 with raw setresuid/setresgid (per
//! thread, so CAP_LINUX_IMMUTABLE goes too; setfsuid would keep it).
//!
//! If /dev/shm is missing or we are not root, the host side is skipped (the
//! reason is printed) and only the scalevfs side runs.

mod common;

use std::ffi::CString;

use scalevfs::inode::{FS_APPEND_FL, FS_IMMUTABLE_FL, FS_NOATIME_FL, FS_NODUMP_FL};
use scalevfs::io::*;
use scalevfs::*;

type R = Result<i64, i32>;

trait Sys {
    fn open(&self, p: &str, flags: u32) -> R;
    fn close(&self, fd: i32) -> R;
    fn pwrite(&self, fd: i32, b: &[u8], off: i64) -> R;
    fn getflags(&self, fd: i32) -> R;
    fn setflags(&self, fd: i32, fl: u32) -> R;
    fn truncate(&self, p: &str, len: i64) -> R;
    fn ftruncate(&self, fd: i32, len: i64) -> R;
    fn fallocate(&self, fd: i32, mode: u32, off: i64, len: i64) -> R;
    fn unlink(&self, p: &str) -> R;
    fn rmdir(&self, p: &str) -> R;
    fn mkdir(&self, p: &str) -> R;
    fn mkfifo(&self, p: &str) -> R;
    fn rename(&self, a: &str, b: &str) -> R;
    fn link(&self, a: &str, b: &str) -> R;
    fn chmod(&self, p: &str, m: u32) -> R;
    fn chown(&self, p: &str, u: u32, g: u32) -> R;
    /// `None`: both to now; `Some(t)`: both to `t` seconds.
    fn utimes(&self, p: &str, t: Option<i64>) -> R;
    fn size(&self, p: &str) -> R;
    fn access(&self, p: &str, mode: u32) -> R;
}

struct Host {
    dir: String,
}

fn cr(r: i64) -> R {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}

const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;

impl Host {
    fn c(&self, p: &str) -> CString {
        CString::new(format!("{}/{p}", self.dir)).unwrap()
    }
}

impl Sys for Host {
    fn open(&self, p: &str, flags: u32) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::open(self.c(p).as_ptr(), flags as i32, 0o644) } as i64)
    }
    fn close(&self, fd: i32) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::close(fd) } as i64)
    }
    fn pwrite(&self, fd: i32, b: &[u8], off: i64) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::pwrite(fd, b.as_ptr().cast(), b.len(), off) } as i64)
    }
    fn getflags(&self, fd: i32) -> R {
        let mut v: libc::c_int = 0;
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::ioctl(fd, FS_IOC_GETFLAGS, &mut v) } as i64)?;
        Ok(v as i64)
    }
    fn setflags(&self, fd: i32, fl: u32) -> R {
        let v = fl as libc::c_int;
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::ioctl(fd, FS_IOC_SETFLAGS, &v) } as i64)
    }
    fn truncate(&self, p: &str, len: i64) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::truncate(self.c(p).as_ptr(), len) } as i64)
    }
    fn ftruncate(&self, fd: i32, len: i64) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::ftruncate(fd, len) } as i64)
    }
    fn fallocate(&self, fd: i32, mode: u32, off: i64, len: i64) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::fallocate(fd, mode as i32, off, len) } as i64)
    }
    fn unlink(&self, p: &str) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::unlink(self.c(p).as_ptr()) } as i64)
    }
    fn rmdir(&self, p: &str) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::rmdir(self.c(p).as_ptr()) } as i64)
    }
    fn mkdir(&self, p: &str) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::mkdir(self.c(p).as_ptr(), 0o755) } as i64)
    }
    fn mkfifo(&self, p: &str) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::mkfifo(self.c(p).as_ptr(), 0o644) } as i64)
    }
    fn rename(&self, a: &str, b: &str) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::rename(self.c(a).as_ptr(), self.c(b).as_ptr()) } as i64)
    }
    fn link(&self, a: &str, b: &str) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::link(self.c(a).as_ptr(), self.c(b).as_ptr()) } as i64)
    }
    fn chmod(&self, p: &str, m: u32) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::chmod(self.c(p).as_ptr(), m) } as i64)
    }
    fn chown(&self, p: &str, u: u32, g: u32) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::chown(self.c(p).as_ptr(), u, g) } as i64)
    }
    fn utimes(&self, p: &str, t: Option<i64>) -> R {
        let ts = t.map(|s| {
            [libc::timespec {
                tv_sec: s,
                tv_nsec: 0,
            }; 2]
        });
        let ptr = ts.as_ref().map_or(std::ptr::null(), |a| a.as_ptr());
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::utimensat(libc::AT_FDCWD, self.c(p).as_ptr(), ptr, 0) } as i64)
    }
    fn size(&self, p: &str) -> R {
        std::fs::metadata(format!("{}/{p}", self.dir))
            .map(|m| std::os::unix::fs::MetadataExt::size(&m) as i64)
            .map_err(|e| e.raw_os_error().unwrap_or(0))
    }
    fn access(&self, p: &str, mode: u32) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::access(self.c(p).as_ptr(), mode as i32) } as i64)
    }
}

struct Ours {
    t: Task,
}

fn e(r: Result<impl Into<i64>, Errno>) -> R {
    r.map(Into::into).map_err(|e| e.raw())
}

fn p(s: &str) -> String {
    format!("/{s}")
}

impl Sys for Ours {
    fn open(&self, s: &str, flags: u32) -> R {
        e(self.t.open(&p(s), flags, 0o644))
    }
    fn close(&self, fd: i32) -> R {
        e(self.t.close(fd).map(|_| 0))
    }
    fn pwrite(&self, fd: i32, b: &[u8], off: i64) -> R {
        e(self.t.pwrite(fd, b, off).map(|n| n as i64))
    }
    fn getflags(&self, fd: i32) -> R {
        e(self.t.ioctl_getflags(fd).map(|v| v as i64))
    }
    fn setflags(&self, fd: i32, fl: u32) -> R {
        e(self.t.ioctl_setflags(fd, fl).map(|_| 0))
    }
    fn truncate(&self, s: &str, len: i64) -> R {
        e(self.t.truncate(&p(s), len).map(|_| 0))
    }
    fn ftruncate(&self, fd: i32, len: i64) -> R {
        e(self.t.ftruncate(fd, len).map(|_| 0))
    }
    fn fallocate(&self, fd: i32, mode: u32, off: i64, len: i64) -> R {
        e(self.t.fallocate(fd, mode, off, len).map(|_| 0))
    }
    fn unlink(&self, s: &str) -> R {
        e(self.t.unlink(&p(s)).map(|_| 0))
    }
    fn rmdir(&self, s: &str) -> R {
        e(self.t.rmdir(&p(s)).map(|_| 0))
    }
    fn mkdir(&self, s: &str) -> R {
        e(self.t.mkdir(&p(s), 0o755).map(|_| 0))
    }
    fn mkfifo(&self, s: &str) -> R {
        e(self
            .t
            .mknodat(AT_FDCWD, &p(s), S_IFIFO | 0o644, 0)
            .map(|_| 0))
    }
    fn rename(&self, a: &str, b: &str) -> R {
        e(self.t.rename(&p(a), &p(b)).map(|_| 0))
    }
    fn link(&self, a: &str, b: &str) -> R {
        e(self.t.link(&p(a), &p(b)).map(|_| 0))
    }
    fn chmod(&self, s: &str, m: u32) -> R {
        e(self.t.chmod(&p(s), m).map(|_| 0))
    }
    fn chown(&self, s: &str, u: u32, g: u32) -> R {
        e(self.t.chown(&p(s), u, g).map(|_| 0))
    }
    fn utimes(&self, s: &str, t: Option<i64>) -> R {
        let ts = t.map(|s| [Timespec { sec: s, nsec: 0 }; 2]);
        e(self.t.utimensat(AT_FDCWD, &p(s), ts, 0).map(|_| 0))
    }
    fn size(&self, s: &str) -> R {
        e(self.t.stat(&p(s)).map(|st| st.size as i64))
    }
    fn access(&self, s: &str, mode: u32) -> R {
        e(self.t.access(&p(s), mode).map(|_| 0))
    }
}

#[derive(Default, Debug, PartialEq)]
struct Log(Vec<String>);

impl Log {
    fn r(&mut self, what: &str, r: R) {
        self.0.push(format!("{what}: {r:?}"));
    }
}

const RW: u32 = libc::O_RDWR as u32;
const RO: u32 = libc::O_RDONLY as u32;
const WO: u32 = libc::O_WRONLY as u32;
const CREAT: u32 = (libc::O_CREAT | libc::O_RDWR) as u32;
const APPEND: u32 = libc::O_APPEND as u32;
const TRUNC: u32 = libc::O_TRUNC as u32;

fn root_part(s: &dyn Sys, l: &mut Log) {
    let fd = s.open("f", CREAT).unwrap() as i32;
    l.r("write", s.pwrite(fd, b"hello", 0));
    l.r("get", s.getflags(fd));
    l.r("set immutable", s.setflags(fd, FS_IMMUTABLE_FL));
    l.r("get", s.getflags(fd));
    l.r("open wr", s.open("f", WO));
    l.r("open rw", s.open("f", RW));
    l.r("open ro trunc", s.open("f", RO | TRUNC));
    // inode_permission: MAY_WRITE on an immutable inode is EPERM, for
    // root too; reading is not.
    l.r("access w", s.access("f", libc::W_OK as u32));
    l.r("access rw", s.access("f", (libc::R_OK | libc::W_OK) as u32));
    l.r("access r", s.access("f", libc::R_OK as u32));
    let r = s.open("f", RO);
    l.r("open ro", r.map(|_| 0));
    if let Ok(r) = r {
        l.r("get via ro fd", s.getflags(r as i32));
        s.close(r as i32).unwrap();
    }
    l.r("truncate", s.truncate("f", 1));
    l.r("unlink", s.unlink("f"));
    l.r("rename", s.rename("f", "g"));
    l.r("link", s.link("f", "h"));
    l.r("chmod", s.chmod("f", 0o600));
    l.r("chown", s.chown("f", 5, 5));
    l.r("chown -1 -1", s.chown("f", u32::MAX, u32::MAX));
    l.r("utimes now", s.utimes("f", None));
    l.r("utimes set", s.utimes("f", Some(1000)));
    // A descriptor opened for writing before: writes and ftruncate go on.
    l.r("pwrite old fd", s.pwrite(fd, b"J", 0));
    l.r("ftruncate old fd", s.ftruncate(fd, 3));
    l.r("fallocate old fd", s.fallocate(fd, 0, 0, 10));
    l.r("size", s.size("f"));
    l.r("clear", s.setflags(fd, 0));
    l.r("set append", s.setflags(fd, FS_APPEND_FL));
    l.r("get", s.getflags(fd));
    l.r("open wr", s.open("f", WO));
    l.r("open wr append trunc", s.open("f", WO | APPEND | TRUNC));
    l.r("open ro trunc", s.open("f", RO | TRUNC));
    let a = s.open("f", WO | APPEND);
    l.r("open wr append", a.map(|_| 0));
    if let Ok(a) = a {
        l.r("append write", s.pwrite(a as i32, b"xy", 0));
        s.close(a as i32).unwrap();
    }
    l.r("size", s.size("f"));
    l.r("truncate", s.truncate("f", 1));
    l.r("ftruncate old fd", s.ftruncate(fd, 1));
    l.r(
        "fallocate keep",
        s.fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 100),
    );
    l.r("fallocate grow", s.fallocate(fd, 0, 0, 100));
    l.r(
        "fallocate punch",
        s.fallocate(fd, FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, 0, 1),
    );
    l.r("pwrite old fd", s.pwrite(fd, b"K", 0));
    l.r("unlink", s.unlink("f"));
    l.r("rename", s.rename("f", "g"));
    l.r("link", s.link("f", "h"));
    l.r("chmod", s.chmod("f", 0o600));
    l.r("utimes now", s.utimes("f", None));
    l.r("utimes set", s.utimes("f", Some(1000)));
    l.r("unknown flag", s.setflags(fd, FS_APPEND_FL | 0x1));
    l.r(
        "set nodump noatime",
        s.setflags(fd, FS_NODUMP_FL | FS_NOATIME_FL),
    );
    l.r("get", s.getflags(fd));
    l.r("clear", s.setflags(fd, 0));
    l.r("unlink", s.unlink("f"));
    l.r("close", s.close(fd));
    // Directories.
    l.r("mkdir", s.mkdir("d"));
    let x = s.open("d/x", CREAT).unwrap() as i32;
    l.r("close", s.close(x));
    let d = s.open("d", RO).unwrap() as i32;
    l.r("dir set immutable", s.setflags(d, FS_IMMUTABLE_FL));
    l.r("create in immutable dir", s.open("d/y", CREAT));
    l.r("access immutable dir w", s.access("d", libc::W_OK as u32));
    l.r("access immutable dir x", s.access("d", libc::X_OK as u32));
    l.r("mkdir in immutable dir", s.mkdir("d/z"));
    l.r("unlink in immutable dir", s.unlink("d/x"));
    l.r("rename out of immutable dir", s.rename("d/x", "x2"));
    let w = s.open("d/x", RW);
    l.r("open child rw", w.map(|_| 0));
    if let Ok(w) = w {
        s.close(w as i32).unwrap();
    }
    l.r("rmdir immutable dir", s.rmdir("d"));
    l.r("dir set append", s.setflags(d, FS_APPEND_FL));
    let y = s.open("d/y", CREAT);
    l.r("create in append dir", y.map(|_| 0));
    if let Ok(y) = y {
        s.close(y as i32).unwrap();
    }
    l.r("unlink in append dir", s.unlink("d/y"));
    l.r("rename into append dir", s.rename("d/y", "d/y2"));
    l.r("dir clear", s.setflags(d, 0));
    l.r("unlink", s.unlink("d/y"));
    l.r("close", s.close(d));
    // Special files and O_PATH.
    l.r("mkfifo", s.mkfifo("p"));
    let q = s.open("p", RW | libc::O_NONBLOCK as u32).unwrap() as i32;
    l.r("fifo get", s.getflags(q));
    l.r("fifo set", s.setflags(q, FS_NODUMP_FL));
    l.r("close", s.close(q));
    let o = s.open("d", libc::O_PATH as u32).unwrap() as i32;
    l.r("o_path get", s.getflags(o));
    l.r("close", s.close(o));
    // For the unprivileged part.
    let u = s.open("mine", CREAT).unwrap() as i32;
    l.r("close", s.close(u));
    l.r("chown mine", s.chown("mine", 1000, 1000));
    let r = s.open("roots", CREAT).unwrap() as i32;
    l.r("close", s.close(r));
    let i = s.open("imm", CREAT).unwrap() as i32;
    l.r("chown imm", s.chown("imm", 1000, 1000));
    l.r("imm set", s.setflags(i, FS_IMMUTABLE_FL));
    l.r("close", s.close(i));
}

fn user_part(s: &dyn Sys, l: &mut Log) {
    let u = s.open("mine", RO).unwrap() as i32;
    l.r("user set nodump", s.setflags(u, FS_NODUMP_FL));
    l.r("user get", s.getflags(u));
    l.r("user set immutable", s.setflags(u, FS_IMMUTABLE_FL));
    l.r(
        "user set append",
        s.setflags(u, FS_APPEND_FL | FS_NODUMP_FL),
    );
    l.r("user clear", s.setflags(u, 0));
    l.r("close", s.close(u));
    let r = s.open("roots", RO).unwrap() as i32;
    l.r("user set others'", s.setflags(r, FS_NODUMP_FL));
    l.r("user get others'", s.getflags(r));
    l.r("close", s.close(r));
    let i = s.open("imm", RO).unwrap() as i32;
    l.r("user clear immutable", s.setflags(i, 0));
    l.r(
        "user add nodump to immutable",
        s.setflags(i, FS_IMMUTABLE_FL | FS_NODUMP_FL),
    );
    l.r("user get imm", s.getflags(i));
    l.r("close", s.close(i));
    // Another's fifo: vfs_fileattr_set says ENOTTY (no fileattr_set for
    // it) before it checks the owner.
    let q = s.open("p", RO | libc::O_NONBLOCK as u32).unwrap() as i32;
    l.r("user set others' fifo", s.setflags(q, FS_NODUMP_FL));
    l.r("close", s.close(q));
}

fn cleanup(s: &dyn Sys) {
    for f in ["imm", "d", "mine", "roots", "f"] {
        if let Ok(fd) = s.open(f, RO) {
            let _ = s.setflags(fd as i32, 0);
            let _ = s.close(fd as i32);
        }
    }
}

fn host_ok() -> Result<(), String> {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    if !std::path::Path::new("/dev/shm").is_dir() {
        return Err("no /dev/shm".into());
    }
    Ok(())
}

#[test]
fn inode_flags_match_tmpfs() {
    let vfs = Vfs::new();
    let root = Ours { t: vfs.root_task() };
    let user = Ours {
        t: vfs.task(Cred::user(1000, 1000)),
    };
    let mut ol = Log::default();
    root_part(&root, &mut ol);
    user_part(&user, &mut ol);
    assert!(ol.0.contains(&"open wr: Err(1)".to_string()), "{ol:?}");
    if let Err(why) = host_ok() {
        eprintln!("host side skipped: {why}");
        return;
    }
    let dir = format!("/dev/shm/scalevfs-flags-{}", std::process::id());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let h = Host { dir: dir.clone() };
    let mut hl = Log::default();
    // SAFETY: plain syscall.
    unsafe { libc::umask(0o022) };
    root_part(&h, &mut hl);
    let d2 = dir.clone();
    let ul = common::as_uid_1000(move || {
        let mut ul = Log::default();
        user_part(&Host { dir: d2 }, &mut ul);
        ul
    });
    hl.0.extend(ul.0);
    cleanup(&h);
    let _ = std::fs::remove_dir_all(&dir);
    if std::env::var_os("OPS_SHOW").is_some() {
        eprintln!("{hl:#?}");
    }
    for (a, b) in hl.0.iter().zip(ol.0.iter()) {
        assert_eq!(a, b, "tmpfs (left) and scalevfs (right) differ");
    }
    assert_eq!(hl.0.len(), ol.0.len());
}
