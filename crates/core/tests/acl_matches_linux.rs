//! POSIX ACLs enforced, inherited and rewritten as Linux does, checked
//! against the host kernel's tmpfs: the same script runs on /dev/shm and
//! on scalevfs, every result (errno, mode, stored ACL) is logged on both
//! sides and the logs must be equal. Covers named users and groups, the
//! mask limiting them, a group entry that refuses although OTHER would
//! allow, search permission of a directory refused by a named entry,
//! chmod rewriting the stored ACL, default ACLs inherited by files and
//! directories (the umask ignored there, applied elsewhere), an ACL the
//! mode says all of (nothing stored), and removal.
//!
//! The unprivileged part runs on the host in a thread that dropped to uid
//! 1000 (gid 1000, no supplementary groups) with raw setresuid (per
//! thread). If we are not root, /dev/shm is missing or its tmpfs has no
//! ACLs, the host side is skipped with the reason printed and only the
//! checks that hold whatever the host says run.

mod common;

use std::ffi::CString;

use scalevfs::xattr::{POSIX_ACL_ACCESS, POSIX_ACL_DEFAULT};
use scalevfs::*;

use common::*;

/// An ACL value as text, entry by entry (tag:id:perm).
fn show_acl(v: &[u8]) -> String {
    v.get(4..)
        .unwrap_or_default()
        .chunks(8)
        .map(|e| {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let perm = u16::from_le_bytes([e[2], e[3]]);
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            let id = if id == U {
                String::new()
            } else {
                id.to_string()
            };
            format!("{tag:x}:{id}:{perm}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

type R = Result<String, i32>;

trait Sys {
    fn creat(&self, p: &str, mode: u32) -> R;
    fn mkdir(&self, p: &str, mode: u32) -> R;
    fn chmod(&self, p: &str, m: u32) -> R;
    fn chown(&self, p: &str, u: u32, g: u32) -> R;
    fn set(&self, p: &str, name: &[u8], v: &[u8]) -> R;
    fn get(&self, p: &str, name: &[u8]) -> R;
    fn remove(&self, p: &str, name: &[u8]) -> R;
    /// open(2) with `flags` and closed again.
    fn open(&self, p: &str, flags: i32) -> R;
    fn access(&self, p: &str, mode: i32) -> R;
    /// The permission bits and setgid (stat).
    fn mode(&self, p: &str) -> R;
    fn umask(&self, m: u32);
}

fn cr(r: isize) -> Result<isize, i32> {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}

struct Host {
    dir: String,
}

impl Host {
    fn c(&self, p: &str) -> CString {
        CString::new(format!("{}/{p}", self.dir)).unwrap()
    }
}

fn ok(r: Result<isize, i32>) -> R {
    r.map(|_| "ok".to_string())
}

impl Sys for Host {
    fn creat(&self, p: &str, mode: u32) -> R {
        // SAFETY: plain syscalls on valid pointers that outlive them.
        let fd = cr(unsafe {
            libc::open(
                self.c(p).as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                mode,
            )
        } as isize)?;
        // SAFETY: closes the fd just opened.
        unsafe { libc::close(fd as i32) };
        Ok("ok".into())
    }
    fn mkdir(&self, p: &str, mode: u32) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        ok(cr(unsafe { libc::mkdir(self.c(p).as_ptr(), mode) } as isize))
    }
    fn chmod(&self, p: &str, m: u32) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        ok(cr(unsafe { libc::chmod(self.c(p).as_ptr(), m) } as isize))
    }
    fn chown(&self, p: &str, u: u32, g: u32) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        ok(cr(unsafe { libc::chown(self.c(p).as_ptr(), u, g) } as isize))
    }
    fn set(&self, p: &str, name: &[u8], v: &[u8]) -> R {
        let n = CString::new(name).unwrap();
        // SAFETY: a plain syscall on valid pointers that outlive it.
        ok(cr(unsafe {
            libc::setxattr(
                self.c(p).as_ptr(),
                n.as_ptr(),
                v.as_ptr().cast(),
                v.len(),
                0,
            )
        } as isize))
    }
    fn get(&self, p: &str, name: &[u8]) -> R {
        let n = CString::new(name).unwrap();
        let mut buf = vec![0u8; 4096];
        // SAFETY: a plain syscall on valid pointers that outlive it; the
        // buffer is `buf.len()` bytes.
        let r = cr(unsafe {
            libc::getxattr(
                self.c(p).as_ptr(),
                n.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        })?;
        Ok(show_acl(&buf[..r as usize]))
    }
    fn remove(&self, p: &str, name: &[u8]) -> R {
        let n = CString::new(name).unwrap();
        // SAFETY: a plain syscall on valid pointers that outlive it.
        ok(cr(
            unsafe { libc::removexattr(self.c(p).as_ptr(), n.as_ptr()) } as isize,
        ))
    }
    fn open(&self, p: &str, flags: i32) -> R {
        // SAFETY: plain syscalls on valid pointers that outlive them.
        let fd = cr(unsafe { libc::open(self.c(p).as_ptr(), flags) } as isize)?;
        // SAFETY: closes the fd just opened.
        unsafe { libc::close(fd as i32) };
        Ok("ok".into())
    }
    fn access(&self, p: &str, mode: i32) -> R {
        // SAFETY: a plain syscall on valid pointers that outlive it.
        ok(cr(
            unsafe { libc::access(self.c(p).as_ptr(), mode) } as isize
        ))
    }
    fn mode(&self, p: &str) -> R {
        let m = std::fs::metadata(format!("{}/{p}", self.dir))
            .map_err(|e| e.raw_os_error().unwrap_or(0))?;
        Ok(format!(
            "{:o}",
            std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777
        ))
    }
    fn umask(&self, m: u32) {
        // SAFETY: a plain syscall (process-wide; this test is the only one
        // in its binary that creates files on the host).
        unsafe { libc::umask(m) };
    }
}

struct Ours {
    t: Task,
}

fn p(s: &str) -> String {
    format!("/{s}")
}

fn e<T>(r: Result<T, Errno>) -> R {
    r.map(|_| "ok".to_string()).map_err(|e| e.raw())
}

impl Sys for Ours {
    fn creat(&self, s: &str, mode: u32) -> R {
        let fd = self
            .t
            .open(
                &p(s),
                (libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY) as u32,
                mode,
            )
            .map_err(|e| e.raw())?;
        self.t.close(fd).unwrap();
        Ok("ok".into())
    }
    fn mkdir(&self, s: &str, mode: u32) -> R {
        e(self.t.mkdir(&p(s), mode))
    }
    fn chmod(&self, s: &str, m: u32) -> R {
        e(self.t.chmod(&p(s), m))
    }
    fn chown(&self, s: &str, u: u32, g: u32) -> R {
        e(self.t.chown(&p(s), u, g))
    }
    fn set(&self, s: &str, name: &[u8], v: &[u8]) -> R {
        e(self.t.setxattr(&p(s), name, v, 0))
    }
    fn get(&self, s: &str, name: &[u8]) -> R {
        let mut buf = vec![0u8; 4096];
        let n = self
            .t
            .getxattr(&p(s), name, &mut buf)
            .map_err(|e| e.raw())?;
        Ok(show_acl(&buf[..n]))
    }
    fn remove(&self, s: &str, name: &[u8]) -> R {
        e(self.t.removexattr(&p(s), name))
    }
    fn open(&self, s: &str, flags: i32) -> R {
        let fd = self.t.open(&p(s), flags as u32, 0).map_err(|e| e.raw())?;
        self.t.close(fd).unwrap();
        Ok("ok".into())
    }
    fn access(&self, s: &str, mode: i32) -> R {
        e(self.t.access(&p(s), mode as u32))
    }
    fn mode(&self, s: &str) -> R {
        let st = self.t.stat(&p(s)).map_err(|e| e.raw())?;
        Ok(format!("{:o}", st.mode & 0o7777))
    }
    fn umask(&self, m: u32) {
        self.t.umask(m);
    }
}

#[derive(Debug, Default)]
struct Log(Vec<String>);

impl Log {
    fn r(&mut self, what: &str, r: R) {
        self.0.push(format!("{what}: {r:?}"));
    }
}

const RD: i32 = libc::O_RDONLY;
const WR: i32 = libc::O_WRONLY;

/// As root: the files, their owners and ACLs, and the inheritance cases.
fn root_part(s: &dyn Sys, l: &mut Log) {
    s.umask(0o022);
    // a: user 1000 may read, not write (named entry r).
    l.r("creat a", s.creat("a", 0o640));
    l.r(
        "set a",
        s.set(
            "a",
            POSIX_ACL_ACCESS,
            &acl(&[
                (USER_OBJ, 6, U),
                (USER, 4, 1000),
                (GROUP_OBJ, 4, U),
                (MASK, 4, U),
                (OTHER, 0, U),
            ]),
        ),
    );
    l.r("mode a", s.mode("a"));
    // b: named rw, mask r: the mask limits the named entry.
    l.r("creat b", s.creat("b", 0o600));
    l.r(
        "set b",
        s.set(
            "b",
            POSIX_ACL_ACCESS,
            &acl(&[
                (USER_OBJ, 6, U),
                (USER, 6, 1000),
                (GROUP_OBJ, 0, U),
                (MASK, 4, U),
                (OTHER, 0, U),
            ]),
        ),
    );
    // c: named group 1000 rw.
    l.r("creat c", s.creat("c", 0o600));
    l.r(
        "set c",
        s.set(
            "c",
            POSIX_ACL_ACCESS,
            &acl(&[
                (USER_OBJ, 6, U),
                (GROUP_OBJ, 0, U),
                (GROUP, 6, 1000),
                (MASK, 6, U),
                (OTHER, 0, U),
            ]),
        ),
    );
    // d: owned by group 1000 whose entry gives nothing, OTHER rw: the
    // caller is in a group, so OTHER does not apply.
    l.r("creat d", s.creat("d", 0o666));
    l.r("chown d", s.chown("d", 0, 1000));
    l.r(
        "set d",
        s.set(
            "d",
            POSIX_ACL_ACCESS,
            &acl(&[
                (USER_OBJ, 6, U),
                (GROUP_OBJ, 0, U),
                (GROUP, 4, 4242),
                (MASK, 6, U),
                (OTHER, 6, U),
            ]),
        ),
    );
    // e: chmod rewrites the stored ACL (mask and other follow the mode).
    l.r("creat e", s.creat("e", 0o644));
    l.r(
        "set e",
        s.set(
            "e",
            POSIX_ACL_ACCESS,
            &acl(&[
                (USER_OBJ, 6, U),
                (USER, 6, 1000),
                (GROUP_OBJ, 4, U),
                (MASK, 6, U),
                (OTHER, 4, U),
            ]),
        ),
    );
    l.r("chmod e", s.chmod("e", 0o604));
    l.r("get e", s.get("e", POSIX_ACL_ACCESS));
    l.r("mode e", s.mode("e"));
    // s: a directory everyone may search by its mode, but user 1000's
    // named entry has no x.
    l.r("mkdir s", s.mkdir("s", 0o755));
    l.r("creat s/f", s.creat("s/f", 0o644));
    l.r(
        "set s",
        s.set(
            "s",
            POSIX_ACL_ACCESS,
            &acl(&[
                (USER_OBJ, 7, U),
                (USER, 0, 1000),
                (GROUP_OBJ, 5, U),
                (MASK, 5, U),
                (OTHER, 5, U),
            ]),
        ),
    );
    l.r("mode s", s.mode("s"));
    // An ACL the mode says all of: nothing stored, the mode changes.
    l.r("creat q", s.creat("q", 0o600));
    l.r(
        "set q",
        s.set(
            "q",
            POSIX_ACL_ACCESS,
            &acl(&[(USER_OBJ, 7, U), (GROUP_OBJ, 5, U), (OTHER, 1, U)]),
        ),
    );
    l.r("get q", s.get("q", POSIX_ACL_ACCESS));
    l.r("mode q", s.mode("q"));
    // Inheritance: a default ACL; the umask does not apply under it.
    l.r("mkdir i", s.mkdir("i", 0o777));
    l.r("chmod i", s.chmod("i", 0o777));
    let def = acl(&[
        (USER_OBJ, 7, U),
        (USER, 7, 1000),
        (GROUP_OBJ, 5, U),
        (MASK, 7, U),
        (OTHER, 0, U),
    ]);
    l.r("set i default", s.set("i", POSIX_ACL_DEFAULT, &def));
    l.r("get i default", s.get("i", POSIX_ACL_DEFAULT));
    l.r("get i access", s.get("i", POSIX_ACL_ACCESS));
    l.r("creat i/f", s.creat("i/f", 0o666));
    l.r("mode i/f", s.mode("i/f"));
    l.r("get i/f", s.get("i/f", POSIX_ACL_ACCESS));
    l.r("get i/f default", s.get("i/f", POSIX_ACL_DEFAULT));
    l.r("creat i/g", s.creat("i/g", 0o600));
    l.r("mode i/g", s.mode("i/g"));
    l.r("get i/g", s.get("i/g", POSIX_ACL_ACCESS));
    l.r("mkdir i/d", s.mkdir("i/d", 0o750));
    l.r("mode i/d", s.mode("i/d"));
    l.r("get i/d", s.get("i/d", POSIX_ACL_ACCESS));
    l.r("get i/d default", s.get("i/d", POSIX_ACL_DEFAULT));
    l.r("creat i/d/f", s.creat("i/d/f", 0o640));
    l.r("mode i/d/f", s.mode("i/d/f"));
    l.r("get i/d/f", s.get("i/d/f", POSIX_ACL_ACCESS));
    // A default ACL with no named entries: an access ACL is not needed.
    l.r("mkdir j", s.mkdir("j", 0o777));
    l.r(
        "set j default",
        s.set(
            "j",
            POSIX_ACL_DEFAULT,
            &acl(&[(USER_OBJ, 7, U), (GROUP_OBJ, 0, U), (OTHER, 0, U)]),
        ),
    );
    l.r("creat j/f", s.creat("j/f", 0o666));
    l.r("mode j/f", s.mode("j/f"));
    l.r("get j/f", s.get("j/f", POSIX_ACL_ACCESS));
    // Removing the default ACL: the umask is back.
    l.r("remove j default", s.remove("j", POSIX_ACL_DEFAULT));
    l.r("creat j/g", s.creat("j/g", 0o666));
    l.r("mode j/g", s.mode("j/g"));
    // Removing an access ACL: the mode alone decides again.
    l.r("creat r", s.creat("r", 0o644));
    l.r("set r", s.set("r", POSIX_ACL_ACCESS, &deny_1000()));
    l.r("remove r", s.remove("r", POSIX_ACL_ACCESS));
    l.r("get r", s.get("r", POSIX_ACL_ACCESS));
    // Removing an ACL that is not there, and a default ACL of a file.
    l.r("remove r again", s.remove("r", POSIX_ACL_ACCESS));
    l.r("remove r default", s.remove("r", POSIX_ACL_DEFAULT));
    l.r("remove j default again", s.remove("j", POSIX_ACL_DEFAULT));
    // Named users out of id order and twice: Linux 6.x's posix_acl_valid
    // takes them (the first match wins).
    l.r("creat o", s.creat("o", 0o640));
    l.r(
        "set o unordered",
        s.set(
            "o",
            POSIX_ACL_ACCESS,
            &acl(&[
                (USER_OBJ, 6, U),
                (USER, 4, 1001),
                (USER, 6, 1000),
                (USER, 0, 1000),
                (GROUP_OBJ, 4, U),
                (MASK, 6, U),
                (OTHER, 0, U),
            ]),
        ),
    );
    l.r("get o", s.get("o", POSIX_ACL_ACCESS));
    // An empty value is no ACL: the stored one goes, the mode stays.
    l.r("set o empty", s.set("o", POSIX_ACL_ACCESS, b""));
    l.r("get o after empty", s.get("o", POSIX_ACL_ACCESS));
    l.r("mode o", s.mode("o"));
    // setgid on a file of uid 1000 in group 0 (not the user's): the
    // user's part removes its ACL.
    l.r("creat sg", s.creat("sg", 0o640));
    l.r("chown sg", s.chown("sg", 1000, 0));
    l.r("chmod sg", s.chmod("sg", 0o2740));
    l.r("mode sg", s.mode("sg"));
    // The user's part tries to remove these.
    l.r("creat x", s.creat("x", 0o644));
    l.r("set x", s.set("x", POSIX_ACL_ACCESS, &deny_1000()));
    l.r("mode x", s.mode("x"));
}

/// `user::rw- user:1000:--- group::r-- mask::r-- other::r--`: everyone
/// may read but uid 1000.
fn deny_1000() -> Vec<u8> {
    acl(&[
        (USER_OBJ, 6, U),
        (USER, 0, 1000),
        (GROUP_OBJ, 4, U),
        (MASK, 4, U),
        (OTHER, 4, U),
    ])
}

/// As uid 1000 (gid 1000, no other groups).
fn user_part(s: &dyn Sys, l: &mut Log) {
    s.umask(0o022);
    for f in ["a", "b", "c", "d", "e"] {
        l.r(&format!("user read {f}"), s.open(f, RD));
        l.r(&format!("user write {f}"), s.open(f, WR));
        l.r(&format!("user access {f} R"), s.access(f, libc::R_OK));
        l.r(&format!("user access {f} W"), s.access(f, libc::W_OK));
    }
    l.r("user search s", s.open("s/f", RD));
    l.r("user access s X", s.access("s", libc::X_OK));
    l.r("user read i/f", s.open("i/f", RD));
    l.r("user write i/f", s.open("i/f", WR));
    l.r("user write i/g", s.open("i/g", WR));
    l.r("user read r", s.open("r", RD));
    // The owner's own create in a directory with a default ACL.
    l.r("user creat i/u", s.creat("i/u", 0o640));
    l.r("user mode i/u", s.mode("i/u"));
    l.r("user get i/u", s.get("i/u", POSIX_ACL_ACCESS));
    // Not the owner: may not set an ACL.
    l.r(
        "user set a",
        s.set(
            "a",
            POSIX_ACL_ACCESS,
            &acl(&[(USER_OBJ, 7, U), (GROUP_OBJ, 7, U), (OTHER, 7, U)]),
        ),
    );
    // Nor remove one (it would widen what the ACL denies), even one that
    // is not there.
    l.r("user read x", s.open("x", RD));
    l.r("user remove x", s.remove("x", POSIX_ACL_ACCESS));
    l.r("user read x again", s.open("x", RD));
    l.r("user remove j default", s.remove("j", POSIX_ACL_DEFAULT));
    // set_posix_acl's order: a default ACL on a non-directory before the
    // owner check (EACCES to set, nothing to remove), and posix_acl_valid
    // (a permission bit past rwx) after it (EPERM for a non-owner).
    l.r(
        "user set x default",
        s.set("x", POSIX_ACL_DEFAULT, &deny_1000()),
    );
    l.r("user remove x default", s.remove("x", POSIX_ACL_DEFAULT));
    l.r(
        "user set a bad perm",
        s.set(
            "a",
            POSIX_ACL_ACCESS,
            &acl(&[(USER_OBJ, 8, U), (GROUP_OBJ, 7, U), (OTHER, 7, U)]),
        ),
    );
    // posix_acl_update_mode on removal: the owner, outside the file's
    // group, loses setgid.
    l.r("user remove sg", s.remove("sg", POSIX_ACL_ACCESS));
    l.r("user mode sg", s.mode("sg"));
}

/// Whether the host can run the script, or why not.
fn host_ok(dir: &str) -> Result<(), String> {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    if !std::path::Path::new("/dev/shm").is_dir() {
        return Err("no /dev/shm".into());
    }
    let h = Host {
        dir: dir.to_string(),
    };
    h.creat("probe", 0o644)
        .map_err(|e| format!("creat on /dev/shm: errno {e}"))?;
    let r = h.set(
        "probe",
        POSIX_ACL_ACCESS,
        &acl(&[
            (USER_OBJ, 6, U),
            (USER, 4, 1000),
            (GROUP_OBJ, 4, U),
            (MASK, 4, U),
            (OTHER, 4, U),
        ]),
    );
    let _ = std::fs::remove_file(format!("{dir}/probe"));
    r.map(|_| ())
        .map_err(|e| format!("the host's tmpfs takes no ACL (errno {e})"))
}

#[test]
fn acls_match_tmpfs() {
    let vfs = Vfs::new();
    let root = Ours { t: vfs.root_task() };
    root.t.chmod("/", 0o777).unwrap();
    let user = Ours {
        t: vfs.task(Cred::user(1000, 1000)),
    };
    let mut ol = Log::default();
    root_part(&root, &mut ol);
    user_part(&user, &mut ol);
    // Checks that hold whatever the host says (Linux's rules).
    let has = |s: &str| ol.0.iter().any(|x| x == s);
    let eacces = format!("Err({})", libc::EACCES);
    for want in [
        "user read a: Ok(\"ok\")".to_string(),
        format!("user write a: {eacces}"),
        format!("user write b: {eacces}"),
        "user write c: Ok(\"ok\")".to_string(),
        format!("user read d: {eacces}"),
        // chmod 0604: the mask is now 0, and with no group bits Linux
        // does not look at the ACL at all (OTHER's r applies).
        "user read e: Ok(\"ok\")".to_string(),
        "get e: Ok(\"1::6,2:1000:6,4::4,10::0,20::4\")".to_string(),
        format!("user search s: {eacces}"),
        "user write i/f: Ok(\"ok\")".to_string(),
        "mode i/f: Ok(\"660\")".to_string(),
        format!("get q: Err({})", libc::ENODATA),
        "mode q: Ok(\"751\")".to_string(),
        "remove r again: Ok(\"ok\")".to_string(),
        format!("user read x: {eacces}"),
        format!("user remove x: Err({})", libc::EPERM),
        format!("user read x again: {eacces}"),
        format!("user remove j default: Err({})", libc::EPERM),
    ] {
        assert!(has(&want), "missing {want:?} in {ol:#?}");
    }
    let dir = format!("/dev/shm/scalevfs-acl-{}", std::process::id());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    if let Err(why) = host_ok(&dir) {
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("host side skipped: {why}");
        return;
    }
    let h = Host { dir: dir.clone() };
    let mut hl = Log::default();
    root_part(&h, &mut hl);
    let d2 = dir.clone();
    let ul = common::as_uid_1000(move || {
        let mut ul = Log::default();
        user_part(&Host { dir: d2 }, &mut ul);
        ul
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
