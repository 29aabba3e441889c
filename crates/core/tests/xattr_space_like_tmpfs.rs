//! Extended attributes share memfs's `nr_inodes` space with the inodes,
//! as tmpfs's share its `free_ispace` (1 KiB per inode of `nr_inodes`;
//! an attribute takes 40 bytes plus its full name and value): attributes
//! leave fewer free inodes in statfs and fewer files to create, files
//! leave less room for attributes, a replace needs room for its whole new
//! value while the old one is still charged (ENOSPC keeps the old one). memfs gave attributes a
//! budget of their own (`nr_inodes=10` took ten 900-byte attributes and
//! eight more files where tmpfs takes eight and no file) and charged 33
//! bytes of overhead instead of 40 (review, stop 50). The steps run on a
//! tmpfs mounted with the same options (when this process may mount one:
//! root) and on a memfs; results and free inode counts must match the
//! annotations on both.

use scalevfs::*;

mod common;
use common::HostTmpfs;

const OPTS: &str = "size=1m,nr_inodes=10";

#[derive(Clone, Debug)]
enum Op {
    Create(&'static str),
    Unlink(&'static str),
    /// Set an attribute of a length on /a.
    Set(String, usize),
    Remove(String),
    /// Set an access ACL on /a (user 1000 may read).
    SetAcl,
}

/// A valid `system.posix_acl_access` value: user::rw-, user:1000:r--,
/// group::r--, mask::r--, other::r--.
fn acl() -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 4, 1000),
        (4, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 4, u32::MAX),
    ] {
        v.extend(tag.to_le_bytes());
        v.extend(perm.to_le_bytes());
        v.extend(id.to_le_bytes());
    }
    v
}

type R = Result<(), i32>;

fn run_host(h: &HostTmpfs, op: &Op) -> R {
    let a = h.path("a");
    let ret = |r: i32| {
        if r < 0 {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap())
        } else {
            Ok(())
        }
    };
    // SAFETY: plain system calls on paths under our own mount, with
    // buffers that outlive them.
    unsafe {
        match op {
            Op::Create(n) => {
                let fd = libc::open(h.path(n).as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
                ret(fd)?;
                libc::close(fd);
                Ok(())
            }
            Op::Unlink(n) => ret(libc::unlink(h.path(n).as_ptr())),
            Op::Set(name, len) => {
                let c = std::ffi::CString::new(name.as_str()).unwrap();
                let v = vec![b'v'; *len];
                ret(libc::setxattr(
                    a.as_ptr(),
                    c.as_ptr(),
                    v.as_ptr().cast(),
                    *len,
                    0,
                ))
            }
            Op::Remove(name) => {
                let c = std::ffi::CString::new(name.as_str()).unwrap();
                ret(libc::removexattr(a.as_ptr(), c.as_ptr()))
            }
            Op::SetAcl => {
                let v = acl();
                ret(libc::setxattr(
                    a.as_ptr(),
                    c"system.posix_acl_access".as_ptr(),
                    v.as_ptr().cast(),
                    v.len(),
                    0,
                ))
            }
        }
    }
}

fn run_vfs(t: &Task, op: &Op) -> R {
    let r = match op {
        Op::Create(n) => t
            .open(&format!("/{n}"), O_CREAT | O_WRONLY, 0o644)
            .and_then(|fd| t.close(fd)),
        Op::Unlink(n) => t.unlink(&format!("/{n}")),
        Op::Set(name, len) => t.setxattr("/a", name, &vec![b'v'; *len], 0),
        Op::Remove(name) => t.removexattr("/a", name),
        Op::SetAcl => t.setxattr("/a", "system.posix_acl_access", &acl(), 0),
    };
    r.map_err(|e| e.raw())
}

#[test]
fn attributes_share_the_inode_space() {
    let host = HostTmpfs::mount("xattr-space", OPTS);
    let vfs = common::memfs_with(OPTS);
    let t = vfs.root_task();
    use Op::*;
    let x = |k: usize| format!("user.x{k}");
    let s = |k: usize| format!("user.s{k}");
    // (step, Linux's result, free inodes after it). 10 KiB of space; the
    // root and /a take 1 KiB each.
    let mut steps: Vec<(Op, R, u64)> = vec![(Create("a"), Ok(()), 8)];
    // 900-byte values take 947 bytes each: eight fit in 8 KiB, which
    // leaves 616 bytes: no free inode.
    for (k, free) in [8, 7, 6, 5, 4, 3, 2, 1].into_iter().enumerate() {
        steps.push((Set(x(k), 900), Ok(()), free - 1));
    }
    steps.push((Set(x(8), 900), Err(libc::ENOSPC), 0));
    steps.push((Create("f"), Err(libc::ENOSPC), 0));
    steps.push((Remove(x(0)), Ok(()), 1));
    steps.push((Set(x(0), 900), Ok(()), 0));
    // Empty values in the 616 bytes left: 47 bytes ("user.sN") or 48
    // ("user.sNN") each: thirteen fit, not fourteen.
    for k in 0..13 {
        steps.push((Set(s(k), 0), Ok(()), 0));
    }
    steps.push((Set(s(13), 0), Err(libc::ENOSPC), 0));
    // An ACL is not an attribute of tmpfs's store (it lives in the
    // inode's i_acl): it takes no space, even from a full pool.
    steps.push((SetAcl, Ok(()), 0));
    // The big ones go (the small ones hold 614 bytes): a free inode per
    // whole KiB left.
    for k in 0..8 {
        steps.push((Remove(x(k)), Ok(()), k as u64));
    }
    for k in 0..7 {
        let f = ["f0", "f1", "f2", "f3", "f4", "f5", "f6"][k];
        steps.push((Create(f), Ok(()), 6 - k as u64));
    }
    steps.push((Create("f7"), Err(libc::ENOSPC), 0));
    // 1434 bytes left: "user.big" with 1386 bytes takes them exactly,
    // with 1394 one byte too many.
    steps.push((Unlink("f0"), Ok(()), 1));
    steps.push((Set("user.big".into(), 1394), Err(libc::ENOSPC), 1));
    steps.push((Set("user.big".into(), 1386), Ok(()), 0));
    // A replace needs room for the whole new value while the old one is
    // still charged (shmem_xattr_handler_set charges, then frees): even a
    // smaller value is ENOSPC on a full pool.
    steps.push((Set("user.big".into(), 400), Err(libc::ENOSPC), 0));
    steps.push((Unlink("f1"), Ok(()), 1));
    steps.push((Set("user.big".into(), 400), Ok(()), 1));
    steps.push((Set("user.big".into(), 3000), Err(libc::ENOSPC), 1));
    steps.push((Remove("user.big".into()), Ok(()), 2));
    steps.push((Create("f7"), Ok(()), 1));
    for (op, want, free) in &steps {
        let got = run_vfs(&t, op);
        // Removed inodes go after a grace period: flush (bounded) until
        // the figure is the expected one.
        let mut ffree = t.statfs("/").unwrap().ffree;
        for _ in 0..1000 {
            if ffree == *free {
                break;
            }
            flush_deferred_frees();
            ffree = t.statfs("/").unwrap().ffree;
        }
        if let Some(h) = &host {
            assert_eq!(run_host(h, op), *want, "{op:?} on the host's tmpfs");
            assert_eq!(
                h.statfs().f_ffree,
                *free,
                "free inodes after {op:?} on the host"
            );
        }
        assert_eq!(got, *want, "{op:?} on memfs");
        assert_eq!(ffree, *free, "free inodes after {op:?} on memfs");
    }
}
