//! A write that waits for space (its tries out of space are redone a few
//! milliseconds apart, for the space of removed files to come back) goes
//! on in the file it started in, though another thread closed its fd and
//! opened another file at that number meanwhile. Linux's write holds its
//! file from `fdget` to `fdput`; before, each try looked the fd up again,
//! so the rest of the write landed in the other thread's new file.
//!
//! The other thread acts while the writer sleeps between tries: it watches
//! the writer's thread state in /proc until it is sleeping (the only sleep
//! on that path is the wait between tries), so the writer's first try has
//! certainly found the first file.

use std::time::{Duration, Instant};

use scalevfs::*;

const PAGE: usize = 4096;

/// The state letter of thread `tid` of this process (R, S, D, ...).
fn thread_state(tid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // "tid (comm) S ...": the state follows the last ')'.
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

#[test]
fn a_write_waiting_for_space_stays_in_its_file() {
    let mut cfg = VfsConfig::default();
    cfg.set("size", &format!("{}k", 64 * PAGE / 1024)).unwrap();
    let vfs = Vfs::with_config(cfg);
    let t = vfs.root_task();
    if thread_state(gettid()).is_none() {
        eprintln!("skipped: /proc/self/task/<tid>/stat is not readable here");
        return;
    }
    // The filesystem full: a file of 64 pages, closed.
    let big = t.open("/big", O_CREAT | O_RDWR, 0o644).unwrap();
    assert_eq!(t.write(big, &vec![1u8; 64 * PAGE]), Ok(64 * PAGE));
    t.close(big).unwrap();
    let f = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    let data = vec![2u8; 8 * PAGE];
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let t2 = t.clone_thread();
        let other = s.spawn(move || {
            let tid: i32 = tid_rx.recv().unwrap();
            // Wait until the writer sleeps between its tries.
            let deadline = Instant::now() + Duration::from_secs(5);
            while thread_state(tid) != Some('S') {
                assert!(Instant::now() < deadline, "the writer never waited");
                std::hint::spin_loop();
            }
            // Its fd now names another file, and the space comes back.
            t2.close(f).unwrap();
            let g = t2.open("/other", O_CREAT | O_RDWR, 0o644).unwrap();
            assert_eq!(g, f, "the lowest free fd is the one just closed");
            t2.unlink("/big").unwrap();
            scalevfs::flush_deferred_frees();
            g
        });
        tid_tx.send(gettid()).unwrap();
        let r = t.write(f, &data);
        let g = other.join().unwrap();
        assert_eq!(
            t.stat("/other").unwrap().size,
            0,
            "the write's rest went to the file opened at its fd meanwhile \
             (write returned {r:?})"
        );
        // The space came back while the writer was waiting: the write is
        // whole, in the file it started in.
        assert_eq!(r, Ok(8 * PAGE));
        assert_eq!(t.stat("/f").unwrap().size, (8 * PAGE) as u64);
        t.close(g).unwrap();
    });
}

/// This thread's kernel thread id.
fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::gettid() }
}
