//! When the superblock goes into the journal. Its free totals, write time
//! and kbytes written may lag on disk, as the kernel lets them (e2fsck
//! recounts the totals from the group descriptors), so an fsync's commit
//! does not carry it; a sync, the orphan list's head and the unmount do.
//!
//! Each check takes the image as a crash would leave it at that point
//! (the device's bytes, no unmount), replays it with e2fsck (the referee)
//! and reads the superblock with dumpe2fs.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{e2fsck, fresh, fresh_list, have_tools, rw_journaled, sb_field, Scratch};
use scalevfs::{Vfs, O_CREAT, O_RDWR, O_WRONLY};
use scalevfs_ext4::{journal, BlockDevice, Ext4, FileDevice, MemDevice};

/// The image as a crash now would leave it, its journal replayed by
/// e2fsck and nothing else (a full `-fy` would also recount the totals).
fn crashed_and_replayed(dev: &MemDevice, at: &Path) {
    let mut b = vec![0u8; dev.size() as usize];
    dev.read_at(0, &mut b).unwrap();
    std::fs::write(at, &b).unwrap();
    let out = std::process::Command::new(common::tool("e2fsck"))
        .args(["-y", "-E", "journal_only"])
        .arg(at)
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    assert!(
        code == 0 || code == 1,
        "e2fsck -E journal_only exit {code}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

fn free_inodes(img: &Path) -> u64 {
    sb_field(img, "Free inodes").parse().unwrap()
}

#[test]
fn fsync_commits_leave_the_superblock_and_a_sync_logs_it() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("sblog");
    let img = fresh(&s.0, 4096, "32M");
    let before = free_inodes(&img);
    let dev = Arc::new(MemDevice::new(std::fs::read(&img).unwrap()));
    let e = Ext4::open_device(Box::new(dev.clone()), rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    // The mount's first commit logs the superblock (none logged yet).
    let fd = t.open("/first", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    let at = s.0.join("crash.img");
    crashed_and_replayed(&dev, &at);
    let logged = free_inodes(&at);
    assert_eq!(logged, before - 1, "the first commit logs the superblock");
    // Ten more fsync'ed creates, well within the refresh interval: the
    // files are there after the crash, the superblock's total is not.
    let t0 = std::time::Instant::now();
    for k in 0..10 {
        let fd = t
            .open(&format!("/f{k}"), O_CREAT | O_WRONLY, 0o644)
            .unwrap();
        t.write(fd, b"x").unwrap();
        t.fsync(fd).unwrap();
        t.close(fd).unwrap();
    }
    crashed_and_replayed(&dev, &at);
    let lagging = free_inodes(&at);
    // The refresh (1 s) may have come due on a slow machine.
    if t0.elapsed() < std::time::Duration::from_millis(900) {
        assert_eq!(lagging, logged, "an fsync's commit logged the superblock");
    } else {
        eprintln!("slow machine: the lag is not checked");
    }
    for k in 0..10 {
        assert!(t.stat(&format!("/f{k}")).is_ok());
    }
    // A sync brings the total on disk up to date.
    e.sync().unwrap();
    crashed_and_replayed(&dev, &at);
    assert_eq!(free_inodes(&at), before - 11, "a sync logs the superblock");
    // A full check of that crash image: clean once e2fsck has done what
    // it does after any crash of a mounted image (the orphan file's
    // feature flag, set while mounted).
    let (code, text) = e2fsck(&at, "-fy");
    assert!(code == 0 || code == 1, "e2fsck -fy exit {code}:\n{text}");
    assert!(!text.contains("count wrong"), "{text}");
    let (code, text) = e2fsck(&at, "-fn");
    assert_eq!(code, 0, "{text}");
    drop(vfs);
    e.unmount().unwrap();
}

/// The orphan list's head is in the superblock: the commit that links an
/// inode in must carry it, refresh interval or not.
#[test]
fn the_orphan_lists_head_goes_with_its_commit() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("sborphan");
    let img = fresh_list(&s.0, 4096, "32M");
    let dev = Arc::new(MemDevice::new(std::fs::read(&img).unwrap()));
    let e = Ext4::open_device(Box::new(dev.clone()), rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fd = t.open("/a", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    // Unlinked while open: on the orphan list; the fsync commits it.
    let fd = t.open("/victim", O_CREAT | O_RDWR, 0o644).unwrap();
    t.write(fd, &[7u8; 8192]).unwrap();
    t.fsync(fd).unwrap();
    let ino = t.fstat(fd).unwrap().ino;
    t.unlink("/victim").unwrap();
    t.fsync(fd).unwrap();
    let mut b = vec![0u8; dev.size() as usize];
    dev.read_at(0, &mut b).unwrap();
    let at = s.0.join("crash.img");
    std::fs::write(&at, &b).unwrap();
    // Replayed (ours; `journal.rs` checks it against e2fsck's), the
    // superblock names the inode as the list's head.
    {
        let d: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&at, true).unwrap());
        journal::recover(&d).unwrap();
    }
    assert_eq!(sb_field(&at, "First orphan inode"), ino.to_string());
    // And e2fsck frees it as an orphan, not as an unattached inode.
    let (code, text) = e2fsck(&at, "-fy");
    assert!(code == 0 || code == 1, "e2fsck -fy exit {code}:\n{text}");
    assert!(!text.contains("Unattached"), "{text}");
    let (code, text) = e2fsck(&at, "-fn");
    assert_eq!(code, 0, "clean after the orphan was freed:\n{text}");
    t.close(fd).unwrap();
    drop(vfs);
    e.unmount().unwrap();
}
