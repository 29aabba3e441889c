//! open(O_CREAT|O_EXCL) in a directory with a default ACL on a full
//! filesystem (128-byte inodes: the inherited ACL needs an xattr block).
//! The create succeeds, storing the inherited ACL fails with ENOSPC
//! (store_inherited_acl after fs.create, open.rs open_create_walked), and
//! the file must not stay: the VFS removes the name again
//! (`undo_create`), as the kernel frees the new inode when its ACL cannot
//! be stored (ext4_init_acl failing in __ext4_new_inode), so ENOSPC and
//! no file. It used to stay on disk behind a negative dentry, and the
//! ENOSPC retry (`redo_counted_enospc`) created it again each time:
//! duplicate entries of one name, which e2fsck reports (review, stop 38).

mod common;

use common::*;
use scalevfs::xattr::{encode_acl, AclEntry, POSIX_ACL_DEFAULT};
use scalevfs::{Errno, O_CREAT, O_EXCL, O_WRONLY};

const U: u32 = u32::MAX;

fn acl(e: &[(u16, u16, u32)]) -> Vec<u8> {
    let v: Vec<AclEntry> = e
        .iter()
        .map(|&(tag, perm, id)| AclEntry { tag, perm, id })
        .collect();
    encode_acl(&v)
}

fn fill_blocks(t: &scalevfs::Task, e: &scalevfs_ext4::Ext4) {
    let fd = t.open("/big", O_CREAT | O_WRONLY, 0o644).unwrap();
    let buf = vec![0x55u8; 1024];
    let mut off = 0i64;
    let mut fails = 0;
    loop {
        match t.pwrite(fd, &buf, off) {
            Ok(n) => off += n as i64,
            Err(Errno::ENOSPC) => {
                fails += 1;
                if fails > 3 {
                    break;
                }
                t.fsync(fd).unwrap();
                e.commit().unwrap();
            }
            Err(x) => panic!("fill: {x:?}"),
        }
    }
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    eprintln!("filled {off} bytes; bfree {}", t.statfs("/").unwrap().bfree);
}

#[test]
fn excl_create_whose_acl_fails_is_not_eexist() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("acl-enospc");
    let img = s.0.join("img");
    mkfs_args(
        &img,
        &["-b", "1024", "-I", "128", "-O", "orphan_file"],
        "4M",
    );
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    t.mkdir("/d", 0o777).unwrap();
    let d = acl(&[
        (1, 7, U),
        (2, 7, 1000),
        (4, 5, U),
        (0x10, 7, U),
        (0x20, 0, U),
    ]);
    t.setxattr("/d", POSIX_ACL_DEFAULT, &d, 0).unwrap();
    fill_blocks(&t, &e);
    let r = t.open("/d/f", O_CREAT | O_EXCL | O_WRONLY, 0o644);
    let exists = t.lstat("/d/f").is_ok();
    eprintln!("open(O_CREAT|O_EXCL) -> {r:?}; file exists afterwards: {exists}");
    if let Ok(fd) = r {
        t.close(fd).unwrap();
    }
    let r2 = t.mknodat(-100, "/d/g", 0o100644, 0);
    let exists2 = t.lstat("/d/g").is_ok();
    eprintln!("mknod -> {r2:?}; file exists afterwards: {exists2}");
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    let (code, text) = e2fsck(&img, "-fn");
    let dups = text
        .lines()
        .filter(|l| l.contains("has a non-unique filename"))
        .count();
    eprintln!("e2fsck -fn exit {code}; {dups} non-unique-name reports");
    if code != 0 {
        eprintln!("{}", text.lines().take(12).collect::<Vec<_>>().join("\n"));
    }
    assert_eq!(code, 0, "e2fsck -fn after a failed create");
    assert_ne!(
        r.err(),
        Some(Errno::EEXIST),
        "EEXIST for a name that did not exist"
    );
    assert_ne!(
        r2.err(),
        Some(Errno::EEXIST),
        "mknod: EEXIST for a name that did not exist"
    );
    assert!(!exists && !exists2, "a failed create left the file");
}
