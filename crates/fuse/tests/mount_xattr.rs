//! Extended attributes through a real FUSE mount: the same calls (libc's
//! `*xattr`, through the kernel) on the mount and on the host's tmpfs
//! (/dev/shm) give the same results, the kernel's size-0 probe included;
//! getfattr/setfattr work; stress-ng's xattr stressor runs on the mount
//! (and does not skip it). Without /dev/fuse or root each test prints why it
//! is skipped and passes; with `SCALEVFS_REQUIRE_FUSE=1` that is a failure.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use scalevfs::Vfs;
use scalevfs_fuse::{spawn_mount, FuseConfig, FuseMount, MountConfig};

fn fuse_ok(test: &str) -> bool {
    let why = if let Err(e) = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        format!("/dev/fuse cannot be opened: {e}")
    // SAFETY: geteuid has no preconditions.
    } else if unsafe { libc::geteuid() } != 0 {
        "not root".to_string()
    } else {
        return true;
    };
    if std::env::var("SCALEVFS_REQUIRE_FUSE").as_deref() == Ok("1") {
        panic!("{test}: FUSE required (SCALEVFS_REQUIRE_FUSE=1) but unavailable: {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
    false
}

struct Mounted {
    m: Option<FuseMount>,
    dir: PathBuf,
}

impl Mounted {
    fn new(tag: &str) -> Mounted {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "scalevfs-fuse-xattr-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).unwrap();
        let cfg = MountConfig {
            fuse: FuseConfig::default(),
            options: Vec::new(),
            threads: 2,
        };
        let m = spawn_mount(Vfs::new(), &dir, &cfg).expect("mount");
        Mounted { m: Some(m), dir }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(m) = self.m.take() {
            let _ = m.unmount();
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno_of(r: isize) -> Result<isize, i32> {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}

fn set(p: &Path, name: &str, v: &[u8], flags: i32, nofollow: bool) -> Result<isize, i32> {
    let n = CString::new(name).unwrap();
    let f = if nofollow {
        libc::lsetxattr
    } else {
        libc::setxattr
    };
    // SAFETY: a plain syscall on valid pointers that outlive it.
    errno_of(unsafe { f(c(p).as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), flags) } as isize)
}

fn get(p: &Path, name: &str, size: usize, nofollow: bool) -> Result<String, i32> {
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; size];
    let f = if nofollow {
        libc::lgetxattr
    } else {
        libc::getxattr
    };
    // SAFETY: a plain syscall on valid pointers that outlive it.
    let r = errno_of(unsafe { f(c(p).as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size) })?;
    Ok(if size == 0 {
        format!("len {r}")
    } else {
        String::from_utf8_lossy(&buf[..r as usize]).into_owned()
    })
}

fn list(p: &Path, size: usize) -> Result<String, i32> {
    let mut buf = vec![0u8; size];
    // SAFETY: a plain syscall on valid pointers that outlive it.
    let r = errno_of(unsafe { libc::llistxattr(c(p).as_ptr(), buf.as_mut_ptr().cast(), size) })?;
    if size == 0 {
        return Ok(format!("len {r}"));
    }
    let mut names: Vec<String> = buf[..r as usize]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    names.sort();
    Ok(names.join(","))
}

fn remove(p: &Path, name: &str) -> Result<isize, i32> {
    let n = CString::new(name).unwrap();
    // SAFETY: a plain syscall on valid pointers that outlive it.
    errno_of(unsafe { libc::removexattr(c(p).as_ptr(), n.as_ptr()) } as isize)
}

/// The calls, logged.
fn script(d: &Path) -> Vec<String> {
    let mut l = Vec::new();
    let mut r = |what: &str, x: String| l.push(format!("{what}: {x}"));
    let f = d.join("f");
    fs::write(&f, b"data").unwrap();
    fs::create_dir(d.join("dir")).unwrap();
    std::os::unix::fs::symlink("f", d.join("l")).unwrap();
    r(
        "set",
        format!("{:?}", set(&f, "user.a", b"hello", 0, false)),
    );
    r("probe", format!("{:?}", get(&f, "user.a", 0, false)));
    r("get", format!("{:?}", get(&f, "user.a", 100, false)));
    r("get short", format!("{:?}", get(&f, "user.a", 3, false)));
    r(
        "create existing",
        format!("{:?}", set(&f, "user.a", b"x", 1, false)),
    );
    r(
        "replace missing",
        format!("{:?}", set(&f, "user.b", b"x", 2, false)),
    );
    r(
        "replace",
        format!("{:?}", set(&f, "user.a", b"bye", 2, false)),
    );
    r("get", format!("{:?}", get(&f, "user.a", 100, false)));
    r(
        "empty value",
        format!("{:?}", set(&f, "user.e", b"", 0, false)),
    );
    r("get empty", format!("{:?}", get(&f, "user.e", 10, false)));
    let big = vec![b'z'; 65536];
    r(
        "big value",
        format!("{:?}", set(&f, "user.big", &big, 0, false)),
    );
    r("probe big", format!("{:?}", get(&f, "user.big", 0, false)));
    r(
        "get big",
        format!("{:?}", get(&f, "user.big", 65536, false).map(|s| s.len())),
    );
    r(
        "too big",
        format!("{:?}", set(&f, "user.big2", &[0; 65537], 0, false)),
    );
    r("remove big", format!("{:?}", remove(&f, "user.big")));
    r(
        "trusted",
        format!("{:?}", set(&f, "trusted.t", b"T", 0, false)),
    );
    r(
        "security",
        format!("{:?}", set(&f, "security.s", b"S", 0, false)),
    );
    r(
        "unknown prefix",
        format!("{:?}", set(&f, "foo.x", b"1", 0, false)),
    );
    r(
        "system.foo",
        format!("{:?}", set(&f, "system.foo", b"1", 0, false)),
    );
    r(
        "long name",
        format!(
            "{:?}",
            set(&f, &format!("user.{}", "n".repeat(251)), b"1", 0, false)
        ),
    );
    r("list", format!("{:?}", list(&f, 1000)));
    r("list probe", format!("{:?}", list(&f, 0)));
    r("list short", format!("{:?}", list(&f, 4)));
    r(
        "get missing",
        format!("{:?}", get(&f, "user.missing", 10, false)),
    );
    r("remove", format!("{:?}", remove(&f, "user.a")));
    r("remove missing", format!("{:?}", remove(&f, "user.a")));
    r("list", format!("{:?}", list(&f, 1000)));
    r(
        "user on symlink",
        format!("{:?}", set(&d.join("l"), "user.a", b"x", 0, true)),
    );
    r(
        "get on symlink",
        format!("{:?}", get(&d.join("l"), "user.a", 10, true)),
    );
    r(
        "via symlink",
        format!("{:?}", get(&d.join("l"), "user.e", 10, false)),
    );
    r(
        "on dir",
        format!("{:?}", set(&d.join("dir"), "user.d", b"D", 0, false)),
    );
    r("list dir", format!("{:?}", list(&d.join("dir"), 100)));
    l
}

#[test]
fn xattrs_through_fuse_match_tmpfs() {
    if !fuse_ok("xattrs_through_fuse_match_tmpfs") {
        return;
    }
    let m = Mounted::new("cmp");
    let ours = script(&m.dir);
    let host = std::path::PathBuf::from(format!("/dev/shm/scalevfs-fxattr-{}", std::process::id()));
    let _ = fs::remove_dir_all(&host);
    fs::create_dir(&host).unwrap();
    let theirs = script(&host);
    let _ = fs::remove_dir_all(&host);
    for (a, b) in theirs.iter().zip(&ours) {
        assert_eq!(a, b, "tmpfs (left) and the FUSE mount (right) differ");
    }
    assert_eq!(theirs.len(), ours.len());
    // getfattr/setfattr, and a user without read permission.
    let f = m.dir.join("g");
    fs::write(&f, b"x").unwrap();
    let st = Command::new("setfattr")
        .args(["-n", "user.tool", "-v", "0x0102ff"])
        .arg(&f)
        .status()
        .unwrap();
    assert!(st.success());
    let out = Command::new("getfattr")
        .args(["-e", "hex", "-n", "user.tool"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("user.tool=0x0102ff"),
        "{out:?}"
    );
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
        ])
        .args(["getfattr", "-n", "user.tool"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{out:?}"
    );
    // A POSIX ACL through the kernel (which parses it too): stored,
    // returned, and the mode's group bits follow its mask.
    let a = m.dir.join("acl");
    fs::write(&a, b"x").unwrap();
    fs::set_permissions(&a, fs::Permissions::from_mode(0o644)).unwrap();
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 7u16, u32::MAX),
        (2, 4, 1000),
        (4, 4, u32::MAX),
        (0x10, 5, u32::MAX),
        (0x20, 1, u32::MAX),
    ] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&id.to_le_bytes());
    }
    set(&a, "system.posix_acl_access", &acl, 0, false).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(fs::metadata(&a).unwrap().mode() & 0o777, 0o751);
    assert_eq!(
        get(&a, "system.posix_acl_access", 0, false),
        Ok(format!("len {}", acl.len()))
    );
    assert_eq!(list(&a, 100), Ok("system.posix_acl_access".to_string()));
}

#[test]
fn stress_ng_xattr_runs_on_the_mount() {
    if !fuse_ok("stress_ng_xattr_runs_on_the_mount") {
        return;
    }
    if Command::new("stress-ng").arg("--version").output().is_err() {
        eprintln!("SKIPPED: stress-ng is not installed");
        return;
    }
    let m = Mounted::new("stress");
    fs::set_permissions(&m.dir, fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new("stress-ng")
        .args([
            "--xattr",
            "2",
            "--timeout",
            "3",
            "--metrics-brief",
            "--temp-path",
        ])
        .arg(&m.dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("skipping"), "{text}");
    assert!(!text.contains("does not support"), "{text}");
    // The bogo-op count is printed, not asserted: one op is thousands of
    // calls (each a FUSE round trip), and a loaded machine may finish none
    // in 5 s.
    let ops = text
        .lines()
        .find_map(|l| l.split("] xattr").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(ops.is_some(), "no xattr metrics line: {text}");
    eprintln!("stress-ng xattr bogo ops in 5 s: {}", ops.unwrap());
}

#[test]
fn ext4_image_xattrs_through_fuse() {
    if !fuse_ok("ext4_image_xattrs_through_fuse") {
        return;
    }
    let Some(mkfs) = ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
    else {
        eprintln!("SKIPPED: mkfs.ext4 not found");
        return;
    };
    // The source on tmpfs, which keeps user.* attributes.
    let src = PathBuf::from(format!(
        "/dev/shm/scalevfs-fuse-ext4x-{}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&src);
    fs::create_dir(&src).unwrap();
    let f = src.join("f");
    fs::write(&f, b"x").unwrap();
    set(&f, "user.small", b"in the inode", 0, false).unwrap();
    set(&f, "user.big", &[b'b'; 2000], 0, false).unwrap();
    set(&f, "trusted.t", b"T", 0, false).unwrap();
    let base = std::env::temp_dir().join(format!("scalevfs-fuse-ext4x-{}", std::process::id()));
    fs::create_dir_all(&base).unwrap();
    let img = base.join("img");
    let out = Command::new(mkfs)
        .args(["-q", "-F", "-b", "4096", "-d"])
        .arg(&src)
        .arg(&img)
        .arg("8M")
        .output()
        .unwrap();
    let _ = fs::remove_dir_all(&src);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ext4 = scalevfs_ext4::Ext4::open(&img, scalevfs_ext4::Ext4Options::default()).unwrap();
    let vfs = Vfs::with_root_fs(scalevfs::VfsConfig::default(), ext4);
    let mnt = base.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let cfg = MountConfig {
        fuse: FuseConfig::default(),
        options: vec!["ro".into()],
        threads: 2,
    };
    let m = spawn_mount(vfs, &mnt, &cfg).expect("mount");
    let mf = mnt.join("f");
    let got = (
        list(&mf, 1000),
        get(&mf, "user.small", 100, false),
        get(&mf, "user.big", 0, false),
        get(&mf, "trusted.t", 10, false),
        get(&mf, "user.none", 10, false),
        set(&mf, "user.new", b"1", 0, false),
    );
    let _ = m.unmount();
    let _ = fs::remove_dir_all(&base);
    assert_eq!(got.0, Ok("trusted.t,user.big,user.small".to_string()));
    assert_eq!(got.1, Ok("in the inode".to_string()));
    assert_eq!(got.2, Ok("len 2000".to_string()));
    assert_eq!(got.3, Ok("T".to_string()));
    assert_eq!(got.4, Err(libc::ENODATA));
    assert_eq!(got.5, Err(libc::EROFS));
}
