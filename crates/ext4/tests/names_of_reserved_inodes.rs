//! Directory entries that name the filesystem's own inodes (the journal,
//! the orphan file) or the directory itself are corruption (EUCLEAN), as
//! the kernel's `__ext4_iget` and `ext4_lookup` say (review, stop 49).
//! Before, a crafted image's name for the journal let `write` go straight
//! into the live journal and `unlink` put the journal on the orphan file;
//! a name for the orphan file let `rm` free the orphan file's blocks while
//! it still used them. Nothing reachable through such a name may change
//! the image: e2fsck says exactly what it said before our mount.

mod common;

use common::*;
use scalevfs::*;

#[test]
fn names_of_reserved_inodes_are_corrupt() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck/debugfs not found");
        return;
    }
    let s = Scratch::new("reserved_names");
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "4096", "-O", "orphan_file"], "16M");
    for req in ["ln <8> jnl", "ln <12> orph", "mkdir d", "ln d d/self"] {
        assert!(debugfs(&img, req));
    }
    let before = e2fsck(&img, "-fn").1;
    assert!(before.contains("invalid inode #: 8"), "{before}");
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    for p in ["/jnl", "/orph", "/d/self"] {
        assert_eq!(t.stat(p).err(), Some(Errno::EUCLEAN), "stat {p}");
        assert_eq!(
            t.open(p, O_WRONLY, 0).err(),
            Some(Errno::EUCLEAN),
            "open {p}"
        );
        assert_eq!(t.unlink(p).err(), Some(Errno::EUCLEAN), "unlink {p}");
    }
    assert_eq!(t.rmdir("/d/self").err(), Some(Errno::EUCLEAN));
    // The directory still lists, and the rest of the tree still works.
    let names: Vec<Vec<u8>> = t
        .read_dir("/")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&b"jnl".to_vec()));
    let fd = t.open("/f", O_CREAT | O_WRONLY, 0o644).unwrap();
    assert_eq!(t.write(fd, b"still fine"), Ok(10));
    t.close(fd).unwrap();
    t.unlink("/f").unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    let after = e2fsck(&img, "-fn").1;
    let strip = |s: &str| {
        s.lines()
            .filter(|l| !l.contains("e2fsck 1.") && !l.contains("files,"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        strip(&before),
        strip(&after),
        "e2fsck before vs after our mount"
    );
}
