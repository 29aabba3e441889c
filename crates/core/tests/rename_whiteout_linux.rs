//! Differential test of renameat2(RENAME_WHITEOUT) (issue 13, item 5)
//! against the host's tmpfs (/dev/shm), as root and as uid 1000 (the host
//! side in a thread that dropped to 1000 with raw setresuid: whiteouts need
//! no CAP_MKNOD since Linux 5.8). Results and the whiteout's lstat (type,
//! mode, rdev, owner, nlink) must be equal. Without root or /dev/shm the
//! host side is skipped (reason printed).

mod common;

use std::ffi::CString;

use scalevfs::*;

type R = Result<i64, i32>;

trait Sys {
    fn rename2(&self, a: &str, b: &str, fl: u32) -> R;
    /// (mode, rdev, uid, gid, nlink, size)
    fn lstat(&self, p: &str) -> Result<(u32, u64, u32, u32, u64, u64), i32>;
    fn mkdir(&self, p: &str) -> R;
    fn mkfile(&self, p: &str) -> R;
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
    fn rename2(&self, a: &str, b: &str, fl: u32) -> R {
        let (a, b) = (self.c(a), self.c(b));
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                fl,
            )
        })
    }
    fn lstat(&self, p: &str) -> Result<(u32, u64, u32, u32, u64, u64), i32> {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::lstat(self.c(p).as_ptr(), &mut st) } as i64)?;
        Ok((
            st.st_mode,
            st.st_rdev,
            st.st_uid,
            st.st_gid,
            st.st_nlink,
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                0
            } else {
                st.st_size as u64
            },
        ))
    }
    fn mkdir(&self, p: &str) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::mkdir(self.c(p).as_ptr(), 0o755) } as i64)
    }
    fn mkfile(&self, p: &str) -> R {
        let fd = cr(
            // SAFETY: a plain syscall on valid pointers that outlive it.
            unsafe { libc::open(self.c(p).as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644) } as i64,
        )?;
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::write(fd as i32, b"abc".as_ptr().cast(), 3) } as i64)?;
        // SAFETY: a plain syscall on valid pointers that outlive it.
        cr(unsafe { libc::close(fd as i32) } as i64)
    }
}

struct Ours {
    t: Task,
}

fn e<T>(r: Result<T, Errno>) -> Result<T, i32> {
    r.map_err(|e| e.raw())
}

impl Sys for Ours {
    fn rename2(&self, a: &str, b: &str, fl: u32) -> R {
        e(self
            .t
            .renameat2(AT_FDCWD, &format!("/{a}"), AT_FDCWD, &format!("/{b}"), fl)
            .map(|_| 0))
    }
    fn lstat(&self, p: &str) -> Result<(u32, u64, u32, u32, u64, u64), i32> {
        let s = e(self.t.lstat(&format!("/{p}")))?;
        let size = if s.mode & S_IFMT == S_IFDIR {
            0
        } else {
            s.size
        };
        Ok((s.mode, s.rdev, s.uid, s.gid, s.nlink as u64, size))
    }
    fn mkdir(&self, p: &str) -> R {
        e(self.t.mkdir(&format!("/{p}"), 0o755).map(|_| 0))
    }
    fn mkfile(&self, p: &str) -> R {
        let fd = e(self.t.open(&format!("/{p}"), O_CREAT | O_WRONLY, 0o644))?;
        e(self.t.write(fd, b"abc"))?;
        e(self.t.close(fd).map(|_| 0))
    }
}

#[derive(Default, Debug)]
struct Log(Vec<String>);

impl Log {
    fn r<T: std::fmt::Debug>(&mut self, what: &str, r: T) {
        self.0.push(format!("{what}: {r:?}"));
    }
}

const WO: u32 = RENAME_WHITEOUT;

fn root_part(s: &dyn Sys, l: &mut Log) {
    l.r("mkfile", s.mkfile("f"));
    l.r("mkdir", s.mkdir("d"));
    l.r("mkdir", s.mkdir("e"));
    l.r("whiteout file", s.rename2("f", "g", WO));
    l.r("old name", s.lstat("f"));
    l.r("new name", s.lstat("g"));
    l.r(
        "whiteout exchange",
        s.rename2("g", "d", WO | RENAME_EXCHANGE),
    );
    l.r(
        "whiteout noreplace",
        s.rename2("g", "d", WO | RENAME_NOREPLACE),
    );
    l.r("whiteout file over dir", s.rename2("g", "e", WO));
    l.r("whiteout missing", s.rename2("nope", "x", WO));
    l.r("whiteout dir", s.rename2("d", "d2", WO));
    l.r("old dir name", s.lstat("d"));
    l.r("root nlink", s.lstat(".").map(|x| x.4));
    l.r("whiteout onto whiteout", s.rename2("g", "f", WO));
    l.r("both", (s.lstat("f"), s.lstat("g")));
    l.r("mkdir shared", s.mkdir("u"));
}

fn user_part(s: &dyn Sys, l: &mut Log) {
    l.r("user mkfile", s.mkfile("u/a"));
    l.r("user whiteout", s.rename2("u/a", "u/b", WO));
    l.r("user whiteout node", s.lstat("u/a"));
    l.r("user whiteout in root's dir", s.rename2("f", "h", WO));
}

#[test]
fn rename_whiteout_matches_tmpfs() {
    let vfs = Vfs::new();
    let root = Ours { t: vfs.root_task() };
    // As the host directory (mkdir with umask 022); memfs's root is 1777.
    root.t.chmod("/", 0o755).unwrap();
    let mut ol = Log::default();
    root_part(&root, &mut ol);
    root.t.chmod("/u", 0o777).unwrap();
    user_part(
        &Ours {
            t: vfs.task(Cred::user(1000, 1000)),
        },
        &mut ol,
    );
    assert!(ol.0.iter().any(|s| s == "whiteout file: Ok(0)"), "{ol:?}");
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/dev/shm").is_dir() {
        eprintln!("host side skipped: not root or no /dev/shm");
        return;
    }
    let dir = format!("/dev/shm/scalevfs-whiteout-{}", std::process::id());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    // SAFETY: plain syscall.
    unsafe { libc::umask(0o022) };
    let mut hl = Log::default();
    root_part(&Host { dir: dir.clone() }, &mut hl);
    std::fs::set_permissions(
        format!("{dir}/u"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let d2 = dir.clone();
    let ul = common::as_uid_1000(move || {
        let mut l = Log::default();
        user_part(&Host { dir: d2 }, &mut l);
        l
    });
    hl.0.extend(ul.0);
    let _ = std::fs::remove_dir_all(&dir);
    if std::env::var_os("OPS_SHOW").is_some() {
        eprintln!("{hl:#?}");
    }
    for (a, b) in hl.0.iter().zip(ol.0.iter()) {
        assert_eq!(a, b, "tmpfs (left) and scalevfs (right) differ");
    }
    assert_eq!(hl.0.len(), ol.0.len());
}
