//! INSERT_RANGE whose split needs a new leaf on a full filesystem:
//! ENOSPC with nothing changed on the stepped path (`insert_prepare`),
//! and the file shifts once space is back; e2fsck clean.

mod common;

use std::collections::BTreeMap;

use common::*;
use scalevfs::io::{FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE};
use scalevfs::{Errno, Task, O_CREAT, O_RDWR};

const BS: u64 = 1024;

fn map_of(t: &Task, fd: i32) -> BTreeMap<u64, (u64, bool)> {
    let mut m = BTreeMap::new();
    for x in t.fiemap(fd, 0, u64::MAX, 0).unwrap() {
        for i in 0..x.length / BS {
            m.insert(
                x.logical / BS + i,
                (x.physical / BS + i, x.flags & 0x800 != 0),
            );
        }
    }
    m
}

#[test]
fn enospc_on_the_split_changes_nothing() {
    if !have_tools() {
        return;
    }
    for stepped in [false, true] {
        let s = Scratch::new("shiftrev-enospc");
        let img = s.0.join("img");
        mkfs_args(&img, &["-b", "1024", "-m", "0"], "4M");
        let (e, vfs) = mount(&img);
        e.set_stepped_shifts(stepped);
        e.set_txn_limit(8);
        // Truly full: the kernel's 2% pool, which the split may take, too.
        e.set_reserved_clusters(0).unwrap();
        let t = vfs.root_task();
        let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
        // 252 two-block extents (3 full leaves of 84).
        for i in 0..252u64 {
            t.pwrite(fd, &[i as u8 | 1; 2 * BS as usize], (3 * i * BS) as i64)
                .unwrap();
        }
        t.fsync(fd).unwrap();
        let g = t.open("/fill", O_CREAT | O_RDWR, 0o644).unwrap();
        let chunk = vec![5u8; 64 << 10];
        let mut at = 0;
        while let Ok(n) = t.pwrite(g, &chunk, at) {
            if n == 0 {
                break;
            }
            at += n as i64;
        }
        // A write ends at the page it could not map whole: the last
        // blocks go one at a time.
        while let Ok(n) = t.pwrite(g, &[5u8; BS as usize], at) {
            if n == 0 {
                break;
            }
            at += n as i64;
        }
        t.fsync(g).unwrap();
        let before = map_of(&t, fd);
        let size = t.fstat(fd).unwrap().size;
        let r = t.fallocate(
            fd,
            FALLOC_FL_INSERT_RANGE,
            ((3 * 100 + 1) * BS) as i64,
            (2 * BS) as i64,
        );
        eprintln!(
            "stepped {stepped}: {r:?} free {}",
            t.statfs("/").unwrap().bfree
        );
        if r.is_err() {
            assert_eq!(r, Err(Errno::ENOSPC), "stepped {stepped}");
            assert_eq!(t.fstat(fd).unwrap().size, size);
            assert_eq!(map_of(&t, fd), before);
        } else {
            assert!(!stepped);
            assert_eq!(
                t.fallocate(
                    fd,
                    FALLOC_FL_COLLAPSE_RANGE,
                    ((3 * 100 + 1) * BS) as i64,
                    (2 * BS) as i64,
                ),
                Ok(())
            );
        }
        t.close(g).unwrap();
        t.unlink("/fill").unwrap();
        t.fsync(fd).unwrap();
        scalevfs::flush_deferred_frees();
        e.commit().unwrap();
        assert_eq!(
            t.fallocate(
                fd,
                FALLOC_FL_INSERT_RANGE,
                ((3 * 100 + 1) * BS) as i64,
                (2 * BS) as i64,
            ),
            Ok(())
        );
        t.fsync(fd).unwrap();
        t.close(fd).unwrap();
        unmount_clean(t, vfs, e, &img);
        fsck_clean(&img);
    }
}
