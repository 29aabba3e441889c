//! Hard links take units of memfs's `nr_inodes` as tmpfs's do: each name
//! past an inode's first reserves one (shmem_link; ENOSPC when none is
//! left) and removing a name that is not the last gives it back (by unlink
//! or by a rename over it); an O_TMPFILE inode's first name takes none.
//! memfs made hard links for free, each a directory entry and a dentry
//! held in memory without any bound. The steps run on a tmpfs mounted with
//! the same options (when this process may mount one: root) and on a
//! memfs; results and `statfs` free inode counts must match the
//! annotations on both.

use std::ffi::CString;

use scalevfs::*;

mod common;
use common::HostTmpfs;

const OPTS: &str = "size=64k,nr_inodes=8";

#[derive(Clone, Copy, Debug)]
enum Op {
    Create(&'static str),
    Link(&'static str, &'static str),
    Unlink(&'static str),
    Rename(&'static str, &'static str),
    /// An O_TMPFILE inode in the root, named by linkat (AT_EMPTY_PATH).
    TmpfileNamed(&'static str),
}

type R = Result<(), i32>;

fn host_ret(r: i32) -> R {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(())
    }
}

fn run_host(h: &HostTmpfs, op: Op) -> R {
    // SAFETY: plain system calls on paths under our own mount.
    unsafe {
        match op {
            Op::Create(n) => {
                let fd = libc::open(h.path(n).as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
                host_ret(fd)?;
                libc::close(fd);
                Ok(())
            }
            Op::Link(a, b) => host_ret(libc::link(h.path(a).as_ptr(), h.path(b).as_ptr())),
            Op::Unlink(n) => host_ret(libc::unlink(h.path(n).as_ptr())),
            Op::Rename(a, b) => host_ret(libc::rename(h.path(a).as_ptr(), h.path(b).as_ptr())),
            Op::TmpfileNamed(n) => {
                let fd = libc::open(h.path(".").as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o644);
                host_ret(fd)?;
                let empty = CString::new("").unwrap();
                let r = host_ret(libc::linkat(
                    fd,
                    empty.as_ptr(),
                    libc::AT_FDCWD,
                    h.path(n).as_ptr(),
                    libc::AT_EMPTY_PATH,
                ));
                libc::close(fd);
                r
            }
        }
    }
}

fn run_vfs(t: &Task, op: Op) -> R {
    let p = |n: &str| format!("/{n}");
    let r = match op {
        Op::Create(n) => t
            .open(&p(n), O_CREAT | O_WRONLY, 0o644)
            .and_then(|fd| t.close(fd)),
        Op::Link(a, b) => t.link(&p(a), &p(b)),
        Op::Unlink(n) => t.unlink(&p(n)),
        Op::Rename(a, b) => t.rename(&p(a), &p(b)),
        Op::TmpfileNamed(n) => t.open("/", O_TMPFILE | O_RDWR, 0o644).and_then(|fd| {
            let r = t.linkat(fd, "", AT_FDCWD, &p(n), AT_EMPTY_PATH);
            t.close(fd).unwrap();
            r
        }),
    };
    r.map_err(|e| e.raw())
}

fn host_ffree(h: &HostTmpfs) -> u64 {
    h.statfs().f_ffree
}

#[test]
fn hard_links_take_inode_units() {
    let host = HostTmpfs::mount("links-space", OPTS);
    let vfs = common::memfs_with(OPTS);
    let t = vfs.root_task();
    use Op::*;
    // (step, Linux's result, free inodes after it); the root takes one.
    let steps: &[(Op, R, u64)] = &[
        (Create("f"), Ok(()), 6),
        (Link("f", "l1"), Ok(()), 5),
        (Link("f", "l2"), Ok(()), 4),
        (Link("f", "l3"), Ok(()), 3),
        (Link("f", "l4"), Ok(()), 2),
        (Link("f", "l5"), Ok(()), 1),
        (Link("f", "l6"), Ok(()), 0),
        (Link("f", "l7"), Err(libc::ENOSPC), 0),
        (Create("g"), Err(libc::ENOSPC), 0),
        // A name that is not the last gives its unit back.
        (Unlink("l1"), Ok(()), 1),
        (Unlink("l2"), Ok(()), 2),
        // A rename over another name of the same inode changes nothing
        // (same inode: rename does nothing at all).
        (Rename("l3", "l4"), Ok(()), 2),
        (Create("g"), Ok(()), 1),
        // A rename over a name that is not its inode's last gives one back.
        (Rename("g", "l3"), Ok(()), 2),
        // Unlink every name of f but one: l4, l5, l6, f left -> 3 more.
        (Unlink("l4"), Ok(()), 3),
        (Unlink("l5"), Ok(()), 4),
        (Unlink("l6"), Ok(()), 5),
        // The last name: the inode goes, with its own unit.
        (Unlink("f"), Ok(()), 6),
        // An O_TMPFILE inode's first name takes no second unit.
        (TmpfileNamed("t"), Ok(()), 5),
        (Link("t", "t2"), Ok(()), 4),
        (Unlink("t"), Ok(()), 5),
        (Unlink("t2"), Ok(()), 6),
    ];
    for &(op, want, free) in steps {
        let got = run_vfs(&t, op);
        // Removed inodes go after a grace period: flush (bounded) until
        // the figure is the expected one.
        let mut ffree = t.statfs("/").unwrap().ffree;
        for _ in 0..1000 {
            if ffree == free {
                break;
            }
            flush_deferred_frees();
            ffree = t.statfs("/").unwrap().ffree;
        }
        if let Some(h) = &host {
            assert_eq!(run_host(h, op), want, "{op:?} on the host's tmpfs");
            assert_eq!(host_ffree(h), free, "free inodes after {op:?} on the host");
        }
        assert_eq!(got, want, "{op:?} on memfs");
        assert_eq!(ffree, free, "free inodes after {op:?} on memfs");
    }
}
