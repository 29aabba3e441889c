//! Read real ext4 images (made by mke2fs -d from a generated tree) through
//! the library and the VFS, and compare the whole tree with the source.

mod common;

use std::path::Path;
use std::sync::Arc;

use scalevfs::fs::Fs;
use scalevfs::{Filesystem, Vfs, VfsConfig};
use scalevfs_ext4::{Ext4, Ext4Options};

use common::*;

fn open(img: &Path) -> Arc<Ext4> {
    Ext4::open(img, Ext4Options::default()).unwrap_or_else(|e| panic!("open: {e}"))
}

fn compare(bs: usize, features: &str) {
    compare_args(bs, features, &[]);
}

fn compare_args(bs: usize, features: &str, extra: &[&str]) {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("cmp");
    let src = s.0.join("src");
    // One-block fragments: 1500 of them need a depth-2 extent tree at
    // 1 KiB blocks (4 x 84 extents per depth-1 tree) and depth 2 at 4 KiB
    // with more (4 x 340).
    let frag = if bs == 1024 { 500 } else { 1500 };
    build_tree(&src, 3000, frag, bs);
    let img = s.0.join("img");
    make_image_args(&src, &img, bs, "64M", features, extra);
    // A time past 2038 with nanoseconds: base 0x80000010 (negative as
    // i32), epoch bits 1, 123456789 ns.
    let timed = debugfs(&img, "sif /pattern.bin mtime 0x80000010")
        && debugfs(&img, "sif /pattern.bin mtime_extra 0x1d6f3455");
    let e = open(&img);
    walk_lib(&e);
    let fs: Arc<dyn Filesystem> = e.clone();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fs);
    let vfs_fs = Fs::new(vfs.root_task());
    let mut want = host_tree(&src);
    if timed {
        want.get_mut("/pattern.bin").unwrap().mtime = (2_147_483_664, 123_456_789);
    }
    let got = vfs_tree(&vfs_fs);
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "names differ"
    );
    let bad: Vec<String> = want
        .iter()
        .filter(|(k, w)| got.get(*k) != Some(w))
        .map(|(k, w)| format!("{k}:\n want {w:?}\n  got {:?}", got.get(k)))
        .collect();
    assert!(
        bad.is_empty(),
        "{} differ:\n{}",
        bad.len(),
        bad[..bad.len().min(8)].join("\n")
    );
    // The fragmented file needs an extent tree of depth >= 2.
    let frag_ino = vfs_fs.symlink_metadata("/frag").unwrap().stat().ino;
    let raw = e.read_inode(frag_ino as u32).unwrap();
    let depth = u16::from_le_bytes([raw.block[6], raw.block[7]]);
    assert!(depth >= 2, "frag has extent depth {depth}");
    // The big directory is an htree, and every name is found through the
    // hash index (not only by the linear fallback).
    let big = vfs_fs.symlink_metadata("/big").unwrap().stat().ino;
    let raw = e.read_inode(big as u32).unwrap();
    assert!(
        raw.flags & 0x1000 != 0 || !have_e2fsck(),
        "big is not indexed"
    );
    for name in want.keys().filter_map(|k| k.strip_prefix("/big/")) {
        let h = e.lookup_htree(&raw, name.as_bytes()).unwrap();
        assert!(h.is_some(), "htree lookup missed {name}");
        assert_eq!(h, e.lookup_linear(&raw, name.as_bytes()).unwrap(), "{name}");
    }
    assert_eq!(e.lookup_htree(&raw, b"no-such-name").unwrap(), None);
    // Read-only: every change is EROFS.
    let err = vfs_fs.write("/newfile", b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let err = vfs_fs.remove_file("/small.txt").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let err = vfs_fs.create_dir("/a/newdir").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    // Statistics agree with the superblock written by mke2fs.
    let st = e.statfs();
    let sb = e.superblock();
    assert_eq!(st.bsize, bs as u64);
    assert_eq!(st.files, u64::from(sb.inodes_count));
    assert_eq!(st.ffree, u64::from(sb.free_inodes_count));
    assert_eq!(st.bfree, sb.free_blocks_count);
    assert!(st.blocks < sb.blocks_count && st.blocks > sb.blocks_count / 2);
}

#[test]
fn tree_matches_source_4k() {
    compare(4096, "orphan_file");
}

#[test]
fn tree_matches_source_1k() {
    compare(1024, "orphan_file");
}

#[test]
fn tree_matches_source_without_metadata_csum() {
    // gdt_csum (crc16) group descriptors, no checksum tails.
    compare(4096, "^metadata_csum,uninit_bg");
}

#[test]
fn tree_matches_source_with_csum_seed_and_64bit() {
    compare(1024, "metadata_csum_seed,64bit");
}

#[test]
fn tree_matches_source_bigalloc_1k() {
    // Regression: bigalloc was refused (blocks_per_group checked against
    // the bitmap instead of clusters_per_group), then the descriptor table
    // was read from first_data_block + 1 (0 + 1 with bigalloc) instead of
    // the block after the superblock's (2 with 1 KiB blocks).
    compare_args(1024, "bigalloc", &["-C", "4096"]);
}

/// Every hash the htree may use: legacy, half_md4 and tea, each with signed
/// and unsigned chars (`s_flags`), on names with bytes >= 0x80 (where the
/// two differ). tune2fs sets the default hash, debugfs the signedness, and
/// e2fsck -fyD rebuilds the index with them.
#[test]
fn htree_lookup_every_hash_version() {
    if !have_tools() || !have_e2fsck() {
        eprintln!("SKIP: needs e2fsck, tune2fs, debugfs");
        return;
    }
    let s = Scratch::new("hash");
    let src = s.0.join("src");
    std::fs::create_dir_all(src.join("big")).unwrap();
    let names: Vec<String> = (0..800)
        .map(|i| format!("n\u{e9}\u{fc}-{i:04}-\u{3b1}\u{3b2}-{}", i * 31 % 97))
        .collect();
    for n in &names {
        std::fs::write(src.join("big").join(n), b"").unwrap();
    }
    let sbin = mkfs().unwrap();
    for alg in ["legacy", "half_md4", "tea"] {
        for flags in ["1", "2"] {
            let img = s.0.join(format!("img-{alg}-{flags}"));
            make_image(&src, &img, 1024, "16M", "");
            let ok = std::process::Command::new(sbin.with_file_name("tune2fs"))
                .args(["-E", &format!("hash_alg={alg}")])
                .arg(&img)
                .output()
                .unwrap()
                .status
                .success();
            assert!(ok, "tune2fs -E hash_alg={alg}");
            assert!(debugfs(&img, &format!("ssv flags {flags}")));
            let out = std::process::Command::new(sbin.with_file_name("e2fsck"))
                .arg("-fyD")
                .arg(&img)
                .output()
                .unwrap();
            assert!(matches!(out.status.code(), Some(0 | 1)));
            let e = open(&img);
            assert_eq!(e.superblock().flags, flags.parse::<u32>().unwrap());
            let root = e.read_inode(2).unwrap();
            let big = e.lookup_name(&root, b"big").unwrap().unwrap();
            let raw = e.read_inode(big).unwrap();
            assert!(raw.flags & 0x1000 != 0, "{alg}: big is not indexed");
            for n in &names {
                let h = e.lookup_htree(&raw, n.as_bytes()).unwrap();
                assert!(h.is_some(), "{alg} flags {flags}: htree lookup missed {n}");
            }
        }
    }
}

fn open_err(img: &Path) -> scalevfs_ext4::Error {
    match Ext4::open(img, Ext4Options::default()) {
        Ok(_) => panic!("{} opened", img.display()),
        Err(e) => e,
    }
}

/// Unsupported INCOMPAT features are refused by name; a journal that needs
/// recovery is refused with its own message; a bad checksum names the object.
#[test]
fn refusals_name_the_feature_or_object() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("refuse");
    let src = s.0.join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/f"), b"data").unwrap();
    // (inline_data is read and written: tests/inline_data.rs.)
    let img = s.0.join("encrypt");
    make_image(&src, &img, 4096, "8M", "encrypt");
    let e = open_err(&img);
    assert!(matches!(e, scalevfs_ext4::Error::Incompatible(_)), "{e}");
    assert!(e.to_string().contains("encrypt"), "{e}");

    let img = s.0.join("recover");
    make_image(&src, &img, 4096, "8M", "");
    if debugfs(&img, "feature needs_recovery") {
        let e = open_err(&img);
        assert!(e.to_string().contains("needs recovery"), "{e}");
    }

    // A bad root inode checksum: open fails naming inode 2.
    let img = s.0.join("csum");
    make_image(&src, &img, 4096, "8M", "");
    let mut bytes = std::fs::read(&img).unwrap();
    let fs = scalevfs_ext4::Ext4::open_device(
        Box::new(scalevfs_ext4::MemDevice::new(bytes.clone())),
        Ext4Options::default(),
    )
    .unwrap();
    let isz = fs.superblock().inode_size();
    // Group 0's inode table: from descriptor 0 (block 1 with 4 KiB blocks).
    let itable = u32::from_le_bytes(bytes[4096 + 8..4096 + 12].try_into().unwrap()) as usize;
    let root_off = itable * 4096 + isz; // inode 2 is the second slot
    bytes[root_off + 0x10] ^= 1; // i_mtime
    std::fs::write(&img, &bytes).unwrap();
    let e = open_err(&img);
    assert!(e.is_corrupt(), "{e}");
    assert!(e.to_string().contains("inode 2"), "{e}");
    assert_eq!(e.errno(), scalevfs::Errno::EUCLEAN);
}

/// The inode cache stays bounded however many inodes are visited, and an
/// inode number maps to one `Arc<Inode>` while it is held (hard links).
#[test]
fn inode_cache_is_bounded_and_shared() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("cache");
    let src = s.0.join("src");
    std::fs::create_dir_all(src.join("big")).unwrap();
    for i in 0..1000 {
        std::fs::write(src.join("big").join(format!("f{i}")), b"x").unwrap();
    }
    std::fs::hard_link(src.join("big/f1"), src.join("link")).unwrap();
    let img = s.0.join("img");
    make_image(&src, &img, 4096, "16M", "");
    let cap = 16;
    let e = Ext4::open(
        &img,
        Ext4Options {
            inode_cache: cap,
            ..Ext4Options::default()
        },
    )
    .unwrap();
    let root = e.root();
    let big = e.lookup(&root, b"big").unwrap().unwrap();
    let held = e.lookup(&big, b"f1").unwrap().unwrap();
    for i in 0..1000 {
        let name = format!("f{i}");
        let _ = e.lookup(&big, name.as_bytes()).unwrap().unwrap();
        // Live inodes: the ring (cap) and the 3 held here; dead entries are
        // swept when the map doubles.
        let bound = 2 * (cap + 3) + 1;
        assert!(e.cached_inodes() <= bound, "{} cached", e.cached_inodes());
    }
    let again = e.lookup(&root, b"link").unwrap().unwrap();
    assert!(Arc::ptr_eq(&held, &again), "hard link gave a second inode");
    assert_eq!(held.attr().nlink, 2);
}

/// A directory's i_size_high is i_dir_acl without large_dir: ignored, as
/// the kernel's ext4_isize does (it reports such a directory as 1024 bytes).
#[test]
fn directory_size_high_is_ignored_without_large_dir() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("sizehi");
    let src = s.0.join("src");
    std::fs::create_dir_all(src.join("dd")).unwrap();
    std::fs::write(src.join("dd/f"), b"x").unwrap();
    let img = s.0.join("img");
    make_image(&src, &img, 1024, "8M", "");
    if !debugfs(&img, "sif /dd size 0x100000400") {
        return;
    }
    let e = open(&img);
    let root = e.root();
    let dd = e.lookup(&root, b"dd").unwrap().unwrap();
    assert_eq!(dd.attr().size, 1024);
    let mut names = Vec::new();
    e.readdir(&dd, 0, &mut |d| {
        names.push(d.name);
        true
    })
    .unwrap();
    assert_eq!(names, [b"f".to_vec()]);
}
