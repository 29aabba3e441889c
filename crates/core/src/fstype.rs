//! The filesystem trait: what a filesystem type supplies under the VFS caches
//! (the analogue of Linux's inode and super operations).
//!
//! The VFS does every check that POSIX defines in terms of the namespace
//! (permissions, existence, type mismatches, emptiness, loops) before calling
//! a method here, under the locks described in `vfs.rs`; a filesystem only
//! stores. Methods are called with:
//! - the parent directory's namespace lock held shared (exclusive for
//!   `rmdir`'s victim), and the per-name lock of every name involved;
//! - never a spinlock, so a method may block or do I/O.
//!
//! CONTRACT FOR LOCK-FREE CALLBACKS: `get_link_cached` is called from inside
//! the lock-free path walk, under an epoch guard and with no reference held on
//! the inode's dentry. It must not block, must not take a lock that a writer
//! could hold for long, and must return data that stays valid as long as the
//! inode is alive. Returning `None` is always allowed: the walk then leaves
//! lock-free mode and calls `readlink`.

use std::sync::Arc;

use crate::errno::{Errno, VfsResult};
use crate::inode::Inode;
use crate::types::{Cred, DirEntry, SetAttr, StatFs, Timespec};

/// What kind of object `create` makes; the mode's permission bits come in
/// `mode` (already masked by the umask).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewNode<'a> {
    /// A regular file, FIFO, socket or device: full mode (type bits included) and rdev.
    Node {
        mode: u32,
        rdev: u64,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: &'a [u8],
    },
}

/// A filesystem type's operations.
pub trait Filesystem: Send + Sync + 'static {
    /// Short type name ("memfs").
    fn name(&self) -> &'static str;

    /// The root directory inode.
    fn root(&self) -> Arc<Inode>;

    /// True when the dcache always holds every existing name of this
    /// filesystem (memfs keeps all its dentries), so a miss in the cache is a
    /// definite ENOENT: the walk needs no negative dentry and no `lookup` call.
    fn dcache_authoritative(&self) -> bool {
        false
    }

    /// Find `name` in `dir`. `Ok(None)`: no such name (a negative dentry).
    fn lookup(&self, dir: &Arc<Inode>, name: &[u8]) -> VfsResult<Option<Arc<Inode>>>;

    /// Make a new object called `name` in `dir`, owned by `owner` (uid, gid).
    fn create(
        &self,
        dir: &Arc<Inode>,
        name: &[u8],
        node: NewNode<'_>,
        owner: (u32, u32),
    ) -> VfsResult<Arc<Inode>>;

    /// Make an unnamed regular file (O_TMPFILE) in the filesystem of `dir`.
    fn create_tmpfile(
        &self,
        dir: &Arc<Inode>,
        mode: u32,
        owner: (u32, u32),
    ) -> VfsResult<Arc<Inode>> {
        let _ = (dir, mode, owner);
        Err(Errno::EOPNOTSUPP)
    }

    /// Add a name for an existing non-directory inode.
    fn link(&self, dir: &Arc<Inode>, name: &[u8], inode: &Arc<Inode>) -> VfsResult<()>;

    /// Remove the name of a non-directory.
    fn unlink(&self, dir: &Arc<Inode>, name: &[u8], inode: &Arc<Inode>) -> VfsResult<()>;

    /// Remove an empty directory (the filesystem reports ENOTEMPTY).
    fn rmdir(&self, dir: &Arc<Inode>, name: &[u8], inode: &Arc<Inode>) -> VfsResult<()>;

    /// Rename: the VFS has checked everything; `replaced` is the inode that
    /// `new_name` named before (already checked to be replaceable), and with
    /// `exchange` the two names swap.
    #[allow(clippy::too_many_arguments)]
    fn rename(
        &self,
        old_dir: &Arc<Inode>,
        old_name: &[u8],
        new_dir: &Arc<Inode>,
        new_name: &[u8],
        moved: &Arc<Inode>,
        replaced: Option<&Arc<Inode>>,
        exchange: bool,
    ) -> VfsResult<()>;

    /// RENAME_WHITEOUT: `rename` (not an exchange), then a whiteout (a
    /// character device 0:0 owned by `owner`) at `old_name`; returns it.
    /// If the whiteout cannot be made (ENOSPC of inodes) the rename stays
    /// done and that error is returned. The default does the two in turn,
    /// so a crash between them may show the name moved and no whiteout; a
    /// journaled filesystem does both in one transaction, as the kernel's
    /// ext4 makes the whiteout inside its rename's handle.
    #[allow(clippy::too_many_arguments)]
    fn rename_whiteout(
        &self,
        old_dir: &Arc<Inode>,
        old_name: &[u8],
        new_dir: &Arc<Inode>,
        new_name: &[u8],
        moved: &Arc<Inode>,
        replaced: Option<&Arc<Inode>>,
        owner: (u32, u32),
    ) -> VfsResult<VfsResult<Arc<Inode>>> {
        self.rename(old_dir, old_name, new_dir, new_name, moved, replaced, false)?;
        let node = NewNode::Node {
            mode: crate::types::S_IFCHR,
            rdev: 0,
        };
        Ok(self.create(old_dir, old_name, node, owner))
    }

    /// The target of a symlink.
    fn readlink(&self, inode: &Arc<Inode>) -> VfsResult<Vec<u8>>;

    /// The target of a symlink without blocking, for the lock-free walk (see
    /// the contract above).
    fn get_link_cached<'i>(&self, inode: &'i Inode) -> Option<&'i [u8]> {
        let _ = inode;
        None
    }

    /// Apply an attribute change. The default writes the inode's attribute
    /// block; a persistent filesystem also records it.
    fn setattr(&self, inode: &Arc<Inode>, set: &SetAttr) -> VfsResult<()> {
        if let Some(size) = set.size {
            self.truncate(inode, size)?;
        }
        inode.update_attr(|a| apply_setattr(a, set));
        Ok(())
    }

    /// List `dir` from `cookie` (0 = start). `emit` returns false to stop.
    /// Cookies must stay valid across concurrent creates and unlinks: an
    /// entry present throughout is returned exactly once, an entry created or
    /// removed meanwhile at most once.
    fn readdir(
        &self,
        dir: &Arc<Inode>,
        cookie: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> VfsResult<()>;

    /// Write `buf` at `off` with the inode's data lock held **shared**, if
    /// this write can run beside other such writes of the same file: it
    /// must change no size, block count or allocation, and be atomic by
    /// itself (memfs: an overwrite inside one page that exists, by copy on
    /// write and compare-and-exchange). `None`: not done; the VFS then
    /// takes the lock exclusive and calls [`Filesystem::write`]. The VFS
    /// calls this only for a positioned write (not O_APPEND) of a file
    /// with no privileges for a write to remove. Default: `None`.
    fn write_shared(
        &self,
        _inode: &Arc<Inode>,
        _off: u64,
        _buf: &[u8],
    ) -> Option<VfsResult<usize>> {
        None
    }

    /// Whether `readdir` must run under the directory's VFS lock
    /// (`Inode::dir_lock`, shared), which holds off the directory's removal
    /// (rmdir, rename over it: exclusive) for the length of the listing.
    /// `false` for a filesystem whose listing is safe against its
    /// directory's removal by itself (memfs: a concurrent skip list, read
    /// under an epoch guard; a directory is removed only when empty, so a
    /// listing that overlaps its removal lists what it held just before).
    /// Name operations hold the lock shared too, so it never excluded
    /// creates and unlinks. Default `true`.
    fn readdir_needs_dir_lock(&self) -> bool {
        true
    }

    /// Where a listing that starts now ends: `Some(c)` if `readdir` goes in
    /// increasing cookie order, every entry present now has a cookie below
    /// `c`, and every entry added to `dir` after this call (created, or
    /// renamed in) gets a cookie >= `c` (one added concurrently may get
    /// either; memfs's cookies are not increasing across threads). A listing started at
    /// position 0 stops there, so entries that keep arriving behind it
    /// (renamed out and back) cannot make it endless (Linux's offset
    /// directories do the same). `None` (the default): no bound.
    fn readdir_end(&self, dir: &Arc<Inode>) -> Option<u64> {
        let _ = dir;
        None
    }

    fn statfs(&self) -> StatFs;

    /// Largest file size supported.
    fn max_file_size(&self) -> u64 {
        i64::MAX as u64
    }

    /// The time the filesystem will store for `t` (a time set by
    /// utimensat): the kernel's timestamp_truncate with this filesystem's
    /// `s_time_min`/`s_time_max` and granularity. The default keeps every
    /// time as it is.
    fn clamp_time(&self, t: Timespec) -> Timespec {
        t
    }

    /// Largest size of the file `inode`: `max_file_size`, unless the
    /// limit depends on how the file is stored (ext4's block-mapped files
    /// reach less far than its extent files: `s_bitmap_maxbytes`). The
    /// VFS checks writes, truncates, lseek and copy_file_range against it
    /// (fallocate against `max_file_size`, as Linux's vfs_fallocate).
    fn max_file_size_of(&self, inode: &Inode) -> u64 {
        let _ = inode;
        self.max_file_size()
    }

    // ---- data ----

    /// Read at `off`; returns bytes read (0 at or past end of file).
    fn read(&self, inode: &Arc<Inode>, off: u64, buf: &mut [u8]) -> VfsResult<usize>;

    /// Write at `off` (the VFS holds the inode's data lock exclusively and
    /// has checked limits); returns bytes written and updates size/times.
    fn write(&self, inode: &Arc<Inode>, off: u64, buf: &[u8]) -> VfsResult<usize>;

    /// Set the size (grow with a hole or shrink, freeing data).
    fn truncate(&self, inode: &Arc<Inode>, size: u64) -> VfsResult<()>;

    /// Allocate (mode 0) or punch a hole (`punch`, size kept).
    fn fallocate(&self, inode: &Arc<Inode>, punch: bool, off: u64, len: u64) -> VfsResult<()> {
        let _ = (inode, punch, off, len);
        Err(Errno::EOPNOTSUPP)
    }

    /// The fallocate modes that zero or move data (`RangeOp`), with the
    /// data lock held; the VFS grows the size after `Zero` without
    /// KEEP_SIZE. The filesystem checks its own alignment rules.
    fn fallocate_range(
        &self,
        inode: &Arc<Inode>,
        op: RangeOp,
        off: u64,
        len: u64,
    ) -> VfsResult<()> {
        let _ = (inode, op, off, len);
        Err(Errno::EOPNOTSUPP)
    }

    /// `FS_IOC_FIEMAP` over the bytes `[start, start + len)` (`len` > 0,
    /// not yet clipped to the maximum file size) with the request's
    /// `FIEMAP_FLAG_*` `flags`: the extents that map the range, in order,
    /// clipped to it at block granularity, the last one flagged
    /// `FIEMAP_EXTENT_LAST` (as the kernel's iomap-based reports). EBADR
    /// for a flag the filesystem does not support. The default (memfs, as
    /// tmpfs): EOPNOTSUPP.
    fn fiemap(
        &self,
        inode: &Arc<Inode>,
        start: u64,
        len: u64,
        flags: u32,
    ) -> VfsResult<Vec<FiemapExtent>> {
        let _ = (inode, start, len, flags);
        Err(Errno::EOPNOTSUPP)
    }

    /// Where a directory's positions end, for lseek on it:
    /// `Some((eof, max))` makes SEEK_END relative to `eof`, SEEK_DATA and
    /// SEEK_HOLE answer against it, and no position pass `max`, as
    /// Linux's `generic_file_llseek_size` (ext4: its htree end cookie, or
    /// the size of a linear directory). `None`, the default: SEEK_SET and
    /// SEEK_CUR only, EINVAL for the rest, as tmpfs's `dcache_dir_lseek`.
    fn dir_seek_bounds(&self, dir: &Arc<Inode>) -> Option<(u64, u64)> {
        let _ = dir;
        None
    }

    /// SEEK_DATA (`data`) or SEEK_HOLE from `off`; ENXIO past the end.
    fn seek_data_hole(&self, inode: &Arc<Inode>, off: u64, data: bool) -> VfsResult<u64> {
        // Default: the whole file is data, with the implicit hole at EOF.
        let size = inode.attr().size;
        if off >= size {
            return Err(Errno::ENXIO);
        }
        Ok(if data { off } else { size })
    }

    /// The chattr flags of `inode` become `flags` (`FS_*_FL` within
    /// `inode::FS_FL_SETTABLE`) with ctime `ctime` (`FS_IOC_SETFLAGS`,
    /// checked by the caller): a filesystem that stores them writes them
    /// (ext4's `i_flags`); the core keeps them in the inode after this
    /// returns Ok. The default stores nothing (memfs).
    fn set_fs_flags(
        &self,
        inode: &Arc<Inode>,
        flags: u32,
        ctime: crate::types::Timespec,
    ) -> VfsResult<()> {
        let _ = (inode, flags, ctime);
        Ok(())
    }

    /// Make the inode's data (and with `!datasync` its metadata) durable.
    fn fsync(&self, inode: &Arc<Inode>, datasync: bool) -> VfsResult<()> {
        let _ = (inode, datasync);
        Ok(())
    }

    // ---- extended attributes ----
    //
    // Names come whole ("user.foo"); the VFS has checked the name, the
    // permissions and the name space (see `xattr.rs`). `setxattr` and
    // `removexattr` are called with the inode's data lock held exclusively;
    // the VFS then sets the ctime.

    /// The value of `name`: ENODATA if absent. The default: no xattrs.
    fn getxattr(&self, inode: &Arc<Inode>, name: &[u8]) -> VfsResult<Vec<u8>> {
        let _ = (inode, name);
        Err(Errno::EOPNOTSUPP)
    }

    /// Every name the inode has (the VFS hides `trusted.*` from non-root).
    fn listxattr(&self, inode: &Arc<Inode>) -> VfsResult<Vec<Vec<u8>>> {
        let _ = inode;
        Ok(Vec::new())
    }

    /// Set `name` to `value`; `flags`: XATTR_CREATE (EEXIST if present) or
    /// XATTR_REPLACE (ENODATA if absent).
    fn setxattr(&self, inode: &Arc<Inode>, name: &[u8], value: &[u8], flags: u32) -> VfsResult<()> {
        let _ = (inode, name, value, flags);
        Err(Errno::EOPNOTSUPP)
    }

    /// Remove `name`: ENODATA if absent.
    fn removexattr(&self, inode: &Arc<Inode>, name: &[u8]) -> VfsResult<()> {
        let _ = (inode, name);
        Err(Errno::EOPNOTSUPP)
    }

    // ---- file handles (exportfs) ----
    //
    // A front end that decodes a file handle after it dropped the inode
    // (the FUSE adapter after the kernel evicted it, or a new daemon on the
    // same image) finds the inode by number and, for a directory, connects
    // it to the tree through its parents (`Task::handle_for_inode`). Called
    // with no lock held. Both default to ESTALE: the handle cannot be
    // decoded.

    /// The parent directory of directory `dir` (its `..`); the root's is the
    /// root. ESTALE if the filesystem cannot tell (the default).
    fn get_parent(&self, dir: &Arc<Inode>) -> VfsResult<Arc<Inode>> {
        let _ = dir;
        Err(Errno::ESTALE)
    }

    /// The inode numbered `ino` if it is in use and has a name (Linux's
    /// `ext4_nfs_get_inode`): for any other 64-bit value (out of range,
    /// reserved, free, unlinked, unreadable) ESTALE, never a panic. The
    /// caller checks the generation. The default: ESTALE (memfs numbers
    /// mean nothing to a later instance, and a live memfs inode is found
    /// through the front end's own references).
    fn inode_by_number(&self, ino: u64) -> VfsResult<Arc<Inode>> {
        let _ = ino;
        Err(Errno::ESTALE)
    }

    /// The inode is no longer used (no names, no open files): free its storage.
    fn evict(&self, inode: &Inode) {
        let _ = inode;
    }
}

/// fallocate modes beyond allocate and punch (ext4 has all three; tmpfs
/// none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeOp {
    /// FALLOC_FL_ZERO_RANGE.
    Zero,
    /// FALLOC_FL_COLLAPSE_RANGE.
    Collapse,
    /// FALLOC_FL_INSERT_RANGE.
    Insert,
}

/// One extent of an `FS_IOC_FIEMAP` answer (`struct fiemap_extent`, bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FiemapExtent {
    /// Offset in the file.
    pub logical: u64,
    /// Offset on the device.
    pub physical: u64,
    /// Length in bytes.
    pub length: u64,
    /// `FIEMAP_EXTENT_*`.
    pub flags: u32,
}

/// `fm_flags`: write dirty data back before mapping (nothing to do where
/// data is not cached).
pub const FIEMAP_FLAG_SYNC: u32 = 0x1;
/// `fm_flags`: map the extended attribute storage instead of the data.
pub const FIEMAP_FLAG_XATTR: u32 = 0x2;
/// `fm_flags`: ext4's "cache the extent tree" request.
pub const FIEMAP_FLAG_CACHE: u32 = 0x4;
/// `fe_flags`: the last extent of the answer.
pub const FIEMAP_EXTENT_LAST: u32 = 0x1;
/// `fe_flags`: allocated but unwritten (reads as zeros).
pub const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
/// `fe_flags`: made of several blocks mapped one by one (block maps).
pub const FIEMAP_EXTENT_MERGED: u32 = 0x1000;
/// The kernel's limit on `fm_extent_count` (EINVAL above it).
pub const FIEMAP_MAX_EXTENTS: u32 = u32::MAX / 56 - 1;

/// Apply the non-size fields of `set` to an attribute block.
pub fn apply_setattr(a: &mut crate::types::Attr, set: &SetAttr) {
    if let Some(m) = set.mode {
        a.mode = (a.mode & crate::types::S_IFMT) | (m & 0o7777);
    }
    if let Some(u) = set.uid {
        a.uid = u;
    }
    if let Some(g) = set.gid {
        a.gid = g;
    }
    if let Some(t) = set.atime {
        a.set_atime(t);
    }
    if let Some(t) = set.mtime {
        a.set_mtime(t);
    }
    if let Some(t) = set.ctime {
        a.set_ctime(t);
    }
}

/// Credentials type re-exported for filesystem implementors.
pub type FsCred = Cred;
