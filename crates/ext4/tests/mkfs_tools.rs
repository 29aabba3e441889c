//! `scalevfs_ext4::mkfs` images handed to the e2fsprogs tools that rewrite
//! metadata: resize2fs growing an image (it takes its new descriptor blocks
//! from the reserved GDT blocks the resize inode maps, or moves blocks
//! without them) and shrinking it, and tune2fs turning features off and on.
//! Each step must leave `e2fsck -fn` clean and the image readable by this
//! crate. Tests skip with a printed reason where e2fsprogs is missing.
//! (Online resize through the kernel needs CAP_SYS_RESOURCE, which this
//! machine's root lacks even for mke2fs's own images, so it is not here.)

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use scalevfs::fs::Fs;
use scalevfs::{Filesystem, Vfs, VfsConfig};
use scalevfs_ext4::mkfs::{self, MkfsOptions};
use scalevfs_ext4::{Ext4, Ext4Options};

use common::Scratch;

fn tool(name: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

/// All of `names`, or None after printing which is missing.
fn tools(names: &[&str]) -> Option<Vec<PathBuf>> {
    let mut v = Vec::new();
    for n in names {
        match tool(n) {
            Some(p) => v.push(p),
            None => {
                eprintln!("SKIP: {n} not found (install e2fsprogs)");
                return None;
            }
        }
    }
    Some(v)
}

fn opts(size: &str, bs: u32, features: &str) -> MkfsOptions {
    MkfsOptions {
        size: mkfs::parse_size(size).unwrap(),
        block_size: Some(bs),
        features: if features.is_empty() {
            vec![]
        } else {
            vec![features.to_string()]
        },
        ..Default::default()
    }
}

/// Run `prog args img`; its status and output.
fn run(prog: &Path, args: &[&str], img: &Path) -> (bool, String) {
    let out = Command::new(prog).args(args).arg(img).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn assert_clean(e2fsck: &Path, img: &Path, what: &str) {
    let (ok, text) = run(e2fsck, &["-fn"], img);
    assert!(ok, "e2fsck -fn after {what}:\n{text}");
}

/// dumpe2fs -h field `key`.
fn field(dumpe2fs: &Path, img: &Path, key: &str) -> String {
    let (ok, text) = run(dumpe2fs, &["-h"], img);
    assert!(ok, "dumpe2fs -h:\n{text}");
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| panic!("dumpe2fs -h has no {key:?}"))
}

fn root_names(img: &Path) -> Vec<String> {
    let e = Ext4::open(img, Ext4Options::default()).expect("our reader opens the image");
    let fs: Arc<dyn Filesystem> = e;
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fs);
    let f = Fs::new(vfs.root_task());
    let mut names: Vec<String> = f
        .read_dir("/")
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn resize2fs_grows_it() {
    let Some(t) = tools(&["resize2fs", "e2fsck", "dumpe2fs"]) else {
        return;
    };
    let (resize2fs, e2fsck, dumpe2fs) = (&t[0], &t[1], &t[2]);
    let s = Scratch::new("mkfs-grow");
    // (size, block size, features, grown size): 1K from 8 to 256 groups
    // needs 15 more descriptor blocks (reserved GDT blocks, or moved
    // blocks without resize_inode); 4K and 2K cross descriptor-block
    // boundaries too.
    for (size, bs, features, grown) in [
        ("64M", 1024, "", 2u64 << 30),
        ("64M", 1024, "^resize_inode", 1 << 30),
        ("100M", 2048, "", 2 << 30),
        ("300M", 4096, "", 6 << 30),
        ("300M", 4096, "^orphan_file", 6 << 30),
    ] {
        let what = format!("{size} bs {bs} {features:?} grown to {grown}");
        let img = s.0.join("g.img");
        let _ = std::fs::remove_file(&img);
        mkfs::make(&img, &opts(size, bs, features)).unwrap();
        let before: u64 = field(dumpe2fs, &img, "Block count").parse().unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&img)
            .unwrap()
            .set_len(grown)
            .unwrap();
        let (ok, text) = run(resize2fs, &[], &img);
        assert!(ok, "resize2fs {what}:\n{text}");
        let after: u64 = field(dumpe2fs, &img, "Block count").parse().unwrap();
        assert!(after > before, "{what}: {before} -> {after} blocks");
        assert_eq!(after, grown / u64::from(bs), "{what}");
        assert_clean(e2fsck, &img, &format!("resize2fs {what}"));
        assert_eq!(root_names(&img), ["lost+found"], "{what}");
    }
}

#[test]
fn resize2fs_shrinks_it() {
    let Some(t) = tools(&["resize2fs", "e2fsck", "dumpe2fs"]) else {
        return;
    };
    let (resize2fs, e2fsck, dumpe2fs) = (&t[0], &t[1], &t[2]);
    let s = Scratch::new("mkfs-shrink");
    for (size, bs) in [("300M", 1024), ("1G", 4096)] {
        let img = s.0.join("s.img");
        let _ = std::fs::remove_file(&img);
        mkfs::make(&img, &opts(size, bs, "")).unwrap();
        let before: u64 = field(dumpe2fs, &img, "Block count").parse().unwrap();
        let (ok, text) = run(resize2fs, &["-M"], &img);
        assert!(ok, "resize2fs -M {size} bs {bs}:\n{text}");
        let after: u64 = field(dumpe2fs, &img, "Block count").parse().unwrap();
        assert!(after < before, "{size}: {before} -> {after} blocks");
        assert_clean(e2fsck, &img, &format!("resize2fs -M {size} bs {bs}"));
        assert_eq!(root_names(&img), ["lost+found"]);
    }
}

#[test]
fn tune2fs_turns_features_off_and_on() {
    let Some(t) = tools(&["tune2fs", "e2fsck", "dumpe2fs"]) else {
        return;
    };
    let (tune2fs, e2fsck, dumpe2fs) = (&t[0], &t[1], &t[2]);
    let s = Scratch::new("mkfs-tune");
    for bs in [1024, 4096] {
        let img = s.0.join("t.img");
        let _ = std::fs::remove_file(&img);
        mkfs::make(&img, &opts("200M", bs, "")).unwrap();
        // With orphan_file on, tune2fs 1.47.0 -O ^has_journal leaves the
        // orphan file behind and e2fsck then objects (to mke2fs's own
        // images too), so orphan_file goes first.
        for (args, feature, on) in [
            (&["-O", "^orphan_file"][..], "orphan_file", false),
            (&["-O", "^has_journal"], "has_journal", false),
            (&["-O", "has_journal"], "has_journal", true),
            (&["-O", "orphan_file"], "orphan_file", true),
            (&["-O", "^dir_index"], "dir_index", false),
            (&["-L", "relabelled"], "", true),
        ] {
            let what = format!("tune2fs {args:?} (bs {bs})");
            let (ok, text) = run(tune2fs, args, &img);
            assert!(ok, "{what}:\n{text}");
            assert_clean(e2fsck, &img, &what);
            if !feature.is_empty() {
                let list = field(dumpe2fs, &img, "Filesystem features");
                let has = list.split_whitespace().any(|f| f == feature);
                assert_eq!(has, on, "{what}: features {list}");
            }
        }
        assert_eq!(
            field(dumpe2fs, &img, "Filesystem volume name"),
            "relabelled"
        );
        assert_eq!(root_names(&img), ["lost+found"]);
    }
}

/// `losetup -f --show img`: the loop device, detached on drop.
struct Loop(PathBuf);

impl Loop {
    fn attach(img: &Path) -> Option<Loop> {
        let out = Command::new(tool("losetup")?)
            .args(["-f", "--show"])
            .arg(img)
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!(
                "SKIP: losetup refused: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        Some(Loop(PathBuf::from(
            String::from_utf8_lossy(&out.stdout).trim(),
        )))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Some(l) = tool("losetup") {
            let _ = Command::new(l).arg("-d").arg(&self.0).status();
        }
    }
}

#[test]
fn makes_it_on_a_block_device_full_of_garbage() {
    let Some(t) = tools(&["e2fsck", "dumpe2fs"]) else {
        return;
    };
    let (e2fsck, dumpe2fs) = (&t[0], &t[1]);
    let s = Scratch::new("mkfs-blockdev");
    let img = s.0.join("dev.img");
    // Garbage everywhere, as on a used disk (a fixed pattern, not random:
    // the test must be repeatable).
    let junk: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&img).unwrap();
        for _ in 0..40 {
            f.write_all(&junk).unwrap();
        }
    }
    let Some(dev) = Loop::attach(&img) else {
        return;
    };
    for bs in [1024u32, 4096] {
        // A fresh loop device may be held for a moment by udev's probe or
        // another test's mount (O_EXCL: EBUSY): a few tries, then skip.
        let mut tries = 0;
        let r = loop {
            match mkfs::make(&dev.0, &opts("40M", bs, "")) {
                Ok(r) => break r,
                Err(e) if e.to_string().contains("busy") && tries < 10 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                Err(e) if e.to_string().contains("busy") => {
                    eprintln!("SKIP: {} stays busy: {e}", dev.0.display());
                    return;
                }
                Err(e) => panic!("mkfs on a loop device: {e}"),
            }
        };
        assert_eq!(r.blocks * u64::from(bs), 40 << 20);
        assert_clean(
            e2fsck,
            &dev.0,
            &format!("mkfs on a dirty loop device, bs {bs}"),
        );
        assert_eq!(field(dumpe2fs, &dev.0, "Block size"), bs.to_string());
        assert_eq!(root_names(&dev.0), ["lost+found"]);
    }
    // Larger than the device: refused before anything is written, so the
    // filesystem already there is untouched.
    let err = mkfs::make(&dev.0, &opts("41M", 1024, "")).unwrap_err();
    assert!(err.to_string().contains("the device has"), "{err}");
    assert_clean(e2fsck, &dev.0, "a refused mkfs");
    assert_eq!(field(dumpe2fs, &dev.0, "Block size"), "4096");
    // Mounted: O_EXCL gives EBUSY, and the mounted filesystem is untouched.
    let mnt = s.0.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "ext4", "-o", "ro"])
        .arg(&dev.0)
        .arg(&mnt)
        .status()
        .is_ok_and(|st| st.success());
    if !mounted {
        eprintln!("SKIP (mounted-device part): the kernel refused to mount");
        return;
    }
    let busy = mkfs::make(&dev.0, &opts("40M", 1024, ""));
    let _ = Command::new("umount").arg(&mnt).status();
    let err = busy.unwrap_err();
    assert!(err.to_string().contains("busy"), "{err}");
    assert_clean(e2fsck, &dev.0, "mkfs refused on a mounted device");
    assert_eq!(field(dumpe2fs, &dev.0, "Block size"), "4096");
}
