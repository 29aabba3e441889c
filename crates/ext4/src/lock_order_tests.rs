//! The journal's waits that are not lock acquisitions are checked against
//! the lock order (`scalevfs_sync::ordered::check_wait`): entering the
//! handle gate (`Ext4::handle`), which waits while a commit has it closed,
//! and asking for a commit (`Ext4::commit`), which waits for the commit
//! lock by try-locks and sleeps. Either with an ext4 lock held deadlocks
//! against a committer that needs that lock with the gate closed, or
//! against a handle inside that waits for it. Debug builds only (the
//! checker compiles away in release builds).

use std::sync::Arc;

use scalevfs_sync::ordered::{self, Class};

use crate::fs::Ext4Inode;
use crate::Ext4;

fn journaled_fs() -> Arc<Ext4> {
    let fs = crate::alloc_held_tests::rw_fs();
    assert!(fs.journal().is_some(), "the test needs a journaled mount");
    fs
}

fn panic_message(f: impl FnOnce()) -> String {
    let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .expect_err("expected a lock-order panic");
    e.downcast_ref::<String>().cloned().unwrap_or_default()
}

/// Starting a handle with a directory's ext4 lock held panics, naming the
/// gate; without it the handle starts. (Before the gate had a class, the
/// first went unnoticed until a commit closed the gate at the wrong
/// moment.)
#[test]
fn handle_start_under_an_ext4_lock_panics() {
    let fs = journaled_fs();
    let root = fs.iget(2).unwrap();
    let ei = root.private::<Ext4Inode>().unwrap();
    let msg = panic_message(|| {
        let _dl = ei.dir_lock.read_as(Class::Ext4Dir, 2);
        let _h = fs.handle().unwrap();
    });
    assert!(msg.contains("ext4 Journal::gate (handle)"), "{msg}");
    assert!(msg.contains("ext4 Ext4Inode::dir_lock"), "{msg}");
    assert!(ordered::held().is_empty(), "{:?}", ordered::held());
    // A file's data lock: the same.
    let msg = panic_message(|| {
        let _g = ei.data.read();
        let _h = fs.handle().unwrap();
    });
    assert!(msg.contains("ext4 Ext4Inode::data"), "{msg}");
    // In order: the handle first, then the lock; and a nested handle
    // (which never waits) under the lock.
    let h = fs.handle().unwrap();
    {
        let _dl = ei.dir_lock.read_as(Class::Ext4Dir, 2);
        let _nested = fs.handle().unwrap();
    }
    drop(h);
    // The wait itself records nothing.
    assert!(ordered::held().is_empty(), "{:?}", ordered::held());
}

/// Asking for a commit (fsync, sync) with an ext4 lock held panics,
/// naming the commit lock, although its waiters take it by try-locks;
/// with only VFS-level locks (below it in the order) it commits.
#[test]
fn commit_request_under_an_ext4_lock_panics() {
    let fs = journaled_fs();
    let root = fs.iget(2).unwrap();
    let ei = root.private::<Ext4Inode>().unwrap();
    let msg = panic_message(|| {
        let _g = ei.data.write();
        let _ = fs.commit();
    });
    assert!(msg.contains("ext4 Journal::commit"), "{msg}");
    assert!(msg.contains("ext4 Ext4Inode::data"), "{msg}");
    let vfs_data_lock = ordered::Mutex::new(Class::DataLock, ());
    let _l = vfs_data_lock.lock();
    fs.commit().unwrap();
}

/// A removed directory's lock is its own try-only class: it is taken
/// out of the parents' order without a check, and a blocking wait for a
/// directory's lock under it panics.
#[test]
fn removed_directory_lock_is_try_only() {
    let fs = journaled_fs();
    let root = fs.iget(2).unwrap();
    let ei = root.private::<Ext4Inode>().unwrap();
    let parent = ordered::RwLock::new(Class::Ext4Dir, ());
    let other = ordered::RwLock::new(Class::Ext4Dir, ());
    let msg = panic_message(|| {
        let _parent = parent.write_as(Class::Ext4Dir, 1);
        let _victim = Ext4::removed_dir_lock(ei);
        assert_eq!(ordered::held(), vec![Class::Ext4Dir, Class::Ext4DirRemoved]);
        // Ascending by number, as two parents are: still refused.
        let _again = other.read_as(Class::Ext4Dir, 100);
    });
    assert!(msg.contains("ext4 Ext4Inode::dir_lock (removed)"), "{msg}");
}
