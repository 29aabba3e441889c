//! `Errno`: the error type of every scalevfs call.
//!
//! A small non-zero `i32` newtype with the Linux numbering, so front ends
//! (FUSE, a C shim, `std::io::Error`) can pass it straight through. The core
//! never returns strings or `io::Error`; front ends translate.

use core::fmt;
use core::num::NonZeroI32;

/// A POSIX error number (Linux values). Never zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(NonZeroI32);

/// Result type of the VFS calls.
pub type VfsResult<T> = Result<T, Errno>;

macro_rules! errnos {
    ($($name:ident = $val:expr, $msg:expr;)*) => {
        impl Errno {
            $(
                #[doc = $msg]
                pub const $name: Errno = Errno(nz($val));
            )*

            /// The libc message for this errno ("No such file or directory").
            pub fn message(self) -> &'static str {
                match self.0.get() {
                    $(v if v == $val => $msg,)*
                    _ => "Unknown error",
                }
            }

            /// The symbolic name ("ENOENT"), or "E?" for an unnamed value.
            pub fn name(self) -> &'static str {
                match self.0.get() {
                    $(v if v == $val => stringify!($name),)*
                    _ => "E?",
                }
            }
        }
    };
}

impl Errno {
    /// Internal, never returned to a caller (Linux's kernel-internal
    /// ERESTARTNOINTR, 513): a name operation found the parent it walked to
    /// without a count gone before it locked it, and is redone with a
    /// counted walk (`walk::ParentWalk`).
    pub(crate) const RESTART_WALK: Errno = Errno(nz(513));
}

const fn nz(v: i32) -> NonZeroI32 {
    match NonZeroI32::new(v) {
        Some(n) => n,
        None => panic!("errno constants are non-zero"),
    }
}

errnos! {
    EPERM = libc::EPERM, "Operation not permitted";
    ENOENT = libc::ENOENT, "No such file or directory";
    EINTR = libc::EINTR, "Interrupted system call";
    EIO = libc::EIO, "Input/output error";
    ENXIO = libc::ENXIO, "No such device or address";
    E2BIG = libc::E2BIG, "Argument list too long";
    EBADF = libc::EBADF, "Bad file descriptor";
    EAGAIN = libc::EAGAIN, "Resource temporarily unavailable";
    ENOMEM = libc::ENOMEM, "Cannot allocate memory";
    EACCES = libc::EACCES, "Permission denied";
    EFAULT = libc::EFAULT, "Bad address";
    EBUSY = libc::EBUSY, "Device or resource busy";
    EEXIST = libc::EEXIST, "File exists";
    EXDEV = libc::EXDEV, "Invalid cross-device link";
    ENODEV = libc::ENODEV, "No such device";
    ENOTDIR = libc::ENOTDIR, "Not a directory";
    EISDIR = libc::EISDIR, "Is a directory";
    EINVAL = libc::EINVAL, "Invalid argument";
    ENFILE = libc::ENFILE, "Too many open files in system";
    EMFILE = libc::EMFILE, "Too many open files";
    ENOTTY = libc::ENOTTY, "Inappropriate ioctl for device";
    ETXTBSY = libc::ETXTBSY, "Text file busy";
    EFBIG = libc::EFBIG, "File too large";
    ENOSPC = libc::ENOSPC, "No space left on device";
    ESPIPE = libc::ESPIPE, "Illegal seek";
    EROFS = libc::EROFS, "Read-only file system";
    EMLINK = libc::EMLINK, "Too many links";
    EPIPE = libc::EPIPE, "Broken pipe";
    ERANGE = libc::ERANGE, "Numerical result out of range";
    ENAMETOOLONG = libc::ENAMETOOLONG, "File name too long";
    ENOSYS = libc::ENOSYS, "Function not implemented";
    ENOTEMPTY = libc::ENOTEMPTY, "Directory not empty";
    ELOOP = libc::ELOOP, "Too many levels of symbolic links";
    ENODATA = libc::ENODATA, "No data available";
    EOVERFLOW = libc::EOVERFLOW, "Value too large for defined data type";
    EOPNOTSUPP = libc::EOPNOTSUPP, "Operation not supported";
    ESTALE = libc::ESTALE, "Stale file handle";
    EDQUOT = libc::EDQUOT, "Disk quota exceeded";
    EUCLEAN = libc::EUCLEAN, "Structure needs cleaning";
    EBADR = libc::EBADR, "Invalid request descriptor";
}

impl Errno {
    /// An errno from a raw value; `None` for 0.
    pub const fn from_raw(v: i32) -> Option<Errno> {
        match NonZeroI32::new(v) {
            Some(n) => Some(Errno(n)),
            None => None,
        }
    }

    /// The raw positive value (as the kernel's `-errno` negated).
    pub const fn raw(self) -> i32 {
        self.0.get()
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0.get())
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> Self {
        std::io::Error::from_raw_os_error(e.raw())
    }
}

impl TryFrom<&std::io::Error> for Errno {
    type Error = ();
    /// The errno of an OS error; `Err(())` for an error with no raw code.
    fn try_from(e: &std::io::Error) -> Result<Self, ()> {
        e.raw_os_error().and_then(Errno::from_raw).ok_or(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "calls the C library's strerror, which Miri cannot run")]
    fn display_matches_libc_strerror() {
        for e in [
            Errno::ENOENT,
            Errno::EACCES,
            Errno::ENOTEMPTY,
            Errno::ELOOP,
            Errno::EXDEV,
        ] {
            // SAFETY: strerror returns a pointer to a NUL-terminated static or
            // thread-local buffer that stays valid until the next call on this thread.
            let c = unsafe { std::ffi::CStr::from_ptr(libc::strerror(e.raw())) };
            assert_eq!(e.to_string(), c.to_str().unwrap(), "{e:?}");
        }
    }

    #[test]
    fn io_error_round_trip() {
        let io: std::io::Error = Errno::ENAMETOOLONG.into();
        assert_eq!(io.raw_os_error(), Some(libc::ENAMETOOLONG));
        assert_eq!(Errno::try_from(&io), Ok(Errno::ENAMETOOLONG));
        assert_eq!(Errno::from_raw(0), None);
        assert_eq!(format!("{:?}", Errno::EBUSY), "EBUSY(16)");
    }
}
