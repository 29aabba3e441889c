//! ext2/3-style (block-mapped) inodes on a read-write mount:
//! - an image without the extent feature is refused read-write (new files
//!   would be extent-mapped, which its readers reject), with a message
//!   that names the way out;
//! - on an image that got the feature later (`tune2fs -O extent`), its
//!   old block-mapped files and directories are removed with every data
//!   and map block freed: direct, single, double and triple indirect
//!   (a sparse file with one block past 64 MiB), a multi-block directory
//!   and a slow symlink. Before, their blocks stayed allocated, which
//!   e2fsck reports as block bitmap differences.

mod common;

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use common::*;
use scalevfs::{Filesystem, Vfs, VfsConfig};
use scalevfs_ext4::{Ext4, Ext4Options};

fn rw() -> Ext4Options {
    Ext4Options {
        ro: false,
        ..Ext4Options::default()
    }
}

#[test]
fn block_mapped_files_are_freed_whole() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("blockmap");
    let src = s.0.join("src");
    std::fs::create_dir_all(src.join("dir")).unwrap();
    let kib = |n: usize| vec![0x5au8; n * 1024];
    std::fs::write(src.join("direct"), kib(5)).unwrap();
    std::fs::write(src.join("single"), kib(100)).unwrap();
    std::fs::write(src.join("double"), kib(600)).unwrap();
    {
        let f = std::fs::File::create(src.join("triple")).unwrap();
        f.write_all_at(b"x", 0).unwrap();
        f.write_all_at(&kib(1), 70 << 20).unwrap();
    }
    for i in 0..200 {
        std::fs::write(
            src.join("dir")
                .join(format!("entry-{i:04}-{}", "n".repeat(40))),
            b"",
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("t".repeat(300), src.join("slow")).unwrap();
    let img = s.0.join("img");
    make_image(
        &src,
        &img,
        1024,
        "32M",
        "^extent,^64bit,^flex_bg,^metadata_csum",
    );
    // Read-write without the feature: refused, the image untouched.
    let before = std::fs::read(&img).unwrap();
    let Err(err) = Ext4::open(&img, rw()) else {
        panic!("opened read-write");
    };
    assert!(format!("{err}").contains("tune2fs -O extent"), "{err}");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refused open wrote"
    );
    tool_ok("tune2fs", &["-O", "extent"], &img);
    fsck_clean(&img);
    let blocks = |what: &str| {
        let e = Ext4::open(&img, Ext4Options::default()).unwrap();
        let fsd: Arc<dyn Filesystem> = e;
        let vfs = Vfs::with_root_fs(VfsConfig::default(), fsd);
        let st = vfs.root_task().statfs("/").unwrap();
        eprintln!("{what}: {} free blocks", st.bfree);
        st.bfree
    };
    let full = blocks("populated");
    {
        let e = Ext4::open(&img, rw()).unwrap();
        let fsd: Arc<dyn Filesystem> = e.clone();
        let vfs = Vfs::with_root_fs(VfsConfig::default(), fsd);
        let t = vfs.root_task();
        for f in ["direct", "single", "double", "triple", "slow"] {
            t.unlink(&format!("/{f}")).unwrap();
        }
        for i in 0..200 {
            t.unlink(&format!("/dir/entry-{i:04}-{}", "n".repeat(40)))
                .unwrap();
        }
        t.rmdir("/dir").unwrap();
        drop(t);
        drop(vfs);
        e.unmount().unwrap();
    }
    fsck_clean(&img);
    // 5 + 100 + 600 data blocks and their maps, 2 + 4 of the sparse file,
    // the directory's blocks, the symlink's: well over 700 come back.
    let empty = blocks("emptied");
    assert!(empty >= full + 700, "{full} -> {empty} free blocks");
    let Some(km) = KMount::new(&img, &s.0.join("mnt")) else {
        return;
    };
    let left: Vec<_> = std::fs::read_dir(&km.0)
        .unwrap()
        .map(|d| d.unwrap().file_name())
        .collect();
    assert_eq!(left, ["lost+found"], "the kernel lists other names");
}
