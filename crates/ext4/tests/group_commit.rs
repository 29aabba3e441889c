//! Group commit (issue 15): threads that fsync at the same time share
//! commits, on a device whose flush takes 2 ms (a disk's cache flush); a
//! thread alone gets one commit per fsync and never waits for company; a
//! waiter sleeping for another thread's commit is woken by it (no hang);
//! every fsync'ed file is there afterwards and e2fsck is clean.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{fresh, fsck_clean, have_tools, rw_journaled, Scratch, SlowFlush};
use scalevfs::{Vfs, O_CREAT, O_WRONLY};
use scalevfs_ext4::{BlockDevice, Ext4, MemDevice};

/// `threads` threads each create, write, fsync and close `per` files;
/// (fsync requests, commits), and the image afterwards.
fn run(threads: usize, per: usize) -> (u64, u64, Vec<u8>) {
    let s = Scratch::new("groupcommit");
    let img = fresh(&s.0, 4096, "32M");
    let mem = Arc::new(MemDevice::new(std::fs::read(&img).unwrap()));
    let e = Ext4::open_device(
        Box::new(SlowFlush::new(mem.clone(), Duration::from_millis(2), false)),
        rw_journaled(),
    )
    .unwrap();
    let vfs = Arc::new(Vfs::with_root_fs(Default::default(), e.clone()));
    vfs.root_task().mkdir("/d", 0o755).unwrap();
    e.commit().unwrap();
    let (c0, q0) = e.commit_stats();
    std::thread::scope(|sc| {
        for k in 0..threads {
            let vfs = vfs.clone();
            sc.spawn(move || {
                let t = vfs.root_task();
                for i in 0..per {
                    let fd = t
                        .open(&format!("/d/f{k}_{i}"), O_CREAT | O_WRONLY, 0o644)
                        .unwrap();
                    t.write(fd, &[k as u8; 4096]).unwrap();
                    t.fsync(fd).unwrap();
                    t.close(fd).unwrap();
                }
            });
        }
    });
    let (c1, q1) = e.commit_stats();
    let t = vfs.root_task();
    for k in 0..threads {
        for i in 0..per {
            let st = t.stat(&format!("/d/f{k}_{i}")).unwrap();
            assert_eq!(st.size, 4096);
        }
    }
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    let mut out = vec![0u8; mem.size() as usize];
    mem.read_at(0, &mut out).unwrap();
    (q1 - q0, c1 - c0, out)
}

#[test]
fn concurrent_fsyncs_share_commits_and_a_lone_thread_does_not_wait() {
    if !have_tools() {
        return;
    }
    let (q, c, _) = run(1, 30);
    eprintln!("1 thread: {q} fsyncs, {c} commits");
    assert_eq!(q, 30);
    assert_eq!(c, 30, "one commit per fsync for a lone thread");
    // Two threads: each commit should carry both fsyncs (the committer
    // waits for the other thread's, which is a few microseconds of work
    // away, while the flush takes milliseconds).
    let (q, c, _) = run(2, 40);
    eprintln!("2 threads: {q} fsyncs, {c} commits");
    assert_eq!(q, 80);
    assert!(
        c * 10 <= q * 6,
        "2 threads: {q} fsyncs in {c} commits: fewer than 1.67 fsyncs per commit"
    );
    let (q, c, image) = run(4, 30);
    eprintln!("4 threads: {q} fsyncs, {c} commits");
    assert_eq!(q, 120);
    // Without batching (each fsync its own commit) c == q; a commit
    // shared by all four would give 30.
    assert!(
        c * 2 <= q,
        "4 threads: {q} fsyncs in {c} commits: fewer than 2 fsyncs per commit"
    );
    let s = Scratch::new("groupcommitimg");
    let p = s.0.join("img");
    std::fs::write(&p, image).unwrap();
    fsck_clean(&p);
}
