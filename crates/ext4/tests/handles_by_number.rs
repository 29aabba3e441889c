//! File handles on the ext4 type (issue 13; xfstests generic/467, 477,
//! 777): `Filesystem::inode_by_number` finds exactly the inodes that have a
//! name, for every number and any 64-bit value (ESTALE otherwise, never a
//! panic), also after a remount; `Filesystem::get_parent` reads a
//! directory's ".." (linear and htree); and `Task::handle_by_number`
//! connects a directory to the tree where it is now, checking the
//! generation.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::{debugfs_ro, fsck_clean, have_tools, make_image, rw_journaled, Scratch};
use scalevfs::fstype::Filesystem;
use scalevfs::{Errno, Handle, Task, Vfs, AT_FDCWD, O_CREAT, O_WRONLY};
use scalevfs_ext4::Ext4;

/// The inode numbers reachable by name from `/`, the root's included.
fn named(t: &Task) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    let root = t.handle_at(AT_FDCWD, "/", 0).unwrap();
    out.insert(root.getattr().ino);
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for e in d.read_dir(t).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            out.insert(e.ino);
            let h = d.lookup(t, &e.name).unwrap();
            if h.inode().is_dir() {
                stack.push(h);
            }
        }
    }
    out
}

/// The path of a directory handle, climbing ".." (as getcwd does).
fn path_of(t: &Task, h: &Handle) -> String {
    let mut names = Vec::new();
    let mut cur = h.clone();
    while cur.getattr().ino != 2 {
        let up = cur.lookup(t, "..").unwrap();
        let me = cur.getattr().ino;
        let e = up.read_dir(t).unwrap();
        let n = e
            .iter()
            .find(|e| e.ino == me && e.name != b"." && e.name != b"..")
            .unwrap();
        names.push(String::from_utf8(n.name.clone()).unwrap());
        cur = up;
    }
    names.reverse();
    format!("/{}", names.join("/"))
}

/// Every number from 0 past the last inode, and values that do not fit
/// 32 bits (one whose low half is a live inode): found exactly when named.
fn check_every_number(e: &Ext4, t: &Task) {
    let want = named(t);
    let count = u64::from(e.superblock().inodes_count);
    let odd = [
        u64::MAX,
        1 << 32,
        (1 << 32) | 2,
        (1 << 32) | want.iter().next_back().copied().unwrap(),
        u64::from(u32::MAX),
        count + 1,
    ];
    for n in (0..=count + 8).chain(odd) {
        match e.inode_by_number(n) {
            Ok(i) => {
                assert!(want.contains(&n), "inode {n} found but has no name");
                assert_eq!(i.ino(), n);
            }
            Err(err) => {
                assert_eq!(err, Errno::ESTALE, "inode {n}");
                assert!(!want.contains(&n), "named inode {n} not found");
            }
        }
    }
}

fn open(img: &Path) -> (std::sync::Arc<Ext4>, Vfs, Task) {
    let e = Ext4::open(img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    (e, vfs, t)
}

#[test]
fn inodes_by_number_and_directories_by_parent() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("fh");
    let src = s.0.join("src");
    std::fs::create_dir_all(src.join("d/e/f")).unwrap();
    std::fs::create_dir_all(src.join("x")).unwrap();
    // Large enough for e2fsck -D to index it (htree).
    std::fs::create_dir_all(src.join("big")).unwrap();
    for i in 0..400 {
        std::fs::write(src.join(format!("big/entry-with-a-long-name-{i:04}")), b"").unwrap();
    }
    std::fs::create_dir(src.join("big/sub")).unwrap();
    std::fs::write(src.join("d/e/file"), b"data").unwrap();
    let img = s.0.join("img");
    make_image(&src, &img, 1024, "8M", "orphan_file");
    assert!(
        debugfs_ro(&img, "htree_dump /big").contains("Root node dump"),
        "/big is not indexed"
    );

    let (e, vfs, t) = open(&img);
    check_every_number(&e, &t);
    let root = t.handle_at(AT_FDCWD, "/", 0).unwrap();
    let ino = |p: &str| t.stat(p).unwrap().ino;
    let inode = |p: &str| t.handle_at(AT_FDCWD, p, 0).unwrap().inode().clone();
    // Parents: linear directories, an htree one, the root's own.
    let ef = inode("/d/e/f");
    assert_eq!(e.get_parent(&ef).unwrap().ino(), ino("/d/e"));
    assert_eq!(e.get_parent(&inode("/d")).unwrap().ino(), 2);
    assert_eq!(e.get_parent(&inode("/big")).unwrap().ino(), 2);
    assert_eq!(e.get_parent(&inode("/big/sub")).unwrap().ino(), ino("/big"));
    assert_eq!(e.get_parent(&root.inode().clone()).unwrap().ino(), 2);
    assert_eq!(
        e.get_parent(&inode("/d/e/file")).unwrap_err(),
        Errno::ENOTDIR
    );
    // The same inode the walk has; a directory connected in place.
    let fi = e.inode_by_number(ino("/d/e/file")).unwrap();
    assert!(std::sync::Arc::ptr_eq(&fi, &inode("/d/e/file")));
    let g = ef.generation();
    drop(ef);
    let h = t.handle_by_number(&root, ino("/d/e/f"), Some(g)).unwrap();
    assert_eq!(path_of(&t, &h), "/d/e/f");
    drop(h);
    // A move to another parent rewrites ".."; an unlinked file is stale.
    t.rename("/d/e", "/x/e").unwrap();
    let f_ino = ino("/x/e/f");
    assert_eq!(
        path_of(&t, &t.handle_by_number(&root, f_ino, None).unwrap()),
        "/x/e/f"
    );
    let fd = t.open("/gone", O_CREAT | O_WRONLY, 0o644).unwrap();
    let gone = ino("/gone");
    t.unlink("/gone").unwrap();
    assert_eq!(e.inode_by_number(gone).unwrap_err(), Errno::ESTALE);
    t.close(fd).unwrap();
    let file = ino("/x/e/file");
    drop((root, t, vfs));
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);

    // A new instance (a new daemon): the same answers from the image.
    let (e, _vfs, t) = open(&img);
    check_every_number(&e, &t);
    let root = t.handle_at(AT_FDCWD, "/", 0).unwrap();
    let h = t.handle_by_number(&root, f_ino, Some(g)).unwrap();
    assert_eq!(path_of(&t, &h), "/x/e/f");
    assert_eq!(
        t.handle_by_number(&root, f_ino, Some(g.wrapping_add(1)))
            .unwrap_err(),
        Errno::ESTALE,
        "another generation"
    );
    assert_eq!(
        t.handle_by_number(&root, gone, None).unwrap_err(),
        Errno::ESTALE
    );
    let hf = t.handle_by_number(&root, file, None).unwrap();
    assert_eq!(hf.getattr().size, 4);
}

/// A number freed and given to the next file at once (the allocator takes
/// the lowest free slot) comes with another generation, so a handle of
/// the removed file is stale rather than the new file's. The generation
/// was a hash of the number and the coarse clock's nanoseconds, equal for
/// every create of one clock tick.
#[test]
fn a_reused_number_gets_another_generation() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("hgen");
    let img = s.0.join("img");
    std::fs::create_dir_all(s.0.join("src")).unwrap();
    make_image(&s.0.join("src"), &img, 4096, "16M", "");
    let (e, _vfs, t) = open(&img);
    let root = t.handle_at(AT_FDCWD, "/", 0).unwrap();
    let (mut same, mut reused) = (0, 0);
    for _ in 0..50 {
        let fd = t.open("/f", O_CREAT | O_WRONLY, 0o644).unwrap();
        t.close(fd).unwrap();
        let old = t.handle_at(AT_FDCWD, "/f", 0).unwrap().inode().clone();
        let (ino, gen) = (old.ino(), old.generation());
        drop(old);
        t.unlink("/f").unwrap();
        // The inode goes when its last reference does (a deferred free).
        scalevfs::flush_deferred_frees();
        e.commit().unwrap();
        let fd = t.open("/g", O_CREAT | O_WRONLY, 0o644).unwrap();
        t.close(fd).unwrap();
        let new = t.handle_at(AT_FDCWD, "/g", 0).unwrap().inode().clone();
        if new.ino() == ino {
            reused += 1;
            if new.generation() == gen {
                same += 1;
            }
            assert_eq!(
                t.handle_by_number(&root, ino, Some(gen))
                    .map(|h| h.inode().ino())
                    .unwrap_err(),
                Errno::ESTALE,
                "the old file's handle opened the new file"
            );
        }
        drop(new);
        t.unlink("/g").unwrap();
        scalevfs::flush_deferred_frees();
        e.commit().unwrap();
    }
    assert!(reused > 0, "no number was reused: the test tests nothing");
    assert_eq!(
        same, 0,
        "numbers reused with their generation ({reused} reused)"
    );
}
