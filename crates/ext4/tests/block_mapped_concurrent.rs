//! Block-mapped (ext2/3-style) files: threads writing block-mapped files on an ext3 image at once
//! (each its own file, and all one shared file in disjoint ranges), with
//! punches and readers; the contents are the model's, e2fsck clean.

mod common;

use std::sync::Arc;

use common::*;
use scalevfs::{O_CREAT, O_RDWR};

#[test]
fn threads_on_block_mapped_files() {
    if !have_tools() {
        return;
    }
    for bs in [1024usize, 4096] {
        let s = Scratch::new(&format!("blockmap-conc-{bs}"));
        let img = s.0.join("img");
        mkfs_args(
            &img,
            &["-t", "ext3", "-b", &bs.to_string(), "-J", "size=4"],
            "256M",
        );
        let (e, vfs) = mount(&img);
        let vfs = Arc::new(vfs);
        let per = (bs / 4) as u64;
        let b = bs as u64;
        let span = (12 + per + 3 * per) * b;
        {
            let t = vfs.root_task();
            let fd = t.open("/shared", O_CREAT | O_RDWR, 0o644).unwrap();
            t.close(fd).unwrap();
        }
        let mut hs = Vec::new();
        for w in 0..4u64 {
            let vfs = vfs.clone();
            hs.push(std::thread::spawn(move || {
                let t = vfs.root_task();
                let own = format!("/f{w}");
                let fd = t.open(own.as_str(), O_CREAT | O_RDWR, 0o644).unwrap();
                let sh = t.open("/shared", O_RDWR, 0).unwrap();
                let mut model = vec![0u8; span as usize];
                let mut rng = Rng(w * 7919 + 13);
                let punch = scalevfs::io::FALLOC_FL_PUNCH_HOLE | scalevfs::io::FALLOC_FL_KEEP_SIZE;
                for i in 0..300u64 {
                    let off = rng.below(span - 3 * b);
                    let len = 1 + rng.below(3 * b) as usize;
                    let k = (i as u8) ^ (w as u8 * 40) | 1;
                    if i % 9 == 8 {
                        t.fallocate(fd, punch, off as i64, len as i64).unwrap();
                        model[off as usize..off as usize + len].fill(0);
                    } else {
                        let d = vec![k; len];
                        assert_eq!(t.pwrite(fd, &d, off as i64), Ok(len));
                        model[off as usize..off as usize + len].fill(k);
                    }
                    // The shared file: this thread's quarter of each
                    // single indirect range.
                    let q = (i % (4 + 2 * per)) * (per / 4) * b + w * (per / 16) * b;
                    let d = vec![k; bs + 3];
                    assert_eq!(t.pwrite(sh, &d, (12 * b + q) as i64), Ok(bs + 3));
                    if i % 50 == 0 {
                        t.fsync(fd).unwrap();
                    }
                }
                let mut back = vec![0u8; span as usize];
                let n = t.pread(fd, &mut back, 0).unwrap();
                back.truncate(n);
                let want = &model[..n];
                assert!(back == want, "thread {w}: contents differ");
                t.close(fd).unwrap();
                t.close(sh).unwrap();
            }));
        }
        // Readers of the shared file meanwhile.
        for r in 0..2 {
            let vfs = vfs.clone();
            hs.push(std::thread::spawn(move || {
                let t = vfs.root_task();
                let fd = t.open("/shared", scalevfs::O_RDONLY, 0).unwrap();
                let mut buf = vec![0u8; 1 << 20];
                for i in 0..200 {
                    let _ = t.pread(fd, &mut buf, ((i * 7 + r) % 64) * 4096).unwrap();
                }
                t.close(fd).unwrap();
            }));
        }
        for h in hs {
            h.join().unwrap();
        }
        let vfs = Arc::try_unwrap(vfs).ok().unwrap();
        let t = vfs.root_task();
        unmount_clean(t, vfs, e, &img);
    }
}
