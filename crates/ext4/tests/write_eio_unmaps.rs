//! A write whose data fails to reach the device (EIO from the image) must
//! not leave the blocks it could not write mapped: a fresh block would
//! show what its last owner left there (another, deleted file's data), and
//! an unwritten (preallocated) block would stop reading as zeros. The
//! kernel's ext4 keeps new blocks unwritten until their data is on disk.
//! Before the fix, the write hooked every block it had taken into the
//! map whether its data went out or not: each case below read the deleted
//! file's bytes back.
//!
//! Every free block first holds a pattern (a file filling the filesystem,
//! then deleted), so a block mapped without its data shows the pattern.
//! The device fails every write that carries a marker, and the write puts
//! the marker in one whole block after a partial first block: the partial
//! block goes out alone, the run of whole blocks after it fails, and the
//! write ends short after the first block.

mod common;

use std::sync::Arc;

use common::*;
use scalevfs::{Errno, Task, Vfs, O_CREAT, O_RDWR};
use scalevfs_ext4::{BlockDevice, Ext4, MemDevice};

const MARK: &[u8; 16] = b"#fail-this-write";
const STALE: u8 = 0xAB;
const BS: usize = 4096;

/// A device that refuses (EIO) every write holding `MARK`.
struct FailDev(Arc<MemDevice>);

impl BlockDevice for FailDev {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> std::io::Result<()> {
        if buf.windows(MARK.len()).any(|w| w == MARK) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        self.0.write_at(off, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
    fn size(&self) -> u64 {
        self.0.size()
    }
}

/// Fill every free block with `STALE` (a file written until ENOSPC), then
/// delete it and commit, so the blocks are free again.
fn fill_free_space(t: &Task, e: &Ext4) {
    // Every free block: the kernel's 2% pool for splits too.
    e.set_reserved_clusters(0).unwrap();
    let free0 = t.statfs("/").unwrap().bfree;
    let fd = t.open("/fill", O_CREAT | O_RDWR, 0o644).unwrap();
    let chunk = vec![STALE; 256 << 10];
    loop {
        match t.write(fd, &chunk) {
            Ok(n) if n == chunk.len() => {}
            _ => break,
        }
    }
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    let bf = t.statfs("/").unwrap().bfree;
    assert!(bf < 64, "not full: {bf}");
    t.unlink("/fill").unwrap();
    // The inode's drop is epoch-deferred: with other tests' threads
    // pinned it may come late, so flush and commit each round (a commit
    // makes the frees durable; then the blocks may be taken), up to ~20 s.
    for i in 0..2000 {
        scalevfs::flush_deferred_frees();
        e.commit().unwrap();
        if t.statfs("/").unwrap().bfree + 16 >= free0 {
            return;
        }
        if i >= 100 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    panic!("the deleted file's space did not come back");
}

/// The write of the test: from byte 100 of block 1 to the end of block
/// 4, with `MARK` at the start of block 3.
fn failing_write(t: &Task, fd: i32) -> scalevfs::VfsResult<usize> {
    let off = BS + 100;
    let mut buf = vec![0x11u8; 4 * BS - 100];
    let at = 3 * BS - off;
    buf[at..at + MARK.len()].copy_from_slice(MARK);
    t.pwrite(fd, &buf, off as i64)
}

fn read_all(t: &Task, path: &str) -> Vec<u8> {
    let fd = t.open(path, scalevfs::O_RDONLY, 0).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = t.read(fd, &mut buf).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    t.close(fd).unwrap();
    out
}

/// What the file must hold after the failed write (`n` bytes written)
/// and a truncate to 6 blocks: zeros, except what the write wrote.
fn expected(n: usize) -> Vec<u8> {
    let mut want = vec![0u8; 6 * BS];
    want[BS + 100..BS + 100 + n].fill(0x11);
    want
}

/// A fresh image (`mkfs` arguments, 16 MiB) served from memory through
/// `FailDev`, every free block holding `STALE` (`fill_free_space`).
struct Setup {
    _s: Scratch,
    img: std::path::PathBuf,
    mem: Arc<MemDevice>,
    e: Arc<Ext4>,
    vfs: Vfs,
    t: Task,
}

fn setup(label: &str, mkfs: &[&str]) -> Option<Setup> {
    if !have_tools() {
        return None;
    }
    let s = Scratch::new(&format!("write-eio-{label}"));
    let img = s.0.join("img");
    mkfs_args(&img, mkfs, "16M");
    let mem = Arc::new(MemDevice::new(std::fs::read(&img).unwrap()));
    let e = Ext4::open_device(Box::new(FailDev(mem.clone())), rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    fill_free_space(&t, &e);
    Some(Setup {
        _s: s,
        img,
        mem,
        e,
        vfs,
        t,
    })
}

/// Unmount, write the image out and check it: e2fsck finds no block
/// leaked or counted twice (the blocks taken back free in the bitmap,
/// i_blocks counting what stays mapped), and a remount reads `want` in /f.
fn finish(st: Setup, want: &[u8], label: &str) {
    let Setup {
        _s,
        img,
        mem,
        e,
        vfs,
        t,
    } = st;
    drop(t);
    drop(vfs);
    unmount_and_check(e, &mem, &img);
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    assert!(read_all(&t, "/f") == want, "{label}: after a remount");
    unmount_clean(t, vfs, e, &img);
}

/// Unmount `e`, write the memory device out to `img` and let e2fsck judge
/// it (no block leaked or counted twice, i_blocks counting what stays
/// mapped).
fn unmount_and_check(e: Arc<Ext4>, mem: &MemDevice, img: &std::path::Path) {
    e.unmount().unwrap();
    drop(e);
    let mut out = vec![0u8; mem.size() as usize];
    mem.read_at(0, &mut out).unwrap();
    std::fs::write(img, &out).unwrap();
    fsck_clean(img);
}

fn run_case(mkfs: &[&str], prealloc: bool, label: &str) {
    let Some(st) = setup(label, mkfs) else {
        return;
    };
    let t = &st.t;
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    if prealloc {
        t.fallocate(fd, 0, 0, 6 * BS as i64).unwrap();
    }
    // The first (partial) block is written; a file with extents writes
    // the run of whole blocks after it at once, and that fails; a
    // block-mapped file writes block by block, and the block with the
    // marker fails.
    let n = failing_write(t, fd).unwrap_or_else(|e| panic!("{label}: {e:?}"));
    assert!(n == BS - 100 || n == 2 * BS - 100, "{label}: wrote {n}");
    t.ftruncate(fd, 6 * BS as i64).unwrap();
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    let got = read_all(t, "/f");
    let want = expected(n);
    let stale = got.iter().filter(|&&b| b == STALE).count();
    assert_eq!(
        stale, 0,
        "{label}: {stale} bytes of the deleted file show through"
    );
    assert_eq!(got, want, "{label}");
    // The filesystem goes on writing: a later write of the same range
    // lands and reads back.
    let fd = t.open("/f", O_RDWR, 0).unwrap();
    assert_eq!(
        t.pwrite(fd, &vec![0x22u8; 2 * BS], 3 * BS as i64),
        Ok(2 * BS)
    );
    t.close(fd).unwrap();
    let mut want = want;
    want[3 * BS..5 * BS].fill(0x22);
    assert_eq!(read_all(t, "/f"), want, "{label}: rewrite");
    finish(st, &want, label);
}

#[test]
fn a_failed_write_into_a_hole_maps_none_of_the_blocks_it_could_not_write() {
    run_case(&["-b", "4096", "-m", "0"], false, "extent-hole");
}

#[test]
fn a_failed_write_into_preallocated_blocks_leaves_them_unwritten() {
    run_case(&["-b", "4096", "-m", "0"], true, "extent-prealloc");
}

#[test]
fn a_failed_write_into_a_hole_of_a_block_mapped_file_unhooks_its_blocks() {
    run_case(
        &["-t", "ext3", "-b", "4096", "-m", "0"],
        false,
        "mapped-hole",
    );
}

// ---------------------------------------------------------------------
// A failing first block.
//
// A write whose very first block fails (a partial first block, so
// nothing at all is written and the call returns EIO) must leave that
// block unmapped too, as the tests above check for the blocks
// after a first one that went out. Before the fix, the undo started at
// the first block boundary after `off` (`div_ceil` of `off + 0`), so the
// first block, fresh or converted from unwritten, stayed in the extent
// list, was stored in the tree, and then the call returned without
// storing the inode: in a tree with leaves, the leaf mapped the block
// (the deleted file's data showed through, `i_blocks` did not count it);
// in an inode-only tree the block was allocated and mapped by nothing.

/// `deep`: the file first gets 10 one-block extents (blocks 0, 2, .., 18:
/// a tree with a leaf). `prealloc`: the target block is preallocated.
/// Then a write of 200 bytes at byte 100 of block 1 (0x11, the marker
/// first) fails whole.
fn run_first_block_case(deep: bool, prealloc: bool, label: &str) {
    let Some(st) = setup(&format!("first-{label}"), &["-b", "4096", "-m", "0"]) else {
        return;
    };
    let t = &st.t;
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    let mut want = vec![0u8; 20 * BS];
    if deep {
        for b in (0..20).step_by(2) {
            assert_eq!(t.pwrite(fd, &vec![0x33u8; BS], (b * BS) as i64), Ok(BS));
            want[b * BS..(b + 1) * BS].fill(0x33);
        }
    }
    t.ftruncate(fd, 20 * BS as i64).unwrap();
    if prealloc {
        t.fallocate(fd, 0, BS as i64, BS as i64).unwrap();
    }
    t.fsync(fd).unwrap();
    let mut buf = vec![0x11u8; 200];
    buf[..MARK.len()].copy_from_slice(MARK);
    assert_eq!(
        t.pwrite(fd, &buf, (BS + 100) as i64),
        Err(Errno::EIO),
        "{label}"
    );
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    let got = read_all(t, "/f");
    let stale = got.iter().filter(|&&b| b == STALE).count();
    assert_eq!(
        stale, 0,
        "{label}: {stale} bytes of the deleted file show through"
    );
    assert_eq!(got, want, "{label}");
    // Still writing: the same write without the marker lands.
    let fd = t.open("/f", O_RDWR, 0).unwrap();
    assert_eq!(t.pwrite(fd, &[0x22u8; 200], (BS + 100) as i64), Ok(200));
    t.close(fd).unwrap();
    want[BS + 100..BS + 300].fill(0x22);
    assert_eq!(read_all(t, "/f"), want, "{label}: rewrite");
    finish(st, &want, label);
}

#[test]
fn a_failed_first_block_into_a_hole_of_an_inode_tree_leaks_nothing() {
    run_first_block_case(false, false, "inode-hole");
}

#[test]
fn a_failed_first_block_into_a_hole_of_a_leaf_maps_nothing() {
    run_first_block_case(true, false, "leaf-hole");
}

#[test]
fn a_failed_first_block_into_preallocated_blocks_of_a_leaf_stays_unwritten() {
    run_first_block_case(true, true, "leaf-prealloc");
}

/// A failing write over a run mixing written, preallocated and hole
/// blocks across leaf boundaries (a tree of 3 leaves): what it wrote
/// reads back, the rest reads as before (zeros or the old data), never
/// the deleted file's data; e2fsck clean.
#[test]
fn a_failed_write_over_mixed_blocks_across_leaves_maps_only_what_it_wrote() {
    let Some(st) = setup("mixed", &["-b", "4096", "-m", "0"]) else {
        return;
    };
    let t = &st.t;
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    const N: usize = 1200;
    let mut want = vec![0u8; N * BS];
    // Holes only from block 990 on: the run of fresh blocks holding the
    // marker spans several blocks.
    for b in 0..990 {
        match b % 3 {
            0 => {
                assert_eq!(t.pwrite(fd, &vec![0x33u8; BS], (b * BS) as i64), Ok(BS));
                want[b * BS..(b + 1) * BS].fill(0x33);
            }
            1 => t.fallocate(fd, 0, (b * BS) as i64, BS as i64).unwrap(),
            _ => {}
        }
    }
    t.ftruncate(fd, (N * BS) as i64).unwrap();
    t.fsync(fd).unwrap();
    let off = 10 * BS + 100;
    let fail_at = 1000 * BS;
    let mut buf = vec![0x11u8; 1100 * BS - off];
    buf[fail_at - off..fail_at - off + MARK.len()].copy_from_slice(MARK);
    let n = t.pwrite(fd, &buf, off as i64).unwrap();
    assert!(n > 0 && off + n <= fail_at, "wrote {n}");
    assert!(
        off + n < 995 * BS,
        "wrote {n}: the failing run is one block"
    );
    want[off..off + n].fill(0x11);
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    let got = read_all(t, "/f");
    let stale = got.iter().filter(|&&b| b == STALE).count();
    assert_eq!(stale, 0, "{stale} bytes of the deleted file show through");
    assert!(got == want, "content");
    finish(st, &want, "mixed");
}

// ---------------------------------------------------------------------
// A failing last run before the step ends.
//
// A write gathers whole blocks that follow each other on the device into
// one run and writes it when the run breaks or the write ends. A write
// whose allocations reach its step's groups ends before the next folio
// (the caller goes on in a new handle), and the run gathered before is
// written last. If that write failed, the undo started at the folio the
// step had no room for, so the blocks of the failed run stayed mapped as
// written extents over what the deleted file left there.

#[test]
fn a_failed_last_run_before_the_step_ends_maps_none_of_its_blocks() {
    if !have_tools() {
        return;
    }
    // A fresh image (free space in long runs): 1 KiB blocks, 256-block
    // groups. The file's blocks start after the flex group's metadata and
    // run on without a gap up to the backup superblock of group 3; a step
    // of two groups ends before it, so the run of the whole step goes out
    // last, at once, and fails (the marker is in its block 3).
    let s = Scratch::new("write-eio-last-run");
    let img = s.0.join("img");
    mkfs_args(
        &img,
        &["-b", "1024", "-g", "256", "-m", "0", "-O", "^resize_inode"],
        "16M",
    );
    let mem = Arc::new(MemDevice::new(std::fs::read(&img).unwrap()));
    let e = Ext4::open_device(Box::new(FailDev(mem.clone())), rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    // Steps of 4 groups, less the tree's margin: 2.
    e.set_txn_limit(8);
    const KB: usize = 1024;
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    // From 4 KiB on: the folios grow from one page (4 KiB, 8 KiB, ...),
    // so the step ends at a folio boundary soon after its second group.
    let mut buf = vec![0x11u8; 2000 * KB];
    buf[3 * KB..3 * KB + MARK.len()].copy_from_slice(MARK);
    let r = t.pwrite(fd, &buf, 4 * KB as i64);
    assert_eq!(r, Err(Errno::EIO));
    // Nothing written, nothing mapped: the blocks of the failed run
    // stayed mapped past the size (e2fsck: "i_size is 0, should be").
    let st_f = t.fstat(fd).unwrap();
    assert_eq!((st_f.size, st_f.blocks), (0, 0), "blocks stay mapped");
    t.close(fd).unwrap();
    // Still writes; e2fsck judges the image.
    let fd = t.open("/f", O_RDWR, 0).unwrap();
    assert_eq!(t.pwrite(fd, &[0x22u8; 3000], 0), Ok(3000));
    t.close(fd).unwrap();
    drop(t);
    drop(vfs);
    unmount_and_check(e, &mem, &img);
}
