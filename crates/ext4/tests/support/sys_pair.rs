//! One script, two systems: the kernel on a loop-mounted copy of an image
//! (`Host`, through libc) and scalevfs over the ext4 type (`Ours`, through
//! a `Task`), behind one trait, `Sys`; each call's result is an `R`, a
//! value or an errno, so that the two logs compare. Shared by the
//! fallocate-against-the-kernel tests (include it with
//! `#[path = "support/sys_pair.rs"] mod sys_pair;` next to `mod common;`).

#![allow(dead_code)]

use std::ffi::CString;

use scalevfs::fstype::{FiemapExtent, FIEMAP_FLAG_SYNC};
use scalevfs::io::*;
use scalevfs::Task;

use crate::common::FS_IOC_FIEMAP;

pub type R = Result<i64, i32>;

pub trait Sys {
    fn open(&self, p: &str, flags: u32) -> R;
    fn close(&self, fd: i32) -> R;
    fn pwrite(&self, fd: i32, b: &[u8], off: i64) -> R;
    fn fallocate(&self, fd: i32, mode: u32, off: i64, len: i64) -> R;
    fn ftruncate(&self, fd: i32, len: i64) -> R;
    fn size(&self, fd: i32) -> u64;
    fn blocks(&self, fd: i32) -> u64;
    fn pread(&self, fd: i32, n: usize, off: i64) -> Vec<u8>;
    /// FIEMAP of the whole file (FIEMAP_FLAG_SYNC).
    fn fiemap(&self, fd: i32) -> Vec<FiemapExtent>;
    /// (mtime, ctime) in nanoseconds.
    fn times(&self, fd: i32) -> (i128, i128);
}

/// FNV-1a of `data`.
pub fn digest_bytes(data: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &x in data {
        h = (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3);
    }
    h
}

pub fn cr(r: i64) -> R {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}

/// The kernel, on the loop-mounted copy at `dir`.
pub struct Host {
    pub dir: String,
}

fn fstat(fd: i32) -> libc::stat {
    // SAFETY: a plain syscall into a zeroed stat buffer this test owns.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
    st
}

impl Sys for Host {
    fn open(&self, p: &str, flags: u32) -> R {
        let c = CString::new(format!("{}/{p}", self.dir)).unwrap();
        // O_CLOEXEC: a tool another test thread starts meanwhile must not
        // hold the mount busy.
        let flags = flags as i32 | libc::O_CLOEXEC;
        // SAFETY: plain syscall with a valid C string.
        cr(unsafe { libc::open(c.as_ptr(), flags, 0o644) } as i64)
    }
    fn close(&self, fd: i32) -> R {
        // SAFETY: plain syscall.
        cr(unsafe { libc::close(fd) } as i64)
    }
    fn pwrite(&self, fd: i32, b: &[u8], off: i64) -> R {
        // SAFETY: plain syscall on a valid buffer.
        cr(unsafe { libc::pwrite(fd, b.as_ptr().cast(), b.len(), off) } as i64)
    }
    fn fallocate(&self, fd: i32, mode: u32, off: i64, len: i64) -> R {
        // SAFETY: plain syscall.
        cr(unsafe { libc::fallocate(fd, mode as i32, off, len) } as i64)
    }
    fn ftruncate(&self, fd: i32, len: i64) -> R {
        // SAFETY: plain syscall.
        cr(unsafe { libc::ftruncate(fd, len) } as i64)
    }
    fn size(&self, fd: i32) -> u64 {
        fstat(fd).st_size as u64
    }
    fn blocks(&self, fd: i32) -> u64 {
        fstat(fd).st_blocks as u64
    }
    fn pread(&self, fd: i32, n: usize, off: i64) -> Vec<u8> {
        let mut b = vec![0u8; n];
        // SAFETY: plain syscall on a valid buffer.
        let r = unsafe { libc::pread(fd, b.as_mut_ptr().cast(), n, off) };
        assert!(r >= 0);
        b.truncate(r as usize);
        b
    }
    fn fiemap(&self, fd: i32) -> Vec<FiemapExtent> {
        // In chunks of at most 8192 extents.
        let n = 8192usize;
        let mut out: Vec<FiemapExtent> = Vec::new();
        let mut start = 0u64;
        loop {
            let mut buf = vec![0u64; (32 + 56 * n) / 8];
            buf[0] = start;
            buf[1] = u64::MAX - start;
            buf[2] = u64::from(FIEMAP_FLAG_SYNC);
            buf[3] = n as u64;
            // SAFETY: the buffer is a struct fiemap with room for n extents.
            let r = unsafe { libc::ioctl(fd, FS_IOC_FIEMAP, buf.as_mut_ptr()) };
            assert!(r >= 0);
            let mapped = (buf[2] >> 32) as usize;
            for i in 0..mapped {
                let x = &buf[4 + i * 7..4 + i * 7 + 7];
                out.push(FiemapExtent {
                    logical: x[0],
                    physical: x[1],
                    length: x[2],
                    flags: x[5] as u32,
                });
            }
            if mapped < n {
                return out;
            }
            let last = out.last().unwrap();
            start = last.logical + last.length;
        }
    }
    fn times(&self, fd: i32) -> (i128, i128) {
        let st = fstat(fd);
        (
            st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
            st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128,
        )
    }
}

/// Our VFS over the ext4 type.
pub struct Ours {
    pub t: Task,
}

fn e(r: Result<impl Into<i64>, scalevfs::Errno>) -> R {
    r.map(Into::into).map_err(|e| e.raw())
}

impl Sys for Ours {
    fn open(&self, p: &str, flags: u32) -> R {
        e(self.t.open(&format!("/{p}"), flags, 0o644))
    }
    fn close(&self, fd: i32) -> R {
        e(self.t.close(fd).map(|_| 0))
    }
    fn pwrite(&self, fd: i32, b: &[u8], off: i64) -> R {
        e(self.t.pwrite(fd, b, off).map(|n| n as i64))
    }
    fn fallocate(&self, fd: i32, mode: u32, off: i64, len: i64) -> R {
        e(self.t.fallocate(fd, mode, off, len).map(|_| 0))
    }
    fn ftruncate(&self, fd: i32, len: i64) -> R {
        e(self.t.ftruncate(fd, len).map(|_| 0))
    }
    fn size(&self, fd: i32) -> u64 {
        self.t.fstat(fd).unwrap().size
    }
    fn blocks(&self, fd: i32) -> u64 {
        self.t.fstat(fd).unwrap().blocks
    }
    /// Up to `n` bytes: fewer only at end of file.
    fn pread(&self, fd: i32, n: usize, off: i64) -> Vec<u8> {
        let mut b = vec![0u8; n];
        let mut got = 0;
        while got < n {
            let r = self.t.pread(fd, &mut b[got..], off + got as i64).unwrap();
            if r == 0 {
                break;
            }
            got += r;
        }
        b.truncate(got);
        b
    }
    fn fiemap(&self, fd: i32) -> Vec<FiemapExtent> {
        self.t.fiemap(fd, 0, u64::MAX, FIEMAP_FLAG_SYNC).unwrap()
    }
    fn times(&self, fd: i32) -> (i128, i128) {
        let st = self.t.fstat(fd).unwrap();
        (
            st.mtime.sec as i128 * 1_000_000_000 + st.mtime.nsec as i128,
            st.ctime.sec as i128 * 1_000_000_000 + st.ctime.nsec as i128,
        )
    }
}

pub const O: u32 = (libc::O_RDWR | libc::O_CREAT) as u32;
pub const Z: u32 = FALLOC_FL_ZERO_RANGE;
pub const K: u32 = FALLOC_FL_KEEP_SIZE;
pub const C: u32 = FALLOC_FL_COLLAPSE_RANGE;
pub const I: u32 = FALLOC_FL_INSERT_RANGE;
pub const PH: u32 = FALLOC_FL_PUNCH_HOLE;

pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| ((i % 251) as u8).wrapping_add(seed) | 1)
        .collect()
}

/// Unmounts a read-write kernel mount if the script panics.
pub struct Umount(pub std::path::PathBuf);

impl Drop for Umount {
    /// Unmount, or detach lazily while something still holds the mount
    /// (see `common::KMount`).
    fn drop(&mut self) {
        let umount = |lazy: bool| {
            let mut c = std::process::Command::new("umount");
            if lazy {
                c.arg("-l");
            }
            c.arg(&self.0)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !umount(false) {
            umount(true);
        }
    }
}

/// Loop-mount `img` (ext4, read-write) at `dir` (created); unmounted when
/// the guard drops. Err: mount's stderr.
pub fn loop_mount(img: &std::path::Path, dir: &std::path::Path) -> Result<Umount, String> {
    std::fs::create_dir_all(dir).unwrap();
    let o = std::process::Command::new("mount")
        .args(["-t", "ext4", "-o", "loop"])
        .arg(img)
        .arg(dir)
        .output()
        .unwrap();
    if o.status.success() {
        Ok(Umount(dir.to_path_buf()))
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    }
}
