//! An access time a read sets (relatime: the first read after a change)
//! reaches the image, as the kernel's ext4 writes it: it survives an
//! unmount and a new mount, e2fsck passes, and the kernel reads the same
//! time. Before, it lived in memory only and a remount showed the old one
//! (xfstests generic/192 on the ext4 type).

mod common;

use common::*;
use scalevfs::types::Timespec;
use scalevfs::{AT_FDCWD, O_CREAT, O_RDONLY, O_WRONLY};

#[test]
fn a_read_sets_an_access_time_that_survives_a_remount() {
    let Some((s, img, e, vfs)) = mount_fresh("atime", "16M") else {
        return;
    };
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.write(fd, b"hello").unwrap();
    t.close(fd).unwrap();
    let old = Timespec { sec: 1000, nsec: 0 };
    t.utimensat(AT_FDCWD, "/f", Some([old, old]), 0).unwrap();
    // A second file read before the change, so its time stays old... and
    // one never read at all.
    let fd = t.open("/g", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
    t.utimensat(AT_FDCWD, "/g", Some([old, old]), 0).unwrap();
    let fd = t.open("/f", O_RDONLY, 0).unwrap();
    let mut b = [0u8; 8];
    assert_eq!(t.read(fd, &mut b).unwrap(), 5);
    t.close(fd).unwrap();
    let st = t.stat("/f").unwrap();
    assert!(st.atime.sec > 1000, "the read set atime: {:?}", st.atime);
    assert_eq!(st.mtime, old, "mtime stays");
    let atime = st.atime;
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    assert_eq!(
        t.stat("/f").unwrap().atime,
        atime,
        "kept across the remount"
    );
    assert_eq!(
        t.stat("/g").unwrap().atime,
        old,
        "an unread file keeps its time"
    );
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    let Some(km) = KMount::new(&img, &s.0.join("mnt")) else {
        return;
    };
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(km.0.join("f")).unwrap();
    assert_eq!(
        (m.atime(), m.atime_nsec()),
        (atime.sec, atime.nsec),
        "the kernel's atime"
    );
}
