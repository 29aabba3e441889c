//! Dropping the last `Vfs` frees its filesystems: the root mount's and the
//! submounts' references fold (`MntRef::detach`, after an epoch grace
//! period that the drop waits for), so the mounts, their dentries, their
//! superblocks and the filesystems go, whether a submount was unmounted
//! first or was still mounted. One test in its own binary: other tests'
//! epoch garbage in the same process would only delay the frees.

use std::sync::Arc;

use scalevfs::*;

#[test]
fn dropping_the_vfs_frees_every_filesystem() {
    for umount_first in [true, false] {
        let fs: Arc<dyn Filesystem> = Arc::new(MemFs::new(1, MemFsOptions::default()));
        let root = Arc::downgrade(&fs);
        let vfs = Vfs::with_root_fs(VfsConfig::default(), fs);
        let t = vfs.root_task();
        t.mkdir("/m", 0o755).unwrap();
        let sub = vfs.new_memfs(MemFsOptions::default());
        let subw = Arc::downgrade(&sub);
        t.mount("/m", sub, false).unwrap();
        t.mkdir("/m/d", 0o755).unwrap();
        let fd = t.open("/m/d/f", O_CREAT | O_WRONLY, 0o644).unwrap();
        t.close(fd).unwrap();
        let h = t.handle_at(AT_FDCWD, "/m/d", 0).unwrap();
        let other = std::thread::spawn(move || drop(h));
        other.join().unwrap();
        if umount_first {
            t.umount("/m").unwrap();
        }
        drop(t);
        drop(vfs);
        // Dentries and their superblocks are freed after a grace period.
        for _ in 0..10_000 {
            if root.strong_count() == 0 && subw.strong_count() == 0 {
                break;
            }
            // The epoch's garbage and this thread's deferred frees (the
            // closed file, its dentry: limbo.rs).
            flush_deferred_frees();
        }
        assert_eq!(
            root.strong_count(),
            0,
            "root filesystem kept (umount first: {umount_first})"
        );
        assert_eq!(
            subw.strong_count(),
            0,
            "submount kept (umount first: {umount_first})"
        );
    }
}
