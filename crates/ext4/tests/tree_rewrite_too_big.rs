//! A change that rewrites a whole extent tree too large for one
//! transaction (issue 15's leftover): on an image with the smallest
//! journal (1024 blocks of 1 KiB), a file of 90,000 one-block extents
//! (~1,070 leaves: more tree blocks than the log holds) gets an
//! INSERT_RANGE, which rewrites its whole tree in one handle. Before, the
//! commit found the transaction larger than the log (EUCLEAN) and the
//! mount stopped writing. Now the insert fails up front with ENOSPC (what
//! jbd2 answers a handle that asks for more than a transaction holds),
//! nothing changed: the file reads back the same, the mount goes on
//! writing, a small insert on another file works, and `e2fsck -fn` is
//! clean.

mod common;

use std::os::unix::fs::FileExt;
use std::process::Command;

use common::{fsck_clean, have_tools, mkfs, rw_journaled, Scratch};
use scalevfs::io::FALLOC_FL_INSERT_RANGE;
use scalevfs::{Errno, Vfs, O_CREAT, O_RDONLY, O_RDWR};
use scalevfs_ext4::Ext4;

const BS: u64 = 1024;
/// One-block extents of /f (data in every other block).
const EXTENTS: u64 = 90_000;

fn block(k: u64) -> Vec<u8> {
    let mut b = vec![(k % 251) as u8 | 1; BS as usize];
    b[..8].copy_from_slice(&k.to_le_bytes());
    b
}

#[test]
fn an_insert_range_too_large_for_the_log_fails_with_enospc_and_changes_nothing() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("treetoobig");
    let src = s.0.join("src");
    std::fs::create_dir(&src).unwrap();
    {
        // Sparse on the host: mke2fs -d keeps the holes, so each data
        // block is an extent of its own.
        let f = std::fs::File::create(src.join("f")).unwrap();
        for k in 0..EXTENTS {
            f.write_at(&block(k), (2 * k + 1) * BS).unwrap();
        }
    }
    let img = s.0.join("img");
    let out = Command::new(mkfs().unwrap())
        .args(["-q", "-F", "-b", "1024", "-J", "size=1", "-m", "0"])
        .arg("-d")
        .arg(&src)
        .arg(&img)
        .arg("200M")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mkfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&src).unwrap();
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fd = t.open("/f", O_RDWR, 0).unwrap();
    let size = t.fstat(fd).unwrap().size;
    assert_eq!(size, 2 * EXTENTS * BS);
    let r = t.fallocate(fd, FALLOC_FL_INSERT_RANGE, 0, BS as i64);
    assert_eq!(
        r,
        Err(Errno::ENOSPC),
        "INSERT_RANGE over a tree larger than the log"
    );
    assert_eq!(t.fstat(fd).unwrap().size, size, "nothing changed");
    for k in [0, 1, EXTENTS / 2, EXTENTS - 1] {
        let mut b = vec![0u8; BS as usize];
        assert_eq!(
            t.pread(fd, &mut b, ((2 * k + 1) * BS) as i64).unwrap(),
            b.len()
        );
        assert_eq!(b, block(k), "block {k} of /f");
    }
    t.close(fd).unwrap();
    // The mount still writes: a new file, and an insert on a small tree.
    let g = t.open("/g", O_CREAT | O_RDWR, 0o644).unwrap();
    t.pwrite(g, &[7u8; 4 * BS as usize], 0).unwrap();
    t.fallocate(g, FALLOC_FL_INSERT_RANGE, BS as i64, BS as i64)
        .unwrap();
    t.fsync(g).unwrap();
    assert_eq!(t.fstat(g).unwrap().size, 5 * BS);
    t.close(g).unwrap();
    let fd = t.open("/f", O_RDONLY, 0).unwrap();
    t.close(fd).unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
}
