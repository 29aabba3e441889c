//! Replacing an extended attribute's value is atomic for readers: a
//! concurrent `getxattr` sees the old value or the new one, never "no such
//! attribute" (xfstests generic/037 through the mount found ENODATA while
//! memfs reinserted the name in its skip list).

use std::sync::atomic::{AtomicBool, Ordering};

use scalevfs::{Vfs, O_CREAT, O_WRONLY};

#[test]
fn readers_never_miss_a_replaced_value() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
    t.setxattr("/f", "user.v", b"first", 0).unwrap();
    let stop = AtomicBool::new(false);
    let writes = if cfg!(miri) { 50 } else { 20_000 };
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let r = vfs.root_task();
            let mut buf = [0u8; 64];
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let n = r
                    .getxattr("/f", "user.v", &mut buf)
                    .unwrap_or_else(|e| panic!("read {reads}: {e:?} during a replace"));
                assert!(
                    matches!(&buf[..n], b"first" | b"second-value"),
                    "torn value"
                );
                reads += 1;
            }
            reads
        });
        for i in 0..writes {
            let v: &[u8] = if i % 2 == 0 {
                b"second-value"
            } else {
                b"first"
            };
            t.setxattr("/f", "user.v", v, scalevfs::xattr::XATTR_REPLACE)
                .unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    });
}
