//! Writing into trees others made: an image from `mke2fs -d` whose large
//! directory `e2fsck -fyD` indexed (an htree we did not build) is mounted
//! read-write; we add and remove names in the indexed directory, rename
//! across directories (the indexed directory itself included), append to
//! and truncate existing files (a fragmented
//! one with a deep extent tree included), then unmount. e2fsck -fn passes,
//! and the kernel (loop, read-only) sees exactly the tree our own VFS saw
//! before the unmount.

mod common;

use std::sync::Arc;

use common::*;
use scalevfs::fs::Fs;
use scalevfs::{Filesystem, Vfs, VfsConfig};
use scalevfs_ext4::{Ext4, Ext4Options};

fn check(bs: usize) {
    if !have_tools() || !have_e2fsck() {
        return;
    }
    let s = Scratch::new("rwinterop");
    let src = s.0.join("src");
    build_tree(&src, 1500, 60, bs);
    let img = s.0.join("img");
    make_image(&src, &img, bs, "64M", "orphan_file");
    let e = Ext4::open(
        &img,
        Ext4Options {
            ro: false,
            ..Ext4Options::default()
        },
    )
    .unwrap();
    let fsd: Arc<dyn Filesystem> = e.clone();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fsd);
    let fs = Fs::new(vfs.root_task());
    // The big directory is indexed (e2fsck -D): insert and remove there.
    for i in 0..600 {
        fs.write(format!("/big/new-{i:04}"), format!("n{i}"))
            .unwrap();
    }
    let names: Vec<String> = fs
        .read_dir("/big")
        .unwrap()
        .map(|d| d.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("entry-"))
        .collect();
    for n in names.iter().step_by(3) {
        fs.remove_file(format!("/big/{n}")).unwrap();
    }
    fs.rename(format!("/big/{}", names[1]), "/a/b/moved")
        .unwrap();
    fs.rename("/a/b/c", "/big/c-moved").unwrap();
    // The indexed directory itself moves to another parent (its ".." is
    // in the dx_root).
    fs.rename("/big", "/a/big-moved").unwrap();
    fs.write("/a/big-moved/after-move", b"x").unwrap();
    {
        use std::io::Write;
        let mut f = fs.options().append(true).open("/small.txt").unwrap();
        f.write_all(b"appended\n").unwrap();
    }
    fs.options()
        .write(true)
        .open("/frag")
        .unwrap()
        .set_len((30 * bs + 123) as u64)
        .unwrap();
    let ours = vfs_tree(&fs);
    e.unmount().unwrap();
    drop(fs);
    drop(vfs);
    drop(e);
    fsck_clean(&img);
    let Some(km) = KMount::new(&img, &s.0.join("mnt")) else {
        return;
    };
    let mut k = host_tree(&km.0);
    k.remove("/lost+found");
    let mut ours_s = ours;
    // host_tree keeps whole-second mtimes only.
    for n in ours_s.values_mut() {
        n.mtime.1 = 0;
    }
    for n in k.values_mut() {
        n.mtime.1 = 0;
    }
    assert_eq!(k.len(), ours_s.len());
    for (a, b) in k.iter().zip(ours_s.iter()) {
        assert_eq!(a, b);
    }
}

#[test]
fn indexed_directory_from_e2fsck_written_4k() {
    check(4096);
}

#[test]
fn indexed_directory_from_e2fsck_written_1k() {
    check(1024);
}
