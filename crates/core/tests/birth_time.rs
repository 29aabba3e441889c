//! A memfs inode keeps the time it was made (`Task::statx`, statx's
//! `stx_btime`; std's `Metadata::created`): the ctime it was made with, unchanged by later
//! changes of its ctime, mtime and atime. Before, `Stat` had no birth time
//! and `created()` was always Unsupported, where tmpfs reports one
//! (review of the std::fs layer, stop 51).

use scalevfs::*;

#[test]
fn the_birth_time_is_the_making_and_stays() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    let x = t.fstatx(fd).unwrap();
    assert_eq!(x.btime, Some(x.stat.ctime));
    assert_eq!(x.stat, t.fstat(fd).unwrap());
    let born = x.btime.unwrap();
    // Changes of every other time.
    let at = |sec, nsec| Timespec { sec, nsec };
    t.futimens(fd, Some([at(5, 6), at(7, 8)])).unwrap();
    t.write(fd, b"data").unwrap();
    t.chmod("/f", 0o600).unwrap();
    t.rename("/f", "/g").unwrap();
    let x = t.statx(AT_FDCWD, "/g", 0).unwrap();
    assert_eq!(x.btime, Some(born));
    assert!(x.stat.ctime >= born);
    // Each inode its own: a later one is born no earlier.
    t.mkdir("/d", 0o755).unwrap();
    let d = t.statx(AT_FDCWD, "/d", 0).unwrap();
    assert_eq!(d.btime, Some(d.stat.ctime));
    assert!(d.btime.unwrap() >= born);
    t.close(fd).unwrap();
}

/// std's `Metadata::created` through the std::fs-shaped layer: the birth
/// time, where it was Unsupported.
#[test]
fn created_is_the_birth_time() {
    let vfs = Vfs::new();
    let fs = scalevfs::fs::Fs::new(vfs.root_task());
    fs.write("/f", b"x").unwrap();
    let born = vfs
        .root_task()
        .statx(AT_FDCWD, "/f", 0)
        .unwrap()
        .btime
        .unwrap();
    let want = std::time::UNIX_EPOCH + std::time::Duration::new(born.sec as u64, born.nsec as u32);
    assert_eq!(fs.metadata("/f").unwrap().created().unwrap(), want);
}
