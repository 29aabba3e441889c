//! Block devices: positioned reads and writes plus flush, so a later
//! io_uring or O_DIRECT backend can stand in for the file-backed one.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::RwLock;

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
}

/// A regular file (an image) or a block device node, through `pread`/`pwrite`.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    size: u64,
}

impl FileDevice {
    /// Open `path`, read-only unless `write`.
    pub fn open(path: &Path, write: bool) -> io::Result<FileDevice> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(path)?;
        // Block devices report size 0 in metadata: seek to the end instead.
        let mut size = file.metadata()?.len();
        if size == 0 {
            use std::io::Seek;
            size = (&file).seek(io::SeekFrom::End(0))?;
        }
        Ok(FileDevice { file, size })
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
        self.file.sync_data()
    }
    fn size(&self) -> u64 {
        self.size
    }
}

/// An image file mapped into memory (`MAP_SHARED`): a write is a copy into
/// the mapping, so threads writing different blocks share no lock — through
/// `pwrite` every write to one image file takes that file's inode lock in
/// the host kernel (`i_rwsem`), which serialises all the data writes of a
/// filesystem on an image in /dev/shm. `flush` is `msync(MS_SYNC)`.
///
/// Every block of the file is allocated at open (`fallocate`): a write
/// into a hole through a mapping allocates at fault time, where a full
/// host filesystem raises SIGBUS instead of returning ENOSPC. On tmpfs
/// that costs the image's full size in memory. The file must not be
/// truncated by anyone while it is mapped (SIGBUS). Regular files only.
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
    size: u64,
    /// Mapped read-write (`open(.., true)`).
    writable: bool,
}

impl std::fmt::Debug for MmapDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmapDevice")
            .field("size", &self.size)
            .finish()
    }
}

impl MmapDevice {
    /// Map the image at `path`, read-only unless `write` (which first
    /// allocates every block of it).
    pub fn open(path: &Path, write: bool) -> io::Result<MmapDevice> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() || meta.len() == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the mmap device maps regular, non-empty image files only",
            ));
        }
        let size = meta.len();
        if write {
            use std::os::unix::io::AsRawFd;
            let len = libc::off_t::try_from(size)
                .map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
            // SAFETY: a plain syscall on a descriptor we own; mode 0 only
            // allocates (the contents and the size stay as they are).
            let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
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
        })
    }

    /// `off..off + len` inside the mapping, as a start index.
    fn range(&self, off: u64, len: usize) -> io::Result<usize> {
        match off.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(off as usize),
            _ => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
        }
    }
}

impl BlockDevice for MmapDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let at = self.range(off, buf.len())?;
        // SAFETY: `at..at + buf.len()` lies inside the mapping (checked),
        // which lives as long as `self`; `buf` is a distinct allocation;
        // no thread writes these bytes meanwhile (the type's contract).
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
        let at = self.range(off, buf.len())?;
        // SAFETY: as in `read_at`; the mapping is writable (checked just
        // above: `open` maps read-write exactly when `writable`).
        unsafe {
            std::ptr::copy_nonoverlapping(buf.as_ptr(), self.map.as_mut_ptr().add(at), buf.len());
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.map.flush()
    }
    fn size(&self) -> u64 {
        self.size
    }
}

/// A device in memory (tests, fuzzing).
#[derive(Debug)]
pub struct MemDevice {
    data: RwLock<Vec<u8>>,
}

impl MemDevice {
    pub fn new(data: Vec<u8>) -> MemDevice {
        MemDevice {
            data: RwLock::new(data),
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
        let d = self.data.read().unwrap_or_else(|e| e.into_inner());
        let r = range(off, buf.len(), d.len())?;
        buf.copy_from_slice(&d[r]);
        Ok(())
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        let mut d = self.data.write().unwrap_or_else(|e| e.into_inner());
        let r = range(off, buf.len(), d.len())?;
        d[r].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.data.read().unwrap_or_else(|e| e.into_inner()).len() as u64
    }
}
