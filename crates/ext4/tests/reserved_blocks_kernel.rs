//! Who may fill an ext4 filesystem how far, against the kernel's ext4 on a
//! copy of the same image (`ext4_has_free_clusters`): an ordinary user
//! stops where `f_bavail` reaches 0 (the reserved blocks and the 2%
//! `s_resv_clusters` pool left); root goes on into the reserved blocks
//! and stops at the pool; a hole punched in the middle of a file (an
//! extent split that needs a leaf) may take the pool. Before, everyone
//! stopped at the reserved blocks: root got less than on the kernel, and
//! a user got the pool too, past the `f_bavail` of our own `statfs`.

mod common;

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use common::*;
use scalevfs::{Cred, Task, O_CREAT, O_RDWR};

const USER: u32 = 1000;
const CHUNK: usize = 64 * 1024;

/// What each step left: (file bytes, file 512-byte blocks, fs free
/// blocks, fs available blocks), after the user's fill, root's fill and
/// the punch.
type Steps = Vec<(u64, u64, u64, u64)>;

fn kernel_side(img: &Path, dir: &Path) -> Option<Steps> {
    let km = KMount::with_options(img, dir, "loop,nodelalloc")?;
    let statfs = |dir: &Path| {
        let s = statvfs(dir);
        (s.f_bfree, s.f_bavail)
    };
    let mut steps = Vec::new();
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    // The user's fill, in a child with the user's ids (groups cleared).
    let fill = |who: Option<u32>, name: &str| {
        let mut c = Command::new("dd");
        c.arg("if=/dev/zero")
            .arg(format!("of={}", dir.join(name).display()))
            .arg(format!("bs={CHUNK}"))
            .arg("count=100000");
        if let Some(u) = who {
            // (std drops root's supplementary groups along with the ids.)
            c.uid(u).gid(u);
        }
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("No space left"),
            "dd did not fill the filesystem up: {err}"
        );
        let m = std::fs::metadata(dir.join(name)).unwrap();
        let (f, a) = statfs(dir);
        (m.size(), m.blocks(), f, a)
    };
    steps.push(fill(Some(USER), "u"));
    steps.push(fill(None, "r"));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("u"))
        .unwrap();
    steps.push(punch_host(&f, dir, "u"));
    drop(f);
    drop(km);
    Some(steps)
}

/// Where the punch goes: one block in the middle of each of the first
/// extents' worth of the file, so that the file's extents no longer fit
/// the inode and the split needs a leaf block.
fn punch_offsets(size: u64, bs: u64) -> Vec<u64> {
    (1..=6).map(|k| (size / 8 * k) / bs * bs).collect()
}

fn punch_host(f: &std::fs::File, dir: &Path, name: &str) -> (u64, u64, u64, u64) {
    use std::os::fd::AsRawFd;
    let size = f.metadata().unwrap().len();
    let bs = statvfs(dir).f_bsize;
    for off in punch_offsets(size, bs) {
        // SAFETY: a valid fd; plain integer arguments.
        let r = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as i64,
                bs as i64,
            )
        };
        assert_eq!(r, 0, "kernel punch: {}", std::io::Error::last_os_error());
    }
    let m = std::fs::metadata(dir.join(name)).unwrap();
    let st = statvfs(dir);
    let (fr, a) = (st.f_bfree, st.f_bavail);
    (m.size(), m.blocks(), fr, a)
}

fn ours(img: &Path) -> Steps {
    let (e, vfs) = mount(img);
    let root = vfs.root_task();
    root.chmod("/", 0o777).unwrap();
    let user = vfs.task(Cred::user(USER, USER));
    let statfs = |t: &Task| {
        let s = t.statfs("/").unwrap();
        (s.bfree, s.bavail)
    };
    let fill = |t: &Task, name: &str| {
        let fd = t.open(name, O_CREAT | O_RDWR, 0o644).unwrap();
        let buf = vec![0u8; CHUNK];
        loop {
            match t.write(fd, &buf) {
                Ok(n) if n == CHUNK => {}
                Ok(_) => {}
                Err(scalevfs::Errno::ENOSPC) => break,
                Err(e) => panic!("write: {e:?}"),
            }
        }
        // A write ends at the folio it could not map whole (up to 64
        // blocks here): the last blocks go one at a time, so that ours
        // fills up to the limit exactly.
        let one = vec![0u8; t.statfs("/").unwrap().bsize as usize];
        while t.write(fd, &one).is_ok() {}
        t.close(fd).unwrap();
        let st = t.stat(name).unwrap();
        let (f, a) = statfs(t);
        (st.size, st.blocks, f, a)
    };
    let mut steps = vec![fill(&user, "/u"), fill(&root, "/r")];
    let fd = root.open("/u", O_RDWR, 0).unwrap();
    let size = root.fstat(fd).unwrap().size;
    let bs = root.statfs("/").unwrap().bsize;
    for off in punch_offsets(size, bs) {
        root.fallocate(
            fd,
            scalevfs::io::FALLOC_FL_PUNCH_HOLE | scalevfs::io::FALLOC_FL_KEEP_SIZE,
            off as i64,
            bs as i64,
        )
        .unwrap();
    }
    root.close(fd).unwrap();
    let st = root.stat("/u").unwrap();
    let (f, a) = statfs(&root);
    steps.push((st.size, st.blocks, f, a));
    drop(user);
    unmount_clean(root, vfs, e, img);
    steps
}

fn compare(bs: usize) {
    if !have_tools() {
        return;
    }
    let s = Scratch::new(&format!("reserved-{bs}"));
    let img = fresh(&s.0, bs, "64M");
    // The user reaches the kernel's mount point through the scratch
    // directory.
    std::fs::set_permissions(&s.0, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let kimg = s.0.join("kernel.img");
    std::fs::copy(&img, &kimg).unwrap();
    // Ours first: what it must do holds whether or not the kernel can
    // mount the copy here.
    let got = ours(&img);
    let blocks = |sectors: u64| sectors * 512 / bs as u64;
    let pool = resv_pool(&img);
    let freed = |v: &Steps| v[2].2 as i64 - v[1].2 as i64;
    // The user's fill: nothing available after it.
    assert!(got[0].0 > 0, "the user wrote nothing: {got:?}");
    assert_eq!(got[0].3, 0, "available after the user's fill");
    // Root's fill: into the reserved blocks, up to the pool.
    assert!(got[1].0 > 0, "root wrote nothing past the user: {got:?}");
    assert_eq!(got[1].2, pool, "free after root's fill: the pool");
    // The punches succeed (the split may take the pool) and free blocks.
    assert!(freed(&got) > 0, "the punches freed nothing: {got:?}");
    assert_eq!(got[2].0, got[0].0, "the punch keeps the size");
    let Some(kernel) = kernel_side(&kimg, &s.0.join("mnt")) else {
        eprintln!("SKIP bs {bs}: no kernel comparison; scalevfs alone: {got:?}");
        return;
    };
    fsck_clean(&kimg);
    eprintln!("bs {bs}: kernel {kernel:?}\n        scalevfs {got:?}");
    // The kernel's allocator stops a few blocks short of either limit (5
    // to 23 here; its statfs still shows them); ours stops exactly at it. Before this change the gaps were the whole pool
    // (the user went past it) and the whole reserve (root stopped short).
    const SLACK: u64 = 32;
    // The user's fill: (almost) nothing available on the kernel either.
    assert!(
        kernel[0].3 <= SLACK,
        "the kernel left {} available",
        kernel[0].3
    );
    let (k, g) = (blocks(kernel[0].1), blocks(got[0].1));
    assert!(
        g >= k && g - k <= SLACK,
        "the user's file: kernel {k} blocks, scalevfs {g}"
    );
    // Root's fill: the kernel too goes into the reserved blocks, up to
    // the pool.
    assert!(
        kernel[1].2 >= pool && kernel[1].2 - pool <= SLACK,
        "the kernel left {} free, the pool is {pool}",
        kernel[1].2
    );
    // The punches succeed on both and free as much.
    assert_eq!(freed(&got), freed(&kernel), "blocks the punches freed");
}

#[test]
fn reserved_blocks_like_kernel_4k() {
    compare(4096);
}

#[test]
fn reserved_blocks_like_kernel_1k() {
    compare(1024);
}
