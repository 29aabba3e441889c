//! Corrupt images never panic or hang: random bytes of the superblock, the
//! group descriptors, an inode table block, an extent block, a directory
//! block, an htree root and an htree leaf of a small image are changed, then the image is
//! opened, walked and read through the `Filesystem` API. Every call must
//! return Ok or an error. Each case's work is bounded by the walk's limits.

mod common;

use scalevfs::types::FileType;
use scalevfs::Filesystem;
use scalevfs_ext4::format::extent::{self, Node};
use scalevfs_ext4::format::inode::RawInode;
use scalevfs_ext4::{BlockDevice, Ext4, Ext4Options, Mapping, MemDevice};
use std::panic::AssertUnwindSafe;

use common::*;

const MAX_ENTRIES: usize = 5000;
const MAX_READ: u64 = 4 << 20;

/// Open and walk everything; errors are fine, panics are not. True when
/// the image opened and the walk listed at least one name besides `.`
/// and `..` (a case that reached the parsers past the mount).
fn exercise(img: Vec<u8>) -> bool {
    let Ok(fs) = Ext4::open_device(Box::new(MemDevice::new(img)), Ext4Options::default()) else {
        return false;
    };
    let _ = fs.statfs();
    let mut stack = vec![fs.root()];
    let mut seen = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    let mut walked = false;
    while let Some(d) = stack.pop() {
        let mut names = Vec::new();
        let _ = fs.readdir(&d, 0, &mut |e| {
            names.push(e.name);
            names.len() + seen < MAX_ENTRIES
        });
        seen += names.len();
        walked |= names.iter().any(|n| n != b"." && n != b"..");
        for n in names {
            let Ok(Some(i)) = fs.lookup(&d, &n) else {
                continue;
            };
            match i.file_type() {
                FileType::Directory if i.ino() != d.ino() && stack.len() < 64 => stack.push(i),
                FileType::Regular => {
                    let mut off = 0;
                    while off < MAX_READ {
                        match fs.read(&i, off, &mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(k) => off += k as u64,
                        }
                    }
                }
                FileType::Symlink => {
                    let _ = fs.readlink(&i);
                    let _ = fs.get_link_cached(&i);
                }
                _ => {}
            }
        }
        if seen >= MAX_ENTRIES {
            break;
        }
    }
    walked
}

/// Mount read-write (journaled) and change things: in each directory
/// reached, create and write a file, make a directory, write into,
/// truncate, rename and unlink what is there; then sync and unmount.
/// Errors are fine; panics are not; a refused mount writes nothing. True
/// when the image mounted and its root listed at least one name besides
/// `.` and `..`.
fn exercise_rw(img: Vec<u8>) -> bool {
    let dev = std::sync::Arc::new(MemDevice::new(img.clone()));
    let opts = Ext4Options {
        ro: false,
        commit_interval: 0,
        ..Ext4Options::default()
    };
    let fs = match Ext4::open_device(Box::new(dev.clone()), opts) {
        Ok(fs) => fs,
        Err(e) => {
            let mut now = vec![0u8; img.len()];
            dev.read_at(0, &mut now).unwrap();
            assert!(
                now == img,
                "a refused read-write mount wrote to the image ({e})"
            );
            return false;
        }
    };
    let vfs = scalevfs::Vfs::with_root_fs(Default::default(), fs.clone());
    let t = vfs.root_task();
    let mut dirs = vec![b"/".to_vec()];
    let mut done = 0;
    let mut walked = false;
    while let Some(d) = dirs.pop() {
        if done >= 12 {
            break;
        }
        done += 1;
        let path = |n: &[u8]| {
            let mut p = d.clone();
            if !p.ends_with(b"/") {
                p.push(b'/');
            }
            p.extend_from_slice(n);
            p
        };
        let mut names = Vec::new();
        if let Ok(fd) = t.open(&d, scalevfs::O_RDONLY | scalevfs::O_DIRECTORY, 0) {
            if let Ok(v) = t.getdents(fd, 64) {
                for e in v {
                    if names.len() < 40 && e.name != b"." && e.name != b".." {
                        walked = true;
                        names.push((e.name, e.file_type));
                    }
                }
            }
            let _ = t.close(fd);
        }
        if let Ok(fd) = t.open(&path(b"new"), scalevfs::O_CREAT | scalevfs::O_RDWR, 0o644) {
            let _ = t.write(fd, &[7u8; 5000]);
            let _ = t.fsync(fd);
            let _ = t.close(fd);
        }
        let _ = t.mkdir(&path(b"newdir"), 0o755);
        for (k, (n, ft)) in names.iter().enumerate() {
            let p = path(n);
            match ft {
                FileType::Directory if dirs.len() < 16 => dirs.push(p.clone()),
                FileType::Regular => {
                    if let Ok(fd) = t.open(&p, scalevfs::O_RDWR, 0) {
                        let _ = t.pwrite(fd, &[9u8; 3000], 100);
                        let _ = t.pwrite(fd, &[9u8; 100], 70_000);
                        let _ = t.ftruncate(fd, 1500);
                        let _ = t.close(fd);
                    }
                }
                _ => {}
            }
            match k % 3 {
                0 => {
                    let _ = t.rename(&p, &path(format!("r{k}").as_bytes()));
                }
                1 => {
                    let _ = t.unlink(&p);
                }
                _ => {}
            }
        }
    }
    drop(t);
    drop(vfs);
    let _ = fs.unmount();
    walked
}

/// A pristine image opened read-only (the tests' own layout checks).
fn open_ro(img: &[u8]) -> std::sync::Arc<Ext4> {
    Ext4::open_device(
        Box::new(MemDevice::new(img.to_vec())),
        Ext4Options::default(),
    )
    .expect("pristine image opens")
}

/// Byte ranges of the structures to corrupt in `img`.
fn targets(img: &[u8]) -> Vec<(&'static str, usize, usize)> {
    let fs = open_ro(img);
    let bs = fs.block_size();
    let sb = fs.superblock().clone();
    let mut t = vec![("superblock", 1024, 1024)];
    t.push((
        "group descriptors",
        (sb.first_data_block as usize + 1) * bs,
        bs,
    ));
    // The inode table block holding the root (inode 2).
    let root = fs.read_inode(2).unwrap();
    let itb = {
        let gd_off = (sb.first_data_block as usize + 1) * bs;
        let lo = u32::from_le_bytes(img[gd_off + 8..gd_off + 12].try_into().unwrap()) as usize;
        lo + sb.inode_size() / bs
    };
    t.push(("inode table", itb * bs, bs));
    let lookup = |name: &[u8]| {
        let ino = fs.lookup_name(&root, name).unwrap().unwrap();
        fs.read_inode(ino).unwrap()
    };
    let frag = lookup(b"frag");
    let node = extent::parse_node(&frag.block, &|| "frag".into(), None, None, u64::MAX).unwrap();
    let Node::Index(_, ix) = node else {
        panic!("frag has no extent block")
    };
    t.push(("extent block", ix[0].leaf as usize * bs, bs));
    let small = lookup(b"a");
    let Mapping::Data { pblk, .. } = fs.map_block(&small, 0).unwrap() else {
        panic!("a has no block")
    };
    t.push(("directory block", pblk as usize * bs, bs));
    let big = lookup(b"big");
    assert!(
        big.flags & 0x1000 != 0 || !have_e2fsck(),
        "big is not indexed"
    );
    let Mapping::Data { pblk, .. } = fs.map_block(&big, 0).unwrap() else {
        panic!("big has no block")
    };
    t.push(("htree root", pblk as usize * bs, bs));
    if let Ok(Mapping::Data { pblk, .. }) = fs.map_block(&big, 1) {
        t.push(("htree leaf", pblk as usize * bs, bs));
    }
    t
}

fn fuzz(features: &str, seed: u64) {
    run_fuzz(features, seed, 1, "", exercise);
}

/// The seed of a run: `seed`, mixed with `EXT4_FUZZ_SEED` when it is set,
/// so that a long campaign (`EXT4_FUZZ_CASES=5000 EXT4_FUZZ_SEED=7`) tries
/// corruptions CI never did; the panic message names the seed to replay.
fn seed_of(seed: u64) -> u64 {
    let extra: u64 = std::env::var("EXT4_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    seed ^ extra.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Cases per target structure: `EXT4_FUZZ_CASES` (default 150) / `share`.
fn cases(share: u64) -> u64 {
    let cases: u64 = std::env::var("EXT4_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    (cases / share).max(1)
}

/// A small image of a generated tree (`features`), then `cases(share)`
/// corruptions of each target structure (`targets`), given to `f`.
fn run_fuzz(features: &str, seed: u64, share: u64, mode: &str, f: fn(Vec<u8>) -> bool) {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("fuzz");
    let src = s.0.join("src");
    build_tree(&src, 150, 60, 1024);
    let img = s.0.join("img");
    make_image(&src, &img, 1024, "12M", features);
    let pristine = std::fs::read(&img).unwrap();
    let t = targets(&pristine);
    corrupt_each(&pristine, &t, seed, cases(share), mode, f);
}

/// `cases` corruptions of each target range of `pristine` (1..8 random
/// bytes set to 0, 0xff or anything), each given to `f` under
/// `catch_unwind`: a panic fails the test, naming the case. The pristine
/// image goes first and must open and walk. So that the fuzzer cannot
/// pass by having every case refused at the mount (testing nothing but
/// the first check), at least half of all cases must open and list a
/// name (`f` returns true; 69% to 88% did at each test's seed when this
/// floor was set, the superblock's and the root inode's cases the
/// fewest).
fn corrupt_each(
    pristine: &[u8],
    targets: &[(&'static str, usize, usize)],
    seed: u64,
    cases: u64,
    mode: &str,
    f: fn(Vec<u8>) -> bool,
) {
    assert!(
        f(pristine.to_vec()),
        "the pristine image{mode} did not open and walk"
    );
    let seed = seed_of(seed);
    let mut rng = Rng(seed);
    let (mut walked, mut total) = (0u64, 0u64);
    let mut per_target = Vec::new();
    for &(what, start, len) in targets {
        let mut here = 0u64;
        for case in 0..cases {
            let mut img = pristine.to_vec();
            let flips = 1 + rng.below(8);
            for _ in 0..flips {
                let at = start + rng.below(len as u64) as usize;
                img[at] = match rng.below(4) {
                    0 => 0,
                    1 => 0xff,
                    _ => rng.next_u64() as u8,
                };
            }
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| f(img)));
            assert!(
                r.is_ok(),
                "panic{mode}: {what} case {case} (seed {seed:#x})"
            );
            here += u64::from(r.unwrap());
        }
        walked += here;
        total += cases;
        per_target.push(format!("{what} {here}/{cases}"));
    }
    eprintln!(
        "cases that opened and walked{mode}: {}",
        per_target.join(", ")
    );
    assert!(
        walked * 2 >= total,
        "only {walked} of {total} corrupt images{mode} opened and listed a name \
         (seed {seed:#x}): {}",
        per_target.join(", ")
    );
}

/// The block holding inode `ino`'s record in the inode table of `img`
/// (group descriptors of 32 bytes or more; `inode_table_lo` only, which
/// small images need).
fn inode_block(fs: &Ext4, img: &[u8], ino: u32) -> (usize, usize) {
    let bs = fs.block_size();
    let sb = fs.superblock();
    let per_group = sb.inodes_per_group as usize;
    let group = (ino as usize - 1) / per_group;
    let index = (ino as usize - 1) % per_group;
    let gd_off = (sb.first_data_block as usize + 1) * bs + group * usize::from(sb.desc_size());
    let table = u32::from_le_bytes(img[gd_off + 8..gd_off + 12].try_into().unwrap()) as usize;
    (table * bs + index * sb.inode_size() / bs * bs, bs)
}

/// ext2/3-style files on an image that got the extent feature later
/// (`tune2fs -O extent`): corrupt the inode table, a single indirect
/// block, a double indirect block and a directory block, then mount
/// read-write and change things (writes, punches and new directory
/// blocks go into the block maps reached). Errors are fine; a panic,
/// a hang or a write to an image refused at mount fails.
#[test]
fn corrupt_block_mapped_images_written_never_panic() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("fuzz-blockmap");
    let src = s.0.join("src");
    build_tree(&src, 150, 60, 1024);
    std::fs::write(src.join("double"), vec![0x5a; 300 * 1024]).unwrap();
    let img = s.0.join("img");
    make_image(&src, &img, 1024, "12M", "^extent,^64bit,^flex_bg");
    tool_ok("tune2fs", &["-O", "extent"], &img);
    let pristine = std::fs::read(&img).unwrap();
    let fs = open_ro(&pristine);
    let bs = fs.block_size();
    let root = fs.read_inode(2).unwrap();
    let ino = |name: &[u8]| fs.lookup_name(&root, name).unwrap().unwrap();
    // i_block[12] is the single indirect block, i_block[13] the double.
    let slot = |i: &RawInode, k: usize| {
        u32::from_le_bytes(i.block[k * 4..k * 4 + 4].try_into().unwrap()) as usize
    };
    let frag = fs.read_inode(ino(b"frag")).unwrap();
    assert!(frag.flags & 0x80000 == 0, "frag is extent-mapped");
    let double = fs.read_inode(ino(b"double")).unwrap();
    let (double_ind, single_ind) = (slot(&double, 13), slot(&frag, 12));
    assert!(double_ind != 0 && single_ind != 0, "no indirect blocks");
    let big = fs.read_inode(ino(b"big")).unwrap();
    let Mapping::Data { pblk, .. } = fs.map_block(&big, 1).unwrap() else {
        panic!("big has no second block")
    };
    let t = vec![
        ("inode table (root)", inode_block(&fs, &pristine, 2).0, bs),
        (
            "inode table (frag)",
            inode_block(&fs, &pristine, ino(b"frag")).0,
            bs,
        ),
        ("single indirect block", single_ind * bs, bs),
        ("double indirect block", double_ind * bs, bs),
        ("directory block", pblk as usize * bs, bs),
    ];
    let frag_ino = ino(b"frag");
    drop(fs);
    // The pristine image takes the path the corrupt ones are meant to
    // reach: exercise_rw's write into frag goes into its block map.
    {
        let dev = std::sync::Arc::new(MemDevice::new(pristine.clone()));
        let opts = Ext4Options {
            ro: false,
            ..Ext4Options::default()
        };
        let fs = Ext4::open_device(Box::new(dev.clone()), opts).expect("read-write mount");
        let vfs = scalevfs::Vfs::with_root_fs(Default::default(), fs.clone());
        let t = vfs.root_task();
        let fd = t.open("/frag", scalevfs::O_RDWR, 0).unwrap();
        t.pwrite(fd, &[9u8; 3000], 100).unwrap();
        t.close(fd).unwrap();
        drop(t);
        drop(vfs);
        fs.unmount().unwrap();
        let mut now = vec![0u8; pristine.len()];
        dev.read_at(0, &mut now).unwrap();
        let again =
            Ext4::open_device(Box::new(MemDevice::new(now)), Ext4Options::default()).unwrap();
        let f = again.read_inode(frag_ino).unwrap();
        assert!(f.flags & 0x80000 == 0, "frag was migrated to extents");
        let vfs = scalevfs::Vfs::with_root_fs(Default::default(), again);
        let t = vfs.root_task();
        let fd = t.open("/frag", scalevfs::O_RDONLY, 0).unwrap();
        let mut back = vec![0u8; 3000];
        assert_eq!(t.pread(fd, &mut back, 100).unwrap(), 3000);
        assert!(
            back.iter().all(|&b| b == 9),
            "frag's write did not read back"
        );
    }
    corrupt_each(
        &pristine,
        &t,
        0xBB67_AE85_84CA_A73B,
        cases(4),
        " (block-mapped, read-write)",
        exercise_rw,
    );
}

/// inline_data images: corrupt the inode table blocks of the root and of
/// small inline files and directories (their bytes in `i_block` and the
/// `system.data` attribute after the inode), then walk and read
/// everything; and mounted read-write, change things (`exercise_rw`).
#[test]
fn corrupt_inline_data_images_never_panic() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("fuzz-inline");
    let src = s.0.join("src");
    build_tree(&src, 150, 60, 1024);
    std::fs::create_dir_all(src.join("tiny")).unwrap();
    for i in 0..3 {
        std::fs::write(src.join(format!("tiny/f{i}")), vec![b'i'; 40 + 30 * i]).unwrap();
    }
    std::os::unix::fs::symlink("x".repeat(70), src.join("tiny/link")).unwrap();
    let img = s.0.join("img");
    make_image(&src, &img, 1024, "12M", "inline_data");
    let pristine = std::fs::read(&img).unwrap();
    let fs = open_ro(&pristine);
    let bs = fs.block_size();
    let root = fs.read_inode(2).unwrap();
    let tiny = fs.lookup_name(&root, b"tiny").unwrap().unwrap();
    let tiny_i = fs.read_inode(tiny).unwrap();
    let f1 = fs.lookup_name(&tiny_i, b"f1").unwrap().unwrap();
    assert!(tiny_i.flags & 0x1000_0000 != 0, "tiny is not inline");
    let mut t = vec![("inode table (root)", inode_block(&fs, &pristine, 2).0, bs)];
    for (what, n) in [("inode table (tiny)", tiny), ("inode table (tiny/f1)", f1)] {
        let (at, len) = inode_block(&fs, &pristine, n);
        if !t.iter().any(|&(_, a, _)| a == at) {
            t.push((what, at, len));
        }
    }
    drop(fs);
    corrupt_each(
        &pristine,
        &t,
        0x3C6E_F372_FE94_F82B,
        cases(1),
        " (inline_data)",
        exercise,
    );
    // Read-write: files and directories reached are written, which moves
    // inline ones out to blocks (`inline_write.rs`).
    corrupt_each(
        &pristine,
        &t,
        0x510E_527F_ADE6_82D1,
        cases(4),
        " (inline_data, read-write)",
        exercise_rw,
    );
}

/// The write side on corrupt images: a quarter of the cases, mounted
/// read-write and changed (`exercise_rw`).
fn fuzz_rw(features: &str, seed: u64) {
    run_fuzz(features, seed, 4, " (read-write)", exercise_rw);
}

#[test]
fn corrupt_images_written_never_panic_with_metadata_csum() {
    fuzz_rw("", 0x2545_F491_4F6C_DD1D);
}

#[test]
fn corrupt_images_written_never_panic_without_checksums() {
    fuzz_rw("^metadata_csum", 0x6A09_E667_F3BC_C908);
}

#[test]
fn corrupt_images_never_panic_with_metadata_csum() {
    fuzz("", 0x9E37_79B9_7F4A_7C15);
}

#[test]
fn corrupt_images_never_panic_without_checksums() {
    // Without checksums the corruption reaches every parser.
    fuzz("^metadata_csum", 0xD1B5_4A32_D192_ED03);
}
