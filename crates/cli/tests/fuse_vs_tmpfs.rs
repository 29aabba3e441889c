//! Behaviours of `scalevfs mount` (memfs and the ext4 type) checked
//! against Linux's own tmpfs / ext4 (on /dev/shm or a loop-mounted ext4,
//! stated in each test): a description's O_APPEND is the caller's (mmap
//! writeback, F_SETFL and RWF_NOAPPEND write at their offsets), a
//! whiteout mknod needs no privilege, ext4 times are clamped to what its
//! inodes hold, protected_hardlinks holds without default_permissions,
//! and the smallest time round-trips. From a review (stop 39); each test
//! failed before.
//!
//! Needs /dev/fuse and root (the tests mount with the binary and switch to
//! uid 65534 in forked children); skipped with a printed reason otherwise.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn usable() -> Option<String> {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_err()
    {
        return Some("/dev/fuse cannot be opened".into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root".into());
    }
    None
}

macro_rules! require {
    () => {
        if let Some(why) = usable() {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
}

/// A scratch directory, removed on drop (declared before the mount, so
/// dropped after it).
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let d = PathBuf::from(format!(
        "/tmp/fuse-vs-tmpfs-t-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

fn is_mounted(dir: &Path) -> bool {
    Command::new("mountpoint")
        .arg("-q")
        .arg(dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A `scalevfs mount --foreground` child; unmounted on drop.
struct Mount {
    child: Option<Child>,
    dir: PathBuf,
}

impl Mount {
    fn new(dir: &Path, image: Option<&Path>, opts: &str) -> Mount {
        std::fs::create_dir_all(dir).unwrap();
        let mut c = Command::new(env!("CARGO_BIN_EXE_scalevfs"));
        c.arg("mount").arg(dir).arg("--foreground");
        if let Some(img) = image {
            c.arg("--image").arg(img);
        }
        if !opts.is_empty() {
            c.arg("-o").arg(opts);
        }
        let mut child = c
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !is_mounted(dir) {
            assert!(child.try_wait().unwrap().is_none(), "scalevfs mount exited");
            assert!(Instant::now() < deadline, "no mount after 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Mount {
            child: Some(child),
            dir: dir.to_path_buf(),
        }
    }

    fn unmount(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Another test's child (a daemon or a helper spawned while a
            // descriptor of ours was open: `libc::open` here has no
            // O_CLOEXEC) can hold a file of this mount for a while, and
            // the unmount is EBUSY meanwhile. Retry, then detach lazily:
            // killing the daemon of a busy mount left it behind, dead.
            let unmount = |lazy: bool| {
                let mut c = Command::new("fusermount3");
                c.arg("-u");
                if lazy {
                    c.arg("-z");
                }
                c.arg(&self.dir)
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while !unmount(false) {
                if Instant::now() > deadline {
                    if !unmount(true) {
                        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
                    }
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while c.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    let _ = c.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.unmount();
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Run `f` in a forked child as uid/gid 65534 (no groups); its result
/// (0 or an errno) is the child's exit status.
fn as_nobody(f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only makes system calls and exits.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0);
        if pid == 0 {
            let r = if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                255
            } else {
                f()
            };
            libc::_exit(r);
        }
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
        assert!(libc::WIFEXITED(st), "child died: {st:#x}");
        libc::WEXITSTATUS(st)
    }
}

fn ext4_image(dir: &Path) -> PathBuf {
    let img = dir.join("img");
    let ok = Command::new(env!("CARGO_BIN_EXE_scalevfs"))
        .args(["mkfs", "-q", "--size", "64M"])
        .arg(&img)
        .status()
        .unwrap()
        .success();
    assert!(ok, "scalevfs mkfs");
    img
}

/// The writeback of a shared mapping of a file opened O_RDWR|O_APPEND:
/// the page goes back to its own offset (tmpfs and ext4: size 8192, the
/// first byte 'X'). The mount opens its daemon-side fd with O_APPEND too,
/// so the kernel's WRITE of page 0 is appended at the end of the file:
/// size 16384, page 0 unchanged (silent corruption).
fn mmap_append_case(root: &Path) -> (u64, u8, u8) {
    let p = root.join("mm");
    let c = cpath(&p);
    // SAFETY: plain system calls on a file we own; the mapping is ours.
    unsafe {
        let fd = libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_APPEND | libc::O_CREAT,
            0o644,
        );
        assert!(fd >= 0);
        let buf = vec![b'a'; 8192];
        assert_eq!(libc::write(fd, buf.as_ptr().cast(), 8192), 8192);
        let m = libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        assert_ne!(m, libc::MAP_FAILED);
        let m = m.cast::<u8>();
        *m = b'X';
        *m.add(4096) = b'Y';
        assert_eq!(libc::msync(m.cast(), 8192, libc::MS_SYNC), 0);
        libc::munmap(m.cast(), 8192);
        libc::close(fd);
    }
    let data = std::fs::read(&p).unwrap();
    (data.len() as u64, data[0], data[4096])
}

#[test]
fn mmap_writeback_of_an_append_fd_lands_at_the_page_offset_memfs() {
    require!();
    let d = scratch("mmapapp");
    if Path::new("/dev/shm").is_dir() {
        let shm = PathBuf::from(format!("/dev/shm/fuse-vs-tmpfs-t-{}", std::process::id()));
        std::fs::create_dir_all(&shm).unwrap();
        assert_eq!(mmap_append_case(&shm), (8192, b'X', b'Y'), "tmpfs referee");
        std::fs::remove_dir_all(&shm).unwrap();
    }
    let m = Mount::new(&d.join("mnt"), None, "");
    assert_eq!(
        mmap_append_case(&m.dir),
        (8192, b'X', b'Y'),
        "(size, byte 0, byte 4096) after msync of a MAP_SHARED map of an O_APPEND fd"
    );
}

#[test]
fn mmap_writeback_of_an_append_fd_lands_at_the_page_offset_ext4() {
    require!();
    let d = scratch("mmapapp4");
    let img = ext4_image(&d);
    let m = Mount::new(&d.join("mnt"), Some(&img), "");
    assert_eq!(
        mmap_append_case(&m.dir),
        (8192, b'X', b'Y'),
        "(size, byte 0, byte 4096) after msync of a MAP_SHARED map of an O_APPEND fd"
    );
}

/// Linux (5.8+) lets any user who may create in a directory make a
/// whiteout (mknod S_IFCHR with device 0:0; vfs_mknod exempts it from
/// CAP_MKNOD), as fuse-overlayfs does unprivileged. tmpfs: 0. The mount:
/// EPERM (the core's mknodat refuses every device node to non-root),
/// while renameat2(RENAME_WHITEOUT) by the same user works.
/// chown(f, -1, -1) by root of set-id files: Linux's chown_common sets
/// ATTR_KILL_SUID|ATTR_KILL_SGID for a non-directory, so tmpfs turns 06755
/// into 0755 and 07777 into 01777 (checked on /dev/shm here); the mount
/// kept the bits (the kernel sends a SETATTR with the ctime alone).
#[test]
fn chown_to_minus_one_clears_setid_bits() {
    require!();
    let d = scratch("chownm1");
    let m = Mount::new(&d.join("mnt"), None, "");
    let shm = d.join("shm-ref");
    let host = std::path::PathBuf::from(format!(
        "/dev/shm/fuse-vs-tmpfs-chown-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&host);
    std::fs::create_dir_all(&host).unwrap();
    let case = |root: &Path| -> Vec<u32> {
        let mut out = Vec::new();
        for (name, mode) in [("a", 0o6755), ("b", 0o7777), ("c", 0o2745)] {
            let p = root.join(name);
            std::fs::write(&p, b"x").unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .unwrap();
            let c = cpath(&p);
            // SAFETY: a system call on a C string.
            assert_eq!(unsafe { libc::chown(c.as_ptr(), u32::MAX, u32::MAX) }, 0);
            out.push(std::fs::metadata(&p).unwrap().mode() & 0o7777);
        }
        out
    };
    let theirs = case(&host);
    let _ = std::fs::remove_dir_all(&host);
    let _ = shm;
    assert_eq!(theirs, [0o755, 0o1777, 0o2745], "tmpfs");
    assert_eq!(case(&m.dir), theirs, "the mount");
}

#[test]
fn unprivileged_whiteout_mknod_is_allowed() {
    require!();
    let d = scratch("whiteout");
    let m = Mount::new(&d.join("mnt"), None, "allow_other");
    std::fs::set_permissions(&m.dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let wh = cpath(&m.dir.join("wh"));
    let r = as_nobody(|| {
        // SAFETY: a system call on a C string.
        if unsafe { libc::mknod(wh.as_ptr(), libc::S_IFCHR | 0o600, 0) } == 0 {
            0
        } else {
            errno()
        }
    });
    assert_eq!(r, 0, "mknod(S_IFCHR, 0:0) as uid 65534: errno {r}");
    let st = std::fs::symlink_metadata(m.dir.join("wh")).unwrap();
    assert_eq!(st.mode() & libc::S_IFMT, libc::S_IFCHR);
    assert_eq!(st.rdev(), 0);
    assert_eq!(st.uid(), 65534);
}

/// The ext4 type keeps inode times outside what its inodes can hold: the
/// kernel's ext4 clamps them (s_time_min/s_time_max: with 256-byte inodes
/// [-2^31, 15032385535], year 2446) and shows and stores the clamped
/// value. The mount shows the value asked for, and after a remount a
/// different, wrapped one (2^40 -> 0; 2500-01-01 -> 1955; -3e9 -> 2419).
#[test]
fn ext4_times_are_clamped_to_what_the_inode_holds() {
    require!();
    let d = scratch("ext4time");
    let img = ext4_image(&d);
    let mnt = d.join("mnt");
    // (asked, what the kernel's ext4 shows and keeps)
    let cases: [(i64, i64); 3] = [
        (1 << 40, 15_032_385_535),
        (16_725_225_600, 15_032_385_535),
        (-3_000_000_000, -2_147_483_648),
    ];
    let mut m = Mount::new(&mnt, Some(&img), "");
    for (i, &(asked, _)) in cases.iter().enumerate() {
        let p = mnt.join(format!("f{i}"));
        std::fs::write(&p, b"x").unwrap();
        let c = cpath(&p);
        let ts = [
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
            libc::timespec {
                tv_sec: asked,
                tv_nsec: 0,
            },
        ];
        // SAFETY: a system call on a C string and a two-element array.
        let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) };
        assert_eq!(r, 0);
    }
    let seen = |when: &str| {
        for (i, &(asked, want)) in cases.iter().enumerate() {
            let got = std::fs::metadata(mnt.join(format!("f{i}")))
                .unwrap()
                .mtime();
            assert_eq!(got, want, "{when}: mtime set to {asked}");
        }
    };
    seen("mounted");
    m.unmount();
    let _m = Mount::new(&mnt, Some(&img), "");
    seen("after a remount");
}

/// With `no_default_permissions` "every check is scalevfs's", but
/// fs.protected_hardlinks (may_linkat: a user may hard-link only files
/// they own or may read and write) is then skipped: the kernel's check
/// asks inode_permission, which FUSE answers "yes" without
/// default_permissions, and the core has no such rule. tmpfs and the
/// default mount: EPERM; here: the link is made.
#[test]
fn protected_hardlinks_hold_with_no_default_permissions() {
    require!();
    if std::fs::read_to_string("/proc/sys/fs/protected_hardlinks")
        .map(|s| s.trim() != "1")
        .unwrap_or(true)
    {
        eprintln!("SKIPPED: fs.protected_hardlinks is not 1");
        return;
    }
    let d = scratch("hardlinks");
    let m = Mount::new(&d.join("mnt"), None, "allow_other,no_default_permissions");
    std::fs::set_permissions(&m.dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let src = m.dir.join("rootfile");
    std::fs::write(&src, b"secret-ish").unwrap();
    std::fs::set_permissions(&src, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let (a, b) = (cpath(&src), cpath(&m.dir.join("hl")));
    let r = as_nobody(|| {
        // SAFETY: a system call on C strings.
        if unsafe { libc::link(a.as_ptr(), b.as_ptr()) } == 0 {
            0
        } else {
            errno()
        }
    });
    assert_eq!(r, libc::EPERM, "link() of root's 0644 file by uid 65534");
}

/// utimensat to the smallest time (i64::MIN seconds): tmpfs shows
/// -9223372036854775808; the mount -9223372036854775807 (attr.rs
/// `timespec`: -(i64::MAX) for a duration of 2^63 s).
#[test]
fn the_smallest_time_round_trips() {
    require!();
    let d = scratch("mintime");
    let m = Mount::new(&d.join("mnt"), None, "");
    let p = m.dir.join("f");
    std::fs::write(&p, b"x").unwrap();
    set_mtime(&p, i64::MIN, 0);
    assert_eq!(std::fs::metadata(&p).unwrap().mtime(), i64::MIN);
}

/// Set `p`'s mtime to (`sec`, `nsec`) with utimensat (atime omitted).
fn set_mtime(p: &Path, sec: i64, nsec: i64) {
    let c = cpath(p);
    let ts = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
    ];
    // SAFETY: a system call on a C string and a two-element array.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) };
    assert_eq!(r, 0, "utimensat({sec}, {nsec}): errno {}", errno());
}

/// Times before 1970 with nanoseconds (-1.5 s is (-2, 500000000)) come
/// back as set, as on tmpfs: fuser 0.18 hands the daemon such a time a
/// second early, which the adapter undoes (`request_time`).
#[test]
fn times_before_1970_with_nanoseconds_round_trip() {
    require!();
    let d = scratch("pre1970");
    let m = Mount::new(&d.join("mnt"), None, "");
    let host = PathBuf::from(format!(
        "/dev/shm/fuse-vs-tmpfs-pre1970-{}",
        std::process::id()
    ));
    std::fs::write(&host, b"x").unwrap();
    let p = m.dir.join("f");
    std::fs::write(&p, b"x").unwrap();
    for (sec, nsec) in [
        (-2i64, 500_000_000i64),
        (-1, 1),
        (-3_000_000_000, 999_999_999),
    ] {
        set_mtime(&host, sec, nsec);
        set_mtime(&p, sec, nsec);
        let h = std::fs::metadata(&host).unwrap();
        let o = std::fs::metadata(&p).unwrap();
        assert_eq!((h.mtime(), h.mtime_nsec()), (sec, nsec), "tmpfs");
        assert_eq!((o.mtime(), o.mtime_nsec()), (sec, nsec), "the mount");
    }
    let _ = std::fs::remove_file(&host);
}

/// The same cause without mmap: the daemon's fd keeps the O_APPEND of the
/// open, but the kernel computes every write's offset itself and is not
/// told of later changes. fcntl(F_SETFL) clearing O_APPEND, then pwrite at
/// 0: tmpfs/ext4 "AB23456789"; the mount "0123456789AB". pwritev2 with
/// RWF_NOAPPEND (Linux 6.9+) on an O_APPEND fd, at 4: tmpfs "AB23CD6789";
/// the mount appends. A write-only (direct) open, O_APPEND cleared, write
/// at 0 after lseek(0): tmpfs "W123456789"; the mount "0123456789W".
fn append_flag_case(root: &Path) -> (String, String, String) {
    let p = root.join("ap");
    let c = cpath(&p);
    let read = || String::from_utf8(std::fs::read(&p).unwrap()).unwrap();
    // SAFETY: plain system calls on a file we own and local buffers.
    unsafe {
        let fd = libc::open(
            c.as_ptr(),
            libc::O_CREAT | libc::O_TRUNC | libc::O_RDWR | libc::O_APPEND,
            0o644,
        );
        assert!(fd >= 0);
        assert_eq!(libc::write(fd, b"0123456789".as_ptr().cast(), 10), 10);
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, 0), 0);
        assert_eq!(libc::pwrite(fd, b"AB".as_ptr().cast(), 2, 0), 2);
        let a = read();
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, libc::O_APPEND), 0);
        let iov = libc::iovec {
            iov_base: b"CD".as_ptr() as *mut _,
            iov_len: 2,
        };
        const RWF_NOAPPEND: i32 = 0x20;
        let r = libc::pwritev2(fd, &iov, 1, 4, RWF_NOAPPEND);
        let b = if r < 0 {
            format!("pwritev2: errno {}", errno())
        } else {
            read()
        };
        libc::close(fd);
        let fd = libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_TRUNC);
        assert_eq!(libc::write(fd, b"0123456789".as_ptr().cast(), 10), 10);
        libc::close(fd);
        let fd = libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_APPEND);
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, 0), 0);
        libc::lseek(fd, 0, libc::SEEK_SET);
        assert_eq!(libc::write(fd, b"W".as_ptr().cast(), 1), 1);
        libc::close(fd);
        (a, b, read())
    }
}

fn append_flag_expected() -> (String, String, String) {
    (
        "AB23456789".into(),
        "AB23CD6789".into(),
        "W123456789".into(),
    )
}

#[test]
fn cleared_append_flag_and_rwf_noappend_write_in_place_memfs() {
    require!();
    let d = scratch("appflag");
    let shm = PathBuf::from(format!(
        "/dev/shm/fuse-vs-tmpfs-t-app-{}",
        std::process::id()
    ));
    if std::fs::create_dir_all(&shm).is_ok() {
        assert_eq!(
            append_flag_case(&shm),
            append_flag_expected(),
            "tmpfs referee"
        );
        let _ = std::fs::remove_dir_all(&shm);
    }
    let m = Mount::new(&d.join("mnt"), None, "");
    assert_eq!(append_flag_case(&m.dir), append_flag_expected());
}

#[test]
fn cleared_append_flag_and_rwf_noappend_write_in_place_ext4() {
    require!();
    let d = scratch("appflag4");
    let img = ext4_image(&d);
    let m = Mount::new(&d.join("mnt"), Some(&img), "");
    assert_eq!(append_flag_case(&m.dir), append_flag_expected());
}

/// copy_file_range into a file opened O_APPEND whose O_APPEND was then
/// cleared with fcntl(F_SETFL): the kernel allows it (the file is no
/// longer append-only) and tmpfs copies (10 bytes, "SSSSSSSSSSTTTT...").
/// The mount: EBADF (the daemon's fd still has O_APPEND, which the core's
/// copy_file_range refuses).
#[test]
fn copy_file_range_after_clearing_append_copies() {
    require!();
    let d = scratch("cfrapp");
    let m = Mount::new(&d.join("mnt"), None, "");
    let (s, t) = (m.dir.join("s"), m.dir.join("t"));
    std::fs::write(&s, [b'S'; 100]).unwrap();
    std::fs::write(&t, [b'T'; 100]).unwrap();
    let (cs, ct) = (cpath(&s), cpath(&t));
    // SAFETY: plain system calls on files we own.
    let r = unsafe {
        let a = libc::open(cs.as_ptr(), libc::O_RDONLY);
        let b = libc::open(ct.as_ptr(), libc::O_RDWR | libc::O_APPEND);
        assert!(a >= 0 && b >= 0);
        assert_eq!(libc::fcntl(b, libc::F_SETFL, 0), 0);
        let (mut oi, mut oo) = (0i64, 0i64);
        let r = libc::copy_file_range(a, &mut oi, b, &mut oo, 10, 0);
        let r = if r < 0 { -i64::from(errno()) } else { r as i64 };
        libc::close(a);
        libc::close(b);
        r
    };
    assert_eq!(r, 10, "copy_file_range result (negative: errno)");
    let got = std::fs::read(&t).unwrap();
    assert_eq!(&got[..12], b"SSSSSSSSSSTT");
}
