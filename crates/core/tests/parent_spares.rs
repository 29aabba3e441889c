//! Spare parent references (`core/src/spares.rs`, dcache.rs "PARENT
//! REFERENCES"): a thread keeps a batch of references on a directory it
//! creates in, so they must come back when the directory goes. Each test
//! leaves the spares with a thread that is still alive (parked), so that
//! nothing but the recall can return them.

use std::sync::mpsc;
use std::sync::Arc;

use scalevfs::*;

/// Create and unlink a few names in `dir` on a new thread, run its own
/// deferred frees until `freed()` (limbo.rs: a thread frees what it
/// retired, so a parked thread's would stay; up to about 5 s), then keep
/// that thread parked (holding its spares) until the returned sender is
/// dropped.
fn park_with_spares(
    t: &Task,
    dir: &str,
    freed: impl Fn() -> bool + Send + 'static,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let t = t.clone_thread();
    let dir = dir.to_string();
    let (done_tx, done_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        for i in 0..5 {
            let p = format!("{dir}/f{i}");
            let fd = t.open(&p, O_CREAT | O_WRONLY, 0o644).unwrap();
            t.close(fd).unwrap();
        }
        for i in 0..5 {
            t.unlink(&format!("{dir}/f{i}")).unwrap();
        }
        drop(t);
        for i in 0..5_000 {
            flush_deferred_frees();
            if freed() {
                break;
            }
            if i >= 100 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        done_tx.send(()).unwrap();
        let _ = stop_rx.recv();
    });
    done_rx.recv().unwrap();
    (stop_tx, h)
}

/// A `Vfs` over a memfs with `opts`, its root task, and the memfs's live
/// inode count before anything is made.
fn memfs_vfs(opts: MemFsOptions) -> (Arc<MemFs>, Vfs, Task, i64) {
    let cfg = VfsConfig {
        memfs: opts.clone(),
        ..VfsConfig::default()
    };
    let fs = Arc::new(MemFs::new(1, opts));
    let base = fs.live_inodes();
    let vfs = Vfs::with_root_fs(cfg, fs.clone());
    let t = vfs.root_task();
    (fs, vfs, t, base)
}

/// Run deferred frees until `until` holds, for up to about 5 s: frees wait
/// for a grace period, which other tests of this binary, pinned and
/// descheduled on a busy machine, can hold up.
fn settle(vfs: &Vfs, until: impl Fn() -> bool) {
    for i in 0..5_000 {
        if until() {
            return;
        }
        vfs.flush_deferred();
        if i >= 100 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// rmdir of a directory on whose dentry another live thread keeps spares:
/// the directory's dentry and inode are freed (the unhash recalls the
/// spares), and the parent keeps the right link count.
#[test]
fn rmdir_frees_a_directory_another_thread_keeps_spares_on() {
    let (fs, vfs, t, base) = memfs_vfs(MemFsOptions::default());
    t.mkdir("/d", 0o755).unwrap();
    let f2 = fs.clone();
    let (stop, h) = park_with_spares(&t, "/d", move || f2.live_inodes() == base + 1);
    assert_eq!(fs.live_inodes(), base + 1);
    let entries = vfs.dcache().len();
    t.rmdir("/d").unwrap();
    settle(&vfs, || fs.live_inodes() == base);
    assert_eq!(
        fs.live_inodes(),
        base,
        "the removed directory's inode is kept"
    );
    assert!(vfs.dcache().len() < entries, "its dentry is kept");
    assert_eq!(t.stat("/").unwrap().nlink, 2);
    // The name works again, and so do creates in the new directory.
    t.mkdir("/d", 0o755).unwrap();
    let fd = t.open("/d/g", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
    drop(stop);
    h.join().unwrap();
}

/// The same for a directory replaced by a rename (`d_move`'s target).
#[test]
fn rename_over_frees_a_directory_another_thread_keeps_spares_on() {
    let (fs, vfs, t, base) = memfs_vfs(MemFsOptions::default());
    t.mkdir("/d", 0o755).unwrap();
    t.mkdir("/e", 0o755).unwrap();
    let f2 = fs.clone();
    let (stop, h) = park_with_spares(&t, "/d", move || f2.live_inodes() == base + 2);
    t.rename("/e", "/d").unwrap();
    settle(&vfs, || fs.live_inodes() == base + 1);
    assert_eq!(
        fs.live_inodes(),
        base + 1,
        "the replaced directory's inode is kept"
    );
    assert_eq!(t.stat("/").unwrap().nlink, 3);
    drop(stop);
    h.join().unwrap();
}

/// Dropping the `Vfs` while a live thread keeps spares on one of its
/// directories frees the filesystem (teardown recalls them).
#[test]
fn dropping_the_vfs_takes_spares_back_from_live_threads() {
    let mem = Arc::new(MemFs::new(1, MemFsOptions::default()));
    let base = mem.live_inodes();
    let watch = Arc::downgrade(&mem);
    let fs: Arc<dyn Filesystem> = mem;
    let weak = Arc::downgrade(&fs);
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fs);
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    t.mkdir("/d/e", 0o755).unwrap();
    let (stop, h) = park_with_spares(&t, "/d/e", move || match watch.upgrade() {
        None => true,
        Some(f) => f.live_inodes() == base + 2,
    });
    drop(t);
    drop(vfs);
    for i in 0..5_000 {
        if weak.strong_count() == 0 {
            break;
        }
        flush_deferred_frees();
        if i >= 100 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    assert_eq!(weak.strong_count(), 0, "the filesystem is kept");
    drop(stop);
    h.join().unwrap();
}

/// A cache whose filesystem is not authoritative evicts a directory that
/// only spares keep in use when asked to shrink everything.
#[test]
fn shrink_evicts_directories_kept_only_by_spares() {
    let (fs, vfs, t, base) = memfs_vfs(MemFsOptions {
        authoritative: false,
        ..MemFsOptions::default()
    });
    t.mkdir("/d", 0o755).unwrap();
    t.mkdir("/d/e", 0o755).unwrap();
    let f2 = fs.clone();
    let (stop, h) = park_with_spares(&t, "/d/e", move || f2.live_inodes() == base + 2);
    let dc = vfs.dcache();
    settle(&vfs, || {
        while dc.shrink(usize::MAX, false) > 0 {}
        dc.len() == 1
    });
    assert_eq!(dc.len(), 1, "only the root is left");
    assert!(t.stat("/d/e").unwrap().is_dir());
    drop(stop);
    h.join().unwrap();
}

/// One thread making names in more directories than its shard has ways
/// (8): entries are evicted with their spares and given back to their
/// directories, which all go when removed (no spare lost or kept), and
/// link counts stay right.
#[test]
fn many_directories_evict_spares_and_lose_none() {
    let (fs, vfs, t, base) = memfs_vfs(MemFsOptions::default());
    let dirs = 40;
    for d in 0..dirs {
        t.mkdir(&format!("/d{d}"), 0o755).unwrap();
    }
    for round in 0..5 {
        for d in 0..dirs {
            let p = format!("/d{d}/f{round}");
            let fd = t.open(&p, O_CREAT | O_WRONLY, 0o644).unwrap();
            t.close(fd).unwrap();
        }
        for d in (0..dirs).rev() {
            t.unlink(&format!("/d{d}/f{round}")).unwrap();
        }
    }
    assert_eq!(t.stat("/").unwrap().nlink, 2 + dirs as u32);
    for d in 0..dirs {
        t.rmdir(&format!("/d{d}")).unwrap();
    }
    settle(&vfs, || fs.live_inodes() == base);
    assert_eq!(fs.live_inodes(), base, "a removed directory is kept");
    assert_eq!(t.stat("/").unwrap().nlink, 2);
}

/// A mount's root is never hashed, yet threads keep spares on it (creates
/// in a mount's root): unmounting while a live thread keeps some frees the
/// mounted filesystem (the `Mount`'s drop recalls them), and the root of
/// the `Vfs` itself keeps them too.
#[test]
fn umount_takes_spares_on_the_mount_root_back_from_live_threads() {
    let (_fs, vfs, t, _) = memfs_vfs(MemFsOptions::default());
    t.mkdir("/m", 0o755).unwrap();
    let mem = Arc::new(MemFs::new(2, MemFsOptions::default()));
    let base = mem.live_inodes();
    let watch = Arc::downgrade(&mem);
    let sub: Arc<dyn Filesystem> = mem;
    let weak = Arc::downgrade(&sub);
    t.mount("/m", sub, false).unwrap();
    let (stop, h) = park_with_spares(&t, "/m", move || match watch.upgrade() {
        None => true,
        Some(f) => f.live_inodes() == base,
    });
    // The parked thread holds spares on /m's root: the root's count is
    // above what the mount and this lookup account for.
    t.umount("/m").unwrap();
    settle(&vfs, || weak.strong_count() == 0);
    assert_eq!(weak.strong_count(), 0, "the unmounted filesystem is kept");
    // Creates in the Vfs's own root work as before.
    let fd = t.open("/g", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
    t.unlink("/g").unwrap();
    drop(stop);
    h.join().unwrap();
}
