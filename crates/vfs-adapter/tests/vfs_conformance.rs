//! The `vfs` crate's own conformance suite against [`ScaleFS`]: served
//! whole (a fresh memfs per test), and served from a subdirectory as
//! `PhysicalFS` serves one.

// The macro's own code (not ours) trips these.
#![allow(clippy::useless_vec)]

use scalevfs::fs::Fs;
use scalevfs_vfs_adapter::ScaleFS;

mod whole {
    use super::*;
    vfs::test_vfs!(ScaleFS::new_memory());
}

mod subdir {
    use super::*;
    fn in_subdir() -> ScaleFS {
        let fs = Fs::new(scalevfs::Vfs::new().root_task());
        fs.create_dir_all("/srv/root").unwrap();
        ScaleFS::with_root(fs, "/srv/root/")
    }
    vfs::test_vfs!(in_subdir());
}

mod chrooted {
    use super::*;
    fn jail() -> ScaleFS {
        let fs = Fs::new(scalevfs::Vfs::new().root_task());
        fs.create_dir_all("/srv/root").unwrap();
        ScaleFS::chrooted(&fs, "/srv/root").unwrap()
    }
    vfs::test_vfs!(jail());
}

/// What `test_vfs!` does not check: errors keep the errno, a served
/// subdirectory confines `vfs` paths, and files go through scalevfs.
#[test]
fn errors_keep_the_errno_and_the_root_confines() {
    use std::io::Write;
    use vfs::error::VfsErrorKind;
    use vfs::VfsPath;

    let fs = Fs::new(scalevfs::Vfs::new().root_task());
    fs.create_dir_all("/srv/root").unwrap();
    fs.write("/secret", b"s").unwrap();
    let root: VfsPath = ScaleFS::with_root(fs.clone(), "/srv/root").into();
    let io_errno = |e: vfs::VfsError| match e.kind() {
        VfsErrorKind::IoError(io) => io.raw_os_error(),
        k => panic!("not an io error: {k:?}"),
    };
    root.join("d/e").unwrap().create_dir_all().unwrap();
    write!(root.join("d/e/f").unwrap().create_file().unwrap(), "x").unwrap();
    assert_eq!(fs.read("/srv/root/d/e/f").unwrap(), b"x");
    let e = root.join("d").unwrap().remove_dir().unwrap_err();
    assert_eq!(io_errno(e), Some(libc::ENOTEMPTY));
    // (VfsPath checks the parent itself; the trait call reaches scalevfs.)
    let sfs = ScaleFS::with_root(fs.clone(), "/srv/root");
    let e = vfs::FileSystem::create_file(&sfs, "/d/e/f/g")
        .err()
        .expect("an error");
    assert_eq!(io_errno(e), Some(libc::ENOTDIR));
    let e = root.join("d").unwrap().create_dir().unwrap_err();
    assert!(matches!(e.kind(), VfsErrorKind::DirectoryExists));
    let e = root.join("d/e/f").unwrap().create_dir().unwrap_err();
    assert!(matches!(e.kind(), VfsErrorKind::FileExists));
    // ".." does not climb out: VfsPath stops at its root, the trait
    // refuses it.
    assert!(!root.join("../secret").unwrap().exists().unwrap());
    let e = vfs::FileSystem::exists(&sfs, "/../secret").unwrap_err();
    assert!(matches!(e.kind(), VfsErrorKind::InvalidPath));
    // A symlink does, when served by prefix (as PhysicalFS); not chrooted.
    fs.soft_link("/secret", "/srv/root/abs").unwrap();
    fs.soft_link("../../secret", "/srv/root/rel").unwrap();
    assert!(root.join("abs").unwrap().exists().unwrap());
    let jail: VfsPath = ScaleFS::chrooted(&fs, "/srv/root").unwrap().into();
    assert!(!jail.join("abs").unwrap().exists().unwrap());
    assert!(!jail.join("rel").unwrap().exists().unwrap());
    assert!(jail.join("d/e/f").unwrap().exists().unwrap());
    let user = Fs::new(fs.task().vfs().task(scalevfs::Cred::user(1, 1)));
    let e = ScaleFS::chrooted(&user, "/srv/root").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    root.join("d").unwrap().remove_dir_all().unwrap();
    assert!(!fs.exists("/srv/root/d"));
}

/// A move between two mounts of the served namespace (EXDEV) falls back
/// to copy-then-remove, as `vfs` does for `PhysicalFS`: the adapter
/// passed EXDEV through, and the move failed.
#[test]
fn moves_across_mounts_copy() {
    use std::io::{Read, Write};
    let vfs = scalevfs::Vfs::new();
    let t = vfs.root_task();
    t.mkdir("/m", 0o755).unwrap();
    t.mount("/m", vfs.new_memfs(Default::default()), false)
        .unwrap();
    let root: vfs::VfsPath = ScaleFS::new(Fs::new(t)).into();
    root.join("d").unwrap().create_dir().unwrap();
    write!(root.join("d/f").unwrap().create_file().unwrap(), "moved").unwrap();
    write!(root.join("g").unwrap().create_file().unwrap(), "file").unwrap();
    root.join("d")
        .unwrap()
        .move_dir(&root.join("m/d").unwrap())
        .unwrap();
    root.join("g")
        .unwrap()
        .move_file(&root.join("m/g").unwrap())
        .unwrap();
    assert!(!root.join("d").unwrap().exists().unwrap());
    assert!(!root.join("g").unwrap().exists().unwrap());
    let mut s = String::new();
    root.join("m/d/f")
        .unwrap()
        .open_file()
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "moved");
    s.clear();
    root.join("m/g")
        .unwrap()
        .open_file()
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "file");
}
