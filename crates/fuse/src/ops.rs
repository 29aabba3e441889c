//! The `fuser::Filesystem` implementation: each FUSE request becomes one or
//! two core calls made by a task carrying the caller's credentials.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fuser::{
    AccessFlags, FileHandle, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use scalevfs::{
    At, Cred, Errno, Handle, Stat, Task, Vfs, AT_EACCESS, AT_EMPTY_PATH, AT_FDCWD, AT_REMOVEDIR,
    AT_SYMLINK_NOFOLLOW, O_ACCMODE, O_ANYFD, O_APPEND, O_CLOEXEC, O_CREAT, O_DIRECTORY, O_DSYNC,
    O_EXCL, O_NOATIME, O_NOFOLLOW, O_NONBLOCK, O_RDONLY, O_SYNC, O_TRUNC, O_WRONLY,
    RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT,
};

use scalevfs_sync::ordered::{Class, Mutex};

use crate::attr::{errno, file_attr, name_bytes, raw, time_or_now};
use crate::creds::request_cred;
use crate::nodes::{Node, NodeTable};
use crate::stats::{Op, RequestStats};

/// Kernel-cache settings of a mount.
#[derive(Clone, Debug)]
pub struct FuseConfig {
    /// How long the kernel may cache attributes (`attr_valid`).
    pub attr_timeout: Duration,
    /// How long the kernel may cache a name -> inode mapping.
    pub entry_timeout: Duration,
    /// How long the kernel may cache "no such name" (0: not at all).
    pub negative_timeout: Duration,
    /// Offer READDIRPLUS (names with attributes in one reply).
    pub readdirplus: bool,
    /// Ask for FUSE_POSIX_ACL and FUSE_DONT_MASK: the kernel then checks
    /// POSIX ACLs itself (it reads them with GETXATTR; it needs
    /// `default_permissions`, which the mount sets with this) and leaves
    /// the umask to the create (the core applies it, or a directory's
    /// default ACL instead). The mount sets it whenever the kernel checks
    /// permissions.
    pub posix_acl: bool,
    /// Serve write-only opens (`O_WRONLY`: an untar, `cp`, a compiler's
    /// output) with FOPEN_DIRECT_IO: each write(2) goes to the daemon
    /// without passing through the page cache, and so without the GETXATTR
    /// of `security.capability` the kernel's cached write path sends before
    /// every write (FUSE superblocks have no SB_NOSEC): one request fewer
    /// per write. Only where the kernel grants FUSE_DIRECT_IO_ALLOW_MMAP
    /// (Linux 6.6+), whose direct writes write back and drop the cached
    /// pages of the range they write, so other opens never read stale
    /// pages. A write-only descriptor can be mapped by no one, so mmap is
    /// unaffected. `-o nodirect_wronly` turns it off.
    pub direct_write_only: bool,
    /// Offer FUSE_EXPORT_SUPPORT: a file handle (name_to_handle_at) of an
    /// inode the kernel evicted still opens (open_by_handle_at; the kernel
    /// asks LOOKUP "." on the node id). On by default; `-o noexport` turns
    /// it off, and such handles are then ESTALE once the kernel evicts the
    /// inode. The reason to turn it off is overlayfs over this mount: a
    /// copied-up file's origin is found by decoding its lower file's
    /// handle, and the dentry the kernel makes for an evicted lower inode
    /// fails the kernel's FUSE revalidation (measured on Linux 6.18, where
    /// no request reaches the daemon), which overlayfs reports as ESTALE
    /// (xfstests generic/631 under memory pressure). Without export
    /// support the origin is simply unknown to overlayfs, as on any FUSE
    /// filesystem that does not offer it. See docs/fuse-compat.md.
    pub export_handles: bool,
}

/// The default of every timeout: long, because the adapter owns the truth.
/// Every change made through the mount is one the kernel makes or is told
/// of in the reply (and invalidates itself: a write drops the cached size
/// and times, an unlink the parent's times and the target's link count, a
/// setxattr the ctime), and every change made through the library by the
/// embedding program is sent to the kernel as an invalidation (the
/// [`scalevfs::ChangeListener`] of `spawn_mount`). So the timeout is only a
/// backstop, and 1 s cost a LOOKUP or GETATTR per file again whenever a
/// program came back to a file after a second (an untar, then a build).
/// What a user gives up, and how to get the old behaviour back
/// (`-o attr_timeout=1,entry_timeout=1,negative_timeout=0`): see
/// `docs/fuse-compat.md`, "Caching".
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for FuseConfig {
    fn default() -> Self {
        FuseConfig {
            attr_timeout: DEFAULT_TIMEOUT,
            entry_timeout: DEFAULT_TIMEOUT,
            negative_timeout: DEFAULT_TIMEOUT,
            readdirplus: true,
            posix_acl: false,
            direct_write_only: true,
            export_handles: true,
        }
    }
}

/// Open flags the core understands; the rest (O_LARGEFILE, O_CLOEXEC, ...)
/// mean nothing to a daemon-side open.
const PASS_FLAGS: u32 =
    O_ACCMODE | O_APPEND | O_TRUNC | O_NONBLOCK | O_DIRECTORY | O_SYNC | O_DSYNC | O_NOATIME;

/// After the daemon opened `fd` with the caller's flags `fl`: an O_APPEND
/// open is checked as one (an append-only file opens for writing only
/// so), then the daemon's description drops O_APPEND, so that each WRITE
/// lands at the offset the kernel sends. The kernel places appends
/// itself, from the flags the caller's file has at the time of each
/// write (fcntl F_SETFL is never sent here, pwritev2 RWF_NOAPPEND and
/// mmap writeback carry their own offsets); a daemon description that
/// kept O_APPEND appended those at EOF. An append-only file keeps
/// O_APPEND (F_SETFL refuses: EPERM), so its writes still only append,
/// whatever offset comes.
fn write_at_offsets(t: &Task, fd: i32, fl: u32) {
    use scalevfs::io::{F_GETFL, F_SETFL};
    if fl & O_APPEND == 0 {
        return;
    }
    if let Ok(cur) = t.fcntl(fd, F_GETFL, 0) {
        // EPERM on an append-only file: it keeps O_APPEND.
        let _ = t.fcntl(fd, F_SETFL, u64::from(cur & !O_APPEND));
    }
}

/// How the xattr ops name a node: its own fd (an O_PATH fd), not what a
/// symlink points to.
const XATTR_AT: u32 = AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW;

/// The kernel's `__FMODE_EXEC` in FUSE_OPEN's flags: the open of execve(2)
/// (or uselib), which needs execute permission, not read.
const FMODE_EXEC: u32 = 0x20;

/// Highest inode number representable per device in node ids.
const INO_BITS: u32 = 48;

/// State shared by the request threads and the embedder's [`crate::Invalidator`].
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) vfs: Vfs,
    /// Root credentials, umask 0; owns the fd table every request shares.
    pub(crate) base: Arc<Task>,
    pub(crate) nodes: NodeTable,
    pub(crate) cfg: FuseConfig,
    /// Requests served, by operation.
    pub(crate) stats: RequestStats,
    /// Identifies this adapter in the per-thread task cache.
    id: u64,
    root_dev: u64,
    root_ino: u64,
    /// Devices other than the root's, by slot (node id bits 48..).
    /// (A leaf of the lock order: `Class::FuseDevs`.)
    other_devs: Mutex<Vec<u64>>,
    /// The session's notifier, set once mounted: for the few changes a
    /// request makes beyond what its reply tells the kernel.
    pub(crate) notifier: OnceLock<fuser::Notifier>,
    /// The kernel granted FUSE_DONT_MASK: creates carry the caller's umask
    /// for the core to apply (else the kernel applied it already).
    dont_mask: AtomicBool,
    /// Write-only opens get FOPEN_DIRECT_IO (`FuseConfig::direct_write_only`
    /// and the kernel granted FUSE_DIRECT_IO_ALLOW_MMAP).
    direct_wronly: AtomicBool,
}

static NEXT_ADAPTER: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// One task per (thread, adapter): shares the adapter's fd table, holds
    /// the credentials of the last request this thread served.
    static TASKS: RefCell<Vec<(u64, Task)>> = const { RefCell::new(Vec::new()) };
}

impl Shared {
    /// The FUSE node id of the inode `st` describes.
    pub(crate) fn nodeid(&self, st: &Stat) -> Result<u64, Errno> {
        if st.ino >= 1 << INO_BITS {
            return Err(Errno::EOVERFLOW);
        }
        if st.dev == self.root_dev {
            // The root is node 1 whatever its inode number; the inode that
            // has number 1 (if the root does not) takes the root's number.
            return Ok(if st.ino == self.root_ino {
                1
            } else if st.ino == 1 {
                self.root_ino
            } else {
                st.ino
            });
        }
        let mut devs = self.other_devs.lock();
        let slot = match devs.iter().position(|&d| d == st.dev) {
            Some(i) => i,
            None => {
                if devs.len() >= (1 << (64 - INO_BITS)) - 1 {
                    return Err(Errno::EOVERFLOW);
                }
                devs.push(st.dev);
                devs.len() - 1
            }
        };
        Ok(((slot as u64 + 1) << INO_BITS) | st.ino)
    }

    /// The node id of inode `ino` of device `dev` if the kernel holds it
    /// (no side effect: an unknown device gets no slot).
    pub(crate) fn known_nodeid(&self, dev: u64, ino: u64) -> Option<u64> {
        if ino >= 1 << INO_BITS {
            return None;
        }
        let id = if dev == self.root_dev {
            self.nodeid(&Stat {
                dev,
                ino,
                ..Default::default()
            })
            .ok()?
        } else {
            let devs = self.other_devs.lock();
            let slot = devs.iter().position(|&d| d == dev)?;
            ((slot as u64 + 1) << INO_BITS) | ino
        };
        self.nodes.contains(id).then_some(id)
    }

    /// Whether write-only opens are direct (see `FuseConfig::direct_write_only`).
    pub(crate) fn direct_wronly(&self) -> bool {
        // Relaxed: set once in init, before any request.
        self.direct_wronly.load(Ordering::Relaxed)
    }

    /// The node for a kernel node id.
    pub(crate) fn node(&self, ino: INodeNo) -> Result<Arc<Node>, fuser::Errno> {
        self.nodes.get(ino.0).ok_or(raw(libc::ESTALE))
    }

    /// Run `f` on this thread's task for this adapter with `cred`.
    pub(crate) fn with_cred<R>(&self, cred: Cred, f: impl FnOnce(&Task) -> R) -> R {
        let r = TASKS.with(move |cell| {
            let Ok(mut tasks) = cell.try_borrow_mut() else {
                return Err((cred, f));
            };
            let i = match tasks.iter().position(|(id, _)| *id == self.id) {
                Some(i) => i,
                None => {
                    tasks.push((self.id, self.base.clone_thread()));
                    tasks.len() - 1
                }
            };
            let t = &mut tasks[i].1;
            if *t.cred() != cred {
                t.set_cred(cred);
            }
            Ok(f(&tasks[i].1))
        });
        match r {
            Ok(r) => r,
            // Re-entered: a one-off task.
            Err((cred, f)) => {
                let mut t = self.base.clone_thread();
                t.set_cred(cred);
                f(&t)
            }
        }
    }

    /// The umask a create applies: the request's when the kernel left it
    /// to us (FUSE_DONT_MASK), else none (the kernel applied it).
    fn set_umask(&self, t: &Task, umask: u32) {
        // Relaxed: see `dont_mask`.
        let m = if self.dont_mask.load(Ordering::Relaxed) {
            umask
        } else {
            0
        };
        t.umask(m);
    }

    fn with_task<R>(&self, req: &Request, f: impl FnOnce(&Task) -> R) -> R {
        self.with_cred(request_cred(req.uid(), req.gid(), req.pid()), f)
    }

    /// Look `name` up in `dir` (a node's handle or an open directory fd)
    /// and count one kernel reference on the result.
    fn lookup_ref<'a>(
        &self,
        t: &Task,
        dir: impl Into<At<'a>> + Copy,
        name: &[u8],
    ) -> Result<(u64, Stat, u32), Errno> {
        // Fast path: a lock-free walk of one cached name and the shard's
        // read lock, no reference taken, for an inode the kernel knows.
        let st = t.fstatat(dir, name, AT_SYMLINK_NOFOLLOW)?;
        let id = self.nodeid(&st)?;
        if let Some(generation) = self.nodes.lookup_existing(id) {
            return Ok((id, st, generation));
        }
        let h = t.handle_at(dir, name, AT_SYMLINK_NOFOLLOW)?;
        self.adopt(h)
    }

    /// Make `h` the handle of its inode's node, or count a reference on
    /// the node that exists; returns fresh attributes and the generation.
    fn adopt(&self, h: Handle) -> Result<(u64, Stat, u32), Errno> {
        let st = h.getattr();
        let generation = h.inode().generation();
        let id = self.nodeid(&st)?;
        // Not taken (the node exists): released here, no shard lock held.
        drop(self.nodes.insert_or_ref(id, h, 1));
        Ok((id, st, generation))
    }

    /// Node `id`, which the kernel no longer holds, for a file handle it
    /// decodes (LOOKUP of "." on the node id; it then checks the
    /// generation itself, and for a directory looks up ".." to connect
    /// it): from the inode remembered when the kernel forgot the node (a
    /// file that still has a name; see `NodeTable::forgotten`), else by
    /// its number (a node id of the root filesystem is its inode number,
    /// see `nodeid`, so a persistent filesystem's handles outlive the
    /// daemon: `Filesystem::inode_by_number`; memfs declines). A directory
    /// comes back connected to the tree (`Task::handle_for_inode`), so that
    /// its ".." is its parent. Runs with root's credentials: the kernel
    /// allowed open_by_handle_at (CAP_DAC_READ_SEARCH), and finding the
    /// directory's name reads its ancestors.
    fn decode(&self, id: u64) -> Result<(u64, Stat, u32), Errno> {
        let root = self.nodes.get(1).ok_or(Errno::ESTALE)?;
        let h = self.with_cred(Cred::root(), |t| match self.nodes.forgotten(id) {
            Some(inode) => t.handle_for_inode(&root.h, inode),
            None => match self.root_ino_of(id) {
                Some(ino) => t.handle_by_number(&root.h, ino, None),
                None => Err(Errno::ESTALE),
            },
        })?;
        // Only the node asked about: another id would be a reference the
        // kernel does not expect.
        if self.nodeid(&h.getattr())? != id {
            return Err(Errno::ESTALE);
        }
        self.adopt(h)
    }

    /// The inode number of the root filesystem that node id `id` stands
    /// for (the inverse of `nodeid` on the root's device); `None` for a
    /// node id of another device.
    fn root_ino_of(&self, id: u64) -> Option<u64> {
        if id == 0 || id >= 1 << INO_BITS {
            return None;
        }
        Some(if id == 1 {
            self.root_ino
        } else if id == self.root_ino {
            1
        } else {
            id
        })
    }

    fn reply_entry(&self, reply: ReplyEntry, r: Result<(u64, Stat, u32), Errno>) {
        match r {
            Ok((id, st, generation)) => reply.entry_with_ttls(
                &self.cfg.attr_timeout,
                &self.cfg.entry_timeout,
                &file_attr(&st, id),
                node_generation(id, generation),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }
}

/// Run `f`, file I/O on the base task, on behalf of the request's
/// caller ([`scalevfs::caller`]: ext4 lets only root, or its resuid and
/// members of its resgid, take the reserved blocks). The supplementary
/// groups are read from /proc only if a check needs them (an image with
/// a resgid, a caller whose own gid is not it). Writeback with no caller
/// (uid -1) runs as the filesystem's own work.
fn as_requester<R>(req: &Request, f: impl FnOnce() -> R) -> R {
    if req.uid() == u32::MAX {
        return f();
    }
    let cred = scalevfs::Cred::user(req.uid(), req.gid());
    let pid = req.pid();
    scalevfs::caller::with_groups(&cred, &|| crate::creds::groups_of(pid), f)
}

/// The scalevfs filesystem as fuser sees it.
#[derive(Debug)]
pub struct ScaleFs {
    pub(crate) shared: Arc<Shared>,
}

impl ScaleFs {
    /// Serve the namespace of `vfs` (from its root) with these cache settings.
    pub fn new(vfs: Vfs, cfg: FuseConfig) -> Result<ScaleFs, Errno> {
        let mut base = vfs.root_task();
        // The kernel knows about changes made through the mount: this task
        // and its threads (every request's task) do not report them to the
        // change listener, which would notify the kernel from inside its own
        // request.
        base.set_quiet_changes(true);
        // The kernel applied the caller's umask already.
        base.umask(0);
        // Every file the kernel holds open is an fd in this table: lift
        // RLIMIT_NOFILE's default of 1024 to a memory-only bound.
        base.files().set_max(base.files().nr_open())?;
        let root = base.handle_at(AT_FDCWD, "/", 0)?;
        let st = root.getattr();
        let base = Arc::new(base);
        let shared = Shared {
            vfs,
            nodes: NodeTable::new(),
            cfg,
            stats: RequestStats::new(),
            // Relaxed: only uniqueness matters.
            id: NEXT_ADAPTER.fetch_add(1, Ordering::Relaxed),
            root_dev: st.dev,
            root_ino: st.ino,
            other_devs: Mutex::new(Class::FuseDevs, Vec::new()),
            notifier: OnceLock::new(),
            dont_mask: AtomicBool::new(false),
            direct_wronly: AtomicBool::new(false),
            base,
        };
        // The root's count never reaches zero (FUSE never forgets node 1).
        let taken = shared.nodes.insert_or_ref(1, root, u64::MAX / 2);
        debug_assert!(taken.is_none());
        Ok(ScaleFs {
            shared: Arc::new(shared),
        })
    }

    /// The `Vfs` this adapter serves.
    pub fn vfs(&self) -> &Vfs {
        &self.shared.vfs
    }

    /// Number of node ids the kernel currently holds.
    pub fn live_nodes(&self) -> usize {
        self.shared.nodes.len()
    }

    /// Requests served so far, by operation (see `stats.rs`).
    pub fn request_counts(&self) -> Vec<(&'static str, u64)> {
        self.shared.stats.snapshot()
    }
}

/// A per-thread buffer for reads (no allocation per request).
fn with_read_buf<R>(size: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    thread_local! {
        static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    let r = BUF.with(move |b| {
        let Ok(mut b) = b.try_borrow_mut() else {
            return Err(f);
        };
        if b.len() < size {
            b.resize(size, 0);
        }
        Ok(f(&mut b[..size]))
    });
    match r {
        Ok(r) => r,
        Err(f) => f(&mut vec![0; size]),
    }
}

/// Bit 32 of a file handle marks a write-only open served with
/// FOPEN_DIRECT_IO (`FuseConfig::direct_write_only`); the low 32 bits are
/// the fd in the shared table.
const FH_DIRECT: u64 = 1 << 32;

fn fd_of(fh: FileHandle) -> Result<i32, fuser::Errno> {
    i32::try_from(fh.0 & !FH_DIRECT).map_err(|_| raw(libc::EBADF))
}

fn off_of(offset: u64) -> Result<i64, fuser::Errno> {
    i64::try_from(offset).map_err(|_| raw(libc::EINVAL))
}

/// Largest read served at once (the kernel asks for at most max_pages).
const MAX_READ: u32 = 16 << 20;

macro_rules! tri {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(err) => return $reply.error(err),
        }
    };
}

impl fuser::Filesystem for ScaleFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Not FUSE_ATOMIC_O_TRUNC: with it the kernel hands O_TRUNC to our
        // OPEN, which runs before the kernel's own "text file busy" check
        // (handle_truncate's get_write_access), so an
        // open(O_RDONLY|O_TRUNC) of a running program truncated it and then
        // failed with ETXTBSY, and the program crashed on its next page
        // fault. Without it the kernel checks first and truncates with a
        // SETATTR (one more round trip per O_TRUNC open).
        let mut want = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_CACHE_SYMLINKS;
        if self.shared.cfg.export_handles {
            // name_to_handle_at/open_by_handle_at through the mount: the
            // kernel encodes (node id, generation) and, for a node it no
            // longer caches, looks up "." (and "..") on the node id.
            want |= InitFlags::FUSE_EXPORT_SUPPORT;
        }
        if self.shared.cfg.readdirplus {
            want |= InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO;
        }
        for bit in want.iter() {
            // A kernel without a capability simply does not get it.
            let _ = config.add_capabilities(bit);
        }
        // POSIX ACLs checked by the kernel, and the umask left to us (so
        // that a default ACL can replace it), only together.
        if self.shared.cfg.posix_acl
            && config
                .add_capabilities(InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK)
                .is_ok()
        {
            // Relaxed: written before the session serves any request.
            self.shared.dont_mask.store(true, Ordering::Relaxed);
        }
        // Direct write-only opens only where direct writes drop the cached
        // pages they overwrite (see `FuseConfig::direct_write_only`).
        if self.shared.cfg.direct_write_only
            && config
                .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
                .is_ok()
        {
            // Relaxed: written before the session serves any request.
            self.shared.direct_wronly.store(true, Ordering::Relaxed);
        }
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.shared.stats.count(Op::Lookup, 1);
        let s = &self.shared;
        let name = tri!(reply, name_bytes(name));
        if name == b"." {
            // The kernel decoding a file handle (FUSE_EXPORT_SUPPORT) for a
            // node whose inode it evicted: the node itself, from the table
            // or, if the kernel forgot it, found again (`Shared::decode`).
            let r = match s.nodes.get(parent.0) {
                // Unlinked (or a removed directory): the kernel evicted the
                // inode and its FORGET has not been served yet, so the node
                // is still here. ESTALE, as `decode` says once the node is
                // gone, and as Linux says for the handle of a deleted inode
                // (ext4_iget with EXT4_IGET_HANDLE). Answering with the node
                // opened the deleted file when the LOOKUP won the race
                // (mount_handles.rs, handles_round_trip_and_go_stale).
                Some(n) if n.h.getattr().nlink == 0 => Err(Errno::ESTALE),
                Some(n) => s.adopt(n.h.clone()),
                None => s.decode(parent.0),
            };
            return s.reply_entry(reply, r);
        }
        let dir = tri!(reply, s.node(parent));
        match s.with_task(req, |t| s.lookup_ref(t, &dir.h, name)) {
            Err(Errno::ENOENT) if !s.cfg.negative_timeout.is_zero() => {
                // A negative entry: node id 0 with an entry timeout.
                let st = Stat {
                    mode: libc::S_IFREG,
                    ..Default::default()
                };
                reply.entry_with_ttls(
                    &Duration::ZERO,
                    &s.cfg.negative_timeout,
                    &file_attr(&st, 0),
                    Generation(0),
                )
            }
            r => s.reply_entry(reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.shared.stats.count(Op::Forget, 1);
        if ino.0 != 1 {
            self.shared.nodes.forget(ino.0, nlookup);
            // The node's fd may have been the inode's last reference.
            scalevfs::flush_deferred_frees();
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.shared.stats.count(Op::Getattr, 1);
        let s = &self.shared;
        // Attributes are the same whatever handle names the inode; the node
        // fd is always there (and an fh is only a hint).
        let _ = fh;
        let node = tri!(reply, s.node(ino));
        match s.base.fstat(&node.h) {
            Ok(st) => reply.attr(&s.cfg.attr_timeout, &file_attr(&st, ino.0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.shared.stats.count(Op::Setattr, 1);
        let s = &self.shared;
        let node = tri!(reply, s.node(ino));
        let fd = &node.h;
        // A SETATTR that sets nothing is what the kernel sends for
        // chown(f, -1, -1) once HANDLE_KILLPRIV_V2 has taken the set-id
        // clearing out of it (fuse_setattr drops ATTR_KILL_SUID/SGID and
        // the mode; the ctime goes only with a writeback cache, which this
        // mount does not use): the chown runs here with no owner, which
        // clears the set-id bits of a non-directory and stamps the ctime,
        // as Linux's chown_common. (No other call sends an empty SETATTR:
        // utimensat with both times omitted returns before.)
        let chown_only = mode.is_none()
            && uid.is_none()
            && gid.is_none()
            && size.is_none()
            && atime.is_none()
            && mtime.is_none();
        // Where the kernel checks permissions (`posix_acl` is set exactly
        // then), an empty SETATTR from a caller without CAP_FSETID was
        // authorised by it: a chown(-1, -1) the kernel let through, or the
        // set-id clearing of a write-like call (fallocate's
        // file_remove_privs, sent with ATTR_FORCE whoever the caller is).
        // The core refuses a non-owner's chown that would clear set-id
        // bits, so the bits go with the daemon's credentials, by the
        // caller's groups (`kill_suid_sgid`), and the chown that stamps the
        // ctime and drops file capabilities runs as the daemon too.
        //
        // Not for any caller, though: the kernel makes no owner check on
        // a SETATTR it emptied (setattr_prepare sees no ATTR_MODE), so a
        // chown(f, -1, -1) by anyone arrives here too, and Linux refuses
        // a non-owner that (EPERM: the set-id clearing is a mode change).
        // The daemon clears the bits only for the owner or a caller who
        // may write the file (who could clear them by writing anyway, as
        // the fallocate case); anyone else's chown runs as themselves,
        // and the core says EPERM.
        let kernel_killpriv = chown_only
            && s.cfg.posix_acl
            && !caller_keeps_setid(req)
            && s.with_task(req, |t| {
                t.fstat(fd).is_ok_and(|st| st.uid == req.uid())
                    || t.faccessat(fd, "", scalevfs::W_OK, AT_EMPTY_PATH).is_ok()
            });
        let r = s.with_task(req, |t| -> Result<Stat, Errno> {
            if kernel_killpriv {
                kill_suid_sgid(s, req, fd, None);
                s.base.fchown(fd, u32::MAX, u32::MAX)?;
            } else if uid.is_some() || gid.is_some() || chown_only {
                t.fchown(fd, uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX))?;
            }
            if let Some(m) = mode {
                // After a chown the core has already cleared set-id bits the
                // kernel may ask to clear again: skip a no-op chmod then
                // (the caller may no longer be allowed one).
                let cur = t.fstat(fd)?.mode & 0o7777;
                if uid.is_none() && gid.is_none() || m & 0o7777 != cur {
                    t.fchmod(fd, m & 0o7777)?;
                }
            }
            if let Some(sz) = size {
                let sz = i64::try_from(sz).map_err(|_| Errno::EFBIG)?;
                match fh {
                    // ftruncate: the handle's access mode decides.
                    Some(h) => t.ftruncate(fd_of(h).map_err(|_| Errno::EBADF)?, sz)?,
                    // truncate(path): write permission decides.
                    None => {
                        let wfd = t.reopen(fd, O_WRONLY | O_CLOEXEC)?;
                        let r = t.ftruncate(wfd, sz);
                        let _ = t.close(wfd);
                        r?;
                    }
                }
                // Linux's do_truncate: a truncate by a caller without
                // CAP_FSETID clears the set-id bits (generic/193).
                // The reply carries the new attributes.
                if !caller_keeps_setid(req) {
                    kill_suid_sgid(s, req, fd, None);
                }
            }
            if atime.is_some() || mtime.is_some() {
                t.futimens(fd, Some([time_or_now(atime), time_or_now(mtime)]))?;
            }
            t.fstat(fd)
        });
        if size.is_some() {
            // A shrinking truncate defers the removed pages' frees: run them
            // now, before the reply, or a truncate+refill loop (stress-ng's
            // sync-file) maps new frames while the refill, pinned on another
            // thread, holds the epoch back from collecting the old ones.
            scalevfs::flush_deferred_frees();
        }
        match r {
            Ok(st) => reply.attr(&s.cfg.attr_timeout, &file_attr(&st, ino.0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.shared.stats.count(Op::Readlink, 1);
        let s = &self.shared;
        let node = tri!(reply, s.node(ino));
        match s.with_task(req, |t| t.readlinkat(&node.h, "")) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.shared.stats.count(Op::Mknod, 1);
        let s = &self.shared;
        let name = tri!(reply, name_bytes(name));
        let dir = tri!(reply, s.node(parent));
        let r = s.with_task(req, |t| {
            s.set_umask(t, umask);
            t.mknodat(&dir.h, name, mode, u64::from(rdev))?;
            s.lookup_ref(t, &dir.h, name)
        });
        s.reply_entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.shared.stats.count(Op::Mkdir, 1);
        let s = &self.shared;
        let name = tri!(reply, name_bytes(name));
        let dir = tri!(reply, s.node(parent));
        let r = s.with_task(req, |t| {
            s.set_umask(t, umask);
            t.mkdirat(&dir.h, name, mode)?;
            s.lookup_ref(t, &dir.h, name)
        });
        s.reply_entry(reply, r);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.shared.stats.count(Op::Unlink, 1);
        let s = &self.shared;
        let name = tri!(reply, name_bytes(name));
        let dir = tri!(reply, s.node(parent));
        reply_empty(reply, s.with_task(req, |t| t.unlinkat(&dir.h, name, 0)));
        // The name may have held the file's last reference.
        scalevfs::flush_deferred_frees();
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.shared.stats.count(Op::Rmdir, 1);
        let s = &self.shared;
        let name = tri!(reply, name_bytes(name));
        let dir = tri!(reply, s.node(parent));
        reply_empty(
            reply,
            s.with_task(req, |t| t.unlinkat(&dir.h, name, AT_REMOVEDIR)),
        )
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.shared.stats.count(Op::Symlink, 1);
        let s = &self.shared;
        let name = tri!(reply, name_bytes(link_name));
        let dir = tri!(reply, s.node(parent));
        let target = target.as_os_str().as_bytes();
        if target.contains(&0) {
            return reply.error(raw(libc::EINVAL));
        }
        let r = s.with_task(req, |t| {
            t.symlinkat(target, &dir.h, name)?;
            s.lookup_ref(t, &dir.h, name)
        });
        s.reply_entry(reply, r);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.shared.stats.count(Op::Rename, 1);
        let s = &self.shared;
        let name = tri!(reply, name_bytes(name));
        let newname = tri!(reply, name_bytes(newname));
        let od = tri!(reply, s.node(parent));
        let nd = tri!(reply, s.node(newparent));
        let bits = flags.bits();
        if bits & !(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) != 0 {
            return reply.error(raw(libc::EINVAL));
        }
        reply_empty(
            reply,
            s.with_task(req, |t| t.renameat2(&od.h, name, &nd.h, newname, bits)),
        )
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.shared.stats.count(Op::Link, 1);
        let s = &self.shared;
        let name = tri!(reply, name_bytes(newname));
        let node = tri!(reply, s.node(ino));
        let dir = tri!(reply, s.node(newparent));
        let r = s.with_task(req, |t| {
            t.link_fd(&node.h, &dir.h, name)?;
            s.lookup_ref(t, &dir.h, name)
        });
        s.reply_entry(reply, r);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.shared.stats.count(Op::Open, 1);
        let s = &self.shared;
        let node = tri!(reply, s.node(ino));
        let r = if flags.0 as u32 & FMODE_EXEC != 0 {
            open_for_exec(s, req, &node.h)
        } else {
            // Any fd will do (the kernel knows it as a file handle): no
            // shared fd-table lock between requests (O_ANYFD).
            let fl = (flags.0 as u32 & PASS_FLAGS) | O_CLOEXEC | O_ANYFD;
            let r = s.with_task(req, |t| {
                t.reopen(&node.h, fl)
                    .inspect(|&fd| write_at_offsets(t, fd, fl))
            });
            // O_TRUNC (only from a kernel that was offered
            // FUSE_ATOMIC_O_TRUNC; ours truncates with SETATTR) by a caller
            // without CAP_FSETID clears the set-id bits, as a truncate does.
            if r.is_ok() && fl & O_TRUNC != 0 && !caller_keeps_setid(req) {
                kill_suid_sgid(s, req, &node.h, Some(ino.0));
            }
            r
        };
        match r {
            Ok(fd) => {
                let (fh, fl) = self.handle_for(fd, flags.0 as u32);
                reply.opened(fh, fl)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.shared.stats.count(Op::Create, 1);
        let s = &self.shared;
        let name = tri!(reply, name_bytes(name));
        let dir = tri!(reply, s.node(parent));
        let fl =
            (flags as u32 & (PASS_FLAGS | O_EXCL)) | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_ANYFD;
        let r = s.with_task(req, |t| -> Result<(i32, u64, Stat, u32), Errno> {
            s.set_umask(t, umask);
            let fd = t.openat(&dir.h, name, fl, mode & 0o7777)?;
            write_at_offsets(t, fd, fl);
            // The node's handle is the open file's location: no second
            // walk, so no race with a concurrent rename.
            match t.handle_at(fd, "", AT_EMPTY_PATH).and_then(|h| s.adopt(h)) {
                Ok((id, st, generation)) => Ok((fd, id, st, generation)),
                Err(e) => {
                    let _ = t.close(fd);
                    Err(e)
                }
            }
        });
        match r {
            Ok((fd, id, st, generation)) => {
                let (fh, fl) = self.handle_for(fd, flags as u32);
                reply.created(
                    // One TTL for the name and the attributes (fuser's
                    // `created`): the shorter, so the attributes are not
                    // cached past `attr_timeout`.
                    &s.cfg.entry_timeout.min(s.cfg.attr_timeout),
                    &file_attr(&st, id),
                    node_generation(id, generation),
                    fh,
                    fl,
                )
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        self.shared.stats.count(Op::Read, 1);
        let s = &self.shared;
        let fd = tri!(reply, fd_of(fh));
        let off = tri!(reply, off_of(offset));
        let _ = req;
        // Access was checked at open: the handle's mode decides, as in the
        // kernel, so no credentials are needed here.
        with_read_buf(size.min(MAX_READ) as usize, |buf| {
            match s.base.pread(fd, buf, off) {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(errno(e)),
            }
        })
    }

    /// FUSE_COPY_FILE_RANGE: the copy stays inside scalevfs (one request
    /// instead of a read and a write per chunk through the kernel), with the
    /// core's checks (an immutable target is EPERM: the kernel cannot see
    /// chattr flags of a FUSE inode). A non-root caller's copy clears the
    /// target's set-id bits, as a write does.
    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.shared.stats.count(Op::CopyFileRange, 1);
        let s = &self.shared;
        let fd_in = tri!(reply, fd_of(fh_in));
        let fd_out = tri!(reply, fd_of(fh_out));
        let off_in = tri!(reply, off_of(offset_in));
        let off_out = tri!(reply, off_of(offset_out));
        let Ok(flags) = u32::try_from(flags.bits()) else {
            return reply.error(raw(libc::EINVAL));
        };
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if !caller_keeps_setid(req) {
            kill_suid_sgid(s, req, fd_out, Some(ino_out.0));
        }
        match as_requester(req, || {
            s.base
                .copy_file_range(fd_in, Some(off_in), fd_out, Some(off_out), len, flags)
        }) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        self.shared.stats.count(Op::Write, 1);
        let s = &self.shared;
        let fd = tri!(reply, fd_of(fh));
        let off = tri!(reply, off_of(offset));
        // A write by a caller without CAP_FSETID (HANDLE_KILLPRIV_V2). The
        // kernel does not flag direct (O_DIRECT) writes, so a write that
        // carries a real non-root caller counts as well (generic/355);
        // writeback of mmap'ed pages carries no caller. The write is
        // authorised by the handle.
        //
        // After the write, unless it failed the checks Linux makes before
        // file_remove_privs (generic_write_checks: EFBIG at the size
        // limit, a bad fd or offset, an immutable file) or wrote nothing
        // for an empty buffer: such a write changes no mode. Afterwards is
        // as safe as before: the writer holds the file open for writing,
        // so no one can exec it meanwhile (ETXTBSY).
        let r = as_requester(req, || s.base.pwrite(fd, data, off));
        let checked = match &r {
            Ok(_) => !data.is_empty(),
            Err(e) => !matches!(
                *e,
                Errno::EFBIG
                    | Errno::EINVAL
                    | Errno::EBADF
                    | Errno::EPERM
                    | Errno::ETXTBSY
                    | Errno::EISDIR
                    | Errno::EROFS
            ),
        };
        if checked {
            if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
                || (req.uid() != u32::MAX && !caller_keeps_setid(req))
            {
                kill_suid_sgid(s, req, fd, Some(ino.0));
            }
            // A direct write skipped the kernel's file_remove_privs, which
            // drops `security.capability` on every write (whoever writes,
            // as Linux's cap_inode_killpriv): the daemon does it instead.
            // (The core's own write drops only capabilities it saw set,
            // `I_FCAPS`; not those an ext4 image brought along.)
            if fh.0 & FH_DIRECT != 0 {
                drop_file_caps(s, fd, ino);
            }
        }
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    // No FLUSH: fuser's default answers ENOSYS, after which the kernel
    // sends none (fc->no_flush). Nothing is buffered in the daemon, so a
    // FLUSH had nothing to do but cost every close(2) one more round trip
    // (open+close 43 -> see `scalevfs bench-fuse`; bindfs has none either).

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.shared.stats.count(Op::Release, 1);
        let fd = tri!(reply, fd_of(fh));
        reply_empty(reply, self.shared.base.close(fd));
        // An unlinked file's last close frees its data, and pages replaced
        // by overwrites wait for the epoch too: run the deferred frees now.
        // (Only after unlinked files' closes was not enough: an overwrite
        // loop of xfstests generic/451 then grew the daemon past its 4 GiB
        // cap; the epoch's own pace does not keep up with a page retired
        // per 4 KiB written.)
        scalevfs::flush_deferred_frees();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.shared.stats.count(Op::Fsync, 1);
        let fd = tri!(reply, fd_of(fh));
        let t = &self.shared.base;
        match if datasync {
            t.fdatasync(fd)
        } else {
            t.fsync(fd)
        } {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn opendir(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.shared.stats.count(Op::Opendir, 1);
        let s = &self.shared;
        let node = tri!(reply, s.node(ino));
        let fl = (flags.0 as u32 & (O_NONBLOCK | O_NOATIME))
            | O_RDONLY
            | O_DIRECTORY
            | O_CLOEXEC
            | O_ANYFD;
        match s.with_task(req, |t| t.reopen(&node.h, fl)) {
            Ok(fd) => reply.opened(FileHandle(fd as u64), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.shared.stats.count(Op::Readdir, 1);
        let s = &self.shared;
        let fd = tri!(reply, fd_of(fh));
        let off = tri!(reply, off_of(offset));
        let t = &s.base;
        tri!(
            reply,
            t.lseek(fd, off, scalevfs::io::SEEK_SET).map_err(errno)
        );
        let dev = tri!(reply, t.fstat(fd).map_err(errno)).dev;
        let mut added = false;
        'outer: loop {
            // Small batches: what does not fit in the reply is read again
            // by the next READDIR (from its cookie); 128 read a third more
            // entries than were sent (listing 10,000 names: 4.2 -> 3.6 ms).
            // An error after some entries sends those, as getdents(2)
            // does; the next READDIR meets the error again.
            let batch = match t.getdents(fd, 32) {
                Ok(b) => b,
                Err(_) if added => break,
                Err(e) => return reply.error(errno(e)),
            };
            if batch.is_empty() {
                break;
            }
            added = true;
            for e in batch {
                let id = s
                    .nodeid(&Stat {
                        dev,
                        ino: e.ino,
                        ..Default::default()
                    })
                    .unwrap_or(e.ino);
                let kind = crate::attr::fuse_type(e.file_type);
                if reply.add(INodeNo(id), e.next_cookie, kind, OsStr::from_bytes(&e.name)) {
                    break 'outer;
                }
            }
        }
        let _ = ino;
        reply.ok();
    }

    fn readdirplus(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.shared.stats.count(Op::Readdirplus, 1);
        let s = &self.shared;
        let fd = tri!(reply, fd_of(fh));
        let off = tri!(reply, off_of(offset));
        let r = s.with_task(req, |t| -> Result<(), Errno> {
            t.lseek(fd, off, scalevfs::io::SEEK_SET)?;
            // Entries already added are counted lookups: an error after
            // them must still send them (as getdents(2) returns what it
            // has), or the kernel never forgets those counts and the
            // nodes pin their inodes until unmount.
            let mut added = false;
            loop {
                let batch = match t.getdents(fd, 64) {
                    Ok(b) => b,
                    Err(_) if added => return Ok(()),
                    Err(e) => return Err(e),
                };
                if batch.is_empty() {
                    return Ok(());
                }
                for e in batch {
                    let name = OsStr::from_bytes(&e.name);
                    let dots = e.name == b"." || e.name == b"..";
                    // "." and ".." are never linked by the kernel (and so
                    // never counted); other names are looked up, counted,
                    // and uncounted if they do not fit.
                    let looked = if dots {
                        t.fstatat(fd, &e.name, AT_SYMLINK_NOFOLLOW)
                            .and_then(|st| Ok((s.nodeid(&st)?, st, 0)))
                    } else {
                        s.lookup_ref(t, fd, &e.name)
                    };
                    let (id, st, generation, counted) = match looked {
                        Ok((id, st, generation)) => (id, st, generation, !dots),
                        // Gone meanwhile: skip it.
                        Err(Errno::ENOENT) => continue,
                        // No attributes for it (search permission): node
                        // id 0 tells the kernel not to link it.
                        Err(_) => {
                            let st = Stat {
                                mode: e.file_type.mode_bits(),
                                ..Default::default()
                            };
                            (0, st, 0, false)
                        }
                    };
                    let full = reply.add(
                        INodeNo(id),
                        e.next_cookie,
                        name,
                        // One TTL for both, as `create`'s: the shorter.
                        &s.cfg.entry_timeout.min(s.cfg.attr_timeout),
                        &file_attr(&st, id),
                        node_generation(id, generation),
                    );
                    if full {
                        if counted {
                            s.nodes.forget(id, 1);
                        }
                        return Ok(());
                    }
                    added = true;
                }
            }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.shared.stats.count(Op::Releasedir, 1);
        let fd = tri!(reply, fd_of(fh));
        reply_empty(reply, self.shared.base.close(fd));
        // An unlinked file's last close frees its data, and pages replaced
        // by overwrites wait for the epoch too: run the deferred frees now.
        // (Only after unlinked files' closes was not enough: an overwrite
        // loop of xfstests generic/451 then grew the daemon past its 4 GiB
        // cap; the epoch's own pace does not keep up with a page retired
        // per 4 KiB written.)
        scalevfs::flush_deferred_frees();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Counted as FSYNC (it is one).
        self.fsync(_req, _ino, fh, datasync, reply)
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.shared.stats.count(Op::Statfs, 1);
        let s = &self.shared;
        let node = tri!(reply, s.node(ino));
        match s.base.fstatfs(&node.h) {
            Ok(f) => reply.statfs(
                f.blocks,
                f.bfree,
                f.bavail,
                f.files,
                f.ffree,
                u32::try_from(f.bsize).unwrap_or(4096),
                u32::try_from(f.namelen).unwrap_or(255),
                u32::try_from(f.frsize).unwrap_or(4096),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.shared.stats.count(Op::Access, 1);
        let s = &self.shared;
        let node = tri!(reply, s.node(ino));
        let mode = (mask.bits() & 7) as u32;
        reply_empty(
            reply,
            s.with_task(req, |t| t.faccessat(&node.h, "", mode, AT_EMPTY_PATH)),
        )
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.shared.stats.count(Op::Fallocate, 1);
        let fd = tri!(reply, fd_of(fh));
        let off = tri!(reply, off_of(offset));
        let len = tri!(reply, off_of(length));
        let mode = tri!(
            reply,
            u32::try_from(mode).map_err(|_| raw(libc::EOPNOTSUPP))
        );
        // The handle was opened for writing (checked by the core): no
        // credentials needed, as for write.
        let s = &self.shared;
        let r = as_requester(req, || s.base.fallocate(fd, mode, off, len));
        // Linux's file_modified: set-id bits go as on a write (generic/683,
        // 684).
        if r.is_ok() && req.uid() != u32::MAX && !caller_keeps_setid(req) {
            kill_suid_sgid(s, req, fd, Some(ino.0));
        }
        // Out of space part way, ext4 keeps what it allocated and the size
        // grows over it (the kernel's ext4 does), but the kernel updates
        // its cached attributes only after a fallocate that succeeded:
        // it forgets them here (attributes only, -1), else `stat` shows
        // the old size and blocks until they time out.
        if r == Err(Errno::ENOSPC) {
            if let Some(n) = s.notifier.get() {
                let _ = n.inval_inode(ino, -1, 0);
            }
        }
        // A hole punch, collapse or zero range defers frees: run them before
        // the reply (as truncate, in setattr).
        if mode != 0 {
            scalevfs::flush_deferred_frees();
        }
        reply_empty(reply, r)
    }

    /// FS_IOC_GETFLAGS / FS_IOC_SETFLAGS (chattr) and FS_IOC_FSGETXATTR /
    /// FS_IOC_FSSETXATTR (the same four flags as `fsx_xflags`; the kernel's
    /// fileattr code asks FSGETXATTR before every SETFLAGS), with the
    /// caller's credentials (setflags checks owner and CAP_LINUX_IMMUTABLE).
    /// Other commands: ENOTTY.
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.shared.stats.count(Op::Ioctl, 1);
        // FS_IOC_{GET,SET}FLAGS and their 32-bit twins (the argument is an
        // int either way), FS_IOC_FS{GET,SET}XATTR (struct fsxattr, 28 bytes).
        const GET: [u32; 2] = [0x8008_6601, 0x8004_6601];
        const SET: [u32; 2] = [0x4008_6602, 0x4004_6602];
        const FSGETXATTR: u32 = 0x801c_581f;
        const FSSETXATTR: u32 = 0x401c_5820;
        // (FS_*_FL, FS_XFLAG_*): immutable, append, nodump, noatime.
        const XMAP: [(u32, u32); 4] = [(0x10, 0x8), (0x20, 0x10), (0x40, 0x80), (0x80, 0x40)];
        let fd = tri!(reply, fd_of(fh));
        let s = &self.shared;
        let get = || s.with_task(req, |t| t.ioctl_getflags(fd)).map_err(errno);
        // The change sets the ctime, which no reply carries: the kernel
        // forgets the attributes it cached (else `stat` shows the old
        // ctime until they time out; generic/277). Attributes only (-1).
        let set = |v: u32| {
            s.with_task(req, |t| t.ioctl_setflags(fd, v))
                .map_err(errno)?;
            if let Some(n) = s.notifier.get() {
                let _ = n.inval_inode(ino, -1, 0);
            }
            Ok(())
        };
        let word = |d: &[u8]| {
            d.get(..4)
                .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        };
        let out = |b: &[u8]| b.len().min(out_size as usize);
        if GET.contains(&cmd) {
            let b = tri!(reply, get()).to_ne_bytes();
            reply.ioctl(0, &b[..out(&b)]);
        } else if SET.contains(&cmd) {
            let v = tri!(reply, word(in_data).ok_or(raw(libc::EINVAL)));
            tri!(reply, set(v));
            reply.ioctl(0, &[]);
        } else if cmd == FSGETXATTR {
            let fl = tri!(reply, get());
            let x = XMAP
                .iter()
                .filter(|(f, _)| fl & f != 0)
                .fold(0u32, |a, (_, x)| a | x);
            let mut b = [0u8; 28];
            b[..4].copy_from_slice(&x.to_ne_bytes());
            reply.ioctl(0, &b[..out(&b)]);
        } else if cmd == FSSETXATTR {
            let x = tri!(reply, word(in_data).ok_or(raw(libc::EINVAL)));
            let known = XMAP.iter().fold(0u32, |a, (_, x)| a | x);
            // fsx_extsize (4), fsx_projid (12), fsx_cowextsize (16): none
            // is stored, so a value other than 0 is EOPNOTSUPP, as on
            // tmpfs (fileattr_has_fsx) and ext4 without the project
            // feature; fsx_nextents (8) is output only.
            let unstored = [4, 12, 16]
                .iter()
                .any(|&o| in_data.get(o..).and_then(word).is_some_and(|v| v != 0));
            if x & !known != 0 || unstored {
                return reply.error(raw(libc::EOPNOTSUPP));
            }
            let fl = XMAP
                .iter()
                .filter(|(_, xf)| x & xf != 0)
                .fold(0u32, |a, (f, _)| a | f);
            tri!(reply, set(fl));
            reply.ioctl(0, &[]);
        } else {
            reply.error(raw(libc::ENOTTY));
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.shared.stats.count(Op::Lseek, 1);
        let fd = tri!(reply, fd_of(fh));
        let whence = tri!(reply, u32::try_from(whence).map_err(|_| raw(libc::EINVAL)));
        match self.shared.base.lseek(fd, offset, whence) {
            Ok(p) => reply.offset(p as i64),
            Err(e) => reply.error(errno(e)),
        }
    }

    // ---- extended attributes: the core's *xattrat on the node's fd ----

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.shared.stats.count(Op::Getxattr, 1);
        let s = &self.shared;
        let node = tri!(reply, s.node(ino));
        // The kernel asks with size 0 for the length, then with a buffer;
        // it never asks for more than XATTR_SIZE_MAX.
        let size = (size as usize).min(scalevfs::xattr::XATTR_SIZE_MAX);
        let r = s.with_task(req, |t| {
            let mut buf = vec![0u8; size];
            t.getxattrat(&node.h, "", XATTR_AT, name.as_bytes(), &mut buf)
                .map(|n| (buf, n))
        });
        match r {
            Ok((_, n)) if size == 0 => reply.size(n as u32),
            Ok((buf, n)) => reply.data(&buf[..n]),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.shared.stats.count(Op::Setxattr, 1);
        let s = &self.shared;
        let node = tri!(reply, s.node(ino));
        let flags = tri!(reply, u32::try_from(flags).map_err(|_| raw(libc::EINVAL)));
        reply_empty(
            reply,
            s.with_task(req, |t| {
                t.setxattrat(&node.h, "", XATTR_AT, name.as_bytes(), value, flags)
            }),
        );
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.shared.stats.count(Op::Listxattr, 1);
        let s = &self.shared;
        let node = tri!(reply, s.node(ino));
        let size = (size as usize).min(scalevfs::xattr::XATTR_LIST_MAX);
        let r = s.with_task(req, |t| {
            let mut buf = vec![0u8; size];
            t.listxattrat(&node.h, "", XATTR_AT, &mut buf)
                .map(|n| (buf, n))
        });
        match r {
            Ok((_, n)) if size == 0 => reply.size(n as u32),
            Ok((buf, n)) => reply.data(&buf[..n]),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.shared.stats.count(Op::Removexattr, 1);
        let s = &self.shared;
        let node = tri!(reply, s.node(ino));
        // The kernel's killpriv: a write, truncate or fallocate by a user
        // without CAP_FSETID drops the file's `security.capability`
        // (file_remove_privs -> cap_inode_killpriv, which skips the
        // CAP_SETFCAP a removexattr(2) needs). Through FUSE it reaches us
        // as that user's REMOVEXATTR, which the core's rules refuse
        // (EPERM: xfstests generic/688). A user who may write the file can
        // drop the capability by writing it anyway, so for such a user the
        // removal is done with the daemon's credentials. (A direct
        // removexattr(2) of it by such a user therefore succeeds here,
        // where a local Linux filesystem says EPERM: FUSE does not tell
        // the two apart.)
        if name.as_bytes() == b"security.capability" && req.uid() != 0 {
            let may_write = s
                .with_task(req, |t| {
                    t.faccessat(&node.h, "", scalevfs::W_OK, AT_EMPTY_PATH)
                })
                .is_ok();
            if may_write {
                return reply_empty(
                    reply,
                    s.base.removexattrat(&node.h, "", XATTR_AT, name.as_bytes()),
                );
            }
        }
        reply_empty(
            reply,
            s.with_task(req, |t| {
                t.removexattrat(&node.h, "", XATTR_AT, name.as_bytes())
            }),
        );
    }
}

impl ScaleFs {
    /// The file handle and open flags for a file opened as `fd` with the
    /// kernel's open flags `flags`: a write-only open is direct when the
    /// mount serves them so (`FuseConfig::direct_write_only`).
    fn handle_for(&self, fd: i32, flags: u32) -> (FileHandle, FopenFlags) {
        let fh = fd as u32 as u64;
        if flags & O_ACCMODE == O_WRONLY && self.shared.direct_wronly() {
            (
                FileHandle(fh | FH_DIRECT),
                self.fopen_flags() | FopenFlags::FOPEN_DIRECT_IO,
            )
        } else {
            (FileHandle(fh), self.fopen_flags())
        }
    }

    fn fopen_flags(&self) -> FopenFlags {
        // No FLUSH on close: the daemon buffers nothing, so a FLUSH has no
        // work (the adapter does not implement it; after the first ENOSYS
        // the kernel stops sending them anyway). With FOPEN_NOFLUSH (Linux
        // 5.16+; older kernels ignore the bit) close(2) also skips the
        // kernel's own flush path (write_inode_now, waiting for writes in
        // flight under the inode lock), which without a writeback cache
        // has nothing to write: data reached the daemon at write(2).
        let noflush = FopenFlags::FOPEN_NOFLUSH;
        // With attribute caching on, keep the page cache across opens: the
        // kernel is told about changes behind its back (Invalidator).
        if self.shared.cfg.attr_timeout.is_zero() {
            noflush
        } else {
            noflush | FopenFlags::FOPEN_KEEP_CACHE
        }
    }
}

/// Clear setuid, and setgid with group-exec (or outside the caller's
/// groups), of the regular file open at `fd`, as Linux does on a write,
/// truncate or fallocate by a caller without CAP_FSETID. Done with the daemon's own credentials: the change is
/// authorised by the write or truncate it goes with.
///
/// The kernel keeps the mode it has cached (a write's or an open's reply
/// carries no attributes), so where `tell` names the node it is told to
/// drop the node's cached attributes. Attributes only (offset -1): no page
/// is touched, so this cannot wait on the pages the request's own caller
/// holds locked.
fn kill_suid_sgid<'a>(s: &Shared, req: &Request, fd: impl Into<At<'a>> + Copy, tell: Option<u64>) {
    // The core clears them under the file's data lock (a mode read here
    // and stored whole, as this did, could undo a chmod racing it from
    // another thread of the embedding program); setgid by the caller's
    // groups (Linux's setattr_should_drop_sgid, generic/683, 684).
    let writer = request_cred(req.uid(), req.gid(), req.pid());
    if s.base.remove_privs_for(fd, &writer) == Ok(true) {
        if let (Some(id), Some(n)) = (tell, s.notifier.get()) {
            let _ = n.inval_inode(INodeNo(id), -1, 0);
        }
    }
}

/// Drop the file capabilities (`security.capability`) of the file open at
/// `fd`, as Linux does on every write (`file_remove_privs`); tell the kernel
/// its cached attributes (ctime) are stale if there were any. The common
/// case, a file without them, is one in-process lookup (a read: a removal
/// that finds nothing would still open a journal handle on ext4).
fn drop_file_caps(s: &Shared, fd: i32, ino: INodeNo) {
    const CAPS: &[u8] = b"security.capability";
    if s.base
        .getxattrat(fd, "", AT_EMPTY_PATH, CAPS, &mut [])
        .is_err()
    {
        return;
    }
    if s.base.removexattrat(fd, "", AT_EMPTY_PATH, CAPS).is_ok() {
        if let Some(n) = s.notifier.get() {
            let _ = n.inval_inode(ino, -1, 0);
        }
    }
}

/// Whether the caller of `req` may keep set-id bits across a write or
/// truncate (CAP_FSETID). fuser passes neither the capability nor the
/// kernel's FATTR_KILL_SUIDGID / FUSE_OPEN_KILL_SUIDGID flags, so root
/// stands for the capability (as for every other privilege the core
/// grants).
fn caller_keeps_setid(req: &Request) -> bool {
    req.uid() == 0
}

/// The open of execve(2): the caller needs execute permission (effective
/// ids, as Linux's `may_open` with `MAY_EXEC`), not read permission, yet the
/// kernel reads the program through the handle, so the handle is opened
/// read-only by the daemon's own (root) task once the check has passed.
///
/// To switch to the core's open-for-exec entry point once it exists: the
/// whole body becomes one `t.reopen_exec(fd)`-style call on the caller's
/// task.
fn open_for_exec(s: &Shared, req: &Request, fd: &Handle) -> Result<i32, Errno> {
    s.with_task(req, |t| {
        t.faccessat(fd, "", libc::X_OK as u32, AT_EMPTY_PATH | AT_EACCESS)
    })?;
    if s.base.fstat(fd)?.mode & libc::S_IFMT != libc::S_IFREG {
        return Err(Errno::EACCES);
    }
    s.base.reopen(fd, O_RDONLY | O_CLOEXEC)
}

/// Answer an operation that returns nothing but success or an errno.
fn reply_empty(reply: ReplyEmpty, r: Result<(), scalevfs::Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

/// The generation a reply gives node `id`: the root node (1) has 0 for the
/// kernel, which forces it so and logs "root generation should be zero"
/// when told another (a LOOKUP of ".." while it decodes a handle,
/// `fuse_get_parent`, or any entry that names the root).
fn node_generation(id: u64, generation: u32) -> Generation {
    Generation(if id == 1 { 0 } else { u64::from(generation) })
}
