//! The fd table under concurrency (issue 16): opens (lowest-fd and
//! `O_ANYFD`), closes and dup2 from threads sharing one table. Slots change
//! by compare-exchange and closes take no lock, so these check what the
//! table promises: no fd is handed to two opens at once, every close frees
//! exactly its own file, and POSIX's lowest-fd rule holds for ordinary
//! opens whatever closes raced with them (the hint's Dekker pair).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use scalevfs::*;

fn setup() -> (Vfs, Task) {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    for i in 0..8 {
        let fd = t
            .open(&format!("/f{i}"), O_CREAT | O_WRONLY, 0o644)
            .unwrap();
        t.write(fd, format!("file {i}").as_bytes()).unwrap();
        t.close(fd).unwrap();
    }
    (vfs, t)
}

/// The name of the file open at `fd` (its contents).
fn whose(t: &Task, fd: i32) -> String {
    let mut b = [0u8; 16];
    let n = t.pread(fd, &mut b, 0).unwrap();
    String::from_utf8_lossy(&b[..n]).into_owned()
}

#[test]
fn concurrent_opens_get_distinct_fds_and_closes_free_their_own() {
    for anyfd in [false, true] {
        let (_vfs, t) = setup();
        let flags = O_RDONLY | if anyfd { O_ANYFD } else { 0 };
        let held: Arc<Mutex<HashSet<i32>>> = Arc::default();
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let t = t.clone_thread();
                let held = held.clone();
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    for round in 0..2000 {
                        let name = format!("/f{}", (w * 2 + round) % 8);
                        let fd = t.open(&name, flags, 0).unwrap();
                        assert!(held.lock().unwrap().insert(fd), "fd {fd} handed out twice");
                        // The fd names the file this open opened.
                        assert_eq!(whose(&t, fd), format!("file {}", (w * 2 + round) % 8));
                        mine.push(fd);
                        if mine.len() > 5 || round % 3 == 0 {
                            let fd = mine.remove(0);
                            assert!(held.lock().unwrap().remove(&fd));
                            t.close(fd).unwrap();
                        }
                    }
                    for fd in mine {
                        assert!(held.lock().unwrap().remove(&fd));
                        t.close(fd).unwrap();
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(t.files().count(), 0, "anyfd {anyfd}: fds left open");
        // Every fd is free again: ordinary opens get 0, 1, 2, ... in order.
        let fds: Vec<i32> = (0..10)
            .map(|_| t.open("/f0", O_RDONLY, 0).unwrap())
            .collect();
        assert_eq!(fds, (0..10).collect::<Vec<_>>(), "anyfd {anyfd}");
        for fd in fds {
            t.close(fd).unwrap();
        }
    }
}

#[test]
fn lowest_fd_rule_survives_racing_closes() {
    // One thread opens and closes ordinary fds while others close the fds
    // it hands them: after each quiet point the lowest free fd is found.
    let (_vfs, t) = setup();
    for round in 0..200 {
        let fds: Vec<i32> = (0..16)
            .map(|_| t.open("/f1", O_RDONLY, 0).unwrap())
            .collect();
        assert_eq!(fds, (0..16).collect::<Vec<_>>(), "round {round}");
        let (even, odd): (Vec<i32>, Vec<i32>) = fds.iter().partition(|fd| *fd % 2 == 0);
        let closers: Vec<_> = [even, odd]
            .into_iter()
            .map(|set| {
                let t = t.clone_thread();
                std::thread::spawn(move || {
                    for fd in set.into_iter().rev() {
                        t.close(fd).unwrap();
                    }
                })
            })
            .collect();
        // Opens racing with the closes: each gets some fd (EMFILE is not
        // possible here); close them again.
        let mut racing = Vec::new();
        for _ in 0..8 {
            racing.push(t.open("/f2", O_RDONLY, 0).unwrap());
        }
        for c in closers {
            c.join().unwrap();
        }
        for fd in racing {
            t.close(fd).unwrap();
        }
        assert_eq!(t.files().count(), 0);
    }
    // After all that, the lowest free fd is 0 again and then 1, 2, ...
    let fds: Vec<i32> = (0..4)
        .map(|_| t.open("/f0", O_RDONLY, 0).unwrap())
        .collect();
    assert_eq!(fds, vec![0, 1, 2, 3]);
}

#[test]
fn anyfd_opens_stay_within_the_limit_and_fall_back() {
    let (_vfs, t) = setup();
    t.files().set_max(256).unwrap();
    // More any-fd opens than one home range: they spill to other ranges
    // and finally to the lowest-fd search; the limit holds (EMFILE).
    let mut fds = Vec::new();
    loop {
        match t.open("/f3", O_RDONLY | O_ANYFD, 0) {
            Ok(fd) => {
                assert!((0..256).contains(&fd), "fd {fd} beyond the limit");
                fds.push(fd);
            }
            Err(e) => {
                assert_eq!(e, Errno::EMFILE);
                break;
            }
        }
        assert!(fds.len() <= 256);
    }
    assert_eq!(fds.len(), 256);
    let distinct: HashSet<i32> = fds.iter().copied().collect();
    assert_eq!(distinct.len(), 256);
    // dup2 onto an any-fd fd replaces it; close frees it.
    let src = t.open("/f4", O_RDONLY | O_ANYFD, 0);
    assert_eq!(src, Err(Errno::EMFILE));
    t.close(fds[100]).unwrap();
    let src = t.open("/f4", O_RDONLY | O_ANYFD, 0).unwrap();
    assert_eq!(t.dup2(src, fds[200]), Ok(fds[200]));
    assert_eq!(whose(&t, fds[200]), "file 4");
    for fd in fds.iter().filter(|fd| **fd != fds[100]) {
        t.close(*fd).unwrap();
    }
    t.close(src).unwrap();
    assert_eq!(t.files().count(), 0);
}

/// dup2 onto the fds an `O_ANYFD` open keeps getting (a reservation made
/// without the table lock) never takes the reservation away from the open
/// (it is EBUSY then, as Linux's do_dup2): each open installs its own file
/// (in test builds the table asserts that), and the accounting comes out
/// even.
#[test]
fn dup2_never_steals_an_anyfd_reservation() {
    use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
    let (_vfs, t) = setup();
    let target = Arc::new(AtomicI32::new(-1));
    let stop = Arc::new(AtomicBool::new(false));
    let src = t.open("/f7", O_RDONLY, 0).unwrap();
    let dupper = {
        let (t, target, stop) = (t.clone_thread(), target.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut ok, mut busy) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let fd = target.load(Ordering::Relaxed);
                if fd < 0 {
                    continue;
                }
                match t.dup2(src, fd) {
                    Ok(_) => ok += 1,
                    Err(Errno::EBUSY) => busy += 1,
                    Err(e) => panic!("dup2 onto {fd}: {e:?}"),
                }
            }
            (ok, busy)
        })
    };
    let mut prev: Vec<i32> = Vec::new();
    for round in 0..20_000 {
        let fd = t.open("/f1", O_RDONLY | O_ANYFD, 0).unwrap();
        target.store(fd, Ordering::Relaxed);
        // Ours, or the dup2's file if it replaced ours after the open.
        let w = whose(&t, fd);
        assert!(
            w == "file 1" || w == "file 7",
            "round {round}: fd {fd} holds {w}"
        );
        // A dup2 that read an earlier target may refill a closed fd: the
        // last few are closed again each round, so the table never fills.
        prev.push(fd);
        if prev.len() > 4 {
            prev.remove(0);
        }
        for &p in &prev {
            let _ = t.close(p);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (ok, busy) = dupper.join().unwrap();
    eprintln!("dup2: {ok} installed, {busy} EBUSY");
    for fd in 0..1024 {
        if fd != src {
            let _ = t.close(fd);
        }
    }
    t.close(src).unwrap();
    assert_eq!(t.files().count(), 0, "fds left open");
}
