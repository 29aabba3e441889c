//! ext2/3-style (block-mapped) inodes on a read-write mount:
//! - an image without the extent feature mounts read-write, and its
//!   block-mapped files and directories are removed with every data
//!   and map block freed: direct, single, double and triple indirect
//!   (a sparse file with one block past 64 MiB), a multi-block directory
//!   and a slow symlink. Before, their blocks stayed allocated, which
//!   e2fsck reports as block bitmap differences;
//! - on an image that got the feature later (`tune2fs -O extent`), old
//!   block-mapped files keep their maps when changed.

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
    // No extent feature: read-write all the same (block-mapped writes).
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

/// Every file under `root` (the host's view): path -> content.
fn host_files(root: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    host_tree(root)
        .into_iter()
        .filter(|(_, n)| n.content.is_some())
        .map(|(k, _)| {
            let c = std::fs::read(root.join(k.trim_start_matches('/'))).unwrap();
            (k, c)
        })
        .filter(|(k, _)| !k.starts_with("/lost+found"))
        .collect()
}

/// Whether debugfs shows `path` of `img` mapped by extents.
fn has_extents(img: &std::path::Path, path: &str) -> bool {
    let out = debugfs_ro(img, &format!("stat {path}"));
    assert!(out.contains("Inode:"), "debugfs stat {path}: {out}");
    out.contains("EXTENTS:")
}

/// Changing an ext2/3-style file or directory on an image upgraded with
/// `tune2fs -O extent` keeps its block map, as the kernel's ext4 does:
/// appends, overwrites, truncates, punches and writes into holes of files
/// using direct, single, double and triple indirect blocks, and a
/// directory that grows by hundreds of names (and becomes indexed).
/// debugfs still sees every old inode block-mapped (the new files are
/// extent-mapped), e2fsck passes, and scalevfs and the kernel read back
/// the same bytes as the host copy the same changes were made to. 1 KiB
/// blocks without checksums, and 4 KiB blocks with metadata_csum.
#[test]
fn block_mapped_files_keep_their_maps_when_changed() {
    if !have_tools() {
        return;
    }
    for (bs, features) in [
        (1024, "^extent,^64bit,^flex_bg,^metadata_csum"),
        (4096, "^extent,^64bit"),
    ] {
        let s = Scratch::new(&format!("blockmap-migrate-{bs}"));
        let src = s.0.join("src");
        std::fs::create_dir_all(src.join("dir")).unwrap();
        let pat = |n: usize, k: u8| -> Vec<u8> { (0..n).map(|i| (i % 251) as u8 ^ k).collect() };
        std::fs::write(src.join("direct"), pat(5 * 1024, 1)).unwrap();
        std::fs::write(src.join("single"), pat(100 * 1024, 2)).unwrap();
        std::fs::write(src.join("double"), pat(600 * 1024, 3)).unwrap();
        std::fs::write(src.join("keep"), pat(300 * 1024, 4)).unwrap();
        std::fs::write(src.join("punched"), pat(200 * 1024, 8)).unwrap();
        {
            let f = std::fs::File::create(src.join("triple")).unwrap();
            f.write_all_at(b"x", 0).unwrap();
            f.write_all_at(&pat(1024, 5), 70 << 20).unwrap();
        }
        for i in 0..100 {
            std::fs::write(src.join("dir").join(format!("old-{i:04}")), b"o").unwrap();
        }
        let img = s.0.join("img");
        make_image(&src, &img, bs, "128M", features);
        tool_ok("tune2fs", &["-O", "extent"], &img);
        fsck_clean(&img);
        for f in [
            "/direct", "/single", "/double", "/triple", "/keep", "/punched", "/dir",
        ] {
            assert!(!has_extents(&img, f), "{f} starts block-mapped");
        }
        // The same changes on the host copy (the model) and through scalevfs.
        let append = pat(3 * 1024, 6);
        let patch = b"overwritten here".to_vec();
        let hole = pat(2048, 7);
        let new_name = |i: usize| format!("new-{i:04}-{}", "m".repeat(60));
        {
            let open = |p: &str| std::fs::OpenOptions::new().write(true).open(src.join(p));
            open("direct")
                .unwrap()
                .write_all_at(&append, 5 * 1024)
                .unwrap();
            open("single")
                .unwrap()
                .write_all_at(&patch, 50 * 1024 + 7)
                .unwrap();
            open("double").unwrap().set_len(300 * 1024 + 100).unwrap();
            open("triple")
                .unwrap()
                .write_all_at(&hole, 40 << 20)
                .unwrap();
            {
                use std::os::unix::io::AsRawFd;
                let f = open("punched").unwrap();
                let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                // SAFETY: a plain syscall on an open descriptor.
                let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, 64 * 1024, 64 * 1024) };
                assert_eq!(r, 0, "punch on the host");
            }
            for i in 0..400 {
                std::fs::write(src.join("dir").join(new_name(i)), b"n").unwrap();
            }
        }
        let expect = host_files(&src);
        {
            let (e, vfs) = mount(&img);
            let t = vfs.root_task();
            use scalevfs::{O_CREAT, O_WRONLY};
            let fd = t.open("/direct", O_WRONLY, 0).unwrap();
            assert_eq!(t.pwrite(fd, &append, 5 * 1024).unwrap(), append.len());
            t.close(fd).unwrap();
            let fd = t.open("/single", O_WRONLY, 0).unwrap();
            assert_eq!(t.pwrite(fd, &patch, 50 * 1024 + 7).unwrap(), patch.len());
            t.close(fd).unwrap();
            t.truncate("/double", 300 * 1024 + 100).unwrap();
            let fd = t.open("/triple", O_WRONLY, 0).unwrap();
            assert_eq!(t.pwrite(fd, &hole, 40 << 20).unwrap(), hole.len());
            t.close(fd).unwrap();
            let fd = t.open("/punched", O_WRONLY, 0).unwrap();
            let punch = scalevfs::io::FALLOC_FL_PUNCH_HOLE | scalevfs::io::FALLOC_FL_KEEP_SIZE;
            t.fallocate(fd, punch, 64 * 1024, 64 * 1024).unwrap();
            t.close(fd).unwrap();
            // Preallocation stays extent-only, as in the kernel's ext4.
            let fd = t.open("/keep", O_WRONLY, 0).unwrap();
            assert_eq!(
                t.fallocate(fd, 0, 0, 1 << 20).unwrap_err(),
                scalevfs::Errno::EOPNOTSUPP
            );
            t.close(fd).unwrap();
            for i in 0..400 {
                let fd = t
                    .open(&format!("/dir/{}", new_name(i)), O_CREAT | O_WRONLY, 0o644)
                    .unwrap();
                t.write(fd, b"n").unwrap();
                t.close(fd).unwrap();
            }
            drop(t);
            drop(vfs);
            e.unmount().unwrap();
        }
        fsck_clean(&img);
        for f in [
            "/direct", "/single", "/double", "/triple", "/keep", "/punched", "/dir",
        ] {
            assert!(!has_extents(&img, f), "{f} stays block-mapped");
        }
        assert!(
            has_extents(&img, &format!("/dir/{}", new_name(0))),
            "a new file is extent-mapped"
        );
        let dir = debugfs_ro(&img, "stat /dir");
        assert!(dir.contains("Flags: 0x1000"), "/dir is indexed: {dir}");
        // scalevfs reads back what the host copy holds.
        let e = Ext4::open(&img, Ext4Options::default()).unwrap();
        let vfs = Vfs::with_root_fs(VfsConfig::default(), e);
        let fs = scalevfs::fs::Fs::new(vfs.root_task());
        let ours: std::collections::BTreeMap<String, Vec<u8>> = vfs_tree(&fs)
            .into_iter()
            .filter(|(_, n)| n.content.is_some())
            .map(|(k, _)| {
                let c = fs.read(&k).unwrap();
                (k, c)
            })
            .collect();
        assert_eq!(ours.len(), expect.len(), "bs {bs}: the same files");
        for (k, v) in &expect {
            assert!(ours.get(k) == Some(v), "bs {bs}: {k} differs");
        }
        drop(fs);
        drop(vfs);
        // And so does the kernel.
        let Some(km) = KMount::new(&img, &s.0.join("mnt")) else {
            continue;
        };
        let theirs = host_files(&km.0);
        assert_eq!(theirs.len(), expect.len(), "bs {bs}: the kernel's files");
        for (k, v) in &expect {
            assert!(
                theirs.get(k) == Some(v),
                "bs {bs}: the kernel reads {k} differently"
            );
        }
    }
}
