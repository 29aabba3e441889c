//! New directories and files on an inline_data image keep their data in
//! their inode as the kernel's ext4 does. Directories
//! (`ext4_try_create_inline_dir`): entries go into `i_block`, then into
//! the `system.data` attribute grown to the room the inode body has, and
//! the directory moves out to a block only when neither has room
//! (`ext4_try_add_inline_entry`); removals and renames leave it inline.
//! Files (`ext4_try_to_write_inline_data`): a new file's writes that end
//! within that room stay in the inode; one past it, a fallocate or a
//! truncate that grows an inline file moves the data to a block; a
//! truncate that cuts it keeps it inline (`ext4_inline_data_truncate`).
//! The same script runs through scalevfs on one copy of a fresh image and
//! through the kernel (loop mount) on another: each inode is inline in
//! both or in neither, with the same size and inline size, the free
//! block counts agree, e2fsck passes ours, and the kernel reads our tree
//! back as its own (contents included).

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// One step of the script, on paths under the root.
enum Step {
    Mkdir(&'static str),
    Create(String),
    Unlink(String),
    Rmdir(&'static str),
    Rename(&'static str, &'static str),
    Exchange(&'static str, &'static str),
    /// pwrite of `len` bytes of `fill` at `off` (created if missing).
    Write(&'static str, u64, usize, u8),
    Truncate(&'static str, u64),
    Fallocate(&'static str, u64, u64),
}

fn script() -> Vec<Step> {
    use Step::*;
    let mut s = vec![Mkdir("/empty"), Mkdir("/few"), Mkdir("/spill")];
    s.push(Mkdir("/full"));
    s.push(Mkdir("/shrunk"));
    s.push(Mkdir("/long"));
    s.push(Mkdir("/nest"));
    s.push(Mkdir("/nest/sub"));
    s.push(Mkdir("/nest/gone"));
    // Three entries of 12 bytes fit the 56 of i_block.
    for i in 0..3 {
        s.push(Create(format!("/few/f{i}")));
    }
    // Six spill into system.data (three fit i_block at 16 bytes each,
    // four the attribute's 68 on 256-byte inodes).
    for i in 0..6 {
        s.push(Create(format!("/spill/name-{i}")));
    }
    // Thirty need a block.
    for i in 0..30 {
        s.push(Create(format!("/full/entry-{i:02}")));
    }
    for i in 0..8 {
        s.push(Create(format!("/shrunk/s{i}")));
    }
    for i in [0, 2, 5, 7] {
        s.push(Unlink(format!("/shrunk/s{i}")));
    }
    // A name longer than both regions: a block at once.
    s.push(Create(format!("/long/{}", "n".repeat(100))));
    s.push(Rmdir("/nest/gone"));
    s.push(Create("/nest/sub/leaf".into()));
    // Renames: within an inline directory (the insert spills into the
    // attribute), across two, over an existing name, a moved directory
    // (its `..` in its inode), one that no longer fits (a block), and
    // exchanges of files and of directories between inline parents.
    s.push(Rename("/few/f0", "/few/renamed-f0"));
    s.push(Rename("/few/f1", "/shrunk/s0"));
    s.push(Rename("/few/f2", "/shrunk/s1"));
    s.push(Mkdir("/moves"));
    s.push(Mkdir("/moves/a"));
    s.push(Mkdir("/moves/b"));
    s.push(Rename("/moves/a", "/nest/sub/a"));
    s.push(Create("/moves/b/x".into()));
    s.push(Exchange("/moves/b", "/nest/sub/a"));
    s.push(Exchange("/nest/sub/leaf", "/nest/sub/a/x"));
    s.push(Mkdir("/tight"));
    for i in 0..7 {
        s.push(Create(format!("/tight/t{i}")));
    }
    s.push(Rename("/shrunk/s3", "/tight/a-name-longer-than-the-room"));
    // Holes left in both regions, then a name that fits neither: the
    // entries move out as they lie (holes kept), and the new one takes the
    // first hole with room in the block.
    s.push(Mkdir("/holes"));
    for i in 0..7 {
        s.push(Create(format!("/holes/h{i}")));
    }
    for i in [1, 4, 5] {
        s.push(Unlink(format!("/holes/h{i}")));
    }
    s.push(Create(format!("/holes/{}", "w".repeat(70))));
    s.push(Create("/holes/after".into()));
    s
}

/// Directories that move out to a block in `script`.
const MOVED: [&str; 4] = ["/full", "/long", "/tight", "/holes"];

/// The first block of directory `path` in `img`: each entry's offset,
/// rec_len and name (live entries; a free one as an empty name), read
/// from the image bytes where debugfs maps the block.
fn block_layout(img: &Path, path: &str, bs: usize) -> Vec<(usize, usize, String)> {
    use std::os::unix::fs::FileExt;
    let out = debugfs_ro(img, &format!("bmap {path} 0"));
    let pblk: u64 = out
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("debugfs bmap {path}: {out}"));
    let mut b = vec![0u8; bs];
    std::fs::File::open(img)
        .unwrap()
        .read_exact_at(&mut b, pblk * bs as u64)
        .unwrap();
    let mut v = Vec::new();
    let mut off = 0;
    while off + 8 <= bs {
        let ino = u32::from_le_bytes(b[off..off + 4].try_into().unwrap());
        let rl = usize::from(u16::from_le_bytes([b[off + 4], b[off + 5]]));
        let nl = usize::from(b[off + 6]);
        assert!(rl >= 8 && off + rl <= bs, "{path}: rec_len {rl} at {off}");
        let name = if ino == 0 {
            String::new()
        } else {
            String::from_utf8_lossy(&b[off + 8..off + 8 + nl]).into_owned()
        };
        v.push((off, rl, name));
        off += rl;
    }
    v
}

const DIRS: [&str; 13] = [
    "/holes",
    "/empty",
    "/few",
    "/spill",
    "/full",
    "/shrunk",
    "/long",
    "/nest",
    "/nest/sub",
    "/nest/sub/a",
    "/moves",
    "/moves/b",
    "/tight",
];

/// Inline flag and size of `path` in `img`, as debugfs shows them.
fn shape(img: &Path, path: &str) -> (bool, u64) {
    let out = debugfs_ro(img, &format!("stat {path}"));
    let field = |key: &str| {
        out.split(key)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no {key} in debugfs stat {path}: {out}"))
            .to_string()
    };
    let flags = u32::from_str_radix(&field("Flags: 0x"), 16).unwrap();
    (flags & 0x1000_0000 != 0, field("Size: ").parse().unwrap())
}

/// `shape`, and the inline data's size where debugfs shows one.
fn inline_shape(img: &Path, path: &str) -> (bool, u64, Option<u64>) {
    let (inline, size) = shape(img, path);
    let out = debugfs_ro(img, &format!("stat {path}"));
    let isz = out
        .split("Size of inline data: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .map(|v| v.parse().unwrap());
    (inline, size, isz)
}

/// Offsets at which the seeks are compared.
const SEEK_AT: [i64; 5] = [0, 5, 59, 60, 127];

/// SEEK_DATA and SEEK_HOLE of the host file `p` from each of `SEEK_AT`.
fn host_seeks(p: &Path) -> Vec<[Result<i64, i32>; 2]> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(p).unwrap();
    let seek = |off: i64, whence: i32| {
        // SAFETY: a valid descriptor; lseek reads nothing from memory.
        let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
        if r < 0 {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap())
        } else {
            Ok(r)
        }
    };
    SEEK_AT
        .iter()
        .map(|&o| [seek(o, libc::SEEK_DATA), seek(o, libc::SEEK_HOLE)])
        .collect()
}

/// The same through scalevfs.
fn our_seeks(t: &scalevfs::Task, fd: i32) -> Vec<[Result<i64, i32>; 2]> {
    let seek = |off: i64, whence: i32| {
        t.lseek(fd, off, whence as u32)
            .map(|v| v as i64)
            .map_err(|e| e.raw())
    };
    SEEK_AT
        .iter()
        .map(|&o| [seek(o, libc::SEEK_DATA), seek(o, libc::SEEK_HOLE)])
        .collect()
}

/// The file script: each file's steps, in order.
fn file_script() -> Vec<Step> {
    use Step::*;
    vec![
        Write("/small", 0, 11, b'a'),
        Write("/hundred", 0, 100, b'b'),
        Write("/max", 0, 128, b'c'),
        Write("/past", 0, 129, b'd'),
        Truncate("/long", 1000),
        Write("/long", 0, 10, b'e'),
        Write("/hole", 50, 10, b'f'),
        Write("/grown", 0, 100, b'g'),
        Write("/grown", 100, 100, b'h'),
        Write("/cut", 0, 100, b'i'),
        Truncate("/cut", 70),
        Write("/again", 0, 100, b'j'),
        Truncate("/again", 0),
        Write("/again", 0, 5, b'k'),
        Write("/stretched", 0, 10, b'l'),
        Truncate("/stretched", 1000),
        Truncate("/empty", 0),
        Fallocate("/falloc", 0, 10),
        Write("/falloc", 0, 10, b'm'),
        Write("/overwrite", 0, 90, b'n'),
        Write("/overwrite", 20, 30, b'o'),
        // Past i_block into the attribute, then grown far: moved out,
        // zeros after the data (random kernel differential seed 990).
        Write("/spilled", 0, 119, b'p'),
        Truncate("/spilled", 779_861),
    ]
}

const FILES: [&str; 14] = [
    "/spilled",
    "/small",
    "/hundred",
    "/max",
    "/past",
    "/long",
    "/hole",
    "/grown",
    "/cut",
    "/again",
    "/stretched",
    "/empty",
    "/falloc",
    "/overwrite",
];

/// Run `script` through scalevfs on `img`.
fn run_ours(img: &Path, script: Vec<Step>) {
    use scalevfs::{O_CREAT, O_RDWR, O_WRONLY};
    let (e, vfs) = mount(img);
    let t = vfs.root_task();
    for step in script {
        match step {
            Step::Mkdir(p) => t.mkdir(p, 0o755).unwrap(),
            Step::Create(p) => {
                let fd = t.open(&p, O_CREAT | O_WRONLY, 0o644).unwrap();
                t.close(fd).unwrap();
            }
            Step::Unlink(p) => t.unlink(&p).unwrap(),
            Step::Rmdir(p) => t.rmdir(p).unwrap(),
            Step::Rename(a, b) => t.rename(a, b).unwrap(),
            Step::Exchange(a, b) => t
                .renameat2(
                    scalevfs::AT_FDCWD,
                    a,
                    scalevfs::AT_FDCWD,
                    b,
                    scalevfs::RENAME_EXCHANGE,
                )
                .unwrap(),
            Step::Write(p, off, len, fill) => {
                let fd = t.open(p, O_CREAT | O_RDWR, 0o644).unwrap();
                assert_eq!(t.pwrite(fd, &vec![fill; len], off as i64).unwrap(), len);
                t.close(fd).unwrap();
            }
            Step::Truncate(p, size) => {
                let fd = t.open(p, O_CREAT | O_RDWR, 0o644).unwrap();
                t.ftruncate(fd, size as i64).unwrap();
                t.close(fd).unwrap();
            }
            Step::Fallocate(p, off, len) => {
                let fd = t.open(p, O_CREAT | O_RDWR, 0o644).unwrap();
                t.fallocate(fd, 0, off as i64, len as i64).unwrap();
                t.close(fd).unwrap();
            }
        }
    }
    unmount_clean(t, vfs, e, img);
}

/// Run `script` through the kernel on `mnt`.
fn run_kernel(mnt: &Path, script: Vec<Step>) {
    use std::os::unix::fs::FileExt;
    let p = |q: &str| mnt.join(q.trim_start_matches('/'));
    let open = |q: &str| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(p(q))
            .unwrap()
    };
    for step in script {
        match step {
            Step::Mkdir(q) => std::fs::create_dir(p(q)).unwrap(),
            Step::Create(q) => drop(std::fs::File::create(p(&q)).unwrap()),
            Step::Unlink(q) => std::fs::remove_file(p(&q)).unwrap(),
            Step::Rmdir(q) => std::fs::remove_dir(p(q)).unwrap(),
            Step::Rename(a, b) => std::fs::rename(p(a), p(b)).unwrap(),
            Step::Exchange(a, b) => exchange(&p(a), &p(b)),
            Step::Write(q, off, len, fill) => open(q).write_all_at(&vec![fill; len], off).unwrap(),
            Step::Truncate(q, size) => open(q).set_len(size).unwrap(),
            Step::Fallocate(q, off, len) => {
                use std::os::fd::AsRawFd;
                let f = open(q);
                // SAFETY: a valid descriptor; plain integer arguments.
                let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, off as i64, len as i64) };
                assert_eq!(r, 0);
            }
        }
    }
}

/// A fresh inline_data image changed by `script` through scalevfs
/// (`ours`, e2fsck-clean), a copy changed by the same script through the
/// kernel (`theirs`, e2fsck-clean; `None` where the kernel cannot
/// loop-mount), and the blocks each used.
struct Pair {
    scratch: Scratch,
    ours: PathBuf,
    theirs: Option<PathBuf>,
    used: (u64, Option<u64>),
}

fn run_both(tag: &str, bs: usize, script: fn() -> Vec<Step>) -> Pair {
    let s = Scratch::new(tag);
    let ours = fresh_with(&s.0, bs, "16M", "inline_data,orphan_file");
    let theirs = s.0.join("theirs");
    std::fs::copy(&ours, &theirs).unwrap();
    let before = free_blocks(&ours);
    run_ours(&ours, script());
    let used = before - free_blocks(&ours);
    let Some(km) = KMount::rw(&theirs, &s.0.join("kmnt")) else {
        return Pair {
            scratch: s,
            ours,
            theirs: None,
            used: (used, None),
        };
    };
    run_kernel(&km.0, script());
    drop(km);
    fsck_clean(&theirs);
    let theirs_used = before - free_blocks(&theirs);
    Pair {
        scratch: s,
        ours,
        theirs: Some(theirs),
        used: (used, Some(theirs_used)),
    }
}

/// The tree the kernel reads from `img` (read-only loop mount), without
/// lost+found and times (they differ between two runs).
fn kernel_tree(img: &Path, mnt: &Path) -> std::collections::BTreeMap<String, Node> {
    let km = KMount::new(img, mnt).unwrap();
    let t = untimed(host_tree(&km.0));
    drop(km);
    t
}

fn untimed(
    t: std::collections::BTreeMap<String, Node>,
) -> std::collections::BTreeMap<String, Node> {
    t.into_iter()
        .filter(|(k, _)| !k.starts_with("/lost+found"))
        .map(|(k, mut n)| {
            n.mtime = (0, 0);
            (k, n)
        })
        .collect()
}

#[test]
fn new_files_are_inline_as_the_kernels() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    for bs in [1024usize, 4096] {
        let pair = run_both("inline-files", bs, file_script);
        let ours = &pair.ours;
        let Some(theirs) = &pair.theirs else {
            assert_eq!(
                inline_shape(ours, "/small"),
                (true, 11, Some(60)),
                "bs {bs}"
            );
            assert!(!inline_shape(ours, "/past").0, "bs {bs}");
            continue;
        };
        for f in FILES {
            assert_eq!(
                inline_shape(ours, f),
                inline_shape(theirs, f),
                "bs {bs}: {f}"
            );
        }
        assert_eq!(
            inline_shape(ours, "/max"),
            (true, 128, Some(128)),
            "bs {bs}"
        );
        assert_eq!(pair.used.0, pair.used.1.unwrap(), "bs {bs}: blocks used");
        // The kernel reads our files as its own, contents included, and
        // scalevfs reads them back the same after a remount. The kernel's
        // FIEMAP and, where it answers them, SEEK_DATA and SEEK_HOLE of our
        // files (a file longer than its inline bytes gets ENOENT from the
        // kernel's inline iomap; checked below instead).
        let km = KMount::new(ours, &pair.scratch.0.join("kmnt2")).unwrap();
        let kernel_maps: Vec<_> = FILES
            .iter()
            .map(|f| kernel_fiemap(&km.0.join(&f[1..]), 0, u64::MAX).unwrap())
            .collect();
        let kernel_seeks: Vec<_> = FILES
            .iter()
            .map(|f| host_seeks(&km.0.join(&f[1..])))
            .collect();
        drop(km);
        let tree = kernel_tree(ours, &pair.scratch.0.join("kmnt3"));
        let expect = kernel_tree(theirs, &pair.scratch.0.join("kmnt4"));
        assert_eq!(tree, expect, "bs {bs}");
        let e = scalevfs_ext4::Ext4::open(ours, scalevfs_ext4::Ext4Options::default()).unwrap();
        let vfs = scalevfs::Vfs::with_root_fs(Default::default(), e);
        let again = untimed(vfs_tree(&scalevfs::fs::Fs::new(vfs.root_task())));
        assert_eq!(again, expect, "bs {bs}: scalevfs after a remount");
        let t = vfs.root_task();
        for (i, f) in FILES.iter().enumerate() {
            let fd = t.open(*f, scalevfs::O_RDONLY, 0).unwrap();
            assert_eq!(
                t.fiemap(fd, 0, u64::MAX, 0).unwrap(),
                kernel_maps[i],
                "bs {bs}: FIEMAP of {f}"
            );
            let ours_seeks = our_seeks(&t, fd);
            if *f == "/long" {
                // 1000 bytes, 60 of them inline: data, then a hole. The
                // kernel finds the same data but answers ENOENT for the
                // hole (its inline iomap has no extent past the data).
                for (k, o) in kernel_seeks[i].iter().zip(&ours_seeks) {
                    assert!(
                        k[0] == o[0] || k[0] == Err(libc::ENOENT),
                        "bs {bs}: {k:?} {o:?}"
                    );
                    assert_eq!(k[1], Err(libc::ENOENT), "bs {bs}");
                }
                assert_eq!(ours_seeks[0], [Ok(0), Ok(60)], "bs {bs}");
                assert_eq!(ours_seeks[3], [Err(libc::ENXIO), Ok(60)], "bs {bs}");
            } else {
                assert_eq!(ours_seeks, kernel_seeks[i], "bs {bs}: seeks of {f}");
            }
            t.close(fd).unwrap();
        }
    }
}

/// renameat2(RENAME_EXCHANGE) on the host.
fn exchange(a: &Path, b: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let (a, b) = (c(a), c(b));
    // SAFETY: both are valid NUL-terminated paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(r, 0, "{:?}", std::io::Error::last_os_error());
}

fn free_blocks(img: &Path) -> u64 {
    sb_field(img, "Free blocks").parse().unwrap()
}

#[test]
fn new_directories_are_inline_as_the_kernels() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    for bs in [1024usize, 4096] {
        let pair = run_both("inline-dirs", bs, script);
        let ours = &pair.ours;
        // The listing the VFS shows after a remount.
        {
            let (e, vfs) = mount(ours);
            let t = vfs.root_task();
            let mut names: Vec<String> = t
                .read_dir("/shrunk")
                .unwrap()
                .into_iter()
                .map(|d| String::from_utf8(d.name.to_vec()).unwrap())
                .filter(|n| n != "." && n != "..")
                .collect();
            names.sort();
            assert_eq!(names, ["s0", "s1", "s4", "s6"], "bs {bs}");
            unmount_clean(t, vfs, e, ours);
        }
        let Some(theirs) = &pair.theirs else {
            // Without the kernel: at least the shapes the rules give.
            assert_eq!(shape(ours, "/empty"), (true, 60), "bs {bs}");
            assert!(!shape(ours, "/full").0, "bs {bs}");
            continue;
        };
        for d in DIRS {
            assert_eq!(shape(ours, d), shape(theirs, d), "bs {bs}: {d}");
        }
        assert!(shape(ours, "/spill").1 > 60, "bs {bs}: /spill grew");
        // A directory moves out with its entries where they lay (20 bytes
        // on, behind `.` and `..`), as the kernel's: the same block, entry
        // for entry, so later inserts fill it alike and readdir positions
        // keep their meaning.
        for d in MOVED {
            assert!(!shape(ours, d).0, "bs {bs}: {d} moved out");
            assert_eq!(
                block_layout(ours, d, bs),
                block_layout(theirs, d, bs),
                "bs {bs}: block of {d}"
            );
        }
        assert_eq!(pair.used.0, pair.used.1.unwrap(), "bs {bs}: blocks used");
        // The kernel reads our tree as its own.
        let tree = kernel_tree(ours, &pair.scratch.0.join("kmnt2"));
        let expect = kernel_tree(theirs, &pair.scratch.0.join("kmnt3"));
        assert_eq!(tree, expect, "bs {bs}");
    }
}

/// The calls of `limits_script` on an open file, each answer as a value
/// or an errno.
type Answers = Vec<(&'static str, Result<u64, i32>)>;

/// Size limits of an inline file, 1 KiB blocks: it has no extent flag,
/// so the kernel limits it as a block-mapped file (`s_bitmap_maxbytes`,
/// about 16 GiB, for truncate, write and lseek) until its data moves to
/// blocks (a write at 15 GiB), after which the extent limit holds
/// (nodelalloc, where the move is at once, as here; random kernel
/// differential seed 390 at 1 KiB with inline_data). A new empty file
/// has the extent flag.
#[test]
fn an_inline_file_is_limited_as_a_block_mapped_one() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    const G: u64 = 1 << 30;
    let s = Scratch::new("inline-limits");
    let ours = fresh_with(&s.0, 1024, "16M", "inline_data,orphan_file");
    let theirs = s.0.join("theirs");
    std::fs::copy(&ours, &theirs).unwrap();
    // (what, file, call): truncate, pwrite one byte, lseek SEEK_SET.
    let script: [(&'static str, &str, char, u64); 9] = [
        ("inline: truncate 64 GiB", "f", 't', 64 * G + 1024),
        ("inline: lseek 17 GiB", "f", 'l', 17 * G),
        ("inline: pwrite 17 GiB", "f", 'w', 17 * G),
        ("inline: lseek 16 GiB", "f", 'l', 16 * G),
        ("moved out: pwrite 15 GiB", "f", 'w', 15 * G),
        ("moved out: lseek 17 GiB", "f", 'l', 17 * G),
        ("moved out: truncate 64 GiB", "f", 't', 64 * G + 1024),
        ("empty: lseek 17 GiB", "g", 'l', 17 * G),
        ("empty: truncate 64 GiB", "g", 't', 64 * G + 1024),
    ];
    let ours_answers: Answers = {
        use scalevfs::{O_CREAT, O_RDWR};
        let (e, vfs) = mount(&ours);
        let t = vfs.root_task();
        let f = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
        assert_eq!(t.pwrite(f, &[b'a'; 116], 0).unwrap(), 116);
        let g = t.open("/g", O_CREAT | O_RDWR, 0o644).unwrap();
        let a = script
            .iter()
            .map(|&(what, file, call, n)| {
                let fd = if file == "f" { f } else { g };
                let r = match call {
                    't' => t.ftruncate(fd, n as i64).map(|_| 0),
                    'w' => t.pwrite(fd, b"x", n as i64).map(|v| v as u64),
                    _ => t.lseek(fd, n as i64, libc::SEEK_SET as u32),
                };
                (what, r.map_err(|e| e.raw()))
            })
            .collect();
        t.close(f).unwrap();
        t.close(g).unwrap();
        unmount_clean(t, vfs, e, &ours);
        a
    };
    let Some(km) = KMount::with_options(&theirs, &s.0.join("kmnt"), "loop,nodelalloc") else {
        return;
    };
    let kernel_answers: Answers = {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileExt;
        let open = |n: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(km.0.join(n))
                .unwrap()
        };
        let f = open("f");
        f.write_all_at(&[b'a'; 116], 0).unwrap();
        let g = open("g");
        script
            .iter()
            .map(|&(what, file, call, n)| {
                let h = if file == "f" { &f } else { &g };
                let r = match call {
                    't' => h.set_len(n).map(|_| 0),
                    'w' => h.write_at(b"x", n).map(|v| v as u64),
                    _ => {
                        // SAFETY: a valid descriptor; lseek reads no memory.
                        let r = unsafe { libc::lseek(h.as_raw_fd(), n as i64, libc::SEEK_SET) };
                        if r < 0 {
                            Err(std::io::Error::last_os_error())
                        } else {
                            Ok(r as u64)
                        }
                    }
                };
                (what, r.map_err(|e| e.raw_os_error().unwrap()))
            })
            .collect()
    };
    drop(km);
    fsck_clean(&theirs);
    assert_eq!(ours_answers, kernel_answers);
    // And as the kernel gave them here (6.18): the inline file stops at
    // the block-mapped limit.
    assert_eq!(ours_answers[0].1, Err(libc::EFBIG));
    assert_eq!(ours_answers[5].1, Ok(17 * G));
}
