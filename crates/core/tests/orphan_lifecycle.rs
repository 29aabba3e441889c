//! Orphans: an unlinked-but-open file lives on the orphan file until its last
//! close, which frees the inode; O_TMPFILE is an orphan from birth; rename
//! over an open file orphans the victim; truncate registers for its duration;
//! every variant (lockless, locked, none) and the overflow list work.

use scalevfs::*;

fn vfs_with(variant: &str, blocks: &str) -> Vfs {
    let mut c = VfsConfig::default();
    c.set("orphan", variant).unwrap();
    c.set("orphan-blocks", blocks).unwrap();
    Vfs::with_config(c)
}

/// Flush deferred frees until `cond` holds (other test threads may hold
/// the epoch back for a moment) or two seconds pass.
fn eventually(vfs: &Vfs, cond: impl Fn() -> bool) -> bool {
    for _ in 0..2000 {
        vfs.flush_deferred();
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    false
}

/// Live inodes once deferred frees have run, expecting `want`.
fn live_is(vfs: &Vfs, fs: &MemFs, want: i64) -> bool {
    eventually(vfs, || fs.live_inodes() == want)
}

fn live(vfs: &Vfs, fs: &MemFs) -> i64 {
    vfs.flush_deferred();
    fs.live_inodes()
}

/// A fresh memfs mounted at /m (its own inode counter).
fn mount_m(vfs: &Vfs, t: &Task) -> std::sync::Arc<MemFs> {
    t.mkdir("/m", 0o755).unwrap();
    let m = std::sync::Arc::new(MemFs::new(vfs.new_dev(), MemFsOptions::default()));
    let fs: std::sync::Arc<dyn Filesystem> = m.clone();
    t.mount("/m", fs, false).unwrap();
    m
}

fn orphans_of(t: &Task, fd: i32) -> Vec<u64> {
    t.files()
        .get_arc(fd)
        .unwrap()
        .path()
        .mnt
        .sb()
        .orphans
        .orphans()
}

#[test]
fn unlink_open_write_read_close_frees_inode() {
    for variant in ["lockless", "locked", "none"] {
        let vfs = vfs_with(variant, "0");
        let t = vfs.root_task();
        let fs = mount_m(&vfs, &t);
        let base = live(&vfs, &fs);
        let fd = t.open("/m/f", O_CREAT | O_RDWR, 0o644).unwrap();
        let ino = t.fstat(fd).unwrap().ino;
        assert_eq!(live(&vfs, &fs), base + 1);
        t.unlink("/m/f").unwrap();
        assert_eq!(t.stat("/m/f"), Err(Errno::ENOENT));
        let expect = if variant == "none" { vec![] } else { vec![ino] };
        assert_eq!(orphans_of(&t, fd), expect, "{variant}");
        assert_eq!(t.write(fd, b"still here").unwrap(), 10);
        let mut b = [0u8; 10];
        assert_eq!(t.pread(fd, &mut b, 0).unwrap(), 10);
        assert_eq!(&b, b"still here");
        assert_eq!(t.fstat(fd).unwrap().nlink, 0);
        let dup = t.dup(fd).unwrap();
        t.close(fd).unwrap();
        vfs.flush_deferred();
        assert_eq!(fs.live_inodes(), base + 1, "a dup keeps it open");
        let sb = t.files().get_arc(dup).unwrap().path().mnt.sb().clone();
        t.close(dup).unwrap();
        assert!(
            live_is(&vfs, &fs, base),
            "{variant}: last close frees the inode"
        );
        assert!(eventually(&vfs, || sb.orphans.is_empty()), "{variant}");
    }
}

#[test]
fn tmpfile_is_orphan_from_birth() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let fs = mount_m(&vfs, &t);
    let base = live(&vfs, &fs);
    let fd = t.open("/m", O_TMPFILE | O_RDWR, 0o600).unwrap();
    let ino = t.fstat(fd).unwrap().ino;
    assert_eq!(orphans_of(&t, fd), vec![ino]);
    t.write(fd, &vec![7u8; 100_000]).unwrap();
    assert_eq!(live(&vfs, &fs), base + 1);
    let sb = t.files().get_arc(fd).unwrap().path().mnt.sb().clone();
    t.close(fd).unwrap();
    assert!(live_is(&vfs, &fs, base));
    assert!(eventually(&vfs, || sb.orphans.is_empty()));
    assert_eq!(fs.statfs().bfree, fs.statfs().blocks, "pages freed");
}

#[test]
fn rename_over_open_file_orphans_victim() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let a = t.open("/a", O_CREAT | O_RDWR, 0o644).unwrap();
    let b = t.open("/b", O_CREAT | O_RDWR, 0o644).unwrap();
    let bino = t.fstat(b).unwrap().ino;
    t.rename("/a", "/b").unwrap();
    assert_eq!(orphans_of(&t, a), vec![bino]);
    t.close(b).unwrap();
    assert!(eventually(&vfs, || orphans_of(&t, a).is_empty()));
    // /b now names a's inode, still open through `a`.
    let aino = t.fstat(a).unwrap().ino;
    t.unlink("/b").unwrap();
    assert_eq!(orphans_of(&t, a), vec![aino]);
    // Unlinking a closed file records nothing (once its close has finished:
    // the description is freed after an epoch grace period).
    let c = t.open("/c", O_CREAT | O_RDWR, 0o644).unwrap();
    t.close(c).unwrap();
    t.unlink("/c").unwrap();
    assert!(eventually(&vfs, || orphans_of(&t, a) == vec![aino]));
    let sb = t.files().get_arc(a).unwrap().path().mnt.sb().clone();
    t.close(a).unwrap();
    assert!(eventually(&vfs, || sb.orphans.is_empty()));
}

#[test]
fn full_orphan_file_falls_back_to_list() {
    let vfs = vfs_with("lockless", "1");
    let t = vfs.root_task();
    t.files().set_max(4096).unwrap();
    let n = scalevfs_orphan_slots() + 5;
    let fds: Vec<i32> = (0..n)
        .map(|i| {
            let p = format!("/f{i}");
            let fd = t.open(&p, O_CREAT | O_RDWR, 0o644).unwrap();
            t.unlink(&p).unwrap();
            fd
        })
        .collect();
    let sb = t.files().get_arc(fds[0]).unwrap().path().mnt.sb().clone();
    assert_eq!(sb.orphans.overflow_len(), 5);
    assert_eq!(sb.orphans.orphans().len(), n);
    for fd in fds {
        t.close(fd).unwrap();
    }
    assert!(eventually(&vfs, || sb.orphans.is_empty()));
}

fn scalevfs_orphan_slots() -> usize {
    (4096 - 8) / 4
}

#[test]
fn truncate_is_registered_only_while_it_runs() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    t.write(fd, &[1u8; 10_000]).unwrap();
    for size in (0..10_000).rev().step_by(97) {
        t.ftruncate(fd, size).unwrap();
    }
    assert!(orphans_of(&t, fd).is_empty());
    assert_eq!(t.fstat(fd).unwrap().size, 9_999 % 97);
    t.close(fd).unwrap();
}

/// Many threads unlink their own open files and close them concurrently,
/// while others truncate: the orphan file ends empty and every inode is freed.
#[test]
fn concurrent_unlink_close_truncate_leaves_nothing() {
    for variant in ["lockless", "locked"] {
        let vfs = vfs_with(variant, "2");
        let t = vfs.root_task();
        let fs = mount_m(&vfs, &t);
        let base = live(&vfs, &fs);
        std::thread::scope(|s| {
            for k in 0..4 {
                let t = t.clone_thread();
                s.spawn(move || {
                    for i in 0..300 {
                        let p = format!("/m/t{k}-{i}");
                        let fd = t.open(&p, O_CREAT | O_RDWR, 0o644).unwrap();
                        t.write(fd, b"0123456789").unwrap();
                        let fd2 = t.open(&p, O_RDONLY, 0).unwrap();
                        t.ftruncate(fd, 5).unwrap();
                        t.unlink(&p).unwrap();
                        t.close(fd).unwrap();
                        let mut b = [0u8; 8];
                        assert_eq!(t.pread(fd2, &mut b, 0).unwrap(), 5);
                        t.close(fd2).unwrap();
                    }
                });
            }
        });
        assert!(
            live_is(&vfs, &fs, base),
            "{variant}: {} live, {base} expected",
            fs.live_inodes()
        );
        let fd = t.open("/m", O_RDONLY, 0).unwrap();
        assert!(orphans_of(&t, fd).is_empty(), "{variant}");
        t.close(fd).unwrap();
    }
}
