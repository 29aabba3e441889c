//! O_TMPFILE on ext4 (the kernel's `ext4_tmpfile`): an unnamed regular
//! file that is an orphan from birth. Written and closed without a name,
//! it is freed (inode and blocks back); given a name by linkat
//! (AT_EMPTY_PATH) it is an ordinary file the kernel reads; opened with
//! O_EXCL it cannot be named; a crash while one is open leaves an orphan
//! that recovery frees. e2fsck passes after each.

mod common;

use common::*;
use scalevfs::{Errno, AT_EMPTY_PATH, AT_FDCWD, O_EXCL, O_RDONLY, O_RDWR, O_TMPFILE};

fn free_counts(t: &scalevfs::Task) -> (u64, u64) {
    let st = t.statfs("/").unwrap();
    (st.bfree, st.ffree)
}

/// The free (blocks, inodes) once the last close's deferred release has
/// run and committed: the VFS lets an inode go after a grace period that
/// another thread (a test running beside this one) may hold open a while,
/// so wait up to 5 s for `want`, then return what there is.
fn settled(e: &scalevfs_ext4::Ext4, t: &scalevfs::Task, want: (u64, u64)) -> (u64, u64) {
    let mut now = (0, 0);
    for _ in 0..500 {
        scalevfs::flush_deferred_frees();
        e.sync().unwrap();
        now = free_counts(t);
        if now == want {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    now
}

#[test]
fn unnamed_files_are_freed_or_named() {
    let Some((s, img, e, vfs)) = mount_fresh("tmpfile", "32M") else {
        return;
    };
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    e.sync().unwrap();
    let before = free_counts(&t);
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7) as u8).collect();

    // Written and closed without a name: everything comes back.
    let fd = t.open("/d", O_TMPFILE | O_RDWR, 0o600).unwrap();
    t.write(fd, &data).unwrap();
    assert_eq!(t.fstat(fd).unwrap().nlink, 0);
    assert!(free_counts(&t).0 < before.0, "the data took blocks");
    t.close(fd).unwrap();
    assert_eq!(
        settled(&e, &t, before),
        before,
        "an unnamed file closed is freed"
    );
    assert_eq!(
        t.getdents(t.open("/d", O_RDONLY, 0).unwrap(), 64)
            .unwrap()
            .len(),
        2
    );

    // Named by linkat: a file like any other.
    let fd = t.open("/d", O_TMPFILE | O_RDWR, 0o640).unwrap();
    t.write(fd, &data).unwrap();
    t.linkat(fd, "", AT_FDCWD, "/d/named", AT_EMPTY_PATH)
        .unwrap();
    assert_eq!(t.fstat(fd).unwrap().nlink, 1);
    // Back in the inode cache: its number gives this inode, not a second
    // copy read from the image (which would miss the write below).
    let by_number = e.iget(t.fstat(fd).unwrap().ino as u32).unwrap();
    t.write(fd, b"more").unwrap();
    assert_eq!(by_number.attr().size, 20_004, "one inode per number");
    drop(by_number);
    t.close(fd).unwrap();
    let st = t.stat("/d/named").unwrap();
    assert_eq!((st.nlink, st.size, st.mode & 0o7777), (1, 20_004, 0o640));

    // O_EXCL: never named.
    let fd = t.open("/d", O_TMPFILE | O_RDWR | O_EXCL, 0o600).unwrap();
    t.write(fd, b"x").unwrap();
    assert_eq!(
        t.linkat(fd, "", AT_FDCWD, "/d/excl", AT_EMPTY_PATH),
        Err(Errno::ENOENT)
    );
    t.close(fd).unwrap();

    // Named, then its name removed while still open: freed at close.
    let fd = t.open("/d", O_TMPFILE | O_RDWR, 0o600).unwrap();
    t.write(fd, &data).unwrap();
    t.linkat(fd, "", AT_FDCWD, "/d/brief", AT_EMPTY_PATH)
        .unwrap();
    t.unlink("/d/brief").unwrap();
    t.close(fd).unwrap();
    let named = (before.0 - 20, before.1 - 1);
    assert_eq!(
        settled(&e, &t, named),
        named,
        "only /d/named holds an inode and its 20 blocks"
    );
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);

    // Our remount and the kernel read the named one.
    let (e, vfs) = mount(&img);
    let mut want = data.clone();
    want.extend_from_slice(b"more");
    assert_eq!(
        scalevfs::fs::Fs::new(vfs.root_task())
            .read("/d/named")
            .unwrap(),
        want
    );
    drop(vfs);
    e.unmount().unwrap();
    if let Some(km) = KMount::new(&img, &s.0.join("mnt")) {
        assert_eq!(std::fs::read(km.0.join("d/named")).unwrap(), want);
        let names: Vec<_> = std::fs::read_dir(km.0.join("d"))
            .unwrap()
            .map(|d| d.unwrap().file_name())
            .collect();
        assert_eq!(names, ["named"]);
    }
}

/// A crash while an unnamed file is open (its creation and data
/// committed): recovery frees it, as the orphan it is, and e2fsck (which
/// replays and frees it its own way) agrees.
#[test]
fn a_crash_with_an_unnamed_file_open_frees_it() {
    let Some((s, img, e, vfs)) = mount_fresh("tmpfile-crash", "32M") else {
        return;
    };
    let t = vfs.root_task();
    e.sync().unwrap();
    let before = free_counts(&t);
    let fd = t.open("/", O_TMPFILE | O_RDWR, 0o600).unwrap();
    t.write(fd, &vec![0xAB; 50_000]).unwrap();
    t.fsync(fd).unwrap();
    // The crash: the image as the device holds it now.
    let crashed = std::fs::read(&img).unwrap();
    t.close(fd).unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    assert!(
        crashed[1024 + 0x60] & 4 != 0,
        "the crash image needs recovery"
    );
    let (after, ()) = recover(crashed.clone(), |_| ());
    let ours = s.0.join("ours");
    std::fs::write(&ours, &after).unwrap();
    fsck_clean(&ours);
    // The recovered image, read back: the unnamed file's inode and blocks
    // are free again (blocks freed at mount are free once committed).
    let e = scalevfs_ext4::Ext4::open(&ours, scalevfs_ext4::Ext4Options::default()).unwrap();
    let v = scalevfs::Vfs::with_root_fs(Default::default(), e);
    assert_eq!(
        free_counts(&v.root_task()),
        before,
        "recovery freed the unnamed file"
    );
    drop(v);
    let theirs = s.0.join("theirs");
    std::fs::write(&theirs, &crashed).unwrap();
    let (code, text) = e2fsck(&theirs, "-fy");
    assert!(code <= 1, "e2fsck -fy exit {code}:\n{text}");
    fsck_clean(&theirs);
}
