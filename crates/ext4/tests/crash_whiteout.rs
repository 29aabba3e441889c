//! RENAME_WHITEOUT is crash-atomic: the rename and the whiteout's create
//! run in one handle (`Ext4::rename_whiteout`), as Linux makes the
//! whiteout in the rename's handle. They used to be two handles, so a
//! commit between them made crash states with the name moved and no
//! whiteout (for overlayfs the lower file would show again). A second
//! thread commits in a loop while the renames run; every crash state is
//! recovered by our mount and checked (found by review, stop 38).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use scalevfs::{Vfs, O_CREAT, O_WRONLY, RENAME_WHITEOUT};
use scalevfs_ext4::crashdev::{CrashLog, RecordingDevice};
use scalevfs_ext4::{Ext4, MemDevice};

const N: usize = 150;

#[test]
fn whiteout_rename_is_atomic_in_every_crash_state() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("crash-whiteout");
    let img = fresh(&s.0, 1024, "8M");
    {
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        t.mkdir("/a", 0o755).unwrap();
        t.mkdir("/b", 0o755).unwrap();
        for i in 0..N {
            let fd = t
                .open(format!("/a/w{i}").as_str(), O_CREAT | O_WRONLY, 0o644)
                .unwrap();
            t.close(fd).unwrap();
        }
        unmount_clean(t, vfs, e, &img);
    }
    let base = std::fs::read(&img).unwrap();
    let rec = Arc::new(RecordingDevice::new(
        MemDevice::new(base.clone()),
        2_000_000,
    ));
    {
        let e = Ext4::open_device(Box::new(rec.clone()), rw_journaled()).unwrap();
        let vfs = Vfs::with_root_fs(Default::default(), e.clone());
        let done = AtomicBool::new(false);
        std::thread::scope(|sc| {
            let (e2, done) = (e.clone(), &done);
            sc.spawn(move || {
                // Commits as often as they can run (as fsyncs of other
                // files, or the commit thread, would).
                while !done.load(Ordering::Relaxed) {
                    e2.commit().unwrap();
                }
            });
            let t = vfs.root_task();
            for i in 0..N {
                t.renameat2(
                    -100,
                    format!("/a/w{i}").as_str(),
                    -100,
                    format!("/b/w{i}").as_str(),
                    RENAME_WHITEOUT,
                )
                .unwrap();
                std::thread::sleep(std::time::Duration::from_micros(300));
            }
            done.store(true, Ordering::Relaxed);
        });
        drop(vfs);
        e.unmount().unwrap();
    }
    let log = CrashLog {
        base,
        ops: rec.ops(),
    };
    let epochs = log.epochs().len();
    let st_img = s.0.join("state");
    let mut bad = Vec::new();
    let mut n = 0;
    // The state at each flush (no random subsets: the journal makes those
    // the same as the flush before).
    log.states(0, 1, &mut |st| {
        n += 1;
        let (after, missing) = recover(st.image.clone(), |v| {
            let t = v.root_task();
            (0..N)
                .filter(|i| {
                    t.lstat(format!("/b/w{i}").as_str()).is_ok()
                        && t.lstat(format!("/a/w{i}").as_str()).is_err()
                })
                .collect::<Vec<_>>()
        });
        if !missing.is_empty() {
            bad.push(format!("state {n}: moved, no whiteout: {missing:?}"));
            std::fs::write(&st_img, &after).unwrap();
            fsck_ok_but_free_totals(&st_img, "whiteout state");
            return bad.len() < 3;
        }
        true
    });
    eprintln!("{n} states of {epochs} epochs checked");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
