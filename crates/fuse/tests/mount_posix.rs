//! The FUSE front end end to end: mount a memfs in-process and use it with
//! std and libc, as any program would.
//!
//! Without /dev/fuse (or, as non-root, without fusermount3) each test
//! prints why it is skipped and passes; with `SCALEVFS_REQUIRE_FUSE=1` that
//! is a failure instead (CI sets it).

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use scalevfs::{Cred, Vfs, O_CREAT, O_WRONLY};
use scalevfs_fuse::{spawn_mount, FuseConfig, MountConfig};

mod common;
use common::*;

fn renameat2(a: &Path, b: &Path, flags: u32) -> i32 {
    let (a, b) = (cpath(a), cpath(b));
    // SAFETY: valid NUL-terminated paths; AT_FDCWD dirfds.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

#[test]
fn files_directories_links_and_errors() {
    if !fuse_ok("files_directories_links_and_errors") {
        return;
    }
    let m = Mounted::new("posix", FuseConfig::default());
    // Create, write, read back.
    fs::write(m.p("a"), b"hello world").unwrap();
    assert_eq!(fs::read(m.p("a")).unwrap(), b"hello world");
    let md = fs::metadata(m.p("a")).unwrap();
    assert_eq!(md.len(), 11);
    assert!(md.is_file());
    // O_EXCL.
    let e = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.p("a"))
        .unwrap_err();
    assert_eq!(errno_of(&e), libc::EEXIST);
    // Directories.
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/f"), b"x").unwrap();
    assert_eq!(
        errno_of(&fs::remove_dir(m.p("d")).unwrap_err()),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno_of(&fs::metadata(m.p("nope")).unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(
        errno_of(&fs::remove_file(m.p("d")).unwrap_err()),
        libc::EISDIR
    );
    // Hard and symbolic links share / name the inode.
    fs::hard_link(m.p("a"), m.p("d/hard")).unwrap();
    assert_eq!(fs::metadata(m.p("a")).unwrap().nlink(), 2);
    assert_eq!(
        fs::metadata(m.p("a")).unwrap().ino(),
        fs::metadata(m.p("d/hard")).unwrap().ino()
    );
    std::os::unix::fs::symlink("a", m.p("s")).unwrap();
    assert_eq!(fs::read_link(m.p("s")).unwrap(), Path::new("a"));
    assert_eq!(fs::read(m.p("s")).unwrap(), b"hello world");
    // Rename, with RENAME_NOREPLACE and RENAME_EXCHANGE.
    fs::write(m.p("b"), b"bee").unwrap();
    assert_eq!(
        renameat2(&m.p("a"), &m.p("b"), libc::RENAME_NOREPLACE),
        libc::EEXIST
    );
    assert_eq!(renameat2(&m.p("a"), &m.p("b"), libc::RENAME_EXCHANGE), 0);
    assert_eq!(fs::read(m.p("a")).unwrap(), b"bee");
    assert_eq!(fs::read(m.p("b")).unwrap(), b"hello world");
    fs::rename(m.p("b"), m.p("d/b2")).unwrap();
    assert!(!m.p("b").exists());
    // readdir sees everything, with the right types.
    let mut names: Vec<_> = fs::read_dir(m.p("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["b2", "f", "hard"]);
    // chmod, chown, truncate, utimens.
    fs::set_permissions(m.p("a"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(m.p("a")).unwrap().mode() & 0o7777, 0o640);
    std::os::unix::fs::chown(m.p("a"), Some(65534), Some(65534)).unwrap();
    let md = fs::metadata(m.p("a")).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 65534));
    fs::OpenOptions::new()
        .write(true)
        .open(m.p("d/b2"))
        .unwrap()
        .set_len(3)
        .unwrap();
    assert_eq!(fs::read(m.p("d/b2")).unwrap(), b"hel");
    let f = fs::File::open(m.p("d/f")).unwrap();
    let t = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    f.set_times(fs::FileTimes::new().set_modified(t)).unwrap();
    assert_eq!(fs::metadata(m.p("d/f")).unwrap().mtime(), 1_000_000_000);
    // Unlink; the name is gone.
    fs::remove_file(m.p("d/hard")).unwrap();
    assert_eq!(fs::metadata(m.p("d/b2")).unwrap().nlink(), 1);
    // statfs answers.
    let c = cpath(&m.dir);
    // SAFETY: statvfs is plain data; the path is valid.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
    assert!(sv.f_namemax >= 255);
}

#[test]
fn seek_data_hole_and_fallocate() {
    if !fuse_ok("seek_data_hole_and_fallocate") {
        return;
    }
    let m = Mounted::new("seek", FuseConfig::default());
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("sparse"))
        .unwrap();
    f.seek(SeekFrom::Start(1 << 20)).unwrap();
    f.write_all(b"data").unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: lseek on an fd we own.
    let data = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    assert!(data > 0 && data <= 1 << 20, "SEEK_DATA gave {data}");
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_HOLE) };
    assert_eq!(hole, 0);
    // SAFETY: fallocate on an fd we own.
    assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 3 << 20) }, 0);
    assert_eq!(f.metadata().unwrap().len(), 3 << 20);
    let mut buf = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut buf).unwrap();
    assert_eq!(buf.len(), 3 << 20);
    assert_eq!(&buf[1 << 20..(1 << 20) + 4], b"data");
}

#[test]
fn lookup_counts_return_to_the_root() {
    if !fuse_ok("lookup_counts_return_to_the_root") {
        return;
    }
    let m = Mounted::new("forget", FuseConfig::default());
    fs::create_dir(m.p("d")).unwrap();
    for i in 0..200 {
        fs::write(m.p(&format!("d/f{i}")), b"x").unwrap();
        fs::metadata(m.p(&format!("d/f{i}"))).unwrap();
        fs::hard_link(m.p(&format!("d/f{i}")), m.p(&format!("d/l{i}"))).unwrap();
    }
    let _ = fs::read_dir(m.p("d")).unwrap().count();
    assert!(m.mount().live_nodes() >= 200);
    for i in 0..200 {
        fs::remove_file(m.p(&format!("d/f{i}"))).unwrap();
        fs::remove_file(m.p(&format!("d/l{i}"))).unwrap();
    }
    fs::remove_dir(m.p("d")).unwrap();
    // The kernel forgets each inode once its last link and use are gone;
    // FORGET is asynchronous.
    let deadline = Instant::now() + Duration::from_secs(10);
    while m.mount().live_nodes() > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(m.mount().live_nodes(), 1, "only the root should be left");
}

#[test]
fn library_changes_are_invalidated_in_the_kernel() {
    if !fuse_ok("library_changes_are_invalidated_in_the_kernel") {
        return;
    }
    let long = Duration::from_secs(3600);
    let cfg = FuseConfig {
        attr_timeout: long,
        entry_timeout: long,
        negative_timeout: long,
        readdirplus: true,
        ..FuseConfig::default()
    };
    let m = Mounted::new("inval", cfg);
    // A quiet task: its changes are not reported automatically, so the
    // kernel learns of them only through the manual `Invalidator`.
    let mut t = m.vfs.task(Cred::root());
    t.set_quiet_changes(true);
    // A negative entry, then a file created behind the kernel's back.
    assert!(fs::metadata(m.p("x")).is_err());
    let fd = t.open("/x", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.write(fd, b"12345").unwrap();
    t.close(fd).unwrap();
    assert!(
        fs::metadata(m.p("x")).is_err(),
        "the kernel still has its negative entry"
    );
    let inv = m.mount().invalidator();
    inv.changed(&t, b"/x").unwrap();
    assert_eq!(fs::read(m.p("x")).unwrap(), b"12345");
    // Attributes and cached data of a known inode.
    let fd = t.open("/x", O_WRONLY, 0).unwrap();
    t.pwrite(fd, b"abcdefgh", 0).unwrap();
    t.close(fd).unwrap();
    t.chmod("/x", 0o600).unwrap();
    inv.changed(&t, b"/x").unwrap();
    let md = fs::metadata(m.p("x")).unwrap();
    assert_eq!((md.len(), md.mode() & 0o777), (8, 0o600));
    assert_eq!(fs::read(m.p("x")).unwrap(), b"abcdefgh");
    // Removal behind the kernel's back.
    t.unlink("/x").unwrap();
    inv.changed(&t, b"/x").unwrap();
    assert_eq!(errno_of(&fs::metadata(m.p("x")).unwrap_err()), libc::ENOENT);
}

/// Changes made through the library by an ordinary task reach the kernel
/// without any call by the embedder: names (negative entries included),
/// attributes and cached data, with every timeout long.
#[test]
fn library_changes_reach_the_kernel_automatically() {
    if !fuse_ok("library_changes_reach_the_kernel_automatically") {
        return;
    }
    let long = Duration::from_secs(60);
    let cfg = FuseConfig {
        attr_timeout: long,
        entry_timeout: long,
        negative_timeout: long,
        readdirplus: true,
        ..FuseConfig::default()
    };
    let mut m = Mounted::new("autoinval", cfg);
    let t = m.vfs.task(Cred::root());
    let enoent = |p: &Path| {
        let r = fs::symlink_metadata(p);
        assert_eq!(
            r.as_ref().map_err(errno_of).err(),
            Some(libc::ENOENT),
            "{}: {r:?}",
            p.display()
        );
    };
    // A negatively cached name, then created behind the kernel's back.
    enoent(&m.p("x"));
    let fd = t.open("/x", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.write(fd, b"12345").unwrap();
    t.close(fd).unwrap();
    assert_eq!(fs::read(m.p("x")).unwrap(), b"12345");
    // Attributes the kernel has cached.
    let md = fs::metadata(m.p("x")).unwrap();
    assert_eq!((md.len(), md.mode() & 0o777), (5, 0o644));
    t.chmod("/x", 0o600).unwrap();
    assert_eq!(fs::metadata(m.p("x")).unwrap().mode() & 0o777, 0o600);
    t.chown("/x", 1234, 5678).unwrap();
    let md = fs::metadata(m.p("x")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    let when = scalevfs::Timespec {
        sec: 1_000_000_000,
        nsec: 5,
    };
    t.utimensat(scalevfs::AT_FDCWD, "/x", Some([when, when]), 0)
        .unwrap();
    let md = fs::metadata(m.p("x")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000_000, 5));
    // Size and cached data (the page cache is kept across opens).
    let fd = t.open("/x", O_WRONLY, 0).unwrap();
    t.pwrite(fd, b"abcdefgh", 0).unwrap();
    assert_eq!(fs::metadata(m.p("x")).unwrap().len(), 8);
    assert_eq!(fs::read(m.p("x")).unwrap(), b"abcdefgh");
    t.ftruncate(fd, 3).unwrap();
    t.close(fd).unwrap();
    assert_eq!(fs::metadata(m.p("x")).unwrap().len(), 3);
    assert_eq!(fs::read(m.p("x")).unwrap(), b"abc");
    t.truncate("/x", 2).unwrap();
    assert_eq!(fs::read(m.p("x")).unwrap(), b"ab");
    let fd = t.open("/x", O_WRONLY | scalevfs::O_TRUNC, 0).unwrap();
    t.close(fd).unwrap();
    assert_eq!(fs::metadata(m.p("x")).unwrap().len(), 0);
    // An open file in the mount sees library writes (no stale pages).
    let mut f = fs::File::open(m.p("x")).unwrap();
    let fd = t.open("/x", O_WRONLY, 0).unwrap();
    t.write(fd, b"fresh").unwrap();
    t.close(fd).unwrap();
    let mut got = String::new();
    f.read_to_string(&mut got).unwrap();
    assert_eq!(got, "fresh");
    drop(f);
    // Rename into a directory the kernel knows; both names change.
    t.mkdir("/d", 0o755).unwrap();
    assert!(fs::metadata(m.p("d")).unwrap().is_dir());
    enoent(&m.p("d/y"));
    t.rename("/x", "/d/y").unwrap();
    enoent(&m.p("x"));
    assert_eq!(fs::read(m.p("d/y")).unwrap(), b"fresh");
    // Link and unlink change the link count of the inode as well.
    assert_eq!(fs::metadata(m.p("d/y")).unwrap().nlink(), 1);
    t.link("/d/y", "/z").unwrap();
    assert_eq!(fs::metadata(m.p("d/y")).unwrap().nlink(), 2);
    assert_eq!(fs::read(m.p("z")).unwrap(), b"fresh");
    t.unlink("/d/y").unwrap();
    enoent(&m.p("d/y"));
    assert_eq!(fs::metadata(m.p("z")).unwrap().nlink(), 1);
    // Exchange: both names now lead to the other inode.
    let fd = t.open("/w", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.write(fd, b"other").unwrap();
    t.close(fd).unwrap();
    assert_eq!(fs::read(m.p("w")).unwrap(), b"other");
    t.renameat2(
        scalevfs::AT_FDCWD,
        "/w",
        scalevfs::AT_FDCWD,
        "/z",
        scalevfs::RENAME_EXCHANGE,
    )
    .unwrap();
    assert_eq!(fs::read(m.p("w")).unwrap(), b"fresh");
    assert_eq!(fs::read(m.p("z")).unwrap(), b"other");
    // Directories: mkdir of a negatively cached name, rmdir.
    enoent(&m.p("e"));
    t.mkdir("/e", 0o755).unwrap();
    assert!(fs::metadata(m.p("e")).unwrap().is_dir());
    let nlink = fs::metadata(&m.dir).unwrap().nlink();
    t.rmdir("/e").unwrap();
    enoent(&m.p("e"));
    assert_eq!(fs::metadata(&m.dir).unwrap().nlink(), nlink - 1);
    // Symlinks.
    enoent(&m.p("s"));
    t.symlink("w", "/s").unwrap();
    assert_eq!(fs::read_link(m.p("s")).unwrap(), Path::new("w"));
    // Changes through the mount (the adapter's own, quiet tasks) still
    // work while library changes are being reported from another thread.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worker = {
        let stop = stop.clone();
        let t = m.vfs.task(Cred::root());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let fd = t.open("/busy", O_CREAT | O_WRONLY, 0o644).unwrap();
                t.write(fd, &n.to_le_bytes()).unwrap();
                t.close(fd).unwrap();
                t.rename("/busy", "/busy2").unwrap();
                t.unlink("/busy2").unwrap();
                n += 1;
            }
            n
        })
    };
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut i = 0;
    while Instant::now() < deadline {
        let p = m.p(&format!("m{i}"));
        fs::write(&p, b"through the mount").unwrap();
        let _ = fs::metadata(m.p("busy"));
        fs::rename(&p, m.p("mm")).unwrap();
        fs::remove_file(m.p("mm")).unwrap();
        i += 1;
    }
    stop.store(true, Ordering::Relaxed);
    assert!(worker.join().unwrap() > 0);
    enoent(&m.p("busy"));
    enoent(&m.p("busy2"));
    // After unmounting, library changes no longer go to the kernel (and do
    // not fail).
    m.m.take().unwrap().unmount().unwrap();
    t.mkdir("/after", 0o755).unwrap();
    t.unlink("/s").unwrap();
}

#[test]
fn concurrent_clients() {
    if !fuse_ok("concurrent_clients") {
        return;
    }
    let m = Mounted::new("mt", FuseConfig::default());
    fs::create_dir(m.p("shared")).unwrap();
    std::thread::scope(|s| {
        for k in 0..8 {
            let m = &m;
            s.spawn(move || {
                let own = m.p(&format!("t{k}"));
                fs::create_dir(&own).unwrap();
                for i in 0..100 {
                    let f = own.join(format!("f{i}"));
                    fs::write(&f, format!("{k}-{i}")).unwrap();
                    assert_eq!(fs::read_to_string(&f).unwrap(), format!("{k}-{i}"));
                    let g = m.p(&format!("shared/{k}-{i}"));
                    fs::rename(&f, &g).unwrap();
                    fs::remove_file(&g).unwrap();
                }
                fs::remove_dir(&own).unwrap();
            });
        }
    });
    assert_eq!(fs::read_dir(m.p("shared")).unwrap().count(), 0);
}

/// A running program's file is "text busy": every open that would change it
/// fails with ETXTBSY and leaves it intact. Through FUSE with
/// FUSE_ATOMIC_O_TRUNC the O_RDONLY|O_TRUNC case used to reach the daemon
/// (which truncated the file) before the kernel's own check failed the call,
/// so the program lost its text and crashed — the pjdfstest `etxtbsy` flake.
#[test]
fn running_program_is_text_busy_and_survives() {
    if !fuse_ok("running_program_is_text_busy_and_survives") {
        return;
    }
    let Ok(sleep) = fs::read("/bin/sleep") else {
        eprintln!("SKIPPED running_program_is_text_busy_and_survives: no /bin/sleep");
        return;
    };
    let m = Mounted::new("etxtbsy", FuseConfig::default());
    let prog = m.p("sleeper");
    fs::write(&prog, &sleep).unwrap();
    fs::set_permissions(&prog, fs::Permissions::from_mode(0o755)).unwrap();
    let mut child = std::process::Command::new(&prog).arg("30").spawn().unwrap();
    // The exec has finished once /proc shows the program as the child's exe.
    let deadline = Instant::now() + Duration::from_secs(20);
    while fs::read_link(format!("/proc/{}/exe", child.id())).ok() != Some(prog.clone()) {
        assert!(Instant::now() < deadline, "the program never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    let c = cpath(&prog);
    for (flags, what) in [
        (libc::O_WRONLY, "O_WRONLY"),
        (libc::O_RDWR, "O_RDWR"),
        (libc::O_RDONLY | libc::O_TRUNC, "O_RDONLY|O_TRUNC"),
    ] {
        // SAFETY: open with a valid C string; a returned fd is closed.
        let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
        let err = std::io::Error::last_os_error();
        if fd >= 0 {
            // SAFETY: closing the fd we just got.
            unsafe { libc::close(fd) };
        }
        assert_eq!(fd, -1, "{what} of a running program succeeded");
        assert_eq!(errno_of(&err), libc::ETXTBSY, "{what}");
    }
    // SAFETY: truncate with a valid C string.
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), 1) }, -1);
    assert_eq!(errno_of(&std::io::Error::last_os_error()), libc::ETXTBSY);
    // Nothing was lost, and the program still runs.
    assert_eq!(
        fs::read(&prog).unwrap(),
        sleep,
        "the program's text changed"
    );
    assert!(child.try_wait().unwrap().is_none(), "the program died");
    child.kill().unwrap();
    child.wait().unwrap();
    // Once it is gone the file can be written again.
    fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&prog)
        .unwrap();
    assert_eq!(fs::metadata(&prog).unwrap().len(), 0);
}

/// `-o noatime` (xfstests generic/120): FUSE leaves atime to the
/// filesystem, so the option must reach the core; without it, relatime
/// updates an atime older than the mtime on read.
#[test]
fn noatime_option_reaches_the_core() {
    if !fuse_ok("noatime_option_reaches_the_core") {
        return;
    }
    for (noatime, options) in [
        (false, vec!["allow_other"]),
        (true, vec!["allow_other", "noatime"]),
    ] {
        let dir = scratch_dir("noatime");
        let vfs = Vfs::new();
        let cfg = MountConfig {
            fuse: FuseConfig::default(),
            options: options.iter().map(|s| s.to_string()).collect(),
            threads: 2,
        };
        let m = spawn_mount(vfs.clone(), &dir, &cfg).expect("mount");
        let f = dir.join("f");
        fs::write(&f, b"some data").unwrap();
        let t = vfs.root_task();
        let old = scalevfs::Timespec { sec: 1000, nsec: 0 };
        let newer = scalevfs::Timespec { sec: 2000, nsec: 0 };
        t.utimensat(scalevfs::AT_FDCWD, "/f", Some([old, newer]), 0)
            .unwrap();
        // A fresh open drops the kernel's page cache: the read reaches us.
        let mut buf = Vec::new();
        fs::File::open(&f).unwrap().read_to_end(&mut buf).unwrap();
        assert_eq!(buf, b"some data");
        let atime = t.stat("/f").unwrap().atime.sec;
        if noatime {
            assert_eq!(atime, 1000, "noatime mount updated atime");
        } else {
            assert!(atime > 2000, "relatime did not update atime ({atime})");
        }
        m.unmount().unwrap();
        let _ = fs::remove_dir(&dir);
    }
}

/// copy_file_range through the mount reaches scalevfs as one request and
/// keeps the core's checks (xfstests generic/553: a target made immutable
/// after it was opened is EPERM, which the kernel cannot see for a FUSE
/// inode).
#[test]
fn copy_file_range_through_the_mount() {
    if !fuse_ok("copy_file_range_through_the_mount") {
        return;
    }
    use std::os::fd::AsRawFd;
    let m = Mounted::new("cfr", FuseConfig::default());
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(m.p("src"), &data).unwrap();
    let src = fs::File::open(m.p("src")).unwrap();
    let dst = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("dst"))
        .unwrap();
    let (mut oi, mut oo) = (0i64, 0i64);
    let mut left = data.len();
    while left > 0 {
        // SAFETY: our fds; the offsets point at live locals.
        let n = unsafe {
            libc::copy_file_range(src.as_raw_fd(), &mut oi, dst.as_raw_fd(), &mut oo, left, 0)
        };
        assert!(
            n > 0,
            "copy_file_range: {}",
            std::io::Error::last_os_error()
        );
        left -= n as usize;
    }
    assert!(fs::read(m.p("dst")).unwrap() == data);
    // chattr +i on the open target, then copy: EPERM, nothing written.
    const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
    let immutable: libc::c_long = 0x10;
    // SAFETY: the ioctl reads a long from a live local.
    let r = unsafe { libc::ioctl(dst.as_raw_fd(), FS_IOC_SETFLAGS, &immutable) };
    assert_eq!(r, 0, "chattr +i: {}", std::io::Error::last_os_error());
    let (mut oi, mut oo) = (0i64, 0i64);
    // SAFETY: as above.
    let n =
        unsafe { libc::copy_file_range(src.as_raw_fd(), &mut oi, dst.as_raw_fd(), &mut oo, 10, 0) };
    assert_eq!(n, -1);
    assert_eq!(errno_of(&std::io::Error::last_os_error()), libc::EPERM);
    let none: libc::c_long = 0;
    // SAFETY: as above.
    let r = unsafe { libc::ioctl(dst.as_raw_fd(), FS_IOC_SETFLAGS, &none) };
    assert_eq!(r, 0);
}

/// chattr changes the ctime, which no FUSE reply carries: the daemon tells
/// the kernel to forget the attributes it cached, so `stat` right after
/// shows the new ctime even with a long attribute timeout (xfstests
/// generic/277: "ctime not updated after chattr").
#[test]
fn chattr_ctime_is_seen_at_once() {
    if !fuse_ok("chattr_ctime_is_seen_at_once") {
        return;
    }
    let long = Duration::from_secs(3600);
    let cfg = FuseConfig {
        attr_timeout: long,
        entry_timeout: long,
        ..FuseConfig::default()
    };
    let m = Mounted::new("chattr-ctime", cfg);
    fs::write(m.p("f"), b"x").unwrap();
    let before = fs::metadata(m.p("f")).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let f = fs::File::open(m.p("f")).unwrap();
    const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
    let nodump: libc::c_long = 0x40;
    // SAFETY: the ioctl reads a long from a live local.
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            FS_IOC_SETFLAGS,
            &nodump,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let after = fs::metadata(m.p("f")).unwrap();
    assert!(
        (after.ctime(), after.ctime_nsec()) > (before.ctime(), before.ctime_nsec()),
        "ctime not updated after chattr: {} {} -> {} {}",
        before.ctime(),
        before.ctime_nsec(),
        after.ctime(),
        after.ctime_nsec()
    );
}

/// `utimensat` at the ends of the time range, through the mount and on the
/// host's tmpfs: the results must agree, and the daemon must live through
/// them (fuser's time conversion overflows on i64::MIN seconds with
/// non-zero nanoseconds; the kernel clamps before it sends).
#[test]
fn extreme_times_match_tmpfs() {
    if !fuse_ok("extreme_times_match_tmpfs") {
        return;
    }
    let m = Mounted::new("extreme-times", FuseConfig::default());
    let host = std::path::PathBuf::from(format!("/dev/shm/scalevfs-times-{}", std::process::id()));
    let _ = fs::remove_dir_all(&host);
    fs::create_dir(&host).unwrap();
    let set_and_read = |p: &Path, sec: i64, nsec: i64| -> (i32, i64, i64, i64, i64) {
        let c = cpath(p);
        let ts = [
            libc::timespec {
                tv_sec: sec,
                tv_nsec: nsec,
            },
            libc::timespec {
                tv_sec: sec,
                tv_nsec: nsec,
            },
        ];
        // SAFETY: a valid NUL-terminated path and two live timespecs.
        let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) };
        let e = if r == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
        };
        let md = fs::metadata(p).unwrap();
        (e, md.atime(), md.atime_nsec(), md.mtime(), md.mtime_nsec())
    };
    let cases = [
        (i64::MIN, 1),
        (i64::MIN, 999_999_999),
        (i64::MIN, 0),
        (i64::MIN + 1, 5),
        (-1, 500_000_000),
        (i64::MAX, 999_999_999),
        (i64::MAX - 1, 7),
    ];
    for (i, &(sec, nsec)) in cases.iter().enumerate() {
        let name = format!("f{i}");
        fs::write(m.p(&name), b"x").unwrap();
        fs::write(host.join(&name), b"x").unwrap();
        let ours = set_and_read(&m.p(&name), sec, nsec);
        let linux = set_and_read(&host.join(&name), sec, nsec);
        assert_eq!(ours, linux, "utimensat({sec} s, {nsec} ns)");
    }
    fs::remove_dir_all(&host).unwrap();
    // The daemon still answers.
    fs::write(m.p("after"), b"alive").unwrap();
    assert_eq!(fs::read(m.p("after")).unwrap(), b"alive");
}

/// errno of `f` (0 on success), through the mount and on the host's tmpfs.
fn errno_or_0(r: i64) -> i32 {
    if r < 0 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    } else {
        0
    }
}

/// `open(path, O_RDWR|O_WRONLY)` (access mode 3: read and write permission
/// checked, an fd for ioctls only) opens through the mount as on tmpfs; it
/// was EINVAL (the adapter reopens its node with the caller's flags, and
/// the core's reopen refused mode 3).
#[test]
fn access_mode_3_opens_as_on_tmpfs() {
    if !fuse_ok("access_mode_3_opens_as_on_tmpfs") {
        return;
    }
    let m = Mounted::new("accmode3", FuseConfig::default());
    let host = std::env::temp_dir().join(format!("scalevfs-accmode3-{}", std::process::id()));
    let host = if Path::new("/dev/shm").is_dir() {
        Path::new("/dev/shm").join(host.file_name().unwrap())
    } else {
        host
    };
    fs::create_dir_all(&host).unwrap();
    let mut results = Vec::new();
    for base in [m.p(""), host.clone()] {
        let f = base.join("f");
        fs::write(&f, b"data").unwrap();
        let c = cpath(&f);
        // SAFETY: a NUL-terminated path; the fd is closed below.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_WRONLY) };
        let open = errno_or_0(i64::from(fd));
        let mut buf = [0u8; 4];
        // SAFETY: `buf` is live and writable for its length.
        let read = errno_or_0(unsafe { libc::read(fd, buf.as_mut_ptr().cast(), 4) } as i64);
        // SAFETY: `buf` is live for its length.
        let write = errno_or_0(unsafe { libc::write(fd, buf.as_ptr().cast(), 4) } as i64);
        if fd >= 0 {
            // SAFETY: an fd this test opened.
            unsafe { libc::close(fd) };
        }
        results.push((open, read, write));
        fs::remove_file(&f).unwrap();
    }
    let _ = fs::remove_dir_all(&host);
    assert_eq!(
        results[0],
        (0, libc::EBADF, libc::EBADF),
        "through the mount"
    );
    assert_eq!(results[0], results[1], "mount vs tmpfs");
}

/// FS_IOC_FSSETXATTR with fields scalevfs does not store (project id,
/// extent size hints) is EOPNOTSUPP, as on tmpfs, and changes nothing; it
/// used to read the flags word alone and report success.
#[test]
fn fssetxattr_unstored_fields_match_tmpfs() {
    if !fuse_ok("fssetxattr_unstored_fields_match_tmpfs") {
        return;
    }
    const FSSETXATTR: libc::c_ulong = 0x401c_5820;
    const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
    let m = Mounted::new("fssetxattr", FuseConfig::default());
    let host = Path::new("/dev/shm").join(format!("scalevfs-fsx-{}", std::process::id()));
    if !Path::new("/dev/shm").is_dir() {
        eprintln!("SKIPPED: no /dev/shm to compare with");
        return;
    }
    fs::create_dir_all(&host).unwrap();
    // (xflags, extsize, nextents, projid, cowextsize); FS_XFLAG_NODUMP is
    // 0x80 (stored: FS_NODUMP_FL), nextents is output only.
    let cases: [(&str, [u32; 5]); 5] = [
        ("project id", [0x80, 0, 0, 7, 0]),
        ("extent size hint", [0x80, 4096, 0, 0, 0]),
        ("cow extent size hint", [0x80, 0, 0, 0, 4096]),
        ("nextents (ignored)", [0, 0, 5, 0, 0]),
        ("nodump", [0x80, 0, 0, 0, 0]),
    ];
    for (what, v) in cases {
        let mut got = Vec::new();
        for base in [m.p(""), host.clone()] {
            let f = base.join("f");
            fs::write(&f, b"x").unwrap();
            let file = fs::File::open(&f).unwrap();
            let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
            let mut arg = [0u8; 28];
            for (i, x) in v.iter().enumerate() {
                arg[i * 4..i * 4 + 4].copy_from_slice(&x.to_ne_bytes());
            }
            // SAFETY: the ioctl reads a 28-byte struct fsxattr from `arg`.
            let e = errno_or_0(i64::from(unsafe {
                libc::ioctl(fd, FSSETXATTR, arg.as_ptr())
            }));
            let mut flags: libc::c_long = 0;
            // SAFETY: the ioctl writes a long to a live local.
            let r = unsafe { libc::ioctl(fd, FS_IOC_GETFLAGS, &mut flags) };
            // tmpfs has FS_IOC_GETFLAGS since Linux 6.0; without it, only
            // the errno is compared.
            let fl = if r == 0 { Some(flags & 0x40) } else { None };
            got.push((e, fl));
            drop(file);
            fs::remove_file(&f).unwrap();
        }
        let (mount, tmpfs) = (got[0], got[1]);
        assert_eq!(mount.0, tmpfs.0, "{what}: errno through the mount vs tmpfs");
        if let (Some(a), Some(b)) = (mount.1, tmpfs.1) {
            assert_eq!(a, b, "{what}: nodump flag through the mount vs tmpfs");
        }
    }
    let _ = fs::remove_dir_all(&host);
}
