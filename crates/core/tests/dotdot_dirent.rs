//! getdents' ".." entry names the parent's inode: in a subdirectory (the
//! lock-free fast path), at the root and the task's chroot (itself), at a
//! mount root (the mount point's parent in the parent mount), and after the
//! directory was renamed under another parent while open.
use scalevfs::*;

fn dotdot(t: &Task, fd: i32) -> u64 {
    t.lseek(fd, 0, scalevfs::io::SEEK_SET).unwrap();
    let es = t.getdents(fd, 16).unwrap();
    es.iter().find(|e| e.name == b"..").expect("a .. entry").ino
}

#[test]
fn dotdot_entry_names_the_parent() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.mkdir("/a", 0o755).unwrap();
    t.mkdir("/a/b", 0o755).unwrap();
    t.mkdir("/x", 0o755).unwrap();
    let ino = |p: &str| t.stat(p).unwrap().ino;

    let fd = t.open("/a/b", O_RDONLY | O_DIRECTORY, 0).unwrap();
    assert_eq!(dotdot(&t, fd), ino("/a"));
    // Moved under /x while open: ".." follows the new parent.
    t.rename("/a/b", "/x/b").unwrap();
    assert_eq!(dotdot(&t, fd), ino("/x"));
    t.close(fd).unwrap();

    // The root: ".." is the root itself.
    let fd = t.open("/", O_RDONLY | O_DIRECTORY, 0).unwrap();
    assert_eq!(dotdot(&t, fd), ino("/"));
    t.close(fd).unwrap();

    // A mount root: ".." is the mount point's parent.
    t.mount("/x/b", vfs.new_memfs(MemFsOptions::default()), false)
        .unwrap();
    let fd = t.open("/x/b", O_RDONLY | O_DIRECTORY, 0).unwrap();
    assert_eq!(dotdot(&t, fd), ino("/x"));
    t.close(fd).unwrap();

    // The task's root after chroot: ".." is itself.
    let c = t.fork();
    c.chroot("/a").unwrap();
    let fd = c.open("/", O_RDONLY | O_DIRECTORY, 0).unwrap();
    assert_eq!(dotdot(&c, fd), ino("/a"));
    c.close(fd).unwrap();
}
