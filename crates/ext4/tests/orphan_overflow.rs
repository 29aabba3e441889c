//! More unlinked-but-open files than the orphan file has slots: the rest go
//! on the orphan list (`s_last_orphan`, chained through `i_dtime`), as the
//! kernel falls back to it, so a crash cannot leak them either.
//!
//! - With every file closed again, each inode is freed and the image is
//!   clean (the list's mutex is taken under an ext4 directory's lock at
//!   unlink and under the commit lock when freeing: in a debug build the
//!   lock-order checker runs on every acquisition).
//! - A "crash" (the device's bytes copied after a commit, no unmount)
//!   with all 600 still open: our mount (replay, then the orphan list and
//!   the orphan file processed) and `e2fsck -fy` each free all 600, the
//!   free counts back to mkfs's less /d. Before the fallback, the 92
//!   inodes that found no slot were recorded only in memory and leaked.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::{e2fsck, fsck_clean, have_tools, mkfs, rw_journaled, sb_field, Scratch};
use scalevfs::{Vfs, O_CREAT, O_WRONLY};
use scalevfs_ext4::{BlockDevice, Ext4, MemDevice};

/// Open unlinked files: more than the 2 x 254 slots.
const N: usize = 600;
const SLOTS: usize = 2 * 254;

/// A 16 MiB image with 1 KiB blocks and a two-block orphan file; its free
/// (blocks, inodes).
fn image(dir: &Path) -> (PathBuf, u64, u64) {
    let img = dir.join("img");
    let out = Command::new(mkfs().unwrap())
        .args([
            "-q",
            "-F",
            "-b",
            "1024",
            "-O",
            "orphan_file",
            "-E",
            "orphan_file_size=2",
        ])
        .arg(&img)
        .arg("16M")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (b, i) = counts(&img);
    (img, b, i)
}

/// Free (blocks, inodes) as the superblock says.
fn counts(img: &Path) -> (u64, u64) {
    let c = |name: &str| -> u64 { sb_field(img, name).parse().unwrap() };
    (c("Free blocks"), c("Free inodes"))
}

fn bytes(mem: &MemDevice) -> Vec<u8> {
    let mut b = vec![0u8; mem.size() as usize];
    mem.read_at(0, &mut b).unwrap();
    b
}

/// /d, then `N` files of 1500 bytes in it, each unlinked while open: the
/// open descriptors, the last committed.
fn open_unlinked(e: &Arc<Ext4>, t: &scalevfs::Task) -> Vec<i32> {
    t.mkdir("/d", 0o755).unwrap();
    let mut fds = Vec::new();
    for i in 0..N {
        let p = format!("/d/f{i}");
        let fd = t.open(&p, O_CREAT | O_WRONLY, 0o644).unwrap();
        t.write(fd, &[i as u8; 1500]).unwrap();
        t.unlink(&p).unwrap();
        fds.push(fd);
    }
    // A commit with every one of them still open: nothing may be freed.
    e.commit().unwrap();
    assert_eq!(
        e.orphan_list_len(),
        N - SLOTS,
        "the files that found no slot are on the orphan list"
    );
    fds
}

/// A journaled mount of a fresh image (in memory) with 600 files
/// unlinked and still open: more than the orphan file's slots.
struct Overflowed {
    img: PathBuf,
    blocks0: u64,
    inodes0: u64,
    mem: Arc<MemDevice>,
    e: Arc<Ext4>,
    vfs: Vfs,
    t: scalevfs::Task,
    fds: Vec<i32>,
}

fn overflowed(dir: &Path) -> Overflowed {
    let (img, blocks0, inodes0) = image(dir);
    let mem = Arc::new(MemDevice::new(std::fs::read(&img).unwrap()));
    let e = Ext4::open_device(Box::new(mem.clone()), rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fds = open_unlinked(&e, &t);
    Overflowed {
        img,
        blocks0,
        inodes0,
        mem,
        e,
        vfs,
        t,
        fds,
    }
}

#[test]
fn more_open_unlinked_files_than_orphan_slots() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("orphanoverflow");
    let Overflowed {
        img,
        blocks0,
        inodes0,
        mem,
        e,
        vfs,
        t,
        fds,
    } = overflowed(&s.0);
    // Closed from both ends: inodes leave the list's head, its tail and
    // slots of the orphan file in the same commits.
    let mut fds: std::collections::VecDeque<i32> = fds.into();
    let mut k = 0;
    while let Some(fd) = if k % 2 == 0 {
        fds.pop_front()
    } else {
        fds.pop_back()
    } {
        t.close(fd).unwrap();
        k += 1;
        if k % 97 == 0 {
            e.commit().unwrap();
        }
    }
    // The VFS lets go of the inodes after a grace period, which another
    // test of this binary running at the same time can hold open for a
    // while (it pins the epoch): flush and commit until the list drains,
    // for at most two seconds.
    for _ in 0..200 {
        scalevfs::flush_deferred_frees();
        e.commit().unwrap();
        if e.orphan_list_len() == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(e.orphan_list_len(), 0);
    e.unmount().unwrap();
    drop(t);
    drop(vfs);
    std::fs::write(&img, bytes(&mem)).unwrap();
    fsck_clean(&img);
    // Everything but /d (an inode and its block) came back.
    assert_eq!(counts(&img), (blocks0 - 1, inodes0 - 1));
}

#[test]
fn a_crash_with_overflowed_orphans_open_leaks_nothing() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("orphanoverflowcrash");
    let Overflowed {
        img: _,
        blocks0,
        inodes0,
        mem,
        e,
        vfs,
        t,
        fds,
    } = overflowed(&s.0);
    // The "crash": the device as it is now (every file unlinked and open,
    // 508 in the orphan file, 92 on the list; the log not checkpointed).
    let crashed = bytes(&mem);
    for fd in fds {
        t.close(fd).unwrap();
    }
    e.unmount().unwrap();
    drop(t);
    drop(vfs);

    // (a) Our mount: replay, then the list and the file processed.
    let ours = s.0.join("ours");
    let dev = Arc::new(MemDevice::new(crashed.clone()));
    let e = Ext4::open_device(Box::new(dev.clone()), rw_journaled()).unwrap();
    assert_eq!(e.orphan_list_len(), 0);
    e.unmount().unwrap();
    drop(e);
    std::fs::write(&ours, bytes(&dev)).unwrap();
    fsck_clean(&ours);
    assert_eq!(
        counts(&ours),
        (blocks0 - 1, inodes0 - 1),
        "our recovery freed every orphan"
    );
    assert_eq!(sb_field(&ours, "Filesystem state"), "clean");

    // (b) e2fsck's own replay and orphan processing on a copy.
    let theirs = s.0.join("theirs");
    std::fs::write(&theirs, &crashed).unwrap();
    let (code, text) = e2fsck(&theirs, "-fy");
    assert!(code <= 1, "e2fsck -fy exit {code}:\n{text}");
    for bad in ["Unattached", "unattached", "Inode bitmap differences"] {
        assert!(
            !text.contains(bad),
            "e2fsck -fy found leaked inodes:\n{text}"
        );
    }
    fsck_clean(&theirs);
    assert_eq!(
        counts(&theirs),
        (blocks0 - 1, inodes0 - 1),
        "e2fsck's recovery freed every orphan"
    );
}
