//! Extended attributes on scalevfs alone: POSIX ACLs (the host's tmpfs
//! here has none to compare with, so the expected results are Linux's
//! rules from fs/posix_acl.c), memfs's space limit, a read-only mount, and
//! attributes going away with their inode.

mod common;

use std::sync::Arc;

use scalevfs::xattr::{
    parse_acl, POSIX_ACL_ACCESS, POSIX_ACL_DEFAULT, XATTR_CREATE, XATTR_REPLACE,
};
use scalevfs::*;

use common::*;

fn mode(t: &Task, p: &str) -> u32 {
    t.stat(p).unwrap().mode & 0o7777
}

#[test]
fn acl_format_is_validated() {
    let ok = acl(&[(USER_OBJ, 7, U), (GROUP_OBJ, 5, U), (OTHER, 4, U)]);
    assert!(parse_acl(&ok).unwrap().is_some());
    // A header alone is "no ACL".
    assert_eq!(parse_acl(&2u32.to_le_bytes()).unwrap(), None);
    let bad: Vec<Vec<u8>> = vec![
        vec![],
        b"\x02\0\0\0garbage".to_vec(),
        // Not a whole number of entries.
        ok[..ok.len() - 1].to_vec(),
        // Missing OTHER.
        acl(&[(USER_OBJ, 7, U), (GROUP_OBJ, 5, U)]),
        // Out of order.
        acl(&[(GROUP_OBJ, 5, U), (USER_OBJ, 7, U), (OTHER, 4, U)]),
        // Permission bits beyond rwx.
        acl(&[(USER_OBJ, 8, U), (GROUP_OBJ, 5, U), (OTHER, 4, U)]),
        // A named user needs a mask.
        acl(&[
            (USER_OBJ, 7, U),
            (USER, 7, 5),
            (GROUP_OBJ, 5, U),
            (OTHER, 4, U),
        ]),
        // Unknown tag.
        acl(&[(USER_OBJ, 7, U), (0x40, 5, U), (OTHER, 4, U)]),
        // Two USER_OBJ.
        acl(&[
            (USER_OBJ, 7, U),
            (USER_OBJ, 7, U),
            (GROUP_OBJ, 5, U),
            (OTHER, 4, U),
        ]),
    ];
    for (k, b) in bad.iter().enumerate() {
        assert_eq!(parse_acl(b), Err(Errno::EINVAL), "case {k}");
    }
    // Named users twice and out of id order: Linux 6.x's posix_acl_valid
    // takes them (checked on the host's tmpfs, 6.18).
    let loose = acl(&[
        (USER_OBJ, 7, U),
        (USER, 7, 6),
        (USER, 7, 5),
        (USER, 7, 5),
        (GROUP_OBJ, 5, U),
        (MASK, 7, U),
        (OTHER, 4, U),
    ]);
    assert_eq!(parse_acl(&loose).unwrap().map(|a| a.len()), Some(7));
    // Another version is EOPNOTSUPP (posix_acl_from_xattr).
    assert_eq!(
        parse_acl(&[&1u32.to_le_bytes()[..], &ok[4..]].concat()),
        Err(Errno::EOPNOTSUPP)
    );
    // A named user of id -1.
    assert_eq!(
        parse_acl(&acl(&[
            (USER_OBJ, 7, U),
            (USER, 7, U),
            (GROUP_OBJ, 5, U),
            (MASK, 7, U),
            (OTHER, 4, U)
        ])),
        Err(Errno::EINVAL)
    );
}

#[test]
fn acl_set_updates_mode_and_reads_back() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.close(t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap())
        .unwrap();
    t.mkdir("/d", 0o755).unwrap();
    t.symlink("f", "/l").unwrap();
    // Garbage is EOPNOTSUPP (a bad version) or EINVAL, and nothing changes.
    assert_eq!(
        t.setxattr("/f", POSIX_ACL_ACCESS, b"garbage!", 0),
        Err(Errno::EOPNOTSUPP)
    );
    assert_eq!(
        t.setxattr("/f", POSIX_ACL_ACCESS, b"\x02\0\0\0garbage", 0),
        Err(Errno::EINVAL)
    );
    assert_eq!(mode(&t, "/f"), 0o644);
    // An ACL the mode says in full: the mode changes, nothing is stored.
    let minimal = acl(&[(USER_OBJ, 6, U), (GROUP_OBJ, 0, U), (OTHER, 0, U)]);
    t.setxattr("/f", POSIX_ACL_ACCESS, &minimal, 0).unwrap();
    assert_eq!(mode(&t, "/f"), 0o600);
    assert_eq!(
        t.xattr_value("/f", POSIX_ACL_ACCESS, 0),
        Err(Errno::ENODATA)
    );
    // A full ACL: stored as given (ids of the *_OBJ entries undefined),
    // and the group bits are the mask's.
    let full = acl(&[
        (USER_OBJ, 7, 0),
        (USER, 4, 1000),
        (USER, 6, 1001),
        (GROUP_OBJ, 4, 0),
        (GROUP, 2, 50),
        (MASK, 5, 0),
        (OTHER, 1, 0),
    ]);
    t.setxattr("/f", POSIX_ACL_ACCESS, &full, 0).unwrap();
    assert_eq!(mode(&t, "/f"), 0o751);
    let back = t.xattr_value("/f", POSIX_ACL_ACCESS, 0).unwrap();
    let want = acl(&[
        (USER_OBJ, 7, U),
        (USER, 4, 1000),
        (USER, 6, 1001),
        (GROUP_OBJ, 4, U),
        (GROUP, 2, 50),
        (MASK, 5, U),
        (OTHER, 1, U),
    ]);
    assert_eq!(back, want);
    assert_eq!(
        t.xattr_names("/f", 0).unwrap(),
        vec![POSIX_ACL_ACCESS.to_vec()]
    );
    // Setting the minimal one again drops the stored ACL.
    t.setxattr("/f", POSIX_ACL_ACCESS, &minimal, 0).unwrap();
    assert_eq!(
        t.xattr_value("/f", POSIX_ACL_ACCESS, 0),
        Err(Errno::ENODATA)
    );
    // Default ACLs: directories only (EACCES), an empty one is a no-op.
    assert_eq!(
        t.setxattr("/f", POSIX_ACL_DEFAULT, &full, 0),
        Err(Errno::EACCES)
    );
    t.setxattr("/f", POSIX_ACL_DEFAULT, &2u32.to_le_bytes(), 0)
        .unwrap();
    t.setxattr("/d", POSIX_ACL_DEFAULT, &full, 0).unwrap();
    assert_eq!(mode(&t, "/d"), 0o755, "a default ACL leaves the mode");
    assert_eq!(t.xattr_value("/d", POSIX_ACL_DEFAULT, 0).unwrap(), want);
    t.removexattr("/d", POSIX_ACL_DEFAULT).unwrap();
    // Removing an ACL the file lacks succeeds (set_posix_acl(NULL); the
    // host's tmpfs agrees), as does removing a default ACL of a file.
    t.removexattr("/d", POSIX_ACL_DEFAULT).unwrap();
    t.removexattr("/f", POSIX_ACL_DEFAULT).unwrap();
    assert_eq!(
        t.lremovexattr("/l", POSIX_ACL_ACCESS),
        Err(Errno::EOPNOTSUPP)
    );
    // XATTR_CREATE and XATTR_REPLACE are ignored for ACLs.
    t.setxattr("/d", POSIX_ACL_DEFAULT, &full, XATTR_REPLACE)
        .unwrap();
    t.setxattr("/d", POSIX_ACL_DEFAULT, &full, XATTR_CREATE)
        .unwrap();
    assert_eq!(t.xattr_value("/d", POSIX_ACL_DEFAULT, 0).unwrap(), want);
    // Not on a symlink itself.
    assert_eq!(
        t.lsetxattr("/l", POSIX_ACL_ACCESS, &full, 0),
        Err(Errno::EOPNOTSUPP)
    );
    // Only the owner (or root) sets an ACL.
    t.chown("/f", 1000, 1000).unwrap();
    let other = vfs.task(Cred::user(1001, 1001));
    assert_eq!(
        other.setxattr("/f", POSIX_ACL_ACCESS, &full, 0),
        Err(Errno::EPERM)
    );
    let owner = vfs.task(Cred::user(1000, 1000));
    t.chmod("/f", 0o2644).unwrap();
    owner.setxattr("/f", POSIX_ACL_ACCESS, &full, 0).unwrap();
    assert_eq!(
        mode(&t, "/f"),
        0o2751,
        "the owner is in the group: setgid stays"
    );
    // Anyone may read an ACL; only the owner (or root) removes one, even
    // one that is not there (the host's tmpfs: EPERM both).
    assert_eq!(other.xattr_value("/f", POSIX_ACL_ACCESS, 0).unwrap(), want);
    assert_eq!(other.removexattr("/f", POSIX_ACL_ACCESS), Err(Errno::EPERM));
    assert_eq!(other.xattr_value("/f", POSIX_ACL_ACCESS, 0).unwrap(), want);
    t.chown("/d", 1000, 1000).unwrap();
    assert_eq!(
        other.removexattr("/d", POSIX_ACL_DEFAULT),
        Err(Errno::EPERM)
    );
    assert_eq!(t.xattr_value("/d", POSIX_ACL_DEFAULT, 0).unwrap(), want);
    owner.removexattr("/d", POSIX_ACL_DEFAULT).unwrap();
    owner.removexattr("/f", POSIX_ACL_ACCESS).unwrap();
    assert_eq!(
        t.xattr_value("/f", POSIX_ACL_ACCESS, 0),
        Err(Errno::ENODATA)
    );
}

#[test]
fn memfs_xattr_space_is_limited() {
    let fs = Arc::new(MemFs::new(
        77,
        MemFsOptions {
            max_inodes: 16,
            ..Default::default()
        },
    ));
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.mkdir("/m", 0o755).unwrap();
    t.mount("/m", fs.clone(), false).unwrap();
    t.close(t.open("/m/f", O_CREAT | O_RDWR, 0o644).unwrap())
        .unwrap();
    // 16 inodes: 16 KiB shared by inodes (1 KiB each: the root and /m/f
    // leave 14 KiB) and attributes (40 bytes, the name and the value:
    // 4046 bytes each), as tmpfs's inode space.
    let v = vec![1u8; 4000];
    let mut n = 0;
    let err = loop {
        match t.setxattr("/m/f", &format!("user.{n}"), &v, 0) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 100, "no limit");
    };
    assert_eq!(err, Errno::ENOSPC);
    assert_eq!(n, 3);
    // Removing gives the space back; so does unlinking the file.
    t.removexattr("/m/f", "user.0").unwrap();
    t.setxattr("/m/f", "user.again", &v, 0).unwrap();
    // A replace by a smaller value shrinks the charge.
    t.setxattr("/m/f", "user.1", b"x", 0).unwrap();
    t.setxattr("/m/f", "user.more", &v, 0).unwrap();
    assert_eq!(t.setxattr("/m/f", "user.full", &v, 0), Err(Errno::ENOSPC));
    // The space comes back when the inode is freed, which (as for its
    // pages) waits for the epoch's deferred frees: other tests of this
    // process may hold them back a while, hence the bounded retries.
    t.unlink("/m/f").unwrap();
    t.close(t.open("/m/g", O_CREAT | O_RDWR, 0o644).unwrap())
        .unwrap();
    let mut freed = false;
    for _ in 0..10_000 {
        flush_deferred_frees();
        match t.setxattr("/m/g", "user.0", &v, 0) {
            Ok(()) => {
                freed = true;
                break;
            }
            Err(e) => assert_eq!(e, Errno::ENOSPC),
        }
        std::thread::yield_now();
    }
    assert!(freed, "the unlinked file's attributes kept their space");
    for k in 1..3 {
        t.setxattr("/m/g", &format!("user.{k}"), &v, 0).unwrap();
    }
    assert_eq!(t.setxattr("/m/g", "user.3", &v, 0), Err(Errno::ENOSPC));
}

#[test]
fn readonly_mount_and_list_limits() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.mkdir("/m", 0o755).unwrap();
    let fs = Arc::new(MemFs::new(78, MemFsOptions::default()));
    t.mount("/m", fs, false).unwrap();
    t.close(t.open("/m/f", O_CREAT | O_RDWR, 0o644).unwrap())
        .unwrap();
    t.setxattr("/m/f", "user.a", b"1", 0).unwrap();
    t.remount("/m", true).unwrap();
    assert_eq!(t.setxattr("/m/f", "user.b", b"1", 0), Err(Errno::EROFS));
    assert_eq!(t.removexattr("/m/f", "user.a"), Err(Errno::EROFS));
    assert_eq!(t.xattr_value("/m/f", "user.a", 0).unwrap(), b"1");
    t.remount("/m", false).unwrap();
    // A name list over XATTR_LIST_MAX: the probe gives its length, a
    // buffer of XATTR_LIST_MAX is E2BIG, a smaller one ERANGE.
    let mut total = "user.a".len() + 1;
    let mut k = 0;
    while total <= 70000 {
        let name = format!("user.{k:0>240}");
        total += name.len() + 1;
        t.setxattr("/m/f", &name, b"", 0).unwrap();
        k += 1;
    }
    let len = t.listxattr("/m/f", &mut []).unwrap();
    assert!(len > 65536, "{len}");
    let mut buf = vec![0u8; 65536];
    assert_eq!(t.listxattr("/m/f", &mut buf), Err(Errno::E2BIG));
    assert_eq!(t.listxattr("/m/f", &mut buf[..1000]), Err(Errno::ERANGE));
    // A bigger buffer is cut to XATTR_LIST_MAX, as Linux cuts it.
    let mut big = vec![0u8; len];
    assert_eq!(t.listxattr("/m/f", &mut big), Err(Errno::E2BIG));
    assert_eq!(
        t.xattr_names("/m/f", 0).unwrap().len(),
        k + 1,
        "with user.a"
    );
}

#[test]
fn concurrent_changes_and_reads() {
    // Writers of different names on one inode (serialised by its data
    // lock) and lock-free readers: every read sees a whole value, and the
    // end state is what the writers left.
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.close(t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap())
        .unwrap();
    std::thread::scope(|s| {
        for w in 0..3u8 {
            let t = t.clone_thread();
            s.spawn(move || {
                for k in 0..300u32 {
                    let name = format!("user.w{w}.{}", k % 7);
                    let v = vec![w; 1 + (k as usize % 50)];
                    t.setxattr("/f", &name, &v, 0).unwrap();
                    if k % 3 == 0 {
                        t.removexattr("/f", &name).unwrap();
                    }
                }
            });
        }
        let t = t.clone_thread();
        s.spawn(move || {
            for _ in 0..300 {
                for name in t.xattr_names("/f", 0).unwrap() {
                    match t.xattr_value("/f", &name, 0) {
                        Ok(v) => {
                            let w = name[6] - b'0';
                            assert!(!v.is_empty() && v.iter().all(|&b| b == w), "{v:?}");
                        }
                        // Removed since the listing.
                        Err(e) => assert_eq!(e, Errno::ENODATA),
                    }
                }
            }
        });
    });
    let mut names = t.xattr_names("/f", 0).unwrap();
    names.sort();
    // k = 299 wrote name k % 7 = 5 last; each name's last write decides.
    let mut want = Vec::new();
    for w in 0..3 {
        for n in 0..7u32 {
            let last = (0..300u32).filter(|k| k % 7 == n).max().unwrap();
            if last % 3 != 0 {
                want.push(format!("user.w{w}.{n}").into_bytes());
            }
        }
    }
    want.sort();
    assert_eq!(names, want);
}
