//! Many smaller files removed by one thread that then makes no call give
//! their space to another (review, stop 50). In a test binary of its own:
//! its 40 MiB of writes, pinned while they copy, would hold back the
//! deferred frees and the resident-memory readings of the tests in
//! `memfs_limits.rs` running beside it (a CI run failed two of them so).

mod common;
use common::small_memfs;
use scalevfs::*;

/// Twenty files, each below the 1 MiB that hands a removal over at
/// once: they waited in the remover's batches, and the other thread's
/// write stopped at a fifth of the space tmpfs gives it (checked on tmpfs: twenty 1020 KiB files removed by a parked
/// thread, then a 20 MiB write, goes through whole).
#[test]
fn space_of_many_smaller_files_removed_by_an_idle_thread_comes_back() {
    // 24 MiB.
    let vfs = small_memfs(6144, 64);
    let t = vfs.root_task();
    let chunk = vec![7u8; 1020 << 10];
    let (parked_tx, parked_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let t2 = t.clone_thread();
        let chunk = &chunk;
        s.spawn(move || {
            for i in 0..20 {
                let p = format!("/m{i}");
                let fd = t2.open(&p, O_CREAT | O_RDWR, 0o644).unwrap();
                assert_eq!(t2.pwrite(fd, chunk, 0), Ok(chunk.len()));
                t2.close(fd).unwrap();
                t2.unlink(&p).unwrap();
            }
            parked_tx.send(()).unwrap();
            let _ = go_rx.recv();
        });
        parked_rx.recv().unwrap();
        let _go = go_tx;
        let f = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
        let big = vec![1u8; 20 << 20];
        assert_eq!(
            t.pwrite(f, &big, 0),
            Ok(big.len()),
            "the removed files' space"
        );
        t.close(f).unwrap();
    });
}
