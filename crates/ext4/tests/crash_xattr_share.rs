//! Crash testing of shared xattr blocks (`xattr_write.rs`, "Sharing"):
//! files take one attribute set (one block, its count going up), one moves
//! off it, one clears it, one is unlinked, a new file joins it, then all
//! clear it (the block freed); each step is fsynced. Every crash state a
//! disk could be left in (each prefix ending at a flush, and random
//! subsets of the writes in flight since) is recovered as a mount does,
//! then `e2fsck -fn` passes (it counts each xattr block's users against
//! `h_refcount`; only the superblock's free totals may lag) and every
//! file's attributes are those of the last fsync before the crash or of
//! the next.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{fresh, have_tools, our_xattrs, rw_journaled, Scratch, Xattrs};
use scalevfs::{Task, Vfs, O_CREAT, O_RDWR, O_WRONLY};
use scalevfs_ext4::crashdev::{CrashLog, RecordingDevice};
use scalevfs_ext4::{Ext4, MemDevice};

/// Each file under /x with its attributes.
type State = BTreeMap<String, Xattrs>;

fn state_of(t: &Task) -> State {
    let mut out = State::new();
    for e in t.read_dir("/x").unwrap_or_default() {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let p = format!("/x/{}", String::from_utf8_lossy(&e.name));
        out.insert(p.clone(), our_xattrs(t, &p));
    }
    out
}

fn workload(rec: &Arc<RecordingDevice<MemDevice>>) -> Vec<(usize, State)> {
    let e = Ext4::open_device(Box::new(rec.clone()), rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let mut points = vec![(rec.writes(), State::new())];
    t.mkdir("/x", 0o755).unwrap();
    let big = |c: u8| vec![c; 300];
    // fsync of each file (a directory's fsync covers only the directory).
    let mut sync = |t: &Task| {
        for p in std::iter::once("/x".to_string()).chain(state_of(t).into_keys()) {
            let fd = t.open(&p, scalevfs::O_RDONLY, 0).unwrap();
            t.fsync(fd).unwrap();
            t.close(fd).unwrap();
        }
        points.push((rec.writes(), state_of(t)));
    };
    for i in 0..6 {
        let p = format!("/x/a{i}");
        let fd = t.open(&p, O_CREAT | O_WRONLY, 0o644).unwrap();
        t.close(fd).unwrap();
        t.setxattr(&p, "user.big", &big(b'v'), 0).unwrap();
    }
    sync(&t);
    t.setxattr("/x/a2", "user.big", &big(b'w'), 0).unwrap();
    sync(&t);
    t.removexattr("/x/a3", "user.big").unwrap();
    t.unlink("/x/a4").unwrap();
    sync(&t);
    let fd = t.open("/x/b", O_CREAT | O_RDWR, 0o644).unwrap();
    t.close(fd).unwrap();
    t.setxattr("/x/b", "user.big", &big(b'v'), 0).unwrap();
    sync(&t);
    for p in ["/x/a0", "/x/a1", "/x/a2", "/x/a5", "/x/b"] {
        t.removexattr(p, "user.big").unwrap();
    }
    sync(&t);
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    let last = points.last().unwrap().1.clone();
    points.push((rec.writes(), last));
    points
}

#[test]
fn every_crash_state_keeps_shared_xattr_counts_exact() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("crashxshare");
    let img = fresh(&s.0, 1024, "8M");
    let base = std::fs::read(&img).unwrap();
    let rec = Arc::new(RecordingDevice::new(MemDevice::new(base.clone()), 200_000));
    let points = workload(&rec);
    let log = CrashLog {
        base,
        ops: rec.ops(),
    };
    let state_img = s.0.join("state");
    let mut n = 0;
    log.states(4, 0x5eed_5a7e, &mut |st| {
        n += 1;
        let i = common::point_at(&points, st.flushed_writes);
        let (img_after, got) = common::recover(st.image.clone(), |v| state_of(&v.root_task()));
        let ok = points[i..(i + 2).min(points.len())]
            .iter()
            .any(|(_, want)| *want == got);
        assert!(
            ok,
            "crash state {n} (flushed {}): {got:?} is neither fsync point {i} nor the next",
            st.flushed_writes
        );
        std::fs::write(&state_img, &img_after).unwrap();
        common::fsck_ok_but_free_totals(&state_img, &format!("crash state {n}"));
        true
    });
    eprintln!(
        "{n} crash states over {} fsync points, each recovered and checked",
        points.len()
    );
    assert!(n > 10, "{n} crash states");
}
