//! A write's whole blocks that lie one after another on the device go to
//! the device in one `write_at` (one `pwrite` on an image file, which takes
//! the image's inode lock in the host kernel: every writing thread shares
//! it, so fewer calls is less time under a shared lock). Counted on a
//! wrapping device, not timed; the data read back must be what was written.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{fresh, fsck_clean, have_tools, rw_journaled, Hooked, Scratch};
use scalevfs::{Vfs, O_CREAT, O_RDWR};
use scalevfs_ext4::{Ext4, FileDevice};

#[test]
fn contiguous_whole_blocks_are_written_in_one_call() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("writeruns");
    let img = fresh(&s.0, 4096, "64M");
    let writes = Arc::new(AtomicU64::new(0));
    // Counts `write_at` calls.
    let mut dev = Hooked::new(FileDevice::open(&img, true).unwrap());
    let w = writes.clone();
    dev.on_write = Box::new(move |_, _| {
        // Relaxed: a counter read after the writer returned.
        w.fetch_add(1, Ordering::Relaxed);
        Ok(())
    });
    let e = Ext4::open_device(Box::new(dev), rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    // 64 whole blocks and a partial one, into a fresh file (contiguous
    // blocks on a fresh image), then 16 whole blocks over the middle.
    let data: Vec<u8> = (0..64 * 4096 + 100).map(|i| (i * 7 % 251) as u8).collect();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    // Relaxed: as above.
    let w0 = writes.load(Ordering::Relaxed);
    assert_eq!(t.pwrite(fd, &data, 0).unwrap(), data.len());
    let w1 = writes.load(Ordering::Relaxed);
    // One run of 64 blocks and the partial block (block by block: 65).
    assert!(w1 - w0 <= 3, "{} device writes for 65 blocks", w1 - w0);
    let over = vec![0xeeu8; 16 * 4096];
    assert_eq!(t.pwrite(fd, &over, 8 * 4096).unwrap(), over.len());
    let w2 = writes.load(Ordering::Relaxed);
    assert_eq!(w2 - w1, 1, "an overwrite of 16 contiguous blocks");
    let mut want = data.clone();
    want[8 * 4096..24 * 4096].copy_from_slice(&over);
    let mut got = vec![0u8; want.len()];
    assert_eq!(t.pread(fd, &mut got, 0).unwrap(), want.len());
    assert!(got == want, "read back differs");
    t.close(fd).unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    drop(e);
    fsck_clean(&img);
}
