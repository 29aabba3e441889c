//! `BlockDevice::write_vectored_at` (the journal's log writes) puts its
//! buffers one after another from the given offset, on the file device
//! (one `pwritev` per 1,024 buffers) and through the default method, and
//! leaves the bytes around the range as they were.

use scalevfs_ext4::{BlockDevice, FileDevice, MemDevice};

/// 1,500 buffers of 1..=37 bytes with distinct contents, and their
/// concatenation.
fn pieces() -> (Vec<Vec<u8>>, Vec<u8>) {
    let bufs: Vec<Vec<u8>> = (0..1500u32)
        .map(|i| {
            let len = 1 + (i as usize * 7) % 37;
            (0..len).map(|k| (i as usize * 31 + k) as u8).collect()
        })
        .collect();
    let all = bufs.concat();
    (bufs, all)
}

fn check(dev: &dyn BlockDevice, read_all: impl Fn() -> Vec<u8>, size: usize) {
    let (bufs, all) = pieces();
    let refs: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
    let off = 333u64;
    dev.write_vectored_at(off, &refs).unwrap();
    let got = read_all();
    assert_eq!(got.len(), size);
    assert!(
        got[..off as usize].iter().all(|&b| b == 0xEE),
        "bytes before"
    );
    assert_eq!(&got[off as usize..off as usize + all.len()], &all[..]);
    assert!(
        got[off as usize + all.len()..].iter().all(|&b| b == 0xEE),
        "bytes after"
    );
}

#[test]
fn file_device_writes_buffers_in_order() {
    let dir = std::env::temp_dir().join(format!("sv-vec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("img");
    let size = 64 * 1024;
    std::fs::write(&path, vec![0xEEu8; size]).unwrap();
    let dev = FileDevice::open(&path, true).unwrap();
    check(&dev, || std::fs::read(&path).unwrap(), size);
    drop(dev);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn default_method_writes_buffers_in_order() {
    let size = 64 * 1024;
    let dev = MemDevice::new(vec![0xEEu8; size]);
    check(
        &dev,
        || {
            let mut v = vec![0u8; size];
            dev.read_at(0, &mut v).unwrap();
            v
        },
        size,
    );
}
