//! `scalevfs mkfs IMAGE --size SIZE --from DIR` judged against `mke2fs -d`
//! on the same tree, `e2fsck -fn` and the kernel reading the image back
//! (loop mount, read-only): extended attributes and ACLs copied, hard
//! links of special files kept, a source with its own lost+found, a 1 TiB
//! sparse file copied by its data runs, zero blocks left as holes at every
//! block size, and a failed or interrupted fill leaving nothing that
//! passes for a filesystem (a file cut to nothing, a block device's
//! superblock zeroed). From a review (stop 39); each test failed before.
//!
//! Each test needs root (mknod, chown, loop mounts) and e2fsprogs; where
//! those are missing it prints SKIP and returns.

#[path = "../../ext4/tests/common.rs"]
mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{host_xattrs, KMount, Scratch};

/// The `scalevfs` binary of this package.
fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_scalevfs"))
}

fn tool(name: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Root and e2fsprogs, or None after printing SKIP.
fn ready(what: &str) -> Option<()> {
    if !is_root() {
        eprintln!("SKIP {what}: needs root");
        return None;
    }
    if tool("mke2fs").is_none() || tool("e2fsck").is_none() {
        eprintln!("SKIP {what}: e2fsprogs missing");
        return None;
    }
    Some(())
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// `scalevfs mkfs IMG --size SIZE -q [extra] --from SRC`.
fn our_mkfs(img: &Path, size: &str, extra: &[&str], src: &Path) -> Output {
    Command::new(bin())
        .arg("mkfs")
        .arg(img)
        .args(["--size", size, "-q"])
        .args(extra)
        .arg("--from")
        .arg(src)
        .output()
        .unwrap()
}

fn ok(o: &Output, who: &str) {
    assert!(
        o.status.success(),
        "{who} failed ({:?}):\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `mke2fs -t ext4 -q -F [extra] -d SRC IMG SIZE`.
fn their_mkfs(img: &Path, size: &str, extra: &[&str], src: &Path) -> Output {
    Command::new(tool("mke2fs").unwrap())
        .args(["-t", "ext4", "-q", "-F"])
        .args(extra)
        .arg("-d")
        .arg(src)
        .arg(img)
        .arg(size)
        .output()
        .unwrap()
}

/// Both images of `src`, `ours.img` and `theirs.img` in `dir`: made with
/// the same `size` and `extra` options, each of which must succeed; ours
/// must pass `e2fsck -fn`.
fn both_images(dir: &Path, size: &str, extra: &[&str], src: &Path) -> (PathBuf, PathBuf) {
    let ours = dir.join("ours.img");
    ok(&our_mkfs(&ours, size, extra, src), "scalevfs mkfs --from");
    fsck_clean(&ours, "scalevfs");
    let theirs = dir.join("theirs.img");
    ok(&their_mkfs(&theirs, size, extra, src), "mke2fs -d");
    (ours, theirs)
}

/// `scalevfs mkfs IMG --size 64M -q --from SRC`, started.
fn spawn_our_mkfs(img: &Path, src: &Path) -> std::process::Child {
    Command::new(bin())
        .arg("mkfs")
        .arg(img)
        .args(["--size", "64M", "-q", "--from"])
        .arg(src)
        .spawn()
        .unwrap()
}

/// The ext4 superblock magic field (0xEF53 on a filesystem) of the device
/// or image `p`, which holds at least 2048 bytes.
fn sb_magic(p: &Path) -> u16 {
    use std::os::unix::fs::FileExt;
    let mut sb = [0u8; 2048];
    std::fs::File::open(p)
        .unwrap()
        .read_exact_at(&mut sb, 0)
        .unwrap();
    u16::from_le_bytes([sb[1024 + 0x38], sb[1024 + 0x39]])
}

fn fsck_clean(img: &Path, who: &str) {
    let o = Command::new(tool("e2fsck").unwrap())
        .arg("-fn")
        .arg(img)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "e2fsck -fn on {who}'s image:\n{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// Mount `img` read-only at `dir` (None, with SKIP printed, where the
/// machine refuses loop mounts).
fn kmount(img: &Path, dir: &Path) -> Option<KMount> {
    KMount::new(img, dir)
}

/// The POSIX ACL `user::rw- user:1000:r-- group::r-- mask::r-- other::---`
/// in its xattr form.
fn acl_blob() -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 4, 1000),
        (4, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn setxattr(p: &Path, name: &str, value: &[u8]) {
    let (c, n) = (cstr(p), CString::new(name).unwrap());
    // SAFETY: a plain syscall on valid pointers that outlive it.
    let r = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "lsetxattr {p:?} {name}: {}",
        std::io::Error::last_os_error()
    );
}

/// Extended attributes (user, trusted, security, POSIX ACLs, a value too
/// big for the inode) are copied, as `mke2fs -d` copies them.
#[test]
fn xattrs_and_acls_are_copied() {
    let Some(()) = ready("xattrs_and_acls_are_copied") else {
        return;
    };
    let s = Scratch::new("mkfs-from-xattr");
    let src = s.0.join("src");
    std::fs::create_dir_all(src.join("dir")).unwrap();
    std::fs::write(src.join("small"), b"s").unwrap();
    std::fs::write(src.join("big"), b"b").unwrap();
    std::fs::write(src.join("acl"), b"a").unwrap();
    setxattr(&src.join("small"), "user.note", b"hello");
    setxattr(&src.join("small"), "trusted.t", b"tt");
    setxattr(&src.join("small"), "security.s", b"ss");
    // Does not fit the 256-byte inode's in-inode space: an xattr block.
    setxattr(&src.join("big"), "user.big", &vec![b'B'; 3000]);
    setxattr(&src.join("acl"), "system.posix_acl_access", &acl_blob());
    // Children made before their directory got its default ACL have none
    // on the host and must have none in the image: the copy used to set
    // the directory's default ACL before making them, and they inherited
    // it (an access ACL widening who may read them).
    std::fs::write(src.join("dir/f"), b"f").unwrap();
    std::fs::create_dir(src.join("dir/sub")).unwrap();
    std::fs::write(src.join("dir/sub/g"), b"g").unwrap();
    setxattr(&src.join("dir"), "system.posix_acl_default", &acl_blob());
    setxattr(&src.join("dir"), "user.d", b"dirval");
    let names = [
        "small",
        "big",
        "acl",
        "dir",
        "dir/f",
        "dir/sub",
        "dir/sub/g",
    ];
    let want: BTreeMap<&str, _> = names
        .iter()
        .map(|n| (*n, host_xattrs(&src.join(n))))
        .collect();

    // The referee: mke2fs -d keeps them all.
    let (ours, theirs) = both_images(&s.0, "64M", &["-b", "4096"], &src);
    let mnt = s.0.join("mnt");
    let Some(m) = kmount(&theirs, &mnt) else {
        return;
    };
    for n in names {
        assert_eq!(host_xattrs(&mnt.join(n)), want[n], "mke2fs -d image, {n}");
    }
    drop(m);
    let _m = kmount(&ours, &mnt).unwrap();
    let mut bad = Vec::new();
    for n in names {
        let got = host_xattrs(&mnt.join(n));
        if got != want[n] {
            bad.push(format!(
                "{n}: kernel shows {:?}, source has {:?}",
                got.keys().collect::<Vec<_>>(),
                want[n].keys().collect::<Vec<_>>()
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "xattrs differ after mkfs --from:\n{}",
        bad.join("\n")
    );
}

/// A FIFO, a device node and a socket with two names each stay one inode
/// with two links (mke2fs -d links every non-directory, non-symlink).
#[test]
fn hard_linked_special_files_stay_one_inode() {
    let Some(()) = ready("hard_linked_special_files_stay_one_inode") else {
        return;
    };
    let s = Scratch::new("mkfs-from-speclink");
    let src = s.0.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    let fifo = src.join("fifo");
    let dev = src.join("dev");
    // SAFETY: plain syscalls on valid C strings.
    unsafe {
        assert_eq!(libc::mkfifo(cstr(&fifo).as_ptr(), 0o640), 0);
        assert_eq!(
            libc::mknod(
                cstr(&dev).as_ptr(),
                libc::S_IFCHR | 0o600,
                libc::makedev(1, 3)
            ),
            0
        );
    }
    std::fs::hard_link(&fifo, src.join("sub/fifo2")).unwrap();
    std::fs::hard_link(&dev, src.join("sub/dev2")).unwrap();
    let (ours, theirs) = both_images(&s.0, "16M", &[], &src);
    let mnt = s.0.join("mnt");
    let check = |img: &Path, who: &str| -> Vec<String> {
        let Some(_m) = kmount(img, &mnt) else {
            return vec![];
        };
        let mut bad = Vec::new();
        for (a, b) in [("fifo", "sub/fifo2"), ("dev", "sub/dev2")] {
            let (ma, mb) = (
                std::fs::symlink_metadata(mnt.join(a)).unwrap(),
                std::fs::symlink_metadata(mnt.join(b)).unwrap(),
            );
            if ma.ino() != mb.ino() || ma.nlink() != 2 {
                bad.push(format!(
                    "{who}: {a} ino {} nlink {}, {b} ino {} nlink {} (source: one inode, 2 links)",
                    ma.ino(),
                    ma.nlink(),
                    mb.ino(),
                    mb.nlink()
                ));
            }
        }
        bad
    };
    assert!(check(&theirs, "mke2fs -d").is_empty(), "referee disagrees");
    let bad = check(&ours, "scalevfs");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// A source that has its own `lost+found` (the root of a mounted ext4, a
/// previous image's dump) is merged into the new one, as mke2fs -d does,
/// instead of failing with EEXIST.
#[test]
fn source_with_lost_found_is_copied() {
    let Some(()) = ready("source_with_lost_found_is_copied") else {
        return;
    };
    let s = Scratch::new("mkfs-from-lpf");
    let src = s.0.join("src");
    std::fs::create_dir_all(src.join("lost+found")).unwrap();
    std::fs::create_dir_all(src.join("etc")).unwrap();
    std::fs::write(src.join("lost+found/#12"), b"recovered").unwrap();
    std::fs::write(src.join("etc/hostname"), b"box\n").unwrap();
    let theirs = s.0.join("theirs.img");
    ok(&their_mkfs(&theirs, "16M", &[], &src), "mke2fs -d");
    fsck_clean(&theirs, "mke2fs");
    let ours = s.0.join("ours.img");
    let o = our_mkfs(&ours, "16M", &[], &src);
    ok(&o, "scalevfs mkfs --from (a tree with lost+found)");
    fsck_clean(&ours, "scalevfs");
    let mnt = s.0.join("mnt");
    let Some(_m) = kmount(&ours, &mnt) else {
        return;
    };
    assert_eq!(
        std::fs::read(mnt.join("lost+found/#12")).unwrap(),
        b"recovered"
    );
    assert_eq!(std::fs::read(mnt.join("etc/hostname")).unwrap(), b"box\n");
}

/// The bytes process `pid` has read so far (`rchar` of /proc/PID/io:
/// read(2), pread(2) and the like, whatever they read from), None once
/// it is gone. A zombie not yet reaped still shows its totals.
fn rchar(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("rchar:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether child `pid` has exited, without reaping it (its /proc entry,
/// and so its I/O totals, stay until `wait`).
fn exited_unreaped(pid: u32) -> bool {
    // SAFETY: siginfo_t is plain data; zeroes are a valid value, and
    // waitid writes it before it is read.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: a plain syscall on our own child, with a valid out-pointer.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
        )
    };
    assert_eq!(r, 0, "waitid: {}", std::io::Error::last_os_error());
    // SAFETY: waitid filled `info` (si_pid 0: nothing has exited).
    unsafe { info.si_pid() != 0 }
}

/// A 1 TiB sparse file (two 4-byte pieces of data) is copied by its data
/// runs (SEEK_DATA/SEEK_HOLE), as mke2fs -d copies it: the fill reads a
/// few kilobytes in all, where reading the terabyte of holes through
/// read() took scalevfs about 8.5 minutes. Checked by what the child read
/// (`rchar`, whole process, sampled while it runs and taken exactly once
/// it has exited), not by how long it took; and the image stays small
/// (no zeros written) and reads back as the source.
#[test]
fn huge_sparse_file_is_copied_by_its_data_runs() {
    let Some(()) = ready("huge_sparse_file_is_copied_by_its_data_runs") else {
        return;
    };
    let s = Scratch::new("mkfs-from-tib");
    let src = s.0.join("src");
    std::fs::create_dir_all(&src).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(src.join("huge")).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        if f.write_all_at(b"tail", 1 << 40).is_err() {
            eprintln!("SKIP: the scratch filesystem cannot hold a 1 TiB sparse file");
            return;
        }
    }
    ok(
        &their_mkfs(&s.0.join("theirs.img"), "64M", &[], &src),
        "mke2fs -d",
    );
    let img = s.0.join("ours.img");
    let mut child = spawn_our_mkfs(&img, &src);
    let pid = child.id();
    // The 64 MiB image itself may be read whole, a few times over; the
    // holes are 1 TiB. Past this, the fill is reading holes.
    const LIMIT: u64 = 256 << 20;
    // Only a guard against a hang (reading the holes is caught by LIMIT
    // within a second of starting); it asserts nothing about speed.
    let guard = Duration::from_secs(600);
    let t0 = Instant::now();
    let mut most = 0u64;
    loop {
        let done = exited_unreaped(pid);
        most = most.max(rchar(pid).unwrap_or(0));
        if most > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "scalevfs mkfs --from a 1 TiB sparse file has read {most} bytes \
                 (the source holds 8): it reads the holes"
            );
        }
        if done {
            break;
        }
        if t0.elapsed() > guard {
            let _ = child.kill();
            let _ = child.wait();
            panic!("scalevfs mkfs --from still running after {guard:?} (read {most} bytes)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "scalevfs mkfs failed: {status:?}");
    eprintln!("scalevfs mkfs --from read {most} bytes in all");
    // No zero blocks written either: a fresh 64 MiB image's metadata and
    // journal only (about 1 MiB allocated here, 4.4 MiB for mke2fs).
    let allocated = std::fs::metadata(&img).unwrap().blocks() * 512;
    assert!(
        allocated <= 16 << 20,
        "the image has {allocated} bytes allocated for 8 bytes of data"
    );
    fsck_clean(&img, "scalevfs");
    let mnt = s.0.join("mnt");
    let Some(_m) = kmount(&img, &mnt) else {
        return;
    };
    let md = std::fs::metadata(mnt.join("huge")).unwrap();
    assert_eq!(md.len(), (1 << 40) + 4);
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(mnt.join("huge")).unwrap();
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, 0).unwrap();
    assert_eq!(&b, b"head");
    f.read_exact_at(&mut b, 1 << 40).unwrap();
    assert_eq!(&b, b"tail");
    f.read_exact_at(&mut b, 1 << 39).unwrap();
    assert_eq!(b, [0; 4], "the middle of the hole");
    // Two data blocks (and the extent tree): a few KiB, not a terabyte.
    assert!(
        md.blocks() * 512 <= 64 << 10,
        "{} bytes allocated",
        md.blocks() * 512
    );
}

/// With 1 KiB blocks, an all-zero 1 KiB block is a hole, as mke2fs -d
/// leaves it (it compares each filesystem block with zeros); scalevfs only
/// skips all-zero 4 KiB chunks, so a 4 KiB file with one byte of data gets
/// four blocks, three of them zeros.
#[test]
fn zero_blocks_stay_holes_with_1k_blocks() {
    let Some(()) = ready("zero_blocks_stay_holes_with_1k_blocks") else {
        return;
    };
    let s = Scratch::new("mkfs-from-1khole");
    let src = s.0.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let mut a = vec![0u8; 4096];
    a[0] = b'x';
    std::fs::write(src.join("a"), &a).unwrap();
    let mut b = vec![0u8; 8192];
    b[1024..2048].fill(b'y');
    std::fs::write(src.join("b"), &b).unwrap();
    let (ours, theirs) = both_images(&s.0, "64M", &["-b", "1024"], &src);
    let mnt = s.0.join("mnt");
    let blocks = |img: &Path| -> Option<Vec<(String, u64)>> {
        let _m = kmount(img, &mnt)?;
        Some(
            ["a", "b"]
                .iter()
                .map(|n| {
                    let p = mnt.join(n);
                    let data = std::fs::read(&p).unwrap();
                    let want = if *n == "a" { &a } else { &b };
                    assert!(&data == want, "{n}: contents differ");
                    (n.to_string(), std::fs::metadata(&p).unwrap().blocks())
                })
                .collect(),
        )
    };
    let Some(t) = blocks(&theirs) else {
        return;
    };
    let o = blocks(&ours).unwrap();
    // mke2fs: one 1 KiB block each (2 sectors).
    assert_eq!(t, vec![("a".into(), 2), ("b".into(), 2)], "referee");
    assert_eq!(o, t, "512-byte sectors per file, scalevfs vs mke2fs -d");
}

/// A fill that fails (here: the tree does not fit) on a block device must
/// not leave a filesystem there that mounts and passes for a good one: the
/// CLI's cleanup (`File::create`, a truncation) does nothing to a device.
#[test]
fn failed_fill_on_a_block_device_leaves_no_filesystem() {
    let Some(()) = ready("failed_fill_on_a_block_device_leaves_no_filesystem") else {
        return;
    };
    let Some(losetup) = tool("losetup") else {
        eprintln!("SKIP: no losetup");
        return;
    };
    let s = Scratch::new("mkfs-from-bdev");
    let src = s.0.join("src");
    std::fs::create_dir_all(&src).unwrap();
    // 20 MiB of incompressible data for a 16 MiB filesystem.
    let mut x = 0x1234_5678_9abc_def0u64;
    let data: Vec<u8> = (0..20 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(src.join("big"), &data).unwrap();
    let backing = s.0.join("backing");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let o = Command::new(&losetup)
        .args(["-f", "--show"])
        .arg(&backing)
        .output()
        .unwrap();
    if !o.status.success() {
        eprintln!("SKIP: losetup: {}", String::from_utf8_lossy(&o.stderr));
        return;
    }
    let dev = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim().to_string());
    struct Detach(PathBuf, PathBuf);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = Command::new(&self.0).arg("-d").arg(&self.1).status();
        }
    }
    let _d = Detach(losetup.clone(), dev.clone());
    let o = our_mkfs(&dev, "16M", &[], &src);
    assert!(!o.status.success(), "20 MiB cannot fit 16 MiB");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("No space left"), "message: {err}");
    let magic = sb_magic(&dev);
    let fsck = Command::new(tool("e2fsck").unwrap())
        .arg("-fn")
        .arg(&dev)
        .output()
        .unwrap();
    assert!(
        magic != 0xEF53,
        "after `{}`, {} still holds an ext4 superblock (e2fsck -fn exit {:?}):\n{}",
        err.trim(),
        dev.display(),
        fsck.status.code(),
        String::from_utf8_lossy(&fsck.stdout)
    );
}

/// A write lease (`F_SETLEASE`, F_WRLCK) on `p`, held while this lives:
/// another process's open of `p` waits until the lease is dropped (a
/// blocking open in the kernel's `__break_lease`; the fill's O_NONBLOCK
/// open gets EWOULDBLOCK and tries again), which is how a test stops a
/// fill at a chosen file. The break is not signalled (no SIGIO: its owner is
/// cleared), it is seen by polling `breaking`.
struct Lease(std::fs::File);

impl Lease {
    /// The lease, or the reason the kernel refused it.
    fn take(p: &Path) -> Result<Lease, String> {
        use std::os::unix::io::AsRawFd;
        let f = std::fs::File::open(p).map_err(|e| format!("open {}: {e}", p.display()))?;
        let fd = f.as_raw_fd();
        // SAFETY: fcntl on a descriptor this owns, integer arguments.
        if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) } != 0 {
            return Err(format!(
                "F_SETLEASE F_WRLCK: {}",
                std::io::Error::last_os_error()
            ));
        }
        // No SIGIO to this test process when the lease is broken (its
        // default action would end the test binary).
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETOWN, 0) } != 0 {
            return Err(format!("F_SETOWN 0: {}", std::io::Error::last_os_error()));
        }
        Ok(Lease(f))
    }

    /// Whether another process's open is waiting for the lease to go (the
    /// kernel reports the type it is to be downgraded to).
    fn breaking(&self) -> bool {
        use std::os::unix::io::AsRawFd;
        // SAFETY: as in `take`.
        let t = unsafe { libc::fcntl(self.0.as_raw_fd(), libc::F_GETLEASE) };
        assert!(t >= 0, "F_GETLEASE: {}", std::io::Error::last_os_error());
        t != libc::F_WRLCK
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        use std::os::unix::io::AsRawFd;
        // SAFETY: as in `take`; closing the file would drop it too.
        unsafe { libc::fcntl(self.0.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    }
}

/// Whether process `pid` has a signal pending (queued, not yet taken by
/// its `sigwait` thread), from /proc/PID/status.
fn signal_pending(pid: u32) -> bool {
    let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false; // gone: nothing pending
    };
    st.lines()
        .filter(|l| l.starts_with("SigPnd:") || l.starts_with("ShdPnd:"))
        .any(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|m| !m.trim_start_matches('0').is_empty())
        })
}

/// A source file under a lease is waited for, as mke2fs -d's blocking
/// open waits, and copied once the lease goes: the fill's non-blocking
/// open (which keeps a FIFO swapped in from hanging it) answers
/// EWOULDBLOCK meanwhile, which is no reason to fail.
#[test]
fn a_leased_file_is_copied_once_its_lease_goes() {
    let s = Scratch::new("mkfs-from-lease");
    let src = s.0.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("leased"), b"under a lease").unwrap();
    let lease = match Lease::take(&src.join("leased")) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("SKIP a_leased_file_is_copied_once_its_lease_goes: no file lease: {e}");
            return;
        }
    };
    let img = s.0.join("ours.img");
    let mut child = Command::new(bin())
        .arg("mkfs")
        .arg(&img)
        .args(["--size", "8M", "-q", "--from"])
        .arg(&src)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The deadline only guards against a hang.
    let t0 = Instant::now();
    while !lease.breaking() {
        if child.try_wait().unwrap().is_some() {
            break; // finished without the file: the asserts below say how
        }
        if t0.elapsed() > Duration::from_secs(40) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mkfs --from never opened the leased file in 40 s");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // Still waiting for the lease a while later, not failed.
    std::thread::sleep(Duration::from_millis(200));
    let waiting = child.try_wait().unwrap().is_none();
    drop(lease);
    let out = child.wait_with_output().unwrap();
    ok(&out, "scalevfs mkfs --from (leased file)");
    assert!(waiting, "mkfs --from did not wait for the lease");
    if tool("e2fsck").is_some() {
        fsck_clean(&img, "scalevfs");
    }
}

/// A fill interrupted (SIGTERM) half way must not leave an image that the
/// kernel mounts and e2fsck "recovers" into a half-filled filesystem: the
/// primary superblock should only become valid once the copy is done
/// (mke2fs writes it at the very end, so an interrupted mke2fs -d leaves
/// no filesystem on a fresh file), or the image is wiped.
///
/// The signal lands mid-copy by construction, not by timing: the source
/// holds 8 MiB of data, then a file under a write lease that this test
/// holds. The fill's open of that file waits until the lease goes; the
/// test sees the lease being broken (the fill is there, past the first
/// file), sends SIGTERM, waits for the fill to take the signal, then lets
/// the open go on. A fill that finishes without ever opening the leased
/// file fails the test.
#[test]
fn interrupted_fill_leaves_no_mountable_image() {
    let Some(()) = ready("interrupted_fill_leaves_no_mountable_image") else {
        return;
    };
    let s = Scratch::new("mkfs-from-intr");
    let src = s.0.join("src");
    std::fs::create_dir_all(&src).unwrap();
    // Dense data copied before the fill reaches the leased file (names
    // are copied in order), so that the image is part filled.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..8 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(src.join("a-data"), &data).unwrap();
    std::fs::write(src.join("b-leased"), &data[..4 << 20]).unwrap();
    std::fs::write(src.join("z-after"), b"never copied").unwrap();
    let lease = match Lease::take(&src.join("b-leased")) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("SKIP interrupted_fill_leaves_no_mountable_image: no file lease: {e}");
            return;
        }
    };
    let img = s.0.join("ours.img");
    let mut child = Command::new(bin())
        .arg("mkfs")
        .arg(&img)
        .args(["--size", "64M", "-q", "--from"])
        .arg(&src)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    fn kill_and_fail(child: &mut std::process::Child, why: &str) -> ! {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{why}");
    }
    // Until the fill opens the leased file. The deadline only guards
    // against a hang (the kernel gives up on a lease after
    // /proc/sys/fs/lease-break-time, 45 s by default); it asserts nothing
    // about speed.
    let t0 = Instant::now();
    while !lease.breaking() {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            panic!(
                "mkfs --from finished ({st:?}) before the signal, without opening the \
                 leased file b-leased:\n{err}"
            );
        }
        if t0.elapsed() > Duration::from_secs(40) {
            kill_and_fail(
                &mut child,
                "mkfs --from never opened the leased file in 40 s",
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // The fill is blocked opening b-leased, a-data copied: interrupt it.
    // SAFETY: kill on our own child's pid, which has not been reaped.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    // The signal is taken (by the fill's signal thread) before the open
    // goes on, so that the fill sees it at its next check.
    let t0 = Instant::now();
    while signal_pending(pid) {
        if t0.elapsed() > Duration::from_secs(20) {
            kill_and_fail(&mut child, "SIGTERM still pending after 20 s");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(50));
    drop(lease);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "an interrupted fill succeeded: {err}"
    );
    assert!(
        err.contains("interrupted"),
        "mkfs --from failed, but not for the signal: {err}"
    );
    if std::fs::metadata(&img).unwrap().len() < 2048 {
        return; // emptied: nothing claims to be a filesystem
    }
    if sb_magic(&img) != 0xEF53 {
        return;
    }
    // What a user would get: e2fsck -fy (on a copy) makes it a valid,
    // half-filled filesystem.
    let copy = s.0.join("copy.img");
    std::fs::copy(&img, &copy).unwrap();
    let fix = Command::new(tool("e2fsck").unwrap())
        .arg("-fy")
        .arg(&copy)
        .output()
        .unwrap();
    panic!(
        "the image of an interrupted mkfs --from still has an ext4 superblock; \
         e2fsck -fy exit {:?}:\n{}",
        fix.status.code(),
        String::from_utf8_lossy(&fix.stdout)
    );
}

/// Whether debugfs shows `path` of `img` inline, and its inline data size.
fn inline_of(img: &Path, path: &str) -> (bool, Option<u64>) {
    let o = Command::new(tool("debugfs").unwrap())
        .args(["-R", &format!("stat {path}")])
        .arg(img)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let flags = out
        .split("Flags: 0x")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .unwrap_or_else(|| panic!("debugfs stat {path}: {out}"));
    let size = out
        .split("Size of inline data: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok());
    (flags & 0x1000_0000 != 0, size)
}

/// `-O inline_data`: files up to the inode's room (60 bytes of `i_block`
/// and 68 of `system.data` on 256-byte inodes) and directories are made
/// inline, as `mke2fs -d` makes the files; e2fsck passes, and the kernel
/// reads the tree back as the source. (mke2fs keeps a directory inline
/// only while it fits `i_block`; scalevfs, as the kernel's ext4, lets it
/// grow into `system.data`.)
#[test]
fn inline_data_image_from_a_directory() {
    let Some(()) = ready("inline_data_image_from_a_directory") else {
        return;
    };
    let s = Scratch::new("mkfs-from-inline");
    let src = s.0.join("src");
    std::fs::create_dir_all(src.join("d/sub")).unwrap();
    std::fs::create_dir_all(src.join("empty")).unwrap();
    for (name, n) in [
        ("d/small", 11),
        ("d/sixty", 60),
        ("d/max", 128),
        ("d/past", 129),
    ] {
        std::fs::write(src.join(name), vec![b'x'; n]).unwrap();
    }
    std::fs::write(src.join("d/sub/f"), b"f").unwrap();
    std::fs::write(src.join("big"), vec![7u8; 5000]).unwrap();
    let (ours, theirs) = both_images(&s.0, "16M", &["-O", "inline_data"], &src);
    for p in [
        "/d/small", "/d/sixty", "/d/max", "/d/past", "/d/sub/f", "/big", "/empty", "/d/sub",
    ] {
        assert_eq!(inline_of(&ours, p), inline_of(&theirs, p), "{p}");
    }
    assert_eq!(inline_of(&ours, "/d/max"), (true, Some(128)));
    assert!(!inline_of(&ours, "/d/past").0);
    // /d holds five entries: past i_block, within the attribute's room.
    assert_eq!(inline_of(&ours, "/d"), (true, Some(128)));
    let Some(m) = kmount(&ours, &s.0.join("mnt")) else {
        return;
    };
    for f in ["d/small", "d/sixty", "d/max", "d/past", "d/sub/f", "big"] {
        assert_eq!(
            std::fs::read(m.0.join(f)).unwrap(),
            std::fs::read(src.join(f)).unwrap(),
            "{f}"
        );
    }
    let mut names: Vec<_> = std::fs::read_dir(m.0.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["max", "past", "sixty", "small", "sub"]);
}

/// `openat(dirfd, name)` for a directory (made first when `make`), one
/// step of a walk too deep for a path.
fn step_dir(dirfd: i32, name: &str, make: bool) -> i32 {
    let n = CString::new(name).unwrap();
    // SAFETY: plain syscalls on a valid C string and a descriptor.
    unsafe {
        if make {
            assert_eq!(libc::mkdirat(dirfd, n.as_ptr(), 0o755), 0, "mkdirat {name}");
        }
        let fd = libc::openat(
            dirfd,
            n.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        );
        assert!(
            fd >= 0,
            "openat {name}: {}",
            std::io::Error::last_os_error()
        );
        fd
    }
}

/// The metadata of `name` in directory `dirfd`, not following a symlink,
/// as (inode, nlink, mode, mtime).
fn stat_at(dirfd: i32, name: &str) -> (u64, u64, u32, i64) {
    let n = CString::new(name).unwrap();
    // SAFETY: `st` is written by fstatat before it is read.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        assert_eq!(
            libc::fstatat(dirfd, n.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW),
            0,
            "fstatat {name}: {}",
            std::io::Error::last_os_error()
        );
        (st.st_ino, st.st_nlink, st.st_mode, st.st_mtime)
    }
}

/// A tree deeper than PATH_MAX (24 directories of 200-byte names, 4.8 KB
/// of path to the bottom) is copied whole, as mke2fs -d copies it: the
/// file, symlink, xattr and directory attributes at the bottom, a hard
/// link from the top to a file at the bottom (its first name too long for
/// one path) and one from the bottom to a file at the top. Before, the
/// scan stopped at "File name too long".
#[test]
fn tree_deeper_than_path_max_is_copied() {
    let Some(()) = ready("tree_deeper_than_path_max_is_copied") else {
        return;
    };
    let s = Scratch::new("mkfs-from-deep");
    let src = s.0.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a.txt"), b"top file").unwrap();
    let names: Vec<String> = (0..24)
        .map(|i| format!("d{i:02}{}", "x".repeat(197)))
        .collect();
    assert!(names.iter().map(|n| n.len() + 1).sum::<usize>() > libc::PATH_MAX as usize);
    let top = std::fs::File::open(&src).unwrap();
    let mut fds = Vec::new();
    let mut cur = std::os::unix::io::AsRawFd::as_raw_fd(&top);
    for n in &names {
        cur = step_dir(cur, n, true);
        fds.push(cur);
    }
    let c = |s: &str| CString::new(s).unwrap();
    // SAFETY: plain syscalls on valid C strings and open descriptors.
    unsafe {
        let f = libc::openat(
            cur,
            c("leaf").as_ptr(),
            libc::O_CREAT | libc::O_WRONLY,
            0o640,
        );
        assert!(f >= 0);
        assert_eq!(libc::write(f, b"deep data".as_ptr().cast(), 9), 9);
        let (k, v) = (c("user.where"), b"bottom");
        assert_eq!(
            libc::fsetxattr(f, k.as_ptr(), v.as_ptr().cast(), v.len(), 0),
            0
        );
        libc::close(f);
        assert_eq!(
            libc::symlinkat(c("leaf").as_ptr(), cur, c("sl").as_ptr()),
            0
        );
        let topfd = std::os::unix::io::AsRawFd::as_raw_fd(&top);
        // One name at the top for the file at the bottom, one at the
        // bottom for the file at the top.
        assert_eq!(
            libc::linkat(cur, c("leaf").as_ptr(), topfd, c("leaf-link").as_ptr(), 0),
            0
        );
        assert_eq!(
            libc::linkat(topfd, c("a.txt").as_ptr(), cur, c("a-link").as_ptr(), 0),
            0
        );
        // The bottom directory's own mode and time, set after its
        // children were made.
        assert_eq!(libc::fchmod(cur, 0o750), 0);
        let t = [
            libc::timespec {
                tv_sec: 1_000_000_000,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: 1_234_567_890,
                tv_nsec: 0,
            },
        ];
        assert_eq!(libc::futimens(cur, t.as_ptr()), 0);
        for fd in fds.drain(..) {
            libc::close(fd);
        }
    }
    let img = s.0.join("ours.img");
    ok(
        &our_mkfs(&img, "16M", &[], &src),
        "scalevfs mkfs --from (deep tree)",
    );
    fsck_clean(&img, "scalevfs");
    let mnt = s.0.join("mnt");
    let Some(_m) = kmount(&img, &mnt) else {
        return;
    };
    let root = std::fs::File::open(&mnt).unwrap();
    let rootfd = std::os::unix::io::AsRawFd::as_raw_fd(&root);
    let mut cur = rootfd;
    for n in &names {
        cur = step_dir(cur, n, false);
        fds.push(cur);
    }
    let (leaf_ino, leaf_nlink, leaf_mode, _) = stat_at(cur, "leaf");
    let (top_ino, _, _, _) = stat_at(rootfd, "leaf-link");
    assert_eq!((leaf_ino, leaf_nlink), (top_ino, 2), "leaf and leaf-link");
    assert_eq!(leaf_mode & 0o7777, 0o640);
    let (a_ino, a_nlink, _, _) = stat_at(rootfd, "a.txt");
    assert_eq!(
        (stat_at(cur, "a-link").0, a_nlink),
        (a_ino, 2),
        "a.txt and a-link"
    );
    let (_, _, dmode, dmtime) = stat_at(fds[fds.len() - 2], names.last().unwrap());
    assert_eq!(
        (dmode & 0o7777, dmtime),
        (0o750, 1_234_567_890),
        "bottom directory"
    );
    // SAFETY: plain syscalls on valid buffers and descriptors.
    unsafe {
        let f = libc::openat(cur, c("leaf").as_ptr(), libc::O_RDONLY);
        assert!(f >= 0);
        let mut buf = [0u8; 64];
        let n = libc::read(f, buf.as_mut_ptr().cast(), buf.len());
        assert_eq!(&buf[..n as usize], b"deep data");
        let n = libc::fgetxattr(
            f,
            c("user.where").as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        );
        assert_eq!(&buf[..n.max(0) as usize], b"bottom", "xattr at the bottom");
        libc::close(f);
        let n = libc::readlinkat(cur, c("sl").as_ptr(), buf.as_mut_ptr().cast(), buf.len());
        assert_eq!(&buf[..n.max(0) as usize], b"leaf");
        for fd in fds.drain(..) {
            libc::close(fd);
        }
    }
}
