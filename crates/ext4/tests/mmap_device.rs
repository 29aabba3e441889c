//! The memory-mapped device (`MmapDevice`): a sparse image gets every
//! block allocated at a read-write open (no SIGBUS from a full host
//! filesystem later), threads create, write, fsync and unlink through it,
//! and the image is then clean for e2fsck and reads back the same through
//! the file-backed device. A read-only mapping refuses writes with EBADF.
//!
//! The lazily allocated mapping (`MmapDevice::open_lazy`, what
//! `Ext4::open` uses for a read-write image on tmpfs, ext4 or XFS):
//! allocates 1 MiB chunks on first write only, reads holes without
//! allocating them, gives ENOSPC (not SIGBUS) when the host filesystem is
//! full, and carries a threaded workload that e2fsck then passes.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
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
    exercise(e, &img);
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

/// Two threads create, write, fsync and unlink through `e`, which is then
/// unmounted: e2fsck passes and every kept file reads back through the
/// file-backed device.
fn exercise(e: Arc<Ext4>, img: &Path) {
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
    fsck_clean(img);
    let e = Ext4::open(img, Default::default()).unwrap();
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
}

/// A directory on tmpfs for a test, or None (printed) where /dev/shm is not
/// tmpfs.
fn shm_dir(tag: &str) -> Option<PathBuf> {
    let d = Path::new("/dev/shm");
    if !is_tmpfs(d) {
        eprintln!("SKIP: /dev/shm is not tmpfs here");
        return None;
    }
    let p = d.join(format!("scalevfs-mmap-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    Some(p)
}

fn is_tmpfs(p: &Path) -> bool {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `st` is plain data that statfs fills; `c` outlives the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::statfs(c.as_ptr(), &mut st) }) == 0 && st.f_type as i64 == 0x0102_1994
}

/// Bytes the host has allocated for `p`.
fn allocated(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

const MIB: u64 = 1 << 20;

/// A new sparse file of 64 MiB, `name` in `dir`.
fn sparse(dir: &Path, name: &str) -> PathBuf {
    let img = dir.join(name);
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 * MIB)
        .unwrap();
    img
}

#[test]
fn a_lazy_mapping_allocates_a_chunk_on_its_first_write_only() {
    let Some(dir) = shm_dir("lazy") else {
        return;
    };
    let img = sparse(&dir, "sparse.img");
    assert_eq!(allocated(&img), 0);
    let dev = MmapDevice::open_lazy(&img).unwrap();
    // The open allocates the first chunk (the superblock's) and no more.
    assert_eq!(allocated(&img), MIB);
    // A write through the mapping into chunk 10 allocates that chunk.
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    dev.write_mapped_at(10 * MIB + 100, &data).unwrap();
    assert_eq!(allocated(&img), 2 * MIB);
    let mut back = vec![0u8; 4096];
    dev.read_at(10 * MIB + 100, &mut back).unwrap();
    assert_eq!(back, data);
    // Another write there allocates nothing more, whichever the path.
    dev.write_mapped_at(10 * MIB + 9000, &data).unwrap();
    dev.write_at(10 * MIB + 20000, &data).unwrap();
    assert_eq!(allocated(&img), 2 * MIB);
    // A write across a chunk boundary allocates both chunks.
    dev.write_mapped_at(21 * MIB - 2048, &data).unwrap();
    assert_eq!(allocated(&img), 4 * MIB);
    // A lone writer into unallocated bytes uses pwrite: only the two
    // pages it touches are allocated, not the chunk.
    dev.write_at(30 * MIB + 2048, &data).unwrap();
    assert_eq!(allocated(&img), 4 * MIB + 8192);
    dev.read_at(30 * MIB + 2048, &mut back).unwrap();
    assert_eq!(back, data);
    // Reading a hole gives zeros and allocates nothing (through the
    // mapping, tmpfs would allocate a page for the fault).
    let mut hole = vec![1u8; 8192];
    dev.read_at(40 * MIB, &mut hole).unwrap();
    assert!(hole.iter().all(|&b| b == 0));
    assert_eq!(allocated(&img), 4 * MIB + 8192);
    // Past the end: an error, nothing written, the file not grown.
    assert!(dev.write_at(64 * MIB - 10, &data).is_err());
    assert!(dev.write_mapped_at(64 * MIB - 10, &data).is_err());
    assert!(dev.read_at(64 * MIB - 10, &mut back).is_err());
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 * MIB);
    dev.flush().unwrap();
    drop(dev);
    // What went through the mapping is in the file.
    let file = std::fs::read(&img).unwrap();
    assert_eq!(&file[(10 * MIB + 100) as usize..][..4096], &data[..]);
    assert_eq!(&file[(21 * MIB - 2048) as usize..][..4096], &data[..]);
    assert_eq!(&file[(30 * MIB + 2048) as usize..][..4096], &data[..]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Chunks the image file already backs whole (written before the open)
/// are known allocated from the open: written and read through the
/// mapping, not through `pwrite`/`pread` for good. A chunk backed only in
/// part is not.
#[test]
fn chunks_already_backed_are_mapped_from_the_open() {
    let Some(dir) = shm_dir("backed") else {
        return;
    };
    let img = sparse(&dir, "sparse.img");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all_at(&vec![7u8; 3 * MIB as usize], 2 * MIB)
            .unwrap();
        f.write_all_at(&vec![8u8; (MIB / 2) as usize], 6 * MIB)
            .unwrap();
        // The last chunk, whole.
        f.write_all_at(&vec![9u8; MIB as usize], 63 * MIB).unwrap();
    }
    let dev = MmapDevice::open_lazy(&img).unwrap();
    assert_eq!(dev.allocated_chunks(), vec![0, 2, 3, 4, 63]);
    assert_eq!(allocated(&img), 5 * MIB + MIB / 2);
    let mut b = vec![0u8; 4096];
    dev.read_at(4 * MIB - 10, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 7));
    drop(dev);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Pages a lone writer allocated through `pwrite` are read and written
/// through the mapping from then on, even inside a chunk that is still
/// partly a hole (file data around blocks the allocator skipped; the
/// journal of a fresh image, which mkfs leaves as a hole, written by one
/// committer); a chunk all of whose pages were written is marked
/// allocated whole, without allocating anything more.
#[test]
fn pages_a_lone_writer_allocated_move_to_the_mapping() {
    let Some(dir) = shm_dir("lone") else {
        return;
    };
    let img = sparse(&dir, "sparse.img");
    let dev = MmapDevice::open_lazy(&img).unwrap();
    assert_eq!(dev.allocated_chunks(), vec![0]);
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 1) as u8).collect();
    for k in 0..256u64 {
        dev.write_at(8 * MIB + k * 4096, &block).unwrap();
    }
    // Every other page of chunk 9.
    for k in 0..100u64 {
        dev.write_at(9 * MIB + 2 * k * 4096, &block).unwrap();
    }
    // Fewer, larger writes: 32 of 32 KiB fill chunk 12, the first from
    // the end of chunk 11, the last into chunk 13.
    let big: Vec<u8> = (0..32768u32).map(|i| (i % 241) as u8).collect();
    dev.write_at(12 * MIB - 16384, &big).unwrap();
    for k in 0..32u64 {
        dev.write_at(12 * MIB + 16384 + k * 32768, &big).unwrap();
    }
    assert_eq!(dev.allocated_chunks(), vec![0, 8, 12]);
    // Nothing allocated beyond the pages written.
    assert_eq!(allocated(&img), 3 * MIB + 100 * 4096 + 2 * 16384);
    // The written pages of chunk 9 are mapped, its holes are not.
    assert!(dev.mapped(9 * MIB + 2 * 4096, 4096));
    assert!(dev.mapped(9 * MIB + 2 * 4096 + 100, 3000));
    assert!(!dev.mapped(9 * MIB + 4096, 4096));
    assert!(
        !dev.mapped(9 * MIB + 2 * 4096, 8192),
        "a range reaching a hole"
    );
    assert!(!dev.mapped(9 * MIB + 200 * 4096, 4096));
    // Written again, through the mapping now: the bytes are there, and
    // reading a hole next to them still allocates nothing.
    let (preads, pwrites) = dev.syscalls();
    assert_eq!(pwrites, 256 + 100 + 33, "every write so far through pwrite");
    let other = vec![0xA5u8; 4096];
    dev.write_at(8 * MIB + 4096, &other).unwrap();
    dev.write_at(9 * MIB + 4 * 4096, &other).unwrap();
    let mut b = vec![0u8; 4096];
    dev.read_at(8 * MIB + 4096, &mut b).unwrap();
    assert_eq!(b, other);
    dev.read_at(9 * MIB + 4 * 4096, &mut b).unwrap();
    assert_eq!(b, other);
    dev.read_at(9 * MIB + 6 * 4096, &mut b).unwrap();
    assert_eq!(b, block);
    assert_eq!(dev.syscalls(), (preads, pwrites), "no system call since");
    dev.read_at(9 * MIB + 5 * 4096, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0));
    assert_eq!(
        dev.syscalls(),
        (preads + 1, pwrites),
        "a hole through pread"
    );
    assert_eq!(allocated(&img), 3 * MIB + 100 * 4096 + 2 * 16384);
    dev.flush().unwrap();
    drop(dev);
    let file = std::fs::read(&img).unwrap();
    assert_eq!(&file[(8 * MIB + 4096) as usize..][..4096], &other[..]);
    assert_eq!(&file[(9 * MIB + 4 * 4096) as usize..][..4096], &other[..]);
    assert_eq!(&file[(8 * MIB) as usize..][..4096], &block[..]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Threads writing into fresh chunks at once: every byte lands, and no
/// chunk is allocated twice over (allocation stays chunk-sized).
#[test]
fn concurrent_writers_into_fresh_chunks_all_land() {
    let Some(dir) = shm_dir("conc") else {
        return;
    };
    let img = sparse(&dir, "sparse.img");
    let dev = MmapDevice::open_lazy(&img).unwrap();
    // 8 threads, each writing its own 4 KiB blocks interleaved over
    // chunks 8..16.
    std::thread::scope(|sc| {
        for t in 0..8u64 {
            let dev = &dev;
            sc.spawn(move || {
                for b in 0..256u64 {
                    let off = 8 * MIB + (b * 8 + t) * 4096;
                    dev.write_at(off, &[(t * 31 + b) as u8; 4096]).unwrap();
                }
            });
        }
    });
    let mut back = vec![0u8; 4096];
    for t in 0..8u64 {
        for b in 0..256u64 {
            let off = 8 * MIB + (b * 8 + t) * 4096;
            dev.read_at(off, &mut back).unwrap();
            assert!(back.iter().all(|&x| x == (t * 31 + b) as u8), "{t} {b}");
        }
    }
    // Chunk 0 plus at most the 8 chunks written.
    assert!(allocated(&img) <= 9 * MIB, "{}", allocated(&img));
    drop(dev);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A small host filesystem mounted at a fresh directory, unmounted on
/// drop: a tmpfs of `size`, or (`ext4`) an ext4 of that size on a loop
/// device, where chunks are allocated with `fallocate` rather than
/// populated.
struct SmallHost(PathBuf);

impl SmallHost {
    fn new(kind: &str, size: &str) -> Option<SmallHost> {
        let p =
            std::env::temp_dir().join(format!("scalevfs-smallhost-{kind}-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        let ok = if kind == "tmpfs" {
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(&p)
                .status()
                .is_ok_and(|s| s.success())
        } else {
            let backing = p.with_extension("ext4");
            let _ = std::fs::remove_file(&backing);
            common::mkfs_args(&backing, &["-O", "^has_journal"], size);
            Command::new("mount")
                .args(["-o", "loop"])
                .arg(&backing)
                .arg(&p)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !ok {
            eprintln!("SKIP: cannot mount a {kind} here (not root, or no loop devices)");
            let _ = std::fs::remove_dir(&p);
            return None;
        }
        Some(SmallHost(p))
    }
}

impl Drop for SmallHost {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
        let _ = std::fs::remove_file(self.0.with_extension("ext4"));
    }
}

/// On a host filesystem of 4 MiB (or 8 MiB of ext4, some of it metadata)
/// the first chunks fit, a later one does not: ENOSPC from the mapped
/// path (populate on tmpfs, fallocate on ext4) and from the lone
/// writer's pwrite, and what was written stays.
fn full_host_gives_enospc(t: &SmallHost) {
    let img = sparse(&t.0, "big.img");
    let dev = MmapDevice::open_lazy(&img).unwrap();
    let block = vec![0xa5u8; 4096];
    for c in 1..3 {
        dev.write_mapped_at(c * MIB, &block).unwrap();
    }
    let mut err = None;
    for c in 3..40 {
        if let Err(e) = dev.write_mapped_at(c * MIB, &block) {
            err = Some(e);
            break;
        }
    }
    let err = err.expect("the host filled up");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    // The lone writer's pwrite path says the same (its pages do not fit
    // either: the mapped path's chunks took the space).
    let mut err = None;
    for c in 40..60 {
        if let Err(e) = dev.write_at(c * MIB, &[0x5a; 65536]) {
            err = Some(e);
            break;
        }
    }
    let err = err.expect("pwrite filled the host too");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    // What was written stays.
    let mut back = vec![0u8; 4096];
    for c in 1..3 {
        dev.read_at(c * MIB, &mut back).unwrap();
        assert_eq!(back, block);
    }
}

#[test]
fn a_full_tmpfs_gives_enospc_not_sigbus() {
    if let Some(t) = SmallHost::new("tmpfs", "4m") {
        full_host_gives_enospc(&t);
    }
}

#[test]
fn a_full_ext4_host_gives_enospc_not_sigbus() {
    if !have_tools() {
        return;
    }
    if let Some(t) = SmallHost::new("ext4", "8M") {
        full_host_gives_enospc(&t);
    }
}

#[test]
fn ext4_open_maps_an_image_on_tmpfs_and_e2fsck_passes() {
    if !have_tools() {
        return;
    }
    let Some(dir) = shm_dir("ext4") else {
        return;
    };
    let img = fresh(&dir, 4096, "64M");
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    assert_eq!(e.device_kind(), "mmap, allocated on first write");
    exercise(e, &img);
    // The image stayed sparse: 64 MiB, far less of it allocated.
    assert!(allocated(&img) < 40 * MIB, "{}", allocated(&img));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ext4_open_uses_pwrite_when_asked_or_read_only() {
    if !have_tools() {
        return;
    }
    let Some(dir) = shm_dir("pwrite") else {
        return;
    };
    let img = fresh(&dir, 4096, "16M");
    let o = scalevfs_ext4::Ext4Options {
        io: scalevfs_ext4::IoMode::Pwrite,
        ..rw_journaled()
    };
    let e = Ext4::open(&img, o).unwrap();
    assert_eq!(e.device_kind(), "pread/pwrite");
    e.unmount().unwrap();
    drop(e);
    let e = Ext4::open(&img, Default::default()).unwrap();
    assert_eq!(e.device_kind(), "pread/pwrite", "read-only");
    drop(e);
    std::fs::remove_dir_all(&dir).unwrap();
}
