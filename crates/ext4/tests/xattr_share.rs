//! Files with the same extended attributes share one xattr block, as the
//! kernel's mbcache makes them (`xattr_write.rs`, "Sharing"): the block's
//! count says how many inodes use it, a change to one file moves that file
//! to a block of its own (or to another twin), the last user frees it.
//! e2fsck checks every count (pass 1 counts the users of each xattr block)
//! and the kernel reads and changes the shared blocks.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::Xattrs;
use common::*;
use scalevfs::Task;

const BS: u64 = 1024;

/// `i_file_acl` of `name` as debugfs shows it.
fn file_acl(img: &Path, name: &str) -> u64 {
    let out = debugfs_ro(img, &format!("stat {name}"));
    out.split("File ACL: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("debugfs stat {name}: {out}"))
}

/// An xattr block's `h_refcount`, read from the image.
fn refcount(img: &Path, blk: u64) -> u32 {
    let b = std::fs::read(img).unwrap();
    let o = (blk * BS) as usize;
    assert_eq!(&b[o..o + 4], &0xEA02_0000u32.to_le_bytes(), "block {blk}");
    u32::from_le_bytes(b[o + 4..o + 8].try_into().unwrap())
}

fn free_blocks(t: &Task) -> u64 {
    t.statfs("/").unwrap().bfree
}

/// An empty regular file at `p`.
fn touch(t: &Task, p: &str) {
    let fd = t
        .open(p, scalevfs::O_CREAT | scalevfs::O_WRONLY, 0o644)
        .unwrap();
    t.close(fd).unwrap();
}

fn set_pair(t: &Task, p: &str, tag: &[u8]) {
    t.setxattr(p, "user.big", &[b'v'; 300], 0).unwrap();
    t.setxattr(p, "user.tag", tag, 0).unwrap();
}

#[test]
fn same_attributes_share_one_block() {
    let Some((s, img, e, vfs)) = mount_fresh("xshare", "16M") else {
        return;
    };
    let t = vfs.root_task();
    for i in 0..10 {
        touch(&t, &format!("/f{i}"));
    }
    e.sync().unwrap();
    let before = free_blocks(&t);
    // 300 bytes do not fit the 256-byte inodes' in-body space: each file's
    // pair goes to a block, and all ten are the same block.
    for i in 0..10 {
        set_pair(&t, &format!("/f{i}"), b"same");
    }
    e.sync().unwrap();
    assert_eq!(before - free_blocks(&t), 1, "blocks used by ten equal sets");
    // One file changes (a block of its own: the small tag lives in the
    // inode, the big value in the block), one drops its attributes, one
    // goes.
    t.setxattr("/f3", "user.big", &[b'w'; 300], 0).unwrap();
    t.removexattr("/f5", "user.big").unwrap();
    t.removexattr("/f5", "user.tag").unwrap();
    t.unlink("/f7").unwrap();
    drop(t);
    e.unmount().unwrap();
    drop(vfs);
    drop(e);
    fsck_clean(&img);
    let shared = file_acl(&img, "/f0");
    for i in [1, 2, 4, 6, 8, 9] {
        assert_eq!(file_acl(&img, &format!("/f{i}")), shared, "f{i}");
    }
    let own = file_acl(&img, "/f3");
    assert!(own != 0 && own != shared);
    assert_eq!(file_acl(&img, "/f5"), 0);
    assert_eq!(refcount(&img, shared), 7);
    assert_eq!(refcount(&img, own), 1);
    // The kernel reads them, changes one and removes another sharer.
    let want = |big: u8| -> BTreeMap<String, Vec<u8>> {
        [
            ("user.big".to_string(), vec![big; 300]),
            ("user.tag".to_string(), b"same".to_vec()),
        ]
        .into_iter()
        .collect()
    };
    if let Some(km) = KMount::rw(&img, &s.0.join("mnt")) {
        for i in [0, 1, 2, 4, 6, 8, 9] {
            assert_eq!(host_xattrs(&km.0.join(format!("f{i}"))), want(b'v'), "f{i}");
        }
        assert_eq!(host_xattrs(&km.0.join("f3")), want(b'w'));
        assert!(host_xattrs(&km.0.join("f5")).is_empty());
        let c =
            std::ffi::CString::new(km.0.join("f0").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: valid NUL-terminated strings and buffer for the call.
        let r = unsafe {
            libc::setxattr(
                c.as_ptr(),
                c"user.big".as_ptr(),
                [b'k'; 300].as_ptr().cast(),
                300,
                0,
            )
        };
        assert_eq!(r, 0);
        std::fs::remove_file(km.0.join("f1")).unwrap();
        drop(km);
        fsck_clean(&img);
        assert_eq!(refcount(&img, shared), 5);
    }
    // Back here: a new file given the shared set joins the block; then
    // every attribute goes and every block comes back.
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    touch(&t, "/g");
    set_pair(&t, "/g", b"same");
    assert_eq!(our_xattrs(&t, "/f2"), want(b'v'));
    assert_eq!(our_xattrs(&t, "/f3"), want(b'w'));
    for p in ["/f0", "/f2", "/f3", "/f4", "/f6", "/f8", "/f9", "/g"] {
        for n in ["user.big", "user.tag"] {
            let _ = t.removexattr(p, n);
        }
        assert!(our_xattrs(&t, p).is_empty(), "{p}");
    }
    e.sync().unwrap();
    let _ = free_blocks(&t);
    drop(t);
    e.unmount().unwrap();
    drop(vfs);
    fsck_clean(&img);
    assert_eq!(file_acl(&img, "/g"), 0);
    // The first mount's ten files took one block; all of them are free
    // again (f1 and f7 are gone, their inodes empty files).
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    assert_eq!(free_blocks(&t), before, "an xattr block was not freed");
    drop(t);
    e.unmount().unwrap();
}

/// Threads giving their own files one of two attribute sets and taking
/// them away again, at once: counts stay exact (e2fsck), every file reads
/// back its last set, and nothing is leaked.
#[test]
fn concurrent_sharers_keep_exact_counts() {
    let Some((_s, img, e, vfs)) = mount_fresh("xshare-mt", "32M") else {
        return;
    };
    let t0 = vfs.root_task();
    e.sync().unwrap();
    let before = free_blocks(&t0);
    std::thread::scope(|sc| {
        for w in 0..4 {
            let t = t0.clone_thread();
            sc.spawn(move || {
                for i in 0..40 {
                    let p = format!("/w{w}-{}", i % 8);
                    if i < 8 {
                        touch(&t, &p);
                    }
                    match (i + w) % 3 {
                        0 => set_pair(&t, &p, b"one"),
                        1 => set_pair(&t, &p, b"two"),
                        _ => {
                            let _ = t.removexattr(&p, "user.big");
                            let _ = t.removexattr(&p, "user.tag");
                        }
                    }
                }
            });
        }
    });
    // What each file holds now, ours; then after a remount, e2fsck's view.
    let mut held = BTreeMap::new();
    for w in 0..4 {
        for k in 0..8 {
            let p = format!("/w{w}-{k}");
            held.insert(p.clone(), our_xattrs(&t0, &p));
        }
    }
    drop(t0);
    e.unmount().unwrap();
    drop(vfs);
    drop(e);
    fsck_clean(&img);
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    for (p, x) in &held {
        assert_eq!(&our_xattrs(&t, p), x, "{p}");
        for n in ["user.big", "user.tag"] {
            let _ = t.removexattr(p, n);
        }
    }
    e.sync().unwrap();
    assert_eq!(free_blocks(&t), before, "xattr blocks leaked");
    drop(t);
    e.unmount().unwrap();
    drop(vfs);
    fsck_clean(&img);
}

/// A block whose last user let it go is never shared afterwards, even when
/// its old copy on the device still looks alive (count 1): the next file
/// given the same attributes gets a block of its own, and e2fsck agrees.
#[test]
fn a_freed_block_is_not_shared_again() {
    let Some((_s, img, e, vfs)) = mount_fresh("xshare-freed", "16M") else {
        return;
    };
    let t = vfs.root_task();
    for p in ["/a", "/b"] {
        touch(&t, p);
    }
    set_pair(&t, "/a", b"same");
    // The block reaches its home location with count 1.
    e.sync().unwrap();
    e.sync().unwrap();
    t.removexattr("/a", "user.big").unwrap();
    set_pair(&t, "/b", b"same");
    drop(t);
    e.unmount().unwrap();
    drop(vfs);
    drop(e);
    fsck_clean(&img);
    let b = file_acl(&img, "/b");
    assert!(b != 0);
    assert_eq!(refcount(&img, b), 1);
}

/// Without a journal a freed block is reusable at once, for file data
/// too. A file whose data is a byte-for-byte copy of the freed xattr
/// block (count 1) must not be taken for it: the cache forgets a block
/// before it is freed, so the next file given those attributes gets a
/// block of its own and e2fsck finds no block claimed twice.
#[test]
fn file_data_that_looks_like_a_freed_block_is_not_shared() {
    freed_block_lookalike(false);
}

/// The same after the block was changed in place first (its only user gave
/// it other attributes): the entry under its first contents must go too,
/// or a file whose data copies those contents could be taken for it (a
/// count of 2 for e2fsck, before the fix).
#[test]
fn a_block_changed_in_place_leaves_no_entry_behind() {
    freed_block_lookalike(true);
}

fn freed_block_lookalike(changed_in_place: bool) {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("xshare-data");
    let img = fresh(&s.0, 1024, "16M");
    let e = scalevfs_ext4::Ext4::open(
        &img,
        scalevfs_ext4::Ext4Options {
            ro: false,
            journal: false,
            ..Default::default()
        },
    )
    .unwrap();
    let vfs = scalevfs::Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    for p in ["/a", "/b"] {
        touch(&t, p);
    }
    set_pair(&t, "/a", b"same");
    e.sync().unwrap();
    let x = file_acl(&img, "/a");
    let bytes = std::fs::read(&img).unwrap()[(x * BS) as usize..((x + 1) * BS) as usize].to_vec();
    assert_eq!(u32::from_le_bytes(bytes[4..8].try_into().unwrap()), 1);
    if changed_in_place {
        t.setxattr("/a", "user.big", &[b'w'; 300], 0).unwrap();
        e.sync().unwrap();
        assert_eq!(file_acl(&img, "/a"), x, "not changed in place");
    }
    t.removexattr("/a", "user.big").unwrap();
    let fd = t
        .open("/d", scalevfs::O_CREAT | scalevfs::O_WRONLY, 0o644)
        .unwrap();
    t.pwrite(fd, &bytes, 0).unwrap();
    t.close(fd).unwrap();
    e.sync().unwrap();
    let blocks = debugfs_ro(&img, "blocks /d");
    assert_eq!(
        blocks.trim(),
        x.to_string(),
        "the data did not reuse the freed block"
    );
    set_pair(&t, "/b", b"same");
    drop(t);
    e.unmount().unwrap();
    drop(vfs);
    drop(e);
    fsck_clean(&img);
    assert_ne!(
        file_acl(&img, "/b"),
        x,
        "file data taken for an xattr block"
    );
}

/// `ea_inode` images: a large value set on several files lives in one
/// value inode, counted once per entry (e2fsck checks each value inode's
/// count against the entries naming it); a changed value gets an inode of
/// its own, the last entry frees the shared one, and the kernel reads
/// them all.
#[test]
fn same_large_values_share_one_value_inode() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("xshare-ea");
    let img = fresh_with(&s.0, 1024, "16M", "ea_inode");
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    for i in 0..5 {
        touch(&t, &format!("/f{i}"));
    }
    e.sync().unwrap();
    let inodes = |t: &Task| t.statfs("/").unwrap().ffree;
    let free0 = inodes(&t);
    // 3,000 bytes: past a 1 KiB block's limit, so a value inode each.
    let big = |c: u8| vec![c; 3000];
    for i in 0..5 {
        t.setxattr(&format!("/f{i}"), "user.v", &big(b'a'), 0)
            .unwrap();
    }
    e.sync().unwrap();
    assert_eq!(free0 - inodes(&t), 1, "inodes used by five equal values");
    t.setxattr("/f1", "user.v", &big(b'b'), 0).unwrap();
    t.removexattr("/f2", "user.v").unwrap();
    t.unlink("/f3").unwrap();
    drop(t);
    e.unmount().unwrap();
    drop(vfs);
    drop(e);
    fsck_clean(&img);
    if let Some(km) = KMount::new(&img, &s.0.join("mnt")) {
        let v = |c: u8| -> Xattrs { [("user.v".to_string(), big(c))].into_iter().collect() };
        assert_eq!(host_xattrs(&km.0.join("f0")), v(b'a'));
        assert_eq!(host_xattrs(&km.0.join("f4")), v(b'a'));
        assert_eq!(host_xattrs(&km.0.join("f1")), v(b'b'));
        assert!(host_xattrs(&km.0.join("f2")).is_empty());
    }
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    for p in ["/f0", "/f1", "/f4"] {
        t.removexattr(p, "user.v").unwrap();
    }
    e.sync().unwrap();
    // f3's inode is gone too: one more free than at the start.
    assert_eq!(inodes(&t), free0 + 1, "a value inode was not freed");
    drop(t);
    e.unmount().unwrap();
    drop(vfs);
    fsck_clean(&img);
}
