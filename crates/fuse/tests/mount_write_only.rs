//! Write-only opens served with FOPEN_DIRECT_IO (issue 14,
//! `FuseConfig::direct_write_only`): each write(2) goes straight to the
//! daemon, without the GETXATTR of `security.capability` the kernel's
//! cached write path sends first. What must hold regardless: other opens
//! (and mappings) never see stale pages, file capabilities still go on a
//! write, and `-o nodirect_wronly` restores the cached path.
//!
//! Where the kernel does not grant FUSE_DIRECT_IO_ALLOW_MMAP (before Linux
//! 6.6) the mount keeps the cached path; the checks of the data still run.

use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use scalevfs_fuse::FuseConfig;

mod common;
use common::*;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A direct write drops the pages other opens have cached, and a shared
/// mapping of the file sees the new bytes.
#[test]
fn readers_and_mappings_see_direct_writes() {
    if !fuse_ok("readers_and_mappings_see_direct_writes") {
        return;
    }
    let m = Mounted::new("wronly", FuseConfig::default());
    let p = m.p("f");
    let a = pattern(1, 3 * 4096 + 100);
    fs::write(&p, &a).unwrap();
    // A reader with every page cached, and a shared mapping.
    let mut r = fs::File::open(&p).unwrap();
    let mut back = Vec::new();
    r.read_to_end(&mut back).unwrap();
    assert_eq!(back, a);
    let len = a.len();
    // SAFETY: a fresh shared read-only mapping of an open file of `len`
    // bytes; unmapped below, read only while mapped.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            r.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    // SAFETY: `map` is a live mapping of `len` readable bytes.
    let mapped = || unsafe { std::slice::from_raw_parts(map as *const u8, len).to_vec() };
    assert_eq!(mapped(), a);
    // Overwrite the middle through a write-only open.
    let b = pattern(2, 5000);
    let w = fs::OpenOptions::new().write(true).open(&p).unwrap();
    w.write_all_at(&b, 3000).unwrap();
    let mut want = a.clone();
    want[3000..8000].copy_from_slice(&b);
    let mut got = vec![0u8; len];
    r.read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, want, "the reader's cached pages are stale");
    assert_eq!(mapped(), want, "the mapping's pages are stale");
    drop(w);
    assert_eq!(fs::read(&p).unwrap(), want);
    // SAFETY: unmapping the mapping made above, no longer used.
    assert_eq!(unsafe { libc::munmap(map, len) }, 0);
    // Appends through a write-only open, then the size and bytes.
    let mut w = fs::OpenOptions::new().append(true).open(&p).unwrap();
    w.write_all(b"tail").unwrap();
    drop(w);
    want.extend_from_slice(b"tail");
    assert_eq!(fs::metadata(&p).unwrap().len(), want.len() as u64);
    assert_eq!(fs::read(&p).unwrap(), want);
}

/// The request saved: a write through a write-only open costs no
/// GETXATTR; with `-o nodirect_wronly` it does again.
#[test]
fn write_only_writes_skip_the_capability_lookup() {
    if !fuse_ok("write_only_writes_skip_the_capability_lookup") {
        return;
    }
    let m = Mounted::new("wronly-count", FuseConfig::default());
    if !m.mount().direct_write_only() {
        eprintln!("SKIPPED the count: the kernel has no FUSE_DIRECT_IO_ALLOW_MMAP");
        return;
    }
    let g = served(m.mount(), "getxattr");
    let w = served(m.mount(), "write");
    for i in 0..10 {
        fs::write(m.p(&format!("f{i}")), b"0123456789").unwrap();
    }
    assert_eq!(served(m.mount(), "write"), w + 10);
    assert_eq!(served(m.mount(), "getxattr"), g, "a direct write asked");
    drop(m);

    let m = Mounted::with(
        "wronly-off",
        &["allow_other", "nodirect_wronly"],
        FuseConfig::default(),
        2,
    );
    assert!(!m.mount().direct_write_only());
    let g = served(m.mount(), "getxattr");
    for i in 0..10 {
        fs::write(m.p(&format!("f{i}")), b"0123456789").unwrap();
    }
    assert!(
        served(m.mount(), "getxattr") >= g + 10,
        "the cached path should ask for security.capability per write"
    );
    for i in 0..10 {
        assert_eq!(fs::read(m.p(&format!("f{i}"))).unwrap(), b"0123456789");
    }
}

fn setxattr(p: &Path, name: &str, value: &[u8]) -> i32 {
    let (c, n) = (
        CString::new(p.as_os_str().as_bytes()).unwrap(),
        CString::new(name).unwrap(),
    );
    // SAFETY: valid NUL-terminated strings and a value buffer of its length.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

fn has_xattr(p: &Path, name: &str) -> bool {
    let (c, n) = (
        CString::new(p.as_os_str().as_bytes()).unwrap(),
        CString::new(name).unwrap(),
    );
    // SAFETY: valid NUL-terminated strings; size 0 asks for the length.
    unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
}

/// A write drops the file's capabilities (`security.capability`) as on
/// Linux, through a write-only open as through a read-write one.
#[test]
fn a_write_drops_file_capabilities() {
    if !fuse_ok("a_write_drops_file_capabilities") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED a_write_drops_file_capabilities: setting file capabilities needs root");
        return;
    }
    let m = Mounted::new("wronly-caps", FuseConfig::default());
    // struct vfs_cap_data, revision 2, effective, CAP_NET_RAW permitted.
    let mut caps = Vec::new();
    caps.extend_from_slice(&0x0200_0001u32.to_le_bytes());
    caps.extend_from_slice(&(1u32 << 13).to_le_bytes());
    caps.extend_from_slice(&[0u8; 12]);
    for (i, rw) in [false, true].into_iter().enumerate() {
        let p = m.p(&format!("prog{i}"));
        fs::write(&p, b"#!/bin/true\n").unwrap();
        assert_eq!(setxattr(&p, "security.capability", &caps), 0);
        assert!(has_xattr(&p, "security.capability"));
        let w = fs::OpenOptions::new()
            .read(rw)
            .write(true)
            .open(&p)
            .unwrap();
        w.write_all_at(b"x", 0).unwrap();
        drop(w);
        assert!(
            !has_xattr(&p, "security.capability"),
            "capabilities kept after a write (read-write open: {rw})"
        );
    }
}

/// File capabilities already stored in an ext4 image (set before this
/// daemon started) go on a write through a write-only open too: the
/// adapter drops them itself, since such a write skips the kernel's
/// `file_remove_privs`.
#[test]
fn capabilities_stored_in_an_image_go_on_a_direct_write() {
    use scalevfs::{Cred, Vfs, VfsConfig, AT_FDCWD, O_CREAT, O_WRONLY};
    use scalevfs_ext4::{Ext4, Ext4Options};
    use scalevfs_fuse::{spawn_mount, MountConfig};
    if !fuse_ok("capabilities_stored_in_an_image_go_on_a_direct_write") {
        return;
    }
    let Some(mkfs) = ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"]
        .iter()
        .find(|p| Path::new(p).exists())
    else {
        eprintln!("SKIPPED: no mkfs.ext4");
        return;
    };
    let base = scratch_dir("wronly-img");
    let img = base.join("img");
    let out = std::process::Command::new(mkfs)
        .args(["-q", "-F", "-O", "orphan_file"])
        .arg(&img)
        .arg("16M")
        .output()
        .unwrap();
    assert!(out.status.success());
    let rw = Ext4Options {
        ro: false,
        ..Default::default()
    };
    let mut caps = Vec::new();
    caps.extend_from_slice(&0x0200_0001u32.to_le_bytes());
    caps.extend_from_slice(&(1u32 << 13).to_le_bytes());
    caps.extend_from_slice(&[0u8; 12]);
    {
        let ext4 = Ext4::open(&img, rw.clone()).unwrap();
        let vfs = Vfs::with_root_fs(VfsConfig::default(), ext4.clone());
        let t = vfs.task(Cred::root());
        let fd = t.open("/prog", O_CREAT | O_WRONLY, 0o755).unwrap();
        t.write(fd, b"#!/bin/true\n").unwrap();
        t.close(fd).unwrap();
        t.setxattrat(AT_FDCWD, "/prog", 0, b"security.capability", &caps, 0)
            .unwrap();
        drop(t);
        drop(vfs);
        ext4.unmount().unwrap();
    }
    let ext4 = Ext4::open(&img, rw).unwrap();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), ext4.clone());
    let mnt = base.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let cfg = MountConfig {
        fuse: FuseConfig::default(),
        options: vec!["allow_other".into()],
        threads: 2,
    };
    let m = spawn_mount(vfs, &mnt, &cfg).expect("mount");
    let p = mnt.join("prog");
    let had = has_xattr(&p, "security.capability");
    let w = fs::OpenOptions::new().write(true).open(&p).unwrap();
    w.write_all_at(b"#", 0).unwrap();
    drop(w);
    let kept = has_xattr(&p, "security.capability");
    let _ = m.unmount();
    let _ = ext4.unmount();
    let _ = fs::remove_dir_all(&base);
    assert!(had, "the image's file should have capabilities");
    assert!(!kept, "capabilities kept after a write-only write");
}
