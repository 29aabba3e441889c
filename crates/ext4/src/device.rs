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
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
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
