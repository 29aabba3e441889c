//! Plain data types of the API: file types, attributes, credentials, flags.
//!
//! Flag values are Linux's (taken from `libc`), so a front end can pass the
//! kernel's numbers straight through.

use bytemuck::{Pod, Zeroable};

/// The type of an inode (the `S_IFMT` bits of its mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    Regular,
    Directory,
    Symlink,
    Fifo,
    CharDevice,
    BlockDevice,
    Socket,
}

pub const S_IFMT: u32 = libc::S_IFMT;
pub const S_IFREG: u32 = libc::S_IFREG;
pub const S_IFDIR: u32 = libc::S_IFDIR;
pub const S_IFLNK: u32 = libc::S_IFLNK;
pub const S_IFIFO: u32 = libc::S_IFIFO;
pub const S_IFCHR: u32 = libc::S_IFCHR;
pub const S_IFBLK: u32 = libc::S_IFBLK;
pub const S_IFSOCK: u32 = libc::S_IFSOCK;
pub const S_ISUID: u32 = libc::S_ISUID;
pub const S_ISGID: u32 = libc::S_ISGID;
pub const S_ISVTX: u32 = libc::S_ISVTX;

impl FileType {
    /// The type encoded in a mode's `S_IFMT` bits, if it is a valid one.
    pub fn from_mode(mode: u32) -> Option<FileType> {
        Some(match mode & S_IFMT {
            S_IFREG => FileType::Regular,
            S_IFDIR => FileType::Directory,
            S_IFLNK => FileType::Symlink,
            S_IFIFO => FileType::Fifo,
            S_IFCHR => FileType::CharDevice,
            S_IFBLK => FileType::BlockDevice,
            S_IFSOCK => FileType::Socket,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits of this type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => S_IFREG,
            FileType::Directory => S_IFDIR,
            FileType::Symlink => S_IFLNK,
            FileType::Fifo => S_IFIFO,
            FileType::CharDevice => S_IFCHR,
            FileType::BlockDevice => S_IFBLK,
            FileType::Socket => S_IFSOCK,
        }
    }

    /// The `d_type` value `getdents` reports (`DT_REG`, ...).
    pub fn dtype(self) -> u8 {
        match self {
            FileType::Regular => libc::DT_REG,
            FileType::Directory => libc::DT_DIR,
            FileType::Symlink => libc::DT_LNK,
            FileType::Fifo => libc::DT_FIFO,
            FileType::CharDevice => libc::DT_CHR,
            FileType::BlockDevice => libc::DT_BLK,
            FileType::Socket => libc::DT_SOCK,
        }
    }
}

/// A point in time, seconds and nanoseconds since the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: i64,
}

impl Timespec {
    /// The current wall-clock time at the kernel's timestamp granularity:
    /// `CLOCK_REALTIME_COARSE`, the clock of Linux's `current_time()` (one
    /// tick: 4 ms on a HZ=250 kernel). Called on modifications, and by a
    /// read only when relatime says its atime may need updating.
    ///
    /// Coarse on purpose, as Linux's: a write that finds mtime and ctime
    /// already equal to the current tick writes no attribute at all
    /// (`file_update_time`'s rule, `pages.rs` `set_blocks`), and a read
    /// whose atime is already the current tick writes nothing either
    /// (`touch_atime`), so a stream of writes and reads of one file does
    /// not write the attribute record readers read (issue 16). Every
    /// timestamp comes from this one clock, so none goes backwards against
    /// another (a fine-grained chmod followed by a coarse write could).
    /// Linux 6.13+ tmpfs switches to a fine-grained time for the next
    /// change after a stat has seen the ctime (multigrain timestamps);
    /// that is not done here.
    pub fn now() -> Timespec {
        #[cfg(all(target_os = "linux", not(miri)))]
        {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `ts` is a valid, writable timespec; the call only
            // writes it.
            if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
                // time_t and c_long: i64 where this is built (64-bit Linux);
                // the casts are for 32-bit targets.
                #[allow(clippy::unnecessary_cast)]
                return Timespec {
                    sec: ts.tv_sec as i64,
                    nsec: ts.tv_nsec as i64,
                };
            }
        }
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos() as i64,
        }
    }
}

/// The attribute block of an inode, kept under the inode's `SeqLock` and read
/// lock-free. `Pod` so the seqlock can copy it as atomic words.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Attr {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub blocks: u64,
    pub rdev: u64,
    pub atime_sec: i64,
    pub atime_nsec: i64,
    pub mtime_sec: i64,
    pub mtime_nsec: i64,
    pub ctime_sec: i64,
    pub ctime_nsec: i64,
}

impl Attr {
    pub fn atime(&self) -> Timespec {
        Timespec {
            sec: self.atime_sec,
            nsec: self.atime_nsec,
        }
    }
    pub fn mtime(&self) -> Timespec {
        Timespec {
            sec: self.mtime_sec,
            nsec: self.mtime_nsec,
        }
    }
    pub fn ctime(&self) -> Timespec {
        Timespec {
            sec: self.ctime_sec,
            nsec: self.ctime_nsec,
        }
    }
    pub fn set_atime(&mut self, t: Timespec) {
        (self.atime_sec, self.atime_nsec) = (t.sec, t.nsec);
    }
    pub fn set_mtime(&mut self, t: Timespec) {
        (self.mtime_sec, self.mtime_nsec) = (t.sec, t.nsec);
    }
    pub fn set_ctime(&mut self, t: Timespec) {
        (self.ctime_sec, self.ctime_nsec) = (t.sec, t.nsec);
    }
    /// Set mtime and ctime to `t` (a data or namespace change).
    pub fn touch_mc(&mut self, t: Timespec) {
        self.set_mtime(t);
        self.set_ctime(t);
    }
}

/// What `fstatat` returns (the fields of `struct stat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub dev: u64,
    pub ino: u64,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    pub blksize: u32,
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
}

/// What `Task::statx` returns: `Stat` and the birth time (statx's
/// `stx_btime`), where the filesystem keeps one. Apart from `Stat` so that
/// `stat`/`fstat` copy no more than `struct stat` holds (a birth time in
/// `Stat` made fstat 17% slower on the 2-core VM).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Statx {
    pub stat: Stat,
    pub btime: Option<Timespec>,
}

impl Stat {
    pub fn file_type(&self) -> Option<FileType> {
        FileType::from_mode(self.mode)
    }
    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }
}

/// Filesystem statistics (`statfs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    pub fs_type: u64,
    pub bsize: u64,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub namelen: u64,
    pub frsize: u64,
    pub flags: u64,
}

/// Credentials of a task: the fsuid/fsgid and supplementary groups used for
/// permission checks. uid 0 has the CAP_DAC_OVERRIDE/CAP_FOWNER/CAP_CHOWN
/// powers of root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Cred {
    /// A fingerprint of these credentials (user, group, supplementary
    /// groups), for "the same credentials as the opener" (Linux compares
    /// the `struct cred` pointers: a process that changed none since the
    /// open has the same). FNV-1a over the ids.
    pub fn fingerprint(&self) -> u64 {
        let ids = [self.uid, self.gid, self.groups.len() as u32];
        ids.iter()
            .chain(self.groups.iter())
            .flat_map(|v| v.to_le_bytes())
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            })
    }

    pub fn root() -> Cred {
        Cred {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        }
    }
    pub fn user(uid: u32, gid: u32) -> Cred {
        Cred {
            uid,
            gid,
            groups: Vec::new(),
        }
    }
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// A change of attributes (`setattr`): each `Some` field is applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Timespec>,
    pub mtime: Option<Timespec>,
    /// Set ctime to this value (the VFS always sets it to "now" on a change).
    pub ctime: Option<Timespec>,
}

/// One directory entry as `getdents` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    /// The cookie to resume after this entry (`d_off`).
    pub next_cookie: u64,
    pub file_type: FileType,
    pub name: Vec<u8>,
}

/// `*at` flags.
pub const AT_FDCWD: i32 = libc::AT_FDCWD;
pub const AT_SYMLINK_NOFOLLOW: u32 = libc::AT_SYMLINK_NOFOLLOW as u32;
pub const AT_SYMLINK_FOLLOW: u32 = libc::AT_SYMLINK_FOLLOW as u32;
pub const AT_REMOVEDIR: u32 = libc::AT_REMOVEDIR as u32;
pub const AT_EMPTY_PATH: u32 = libc::AT_EMPTY_PATH as u32;
pub const AT_EACCESS: u32 = libc::AT_EACCESS as u32;

/// `access` modes.
pub const F_OK: u32 = 0;
pub const X_OK: u32 = 1;
pub const W_OK: u32 = 2;
pub const R_OK: u32 = 4;

/// `flock` operations.
pub const LOCK_SH: u32 = libc::LOCK_SH as u32;
pub const LOCK_EX: u32 = libc::LOCK_EX as u32;
pub const LOCK_NB: u32 = libc::LOCK_NB as u32;
pub const LOCK_UN: u32 = libc::LOCK_UN as u32;
/// Linux's deprecated mandatory-lock flag: an op with it set succeeds and
/// does nothing.
pub const LOCK_MAND: u32 = 32;

/// `renameat2` flags.
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;
pub const RENAME_WHITEOUT: u32 = 4;

/// `utimensat` special nanosecond values.
pub const UTIME_NOW: i64 = (1 << 30) - 1;
pub const UTIME_OMIT: i64 = (1 << 30) - 2;

/// `open` flags.
pub const O_ACCMODE: u32 = libc::O_ACCMODE as u32;
pub const O_RDONLY: u32 = libc::O_RDONLY as u32;
pub const O_WRONLY: u32 = libc::O_WRONLY as u32;
pub const O_RDWR: u32 = libc::O_RDWR as u32;
pub const O_CREAT: u32 = libc::O_CREAT as u32;
pub const O_EXCL: u32 = libc::O_EXCL as u32;
pub const O_NOCTTY: u32 = libc::O_NOCTTY as u32;
pub const O_TRUNC: u32 = libc::O_TRUNC as u32;
pub const O_APPEND: u32 = libc::O_APPEND as u32;
pub const O_NONBLOCK: u32 = libc::O_NONBLOCK as u32;
pub const O_DSYNC: u32 = libc::O_DSYNC as u32;
pub const O_DIRECT: u32 = libc::O_DIRECT as u32;
pub const O_LARGEFILE: u32 = libc::O_LARGEFILE as u32;
pub const O_DIRECTORY: u32 = libc::O_DIRECTORY as u32;
pub const O_NOFOLLOW: u32 = libc::O_NOFOLLOW as u32;
pub const O_NOATIME: u32 = libc::O_NOATIME as u32;
pub const O_CLOEXEC: u32 = libc::O_CLOEXEC as u32;
pub const O_SYNC: u32 = libc::O_SYNC as u32;
pub const O_PATH: u32 = libc::O_PATH as u32;
pub const O_TMPFILE: u32 = libc::O_TMPFILE as u32;
/// Linux's `__FMODE_EXEC`: an open for exec (open_exec; FUSE passes it in
/// an OPEN's flags). Not an openat flag: `Task::openat` ignores it, as
/// Linux drops unknown flags; `Task::reopen` and `Task::open_exec` honour it.
pub const FMODE_EXEC: u32 = 0o40;
/// scalevfs's (and sv6's) `O_ANYFD`: `openat` may return any free fd, not
/// the lowest (POSIX's rule), which lets threads sharing one fd table open
/// and close without a shared lock (`FdTable::install_any`). No Linux open
/// flag uses this bit; it is not stored in the file's flags.
pub const O_ANYFD: u32 = 1 << 30;

/// Limits.
pub const NAME_MAX: usize = 255;
pub const PATH_MAX: usize = 4096;
pub const MAX_SYMLINKS: u32 = 40;
