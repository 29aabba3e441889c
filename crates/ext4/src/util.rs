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
