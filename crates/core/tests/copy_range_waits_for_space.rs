//! `rm big; copy_file_range` on a full memfs gets the removed file's
//! space, as `rm big; write` does. A test binary of its own: the space
//! comes back a grace period after the unlink, and other tests' pinned
//! threads in the same process would hold the epoch back.

mod common;

use scalevfs::*;

const PAGE: u64 = 4096;

/// `rm big; copy_file_range` on a full filesystem gets the removed file's
/// space, as `rm big; write` does (its last count is freed a grace period
/// later; the copy waits for it as a write does) (review, stop 49: the
/// copy failed with ENOSPC at once, and held one pin across the whole
/// copy). tmpfs frees at the unlink, so the copy succeeds there.
#[test]
fn copy_file_range_waits_for_removed_space() {
    let vfs = common::memfs_with("size=256k,nr_inodes=16");
    let t = vfs.root_task();
    let page = PAGE as usize;
    let src = t.open("/src", O_CREAT | O_RDWR, 0o644).unwrap();
    assert_eq!(t.write(src, &vec![3u8; 6 * page]), Ok(6 * page));
    let big = t.open("/big", O_CREAT | O_RDWR, 0o644).unwrap();
    // Every page left (a short write ends at the limit).
    let n = t.write(big, &vec![4u8; 64 * page]).unwrap();
    assert!(n >= 50 * page, "{n}");
    assert_eq!(t.write(big, b"x"), Err(Errno::ENOSPC));
    t.close(big).unwrap();
    let dst = t.open("/dst", O_CREAT | O_RDWR, 0o644).unwrap();
    t.unlink("/big").unwrap();
    assert_eq!(
        t.copy_file_range(src, Some(0), dst, Some(0), 6 * page, 0),
        Ok(6 * page)
    );
    let mut b = vec![0u8; 6 * page];
    assert_eq!(t.pread(dst, &mut b, 0), Ok(6 * page));
    assert!(b.iter().all(|&x| x == 3));
}
