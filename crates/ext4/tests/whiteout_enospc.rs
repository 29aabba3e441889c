//! RENAME_WHITEOUT when no inode is free for the whiteout: the rename
//! must stay done and ENOSPC must be returned (fstype.rs doc of
//! rename_whiteout). The ENOSPC retry of name operations used to run the
//! whole rename again, which found the old name gone and returned ENOENT
//! (review, stop 38): renames are not retried (`redo_counted_enospc` is
//! for the operations that make a name).

mod common;

use common::*;
use scalevfs::{Errno, O_CREAT, O_WRONLY, RENAME_WHITEOUT};

fn fill_inodes(t: &scalevfs::Task) -> usize {
    let mut n = 0;
    loop {
        match t.open(format!("/fill{n}").as_str(), O_CREAT | O_WRONLY, 0o644) {
            Ok(fd) => {
                t.close(fd).unwrap();
                n += 1;
            }
            Err(Errno::ENOSPC) => return n,
            Err(e) => panic!("fill: {e:?}"),
        }
    }
}

fn run(cross: bool) {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("whiteout-enospc");
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "1024", "-N", "64", "-O", "orphan_file"], "4M");
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    t.mkdir("/a", 0o755).unwrap();
    t.mkdir("/b", 0o755).unwrap();
    let fd = t.open("/a/x", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
    let n = fill_inodes(&t);
    eprintln!("filled {n} inodes; ffree {}", t.statfs("/").unwrap().ffree);
    let (from, to) = if cross {
        ("/a/x", "/b/x")
    } else {
        ("/a/x", "/a/y")
    };
    let r = t.renameat2(-100, from, -100, to, RENAME_WHITEOUT);
    let moved = t.lstat(to).is_ok();
    let old = t.lstat(from).is_ok();
    eprintln!("renameat2 -> {r:?}; new name present {moved}, old name present {old}");
    let vfs_r = r;
    unmount_clean(t, vfs, e, &img);
    assert!(moved, "the rename must stay done");
    assert!(!old, "no whiteout could be made");
    assert_eq!(
        vfs_r,
        Err(Errno::ENOSPC),
        "the whiteout's ENOSPC must be returned"
    );
}

#[test]
fn whiteout_enospc_cross_dir() {
    run(true);
}

#[test]
fn whiteout_enospc_same_dir() {
    run(false);
}
