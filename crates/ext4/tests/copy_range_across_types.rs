//! copy_file_range between two filesystem types (memfs and ext4 here; on
//! the host, tmpfs and ext4) is EXDEV before the offset and size checks,
//! as Linux's generic_copy_file_checks compares the files' operations
//! first (checked on the host: /dev/shm to an ext4 /tmp with a negative
//! source offset or a length past 2^62 is EXDEV). Between two mounts of one
//! type the offsets are checked first (`copy_file_range_matches_linux.rs`).

mod common;

use std::sync::Arc;

use common::*;
use scalevfs::*;

#[test]
fn copy_between_filesystem_types_is_exdev_first() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("copy_across_types");
    let img = fresh(&s.0, 4096, "16M");
    let e = scalevfs_ext4::Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.mkdir("/mnt", 0o755).unwrap();
    let fs: Arc<dyn Filesystem> = e.clone();
    t.mount("/mnt", fs, false).unwrap();
    let a = t.open("/a", O_CREAT | O_RDWR, 0o644).unwrap();
    assert_eq!(t.write(a, &[1u8; 100]), Ok(100));
    let b = t.open("/mnt/b", O_CREAT | O_RDWR, 0o644).unwrap();
    assert_eq!(
        t.copy_file_range(a, Some(-1), b, Some(0), 10, 0),
        Err(Errno::EXDEV)
    );
    assert_eq!(
        t.copy_file_range(a, Some(0), b, Some(0), 1 << 62, 0),
        Err(Errno::EXDEV)
    );
    assert_eq!(
        t.copy_file_range(a, Some(0), b, Some(0), 10, 0),
        Err(Errno::EXDEV)
    );
    t.close(a).unwrap();
    t.close(b).unwrap();
    t.umount("/mnt").unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
}
