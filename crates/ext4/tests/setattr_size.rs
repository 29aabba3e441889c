//! `Filesystem::setattr` with a size (no caller of the core passes one,
//! but the trait allows it): the size goes through the truncate's own
//! handles, a long truncate in steps with its orphan record removed by the
//! last, then the other attributes. Before, both ran in one handle: an
//! error after a long truncate had begun left its orphan record, and a
//! rerun of the handle for space recorded the inode twice (review, stop
//! 51). Checked here: a long truncate with a mode change applies both,
//! leaves no orphan, and the image passes e2fsck.

mod common;

use common::*;
use scalevfs::fstype::Filesystem;
use scalevfs::{SetAttr, O_CREAT, O_RDWR};

#[test]
fn a_size_with_other_attributes_truncates_in_steps_and_sets_the_rest() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("setattr-size");
    let img = s.0.join("img");
    // 1 KiB blocks and the smallest journal: a 24 MiB file's truncate
    // takes several handles.
    mkfs_args(&img, &["-b", "1024", "-J", "size=1"], "64M");
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    t.fallocate(fd, 0, 0, 24 << 20).unwrap();
    t.write(fd, b"head").unwrap();
    let h = t.handle_at(scalevfs::AT_FDCWD, "/f", 0).unwrap();
    let inode = h.inode().clone();
    let set = SetAttr {
        size: Some(100),
        mode: Some(0o600),
        ..Default::default()
    };
    e.setattr(&inode, &set).unwrap();
    let st = t.fstat(fd).unwrap();
    assert_eq!((st.size, st.mode & 0o7777), (100, 0o600));
    assert!(st.blocks <= 2, "{} sectors left", st.blocks);
    drop((inode, h));
    t.close(fd).unwrap();
    let errs = [SetAttr {
        size: Some(1),
        ..Default::default()
    }];
    t.mkdir("/d", 0o755).unwrap();
    let dh = t.handle_at(scalevfs::AT_FDCWD, "/d", 0).unwrap();
    assert_eq!(
        e.setattr(dh.inode(), &errs[0]),
        Err(scalevfs::Errno::EINVAL)
    );
    drop(dh);
    unmount_clean(t, vfs, e, &img);
    assert!(
        !sb_field(&img, "Filesystem features").contains("orphan_present"),
        "an orphan record was left"
    );
}
