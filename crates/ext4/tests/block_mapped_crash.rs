//! Block-mapped (ext2/3-style) files: crash states of block-mapped writes and punches on ext3 images:
//! files reaching the double and triple indirect blocks, fsynced; a punch
//! of whole indirect subtrees; a new file reusing the freed (once
//! journaled) indirect blocks as data; a truncate; each crash state
//! recovers to the tree of the last fsync or the next, e2fsck clean.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{have_tools, rw_journaled, Scratch};
use scalevfs::{Vfs, O_CREAT, O_RDWR};
use scalevfs_ext4::crashdev::RecordingDevice;
use scalevfs_ext4::{Ext4, MemDevice};

/// (name, size, hash of content) of /a, /b, /c.
type Tree = BTreeMap<String, (u64, u64)>;

fn tree_of(vfs: &Vfs) -> Tree {
    let t = vfs.root_task();
    let mut out = Tree::new();
    for n in ["/a", "/b", "/c"] {
        let Ok(st) = t.stat(n) else { continue };
        let fd = t.open(n, scalevfs::O_RDONLY, 0).unwrap();
        let mut h: u64 = 0xcbf29ce484222325;
        let mut buf = vec![0u8; 1 << 16];
        let mut off = 0u64;
        while off < st.size {
            // Sparse files: read only the first 4 MiB and windows beyond.
            let k = t.pread(fd, &mut buf, off as i64).unwrap();
            assert!(k > 0);
            for (i, &b) in buf[..k].iter().enumerate() {
                if b != 0 {
                    h = (h ^ (off + i as u64)).wrapping_mul(0x100000001b3) ^ u64::from(b);
                }
            }
            off += k as u64;
            if off >= 4 << 20 && off < st.size.saturating_sub(1 << 20) {
                off = st.size.saturating_sub(1 << 20);
            }
        }
        t.close(fd).unwrap();
        out.insert(n.to_string(), (st.size, h));
    }
    out
}

fn pat(n: usize, k: u8) -> Vec<u8> {
    (0..n).map(|i| (i % 241) as u8 ^ k | 1).collect()
}

fn workload(rec: &Arc<RecordingDevice<MemDevice>>, bs: usize) -> Vec<(usize, Tree)> {
    let e = Ext4::open_device(Box::new(rec.clone()), rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let per = (bs / 4) as i64;
    let b = bs as i64;
    let mut points = vec![(rec.writes(), tree_of(&vfs))];
    let mut sync = |fd: i32, vfs: &Vfs| {
        t.fsync(fd).unwrap();
        points.push((rec.writes(), tree_of(vfs)));
    };
    let a = t.open("/a", O_CREAT | O_RDWR, 0o644).unwrap();
    // Across 11/12 and into the double indirect block.
    t.pwrite(a, &pat(3 * bs, 1), 10 * b + 7).unwrap();
    t.pwrite(a, &pat(2 * bs + 3, 2), (12 + per) * b - b)
        .unwrap();
    t.pwrite(a, &pat(bs, 3), (12 + per + 2 * per) * b + 9)
        .unwrap();
    sync(a, &vfs);
    // The triple.
    let c = t.open("/c", O_CREAT | O_RDWR, 0o644).unwrap();
    t.pwrite(c, &pat(2 * bs, 4), (12 + per + per * per) * b - 5)
        .unwrap();
    sync(c, &vfs);
    // Punch a's double indirect subtree and c's triple part: their
    // indirect blocks (journaled above) are freed.
    let punch = scalevfs::io::FALLOC_FL_PUNCH_HOLE | scalevfs::io::FALLOC_FL_KEEP_SIZE;
    t.fallocate(a, punch, (12 + per) * b, 4 * per * b).unwrap();
    t.fallocate(c, punch, (12 + per + per * per) * b, 1 << 30)
        .unwrap();
    sync(a, &vfs);
    // A new file over the freed blocks (after the commit that freed
    // them): data where indirect blocks were.
    let bb = t.open("/b", O_CREAT | O_RDWR, 0o644).unwrap();
    t.pwrite(bb, &pat(40 * bs, 5), 0).unwrap();
    sync(bb, &vfs);
    t.pwrite(a, &pat(bs, 6), (12 + per + 5) * b).unwrap();
    t.ftruncate(c, 11 * b + 1).unwrap();
    t.pwrite(bb, &pat(bs, 7), (12 + per) * b).unwrap();
    sync(bb, &vfs);
    t.close(a).unwrap();
    t.close(bb).unwrap();
    t.close(c).unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    let last = points.last().unwrap().1.clone();
    points.push((rec.writes(), last));
    points
}

#[test]
fn crash_states_of_block_mapped_writes_and_punches() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("blockmap-crash");
    for bs in [1024usize, 4096] {
        let img = s.0.join(format!("ext3-{bs}"));
        common::mkfs_args(&img, &["-t", "ext3", "-b", &bs.to_string()], "8M");
        let (n, _) = common::check_crash_states(
            &img,
            &s.0.join(format!("state{bs}")),
            bs,
            200_000,
            |rec| workload(rec, bs),
            tree_of,
            &format!("bs {bs}, state"),
            |tree, _, ok| {
                let ok: Vec<&Tree> = ok.iter().map(|(_, t)| t).collect();
                format!("{tree:?} is neither {ok:?}")
            },
        );
        eprintln!("bs {bs}: {n} states");
    }
}
