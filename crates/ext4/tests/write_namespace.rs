//! Creating a tree on a read-write mount through the VFS (directories,
//! empty files, a FIFO, devices in both encodings, fast and slow
//! symlinks, a directory grown past one block, chmod/chown/utimens with
//! nanoseconds and epoch bits): after unmount e2fsck -fn passes, our reader
//! reopens the same tree, and the kernel (loop, read-only) sees it too.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use scalevfs::fs::Fs;
use scalevfs::types::Timespec;
use scalevfs::{Errno, Filesystem, Vfs, VfsConfig};
use scalevfs_ext4::{Ext4, Ext4Options, Mapping};

fn rw() -> Ext4Options {
    Ext4Options {
        ro: false,
        ..Ext4Options::default()
    }
}

fn ours(e: Arc<Ext4>) -> BTreeMap<String, Node> {
    let fs: Arc<dyn Filesystem> = e;
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fs);
    let fs = Fs::new(vfs.root_task());
    let mut t = vfs_tree(&fs);
    for (k, n) in t.iter_mut() {
        let st = *fs.symlink_metadata(k).unwrap().stat();
        n.mtime = (st.mtime.sec, st.mtime.nsec);
    }
    t
}

const FILES: usize = 150;

fn workload(e: &Arc<Ext4>) {
    let fs: Arc<dyn Filesystem> = e.clone();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fs);
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    t.mkdir("/d/sub", 0o700).unwrap();
    t.mkdir("/d/sub/deep", 0o755).unwrap();
    // Enough names to grow /d past one block (both block sizes).
    for i in 0..FILES {
        t.mknodat(
            -100,
            &format!("/d/file-with-a-longish-name-{i:04}"),
            libc::S_IFREG | 0o644,
            0,
        )
        .unwrap();
    }
    t.mknodat(-100, "/fifo", libc::S_IFIFO | 0o640, 0).unwrap();
    t.mknodat(-100, "/chr", libc::S_IFCHR | 0o600, libc::makedev(1, 3))
        .unwrap();
    // Past 8 bits of major/minor: the new encoding.
    t.mknodat(
        -100,
        "/blk",
        libc::S_IFBLK | 0o600,
        libc::makedev(300, 70000),
    )
    .unwrap();
    t.symlink("d/file-with-a-longish-name-0001", "/fast")
        .unwrap();
    let long = "x/".repeat(100);
    t.symlink(long.as_str(), "/slow").unwrap();
    t.chmod("/d/file-with-a-longish-name-0002", 0o4711).unwrap();
    t.chown("/d/file-with-a-longish-name-0003", 1000, 2000)
        .unwrap();
    // Past 2038 (an epoch bit) and before 1970, with nanoseconds.
    let times = [
        Timespec {
            sec: -12345,
            nsec: 999_999_999,
        },
        Timespec {
            sec: (1 << 32) + 77,
            nsec: 123_456_789,
        },
    ];
    t.utimensat(-100, "/d/file-with-a-longish-name-0004", Some(times), 0)
        .unwrap();
    // Errnos of the checks before any write.
    assert_eq!(t.mkdir("/d", 0o755), Err(Errno::EEXIST));
    assert_eq!(
        t.mkdir(format!("/{}", "n".repeat(256)).as_str(), 0o755),
        Err(Errno::ENAMETOOLONG)
    );
    e.sync().unwrap();
}

fn check(bs: usize) {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("rwns");
    let img = fresh(&s.0, bs, "32M");
    let e = Ext4::open(&img, rw()).unwrap();
    workload(&e);
    let want = ours(e.clone());
    assert_eq!(want.len(), 3 + FILES + 5);
    let n = &want["d/file-with-a-longish-name-0004"];
    assert_eq!(n.mtime, ((1 << 32) + 77, 123_456_789));
    assert_eq!(
        want["d/file-with-a-longish-name-0002"].mode,
        libc::S_IFREG | 0o4711
    );
    assert_eq!(
        want["/slow"].target.as_deref(),
        Some("x/".repeat(100).as_bytes())
    );
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);

    // Our reader, read-only, sees the same.
    let e = Ext4::open(&img, Ext4Options::default()).unwrap();
    walk_lib(&e);
    assert_eq!(ours(e), want);

    // The kernel too.
    let Some(km) = KMount::new(&img, &s.0.join("mnt")) else {
        return;
    };
    let mut k = host_tree_ns(&km.0);
    k.remove("/lost+found");
    assert_eq!(k, want);
    use std::os::unix::fs::MetadataExt;
    let d = std::fs::metadata(km.0.join("d")).unwrap();
    assert_eq!(d.nlink(), 3, "/d: . .. and sub");
    assert!(d.size() > bs as u64, "/d grew past one block");
    let root = std::fs::metadata(&km.0).unwrap();
    assert_eq!(root.nlink(), 4, "/: . .. lost+found d");
}

#[test]
fn tree_written_reads_back_1k() {
    check(1024);
}

#[test]
fn tree_written_reads_back_4k() {
    check(4096);
}

/// A directory of 5,000 entries (converted to an htree at its second
/// block, leaves split by hash), half of them removed again: e2fsck -fn
/// passes (its pass 2 checks the index), our htree lookup finds every
/// survivor, and the kernel lists exactly them.
#[test]
fn big_directory_then_half_removed() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("rwbigdir");
    // (With 1 KiB blocks the root's index fills up: its entries move to an
    // index node, which then splits too.)
    for (bs, n) in [(1024, 5000), (4096, 5000)] {
        let img = fresh(&s.0, bs, "48M");
        let e = Ext4::open(&img, rw()).unwrap();
        let fsd: Arc<dyn Filesystem> = e.clone();
        let vfs = Vfs::with_root_fs(VfsConfig::default(), fsd);
        let t = vfs.root_task();
        t.mkdir("/big", 0o755).unwrap();
        for i in 0..n {
            t.mknodat(
                -100,
                &format!("/big/entry-{i:05}"),
                libc::S_IFREG | 0o644,
                0,
            )
            .unwrap_or_else(|x| panic!("{bs}: entry {i}: {x:?}"));
        }
        for i in (0..n).step_by(2) {
            t.unlink(&format!("/big/entry-{i:05}")).unwrap();
        }
        for i in 0..n {
            let r = t.lstat(&format!("/big/entry-{i:05}"));
            assert_eq!(r.is_ok(), i % 2 == 1, "entry {i}: {r:?}");
        }
        e.unmount().unwrap();
        drop(t);
        drop(vfs);
        drop(e);
        fsck_clean(&img);
        if bs == 1024 {
            // The index grew a level and that level split: the root holds
            // two or more index nodes.
            let e = Ext4::open(&img, Ext4Options::default()).unwrap();
            let root = e.read_inode(2).unwrap();
            let big = e.lookup_name(&root, b"big").unwrap().unwrap();
            let raw = e.read_inode(big).unwrap();
            let Mapping::Data { pblk, .. } = e.map_block(&raw, 0).unwrap() else {
                panic!("block 0 unmapped")
            };
            let image = std::fs::read(&img).unwrap();
            let b0 = &image[pblk as usize * bs..(pblk as usize + 1) * bs];
            assert_eq!(b0[0x18 + 6], 1, "indirect levels");
            let count = u16::from_le_bytes([b0[0x22], b0[0x23]]);
            assert!(count >= 2, "root entries {count}");
        }
        let Some(km) = KMount::new(&img, &s.0.join(format!("mnt{bs}"))) else {
            continue;
        };
        let mut got: Vec<String> = std::fs::read_dir(km.0.join("big"))
            .unwrap()
            .map(|d| d.unwrap().file_name().into_string().unwrap())
            .collect();
        got.sort();
        let want: Vec<String> = (1..n).step_by(2).map(|i| format!("entry-{i:05}")).collect();
        assert_eq!(got, want);
    }
}

/// dir_nlink: a directory with more than 65,000 subdirectories has link
/// count 1 (as the kernel's ext4_inc_count); e2fsck -fn agrees and the
/// kernel reports the same; removing some keeps it at 1.
#[test]
fn dir_nlink_past_65000_subdirectories() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("rwnlink");
    let img = s.0.join("img");
    let out = std::process::Command::new(mkfs().unwrap())
        .args(["-q", "-F", "-b", "1024", "-N", "70000", "-O", "orphan_file"])
        .arg(&img)
        .arg("128M")
        .output()
        .unwrap();
    assert!(out.status.success());
    let e = Ext4::open(&img, rw()).unwrap();
    let fsd: Arc<dyn Filesystem> = e.clone();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fsd);
    let t = vfs.root_task();
    t.mkdir("/p", 0o755).unwrap();
    let n = 65_010;
    for i in 0..n {
        t.mkdir(format!("/p/{i}").as_str(), 0o755).unwrap();
        if i == 64_997 {
            // 2 + 64,998 subdirectories: still exact.
            assert_eq!(t.lstat("/p").unwrap().nlink, 65_000);
        }
    }
    assert_eq!(t.lstat("/p").unwrap().nlink, 1);
    for i in 0..20 {
        t.rmdir(format!("/p/{i}").as_str()).unwrap();
    }
    assert_eq!(t.lstat("/p").unwrap().nlink, 1);
    e.unmount().unwrap();
    drop(t);
    drop(vfs);
    drop(e);
    fsck_clean(&img);
    let Some(km) = KMount::new(&img, &s.0.join("mnt")) else {
        return;
    };
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(km.0.join("p")).unwrap().nlink(), 1);
    assert_eq!(std::fs::read_dir(km.0.join("p")).unwrap().count(), n - 20);
}
