//! A symlink's target counts against memfs's `size=` as tmpfs's does: a
//! target of 128 bytes or more is kept in a page of the filesystem (tmpfs's
//! `SHORT_SYMLINK_LEN`: 128 with the NUL; shorter ones live in the inode),
//! which `statfs` counts and `st_blocks` shows (8), a full filesystem
//! refuses (ENOSPC) and the symlink's removal gives back. memfs counted no
//! space for any symlink: 4 KiB per inode of `nr_inodes` past the limit.
//!
//! The same steps run on a tmpfs mounted with the same options (when this
//! process may mount one: root) and on a memfs; each step's result and the
//! `statfs` figures after it must match, and match the annotations.

use std::ffi::CString;

use scalevfs::*;

mod common;
use common::HostTmpfs;

const OPTS: &str = "size=64k,nr_inodes=64";

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

/// What one step returned on one side: a count or an errno.
type R = Result<u64, i32>;

fn host_ret(r: isize) -> R {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as u64)
    }
}

fn vfs_ret(r: VfsResult<u64>) -> R {
    r.map_err(|e| e.raw())
}

#[derive(Clone, Copy, Debug)]
enum Op<'a> {
    Symlink(&'a str, usize),
    Unlink(&'a str),
    /// Create `name` and write `len` bytes to it: the count written.
    Write(&'a str, usize),
    /// `st_blocks` of a name (lstat).
    Blocks(&'a str),
}

fn target(len: usize) -> String {
    "t".repeat(len)
}

fn run_host(h: &HostTmpfs, op: Op) -> R {
    // SAFETY: plain system calls on paths under our own mount, with
    // buffers that outlive them.
    unsafe {
        match op {
            Op::Symlink(name, len) => host_ret(libc::symlink(
                CString::new(target(len)).unwrap().as_ptr(),
                h.path(name).as_ptr(),
            ) as isize),
            Op::Unlink(name) => host_ret(libc::unlink(h.path(name).as_ptr()) as isize),
            Op::Write(name, len) => {
                let fd = libc::open(h.path(name).as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
                if fd < 0 {
                    return Err(errno());
                }
                let buf = vec![7u8; len];
                let r = host_ret(libc::write(fd, buf.as_ptr().cast(), len));
                libc::close(fd);
                r
            }
            Op::Blocks(name) => {
                let mut st: libc::stat = std::mem::zeroed();
                if libc::lstat(h.path(name).as_ptr(), &mut st) < 0 {
                    return Err(errno());
                }
                Ok(st.st_blocks as u64)
            }
        }
    }
}

fn run_vfs(t: &Task, op: Op) -> R {
    match op {
        Op::Symlink(name, len) => vfs_ret(t.symlink(&target(len), &format!("/{name}")).map(|()| 0)),
        Op::Unlink(name) => vfs_ret(t.unlink(&format!("/{name}")).map(|()| 0)),
        Op::Write(name, len) => {
            let fd = t
                .open(&format!("/{name}"), O_CREAT | O_WRONLY, 0o644)
                .map_err(|e| e.raw())?;
            let r = t.write(fd, &vec![7u8; len]).map(|n| n as u64);
            t.close(fd).unwrap();
            vfs_ret(r)
        }
        Op::Blocks(name) => vfs_ret(t.lstat(&format!("/{name}")).map(|s| s.blocks)),
    }
}

fn host_bfree(h: &HostTmpfs) -> u64 {
    h.statfs().f_bfree
}

#[test]
fn long_symlink_targets_take_a_page() {
    let host = HostTmpfs::mount("symlink-space", OPTS);
    let vfs = common::memfs_with(OPTS);
    let t = vfs.root_task();
    // (step, what Linux's tmpfs returns, free blocks after it)
    let steps: &[(Op, R, u64)] = &[
        (Op::Symlink("s127", 127), Ok(0), 16),
        (Op::Blocks("s127"), Ok(0), 16),
        (Op::Symlink("s128", 128), Ok(0), 15),
        (Op::Blocks("s128"), Ok(8), 15),
        (Op::Symlink("s4095", 4095), Ok(0), 14),
        // The rest of the space: 14 pages of a 100000-byte write.
        (Op::Write("f", 100_000), Ok(14 * 4096), 0),
        // Full: a long target is ENOSPC, a short one still fits.
        (Op::Symlink("l", 200), Err(libc::ENOSPC), 0),
        (Op::Blocks("l"), Err(libc::ENOENT), 0),
        (Op::Symlink("s", 10), Ok(0), 0),
        // The page comes back with the symlink, and a write can use it.
        (Op::Unlink("s4095"), Ok(0), 1),
        (Op::Write("g", 10_000), Ok(4096), 0),
        (Op::Unlink("s128"), Ok(0), 1),
        (Op::Symlink("l", 200), Ok(0), 0),
    ];
    for &(op, want, free) in steps {
        let got = run_vfs(&t, op);
        // Removed inodes go after a grace period: flush (bounded) until
        // the figure is the expected one.
        let mut bfree = t.statfs("/").unwrap().bfree;
        for _ in 0..1000 {
            if bfree == free {
                break;
            }
            flush_deferred_frees();
            bfree = t.statfs("/").unwrap().bfree;
        }
        if let Some(h) = &host {
            let hr = run_host(h, op);
            assert_eq!(hr, want, "{op:?} on the host's tmpfs");
            assert_eq!(host_bfree(h), free, "free blocks after {op:?} on the host");
        }
        assert_eq!(got, want, "{op:?} on memfs");
        assert_eq!(bfree, free, "free blocks after {op:?} on memfs");
    }
}
