//! The memory-mapped device (`MmapDevice`): a sparse image gets every
//! block allocated at a read-write open (no SIGBUS from a full host
//! filesystem later), threads create, write, fsync and unlink through it,
//! and the image is then clean for e2fsck and reads back the same through
//! the file-backed device. A read-only mapping refuses writes with EBADF.

mod common;

use std::sync::Arc;

use common::{fresh, fsck_clean, have_tools, rw_journaled, Scratch};
use scalevfs::{Vfs, O_CREAT, O_RDWR};
use scalevfs_ext4::{BlockDevice, Ext4, MmapDevice};

#[test]
fn an_image_mapped_into_memory_is_written_and_checked() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("mmapdev");
    let img = fresh(&s.0, 4096, "32M");
    let sparse = std::fs::metadata(&img).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(
        sparse.blocks() * 512 < sparse.len(),
        "mkfs made a sparse image"
    );
    let dev = MmapDevice::open(&img, true).unwrap();
    let full = std::fs::metadata(&img).unwrap();
    assert!(full.blocks() * 512 >= full.len(), "every block allocated");
    let e = Ext4::open_device(Box::new(dev), rw_journaled()).unwrap();
    let vfs = Arc::new(Vfs::with_root_fs(Default::default(), e.clone()));
    std::thread::scope(|sc| {
        for k in 0..2u8 {
            let vfs = vfs.clone();
            sc.spawn(move || {
                let t = vfs.root_task();
                t.mkdir(&format!("/d{k}"), 0o755).unwrap();
                for i in 0..200 {
                    let p = format!("/d{k}/f{i}");
                    let fd = t.open(&p, O_CREAT | O_RDWR, 0o644).unwrap();
                    t.write(fd, &vec![k ^ i as u8; 5000 + i]).unwrap();
                    if i % 10 == 0 {
                        t.fsync(fd).unwrap();
                    }
                    t.close(fd).unwrap();
                    if i % 3 == 0 {
                        t.unlink(&p).unwrap();
                    }
                }
            });
        }
    });
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
    let e = Ext4::open(&img, Default::default()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e);
    let fs = scalevfs::fs::Fs::new(vfs.root_task());
    for k in 0..2u8 {
        for i in 0..200usize {
            let got = fs.read(format!("/d{k}/f{i}"));
            if i % 3 == 0 {
                assert!(got.is_err());
            } else {
                assert_eq!(got.unwrap(), vec![k ^ i as u8; 5000 + i]);
            }
        }
    }
    let ro = MmapDevice::open(&img, false).unwrap();
    let before = std::fs::read(&img).unwrap();
    assert_eq!(
        ro.write_at(0, &[1]).unwrap_err().raw_os_error(),
        Some(libc::EBADF)
    );
    let mut b = vec![0u8; 1024];
    ro.read_at(1024, &mut b).unwrap();
    assert_eq!(&b[..], &before[1024..2048]);
    assert!(
        ro.read_at(ro.size() - 10, &mut b).is_err(),
        "a read past the end"
    );
    assert!(std::fs::read(&img).unwrap() == before);
}
