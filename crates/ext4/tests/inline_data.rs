//! Images made with the inline_data feature are read (and refused
//! read-write): files and symlinks whose bytes live in the inode (the 60
//! bytes of `i_block`, then the `system.data` attribute), directories whose
//! entries do, next to ordinary ones. mke2fs -d lays the tree out, debugfs
//! confirms which inodes are inline (the kernel, where it can loop-mount,
//! adds a directory that outgrows `i_block`, which mke2fs never leaves
//! inline), and the tree read through scalevfs must equal the source and
//! the kernel's own read of the image.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use scalevfs::{Vfs, VfsConfig};
use scalevfs_ext4::{Ext4, Ext4Options};

/// Whether debugfs shows `path` of `img` with the inline data flag.
fn inline(img: &Path, path: &str) -> bool {
    let out = debugfs_ro(img, &format!("stat {path}"));
    assert!(out.contains("Inode:"), "debugfs stat {path}: {out}");
    let flags = out
        .split("Flags: 0x")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .unwrap_or_else(|| panic!("no flags in debugfs stat {path}: {out}"));
    flags & 0x1000_0000 != 0
}

/// Attribute names of `p` as the host lists them (not following links).
fn host_xattr_names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = host_xattrs(p).into_keys().collect();
    v.sort();
    v
}

/// The same names, and for each its mode, size, content and target.
fn same_tree(ours: &BTreeMap<String, Node>, theirs: &BTreeMap<String, Node>, who: &str) {
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "names against {who}"
    );
    for (k, v) in theirs {
        let o = &ours[k];
        assert_eq!(
            (o.mode, o.size, &o.content, &o.target),
            (v.mode, v.size, &v.content, &v.target),
            "{k} against {who}"
        );
    }
}

#[test]
fn inline_files_and_directories_read_back_as_the_kernel_reads_them() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("inline");
    let src = s.0.join("src");
    std::fs::create_dir_all(src.join("few/deeper")).unwrap();
    std::fs::create_dir_all(src.join("many")).unwrap();
    let pat = |n: usize| -> Vec<u8> { (0..n).map(|i| b'a' + (i % 26) as u8).collect() };
    for n in [0usize, 1, 10, 59, 60, 61, 100, 120, 200, 5000] {
        std::fs::write(src.join(format!("f{n}")), pat(n)).unwrap();
    }
    std::fs::write(src.join("few/one"), b"1").unwrap();
    std::fs::write(src.join("few/deeper/two"), pat(90)).unwrap();
    for i in 0..100 {
        std::fs::write(src.join("many").join(format!("entry-{i:03}")), b"m").unwrap();
    }
    std::os::unix::fs::symlink("short", src.join("fast-link")).unwrap();
    std::os::unix::fs::symlink("t".repeat(70), src.join("inline-link")).unwrap();
    // An attribute of its own beside the inline data's.
    {
        let c = std::ffi::CString::new(src.join("f10").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: plain syscall; the strings outlive it.
        let r = unsafe {
            libc::setxattr(
                c.as_ptr(),
                c"user.note".as_ptr(),
                b"x".as_ptr().cast(),
                1,
                0,
            )
        };
        assert_eq!(r, 0, "setxattr on the source");
    }
    let img = s.0.join("img");
    make_image(&src, &img, 4096, "32M", "inline_data");
    // mke2fs moves a directory out of the inode once i_block is full; the
    // kernel first grows it into system.data: five entries of 16 bytes
    // made by the kernel (and in the source, which the tree must match).
    let kdir = match KMount::rw(&img, &s.0.join("mnt-rw")) {
        Some(km) => {
            std::fs::create_dir(km.0.join("mid")).unwrap();
            std::fs::create_dir(src.join("mid")).unwrap();
            for i in 0..5 {
                std::fs::write(km.0.join("mid").join(format!("file-{i}")), b"x").unwrap();
                std::fs::write(src.join("mid").join(format!("file-{i}")), b"x").unwrap();
            }
            drop(km);
            true
        }
        None => false,
    };
    fsck_clean(&img);
    if kdir {
        assert!(inline(&img, "/mid"), "the kernel kept /mid inline");
        let st = debugfs_ro(&img, "stat /mid");
        assert!(
            st.contains("Size of inline data: 128"),
            "/mid spills into system.data: {st}"
        );
    }
    // The layout the test is about: small files, a small directory and a
    // long symlink inline; larger ones not.
    for p in [
        "/f1",
        "/f10",
        "/f60",
        "/f100",
        "/few",
        "/few/deeper",
        "/inline-link",
    ] {
        assert!(inline(&img, p), "{p} is inline");
    }
    for p in ["/f5000", "/many"] {
        assert!(!inline(&img, p), "{p} is not inline");
    }
    // Read-write: refused, naming the feature, the image untouched.
    let before = std::fs::read(&img).unwrap();
    let Err(err) = Ext4::open(&img, rw_journaled()) else {
        panic!("an inline_data image opened read-write");
    };
    assert!(format!("{err}").contains("inline_data"), "{err}");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refused open wrote"
    );
    // Read-only: the tree is the source's.
    let e = Ext4::open(&img, Ext4Options::default()).unwrap();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), e);
    let t = vfs.root_task();
    let fs = scalevfs::fs::Fs::new(vfs.root_task());
    let ours = vfs_tree(&fs);
    let theirs: BTreeMap<_, _> = host_tree(&src);
    same_tree(&ours, &theirs, "the source");
    // Lookups by name in an inline directory, `..` from one, a miss.
    assert_eq!(fs.read("/few/deeper/two").unwrap(), pat(90));
    assert!(fs.metadata("/few/deeper/..").unwrap().is_dir());
    assert_eq!(
        fs.metadata("/few/deeper/..").unwrap().stat().ino,
        fs.metadata("/few").unwrap().stat().ino
    );
    assert!(fs.metadata("/few/none").is_err());
    if kdir {
        assert_eq!(fs.read("/mid/file-4").unwrap(), b"x");
        assert_eq!(fs.read_dir("/mid").unwrap().count(), 5);
    }
    // Partial reads inside the inline bytes and across i_block's end.
    let fd = t.open("/f100", scalevfs::O_RDONLY, 0).unwrap();
    let mut b = [0u8; 30];
    assert_eq!(t.pread(fd, &mut b, 50).unwrap(), 30);
    assert_eq!(&b[..], &pat(100)[50..80]);
    assert_eq!(t.pread(fd, &mut b, 90).unwrap(), 10);
    assert_eq!(t.pread(fd, &mut b, 100).unwrap(), 0);
    // FIEMAP: one extent, the bytes in the inode.
    let ours_map = t.fiemap(fd, 0, u64::MAX, 0).unwrap();
    assert_eq!(ours_map.len(), 1, "{ours_map:?}");
    assert_eq!((ours_map[0].logical, ours_map[0].length), (0, 100));
    assert_eq!(
        ours_map[0].flags,
        0x200 | 0x100 | 0x1,
        "DATA_INLINE | NOT_ALIGNED | LAST"
    );
    t.close(fd).unwrap();
    // system.data is not an attribute anyone sees; user.note is.
    let mut names = vec![0u8; 256];
    let n = t.llistxattr("/f10", &mut names).unwrap();
    assert_eq!(&names[..n], b"user.note\0");
    let n = t.llistxattr("/f100", &mut names).unwrap();
    assert_eq!(n, 0, "no attribute listed for an inline file");
    drop(fs);
    drop(t);
    drop(vfs);
    // The kernel reads the same tree and lists the same attributes.
    let Some(km) = KMount::new(&img, &s.0.join("mnt")) else {
        return;
    };
    let kernel = host_tree(&km.0);
    let kernel: BTreeMap<_, _> = kernel
        .into_iter()
        .filter(|(k, _)| !k.starts_with("/lost+found"))
        .collect();
    same_tree(&ours, &kernel, "the kernel");
    assert_eq!(host_xattr_names(&km.0.join("f10")), ["user.note"]);
    assert_eq!(
        kernel_fiemap(&km.0.join("f100"), 0, u64::MAX).unwrap(),
        ours_map
    );
    assert!(host_xattr_names(&km.0.join("f100")).is_empty());
}
