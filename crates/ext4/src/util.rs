//! Small helpers of the write side (`write.rs`, `extent_write.rs`), below
//! both so that neither names the other for them.

use crate::error::Error;

/// An errno of the write side as an [`Error`].
pub(crate) fn errno(n: i32) -> Error {
    Error::Io(std::io::Error::from_raw_os_error(n))
}

/// The time now as (seconds, nanoseconds) since the epoch, for inode times.
pub(crate) fn now() -> (i64, i64) {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() as i64, i64::from(d.subsec_nanos()))
}
