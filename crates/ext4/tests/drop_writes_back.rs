//! A program that embeds a read-write ext4, writes, drops its `Vfs` and
//! then its `Ext4`, and exits, finds its writes in the image and the image
//! clean: the drop of the last `Vfs` runs the frees its teardown deferred
//! (the dentries' counts on the superblock and inodes), so the caller's
//! `Ext4` is the last count and its drop unmounts. Before, that count
//! waited in this thread's deferred frees, the program exited first, and
//! the image kept `needs_recovery` (a read-only open refused it) without
//! the last writes (review of the docs, stop 51). In its own binary: other
//! tests' epoch garbage would only delay the frees.

mod common;

use std::sync::Arc;

use common::*;

#[test]
fn dropping_the_vfs_then_the_fs_writes_the_image_back() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("dropback");
    let img = fresh(&s.0, 4096, "64M");
    let e = scalevfs_ext4::Ext4::open(&img, rw_journaled()).unwrap();
    let weak = Arc::downgrade(&e);
    let fs: Arc<dyn scalevfs::Filesystem> = e.clone();
    let vfs = scalevfs::Vfs::with_root_fs(Default::default(), fs);
    let f = scalevfs::fs::Fs::new(vfs.root_task());
    f.create_dir_all("/d/e").unwrap();
    f.write("/d/e/file", b"persist me").unwrap();
    drop(f);
    drop(vfs);
    drop(e);
    assert_eq!(weak.strong_count(), 0, "the Ext4 outlived its last handle");
    assert!(
        !sb_field(&img, "Filesystem features").contains("needs_recovery"),
        "the journal was left needing recovery"
    );
    fsck_clean(&img);
    let out = debugfs_ro(&img, "cat /d/e/file");
    assert!(out.contains("persist me"), "{out}");
}
