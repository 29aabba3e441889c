//! Random-operation differential test: one seeded sequence of namespace
//! and data calls (create, write at an offset, append, truncate, punch,
//! read, unlink, mkdir, rmdir, rename — over existing targets, across
//! directories, RENAME_EXCHANGE and RENAME_NOREPLACE — hard link, symlink,
//! readlink, chmod, stat) runs through
//! the same `Fs` API on a memfs `Vfs` and on a read-write ext4 `Vfs`.
//! Every call's result (value or errno) must agree, with the ext4 image
//! unmounted and reopened in the middle; the final trees must be equal;
//! e2fsck -fn passes at the end.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use scalevfs::fs::{FileExt, Fs};
use scalevfs::types::{RENAME_EXCHANGE, RENAME_NOREPLACE};
use scalevfs::{Filesystem, Vfs, VfsConfig};
use scalevfs_ext4::{Ext4, Ext4Options};

/// A tiny deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const NAMES: &[&str] = &["a", "b", "c", "d1", "d2"];

fn path(r: &mut Rng) -> String {
    let depth = r.below(3);
    let mut p = String::new();
    for i in 0..=depth {
        let n = if i < depth {
            ["d1", "d2"][r.below(2) as usize]
        } else {
            NAMES[r.below(NAMES.len() as u64) as usize]
        };
        p.push('/');
        p.push_str(n);
    }
    p
}

fn e<T>(r: std::io::Result<T>) -> Result<T, i32> {
    r.map_err(|x| x.raw_os_error().unwrap_or(-1))
}

/// One operation on `fs`; the value both sides must agree on.
fn op(fs: &Fs, r: &mut Rng, bs: usize) -> String {
    let p = path(r);
    let q = path(r);
    let k = r.below(15);
    let off = r.below(4 * bs as u64);
    let len = 1 + r.below(2 * bs as u64) as usize;
    let seed = r.below(256) as u8;
    let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_add(seed)).collect();
    let out = match k {
        0 => format!("{:?}", e(fs.create_dir(&p))),
        1 => format!("{:?}", e(fs.remove_dir(&p))),
        2 => format!("{:?}", e(fs.remove_file(&p))),
        3 => format!("{:?}", e(fs.rename(&p, &q))),
        4 => format!("{:?}", e(fs.hard_link(&p, &q))),
        5 => format!("{:?}", e(fs.symlink(&q[1..], &p))),
        6 => format!("{:?}", e(fs.read_link(&p))),
        7 | 8 => format!(
            "{:?}",
            e(fs.options()
                .write(true)
                .create(true)
                .open(&p)
                .and_then(|f| f.write_all_at(&data, off)))
        ),
        9 => format!(
            "{:?}",
            e(fs.options()
                .write(true)
                .open(&p)
                .and_then(|f| f.set_len(off)))
        ),
        10 => format!("{:?}", e(fs.read(&p)).map(|v| (v.len(), short(v)))),
        11 => format!(
            "{:?}",
            e(fs.symlink_metadata(&p)).map(|m| {
                let st = *m.stat();
                let size = if m.is_dir() { 0 } else { st.size };
                (st.mode, st.nlink, size)
            })
        ),
        12 => format!(
            "{:?}",
            e(fs.set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)))
        ),
        13 => format!(
            "{:?}",
            fs.task()
                .renameat2(-100, p.as_str(), -100, q.as_str(), RENAME_EXCHANGE)
        ),
        _ => format!(
            "{:?}",
            fs.task()
                .renameat2(-100, p.as_str(), -100, q.as_str(), RENAME_NOREPLACE)
        ),
    };
    format!("{k} {p} {q}: {out}")
}

fn tree(fs: &Fs) -> BTreeMap<String, Node> {
    let mut t = vfs_tree(fs);
    for n in t.values_mut() {
        n.mtime = (0, 0);
    }
    t
}

fn ext4_vfs(img: &std::path::Path) -> (Arc<Ext4>, Fs) {
    let e = Ext4::open(
        img,
        Ext4Options {
            ro: false,
            ..Ext4Options::default()
        },
    )
    .unwrap();
    let fsd: Arc<dyn Filesystem> = e.clone();
    let vfs = Vfs::with_root_fs(VfsConfig::default(), fsd);
    (e, Fs::new(vfs.root_task()))
}

fn run(bs: usize, seed: u64, n: usize) {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("rwdiff");
    let img = fresh(&s.0, bs, "16M");
    let mem = Fs::new(Vfs::with_config(VfsConfig::default()).root_task());
    // lost+found exists on the image: give memfs one too.
    mem.create_dir("/lost+found").unwrap();
    let (mut e, mut ext) = ext4_vfs(&img);
    let mut rm = Rng(seed);
    let mut re = Rng(seed);
    let mut ok = 0;
    let mut exchanged = 0;
    for i in 0..n {
        if i == n / 2 {
            // Unmount and reopen the image in the middle.
            e.unmount().unwrap();
            drop(ext);
            drop(e);
            fsck_clean(&img);
            (e, ext) = ext4_vfs(&img);
        }
        let a = op(&mem, &mut rm, bs);
        let b = op(&ext, &mut re, bs);
        assert_eq!(a, b, "step {i} (seed {seed})");
        ok += usize::from(a.contains(": Ok("));
        exchanged += usize::from(a.starts_with("13 ") && a.contains(": Ok("));
    }
    // The sequence must do real work, not only fail.
    assert!(ok > n / 8, "only {ok} of {n} calls succeeded");
    assert!(exchanged > 0, "no RENAME_EXCHANGE succeeded");
    let t = tree(&mem);
    assert!(t.len() > 3, "{t:?}");
    assert_eq!(tree(&mem), tree(&ext), "final trees (seed {seed})");
    e.unmount().unwrap();
    fsck_clean(&img);
}

#[test]
fn random_ops_agree_with_memfs_1k() {
    for seed in 1..=3 {
        run(1024, seed * 0x9E37_79B9, 1500);
    }
}

#[test]
fn random_ops_agree_with_memfs_4k() {
    for seed in 4..=6 {
        run(4096, seed * 0x9E37_79B9, 1500);
    }
}
