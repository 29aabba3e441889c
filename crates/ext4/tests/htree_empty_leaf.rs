//! An htree leaf whose every entry was removed, on a filesystem without
//! metadata_csum: its one free entry (inode 0) spans the whole block, the
//! same two fields an index node's fake entry has (the kernel tells them
//! apart by their place in the tree). Lookups and creates that reach it
//! used to fail with EUCLEAN ("leaf N is an index block"), on our own
//! images and the kernel's; now a block reached as a leaf is an index
//! node only if its count/limit header fits (`looks_like_dx_node`).
//! Found by review, stop 38.

mod common;

use std::path::Path;

use common::*;
use scalevfs::{Errno, O_CREAT, O_WRONLY};

fn creat(t: &scalevfs::Task, p: &str) -> Result<(), Errno> {
    let fd = t.open(p, O_CREAT | O_WRONLY, 0o644)?;
    t.close(fd).unwrap();
    Ok(())
}

fn nocsum_image(dir: &Path) -> std::path::PathBuf {
    let img = dir.join("img");
    mkfs_args(
        &img,
        &["-b", "1024", "-O", "^metadata_csum,^orphan_file"],
        "32M",
    );
    img
}

/// Names made and removed by us: every name goes, then a lookup of a
/// missing name must say ENOENT and a create must work.
#[test]
fn emptied_leaf_without_metadata_csum_still_works() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("emptyleaf-emptyleaf");
    let img = nocsum_image(&s.0);
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    let names: Vec<String> = (0..300).map(|i| format!("name-number-{i:05}")).collect();
    for n in &names {
        creat(&t, &format!("/d/{n}")).unwrap();
    }
    assert!(t.stat("/d").unwrap().size > 4096, "not indexed");
    for n in &names {
        t.unlink(&format!("/d/{n}")).unwrap();
    }
    let look = t.lstat("/d/not-there").map(|_| ());
    let made = creat(&t, "/d/a-new-name");
    let list = t.read_dir("/d").map(|v| v.len());
    eprintln!("lookup: {look:?}, create: {made:?}, listing: {list:?}");
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);
    assert_eq!(look, Err(Errno::ENOENT), "lookup of a missing name");
    assert_eq!(made, Ok(()), "create in the emptied directory");
}

/// The same directory made and emptied by the kernel (its image is what
/// any ext4 without metadata_csum has after an rm of a leaf's names).
#[test]
fn kernel_emptied_leaf_without_metadata_csum_still_works() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("emptyleaf-emptyleaf-k");
    let img = nocsum_image(&s.0);
    {
        let Some(km) = KMount::rw(&img, &s.0.join("mnt")) else {
            return;
        };
        let d = km.0.join("d");
        std::fs::create_dir(&d).unwrap();
        for i in 0..300 {
            std::fs::File::create(d.join(format!("name-number-{i:05}"))).unwrap();
        }
        for i in 0..300 {
            std::fs::remove_file(d.join(format!("name-number-{i:05}"))).unwrap();
        }
        std::fs::File::create(d.join("kept")).unwrap();
    }
    fsck_clean(&img);
    eprintln!(
        "{}",
        debugfs_ro(&img, "htree_dump /d")
            .lines()
            .take(12)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let kept = t.lstat("/d/kept").map(|_| ());
    let look: Vec<_> = (0..50)
        .map(|i| t.lstat(&format!("/d/missing-{i}")).map(|_| ()))
        .filter(|r| *r != Err(Errno::ENOENT))
        .collect();
    let made: Vec<_> = (0..50)
        .map(|i| creat(&t, &format!("/d/made-{i}")))
        .filter(|r| r.is_err())
        .collect();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    assert_eq!(kept, Ok(()));
    assert!(look.is_empty(), "lookups of missing names: {look:?}");
    assert!(made.is_empty(), "creates: {made:?}");
    fsck_clean(&img);
}
