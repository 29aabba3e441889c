//! `link` racing with the removal of its source's last name.
//!
//! Linux's `vfs_link` checks "no name left" (nlink 0 and not a linkable
//! tmpfile: ENOENT) under the source inode's lock, which `vfs_unlink` and
//! `vfs_rename` also hold on the inode they remove a name of, so a link
//! either comes first (the file keeps the new name) or finds nlink 0 and
//! fails. Without that lock a link that checked nlink 1 could add its name
//! after the unlink had taken the count to 0 and put the open file on the
//! orphan file: the file then had a name and nlink 1 but stayed an orphan,
//! to be freed at its last close under the name that still pointed at it.
//!
//! Each round: `x` is created and kept open; one thread removes `x`
//! (unlink, or a rename of another file over it) while another links `x`
//! to `y`. Whichever wins, the counts must agree with the names.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;

use scalevfs::*;

const ROUNDS: usize = 5000;

#[test]
fn link_and_last_unlink_agree_on_the_link_count() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    let start = Barrier::new(3);
    let done = Barrier::new(3);
    let mut linked = 0usize;
    let mut refused = 0usize;
    let link_result = std::sync::Mutex::new(None);
    // A failed check stops the workers (they wait at `start`) before the
    // panic, so a failure is reported instead of hanging the scope.
    let stop = AtomicBool::new(false);
    let mut failure = None;
    std::thread::scope(|s| {
        // Remover: unlink x, or (odd rounds) rename z over it.
        s.spawn(|| {
            for r in 0..ROUNDS {
                start.wait();
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                if r % 2 == 0 {
                    t.unlink("/d/x").unwrap();
                } else {
                    t.rename("/d/z", "/d/x").unwrap();
                }
                done.wait();
            }
        });
        s.spawn(|| {
            for _ in 0..ROUNDS {
                start.wait();
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                *link_result.lock().unwrap() = Some(t.link("/d/x", "/d/y"));
                done.wait();
            }
        });
        for r in 0..ROUNDS {
            let fd = t.open("/d/x", O_CREAT | O_EXCL | O_RDWR, 0o644).unwrap();
            assert_eq!(t.write(fd, b"hello"), Ok(5));
            let mut z_ino = None;
            if r % 2 == 1 {
                let z = t.open("/d/z", O_CREAT | O_EXCL | O_WRONLY, 0o644).unwrap();
                z_ino = Some(t.fstat(z).unwrap().ino);
                t.close(z).unwrap();
            }
            let inode = t.files().get_arc(fd).unwrap().inode().clone();
            start.wait();
            done.wait();
            let res = link_result.lock().unwrap().take().unwrap();
            let st = t.fstat(fd).unwrap();
            let mut x_kept = false;
            let verdict = (|| -> Result<(), String> {
                match res {
                    Ok(()) => {
                        linked += 1;
                        let y = t.stat("/d/y").map_err(|e| format!("round {r}: y: {e:?}"))?;
                        // A link that came after the rename links the file
                        // renamed over x.
                        x_kept = y.ino == st.ino;
                        check(
                            x_kept || Some(y.ino) == z_ino,
                            format!("round {r}: y is neither x nor z"),
                        )?;
                        let want = u32::from(x_kept);
                        check(
                            st.nlink == want,
                            format!("round {r}: linked, nlink {} not {want}", st.nlink),
                        )?;
                        check(
                            orphan::is_orphan(&inode) != x_kept,
                            format!("round {r}: orphan state does not match the names"),
                        )?;
                    }
                    Err(e) => {
                        refused += 1;
                        check(e == Errno::ENOENT, format!("round {r}: link gave {e:?}"))?;
                        check(
                            st.nlink == 0,
                            format!("round {r}: refused, but nlink {}", st.nlink),
                        )?;
                        check(
                            orphan::is_orphan(&inode),
                            format!("round {r}: not an orphan"),
                        )?;
                        check(
                            t.stat("/d/y").err() == Some(Errno::ENOENT),
                            format!("round {r}: refused, but y exists"),
                        )?;
                    }
                }
                t.close(fd)
                    .map_err(|e| format!("round {r}: close: {e:?}"))?;
                if res.is_ok() {
                    // The data outlived the close under its new name.
                    let mut b = [0u8; 8];
                    let fd = t
                        .open("/d/y", O_RDONLY, 0)
                        .map_err(|e| format!("round {r}: {e:?}"))?;
                    let n = t.read(fd, &mut b);
                    t.close(fd).unwrap();
                    let want: &[u8] = if x_kept { b"hello" } else { b"" };
                    check(
                        n == Ok(want.len()) && &b[..want.len()] == want,
                        format!("round {r}: y lost its data"),
                    )?;
                    t.unlink("/d/y").unwrap();
                }
                Ok(())
            })();
            drop(inode);
            if let Err(m) = verdict {
                failure = Some(m);
                stop.store(true, Ordering::SeqCst);
                start.wait();
                break;
            }
            if r % 2 == 1 {
                t.unlink("/d/x").unwrap();
            }
        }
    });
    if let Some(m) = failure {
        panic!("{m}");
    }
    eprintln!("{linked} links won, {refused} refused");
    assert_eq!(linked + refused, ROUNDS);
}

fn check(ok: bool, what: String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what)
    }
}
