//! Block devices: positioned reads and writes plus flush, so a later
//! io_uring or O_DIRECT backend can stand in for the file-backed one.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

use scalevfs_sync::ordered::{Class, Mutex};

/// A device the filesystem lives on, addressed in bytes.
pub trait BlockDevice: Send + Sync + 'static {
    /// Fill `buf` from byte `off`; a read past the end is an error
    /// (`UnexpectedEof`).
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Write `buf` at byte `off`.
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()>;
    /// Write `bufs` one after another from byte `off` on, as one write
    /// where the device can (`pwritev`): a commit's log blocks go out
    /// without being copied into one buffer first. The default writes
    /// them one by one.
    fn write_vectored_at(&self, off: u64, bufs: &[&[u8]]) -> io::Result<()> {
        let mut at = off;
        for b in bufs {
            self.write_at(at, b)?;
            at += b.len() as u64;
        }
        Ok(())
    }
    /// Make every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// How the device is reached, for logs and tests: `pread/pwrite`,
    /// `mmap`, `mmap, allocated on first write`, `memory`, or `other`.
    fn kind(&self) -> &'static str {
        "other"
    }
    /// Let go of the exclusive claim on the image (its `flock`), where
    /// the device holds one: the filesystem is unmounted and writes
    /// nothing more, though the device may live on a while (inodes freed
    /// after a grace period still hold the filesystem).
    fn release_claim(&self) {}
}

/// A shared device: a test or a tool keeps one `Arc` (to read what was
/// written, or a recording) while the filesystem owns a clone.
impl<D: BlockDevice + ?Sized> BlockDevice for std::sync::Arc<D> {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        (**self).write_at(off, buf)
    }
    fn write_vectored_at(&self, off: u64, bufs: &[&[u8]]) -> io::Result<()> {
        (**self).write_vectored_at(off, bufs)
    }
    fn flush(&self) -> io::Result<()> {
        (**self).flush()
    }
    fn size(&self) -> u64 {
        (**self).size()
    }
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn release_claim(&self) {
        (**self).release_claim()
    }
}

/// What a device's `flush` found: once one failed, every later one fails
/// too (EIO). The host reports a writeback error once per open file, and
/// the filesystem's threads share one: the commit thread's flush could
/// take the error and a later fsync's flush report success for data that
/// never reached the image. A flush also checks that the image file is
/// not shorter than at open: another program truncating it (the `flock`
/// is advisory) made writes past its new end grow it again with zeros in
/// between, silently (and would make a mapped access past it SIGBUS);
/// the flush is where every commit and fsync passes, so the filesystem
/// stops there instead of reporting the data durable.
#[derive(Debug, Default)]
struct FlushState {
    failed: AtomicBool,
}

impl FlushState {
    fn run(&self, file: &File, size: u64, sync: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        // Relaxed: a flag that only ever goes up; the errors it stands for
        // were returned by the flush that set it.
        if self.failed.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let r = sync().and_then(|()| {
            let md = file.metadata()?;
            // A block device's metadata says 0: only regular files.
            if md.file_type().is_file() && md.len() < size {
                return Err(io::Error::other(format!(
                    "the image was cut short from outside: {} bytes, {size} at open",
                    md.len()
                )));
            }
            Ok(())
        });
        if r.is_err() {
            // Relaxed: as above.
            self.failed.store(true, Ordering::Relaxed);
        }
        r
    }
}

/// A regular file (an image) or a block device node, through `pread`/`pwrite`.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    size: u64,
    flushed: FlushState,
}

impl FileDevice {
    /// Open `path`, read-only unless `write`.
    pub fn open(path: &Path, write: bool) -> io::Result<FileDevice> {
        FileDevice::from_file(open_claimed(path, write)?)
    }

    /// A device on `file`, already open (and locked, where it is to be
    /// written: `scalevfs mkfs` locks before it truncates).
    pub(crate) fn from_file(file: File) -> io::Result<FileDevice> {
        // Block devices report size 0 in metadata: seek to the end instead.
        let mut size = file.metadata()?.len();
        if size == 0 {
            use std::io::Seek;
            size = (&file).seek(io::SeekFrom::End(0))?;
        }
        Ok(FileDevice {
            file,
            size,
            flushed: FlushState::default(),
        })
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, off)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.file.write_all_at(buf, off)
    }
    fn write_vectored_at(&self, off: u64, bufs: &[&[u8]]) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // At most IOV_MAX (1024 on Linux) buffers per call.
        const MAX_IOV: usize = 1024;
        let mut at = off;
        for chunk in bufs.chunks(MAX_IOV) {
            let iov: Vec<libc::iovec> = chunk
                .iter()
                .map(|b| libc::iovec {
                    iov_base: b.as_ptr() as *mut libc::c_void,
                    iov_len: b.len(),
                })
                .collect();
            let total: usize = chunk.iter().map(|b| b.len()).sum();
            let Ok(pos) = libc::off_t::try_from(at) else {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            };
            // SAFETY: every iovec points into a slice of `chunk`, which
            // outlives the call; pwritev only reads them; `iov.len()` is at
            // most 1024, within IOV_MAX.
            let r = unsafe {
                libc::pwritev(
                    self.file.as_raw_fd(),
                    iov.as_ptr(),
                    iov.len() as libc::c_int,
                    pos,
                )
            };
            let done = if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
                0
            } else {
                r as usize
            };
            if done < total {
                // A short write (or EINTR): finish the rest buffer by
                // buffer, from where it stopped.
                let mut skip = done;
                let mut o = at;
                for b in chunk {
                    if skip >= b.len() {
                        skip -= b.len();
                    } else {
                        self.file.write_all_at(&b[skip..], o + skip as u64)?;
                        skip = 0;
                    }
                    o += b.len() as u64;
                }
            }
            at += total as u64;
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.flushed
            .run(&self.file, self.size, || self.file.sync_data())
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn kind(&self) -> &'static str {
        "pread/pwrite"
    }
    fn release_claim(&self) {
        unlock(&self.file);
    }
}

/// An image file mapped into memory (`MAP_SHARED`): a write is a copy into
/// the mapping, so threads writing different blocks share no lock — through
/// `pwrite` every write to one image file takes that file's inode lock in
/// the host kernel (`i_rwsem`), which serialises all the data writes of a
/// filesystem on an image in /dev/shm (at 16 threads an untar-like create
/// spent 41% of its time spinning on that lock). `flush` is
/// `msync(MS_SYNC)`.
///
/// A write into a hole through a mapping allocates at fault time, where a
/// full host filesystem raises SIGBUS instead of returning ENOSPC. So a
/// block is written through the mapping only once it is allocated:
/// - [`MmapDevice::open`] (read-write) allocates the whole file at open
///   (`fallocate`); on tmpfs that costs the image's full size in memory
///   and about 150 ms per GiB.
/// - [`MmapDevice::open_lazy`], what [`crate::Ext4::open`] uses for a
///   read-write image on tmpfs, ext4 or XFS, allocates 1 MiB at a time,
///   on the first write there (on tmpfs by populating the chunk's pages,
///   `MADV_POPULATE_WRITE`, elsewhere with one `fallocate`; either way
///   ENOSPC comes back as an error), and reads what it has not allocated through `pread`, which
///   allocates nothing. Opening costs a mapping, not the image's size. A
///   write where nothing is allocated yet, while no other such write is in
///   progress, goes through `pwrite` instead: with no other writer that
///   might take it the host lock is free, and `pwrite` fills fresh pages without
///   zeroing them first, which `fallocate` and faults do (one thread's
///   untar-like create was 1.6x slower through the mapping on the 2-core
///   VM for that reason); the pages it allocated are read and
///   written through the mapping from then on (`Lazy::pages`), and so
///   are chunks the file already backed at open.
///
/// The file must not be truncated by anyone while it is mapped (SIGBUS),
/// nor written by another process (a data race with our copies through the
/// mapping). A known limit, not enforced: the image's exclusive `flock`
/// (read-write opens only) is advisory, and tools that take no lock
/// (e2fsck, debugfs, a loop device, a plain `truncate`) ignore it. Every
/// flush checks the file's size (`FlushState`): a commit or fsync after a
/// truncation fails and the filesystem stops, instead of reporting data
/// durable that a `pwrite` past the new end put back among zeros. A
/// read-only device reads through `pread` (holes stay holes). Other host
/// errors that a mapped access meets (a read error on a page the host
/// evicted, a host filesystem shut down) are SIGBUS too; and on a
/// copy-on-write host (btrfs) `fallocate` does not reserve room for the
/// copies a write fault makes: [`crate::Ext4::open`] maps only on tmpfs,
/// ext4 and XFS (whose reflinked blocks `allocate` unshares), and `-o
/// pwrite` keeps every access a system call.
/// Regular files only.
///
/// CONTRACT: no two threads read and write overlapping byte ranges at the
/// same time (a write racing a read of the same bytes in a mapping is a
/// data race). The ext4 type keeps it: a file's data blocks are read and
/// written under its data lock (shared to read, exclusive to write), a
/// metadata block is read from the device only when the buffer cache does
/// not hold it and written home only by writeback or a checkpoint while
/// the cache holds it, and the log is written by the one committer.
pub struct MmapDevice {
    map: memmap2::MmapRaw,
    /// The image (its exclusive `flock` where writable; `pread`/`pwrite`
    /// and allocation where lazy).
    file: File,
    size: u64,
    /// Mapped read-write (`open(.., true)`, `open_lazy`).
    writable: bool,
    /// `open_lazy`: the file and which chunks are allocated.
    lazy: Option<Lazy>,
    flushed: FlushState,
}

/// Allocation on first write, per chunk of `1 << CHUNK_SHIFT` bytes.
struct Lazy {
    /// Taken (stripe = chunk mod `STRIPES`) to allocate a chunk, so that
    /// the threads writing into one fresh chunk at once allocate it once,
    /// not once each (queued on the host inode lock, for `fallocate`).
    allocating: Box<[Mutex<()>]>,
    /// One bit per chunk, set once the chunk is allocated. A bit only ever
    /// goes from 0 to 1, and the fact it records lives in the host kernel
    /// (which orders the allocation before any later fault on those
    /// pages), so the bits need no ordering with other memory:
    /// a thread that misses a fresh bit merely allocates again (harmless)
    /// or reads through `pread`. Relaxed throughout.
    done: Box<[AtomicU64]>,
    /// Writes in progress into bytes not yet allocated (writes into
    /// allocated chunks, which take no host lock, do not count and touch
    /// no shared line). A write into unallocated bytes that finds itself
    /// alone goes through `pwrite`: that allocates only the pages written
    /// and copies into them without zeroing them first (an allocation
    /// through `fallocate` or a fault zeroes every page), and with no
    /// other such writer the host inode lock it takes is free. Relaxed: a
    /// hint that picks between two correct paths.
    writers: CachePadded<AtomicUsize>,
    /// On tmpfs a chunk is allocated by populating its pages through the
    /// mapping (`MADV_POPULATE_WRITE`, Linux 5.14), not by `fallocate`:
    /// the fault path takes no inode lock, so threads allocating different
    /// chunks zero their pages in parallel (`fallocate` zeroes them under
    /// the host inode lock, one chunk at a time), and a failure comes back
    /// as an error (EFAULT where a fault would raise SIGBUS: reported as
    /// ENOSPC), not a signal. On ext4 or XFS populating would dirty, and
    /// write back, every page of the chunk: `fallocate` there. Cleared
    /// (for good) by a kernel that does not know the advice. Relaxed: a
    /// choice between two correct ways to allocate.
    populate: AtomicBool,
    /// The host filesystem says truly which bytes are backed (tmpfs: pages
    /// present; ext4: written or reserved blocks, and it shares no extent
    /// between files, so a backed page never needs a new block to be
    /// written): `SEEK_HOLE` may then mark a chunk allocated without
    /// allocating it. Not on XFS, where a reflinked extent reads as data
    /// yet needs a fresh block on its first write.
    seek_backed: bool,
    /// On tmpfs, one bit per 4 KiB page written through `pwrite` (the
    /// lone-writer path), which allocated that page whole: the page is
    /// read and written through the mapping from then on (no `pread` or
    /// `pwrite` each time for good, and no fault can fail there), even
    /// while the rest of its chunk is a hole — file data leaves holes
    /// where the allocator skipped blocks, and the journal of a freshly
    /// made image is a hole until written. A chunk whose 256 pages are all
    /// set is marked allocated (`done`). Empty elsewhere (a host block may
    /// be smaller than a page) and for images over `PAGE_BITS_MAX`.
    /// Relaxed: a bit only goes from 0 to 1 after the host allocated the
    /// page (the kernel orders that before any later fault on it); a
    /// stale 0 only takes the slower path.
    pages: Box<[AtomicU64]>,
    /// Reads through `pread` and writes through `pwrite` so far (each a
    /// system call anyway; for tests and profiles). Relaxed: statistics.
    preads: AtomicU64,
    pwrites: AtomicU64,
}

/// Images up to this size keep `Lazy::pages` (32 bytes per MiB: 32 MiB
/// of bits for 1 TiB).
const PAGE_BITS_MAX: u64 = 1 << 40;
/// Host pages (4 KiB) per chunk, and 64-bit words of `Lazy::pages`.
const CHUNK_PAGES: u64 = 1 << (CHUNK_SHIFT - 12);
const CHUNK_WORDS: u64 = CHUNK_PAGES / 64;
/// At most this many `SEEK_DATA`/`SEEK_HOLE` calls when a lazy device
/// opens and learns which chunks are already backed (two per data run at
/// most): a few milliseconds; a more fragmented image leaves the rest to
/// be found as it is written.
const OPEN_SEEKS: u32 = 1 << 14;

/// 1 MiB chunks: one allocation (on ext4 or XFS a `fallocate`, taking
/// the host inode lock once) per 256 blocks of 4 KiB written for the
/// first time.
const CHUNK_SHIFT: u32 = 20;
/// Stripes of `Lazy::allocating`.
const STRIPES: usize = 64;

impl std::fmt::Debug for MmapDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmapDevice")
            .field("size", &self.size)
            .field("lazy", &self.lazy.is_some())
            .finish()
    }
}

/// `fallocate(fd, 0, off, len)`: allocate without changing contents or size.
/// On XFS `FALLOC_FL_UNSHARE_RANGE` too: an image copied with reflinks
/// (`cp` does so by default there) shares its blocks, and mode 0 leaves
/// them shared, so the first write fault through the mapping must copy
/// them and, on a full host, raises SIGBUS; unshared now, that is ENOSPC
/// here (falls back to mode 0 where the kernel refuses the flag).
fn allocate(file: &File, off: u64, len: u64) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    const FALLOC_FL_UNSHARE_RANGE: libc::c_int = 0x40;
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(off), libc::off_t::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    if host_fs_magic(file) == Some(XFS_MAGIC) {
        // SAFETY: a plain syscall on a descriptor we own; unsharing
        // allocates private copies and changes no byte or size.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), FALLOC_FL_UNSHARE_RANGE, off, len) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) {
            return Err(e);
        }
    }
    // SAFETY: a plain syscall on a descriptor we own; mode 0 only
    // allocates (the contents and the size stay as they are).
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, off, len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `statfs` magic of tmpfs.
pub(crate) const TMPFS_MAGIC: i64 = 0x0102_1994;
/// `statfs` magic of ext2/3/4.
pub(crate) const EXT4_HOST_MAGIC: i64 = 0xEF53;
/// `statfs` magic of XFS.
pub(crate) const XFS_MAGIC: i64 = 0x5846_5342;

/// The `statfs` magic (`f_type`) of the filesystem `file` lives on.
pub(crate) fn host_fs_magic(file: &File) -> Option<i64> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: `st` is plain data that fstatfs only writes; the descriptor
    // is open for the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    Some(st.f_type as i64)
}

/// Take an exclusive `flock` on an image opened read-write, without
/// waiting: a second scalevfs writing the same image (another mount, a
/// `scalevfs mkfs` over it, a second `Ext4::open` in this process) would
/// corrupt it, so it is refused (`WouldBlock`, with a message naming the
/// cause). Advisory: tools that take no lock (e2fsck, debugfs, the
/// kernel's loop device) are not kept out. The lock goes at
/// `Ext4::unmount` (`BlockDevice::release_claim`) or with the file's last
/// descriptor; a filesystem dropped without `unmount` may live on (and
/// keep the claim) until its inodes' grace period ends, so unmount before
/// opening the image read-write again in the same process.
pub(crate) fn lock_exclusive(file: &File) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: a plain syscall on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            "the image is open read-write elsewhere (another scalevfs holds its flock)",
        ));
    }
    // A filesystem without flock support (some network filesystems):
    // open without the lock, as before.
    if e.raw_os_error() == Some(libc::ENOLCK) || e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        return Ok(());
    }
    Err(e)
}

/// Drop this process's `flock` on `file` (`lock_exclusive`'s).
fn unlock(file: &File) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: a plain syscall on a descriptor we own; unlocking a file
    // not locked is a no-op.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
}

/// Open `path`, read-only unless `write`, which also claims it
/// (`lock_exclusive`).
fn open_claimed(path: &Path, write: bool) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .open(path)?;
    if write {
        lock_exclusive(&file)?;
    }
    Ok(file)
}

/// Open `path` as a non-empty regular file; its size.
fn open_regular(path: &Path, write: bool) -> io::Result<(File, u64)> {
    let file = open_claimed(path, write)?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.len() == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the mmap device maps regular, non-empty image files only",
        ));
    }
    Ok((file, meta.len()))
}

impl MmapDevice {
    /// Map the image at `path`, read-only unless `write` (which first
    /// allocates every block of it).
    pub fn open(path: &Path, write: bool) -> io::Result<MmapDevice> {
        let (file, size) = open_regular(path, write)?;
        if write {
            allocate(&file, 0, size)?;
        }
        let map = if write {
            memmap2::MmapOptions::new().map_raw(&file)?
        } else {
            memmap2::MmapOptions::new().map_raw_read_only(&file)?
        };
        Ok(MmapDevice {
            map,
            size,
            writable: write,
            file,
            lazy: None,
            flushed: FlushState::default(),
        })
    }

    /// Map the image at `path` read-write, allocating it 1 MiB at a time
    /// on first write (see the type's documentation). Fails where the
    /// host filesystem cannot allocate (tried on the first chunk, which
    /// holds the superblock and is written at every mount).
    pub fn open_lazy(path: &Path) -> io::Result<MmapDevice> {
        let (file, size) = open_regular(path, true)?;
        // Map first: a size no mapping can hold fails here, before the
        // bitmap below (one bit per MiB) is sized from it.
        let map = memmap2::MmapOptions::new().map_raw(&file)?;
        let chunks = size.div_ceil(1 << CHUNK_SHIFT);
        let words = usize::try_from(chunks.div_ceil(64))
            .map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let done: Box<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
        let magic = host_fs_magic(&file);
        let seek_backed = magic == Some(TMPFS_MAGIC) || magic == Some(EXT4_HOST_MAGIC);
        let page_words = if magic == Some(TMPFS_MAGIC) && size <= PAGE_BITS_MAX {
            (chunks * CHUNK_WORDS) as usize
        } else {
            0
        };
        let dev = MmapDevice {
            map,
            size,
            writable: true,
            file,
            flushed: FlushState::default(),
            lazy: Some(Lazy {
                allocating: (0..STRIPES)
                    .map(|_| Mutex::new(Class::Ext4DeviceChunk, ()))
                    .collect(),
                done,
                writers: CachePadded::new(AtomicUsize::new(0)),
                populate: AtomicBool::new(magic == Some(TMPFS_MAGIC)),
                seek_backed,
                pages: (0..page_words).map(|_| AtomicU64::new(0)).collect(),
                preads: AtomicU64::new(0),
                pwrites: AtomicU64::new(0),
            }),
        };
        dev.mark_backed_chunks();
        dev.allocate_range(0, 1)?;
        Ok(dev)
    }

    /// The chunks (1 MiB each) known to be allocated, so written and read
    /// through the mapping; every chunk where the device is not lazy.
    /// For tests.
    #[doc(hidden)]
    pub fn allocated_chunks(&self) -> Vec<u64> {
        let chunks = self.size.div_ceil(1 << CHUNK_SHIFT);
        (0..chunks)
            .filter(|&c| self.allocated(c << CHUNK_SHIFT, 1))
            .collect()
    }

    /// `lseek(fd, off, whence)`; `None` past the last data (ENXIO) or on
    /// any error (the caller then just learns nothing).
    fn seek(&self, off: u64, whence: libc::c_int) -> Option<u64> {
        use std::os::unix::io::AsRawFd;
        let off = libc::off_t::try_from(off).ok()?;
        // SAFETY: a plain syscall on a descriptor we own; SEEK_DATA and
        // SEEK_HOLE only move the file offset, which this type never uses
        // (it reads and writes at explicit offsets).
        let r = unsafe { libc::lseek(self.file.as_raw_fd(), off, whence) };
        u64::try_from(r).ok()
    }

    /// Mark allocated every chunk the host file already backs whole (an
    /// image written before, by us or by the kernel; the parts mkfs
    /// wrote), so that writes there go through the mapping from the
    /// start and reads do not go through `pread`. At most `OPEN_SEEKS`
    /// calls.
    fn mark_backed_chunks(&self) {
        let Some(lazy) = &self.lazy else { return };
        if !lazy.seek_backed {
            return;
        }
        let chunks = self.size.div_ceil(1 << CHUNK_SHIFT);
        let (mut c, mut calls) = (0u64, 0u32);
        while c < chunks && calls < OPEN_SEEKS {
            calls += 2;
            let Some(d) = self.seek(c << CHUNK_SHIFT, libc::SEEK_DATA) else {
                break;
            };
            let Some(h) = self.seek(d, libc::SEEK_HOLE) else {
                break;
            };
            if h <= d {
                break;
            }
            // Chunk k lies whole in d..h when it starts at or after d and
            // ends (the last one at the file's end) at or before h.
            let first = d.div_ceil(1 << CHUNK_SHIFT);
            let end = if h >= self.size {
                chunks
            } else {
                h >> CHUNK_SHIFT
            };
            for k in first..end {
                // Relaxed: see `Lazy::done`.
                lazy.done[(k / 64) as usize].fetch_or(1 << (k % 64), Ordering::Relaxed);
            }
            // The chunk holding `h` has a hole at `h`.
            c = (h >> CHUNK_SHIFT) + 1;
        }
    }

    /// After a lone `pwrite` of `off..off + len` (in bounds, `len > 0`):
    /// its pages are allocated (`Lazy::pages`); a chunk all of whose
    /// pages are is marked allocated.
    fn mark_pages(&self, off: u64, len: usize) {
        let Some(lazy) = &self.lazy else { return };
        if lazy.pages.is_empty() {
            return;
        }
        let (first, last) = (off >> 12, (off + len as u64 - 1) >> 12);
        for p in first..=last {
            let Some(w) = lazy.pages.get((p / 64) as usize) else {
                return;
            };
            // Relaxed: see `Lazy::pages`.
            w.fetch_or(1 << (p % 64), Ordering::Relaxed);
        }
        for c in Self::chunks(off, len) {
            let words = &lazy.pages[(c * CHUNK_WORDS) as usize..][..CHUNK_WORDS as usize];
            // Relaxed: as above.
            if words.iter().all(|w| w.load(Ordering::Relaxed) == u64::MAX) {
                // Relaxed: see `Lazy::done`.
                lazy.done[(c / 64) as usize].fetch_or(1 << (c % 64), Ordering::Relaxed);
            }
        }
    }

    /// Whether every page of `off..off + len` (in bounds, `len > 0`) was
    /// written through `pwrite` (`Lazy::pages`).
    fn pages_backed(&self, off: u64, len: usize) -> bool {
        let Some(lazy) = &self.lazy else {
            // As `allocated`: all of a read-write one, none of a read-only.
            return self.writable;
        };
        if lazy.pages.is_empty() {
            return false;
        }
        let (first, last) = (off >> 12, (off + len as u64 - 1) >> 12);
        (first..=last).all(|p| {
            lazy.pages.get((p / 64) as usize).is_some_and(|w| {
                // Relaxed: see `Lazy::pages`.
                w.load(Ordering::Relaxed) & (1 << (p % 64)) != 0
            })
        })
    }

    /// Reads that went through `pread` and writes through `pwrite` so
    /// far ((0, 0) where the device is not lazy). For tests.
    #[doc(hidden)]
    pub fn syscalls(&self) -> (u64, u64) {
        self.lazy.as_ref().map_or((0, 0), |l| {
            // Relaxed: statistics.
            (
                l.preads.load(Ordering::Relaxed),
                l.pwrites.load(Ordering::Relaxed),
            )
        })
    }

    /// Whether `off..off + len` (in bounds) is read and written through
    /// the mapping: its chunks are allocated, or its pages were written.
    /// For tests.
    #[doc(hidden)]
    pub fn mapped(&self, off: u64, len: usize) -> bool {
        len == 0 || self.allocated(off, len) || self.pages_backed(off, len)
    }

    /// Allocate `start..end` (in bounds, `start` a multiple of the chunk
    /// size) by populating its pages writable through the mapping: true
    /// when done, false when the kernel does not know the advice (the
    /// caller falls back to `fallocate`; so will every later call).
    fn populate(&self, start: u64, end: u64) -> io::Result<bool> {
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        // SAFETY: `start..end` lies inside the mapping (end <= size) and
        // `start` is page-aligned (a multiple of 1 MiB from the mapping's
        // page-aligned base); populating maps pages and changes no byte.
        let r = unsafe {
            libc::madvise(
                self.map.as_mut_ptr().add(start as usize).cast(),
                (end - start) as usize,
                MADV_POPULATE_WRITE,
            )
        };
        if r == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINVAL) => {
                if let Some(lazy) = &self.lazy {
                    // Relaxed: see `Lazy::populate`.
                    lazy.populate.store(false, Ordering::Relaxed);
                }
                Ok(false)
            }
            // A fault that would have raised SIGBUS: on tmpfs, no space.
            Some(libc::EFAULT) => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            _ => Err(e),
        }
    }

    /// `off..off + len` inside the mapping, as a start index.
    fn range(&self, off: u64, len: usize) -> io::Result<usize> {
        match off.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(off as usize),
            _ => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
        }
    }

    /// The chunks `off..off + len` (in bounds, `len > 0`) lies in.
    fn chunks(off: u64, len: usize) -> std::ops::RangeInclusive<u64> {
        (off >> CHUNK_SHIFT)..=((off + len as u64 - 1) >> CHUNK_SHIFT)
    }

    /// Whether every chunk of `off..off + len` is allocated (always, for
    /// a device that is not lazy).
    fn allocated(&self, off: u64, len: usize) -> bool {
        let Some(lazy) = &self.lazy else {
            // Read-write: allocated whole at open. Read-only: nothing is
            // known allocated, so reads go through `pread`: a read fault
            // in a hole of a sparse image on tmpfs allocates a page, which
            // on a full tmpfs is SIGBUS (and on any, memory a read-only
            // mount should not take).
            return self.writable;
        };
        len == 0
            || Self::chunks(off, len).all(|c| {
                let bit = 1u64 << (c % 64);
                // Relaxed: see `Lazy::done`.
                lazy.done[(c / 64) as usize].load(Ordering::Relaxed) & bit != 0
            })
    }

    /// Allocate the chunks of `off..off + len` (in bounds) not yet known
    /// to be allocated.
    fn allocate_range(&self, off: u64, len: usize) -> io::Result<()> {
        let Some(lazy) = &self.lazy else {
            return Ok(());
        };
        if len == 0 {
            return Ok(());
        }
        for c in Self::chunks(off, len) {
            let (word, bit) = (&lazy.done[(c / 64) as usize], 1u64 << (c % 64));
            // Relaxed: see `Lazy::done`.
            if word.load(Ordering::Relaxed) & bit != 0 {
                continue;
            }
            let _g = lazy.allocating[(c % STRIPES as u64) as usize].lock();
            // Relaxed: a thread that allocated the chunk set the bit
            // before it released the stripe, which this thread holds now.
            if word.load(Ordering::Relaxed) & bit != 0 {
                continue;
            }
            let start = c << CHUNK_SHIFT;
            let end = (start + (1 << CHUNK_SHIFT)).min(self.size);
            // Relaxed: see `Lazy::populate`.
            if !lazy.populate.load(Ordering::Relaxed) || !self.populate(start, end)? {
                allocate(&self.file, start, end - start)?;
            }
            word.fetch_or(bit, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl BlockDevice for MmapDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let at = self.range(off, buf.len())?;
        if !self.mapped(off, buf.len()) {
            // Not allocated by us (it may be a hole): a read through the
            // mapping would allocate a page there, `pread` does not.
            // (Only a lazy device has bytes it did not allocate.)
            if let Some(lazy) = &self.lazy {
                // Relaxed: a statistic.
                lazy.preads.fetch_add(1, Ordering::Relaxed);
            }
            return self.file.read_exact_at(buf, off);
        }
        // SAFETY: `at..at + buf.len()` lies inside the mapping (checked),
        // which lives as long as `self`; `buf` is a distinct allocation;
        // no thread of this process writes these bytes meanwhile (the
        // type's contract). Other processes are only asked to keep out:
        // the image's `flock` is advisory (and taken only read-write), so
        // one that ignores it and writes these bytes makes this copy a
        // data race, and one that truncates the file makes it fault
        // (SIGBUS). A documented limit of the mmap device (the type's doc).
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.as_ptr().add(at), buf.as_mut_ptr(), buf.len());
        }
        Ok(())
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        // As pwrite on a descriptor opened read-only.
        if !self.writable {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        // In bounds first: a `pwrite` past the end would grow the file.
        self.range(off, buf.len())?;
        match &self.lazy {
            // Bytes not yet allocated: counted among such writes (no shared
            // atomic for the rest, nearly every write once chunks exist).
            Some(lazy) if !self.allocated(off, buf.len()) => {
                if self.pages_backed(off, buf.len()) {
                    // Pages a lone `pwrite` allocated: no allocation, no
                    // count.
                    self.copy_in(off, buf);
                    return Ok(());
                }
                // Relaxed: see `Lazy::writers`.
                let alone = lazy.writers.fetch_add(1, Ordering::Relaxed) == 0;
                struct Leave<'a>(&'a AtomicUsize);
                impl Drop for Leave<'_> {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                let _leave = Leave(&lazy.writers);
                if alone {
                    // Relaxed: a statistic.
                    lazy.pwrites.fetch_add(1, Ordering::Relaxed);
                    self.file.write_all_at(buf, off)?;
                    if !buf.is_empty() {
                        self.mark_pages(off, buf.len());
                    }
                    return Ok(());
                }
                self.write_mapped_at(off, buf)
            }
            _ => self.write_mapped_at(off, buf),
        }
    }
    fn flush(&self) -> io::Result<()> {
        self.flushed.run(&self.file, self.size, || self.map.flush())
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn kind(&self) -> &'static str {
        if self.lazy.is_some() {
            "mmap, allocated on first write"
        } else {
            "mmap"
        }
    }
    fn release_claim(&self) {
        unlock(&self.file);
    }
}

impl MmapDevice {
    /// Write `buf` at `off` through the mapping, allocating the chunks it
    /// lies in first where the device is lazy — what `write_at` does
    /// unless it finds itself the only writer of bytes not yet allocated.
    /// Public for tests of the allocation.
    #[doc(hidden)]
    pub fn write_mapped_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        let at = self.range(off, buf.len())?;
        // Never fault a hole in through the mapping (SIGBUS on a full
        // host filesystem): allocate first, where ENOSPC is an error.
        self.allocate_range(off, buf.len())?;
        debug_assert_eq!(at as u64, off);
        self.copy_in(off, buf);
        Ok(())
    }

    /// Copy `buf` into the mapping at `off`: the device is writable, the
    /// range in bounds and allocated in the file (every caller checked).
    fn copy_in(&self, off: u64, buf: &[u8]) {
        debug_assert!(self.writable && off + buf.len() as u64 <= self.size);
        // SAFETY: as in `read_at` (`off..off + buf.len()` lies inside the
        // mapping: both callers bounds-checked it with `range`); the
        // mapping is writable (both callers checked `writable`: `open`
        // and `open_lazy` map read-write exactly then); the range is
        // allocated in the file (`open` allocated all of it; `open_lazy`
        // these chunks in `write_mapped_at`, or a `pwrite` these pages:
        // `pages_backed`), so no fault here can fail, unless another
        // process truncates the file (SIGBUS) or writes these bytes (a
        // data race), which the advisory `flock` does not prevent: the
        // mmap device's documented limit (see `read_at` and the type).
        unsafe {
            std::ptr::copy_nonoverlapping(
                buf.as_ptr(),
                self.map.as_mut_ptr().add(off as usize),
                buf.len(),
            );
        }
    }
}

/// A device in memory (tests, fuzzing).
#[derive(Debug)]
pub struct MemDevice {
    /// A leaf of the lock order (`Class::Ext4MemDevice`): held across
    /// one copy, under whatever a device access happens under.
    data: scalevfs_sync::ordered::RwLock<Vec<u8>>,
}

impl MemDevice {
    pub fn new(data: Vec<u8>) -> MemDevice {
        MemDevice {
            data: scalevfs_sync::ordered::RwLock::new(Class::Ext4MemDevice, data),
        }
    }
}

fn range(off: u64, len: usize, size: usize) -> io::Result<std::ops::Range<usize>> {
    let start = usize::try_from(off).map_err(|_| io::ErrorKind::UnexpectedEof)?;
    let end = start
        .checked_add(len)
        .filter(|&e| e <= size)
        .ok_or(io::ErrorKind::UnexpectedEof)?;
    Ok(start..end)
}

impl BlockDevice for MemDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let d = self.data.read();
        let r = range(off, buf.len(), d.len())?;
        buf.copy_from_slice(&d[r]);
        Ok(())
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        let mut d = self.data.write();
        let r = range(off, buf.len(), d.len())?;
        d[r].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.data.read().len() as u64
    }
    fn kind(&self) -> &'static str {
        "memory"
    }
}
