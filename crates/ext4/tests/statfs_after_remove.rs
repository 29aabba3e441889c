//! `statfs` right after a removal, through the library: the space and
//! the inode of a removed file are free at once, as on the kernel's ext4
//! (which frees an unlinked inode at its last reference), and not while
//! the file is still open. Before, the removed file's dentry (and with it
//! the inode) went a grace period later and the freed inode then waited
//! for a handle or a commit: an 8 MiB file stayed counted as used.
//! (`statfs_after_unlink.rs` checks the step after: blocks freed in the
//! running transaction count as free before its commit.)

mod common;

use common::*;
use scalevfs::{O_CREAT, O_WRONLY};

#[test]
fn statfs_counts_a_removed_file_free_at_once_and_an_open_one_not() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("statfs-rm");
    let img = fresh(&s.0, 4096, "64M");
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let free = |t: &scalevfs::Task| {
        let st = t.statfs("/").unwrap();
        (st.bfree, st.ffree)
    };
    let start = free(&t);
    let write = |p: &str| {
        let fd = t.open(p, O_CREAT | O_WRONLY, 0o644).unwrap();
        t.write(fd, &vec![0x5au8; 8 << 20]).unwrap();
        fd
    };
    // Closed, then removed: free at once.
    let fd = write("/closed");
    t.close(fd).unwrap();
    let full = free(&t);
    assert!(start.0 - full.0 >= 2048, "{start:?} -> {full:?}");
    assert_eq!(full.1, start.1 - 1);
    t.unlink("/closed").unwrap();
    assert_eq!(free(&t), start, "after unlink of a closed file");
    // Open while removed: still in use until the close (fstatfs too).
    let fd = write("/open");
    t.unlink("/open").unwrap();
    let held = free(&t);
    assert_eq!(held, full, "an open file's space stays in use");
    let st = t.fstatfs(fd).unwrap();
    assert_eq!((st.bfree, st.ffree), full);
    t.close(fd).unwrap();
    assert_eq!(free(&t), start, "after the last close");
    unmount_clean(t, vfs, e, &img);
}
