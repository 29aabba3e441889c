//! fallocate mode 0 running out of space part way (ext4): the size grows
//! over the blocks it mapped from the start of the range up to the first
//! hole left, never past it (blocks preallocated further on with
//! KEEP_SIZE do not count), and not at all with KEEP_SIZE; e2fsck clean.

mod common;

use common::*;
use scalevfs::io::FALLOC_FL_KEEP_SIZE;
use scalevfs::{Errno, O_CREAT, O_RDWR};

const BS: u64 = 1024;

#[test]
fn a_short_fallocate_grows_the_size_to_its_first_hole_only() {
    if !have_tools() {
        return;
    }
    for keep in [false, true] {
        let s = Scratch::new("falloc-partial");
        let img = s.0.join("img");
        mkfs_args(&img, &["-b", "1024", "-m", "0"], "4M");
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
        // Preallocated past EOF, far into the range.
        t.fallocate(
            fd,
            FALLOC_FL_KEEP_SIZE,
            (3000 * BS) as i64,
            (10 * BS) as i64,
        )
        .unwrap();
        // Fill all but ~50 blocks.
        let g = t.open("/fill", O_CREAT | O_RDWR, 0o644).unwrap();
        let mut at = 0i64;
        while t.statfs("/").unwrap().bfree > 60 {
            let n = t.pwrite(g, &[1u8; BS as usize], at).unwrap();
            at += n as i64;
        }
        t.fsync(g).unwrap();
        let mode = if keep { FALLOC_FL_KEEP_SIZE } else { 0 };
        assert_eq!(
            t.fallocate(fd, mode, 0, (4000 * BS) as i64),
            Err(Errno::ENOSPC)
        );
        let size = t.fstat(fd).unwrap().size;
        let map = t.fiemap(fd, 0, u64::MAX, 0).unwrap();
        let first_hole = map
            .iter()
            .take_while(|x| x.logical < 3000 * BS)
            .map(|x| x.logical + x.length)
            .max()
            .unwrap_or(0);
        eprintln!("keep {keep}: size {size} first hole {first_hole} {map:?}");
        if keep {
            assert_eq!(size, 0);
        } else {
            assert!(size > 0 && size == first_hole && size < 3000 * BS);
        }
        t.close(g).unwrap();
        t.fsync(fd).unwrap();
        t.close(fd).unwrap();
        unmount_clean(t, vfs, e, &img);
        fsck_clean(&img);
    }
}
