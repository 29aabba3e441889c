//! `rm big; write` on a full filesystem gets the removed file's space, as
//! on the kernel, where unlink frees it at once. Here the inode goes a
//! grace period after its last name and descriptor, and its blocks with
//! it: a write that finds no space runs again after this thread's
//! deferred frees ran (`Task::write_retrying`); so do fallocate and
//! setxattr. They failed with ENOSPC (the random kernel differential,
//! seeds 122, 130 and 348 at 1 KiB).

mod common;

use common::*;
use scalevfs::{Errno, O_CREAT, O_RDWR};

#[test]
fn a_write_right_after_an_unlink_gets_the_space() {
    let Some((_s, img, e, vfs)) = mount_fresh("unlink-space", "32M") else {
        return;
    };
    let pool = resv_pool(&img);
    // Full (all but the pool), and remounted: nothing but the name holds
    // the big file.
    {
        let t = vfs.root_task();
        let fd = t.open("/big", O_CREAT | O_RDWR, 0o644).unwrap();
        assert_eq!(t.fallocate(fd, 0, 0, 40 << 20), Err(Errno::ENOSPC));
        assert_eq!(t.statfs("/").unwrap().bfree, pool);
        t.close(fd).unwrap();
        unmount_clean(t, vfs, e, &img);
    }
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    let w = t.open("/w", O_CREAT | O_RDWR, 0o644).unwrap();
    t.unlink("/big").unwrap();
    // Both write paths: pwrite, and write at the description's position.
    let n = 4 << 20;
    assert_eq!(t.pwrite(fd, &vec![1u8; n], 12345), Ok(n));
    assert_eq!(t.write(w, &vec![2u8; n]), Ok(n));
    assert_eq!(t.fstat(w).unwrap().size, n as u64);
    t.close(fd).unwrap();
    t.close(w).unwrap();
    unmount_clean(t, vfs, e, &img);
}

/// The same for fallocate, and for an unlinked file whose last descriptor
/// just closed (the kernel frees it at that close): seed 130 at 1 KiB.
#[test]
fn a_fallocate_right_after_the_last_close_of_an_unlinked_file_gets_the_space() {
    let Some((_s, img, e, vfs)) = mount_fresh("close-space", "32M") else {
        return;
    };
    let t = vfs.root_task();
    let gone = t.open("/gone", O_CREAT | O_RDWR, 0o644).unwrap();
    t.unlink("/gone").unwrap();
    assert_eq!(t.fallocate(gone, 0, 0, 40 << 20), Err(Errno::ENOSPC));
    let f = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    t.close(gone).unwrap();
    assert_eq!(t.fallocate(f, 0, 0, 8 << 20), Ok(()));
    t.close(f).unwrap();
    unmount_clean(t, vfs, e, &img);
}

/// The same for an extended attribute that needs a block: the removed
/// file's attribute block comes back a grace period after its unlink, and
/// setxattr runs again after the deferred frees (random kernel
/// differential, seed 348 at 1 KiB, where the kernel's setxattr succeeded).
#[test]
fn a_setxattr_right_after_an_unlink_gets_the_attribute_block() {
    let Some((_s, img, e, vfs)) = mount_fresh("unlink-xattr", "32M") else {
        return;
    };
    let pool = resv_pool(&img);
    {
        let t = vfs.root_task();
        let x = t.open("/x", O_CREAT | O_RDWR, 0o644).unwrap();
        t.close(x).unwrap();
        t.setxattr("/x", "user.big", &[7u8; 600], 0).unwrap();
        let fd = t.open("/big", O_CREAT | O_RDWR, 0o644).unwrap();
        assert_eq!(t.fallocate(fd, 0, 0, 40 << 20), Err(Errno::ENOSPC));
        t.close(fd).unwrap();
        unmount_clean(t, vfs, e, &img);
    }
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let y = t.open("/y", O_CREAT | O_RDWR, 0o644).unwrap();
    t.close(y).unwrap();
    assert_eq!(t.statfs("/").unwrap().bfree, pool);
    assert_eq!(
        t.setxattr("/y", "trusted.t", &[1u8; 567], 0),
        Err(Errno::ENOSPC),
        "full: no block for the attribute"
    );
    t.unlink("/x").unwrap();
    t.setxattr("/y", "trusted.t", &[1u8; 567], 0).unwrap();
    let mut v = [0u8; 1000];
    assert_eq!(t.getxattr("/y", "trusted.t", &mut v), Ok(567));
    assert_eq!(v[..567], [1u8; 567]);
    unmount_clean(t, vfs, e, &img);
}
