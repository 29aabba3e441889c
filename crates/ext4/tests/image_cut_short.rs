//! An image file cut short by another program while mounted (the `flock`
//! is advisory): the next commit's or fsync's flush finds the file shorter
//! than at open and fails, the filesystem stops, and every later flush
//! fails too. Before, writes past the new end grew the file back with
//! zeros in between, every sync and the unmount reported success, and
//! e2fsck found the image broken (review of the device layer, stop 51).
//! Through `pread`/`pwrite` (`IoMode::Pwrite`): through a mapping, an
//! access past the new end is SIGBUS before any flush (the device's doc).
//!
//! Also: a read-only `MmapDevice` reads a sparse image's holes through
//! `pread`, so on a full tmpfs reading them is no SIGBUS (a read fault in
//! a hole allocates a page there).

mod common;

use std::process::Command;

use common::*;
use scalevfs::{Vfs, O_CREAT, O_RDWR};
use scalevfs_ext4::{BlockDevice, Ext4, IoMode, MmapDevice};

#[test]
fn an_image_cut_short_stops_the_filesystem() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("cutshort");
    let img = fresh(&s.0, 4096, "64M");
    let mut opts = rw_journaled();
    opts.io = IoMode::Pwrite;
    opts.commit_interval = 0;
    let e = Ext4::open(&img, opts).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let fd = t.open("/before", O_CREAT | O_RDWR, 0o644).unwrap();
    t.write(fd, &vec![1u8; 1 << 20]).unwrap();
    t.fsync(fd).unwrap();
    // Another program cuts the image to 1 MiB.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let r = t
        .open("/after", O_CREAT | O_RDWR, 0o644)
        .and_then(|g| t.write(g, &vec![2u8; 1 << 20]).and(t.fsync(g)));
    assert!(r.is_err(), "an fsync after the cut succeeded");
    assert!(e.sync().is_err(), "a sync after the cut succeeded");
    assert!(t.fsync(fd).is_err(), "an fsync of the older file succeeded");
    drop(t);
    drop(vfs);
    assert!(e.unmount().is_err(), "the unmount after the cut succeeded");
}

#[test]
fn a_read_only_mapping_reads_holes_without_sigbus() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let s = Scratch::new("ro-holes");
    let dir = s.0.join("tmpfs");
    std::fs::create_dir_all(&dir).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(&dir)
        .status()
        .is_ok_and(|st| st.success());
    if !ok {
        eprintln!("skipped: no tmpfs mount here");
        return;
    }
    struct Umount(std::path::PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Umount(dir.clone());
    // A sparse 64 MiB image (mkfs writes a few hundred KiB of it), then
    // the tmpfs filled to the last byte.
    let img = dir.join("img");
    mkfs_args(&img, &["-b", "4096"], "64M");
    let fill = dir.join("fill");
    let mut f = std::fs::File::create(&fill).unwrap();
    let chunk = vec![7u8; 64 << 10];
    while std::io::Write::write(&mut f, &chunk).is_ok_and(|n| n > 0) {}
    drop(f);
    // Read the whole image in a child: a SIGBUS kills it, not the tests.
    // SAFETY: the child only reads through the device and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = std::panic::catch_unwind(|| {
            let d = MmapDevice::open(&img, false).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            let mut off = 0;
            while off < d.size() {
                let n = buf.len().min((d.size() - off) as usize);
                d.read_at(off, &mut buf[..n]).unwrap();
                off += n as u64;
            }
        })
        .map_or(2, |()| 0);
        // SAFETY: leaves the child at once, as a forked child should.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "reading the image's holes killed the reader (status {status:#x}, signal {})",
        libc::WTERMSIG(status)
    );
}
