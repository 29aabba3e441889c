//! POSIX ACLs on the ext4 type are enforced from the image, not only from
//! memory: an ACL set through scalevfs, and one set by the kernel's ext4
//! (setfacl on a loop mount), decide a non-owner's access after the image
//! is opened again (the inode read fresh loads its ACL into the core's
//! cache); a default ACL stored on a directory is inherited by files
//! created after the reopen; a chmod rewrites the stored ACL; e2fsck stays
//! clean. Skipped (with the reason printed) without e2fsprogs; the kernel
//! part also without root, setfacl or loop mounts.

mod common;

use std::path::Path;
use std::process::Command;

use common::{fresh, fsck_clean, have_tools, rw_journaled, KMount, Scratch};
use scalevfs::xattr::{encode_acl, AclEntry, POSIX_ACL_ACCESS, POSIX_ACL_DEFAULT};
use scalevfs::{Cred, Errno, Vfs, O_CREAT, O_RDONLY, O_WRONLY, R_OK, W_OK};
use scalevfs_ext4::Ext4;

const U: u32 = u32::MAX;

fn acl(e: &[(u16, u16, u32)]) -> Vec<u8> {
    let v: Vec<AclEntry> = e
        .iter()
        .map(|&(tag, perm, id)| AclEntry { tag, perm, id })
        .collect();
    encode_acl(&v)
}

/// Open the image in a fresh Vfs, run `f` with a root task and a task of
/// uid/gid 1000, unmount.
fn with_image(img: &Path, f: impl FnOnce(&scalevfs::Task, &scalevfs::Task)) {
    let e = Ext4::open(img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let root = vfs.root_task();
    let user = vfs.task(Cred::user(1000, 1000));
    f(&root, &user);
    drop((root, user, vfs));
    e.unmount().unwrap();
}

#[test]
fn acls_set_by_scalevfs_are_enforced_after_a_reopen() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("acl-ext4");
    let img = fresh(&s.0, 4096, "16M");
    with_image(&img, |t, _| {
        let fd = t.open("/f", O_CREAT | O_WRONLY, 0o600).unwrap();
        t.close(fd).unwrap();
        // user 1000: read only.
        let a = acl(&[
            (1, 6, U),
            (2, 4, 1000),
            (4, 0, U),
            (0x10, 4, U),
            (0x20, 0, U),
        ]);
        t.setxattr("/f", POSIX_ACL_ACCESS, &a, 0).unwrap();
        t.mkdir("/d", 0o777).unwrap();
        t.chmod("/d", 0o777).unwrap();
        let d = acl(&[
            (1, 7, U),
            (2, 7, 1000),
            (4, 5, U),
            (0x10, 7, U),
            (0x20, 0, U),
        ]);
        t.setxattr("/d", POSIX_ACL_DEFAULT, &d, 0).unwrap();
        // A file whose ACL is rewritten by chmod: mask to 0.
        let fd = t.open("/g", O_CREAT | O_WRONLY, 0o600).unwrap();
        t.close(fd).unwrap();
        let g = acl(&[
            (1, 6, U),
            (2, 6, 1000),
            (4, 0, U),
            (0x10, 6, U),
            (0x20, 0, U),
        ]);
        t.setxattr("/g", POSIX_ACL_ACCESS, &g, 0).unwrap();
        t.chmod("/g", 0o640).unwrap();
    });
    fsck_clean(&img);
    with_image(&img, |t, u| {
        // Loaded from the image: the named entry decides.
        assert_eq!(u.access("/f", R_OK), Ok(()));
        assert_eq!(u.access("/f", W_OK), Err(Errno::EACCES));
        let fd = u.open("/f", O_RDONLY, 0).unwrap();
        u.close(fd).unwrap();
        // chmod 0640 made the mask r: read yes, write no.
        assert_eq!(u.access("/g", R_OK), Ok(()));
        assert_eq!(u.access("/g", W_OK), Err(Errno::EACCES));
        // The default ACL, read from the image, is inherited (umask ignored).
        t.umask(0o077);
        let fd = t.open("/d/n", O_CREAT | O_WRONLY, 0o666).unwrap();
        t.close(fd).unwrap();
        assert_eq!(t.stat("/d/n").unwrap().mode & 0o777, 0o660);
        assert_eq!(u.access("/d/n", W_OK), Ok(()));
        let mut buf = vec![0u8; 256];
        assert!(t.getxattr("/d/n", POSIX_ACL_ACCESS, &mut buf).is_ok());
    });
    fsck_clean(&img);
}

#[test]
fn acls_set_by_the_kernel_are_enforced() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: not root (loop mount)");
        return;
    }
    if Command::new("setfacl").arg("--version").output().is_err() {
        eprintln!("skipped: setfacl (acl) is not installed");
        return;
    }
    let s = Scratch::new("acl-ext4-kernel");
    let img = fresh(&s.0, 4096, "16M");
    let mnt = s.0.join("mnt");
    let Some(km) = KMount::rw(&img, &mnt) else {
        return;
    };
    let sh = format!(
        "cd {} && echo hi > f && chmod 600 f && setfacl -m u:1000:r f && mkdir d && chmod 777 d && setfacl -d -m u:1000:rwx,o::- d",
        mnt.display()
    );
    let ok = Command::new("sh")
        .arg("-c")
        .arg(&sh)
        .status()
        .unwrap()
        .success();
    drop(km);
    assert!(ok, "setfacl on the kernel's mount failed");
    fsck_clean(&img);
    with_image(&img, |t, u| {
        assert_eq!(u.access("/f", R_OK), Ok(()));
        assert_eq!(u.access("/f", W_OK), Err(Errno::EACCES));
        let fd = t.open("/d/n", O_CREAT | O_WRONLY, 0o666).unwrap();
        t.close(fd).unwrap();
        assert_eq!(u.access("/d/n", W_OK), Ok(()));
    });
    fsck_clean(&img);
}
