//! More unlinked-but-open files than the orphan file has slots: the rest go
//! on the in-memory overflow list (`scalevfs-orphan`), whose lock is taken
//! under an ext4 directory's lock (unlink) and the commit lock (freeing at
//! commit). In a debug build the lock-order checker runs on every
//! acquisition here: a wrong level in the table panics. Every inode is freed
//! once closed, and the image is clean.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::{fsck_clean, have_tools, mkfs, rw_journaled, sb_field, Scratch};
use scalevfs::{Vfs, O_CREAT, O_WRONLY};
use scalevfs_ext4::{BlockDevice, Ext4, MemDevice};

#[test]
fn more_open_unlinked_files_than_orphan_slots() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("orphanoverflow");
    let img = s.0.join("img");
    // 1 KiB blocks, a two-block orphan file: 2 x 254 slots.
    let out = Command::new(mkfs().unwrap())
        .args([
            "-q",
            "-F",
            "-b",
            "1024",
            "-O",
            "orphan_file",
            "-E",
            "orphan_file_size=2",
        ])
        .arg(&img)
        .arg("16M")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let count = |name: &str| -> u64 { sb_field(&img, name).parse().unwrap() };
    let (blocks0, inodes0) = (count("Free blocks"), count("Free inodes"));
    let mem = Arc::new(MemDevice::new(std::fs::read(&img).unwrap()));
    let e = Ext4::open_device(Box::new(mem.clone()), rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    const N: usize = 600;
    let mut fds = Vec::new();
    for i in 0..N {
        let p = format!("/d/f{i}");
        let fd = t.open(&p, O_CREAT | O_WRONLY, 0o644).unwrap();
        t.write(fd, &[i as u8; 1500]).unwrap();
        t.unlink(&p).unwrap();
        fds.push(fd);
    }
    // A commit with every one of them still open: nothing may be freed.
    e.commit().unwrap();
    for fd in fds {
        t.close(fd).unwrap();
    }
    e.commit().unwrap();
    e.unmount().unwrap();
    drop(vfs);
    let mut bytes = vec![0u8; mem.size() as usize];
    mem.read_at(0, &mut bytes).unwrap();
    std::fs::write(&img, &bytes).unwrap();
    fsck_clean(&img);
    // Everything but /d (an inode and its block) came back.
    assert_eq!(count("Free inodes"), inodes0 - 1);
    assert_eq!(count("Free blocks"), blocks0 - 1);
}
