//! A directory's link limit on an image without `dir_nlink` (65000, the
//! kernel's EXT4_LINK_MAX): mkdir in a parent at the limit is EMLINK, and
//! so is moving a directory into it by rename or by RENAME_EXCHANGE with
//! a file (the kernel's ext4_rename and ext4_cross_rename). Both used to
//! succeed and set the parent's count to 1, which e2fsck reports without
//! dir_nlink ("Directory exceeds max links, but no DIR_NLINK feature").
//! Found by review, stop 38.

mod common;

use common::*;
use scalevfs::{Errno, O_CREAT, O_WRONLY, RENAME_EXCHANGE};

#[test]
fn moving_a_directory_into_a_full_parent_without_dir_nlink_is_emlink() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("dir-nlink-limit");
    let img = s.0.join("img");
    mkfs_args(
        &img,
        &["-b", "1024", "-N", "70000", "-O", "orphan_file,^dir_nlink"],
        "128M",
    );
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    t.mkdir("/p", 0o755).unwrap();
    t.mkdir("/q", 0o755).unwrap();
    t.mkdir("/q/x", 0o755).unwrap();
    t.mkdir("/q/y", 0o755).unwrap();
    for i in 0..64_998 {
        t.mkdir(format!("/p/{i}").as_str(), 0o755).unwrap();
    }
    assert_eq!(t.lstat("/p").unwrap().nlink, 65_000);
    assert_eq!(t.mkdir("/p/more", 0o755), Err(Errno::EMLINK));
    let fd = t.open("/p/file", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
    assert_eq!(t.rename("/q/x", "/p/x"), Err(Errno::EMLINK));
    assert_eq!(
        t.renameat2(-100, "/q/y", -100, "/p/file", RENAME_EXCHANGE),
        Err(Errno::EMLINK)
    );
    // Nothing moved; the counts are as before.
    assert_eq!(t.lstat("/p").unwrap().nlink, 65_000);
    assert_eq!(t.lstat("/q").unwrap().nlink, 4);
    assert!(t.lstat("/q/x").is_ok() && t.lstat("/q/y").is_ok());
    assert!(t.lstat("/p/file").is_ok());
    // A file may still move in, and a directory out and back.
    t.rename("/p/file", "/q/file").unwrap();
    t.rename("/p/0", "/q/0").unwrap();
    t.rename("/q/0", "/p/0").unwrap();
    unmount_clean(t, vfs, e, &img);
}
