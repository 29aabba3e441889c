//! Conversions between the core's types and fuser's.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType as FuseType, INodeNo};
use scalevfs::{FileType, Stat, Timespec, NAME_MAX, UTIME_NOW, UTIME_OMIT};

/// A core errno as fuser's.
pub(crate) fn errno(e: scalevfs::Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e.raw())
}

/// Shorthand for fuser errnos built from libc constants.
pub(crate) fn raw(e: i32) -> fuser::Errno {
    fuser::Errno::from_i32(e)
}

/// A name from the kernel, checked: one component, no NUL, not too long.
/// The kernel never sends bad names, but nothing here trusts it.
pub(crate) fn name_bytes(name: &OsStr) -> Result<&[u8], fuser::Errno> {
    let b = name.as_bytes();
    if b.is_empty() {
        return Err(raw(libc::ENOENT));
    }
    if b.contains(&b'/') || b.contains(&0) {
        return Err(raw(libc::EINVAL));
    }
    if b.len() > NAME_MAX {
        return Err(raw(libc::ENAMETOOLONG));
    }
    Ok(b)
}

pub(crate) fn system_time(t: Timespec) -> SystemTime {
    let nsec = t.nsec.clamp(0, 999_999_999) as u32;
    if t.sec >= 0 {
        UNIX_EPOCH
            .checked_add(Duration::new(t.sec as u64, nsec))
            .unwrap_or(UNIX_EPOCH)
    } else {
        // sec < 0: the instant is sec + nsec/1e9, i.e. before the epoch by
        // |sec| - nsec/1e9.
        let back = Duration::new(t.sec.unsigned_abs(), 0).saturating_sub(Duration::new(0, nsec));
        UNIX_EPOCH.checked_sub(back).unwrap_or(UNIX_EPOCH)
    }
}

pub(crate) fn timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec {
            sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nsec: d.subsec_nanos() as i64,
        },
        Err(e) => {
            // Before the epoch: -(secs) and the nanoseconds borrowed from
            // the second before; computed in i128 so that i64::MIN seconds
            // (2^63 before the epoch) is reached exactly.
            let d = e.duration();
            let mut sec = -i128::from(d.as_secs());
            let mut nsec = 0i64;
            if d.subsec_nanos() != 0 {
                sec -= 1;
                nsec = 1_000_000_000 - i64::from(d.subsec_nanos());
            }
            match i64::try_from(sec) {
                Ok(sec) => Timespec { sec, nsec },
                Err(_) => Timespec {
                    sec: i64::MIN,
                    nsec: 0,
                },
            }
        }
    }
}

/// A time from a request (SETATTR's atime/mtime) as the kernel sent it.
/// fuser 0.18 turns the kernel's (seconds, nanoseconds) pair into a
/// `SystemTime` as `UNIX_EPOCH - (-seconds, nanoseconds)` when the seconds
/// are negative (its `system_time_from_time`), so a time before 1970 with
/// nanoseconds arrives a whole second early (the kernel's (-2, 500000000),
/// -1.5 s, becomes -2.5 s): this undoes that, giving back the kernel's
/// pair exactly.
/// (`fuse_vs_tmpfs.rs` compares such a time with tmpfs through the mount,
/// so a fuser that fixes its conversion makes that test fail here.)
pub(crate) fn request_time(t: SystemTime) -> Timespec {
    match UNIX_EPOCH.duration_since(t) {
        Ok(d) if !d.is_zero() => {
            // Before the epoch by d = (-seconds) s + nanoseconds ns.
            let sec = i64::try_from(-i128::from(d.as_secs())).unwrap_or(i64::MIN);
            Timespec {
                sec,
                nsec: i64::from(d.subsec_nanos()),
            }
        }
        _ => timespec(t),
    }
}

/// The `utimensat` form of a FUSE time: `None` is "omit".
pub(crate) fn time_or_now(t: Option<fuser::TimeOrNow>) -> Timespec {
    match t {
        None => Timespec {
            sec: 0,
            nsec: UTIME_OMIT,
        },
        Some(fuser::TimeOrNow::Now) => Timespec {
            sec: 0,
            nsec: UTIME_NOW,
        },
        Some(fuser::TimeOrNow::SpecificTime(s)) => request_time(s),
    }
}

pub(crate) fn fuse_type(t: FileType) -> FuseType {
    match t {
        FileType::Regular => FuseType::RegularFile,
        FileType::Directory => FuseType::Directory,
        FileType::Symlink => FuseType::Symlink,
        FileType::Fifo => FuseType::NamedPipe,
        FileType::CharDevice => FuseType::CharDevice,
        FileType::BlockDevice => FuseType::BlockDevice,
        FileType::Socket => FuseType::Socket,
    }
}

/// The attributes the kernel gets for `st` under node id `nodeid` (fuser
/// sends `attr.ino` as the node id, so they are the same number).
pub(crate) fn file_attr(st: &Stat, nodeid: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(nodeid),
        size: st.size,
        blocks: st.blocks,
        atime: system_time(st.atime),
        mtime: system_time(st.mtime),
        ctime: system_time(st.ctime),
        crtime: system_time(st.ctime),
        kind: fuse_type(st.file_type().unwrap_or(FileType::Regular)),
        perm: (st.mode & 0o7777) as u16,
        nlink: st.nlink,
        uid: st.uid,
        gid: st.gid,
        // FUSE carries the kernel's 32-bit (new_encode_dev) form, which is
        // what mknod gave the core.
        rdev: st.rdev as u32,
        blksize: if st.blksize == 0 { 4096 } else { st.blksize },
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fuser 0.18's conversion of a request's time (time.rs,
    /// `system_time_from_time`), reproduced: what `request_time` undoes.
    fn fuser_request_time(secs: i64, nsecs: u32) -> SystemTime {
        if secs >= 0 {
            UNIX_EPOCH + Duration::new(secs as u64, nsecs)
        } else {
            UNIX_EPOCH - Duration::new(secs.unsigned_abs(), nsecs)
        }
    }

    #[test]
    fn request_times_come_back_as_the_kernel_sent_them() {
        for (sec, nsec) in [
            (0i64, 0u32),
            (1_700_000_000, 123),
            (-1, 0),
            (-2, 500_000_000),
            (-1, 999_999_999),
            (-3_000_000_000, 7),
            (i64::MIN, 0),
        ] {
            let t = request_time(fuser_request_time(sec, nsec));
            assert_eq!((t.sec, t.nsec), (sec, i64::from(nsec)), "({sec}, {nsec})");
        }
    }

    #[test]
    fn times_round_trip() {
        for t in [
            Timespec { sec: 0, nsec: 0 },
            Timespec {
                sec: 1_700_000_000,
                nsec: 123,
            },
            Timespec {
                sec: -1,
                nsec: 500_000_000,
            },
            Timespec { sec: -5, nsec: 0 },
        ] {
            assert_eq!(timespec(system_time(t)), t);
        }
        // Out-of-range values do not panic.
        let _ = system_time(Timespec {
            sec: i64::MAX,
            nsec: 2_000_000_000,
        });
        let _ = system_time(Timespec {
            sec: i64::MIN,
            nsec: -1,
        });
    }

    #[test]
    fn bad_names_are_errors() {
        assert!(name_bytes(OsStr::new("")).is_err());
        assert!(name_bytes(OsStr::new("a/b")).is_err());
        assert!(name_bytes(OsStr::from_bytes(b"a\0b")).is_err());
        assert!(name_bytes(OsStr::from_bytes(&[b'x'; 256])).is_err());
        assert!(name_bytes(OsStr::new("ok")).is_ok());
    }
}
