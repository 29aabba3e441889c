//! `linkat(fd, "", dir, name, AT_EMPTY_PATH)` ("flink") without
//! CAP_DAC_READ_SEARCH, as Linux since 6.10: allowed for a file the
//! caller opened itself (the same credentials as its opener), ENOENT for
//! one opened with other credentials (a root-opened fd kept across a
//! setuid), and the cwd (AT_FDCWD) is not checked (a directory: EPERM).
//! scalevfs refused every non-root caller with ENOENT. The host side runs
//! in a forked child that drops to nobody, on tmpfs (/dev/shm).

use std::ffi::CString;

use scalevfs::*;

const NOBODY: u32 = 65534;

/// (root-opened fd, own fd, AT_FDCWD) results: 0 or the errno.
type Outcome = (i32, i32, i32);

fn ours() -> Outcome {
    let vfs = Vfs::new();
    let root = vfs.root_task();
    root.mkdir("/d", 0o777).unwrap();
    root.chmod("/d", 0o777).unwrap();
    let fd = root.open("/d/a", O_CREAT | O_RDWR, 0o644).unwrap();
    // The forked task keeps the root-opened fd and then becomes nobody.
    let mut t = root.fork();
    t.set_cred(Cred::user(NOBODY, NOBODY));
    let e = |r: VfsResult<()>| r.err().map_or(0, |e| e.raw());
    let a = e(t.linkat(fd, "", AT_FDCWD, "/d/b1", AT_EMPTY_PATH));
    let own = t.open("/d/c", O_CREAT | O_RDWR, 0o644).unwrap();
    let b = e(t.linkat(own, "", AT_FDCWD, "/d/c1", AT_EMPTY_PATH));
    t.chdir("/d").unwrap();
    let c = e(t.linkat(AT_FDCWD, "", AT_FDCWD, "/d/x", AT_EMPTY_PATH));
    (a, b, c)
}

fn host() -> Option<Outcome> {
    // SAFETY: plain syscall.
    if !std::path::Path::new("/dev/shm").is_dir() || unsafe { libc::geteuid() } != 0 {
        eprintln!("host side skipped: needs /dev/shm and root");
        return None;
    }
    let dir = format!("/dev/shm/scalevfs-flink-{}", std::process::id());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let c = |s: &str| CString::new(format!("{dir}/{s}")).unwrap();
    // Everything the child uses is made before the fork: it only makes
    // raw system calls (async-signal-safe), no allocation.
    let (a, b1, cc, c1, x) = (c("a"), c("b1"), c("c"), c("c1"), c("x"));
    let d = CString::new(dir.clone()).unwrap();
    let empty = CString::new("").unwrap();
    let mut fds = [0i32; 2];
    // SAFETY: a pipe into a live array of two.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child below makes only raw system calls and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: raw system calls on the strings made before the fork.
        unsafe {
            let err = || *libc::__errno_location();
            let link = |fd: i32, new: &CString| {
                if libc::linkat(
                    fd,
                    empty.as_ptr(),
                    libc::AT_FDCWD,
                    new.as_ptr(),
                    libc::AT_EMPTY_PATH,
                ) == 0
                {
                    0
                } else {
                    err()
                }
            };
            let fd = libc::open(a.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o644);
            if libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 || fd < 0 {
                libc::_exit(2);
            }
            let mut out = [0i32; 3];
            out[0] = link(fd, &b1);
            let own = libc::open(cc.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o644);
            out[1] = if own < 0 { -1 } else { link(own, &c1) };
            out[2] = if libc::chdir(d.as_ptr()) == 0 {
                link(libc::AT_FDCWD, &x)
            } else {
                -1
            };
            libc::write(fds[1], out.as_ptr().cast(), std::mem::size_of_val(&out));
            libc::_exit(0);
        }
    }
    // SAFETY: closing our write end; reading into a live array; reaping
    // our child.
    let out = unsafe {
        libc::close(fds[1]);
        let mut out = [0i32; 3];
        let n = libc::read(fds[0], out.as_mut_ptr().cast(), std::mem::size_of_val(&out));
        libc::close(fds[0]);
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
        assert_eq!(
            n as usize,
            std::mem::size_of_val(&out),
            "the child failed: {st}"
        );
        out
    };
    let _ = std::fs::remove_dir_all(&dir);
    Some((out[0], out[1], out[2]))
}

#[test]
fn flink_needs_the_openers_credentials_not_root() {
    let ours = ours();
    // What Linux 6.10+ does (checked on the host when it can run).
    assert_eq!(ours, (libc::ENOENT, 0, libc::EPERM));
    if let Some(linux) = host() {
        assert_eq!(ours, linux, "(left: scalevfs, right: Linux)");
    }
}
