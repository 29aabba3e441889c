//! Raw FUSE requests with fuzzed fields, fed to the adapter without the
//! kernel: fuser's session runs on one end of a `SOCK_SEQPACKET` socket
//! pair (one message per read and per write, as `/dev/fuse` gives them),
//! and this test plays the kernel on the other end.
//!
//! The kernel only sends node ids it was given, sizes up to its own
//! limits and names it checked; a buggy or hostile kernel module aside,
//! the adapter must still hold up when those promises are broken, so the
//! requests here break them: unknown and forgotten node ids, file handles
//! never handed out, offsets past `i64::MAX`, sizes up to `u32::MAX`,
//! names that are empty, `.`, `..`, 256 bytes long or contain `/`, every
//! flag bit, forgets of more lookups than were made, truncated bodies.
//!
//! Checked: every request but FORGET gets exactly one well-formed reply
//! (its own unique id, an error of 0 or a negative errno, an error reply
//! without a body, data no larger than the size asked for); the daemon
//! never panics or stalls (a reply that does not come within the timeout
//! fails the test); requests from an unprivileged caller leave the files
//! it may not write exactly as they were; the filesystem still works
//! afterwards and the session ends cleanly at DESTROY.
//!
//! `FUSE_FUZZ_REQUESTS` (default 10,000) and `FUSE_FUZZ_SEED` change the
//! run.
//!
//! The same harness sends requests no kernel test can produce on demand:
//! a READDIRPLUS over a directory with a corrupt block, a WRITE flagged
//! FUSE_WRITE_KILL_SUIDGID that fails its size check.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use fuser::{Config, Session, SessionACL};
use std::process::Command;

use scalevfs::{Vfs, VfsConfig, O_CREAT, O_WRONLY};
use scalevfs_ext4::{Ext4, Ext4Options};
use scalevfs_fuse::{FuseConfig, ScaleFs};

/// The unprivileged callers of the fuzzed requests.
const USER: u32 = 1000;
const OTHER: u32 = 1001;

// Opcodes (linux/fuse.h).
const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const SETATTR: u32 = 4;
const READLINK: u32 = 5;
const SYMLINK: u32 = 6;
const MKNOD: u32 = 8;
const MKDIR: u32 = 9;
const UNLINK: u32 = 10;
const RMDIR: u32 = 11;
const RENAME: u32 = 12;
const LINK: u32 = 13;
const OPEN: u32 = 14;
const READ: u32 = 15;
const WRITE: u32 = 16;
const STATFS: u32 = 17;
const RELEASE: u32 = 18;
const FSYNC: u32 = 20;
const SETXATTR: u32 = 21;
const GETXATTR: u32 = 22;
const LISTXATTR: u32 = 23;
const REMOVEXATTR: u32 = 24;
const FLUSH: u32 = 25;
const INIT: u32 = 26;
const OPENDIR: u32 = 27;
const READDIR: u32 = 28;
const RELEASEDIR: u32 = 29;
const FSYNCDIR: u32 = 30;
const GETLK: u32 = 31;
const SETLK: u32 = 32;
const ACCESS: u32 = 34;
const CREATE: u32 = 35;
const BMAP: u32 = 37;
const DESTROY: u32 = 38;
const IOCTL: u32 = 39;
const BATCH_FORGET: u32 = 42;
const FALLOCATE: u32 = 43;
const READDIRPLUS: u32 = 44;
const RENAME2: u32 = 45;
const LSEEK: u32 = 46;
const COPY_FILE_RANGE: u32 = 47;

const OPS: &[u32] = &[
    LOOKUP,
    LOOKUP,
    LOOKUP,
    LOOKUP,
    LOOKUP,
    MKDIR,
    CREATE,
    CREATE,
    OPEN,
    OPENDIR,
    READ,
    WRITE,
    READDIRPLUS,
    GETATTR,
    SETXATTR,
    FORGET,
    GETATTR,
    SETATTR,
    READLINK,
    SYMLINK,
    MKNOD,
    MKDIR,
    UNLINK,
    RMDIR,
    RENAME,
    LINK,
    OPEN,
    OPEN,
    READ,
    WRITE,
    WRITE,
    STATFS,
    RELEASE,
    FSYNC,
    SETXATTR,
    GETXATTR,
    LISTXATTR,
    REMOVEXATTR,
    FLUSH,
    OPENDIR,
    READDIR,
    RELEASEDIR,
    FSYNCDIR,
    GETLK,
    SETLK,
    ACCESS,
    CREATE,
    CREATE,
    BMAP,
    IOCTL,
    BATCH_FORGET,
    FALLOCATE,
    READDIRPLUS,
    RENAME2,
    LSEEK,
    COPY_FILE_RANGE,
    // Unknown and unsupported opcodes.
    0,
    7,
    19,
    33,
    36,
    40,
    41,
    48,
    4096,
];

/// xorshift64*: deterministic and dependency-free (a `Cell`, so that a
/// pick can take freshly drawn values among its choices).
struct Rng(std::cell::Cell<u64>);

impl Rng {
    fn next(&self) -> u64 {
        let mut x = self.0.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<T: Copy>(&self, v: &[T]) -> T {
        v[self.below(v.len())]
    }
}

/// What the fuzzer learned from replies: node ids and file handles the
/// daemon handed out, plus made-up ones.
struct Pools {
    nodes: Vec<u64>,
    fhs: Vec<u64>,
    /// The largest reply the socket carries (a READ may ask no more).
    max_reply: usize,
}

impl Pools {
    fn node(&mut self, r: &mut Rng) -> u64 {
        if r.chance(8) {
            r.pick(&[0, 2, 3, 1 << 32, u64::MAX, r.next()])
        } else {
            r.pick(&self.nodes)
        }
    }
    fn fh(&mut self, r: &mut Rng) -> u64 {
        if self.fhs.is_empty() || r.chance(10) {
            r.pick(&[0, 1, 2, 3, 1 << 32, (1 << 32) | 3, u64::MAX, r.next()])
        } else {
            r.pick(&self.fhs)
        }
    }
    fn learn_node(&mut self, id: u64) {
        if id != 0 && !self.nodes.contains(&id) {
            if self.nodes.len() >= 64 {
                let i = 1 + (id as usize % 63);
                self.nodes[i] = id;
            } else {
                self.nodes.push(id);
            }
        }
    }
    fn learn_fh(&mut self, fh: u64) {
        if self.fhs.len() >= 64 {
            self.fhs.swap_remove(0);
        }
        self.fhs.push(fh);
    }
}

fn name(r: &mut Rng) -> Vec<u8> {
    match r.below(20) {
        0 => Vec::new(),
        1 => b".".to_vec(),
        2 => b"..".to_vec(),
        3 => b"x/y".to_vec(),
        4 => vec![b'n'; 255],
        5 => vec![b'n'; 256],
        6 => vec![0xff, 0xfe, b'z'],
        7 => b"vault".to_vec(),
        8 => b"pub".to_vec(),
        _ => vec![b'a' + r.below(6) as u8],
    }
}

fn offset(r: &mut Rng) -> u64 {
    r.pick(&[
        0,
        1,
        4095,
        4096,
        1 << 20,
        (1 << 31) - 1,
        i64::MAX as u64,
        (i64::MAX as u64) + 1,
        u64::MAX,
        u64::MAX - 4095,
        r.next() % (1 << 24),
        r.next(),
    ])
}

fn size(r: &mut Rng) -> u32 {
    r.pick(&[
        0,
        1,
        8,
        100,
        4096,
        65536,
        1 << 20,
        16 << 20,
        u32::MAX,
        r.next() as u32,
    ])
}

fn flags(r: &mut Rng) -> u32 {
    if r.chance(30) {
        r.next() as u32
    } else {
        // Access mode, O_CREAT, O_EXCL, O_TRUNC, O_APPEND, O_DIRECTORY, ...
        let base = r.pick(&[0, 1, 2, 3]);
        let extra = r.pick(&[
            0, 0o100, 0o200, 0o1000, 0o2000, 0o4000, 0o200000, 0o400000, 0o4010000, 0o20000000,
        ]);
        base | extra
    }
}

fn mode(r: &mut Rng) -> u32 {
    let ty = r.pick(&[
        0o100000, 0o040000, 0o120000, 0o020000, 0o060000, 0o010000, 0o140000, 0, 0o170000,
    ]);
    ty | (r.next() as u32 & 0o7777)
}

fn cstr(b: &mut Vec<u8>, s: &[u8]) {
    b.extend_from_slice(s);
    b.push(0);
}

fn u32s(b: &mut Vec<u8>, v: &[u32]) {
    for x in v {
        b.extend_from_slice(&x.to_le_bytes());
    }
}

fn u64s(b: &mut Vec<u8>, v: &[u64]) {
    for x in v {
        b.extend_from_slice(&x.to_le_bytes());
    }
}

/// One request's body; the node id goes in the header.
fn body(op: u32, r: &mut Rng, p: &mut Pools) -> Vec<u8> {
    let mut b = Vec::new();
    match op {
        LOOKUP | UNLINK | RMDIR | REMOVEXATTR => {
            let n = if op == REMOVEXATTR {
                xattr_name(r)
            } else {
                name(r)
            };
            cstr(&mut b, &n);
        }
        FORGET => u64s(&mut b, &[r.pick(&[0, 1, 2, u64::MAX, r.next() % 8])]),
        GETATTR => {
            u32s(&mut b, &[r.pick(&[0, 1, r.next() as u32]), 0]);
            u64s(&mut b, &[p.fh(r)]);
        }
        SETATTR => {
            // valid, padding, fh, size, lock_owner, atime, mtime, ctime,
            // the three nsecs, mode, unused, uid, gid, unused.
            let valid = if r.chance(50) {
                r.next() as u32
            } else {
                r.pick(&[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
            };
            u32s(&mut b, &[valid, 0]);
            u64s(
                &mut b,
                &[p.fh(r), offset(r), r.next(), r.next(), r.next(), r.next()],
            );
            u32s(
                &mut b,
                &[
                    r.next() as u32,
                    r.next() as u32,
                    r.pick(&[0, 999_999_999, 1_000_000_000, u32::MAX]),
                ],
            );
            u32s(
                &mut b,
                &[
                    mode(r),
                    0,
                    r.pick(&[0, USER, OTHER, u32::MAX]),
                    r.pick(&[0, USER, u32::MAX]),
                    0,
                ],
            );
        }
        READLINK | STATFS | DESTROY => {}
        SYMLINK => {
            cstr(&mut b, &name(r));
            let target = match r.below(4) {
                0 => Vec::new(),
                1 => vec![b't'; 4096],
                2 => vec![b't'; 5000],
                _ => b"../target".to_vec(),
            };
            cstr(&mut b, &target);
        }
        MKNOD => {
            u32s(
                &mut b,
                &[
                    mode(r),
                    r.next() as u32,
                    r.pick(&[0, 0o22, r.next() as u32]),
                    0,
                ],
            );
            cstr(&mut b, &name(r));
        }
        MKDIR => {
            u32s(&mut b, &[mode(r), r.pick(&[0, 0o22, r.next() as u32])]);
            cstr(&mut b, &name(r));
        }
        RENAME | RENAME2 => {
            u64s(&mut b, &[p.node(r)]);
            if op == RENAME2 {
                u32s(&mut b, &[r.pick(&[0, 1, 2, 4, 3, 8, r.next() as u32]), 0]);
            }
            cstr(&mut b, &name(r));
            cstr(&mut b, &name(r));
        }
        LINK => {
            u64s(&mut b, &[p.node(r)]);
            cstr(&mut b, &name(r));
        }
        OPEN | OPENDIR => u32s(&mut b, &[flags(r), r.next() as u32 & 3]),
        READ | READDIR | READDIRPLUS => {
            u64s(&mut b, &[p.fh(r), offset(r)]);
            // Up to what a reply can carry here (the adapter caps a READ
            // at 16 MiB; the socket may carry less).
            let n = (size(r) as usize).min(p.max_reply) as u32;
            u32s(&mut b, &[n, r.next() as u32 & 3]);
            u64s(&mut b, &[r.next()]);
            u32s(&mut b, &[flags(r), 0]);
        }
        WRITE => {
            let len = r.pick(&[0usize, 1, 100, 4096, 5000, 70_000]);
            u64s(&mut b, &[p.fh(r), offset(r)]);
            u32s(&mut b, &[len as u32, r.next() as u32 & 7]);
            u64s(&mut b, &[r.next()]);
            u32s(&mut b, &[flags(r), 0]);
            b.extend(std::iter::repeat_n(b'w', len));
        }
        RELEASE | RELEASEDIR => {
            u64s(&mut b, &[p.fh(r)]);
            u32s(&mut b, &[flags(r), r.next() as u32 & 0xf]);
            u64s(&mut b, &[r.next()]);
        }
        FSYNC | FSYNCDIR => {
            u64s(&mut b, &[p.fh(r)]);
            u32s(&mut b, &[r.next() as u32 & 1, 0]);
        }
        SETXATTR => {
            let v = vec![b'v'; r.pick(&[0usize, 1, 255, 4000, 65536, 70_000])];
            u32s(
                &mut b,
                &[v.len() as u32, r.pick(&[0, 1, 2, 3, r.next() as u32])],
            );
            cstr(&mut b, &xattr_name(r));
            b.extend_from_slice(&v);
        }
        GETXATTR => {
            u32s(&mut b, &[size(r), 0]);
            cstr(&mut b, &xattr_name(r));
        }
        LISTXATTR => u32s(&mut b, &[size(r), 0]),
        FLUSH => {
            u64s(&mut b, &[p.fh(r)]);
            u32s(&mut b, &[0, 0]);
            u64s(&mut b, &[r.next()]);
        }
        GETLK | SETLK => {
            // fh, owner, {start, end, type, pid}, lk_flags, padding.
            u64s(&mut b, &[p.fh(r), r.next(), offset(r), offset(r)]);
            u32s(
                &mut b,
                &[
                    r.pick(&[0, 1, 2, 7]),
                    r.next() as u32,
                    r.next() as u32 & 1,
                    0,
                ],
            );
        }
        ACCESS => u32s(&mut b, &[r.next() as u32 & 0xf, 0]),
        CREATE => {
            u32s(&mut b, &[flags(r) | 0o100, mode(r), r.pick(&[0, 0o22]), 0]);
            cstr(&mut b, &name(r));
        }
        BMAP => {
            u64s(&mut b, &[r.next()]);
            u32s(&mut b, &[r.pick(&[0, 512, 4096, u32::MAX]), 0]);
        }
        IOCTL => {
            // fh, flags, cmd, arg, in_size, out_size, then the input.
            let cmd = r.pick(&[
                0x8008_6601u32, // FS_IOC_GETFLAGS
                0x4008_6602,    // FS_IOC_SETFLAGS
                0x8004_6601,    // FS_IOC32_GETFLAGS
                0x4004_6602,    // FS_IOC32_SETFLAGS
                0x801c_581f,    // FS_IOC_FSGETXATTR
                0x401c_5820,    // FS_IOC_FSSETXATTR
                0x5401,         // TCGETS
                0x8008_6610,    // FS_IOC_GETVERSION-like
                r.next() as u32,
            ]);
            let in_len = r.pick(&[0usize, 4, 8, 28, 100]);
            u64s(&mut b, &[p.fh(r)]);
            u32s(&mut b, &[r.next() as u32 & 0x3f, cmd]);
            u64s(&mut b, &[r.next()]);
            u32s(
                &mut b,
                &[in_len as u32, r.pick(&[0, 4, 8, 28, 4096, u32::MAX])],
            );
            b.extend((0..in_len).map(|_| r.next() as u8));
        }
        BATCH_FORGET => {
            let n = r.below(5);
            u32s(&mut b, &[n as u32, 0]);
            for _ in 0..n {
                u64s(&mut b, &[p.node(r), r.pick(&[1, 2, u64::MAX])]);
            }
        }
        FALLOCATE => {
            u64s(&mut b, &[p.fh(r), offset(r), offset(r)]);
            u32s(
                &mut b,
                &[r.pick(&[0, 1, 2, 3, 8, 16, 32, 64, r.next() as u32]), 0],
            );
        }
        LSEEK => {
            u64s(&mut b, &[p.fh(r), offset(r)]);
            u32s(&mut b, &[r.pick(&[0, 1, 2, 3, 4, 5, r.next() as u32]), 0]);
        }
        COPY_FILE_RANGE => {
            u64s(
                &mut b,
                &[
                    p.fh(r),
                    offset(r),
                    p.node(r),
                    p.fh(r),
                    offset(r),
                    offset(r),
                    r.pick(&[0, 1, r.next()]),
                ],
            );
        }
        _ => b.extend((0..r.below(64)).map(|_| r.next() as u8)),
    }
    // Sometimes a body cut short, as no kernel sends. Not a forget's
    // (fuser answers an unparsable one with ENOSYS, so whether a reply
    // comes would depend on fuser), nor a WRITE's, SETXATTR's or IOCTL's:
    // fuser 0.18 trusts that their data is as long as the size field
    // says, and panics (an assert in its parser for WRITE and SETXATTR, a
    // slice out of bounds for IOCTL's input): its bugs, which no kernel
    // reaches, as the kernel always sends the data its size field counts.
    if !b.is_empty()
        && !matches!(op, FORGET | BATCH_FORGET | WRITE | SETXATTR | IOCTL)
        && r.chance(4)
    {
        b.truncate(r.below(b.len()));
    }
    b
}

fn xattr_name(r: &mut Rng) -> Vec<u8> {
    match r.below(8) {
        0 => Vec::new(),
        1 => b"user.".to_vec(),
        2 => b"trusted.t".to_vec(),
        3 => b"security.s".to_vec(),
        4 => b"system.posix_acl_access".to_vec(),
        5 => b"bogus.b".to_vec(),
        6 => {
            let mut n = b"user.".to_vec();
            n.extend(std::iter::repeat_n(b'x', 300));
            n
        }
        _ => vec![b'u', b's', b'e', b'r', b'.', b'a' + r.below(3) as u8],
    }
}

/// The test's end of the socket pair: the kernel's side of `/dev/fuse`.
struct Kernel {
    fd: OwnedFd,
    unique: u64,
    buf: Vec<u8>,
}

impl Kernel {
    fn send(&mut self, op: u32, node: u64, uid: u32, body: &[u8]) -> u64 {
        self.unique += 2;
        let mut h = Vec::with_capacity(40);
        u32s(&mut h, &[(40 + body.len()) as u32, op]);
        u64s(&mut h, &[self.unique, node]);
        // uid, gid, pid (0: no /proc lookup of supplementary groups),
        // total_extlen and padding.
        u32s(&mut h, &[uid, uid, 0, 0]);
        let iov = [IoSlice::new(&h), IoSlice::new(body)];
        // SAFETY: the iovecs point at live slices for the call's duration.
        let n = unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr().cast(), 2) };
        assert_eq!(
            n,
            (40 + body.len()) as isize,
            "writev: {}",
            std::io::Error::last_os_error()
        );
        self.unique
    }

    /// The next reply: (error, body). Panics if none comes in time.
    fn reply(&mut self, unique: u64, what: &str) -> (i32, Vec<u8>) {
        // SAFETY: `buf` is a live, writable buffer of its length.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                self.buf.as_mut_ptr().cast(),
                self.buf.len(),
                0,
            )
        };
        assert!(
            n >= 0,
            "no reply to {what} (unique {unique}): {} (the daemon stalled or died)",
            std::io::Error::last_os_error()
        );
        let n = n as usize;
        assert!(
            n >= 16,
            "{what}: reply of {n} bytes, shorter than its header"
        );
        let b = &self.buf[..n];
        let len = u32::from_le_bytes(b[0..4].try_into().unwrap()) as usize;
        let err = i32::from_le_bytes(b[4..8].try_into().unwrap());
        let uniq = u64::from_le_bytes(b[8..16].try_into().unwrap());
        assert_eq!(
            len, n,
            "{what}: header length {len} for a reply of {n} bytes"
        );
        assert_eq!(uniq, unique, "{what}: reply to another request");
        assert!(
            (-4095..=0).contains(&err),
            "{what}: error {err} is not a negative errno"
        );
        if err != 0 {
            assert_eq!(n, 16, "{what}: an error reply ({err}) with a body");
        }
        (err, b[16..].to_vec())
    }
}

fn socket_pair() -> (OwnedFd, OwnedFd) {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "socketpair: {}", std::io::Error::last_os_error());
    // SAFETY: both fds were just created and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Let the daemon's end send large replies, as `/dev/fuse` takes any
/// (SO_SNDBUFFORCE needs CAP_NET_ADMIN; without it the buffer stops at
/// net.core.wmem_max). Returns the largest reply the socket carries.
fn widen_send_buffer(fd: &OwnedFd) -> usize {
    let want: libc::c_int = 32 << 20;
    for opt in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
        // SAFETY: a valid socket and an int option of the size given.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&want as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            break;
        }
    }
    let mut got: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid socket; `got` and `len` are live and sized.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&mut got as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0);
    // The kernel doubles the value for its bookkeeping; keep a margin.
    // And a datagram's linear part is one kmalloc (at most 4 MiB): stay
    // at 2 MiB, twice the most a kernel's READ asks (256 pages).
    (got as usize / 2).saturating_sub(4096).min(2 << 20)
}

fn set_timeout(fd: &OwnedFd, d: Duration) {
    let tv = libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: 0,
    };
    // SAFETY: a valid socket and a timeval of the size given.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Files the unprivileged callers may read but not change, with their
/// contents.
fn plant(vfs: &Vfs) -> Vec<(&'static str, Vec<u8>)> {
    let t = vfs.root_task();
    // Sticky, as /tmp: the callers may make names here but not move or
    // remove root's.
    t.chmod("/", 0o1777).unwrap();
    t.mkdir("/vault", 0o700).unwrap();
    t.mkdir("/pub", 0o755).unwrap();
    let files = vec![
        (
            "/vault/secret",
            b"what the fuzzer must not see or change".to_vec(),
        ),
        ("/pub/keep", vec![7u8; 9000]),
    ];
    for (path, data) in &files {
        let fd = t.open(*path, O_CREAT | O_WRONLY, 0o644).unwrap();
        assert_eq!(t.write(fd, data).unwrap(), data.len());
        t.close(fd).unwrap();
    }
    t.setxattr("/pub/keep", "user.k", b"kept", 0).unwrap();
    files
}

/// The adapter serving `vfs` with `threads` request threads on a socket
/// pair, past INIT: the kernel's end, the session's thread and the
/// largest reply the socket carries.
fn start(
    vfs: &Vfs,
    threads: usize,
) -> (Kernel, std::thread::JoinHandle<std::io::Result<()>>, usize) {
    let fs = ScaleFs::new(vfs.clone(), FuseConfig::default()).expect("adapter");
    let (daemon_end, kernel_end) = socket_pair();
    let max_reply = widen_send_buffer(&daemon_end);
    set_timeout(&kernel_end, Duration::from_secs(60));
    let mut k = Kernel {
        fd: kernel_end,
        unique: 0,
        buf: vec![0u8; 32 << 20],
    };
    // INIT first: Session::from_fd reads it before returning. Protocol
    // 7.40, the kernel offering the usual capabilities (no FUSE_INIT_EXT:
    // the short SETXATTR form).
    let mut init = Vec::new();
    u32s(&mut init, &[7, 40, 128 << 10, (1 << 26) - 1 - (1 << 16)]);
    init.extend_from_slice(&[0u8; 48]);
    let u = k.send(INIT, 0, 0, &init);
    let mut cfg = Config::default();
    cfg.acl = SessionACL::All;
    cfg.n_threads = Some(threads);
    let session = Session::from_fd(fs, daemon_end, SessionACL::All, cfg).expect("handshake");
    let (err, _) = k.reply(u, "INIT");
    assert_eq!(err, 0, "INIT refused");
    let daemon = std::thread::spawn(move || session.run());
    (k, daemon, max_reply)
}

/// DESTROY to each request thread; the session must end without error.
fn stop(mut k: Kernel, daemon: std::thread::JoinHandle<std::io::Result<()>>, threads: usize) {
    // Each request thread ends at the DESTROY it reads (a kernel's
    // unmount ends them all with ENODEV, which a socket cannot give).
    for _ in 0..threads {
        let u = k.send(DESTROY, 0, 0, &[]);
        assert_eq!(k.reply(u, "DESTROY").0, 0);
    }
    drop(k);
    let ended = daemon.join().expect("a daemon thread panicked");
    assert!(ended.is_ok(), "the session ended with {ended:?}");
}

fn run(vfs: &Vfs, seed: u64, requests: u64, threads: usize) {
    let planted = plant(vfs);
    let (mut k, daemon, max_reply) = start(vfs, threads);

    let mut r = Rng(std::cell::Cell::new(seed.wrapping_mul(2) | 1));
    let mut p = Pools {
        nodes: vec![1],
        fhs: Vec::new(),
        max_reply,
    };
    let (mut ok, mut answered) = (0u64, 0u64);
    let mut per_op = std::collections::BTreeMap::new();
    for i in 0..requests {
        let op = r.pick(OPS);
        let node = p.node(&mut r);
        let uid = if r.chance(90) { USER } else { OTHER };
        let b = body(op, &mut r, &mut p);
        let u = k.send(op, node, uid, &b);
        if op == FORGET || op == BATCH_FORGET {
            // Mostly as a kernel would: a forgotten id is not used again.
            if node != 1 && r.chance(80) {
                p.nodes.retain(|&n| n != node);
            }
            continue;
        }
        if matches!(op, RELEASE | RELEASEDIR) && b.len() >= 8 && r.chance(80) {
            let fh = u64::from_le_bytes(b[0..8].try_into().unwrap());
            p.fhs.retain(|&f| f != fh);
        }
        let what = format!(
            "request {i} (seed {seed}): opcode {op} node {node} uid {uid} body {} bytes",
            b.len()
        );
        let (err, data) = k.reply(u, &what);
        answered += 1;
        *per_op.entry((op, err)).or_insert(0u64) += 1;
        if err != 0 {
            continue;
        }
        ok += 1;
        // Size promises of the replies the kernel copies out.
        if b.len() >= 20 && matches!(op, READ | READDIR | READDIRPLUS) {
            let asked = u32::from_le_bytes(b[16..20].try_into().unwrap()) as usize;
            assert!(
                data.len() <= asked,
                "{what}: {} bytes for a read of {asked}",
                data.len()
            );
        }
        if b.len() >= 4 && matches!(op, GETXATTR | LISTXATTR) {
            let asked = u32::from_le_bytes(b[0..4].try_into().unwrap()) as usize;
            if asked == 0 {
                assert_eq!(
                    data.len(),
                    8,
                    "{what}: a size query answers with fuse_getxattr_out"
                );
            } else {
                assert!(
                    data.len() <= asked,
                    "{what}: {} bytes for a buffer of {asked}",
                    data.len()
                );
            }
        }
        // Learn what was handed out.
        match op {
            LOOKUP | MKDIR | MKNOD | SYMLINK | LINK | CREATE if data.len() >= 8 => {
                p.learn_node(u64::from_le_bytes(data[0..8].try_into().unwrap()));
                if op == CREATE && data.len() >= 136 {
                    p.learn_fh(u64::from_le_bytes(data[128..136].try_into().unwrap()));
                }
            }
            OPEN | OPENDIR if data.len() >= 8 => {
                p.learn_fh(u64::from_le_bytes(data[0..8].try_into().unwrap()));
            }
            _ => {}
        }
    }
    if std::env::var_os("FUSE_FUZZ_VERBOSE").is_some() {
        eprintln!("(opcode, error) -> replies: {per_op:?}");
    }
    assert!(answered > requests / 2);
    // A fuzzer whose requests all fail tests nothing but the error paths.
    assert!(
        ok * 10 > answered,
        "only {ok} of {answered} requests succeeded"
    );

    // The daemon still serves: a lookup of a planted file, then DESTROY
    // ends the session cleanly.
    let mut lk = Vec::new();
    cstr(&mut lk, b"pub");
    let u = k.send(LOOKUP, 1, 0, &lk);
    assert_eq!(k.reply(u, "final LOOKUP").0, 0);
    stop(k, daemon, threads);

    // What the unprivileged callers could not change is unchanged.
    let t = vfs.root_task();
    for (path, data) in &planted {
        let st = t.stat(*path).unwrap_or_else(|e| panic!("{path}: {e:?}"));
        assert_eq!(st.size, data.len() as u64, "{path} changed size");
        assert_eq!(st.mode & 0o7777, 0o644, "{path} changed mode");
        assert_eq!((st.uid, st.gid), (0, 0), "{path} changed owner");
        let mut got = vec![0u8; data.len() + 1];
        let fd = t.open(*path, 0, 0).unwrap();
        let n = t.read(fd, &mut got).unwrap();
        t.close(fd).unwrap();
        assert_eq!(&got[..n], &data[..], "{path} changed content");
    }
    let mut v = [0u8; 16];
    let n = t.getxattr("/pub/keep", "user.k", &mut v).unwrap();
    assert_eq!(&v[..n], b"kept");
    // And the filesystem still works.
    t.mkdir("/after", 0o755).unwrap();
    t.rmdir("/after").unwrap();
    eprintln!(
        "fuse_request_fuzz: seed {seed}, {threads} daemon thread(s): {requests} requests, {answered} answered, {ok} succeeded"
    );
}

fn seed() -> u64 {
    env_u64("FUSE_FUZZ_SEED", 0x5eed_f05e)
}

fn requests() -> u64 {
    env_u64("FUSE_FUZZ_REQUESTS", 10_000)
}

#[test]
fn fuzzed_requests_get_well_formed_replies_and_change_nothing_they_may_not() {
    run(&Vfs::new(), seed(), requests(), 1);
}

#[test]
fn fuzzed_requests_on_two_daemon_threads() {
    run(&Vfs::new(), seed().wrapping_add(1), requests(), 2);
}

/// The same on an ext4 image, which `e2fsck -fn` then checks.
#[test]
fn fuzzed_requests_on_an_ext4_image_leave_it_consistent() {
    let Some((mkfs, base, img)) = fresh_image("fuzz", &["-b", "1024"], "32M") else {
        return;
    };
    let ext4 = open_rw(&img);
    let vfs = Vfs::with_root_fs(VfsConfig::default(), ext4.clone());
    run(&vfs, seed().wrapping_add(2), requests(), 2);
    drop(vfs);
    ext4.unmount().unwrap();
    drop(ext4);
    let out = Command::new(mkfs.with_file_name("e2fsck"))
        .arg("-fn")
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn after the fuzzed requests: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let _ = std::fs::remove_dir_all(&base);
}

fn mkfs() -> Option<&'static std::path::Path> {
    [
        "/usr/sbin/mkfs.ext4",
        "/sbin/mkfs.ext4",
        "/usr/bin/mkfs.ext4",
    ]
    .iter()
    .map(std::path::Path::new)
    .find(|p| p.exists())
}

/// A fresh `mkfs.ext4 -q -F ARGS` image of `size` in a scratch directory
/// named after `tag`: (mkfs.ext4's path, the directory, the image). None,
/// with the reason printed, without e2fsprogs.
fn fresh_image(
    tag: &str,
    args: &[&str],
    size: &str,
) -> Option<(
    &'static std::path::Path,
    std::path::PathBuf,
    std::path::PathBuf,
)> {
    let Some(mkfs) = mkfs() else {
        eprintln!("SKIPPED: mkfs.ext4 not found (e2fsprogs)");
        return None;
    };
    let base = std::env::temp_dir().join(format!("scalevfs-fuse-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let img = base.join("img");
    let out = Command::new(mkfs)
        .args(["-q", "-F"])
        .args(args)
        .arg(&img)
        .arg(size)
        .output()
        .unwrap();
    assert!(out.status.success(), "mkfs.ext4: {out:?}");
    Some((mkfs, base, img))
}

/// `img` opened read-write.
fn open_rw(img: &std::path::Path) -> std::sync::Arc<Ext4> {
    Ext4::open(
        img,
        Ext4Options {
            ro: false,
            ..Ext4Options::default()
        },
    )
    .unwrap()
}

/// (node id, offset, name) of each entry of a READDIRPLUS reply.
fn direntplus(mut b: &[u8]) -> Vec<(u64, u64, Vec<u8>)> {
    let mut out = Vec::new();
    // fuse_entry_out (128 bytes), then fuse_dirent: ino, off, namelen,
    // type, the name, padded to 8.
    while b.len() >= 152 {
        let node = u64::from_le_bytes(b[0..8].try_into().unwrap());
        let off = u64::from_le_bytes(b[136..144].try_into().unwrap());
        let namelen = u32::from_le_bytes(b[144..148].try_into().unwrap()) as usize;
        let end = 152 + namelen;
        assert!(end <= b.len(), "a direntplus cut short");
        out.push((node, off, b[152..end].to_vec()));
        b = &b[end.next_multiple_of(8).min(b.len())..];
    }
    assert!(b.is_empty(), "{} stray bytes after the entries", b.len());
    out
}

/// A READDIRPLUS that meets an unreadable directory block after some
/// entries sends those entries (as getdents(2) returns what it has): the
/// kernel takes their lookup counts and forgets them later. It used to
/// answer with the error alone, dropping entries the adapter had already
/// counted, so their nodes pinned their inodes until unmount. The next
/// READDIRPLUS, from the last entry's offset, gets the error.
#[test]
fn readdirplus_sends_the_entries_before_a_bad_block() {
    // A linear directory (no htree), so entries come in block order.
    let Some((mkfs, base, img)) =
        fresh_image("badblock", &["-b", "1024", "-O", "^dir_index"], "8M")
    else {
        return;
    };
    {
        let ext4 = open_rw(&img);
        let vfs = Vfs::with_root_fs(VfsConfig::default(), ext4.clone());
        let t = vfs.root_task();
        t.mkdir("/d", 0o755).unwrap();
        for i in 0..300 {
            let fd = t
                .open(&format!("/d/file-{i:04}"), O_CREAT | O_WRONLY, 0o644)
                .unwrap();
            t.close(fd).unwrap();
        }
        drop(t);
        drop(vfs);
        ext4.unmount().unwrap();
    }
    // Corrupt the directory's second block (its checksum then fails).
    let out = Command::new(mkfs.with_file_name("debugfs"))
        .args(["-R", "bmap /d 1"])
        .arg(&img)
        .output()
        .unwrap();
    let blk: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("debugfs bmap");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all_at(b"XXXX", blk * 1024 + 20).unwrap();
    }

    let ext4 = open_rw(&img);
    let vfs = Vfs::with_root_fs(VfsConfig::default(), ext4.clone());
    let (mut k, daemon, max_reply) = start(&vfs, 1);
    let mut b = Vec::new();
    cstr(&mut b, b"d");
    let u = k.send(LOOKUP, 1, 0, &b);
    let (err, entry) = k.reply(u, "LOOKUP d");
    assert_eq!(err, 0);
    let dir = u64::from_le_bytes(entry[0..8].try_into().unwrap());
    let mut b = Vec::new();
    u32s(&mut b, &[0o200000, 0]);
    let u = k.send(OPENDIR, dir, 0, &b);
    let (err, open) = k.reply(u, "OPENDIR d");
    assert_eq!(err, 0);
    let fh = u64::from_le_bytes(open[0..8].try_into().unwrap());
    let readdirplus = |k: &mut Kernel, off: u64| {
        let mut b = Vec::new();
        u64s(&mut b, &[fh, off]);
        u32s(&mut b, &[max_reply.min(1 << 20) as u32, 0]);
        u64s(&mut b, &[0]);
        u32s(&mut b, &[0, 0]);
        let u = k.send(READDIRPLUS, dir, 0, &b);
        k.reply(u, "READDIRPLUS d")
    };
    let (err, data) = readdirplus(&mut k, 0);
    assert_eq!(
        err, 0,
        "READDIRPLUS failed outright (errno {}) instead of sending the first block's entries",
        -err
    );
    let got = direntplus(&data);
    let named: Vec<_> = got.iter().filter(|e| e.2.starts_with(b"file-")).collect();
    assert!(
        !named.is_empty() && named.len() < 300,
        "{} of the 300 names before the bad block",
        named.len()
    );
    assert!(named.iter().all(|e| e.0 != 0));
    let last = got.last().unwrap().1;
    let (err, _) = readdirplus(&mut k, last);
    assert!(err < 0, "the bad block is reported by the next READDIRPLUS");
    // The kernel forgets what it was given; the session ends cleanly.
    let mut b = Vec::new();
    u32s(&mut b, &[named.len() as u32, 0]);
    for e in &named {
        u64s(&mut b, &[e.0, 1]);
    }
    k.send(BATCH_FORGET, 0, 0, &b);
    stop(k, daemon, 1);
    eprintln!(
        "readdirplus_sends_the_entries_before_a_bad_block: {} entries before the bad block, then errno {}",
        named.len(),
        -err
    );
    drop(vfs);
    drop(ext4);
    let _ = std::fs::remove_dir_all(&base);
}

/// A WRITE flagged FUSE_WRITE_KILL_SUIDGID (a kernel with
/// HANDLE_KILLPRIV_V2 leaves the set-id bits to the daemon) that fails
/// the size check (EFBIG past the filesystem's limit) changes no mode, as
/// Linux's generic_write_checks comes before file_remove_privs; one that
/// lands clears setuid (and keeps setgid without group-exec for a caller
/// in the file's group). The adapter used to clear them before writing.
#[test]
fn flagged_write_refused_for_size_keeps_set_id_bits() {
    let vfs = Vfs::with_config(VfsConfig {
        memfs: scalevfs::MemFsOptions {
            max_file_size: 1 << 20,
            ..Default::default()
        },
        ..Default::default()
    });
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
    t.chown("/f", USER, USER).unwrap();
    t.chmod("/f", 0o6644).unwrap();
    let mode = || t.stat("/f").unwrap().mode & 0o7777;
    let (mut k, daemon, _) = start(&vfs, 1);
    let mut b = Vec::new();
    cstr(&mut b, b"f");
    let u = k.send(LOOKUP, 1, 0, &b);
    let (err, entry) = k.reply(u, "LOOKUP f");
    assert_eq!(err, 0);
    let node = u64::from_le_bytes(entry[0..8].try_into().unwrap());
    let mut b = Vec::new();
    u32s(&mut b, &[1, 0]);
    let u = k.send(OPEN, node, USER, &b);
    let (err, open) = k.reply(u, "OPEN f O_WRONLY");
    assert_eq!(err, 0);
    let fh = u64::from_le_bytes(open[0..8].try_into().unwrap());
    const KILL_SUIDGID: u32 = 1 << 2;
    let mut write = |off: u64| {
        let mut b = Vec::new();
        u64s(&mut b, &[fh, off]);
        u32s(&mut b, &[4, KILL_SUIDGID]);
        u64s(&mut b, &[0]);
        u32s(&mut b, &[1, 0]);
        b.extend_from_slice(b"data");
        let u = k.send(WRITE, node, USER, &b);
        k.reply(u, "WRITE").0
    };
    assert_eq!(write(2 << 20), -libc::EFBIG);
    assert_eq!(
        mode(),
        0o6644,
        "a write refused for its size changed the mode"
    );
    assert_eq!(write(0), 0);
    assert_eq!(mode(), 0o2644, "a write that landed kept setuid");
    stop(k, daemon, 1);
}
