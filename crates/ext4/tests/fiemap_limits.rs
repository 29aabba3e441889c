//! FIEMAP's range checks against the kernel's: the limit is the file's
//! own (`s_bitmap_maxbytes` for a block-mapped file, `s_maxbytes` for an
//! extent file), then the filesystem's (review, stop 51). Before, every
//! file was checked against `s_maxbytes` alone and with `start >= max`:
//! a block-mapped file asked at 8 TiB got an empty answer where the kernel
//! says EFBIG, and an extent file asked exactly at `s_maxbytes` got EFBIG
//! where the kernel says EINVAL. The same starts and lengths run through
//! scalevfs and, where this machine loop-mounts ext4, the kernel on a
//! copy of the image; the expected errnos (measured on the host kernel,
//! 4 KiB blocks) are checked either way.

mod common;
#[path = "support/sys_pair.rs"]
mod sys_pair;

use common::*;
use scalevfs::{Errno, O_CREAT, O_RDWR};

/// `s_maxbytes` with 4 KiB blocks and huge_file: 2^32 - 1 blocks.
const SMAX: u64 = ((1 << 32) - 1) * 4096;

/// (start, len) and the kernel's answer for an extent file and for a
/// block-mapped one (`Ok(n)`: n extents; the file has one).
#[allow(clippy::type_complexity)]
fn cases() -> Vec<((u64, u64), Result<usize, i32>, Result<usize, i32>)> {
    let efbig = Err(libc::EFBIG);
    vec![
        ((0, 4096), Ok(1), Ok(1)),
        ((0, u64::MAX), Ok(1), Ok(1)),
        ((0, 0), Err(libc::EINVAL), Err(libc::EINVAL)),
        ((1 << 43, 4096), Ok(0), efbig),
        ((1 << 43, u64::MAX), Ok(0), efbig),
        ((SMAX - 4096, 4096), Ok(0), efbig),
        ((SMAX, 4096), Err(libc::EINVAL), efbig),
        ((SMAX, u64::MAX), Err(libc::EINVAL), efbig),
        ((SMAX + 1, 4096), efbig, efbig),
        ((u64::MAX, 1), efbig, efbig),
    ]
}

fn ours(img: &std::path::Path, start: u64, len: u64) -> Result<usize, i32> {
    let (e, vfs) = mount(img);
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    t.write(fd, &[7u8; 5000]).unwrap();
    let r = t.fiemap(fd, start, len, 0).map(|v| v.len());
    t.close(fd).unwrap();
    t.unlink("/f").unwrap();
    unmount_clean(t, vfs, e, img);
    r.map_err(Errno::raw)
}

#[test]
fn fiemap_limits_match_the_kernel() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("fiemaplim");
    for (name, args) in [
        ("extents", &["-b", "4096"][..]),
        ("block-mapped", &["-b", "4096", "-O", "^extent,^64bit"][..]),
    ] {
        let img = s.0.join(format!("{name}.img"));
        mkfs_args(&img, args, "64M");
        let host = s.0.join(format!("{name}-host.img"));
        std::fs::copy(&img, &host).unwrap();
        let dir = s.0.join(format!("{name}-mnt"));
        let kernel = match sys_pair::loop_mount(&host, &dir) {
            Ok(m) => {
                std::fs::write(dir.join("f"), [7u8; 5000]).unwrap();
                Some(m)
            }
            Err(e) => {
                eprintln!("kernel side skipped: loop mount failed: {e}");
                None
            }
        };
        for ((start, len), ext, mapped) in cases() {
            let want = if name == "extents" { ext } else { mapped };
            let got = ours(&img, start, len);
            assert_eq!(got, want, "{name}: fiemap({start}, {len})");
            if kernel.is_some() {
                let k = kernel_fiemap(&dir.join("f"), start, len).map(|v| v.len());
                assert_eq!(k, want, "{name}: the kernel's fiemap({start}, {len})");
            }
        }
        drop(kernel);
    }
}
