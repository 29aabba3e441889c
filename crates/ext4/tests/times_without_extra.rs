//! On 128-byte inodes (no `_extra` time words) times are 32-bit signed
//! seconds: a time past 2038 is stored clamped to 2038-01-19 03:14:07, as
//! the kernel's EXT4_INODE_SET_XTIME does, not wrapped into 1904. Read
//! back through a second mount. (The inode encoder now clamps too, for an
//! inode whose own `i_extra_isize` lacks the words on an image of larger
//! inodes, review stop 49; that case needs an inode whose in-inode xattrs
//! keep it from growing, which this test does not build: here the
//! filesystem-wide clamp already held before.)

mod common;

use common::*;
use scalevfs::*;

#[test]
fn times_past_2038_clamp_on_small_inodes() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("times_small_inodes");
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "4096", "-I", "128"], "16M");
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
    // 2040-01-01 and 1900-01-01.
    let late = Timespec {
        sec: 2_208_988_800,
        nsec: 0,
    };
    let early = Timespec {
        sec: -2_208_988_800,
        nsec: 0,
    };
    t.utimensat(AT_FDCWD, "/f", Some([early, late]), 0).unwrap();
    unmount_clean(t, vfs, e, &img);
    let (e, vfs) = mount(&img);
    let st = vfs.root_task().stat("/f").unwrap();
    assert_eq!(st.mtime.sec, i64::from(i32::MAX), "mtime");
    assert_eq!(st.atime.sec, i64::from(i32::MIN), "atime");
    drop(vfs);
    drop(e);
}
