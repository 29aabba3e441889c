//! A removed directory under which names were looked up and not found.
//! Its cached negative entries pin its dentry, and so its inode, which on
//! ext4 stays allocated: Linux prunes them at rmdir
//! (`shrink_dcache_parent`), this dcache keeps no child list to do so.
//! A build tool's pattern (make a temporary directory, probe names in it,
//! remove it) then used up the image's inodes: on an image with 128 free
//! inodes the 128th such directory got ENOSPC, the removed ones all still
//! allocated. Now a name operation that gets ENOSPC first evicts the
//! negative entries under removed directories
//! (`Dcache::prune_dead_negatives`), and the inodes come back; the image
//! then passes e2fsck.

mod common;

use common::*;
use scalevfs::{Errno, O_CREAT, O_WRONLY};

#[test]
fn removed_directories_probed_for_missing_names_give_their_inodes_back() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("rmdir-neg");
    let img = s.0.join("img");
    // 4 MiB with 1 KiB blocks and 128 inodes in all.
    mkfs_args(
        &img,
        &["-b", "1024", "-N", "128", "-O", "orphan_file"],
        "4M",
    );
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let free = t.statfs("/").unwrap().ffree;
    assert!((50..=128).contains(&free), "{free} free inodes");
    // Three times as many directories as there are free inodes.
    let rounds = 3 * free as usize;
    for i in 0..rounds {
        let d = format!("/tmp{i}");
        t.mkdir(&d, 0o755)
            .unwrap_or_else(|e| panic!("mkdir {d} ({i} of {rounds}): {e:?}"));
        for probe in ["config.h", "Makefile", ".git"] {
            assert_eq!(t.stat(&format!("{d}/{probe}")).unwrap_err(), Errno::ENOENT);
        }
        t.rmdir(&d).unwrap();
    }
    // Files too (a create takes the same path as mkdir).
    for i in 0..free as usize + 8 {
        let d = format!("/f{i}");
        t.mkdir(&d, 0o755).unwrap();
        assert_eq!(t.stat(&format!("{d}/x")).unwrap_err(), Errno::ENOENT);
        t.rmdir(&d).unwrap();
        let f = format!("/file{i}");
        let fd = t
            .open(&f, O_CREAT | O_WRONLY, 0o644)
            .unwrap_or_else(|e| panic!("create {f}: {e:?}"));
        t.close(fd).unwrap();
        t.unlink(&f).unwrap();
    }
    unmount_clean(t, vfs, e, &img);
}
