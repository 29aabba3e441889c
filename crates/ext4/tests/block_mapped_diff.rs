//! Block-mapped files against the kernel: writes across every map
//! boundary, partial writes into holes, punches inside and across
//! indirect blocks, truncates; results, contents and st_blocks compared.

mod common;

use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use common::*;

#[derive(Clone, Debug)]
enum Op {
    Write(&'static str, u64, usize, u8),
    Truncate(&'static str, u64),
    Punch(&'static str, u64, u64),
}

type Res = Result<u64, i32>;

fn pat(n: usize, k: u8) -> Vec<u8> {
    (0..n)
        .map(|i| ((i % 251) as u8).wrapping_add(k) | 1)
        .collect()
}

fn kernel_op(root: &Path, op: &Op) -> Res {
    let p = |s: &str| root.join(s.trim_start_matches('/'));
    let e = |r: std::io::Error| r.raw_os_error().unwrap_or(-1);
    let open = |s: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(p(s))
            .map_err(e)
    };
    match op {
        Op::Write(s, off, n, k) => open(s)?
            .write_at(&pat(*n, *k), *off)
            .map(|n| n as u64)
            .map_err(e),
        Op::Truncate(s, n) => open(s)?.set_len(*n).map(|_| 0).map_err(e),
        Op::Punch(s, off, len) => {
            let f = open(s)?;
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            // SAFETY: a plain syscall on an open descriptor.
            let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, *off as i64, *len as i64) };
            if r == 0 {
                Ok(0)
            } else {
                Err(e(std::io::Error::last_os_error()))
            }
        }
    }
}

fn our_op(t: &scalevfs::Task, op: &Op) -> Res {
    let with = |s: &str, f: &dyn Fn(i32) -> Result<u64, scalevfs::Errno>| with_wfd(t, s, f);
    let punch = scalevfs::io::FALLOC_FL_PUNCH_HOLE | scalevfs::io::FALLOC_FL_KEEP_SIZE;
    match op {
        Op::Write(s, off, n, k) => with(s, &|fd| {
            t.pwrite(fd, &pat(*n, *k), *off as i64).map(|n| n as u64)
        }),
        Op::Truncate(s, n) => with(s, &|fd| t.ftruncate(fd, *n as i64).map(|_| 0)),
        Op::Punch(s, off, len) => with(s, &|fd| {
            t.fallocate(fd, punch, *off as i64, *len as i64).map(|_| 0)
        }),
    }
}

/// (size, st_blocks, digest of content as (offset, byte) of non-zero
/// bytes summarised by a hash) of each file.
fn summary_kernel(root: &Path, files: &[&str]) -> Vec<(String, u64, u64, u64)> {
    files
        .iter()
        .map(|f| {
            let p = root.join(f.trim_start_matches('/'));
            let m = std::fs::metadata(&p).unwrap();
            let file = std::fs::File::open(&p).unwrap();
            (
                f.to_string(),
                m.size(),
                m.blocks(),
                digest(m.size(), |b, o| file.read_at(b, o).unwrap()),
            )
        })
        .collect()
}

fn summary_ours(t: &scalevfs::Task, files: &[&str]) -> Vec<(String, u64, u64, u64)> {
    files
        .iter()
        .map(|f| {
            let st = t.stat(*f).unwrap();
            let fd = t.open(*f, scalevfs::O_RDONLY, 0).unwrap();
            let d = digest(st.size, |b, o| t.pread(fd, b, o as i64).unwrap());
            t.close(fd).unwrap();
            (f.to_string(), st.size, st.blocks, d)
        })
        .collect()
}

/// The file's data runs as SEEK_DATA / SEEK_HOLE give them, from 0 on
/// (at most 64 runs; `seek(off, data)` is the lseek, None for ENXIO). The
/// block map's holes are holes: this was "all data" (as the VFS default)
/// until the ext3-style kernel comparison found it.
fn seek_chain(size: u64, mut seek: impl FnMut(u64, bool) -> Option<u64>) -> Vec<(u64, u64)> {
    let mut runs = Vec::new();
    let mut off = 0;
    while off < size && runs.len() < 64 {
        let Some(d) = seek(off, true) else { break };
        let h = seek(d, false).expect("a hole after data (EOF at least)");
        runs.push((d, h));
        off = h;
    }
    runs
}

/// Reads the file in 1 MiB pieces, skipping all-zero pieces cheaply by
/// hashing only the non-zero bytes with their offsets.
fn digest(size: u64, mut read: impl FnMut(&mut [u8], u64) -> usize) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    let mut buf = vec![0u8; 1 << 16];
    let mut off = 0u64;
    // Only the regions that matter: the files here are sparse and huge;
    // read everything under 8 MiB, and 64 KiB windows every 1 MiB beyond.
    while off < size {
        let n = read(&mut buf, off);
        assert!(n > 0, "short read at {off} of {size}");
        for (i, &b) in buf[..n].iter().enumerate() {
            if b != 0 {
                h = (h ^ (off + i as u64)).wrapping_mul(0x100000001b3);
                h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
            }
        }
        off += n as u64;
        if off >= 8 << 20 {
            break;
        }
    }
    h
}

fn run_diff(tag: &str, mkfs: &[&str], size: &str, ops: &[Op], files: &[&str], extra: &[u64]) {
    let s = Scratch::new(tag);
    let img = s.0.join("ours");
    mkfs_args(&img, mkfs, size);
    let theirs = s.0.join("theirs");
    std::fs::copy(&img, &theirs).unwrap();
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let ours: Vec<Res> = ops.iter().map(|op| our_op(&t, op)).collect();
    let mut our_sum = summary_ours(&t, files);
    let our_runs: Vec<_> = files
        .iter()
        .map(|f| {
            let fd = t.open(*f, scalevfs::O_RDONLY, 0).unwrap();
            let size = t.fstat(fd).unwrap().size;
            let runs = seek_chain(size, |o, data| {
                let w = if data {
                    libc::SEEK_DATA
                } else {
                    libc::SEEK_HOLE
                };
                t.lseek(fd, o as i64, w as u32).ok()
            });
            t.close(fd).unwrap();
            runs
        })
        .collect();
    // Our FIEMAP, for the kernel's of the same image below.
    let our_maps: Vec<_> = files
        .iter()
        .map(|f| {
            let fd = t.open(*f, scalevfs::O_RDONLY, 0).unwrap();
            let m = t.fiemap(fd, 0, u64::MAX, 0).unwrap();
            t.close(fd).unwrap();
            m
        })
        .collect();
    // Windows at the given offsets (beyond the first 8 MiB).
    let mut our_win = Vec::new();
    for f in files {
        let fd = t.open(*f, scalevfs::O_RDONLY, 0).unwrap();
        for &o in extra {
            let mut b = vec![0u8; 8192];
            let n = t.pread(fd, &mut b, o as i64).unwrap();
            b.truncate(n);
            our_win.push((f.to_string(), o, b));
        }
        t.close(fd).unwrap();
    }
    unmount_clean(t, vfs, e, &img);
    // After a remount, the same.
    {
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        assert_eq!(summary_ours(&t, files), our_sum, "{tag}: after remount");
        unmount_clean(t, vfs, e, &img);
    }
    // The kernel's FIEMAP of our image equals ours (extents, flags).
    if let Some(km) = KMount::new(&img, &s.0.join("ours-mnt")) {
        for (f, ours) in files.iter().zip(&our_maps) {
            let k = kernel_fiemap(&km.0.join(f.trim_start_matches('/')), 0, u64::MAX).unwrap();
            assert_eq!(ours, &k, "{tag}: FIEMAP of {f}, ours vs the kernel's");
        }
    }
    let Some(km) = KMount::rw(&theirs, &s.0.join("mnt")) else {
        return;
    };
    let kernel: Vec<Res> = ops.iter().map(|op| kernel_op(&km.0, op)).collect();
    // Delayed allocation: st_blocks counts the indirect blocks once
    // written back.
    // SAFETY: a plain syscall.
    unsafe { libc::sync() };
    let mut k_sum = summary_kernel(&km.0, files);
    let k_runs: Vec<_> = files
        .iter()
        .map(|f| {
            let file = std::fs::File::open(km.0.join(f.trim_start_matches('/'))).unwrap();
            let size = file.metadata().unwrap().len();
            seek_chain(size, |o, data| {
                let w = if data {
                    libc::SEEK_DATA
                } else {
                    libc::SEEK_HOLE
                };
                // SAFETY: a plain syscall on an open descriptor.
                let r = unsafe { libc::lseek(file.as_raw_fd(), o as i64, w) };
                (r >= 0).then_some(r as u64)
            })
        })
        .collect();
    let mut k_win = Vec::new();
    for f in files {
        let file = std::fs::File::open(km.0.join(f.trim_start_matches('/'))).unwrap();
        for &o in extra {
            let mut b = vec![0u8; 8192];
            let n = file.read_at(&mut b, o).unwrap();
            b.truncate(n);
            k_win.push((f.to_string(), o, b));
        }
    }
    drop(km);
    fsck_clean(&theirs);
    for (i, op) in ops.iter().enumerate() {
        assert_eq!(ours[i], kernel[i], "{tag}: step {i} {op:?}");
    }
    assert_eq!(
        our_runs, k_runs,
        "{tag}: SEEK_DATA/SEEK_HOLE runs, ours vs kernel"
    );
    for (a, b) in our_win.iter().zip(&k_win) {
        assert!(a == b, "{tag}: window {} at {} differs", a.0, a.1);
    }
    our_sum.sort();
    k_sum.sort();
    assert_eq!(
        our_sum, k_sum,
        "{tag}: (file, size, st_blocks, digest) ours vs kernel"
    );
}

fn boundary_ops(bs: u64) -> Vec<Op> {
    let per = bs / 4;
    let s1 = 12 * bs; // single indirect starts
    let s2 = (12 + per) * bs; // double starts
    let s3 = (12 + per + per * per) * bs; // triple starts
    let b = bs as usize;
    vec![
        // 11/12 boundary, partial blocks at both ends.
        Op::Write("/a", s1 - 100, 300, 1),
        // Crossing into the double indirect block.
        Op::Write("/a", s2 - bs - 7, 2 * b + 20, 2),
        // Crossing a single-indirect boundary inside the double block.
        Op::Write("/a", s2 + per * bs - 3, 10, 3),
        // Into the triple indirect block, crossing its start.
        Op::Write("/b", s3 - 2 * bs + 1, 4 * b, 4),
        // A hole under an existing indirect block, partial.
        Op::Write("/a", s1 + 5 * bs + 100, 50, 5),
        // A hole under a missing single indirect (inside the double).
        Op::Write("/a", s2 + 3 * per * bs + 17, 33, 6),
        // Punches: inside one indirect block, partial both ends.
        Op::Punch("/a", s1 - 50, 60),
        Op::Punch("/a", s2 - bs + 1, bs + 10),
        // A whole single indirect subtree in the double.
        Op::Punch("/a", s2 + per * bs, per * bs),
        // Beyond EOF.
        Op::Punch("/a", s2 + 10 * per * bs, 4 * bs),
        // Truncate up, then write past the old EOF within its block.
        Op::Truncate("/c", 5),
        Op::Write("/c", 0, 5, 7),
        Op::Truncate("/c", 3),
        Op::Truncate("/c", s2 + 10),
        Op::Write("/c", s2 + 100, 10, 8),
        Op::Write("/c", 1, 1, 9),
        // Punch in the triple range and across its start.
        Op::Punch("/b", s3 - bs, 2 * bs),
        Op::Punch("/b", 0, s3 + 10 * bs),
        // A dense file punched in the middle of its indirect block.
        Op::Write("/d", 0, 40 * b, 10),
        Op::Punch("/d", 14 * bs, 10 * bs),
        Op::Punch("/d", 11 * bs, 2 * bs),
        Op::Punch("/d", 20 * bs, 30 * bs),
        Op::Truncate("/d", 13 * bs + 1),
        Op::Write("/d", 26 * bs, 1, 11),
    ]
}

/// `boundary_ops` on a fresh image made with `mkfs` (block size `bs`),
/// sizes checked at the single, double and triple indirect boundaries.
fn boundaries(tag: &str, mkfs: &[&str], bs: u64) {
    if !have_tools() {
        return;
    }
    let per = bs / 4;
    let s3 = (12 + per + per * per) * bs;
    run_diff(
        tag,
        mkfs,
        "64M",
        &boundary_ops(bs),
        &["/a", "/b", "/c", "/d"],
        &[
            s3 - 4 * bs,
            s3,
            (12 + per) * bs - 2 * bs,
            (12 + 2 * per) * bs - 4096,
        ],
    );
}

#[test]
fn boundaries_ext3_1k() {
    boundaries("blockmap-bnd1k", &["-t", "ext3", "-b", "1024"], 1024);
}

#[test]
fn boundaries_ext3_4k() {
    boundaries("blockmap-bnd4k", &["-t", "ext3", "-b", "4096"], 4096);
}

#[test]
fn boundaries_ext4_noextent_4k() {
    boundaries(
        "blockmap-bnd4kx",
        &["-b", "4096", "-O", "^extent,^64bit"],
        4096,
    );
}

/// Punches whose range covers an indirect block only partly while the
/// rest of it maps nothing (a sparse file), and a whole double indirect
/// subtree; then writes back into the punched places.
fn sparse_punch_ops(bs: u64) -> Vec<Op> {
    let per = bs / 4;
    let s2 = (12 + per) * bs;
    let s3 = (12 + per + per * per) * bs;
    let b = bs as usize;
    vec![
        Op::Write("/e", 20 * bs, 10 * b, 1),
        Op::Punch("/e", 15 * bs, 25 * bs),
        Op::Write("/e", 0, 100, 2),
        Op::Write("/f", s2 + 3 * per * bs + 5 * bs, 3 * b, 3),
        Op::Write("/f", s2 + 7 * per * bs, b, 4),
        Op::Punch("/f", s2 + 3 * per * bs + bs, 10 * bs),
        Op::Punch("/f", s2 + 6 * per * bs, 2 * per * bs),
        Op::Write("/g", s3 + per * per * bs + 4 * bs, b, 5),
        Op::Write("/g", s3 + 4 * bs, b, 6),
        Op::Punch("/g", s3 + per * per * bs, per * per * bs),
        Op::Punch("/g", s3 + bs, 8 * bs),
        Op::Write("/g", s3 + 5 * bs, 10, 7),
        // A punch whose end is inside a block-mapped file's first block.
        Op::Write("/h", 0, 3 * b, 8),
        Op::Punch("/h", 0, 10),
        Op::Punch("/h", bs - 10, 20),
        Op::Punch("/h", 2 * bs + 1, 100 * bs),
        // Punch of everything, then more writes.
        Op::Write("/i", 0, 300 * b, 9),
        Op::Punch("/i", 0, 1 << 30),
        Op::Write("/i", 299 * bs, 2 * b, 10),
    ]
}

#[test]
fn sparse_punches_ext3() {
    if !have_tools() {
        return;
    }
    for bs in [1024u64, 4096] {
        let per = bs / 4;
        let s3 = (12 + per + per * per) * bs;
        run_diff(
            &format!("blockmap-sparse{bs}"),
            &["-t", "ext3", "-b", &bs.to_string()],
            "64M",
            &sparse_punch_ops(bs),
            &["/e", "/f", "/g", "/h", "/i"],
            &[s3, s3 + 4 * bs, s3 + per * per * bs + 4 * bs],
        );
    }
}

#[test]
fn boundaries_and_punches_ext2_no_journal() {
    if !have_tools() {
        return;
    }
    for bs in [1024u64, 4096] {
        let per = bs / 4;
        let s3 = (12 + per + per * per) * bs;
        let mut ops = boundary_ops(bs);
        ops.extend(sparse_punch_ops(bs));
        run_diff(
            &format!("blockmap-ext2-{bs}"),
            &["-t", "ext2", "-b", &bs.to_string()],
            "64M",
            &ops,
            &["/a", "/b", "/c", "/d", "/e", "/f", "/g", "/h", "/i"],
            &[s3, s3 + 4 * bs, s3 + per * per * bs + 4 * bs],
        );
    }
}
