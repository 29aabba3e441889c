//! ext4's `i_crtime` is the inode's birth time both ways: a file made
//! through scalevfs reads back through the kernel's loop mount (statx
//! `stx_btime`) with the birth time scalevfs reported, and a file the
//! kernel made reads back through scalevfs with the kernel's. Before,
//! scalevfs wrote the field but reported no birth time at all (review of
//! the std::fs layer, stop 51). Inodes of 128 bytes have no room for one:
//! none is reported, as the kernel reports none.

mod common;
#[path = "support/sys_pair.rs"]
mod sys_pair;

use common::*;
use scalevfs::{O_CREAT, O_RDWR};

/// The kernel's statx birth time of `p`, if it reports one.
fn kernel_btime(p: &std::path::Path) -> Option<(i64, i64)> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statx into a zeroed struct we own, on a live C string.
    unsafe {
        let mut sx: libc::statx = std::mem::zeroed();
        let r = libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_BTIME, &mut sx);
        assert_eq!(r, 0, "statx {}", p.display());
        (sx.stx_mask & libc::STATX_BTIME != 0)
            .then(|| (sx.stx_btime.tv_sec, i64::from(sx.stx_btime.tv_nsec)))
    }
}

#[test]
fn birth_times_cross_between_scalevfs_and_the_kernel() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("btime");
    for isize in ["256", "128"] {
        let img = s.0.join(format!("i{isize}.img"));
        mkfs_args(&img, &["-b", "4096", "-I", isize], "64M");
        // Ours: made, then read back after a remount.
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        t.close(t.open("/ours", O_CREAT | O_RDWR, 0o644).unwrap())
            .unwrap();
        let born = t.statx(scalevfs::AT_FDCWD, "/ours", 0).unwrap().btime;
        unmount_clean(t, vfs, e, &img);
        if isize == "128" {
            assert_eq!(born, None, "a 128-byte inode has no crtime");
        } else {
            assert!(born.is_some());
        }
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        assert_eq!(
            t.statx(scalevfs::AT_FDCWD, "/ours", 0).unwrap().btime,
            born,
            "after a remount"
        );
        unmount_clean(t, vfs, e, &img);
        // The kernel's view, and a file the kernel makes.
        let dir = s.0.join(format!("mnt{isize}"));
        let m = match sys_pair::loop_mount(&img, &dir) {
            Ok(m) => m,
            Err(err) => {
                eprintln!("kernel side skipped: loop mount failed: {err}");
                continue;
            }
        };
        let ours = born.map(|b| (b.sec, b.nsec));
        assert_eq!(
            kernel_btime(&dir.join("ours")),
            ours,
            "the kernel reads ours"
        );
        std::fs::write(dir.join("theirs"), b"k").unwrap();
        let theirs = kernel_btime(&dir.join("theirs"));
        eprintln!("{isize}-byte inodes: the kernel's file born {theirs:?}, ours {ours:?}");
        drop(m);
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        let got = t
            .statx(scalevfs::AT_FDCWD, "/theirs", 0)
            .unwrap()
            .btime
            .map(|b| (b.sec, b.nsec));
        assert_eq!(got, theirs, "we read the kernel's");
        unmount_clean(t, vfs, e, &img);
    }
}
