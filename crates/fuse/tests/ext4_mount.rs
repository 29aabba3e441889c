//! An ext4 image served through FUSE (what `scalevfs mount --image IMG -o
//! ro` does): the mounted tree equals the tree the image was made from, as
//! seen by ordinary programs through the kernel. Skipped with the reason
//! printed without FUSE (a failure with SCALEVFS_REQUIRE_FUSE=1) or without
//! mkfs.ext4.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use scalevfs::{Vfs, VfsConfig};
use scalevfs_ext4::{Ext4, Ext4Options};
use scalevfs_fuse::{spawn_mount, FuseConfig, MountConfig};

fn skip(why: &str) -> bool {
    if std::env::var("SCALEVFS_REQUIRE_FUSE").as_deref() == Ok("1") && why.contains("fuse") {
        panic!("FUSE required (SCALEVFS_REQUIRE_FUSE=1) but unavailable: {why}");
    }
    eprintln!("SKIPPED: {why}");
    true
}

fn mkfs() -> Option<PathBuf> {
    [
        "/usr/sbin/mkfs.ext4",
        "/sbin/mkfs.ext4",
        "/usr/bin/mkfs.ext4",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// (relative path, mode, size, content or link target) of every entry.
fn tree(root: &Path) -> Vec<(String, u32, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut names: Vec<_> = fs::read_dir(root.join(&rel))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for n in names {
            let r = rel.join(&n);
            if r == Path::new("lost+found") {
                continue;
            }
            let p = root.join(&r);
            let m = fs::symlink_metadata(&p).unwrap();
            let (size, body) = if m.is_dir() {
                stack.push(r.clone());
                (0, Vec::new())
            } else if m.file_type().is_symlink() {
                use std::os::unix::ffi::OsStrExt;
                (
                    m.size(),
                    fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec(),
                )
            } else {
                (m.size(), fs::read(&p).unwrap())
            };
            out.push((r.to_string_lossy().into_owned(), m.mode(), size, body));
        }
    }
    out.sort();
    out
}

#[test]
fn ext4_image_through_fuse_matches_its_source() {
    if fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_err()
    {
        skip("/dev/fuse cannot be opened");
        return;
    }
    let Some(mkfs) = mkfs() else {
        skip("mkfs.ext4 not found (e2fsprogs)");
        return;
    };
    let base = std::env::temp_dir().join(format!("scalevfs-fuse-ext4-{}", std::process::id()));
    let _ = fs::remove_dir_all(&base);
    let src = base.join("src");
    fs::create_dir_all(src.join("d/e")).unwrap();
    fs::write(src.join("d/e/f.txt"), b"through fuse\n").unwrap();
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    fs::write(src.join("big.bin"), &big).unwrap();
    fs::create_dir(src.join("many")).unwrap();
    for i in 0..500 {
        fs::write(
            src.join("many").join(format!("entry-{i:04}")),
            i.to_string(),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("d/e/f.txt", src.join("link")).unwrap();
    fs::set_permissions(src.join("d"), fs::Permissions::from_mode(0o750)).unwrap();
    let img = base.join("img");
    let out = Command::new(mkfs)
        .args(["-q", "-F", "-b", "4096", "-d"])
        .arg(&src)
        .arg(&img)
        .arg("16M")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let ext4 = Ext4::open(&img, Ext4Options::default()).unwrap();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), ext4);
    let mnt = base.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let cfg = MountConfig {
        fuse: FuseConfig::default(),
        options: vec!["ro".into()],
        threads: 2,
    };
    let m = spawn_mount(vfs, &mnt, &cfg).expect("mount");
    let want = tree(&src);
    let got = tree(&mnt);
    let write = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(mnt.join("new"))
        .and_then(|mut f| f.write_all(b"x"));
    let _ = m.unmount();
    let _ = fs::remove_dir_all(&base);
    assert_eq!(want.len(), got.len());
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(w, g);
    }
    assert_eq!(write.unwrap_err().raw_os_error(), Some(libc::EROFS));
}

/// `scalevfs mount --image` without `-o ro`: what programs write through
/// the mount lands in the image, and after unmount e2fsck -fn passes and
/// the image reads back the same.
/// e2fsck -fn (next to `mkfs`) passes `img`.
fn fsck_clean(mkfs: &Path, img: &Path) {
    let out = Command::new(mkfs.with_file_name("e2fsck"))
        .arg("-fn")
        .arg(img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A fresh read-write ext4 image (`mkfs.ext4 -q -F ARGS IMG SIZE` in a
/// scratch directory `tag`) served through FUSE with `options`: the
/// scratch directory, the image, the filesystem, the mount point and the
/// mount. None, with the reason printed, without /dev/fuse or mkfs.ext4.
struct ImageMount {
    base: PathBuf,
    img: PathBuf,
    mkfs: PathBuf,
    ext4: std::sync::Arc<Ext4>,
    mnt: PathBuf,
    m: scalevfs_fuse::FuseMount,
}

impl ImageMount {
    /// Unmount (the FUSE mount, then the filesystem), pass on a panic of
    /// `work`, check the image with e2fsck, remove the scratch files.
    fn finish(self, work: std::thread::Result<()>) {
        let _ = self.m.unmount();
        self.ext4.unmount().unwrap();
        drop(self.ext4);
        if let Err(p) = work {
            std::panic::resume_unwind(p);
        }
        fsck_clean(&self.mkfs, &self.img);
        let _ = fs::remove_dir_all(&self.base);
    }
}

fn mount_fresh_image(tag: &str, args: &[&str], size: &str, options: &[&str]) -> Option<ImageMount> {
    mount_tuned_image(tag, args, &[], size, options)
}

/// `mount_fresh_image`, with `tune2fs TUNE` run on the image before it
/// is opened (when `tune` is not empty).
fn mount_tuned_image(
    tag: &str,
    args: &[&str],
    tune: &[&str],
    size: &str,
    options: &[&str],
) -> Option<ImageMount> {
    if fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_err()
    {
        skip("/dev/fuse cannot be opened");
        return None;
    }
    let Some(mkfs) = mkfs() else {
        skip("mkfs.ext4 not found (e2fsprogs)");
        return None;
    };
    let base = std::env::temp_dir().join(format!("scalevfs-fuse-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&base);
    fs::create_dir_all(&base).unwrap();
    fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).unwrap();
    let img = base.join("img");
    let out = Command::new(&mkfs)
        .args(["-q", "-F"])
        .args(args)
        .arg(&img)
        .arg(size)
        .output()
        .unwrap();
    assert!(out.status.success());
    if !tune.is_empty() {
        let out = Command::new(mkfs.with_file_name("tune2fs"))
            .args(tune)
            .arg(&img)
            .output()
            .unwrap();
        assert!(out.status.success(), "tune2fs {tune:?}: {out:?}");
    }
    let ext4 = Ext4::open(
        &img,
        Ext4Options {
            ro: false,
            ..Ext4Options::default()
        },
    )
    .unwrap();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), ext4.clone());
    let mnt = base.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let cfg = MountConfig {
        fuse: FuseConfig::default(),
        options: options.iter().map(|o| o.to_string()).collect(),
        threads: 2,
    };
    let m = spawn_mount(vfs, &mnt, &cfg).expect("mount");
    Some(ImageMount {
        base,
        img,
        mkfs,
        ext4,
        mnt,
        m,
    })
}

/// A member of the image's resgid by a supplementary group only (the
/// FUSE request carries the uid and gid, not the groups: the daemon
/// reads them from /proc when the check needs them) takes the reserved
/// blocks, as on the kernel's ext4 (`in_group_p`); a user outside the
/// group does not. Before, the groups were not read and the member was
/// refused.
#[test]
fn ext4_reserved_blocks_through_fuse_follow_the_callers_groups() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("not root: cannot write as another user");
        return;
    }
    let Ok(setpriv) = which("setpriv") else {
        skip("setpriv not found (util-linux)");
        return;
    };
    let Some(im) = mount_tuned_image(
        "resgid",
        &["-b", "4096"],
        &["-g", "4242"],
        "24M",
        &["allow_other"],
    ) else {
        return;
    };
    let reserved = sb_number(&im.mkfs, &im.img, "Reserved block count");
    let pool = (sb_number(&im.mkfs, &im.img, "Block count") / 50).min(4096);
    let work = std::panic::catch_unwind(|| {
        fs::set_permissions(&im.mnt, fs::Permissions::from_mode(0o777)).unwrap();
        dd_until_full(&im.mnt.join("outsider"), Some(65534));
        assert_eq!(statvfs_free(&im.mnt).0, reserved + pool, "outsider");
        let member = || {
            let mut c = Command::new(&setpriv);
            c.args(["--reuid=65533", "--regid=65533", "--groups=4242", "dd"]);
            c
        };
        dd_full(member, &im.mnt.join("member"));
        assert_eq!(
            statvfs_free(&im.mnt).0,
            pool,
            "a member of the resgid by a supplementary group left the pool only"
        );
    });
    im.finish(work);
}

/// The path of program `name` on PATH.
fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|f| f.is_file())
        })
        .ok_or(())
}

#[test]
fn ext4_image_written_through_fuse_passes_e2fsck() {
    let Some(im) = mount_fresh_image("ext4w", &["-b", "4096", "-O", "orphan_file"], "16M", &[])
    else {
        return;
    };
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let work = (|| -> std::io::Result<()> {
        fs::create_dir_all(im.mnt.join("d/e"))?;
        fs::write(im.mnt.join("d/e/f.txt"), b"written through fuse\n")?;
        fs::write(im.mnt.join("big.bin"), &big)?;
        fs::write(im.mnt.join("gone"), b"soon gone")?;
        fs::remove_file(im.mnt.join("gone"))?;
        std::os::unix::fs::symlink("d/e/f.txt", im.mnt.join("link"))?;
        Ok(())
    })();
    let _ = im.m.unmount();
    im.ext4.unmount().unwrap();
    drop(im.ext4);
    work.unwrap();
    fsck_clean(&im.mkfs, &im.img);
    // Read back through the library, read-only.
    let e = Ext4::open(&im.img, Ext4Options::default()).unwrap();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), e);
    let fsx = scalevfs::fs::Fs::new(vfs.root_task());
    assert_eq!(fsx.read("/d/e/f.txt").unwrap(), b"written through fuse\n");
    assert!(fsx.read("/big.bin").unwrap() == big);
    assert!(!fsx.exists("/gone"));
    assert_eq!(fsx.read_link("/link").unwrap().to_str(), Some("d/e/f.txt"));
    let _ = fs::remove_dir_all(&im.base);
}

/// A superblock field as `dumpe2fs -h` prints it.
fn sb_number(mkfs: &Path, img: &Path, name: &str) -> u64 {
    let out = Command::new(mkfs.with_file_name("dumpe2fs"))
        .arg("-h")
        .arg(img)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("{name} not in dumpe2fs -h"))
        .trim()
        .parse()
        .unwrap()
}

/// Fill the mount with `dd` as `uid` (None: root) until ENOSPC.
fn dd_until_full(file: &Path, uid: Option<u32>) {
    use std::os::unix::process::CommandExt;
    let dd = || {
        let mut c = Command::new("dd");
        if let Some(u) = uid {
            c.uid(u).gid(u);
        }
        c
    };
    dd_full(dd, file);
}

/// `dd_until_full` through `cmd` (dd, or a program that runs it): 64 KiB
/// writes, then the last blocks 4 KiB at a time (a write ends at the
/// folio it cannot map whole, as the kernel's ext4 does, so the 64 KiB
/// writes stop up to 15 blocks short).
fn dd_full(make: impl Fn() -> Command, file: &Path) {
    for (i, args) in [
        ["bs=65536", "count=100000", "conv=notrunc"],
        ["bs=4096", "oflag=append", "conv=notrunc"],
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = make();
        c.arg("if=/dev/zero")
            .arg(format!("of={}", file.display()))
            .args(args);
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("No space left"),
            "dd (pass {i}) did not fill the mount: {err}"
        );
    }
}

fn statvfs_free(dir: &Path) -> (u64, u64) {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a zeroed statvfs is a valid out-parameter; the path is a
    // valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    (s.f_bfree, s.f_bavail)
}

/// Through the mount, the reserved blocks are root's, as on the kernel's
/// ext4: an ordinary user's writes stop where `f_bavail` reaches 0, and
/// root's go on until only the 2% pool is left. The daemon does a write on
/// a task of its own; the request's caller is what counts.
#[test]
fn ext4_reserved_blocks_through_fuse_follow_the_caller() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("not root: cannot write as another user");
        return;
    }
    let Some(im) = mount_fresh_image("resv", &["-b", "4096"], "24M", &["allow_other"]) else {
        return;
    };
    let reserved = sb_number(&im.mkfs, &im.img, "Reserved block count");
    let pool = (sb_number(&im.mkfs, &im.img, "Block count") / 50).min(4096);
    let work = std::panic::catch_unwind(|| {
        fs::set_permissions(&im.mnt, fs::Permissions::from_mode(0o777)).unwrap();
        dd_until_full(&im.mnt.join("user"), Some(65534));
        let (bfree, bavail) = statvfs_free(&im.mnt);
        assert_eq!(bavail, 0, "available after the user's fill");
        assert_eq!(
            bfree,
            reserved + pool,
            "the user left the reserve and the pool"
        );
        dd_until_full(&im.mnt.join("root"), None);
        let (bfree, _) = statvfs_free(&im.mnt);
        assert_eq!(bfree, pool, "root left the pool");
    });
    im.finish(work);
}

/// `df` right after `rm`: the space and the inode of a removed file are
/// free at once, as on the kernel's ext4 (which frees an unlinked inode
/// when it evicts it). The inode goes at the kernel's FORGET, on a
/// request thread that may get no further request; before, it then
/// waited for that thread's next change or a commit, and with nothing
/// else dirty there was none: a removed 32 MiB file stayed counted as
/// used (`Ext4::statfs` now frees such inodes first, and the commit
/// thread frees them when nothing else is dirty).
#[test]
fn ext4_space_of_a_removed_file_is_free_at_once() {
    let Some(im) = mount_fresh_image("rmdf", &["-b", "4096"], "64M", &["allow_other"]) else {
        return;
    };
    let work = std::panic::catch_unwind(|| {
        let files = |d: &Path| {
            let c = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a zeroed statvfs is a valid out-parameter; the path
            // is a valid C string.
            let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
            s.f_ffree
        };
        let (free0, _) = statvfs_free(&im.mnt);
        let ffree0 = files(&im.mnt);
        let f = im.mnt.join("big");
        fs::write(&f, vec![0x5au8; 32 << 20]).unwrap();
        let (full, _) = statvfs_free(&im.mnt);
        assert!(
            free0 - full >= 8192,
            "32 MiB written: {free0} -> {full} free"
        );
        assert_eq!(files(&im.mnt), ffree0 - 1);
        fs::remove_file(&f).unwrap();
        // The kernel's FORGET may still be on its way: a short grace.
        let mut waited = 0;
        while statvfs_free(&im.mnt).0 < free0 && waited < 50 {
            std::thread::sleep(std::time::Duration::from_millis(2));
            waited += 1;
        }
        assert_eq!(statvfs_free(&im.mnt).0, free0, "free blocks after rm");
        assert_eq!(files(&im.mnt), ffree0, "free inodes after rm");
    });
    im.finish(work);
}
