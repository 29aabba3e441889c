//! An image open read-write holds an exclusive `flock`: a second
//! read-write open (another `Ext4::open`, whichever device it would use,
//! or `scalevfs mkfs` over it) is refused while the first lives, and works
//! once it is unmounted (or dropped); read-only opens take no lock and
//! are never refused.

mod common;

use common::{fresh, have_tools, rw_journaled, Scratch};
use scalevfs_ext4::{Ext4, Ext4Options, FileDevice, IoMode, MmapDevice};

fn refused(r: std::io::Result<impl Sized>) -> bool {
    match r {
        Ok(_) => false,
        Err(e) => {
            assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
            assert!(e.to_string().contains("open read-write elsewhere"), "{e}");
            true
        }
    }
}

#[test]
fn a_second_writer_of_one_image_is_refused() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("imglock");
    let img = fresh(&s.0, 4096, "16M");
    for io in [IoMode::Auto, IoMode::Pwrite] {
        let first = Ext4::open(
            &img,
            Ext4Options {
                io,
                ..rw_journaled()
            },
        )
        .unwrap();
        // Every way of opening it read-write is refused meanwhile.
        for io2 in [IoMode::Auto, IoMode::Pwrite] {
            let Err(e) = Ext4::open(
                &img,
                Ext4Options {
                    io: io2,
                    ..rw_journaled()
                },
            ) else {
                panic!("a second writer was let in");
            };
            assert!(e.to_string().contains("open read-write elsewhere"), "{e}");
        }
        assert!(refused(FileDevice::open(&img, true)));
        assert!(refused(MmapDevice::open_lazy(&img)));
        assert!(refused(MmapDevice::open(&img, true)));
        // Read-only opens are not.
        assert!(FileDevice::open(&img, false).is_ok());
        assert!(MmapDevice::open(&img, false).is_ok());
        // Let go at unmount, though the filesystem lives on (here: this
        // handle; in general, inodes freed after a grace period).
        first.unmount().unwrap();
        let again = Ext4::open(&img, rw_journaled()).unwrap();
        again.unmount().unwrap();
        drop(first);
    }
}

#[test]
fn mkfs_over_an_image_open_read_write_is_refused() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("imglockmkfs");
    let img = fresh(&s.0, 4096, "16M");
    let fs = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = scalevfs::Vfs::with_root_fs(Default::default(), fs.clone());
    scalevfs::fs::Fs::new(vfs.root_task())
        .write("/kept", b"still here")
        .unwrap();
    let o = scalevfs_ext4::mkfs::MkfsOptions {
        size: 8 << 20,
        ..Default::default()
    };
    let e = scalevfs_ext4::mkfs::make(&img, &o).expect_err("mkfs over a mounted image");
    assert!(e.to_string().contains("open read-write elsewhere"), "{e}");
    // Not cut: the mount goes on and its data stays.
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 16 << 20);
    drop(vfs);
    fs.unmount().unwrap();
    drop(fs);
    common::fsck_clean(&img);
    let fs = Ext4::open(&img, Default::default()).unwrap();
    let vfs = scalevfs::Vfs::with_root_fs(Default::default(), fs);
    assert_eq!(
        scalevfs::fs::Fs::new(vfs.root_task())
            .read("/kept")
            .unwrap(),
        b"still here"
    );
    // Once it is unmounted, mkfs may make a new filesystem there.
    drop(vfs);
    scalevfs_ext4::mkfs::make(&img, &o).unwrap();
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 8 << 20);
}
