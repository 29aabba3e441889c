//! Mount references (`MntRef`, issue 16): counted per thread while the
//! mount is in the tree, exact once it leaves it. These tests watch the
//! mounted filesystem's `Arc` (a mount holds its superblock, which holds
//! the filesystem): it must stay alive exactly as long as something refers
//! to the mount, and go after the last reference, whichever thread drops
//! it and however the references were taken and dropped across threads.

use std::sync::Arc;

use scalevfs::*;

/// memfs that keeps its names itself: the dcache may then drop unused
/// dentries (`settle` shrinks it), as it would a disk filesystem's.
fn opts() -> MemFsOptions {
    MemFsOptions {
        authoritative: false,
        ..Default::default()
    }
}

fn new_vfs() -> Vfs {
    Vfs::with_config(VfsConfig {
        memfs: opts(),
        ..Default::default()
    })
}

/// Run epoch grace periods (a detached mount's count is folded in a
/// deferred function) and shrink the dcache (a freed mount's dentries are
/// cached unused, holding its superblock) until `done` holds; false if it
/// never does.
fn settle(vfs: &Vfs, done: impl Fn() -> bool) -> bool {
    for _ in 0..10_000 {
        if done() {
            return true;
        }
        // The epoch's garbage and this thread's deferred frees (limbo.rs).
        vfs.flush_deferred();
        vfs.dcache().shrink_all();
        std::thread::yield_now();
    }
    done()
}

#[test]
fn unmounted_filesystem_is_freed() {
    let vfs = new_vfs();
    let t = vfs.root_task();
    t.mkdir("/m", 0o755).unwrap();
    for round in 0..200 {
        let fs = vfs.new_memfs(opts());
        let weak = Arc::downgrade(&fs);
        t.mount("/m", fs, false).unwrap();
        // References taken and dropped by walks, files and handles, on
        // this thread and others.
        t.mkdir("/m/d", 0o755).unwrap();
        let fd = t.open("/m/d/f", O_CREAT | O_WRONLY, 0o644).unwrap();
        let h = t.handle_at(AT_FDCWD, "/m/d", 0).unwrap();
        let clones: Vec<Handle> = (0..4).map(|_| h.clone()).collect();
        std::thread::spawn(move || drop(clones)).join().unwrap();
        // In use: EBUSY, and nothing freed.
        assert_eq!(t.umount("/m"), Err(Errno::EBUSY));
        t.close(fd).unwrap();
        drop(h);
        assert_eq!(t.umount("/m"), Ok(()), "round {round}");
        assert!(
            settle(&vfs, || weak.strong_count() == 0),
            "round {round}: the unmounted filesystem was not freed"
        );
    }
}

#[test]
fn walks_racing_with_umount_are_counted() {
    let vfs = new_vfs();
    let t = vfs.root_task();
    t.mkdir("/m", 0o755).unwrap();
    for round in 0..30 {
        let fs = vfs.new_memfs(opts());
        let weak = Arc::downgrade(&fs);
        t.mount("/m", fs, false).unwrap();
        t.mkdir("/m/d", 0o755).unwrap();
        let fd = t.open("/m/d/f", O_CREAT | O_WRONLY, 0o644).unwrap();
        t.close(fd).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Walks into the mount (each takes and drops references on it,
        // counted on the walker's thread) while it is unmounted.
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let vfs = vfs.clone();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let t = vfs.root_task();
                    let mut seen = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        if t.stat("/m/d/f").is_ok() {
                            seen += 1;
                        }
                        if let Ok(fd) = t.open("/m/d/f", O_RDONLY, 0) {
                            let _ = t.close(fd);
                        }
                    }
                    seen
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(2));
        // EBUSY while a walker's open holds an fd in it: retry.
        let mut tries = 0;
        while t.umount("/m") == Err(Errno::EBUSY) {
            tries += 1;
            assert!(tries < 100_000, "round {round}: umount never succeeded");
            std::thread::yield_now();
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        assert!(
            settle(&vfs, || weak.strong_count() == 0),
            "round {round}: not freed after the last reference"
        );
    }
}

#[test]
fn a_handle_keeps_its_mount_after_the_vfs_goes() {
    let vfs = new_vfs();
    let t = vfs.root_task();
    t.mkdir("/m", 0o755).unwrap();
    let fs = vfs.new_memfs(opts());
    let weak = Arc::downgrade(&fs);
    t.mount("/m", fs, false).unwrap();
    let fd = t.open("/m/f", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
    let h = t.handle_at(AT_FDCWD, "/m", 0).unwrap();
    drop(t);
    drop(vfs);
    for _ in 0..50 {
        crossbeam_epoch::pin().flush();
    }
    // Detached with the Vfs, but referenced: alive and usable.
    assert!(weak.strong_count() > 0);
    let st = h.getattr();
    assert_eq!(st.mode & S_IFMT, S_IFDIR);
    drop(h);
}
