//! Core handles (`scalevfs::Handle`): calls relative to a handle give the
//! same results and errnos as the same calls relative to an fd, a handle
//! follows its dentry (not a path), and it holds its mount.

use scalevfs::{
    Cred, Errno, Handle, MemFsOptions, Task, Vfs, AT_EMPTY_PATH, AT_FDCWD, AT_REMOVEDIR,
    AT_SYMLINK_NOFOLLOW, O_CREAT, O_DIRECTORY, O_PATH, O_RDONLY, O_RDWR, O_WRONLY,
};

fn setup() -> (Vfs, Task) {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    t.mkdir("/d/sub", 0o755).unwrap();
    let fd = t.open("/d/f", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.write(fd, b"hello").unwrap();
    t.close(fd).unwrap();
    (vfs, t)
}

fn user(vfs: &Vfs, uid: u32) -> Task {
    vfs.task(Cred {
        uid,
        gid: uid,
        groups: vec![],
    })
}

#[test]
fn lookup_and_getattr_match_stat() {
    let (_vfs, t) = setup();
    let d = t.handle_at(AT_FDCWD, "/d", 0).unwrap();
    let f = d.lookup(&t, "f").unwrap();
    let st = t.stat("/d/f").unwrap();
    assert_eq!(f.getattr().ino, st.ino);
    assert_eq!(f.getattr().size, 5);
    assert_eq!(f.id().ino, st.ino);
    assert_eq!(f.id(), f.clone().id());
    // `.` and `..` resolve as the walk does.
    assert!(d.lookup(&t, ".").unwrap().same_location(&d));
    assert_eq!(
        d.lookup(&t, "..").unwrap().getattr().ino,
        t.stat("/").unwrap().ino
    );
    // A missing name, a file used as a directory.
    assert_eq!(d.lookup(&t, "nope").unwrap_err(), Errno::ENOENT);
    assert_eq!(f.lookup(&t, "x").unwrap_err(), Errno::ENOTDIR);
    assert_eq!(
        t.fstatat(&f, "x", 0).unwrap_err(),
        t.fstatat(AT_FDCWD, "/d/f/x", 0).unwrap_err()
    );
    // AT_EMPTY_PATH names the base itself; without it an empty path is ENOENT.
    let fd = t.open("/d", O_PATH, 0).unwrap();
    let again = t.handle_at(fd, "", AT_EMPTY_PATH).unwrap();
    assert!(again.same_location(&d));
    assert_eq!(t.handle_at(fd, "", 0).unwrap_err(), Errno::ENOENT);
    assert_eq!(
        t.handle_at(fd, "f", 0x4000_0000).unwrap_err(),
        Errno::EINVAL
    );
    // fstat on a handle is its getattr.
    assert_eq!(t.fstat(&f).unwrap().ino, st.ino);
}

#[test]
fn symlinks_follow_only_when_asked() {
    let (_vfs, t) = setup();
    let d = t.handle_at(AT_FDCWD, "/d", 0).unwrap();
    d.symlink(&t, "f", "l").unwrap();
    let l = d.lookup(&t, "l").unwrap();
    assert_eq!(l.getattr().mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(l.readlink(&t).unwrap(), b"f");
    let followed = t.handle_at(&d, "l", 0).unwrap();
    assert_eq!(followed.getattr().ino, t.stat("/d/f").unwrap().ino);
    assert_eq!(
        t.handle_at(&d, "l", AT_SYMLINK_NOFOLLOW).unwrap().id(),
        l.id()
    );
}

#[test]
fn name_ops_through_a_handle() {
    let (_vfs, t) = setup();
    let d = t.handle_at(AT_FDCWD, "/d", 0).unwrap();
    let sub = d.lookup(&t, "sub").unwrap();
    d.mkdir(&t, "m", 0o700).unwrap();
    assert!(t.stat("/d/m").unwrap().is_dir());
    assert_eq!(d.mkdir(&t, "m", 0o700).unwrap_err(), Errno::EEXIST);
    let fd = d.create(&t, "c", O_RDWR, 0o600).unwrap();
    t.write(fd, b"x").unwrap();
    t.close(fd).unwrap();
    assert_eq!(t.stat("/d/c").unwrap().size, 1);
    d.rename(&t, "c", &sub, "c2", 0).unwrap();
    assert_eq!(t.stat("/d/c").unwrap_err(), Errno::ENOENT);
    assert_eq!(t.stat("/d/sub/c2").unwrap().size, 1);
    let c2 = sub.lookup(&t, "c2").unwrap();
    c2.link(&t, &d, "hard").unwrap();
    assert_eq!(t.stat("/d/hard").unwrap().nlink, 2);
    assert_eq!(c2.link(&t, &d, "hard").unwrap_err(), Errno::EEXIST);
    d.unlink(&t, "hard", 0).unwrap();
    assert_eq!(d.unlink(&t, "m", 0).unwrap_err(), Errno::EISDIR);
    d.unlink(&t, "m", AT_REMOVEDIR).unwrap();
    // Attribute changes.
    c2.chmod(&t, 0o640).unwrap();
    assert_eq!(t.stat("/d/sub/c2").unwrap().mode & 0o7777, 0o640);
    c2.chown(&t, 7, 8).unwrap();
    let st = t.stat("/d/sub/c2").unwrap();
    assert_eq!((st.uid, st.gid), (7, 8));
    c2.set_times(
        &t,
        Some([
            scalevfs::Timespec { sec: 5, nsec: 0 },
            scalevfs::Timespec { sec: 6, nsec: 0 },
        ]),
    )
    .unwrap();
    assert_eq!(t.stat("/d/sub/c2").unwrap().mtime.sec, 6);
    // Listing.
    let mut names: Vec<Vec<u8>> = d
        .read_dir(&t)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            b".".to_vec(),
            b"..".to_vec(),
            b"f".to_vec(),
            b"sub".to_vec()
        ]
    );
    assert_eq!(c2.read_dir(&t).unwrap_err(), Errno::ENOTDIR);
}

#[test]
fn permission_checks_are_the_path_calls() {
    let (vfs, t) = setup();
    let u = user(&vfs, 1000);
    let d = t.handle_at(AT_FDCWD, "/d", 0).unwrap();
    // Same errno as the path-based call, for each kind of operation.
    assert_eq!(d.mkdir(&u, "x", 0o755).unwrap_err(), Errno::EACCES);
    assert_eq!(u.mkdir("/d/x", 0o755).unwrap_err(), Errno::EACCES);
    assert_eq!(d.unlink(&u, "f", 0).unwrap_err(), Errno::EACCES);
    assert_eq!(
        d.create(&u, "n", O_WRONLY, 0o644).unwrap_err(),
        Errno::EACCES
    );
    let f = d.lookup(&u, "f").unwrap();
    assert_eq!(f.open(&u, O_WRONLY).unwrap_err(), Errno::EACCES);
    assert_eq!(f.chmod(&u, 0o777).unwrap_err(), Errno::EPERM);
    let fd = f.open(&u, O_RDONLY).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(u.read(fd, &mut buf).unwrap(), 5);
    u.close(fd).unwrap();
    // Search permission on the handle's directory is checked at lookup.
    let dfd = u.open("/d", O_PATH, 0).unwrap();
    t.chmod("/d", 0o700).unwrap();
    assert_eq!(u.fstatat(dfd, "f", 0).unwrap_err(), Errno::EACCES);
    assert_eq!(u.openat(dfd, "f", O_RDONLY, 0).unwrap_err(), Errno::EACCES);
    assert_eq!(u.openat(dfd, "f", O_PATH, 0).unwrap_err(), Errno::EACCES);
    assert_eq!(d.lookup(&u, "f").unwrap_err(), Errno::EACCES);
    assert_eq!(u.stat("/d/f").unwrap_err(), Errno::EACCES);
    // A handle on a directory opens as one only when it is one.
    assert_eq!(
        f.open(&t, O_RDONLY | O_DIRECTORY).unwrap_err(),
        Errno::ENOTDIR
    );
}

#[test]
fn a_handle_follows_its_dentry() {
    let (_vfs, t) = setup();
    let sub = t.handle_at(AT_FDCWD, "/d/sub", 0).unwrap();
    t.rename("/d/sub", "/moved").unwrap();
    sub.mkdir(&t, "inner", 0o755).unwrap();
    assert!(t.stat("/moved/inner").unwrap().is_dir());
    // An unlinked file stays reachable through its handle.
    let f = t.handle_at(AT_FDCWD, "/d/f", 0).unwrap();
    t.unlink("/d/f").unwrap();
    assert_eq!(f.getattr().nlink, 0);
    let fd = f.open(&t, O_RDONLY).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(t.read(fd, &mut buf).unwrap(), 5);
    t.close(fd).unwrap();
    // A removed directory refuses creates.
    let m = t.handle_at(AT_FDCWD, "/moved/inner", 0).unwrap();
    t.rmdir("/moved/inner").unwrap();
    assert_eq!(m.mkdir(&t, "z", 0o755).unwrap_err(), Errno::ENOENT);
}

#[test]
fn a_handle_holds_its_mount() {
    let (vfs, t) = setup();
    t.mkdir("/mnt", 0o755).unwrap();
    let fs = vfs.new_memfs(MemFsOptions::default());
    t.mount("/mnt", fs, false).unwrap();
    t.mkdir("/mnt/a", 0o755).unwrap();
    let root = t.handle_at(AT_FDCWD, "/", 0).unwrap();
    let a = t.handle_at(AT_FDCWD, "/mnt/a", 0).unwrap();
    // Lookup crosses into the mount as the walk does.
    assert_eq!(
        root.lookup(&t, "mnt").unwrap().getattr().dev,
        a.getattr().dev
    );
    let a2 = a.clone();
    drop(a);
    assert_eq!(t.umount("/mnt").unwrap_err(), Errno::EBUSY);
    drop(a2);
    t.umount("/mnt").unwrap();
}

#[test]
fn generations_tell_filesystems_apart() {
    let (vfs, t) = setup();
    let a: Handle = t.handle_at(AT_FDCWD, "/d/f", 0).unwrap();
    t.mkdir("/mnt", 0o755).unwrap();
    t.mount("/mnt", vfs.new_memfs(MemFsOptions::default()), false)
        .unwrap();
    let fd = t.open("/mnt/f", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
    let b = t.handle_at(AT_FDCWD, "/mnt/f", 0).unwrap();
    assert_ne!(a.id().generation, 0);
    assert_ne!(a.id().generation, b.id().generation);
    // Every inode of one memfs shares its generation; numbers are unique.
    let d = t.handle_at(AT_FDCWD, "/d", 0).unwrap();
    assert_eq!(d.id().generation, a.id().generation);
    assert_ne!(d.id().ino, a.id().ino);
}

/// `Task::handle_for_inode`: a handle on a file found by its inode (a
/// decoded file handle) reads and writes the file, also after a rename; a
/// directory's is connected to the tree; it is ESTALE for an unlinked file
/// and another filesystem's inode.
#[test]
fn handle_for_inode_reaches_named_files_only() {
    let (vfs, t) = setup();
    let root = t.handle_at(AT_FDCWD, "/", 0).unwrap();
    let f = t.handle_at(AT_FDCWD, "/d/f", 0).unwrap();
    let inode = f.inode().clone();
    drop(f);
    let h = t.handle_for_inode(&root, inode.clone()).unwrap();
    assert_eq!(h.getattr().ino, t.stat("/d/f").unwrap().ino);
    t.rename("/d/f", "/d/g").unwrap();
    let fd = h.open(&t, O_RDWR).unwrap();
    let mut buf = [0u8; 5];
    assert_eq!(t.pread(fd, &mut buf, 0).unwrap(), 5);
    assert_eq!(&buf, b"hello");
    t.pwrite(fd, b"J", 0).unwrap();
    t.close(fd).unwrap();
    let fd = t.open("/d/g", O_RDONLY, 0).unwrap();
    assert_eq!(t.pread(fd, &mut buf, 0).unwrap(), 5);
    assert_eq!(&buf, b"Jello");
    t.close(fd).unwrap();
    // A directory is reached through the tree: its `..` is its parent.
    let sub = t.handle_at(AT_FDCWD, "/d/sub", 0).unwrap();
    let h = t.handle_for_inode(&root, sub.inode().clone()).unwrap();
    assert!(h.same_location(&sub));
    let up = h.lookup(&t, "..").unwrap();
    assert_eq!(up.getattr().ino, t.stat("/d").unwrap().ino);
    // Another filesystem's inode.
    t.mkdir("/m", 0o755).unwrap();
    t.mount("/m", vfs.new_memfs(MemFsOptions::default()), false)
        .unwrap();
    let fd = t.open("/m/x", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
    let other = t.handle_at(AT_FDCWD, "/m/x", 0).unwrap().inode().clone();
    assert_eq!(t.handle_for_inode(&root, other).unwrap_err(), Errno::ESTALE);
    // Unlinked: stale.
    drop(h);
    t.unlink("/d/g").unwrap();
    assert_eq!(t.handle_for_inode(&root, inode).unwrap_err(), Errno::ESTALE);
}

/// A directory found by its inode (`Task::handle_for_inode`, a file handle
/// decoded after the front end forgot it; xfstests generic/467) is
/// connected where it is now: after moves to other parents (memfs keeps
/// each directory's parent for `Filesystem::get_parent`), several levels
/// deep, and with a name past the first listing batch. A removed directory
/// is ESTALE, and memfs finds no inode by number (`handle_by_number`).
#[test]
fn directory_handles_connect_to_where_the_directory_is() {
    let (_vfs, t) = setup();
    let root = t.handle_at(AT_FDCWD, "/", 0).unwrap();
    t.mkdir("/d/sub/a", 0o755).unwrap();
    t.mkdir("/d/sub/a/b", 0o700).unwrap();
    for i in 0..600 {
        t.mkdir(&format!("/d/sub/a/n{i:03}"), 0o755).unwrap();
    }
    let b = t
        .handle_at(AT_FDCWD, "/d/sub/a/b", 0)
        .unwrap()
        .inode()
        .clone();
    let last = t
        .handle_at(AT_FDCWD, "/d/sub/a/n599", 0)
        .unwrap()
        .inode()
        .clone();
    let path_of = |h: &Handle| {
        // Climb `..` to the root, collecting the names (as getcwd does).
        let mut names = Vec::new();
        let mut cur = h.clone();
        while cur.getattr().ino != root.getattr().ino {
            let up = cur.lookup(&t, "..").unwrap();
            let me = cur.getattr().ino;
            let e = up.read_dir(&t).unwrap();
            let n = e
                .iter()
                .find(|e| e.ino == me && e.name != b".." && e.name != b".");
            names.push(String::from_utf8(n.unwrap().name.clone()).unwrap());
            cur = up;
        }
        names.reverse();
        format!("/{}", names.join("/"))
    };
    let hb = t.handle_for_inode(&root, b.clone()).unwrap();
    assert_eq!(path_of(&hb), "/d/sub/a/b");
    assert_eq!(
        path_of(&t.handle_for_inode(&root, last.clone()).unwrap()),
        "/d/sub/a/n599"
    );
    drop(hb);
    // Moved to another parent, then its parent moved too.
    t.mkdir("/x", 0o755).unwrap();
    t.rename("/d/sub/a/b", "/x/b").unwrap();
    assert_eq!(
        path_of(&t.handle_for_inode(&root, b.clone()).unwrap()),
        "/x/b"
    );
    t.mkdir("/y", 0o755).unwrap();
    t.rename("/x", "/y/x").unwrap();
    assert_eq!(
        path_of(&t.handle_for_inode(&root, b.clone()).unwrap()),
        "/y/x/b"
    );
    // Exchanged with a directory elsewhere: both parents follow.
    t.renameat2(
        AT_FDCWD,
        "/y/x",
        AT_FDCWD,
        "/d/sub/a",
        scalevfs::RENAME_EXCHANGE,
    )
    .unwrap();
    assert_eq!(
        path_of(&t.handle_for_inode(&root, b.clone()).unwrap()),
        "/d/sub/a/b"
    );
    assert_eq!(
        path_of(&t.handle_for_inode(&root, last.clone()).unwrap()),
        "/y/x/n599"
    );
    // The root is itself.
    let r = t.handle_for_inode(&root, root.inode().clone()).unwrap();
    assert!(r.same_location(&root));
    // Removed: stale.
    t.unlinkat(AT_FDCWD, "/d/sub/a/b", AT_REMOVEDIR).unwrap();
    assert_eq!(t.handle_for_inode(&root, b).unwrap_err(), Errno::ESTALE);
    // memfs numbers: never found by number.
    let ino = t.stat("/y/x/n599").unwrap().ino;
    for n in [0, 1, ino, u64::MAX] {
        assert_eq!(
            t.handle_by_number(&root, n, None).unwrap_err(),
            Errno::ESTALE
        );
    }
}
