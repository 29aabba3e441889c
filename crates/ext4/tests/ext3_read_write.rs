//! ext2/3-style images and files on a read-write mount, with the kernel's
//! ext4 as the referee:
//! - an image without the extent feature (`mkfs -t ext3`) is written in
//!   place: new files, directories and slow symlinks are block-mapped,
//!   block-mapped files keep their maps through writes, truncates and
//!   punched holes, and a growing directory becomes indexed. The same
//!   script runs on the image through scalevfs and on a copy through the
//!   kernel's loop mount: every result and errno, then every file's
//!   content, size, mode, link count and target, agree; both images pass
//!   e2fsck -fn and keep no extent-mapped inode.
//! - a block-mapped file's size limit is the kernel's `s_bitmap_maxbytes`
//!   (smaller than an extent file's): truncate, pwrite and lseek at and
//!   around it give the kernel's results.

mod common;

use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use common::*;

/// One step of the script.
#[derive(Clone, Debug)]
enum Op {
    Write(&'static str, u64, Vec<u8>),
    Truncate(&'static str, u64),
    Punch(&'static str, u64, u64),
    Falloc(&'static str, u64, u64),
    Mkdir(String),
    Create(String),
    Symlink(String, &'static str),
    Link(&'static str, &'static str),
    Rename(String, String),
    Unlink(String),
}

fn pat(n: usize, k: u8) -> Vec<u8> {
    (0..n).map(|i| (i % 253) as u8 ^ k).collect()
}

/// The script: files reaching the double and triple indirect blocks,
/// holes filled and punched, truncates down and up, a directory of 300
/// names (indexed once past a block) with some removed and renamed, fast
/// and slow symlinks, a hard link, and preallocation (EOPNOTSUPP on a
/// block-mapped file, as in the kernel's ext4).
fn script(bs: u64) -> Vec<Op> {
    let mut v = vec![
        Op::Write("/small", 0, pat(5000, 1)),
        Op::Write("/small", 4000, pat(3000, 2)),
        Op::Write("/big", 0, pat(300 * 1024, 3)),
        Op::Write("/sparse", 0, b"head".to_vec()),
        // Past the single indirect block's reach for both block sizes.
        Op::Write("/sparse", 1100 * bs + 17, pat(3 * bs as usize, 4)),
        // Into the hole between, then across its edge.
        Op::Write("/sparse", 20 * bs - 5, pat(100, 5)),
        Op::Write("/sparse", 12 * bs - 1, pat(2, 6)),
        // The triple indirect block (1 KiB: past 64 MiB + 268 KiB; 4 KiB:
        // past 4 GiB + 4 MiB).
        Op::Write("/triple", (12 + 256 + 65536 + 7) * 1024 * (bs / 1024).pow(3), pat(10, 7)),
        Op::Truncate("/big", 100 * 1024 + 7),
        Op::Truncate("/big", 200 * 1024),
        Op::Write("/big", 150 * 1024, pat(1000, 8)),
        Op::Punch("/big", 10 * 1024 + 3, 40 * 1024),
        Op::Punch("/sparse", 0, 30 * bs),
        Op::Falloc("/small", 0, 1 << 20),
        Op::Falloc("/new-empty", 0, 4096),
        Op::Symlink("/fast".into(), "small"),
        Op::Symlink("/slow".into(), "a-long-target-for-a-slow-symlink-so-it-needs-a-data-block-of-its-own-beyond-sixty-bytes"),
        Op::Link("/small", "/small-link"),
        Op::Mkdir("/d".into()),
    ];
    // Creating /new-empty first (falloc of a missing file would be ENOENT).
    v.insert(13, Op::Create("/new-empty".into()));
    for i in 0..300 {
        v.push(Op::Create(format!("/d/name-{i:04}-{}", "x".repeat(40))));
    }
    for i in (0..300).step_by(7) {
        v.push(Op::Unlink(format!("/d/name-{i:04}-{}", "x".repeat(40))));
    }
    for i in (1..300).step_by(11) {
        v.push(Op::Rename(
            format!("/d/name-{i:04}-{}", "x".repeat(40)),
            format!("/d/moved-{i:04}"),
        ));
    }
    v.push(Op::Mkdir("/d/sub".into()));
    v.push(Op::Rename("/big".into(), "/d/sub/big".into()));
    v
}

type Res = Result<u64, i32>;

/// Run `op` through the kernel on its mount at `root`.
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
    let falloc = |s: &str, mode: i32, off: u64, len: u64| -> Res {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(p(s))
            .map_err(e)?;
        // SAFETY: a plain syscall on an open descriptor.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) };
        if r == 0 {
            Ok(0)
        } else {
            Err(e(std::io::Error::last_os_error()))
        }
    };
    match op {
        Op::Write(s, off, d) => open(s)?.write_at(d, *off).map(|n| n as u64).map_err(e),
        Op::Truncate(s, n) => open(s)?.set_len(*n).map(|_| 0).map_err(e),
        Op::Punch(s, off, len) => falloc(
            s,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            *off,
            *len,
        ),
        Op::Falloc(s, off, len) => falloc(s, 0, *off, *len),
        Op::Mkdir(s) => std::fs::create_dir(p(s)).map(|_| 0).map_err(e),
        Op::Create(s) => open(s).map(|_| 0),
        Op::Symlink(s, t) => std::os::unix::fs::symlink(t, p(s)).map(|_| 0).map_err(e),
        Op::Link(a, b) => std::fs::hard_link(p(a), p(b)).map(|_| 0).map_err(e),
        Op::Rename(a, b) => std::fs::rename(p(a), p(b)).map(|_| 0).map_err(e),
        Op::Unlink(s) => std::fs::remove_file(p(s)).map(|_| 0).map_err(e),
    }
}

/// Run `op` through scalevfs.
fn our_op(t: &scalevfs::Task, op: &Op) -> Res {
    let e = |r: scalevfs::Errno| r.raw();
    let with = |s: &str, f: &dyn Fn(i32) -> Result<u64, scalevfs::Errno>| with_wfd(t, s, f);
    let punch = scalevfs::io::FALLOC_FL_PUNCH_HOLE | scalevfs::io::FALLOC_FL_KEEP_SIZE;
    match op {
        Op::Write(s, off, d) => with(s, &|fd| t.pwrite(fd, d, *off as i64).map(|n| n as u64)),
        Op::Truncate(s, n) => with(s, &|fd| t.ftruncate(fd, *n as i64).map(|_| 0)),
        Op::Punch(s, off, len) => with(s, &|fd| {
            t.fallocate(fd, punch, *off as i64, *len as i64).map(|_| 0)
        }),
        Op::Falloc(s, off, len) => with(s, &|fd| {
            t.fallocate(fd, 0, *off as i64, *len as i64).map(|_| 0)
        }),
        Op::Mkdir(s) => t.mkdir(s.as_str(), 0o755).map(|_| 0).map_err(e),
        Op::Create(s) => with(s, &|_| Ok(0)),
        Op::Symlink(s, tg) => t.symlink(*tg, s.as_str()).map(|_| 0).map_err(e),
        Op::Link(a, b) => t.link(*a, *b).map(|_| 0).map_err(e),
        Op::Rename(a, b) => t.rename(a.as_str(), b.as_str()).map(|_| 0).map_err(e),
        Op::Unlink(s) => t.unlink(s.as_str()).map(|_| 0).map_err(e),
    }
}

/// The fields both sides must agree on (not times, not inode numbers).
fn comparable(t: std::collections::BTreeMap<String, Node>) -> Vec<String> {
    t.into_iter()
        .filter(|(k, _)| !k.starts_with("/lost+found"))
        .map(|(k, n)| {
            format!(
                "{k} mode {:o} nlink {} size {} content {:?} target {:?}",
                n.mode,
                n.nlink,
                n.size,
                n.content.map(short),
                n.target
            )
        })
        .collect()
}

/// No inode of `img` (besides the journal's, which mkfs makes) is mapped
/// by extents, and the feature is still off.
fn no_extents(img: &Path) {
    let feats = debugfs_ro(img, "features");
    assert!(!feats.contains(" extent"), "{feats}");
    for p in [
        "/small",
        "/sparse",
        "/triple",
        "/d",
        "/d/sub/big",
        "/slow",
        "/d/sub",
    ] {
        let st = debugfs_ro(img, &format!("stat {p}"));
        assert!(st.contains("Inode:"), "{p}: {st}");
        assert!(!st.contains("EXTENTS:"), "{p} is extent-mapped: {st}");
    }
}

#[test]
fn ext3_images_are_written_in_place_as_the_kernel_writes_them() {
    if !have_tools() {
        return;
    }
    for bs in [1024u64, 4096] {
        let s = Scratch::new(&format!("ext3-rw-{bs}"));
        let img = s.0.join("ours");
        mkfs_args(&img, &["-t", "ext3", "-b", &bs.to_string()], "96M");
        let theirs = s.0.join("theirs");
        std::fs::copy(&img, &theirs).unwrap();
        let ops = script(bs);
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        let ours: Vec<Res> = ops.iter().map(|op| our_op(&t, op)).collect();
        let fs = scalevfs::fs::Fs::new(vfs.root_task());
        let our_tree = comparable(vfs_tree(&fs));
        drop(fs);
        unmount_clean(t, vfs, e, &img);
        no_extents(&img);
        // Read back after a remount too.
        {
            let (e, vfs) = mount(&img);
            let fs = scalevfs::fs::Fs::new(vfs.root_task());
            assert_eq!(
                comparable(vfs_tree(&fs)),
                our_tree,
                "bs {bs}: after a remount"
            );
            drop(fs);
            unmount_clean(vfs.root_task(), vfs, e, &img);
        }
        let Some(km) = KMount::rw(&theirs, &s.0.join("mnt")) else {
            continue;
        };
        let kernel: Vec<Res> = ops.iter().map(|op| kernel_op(&km.0, op)).collect();
        for (i, op) in ops.iter().enumerate() {
            assert_eq!(ours[i], kernel[i], "bs {bs}: step {i} {op:?}");
        }
        let kernel_tree = comparable(host_tree(&km.0));
        drop(km);
        assert_eq!(our_tree, kernel_tree, "bs {bs}: the trees differ");
        fsck_clean(&theirs);
        no_extents(&theirs);
        // And the kernel reads our image as we do.
        let Some(km) = KMount::new(&img, &s.0.join("mnt2")) else {
            continue;
        };
        assert_eq!(
            comparable(host_tree(&km.0)),
            our_tree,
            "bs {bs}: the kernel reads ours"
        );
    }
}

/// `s_bitmap_maxbytes` on an ext3 image with 1 KiB blocks (no huge_file:
/// i_blocks' 2^32 sectors are not what ends it, the map's reach is) and
/// on a block-mapped file of an ext4 image with 4 KiB blocks: the same
/// truncate, pwrite and lseek results as the kernel's around the limit.
#[test]
fn a_block_mapped_files_size_limit_is_the_kernels() {
    if !have_tools() {
        return;
    }
    for (bs, args) in [
        (1024u64, vec!["-t", "ext3", "-b", "1024"]),
        (4096, vec!["-b", "4096", "-O", "^extent,^64bit"]),
    ] {
        let s = Scratch::new(&format!("bitmap-max-{bs}"));
        let img = s.0.join("ours");
        mkfs_args(&img, &args, "64M");
        let theirs = s.0.join("theirs");
        std::fs::copy(&img, &theirs).unwrap();
        let per = bs / 4;
        let max = (12 + per + per * per + per * per * per) * bs;
        let offs = [max - 10, max - 1, max, max + 1, max + bs];
        // (truncate, pwrite of 100 bytes, lseek SEEK_SET) at each offset.
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        let mut ours = Vec::new();
        let fd = t
            .open("/f", scalevfs::O_CREAT | scalevfs::O_RDWR, 0o644)
            .unwrap();
        for &o in &offs {
            let (tr, w) = our_truncate_write(&t, fd, o);
            let l = t.lseek(fd, o as i64, libc::SEEK_SET as u32);
            ours.push((tr, w, l.map_err(|e| e.raw())));
            t.ftruncate(fd, 0).unwrap();
        }
        t.close(fd).unwrap();
        unmount_clean(t, vfs, e, &img);
        // Written at max - 10: ten bytes, the rest EFBIG.
        assert_eq!(ours[0].1, Ok(10), "bs {bs}: {ours:?}");
        assert_eq!(ours[2].1, Err(libc::EFBIG), "bs {bs}: {ours:?}");
        assert_eq!(ours[3].0, Err(libc::EFBIG), "bs {bs}: {ours:?}");
        let Some(km) = KMount::rw(&theirs, &s.0.join("mnt")) else {
            continue;
        };
        let f = create_rw(&km.0.join("f"));
        let mut kernel = Vec::new();
        for &o in &offs {
            let (tr, w) = kernel_truncate_write(&f, o);
            // SAFETY: a plain syscall on an open descriptor.
            let l = unsafe { libc::lseek(f.as_raw_fd(), o as i64, libc::SEEK_SET) };
            let l = if l >= 0 {
                Ok(l as u64)
            } else {
                Err(std::io::Error::last_os_error().raw_os_error().unwrap())
            };
            kernel.push((tr, w, l));
            f.set_len(0).unwrap();
        }
        drop(f);
        drop(km);
        assert_eq!(ours, kernel, "bs {bs}: offsets {offs:?}");
        fsck_clean(&theirs);
    }
}
