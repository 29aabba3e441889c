//! A commit logs the group-descriptor blocks of the groups that changed,
//! not every descriptor block of the image (`alloc.rs` `write_descs`: one
//! dirty bit per group). Before, every commit re-encoded every descriptor
//! and logged every descriptor block: on a large image, blocks and
//! checksums per commit in proportion to the image's size. The referee is
//! e2fsprogs's own journal reader (`debugfs -R logdump`) on the image as a
//! crash would leave it (the commit durable, not yet checkpointed).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::{debugfs_ro, fresh, fsck_clean, have_tools, rw_journaled, Scratch};
use scalevfs::{Vfs, O_CREAT, O_WRONLY};
use scalevfs_ext4::{BlockDevice, Ext4, MemDevice};

/// Home blocks the log holds, by `debugfs -R logdump`'s "FS block N logged".
fn logged(img: &std::path::Path) -> BTreeSet<u64> {
    let out = debugfs_ro(img, "logdump -a");
    out.lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("FS block ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .collect()
}

#[test]
fn commit_logs_only_changed_descriptor_blocks() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("commitdescs");
    // 1 KiB blocks, 8 MiB groups: 20 groups; 64-byte descriptors, 16 per
    // block: descriptor blocks 2 (groups 0-15) and 3 (groups 16-19).
    let img = fresh(&s.0, 1024, "160M");
    let mem = Arc::new(MemDevice::new(std::fs::read(&img).unwrap()));
    let e = Ext4::open_device(Box::new(mem.clone()), rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    // One file in the root directory (group 0): its inode and its block come
    // from one group.
    let fd = t.open("/f", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.write(fd, &[7u8; 1024]).unwrap();
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    // The image as a crash now would leave it.
    let mut snap = vec![0u8; mem.size() as usize];
    mem.read_at(0, &mut snap).unwrap();
    let crash = s.0.join("crash.img");
    std::fs::write(&crash, &snap).unwrap();
    let blocks = logged(&crash);
    assert!(
        !blocks.is_empty(),
        "logdump shows no logged block: {}",
        debugfs_ro(&crash, "logdump -a")
    );
    let gdt: Vec<u64> = [2u64, 3]
        .into_iter()
        .filter(|b| blocks.contains(b))
        .collect();
    assert_eq!(
        gdt.len(),
        1,
        "one file's create changes the descriptors of one group, in one \
         descriptor block; logged home blocks: {blocks:?}"
    );
    // The descriptors that were written are right: a clean unmount passes
    // e2fsck (which checks every group's counts against its bitmaps).
    e.unmount().unwrap();
    drop(vfs);
    let mut out = vec![0u8; mem.size() as usize];
    mem.read_at(0, &mut out).unwrap();
    std::fs::write(&img, &out).unwrap();
    fsck_clean(&img);
}
