//! `Dcache::prune_dead_negatives`: the cached negative names under a
//! removed directory go (they pinned its dentry and inode), those under
//! live directories stay.

use scalevfs::{Errno, MemFsOptions, Vfs, VfsConfig};

/// A memfs that caches negative names, as a disk filesystem's are (the
/// default memfs needs none: its dcache holds every name).
fn negative_caching_vfs() -> Vfs {
    Vfs::with_config(VfsConfig {
        memfs: MemFsOptions {
            authoritative: false,
            ..Default::default()
        },
        ..Default::default()
    })
}

#[test]
fn only_negatives_under_removed_directories_are_pruned() {
    let vfs = negative_caching_vfs();
    let t = vfs.root_task();
    t.mkdir("/live", 0o755).unwrap();
    t.mkdir("/gone", 0o755).unwrap();
    for n in ["a", "b", "c"] {
        assert_eq!(t.stat(&format!("/gone/{n}")).unwrap_err(), Errno::ENOENT);
        assert_eq!(t.stat(&format!("/live/{n}")).unwrap_err(), Errno::ENOENT);
    }
    let dc = vfs.dcache();
    // Nothing is under a removed directory yet.
    assert_eq!(dc.prune_dead_negatives(), 0);
    t.rmdir("/gone").unwrap();
    // rmdir leaves a negative "/gone" under the live root: not pruned.
    let pruned = dc.prune_dead_negatives();
    assert_eq!(pruned, 3);
    assert_eq!(dc.prune_dead_negatives(), 0);
    // The live directory's negatives are still cached (and still right).
    for n in ["a", "b", "c"] {
        assert_eq!(t.stat(&format!("/live/{n}")).unwrap_err(), Errno::ENOENT);
    }
    assert_eq!(t.stat("/gone").unwrap_err(), Errno::ENOENT);
    t.mkdir("/gone", 0o755).unwrap();
    assert_eq!(t.stat("/gone/a").unwrap_err(), Errno::ENOENT);
}

#[test]
fn lookups_in_a_removed_directory_cache_nothing() {
    let vfs = negative_caching_vfs();
    let t = vfs.root_task();
    t.mkdir("/gone", 0o755).unwrap();
    t.chdir("/gone").unwrap();
    t.rmdir("/gone").unwrap();
    // Linux's __lookup_slow: a dead directory answers ENOENT without asking
    // the filesystem, so no negative name is cached under it.
    for i in 0..100 {
        assert_eq!(t.stat(&format!("n{i}")).unwrap_err(), Errno::ENOENT);
        assert_eq!(t.mkdir(&format!("d{i}"), 0o755).unwrap_err(), Errno::ENOENT);
    }
    assert_eq!(vfs.dcache().prune_dead_negatives(), 0);
    // "." and ".." still resolve (the cwd is held; its parent is the root).
    assert!(t.stat(".").is_ok());
    assert_eq!(t.stat("..").unwrap().ino, t.stat("/").unwrap().ino);
}
