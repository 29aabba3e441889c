//! Writing to a meta_bg image (`mkfs.ext4 -O meta_bg`): groups past the
//! first are made BLOCK_UNINIT, and their block bitmaps are built on first
//! use. With meta_bg a group's reserved start is its own meta group's
//! descriptor block (in the first, second and last group of each meta
//! group, superblock copy or not), not the whole descriptor table. Before,
//! any BLOCK_UNINIT group of a meta_bg image was refused as corrupt, and
//! the mount stopped writing at the first allocation that reached one.
//!
//! 1 KiB blocks and 1024 blocks per group: 64 groups, 16 descriptors per
//! descriptor block (64bit), so four meta groups; the files written fill
//! well past the first groups. Referees: e2fsck -fn, and statfs against the
//! kernel's before and after (loop mount, skipped where it cannot run).

mod common;

use common::*;
use scalevfs::*;

#[test]
fn files_fill_uninitialised_meta_bg_groups() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("meta_bg_write");
    let img = s.0.join("img");
    mkfs_args(
        &img,
        &[
            "-b",
            "1024",
            "-g",
            "1024",
            "-O",
            "meta_bg,^resize_inode",
            "-N",
            "2048",
        ],
        "64M",
    );
    let uninit = uninit_groups(&img);
    assert!(uninit > 16, "mkfs left {uninit} groups BLOCK_UNINIT");
    let kernel_before = KMount::new(&img, &s.0.join("k1")).map(|k| statvfs(&k.0));
    let (e, vfs) = mount(&img);
    if let Some(k) = kernel_before {
        let o = e.statfs();
        assert_eq!(
            (k.f_blocks, k.f_bfree),
            (o.blocks, o.bfree),
            "statfs of the fresh image"
        );
    }
    let t = vfs.root_task();
    // 40 MiB in 80 files over 8 directories (threads start their search
    // at different groups, and group 0's 1 MiB is soon full anyway).
    let chunk = vec![0x5au8; 64 * 1024];
    for d in 0..8 {
        t.mkdir(&format!("/d{d}"), 0o755).unwrap();
        for f in 0..10 {
            let fd = t
                .open(&format!("/d{d}/f{f}"), O_CREAT | O_WRONLY, 0o644)
                .unwrap();
            for _ in 0..8 {
                assert_eq!(t.write(fd, &chunk), Ok(chunk.len()));
            }
            t.close(fd).unwrap();
        }
    }
    unmount_clean(t, vfs, e, &img);
    let left = uninit_groups(&img);
    assert!(
        left < uninit,
        "no BLOCK_UNINIT group was used ({left} left)"
    );
    if let Some(k) = KMount::new(&img, &s.0.join("k2")) {
        let (e, _vfs) = mount(&img);
        let o = e.statfs();
        let ks = statvfs(&k.0);
        assert_eq!(
            (ks.f_blocks, ks.f_bfree),
            (o.blocks, o.bfree),
            "statfs after"
        );
        let data = std::fs::read(k.0.join("d7/f9")).unwrap();
        assert_eq!(data.len(), 8 * chunk.len());
        assert!(data.iter().all(|&b| b == 0x5a));
    }
}

/// How many groups of `img` dumpe2fs shows as BLOCK_UNINIT.
fn uninit_groups(img: &std::path::Path) -> usize {
    let out = std::process::Command::new(tool("dumpe2fs"))
        .arg(img)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("Group ") && l.contains("BLOCK_UNINIT"))
        .count()
}
