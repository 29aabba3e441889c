//! Differential test of extended attributes against the host's tmpfs
//! (/dev/shm keeps user., trusted. and security. attributes): every call's
//! result (value, length or errno) is logged on both sides and the logs
//! must be equal. Covers the name checks (ERANGE, E2BIG, EINVAL,
//! EOPNOTSUPP), XATTR_CREATE/REPLACE, the size-0 probe and ERANGE for a
//! short buffer, the name spaces' rules (trusted for root only, user only on
//! regular files and directories, not on another's sticky directory),
//! read/write permission, immutable and append-only inodes, the `l` and `f`
//! variants, and that set and remove change the ctime. The unprivileged
//! part runs on the host in a thread that dropped to uid 1000 with raw
//! setresuid (per thread).
//!
//! If /dev/shm is missing or we are not root, the host side is skipped (the
//! reason is printed) and only the scalevfs side runs.
//!
//! POSIX ACLs are checked on scalevfs alone (`acl_*` tests): the host's
//! tmpfs here is built without them (EOPNOTSUPP), so the expected results
//! are Linux's rules from fs/posix_acl.c as ext4 applies them.

mod common;

use std::ffi::CString;

use scalevfs::inode::{FS_APPEND_FL, FS_IMMUTABLE_FL};
use scalevfs::xattr::{XATTR_CREATE, XATTR_REPLACE};
use scalevfs::*;

type R = Result<String, i32>;

trait Sys {
    fn creat(&self, p: &str) -> i32;
    fn close(&self, fd: i32);
    fn mkdir(&self, p: &str, mode: u32);
    fn symlink(&self, target: &str, p: &str);
    fn mkfifo(&self, p: &str);
    fn chmod(&self, p: &str, m: u32);
    fn chown(&self, p: &str, u: u32, g: u32);
    fn setflags(&self, p: &str, fl: u32);
    fn ctime(&self, p: &str) -> (i64, i64);
    fn set(&self, p: &str, name: &[u8], v: &[u8], flags: u32, nofollow: bool) -> R;
    /// `size` is the buffer given; the value comes back as text.
    fn get(&self, p: &str, name: &[u8], size: usize, nofollow: bool) -> R;
    /// The names, sorted (the order is not specified), or the length with
    /// a size-0 probe.
    fn list(&self, p: &str, size: usize, nofollow: bool) -> R;
    fn remove(&self, p: &str, name: &[u8], nofollow: bool) -> R;
    fn fget(&self, fd: i32, name: &[u8], size: usize) -> R;
    fn fset(&self, fd: i32, name: &[u8], v: &[u8], flags: u32) -> R;
    fn open_path(&self, p: &str) -> i32;
}

fn cr(r: isize) -> Result<isize, i32> {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}

fn show_get(buf: &[u8], n: usize, size: usize) -> String {
    if size == 0 {
        format!("len {n}")
    } else {
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

fn show_list(buf: &[u8], n: usize, size: usize) -> String {
    if size == 0 {
        return format!("len {n}");
    }
    let mut names: Vec<String> = buf[..n]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    names.sort();
    names.join(",")
}

struct Host {
    dir: String,
}

impl Host {
    fn c(&self, p: &str) -> CString {
        CString::new(format!("{}/{p}", self.dir)).unwrap()
    }
}

fn cs(b: &[u8]) -> CString {
    CString::new(b).unwrap()
}

impl Sys for Host {
    fn creat(&self, p: &str) -> i32 {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::open(self.c(p).as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o644) } as isize)
            .unwrap() as i32
    }
    fn close(&self, fd: i32) {
        // SAFETY: a plain syscall.
        unsafe { libc::close(fd) };
    }
    fn mkdir(&self, p: &str, mode: u32) {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::mkdir(self.c(p).as_ptr(), mode) } as isize).unwrap();
        self.chmod(p, mode);
    }
    fn symlink(&self, target: &str, p: &str) {
        let t = cs(target.as_bytes());
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::symlink(t.as_ptr(), self.c(p).as_ptr()) } as isize).unwrap();
    }
    fn mkfifo(&self, p: &str) {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::mkfifo(self.c(p).as_ptr(), 0o644) } as isize).unwrap();
    }
    fn chmod(&self, p: &str, m: u32) {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::chmod(self.c(p).as_ptr(), m) } as isize).unwrap();
    }
    fn chown(&self, p: &str, u: u32, g: u32) {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::lchown(self.c(p).as_ptr(), u, g) } as isize).unwrap();
    }
    fn setflags(&self, p: &str, fl: u32) {
        // SAFETY: plain syscalls on valid pointers that outlive them.
        unsafe {
            let fd = libc::open(self.c(p).as_ptr(), libc::O_RDONLY);
            assert!(fd >= 0);
            let v = fl as libc::c_int;
            assert_eq!(libc::ioctl(fd, 0x4008_6602, &v), 0);
            libc::close(fd);
        }
    }
    fn ctime(&self, p: &str) -> (i64, i64) {
        let m = std::fs::symlink_metadata(format!("{}/{p}", self.dir)).unwrap();
        use std::os::unix::fs::MetadataExt;
        (m.ctime(), m.ctime_nsec())
    }
    fn set(&self, p: &str, name: &[u8], v: &[u8], flags: u32, nofollow: bool) -> R {
        let n = cs(name);
        let f = if nofollow {
            libc::lsetxattr
        } else {
            libc::setxattr
        };
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe {
            f(
                self.c(p).as_ptr(),
                n.as_ptr(),
                v.as_ptr().cast(),
                v.len(),
                flags as i32,
            )
        } as isize)
        .map(|_| String::new())
    }
    fn get(&self, p: &str, name: &[u8], size: usize, nofollow: bool) -> R {
        let n = cs(name);
        let mut buf = vec![0u8; size];
        let f = if nofollow {
            libc::lgetxattr
        } else {
            libc::getxattr
        };
        // SAFETY: a plain syscall on valid pointers that outlive it.
        let r = cr(unsafe {
            f(
                self.c(p).as_ptr(),
                n.as_ptr(),
                buf.as_mut_ptr().cast(),
                size,
            )
        })?;
        Ok(show_get(&buf, r as usize, size))
    }
    fn list(&self, p: &str, size: usize, nofollow: bool) -> R {
        let mut buf = vec![0u8; size];
        let f = if nofollow {
            libc::llistxattr
        } else {
            libc::listxattr
        };
        // SAFETY: a plain syscall on valid pointers that outlive it.
        let r = cr(unsafe { f(self.c(p).as_ptr(), buf.as_mut_ptr().cast(), size) })?;
        Ok(show_list(&buf, r as usize, size))
    }
    fn remove(&self, p: &str, name: &[u8], nofollow: bool) -> R {
        let n = cs(name);
        let f = if nofollow {
            libc::lremovexattr
        } else {
            libc::removexattr
        };
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { f(self.c(p).as_ptr(), n.as_ptr()) } as isize).map(|_| String::new())
    }
    fn fget(&self, fd: i32, name: &[u8], size: usize) -> R {
        let n = cs(name);
        let mut buf = vec![0u8; size];
        // SAFETY: a plain syscall on valid pointers that outlive it.
        let r = cr(unsafe { libc::fgetxattr(fd, n.as_ptr(), buf.as_mut_ptr().cast(), size) })?;
        Ok(show_get(&buf, r as usize, size))
    }
    fn fset(&self, fd: i32, name: &[u8], v: &[u8], flags: u32) -> R {
        let n = cs(name);
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(
            unsafe { libc::fsetxattr(fd, n.as_ptr(), v.as_ptr().cast(), v.len(), flags as i32) }
                as isize,
        )
        .map(|_| String::new())
    }
    fn open_path(&self, p: &str) -> i32 {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::open(self.c(p).as_ptr(), libc::O_PATH) } as isize).unwrap() as i32
    }
}

struct Ours {
    t: Task,
}

fn p(s: &str) -> String {
    format!("/{s}")
}

fn e(r: Result<String, Errno>) -> R {
    r.map_err(|e| e.raw())
}

impl Sys for Ours {
    fn creat(&self, s: &str) -> i32 {
        self.t
            .open(&p(s), (libc::O_CREAT | libc::O_RDWR) as u32, 0o644)
            .unwrap()
    }
    fn close(&self, fd: i32) {
        self.t.close(fd).unwrap();
    }
    fn mkdir(&self, s: &str, mode: u32) {
        self.t.mkdir(&p(s), mode).unwrap();
        self.t.chmod(&p(s), mode).unwrap();
    }
    fn symlink(&self, target: &str, s: &str) {
        self.t.symlink(target, &p(s)).unwrap();
    }
    fn mkfifo(&self, s: &str) {
        self.t.mknodat(AT_FDCWD, &p(s), S_IFIFO | 0o644, 0).unwrap();
    }
    fn chmod(&self, s: &str, m: u32) {
        self.t.chmod(&p(s), m).unwrap();
    }
    fn chown(&self, s: &str, u: u32, g: u32) {
        self.t
            .fchownat(AT_FDCWD, &p(s), u, g, AT_SYMLINK_NOFOLLOW)
            .unwrap();
    }
    fn setflags(&self, s: &str, fl: u32) {
        let fd = self.t.open(&p(s), libc::O_RDONLY as u32, 0).unwrap();
        self.t.ioctl_setflags(fd, fl).unwrap();
        self.t.close(fd).unwrap();
    }
    fn ctime(&self, s: &str) -> (i64, i64) {
        let st = self.t.lstat(&p(s)).unwrap();
        (st.ctime.sec, st.ctime.nsec)
    }
    fn set(&self, s: &str, name: &[u8], v: &[u8], flags: u32, nofollow: bool) -> R {
        let r = if nofollow {
            self.t.lsetxattr(&p(s), name, v, flags)
        } else {
            self.t.setxattr(&p(s), name, v, flags)
        };
        e(r.map(|_| String::new()))
    }
    fn get(&self, s: &str, name: &[u8], size: usize, nofollow: bool) -> R {
        let mut buf = vec![0u8; size];
        let r = if nofollow {
            self.t.lgetxattr(&p(s), name, &mut buf)
        } else {
            self.t.getxattr(&p(s), name, &mut buf)
        };
        e(r.map(|n| show_get(&buf, n, size)))
    }
    fn list(&self, s: &str, size: usize, nofollow: bool) -> R {
        let mut buf = vec![0u8; size];
        let r = if nofollow {
            self.t.llistxattr(&p(s), &mut buf)
        } else {
            self.t.listxattr(&p(s), &mut buf)
        };
        e(r.map(|n| show_list(&buf, n, size)))
    }
    fn remove(&self, s: &str, name: &[u8], nofollow: bool) -> R {
        let r = if nofollow {
            self.t.lremovexattr(&p(s), name)
        } else {
            self.t.removexattr(&p(s), name)
        };
        e(r.map(|_| String::new()))
    }
    fn fget(&self, fd: i32, name: &[u8], size: usize) -> R {
        let mut buf = vec![0u8; size];
        e(self
            .t
            .fgetxattr(fd, name, &mut buf)
            .map(|n| show_get(&buf, n, size)))
    }
    fn fset(&self, fd: i32, name: &[u8], v: &[u8], flags: u32) -> R {
        e(self.t.fsetxattr(fd, name, v, flags).map(|_| String::new()))
    }
    fn open_path(&self, s: &str) -> i32 {
        self.t.open(&p(s), libc::O_PATH as u32, 0).unwrap()
    }
}

#[derive(Default, Debug, PartialEq)]
struct Log(Vec<String>);

impl Log {
    fn r(&mut self, what: &str, r: R) {
        self.0.push(format!("{what}: {r:?}"));
    }
}

const ENODATA: i32 = libc::ENODATA;

fn root_part(s: &dyn Sys, l: &mut Log) {
    let fd = s.creat("f");
    s.mkdir("d", 0o755);
    s.symlink("f", "l");
    s.mkfifo("p");
    // Names.
    l.r("empty name", s.set("f", b"", b"x", 0, false));
    l.r("get empty name", s.get("f", b"", 10, false));
    l.r("unknown prefix", s.set("f", b"foo.bar", b"x", 0, false));
    l.r("get unknown prefix", s.get("f", b"foo.bar", 10, false));
    l.r("remove unknown prefix", s.remove("f", b"foo.bar", false));
    l.r("prefix only", s.set("f", b"user.", b"x", 0, false));
    l.r("get prefix only", s.get("f", b"user.", 10, false));
    l.r(
        "trusted prefix only",
        s.set("f", b"trusted.", b"x", 0, false),
    );
    l.r("system.foo", s.set("f", b"system.foo", b"x", 0, false));
    l.r("get system.foo", s.get("f", b"system.foo", 10, false));
    let long = [b"user.".as_slice(), &[b'a'; 251]].concat();
    l.r("name 256", s.set("f", &long, b"x", 0, false));
    l.r("get name 256", s.get("f", &long, 10, false));
    l.r("remove name 256", s.remove("f", &long, false));
    l.r("name 255", s.set("f", &long[..255], b"x", 0, false));
    l.r("get name 255", s.get("f", &long[..255], 10, false));
    l.r("remove name 255", s.remove("f", &long[..255], false));
    // Values and sizes.
    l.r(
        "value 65537",
        s.set("f", b"user.big", &[7; 65537], 0, false),
    );
    l.r(
        "value 65536",
        s.set("f", b"user.big", &[b'v'; 65536], 0, false),
    );
    l.r("probe big", s.get("f", b"user.big", 0, false));
    l.r("short buffer", s.get("f", b"user.big", 65535, false));
    l.r("remove big", s.remove("f", b"user.big", false));
    l.r("empty value", s.set("f", b"user.e", b"", 0, false));
    l.r("get empty value", s.get("f", b"user.e", 10, false));
    l.r("probe empty value", s.get("f", b"user.e", 0, false));
    l.r("set a", s.set("f", b"user.a", b"hello", 0, false));
    l.r("get a", s.get("f", b"user.a", 100, false));
    l.r("probe a", s.get("f", b"user.a", 0, false));
    l.r("get a short", s.get("f", b"user.a", 4, false));
    l.r("get a exact", s.get("f", b"user.a", 5, false));
    l.r(
        "replace a",
        s.set("f", b"user.a", b"world!", XATTR_REPLACE, false),
    );
    l.r("get a", s.get("f", b"user.a", 100, false));
    l.r(
        "create a",
        s.set("f", b"user.a", b"no", XATTR_CREATE, false),
    );
    l.r(
        "replace missing",
        s.set("f", b"user.m", b"no", XATTR_REPLACE, false),
    );
    l.r("both flags", s.set("f", b"user.m", b"no", 3, false));
    l.r("bad flags", s.set("f", b"user.m", b"no", 4, false));
    l.r("create b", s.set("f", b"user.b", b"B", XATTR_CREATE, false));
    l.r("get missing", s.get("f", b"user.m", 10, false));
    l.r("remove missing", s.remove("f", b"user.m", false));
    l.r("trusted", s.set("f", b"trusted.t", b"T", 0, false));
    l.r("security", s.set("f", b"security.s", b"S", 0, false));
    l.r("list", s.list("f", 1000, false));
    l.r("list probe", s.list("f", 0, false));
    l.r("list short", s.list("f", 5, false));
    l.r("list via symlink", s.list("l", 1000, false));
    l.r("get via symlink", s.get("l", b"user.a", 100, false));
    // The symlink, fifo and directory themselves.
    l.r("user on symlink", s.set("l", b"user.a", b"x", 0, true));
    l.r("get user on symlink", s.get("l", b"user.a", 10, true));
    l.r("remove user on symlink", s.remove("l", b"user.a", true));
    l.r(
        "trusted on symlink",
        s.set("l", b"trusted.a", b"x", 0, true),
    );
    l.r("llist symlink", s.list("l", 1000, true));
    // get_posix_acl (Linux >= 6.2): a symlink has no ACL operations.
    l.r(
        "acl on symlink",
        s.get("l", b"system.posix_acl_access", 100, true),
    );
    l.r("user on fifo", s.set("p", b"user.a", b"x", 0, false));
    l.r("get user on fifo", s.get("p", b"user.a", 10, false));
    l.r("remove user on fifo", s.remove("p", b"user.a", false));
    l.r(
        "security on fifo",
        s.set("p", b"security.a", b"x", 0, false),
    );
    l.r("user on dir", s.set("d", b"user.a", b"dir", 0, false));
    l.r("get user on dir", s.get("d", b"user.a", 10, false));
    l.r("list dir", s.list("d", 100, false));
    // The f variants.
    l.r("fget", s.fget(fd, b"user.a", 100));
    l.r("fset", s.fset(fd, b"user.f", b"F", 0));
    l.r("fget f", s.fget(fd, b"user.f", 100));
    let op = s.open_path("f");
    l.r("fget O_PATH", s.fget(op, b"user.a", 100));
    l.r("fset O_PATH", s.fset(op, b"user.a", b"x", 0));
    s.close(op);
    // ctime.
    let c0 = s.ctime("f");
    std::thread::sleep(std::time::Duration::from_millis(20));
    l.r("set for ctime", s.set("f", b"user.c", b"1", 0, false));
    let c1 = s.ctime("f");
    l.0.push(format!("set changes ctime: {}", c1 > c0));
    std::thread::sleep(std::time::Duration::from_millis(20));
    l.r("remove for ctime", s.remove("f", b"user.c", false));
    l.0.push(format!("remove changes ctime: {}", s.ctime("f") > c1));
    let c2 = s.ctime("f");
    std::thread::sleep(std::time::Duration::from_millis(20));
    l.r(
        "failed set",
        s.set("f", b"user.a", b"x", XATTR_CREATE, false),
    );
    l.0.push(format!("failed set keeps ctime: {}", s.ctime("f") == c2));
    // Immutable and append-only.
    s.creat("i");
    s.close(s.creat("i"));
    s.set("i", b"user.k", b"K", 0, false).unwrap();
    for (what, fl) in [("immutable", FS_IMMUTABLE_FL), ("append", FS_APPEND_FL)] {
        s.setflags("i", fl);
        l.r(
            &format!("{what}: set"),
            s.set("i", b"user.a", b"x", 0, false),
        );
        l.r(&format!("{what}: remove"), s.remove("i", b"user.k", false));
        l.r(
            &format!("{what}: trusted"),
            s.set("i", b"trusted.a", b"x", 0, false),
        );
        l.r(&format!("{what}: get"), s.get("i", b"user.k", 10, false));
        l.r(&format!("{what}: list"), s.list("i", 100, false));
        s.setflags("i", 0);
    }
    // For the unprivileged part.
    s.close(s.creat("g"));
    s.chmod("g", 0o600);
    s.set("g", b"user.r", b"R", 0, false).unwrap();
    s.set("g", b"trusted.t", b"T", 0, false).unwrap();
    s.set("g", b"security.s", b"S", 0, false).unwrap();
    s.close(s.creat("h"));
    s.chown("h", 1000, 1000);
    s.close(s.creat("w"));
    s.chmod("w", 0o666);
    s.mkdir("sd", 0o1777);
    s.mkdir("od", 0o777);
    s.close(fd);
}

fn user_part(s: &dyn Sys, l: &mut Log) {
    l.r("user: get no read perm", s.get("g", b"user.r", 10, false));
    l.r("user: get trusted", s.get("g", b"trusted.t", 10, false));
    l.r("user: get security", s.get("g", b"security.s", 10, false));
    l.r("user: list", s.list("g", 100, false));
    l.r("user: list probe", s.list("g", 0, false));
    l.r(
        "user: set no write perm",
        s.set("g", b"user.x", b"1", 0, false),
    );
    l.r(
        "user: remove no write perm",
        s.remove("g", b"user.r", false),
    );
    l.r(
        "user: unknown prefix no perm",
        s.set("g", b"foo.x", b"1", 0, false),
    );
    l.r(
        "user: system.foo no perm",
        s.set("g", b"system.foo", b"1", 0, false),
    );
    l.r("user: set own", s.set("h", b"user.x", b"1", 0, false));
    l.r("user: get own", s.get("h", b"user.x", 10, false));
    l.r(
        "user: trusted own",
        s.set("h", b"trusted.x", b"1", 0, false),
    );
    l.r(
        "user: security own",
        s.set("h", b"security.x", b"1", 0, false),
    );
    l.r("user: remove trusted", s.remove("g", b"trusted.t", false));
    l.r("user: remove security", s.remove("g", b"security.s", false));
    l.r(
        "user: set on 666 file",
        s.set("w", b"user.x", b"1", 0, false),
    );
    l.r("user: sticky dir", s.set("sd", b"user.x", b"1", 0, false));
    l.r("user: get on sticky dir", s.get("sd", b"user.x", 10, false));
    l.r("user: 777 dir", s.set("od", b"user.x", b"1", 0, false));
    l.r("user: get 777 dir", s.get("od", b"user.x", 10, false));
}

fn cleanup(h: &Host) {
    h.setflags("i", 0);
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
fn xattrs_match_tmpfs() {
    let vfs = Vfs::new();
    let root = Ours { t: vfs.root_task() };
    let user = Ours {
        t: vfs.task(Cred::user(1000, 1000)),
    };
    root.t.umask(0o022);
    let mut ol = Log::default();
    root_part(&root, &mut ol);
    user_part(&user, &mut ol);
    // Checks that hold whatever the host says.
    let has = |s: &str| ol.0.iter().any(|x| x == s);
    assert!(has(&format!("get missing: Err({ENODATA})")), "{ol:#?}");
    assert!(has("get a: Ok(\"world!\")"), "{ol:#?}");
    assert!(has("set changes ctime: true"), "{ol:#?}");
    if let Err(why) = host_ok() {
        eprintln!("host side skipped: {why}");
        return;
    }
    let dir = format!("/dev/shm/scalevfs-xattr-{}", std::process::id());
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
