//! Inodes whose `i_extra_isize` is below the 32 bytes new inodes get
//! (images from an older mke2fs or kernel, which used 0 or 28; made here
//! with debugfs `sif`)
//! grow it when a read-write mount changes them, as the kernel's
//! `ext4_try_to_expand_extra_isize` does: nanosecond times and the high
//! half of the checksum are stored from then on, and attributes in the
//! inode move up behind the longer fixed part. One whose attributes would
//! not fit the smaller area keeps its size. e2fsck passes, debugfs shows
//! the sizes and the attributes, and the kernel reads the nanoseconds and
//! the attributes back.

mod common;

use std::path::Path;

use common::*;
use scalevfs::types::Timespec;
use scalevfs::{Vfs, O_CREAT, O_WRONLY};

fn extra_of(img: &Path, p: &str) -> usize {
    let out = debugfs_ro(img, &format!("stat {p}"));
    match out.split("Size of extra inode fields: ").nth(1) {
        Some(r) => r.split_whitespace().next().unwrap().parse().unwrap(),
        None => panic!("no extra size in debugfs stat {p}: {out}"),
    }
}

fn dbg_w(img: &Path, req: &str) {
    assert!(debugfs(img, req), "debugfs -w {req}");
}

#[test]
fn short_extra_isize_grows_when_an_inode_changes() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("extraisize");
    let src = s.0.join("src");
    std::fs::create_dir_all(src.join("dir")).unwrap();
    for f in ["a", "b", "c", "d", "e"] {
        std::fs::write(src.join(f), f.repeat(100)).unwrap();
    }
    let img = s.0.join("img");
    make_image(&src, &img, 4096, "16M", "");
    let fat = "f".repeat(70);
    let vfile = s.0.join("fat");
    std::fs::write(&vfile, &fat).unwrap();
    dbg_w(&img, "sif /a extra_isize 0");
    dbg_w(&img, "sif /b extra_isize 4");
    dbg_w(&img, "sif /dir extra_isize 0");
    dbg_w(&img, "sif /c extra_isize 28");
    dbg_w(&img, "ea_set /c user.small v1");
    dbg_w(&img, "sif /d extra_isize 28");
    dbg_w(&img, &format!("ea_set -f {} /d user.fat", vfile.display()));
    dbg_w(&img, "sif /e extra_isize 8");
    fsck_clean(&img);
    for (p, want) in [("/a", 0), ("/b", 4), ("/dir", 0), ("/c", 28), ("/d", 28)] {
        assert_eq!(extra_of(&img, p), want, "{p} before");
    }
    assert!(debugfs_ro(&img, "ea_list /c").contains("user.small"));
    let when = Timespec {
        sec: 1_700_000_000,
        nsec: 123_456_789,
    };
    {
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        t.utimensat(scalevfs::AT_FDCWD, "/a", Some([when, when]), 0)
            .unwrap();
        t.chmod("/b", 0o600).unwrap();
        t.setxattr("/c", "user.new", b"value-2", 0).unwrap();
        t.chmod("/d", 0o640).unwrap();
        t.setxattr("/d", "user.more", b"x", 0).unwrap();
        let fd = t.open("/dir/new", O_CREAT | O_WRONLY, 0o644).unwrap();
        t.close(fd).unwrap();
        // Untouched: /e keeps its size.
        drop(t);
        drop(vfs);
        e.unmount().unwrap();
    }
    fsck_clean(&img);
    for p in ["/a", "/b", "/dir", "/c"] {
        assert_eq!(extra_of(&img, p), 32, "{p} after");
    }
    assert_eq!(
        extra_of(&img, "/d"),
        28,
        "/d's attributes do not fit a smaller area"
    );
    assert_eq!(extra_of(&img, "/e"), 8, "/e was not changed");
    let ea = debugfs_ro(&img, "ea_list /c");
    assert!(ea.contains("user.small") && ea.contains("user.new"), "{ea}");
    // Read back through scalevfs.
    let e = scalevfs_ext4::Ext4::open(&img, scalevfs_ext4::Ext4Options::default()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e);
    let t = vfs.root_task();
    let st = t.stat("/a").unwrap();
    assert_eq!((st.mtime.sec, st.mtime.nsec), (when.sec, when.nsec));
    assert_eq!(
        t.xattr_value("/c", "user.small", 0).unwrap(),
        b"v1".to_vec()
    );
    assert_eq!(
        t.xattr_value("/d", "user.fat", 0).unwrap(),
        fat.as_bytes().to_vec()
    );
    drop(t);
    drop(vfs);
    let Some(km) = KMount::new(&img, &s.0.join("mnt")) else {
        return;
    };
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(km.0.join("a")).unwrap();
    assert_eq!((m.mtime(), m.mtime_nsec()), (when.sec, when.nsec));
    let x = host_xattrs(&km.0.join("c"));
    assert_eq!(x.get("user.small"), Some(&b"v1".to_vec()));
    assert_eq!(x.get("user.new"), Some(&b"value-2".to_vec()));
    let x = host_xattrs(&km.0.join("d"));
    assert_eq!(x.get("user.fat"), Some(&fat.as_bytes().to_vec()));
    assert_eq!(x.get("user.more"), Some(&b"x".to_vec()));
    assert_eq!(
        std::fs::read(km.0.join("b")).unwrap(),
        "b".repeat(100).as_bytes()
    );
}
