//! Errors of the ext4 reader: a *corrupt* image (which object, what was
//! wrong) is kept apart from an *incompatible* one (a feature this build
//! cannot handle) and from the device's own I/O errors.

use std::fmt;

use scalevfs::Errno;

/// An ext4 error.
#[derive(Debug)]
pub enum Error {
    /// The image contradicts the format: `what` names the object (with its
    /// number), `why` the check that failed.
    Corrupt { what: String, why: String },
    /// The image uses something this build does not support (a feature
    /// flag, a journal that needs recovery).
    Incompatible(String),
    /// The block device failed.
    Io(std::io::Error),
}

/// Result of the ext4 reader.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The errno the VFS reports: EUCLEAN for corruption (as Linux's
    /// EFSCORRUPTED), EIO for device errors (ENOSPC, EROFS from the writer), EINVAL for an incompatible
    /// image (only seen at open time).
    pub fn errno(&self) -> Errno {
        match self {
            Error::Corrupt { .. } => Errno::EUCLEAN,
            Error::Incompatible(_) => Errno::EINVAL,
            // An errno the write side raises itself (ENOSPC, EROFS) passes
            // through; other device errors are EIO.
            Error::Io(e) => e
                .raw_os_error()
                .filter(|n| WRITER_ERRNOS.contains(n))
                .and_then(Errno::from_raw)
                .unwrap_or(Errno::EIO),
        }
    }

    /// True for [`Error::Corrupt`].
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Error::Corrupt { .. })
    }
}

/// Errnos the write side raises itself (passed through; any other device
/// error is EIO).
const WRITER_ERRNOS: &[i32] = &[
    libc::ENOSPC,
    libc::EROFS,
    libc::EOPNOTSUPP,
    libc::EMLINK,
    libc::ENAMETOOLONG,
    libc::EFBIG,
    libc::EINVAL,
    libc::ENOTEMPTY,
    libc::ENOENT,
    // Extended attributes (`xattr_write.rs`).
    libc::EEXIST,
    libc::ENODATA,
    libc::ERANGE,
    libc::E2BIG,
];

/// A corruption error.
pub fn corrupt(what: impl Into<String>, why: impl Into<String>) -> Error {
    Error::Corrupt {
        what: what.into(),
        why: why.into(),
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Corrupt { what, why } => write!(f, "ext4: corrupt {what}: {why}"),
            Error::Incompatible(m) => write!(f, "ext4: unsupported: {m}"),
            Error::Io(e) => write!(f, "ext4: I/O error: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<Error> for Errno {
    fn from(e: Error) -> Errno {
        e.errno()
    }
}
