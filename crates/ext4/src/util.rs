//! Small helpers of the write side (`write.rs`, `extent_write.rs`), below
//! both so that neither names the other for them.

use crate::error::Error;

/// An errno of the write side as an [`Error`].
pub(crate) fn errno(n: i32) -> Error {
    Error::Io(std::io::Error::from_raw_os_error(n))
}

/// The time now as (seconds, nanoseconds) since the epoch, for inode times:
/// the core's clock (`Timespec::now`, Linux's coarse `current_time()`), so
/// that times ext4 sets and times the VFS sets on one inode never run
/// backwards against each other (a fine-grained mtime after a coarse ctime
/// broke statx's ctime >= mtime, xfstests generic/423).
pub(crate) fn now() -> (i64, i64) {
    let t = scalevfs::types::Timespec::now();
    (t.sec, t.nsec)
}

/// A block-sized scratch buffer (a directory block, an extent node, an
/// inode table block read to parse one inode), taken from a small pool of
/// the calling thread and given back to it on drop.
///
/// Why not `vec![0u8; bs]`: that is `calloc`, which glibc serves from the
/// thread's malloc arena under the arena's lock (its per-thread cache
/// serves `malloc` but not `calloc`), and the free goes back under the
/// same lock once the per-thread cache is full. A create or unlink read
/// about nine such blocks, so each took an arena lock about eighteen
/// times; another thread freeing this thread's objects (the dcache's
/// epoch-deferred frees of dentries and inodes run on whichever thread
/// collects) holds the same lock, and the two threads handed it back and
/// forth through futex sleeps and wakes on nearly every operation: with
/// two threads creat-clo in one directory ran at half the speed of one.
/// A pooled buffer is the thread's own and takes no lock at all.
pub(crate) struct BlockBuf {
    buf: Vec<u8>,
}

/// Buffers a thread keeps (the deepest nesting on a hot path is about
/// four: an htree insert's root, path and leaf blocks).
const POOL_MAX: usize = 8;
/// Larger buffers are not kept (a block is at most 64 KiB).
const POOL_KEEP_MAX: usize = 64 * 1024;

thread_local! {
    static POOL: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl BlockBuf {
    /// `len` zero bytes.
    pub(crate) fn zeroed(len: usize) -> BlockBuf {
        let mut buf = POOL
            .try_with(|p| p.try_borrow_mut().ok().and_then(|mut p| p.pop()))
            .ok()
            .flatten()
            .unwrap_or_default();
        buf.clear();
        buf.resize(len, 0);
        BlockBuf { buf }
    }
}

impl Clone for BlockBuf {
    fn clone(&self) -> BlockBuf {
        let mut b = BlockBuf::zeroed(self.buf.len());
        b.buf.copy_from_slice(&self.buf);
        b
    }
}

impl Drop for BlockBuf {
    fn drop(&mut self) {
        if self.buf.capacity() > POOL_KEEP_MAX {
            return;
        }
        let buf = std::mem::take(&mut self.buf);
        // During thread exit the pool may be gone: the buffer is then
        // simply freed.
        let _ = POOL.try_with(|p| {
            if let Ok(mut p) = p.try_borrow_mut() {
                if p.len() < POOL_MAX {
                    p.push(buf);
                }
            }
        });
    }
}

impl std::ops::Deref for BlockBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl std::ops::DerefMut for BlockBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::BlockBuf;

    #[test]
    fn block_bufs_are_zeroed_distinct_and_reused() {
        let p = {
            let mut a = BlockBuf::zeroed(1024);
            a.fill(0xAB);
            let b = BlockBuf::zeroed(1024);
            // Nested buffers are distinct.
            assert_ne!(a.as_ptr(), b.as_ptr());
            assert!(b.iter().all(|&x| x == 0));
            drop(b);
            a.as_ptr()
        };
        // The pool is a stack: the buffer given back last comes first,
        // written over by its last user, and starts zeroed again.
        let c = BlockBuf::zeroed(1024);
        assert_eq!(c.as_ptr(), p);
        assert!(c.iter().all(|&x| x == 0));
        drop(c);
        for len in [4096, 512] {
            let d = BlockBuf::zeroed(len);
            assert_eq!(d.len(), len);
            assert!(d.iter().all(|&x| x == 0));
        }
    }
}
