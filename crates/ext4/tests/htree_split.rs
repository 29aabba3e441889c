//! How a full htree leaf splits (1 KiB blocks, where a leaf holds three
//! 255-byte names or about eighty short ones):
//! - by bytes, not by entry count: a leaf of short names below long ones
//!   by hash once split by count into halves the new long name did not
//!   fit (an EUCLEAN error with the leaf already rewritten);
//! - inside a run of names that share one hash, with the continuation bit
//!   on the new leaf's index entry, as the kernel's do_split: the names
//!   (7-way collisions of half_md4 under a fixed hash seed, found by a
//!   brute-force search of 400 million names) then span leaves, and our
//!   lookup, e2fsck and the kernel follow the run.
//!
//! - random names of every length created and removed (the old split by
//!   count failed at the 242nd create).
//!
//! Each case: every name found through a fresh mount (the on-disk index),
//! `e2fsck -fn` clean, the kernel (loop mount, where the machine allows)
//! lists and finds the same names and adds its own into our index.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use scalevfs::Vfs;
use scalevfs_ext4::format::htree::{dirhash, HASH_HALF_MD4};
use scalevfs_ext4::Ext4;

/// The hash seed the images get (mke2fs -E hash_seed); the colliding
/// names below were searched for under it.
const SEED_UUID: &str = "12345678-9abc-def0-1234-56789abcdef0";

fn image(dir: &Path) -> PathBuf {
    let img = dir.join("img");
    mkfs_args(
        &img,
        &[
            "-b",
            "1024",
            "-O",
            "orphan_file",
            "-E",
            &format!("hash_seed={SEED_UUID}"),
        ],
        "16M",
    );
    img
}

/// `s_hash_seed` as the superblock stores it.
fn seed_of(img: &Path) -> [u32; 4] {
    let b = std::fs::read(img).unwrap();
    let mut s = [0u32; 4];
    for (k, w) in s.iter_mut().enumerate() {
        let o = 1024 + 0xEC + 4 * k;
        *w = u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    }
    s
}

fn hash(name: &str, seed: &[u32; 4]) -> u32 {
    // mke2fs sets signed_directory_hash on x86: version as stored.
    dirhash(name.as_bytes(), HASH_HALF_MD4, seed).unwrap()
}

fn create_all(vfs: &Vfs, names: &[String]) {
    let t = vfs.root_task();
    for n in names {
        t.mknodat(-100, &format!("/d/{n}"), libc::S_IFREG | 0o644, 0)
            .unwrap_or_else(|x| panic!("create {}...: {x:?}", &n[..n.len().min(12)]));
    }
}

/// Unmount, e2fsck, then a fresh mount finds exactly `want` in /d, by
/// lookup and by listing; then the kernel does the same and creates
/// `kernel_adds`, which we find afterwards.
fn judge(
    s: &Scratch,
    img: &Path,
    e: Arc<Ext4>,
    vfs: Vfs,
    want: &BTreeSet<String>,
    kernel_adds: &[String],
) {
    e.unmount().unwrap();
    drop(vfs);
    drop(e);
    fsck_clean(img);
    let (_e, vfs) = mount(img);
    let t = vfs.root_task();
    for n in want {
        t.lstat(&format!("/d/{n}"))
            .unwrap_or_else(|x| panic!("lookup of {}...: {x:?}", &n[..n.len().min(12)]));
    }
    let listed: BTreeSet<String> = t
        .read_dir("/d")
        .unwrap()
        .into_iter()
        .map(|d| String::from_utf8(d.name).unwrap())
        .filter(|n| n != "." && n != "..")
        .collect();
    assert!(&listed == want, "our listing differs");
    drop(t);
    drop(vfs);
    // Unmounted (not only dropped): the image's claim goes now, not when
    // the last inode's grace period ends.
    _e.unmount().unwrap();
    drop(_e);
    let Some(km) = KMount::rw(img, &s.0.join("mnt")) else {
        return;
    };
    let d = km.0.join("d");
    let got: BTreeSet<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|x| x.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(&got == want, "the kernel lists other names");
    for n in want {
        assert!(d.join(n).exists(), "the kernel does not find a name");
    }
    for n in kernel_adds {
        std::fs::File::create(d.join(n)).unwrap();
    }
    drop(km);
    fsck_clean(img);
    let (_e, vfs) = mount(img);
    let t = vfs.root_task();
    for n in want.iter().chain(kernel_adds) {
        t.lstat(&format!("/d/{n}"))
            .unwrap_or_else(|x| panic!("after the kernel: {}...: {x:?}", &n[..n.len().min(12)]));
    }
}

#[test]
fn a_leaf_splits_by_bytes_not_by_count() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("htree-bytes");
    let img = image(&s.0);
    let seed = seed_of(&img);
    // Four long names with the highest hashes of 3,000, and 18 short
    // names (12 bytes each) below all of them: 18 * 12 + 3 * 264 = 1008
    // of the leaf's 1012 bytes, then the fourth long name. A cut by count
    // (at 11 of 22) would leave 7 short and all 4 long names, 1140 bytes,
    // for one block.
    let mut long: Vec<(u32, String)> = (0..3_000)
        .map(|i| {
            let n = format!("{i:05}{}", "L".repeat(250));
            (hash(&n, &seed), n)
        })
        .collect();
    long.sort();
    let long: Vec<String> = long
        .split_off(long.len() - 4)
        .into_iter()
        .map(|x| x.1)
        .collect();
    let floor = hash(&long[0], &seed);
    let short: Vec<String> = (0..)
        .map(|i| format!("s{i}"))
        .filter(|n| hash(n, &seed) < floor)
        .take(18)
        .collect();
    let (e, vfs) = mount(&img);
    vfs.root_task().mkdir("/d", 0o755).unwrap();
    create_all(&vfs, &short);
    create_all(&vfs, &long);
    // More of both kinds: further splits of the same shape.
    let more: Vec<String> = (0..400)
        .map(|i| {
            if i % 3 == 0 {
                format!("{i:05}{}", "m".repeat(200 + i % 50))
            } else {
                format!("t{i}")
            }
        })
        .collect();
    create_all(&vfs, &more);
    let want: BTreeSet<String> = short.iter().chain(&long).chain(&more).cloned().collect();
    let adds: Vec<String> = (0..50)
        .map(|i| format!("k{i}{}", "K".repeat(i * 4)))
        .collect();
    judge(&s, &img, e, vfs, &want, &adds);
}

/// A 255-byte name of the collision search: 245 'q's and a 10-digit
/// number.
fn qname(n: u64) -> String {
    format!("{}{n:010}", "q".repeat(245))
}

/// Seven names each of two half_md4 hashes under `SEED_UUID` (signed
/// characters), found by hashing 400 million `qname`s.
const RUN_A: (u32, [u64; 7]) = (
    0xaf24_b392,
    [
        85624808, 125029730, 160175341, 168913235, 197109169, 201819578, 234501717,
    ],
);
const RUN_B: (u32, [u64; 7]) = (
    0x6918_bfbc,
    [
        39990963, 140591209, 153096775, 260114970, 336133137, 350665760, 366075562,
    ],
);

/// The index entries (hash, block) of `/d` as debugfs's htree_dump shows
/// them.
fn index_hashes(img: &Path) -> Vec<u32> {
    let out = debugfs_ro(img, "htree_dump /d");
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Entry #"))
        .filter_map(|l| l.split("Hash 0x").nth(1))
        .filter_map(|h| {
            u32::from_str_radix(h.split(|c: char| !c.is_ascii_hexdigit()).next()?, 16).ok()
        })
        .collect()
}

#[test]
fn a_run_of_one_hash_spans_leaves_with_the_continuation_bit() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("htree-run");
    let img = image(&s.0);
    let seed = seed_of(&img);
    let a: Vec<String> = RUN_A.1.iter().map(|&n| qname(n)).collect();
    let b: Vec<String> = RUN_B.1.iter().map(|&n| qname(n)).collect();
    for (run, names) in [(RUN_A.0, &a), (RUN_B.0, &b)] {
        for n in names {
            assert_eq!(hash(n, &seed), run, "the fixture's hash");
        }
    }
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    // Three names fill the first block (the directory then becomes
    // indexed); from the fourth on a leaf holds only names of one hash and
    // splits inside the run: twice for seven names.
    create_all(&vfs, &a);
    // Remove two and add them back: the removal finds them through the
    // run, the insert goes to the run's first leaf.
    for n in [&a[0], &a[6]] {
        t.unlink(&format!("/d/{n}")).unwrap();
        assert_eq!(
            t.lstat(&format!("/d/{n}")).err(),
            Some(scalevfs::Errno::ENOENT)
        );
    }
    create_all(&vfs, &[a[6].clone(), a[0].clone()]);
    drop(t);
    e.unmount().unwrap();
    let conts = index_hashes(&img)
        .iter()
        .filter(|&&h| h == RUN_A.0 | 1)
        .count();
    assert!(conts >= 2, "index entries continuing the run: {conts}");
    let want: BTreeSet<String> = a.iter().cloned().collect();
    // The kernel finds ours and adds a run of its own, which we read.
    judge(&s, &img, e, vfs, &want, &b);
}

/// Random names of every length (1 to 255 bytes) created and removed in
/// one directory of 1 KiB blocks, so that leaves split at every kind of
/// cut and the index grows a level: at the end our lookup finds exactly
/// the names kept, e2fsck -fn checks every hash range and count, and the
/// kernel lists the same names.
#[test]
fn random_name_lengths_keep_the_index_valid() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("htree-random");
    let img = image(&s.0);
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    // xorshift64*: deterministic, so a failure reproduces.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut kept: Vec<String> = Vec::new();
    let mut want = BTreeSet::new();
    for i in 0..4_000u64 {
        if !kept.is_empty() && next() % 4 == 0 {
            let k = (next() % kept.len() as u64) as usize;
            let n = kept.swap_remove(k);
            t.unlink(&format!("/d/{n}")).unwrap();
            want.remove(&n);
            continue;
        }
        // Mostly short names, a fifth long ones, a few at the limit.
        let len = match next() % 10 {
            0 | 1 => 200 + (next() % 56) as usize,
            2 => 255,
            _ => 1 + (next() % 24) as usize,
        };
        let tag = format!("{i:x}-");
        let fill = "abcdefghijklmnopqrstuvwxyz0123456789";
        let mut n = tag.clone();
        while n.len() < len.max(tag.len()) {
            n.push(fill.as_bytes()[(next() % 36) as usize] as char);
        }
        n.truncate(len.max(tag.len()).min(255));
        t.mknodat(-100, &format!("/d/{n}"), libc::S_IFREG | 0o644, 0)
            .unwrap_or_else(|x| panic!("create #{i} ({} bytes): {x:?}", n.len()));
        want.insert(n.clone());
        kept.push(n);
    }
    drop(t);
    e.unmount().unwrap();
    let out = debugfs_ro(&img, "htree_dump /d");
    let levels: u32 = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Indirect levels:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no depth in htree_dump: {}", &out[..out.len().min(300)]));
    assert_eq!(levels, 1, "the index did not grow a level below the root");
    judge(&s, &img, e, vfs, &want, &[]);
}
