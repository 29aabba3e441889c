//! Block-mapped (ext2/3-style) files: fallocate on a block-mapped file with a range ending past
//! s_bitmap_maxbytes (but below s_maxbytes). The kernel's vfs_fallocate
//! checks the superblock's s_maxbytes only; ext4_punch_hole then punches
//! (to EOF), and the other modes are EOPNOTSUPP on a block-mapped file.

mod common;

use std::os::unix::io::AsRawFd;

use common::*;

#[test]
fn fallocate_past_the_bitmap_limit_is_the_kernels() {
    if !have_tools() {
        return;
    }
    let bs = 1024u64;
    let per = bs / 4;
    let max = (12 + per + per * per + per * per * per) * bs;
    let s = Scratch::new("blockmap-falloc-limit");
    let img = s.0.join("ours");
    mkfs_args(&img, &["-t", "ext3", "-b", "1024"], "32M");
    let theirs = s.0.join("theirs");
    std::fs::copy(&img, &theirs).unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // (mode, offset, length)
    let cases: Vec<(i32, u64, u64)> = vec![
        (punch, 0, 1 << 40),
        (punch, 4096, max),
        (punch, max - 10, 100),
        (0, max - 10, 100),
        (libc::FALLOC_FL_KEEP_SIZE, 0, max + 1),
    ];
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t
        .open("/f", scalevfs::O_CREAT | scalevfs::O_RDWR, 0o644)
        .unwrap();
    let mut ours = Vec::new();
    for &(mode, off, len) in &cases {
        t.pwrite(fd, &[3u8; 20000], 0).unwrap();
        ours.push(
            t.fallocate(fd, mode as u32, off as i64, len as i64)
                .map_err(|e| e.raw()),
        );
    }
    let st = t.fstat(fd).unwrap();
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
    let Some(km) = KMount::rw(&theirs, &s.0.join("mnt")) else {
        return;
    };
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(km.0.join("f"))
        .unwrap();
    let mut kernel = Vec::new();
    for &(mode, off, len) in &cases {
        use std::os::unix::fs::FileExt;
        f.write_at(&[3u8; 20000], 0).unwrap();
        // SAFETY: a plain syscall on an open descriptor.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) };
        kernel.push(if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap())
        });
    }
    drop(f);
    // SAFETY: a plain syscall.
    unsafe { libc::sync() };
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(km.0.join("f")).unwrap();
    drop(km);
    let named: Vec<_> = cases.iter().zip(ours.iter().zip(&kernel)).collect();
    assert_eq!(ours, kernel, "(case, (ours, kernel)): {named:?}");
    assert_eq!((st.size, st.blocks), (m.size(), m.blocks()));
}

/// 4 KiB ext3 (no huge_file): the limit is i_blocks' 2^32 sectors less
/// the map's own blocks, not the map's reach. Truncate and pwrite around
/// it, as the kernel.
#[test]
fn ext3_4k_limit_without_huge_file_is_the_kernels() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("blockmap-limit4k");
    let img = s.0.join("ours");
    mkfs_args(&img, &["-t", "ext3", "-b", "4096"], "64M");
    let feats = debugfs_ro(&img, "features");
    assert!(!feats.contains("huge_file"), "{feats}");
    let theirs = s.0.join("theirs");
    std::fs::copy(&img, &theirs).unwrap();
    let max: u64 = 536_346_110 * 4096;
    let offs = [max - 4097, max - 10, max - 1, max, max + 1, max + 4096];
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t
        .open("/f", scalevfs::O_CREAT | scalevfs::O_RDWR, 0o644)
        .unwrap();
    let mut ours = Vec::new();
    for &o in &offs {
        let (tr, w) = our_truncate_write(&t, fd, o);
        ours.push((tr, w, t.fstat(fd).unwrap().blocks));
        t.ftruncate(fd, 0).unwrap();
    }
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
    let Some(km) = KMount::rw(&theirs, &s.0.join("mnt")) else {
        return;
    };
    let f = create_rw(&km.0.join("f"));
    let mut kernel = Vec::new();
    for &o in &offs {
        let (tr, w) = kernel_truncate_write(&f, o);
        f.sync_all().unwrap();
        use std::os::unix::fs::MetadataExt;
        kernel.push((tr, w, f.metadata().unwrap().blocks()));
        f.set_len(0).unwrap();
    }
    drop(f);
    drop(km);
    assert_eq!(ours, kernel, "offsets {offs:?}");
    fsck_clean(&theirs);
}
