//! An extended attribute too large for the room an inode has (its body and
//! one block) fails with ENOSPC at once, as on Linux: no freeing can make
//! it fit, so neither the VFS's waits for deferred frees
//! (`namei::EnospcWait`, six tries over 31 ms) nor ext4's commit before a
//! retry (`journaled`) may run for it (`scalevfs::enospc_final`). They
//! did: each such call cost 31 ms and seven commits, and xfstests
//! generic/642 (fsstress setting large attributes from four processes)
//! ran for many minutes.

mod common;

use common::*;
use scalevfs::{Errno, O_CREAT, O_RDWR};

#[test]
fn an_attribute_that_cannot_fit_fails_without_retries_or_commits() {
    let Some((_s, img, e, vfs)) = mount_fresh("xattr-enospc-final", "8M") else {
        return;
    };
    let t = vfs.root_task();
    // An unlinked file still open: ext4 then commits before retrying an
    // allocation that found no space (its inode waits to be freed).
    let held = t.open("/held", O_CREAT | O_RDWR, 0o644).unwrap();
    t.unlink("/held").unwrap();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    t.close(fd).unwrap();
    // 1 KiB blocks: 2,000 bytes fit neither in the inode nor in a block.
    let big = vec![b'v'; 2000];
    let before = e.commit_stats().1;
    assert_eq!(t.setxattr("/f", "user.big", &big, 0), Err(Errno::ENOSPC));
    assert_eq!(
        e.commit_stats().1,
        before,
        "commits requested for an attribute that cannot fit"
    );
    // One that fits still goes in, and a real shortage still retries: the
    // mark does not outlive the call that set it.
    t.setxattr("/f", "user.small", b"x", 0).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(t.getxattr("/f", "user.small", &mut buf), Ok(1));
    assert_eq!(buf[0], b'x');
    assert!(!scalevfs::enospc_is_final());
    t.close(held).unwrap();
    unmount_clean(t, vfs, e, &img);
}
