//! Interop with Linux's own ext4: the same image mounted by the kernel
//! (loop, read-only) and opened by this crate must show the same tree and
//! the same statfs numbers. Skipped (with the reason printed) where a loop
//! mount is not possible (not root, no loop devices, a container).

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use scalevfs::fs::Fs;
use scalevfs::{Filesystem, Vfs, VfsConfig};
use scalevfs_ext4::{Ext4, Ext4Options};

use common::*;

/// A kernel mount of `img` at `dir`, unmounted on drop.
struct KMount(std::path::PathBuf);

impl KMount {
    fn new(img: &Path, dir: &Path) -> Option<KMount> {
        std::fs::create_dir_all(dir).ok()?;
        let out = Command::new("mount")
            .args(["-t", "ext4", "-o", "loop,ro"])
            .arg(img)
            .arg(dir)
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!(
                "SKIP: cannot loop-mount ext4 here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        Some(KMount(dir.to_path_buf()))
    }
}

impl Drop for KMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn interop(bs: usize, features: &str, extra: &[&str]) {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("kernel");
    let src = s.0.join("src");
    build_tree(&src, 600, 100, bs);
    let img = s.0.join("img");
    make_image_args(&src, &img, bs, "96M", features, extra);
    debugfs(&img, "sif /pattern.bin mtime 0x80000010");
    debugfs(&img, "sif /pattern.bin mtime_extra 0x1d6f3455");
    let Some(km) = KMount::new(&img, &s.0.join("mnt")) else {
        return;
    };
    let e = Ext4::open(&img, Ext4Options::default()).unwrap_or_else(|x| panic!("open: {x}"));
    walk_lib(&e);
    let fs: Arc<dyn Filesystem> = e.clone();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fs);
    let ours = vfs_tree_ns(&Fs::new(vfs.root_task()));
    let mut kernel = host_tree_ns(&km.0);
    kernel.remove("/lost+found");
    assert_eq!(
        kernel.keys().collect::<Vec<_>>(),
        ours.keys().collect::<Vec<_>>()
    );
    let bad: Vec<String> = kernel
        .iter()
        .filter(|(k, w)| ours.get(*k) != Some(w))
        .map(|(k, w)| format!("{k}:\n kernel {w:?}\n   ours {:?}", ours.get(k)))
        .collect();
    assert!(bad.is_empty(), "{} differ:\n{}", bad.len(), bad.join("\n"));
    // SEEK_DATA / SEEK_HOLE agree with the kernel's on sparse files.
    for name in ["sparse", "frag", "pattern.bin", "empty"] {
        let host = std::fs::File::open(km.0.join(name)).unwrap();
        let ino = fs_ino(&e, name);
        let inode = e.iget(ino).unwrap();
        let size = host.metadata().unwrap().len();
        let mut offs: Vec<u64> = vec![0, 1, 4095, 4096, 5 << 20, size.saturating_sub(1), size];
        offs.extend((0..40).map(|i| i * 12_345));
        for off in offs {
            for (data, whence) in [(true, libc::SEEK_DATA), (false, libc::SEEK_HOLE)] {
                use std::os::unix::io::AsRawFd;
                // SAFETY: a valid fd; lseek has no memory effects.
                let k = unsafe { libc::lseek(host.as_raw_fd(), off as i64, whence) };
                let k = if k < 0 { None } else { Some(k as u64) };
                let o = e.seek_data_hole(&inode, off, data).ok();
                assert_eq!(k, o, "{name} off {off} data {data}");
            }
        }
    }
    let k = statvfs(&km.0);
    let o = e.statfs();
    assert_eq!(
        (
            k.f_bsize,
            k.f_blocks,
            k.f_bfree,
            k.f_bavail,
            k.f_files,
            k.f_ffree,
            k.f_namemax
        ),
        (o.bsize, o.blocks, o.bfree, o.bavail, o.files, o.ffree, o.namelen),
        "statfs (kernel, ours)"
    );
}

fn fs_ino(e: &Ext4, name: &str) -> u32 {
    let root = e.read_inode(2).unwrap();
    e.lookup_name(&root, name.as_bytes()).unwrap().unwrap()
}

/// The trees with nanosecond mtimes (both sides read the same image).
fn host_tree_ns(root: &Path) -> std::collections::BTreeMap<String, Node> {
    use std::os::unix::fs::MetadataExt;
    let mut t = host_tree(root);
    for (k, n) in t.iter_mut() {
        let m = std::fs::symlink_metadata(root.join(k.trim_start_matches('/'))).unwrap();
        n.mtime = (m.mtime(), m.mtime_nsec());
    }
    t
}

fn vfs_tree_ns(fs: &Fs) -> std::collections::BTreeMap<String, Node> {
    let mut t = vfs_tree(fs);
    for (k, n) in t.iter_mut() {
        let st = *fs.symlink_metadata(k).unwrap().stat();
        n.mtime = (st.mtime.sec, st.mtime.nsec);
    }
    t
}

#[test]
fn kernel_agrees_4k() {
    interop(4096, "orphan_file", &[]);
}

#[test]
fn kernel_agrees_1k() {
    interop(1024, "", &[]);
}

#[test]
fn kernel_agrees_gdt_csum() {
    interop(4096, "^metadata_csum,uninit_bg", &[]);
}

#[test]
fn kernel_agrees_64bit_csum_seed() {
    interop(1024, "64bit,metadata_csum_seed", &[]);
}

/// An ext3-style image (no extent feature; block-mapped files): statfs
/// leaves no 2% pool out of f_bavail, as the kernel reserves none without
/// extents (it did: f_bavail was 2% low).
#[test]
fn kernel_agrees_ext3_style() {
    interop(1024, "^extent,^64bit,^flex_bg", &[]);
}

#[test]
fn kernel_agrees_meta_bg() {
    interop(4096, "meta_bg,^resize_inode", &[]);
}

#[test]
fn kernel_agrees_bigalloc() {
    interop(1024, "bigalloc", &["-C", "4096"]);
}

#[test]
fn kernel_agrees_no_journal() {
    interop(4096, "^has_journal", &[]);
}

/// Files, symlinks and directories stored in the inode (inline_data):
/// SEEK_DATA/SEEK_HOLE, statfs and the tree as the kernel reads them.
#[test]
fn kernel_agrees_inline_data() {
    interop(4096, "inline_data", &[]);
}

/// ext2-style: no journal, no extents, no flex_bg.
#[test]
fn kernel_agrees_ext2_style() {
    interop(
        1024,
        "^has_journal,^extent,^64bit,^flex_bg,^orphan_file",
        &[],
    );
}

/// 128-byte inodes (no extra fields: second timestamps, no crtime) and
/// linear directories (no dir_index).
#[test]
fn kernel_agrees_small_inodes_linear_dirs() {
    interop(4096, "^dir_index", &["-I", "128"]);
}

/// large_dir and ea_inode images.
#[test]
fn kernel_agrees_large_dir_ea_inode() {
    interop(1024, "large_dir,ea_inode", &[]);
}
