//! A loop that writes a file and truncates it again frees and needs the
//! same blocks every round; blocks freed in the running transaction are
//! reusable only after its commit. When the free space runs out meanwhile,
//! a write must commit and go on (as the kernel's ext4 forces a commit and
//! retries the allocation), not come back short: xfstests generic/129
//! (looptest -t) saw "short write: 32768 of 102400" on the ext4 type.

mod common;

use common::{fresh, fsck_clean, have_tools, rw_journaled, Scratch};
use scalevfs::{Vfs, O_CREAT, O_RDWR};
use scalevfs_ext4::Ext4;

#[test]
fn truncate_and_rewrite_loop_never_writes_short() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("rewrite-loop");
    // 16 MiB: the loop below cycles several times the free space through
    // one file (no commit thread: `commit_interval` 0).
    let img = fresh(&s.0, 4096, "16M");
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fd = t.open("/loop", O_CREAT | O_RDWR, 0o644).unwrap();
    let buf: Vec<u8> = (0..102_400u32).map(|i| (i % 251) as u8).collect();
    for round in 0..600 {
        let n = t.pwrite(fd, &buf, 0).unwrap();
        assert_eq!(n, buf.len(), "round {round}: short write");
        t.ftruncate(fd, 0).unwrap();
    }
    assert_eq!(t.pwrite(fd, &buf, 0).unwrap(), buf.len());
    let mut back = vec![0u8; buf.len()];
    assert_eq!(t.pread(fd, &mut back, 0).unwrap(), buf.len());
    assert!(back == buf, "data read back differs");
    t.close(fd).unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);
}
