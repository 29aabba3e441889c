//! A write in progress keeps its mount written and busy though another
//! thread closes the fd it came through: Linux's write holds its file (and
//! so the file's writer count) until it returns, so a read-only remount
//! meanwhile is EBUSY. Before, calls borrowed the file without a count, and
//! the close gave the writer count back at once: the remount succeeded
//! and the write went on changing a read-only mount.

use std::sync::atomic::{AtomicBool, Ordering};

use scalevfs::*;

#[test]
fn a_remount_read_only_waits_for_a_write_whose_fd_was_closed() {
    let mut conclusive = false;
    for round in 0..4u32 {
        let vfs = Vfs::new();
        let t = vfs.root_task();
        let fd = t.open("/f", O_CREAT | O_WRONLY, 0o644).unwrap();
        let size = (128usize << 20) << round;
        let data = vec![7u8; size];
        let free0 = t.statfs("/").unwrap().bfree;
        let done = AtomicBool::new(false);
        let verdict = std::thread::scope(|s| {
            let t2 = t.clone_thread();
            let (data, done) = (&data, &done);
            let w = s.spawn(move || {
                let r = t2.write(fd, data);
                done.store(true, Ordering::SeqCst);
                r
            });
            // Until the write is under way (its pages are counted)...
            while t.statfs("/").unwrap().bfree + 256 > free0 && !done.load(Ordering::SeqCst) {
                std::hint::spin_loop();
            }
            // ... then its fd goes, and a read-only remount is tried.
            t.close(fd).unwrap();
            let r = t.remount("/", true);
            let finished = done.load(Ordering::SeqCst);
            let wr = w.join().unwrap();
            (r, finished, wr)
        });
        let (r, finished, wr) = verdict;
        assert_eq!(wr, Ok(size), "the write itself");
        if finished {
            eprintln!("round {round}: the write ended before the remount; larger");
            continue;
        }
        assert_eq!(
            r,
            Err(Errno::EBUSY),
            "remounted read-only under a running write"
        );
        conclusive = true;
        break;
    }
    assert!(conclusive, "the write always ended first");
}
