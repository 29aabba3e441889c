//! chattr flags on the ext4 type (xfstests generic/277 found them kept in
//! memory only): `FS_IOC_SETFLAGS` writes the flags and the new ctime into
//! the inode's `i_flags` (keeping ext4's own bits such as EXTENTS), debugfs
//! reads them back, a remount loads them, and immutable is enforced after
//! the remount as the kernel enforces it.

mod common;

use common::{debugfs_ro, fresh, fsck_clean, have_tools, rw_journaled, Scratch};
use scalevfs::inode::{FS_IMMUTABLE_FL, FS_NOATIME_FL, FS_NODUMP_FL};
use scalevfs::{Errno, Vfs, O_CREAT, O_RDONLY, O_WRONLY};
use scalevfs_ext4::Ext4;

#[test]
fn chattr_flags_reach_the_image_and_come_back() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("chattr");
    let img = fresh(&s.0, 4096, "16M");
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.write(fd, b"hello").unwrap();
    let before = t.fstat(fd).unwrap().ctime;
    std::thread::sleep(std::time::Duration::from_millis(20));
    t.ioctl_setflags(fd, FS_NODUMP_FL | FS_NOATIME_FL).unwrap();
    let after = t.fstat(fd).unwrap().ctime;
    assert!(after > before, "ctime moves with chattr");
    t.close(fd).unwrap();
    let fd = t.open("/g", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.ioctl_setflags(fd, FS_IMMUTABLE_FL).unwrap();
    t.close(fd).unwrap();
    let ino = t.stat("/f").unwrap().ino;
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
    // debugfs: extents (0x80000) kept, nodump (0x40) and noatime (0x80) set.
    let st = debugfs_ro(&img, &format!("stat <{ino}>"));
    assert!(st.contains("Flags: 0x800c0"), "{st}");
    // A remount loads them; immutable is enforced.
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fd = t.open("/f", O_RDONLY, 0).unwrap();
    assert_eq!(t.ioctl_getflags(fd).unwrap(), FS_NODUMP_FL | FS_NOATIME_FL);
    assert_eq!(
        t.fstat(fd).unwrap().ctime,
        after,
        "ctime stored with the flags"
    );
    t.close(fd).unwrap();
    assert_eq!(t.open("/g", O_WRONLY, 0).unwrap_err(), Errno::EPERM);
    assert_eq!(t.unlink("/g").unwrap_err(), Errno::EPERM);
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
}
