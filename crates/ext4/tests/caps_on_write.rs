//! File capabilities stored in an image go at the first write after a
//! remount, as Linux's `file_remove_privs` removes `security.capability`
//! on any write: the inode's "may have capabilities" mark is set when
//! ext4 reads an inode that has the attribute, not only when this session
//! set it. Checked with the attribute in the inode body and in the xattr
//! block (a large value elsewhere pushes it there).

mod common;

use common::{fresh, fsck_clean, have_tools, rw_journaled, Scratch};
use scalevfs::{Errno, Vfs, O_CREAT, O_WRONLY};
use scalevfs_ext4::Ext4;

/// A v2 capability set: CAP_NET_BIND_SERVICE permitted and effective.
fn cap_v2() -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&0x0200_0001u32.to_le_bytes());
    v.extend_from_slice(&(1u32 << 10).to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v
}

#[test]
fn capabilities_read_from_the_image_go_at_the_next_write() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("capswrite");
    let img = fresh(&s.0, 4096, "16M");
    {
        let e = Ext4::open(&img, rw_journaled()).unwrap();
        let vfs = Vfs::with_root_fs(Default::default(), e.clone());
        let t = vfs.root_task();
        for name in ["/body", "/block"] {
            let fd = t.open(name, O_CREAT | O_WRONLY, 0o755).unwrap();
            t.write(fd, b"#!/bin/true\n").unwrap();
            t.close(fd).unwrap();
        }
        // A big attribute first fills the inode body: the capability
        // then lands in the xattr block.
        t.setxattr("/block", "user.big", &vec![b'x'; 300], 0)
            .unwrap();
        for name in ["/body", "/block"] {
            t.setxattr(name, "security.capability", &cap_v2(), 0)
                .unwrap();
        }
        drop(t);
        drop(vfs);
        e.unmount().unwrap();
    }
    fsck_clean(&img);
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let mut buf = vec![0u8; 64];
    for name in ["/body", "/block"] {
        assert_eq!(
            t.getxattr(name, "security.capability", &mut buf).unwrap(),
            20
        );
        let fd = t.open(name, O_WRONLY, 0).unwrap();
        t.pwrite(fd, b"x", 0).unwrap();
        t.close(fd).unwrap();
        assert_eq!(
            t.getxattr(name, "security.capability", &mut buf),
            Err(Errno::ENODATA),
            "{name}: the capability survived a write"
        );
    }
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);
}
