//! statfs counts the blocks a removal frees at once, as the kernel's ext4
//! (its free counter drops when blocks are freed, not when the transaction
//! commits; `df` right after `rm` shows the space). Before, blocks freed in
//! the running transaction showed as used until its commit, up to the
//! commit interval later. Found by the random kernel differential
//! (`random_ops_vs_kernel.rs`).

mod common;

use common::*;
use scalevfs::{O_CREAT, O_RDWR};

#[test]
fn blocks_freed_by_an_unlink_are_free_before_the_commit() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("statfs-unlink");
    let img = fresh(&s.0, 4096, "32M");
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t.open("/big", O_CREAT | O_RDWR, 0o644).unwrap();
    t.write(fd, &vec![5u8; 4 << 20]).unwrap();
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    let before = t.statfs("/").unwrap().bfree;
    let commits = e.commit_stats().0;
    t.unlink("/big").unwrap();
    // The inode's last drop is epoch-deferred, and the next handle frees
    // it (its 1024 data blocks go to the running transaction's frees):
    // flush, and start a handle, until it is freed.
    let mut after = before;
    for i in 0..2000 {
        scalevfs::flush_deferred_frees();
        let fd = t.open("/step", O_CREAT | O_RDWR, 0o644).unwrap();
        t.close(fd).unwrap();
        after = t.statfs("/").unwrap().bfree;
        if after >= before + 1024 {
            break;
        }
        if i >= 100 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    assert_eq!(e.commit_stats().0, commits, "nothing committed meanwhile");
    assert!(
        after >= before + 1024,
        "free blocks {before} -> {after} before the commit"
    );
    // After the commit the count is the same (the blocks moved from the
    // pending list to the bitmaps, counted once).
    e.commit().unwrap();
    assert_eq!(t.statfs("/").unwrap().bfree, after);
    unmount_clean(t, vfs, e, &img);
}
