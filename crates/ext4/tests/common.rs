//! Shared helpers: build ext4 images with mke2fs -d from generated trees.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use scalevfs::fs::Fs;
use scalevfs_ext4::Ext4;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where mkfs.ext4 is, or None (the caller skips, printing why).
pub fn mkfs() -> Option<PathBuf> {
    for d in ["/usr/sbin", "/sbin", "/usr/bin", "/bin"] {
        let p = Path::new(d).join("mkfs.ext4");
        if p.exists() {
            return Some(p);
        }
    }
    None
}

/// Run a debugfs -w request on `img`; false (with a note) without debugfs.
pub fn debugfs(img: &Path, req: &str) -> bool {
    let Some(p) = mkfs()
        .map(|m| m.with_file_name("debugfs"))
        .filter(|p| p.exists())
    else {
        eprintln!("note: debugfs not found, skipping `{req}`");
        return false;
    };
    let out = Command::new(p)
        .args(["-w", "-R", req])
        .arg(img)
        .output()
        .expect("run debugfs");
    assert!(
        out.status.success(),
        "debugfs {req}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

pub fn have_tools() -> bool {
    if mkfs().is_none() {
        eprintln!("SKIP: mkfs.ext4 not found (install e2fsprogs)");
        return false;
    }
    true
}

static N: AtomicUsize = AtomicUsize::new(0);

/// A fresh scratch directory, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        // Relaxed: only uniqueness matters.
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("scalevfs-ext4-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run mkfs.ext4 -d `src` into `img` with block size `bs`, `size` (mke2fs
/// syntax), and extra `-O` features.
pub fn make_image(src: &Path, img: &Path, bs: usize, size: &str, features: &str) {
    make_image_args(src, img, bs, size, features, &[]);
}

/// As `make_image`, with more mkfs arguments (`-C 4096`).
pub fn make_image_args(
    src: &Path,
    img: &Path,
    bs: usize,
    size: &str,
    features: &str,
    extra: &[&str],
) {
    let mut c = Command::new(mkfs().unwrap());
    c.args(["-q", "-F", "-b", &bs.to_string()]);
    if !features.is_empty() {
        c.args(["-O", features]);
    }
    c.args(extra);
    c.arg("-d").arg(src).arg(img).arg(size);
    // Fixed hash seed and UUID would make the image reproducible; a random
    // one exercises the seeded hash, which is what we want.
    let out = c.output().expect("run mkfs.ext4");
    assert!(
        out.status.success(),
        "mkfs.ext4 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // mke2fs -d writes linear directories; e2fsck -D indexes the large
    // ones (htree) as the kernel would have.
    let fsck = mkfs().unwrap().with_file_name("e2fsck");
    if fsck.exists() {
        let out = Command::new(fsck)
            .arg("-fyD")
            .arg(img)
            .output()
            .expect("run e2fsck");
        // 0: clean, 1: errors corrected (the re-indexing itself).
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "e2fsck -fyD: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    } else {
        eprintln!("note: e2fsck not found; directories stay linear");
    }
}

/// Whether e2fsck is there to index directories.
pub fn have_e2fsck() -> bool {
    mkfs().is_some_and(|m| m.with_file_name("e2fsck").exists())
}

fn set_times(p: &Path, sec: i64, nsec: i64) {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
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
    // SAFETY: c is a valid NUL-terminated path and ts points to two timespecs.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "utimensat {}", p.display());
}

/// Fill `root` with the test tree. `big` entries go in `big/`;
/// `frag_blocks` blocks of `bs` with a hole after each go in `frag`.
pub fn build_tree(root: &Path, big: usize, frag_blocks: usize, bs: usize) {
    use std::fs;
    fs::create_dir_all(root.join("a/b/c/d")).unwrap();
    fs::write(root.join("a/b/c/d/deep.txt"), b"deep file\n").unwrap();
    fs::write(root.join("empty"), b"").unwrap();
    fs::write(root.join("small.txt"), b"hello ext4\n").unwrap();
    // A file of several blocks with a pattern.
    let pat: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    fs::write(root.join("pattern.bin"), &pat).unwrap();
    // A sparse file: data at 0, at 5 MiB and at its end.
    {
        let f = fs::File::create(root.join("sparse")).unwrap();
        f.write_all_at(b"start", 0).unwrap();
        f.write_all_at(b"middle", 5 << 20).unwrap();
        f.write_all_at(b"end", (9 << 20) - 3).unwrap();
    }
    // A file made of many one-block fragments: a deep extent tree.
    {
        let f = fs::File::create(root.join("frag")).unwrap();
        let mut blk = vec![0u8; bs];
        for i in 0..frag_blocks {
            for (j, b) in blk.iter_mut().enumerate() {
                *b = (i as u8) ^ (j as u8) ^ 0x5a;
            }
            f.write_all_at(&blk, (2 * i * bs) as u64).unwrap();
        }
        f.set_len((2 * frag_blocks * bs) as u64).unwrap();
    }
    fs::create_dir(root.join("big")).unwrap();
    for i in 0..big {
        let name = format!("entry-{i:05}-with-a-longer-name-{}", i * 7919 % 1000);
        fs::write(root.join("big").join(name), format!("{i}")).unwrap();
    }
    // Symlinks: fast (fits in i_block) and slow (needs a block).
    std::os::unix::fs::symlink("small.txt", root.join("fastlink")).unwrap();
    let long = format!("a/b/c/d/{}", "x".repeat(120));
    std::os::unix::fs::symlink(&long, root.join("slowlink")).unwrap();
    std::os::unix::fs::symlink("a/b/c/d/deep.txt", root.join("deeplink")).unwrap();
    // Hard links.
    fs::hard_link(root.join("small.txt"), root.join("a/hardlink")).unwrap();
    // A FIFO.
    let c = std::ffi::CString::new(root.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o640) }, 0);
    // A character device, when we may make one (root).
    let c = std::ffi::CString::new(root.join("chardev").as_os_str().as_bytes()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    let _ = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o600,
            libc::makedev(4, 70000 & 0xfffff),
        )
    };
    // Odd modes.
    fs::write(root.join("setuid"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(root.join("setuid"), fs::Permissions::from_mode(0o4751)).unwrap();
    fs::write(root.join("nomode"), b"x").unwrap();
    fs::set_permissions(root.join("nomode"), fs::Permissions::from_mode(0o000)).unwrap();
    fs::create_dir(root.join("sticky")).unwrap();
    fs::set_permissions(root.join("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
    // Owners with high bits, when we are root.
    let c = std::ffi::CString::new(root.join("small.txt").as_os_str().as_bytes()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    let _ = unsafe { libc::lchown(c.as_ptr(), 100_123, 70_007) };
    // Times with nanoseconds, before 1970 and after 2038.
    set_times(&root.join("pattern.bin"), 1_234_567_890, 123_456_789);
    set_times(&root.join("empty"), -86_400 * 365, 5);
    // (mke2fs -d drops the epoch bits of times past 2038: those are set
    // through debugfs by the tests.)
    set_times(&root.join("a/b/c/d/deep.txt"), 2_000_000_017, 999_999_999);
}

#[derive(Debug, PartialEq)]
pub struct Node {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub size: u64,
    pub rdev: u64,
    pub mtime: (i64, i64),
    pub content: Option<Vec<u8>>,
    pub target: Option<Vec<u8>>,
}

/// Long contents compare by a digest so mismatches print short.
pub fn short(v: Vec<u8>) -> Vec<u8> {
    if v.len() <= 64 {
        return v;
    }
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in &v {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    let mut out = (v.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h.to_le_bytes());
    out
}

pub fn host_tree(root: &Path) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        for e in std::fs::read_dir(&p).unwrap() {
            let e = e.unwrap();
            let name = format!("{rel}/{}", e.file_name().to_str().unwrap());
            let path = root.join(name.trim_start_matches('/'));
            let m = std::fs::symlink_metadata(&path).unwrap();
            let ft = m.file_type();
            if ft.is_dir() {
                stack.push(name.trim_start_matches('/').to_string());
            }
            out.insert(
                name,
                Node {
                    mode: m.mode(),
                    uid: m.uid(),
                    gid: m.gid(),
                    // Directory link counts differ from the source's (lost+found).
                    nlink: if ft.is_dir() { 0 } else { m.nlink() },
                    size: if ft.is_dir() { 0 } else { m.size() },
                    rdev: m.rdev(),
                    // mke2fs -d stores whole seconds (nanoseconds are
                    // checked separately, set through debugfs).
                    mtime: (m.mtime(), 0),
                    content: ft
                        .is_file()
                        .then(|| std::fs::read(&path).unwrap())
                        .map(short),
                    target: ft.is_symlink().then(|| {
                        use std::os::unix::ffi::OsStrExt;
                        std::fs::read_link(&path)
                            .unwrap()
                            .as_os_str()
                            .as_bytes()
                            .to_vec()
                    }),
                },
            );
        }
    }
    out
}

pub fn vfs_tree(fs: &Fs) -> BTreeMap<String, Node> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        for e in fs.read_dir(format!("/{rel}")).unwrap() {
            let e = e.unwrap();
            let fname = e.file_name();
            let fname = fname.to_str().unwrap();
            if rel.is_empty() && fname == "lost+found" {
                continue;
            }
            let name = format!("{rel}/{fname}");
            let path = format!("/{}", name.trim_start_matches('/'));
            let m = fs.symlink_metadata(&path).unwrap();
            let st = *m.stat();
            let dir = m.is_dir();
            if dir {
                stack.push(name.trim_start_matches('/').to_string());
            }
            out.insert(
                name,
                Node {
                    mode: st.mode,
                    uid: st.uid,
                    gid: st.gid,
                    nlink: if dir { 0 } else { u64::from(st.nlink) },
                    size: if dir { 0 } else { st.size },
                    rdev: st.rdev,
                    mtime: (st.mtime.sec, st.mtime.nsec),
                    content: m.is_file().then(|| fs.read(&path).unwrap()).map(short),
                    target: m
                        .is_symlink()
                        .then(|| fs.read_link(&path).unwrap().as_os_str().as_bytes().to_vec()),
                },
            );
        }
    }
    out
}

/// Walk the whole tree through the library, panicking with the full error
/// message (the VFS only passes the errno on).
pub fn walk_lib(e: &Ext4) {
    let mut stack = vec![(String::from(""), 2u32)];
    while let Some((path, ino)) = stack.pop() {
        let raw = e.read_inode(ino).unwrap_or_else(|x| panic!("{path}: {x}"));
        let mut kids = Vec::new();
        e.list(&raw, &mut |i, n| {
            kids.push((format!("{path}/{}", String::from_utf8_lossy(n)), i));
            true
        })
        .unwrap_or_else(|x| panic!("{path}: {x}"));
        for (p, i) in kids {
            let r = e.read_inode(i).unwrap_or_else(|x| panic!("{p}: {x}"));
            if r.mode & 0o170000 == 0o040000 {
                stack.push((p, i));
            }
        }
    }
}

// ---- helpers of the write tests ----

pub fn tool(name: &str) -> PathBuf {
    mkfs().unwrap().with_file_name(name)
}

/// A fresh image as the brief's reference: mkfs.ext4 defaults plus
/// orphan_file.
pub fn fresh(dir: &Path, bs: usize, size: &str) -> PathBuf {
    fresh_with(dir, bs, size, "orphan_file")
}

/// A fresh image without an orphan file: a journaled mount records
/// orphans on the orphan list (`s_last_orphan`).
pub fn fresh_list(dir: &Path, bs: usize, size: &str) -> PathBuf {
    fresh_with(dir, bs, size, "^orphan_file")
}

/// A fresh mkfs.ext4 image with `-O features`.
pub fn fresh_with(dir: &Path, bs: usize, size: &str, features: &str) -> PathBuf {
    let img = dir.join(format!("img{bs}"));
    mkfs_args(&img, &["-b", &bs.to_string(), "-O", features], size);
    img
}

/// `mkfs.ext4 -q -F ARGS img size`, which must succeed.
pub fn mkfs_args(img: &Path, args: &[&str], size: &str) {
    let out = Command::new(mkfs().unwrap())
        .args(["-q", "-F"])
        .args(args)
        .arg(img)
        .arg(size)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mkfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// e2fsck -fn must exit 0 and say nothing about counts, bitmaps or
/// checksums.
pub fn fsck_clean(img: &Path) {
    let out = Command::new(tool("e2fsck"))
        .args(["-fn"])
        .arg(img)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "e2fsck -fn failed:\n{text}");
    for bad in ["differences", "checksum", "count wrong", "Fix?"] {
        assert!(!text.contains(bad), "e2fsck -fn: {bad}:\n{text}");
    }
}

/// Run e2fsprogs tool `name` with `args` on `img`; it must succeed.
pub fn tool_ok(name: &str, args: &[&str], img: &Path) {
    let out = Command::new(tool(name))
        .args(args)
        .arg(img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `e2fsck` with `flag` on `img`: (exit code, stdout + stderr).
pub fn e2fsck(img: &Path, flag: &str) -> (i32, String) {
    let out = Command::new(tool("e2fsck"))
        .arg(flag)
        .arg(img)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `e2fsck -fn` after a crash: it must find nothing but the superblock's
/// free block and inode totals, which may lag after a crash as the
/// kernel's do (the group descriptors hold the true counts), and its
/// optimization hints for extent trees ("could be narrower/shorter ...
/// Optimize? no", exit 0: trees split in place, the kernel's included,
/// leave nodes part full). Returns its text (stdout and stderr).
pub fn fsck_ok_but_free_totals(img: &Path, what: &str) -> String {
    let (code, text) = e2fsck(img, "-fn");
    let bad: Vec<&str> = text
        .lines()
        .filter(|l| {
            let hint = l.contains(" extent tree (at level ")
                && (l.contains(") could be narrower.  Optimize? no")
                    || l.contains(") could be shorter.  Optimize? no"));
            !(hint
                || l.starts_with("Free blocks count wrong (")
                || l.starts_with("Free inodes count wrong (")
                || l.starts_with("Fix? no")
                || l.starts_with("Pass ")
                || l.starts_with("e2fsck ")
                || l.contains(" files (")
                || l.trim().is_empty())
        })
        .collect();
    assert!(
        (code == 0 || code == 4) && bad.is_empty(),
        "{what}: e2fsck -fn exit {code}:\n{text}"
    );
    text
}

/// The inode number debugfs gives for `name` (a path in the image).
pub fn ino_of(img: &Path, name: &str) -> u32 {
    let out = debugfs_ro(img, &format!("stat {name}"));
    out.split("Inode: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("debugfs stat {name}: {out}"))
}

/// A field of `dumpe2fs -h`.
pub fn sb_field(img: &Path, name: &str) -> String {
    let out = Command::new(tool("dumpe2fs"))
        .arg("-h")
        .arg(img)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in dumpe2fs -h"))
        .trim()
        .to_string()
}

/// debugfs's answer to `req` (read-only).
pub fn debugfs_ro(img: &Path, req: &str) -> String {
    let out = Command::new(tool("debugfs"))
        .args(["-R", req])
        .arg(img)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A kernel mount of `img` at `dir` (loop, read-only), unmounted on drop;
/// None (with the reason printed) where the machine refuses.
pub struct KMount(pub PathBuf);

impl KMount {
    pub fn new(img: &Path, dir: &Path) -> Option<KMount> {
        KMount::with_options(img, dir, "loop,ro")
    }
    /// The same, read-write.
    pub fn rw(img: &Path, dir: &Path) -> Option<KMount> {
        KMount::with_options(img, dir, "loop")
    }
    /// The same with the mount options `opts`.
    pub fn with_options(img: &Path, dir: &Path, opts: &str) -> Option<KMount> {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("SKIP: cannot make the mount point {}: {e}", dir.display());
            return None;
        }
        let out = match Command::new("mount")
            .args(["-t", "ext4", "-o", opts])
            .arg(img)
            .arg(dir)
            .output()
        {
            Ok(out) => out,
            Err(e) => {
                eprintln!("SKIP: cannot run mount(8) to loop-mount ext4: {e}");
                return None;
            }
        };
        if !out.status.success() {
            eprintln!(
                "SKIP: cannot loop-mount ext4 here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        Some(KMount(dir.to_path_buf()))
    }
}

impl Drop for KMount {
    /// Unmount; while something still holds the mount (a descriptor
    /// dropped after this, a child that has not exec'd yet), detach it
    /// lazily instead, so that no test leaves a mount (and its loop
    /// device) behind.
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// `host_tree` with nanosecond mtimes.
pub fn host_tree_ns(root: &Path) -> BTreeMap<String, Node> {
    let mut t = host_tree(root);
    for (k, n) in t.iter_mut() {
        let m = std::fs::symlink_metadata(root.join(k.trim_start_matches('/'))).unwrap();
        n.mtime = (m.mtime(), m.mtime_nsec());
    }
    t
}

/// statvfs(2) of a host path.
pub fn statvfs(p: &Path) -> libc::statvfs {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: statvfs is plain data; zeroes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid path and st a valid out-pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st
}

/// A read-write journaled open for tests: no commit thread (commits only at
/// fsync, sync and unmount, so a test controls them), a journal left by a
/// crash replayed onto the image.
pub fn rw_journaled() -> scalevfs_ext4::Ext4Options {
    scalevfs_ext4::Ext4Options {
        ro: false,
        commit_interval: 0,
        replay: scalevfs_ext4::journal::Replay::OnDevice,
        ..scalevfs_ext4::Ext4Options::default()
    }
}

/// Recover a crash state as a mount does: our journal replay, then a
/// read-write mount (which frees the orphans); `read` what the test
/// checks, unmount cleanly. Returns the image afterwards and what was read.
pub fn recover<S>(image: Vec<u8>, read: impl FnOnce(&scalevfs::Vfs) -> S) -> (Vec<u8>, S) {
    use scalevfs_ext4::BlockDevice;
    let dev = std::sync::Arc::new(scalevfs_ext4::MemDevice::new(image));
    let e = Ext4::open_device(Box::new(dev.clone()), rw_journaled()).unwrap();
    let vfs = scalevfs::Vfs::with_root_fs(Default::default(), e.clone());
    let got = read(&vfs);
    drop(vfs);
    e.unmount().unwrap();
    let mut img = vec![0u8; dev.size() as usize];
    dev.read_at(0, &mut img).unwrap();
    (img, got)
}

/// The crash states of a workload recorded on a copy of `img` (`cap`
/// writes at most; `CrashLog::states(3, bs + 11)`), each recovered
/// (`recover` with `read`): it must be the state of the fsync point at or
/// before its flushed writes or of the next (`workload` returns the
/// points: writes recorded, state), and e2fsck clean but for the free
/// totals (written to `state_img` to check). A state that is neither fails
/// with "{label} {n} (flushed .., in flight ..): " and `shown(state, i,
/// the two points)`. Returns the number of states and of points.
#[allow(clippy::too_many_arguments)]
pub fn check_crash_states<S: PartialEq>(
    img: &Path,
    state_img: &Path,
    bs: usize,
    cap: usize,
    workload: impl FnOnce(
        &std::sync::Arc<scalevfs_ext4::crashdev::RecordingDevice<scalevfs_ext4::MemDevice>>,
    ) -> Vec<(usize, S)>,
    read: fn(&scalevfs::Vfs) -> S,
    label: &str,
    shown: impl Fn(&S, usize, &[(usize, S)]) -> String,
) -> (usize, usize) {
    use scalevfs_ext4::crashdev::{CrashLog, RecordingDevice};
    let base = std::fs::read(img).unwrap();
    let rec = std::sync::Arc::new(RecordingDevice::new(
        scalevfs_ext4::MemDevice::new(base.clone()),
        cap,
    ));
    let points = workload(&rec);
    let log = CrashLog {
        base,
        ops: rec.ops(),
    };
    let mut n = 0;
    log.states(3, bs as u64 + 11, &mut |st| {
        n += 1;
        let i = point_at(&points, st.flushed_writes);
        let (img_after, got) = recover(st.image.clone(), read);
        let ok = &points[i..(i + 2).min(points.len())];
        assert!(
            ok.iter().any(|(_, p)| *p == got),
            "{label} {n} (flushed {}, in flight {:?}): {}",
            st.flushed_writes,
            st.in_flight,
            shown(&got, i, ok)
        );
        std::fs::write(state_img, &img_after).unwrap();
        fsck_ok_but_free_totals(state_img, &format!("{label} {n}"));
        true
    });
    (n, points.len())
}

/// At offset `o` of the file `fd`: ftruncate to `o`, then a pwrite of 100
/// bytes there; the results as (0, bytes written) or errnos.
pub fn our_truncate_write(
    t: &scalevfs::Task,
    fd: i32,
    o: u64,
) -> (Result<u64, i32>, Result<u64, i32>) {
    let er = |r: scalevfs::Errno| r.raw();
    (
        t.ftruncate(fd, o as i64).map(|_| 0).map_err(er),
        t.pwrite(fd, &[7u8; 100], o as i64)
            .map(|n| n as u64)
            .map_err(er),
    )
}

/// `our_truncate_write` through the kernel, on the open file `f`.
pub fn kernel_truncate_write(f: &std::fs::File, o: u64) -> (Result<u64, i32>, Result<u64, i32>) {
    use std::os::fd::AsRawFd;
    let tr = f
        .set_len(o)
        .map(|_| 0)
        .map_err(|e| e.raw_os_error().unwrap());
    // SAFETY: a plain syscall on an open descriptor and a live buffer.
    let w = unsafe { libc::pwrite(f.as_raw_fd(), [7u8; 100].as_ptr().cast(), 100, o as i64) };
    let w = if w >= 0 {
        Ok(w as u64)
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    };
    (tr, w)
}

/// A new, empty file at `p` (created or truncated), open to read and
/// write.
pub fn create_rw(p: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(p)
        .unwrap()
}

/// The last of a crash test's fsync points (writes recorded, state) at or
/// before `flushed` writes (0 when none is).
pub fn point_at<S>(points: &[(usize, S)], flushed: usize) -> usize {
    points.iter().rposition(|(w, _)| *w <= flushed).unwrap_or(0)
}

/// `img` opened read-write with its journal (`rw_journaled`) as the root
/// filesystem of a new VFS.
pub fn mount(img: &Path) -> (std::sync::Arc<Ext4>, scalevfs::Vfs) {
    let e = Ext4::open(img, rw_journaled()).unwrap();
    let vfs = scalevfs::Vfs::with_root_fs(Default::default(), e.clone());
    (e, vfs)
}

/// Unmount a filesystem `mount` gave (its task `t` first, then the VFS),
/// and check that e2fsck finds `img` clean (`fsck_clean`).
pub fn unmount_clean(t: scalevfs::Task, vfs: scalevfs::Vfs, e: std::sync::Arc<Ext4>, img: &Path) {
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(img);
}

/// A fresh mkfs.ext4 image with 1 KiB blocks (`fresh`) of `size`, mounted
/// (`mount`); `None`, with the reason printed, where mkfs.ext4 or e2fsck
/// is missing. The scratch directory goes when the first field is dropped.
pub fn mount_fresh(
    tag: &str,
    size: &str,
) -> Option<(Scratch, PathBuf, std::sync::Arc<Ext4>, scalevfs::Vfs)> {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return None;
    }
    let s = Scratch::new(tag);
    let img = fresh(&s.0, 1024, size);
    let (e, vfs) = mount(&img);
    Some((s, img, e, vfs))
}

/// The kernel's `s_resv_clusters` pool of `img`, in blocks: 2% of the
/// filesystem, at most 4096 (clusters of one block).
pub fn resv_pool(img: &Path) -> u64 {
    let count: u64 = sb_field(img, "Block count").parse().unwrap();
    (count / 50).min(4096)
}

/// A file's extended attributes by name.
pub type Xattrs = BTreeMap<String, Vec<u8>>;

/// Every attribute of `p` (not following a symlink) as the kernel shows it.
pub fn host_xattrs(p: &Path) -> Xattrs {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 65536];
    // SAFETY: a plain syscall on valid pointers that outlive it.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0, "llistxattr {p:?}");
    let mut out = Xattrs::new();
    for name in buf[..n as usize]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
    {
        let cn = std::ffi::CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        // SAFETY: a plain syscall on valid pointers that outlive it.
        let r = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(r >= 0, "lgetxattr {p:?} {name:?}");
        v.truncate(r as usize);
        out.insert(String::from_utf8_lossy(name).into_owned(), v);
    }
    out
}

/// Every attribute of `p` (not following a symlink) as scalevfs shows it.
pub fn our_xattrs(t: &scalevfs::Task, p: &str) -> Xattrs {
    let mut out = Xattrs::new();
    for name in t.xattr_names(p, scalevfs::AT_SYMLINK_NOFOLLOW).unwrap() {
        let v = t
            .xattr_value(p, &name, scalevfs::AT_SYMLINK_NOFOLLOW)
            .unwrap_or_else(|e| panic!("{p} {:?}: {e}", String::from_utf8_lossy(&name)));
        out.insert(String::from_utf8_lossy(&name).into_owned(), v);
    }
    out
}

/// FS_IOC_FIEMAP = _IOWR('f', 11, struct fiemap).
pub const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;

/// The kernel's FIEMAP of `path` over `[start, start + len)`.
pub fn kernel_fiemap(
    path: &std::path::Path,
    start: u64,
    len: u64,
) -> Result<Vec<scalevfs::fstype::FiemapExtent>, i32> {
    let f = std::fs::File::open(path).unwrap();
    use std::os::fd::AsRawFd;
    fiemap_fd(f.as_raw_fd(), start, len)
}

/// The kernel's FIEMAP of the open file `fd`.
pub fn fiemap_fd(
    fd: i32,
    start: u64,
    len: u64,
) -> Result<Vec<scalevfs::fstype::FiemapExtent>, i32> {
    let n = 8192usize;
    // struct fiemap (32 bytes) then n struct fiemap_extent (56 bytes).
    let mut buf = vec![0u64; (32 + 56 * n) / 8];
    buf[0] = start;
    buf[1] = len;
    buf[2] = u64::from(scalevfs::fstype::FIEMAP_FLAG_SYNC);
    buf[3] = n as u64;
    // SAFETY: the buffer is a struct fiemap with room for n extents.
    let r = unsafe { libc::ioctl(fd, FS_IOC_FIEMAP, buf.as_mut_ptr()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    let mapped = (buf[2] >> 32) as usize;
    assert!(mapped < n);
    Ok((0..mapped)
        .map(|i| {
            let x = &buf[4 + i * 7..4 + i * 7 + 7];
            scalevfs::fstype::FiemapExtent {
                logical: x[0],
                physical: x[1],
                length: x[2],
                flags: x[5] as u32,
            }
        })
        .collect())
}

/// Deterministic xorshift64* for randomized tests, so that a failing case
/// can be replayed from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (0 for `n` 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A device whose flush sleeps (a disk's cache flush) before the inner
/// device's: the given time, or with `jitter` zero to three times it,
/// varying from flush to flush (so that of two flushes begun in one order,
/// the second often ends first).
pub struct SlowFlush<D> {
    pub dev: std::sync::Arc<D>,
    pub time: std::time::Duration,
    pub jitter: bool,
    pub flushes: std::sync::atomic::AtomicU32,
}

impl<D> SlowFlush<D> {
    pub fn new(dev: std::sync::Arc<D>, time: std::time::Duration, jitter: bool) -> Self {
        SlowFlush {
            dev,
            time,
            jitter,
            flushes: std::sync::atomic::AtomicU32::new(0),
        }
    }
}

impl<D: scalevfs_ext4::BlockDevice> scalevfs_ext4::BlockDevice for SlowFlush<D> {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.dev.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> std::io::Result<()> {
        self.dev.write_at(off, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        // Relaxed: a counter that only varies the delay.
        let k = self
            .flushes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let times = if self.jitter {
            k.wrapping_mul(2_654_435_761) >> 30
        } else {
            1
        };
        std::thread::sleep(self.time * times);
        self.dev.flush()
    }
    fn size(&self) -> u64 {
        self.dev.size()
    }
}

/// Open `path` through `t` for writing (created if missing, mode 0644),
/// run `f` on the descriptor and close it; errnos as raw numbers (the
/// kernel-differential tests compare them with the host's).
pub fn with_wfd(
    t: &scalevfs::Task,
    path: &str,
    f: &dyn Fn(i32) -> Result<u64, scalevfs::Errno>,
) -> Result<u64, i32> {
    let e = |r: scalevfs::Errno| r.raw();
    let fd = t
        .open(path, scalevfs::O_CREAT | scalevfs::O_WRONLY, 0o644)
        .map_err(e)?;
    let r = f(fd).map_err(e);
    t.close(fd).map_err(e)?;
    r
}

/// The number after `key` in `text` (its leading digits: "3-129" is 3).
pub fn num_after(text: &str, key: &str) -> u64 {
    text.split(key)
        .nth(1)
        .map(|r| {
            r.trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {key:?} in {text}"))
}

/// A device that forwards to `inner` after asking a hook, for the tests of
/// error paths and of how a filesystem writes: `on_read` sees each read's
/// offset and length, `on_write` each write's offset and bytes; either
/// may count, or fail the call with its error (the device untouched).
pub struct Hooked<D> {
    pub inner: D,
    pub on_read: ReadHook,
    pub on_write: WriteHook,
}

/// `Hooked::on_read`: the offset and length of a read.
pub type ReadHook = Box<dyn Fn(u64, usize) -> std::io::Result<()> + Send + Sync>;
/// `Hooked::on_write`: the offset and bytes of a write.
pub type WriteHook = Box<dyn Fn(u64, &[u8]) -> std::io::Result<()> + Send + Sync>;

impl<D: scalevfs_ext4::BlockDevice> Hooked<D> {
    /// `inner` with hooks that let everything through.
    pub fn new(inner: D) -> Hooked<D> {
        Hooked {
            inner,
            on_read: Box::new(|_, _| Ok(())),
            on_write: Box::new(|_, _| Ok(())),
        }
    }
}

impl<D: scalevfs_ext4::BlockDevice> scalevfs_ext4::BlockDevice for Hooked<D> {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> std::io::Result<()> {
        (self.on_read)(off, buf.len())?;
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> std::io::Result<()> {
        (self.on_write)(off, buf)?;
        self.inner.write_at(off, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}
