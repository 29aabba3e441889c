//! What the core's differential tests share.
#![allow(dead_code, unused_imports)]

/// Run `f` on a thread of its own that first drops to uid and gid 1000
/// with no supplementary groups (raw syscalls: they change that thread's
/// credentials only, where libc's wrappers change the whole process), and
/// return its result. The caller must be root.
pub fn as_uid_1000<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: raw syscalls change this thread's credentials only.
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_setresgid, 1000, 1000, 1000), 0);
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<u32>()),
                0
            );
            assert_eq!(libc::syscall(libc::SYS_setresuid, 1000, 1000, 1000), 0);
        }
        f()
    })
    .join()
    .unwrap()
}

pub use scalevfs::xattr::{
    ACL_GROUP as GROUP, ACL_GROUP_OBJ as GROUP_OBJ, ACL_MASK as MASK, ACL_OTHER as OTHER,
    ACL_UNDEFINED_ID as U, ACL_USER as USER, ACL_USER_OBJ as USER_OBJ,
};

/// An ACL in xattr form from (tag, perm, id) triples.
pub fn acl(e: &[(u16, u16, u32)]) -> Vec<u8> {
    let v: Vec<scalevfs::xattr::AclEntry> = e
        .iter()
        .map(|&(tag, perm, id)| scalevfs::xattr::AclEntry { tag, perm, id })
        .collect();
    scalevfs::xattr::encode_acl(&v)
}

/// A tmpfs mounted with `opts` at a fresh directory for the test's life
/// (`tag` names the directory); `None`, with the reason printed, where
/// this process may not mount one (not root).
pub struct HostTmpfs(pub String);

impl HostTmpfs {
    pub fn mount(tag: &str, opts: &str) -> Option<HostTmpfs> {
        let dir = format!("/tmp/{tag}-{}", std::process::id());
        std::fs::create_dir_all(&dir).ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "tmpfs", &dir])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            let _ = std::fs::remove_dir(&dir);
            eprintln!("no host tmpfs (not root?): annotations only");
            return None;
        }
        Some(HostTmpfs(dir))
    }

    pub fn path(&self, name: &str) -> std::ffi::CString {
        std::ffi::CString::new(format!("{}/{name}", self.0)).unwrap()
    }

    /// statfs(2) of the mount.
    pub fn statfs(&self) -> libc::statfs {
        // SAFETY: statfs into a zeroed struct we own, on a live C string.
        unsafe {
            let mut s: libc::statfs = std::mem::zeroed();
            assert_eq!(libc::statfs(self.path(".").as_ptr(), &mut s), 0);
            s
        }
    }
}

/// A VFS whose root memfs takes the tmpfs mount options `opts`
/// (`size=64k,nr_inodes=8`), as `HostTmpfs::mount` mounts the host's.
pub fn memfs_with(opts: &str) -> scalevfs::Vfs {
    let mut cfg = scalevfs::VfsConfig::default();
    for kv in opts.split(',') {
        let (k, v) = kv.split_once('=').unwrap();
        cfg.set(k, v).unwrap();
    }
    scalevfs::Vfs::with_config(cfg)
}

impl Drop for HostTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A Vfs whose memfs holds `pages` pages of 4 KiB and `inodes` inodes
/// (tmpfs's `size=` and `nr_inodes=`).
pub fn small_memfs(pages: u64, inodes: u64) -> scalevfs::Vfs {
    let mut cfg = scalevfs::VfsConfig::default();
    cfg.set("size", &format!("{}k", pages * 4)).unwrap();
    cfg.set("nr_inodes", &inodes.to_string()).unwrap();
    scalevfs::Vfs::with_config(cfg)
}
