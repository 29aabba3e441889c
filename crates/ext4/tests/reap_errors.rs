//! A read error while an unlinked inode is being freed (here: its xattr
//! block, read after its data blocks were queued to be freed and its
//! orphan record removed) must not commit half of the free: the
//! filesystem stops writing, so the image keeps its last committed state,
//! which e2fsck passes. It used to go on: the commit freed the blocks
//! while the inode, out of the orphan file, still mapped them, and the
//! next file took them (cross-linked; e2fsck: "Deleted inode has zero
//! dtime", bitmap differences).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::*;
use scalevfs::{Vfs, O_CREAT, O_RDWR};
use scalevfs_ext4::{BlockDevice, Ext4, MemDevice};

#[test]
fn a_read_error_while_freeing_an_unlinked_inode_stops_writes() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("reap-eio");
    let img = fresh(&s.0, 4096, "16M");
    {
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        let fd = t.open("/a", O_CREAT | O_RDWR, 0o644).unwrap();
        t.write(fd, &vec![7u8; 64 << 10]).unwrap();
        t.close(fd).unwrap();
        t.setxattr("/a", "user.big", &vec![b'v'; 3000], 0).unwrap();
        unmount_clean(t, vfs, e, &img);
    }
    let acl: u64 = debugfs_ro(&img, "stat /a")
        .split("File ACL: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("an xattr block");
    assert_ne!(acl, 0);
    let mem = Arc::new(MemDevice::new(std::fs::read(&img).unwrap()));
    let fail = Arc::new(AtomicU64::new(0));
    // Reads of the block `fail` names fail (EIO).
    let mut dev = Hooked::new(mem.clone());
    let f = fail.clone();
    dev.on_read = Box::new(move |off, len| {
        let b = f.load(Ordering::SeqCst);
        let (a, z) = (off / 4096, (off + len as u64 - 1) / 4096);
        if b != 0 && a <= b && b <= z {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    });
    let e = Ext4::open_device(Box::new(dev), rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    fail.store(acl, Ordering::SeqCst);
    t.unlink("/a").unwrap();
    scalevfs::flush_deferred_frees();
    // The next handle frees /a's inode and fails reading its xattr block.
    let _ = t.open("/b", O_CREAT | O_RDWR, 0o644);
    fail.store(0, Ordering::SeqCst);
    // From then on nothing is written.
    let later = t
        .open("/c", O_CREAT | O_RDWR, 0o644)
        .and_then(|fd| t.write(fd, &vec![9u8; 64 << 10]).map(|_| fd))
        .and_then(|fd| t.fsync(fd));
    assert!(later.is_err(), "the filesystem went on writing: {later:?}");
    assert!(e.commit().is_err());
    drop(t);
    drop(vfs);
    assert!(e.unmount().is_err());
    drop(e);
    let mut out = vec![0u8; mem.size() as usize];
    mem.read_at(0, &mut out).unwrap();
    std::fs::write(&img, &out).unwrap();
    // As after a crash: e2fsck replays a copy and finds it consistent.
    let copy = s.0.join("copy");
    std::fs::copy(&img, &copy).unwrap();
    let (code, text) = e2fsck(&copy, "-fy");
    assert!(code <= 1, "e2fsck -fy exit {code}: {text}");
    let (code, text) = e2fsck(&copy, "-fn");
    assert_eq!(code, 0, "{text}");
    // Our mount recovers the same; the last commit was before the unlink:
    // /a is whole.
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t.open("/a", O_RDWR, 0).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    assert_eq!(t.read(fd, &mut buf).unwrap(), 64 << 10);
    assert!(buf.iter().all(|&b| b == 7));
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
}
