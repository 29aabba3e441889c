//! File data and names on a read-write mount, judged from outside: a
//! workload of creates, writes, appends, overwrites, sparse writes,
//! truncates (shrink with a partial last block, grow), punched holes,
//! hard links, unlinks (one of a file still open), mkdir/rmdir, a file
//! whose extent tree is two levels deep (every other block written), and
//! filling the filesystem to ENOSPC and freeing it again. After unmount:
//! e2fsck -fn passes, our reader reopens the same tree, the kernel (loop,
//! read-only) sees the same contents.

mod common;

use scalevfs::fs::FileExt;
use std::collections::BTreeMap;
use std::io::{Seek, Write};
use std::sync::Arc;

use common::*;
use scalevfs::fs::Fs;
use scalevfs::{Errno, Filesystem, Vfs, VfsConfig};
use scalevfs_ext4::{Ext4, Ext4Options};

fn rw() -> Ext4Options {
    Ext4Options {
        ro: false,
        ..Ext4Options::default()
    }
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Files' expected contents (the model) and directories.
#[derive(Default)]
struct Model {
    files: BTreeMap<String, Vec<u8>>,
}

fn write_at(m: &mut Model, fs: &Fs, path: &str, off: usize, data: &[u8]) {
    let f = fs.options().write(true).create(true).open(path).unwrap();
    f.write_all_at(data, off as u64).unwrap();
    let v = m.files.entry(path.to_string()).or_default();
    if v.len() < off + data.len() {
        v.resize(off + data.len(), 0);
    }
    v[off..off + data.len()].copy_from_slice(data);
}

fn workload(e: &Arc<Ext4>, bs: usize) -> Model {
    let fsd: Arc<dyn Filesystem> = e.clone();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fsd);
    let fs = Fs::new(vfs.root_task());
    let t = vfs.root_task();
    let mut m = Model::default();
    fs.create_dir("/dir").unwrap();
    fs.create_dir("/dir/gone").unwrap();
    // Create, append, overwrite in the middle.
    write_at(&mut m, &fs, "/a", 0, &pattern(1, 3 * bs + 100));
    {
        let mut f = fs.options().append(true).open("/a").unwrap();
        let more = pattern(2, bs / 2);
        f.write_all(&more).unwrap();
        m.files.get_mut("/a").unwrap().extend_from_slice(&more);
    }
    write_at(&mut m, &fs, "/a", bs - 10, &pattern(3, 20));
    // Sparse: data far past a hole.
    write_at(&mut m, &fs, "/dir/sparse", 10 * bs + 5, b"after the hole");
    // Truncate: shrink into the middle of a block, then grow again (the
    // tail of that block must read back as zeros).
    write_at(&mut m, &fs, "/t", 0, &pattern(4, 4 * bs));
    {
        let f = fs.options().write(true).open("/t").unwrap();
        f.set_len(bs as u64 + 7).unwrap();
        f.set_len(3 * bs as u64).unwrap();
        let v = m.files.get_mut("/t").unwrap();
        v.truncate(bs + 7);
        v.resize(3 * bs, 0);
    }
    // Punch blocks 2..4 and part of block 1 out of a six-block file.
    write_at(&mut m, &fs, "/p", 0, &pattern(5, 6 * bs));
    {
        let f = fs.options().write(true).open("/p").unwrap();
        let mode = (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32;
        f.task()
            .fallocate(
                f.as_raw_fd(),
                mode,
                (bs + bs / 2) as i64,
                (3 * bs - bs / 2) as i64,
            )
            .unwrap();
        m.files.get_mut("/p").unwrap()[bs + bs / 2..4 * bs].fill(0);
    }
    // fallocate: unwritten extents (zeros), then writes into them convert
    // blocks (a partial one reads zeros around the data).
    {
        let f = fs.create("/fa").unwrap();
        f.task()
            .fallocate(f.as_raw_fd(), 0, 0, (8 * bs) as i64)
            .unwrap();
        assert_eq!(f.metadata().unwrap().len(), 8 * bs as u64);
        // KEEP_SIZE past the end: blocks, no size change.
        let keep = libc::FALLOC_FL_KEEP_SIZE as u32;
        f.task()
            .fallocate(f.as_raw_fd(), keep, (8 * bs) as i64, (4 * bs) as i64)
            .unwrap();
        assert_eq!(f.metadata().unwrap().len(), 8 * bs as u64);
        m.files.insert("/fa".into(), vec![0; 8 * bs]);
    }
    write_at(&mut m, &fs, "/fa", 2 * bs + 10, &pattern(8, 100));
    write_at(&mut m, &fs, "/fa", 5 * bs, &pattern(9, bs));
    assert!(fs.read("/fa").unwrap() == m.files["/fa"]);
    // A file whose extents need a two-level tree: every other block.
    let per = (bs - 16) / 12;
    let nblk = 2 * (4 * per + 20);
    for i in (0..nblk).step_by(2) {
        write_at(&mut m, &fs, "/deep", i * bs, &pattern(i as u8, bs));
    }
    // Hard links, unlinks, rmdir.
    write_at(&mut m, &fs, "/dir/x", 0, b"linked");
    fs.hard_link("/dir/x", "/x2").unwrap();
    m.files.insert("/x2".into(), b"linked".to_vec());
    fs.remove_file("/dir/x").unwrap();
    m.files.remove("/dir/x");
    write_at(&mut m, &fs, "/dir/gone/f", 0, &pattern(6, 5 * bs));
    assert_eq!(
        fs.remove_dir("/dir/gone").unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    fs.remove_file("/dir/gone/f").unwrap();
    m.files.remove("/dir/gone/f");
    fs.remove_dir("/dir/gone").unwrap();
    // Unlinked while open: still readable, freed after close.
    write_at(&mut m, &fs, "/open", 0, &pattern(7, 2 * bs));
    let held = fs.open("/open").unwrap();
    fs.remove_file("/open").unwrap();
    m.files.remove("/open");
    let mut back = vec![0u8; 2 * bs];
    held.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(back, pattern(7, 2 * bs));
    e.sync().unwrap();
    drop(held);
    // Everything reads back through the VFS.
    for (p, want) in &m.files {
        assert!(fs.read(p).unwrap() == *want, "{p} differs");
    }
    assert_eq!(t.rmdir("/dir"), Err(Errno::ENOTEMPTY));
    m
}

fn check(bs: usize) {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("rwfiles");
    let img = fresh(&s.0, bs, "24M");
    let e = Ext4::open(&img, rw()).unwrap();
    let m = workload(&e, bs);
    // The deep file's tree really is two levels.
    let root = e.read_inode(2).unwrap();
    let ino = e.lookup_name(&root, b"deep").unwrap().unwrap();
    let depth = u16::from_le_bytes(e.read_inode(ino).unwrap().block[6..8].try_into().unwrap());
    assert!(depth >= 2, "extent depth {depth}");
    e.unmount().unwrap();
    assert_eq!(sb_field(&img, "Filesystem state"), "clean");
    // After unmount nothing changes any more.
    assert_eq!(e.alloc_block(0).unwrap_err().errno(), Errno::EROFS);
    drop(e);
    fsck_clean(&img);

    // Our reader sees the model.
    let e = Ext4::open(&img, Ext4Options::default()).unwrap();
    walk_lib(&e);
    let fsd: Arc<dyn Filesystem> = e;
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fsd);
    let fs = Fs::new(vfs.root_task());
    for (p, want) in &m.files {
        assert!(fs.read(p).unwrap() == *want, "reopened: {p} differs");
    }
    assert!(!fs.exists("/open") && !fs.exists("/dir/gone"));
    drop(fs);
    drop(vfs);

    fill_and_free(&img);

    // So does the kernel.
    let Some(km) = KMount::new(&img, &s.0.join("mnt")) else {
        return;
    };
    for (p, want) in &m.files {
        let got = std::fs::read(km.0.join(p.trim_start_matches('/'))).unwrap();
        assert!(got == *want, "kernel: {p} differs");
    }
    let names: Vec<String> = std::fs::read_dir(&km.0)
        .unwrap()
        .map(|d| d.unwrap().file_name().into_string().unwrap())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(
        names,
        ["a", "deep", "dir", "fa", "lost+found", "p", "t", "x2"]
    );
}

/// Fill the filesystem to ENOSPC through one file, remove it; after the
/// unmount the free count is back where it was and e2fsck agrees.
fn fill_and_free(img: &std::path::Path) {
    let e = Ext4::open(img, rw()).unwrap();
    let free0 = e.statfs().bfree;
    let fsd: Arc<dyn Filesystem> = e.clone();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fsd);
    let fs = Fs::new(vfs.root_task());
    {
        let mut f = fs.create("/fill").unwrap();
        let chunk = vec![0xA5u8; 64 * 1024];
        let err = loop {
            if let Err(x) = f.write_all(&chunk) {
                break x;
            }
        };
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
        assert!(f.stream_position().unwrap() > 0);
    }
    // Only the reserve is left (and the blocks of the file's own tree).
    assert!(e.statfs().bavail == 0, "{:?}", e.statfs());
    fs.remove_file("/fill").unwrap();
    drop(fs);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(img);
    let e = Ext4::open(img, Ext4Options::default()).unwrap();
    assert_eq!(e.statfs().bfree, free0, "all of /fill freed");
}

#[test]
fn workload_passes_e2fsck_and_reads_back_1k() {
    check(1024);
}

#[test]
fn workload_passes_e2fsck_and_reads_back_4k() {
    check(4096);
}
