//! `st_blksize` on the ext4 type is the filesystem's block size, as the
//! kernel's ext4 gives (`i_blkbits`): programs size their I/O by it, and
//! xfstests' generic/486 sizes an xattr value to 3/4 of it, which on a
//! 1 KiB-block image must fit one xattr block (with 4096 reported it did
//! not: ENOSPC).

mod common;

use common::*;

#[test]
fn st_blksize_is_the_block_size() {
    if !have_tools() {
        return;
    }
    for bs in [1024usize, 2048, 4096] {
        let s = Scratch::new("blksize");
        let img = fresh(&s.0, bs, "32M");
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        t.mkdir("/d", 0o755).unwrap();
        let fd = t
            .open("/d/f", (libc::O_CREAT | libc::O_WRONLY) as u32, 0o644)
            .unwrap();
        t.close(fd).unwrap();
        for p in ["/", "/d", "/d/f"] {
            let st = t.stat(p).unwrap();
            assert_eq!(st.blksize as usize, bs, "{p} on a {bs}-byte-block image");
        }
        // The value generic/486 sets: 3/4 of st_blksize replaces a 1-byte one.
        let fd = t.open("/d/f", libc::O_RDWR as u32, 0).unwrap();
        t.fsetxattr(fd, "user.world", b"0", scalevfs::xattr::XATTR_CREATE)
            .unwrap();
        let big = vec![b'1'; bs * 3 / 4];
        t.fsetxattr(fd, "user.world", &big, scalevfs::xattr::XATTR_REPLACE)
            .unwrap();
        let mut got = vec![0u8; bs];
        let n = t.fgetxattr(fd, "user.world", &mut got).unwrap();
        assert_eq!(&got[..n], &big[..]);
        t.close(fd).unwrap();
        unmount_clean(t, vfs, e, &img);
    }
}
