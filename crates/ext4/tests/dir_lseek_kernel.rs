//! lseek on ext4 directories against the kernel's ext4 on the same image:
//! a hashed directory (one block, or an htree) ends at the 64-bit htree
//! end cookie (SEEK_END, SEEK_DATA, SEEK_HOLE answer against it, as
//! ext4_dir_llseek), a linear one (no dir_index) at its size; reading on
//! from the end lists nothing. scalevfs answered EINVAL for all but
//! SEEK_SET and SEEK_CUR (tmpfs's rule, which memfs keeps).

mod common;

use std::os::fd::AsRawFd;
use std::path::Path;

use common::*;
use scalevfs::{O_CREAT, O_DIRECTORY, O_RDONLY, O_WRONLY};

const SEEKS: [(u32, i64); 15] = [
    (2, 0),
    (2, -5),
    (2, 1),
    (3, 0),
    (3, 100),
    (3, -1),
    (4, 0),
    (4, 4096),
    (4, i64::MAX),
    (0, 12345),
    (1, 5),
    (0, -1),
    (1, i64::MAX),
    // Past s_bitmap_maxbytes at 1 KiB blocks (about 16 GiB): the limit of
    // a linear directory without the extent flag (inline).
    (0, 1 << 36),
    (0, 0),
];

fn kernel_seeks(dir: &Path) -> Vec<Result<u64, i32>> {
    let f = std::fs::File::open(dir).unwrap();
    SEEKS
        .iter()
        .map(|&(w, o)| {
            // SAFETY: a plain syscall on an open descriptor.
            let r = unsafe { libc::lseek(f.as_raw_fd(), o, w as i32) };
            if r < 0 {
                Err(std::io::Error::last_os_error().raw_os_error().unwrap())
            } else {
                Ok(r as u64)
            }
        })
        .collect()
}

fn our_seeks(t: &scalevfs::Task, dir: &str) -> (Vec<Result<u64, i32>>, usize) {
    let fd = t.open(dir, O_RDONLY | O_DIRECTORY, 0).unwrap();
    let r = SEEKS
        .iter()
        .map(|&(w, o)| t.lseek(fd, o, w).map_err(|e| e.raw()))
        .collect();
    // From the end, nothing is listed.
    t.lseek(fd, 0, 2).unwrap();
    let after_end = t.getdents(fd, 64).unwrap().len();
    t.close(fd).unwrap();
    (r, after_end)
}

fn compare(tag: &str, mkfs: &[&str]) {
    if !have_tools() {
        return;
    }
    let s = Scratch::new(tag);
    let img = s.0.join("img");
    mkfs_args(&img, mkfs, "32M");
    let dirs = ["/small", "/big"];
    {
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        for d in dirs {
            t.mkdir(d, 0o755).unwrap();
        }
        t.close(t.open("/small/f", O_CREAT | O_WRONLY, 0o644).unwrap())
            .unwrap();
        for i in 0..400 {
            let name = format!("/big/{i:04}-a-rather-long-name-to-fill-blocks-sooner");
            t.close(t.open(name.as_str(), O_CREAT | O_WRONLY, 0o644).unwrap())
                .unwrap();
        }
        unmount_clean(t, vfs, e, &img);
    }
    let kimg = s.0.join("kernel.img");
    std::fs::copy(&img, &kimg).unwrap();
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let ours: Vec<_> = dirs.iter().map(|d| our_seeks(&t, d)).collect();
    unmount_clean(t, vfs, e, &img);
    // What holds whatever the kernel says: nothing is listed from the
    // end, and SEEK_SET to a position in range lands there while a
    // negative one is EINVAL (SEEKS[9], [11] and [14]).
    for (d, (got, after_end)) in dirs.iter().zip(&ours) {
        assert_eq!(*after_end, 0, "{tag} {d}: entries listed from the end");
        assert_eq!(got[9], Ok(12345), "{tag} {d}: SEEK_SET 12345");
        assert_eq!(got[11], Err(libc::EINVAL), "{tag} {d}: SEEK_SET -1");
        assert_eq!(got[14], Ok(0), "{tag} {d}: SEEK_SET 0");
    }
    let Some(km) = KMount::new(&kimg, &s.0.join("mnt")) else {
        eprintln!("SKIP {tag}: no kernel comparison of the lseek results");
        return;
    };
    for (d, (got, _)) in dirs.iter().zip(&ours) {
        let want = kernel_seeks(&km.0.join(d.trim_start_matches('/')));
        assert_eq!(got, &want, "{tag} {d}: lseek results, ours vs the kernel's");
    }
}

#[test]
fn directory_lseek_like_kernel_hashed() {
    compare("dirseek-dx", &["-b", "4096"]);
}

/// Inline directories without dir_index are linear and have no extent
/// flag: ext4_llseek limits them at s_bitmap_maxbytes (random kernel
/// differential, seed 514, inline_data without dir_index: EINVAL there,
/// a position here).
#[test]
fn directory_lseek_like_kernel_inline_linear() {
    compare(
        "dirseek-inline",
        &["-b", "1024", "-O", "inline_data,^dir_index"],
    );
}

#[test]
fn directory_lseek_like_kernel_linear() {
    compare("dirseek-linear", &["-b", "1024", "-O", "^dir_index"]);
}
