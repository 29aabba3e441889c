//! Review probe: stepped INSERT_RANGE / COLLAPSE_RANGE (`shift_step`,
//! forced with `set_stepped_shifts`, many commits with `set_txn_limit`)
//! against the one-handle rewrite on a copy of the same image: same
//! results, sizes, bytes and block maps (FIEMAP, per block), and both
//! images e2fsck clean. Trees of depth 2 and 3 (1 KiB blocks), written
//! by scalevfs, by mke2fs -d or by the kernel; and the kernel itself
//! (loop mount) doing the same ops: same errors, sizes, bytes and
//! written/unwritten block maps.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::process::Command;
use std::sync::Arc;

use common::*;
use scalevfs::io::{FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE, FALLOC_FL_KEEP_SIZE};
use scalevfs::{Task, Vfs, O_CREAT, O_RDWR};
use scalevfs_ext4::{BlockDevice, Ext4, MemDevice};

const BS: u64 = 1024;

fn block(k: u64) -> Vec<u8> {
    let mut b = vec![(k % 251) as u8 | 1; BS as usize];
    b[..8].copy_from_slice(&k.to_le_bytes());
    b
}

type Map = BTreeMap<u64, (u64, bool)>;

fn map_of(t: &Task, fd: i32) -> Map {
    let mut m = Map::new();
    for x in t.fiemap(fd, 0, u64::MAX, 0).unwrap() {
        for i in 0..x.length / BS {
            m.insert(
                x.logical / BS + i,
                (x.physical / BS + i, x.flags & 0x800 != 0),
            );
        }
    }
    m
}

fn bytes_of(t: &Task, fd: i32) -> Vec<u8> {
    let size = t.fstat(fd).unwrap().size as usize;
    let mut b = vec![0u8; size + 1];
    let mut n = 0;
    while n < b.len() {
        let r = t.pread(fd, &mut b[n..], n as i64).unwrap();
        if r == 0 {
            break;
        }
        n += r;
    }
    b.truncate(n);
    b
}

struct Side {
    mem: Arc<MemDevice>,
    e: Arc<Ext4>,
    vfs: Vfs,
}

fn open_side(img: &[u8], stepped: bool) -> Side {
    let mem = Arc::new(MemDevice::new(img.to_vec()));
    let e = Ext4::open_device(Box::new(mem.clone()), rw_journaled()).unwrap();
    if stepped {
        e.set_stepped_shifts(true);
        e.set_txn_limit(8);
    }
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    Side { mem, e, vfs }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Ins(u64, u64),
    Col(u64, u64),
    /// fallocate (KEEP_SIZE if true) of blocks a..a+k.
    Pre(u64, u64, bool),
}

/// The kernel's side: the same ops on a loop-mounted copy.
struct KSide {
    // Dropped in this order: the file, then the mount (a mount with an
    // open file cannot be unmounted).
    f: std::fs::File,
    _m: KMount,
}

fn kernel_map(f: &std::fs::File) -> BTreeMap<u64, bool> {
    use std::os::fd::AsRawFd;
    let mut m = BTreeMap::new();
    // Windows of 8,000 blocks: at most ~4,000 extents each (`fiemap_fd`
    // holds 8,192).
    let end = (f.metadata().unwrap().len() / BS).max(70_000) + 1000;
    let mut at = 0;
    while at < end {
        for x in fiemap_fd(f.as_raw_fd(), at * BS, 8000 * BS).unwrap() {
            for i in 0..x.length / BS {
                m.insert(x.logical / BS + i, x.flags & 0x800 != 0);
            }
        }
        at += 8000;
    }
    m
}

fn kernel_op(f: &std::fs::File, op: Op) -> Result<(), i32> {
    use std::os::fd::AsRawFd;
    let (mode, a, k) = match op {
        Op::Ins(a, k) => (libc::FALLOC_FL_INSERT_RANGE, a, k),
        Op::Col(a, k) => (libc::FALLOC_FL_COLLAPSE_RANGE, a, k),
        Op::Pre(a, k, keep) => (if keep { libc::FALLOC_FL_KEEP_SIZE } else { 0 }, a, k),
    };
    // SAFETY: fallocate on an open descriptor; no memory is passed.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, (a * BS) as i64, (k * BS) as i64) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(())
    }
}

fn run(name: &str, img: &std::path::Path, ops: &[Op]) {
    let base = std::fs::read(img).unwrap();
    let ks = Scratch::new(&format!("shiftrev-k-{name}"));
    let kimg = ks.0.join("img");
    std::fs::write(&kimg, &base).unwrap();
    let kside = KMount::rw(&kimg, &ks.0.join("mnt")).map(|m| {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(m.0.join("f"))
            .unwrap();
        KSide { _m: m, f }
    });
    let sides = [open_side(&base, true), open_side(&base, false)];
    let tasks: Vec<Task> = sides.iter().map(|s| s.vfs.root_task()).collect();
    let fds: Vec<i32> = tasks
        .iter()
        .map(|t| t.open("/f", O_RDWR, 0).unwrap())
        .collect();
    let commits0 = sides[0].e.commit_stats().0;
    for (n, op) in ops.iter().enumerate() {
        let mut res = Vec::new();
        for (t, &fd) in tasks.iter().zip(&fds) {
            let r = match *op {
                Op::Ins(a, k) => {
                    t.fallocate(fd, FALLOC_FL_INSERT_RANGE, (a * BS) as i64, (k * BS) as i64)
                }
                Op::Col(a, k) => t.fallocate(
                    fd,
                    FALLOC_FL_COLLAPSE_RANGE,
                    (a * BS) as i64,
                    (k * BS) as i64,
                ),
                Op::Pre(a, k, keep) => t.fallocate(
                    fd,
                    if keep { FALLOC_FL_KEEP_SIZE } else { 0 },
                    (a * BS) as i64,
                    (k * BS) as i64,
                ),
            };
            res.push((r, t.fstat(fd).unwrap().size));
        }
        assert_eq!(
            res[0], res[1],
            "{name}: op {n} {op:?}: stepped vs one handle"
        );
        let m0 = map_of(&tasks[0], fds[0]);
        let m1 = map_of(&tasks[1], fds[1]);
        if m0 != m1 {
            let d: Vec<_> = m0
                .iter()
                .filter(|(k, v)| m1.get(k) != Some(v))
                .take(5)
                .collect();
            let d1: Vec<_> = m1
                .iter()
                .filter(|(k, v)| m0.get(k) != Some(v))
                .take(5)
                .collect();
            panic!("{name}: op {n} {op:?}: maps differ: stepped {d:?} one {d1:?}");
        }
        let b0 = bytes_of(&tasks[0], fds[0]);
        let b1 = bytes_of(&tasks[1], fds[1]);
        assert!(b0 == b1, "{name}: op {n} {op:?}: bytes differ");
        if let Some(k) = &kside {
            let r = kernel_op(&k.f, *op);
            let ours = res[0].0.map_err(|e| e.raw());
            assert_eq!(ours, r, "{name}: op {n} {op:?}: vs the kernel");
            assert_eq!(
                res[0].1,
                k.f.metadata().unwrap().len(),
                "{name}: op {n} size"
            );
            let km = kernel_map(&k.f);
            let om: BTreeMap<u64, bool> = m0.iter().map(|(&l, &(_, u))| (l, u)).collect();
            if km != om {
                let d: Vec<_> = om
                    .iter()
                    .filter(|(l, v)| km.get(l) != Some(v))
                    .take(5)
                    .collect();
                let d1: Vec<_> = km
                    .iter()
                    .filter(|(l, v)| om.get(l) != Some(v))
                    .take(5)
                    .collect();
                panic!(
                    "{name}: op {n} {op:?}: maps differ from the kernel: ours {d:?} kernel {d1:?}"
                );
            }
            let mut kb = vec![0u8; b0.len() + 1];
            let mut got = 0;
            while got < kb.len() {
                let r = k.f.read_at(&mut kb[got..], got as u64).unwrap();
                if r == 0 {
                    break;
                }
                got += r;
            }
            kb.truncate(got);
            assert!(
                kb == b0,
                "{name}: op {n} {op:?}: bytes differ from the kernel"
            );
        }
    }
    // The stepped side shifted a leaf per handle, over many commits.
    let commits = sides[0].e.commit_stats().0 - commits0;
    assert!(commits > ops.len() as u64, "{name}: only {commits} commits");
    // Still writing: a write into the file on each side.
    for (t, &fd) in tasks.iter().zip(&fds) {
        assert_eq!(t.pwrite(fd, &block(7), (3 * BS) as i64), Ok(BS as usize));
        t.fsync(fd).unwrap();
        t.close(fd).unwrap();
    }
    drop(tasks);
    if let Some(k) = kside {
        k.f.sync_all().unwrap();
        drop(k);
        fsck_clean(&kimg);
    }
    let s = Scratch::new(&format!("shiftrev-{name}"));
    for (i, side) in sides.into_iter().enumerate() {
        let Side { mem, e, vfs } = side;
        drop(vfs);
        e.unmount().unwrap();
        drop(e);
        let mut out = vec![0u8; mem.size() as usize];
        mem.read_at(0, &mut out).unwrap();
        let p = s.0.join(format!("img{i}"));
        std::fs::write(&p, &out).unwrap();
        fsck_clean(&p);
    }
}

/// An image whose /f has `n` one-block extents at odd blocks, written by
/// mke2fs -d from a sparse file.
fn mke2fs_image(s: &Scratch, n: u64, size: &str) -> std::path::PathBuf {
    mke2fs_image_with(s, n, size, &[])
}

fn mke2fs_image_with(s: &Scratch, n: u64, size: &str, extra: &[&str]) -> std::path::PathBuf {
    let src = s.0.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let f = std::fs::File::create(src.join("f")).unwrap();
    for k in 0..n {
        f.write_at(&block(k), (2 * k + 1) * BS).unwrap();
    }
    drop(f);
    let img = s.0.join("img");
    let out = Command::new(mkfs().unwrap())
        .args(["-q", "-F", "-b", "1024", "-m", "0"])
        .args(extra)
        .arg("-d")
        .arg(&src)
        .arg(&img)
        .arg(size)
        .output()
        .unwrap();
    assert!(out.status.success());
    std::fs::remove_dir_all(&src).unwrap();
    img
}

/// An image whose /f scalevfs wrote: `n` one-block extents at odd
/// blocks, a long extent at `long..long + 40`, preallocated holes in the
/// middle and KEEP_SIZE preallocation past EOF.
fn our_image(s: &Scratch, n: u64, size: &str) -> std::path::PathBuf {
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "1024", "-m", "0"], size);
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    for k in 0..n {
        t.pwrite(fd, &block(k), ((2 * k + 1) * BS) as i64).unwrap();
    }
    let long = 2 * n + 10;
    let run: Vec<u8> = (0..40).flat_map(|j| block(100_000 + j)).collect();
    t.pwrite(fd, &run, (long * BS) as i64).unwrap();
    // Unwritten blocks in the holes of extents 200..260.
    t.fallocate(fd, 0, (400 * BS) as i64, (120 * BS) as i64)
        .unwrap();
    let size_now = t.fstat(fd).unwrap().size;
    t.fallocate(fd, FALLOC_FL_KEEP_SIZE, size_now as i64, (300 * BS) as i64)
        .unwrap();
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
    img
}

#[test]
fn stepped_shifts_match_one_handle_on_our_depth2_tree() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("shiftrev-ours2");
    // ~2000 extents: depth 2 with 1 KiB blocks.
    let n = 2000;
    let img = our_image(&s, n, "32M");
    let long = 2 * n + 10;
    let leaf = 2 * 84;
    run(
        "ours2",
        &img,
        &[
            Op::Ins(5, 3),
            Op::Col(5, 3),
            Op::Ins(long + 7, 2),
            Op::Ins(leaf * 3 + 1, 4),
            Op::Col(leaf * 3 + 1, 4),
            Op::Col(leaf * 2, leaf * 3),
            Op::Ins(2 * n - 5, 1),
            Op::Col(2 * n - 30, 20),
            Op::Ins(0, 1),
            Op::Col(0, 1),
            Op::Col(390, 150),
            Op::Ins(420, 9),
            Op::Pre(2 * n + 60, 20, false),
            Op::Ins(100, 1),
            Op::Col(1, 2 * n - 100),
            Op::Ins(1, 500),
        ],
    );
}

#[test]
fn stepped_shifts_match_one_handle_on_a_mke2fs_depth3_tree() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("shiftrev-mk3");
    let n = 30_000;
    let img = mke2fs_image(&s, n, "96M");
    run(
        "mk3",
        &img,
        &[
            Op::Ins(5, 3),
            Op::Col(5, 3),
            Op::Ins(2 * n - 3, 2),
            Op::Col(2 * n - 50, 40),
            Op::Col(20_000, 20_000),
            Op::Ins(17, 33),
            Op::Pre(2 * n, 10, true),
            Op::Ins(30_001, 2),
            Op::Ins(0, 2),
            Op::Col(0, 1),
            Op::Col(0, 2),
        ],
    );
}

/// A tree the kernel wrote (and punched), then shifted stepped.
#[test]
fn stepped_shifts_match_one_handle_and_the_kernel_on_a_kernel_tree() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("shiftrev-kern");
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "1024", "-m", "0"], "32M");
    {
        let Some(m) = KMount::rw(&img, &s.0.join("mnt")) else {
            return;
        };
        let f = std::fs::File::create(m.0.join("f")).unwrap();
        for k in 0..3000u64 {
            f.write_at(&block(k), (2 * k + 1) * BS).unwrap();
        }
        let long: Vec<u8> = (0..50).flat_map(|j| block(50_000 + j)).collect();
        f.write_at(&long, 6100 * BS).unwrap();
        f.sync_all().unwrap();
        // Punches that remove the first extents of leaves.
        for (a, k) in [(0u64, 4u64), (330, 40), (1000, 200)] {
            use std::os::fd::AsRawFd;
            // SAFETY: fallocate on an open descriptor.
            let r = unsafe {
                libc::fallocate(
                    f.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    (a * BS) as i64,
                    (k * BS) as i64,
                )
            };
            assert_eq!(r, 0);
        }
        let size = f.metadata().unwrap().len();
        // SAFETY: fallocate on an open descriptor.
        let r = unsafe {
            use std::os::fd::AsRawFd;
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                size as i64,
                (100 * BS) as i64,
            )
        };
        assert_eq!(r, 0);
        // Unwritten blocks in holes in the middle.
        // SAFETY: fallocate on an open descriptor.
        let r = unsafe {
            use std::os::fd::AsRawFd;
            libc::fallocate(f.as_raw_fd(), 0, (3000 * BS) as i64, (300 * BS) as i64)
        };
        assert_eq!(r, 0);
        f.sync_all().unwrap();
    }
    fsck_clean(&img);
    run(
        "kern",
        &img,
        &[
            Op::Ins(0, 3),
            Op::Col(0, 3),
            Op::Ins(6120, 5),
            Op::Col(6110, 30),
            Op::Col(300, 200),
            Op::Ins(1500, 7),
            Op::Col(2990, 100),
            Op::Ins(5, 1),
            Op::Col(1, 4000),
        ],
    );
}

/// Leaves whose header gives less room than the block (eh_max 83 of 84,
/// as e2fsck allows), on a tree mke2fs wrote (no metadata_csum: the
/// header is patched in place).
#[test]
fn stepped_shifts_match_one_handle_on_leaves_with_a_smaller_eh_max() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("shiftrev-ehmax");
    let n = 3000;
    let img = mke2fs_image_with(&s, n, "32M", &["-O", "^metadata_csum"]);
    let out = debugfs_ro(&img, "ex /f");
    let depth: u32 = out
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("0/"))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap();
    let pre = format!("{}/", depth - 1);
    let leaves: Vec<u64> = out
        .lines()
        .filter(|l| l.trim_start().starts_with(&pre))
        .filter_map(|l| l.split_whitespace().rev().nth(1)?.parse().ok())
        .collect();
    assert!(leaves.len() > 10, "{out}");
    let mut bytes = std::fs::read(&img).unwrap();
    let mut patched = 0;
    for b in leaves {
        let h = (b * BS) as usize;
        assert_eq!(&bytes[h..h + 2], &[0x0a, 0xf3]);
        let entries = u16::from_le_bytes([bytes[h + 2], bytes[h + 3]]);
        if entries <= 83 {
            bytes[h + 4..h + 6].copy_from_slice(&83u16.to_le_bytes());
            patched += 1;
        }
    }
    assert!(patched > 10);
    std::fs::write(&img, &bytes).unwrap();
    fsck_clean(&img);
    run(
        "ehmax",
        &img,
        &[
            Op::Pre(12, 1, false),
            Op::Ins(5, 3),
            Op::Ins(1001, 2),
            Op::Col(990, 400),
            Op::Ins(2 * n - 10, 7),
            Op::Col(1, 7),
            Op::Ins(0, 1),
        ],
    );
}
