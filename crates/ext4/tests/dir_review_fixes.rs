//! Fixes from a review of the directory code (stop 48), each of which
//! failed before:
//! - a directory whose link count is 65535 (as an image may hold it, with
//!   dir_nlink) gets a subdirectory: the count sticks at 1, as the
//!   kernel's `ext4_inc_count`, where it overflowed (a panic in a debug
//!   build, a live directory with no links in a release one);
//! - without the filetype feature, `.` and `..` carry no file type (the
//!   kernel's `ext4_set_de_type`): e2fsck flagged them in new directories,
//!   in directories made indexed and in inline ones moved to a block.

mod common;

use scalevfs::fs::Fs;

use common::*;

#[test]
fn a_link_count_of_65535_gets_one_more_subdirectory() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("nlink-max");
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "1024"], "8M");
    let (e, vfs) = mount(&img);
    Fs::new(vfs.root_task()).create_dir("/d").unwrap();
    unmount_clean(vfs.root_task(), vfs, e, &img);
    assert!(debugfs(&img, "sif /d links_count 65535"));
    let (e, vfs) = mount(&img);
    {
        let t = vfs.root_task();
        t.mkdir("/d/x", 0o755).unwrap();
        assert_eq!(t.stat("/d").unwrap().nlink, 1, "sticks at 1 past the limit");
        assert!(t.stat("/d/x").unwrap().nlink == 2);
    }
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    let st = debugfs_ro(&img, "stat /d");
    assert!(st.contains("Links: 1 "), "{st}");
}

#[test]
fn dot_entries_have_no_type_without_filetype() {
    if !have_tools() {
        return;
    }
    for extra in ["^filetype", "^filetype,inline_data"] {
        let s = Scratch::new("no-filetype");
        let img = s.0.join("img");
        mkfs_args(&img, &["-b", "1024", "-O", extra], "8M");
        let (e, vfs) = mount(&img);
        {
            let fs = Fs::new(vfs.root_task());
            fs.create_dir("/d").unwrap();
            // Enough names to move an inline directory to a block and
            // then make it indexed.
            fs.create_dir("/big").unwrap();
            for i in 0..200 {
                fs.write(format!("/big/{i:040}"), b"").unwrap();
            }
        }
        unmount_clean(vfs.root_task(), vfs, e, &img);
    }
}
