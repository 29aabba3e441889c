//! Extended attributes written on a read-write (journaled) mount, judged
//! from outside: set, replace and remove `user.`, `trusted.`, `security.`
//! and ACL attributes of many sizes (in the inode body, spilling to the
//! xattr block, many names), XATTR_CREATE/REPLACE errnos, an unlinked
//! file's block freed; after each unmount e2fsck -fn is clean and our
//! reader reopens the same attributes, and the kernel (loop mount, root
//! only) reads them back too. The same operations on the kernel's ext4
//! give the same errnos (ENOSPC where a value fits nowhere). A block two
//! inodes share is copied on write, never changed in place.

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use scalevfs::fs::{Fs, MetadataExt};
use scalevfs::xattr::{encode_acl, AclEntry};
use scalevfs::{Errno, Filesystem, Task, Vfs, VfsConfig, AT_SYMLINK_NOFOLLOW};
use scalevfs_ext4::format::xattr::block_csum;
use scalevfs_ext4::{Ext4, Ext4Options};

use common::*;

const XATTR_CREATE: u32 = 1;
const XATTR_REPLACE: u32 = 2;

/// Every file's expected attributes.
type Model = BTreeMap<String, Xattrs>;

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// The kernel's setxattr/removexattr on `p`: 0 or the errno.
fn host_set(p: &Path, name: &str, value: Option<&[u8]>, flags: u32) -> i32 {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let cn = CString::new(name).unwrap();
    // SAFETY: plain syscalls on valid pointers that outlive them.
    let r = unsafe {
        match value {
            Some(v) => libc::lsetxattr(
                c.as_ptr(),
                cn.as_ptr(),
                v.as_ptr().cast(),
                v.len(),
                flags as i32,
            ),
            None => libc::lremovexattr(c.as_ptr(), cn.as_ptr()),
        }
    };
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }
}

fn acl(named_user: Option<u32>, perm: u16) -> Vec<u8> {
    let mut v = vec![AclEntry {
        tag: 1,
        perm: 6,
        id: u32::MAX,
    }];
    if let Some(u) = named_user {
        v.push(AclEntry {
            tag: 2,
            perm,
            id: u,
        });
    }
    v.push(AclEntry {
        tag: 4,
        perm: 4,
        id: u32::MAX,
    });
    if named_user.is_some() {
        v.push(AclEntry {
            tag: 0x10,
            perm: 4,
            id: u32::MAX,
        });
    }
    v.push(AclEntry {
        tag: 0x20,
        perm: 0,
        id: u32::MAX,
    });
    encode_acl(&v)
}

fn vfs_of(e: &Arc<Ext4>) -> Vfs {
    let fsd: Arc<dyn Filesystem> = e.clone();
    Vfs::with_root_fs(VfsConfig::default(), fsd)
}

fn file_acl(e: &Ext4, path: &str) -> u64 {
    let mut raw = e.read_inode(2).unwrap();
    for c in path.trim_start_matches('/').split('/') {
        let ino = e.lookup_name(&raw, c.as_bytes()).unwrap().unwrap();
        raw = e.read_inode(ino).unwrap();
    }
    raw.file_acl
}

fn set(t: &Task, m: &mut Model, p: &str, name: &str, v: &[u8]) {
    t.lsetxattr(p, name, v, 0)
        .unwrap_or_else(|e| panic!("set {p} {name} ({} bytes): {e}", v.len()));
    m.entry(p.to_string())
        .or_default()
        .insert(name.to_string(), v.to_vec());
}

fn remove(t: &Task, m: &mut Model, p: &str, name: &str) {
    t.lremovexattr(p, name)
        .unwrap_or_else(|e| panic!("remove {p} {name}: {e}"));
    m.get_mut(p).unwrap().remove(name);
}

/// Unmount, e2fsck -fn, reopen read-only: our reader sees `m`.
fn check_after_unmount(img: &Path, e: Arc<Ext4>, m: &Model) {
    e.unmount().unwrap();
    drop(e);
    fsck_clean(img);
    let e = Ext4::open(img, Ext4Options::default()).unwrap();
    let vfs = vfs_of(&e);
    let t = vfs.root_task();
    for (p, want) in m {
        assert_eq!(&our_xattrs(&t, p), want, "reopened: {p}");
    }
}

fn workload(e: &Arc<Ext4>, bs: usize) -> Model {
    let vfs = vfs_of(e);
    let fs = Fs::new(vfs.root_task());
    let t = vfs.root_task();
    let mut m = Model::new();
    for f in ["/small", "/grow", "/many", "/gone", "/same"] {
        fs.write(f, f.as_bytes()).unwrap();
        m.insert(f.to_string(), Xattrs::new());
    }
    fs.create_dir("/dir").unwrap();
    m.insert("/dir".into(), Xattrs::new());
    fs.symlink("small", "/link").unwrap();
    m.insert("/link".into(), Xattrs::new());

    // Small values of each name space: all in the inode body.
    set(&t, &mut m, "/small", "user.s", b"hi");
    set(&t, &mut m, "/small", "trusted.t", &[0, 0xff, 0x10]);
    // 256-byte inodes have 96 bytes for attributes (i_extra_isize 32);
    // 128-byte ones (mke2fs's for small 1 KiB filesystems) none.
    let inode_room = e.superblock().inode_size() > 128;
    assert_eq!(
        file_acl(e, "/small") == 0,
        inode_room,
        "small values stay in the inode"
    );
    set(&t, &mut m, "/small", "security.label", b"x");
    set(&t, &mut m, "/small", "user.empty", b"");
    // XATTR_CREATE / XATTR_REPLACE / remove of a missing name.
    assert_eq!(
        t.setxattr("/small", "user.s", b"again", XATTR_CREATE),
        Err(Errno::EEXIST)
    );
    assert_eq!(
        t.setxattr("/small", "user.nope", b"1", XATTR_REPLACE),
        Err(Errno::ENODATA)
    );
    assert_eq!(t.removexattr("/small", "user.nope"), Err(Errno::ENODATA));
    assert_eq!(
        t.setxattr("/small", "system.foo", b"1", 0),
        Err(Errno::EOPNOTSUPP)
    );
    t.setxattr("/small", "user.s", b"replaced", XATTR_REPLACE)
        .unwrap();
    m.get_mut("/small")
        .unwrap()
        .insert("user.s".into(), b"replaced".to_vec());
    t.setxattr("/small", "user.c", b"created", XATTR_CREATE)
        .unwrap();
    m.get_mut("/small")
        .unwrap()
        .insert("user.c".into(), b"created".to_vec());
    remove(&t, &mut m, "/small", "security.label");

    // One value through every size: body, block, too big, back.
    let mut sizes = vec![1, 20, 60, 100, 150, 400, 1000, 2000, bs / 2, bs - 100];
    sizes.extend([bs - 60, 300, 3, 0]);
    for (i, &n) in sizes.iter().enumerate() {
        let v = pattern(i as u8, n);
        let r = t.setxattr("/grow", "user.g", &v, 0);
        // header 32 + entry 20 + end 4 + value: more than a block fits
        // nowhere (no ea_inode): ENOSPC, as Linux's ext4.
        if 32 + 20 + 4 + ((n + 3) & !3) > bs {
            assert_eq!(r, Err(Errno::ENOSPC), "{n} bytes");
        } else {
            r.unwrap_or_else(|e| panic!("{n} bytes: {e}"));
            m.get_mut("/grow").unwrap().insert("user.g".into(), v);
        }
        assert_eq!(our_xattrs(&t, "/grow"), m["/grow"], "after {n} bytes");
    }
    assert_eq!(
        t.setxattr("/grow", "user.g", &vec![7; 65536], 0),
        Err(Errno::ENOSPC)
    );
    assert_eq!(
        t.setxattr("/grow", "user.g", &vec![7; 65537], 0),
        Err(Errno::E2BIG)
    );
    // The last value was small: back in the body, the block freed.
    assert_eq!(file_acl(e, "/grow"), 0, "the emptied block is freed");
    assert_eq!(fs.metadata("/grow").unwrap().blocks(), bs as u64 / 512);

    // Many names: the body fills, then the block, then ENOSPC.
    let mut n = 0;
    loop {
        let name = format!("user.name{n:03}");
        let v = pattern(n as u8, 40);
        match t.setxattr("/many", &name, &v, 0) {
            Ok(()) => {
                m.get_mut("/many").unwrap().insert(name, v);
            }
            Err(Errno::ENOSPC) => break,
            Err(e) => panic!("{name}: {e}"),
        }
        n += 1;
        assert!(n < 1000);
    }
    // 1 KiB blocks with 128-byte inodes: 16 of 64 bytes in the block.
    assert!(n >= 16, "only {n} names fit");
    assert_ne!(file_acl(e, "/many"), 0);
    assert_eq!(our_xattrs(&t, "/many"), m["/many"]);
    // Remove every other one, replace some, all read back.
    for i in (0..n).step_by(2) {
        remove(&t, &mut m, "/many", &format!("user.name{i:03}"));
    }
    for i in (1..n).step_by(6) {
        set(&t, &mut m, "/many", &format!("user.name{i:03}"), b"short");
    }
    assert_eq!(our_xattrs(&t, "/many"), m["/many"]);

    // Directories, symlinks (trusted.), ACLs.
    set(&t, &mut m, "/dir", "user.d", b"dir");
    set(
        &t,
        &mut m,
        "/dir",
        "system.posix_acl_default",
        &acl(Some(1000), 5),
    );
    set(
        &t,
        &mut m,
        "/dir",
        "system.posix_acl_access",
        &acl(Some(1001), 7),
    );
    set(&t, &mut m, "/link", "trusted.l", b"link");
    set(&t, &mut m, "/link", "trusted.big", &pattern(8, 600));
    assert_eq!(our_xattrs(&t, "/link"), m["/link"]);
    set(
        &t,
        &mut m,
        "/small",
        "system.posix_acl_access",
        &acl(Some(1002), 4),
    );
    assert_eq!(our_xattrs(&t, "/dir"), m["/dir"]);
    // An ACL the mode says all of is not stored (the VFS removes it).
    t.setxattr("/small", "system.posix_acl_access", &acl(None, 0), 0)
        .unwrap();
    m.get_mut("/small")
        .unwrap()
        .remove("system.posix_acl_access");
    set(&t, &mut m, "/dir", "security.big", &pattern(9, bs / 3));

    // A file with a block, unlinked: the block is freed (e2fsck counts).
    set(&t, &mut m, "/gone", "user.big", &pattern(3, bs / 2));
    assert_ne!(file_acl(e, "/gone"), 0);
    fs.remove_file("/gone").unwrap();
    m.remove("/gone");
    // The same value again: nothing to change.
    set(&t, &mut m, "/same", "user.v", &pattern(4, bs / 4));
    set(&t, &mut m, "/same", "user.v", &pattern(4, bs / 4));
    m
}

fn check(bs: usize) {
    if !have_tools() {
        return;
    }
    let s = Scratch::new(&format!("xw{bs}"));
    let img = fresh(&s.0, bs, "16M");
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let m = workload(&e, bs);
    check_after_unmount(&img, e, &m);

    // A second mount changes what the first wrote.
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let mut m = m;
    {
        let vfs = vfs_of(&e);
        let t = vfs.root_task();
        for (p, attrs) in m.iter_mut() {
            for name in attrs.keys().cloned().collect::<Vec<_>>() {
                if name.ends_with('0') || name.ends_with('5') {
                    t.lremovexattr(p.as_str(), &name).unwrap();
                    attrs.remove(&name);
                }
            }
        }
        set(&t, &mut m, "/small", "user.later", &pattern(1, 700));
    }
    check_after_unmount(&img, e, &m);

    // The kernel reads what we wrote.
    if !root() {
        return;
    }
    if let Some(km) = KMount::new(&img, &s.0.join("mnt")) {
        for (p, want) in &m {
            let k = host_xattrs(&km.0.join(p.trim_start_matches('/')));
            assert_eq!(&k, want, "{p}: kernel (left) and ours (right)");
        }
    }
}

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: not root (loop mounts)");
        return false;
    }
    true
}

#[test]
fn xattrs_written_4k() {
    check(4096);
}

#[test]
fn xattrs_written_1k() {
    check(1024);
}

/// One operation: set (`Some`) or remove a name, with flags.
type Op = (&'static str, Option<Vec<u8>>, u32);

fn ops() -> Vec<Op> {
    let mut v: Vec<Op> = Vec::new();
    for n in [10, 100, 1000, 3000, 4000, 4040, 4050, 5000, 65536, 8] {
        v.push(("user.a", Some(vec![b'a'; n]), 0));
    }
    v.push(("user.a", Some(b"x".to_vec()), XATTR_CREATE));
    v.push(("user.b", Some(b"x".to_vec()), XATTR_REPLACE));
    v.push(("user.b", None, 0));
    v.push(("trusted.t", Some(vec![1; 90]), 0));
    v.push(("security.s", Some(vec![2; 50]), 0));
    // Names until the block is full.
    const NAMES: [&str; 8] = [
        "user.n0", "user.n1", "user.n2", "user.n3", "user.n4", "user.n5", "user.n6", "user.n7",
    ];
    // Growing values: some fit in the body, the rest in the block, until
    // neither has room (ENOSPC) for the larger ones.
    for round in 0..12u8 {
        for (i, name) in NAMES.iter().enumerate() {
            let n = 4 + usize::from(round) * 45 + i * 3;
            v.push((name, Some(vec![round; n]), 0));
        }
    }
    for name in NAMES.iter().step_by(3) {
        v.push((name, None, 0));
    }
    v.push(("user.n1", Some(vec![9; 20]), 0));
    v.push(("user.a", None, 0));
    v.push(("user.a", None, 0));
    v
}

/// The same operations give the same errnos on the kernel's ext4 and on
/// ours, and leave the same attributes.
#[test]
fn errnos_match_the_kernel() {
    if !have_tools() || !root() {
        return;
    }
    let s = Scratch::new("xwk");
    let kimg = fresh(&s.0, 4096, "16M");
    let ours_img = s.0.join("ours");
    std::fs::copy(&kimg, &ours_img).unwrap();
    let (kres, kattrs) = {
        let Some(km) = KMount::rw(&kimg, &s.0.join("mnt")) else {
            return;
        };
        let f = km.0.join("f");
        std::fs::write(&f, b"f").unwrap();
        let r: Vec<i32> = ops()
            .iter()
            .map(|(n, v, fl)| host_set(&f, n, v.as_deref(), *fl))
            .collect();
        (r, host_xattrs(&f))
    };
    fsck_clean(&kimg);
    let e = Ext4::open(&ours_img, rw_journaled()).unwrap();
    let (ores, oattrs) = {
        let vfs = vfs_of(&e);
        let fs = Fs::new(vfs.root_task());
        let t = vfs.root_task();
        fs.write("/f", b"f").unwrap();
        let r: Vec<i32> = ops()
            .iter()
            .map(|(n, v, fl)| {
                let r = match v {
                    Some(v) => t.setxattr("/f", n, v, *fl),
                    None => t.removexattr("/f", n),
                };
                r.map_or_else(|e| e.raw(), |()| 0)
            })
            .collect();
        (r, our_xattrs(&t, "/f"))
    };
    let names: Vec<String> = ops()
        .iter()
        .map(|(n, v, f)| format!("{n} {:?} {f}", v.as_ref().map(Vec::len)))
        .collect();
    eprintln!("kernel {kres:?}\nours   {ores:?}");
    for (i, n) in names.iter().enumerate() {
        assert_eq!(
            kres[i], ores[i],
            "op {i} ({n}): kernel (left), ours (right)"
        );
    }
    assert_eq!(kattrs, oattrs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&ours_img);
}

/// An image whose /a and /b share one xattr block (refcount 2, as mke2fs
/// -d or the kernel's mbcache make them), e2fsck-clean: the block and the
/// value in it.
fn shared_image(dir: &Path, bs: usize) -> (std::path::PathBuf, u64, Vec<u8>) {
    let img = fresh(dir, bs, "16M");
    {
        let e = Ext4::open(&img, rw_journaled()).unwrap();
        let vfs = vfs_of(&e);
        let fs = Fs::new(vfs.root_task());
        fs.write("/a", b"a").unwrap();
        fs.write("/b", b"b").unwrap();
        drop(fs);
        drop(vfs);
        e.unmount().unwrap();
    }
    let val = dir.join("val");
    let big = pattern(5, 2000);
    std::fs::write(&val, &big).unwrap();
    assert!(debugfs(
        &img,
        &format!("ea_set -f {} /a user.big", val.display())
    ));
    // b refers to a's block too; its count becomes 2 (with its checksum).
    let blk = {
        let e = Ext4::open(&img, Ext4Options::default()).unwrap();
        file_acl(&e, "/a")
    };
    assert_ne!(blk, 0);
    assert!(debugfs(&img, &format!("sif /b file_acl {blk}")));
    // One data block and the xattr block.
    assert!(debugfs(&img, &format!("sif /b blocks {}", 2 * bs / 512)));
    let seed = Ext4::open(&img, Ext4Options::default())
        .unwrap()
        .superblock()
        .csum_seed();
    let mut bytes = std::fs::read(&img).unwrap();
    let b = &mut bytes[blk as usize * bs..(blk as usize + 1) * bs];
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    let c = block_csum(b, blk, seed);
    b[0x10..0x14].copy_from_slice(&c.to_le_bytes());
    std::fs::write(&img, &bytes).unwrap();
    fsck_clean(&img);
    (img, blk, big)
}

fn block_bytes(img: &Path, blk: u64, bs: usize) -> Vec<u8> {
    std::fs::read(img).unwrap()[blk as usize * bs..(blk as usize + 1) * bs].to_vec()
}

/// A change to one sharer goes to a new block; the other keeps the old
/// one, changed only in its count (and checksum).
#[test]
fn shared_block_is_copied_on_write() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("xwshared");
    let bs = 4096;
    let (img, blk, big) = shared_image(&s.0, bs);
    let before = block_bytes(&img, blk, bs);
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    {
        let vfs = vfs_of(&e);
        let t = vfs.root_task();
        assert_eq!(t.xattr_value("/b", "user.big", 0).unwrap(), big);
        t.setxattr("/b", "user.more", &pattern(6, 1000), 0).unwrap();
        let nb = file_acl(&e, "/b");
        assert!(nb != blk && nb != 0, "b got its own block");
        assert_eq!(file_acl(&e, "/a"), blk);
        assert_eq!(t.xattr_value("/a", "user.big", 0).unwrap(), big);
        assert_eq!(t.xattr_names("/a", 0).unwrap(), [b"user.big".to_vec()]);
        assert_eq!(t.xattr_value("/b", "user.big", 0).unwrap(), big);
    }
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
    let after = block_bytes(&img, blk, bs);
    assert_eq!(after[4..8], 1u32.to_le_bytes());
    assert_eq!(before[..4], after[..4]);
    assert_eq!(before[8..0x10], after[8..0x10]);
    assert_eq!(before[0x14..], after[0x14..]);
}

/// Removing a shared block's last attribute from one sharer only drops
/// its reference; removing it from the last user frees the block.
#[test]
fn shared_block_remove_then_free() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("xwshared2");
    let bs = 4096;
    let (img, blk, big) = shared_image(&s.0, bs);
    let free0: u64 = sb_field(&img, "Free blocks").parse().unwrap();
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    {
        let vfs = vfs_of(&e);
        let fs = Fs::new(vfs.root_task());
        let t = vfs.root_task();
        t.removexattr("/b", "user.big").unwrap();
        assert_eq!(file_acl(&e, "/b"), 0);
        assert_eq!(fs.metadata("/b").unwrap().blocks(), bs as u64 / 512);
        let _ = t.xattr_names("/b", 0).unwrap();
        assert_eq!(t.xattr_value("/a", "user.big", 0).unwrap(), big);
    }
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
    assert_eq!(block_bytes(&img, blk, bs)[4..8], 1u32.to_le_bytes());
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    {
        let vfs = vfs_of(&e);
        let t = vfs.root_task();
        t.removexattr("/a", "user.big").unwrap();
        assert_eq!(file_acl(&e, "/a"), 0);
        assert!(t.xattr_names("/a", 0).unwrap().is_empty());
    }
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
    let free1: u64 = sb_field(&img, "Free blocks").parse().unwrap();
    assert_eq!(free1, free0 + 1, "the block is free again");
}

/// Unlinking one sharer keeps the block for the other (its count drops).
#[test]
fn shared_block_survives_unlink() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("xwshared3");
    let bs = 4096;
    let (img, blk, big) = shared_image(&s.0, bs);
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    {
        let vfs = vfs_of(&e);
        let fs = Fs::new(vfs.root_task());
        fs.remove_file("/b").unwrap();
    }
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
    assert_eq!(block_bytes(&img, blk, bs)[4..8], 1u32.to_le_bytes());
    let e = Ext4::open(&img, Ext4Options::default()).unwrap();
    let vfs = vfs_of(&e);
    let t = vfs.root_task();
    assert_eq!(t.xattr_value("/a", "user.big", 0).unwrap(), big);
}

/// The attributes of each of `files` (None: the file is gone).
type XTree = BTreeMap<&'static str, Option<Xattrs>>;

fn xtree(t: &Task, files: &[&'static str]) -> XTree {
    files
        .iter()
        .map(|&f| {
            let x = t
                .xattr_names(f, AT_SYMLINK_NOFOLLOW)
                .ok()
                .map(|_| our_xattrs(t, f));
            (f, x)
        })
        .collect()
}

/// Every crash state of a workload of attribute changes (body, block,
/// moves between them, removal, an unlink of a file with a block), each
/// followed by an fsync, recovers (our replay) to an e2fsck-clean image
/// whose attributes are those of the last completed fsync or the next.
#[test]
fn xattr_changes_survive_crashes() {
    use scalevfs::{O_CREAT, O_RDWR};
    use scalevfs_ext4::crashdev::{CrashLog, Op, RecordingDevice};
    use scalevfs_ext4::{BlockDevice, MemDevice};
    if !have_tools() {
        return;
    }
    const FILES: [&str; 2] = ["/x", "/y"];
    let s = Scratch::new("xwcrash");
    let bs = 1024;
    let img = fresh(&s.0, bs, "8M");
    let base = std::fs::read(&img).unwrap();
    let rec = Arc::new(RecordingDevice::new(MemDevice::new(base.clone()), 200_000));
    let writes = |rec: &RecordingDevice<MemDevice>| {
        rec.ops().iter().filter(|o| !matches!(o, Op::Flush)).count()
    };
    let mut points = Vec::new();
    {
        let e = Ext4::open_device(Box::new(rec.clone()), rw_journaled()).unwrap();
        let vfs = vfs_of(&e);
        let t = vfs.root_task();
        points.push((writes(&rec), xtree(&t, &FILES)));
        let x = t.open("/x", O_CREAT | O_RDWR, 0o644).unwrap();
        let y = t.open("/y", O_CREAT | O_RDWR, 0o644).unwrap();
        t.fsync(x).unwrap();
        points.push((writes(&rec), xtree(&t, &FILES)));
        let steps: Vec<(&str, &str, Option<Vec<u8>>)> = vec![
            ("/x", "user.a", Some(b"small".to_vec())),
            ("/x", "user.big", Some(pattern(1, 600))),
            ("/y", "trusted.t", Some(pattern(2, 700))),
            ("/x", "user.big", Some(b"now small".to_vec())),
            ("/x", "user.a", None),
            ("/x", "security.s", Some(pattern(3, 500))),
            ("/x", "user.big", None),
        ];
        for (f, name, v) in steps {
            match v {
                Some(v) => t.setxattr(f, name, &v, 0).unwrap(),
                None => t.removexattr(f, name).unwrap(),
            }
            t.fsync(if f == "/x" { x } else { y }).unwrap();
            points.push((writes(&rec), xtree(&t, &FILES)));
        }
        t.close(y).unwrap();
        t.unlink("/y").unwrap();
        // fsync commits the running transaction only when the file has
        // a change in it: one more on x takes the unlink along.
        t.setxattr("/x", "user.end", b"e", 0).unwrap();
        t.fsync(x).unwrap();
        points.push((writes(&rec), xtree(&t, &FILES)));
        t.close(x).unwrap();
        drop(t);
        drop(vfs);
        e.unmount().unwrap();
        let last = points.last().unwrap().1.clone();
        points.push((writes(&rec), last));
    }
    let log = CrashLog {
        base,
        ops: rec.ops(),
    };
    let state_img = s.0.join("state");
    let mut n = 0;
    log.states(4, 99, &mut |st| {
        n += 1;
        let i = points
            .iter()
            .rposition(|(w, _)| *w <= st.flushed_writes)
            .unwrap_or(0);
        let dev = Arc::new(MemDevice::new(st.image.clone()));
        let e = Ext4::open_device(Box::new(dev.clone()), rw_journaled()).unwrap();
        let got = {
            let vfs = vfs_of(&e);
            let t = vfs.root_task();
            xtree(&t, &FILES)
        };
        e.unmount().unwrap();
        drop(e);
        let ok = &points[i..(i + 2).min(points.len())];
        assert!(
            ok.iter().any(|(_, t)| *t == got),
            "crash state {n} (flushed {}): {got:?} is neither fsync point {i} nor the next",
            st.flushed_writes
        );
        let mut after = vec![0u8; dev.size() as usize];
        dev.read_at(0, &mut after).unwrap();
        std::fs::write(&state_img, &after).unwrap();
        fsck_clean(&state_img);
        true
    });
    eprintln!("{n} crash states recovered and checked");
    assert!(n > 10);
}

/// Threads change attributes at once: each its own file, all one shared
/// file, readers alongside, and the two sharers of one block copying it at
/// the same moment; afterwards e2fsck is clean and every value is one
/// that was written.
#[test]
fn concurrent_changes_are_clean() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("xwconc");
    let bs = 4096;
    let (img, blk, big) = shared_image(&s.0, bs);
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    {
        let vfs = vfs_of(&e);
        let fs = Fs::new(vfs.root_task());
        for i in 0..4 {
            fs.write(format!("/t{i}"), b"t").unwrap();
        }
        fs.write("/common", b"c").unwrap();
        std::thread::scope(|sc| {
            for i in 0..4u8 {
                let vfs = &vfs;
                sc.spawn(move || {
                    let t = vfs.root_task();
                    let own = format!("/t{i}");
                    for k in 0..60usize {
                        let n = (k * 37 + usize::from(i) * 11) % 500;
                        let name = format!("user.k{}", k % 7);
                        t.setxattr(own.as_str(), &name, &pattern(i, n), 0).unwrap();
                        let cn = format!("user.c{i}");
                        match t.setxattr("/common", &cn, &pattern(i, n / 3), 0) {
                            Ok(()) | Err(Errno::ENOSPC) => {}
                            Err(e) => panic!("{e}"),
                        }
                        if k % 5 == 0 {
                            let _ = t.removexattr(own.as_str(), &name);
                        }
                        let _ = our_xattrs(&t, "/common");
                    }
                });
            }
            // The two sharers of one block change it at once.
            for f in ["/a", "/b"] {
                let vfs = &vfs;
                sc.spawn(move || {
                    let t = vfs.root_task();
                    // Too big for the inode body: into the block.
                    t.setxattr(f, "user.mine", &f.as_bytes().repeat(100), 0)
                        .unwrap();
                });
            }
        });
        let t = vfs.root_task();
        for f in ["/a", "/b"] {
            assert_eq!(t.xattr_value(f, "user.big", 0).unwrap(), big);
            assert_eq!(
                t.xattr_value(f, "user.mine", 0).unwrap(),
                f.as_bytes().repeat(100)
            );
        }
        // The first copies; the second finds itself the only user (and
        // changes the block in place) or copies too (and frees it).
        let (a, b) = (file_acl(&e, "/a"), file_acl(&e, "/b"));
        assert!(a != b && a != 0 && b != 0, "{a} {b} (shared {blk})");
    }
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
}

/// Corrupt bytes in a file's xattr block and inode body (the inode's
/// checksum made valid again, so the body reaches the parser): a writer
/// setting and removing attributes gets errors, never a panic, and never
/// writes an image e2fsck finds worse than the corruption (not checked:
/// the image was corrupt to begin with).
#[test]
fn corrupt_attributes_never_panic_a_writer() {
    use scalevfs_ext4::MemDevice;
    if !have_tools() {
        return;
    }
    let s = Scratch::new("xwcorrupt");
    let bs = 4096;
    let img = fresh(&s.0, bs, "8M");
    {
        let e = Ext4::open(&img, rw_journaled()).unwrap();
        let vfs = vfs_of(&e);
        let fs = Fs::new(vfs.root_task());
        let t = vfs.root_task();
        fs.write("/f", b"f").unwrap();
        t.setxattr("/f", "user.s", b"body", 0).unwrap();
        t.setxattr("/f", "trusted.t", b"t", 0).unwrap();
        t.setxattr("/f", "user.big", &pattern(1, 2000), 0).unwrap();
        t.setxattr("/f", "user.b2", &pattern(2, 300), 0).unwrap();
        drop(t);
        drop(fs);
        drop(vfs);
        e.unmount().unwrap();
    }
    let (blk, sb, raw) = {
        let e = Ext4::open(&img, Ext4Options::default()).unwrap();
        let root = e.read_inode(2).unwrap();
        let ino = e.lookup_name(&root, b"f").unwrap().unwrap();
        let raw = e.read_inode(ino).unwrap();
        (raw.file_acl, e.superblock().clone(), raw)
    };
    assert_ne!(blk, 0);
    // Where the inode is: "located at block B, offset 0xO".
    let loc = debugfs_ro(&img, "imap /f");
    let tail = &loc[loc.find("located at").unwrap()..];
    let mut words = tail.split_whitespace().skip_while(|w| *w != "block");
    let iblk: usize = words.nth(1).unwrap().trim_end_matches(',').parse().unwrap();
    let ioff = usize::from_str_radix(words.nth(1).unwrap().trim_start_matches("0x"), 16).unwrap();
    let islot = iblk * bs + ioff;
    let isz = sb.inode_size();
    let base = std::fs::read(&img).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..150 {
        let mut b = base.clone();
        let (at, body) = if round % 2 == 0 {
            (blk as usize * bs + (rnd() as usize % 160), false)
        } else {
            (islot + 160 + (rnd() as usize % (isz - 160)), true)
        };
        b[at] = [0, 0xff, 0x7f, 0x80, 1, rnd() as u8][rnd() as usize % 6];
        if body {
            raw.encode(&sb, &mut b[islot..islot + isz], None);
        }
        let Ok(e) = Ext4::open_device(Box::new(MemDevice::new(b)), rw_journaled()) else {
            continue;
        };
        {
            let vfs = vfs_of(&e);
            let t = vfs.root_task();
            let _ = t.xattr_names("/f", 0);
            let _ = t.xattr_value("/f", "user.big", 0);
            let _ = t.setxattr("/f", "user.s", &pattern(3, 40), 0);
            let _ = t.setxattr("/f", "user.new", &pattern(4, 900), 0);
            let _ = t.removexattr("/f", "user.big");
            let _ = t.removexattr("/f", "trusted.t");
            let _ = t.setxattr("/f", "user.b2", b"", XATTR_REPLACE);
        }
        let _ = e.unmount();
    }
}
