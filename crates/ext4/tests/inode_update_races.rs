//! Changes to one ext4 inode made through different paths at once must
//! not undo each other. Each path reads the inode's in-memory copy,
//! changes some fields and stores the whole copy back (and into its inode
//! table slot), so two paths that do not exclude each other lose one
//! change: a chmod of a directory while names are created in it put back
//! an old size or link count (e2fsck: wrong i_size, wrong link count); a
//! write extending a file while its last name was removed put back a
//! link count of 1, and the inode was never freed (e2fsck: unattached
//! inode); a chmod of a directory as rmdir (or a rename over it) removed
//! it put back its link count of 2 (e2fsck: unattached inode). Every such
//! change now holds the inode's own lock: the directory lock for a
//! directory, the data lock for anything else.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{fsck_clean, mount, mount_fresh};
use scalevfs::{O_CREAT, O_WRONLY};

#[test]
fn chmod_of_a_directory_beside_creates_and_mkdirs_in_it() {
    let Some((_s, img, e, vfs)) = mount_fresh("racechmoddir", "64M") else {
        return;
    };
    let vfs = Arc::new(vfs);
    vfs.root_task().mkdir("/d", 0o755).unwrap();
    let stop = AtomicBool::new(false);
    let (files, dirs) = (1500, 60);
    std::thread::scope(|sc| {
        let v = vfs.clone();
        let stop = &stop;
        sc.spawn(move || {
            let t = v.root_task();
            let mut m = 0o700;
            // Relaxed: a stop flag; the scope's join orders the rest.
            while !stop.load(Ordering::Relaxed) {
                t.chmod("/d", m).unwrap();
                m ^= 0o055;
            }
        });
        let v = vfs.clone();
        let worker = sc.spawn(move || {
            let t = v.root_task();
            for i in 0..files {
                let fd = t
                    .open(
                        &format!("/d/file-with-a-longish-name-{i}"),
                        O_CREAT | O_WRONLY,
                        0o644,
                    )
                    .unwrap();
                t.close(fd).unwrap();
                if i % (files / dirs) == 0 {
                    t.mkdir(&format!("/d/sub{i}"), 0o755).unwrap();
                }
            }
        });
        let r = worker.join();
        // Relaxed: see above.
        stop.store(true, Ordering::Relaxed);
        if let Err(p) = r {
            std::panic::resume_unwind(p);
        }
    });
    let t = vfs.root_task();
    assert_eq!(t.stat("/d").unwrap().nlink, 2 + dirs as u32);
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
}

#[test]
fn a_write_beside_the_unlink_of_the_files_last_name() {
    let Some((_s, img, e, vfs)) = mount_fresh("racewriteunlink", "64M") else {
        return;
    };
    let vfs = Arc::new(vfs);
    vfs.root_task().mkdir("/w", 0o755).unwrap();
    let block = vec![0x5Au8; 1024];
    for round in 0..200 {
        let t = vfs.root_task();
        let p = format!("/w/f{round}");
        let fd = t.open(&p, O_CREAT | O_WRONLY, 0o644).unwrap();
        let go = std::sync::Barrier::new(2);
        std::thread::scope(|sc| {
            let (v, p, go) = (vfs.clone(), &p, &go);
            sc.spawn(move || {
                let t2 = v.root_task();
                go.wait();
                t2.unlink(p).unwrap();
            });
            go.wait();
            // Appends: each changes the size and the extent tree while
            // the unlink sets the link count to 0.
            for k in 0..16i64 {
                t.pwrite(fd, &block, k * 1024).unwrap();
            }
        });
        t.close(fd).unwrap();
    }
    scalevfs::flush_deferred_frees();
    e.commit().unwrap();
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
}

/// A chmod of a directory at the moment it is removed (rmdir, or a
/// rename over it): the removal sets the emptied directory's link count
/// to 0 and frees it, and must not have that count stored back (e2fsck:
/// an unattached or wrongly counted inode).
#[test]
fn chmod_of_a_directory_being_removed() {
    let Some((_s, img, e, vfs)) = mount_fresh("racechmodrmdir", "64M") else {
        return;
    };
    let vfs = Arc::new(vfs);
    let t = vfs.root_task();
    t.mkdir("/p", 0o755).unwrap();
    for round in 0..300 {
        let d = format!("/p/d{round}");
        t.mkdir(&d, 0o755).unwrap();
        let over = round % 2 == 1;
        if over {
            t.mkdir(&format!("/p/e{round}"), 0o755).unwrap();
        }
        let go = std::sync::Barrier::new(2);
        std::thread::scope(|sc| {
            let (v, d, go) = (vfs.clone(), &d, &go);
            sc.spawn(move || {
                let t2 = v.root_task();
                go.wait();
                // Until it is gone (ENOENT), or (renamed over: the name
                // then holds the other directory) a bounded number of times.
                for k in 0..200 {
                    if t2.chmod(d, [0o700, 0o755][k % 2]).is_err() {
                        break;
                    }
                }
            });
            go.wait();
            if over {
                // The directory named by `d` is replaced: it goes.
                t.rename(&format!("/p/e{round}"), d).unwrap();
            } else {
                t.rmdir(d).unwrap();
            }
        });
    }
    assert_eq!(t.stat("/p").unwrap().nlink, 2 + 150);
    drop(t);
    scalevfs::flush_deferred_frees();
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
}

/// A create or unlink stamps the directory with the current time, as
/// Linux does, even over a later one (a directory whose times were set
/// in the future): the shared-lock path stores the time, it does not keep
/// the larger one. The stamp reaches the disk.
#[test]
fn a_create_stamps_the_current_time_over_a_future_one() {
    use scalevfs::types::Timespec;
    let Some((_s, img, e, vfs)) = mount_fresh("futuremtime", "32M") else {
        return;
    };
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    let future = Timespec {
        sec: Timespec::now().sec + 86_400,
        nsec: 0,
    };
    for (k, remove) in [(0, false), (1, true)] {
        t.utimensat(-100, "/d", Some([future, future]), 0).unwrap();
        let before = Timespec::now();
        if remove {
            t.unlink("/d/f0").unwrap();
        } else {
            let fd = t.open("/d/f0", O_CREAT | O_WRONLY, 0o644).unwrap();
            t.close(fd).unwrap();
        }
        let st = t.stat("/d").unwrap();
        for (what, ts) in [("mtime", st.mtime), ("ctime", st.ctime)] {
            assert!(
                (ts.sec, ts.nsec) >= (before.sec, before.nsec) && ts.sec < future.sec,
                "step {k}: {what} {ts:?} is not the time of the change ({before:?})"
            );
        }
    }
    let mtime = t.stat("/d").unwrap().mtime;
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
    let (e, vfs) = mount(&img);
    assert_eq!(vfs.root_task().stat("/d").unwrap().mtime, mtime, "on disk");
    drop(vfs);
    e.unmount().unwrap();
}
