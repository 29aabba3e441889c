//! `scalevfs mkfs` from the command line: options reach the image
//! (label, UUID, features, block size) as dumpe2fs reads them, e2fsck
//! passes, and bad options exit non-zero with a message, never a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scalevfs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_scalevfs"))
        .args(args)
        .output()
        .expect("run scalevfs")
}

fn tool(name: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("scalevfs-mkfs-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn mkfs_options_reach_the_image() {
    let d = scratch("ok");
    let img = d.join("a.img");
    let img_s = img.to_str().unwrap();
    let out = scalevfs(&[
        "mkfs",
        img_s,
        "--size",
        "64M",
        "-b",
        "2048",
        "-L",
        "scratch",
        "-U",
        "0123456789abcdef0123456789abcdef",
        "-O",
        "^orphan_file",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("32768 blocks of 2048 bytes"), "{text}");
    let Some(dumpe2fs) = tool("dumpe2fs") else {
        eprintln!("SKIP: dumpe2fs not found");
        return;
    };
    let h = Command::new(dumpe2fs).arg("-h").arg(&img).output().unwrap();
    let h = String::from_utf8_lossy(&h.stdout);
    assert!(h.contains("Filesystem volume name:   scratch"), "{h}");
    assert!(
        h.contains("Filesystem UUID:          01234567-89ab-cdef-0123-456789abcdef"),
        "{h}"
    );
    assert!(h.contains("Block size:               2048"), "{h}");
    assert!(!h.contains("orphan_file"), "{h}");
    if let Some(e2fsck) = tool("e2fsck") {
        let st = Command::new(e2fsck).arg("-fn").arg(&img).output().unwrap();
        assert!(
            st.status.success(),
            "{}",
            String::from_utf8_lossy(&st.stdout)
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn bad_options_exit_with_a_message() {
    let d = scratch("bad");
    let img = d.join("b.img");
    let img_s = img.to_str().unwrap();
    for (args, want) in [
        (vec!["--size", "64M", "-b", "3000"], "block size 3000"),
        (vec!["--size", "17T", "-b", "1024"], "too large"),
        (vec!["--size", "20K"], "too small"),
        (vec!["--size", "lots"], "size \"lots\""),
        (vec!["--size", "64M", "-U", "nope"], "UUID"),
        (
            vec!["--size", "64M", "-O", "^extent"],
            "cannot be turned off",
        ),
    ] {
        let mut a = vec!["mkfs", img_s];
        a.extend(args);
        let out = scalevfs(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{a:?} succeeded");
        assert!(err.contains(want), "{a:?}: {err}");
        assert!(!err.contains("panicked"), "{a:?}: {err}");
        assert!(!img.exists(), "{a:?} left a file");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// Sizes where the one block group's leftover holds its metadata but not
/// 50 blocks more: mke2fs drops that short group, leaving none, and says
/// the size is too small. These once divided by a zero group count.
#[test]
fn one_short_group_is_too_small_not_a_panic() {
    let d = scratch("short");
    let img = d.join("s.img");
    let img_s = img.to_str().unwrap();
    for args in [
        vec!["--size", "64K", "-i", "1024"],
        vec!["--size", "64K", "-I", "1024"],
        vec!["-b", "2048", "-I", "1024", "-i", "4096", "--size", "128K"],
        vec!["-b", "4096", "-I", "1024", "-i", "4096", "--size", "256K"],
    ] {
        let mut a = vec!["mkfs", img_s];
        a.extend(args);
        let out = scalevfs(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{a:?} succeeded");
        assert!(!err.contains("panicked"), "{a:?}: {err}");
        assert!(err.contains("too small"), "{a:?}: {err}");
        assert!(!img.exists(), "{a:?} left a file");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// Every entry below `root` as (relative path, description), where the
/// description has what both sides must agree on. `attrs`: also owners,
/// modes, times and device numbers (not kept by `debugfs rdump` as non-root).
fn describe(root: &Path, attrs: bool) -> Vec<(PathBuf, String)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            if r == Path::new("lost+found") {
                continue;
            }
            let p = root.join(&r);
            let md = std::fs::symlink_metadata(&p).unwrap();
            let ft = md.file_type();
            let mut d = if ft.is_dir() {
                stack.push(r.clone());
                "dir".to_string()
            } else if ft.is_file() {
                let data = std::fs::read(&p).unwrap();
                let h = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                    (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
                });
                format!("file {} {h:x}", data.len())
            } else if ft.is_symlink() {
                format!("link {:?}", std::fs::read_link(&p).unwrap())
            } else if attrs {
                "special".to_string()
            } else {
                // `debugfs rdump` does not recreate FIFOs and devices.
                continue;
            };
            if attrs {
                d += &format!(
                    " mode {:o} {}:{} mtime {}.{} rdev {} nlink {}",
                    md.mode(),
                    md.uid(),
                    md.gid(),
                    md.mtime(),
                    md.mtime_nsec(),
                    md.rdev(),
                    if ft.is_dir() { 0 } else { md.nlink() }
                );
            }
            out.push((r, d));
        }
    }
    out.sort();
    out
}

/// Equal trees, or a failure that names the first few differences.
fn same_trees(got: &[(PathBuf, String)], want: &[(PathBuf, String)], who: &str) {
    let diff: Vec<String> = want
        .iter()
        .filter(|w| !got.contains(w))
        .map(|w| format!("missing/different: {w:?}"))
        .chain(
            got.iter()
                .filter(|g| !want.contains(g))
                .map(|g| format!("extra: {g:?}")),
        )
        .take(8)
        .collect();
    assert!(
        diff.is_empty(),
        "{who} sees a different tree:\n{}",
        diff.join("\n")
    );
}

/// `mkfs --from DIR` (as mke2fs -d): e2fsck passes, e2fsprogs' own reader
/// (`debugfs rdump`) extracts the same names and contents, and where a loop
/// mount is possible the kernel shows the same owners, modes, times, device
/// numbers and hard links; sparse files stay sparse.
#[test]
fn mkfs_from_a_directory() {
    use std::os::unix::fs::PermissionsExt;
    let (Some(e2fsck), Some(debugfs)) = (tool("e2fsck"), tool("debugfs")) else {
        eprintln!("SKIPPED mkfs_from_a_directory: e2fsprogs is not installed");
        return;
    };
    let d = scratch("from");
    let src = d.join("src");
    std::fs::create_dir_all(src.join("a/b/many")).unwrap();
    std::fs::write(src.join("a/f"), b"hello\n").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 31 % 253) as u8).collect();
    std::fs::write(src.join("a/b/big"), &big).unwrap();
    std::fs::hard_link(src.join("a/f"), src.join("a/hard")).unwrap();
    std::os::unix::fs::symlink("../f", src.join("a/b/fast")).unwrap();
    std::os::unix::fs::symlink("y".repeat(300), src.join("slow")).unwrap();
    let sparse = std::fs::File::create(src.join("sparse")).unwrap();
    sparse.set_len(8 << 20).unwrap();
    drop(sparse);
    for i in 0..2500 {
        std::fs::write(src.join(format!("a/b/many/entry-{i:05}")), i.to_string()).unwrap();
    }
    std::fs::set_permissions(src.join("a/b/big"), std::fs::Permissions::from_mode(0o4751)).unwrap();
    let fifo = std::ffi::CString::new(src.join("a/fifo").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        let f = std::ffi::CString::new(src.join("a/f").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: chown with a valid C string.
        assert_eq!(unsafe { libc::chown(f.as_ptr(), 1234, 5678) }, 0);
    }
    let img = d.join("from.img");
    let out = scalevfs(&[
        "mkfs",
        img.to_str().unwrap(),
        "--size",
        "128M",
        "-q",
        "--from",
        src.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fsck = Command::new(&e2fsck).arg("-fn").arg(&img).output().unwrap();
    assert!(
        fsck.status.success(),
        "e2fsck: {}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    // e2fsprogs' reader extracts the same tree.
    let dump = d.join("dump");
    std::fs::create_dir_all(&dump).unwrap();
    let r = Command::new(&debugfs)
        .args(["-R", &format!("rdump / {}", dump.display())])
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        r.status.success(),
        "debugfs: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let dumped = dump.join(src.file_name().unwrap()); // rdump / DIR puts the root's entries in DIR
    let dumped = if dumped.exists() {
        dumped
    } else {
        dump.clone()
    };
    same_trees(
        &describe(&dumped, false),
        &describe(&src, false),
        "debugfs rdump",
    );
    // The kernel, where a loop mount is possible.
    let mnt = d.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = Command::new("mount")
        .args(["-o", "loop,ro"])
        .arg(&img)
        .arg(&mnt)
        .output();
    match m {
        Ok(o) if o.status.success() => {
            let (k, h) = (describe(&mnt, true), describe(&src, true));
            let blocks = {
                use std::os::unix::fs::MetadataExt;
                std::fs::metadata(mnt.join("sparse")).unwrap().blocks()
            };
            let _ = Command::new("umount").arg(&mnt).status();
            same_trees(&k, &h, "the kernel");
            assert_eq!(blocks, 0, "the sparse file got blocks");
        }
        Ok(o) => eprintln!(
            "kernel comparison skipped: cannot loop-mount here: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => eprintln!("kernel comparison skipped: mount: {e}"),
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// A bad `--from` (missing, a file, an unreadable subdirectory for a
/// non-root run) is an error before the image is touched: an existing
/// image stays as it was (it used to be made first, then wiped to 0
/// bytes). And an image made inside its own source is not copied into
/// itself.
#[test]
fn a_bad_source_leaves_the_image_and_the_image_is_not_its_own_content() {
    let d = scratch("from-first");
    let img = d.join("keep.img");
    let img_s = img.to_str().unwrap();
    let old = b"an existing file the user did not mean to lose".to_vec();
    std::fs::write(&img, &old).unwrap();
    let file = d.join("file");
    std::fs::write(&file, b"x").unwrap();
    for from in [d.join("missing"), file.clone()] {
        let out = scalevfs(&[
            "mkfs",
            img_s,
            "--size",
            "16M",
            "--from",
            from.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "--from {}: succeeded",
            from.display()
        );
        assert!(err.contains(from.to_str().unwrap()), "{err}");
        assert_eq!(
            std::fs::read(&img).unwrap(),
            old,
            "--from {}: the image changed",
            from.display()
        );
    }

    // The image inside the tree it is made from.
    let src = d.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), b"a").unwrap();
    let inner = src.join("inner.img");
    std::fs::write(&inner, b"old").unwrap();
    let out = scalevfs(&[
        "mkfs",
        inner.to_str().unwrap(),
        "--size",
        "16M",
        "-q",
        "--from",
        src.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("it is the image being made"), "{err}");
    if let Some(debugfs) = tool("debugfs") {
        let ls = std::process::Command::new(debugfs)
            .args(["-R", "ls -l /"])
            .arg(&inner)
            .output()
            .unwrap();
        let ls = String::from_utf8_lossy(&ls.stdout);
        assert!(ls.contains(" a"), "{ls}");
        assert!(!ls.contains("inner.img"), "the image holds itself: {ls}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// A source larger than the image says which limit it passed: its inodes
/// (with what to change) or its blocks, not a bare ENOSPC.
#[test]
fn a_source_too_large_names_the_limit() {
    let d = scratch("limits");
    let src = d.join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..600 {
        std::fs::write(src.join(format!("f{i}")), b"").unwrap();
    }
    let img = d.join("img");
    let run = |size: &str| {
        let out = scalevfs(&[
            "mkfs",
            img.to_str().unwrap(),
            "--size",
            size,
            "-q",
            "--from",
            src.to_str().unwrap(),
        ]);
        assert!(!out.status.success());
        // Wiped, and nothing written back into it after the wipe.
        assert_eq!(std::fs::metadata(&img).map(|m| m.len()).unwrap_or(0), 0);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // 1 MiB: 128 inodes for 600 files, found before the image is made.
    let err = run("1M");
    assert!(
        err.contains("the source has 600 files and directories, more than the 117 free inodes")
            && err.contains("a smaller --inode-ratio"),
        "{err}"
    );
    // An image already there is left as it was.
    let ok = scalevfs(&["mkfs", img.to_str().unwrap(), "--size", "1M", "-q"]);
    assert!(ok.status.success());
    let before = std::fs::read(&img).unwrap();
    let out = scalevfs(&[
        "mkfs",
        img.to_str().unwrap(),
        "--size",
        "1M",
        "-q",
        "--from",
        src.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        std::fs::read(&img).unwrap() == before,
        "the old image changed"
    );
    std::fs::remove_file(&img).unwrap();
    // Few files, more data than the image holds (not zeros: those stay
    // holes).
    for i in 0..600 {
        std::fs::remove_file(src.join(format!("f{i}"))).unwrap();
    }
    let data: Vec<u8> = (0..(3u32 << 20))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8 | 1)
        .collect();
    std::fs::write(src.join("big"), data).unwrap();
    let err = run("2M");
    assert!(err.contains("no free blocks left"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}
