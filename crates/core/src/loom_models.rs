//! Loom models that run the production code of the core's lock-free
//! protocols. Every atomic of the core comes from the
//! `scalevfs_sync::primitive` shim, so these are loom's under `--cfg loom`.
//!
//! - **last close vs unlink** (`orphan::file_closed`, `file_opened`,
//!   `mark_unlinked`, `Inode::update_attr`, on a real `Inode` and a real
//!   `OrphanFile`): when every file is closed the orphan slot is released,
//!   and not while a file is still open. (Checked: with `mark_unlinked`'s
//!   re-check of `opens` removed, `unlink_vs_last_close` reports the leak.)
//!
//! Not modelled here (the copies in `crates/sync/tests/loom_dcache.rs`
//! stay): the dcache's lock-free lookup against `d_move` and against the
//! CLOCK sweep. A model driving `Dcache::lookup_rcu` concurrently with
//! `Dcache::d_move` on a real `Vfs` builds and runs, but loom aborts it
//! ("Reached unexpected exploration state. Is the model fully
//! deterministic?"); the same model with the reader reading the dentry's
//! flags and seqcount instead of calling `lookup_rcu`, or with the writer
//! idle, is accepted. The cause was not found in the time available.
//! (Also to solve there: `free_dentry`'s deferred free would run during a
//! later loom execution and touch its atomics; under loom it must leak.)
//!
//! What loom cannot see: crossbeam-epoch has no loom support, so epoch
//! guards are real (std atomics, invisible to loom); the epoch's own
//! protocol (no free before every pinned reader has left) is crossbeam's.
//!
//! Loom's `SeqCst` is `AcqRel`; the shim performs `SeqCst` loads as
//! read-only RMWs (see `scalevfs_sync::primitive`), without which the
//! store-buffer pattern of the last close fails spuriously.
//!
//! Run with `ci/loom.sh` (or `RUSTFLAGS="--cfg loom" cargo test -p scalevfs
//! --release --lib loom_models`).

use std::sync::Arc;

use loom::model::Builder;
use loom::thread;

use crate::inode::Inode;
use crate::types::{Attr, S_IFREG};
use crate::OrphanVariant;

fn model(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(bound);
    }
    b.check(f);
}

fn regular_inode() -> Arc<Inode> {
    let attr = Attr {
        mode: S_IFREG | 0o644,
        nlink: 1,
        ..Default::default()
    };
    Arc::new(Inode::new(7, 1, attr, Box::new(())))
}

/// The unlink side, as `Task::unlinkat` runs it after the filesystem's
/// unlink dropped the link count.
fn unlink(of: &scalevfs_orphan::OrphanFile, i: &Inode) {
    i.update_attr(|a| a.nlink = 0);
    if i.attr().nlink == 0 {
        crate::orphan::mark_unlinked(of, i);
    }
}

fn orphan_file() -> Arc<scalevfs_orphan::OrphanFile> {
    Arc::new(scalevfs_orphan::OrphanFile::with_geometry(
        OrphanVariant::Lockless,
        1,
        2,
    ))
}

#[test]
fn unlink_vs_last_close() {
    model(3, || {
        let of = orphan_file();
        let i = regular_inode();
        crate::orphan::file_opened(&of, &i);
        let (of2, i2) = (of.clone(), i.clone());
        let closer = thread::spawn(move || crate::orphan::file_closed(&of2, &i2));
        unlink(&of, &i);
        closer.join().unwrap();
        assert!(of.is_empty(), "orphan slot leaked after the last close");
        assert!(!crate::orphan::is_orphan(&i));
    });
}

#[test]
fn unlink_vs_racing_open_and_close() {
    model(2, || {
        let of = orphan_file();
        let i = regular_inode();
        // One description open throughout (closed at the end), one that
        // races: opened (found the name before the unlink) and closed.
        crate::orphan::file_opened(&of, &i);
        let (of2, i2) = (of.clone(), i.clone());
        let racer = thread::spawn(move || {
            crate::orphan::file_opened(&of2, &i2);
            crate::orphan::file_closed(&of2, &i2);
        });
        unlink(&of, &i);
        racer.join().unwrap();
        // Still open: the slot must be held.
        assert!(!of.is_empty(), "slot released while a file is open");
        assert!(crate::orphan::is_orphan(&i));
        crate::orphan::file_closed(&of, &i);
        assert!(of.is_empty(), "orphan slot leaked after the last close");
        assert!(!crate::orphan::is_orphan(&i));
    });
}
