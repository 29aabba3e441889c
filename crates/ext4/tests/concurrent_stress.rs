//! Threads changing one journaled ext4 tree at random, at once, over a
//! small shared namespace so that their operations collide: creates,
//! overwrites, sparse writes, appends, truncates, preallocation and hole
//! punching, unlinks (also of files still open, which makes orphans),
//! O_TMPFILE files (named by linkat or not),
//! renames of files and directories across directories and over existing
//! names, hard links, fast and slow symlinks, mkdir/rmdir, chmod,
//! attributes in the inode and in a block, fsyncs.
//!
//! Each thread also keeps a few files of its own, in the same shared
//! directories, whose contents it models as it writes, truncates,
//! preallocates and punches them: those must read back as the model says,
//! live, after a remount and through the kernel.
//!
//! No call may fail with an errno that means the filesystem broke (EIO,
//! EUCLEAN, EROFS after a failed consistency check, ENOSPC on an image a
//! fraction full). Afterwards the tree as the live mount shows it must be
//! what a remount shows and what the kernel's ext4 reads from the image
//! (names, modes, sizes, link counts, nanosecond mtimes, contents, symlink
//! targets, extended attributes), and `e2fsck -fn` must pass. Run at 1 KiB
//! blocks (deeper extent trees, more htree splits) and at 4 KiB, with the
//! orphan list instead of the orphan file, and on an inline_data image
//! whose files and directories start inline.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use scalevfs::fs::Fs;
use scalevfs::{Errno, Task, VfsResult, O_CREAT, O_WRONLY};

const THREADS: usize = 4;
const OPS: usize = 4000;
const DIRS: usize = 4;
const NAMES: usize = 20;

/// A random name: `/dK/nJ`, or `/dK/sJ/nI` inside a subdirectory.
fn name(r: &mut Rng) -> String {
    let d = r.below(DIRS as u64);
    if r.below(4) == 0 {
        format!("/d{d}/s{}/n{}", r.below(3), r.below(NAMES as u64 / 2))
    } else {
        format!("/d{d}/n{}", r.below(NAMES as u64))
    }
}

fn subdir(r: &mut Rng) -> String {
    format!("/d{}/s{}", r.below(DIRS as u64), r.below(3))
}

/// Bytes that say who wrote them, so that a misplaced block shows.
fn data(r: &mut Rng, len: usize) -> Vec<u8> {
    let tag = r.next_u64();
    (0..len)
        .map(|i| (tag.rotate_left((i % 64) as u32) as u8) ^ (i / 4096) as u8)
        .collect()
}

/// Fails the test on an errno that only a broken filesystem gives here.
fn ok<T>(what: &str, r: VfsResult<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e @ (Errno::EIO | Errno::EUCLEAN | Errno::EROFS | Errno::ENOSPC | Errno::EFAULT)) => {
            panic!("{what}: {e:?}")
        }
        Err(_) => None,
    }
}

fn one_op(t: &Task, r: &mut Rng) {
    use scalevfs::{O_APPEND, O_RDWR, O_TRUNC};
    let bs = 4096u64;
    match r.below(21) {
        0..=2 => {
            let p = name(r);
            let len = r.below(5 * bs + 700) as usize;
            if let Some(fd) = ok("create", t.open(&p, O_CREAT | O_WRONLY | O_TRUNC, 0o644)) {
                ok("write", t.write(fd, &data(r, len)));
                ok("close", t.close(fd));
            }
        }
        3 => {
            // Sparse: somewhere in the first 300 KiB.
            let p = name(r);
            if let Some(fd) = ok("open", t.open(&p, O_CREAT | O_RDWR, 0o644)) {
                let off = r.below(300 * 1024);
                let len = 1 + r.below(3 * bs) as usize;
                ok("pwrite", t.pwrite(fd, &data(r, len), off as i64));
                ok("close", t.close(fd));
            }
        }
        4 => {
            let p = name(r);
            if let Some(fd) = ok("open", t.open(&p, O_WRONLY | O_APPEND, 0)) {
                let len = 1 + r.below(2 * bs) as usize;
                ok("append", t.write(fd, &data(r, len)));
                ok("close", t.close(fd));
            }
        }
        5 => {
            let p = name(r);
            if let Some(fd) = ok("open", t.open(&p, O_WRONLY, 0)) {
                ok("ftruncate", t.ftruncate(fd, r.below(200 * 1024) as i64));
                ok("close", t.close(fd));
            }
        }
        6 => {
            let p = name(r);
            if let Some(fd) = ok("open", t.open(&p, O_RDWR, 0)) {
                let off = r.below(200 * 1024) as i64;
                let len = 1 + r.below(6 * bs) as i64;
                let mode = match r.below(3) {
                    0 => 0,
                    1 => scalevfs::io::FALLOC_FL_KEEP_SIZE,
                    _ => scalevfs::io::FALLOC_FL_PUNCH_HOLE | scalevfs::io::FALLOC_FL_KEEP_SIZE,
                };
                ok("fallocate", t.fallocate(fd, mode, off, len));
                ok("close", t.close(fd));
            }
        }
        7 | 8 => {
            ok("unlink", t.unlink(&name(r)));
        }
        9 | 10 => {
            let (a, b) = (name(r), name(r));
            ok("rename", t.rename(&a, &b));
        }
        11 => {
            let (a, b) = (subdir(r), subdir(r));
            ok("rename dir", t.rename(&a, &b));
        }
        12 => {
            let (a, b) = (name(r), name(r));
            ok("link", t.link(&a, &b));
        }
        13 => {
            let target = if r.below(2) == 0 {
                "short".to_string()
            } else {
                format!("{:0>100}", r.next_u64())
            };
            ok("symlink", t.symlink(target.as_bytes(), &name(r)));
        }
        14 => {
            ok("mkdir", t.mkdir(&subdir(r), 0o755));
        }
        15 => {
            ok("rmdir", t.rmdir(&subdir(r)));
        }
        16 => {
            ok("chmod", t.chmod(&name(r), 0o600 + r.below(0o100) as u32));
        }
        17 => {
            let p = name(r);
            let k = r.below(4);
            if r.below(3) == 0 {
                ok("removexattr", t.removexattr(&p, &format!("user.k{k}")));
            } else {
                // Up to 300 bytes: some fit in the inode, more go to a block.
                let len = r.below(300) as usize;
                // ENOSPC is the answer when the values outgrow the inode's
                // room and one attribute block (1 KiB blocks), as in Linux.
                let set = t.setxattr(&p, &format!("user.k{k}"), &data(r, len), 0);
                if set != Err(Errno::ENOSPC) {
                    ok("setxattr", set);
                }
            }
        }
        18 => {
            // An open file loses its last name, is written, then closed.
            let p = name(r);
            if let Some(fd) = ok("open", t.open(&p, O_CREAT | O_RDWR, 0o644)) {
                ok("unlink open", t.unlink(&p));
                let len = r.below(3 * bs) as usize;
                ok("write orphan", t.write(fd, &data(r, len)));
                ok("close orphan", t.close(fd));
            }
        }
        19 => {
            // O_TMPFILE: written, then named (over nothing) or not.
            let d = format!("/d{}", r.below(DIRS as u64));
            let fd = ok("tmpfile", t.open(&d, scalevfs::O_TMPFILE | O_RDWR, 0o600));
            if let Some(fd) = fd {
                let len = r.below(3 * bs) as usize;
                ok("write tmpfile", t.write(fd, &data(r, len)));
                if r.below(2) == 0 {
                    let p = name(r);
                    ok(
                        "link tmpfile",
                        t.linkat(fd, "", scalevfs::AT_FDCWD, &p, scalevfs::AT_EMPTY_PATH),
                    );
                }
                ok("close tmpfile", t.close(fd));
            }
        }
        _ => {
            let p = name(r);
            if let Some(fd) = ok("open", t.open(&p, O_RDWR, 0)) {
                ok("fsync", t.fsync(fd));
                ok("close", t.close(fd));
            }
        }
    }
}

const PRIVATE: usize = 3;

/// Thread `k`'s own file `j`, which no other thread names.
fn private(k: usize, j: usize) -> String {
    format!("/d{}/p{k}_{j}", (k + j) % DIRS)
}

/// A data change to one of this thread's own files, applied to the model
/// `m` of its contents too.
fn private_op(t: &Task, r: &mut Rng, p: &str, m: &mut Vec<u8>) {
    use scalevfs::io::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE};
    let fd = ok("open own", t.open(p, scalevfs::O_RDWR, 0)).expect("own file gone");
    let off = r.below(160 * 1024) as usize;
    let len = 1 + r.below(5 * 4096) as usize;
    match r.below(5) {
        0 | 1 => {
            let d = data(r, len);
            ok("pwrite own", t.pwrite(fd, &d, off as i64)).unwrap();
            if m.len() < off + len {
                m.resize(off + len, 0);
            }
            m[off..off + len].copy_from_slice(&d);
        }
        2 => {
            ok("ftruncate own", t.ftruncate(fd, off as i64)).unwrap();
            m.resize(off, 0);
        }
        3 => {
            ok(
                "punch own",
                t.fallocate(
                    fd,
                    FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    off as i64,
                    len as i64,
                ),
            )
            .unwrap();
            let end = (off + len).min(m.len());
            if off < end {
                m[off..end].fill(0);
            }
        }
        _ => {
            ok("fallocate own", t.fallocate(fd, 0, off as i64, len as i64)).unwrap();
            if m.len() < off + len {
                m.resize(off + len, 0);
            }
        }
    }
    ok("close own", t.close(fd)).unwrap();
}

/// Every file's, link's and directory's user attributes, by path.
fn xattr_tree(t: &Task, tree: &BTreeMap<String, Node>) -> BTreeMap<String, Xattrs> {
    tree.keys()
        .map(|p| {
            let mut x = our_xattrs(t, p);
            x.retain(|k, _| k.starts_with("user."));
            (p.clone(), x)
        })
        .collect()
}

/// `EXT4_STRESS_SEED` mixes into the seed, `EXT4_STRESS_OPS` sets the
/// operations per thread and `EXT4_STRESS_THREADS` the threads, for longer
/// campaigns than CI's.
fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The image a stress run starts from.
#[derive(Clone, Copy, PartialEq)]
enum Start {
    /// `mkfs.ext4 -O orphan_file`, empty.
    Fresh,
    /// Without an orphan file: the orphan list.
    List,
    /// `-O inline_data`, made by `mke2fs -d` from a tree of the
    /// workload's own names: small inline files and inline directories
    /// that the threads' changes move out to blocks, racing each other.
    Inline,
}

fn stress(tag: &str, bs: usize, start: Start, seed: u64) {
    if !have_tools() {
        return;
    }
    let seed = seed
        ^ env_u64("EXT4_STRESS_SEED")
            .unwrap_or(0)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let ops = env_u64("EXT4_STRESS_OPS").map_or(OPS, |n| n as usize);
    let threads = env_u64("EXT4_STRESS_THREADS").map_or(THREADS, |n| n.clamp(1, 64) as usize);
    eprintln!("{tag}: seed {seed:#x}, {threads} threads, {ops} operations each");
    let s = Scratch::new(tag);
    let img = match start {
        Start::List => fresh_list(&s.0, bs, "96M"),
        Start::Fresh => fresh(&s.0, bs, "96M"),
        Start::Inline => {
            let src = s.0.join("src");
            for d in 0..DIRS {
                for sub in 0..2 {
                    std::fs::create_dir_all(src.join(format!("d{d}/s{sub}"))).unwrap();
                }
                for j in 0..6 {
                    std::fs::write(src.join(format!("d{d}/n{j}")), vec![b'i'; 10 + 15 * j])
                        .unwrap();
                }
                std::fs::write(src.join(format!("d{d}/s0/n1")), b"inline").unwrap();
            }
            let img = s.0.join("img");
            make_image(&src, &img, bs, "96M", "inline_data,orphan_file");
            img
        }
    };
    let (e, vfs) = mount(&img);
    let vfs = Arc::new(vfs);
    if start != Start::Inline {
        let t = vfs.root_task();
        for d in 0..DIRS {
            t.mkdir(&format!("/d{d}"), 0o755).unwrap();
            t.mkdir(&format!("/d{d}/s0"), 0o755).unwrap();
        }
    }
    let models = std::thread::scope(|sc| {
        (0..threads)
            .map(|k| {
                let vfs = vfs.clone();
                sc.spawn(move || {
                    let t = vfs.root_task();
                    let mut r = Rng(seed ^ (k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    let mut own = vec![Vec::new(); PRIVATE];
                    for j in 0..PRIVATE {
                        let fd = t.open(&private(k, j), O_CREAT | O_WRONLY, 0o644).unwrap();
                        t.close(fd).unwrap();
                    }
                    for _ in 0..ops {
                        if r.below(3) == 0 {
                            let j = r.below(PRIVATE as u64) as usize;
                            private_op(&t, &mut r, &private(k, j), &mut own[j]);
                        } else {
                            one_op(&t, &mut r);
                        }
                    }
                    own
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    // Each thread's own files: as modelled, through the live mount.
    let own: BTreeMap<String, Vec<u8>> = models
        .into_iter()
        .enumerate()
        .flat_map(|(k, v)| {
            v.into_iter()
                .enumerate()
                .map(move |(j, m)| (private(k, j), m))
        })
        .collect();
    let check_own = |tree: &BTreeMap<String, Node>, who: &str| {
        for (p, m) in &own {
            // Keys below the root have no leading slash (`vfs_tree`).
            let n = &tree[p.trim_start_matches('/')];
            assert_eq!(n.size, m.len() as u64, "{p}: size {who}");
            assert!(
                n.content.as_ref() == Some(&short(m.clone())),
                "{p}: content {who}"
            );
        }
    };
    let live = vfs_tree(&Fs::new(vfs.root_task()));
    check_own(&live, "live");
    let live_x = xattr_tree(&vfs.root_task(), &live);
    let files = live.values().filter(|n| n.content.is_some()).count();
    eprintln!("{tag}: {} names, {files} files", live.len());
    assert!(files >= 20, "the workload left only {files} files");
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);

    let (e, vfs) = mount(&img);
    let again = vfs_tree(&Fs::new(vfs.root_task()));
    check_own(&again, "after a remount");
    assert!(again == live, "the remount shows another tree");
    assert!(
        xattr_tree(&vfs.root_task(), &again) == live_x,
        "the remount shows other attributes"
    );
    drop(vfs);
    e.unmount().unwrap();

    let Some(km) = KMount::new(&img, &s.0.join("mnt")) else {
        return;
    };
    let mut kernel = host_tree_ns(&km.0);
    kernel.retain(|k, _| k != "/lost+found" && !k.starts_with("/lost+found/"));
    check_own(&kernel, "through the kernel");
    assert_eq!(
        kernel.keys().collect::<Vec<_>>(),
        live.keys().collect::<Vec<_>>(),
        "the kernel lists other names"
    );
    for (k, n) in &live {
        assert!(kernel[k] == *n, "{k}: kernel {:?}, ours {n:?}", kernel[k]);
        let mut x = host_xattrs(&km.0.join(k.trim_start_matches('/')));
        x.retain(|k, _| k.starts_with("user."));
        assert!(x == live_x[k], "{k}: the kernel reads other attributes");
    }
}

#[test]
fn threads_changing_one_tree_at_1k_blocks() {
    stress("stress1k", 1024, Start::Fresh, 0x5151_7A7A_0001);
}

#[test]
fn threads_changing_one_tree_at_4k_blocks() {
    stress("stress4k", 4096, Start::Fresh, 0x5151_7A7A_0004);
}

/// The same with the orphan list (`s_last_orphan`, one mutex) instead of
/// the orphan file: files unlinked while open are chained through their
/// inodes while other threads create and remove names.
#[test]
fn threads_changing_one_tree_with_the_orphan_list() {
    stress("stresslist", 4096, Start::List, 0x5151_7A7A_0005);
}

/// The same on an inline_data image whose files and directories start
/// inline: threads change them at once, so conversions race each other and
/// the changes that follow them.
#[test]
fn threads_changing_an_inline_data_tree() {
    stress("stressinline", 1024, Start::Inline, 0x5151_7A7A_0006);
}
