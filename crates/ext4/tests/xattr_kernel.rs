//! Extended attributes read from ext4 images agree with the kernel's view
//! of the same image (loop mount, read-only): small values in the inode
//! body, big ones in the xattr block, values stored by `mke2fs -d` from a
//! tree made with setfattr and by `debugfs ea_set`, and a POSIX ACL (stored
//! by debugfs in ext4's on-disk ACL format, returned in the xattr format).
//! A corrupted xattr block is EUCLEAN, not a panic. Skipped (with the
//! reason printed) without e2fsprogs, root, /dev/shm or loop mounts.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use scalevfs::xattr::{encode_acl, AclEntry};
use scalevfs::{Errno, Filesystem, Vfs, VfsConfig};
use scalevfs_ext4::{Ext4, Ext4Options};

use common::*;

fn setfattr(p: &Path, name: &str, value: &str) {
    let st = Command::new("setfattr")
        .args(["-h", "-n", name, "-v", value])
        .arg(p)
        .status()
        .expect("setfattr");
    assert!(st.success(), "setfattr {name} {p:?}");
}

fn ready() -> bool {
    if !have_tools() {
        return false;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: not root (loop mounts, trusted.*)");
        return false;
    }
    if Command::new("setfattr").arg("--version").output().is_err() {
        eprintln!("SKIP: setfattr (attr) not installed");
        return false;
    }
    true
}

const FILES: [&str; 6] = ["small", "several", "big", "dir", "link", "acl"];

#[test]
fn xattrs_match_the_kernel() {
    if !ready() {
        return;
    }
    let s = Scratch::new("xattr");
    // The source tree on tmpfs, which keeps user., trusted. and security.
    let src = Path::new("/dev/shm").join(format!("scalevfs-ext4-xattr-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir(&src).unwrap();
    for f in ["small", "several", "big", "acl"] {
        std::fs::write(src.join(f), f.as_bytes()).unwrap();
    }
    std::fs::create_dir(src.join("dir")).unwrap();
    std::os::unix::fs::symlink("small", src.join("link")).unwrap();
    setfattr(&src.join("small"), "user.s", "hi");
    setfattr(&src.join("several"), "user.a", "1");
    setfattr(&src.join("several"), "user.empty", "");
    setfattr(&src.join("several"), "trusted.t", "0x00ff10");
    setfattr(&src.join("several"), "security.label", "x");
    // 3000 bytes: too big for a 256-byte inode, so in the block.
    setfattr(
        &src.join("big"),
        "user.big",
        &format!("0x{}", "ab".repeat(3000)),
    );
    setfattr(&src.join("big"), "user.small", "in-inode");
    setfattr(&src.join("dir"), "user.d", "dir");
    setfattr(&src.join("link"), "trusted.l", "link");
    let img = s.0.join("img");
    make_image(&src, &img, 4096, "32M", "metadata_csum");
    let _ = std::fs::remove_dir_all(&src);
    // debugfs: one value beside mke2fs's, a block value, an ACL.
    let val = s.0.join("val");
    std::fs::write(&val, vec![b'q'; 1500]).unwrap();
    assert!(debugfs(&img, "ea_set /small user.viadebugfs hello"));
    assert!(debugfs(
        &img,
        &format!("ea_set -f {} /several user.blockval", val.display())
    ));
    let acl = encode_acl(&[
        AclEntry {
            tag: 1,
            perm: 6,
            id: u32::MAX,
        },
        AclEntry {
            tag: 2,
            perm: 4,
            id: 1000,
        },
        AclEntry {
            tag: 4,
            perm: 4,
            id: u32::MAX,
        },
        AclEntry {
            tag: 0x10,
            perm: 4,
            id: u32::MAX,
        },
        AclEntry {
            tag: 0x20,
            perm: 0,
            id: u32::MAX,
        },
    ]);
    let aclf = s.0.join("aclval");
    std::fs::write(&aclf, &acl).unwrap();
    assert!(debugfs(
        &img,
        &format!("ea_set -f {} /acl system.posix_acl_access", aclf.display())
    ));
    // e2fsck agrees the image is sound.
    let out = Command::new(mkfs().unwrap().with_file_name("e2fsck"))
        .arg("-fn")
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    let e = Ext4::open(&img, Ext4Options::default()).unwrap_or_else(|x| panic!("open: {x}"));
    let fs: Arc<dyn Filesystem> = e.clone();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fs);
    let t = vfs.root_task();
    let ours: BTreeMap<&str, Xattrs> = FILES
        .iter()
        .map(|f| (*f, our_xattrs(&t, &format!("/{f}"))))
        .collect();
    // What we must see whatever the kernel says.
    assert_eq!(ours["small"]["user.s"], b"hi");
    assert_eq!(ours["small"]["user.viadebugfs"], b"hello");
    assert_eq!(ours["several"]["trusted.t"], [0, 0xff, 0x10]);
    assert_eq!(ours["several"]["user.empty"], b"");
    assert_eq!(ours["several"]["user.blockval"], vec![b'q'; 1500]);
    assert_eq!(ours["big"]["user.big"], vec![0xab; 3000]);
    assert_eq!(ours["acl"]["system.posix_acl_access"], acl);
    assert_eq!(ours["link"]["trusted.l"], b"link");
    // A read-only filesystem: no changes.
    assert_eq!(t.setxattr("/small", "user.x", b"1", 0), Err(Errno::EROFS));

    if let Some(km) = KMount::new(&img, &s.0.join("mnt")) {
        for f in FILES {
            let k = host_xattrs(&km.0.join(f));
            assert_eq!(k, ours[f], "{f}: kernel (left) and ours (right)");
        }
    }

    // Corrupt the xattr block of `big`: a checksum error, never a panic.
    let raw = e
        .read_inode(
            e.lookup_name(&e.read_inode(2).unwrap(), b"big")
                .unwrap()
                .unwrap(),
        )
        .unwrap();
    assert_ne!(raw.file_acl, 0, "big has an xattr block");
    drop(t);
    drop(vfs);
    drop(e);
    let bad = s.0.join("bad");
    let mut bytes = std::fs::read(&img).unwrap();
    let at = raw.file_acl as usize * 4096 + 2000;
    bytes[at] ^= 0xff;
    std::fs::write(&bad, &bytes).unwrap();
    let e = Ext4::open(&bad, Ext4Options::default()).unwrap();
    let fs: Arc<dyn Filesystem> = e;
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fs);
    let t = vfs.root_task();
    assert_eq!(t.xattr_value("/big", "user.big", 0), Err(Errno::EUCLEAN));
    assert_eq!(t.xattr_names("/big", 0).err(), Some(Errno::EUCLEAN));
    // The in-inode value of another file is still there.
    assert_eq!(t.xattr_value("/small", "user.s", 0).unwrap(), b"hi");
}
