//! `Ext4`: an ext4 filesystem over a [`BlockDevice`], as a `scalevfs`
//! [`Filesystem`]: the read side here (and the commit, `Ext4::commit`);
//! the write side in `write.rs` (names), `extent_write.rs` (data),
//! `xattr_write.rs`, `xattr_cache.rs` and `ea_inode.rs` (attributes),
//! `alloc.rs`, `bufcache.rs`, `txn.rs` (handles), `orphan.rs` and
//! `orphan_list.rs` (orphans); `open.rs` opens an image (replaying its
//! journal first).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, OnceLock, Weak};

use scalevfs::fstype::{Filesystem, NewNode};
use scalevfs::inode::Inode;
use scalevfs::types::{Attr, DirEntry, FileType, SetAttr, StatFs};
use scalevfs::{Errno, VfsResult};

use crossbeam_utils::CachePadded;
use scalevfs_sync::ordered::{Class, Mutex as OMutex, MutexGuard, RwLock as ORwLock};
use scalevfs_sync::primitive::{AtomicBool, AtomicU64, Ordering};

use crate::alloc::{Alloc, Io};
use crate::bufcache::BufCache;
use crate::device::BlockDevice;
use crate::error::{corrupt, Error, Result};
use crate::format::dir::{self, Entry};
use crate::format::extent;
use crate::format::features::*;
use crate::format::group_desc::{self, GroupDesc};
use crate::format::htree;
use crate::format::inode::{self, RawInode};
use crate::format::superblock::{
    self, SbUpdate, Superblock, FLAG_UNSIGNED_HASH, SB_OFFSET, SB_SIZE, STATE_ERROR, STATE_VALID,
};
use crate::format::xattr;
use crate::txn::{
    current_tid, Committer, CommitterMark, Handle, Journal, LogSink, OrphanDisk, OrphanList,
    Sharded, PIPELINE_ALWAYS, PIPELINE_AUTO, PIPELINE_NEVER,
};
use crate::util::{now, BlockBuf};
use scalevfs_orphan::OrphanSlot;

/// `statfs` f_type of ext2/3/4.
pub const EXT4_SUPER_MAGIC: u64 = 0xEF53;

/// What opening an image whose journal needs recovery does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Replay {
    /// Refuse the image ("the journal needs recovery ...").
    #[default]
    Refuse,
    /// Replay into an overlay in memory: the filesystem reads the
    /// recovered state, the device is never written.
    InMemory,
    /// Replay onto the device (which must be writable), flush, mark the
    /// journal empty and clear needs_recovery, as e2fsck and the kernel do.
    OnDevice,
}

/// How an image is opened.
#[derive(Clone, Debug)]
pub struct Ext4Options {
    /// Device number reported in `stat` (the root filesystem of a `Vfs` is 1).
    pub dev: u64,
    /// Inodes kept alive by the cache beyond those the VFS holds.
    pub inode_cache: usize,
    /// An image whose journal needs recovery: refused (the default),
    /// replayed in memory, or replayed on the device (journal/mod.rs).
    pub replay: Replay,
    /// Read-only (the default). `false` mounts read-write: the image must
    /// be clean (journal needing no recovery, state valid) and use no
    /// feature the writer does not keep.
    pub ro: bool,
    /// Metadata blocks the write-back cache holds (read-write only).
    pub buffer_cache: usize,
    /// Read-write with a journal in the image: write through it (jbd2,
    /// data=ordered; the default). `false` writes in place as before, so
    /// the image is consistent only after sync/unmount.
    pub journal: bool,
    /// Seconds between the commit thread's commits (jbd2's commit
    /// interval, 5 s by default); 0 turns the thread off (commits happen
    /// at fsync, sync, unmount and when a transaction grows large).
    pub commit_interval: u64,
    /// How a journaled mount records inodes whose last name went, so that
    /// a crash before they are freed does not leak them (seed 002).
    pub orphans: OrphanMode,
    /// How `Ext4::open` writes a read-write image file (not used by
    /// `Ext4::open_device`, which is given its device).
    pub io: IoMode,
}

/// How [`Ext4::open`](crate::Ext4::open) reaches an image file opened
/// read-write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoMode {
    /// Mapped into memory, allocated 1 MiB at a time on first write
    /// ([`MmapDevice::open_lazy`](crate::MmapDevice::open_lazy)), when it
    /// is a regular file on tmpfs, ext4 or XFS, where `fallocate` reserves
    /// the space a later write through the mapping needs; `pread`/`pwrite`
    /// otherwise (block devices, other host filesystems, read-only).
    #[default]
    Auto,
    /// `pread`/`pwrite` always ([`FileDevice`](crate::FileDevice)): every
    /// write takes the image file's inode lock in the host kernel, which
    /// serialises writers, but a host that truncates the file under us
    /// gives errors rather than SIGBUS.
    Pwrite,
}

/// Where a journaled mount records inodes whose last name went (until
/// they are freed). Whatever the mode, a read-write journaled mount frees
/// what a crash left in the orphan file and on the orphan list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OrphanMode {
    /// The orphan file when the image has one, else the list (the
    /// kernel's choice).
    #[default]
    Auto,
    /// The orphan file (`COMPAT_ORPHAN_FILE`): slots claimed without a
    /// shared lock (seed 002's "after"). An image without one is refused.
    File,
    /// The orphan list (`s_last_orphan`, chained through `i_dtime`) under
    /// one mutex (seed 002's "before").
    List,
    /// No record (seed 002's "none", for benchmarks): a crash leaks the
    /// inodes until e2fsck frees them.
    None,
}

impl std::str::FromStr for OrphanMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<OrphanMode, String> {
        match s {
            "auto" => Ok(OrphanMode::Auto),
            "file" => Ok(OrphanMode::File),
            "list" => Ok(OrphanMode::List),
            "none" => Ok(OrphanMode::None),
            _ => Err(format!("orphan={s}: expected auto, file, list or none")),
        }
    }
}

impl Default for Ext4Options {
    fn default() -> Self {
        Ext4Options {
            dev: 1,
            inode_cache: 4096,
            replay: Replay::Refuse,
            ro: true,
            buffer_cache: 8192,
            journal: true,
            commit_interval: 5,
            orphans: OrphanMode::Auto,
            io: IoMode::Auto,
        }
    }
}

/// What an ext4 inode carries as the VFS inode's private data.
#[derive(Debug)]
pub struct Ext4Inode {
    /// The on-disk inode as last read or written (a read-write mount
    /// changes it under this lock, held only to copy or replace it).
    raw: OMutex<RawInode>,
    /// A fast symlink's target (symlinks never change).
    link: Option<Box<[u8]>>,
    /// A directory's blocks (read-write mounts): exclusive to change them,
    /// shared for lookup and readdir, so a reader never sees an index
    /// that points past the size of the inode copy it holds.
    pub(crate) dir_lock: ORwLock<()>,
    /// A regular file's extent tree (read-write mounts): exclusive while
    /// it changes, shared for reads, so a reader never follows a freed
    /// tree block.
    pub(crate) data: ORwLock<()>,
    /// Set when the inode's last name goes (journaled mounts): its drop
    /// (the VFS let go of it) tells the filesystem, which then frees it
    /// in the next handle instead of at the next commit.
    pub(crate) on_drop: OnceLock<(u32, Arc<Sharded<u32>>)>,
    /// The commit that carries this inode's last change (journaled
    /// mounts; 0: none since mount): what an fsync of it waits for.
    pub(crate) last_tid: AtomicU64,
    /// A block-mapped (ext2/3-style) regular file, whose size limit is
    /// `Ext4::bitmap_max_size`. Fixed for the inode's life: such a file
    /// stays block-mapped (as in the kernel's ext4), an inline file moves
    /// to extents.
    mapped: bool,
    /// A regular file whose data may live in its inode (the kernel's
    /// `EXT4_STATE_MAY_INLINE_DATA`, also in memory only): an inline file
    /// as read, or one created empty by this mount on an inline_data
    /// image; cleared when its data moves to blocks. Writes that end
    /// within the inline room then go into the inode (`inline_write`).
    /// Relaxed: read and changed under the data lock held exclusive
    /// (set once before the inode is handed out); a stale read outside
    /// it only picks between two valid layouts.
    pub(crate) may_inline: AtomicBool,
    /// A COLLAPSE_RANGE or INSERT_RANGE is under way (`Ext4::reshaping`),
    /// which may take several handles (a large range punched first, a
    /// tree shifted a leaf per handle): readers wait for it to end
    /// (`file_read_settled`), as the kernel's wait on `invalidate_lock`,
    /// so none sees the range punched but not yet shifted or the file
    /// half shifted. Relaxed: set and cleared under the data lock held
    /// exclusive, read under it held shared.
    pub(crate) reshaping: AtomicBool,
}

impl Drop for Ext4Inode {
    fn drop(&mut self) {
        if let Some((ino, q)) = self.on_drop.get() {
            q.mine().lock().push(*ino);
        }
    }
}

impl Ext4Inode {
    /// A copy of the on-disk inode.
    pub fn raw(&self) -> RawInode {
        self.raw.lock().clone()
    }

    /// Set the ctime (and with `mtime` the mtime) to `t`, no other field
    /// (a directory gaining a name under its shared lock, a renamed inode:
    /// `Ext4::advance_times`).
    pub(crate) fn advance_times(&self, t: (i64, i64), mtime: bool) {
        {
            let mut r = self.raw.lock();
            if mtime {
                r.mtime = t;
            }
            r.ctime = t;
        }
        self.note_tid();
    }

    pub(crate) fn set_raw(&self, r: RawInode) {
        *self.raw.lock() = r;
        self.note_tid();
    }

    /// This inode's last change is in the running transaction.
    fn note_tid(&self) {
        let t = current_tid();
        if t > 0 {
            // Relaxed: read by fsync after the change it follows returned
            // (program order, or the caller's own synchronisation).
            self.last_tid.fetch_max(t, Ordering::Relaxed);
        }
    }
}

/// Where a logical block of a file lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// `count` blocks from physical block `pblk` (`uninit`: read as zeros).
    Data { pblk: u64, count: u64, uninit: bool },
    /// `count` blocks of hole.
    Hole { count: u64 },
}

/// One step of `map_extent`: the answer, or the child node to search
/// next (its block, its depth, the end of its range).
enum MapStep {
    Found(Mapping),
    Child(u64, u16, u64),
}

/// Search the extent node `b` (header `h`, checked) for logical block
/// `key`, in a node whose range ends at `limit` (exclusive).
fn map_in_node(
    b: &[u8],
    h: extent::Header,
    key: u64,
    limit: u64,
    what: &dyn Fn() -> String,
    fs_blocks: u64,
) -> Result<MapStep> {
    let n = usize::from(h.entries);
    let pos = extent::search(b, n, key);
    // Where the next entry starts (an extent's first block sits where an
    // index's does): the end of what entry `pos - 1` covers. Entries past
    // `key` and the parent's bound both lie past `key`.
    let next = if pos < n {
        u64::from(extent::index_at(b, pos).block).min(limit)
    } else {
        limit
    };
    if h.depth == 0 {
        if pos > 0 {
            let e = extent::extent_at(b, pos - 1);
            let end = u64::from(e.block) + u64::from(e.len);
            if key < end {
                extent::check_extent(&e, what, fs_blocks)?;
                return Ok(MapStep::Found(Mapping::Data {
                    pblk: e.start + (key - u64::from(e.block)),
                    count: end.min(limit).saturating_sub(key).max(1),
                    uninit: e.uninit,
                }));
            }
        }
        return Ok(MapStep::Found(Mapping::Hole {
            count: next.saturating_sub(key).max(1),
        }));
    }
    if pos == 0 {
        return Ok(MapStep::Found(Mapping::Hole {
            count: next.saturating_sub(key).max(1),
        }));
    }
    let ix = extent::index_at(b, pos - 1);
    extent::check_index(&ix, what, fs_blocks)?;
    Ok(MapStep::Child(ix.leaf, h.depth - 1, next))
}

/// A visit of a directory leaf block (logical number, bytes, how it was
/// read) that may return what it looked for (`Ext4::htree_search`).
pub(crate) type LeafVisit<'a, T> = dyn FnMut(u32, &[u8], &MetaRead) -> Result<Option<T>> + 'a;

/// How a metadata block was read (`Ext4::read_meta`): where it lies and,
/// for a copy from the buffer cache, its generation and whether a reader
/// verified that generation's checksum already (the kernel's
/// `buffer_verified`): a directory block read again unchanged is not
/// checked again.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MetaRead {
    pub(crate) pblk: u64,
    gen: Option<u64>,
    pub(crate) verified: bool,
}

/// Shards of the inode cache.
const ICACHE_SHARDS: usize = 16;

struct InodeCache {
    map: HashMap<u32, Weak<Inode>>,
    /// Recently used inodes kept alive (bounded), with their numbers, so
    /// that finding one (`forget_inode`) compares numbers side by side
    /// instead of following a pointer per entry.
    recent: VecDeque<(u32, Arc<Inode>)>,
    /// Map size after the last sweep of dead entries.
    swept: usize,
    /// `iget`s of this shard between their miss and their insert (they
    /// read the inode with no lock held).
    loading: usize,
    /// Bumped by every `forget_inode` of this shard.
    forget_gen: u64,
    /// The inodes forgotten while some `iget` was loading, with the
    /// `forget_gen` of their forget: a load that started before it read a
    /// copy from before the unlink and must read again, not insert a stale
    /// inode (one that still has its name's link and its freed blocks).
    /// Emptied whenever no load is in flight, so it holds only the forgets
    /// that overlap loads.
    forgot: HashMap<u32, u64>,
}

/// An ext4 filesystem (read-only unless opened with `ro: false`).
pub struct Ext4 {
    pub(crate) dev: Arc<dyn BlockDevice>,
    pub(crate) sb: Superblock,
    pub(crate) groups: Vec<GroupDesc>,
    pub(crate) bs: usize,
    pub(crate) devno: u64,
    pub(crate) cache_cap: usize,
    /// The inode cache in shards by inode number (`ICACHE_SHARDS`): an
    /// unlink and a lookup of inodes in different shards share no lock,
    /// and forgetting an inode scans one shard's recent list, not all.
    cache: Box<[CachePadded<OMutex<InodeCache>>]>,
    pub(crate) root: Arc<Inode>,
    pub(crate) statfs: StatFs,
    /// The write side; `None` for a read-only mount.
    pub(crate) rw: Option<RwState>,
    /// The metadata blocks no xattr block may be (`xattr_write.rs`).
    pub(crate) meta_zone: OnceLock<crate::meta_zone::MetaZone>,
}

/// State of a read-write mount.
pub(crate) struct RwState {
    /// The kernel's `s_resv_clusters`, in blocks: the pool every
    /// allocation but a `nofail` one leaves (`Superblock::resv_blocks`;
    /// `Ext4::set_reserved_clusters`).
    pub(crate) resv: AtomicU64,
    pub(crate) bufs: BufCache,
    pub(crate) alloc: Alloc,
    /// The raw superblock as read (fields not modelled kept as they are).
    pub(crate) sb_raw: OMutex<Vec<u8>>,
    pub(crate) mnt_count: u16,
    pub(crate) kbytes_written: u64,
    /// Bytes written since mount (data and metadata), for s_kbytes_written.
    pub(crate) written: AtomicU64,
    /// A check failed while writing: nothing more goes to the device.
    pub(crate) failed: AtomicBool,
    /// `unmount` ran: the image is clean and nothing more is written.
    pub(crate) unmounted: AtomicBool,
    /// A superblock field that a crash must see with its transaction
    /// changed (the orphan list's head), or a sync asked for the
    /// superblock: the next commit logs it (`prepare_commit`).
    pub(crate) sb_changed: AtomicBool,
    /// `COMPAT_EXT_ATTR` is in `sb_raw` (set at mount or by the first
    /// attribute stored: `note_ext_attr`), so later stores skip its lock.
    pub(crate) ext_attr_noted: AtomicBool,
    /// When a commit last logged the superblock (ns since `RwState` was
    /// made, plus one; 0: never).
    pub(crate) sb_logged_ns: AtomicU64,
    /// The clock of `sb_logged_ns`.
    pub(crate) born: std::time::Instant,
    /// Inodes whose last name is gone, freed once nothing holds them.
    pub(crate) unlinked: Sharded<(u32, Weak<Inode>, OrphanSlot)>,
    /// The orphan file (journaled mounts of images that have one).
    pub(crate) orphans: OnceLock<OrphanDisk>,
    /// Unlinked inodes the VFS no longer holds (`Ext4Inode::on_drop`).
    pub(crate) dead: Arc<Sharded<u32>>,
    /// The orphan file records no new orphans (`OrphanMode::List` or
    /// `None`).
    pub(crate) orphans_off: AtomicBool,
    /// The orphan list (`OrphanMode::List`, or `Auto` without an orphan
    /// file; `orphan_list.rs`).
    pub(crate) orphan_list: OnceLock<OrphanList>,
    /// The fallback orphan list of a mount that records orphans in the
    /// orphan file: inodes that found every slot taken (`orphan.rs`).
    pub(crate) orphan_fallback: OnceLock<OrphanList>,
    /// Our xattr blocks by header hash, to share (`xattr_write.rs`).
    pub(crate) xattr_blocks: crate::xattr_cache::XattrBlockCache,
    /// Our value inodes by value hash, to share (`ea_inode.rs`).
    pub(crate) ea_values: crate::xattr_cache::XattrBlockCache,
    /// The mount will write through the journal (open.rs installs it):
    /// the state stays valid from the first write on.
    pub(crate) journaled: bool,
    /// The journaled write path (`txn.rs`), installed by `open.rs` when the
    /// image has a journal and `Ext4Options::journal` is on.
    pub(crate) journal: OnceLock<Journal>,
}

/// The RO_COMPAT features a read-write mount keeps correct.
const RO_COMPAT_RW_OK: u32 = RO_COMPAT_SPARSE_SUPER
    | RO_COMPAT_LARGE_FILE
    | RO_COMPAT_HUGE_FILE
    | RO_COMPAT_GDT_CSUM
    | RO_COMPAT_DIR_NLINK
    | RO_COMPAT_EXTRA_ISIZE
    | RO_COMPAT_METADATA_CSUM;

impl std::fmt::Debug for Ext4 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ext4")
            .field("block_size", &self.bs)
            .field("groups", &self.groups.len())
            .finish()
    }
}

fn ino_what(ino: u32) -> impl Fn() -> String {
    move || format!("inode {ino}")
}

std::thread_local! {
    /// Set while this thread splits extents to free space (`nofail`).
    static NOFAIL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

std::thread_local! {
    /// Blocks already taken that this thread's allocations use first
    /// (`with_spares`): `.0` not handed out yet, `.1` handed out.
    static SPARES: std::cell::RefCell<Option<(Vec<u64>, Vec<u64>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Run `f` with `blocks` (taken already, in the running transaction) as
/// the first blocks its allocations get; a block of theirs that `f`
/// frees goes back to them rather than to the allocator (it was never
/// anyone's). Returns `f`'s result and the blocks not handed out.
pub(crate) fn with_spares<R>(blocks: Vec<u64>, f: impl FnOnce() -> R) -> (R, Vec<u64>) {
    struct Restore(Option<(Vec<u64>, Vec<u64>)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            SPARES.with(|s| *s.borrow_mut() = prev);
        }
    }
    let restore = Restore(SPARES.with(|s| s.borrow_mut().replace((blocks, Vec::new()))));
    let r = f();
    let left = SPARES.with(|s| s.borrow_mut().take().map(|(a, _)| a).unwrap_or_default());
    drop(restore);
    (r, left)
}

/// A spare of `with_spares`, if one is left.
fn take_spare() -> Option<u64> {
    SPARES.with(|s| {
        let mut s = s.borrow_mut();
        let (avail, out) = s.as_mut()?;
        let b = avail.pop()?;
        out.push(b);
        Some(b)
    })
}

/// Give a spare handed out back to `with_spares`; false if `blk` is not
/// one.
fn return_spare(blk: u64) -> bool {
    SPARES.with(|s| {
        let mut s = s.borrow_mut();
        let Some((avail, out)) = s.as_mut() else {
            return false;
        };
        match out.iter().position(|&b| b == blk) {
            Some(i) => {
                out.swap_remove(i);
                avail.push(blk);
                true
            }
            None => false,
        }
    })
}

/// Run `f` with every free block available to its allocations: the extent
/// splits of a punch, a truncate or a collapse, which must not fail for
/// want of a block the caller may not take (the kernel's
/// `EXT4_GET_BLOCKS_METADATA_NOFAIL` dips into the reserved pool).
pub(crate) fn nofail<R>(f: impl FnOnce() -> R) -> R {
    let _scope = NofailScope::enter();
    f()
}

/// `nofail` for the rest of a scope: while it lives, this thread's
/// allocations may take every free block; its drop puts the previous
/// setting back.
pub(crate) struct NofailScope(bool);

impl NofailScope {
    pub(crate) fn enter() -> NofailScope {
        NofailScope(NOFAIL.with(|n| n.replace(true)))
    }
}

impl Drop for NofailScope {
    fn drop(&mut self) {
        let prev = self.0;
        NOFAIL.with(|n| n.set(prev));
    }
}

impl Ext4 {
    /// Open a filesystem on `dev` whose journal needs no recovery (or whose
    /// recovery was done or overlaid by `open.rs`'s `Ext4::open_device`,
    /// the public entry).
    pub(crate) fn open_unreplayed(
        dev: Box<dyn BlockDevice>,
        opts: Ext4Options,
    ) -> Result<Arc<Ext4>> {
        let mut sbb = vec![0u8; SB_SIZE];
        dev.read_at(SB_OFFSET, &mut sbb)?;
        let sb = Superblock::parse(&sbb)?;
        if !opts.ro {
            check_rw(&sb, opts.journal)?;
        }
        let bs = sb.block_size();
        let dev_blocks = dev.size() / bs as u64;
        if sb.blocks_count > dev_blocks {
            return Err(corrupt(
                "superblock",
                format!(
                    "{} blocks but the device holds {dev_blocks} (truncated image?)",
                    sb.blocks_count
                ),
            ));
        }
        // group_count <= blocks_count, itself bounded by the device size.
        let ngroups = sb.group_count();
        let dsz = usize::from(sb.desc_size());
        let per_block = (bs / dsz) as u64;
        let mut groups = Vec::with_capacity(ngroups as usize);
        let mut blk = vec![0u8; bs];
        let mut loaded = u64::MAX;
        for g in 0..ngroups {
            let gdb = g / per_block;
            let b = gdt_block(&sb, gdb);
            if b >= sb.blocks_count {
                return Err(corrupt("group descriptor table", format!("block {b}")));
            }
            if loaded != b {
                dev.read_at(b * bs as u64, &mut blk)?;
                loaded = b;
            }
            let off = (g % per_block) as usize * dsz;
            groups.push(GroupDesc::parse(&sb, g, &blk[off..off + dsz])?);
        }
        let cache = (0..ICACHE_SHARDS)
            .map(|_| {
                CachePadded::new(OMutex::new(
                    Class::Ext4Icache,
                    InodeCache {
                        map: HashMap::new(),
                        recent: VecDeque::new(),
                        swept: 0,
                        loading: 0,
                        forget_gen: 0,
                        forgot: HashMap::new(),
                    },
                ))
            })
            .collect();
        // A placeholder root until the real one is read (the struct needs one).
        let placeholder = Arc::new(Inode::new(
            0,
            opts.dev,
            Attr {
                mode: libc::S_IFDIR,
                ..Attr::default()
            },
            Box::new(()),
        ));
        let mut fs = Ext4 {
            dev: Arc::from(dev),
            sb,
            groups,
            bs,
            devno: opts.dev,
            cache_cap: opts.inode_cache.max(16),
            cache,
            root: placeholder,
            statfs: StatFs::default(),
            rw: None,
            meta_zone: OnceLock::new(),
        };
        if !opts.ro {
            let (mnt_count, kbytes_written) = superblock::mount_fields(&sbb);
            fs.rw = Some(RwState {
                bufs: BufCache::new(bs, opts.buffer_cache.max(64)),
                alloc: Alloc::new(&fs.groups),
                sb_raw: OMutex::new(Class::Ext4Super, sbb),
                mnt_count: mnt_count.wrapping_add(1),
                kbytes_written,
                written: AtomicU64::new(0),
                failed: AtomicBool::new(false),
                unmounted: AtomicBool::new(false),
                sb_changed: AtomicBool::new(false),
                ext_attr_noted: AtomicBool::new(false),
                sb_logged_ns: AtomicU64::new(0),
                born: std::time::Instant::now(),
                unlinked: Sharded::new(Class::Ext4Unlinked),
                journal: OnceLock::new(),
                orphans: OnceLock::new(),
                orphans_off: AtomicBool::new(false),
                orphan_list: OnceLock::new(),
                orphan_fallback: OnceLock::new(),
                dead: Arc::new(Sharded::new(Class::Ext4Dead)),
                xattr_blocks: crate::xattr_cache::XattrBlockCache::new(),
                resv: AtomicU64::new(fs.sb.resv_blocks()),
                ea_values: crate::xattr_cache::XattrBlockCache::new(),
                journaled: opts.journal
                    && fs.sb.feature_compat & COMPAT_HAS_JOURNAL != 0
                    && fs.sb.journal_inum != 0,
            });
            // A journaled mount frees what the orphan file lists: check the
            // file (layout, magic, checksums, inode numbers) before the
            // first write, so a bad one leaves the image untouched.
            if fs.rw_journaled() {
                let r = fs
                    .load_orphan_file()
                    .and_then(|od| od.map_or(Ok(()), |od| fs.scan_orphans(&od)))
                    .and_then(|_| fs.scan_orphan_list());
                if let Err(e) = r {
                    fs.abandon();
                    return Err(e);
                }
            }
        }
        // Every check before the first write: a refused image stays as it
        // was (`abandon`: not even the drop writes).
        let root = match fs.iget(inode::ROOT_INO) {
            Ok(r) if r.is_dir() => r,
            Ok(_) => {
                fs.abandon();
                return Err(corrupt("inode 2", "the root is not a directory"));
            }
            Err(e) => {
                fs.abandon();
                return Err(e);
            }
        };
        fs.root = root;
        fs.statfs = match fs.compute_statfs() {
            Ok(s) => s,
            Err(e) => {
                fs.abandon();
                return Err(e);
            }
        };
        // Mark the filesystem in use (not clean) until unmount. A journaled
        // mount does it when the journal is installed (`install_journal`),
        // after the journal itself was checked.
        if fs.rw.is_some() && !fs.rw_journaled() {
            if let Err(e) = fs.write_super(false).and_then(|()| Ok(fs.dev.flush()?)) {
                fs.abandon();
                return Err(e);
            }
        }
        Ok(Arc::new(fs))
    }

    /// The checked superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> usize {
        self.bs
    }

    pub(crate) fn read_block(&self, blk: u64, buf: &mut [u8]) -> Result<()> {
        if blk >= self.sb.blocks_count {
            return Err(corrupt(
                format!("block {blk}"),
                "block number beyond the filesystem",
            ));
        }
        match &self.rw {
            Some(rw) => rw.bufs.read(&*self.dev, blk, buf)?,
            None => self.dev.read_at(blk * self.bs as u64, buf)?,
        }
        Ok(())
    }

    /// `read_block` of a metadata block whose checksum the caller checks:
    /// with it, whether the cached copy's checksum was checked already
    /// (`MetaRead`; `verified_meta` records a check).
    pub(crate) fn read_meta(&self, blk: u64, buf: &mut [u8]) -> Result<MetaRead> {
        if blk >= self.sb.blocks_count {
            return Err(corrupt(
                format!("block {blk}"),
                "block number beyond the filesystem",
            ));
        }
        let (gen, verified) = match &self.rw {
            Some(rw) => match rw.bufs.read_gen(&*self.dev, blk, buf)? {
                Some((g, ok)) => (Some(g), ok),
                None => (None, false),
            },
            None => {
                self.dev.read_at(blk * self.bs as u64, buf)?;
                (None, false)
            }
        };
        Ok(MetaRead {
            pblk: blk,
            gen,
            verified,
        })
    }

    /// The block `r` names passed its checksum check: a later read of the
    /// same cached generation skips it.
    pub(crate) fn verified_meta(&self, r: &MetaRead) {
        if let (Some(rw), Some(g)) = (&self.rw, r.gen) {
            rw.bufs.mark_verified(r.pblk, g);
        }
    }

    /// True for a read-write mount.
    pub fn is_rw(&self) -> bool {
        self.rw.is_some()
    }

    pub(crate) fn rw(&self) -> Result<(&RwState, Io<'_>)> {
        let rw = self
            .rw
            .as_ref()
            .ok_or_else(|| Error::Io(std::io::Error::from_raw_os_error(libc::EROFS)))?;
        // Relaxed: the flags only stop further writes; they order nothing.
        if rw.failed.load(Ordering::Relaxed) || rw.unmounted.load(Ordering::Relaxed) {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::EROFS)));
        }
        let io = Io {
            sb: &self.sb,
            dev: &*self.dev,
            bufs: &rw.bufs,
        };
        Ok((rw, io))
    }

    /// A corrupt-image error on the write path stops all further writing
    /// (the kernel's errors=remount-ro).
    pub(crate) fn check<T>(&self, r: Result<T>) -> Result<T> {
        if let (Err(e), Some(rw)) = (&r, &self.rw) {
            if e.is_corrupt() {
                // Relaxed: see `rw`.
                rw.failed.store(true, Ordering::Relaxed);
            }
        }
        r
    }

    /// A change failed after part of it was made (in the buffer cache, in
    /// the caller's copy of the inode), and the caller will not store the
    /// rest: stop writing, as `check` does for corruption, so that the
    /// half-made change never commits. Returns `e`.
    pub(crate) fn stop_writes(&self, e: Error) -> Error {
        if let Some(rw) = &self.rw {
            // Relaxed: see `rw`.
            rw.failed.store(true, Ordering::Relaxed);
        }
        e
    }

    /// Allocate a block near `goal` (0: the thread's group), leaving the
    /// blocks the caller may not take, as the kernel's
    /// `ext4_has_free_clusters`: everyone leaves the `s_resv_clusters`
    /// pool (2% of the filesystem, at most 4096 clusters, none without
    /// extents), and a caller ([`scalevfs::caller`]) who is not root, not
    /// `s_def_resuid` and not in `s_def_resgid` also leaves
    /// `s_r_blocks_count`. Work with no caller (the filesystem's own) is
    /// privileged, as the kernel's threads are. Inside [`nofail`] (extent
    /// splits that free space: punch, truncate, collapse, insert's split)
    /// every free block may be taken, as the kernel's
    /// `EXT4_GET_BLOCKS_METADATA_NOFAIL`.
    pub fn alloc_block(&self, goal: u64) -> Result<u64> {
        if let Some(b) = take_spare() {
            return Ok(b);
        }
        let keep = if NOFAIL.with(|n| n.get()) {
            0
        } else {
            self.blocks_to_keep()
        };
        let (rw, io) = self.rw()?;
        self.check(rw.alloc.alloc_block(&io, goal, keep))
    }

    /// `alloc_block` as the extent splits of a punch do: every free block
    /// may be taken (tests and tools).
    #[doc(hidden)]
    pub fn alloc_block_nofail(&self, goal: u64) -> Result<u64> {
        nofail(|| self.alloc_block(goal))
    }

    /// The free blocks the current caller must leave (see `alloc_block`).
    fn blocks_to_keep(&self) -> u64 {
        let sb = &self.sb;
        let privileged = scalevfs::caller::current(|c| match c {
            None => true,
            Some(c) => c.is_root() || c.uid == u32::from(sb.def_resuid),
        }) || (sb.def_resgid != 0
            && scalevfs::caller::in_group(u32::from(sb.def_resgid)) == Some(true));
        // Relaxed: a setting, read alone.
        let resv = self
            .rw
            .as_ref()
            .map_or(0, |rw| rw.resv.load(Ordering::Relaxed));
        if privileged {
            resv
        } else {
            resv.saturating_add(sb.r_blocks_count)
        }
    }

    /// Free block `blk`. Journaled: the block is freed in the bitmaps by
    /// the commit of the running transaction and reusable only after it
    /// (`txn.rs`).
    pub fn free_block(&self, blk: u64) -> Result<()> {
        if return_spare(blk) {
            return Ok(());
        }
        let (rw, io) = self.rw()?;
        if let Some(j) = rw.journal.get() {
            if blk < u64::from(self.sb.first_data_block) || blk >= self.sb.blocks_count {
                return self.check(Err(corrupt(
                    format!("block {blk}"),
                    "freeing a block outside the fs",
                )));
            }
            rw.bufs.forget(blk);
            let bpg = u64::from(self.sb.blocks_per_group).max(1);
            let group = |b: u64| (b - u64::from(self.sb.first_data_block)) / bpg;
            let mut q = j.pending.mine().lock();
            if q.last().is_none_or(|&l| group(l) != group(blk)) {
                // Relaxed: an estimate (`Journal::txn_estimate`).
                j.freed_groups.fetch_add(1, Ordering::Relaxed);
            }
            q.push(blk);
            return Ok(());
        }
        self.check(rw.alloc.free_block(&io, blk))
    }

    /// Free block `blk`, which the caller's handle allocated itself and
    /// nothing yet maps: back in the bitmap at once, reusable by this
    /// handle (no committed state ever had it in use, so no commit must
    /// come first, unlike `free_block`). A write that undoes the blocks
    /// of the folio it could not map gives them back so, and its tree
    /// may then take them (kernel differential seed 1148 at 1 KiB: held
    /// back, they left the tree no block and the whole 13 MiB write
    /// failed).
    pub(crate) fn free_fresh_block(&self, blk: u64) -> Result<()> {
        if return_spare(blk) {
            return Ok(());
        }
        let (rw, io) = self.rw()?;
        self.check(rw.alloc.free_block(&io, blk))
    }

    pub(crate) fn journal(&self) -> Option<&Journal> {
        self.rw.as_ref()?.journal.get()
    }

    /// Start a handle (a change to the filesystem; `txn.rs`). A thread
    /// that holds none first commits if the running transaction is large.
    pub(crate) fn handle(&self) -> Result<Handle<'_>> {
        let Some(j) = self.journal() else {
            return Ok(Handle::none());
        };
        if !Handle::nested(j) {
            if let Some(rw) = &self.rw {
                if j.txn_estimate(rw.bufs.dirty_count()) > j.limit() {
                    self.commit()?;
                }
            }
        }
        Ok(Handle::start(j))
    }

    /// Run `f` in a handle. On ENOSPC while blocks freed by the running
    /// transaction wait for its commit, or unlinked inodes wait to be
    /// freed, commit (which frees the unlinked inodes nothing holds any
    /// more) and try once more, as ext4 retries an allocation after
    /// forcing a commit. (Inodes still held by deferred frees: the VFS
    /// flushes those and retries the whole call, `redo_counted`.)
    pub(crate) fn journaled<T>(&self, f: impl Fn() -> Result<T>) -> Result<T> {
        let Some(j) = self.journal() else {
            return f();
        };
        let nested = Handle::nested(j);
        if !nested {
            scalevfs::enospc_final_reset();
        }
        let (r, partial) = {
            let _h = self.handle()?;
            let r = f();
            let partial = if nested { Vec::new() } else { self.reap_dead() };
            (r, partial)
        };
        if let Err(e) = self.reap_rest(partial) {
            eprintln!("scalevfs-ext4: freeing unlinked inodes failed: {e}");
        }
        let enospc = matches!(&r, Err(Error::Io(e)) if e.raw_os_error() == Some(libc::ENOSPC));
        let waiting = !j.pending.is_empty()
            || self
                .rw
                .as_ref()
                .is_some_and(|rw| rw.alloc.holds_blocks() || !rw.unlinked.is_empty());
        if enospc && !nested && waiting && !scalevfs::enospc_is_final() {
            self.commit()?;
            let _h = self.handle()?;
            return f();
        }
        r
    }

    /// Free the unlinked inodes whose last VFS reference went since the
    /// last call, in the caller's handle (their orphan records go in the
    /// same transaction). A failure stops writing (as any write error does)
    /// and is reported by the next call that writes. Returns the inodes
    /// too large for one handle (`reap_some`), for the caller to finish
    /// after its handle (`reap_rest`).
    fn reap_dead(&self) -> Vec<u32> {
        let Some(rw) = &self.rw else {
            return Vec::new();
        };
        let dead = {
            let mut q = rw.dead.mine().lock();
            if q.is_empty() {
                return Vec::new();
            }
            std::mem::take(&mut *q)
        };
        self.reap_some(false, Some(&dead)).unwrap_or_else(|e| {
            eprintln!("scalevfs-ext4: freeing unlinked inodes failed: {e}");
            Vec::new()
        })
    }

    /// Make everything done before this call durable (fsync, sync): wait
    /// for a commit that starts after the call, or run it (group commit:
    /// callers that arrive while one runs share the next).
    pub fn commit(&self) -> Result<()> {
        let Some(j) = self.journal() else {
            return self.writeback(false);
        };
        if Handle::nested(j) {
            return Err(corrupt("journal", "commit requested inside a handle"));
        }
        self.commit_until(j, j.next_commit())
    }

    /// Make commit `target` durable: return at once if it is, else wait
    /// for the commit lock and commit unless a commit that covers it
    /// finished meanwhile (group commit).
    fn commit_until(&self, j: &Journal, target: u64) -> Result<()> {
        // Relaxed: a statistic.
        j.requests.fetch_add(1, Ordering::Relaxed);
        // Relaxed (both): `waiters` is a hint for the batching wait below;
        // nothing is published through it.
        let waiting = &j.waiters[(target & 1) as usize];
        waiting.fetch_add(1, Ordering::Relaxed);
        struct Leave<'a>(&'a std::sync::atomic::AtomicU64);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let _leave = Leave(waiting);
        // The loop below waits for the commit lock by try-locks and sleeps
        // (which the checker records without checking): check the wait.
        scalevfs_sync::ordered::check_wait(Class::Ext4Commit, 0);
        // Wait for the commit lock or for another thread's commit to cover
        // `target`, whichever comes first: a waiter parked on the lock
        // could be passed again and again by the committing thread coming
        // back for its next fsync (std's mutex lets a running thread take
        // it before a woken one), and would wait for commits it does not
        // need. After a short spin the waiter sleeps on `released` (a
        // futex), which every holder bumps as it lets the lock go (after
        // storing `done`): read `released`, re-check `done` and the lock,
        // then sleep only if `released` still has the value read, so a
        // release between the check and the sleep is never missed. (A
        // timed sleep here overslept the other thread's commit by tens of
        // microseconds, longer than the commit itself on a fast device.)
        let mut spins = 0u32;
        let mut spin_start: Option<std::time::Instant> = None;
        // A commit that has begun (`started`) covers `target` once its
        // log is written (by its committer, after the lock is released):
        // wait for `done` then, instead of taking the lock for the next.
        // SeqCst: see `Journal::next_commit`.
        let begun = || j.started.load(Ordering::SeqCst) >= target;
        let mut st = loop {
            // SeqCst: see `Journal::next_commit`.
            if j.done.load(Ordering::SeqCst) >= target {
                return Ok(());
            }
            self.check_failed()?;
            // Relaxed: a hint; a stale value costs one failed try or one
            // more turn (the sleeping path below tries regardless).
            if !j.committing.load(Ordering::Relaxed) && !begun() {
                if let Some(g) = j.commit.try_lock() {
                    break g;
                }
            }
            // The committer may offer its log writes: do them instead of
            // idling (`HelpSlot`).
            if j.help.help() {
                continue;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
                continue;
            }
            // A commit takes tens of microseconds on a fast device, about
            // what waking a sleeping thread costs on a VM: yield-spin for up
            // to twice the average commit (at most 200 µs) before sleeping.
            let spin_for = j
                .avg_commit_ns
                .load(Ordering::Relaxed)
                .saturating_mul(2)
                .min(200_000);
            let since = *spin_start.get_or_insert_with(std::time::Instant::now);
            if (since.elapsed().as_nanos() as u64) < spin_for {
                std::thread::yield_now();
                continue;
            }
            // SeqCst (with the re-checks below and the holder's store of
            // `done` before its bump): if this load misses the bump, the
            // re-check sees the new `done` or a free lock.
            let seen = j.released.prepare();
            if j.done.load(Ordering::SeqCst) >= target {
                return Ok(());
            }
            self.check_failed()?;
            if !begun() {
                if let Some(g) = j.commit.try_lock() {
                    break g;
                }
            }
            j.released.wait(seen);
        };
        // Relaxed: a hint (see `Journal::committing`), cleared by
        // `Released` after the lock goes.
        j.committing.store(true, Ordering::Relaxed);
        let st_guard = Released(j);
        // SeqCst: as above.
        if j.done.load(Ordering::SeqCst) >= target {
            drop(st);
            drop(st_guard);
            return Ok(());
        }
        self.wait_in_flight(j)?;
        self.batch_wait(j);
        let t0 = std::time::Instant::now();
        // The threads waiting for this commit now are served by it.
        // Relaxed: hints (see above).
        j.last_batch
            .store(Self::waiting_for_next(j).max(1), Ordering::Relaxed);
        let r = self.commit_begin(j, &mut st, false);
        // The lock goes first, then the sleepers wake (`Released`): the
        // next commit may begin while this one's log is written.
        drop(st);
        drop(st_guard);
        if let Some((n, w)) = r? {
            self.commit_write(j, n, w)?;
        }
        let ns = t0.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        // Relaxed: a moving average (7/8 old + 1/8 new), read as a hint.
        let avg = j.avg_commit_ns.load(Ordering::Relaxed);
        j.avg_commit_ns
            .store(avg - avg / 8 + ns / 8, Ordering::Relaxed);
        Ok(())
    }

    /// Where writing a commit is slow (a device whose flush costs: the
    /// average commit takes 100 µs or more), wait, holding the commit lock,
    /// until the commits begun before are durable, as jbd2 commits one
    /// transaction at a time: the handles and fsyncs that arrive meanwhile
    /// join the next commit, which then pays one flush for all of them.
    /// Where the flush is nearly free, a commit costs its CPU work and the
    /// next one begins at once, its log written while the earlier one's is.
    fn wait_in_flight(&self, j: &Journal) -> Result<()> {
        // Relaxed (both): a setting and a moving average, hints.
        let slow = match j.pipeline.load(Ordering::Relaxed) {
            PIPELINE_ALWAYS => false,
            PIPELINE_NEVER => true,
            _ => j.avg_commit_ns.load(Ordering::Relaxed) >= 100_000,
        };
        if !slow {
            return Ok(());
        }
        // SeqCst: see `Journal::next_commit`; `started` is fixed while
        // the commit lock is held.
        let last = j.started.load(Ordering::SeqCst);
        let mut spins = 0u32;
        loop {
            // SeqCst: read before the check (see `commit_until`).
            let seen = j.released.prepare();
            if j.done.load(Ordering::SeqCst) >= last {
                return Ok(());
            }
            self.check_failed()?;
            if j.help.help() {
                continue;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                j.released.wait(seen);
            }
        }
    }

    /// Whether writing has stopped (a failed commit, a failed check or
    /// `stop_writes`): nothing more reaches the image.
    pub(crate) fn writes_stopped(&self) -> bool {
        // Relaxed: see `rw`.
        self.rw
            .as_ref()
            .is_some_and(|rw| rw.failed.load(Ordering::Relaxed))
    }

    /// EIO once a write failed (a failed commit stops the filesystem).
    fn check_failed(&self) -> Result<()> {
        // Relaxed: see `rw`.
        if self
            .rw
            .as_ref()
            .is_some_and(|rw| rw.failed.load(Ordering::Relaxed))
        {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::EIO)));
        }
        Ok(())
    }

    /// Write commit `n`'s log (begun by `commit_begin`), without the
    /// commit lock, and publish it as done. Several may run at once; the
    /// log makes them durable in the order they began, so `done` only
    /// grows past commits that are durable.
    fn commit_write(&self, j: &Journal, n: u64, w: Box<dyn crate::txn::LogWrite>) -> Result<()> {
        let Some(rw) = &self.rw else { return Ok(()) };
        // Another thread waits for a commit: offer it the log writes.
        // Relaxed: hints (see `commit_until`); a wrong guess costs one
        // write call more, or leaves the work to this thread.
        let others =
            j.waiters[0].load(Ordering::Relaxed) + j.waiters[1].load(Ordering::Relaxed) > 1;
        let r = w.write(others.then_some(&j.help));
        if r.is_err() {
            // Relaxed: see `rw`.
            rw.failed.store(true, Ordering::Relaxed);
        } else {
            // SeqCst: see `Journal::next_commit`; `fetch_max` because the
            // writer of an earlier commit may publish after this one.
            j.done.fetch_max(n, Ordering::SeqCst);
            rw.alloc.set_durable(n);
        }
        // The threads sleeping for `done` (or for the failure) wake.
        // SeqCst: after the store of `done` (see `commit_until`).
        j.released.notify();
        r
    }

    /// Threads waiting for the commit about to start (commit lock held, so
    /// its number is fixed).
    fn waiting_for_next(j: &Journal) -> u64 {
        // Relaxed: a hint; the count may include a thread two commits
        // behind that has not noticed yet (same parity), which only makes
        // a batch wait end early.
        j.waiters[(j.next_commit() & 1) as usize].load(Ordering::Relaxed)
    }

    /// Group commit, after jbd2's batching: when the last commit was asked
    /// for by another thread or served several, several threads are
    /// syncing; with the gate
    /// still open, wait until as many threads wait for a commit as the
    /// last commit served (at least two), so that the change another
    /// thread is making right now (it returned from the last commit and is
    /// on its next operation) joins this commit and its fsync finds it
    /// done: one commit and one flush for both. The wait is bounded by
    /// twice the average commit (20 µs .. 1 ms; jbd2 sleeps one average
    /// commit, up to 15 ms): a thread that stopped syncing costs one such
    /// wait, after which `last_batch` no longer expects it.
    fn batch_wait(&self, j: &Journal) {
        let me = crate::txn::thread_id();
        // Relaxed: hints.
        let prev = j.last_sync_thread.swap(me, Ordering::Relaxed);
        let last = j.last_batch.load(Ordering::Relaxed);
        if last < 2 && (prev == me || prev == 0) {
            return;
        }
        let want = last.max(2);
        let avg = j.avg_commit_ns.load(Ordering::Relaxed);
        let limit = std::time::Duration::from_nanos(avg.saturating_mul(2).clamp(20_000, 1_000_000));
        let t0 = std::time::Instant::now();
        let mut spins = 0u32;
        while Self::waiting_for_next(j) < want && t0.elapsed() < limit {
            spins += 1;
            if spins < 32 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Whether a commit may begin while the one before writes its log:
    /// `None` decides by the average commit time (`wait_in_flight`),
    /// `Some(true)` always, `Some(false)` never (jbd2's one committing
    /// transaction). For tests that must see commits overlap.
    #[doc(hidden)]
    pub fn set_pipelined(&self, on: Option<bool>) {
        if let Some(j) = self.journal() {
            let v = match on {
                None => PIPELINE_AUTO,
                Some(true) => PIPELINE_ALWAYS,
                Some(false) => PIPELINE_NEVER,
            };
            // Relaxed: a setting, read as a hint.
            j.pipeline.store(v, Ordering::Relaxed);
        }
    }

    /// Lower the transaction size limit (dirty metadata blocks past which
    /// a new handle commits first; a quarter of the log by default) to
    /// `blocks` (at least 8), so that a test on a small image sees the
    /// long operations split into many transactions. Only lowers it.
    #[doc(hidden)]
    pub fn set_txn_limit(&self, blocks: usize) {
        if let Some(j) = self.journal() {
            // Relaxed: see `Journal::limit`.
            j.limit.fetch_min(blocks.max(8), Ordering::Relaxed);
        }
    }

    /// Set the pool of clusters kept for the splits that free space (the
    /// kernel's `/sys/fs/ext4/<dev>/reserved_clusters`; mount default: 2%
    /// of the filesystem, at most 4096 clusters, none without extents).
    /// EINVAL, as the kernel, for as many clusters as the filesystem has
    /// or more; EROFS read-only.
    pub fn set_reserved_clusters(&self, clusters: u64) -> Result<()> {
        let (rw, _) = self.rw()?;
        if clusters >= self.sb.blocks_count / self.sb.cluster_ratio() {
            return Err(crate::util::errno(libc::EINVAL));
        }
        // Relaxed: a setting, read alone.
        rw.resv.store(
            clusters.saturating_mul(self.sb.cluster_ratio()),
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// Make INSERT_RANGE and COLLAPSE_RANGE shift the extent tree a leaf
    /// per handle even where the whole tree could be rewritten in one
    /// (what a tree too large for a transaction gets), so that a crash
    /// test on a small file sees the steps.
    #[doc(hidden)]
    pub fn set_stepped_shifts(&self, on: bool) {
        if let Some(j) = self.journal() {
            // Relaxed: a setting, changed by a test before its workload.
            j.stepped_shifts.store(on, Ordering::Relaxed);
        }
    }

    /// Commits that logged something, and commit requests (fsync, sync)
    /// since mount: (0, 0) without a journal.
    pub fn commit_stats(&self) -> (u64, u64) {
        self.journal().map_or((0, 0), |j| {
            // Relaxed: statistics.
            (
                j.commits.load(Ordering::Relaxed),
                j.requests.load(Ordering::Relaxed),
            )
        })
    }

    /// One commit, under the commit lock (`last`: unmount, free every
    /// unlinked inode), its log written before it returns.
    fn commit_locked(&self, j: &Journal, st: &mut Committer, last: bool) -> Result<()> {
        if let Some((n, w)) = self.commit_begin(j, st, last)? {
            self.commit_write(j, n, w)?;
        }
        Ok(())
    }

    /// The part of a commit under the commit lock: the running
    /// transaction closed, its blocks taken and its place in the log
    /// reserved. Returns the commit's number and what writes its log
    /// (`commit_write`), or nothing if it logged nothing (then it is
    /// done, after every commit begun before it).
    #[allow(clippy::type_complexity)]
    fn commit_begin(
        &self,
        j: &Journal,
        st: &mut Committer,
        last: bool,
    ) -> Result<Option<(u64, Box<dyn crate::txn::LogWrite>)>> {
        let Some(rw) = &self.rw else { return Ok(None) };
        if st.log.is_none() {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::EROFS)));
        }
        // The committer waits for every handle to leave.
        scalevfs_sync::ordered::check_wait(Class::Ext4Handle, 0);
        j.gate.close();
        // SeqCst: see `Journal::next_commit` (changed under the commit lock).
        let n = j.started.load(Ordering::SeqCst) + 1;
        j.started.store(n, Ordering::SeqCst);
        let r = {
            let _m = CommitterMark::set(j);
            self.prepare_commit(j, st, last, n)
        };
        j.gate.open();
        // A commit that began and failed stops the filesystem: the threads
        // waiting for it see `failed` instead of waiting for ever.
        // Relaxed: see `rw`.
        let (blocks, revokes) = r.inspect_err(|_| rw.failed.store(true, Ordering::Relaxed))?;
        let log = st.log.as_mut().expect("checked above");
        log.forget(&revokes);
        if !blocks.is_empty() || !revokes.is_empty() {
            let per_desc = log.tags_per_block().max(1) as usize;
            let per_revoke = (self.bs / 8).max(1);
            let need = blocks.len() + blocks.len() / per_desc + revokes.len() / per_revoke + 4;
            if need >= log.capacity() as usize {
                rw.failed.store(true, Ordering::Relaxed);
                return Err(corrupt(
                    "journal",
                    format!(
                        "a transaction of {need} blocks does not fit the log of {}",
                        log.capacity()
                    ),
                ));
            }
            if (log.room() as usize) <= need {
                // A failed checkpoint stops the filesystem too: the dirty
                // blocks were taken above (`prepare_commit`) and commit
                // `n` is counted as started, so returning with writes
                // still allowed dropped the transaction (a later commit
                // marked it done) or hung its waiters (`wait_in_flight`).
                if let Err(e) = log.checkpoint() {
                    // Relaxed: see `rw`.
                    rw.failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
                rw.bufs.checkpointed(n - 1);
                st.logged.clear();
            }
            // Recorded before the commit consumes the blocks; a failed
            // commit fails the filesystem, so the set no longer matters.
            st.logged.extend(blocks.iter().map(|(b, _)| *b));
            let w = match log.begin(blocks, &revokes, now().0.max(0) as u64) {
                Ok(w) => w,
                Err(e) => {
                    // Relaxed: see `rw`.
                    rw.failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            };
            // Relaxed: a statistic.
            j.commits.fetch_add(1, Ordering::Relaxed);
            // The superblock goes into the log with the transaction
            // (`journal_super`); the checkpoint writes it home.
            return Ok(Some((n, w)));
        }
        // Nothing logged: done once the commits before it are.
        if let Err(e) = log.wait_all() {
            // Relaxed: see `rw`.
            rw.failed.store(true, Ordering::Relaxed);
            return Err(e);
        }
        // SeqCst: see `Journal::next_commit`.
        j.done.fetch_max(n, Ordering::SeqCst);
        rw.alloc.set_durable(n);
        Ok(None)
    }

    /// The part of a commit with the gate closed: free the unlinked
    /// inodes and the running transaction's freed blocks, encode the group
    /// descriptors, copy the dirty blocks out.
    #[allow(clippy::type_complexity)]
    fn prepare_commit(
        &self,
        j: &Journal,
        st: &mut Committer,
        last: bool,
        n: u64,
    ) -> Result<(Vec<(u64, crate::bufcache::Block)>, Vec<u64>)> {
        let Some(rw) = &self.rw else {
            return Ok((Vec::new(), Vec::new()));
        };
        // Inodes whose last name went are freed here if nothing holds them;
        // the others (still open, or referenced by a dentry the VFS frees
        // after a grace period) stay in the orphan file until a later
        // commit frees them. Each signals its last drop (`on_drop`, to the
        // dropping thread's `dead` queue), so a commit takes every thread's
        // queue instead of looking at every unlinked inode still held: with
        // the gate closed, that scan (a few hundred inodes kept by the
        // VFS's deferred frees, at every commit) was time no handle could
        // run in.
        // Relaxed: see `rw`.
        if !rw.failed.load(Ordering::Relaxed) {
            // An inode too large for this transaction loses a step of its
            // blocks and stays queued for the next (`reap_some`): back on
            // this thread's queue, for its next handle or the next commit.
            let partial = if last {
                self.reap(true)?
            } else {
                let dead = rw.dead.drain_all();
                if dead.is_empty() {
                    Vec::new()
                } else {
                    self.reap_some(false, Some(&dead))?
                }
            };
            if !partial.is_empty() {
                rw.dead.mine().lock().extend(partial);
            }
        }
        let (_, io) = self.rw()?;
        let frees = j.pending.drain_all();
        // Relaxed: see `Journal::txn_estimate` (the gate is closed: no
        // handle frees meanwhile).
        j.freed_groups.store(0, Ordering::Relaxed);
        let mut revokes = Vec::new();
        for b in frees {
            self.check(rw.alloc.free_block_held(&io, b, n))?;
            if st.logged.remove(&b) {
                revokes.push(b);
            }
        }
        rw.alloc
            .write_descs(&io, |gdb| gdt_block(&self.sb, gdb), last)?;
        self.orphan_tails();
        // SeqCst: pairs with `sync`'s store (see there); a handle sets it
        // under `sb_raw`'s lock before it ends, and the gate (closed
        // before this) waited for it.
        let changed = rw.sb_changed.swap(false, Ordering::SeqCst);
        if (changed || rw.bufs.dirty_count() > 0) && self.sb_due(rw, last || changed) {
            self.journal_super()?;
        }
        Ok((rw.bufs.take_dirty(n), revokes))
    }

    /// An attribute was stored: the superblock says the image has them
    /// (`COMPAT_EXT_ATTR`), as the kernel's ext4_xattr_update_super_block
    /// sets it on the first one (e2fsck clears the attributes of an image
    /// without it). Called inside the handle that stored it, so the commit
    /// carrying the attribute logs the superblock too.
    pub(crate) fn note_ext_attr(&self) {
        if self.sb.has_compat(COMPAT_EXT_ATTR) {
            return;
        }
        if let Some(rw) = &self.rw {
            // Relaxed: a hint; set after the bit is in `sb_raw`, and a
            // thread that misses it takes the lock and finds the bit.
            if rw.ext_attr_noted.load(Ordering::Relaxed) {
                return;
            }
            let mut raw = rw.sb_raw.lock();
            let c = u32::from_le_bytes([raw[0x5C], raw[0x5D], raw[0x5E], raw[0x5F]]);
            if c & COMPAT_EXT_ATTR == 0 {
                raw[0x5C..0x60].copy_from_slice(&(c | COMPAT_EXT_ATTR).to_le_bytes());
                // SeqCst: see `prepare_commit` (set under `sb_raw`'s lock,
                // inside the handle).
                rw.sb_changed.store(true, Ordering::SeqCst);
            }
            // Relaxed: see above.
            rw.ext_attr_noted.store(true, Ordering::Relaxed);
        }
    }

    /// Whether this commit logs the superblock (`must`: it has to). Its free totals, write
    /// time and kbytes written may lag on disk, as the kernel lets them
    /// (e2fsck recounts the totals from the group descriptors): it goes
    /// into the log when a field a crash must see with its transaction
    /// changed (`sb_changed`: the orphan list's head; a sync), at the
    /// last commit, and otherwise at most once per `SB_REFRESH`, so the
    /// totals on disk stay recent without a 4 KiB block in every fsync's
    /// commit.
    fn sb_due(&self, rw: &RwState, must: bool) -> bool {
        const SB_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);
        let now = rw.born.elapsed().as_nanos().min(u128::from(u64::MAX - 1)) as u64 + 1;
        // Relaxed: read and written only under the commit lock.
        let at = rw.sb_logged_ns.load(Ordering::Relaxed);
        let due = must || at == 0 || now.saturating_sub(at) >= SB_REFRESH.as_nanos() as u64;
        if due {
            rw.sb_logged_ns.store(now, Ordering::Relaxed);
        }
        due
    }

    /// The device (shared with the journal's log writer).
    pub(crate) fn device(&self) -> Arc<dyn BlockDevice> {
        self.dev.clone()
    }

    /// How the image is reached ([`BlockDevice::kind`]): `Ext4::open`
    /// picks the lazily allocated mapping or `pread`/`pwrite`
    /// ([`IoMode`]).
    pub fn device_kind(&self) -> &'static str {
        self.dev.kind()
    }

    /// Turn on the journaled write path with `log` (open.rs, right after
    /// the open): needs_recovery stays set while mounted, and a commit
    /// thread commits every `interval` seconds (0: none); `orphan_file`:
    /// record orphans in the image's orphan file.
    pub(crate) fn install_journal(
        self: &Arc<Self>,
        log: Box<dyn LogSink>,
        interval: u64,
        orphans: OrphanMode,
    ) -> Result<()> {
        let Some(rw) = &self.rw else { return Ok(()) };
        rw.bufs.set_journaled();
        {
            let mut raw = rw.sb_raw.lock();
            let inc =
                u32::from_le_bytes([raw[0x60], raw[0x61], raw[0x62], raw[0x63]]) | INCOMPAT_RECOVER;
            raw[0x60..0x64].copy_from_slice(&inc.to_le_bytes());
        }
        if rw.journal.set(Journal::new(log)).is_err() {
            return Err(corrupt("journal", "installed twice"));
        }
        let od = self.load_orphan_file()?;
        if orphans == OrphanMode::File && od.is_none() {
            return Err(Error::Incompatible(
                "orphan=file: the image has no orphan file (mkfs.ext4 -O orphan_file, or \
                 tune2fs -O orphan_file)"
                    .into(),
            ));
        }
        let list = match orphans {
            OrphanMode::List => true,
            OrphanMode::Auto => od.is_none(),
            OrphanMode::File | OrphanMode::None => false,
        };
        let file = match orphans {
            OrphanMode::File => true,
            OrphanMode::Auto => od.is_some(),
            OrphanMode::List | OrphanMode::None => false,
        };
        if let Some(od) = od {
            // Inodes a crash left are freed below whatever `orphan_file`
            // says; without it no new ones are recorded.
            let _ = rw.orphans.set(od);
            let mut raw = rw.sb_raw.lock();
            let ro = u32::from_le_bytes([raw[0x64], raw[0x65], raw[0x66], raw[0x67]])
                | RO_COMPAT_ORPHAN_PRESENT;
            raw[0x64..0x68].copy_from_slice(&ro.to_le_bytes());
        }
        self.write_super(false)?;
        self.dev.flush()?;
        // The orphan list a crash (or the kernel) left is processed first,
        // one handle per inode; then the orphan file (whose scan skips an
        // inode the list already freed).
        let (freed, truncated) = self.check(self.process_orphan_list())?;
        if freed + truncated > 0 {
            eprintln!(
                "scalevfs-ext4: orphan list: freed {freed} inode(s), finished {truncated} \
                 truncate(s) left by a crash"
            );
        }
        let (freed, truncated) = self.check(self.process_orphans())?;
        if freed + truncated > 0 {
            eprintln!(
                "scalevfs-ext4: orphan file: freed {freed} inode(s), finished {truncated} \
                 truncate(s) left by a crash"
            );
        }
        if !file {
            // Relaxed: set once here, before any handle records an orphan.
            rw.orphans_off.store(true, Ordering::Relaxed);
        } else {
            // Processing above emptied the chain (`s_last_orphan` is 0).
            let _ = rw.orphan_fallback.set(OrphanList::new());
        }
        if list {
            let _ = rw.orphan_list.set(OrphanList::new());
        }
        if interval > 0 {
            let weak = Arc::downgrade(self);
            std::thread::Builder::new()
                .name("ext4-commit".into())
                .spawn(move || commit_thread(weak, interval))
                .map_err(Error::Io)?;
        }
        Ok(())
    }

    /// Allocate an inode number, preferably in group `group`.
    pub fn alloc_inode(&self, group: Option<usize>, dir: bool) -> Result<u32> {
        let (rw, io) = self.rw()?;
        self.check(rw.alloc.alloc_inode(&io, group, dir))
    }

    /// Free inode number `ino`.
    pub fn free_inode(&self, ino: u32, dir: bool) -> Result<()> {
        let (rw, io) = self.rw()?;
        self.check(rw.alloc.free_inode(&io, ino, dir))
    }

    /// Write the superblock with the current counts; `clean` marks the
    /// filesystem valid (unmount), else in use.
    fn write_super(&self, clean: bool) -> Result<()> {
        let Some(rw) = &self.rw else { return Ok(()) };
        let raw = self.encode_super(rw, clean);
        self.dev.write_at(SB_OFFSET, &raw)?;
        rw.written.fetch_add(SB_SIZE as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Journaled: put the superblock (counts, orphan list head, flags) in
    /// the running transaction (commit, gate closed), as the kernel
    /// journals it for the orphan list: written in place only by the
    /// checkpoint, it never shows a head the log has not committed.
    fn journal_super(&self) -> Result<()> {
        let (rw, io) = self.rw()?;
        let raw = self.encode_super(rw, false);
        let bs = self.bs as u64;
        let (blk, off) = (SB_OFFSET / bs, (SB_OFFSET % bs) as usize);
        rw.bufs.modify(io.dev, blk, true, |b| {
            b[off..off + SB_SIZE].copy_from_slice(&raw);
        })?;
        Ok(())
    }

    /// The raw superblock with the current counts and times (`clean`: the
    /// state as at unmount), checksum updated; a copy.
    fn encode_super(&self, rw: &RwState, clean: bool) -> Vec<u8> {
        let t = now().0;
        let mut raw = rw.sb_raw.lock();
        // Relaxed: a statistic.
        let kb = rw.written.load(Ordering::Relaxed) / 1024;
        let state = if clean || rw.journaled {
            // A journaled mount keeps the state valid, as the kernel's
            // does: needs_recovery says whether a replay is due.
            self.sb.state | STATE_VALID
        } else {
            self.sb.state & !STATE_VALID
        };
        let u = SbUpdate {
            state,
            mnt_count: rw.mnt_count,
            mtime: t,
            wtime: t,
            free_blocks: rw.alloc.free_blocks() * self.sb.cluster_ratio(),
            free_inodes: rw.alloc.free_inodes() as u32,
            kbytes_written: rw.kbytes_written.saturating_add(kb),
        };
        superblock::encode_update(&mut raw, &u, self.sb.has_metadata_csum());
        raw.clone()
    }

    /// Write every dirty metadata block, the group descriptors and the
    /// superblock, then flush the device (`syncfs`). A read-only mount has
    /// nothing to write.
    pub fn sync(&self) -> Result<()> {
        // Relaxed: see `rw`.
        if self
            .rw
            .as_ref()
            .is_some_and(|r| r.unmounted.load(Ordering::Relaxed))
        {
            return Ok(());
        }
        if self.journal().is_some() {
            if let Some(rw) = &self.rw {
                // A sync brings the superblock's totals on disk up to date.
                // SeqCst: `commit` waits for a commit that had not started
                // when it read `Journal::next_commit` (SeqCst); that
                // commit's swap in `prepare_commit` comes later in the single
                // order, so it sees this store.
                rw.sb_changed.store(true, Ordering::SeqCst);
            }
            return self.commit();
        }
        self.writeback(false)
    }

    /// An inode lost its last name: drop it from the cache and queue it
    /// to be freed once unused.
    /// Journaled: it is recorded in the orphan file in the same handle,
    /// so a crash before it is freed cannot leak it.
    pub(crate) fn forget_inode(&self, inode: &Arc<Inode>) -> Result<()> {
        let ino = inode.ino() as u32;
        let gone: Option<Arc<Inode>> = {
            let mut c = self.icache(ino);
            c.map.remove(&ino);
            c.forget_gen += 1;
            if c.loading > 0 {
                let g = c.forget_gen;
                c.forgot.insert(ino, g);
            }
            // On the recent list at most once (pushed when it entered the
            // map); dropped after the shard's lock (nothing is taken under
            // it).
            let k = c.recent.iter().position(|(n, _)| *n == ino);
            k.and_then(|k| c.recent.remove(k)).map(|(_, i)| i)
        };
        drop(gone);
        if let Some(rw) = &self.rw {
            // The caller has already stored the link count of 0 (and
            // dropped the name): without a record the inode would leak,
            // so a failure here stops writes and the half change never
            // commits.
            let slot = self.orphan_add(ino).map_err(|e| self.stop_writes(e))?;
            rw.unlinked
                .shard(u64::from(ino))
                .lock()
                .push((ino, Arc::downgrade(inode), slot));
            if rw.journaled {
                if let Some(e) = inode.private::<Ext4Inode>() {
                    let _ = e.on_drop.set((ino, rw.dead.clone()));
                }
            }
        }
        Ok(())
    }

    /// An open that failed after the write side was set up: write nothing
    /// more, not even at drop (the image stays as the open found it, or
    /// as far as the open got).
    pub(crate) fn abandon(&self) {
        if let Some(rw) = &self.rw {
            // Relaxed: see `rw`.
            rw.unmounted.store(true, Ordering::Relaxed);
        }
    }

    /// Put `inode` back in the inode cache (an O_TMPFILE file that got a
    /// name: `forget_inode` took it out), so that a lookup of its name
    /// finds this inode, not a second copy read from the image.
    pub(crate) fn icache_put(&self, inode: &Arc<Inode>) {
        let ino = inode.ino() as u32;
        self.icache(ino).map.insert(ino, Arc::downgrade(inode));
    }

    /// The inode cache shard of `ino`, locked.
    fn icache(&self, ino: u32) -> MutexGuard<'_, InodeCache> {
        self.cache[ino as usize % ICACHE_SHARDS].lock()
    }

    /// A read-write mount that writes through the image's journal.
    pub(crate) fn rw_journaled(&self) -> bool {
        self.rw.as_ref().is_some_and(|r| r.journaled)
    }

    /// The orphan file, on journaled mounts of images that have one.
    pub(crate) fn orphan_disk(&self) -> Option<&OrphanDisk> {
        self.rw.as_ref()?.orphans.get()
    }

    /// Free the queued unlinked inodes nothing holds (`all`: every one,
    /// at unmount).
    fn reap(&self, all: bool) -> Result<Vec<u32>> {
        self.reap_some(all, None)
    }

    /// `reap`, limited to the inodes `only` lists when given (the ones
    /// whose drop was signalled). An inode too large to free in one
    /// handle (`Ext4::release_step`) loses one step's worth of blocks and
    /// goes back on the queue, still an orphan: returned, for the caller
    /// to continue in a new handle (or the next commit to).
    fn reap_some(&self, all: bool, only: Option<&[u32]>) -> Result<Vec<u32>> {
        let Some(rw) = &self.rw else {
            return Ok(Vec::new());
        };
        #[allow(clippy::type_complexity)]
        let mut ready: Vec<(u32, Weak<Inode>, OrphanSlot)> = Vec::new();
        match only {
            Some(list) => {
                for &ino in list {
                    let mut l = rw.unlinked.shard(u64::from(ino)).lock();
                    if let Some(k) = l
                        .iter()
                        .position(|(i, w, _)| *i == ino && (all || w.strong_count() == 0))
                    {
                        ready.push(l.swap_remove(k));
                    }
                }
            }
            None => rw.unlinked.for_each(all, |l| {
                let (go, keep): (Vec<_>, Vec<_>) = std::mem::take(l)
                    .into_iter()
                    .partition(|(_, w, _)| all || w.strong_count() == 0);
                *l = keep;
                ready.extend(go);
            }),
        }
        let requeue = |ino: u32, weak: Weak<Inode>, slot: OrphanSlot| {
            rw.unlinked
                .shard(u64::from(ino))
                .lock()
                .push((ino, weak, slot));
        };
        // Metadata blocks this call may change, and has (bitmap groups,
        // inode table and orphan blocks: `groups_of`, `record_keys`): the
        // first inode always goes (whole, or a step of it:
        // `release_step`); the next only while the blocks changed so far,
        // with its own, stay within the budget and it needs no step, else
        // it waits for a later handle (returned with the partial ones).
        // A commit of many unlinked files then fits the log, as the
        // kernel frees each evicted inode in a handle of its own. The
        // budget is one step's (`step_groups`, half the transaction limit:
        // a reap may run inside another handle or in a commit whose
        // transaction is already at the limit, so it must stay small
        // beside the log), but at least 32 blocks, so that a limit
        // lowered for a test still frees several small files at once.
        let budget = self.step_groups().map(|b| b.max(32));
        let mut used = std::collections::HashSet::new();
        let mut partial = Vec::new();
        let mut ready = ready.into_iter();
        while let Some((ino, weak, slot)) = ready.next() {
            let live = weak.upgrade();
            let ei = live.as_deref().and_then(|i| i.private::<Ext4Inode>());
            // Until the orphan record goes, a failure has changed nothing
            // (a step that changed part fails the filesystem itself,
            // `drop_range_step`): this inode and the rest stay queued.
            let step = (|| {
                let mut raw = match ei {
                    Some(e) => e.raw(),
                    None => self.read_inode(ino)?,
                };
                let r = if raw.links_count == 0 {
                    self.check(self.release_step(&mut raw, used.is_empty()))?
                } else {
                    Release::Fits(Vec::new())
                };
                Ok((raw, r))
            })();
            let (raw, r) = match step {
                Ok((raw, Release::Fits(mut g))) => {
                    // Besides its bitmaps: its inode table block and its
                    // orphan record's block (or list neighbour).
                    g.extend(self.record_keys(ino, slot));
                    g.sort_unstable();
                    g.dedup();
                    (raw, Release::Fits(g))
                }
                Ok(v) => v,
                Err(e) => {
                    drop(live);
                    requeue(ino, weak, slot);
                    ready.for_each(|(i, w, s)| requeue(i, w, s));
                    return Err(e);
                }
            };
            match r {
                Release::Stepped => {
                    // A step takes the whole budget.
                    used.extend(0..budget.unwrap_or(0) as u64 + 1);
                    if let Some(e) = ei {
                        e.set_raw(raw);
                    }
                }
                Release::Later => {}
                Release::Fits(g)
                    if budget.is_some_and(|b| {
                        !used.is_empty()
                            && used.len() + g.iter().filter(|x| !used.contains(*x)).count() > b
                    }) => {}
                Release::Fits(g) => {
                    used.extend(g);
                    // Its orphan record goes in the transaction that frees
                    // it (first: the list's link must not be encoded into
                    // the freed inode). From here a failure leaves half a
                    // change (the record gone, blocks queued to be freed
                    // while the inode still maps them): the filesystem
                    // stops writing, so it never commits.
                    let done = (|| {
                        let listed = self.orphan_remove(slot, ino)?;
                        if raw.links_count == 0 {
                            self.release_inode(raw)?;
                        } else if listed {
                            // Linked again: its dtime no longer links the list.
                            self.write_inode(&raw, false)?;
                        }
                        Ok(())
                    })();
                    if let Err(e) = done {
                        ready.for_each(|(i, w, s)| requeue(i, w, s));
                        return Err(self.stop_writes(e));
                    }
                    continue;
                }
            }
            drop(live);
            requeue(ino, weak, slot);
            partial.push(ino);
        }
        Ok(partial)
    }

    /// Keys (apart from `groups_of`'s bitmap groups, which are below
    /// 2^32 or above 2^64 - 2^32) for the other blocks freeing `ino`
    /// logs: its inode table block and the block of its orphan-file slot
    /// (`META | block`), or, on an orphan list, the neighbour whose link
    /// changes (`NEIGHBOUR | ino`: its block is not known without a read,
    /// so counted as one more block). Each block the transaction logs
    /// then counts once toward `reap_some`'s budget.
    fn record_keys(&self, ino: u32, slot: OrphanSlot) -> Vec<u64> {
        const META: u64 = 1 << 62;
        const NEIGHBOUR: u64 = 1 << 61;
        let mut k = Vec::with_capacity(2);
        if let Ok((blk, _, _)) = self.inode_slot(ino) {
            k.push(META | blk);
        }
        if self.orphan_list().is_some() || slot == OrphanSlot::Overflow {
            k.push(NEIGHBOUR | u64::from(ino));
        } else if let (OrphanSlot::Slot { block, .. }, Some(od)) = (slot, self.orphan_disk()) {
            if let Some(&b) = od.blocks.get(block as usize) {
                k.push(META | b);
            }
        }
        k
    }

    /// Free now, in a handle of its own, every unlinked inode whose last
    /// reference went and that waits for a handle of the thread that
    /// dropped it or for the next commit (`Ext4Inode::on_drop`). `statfs`
    /// calls it, as the kernel frees such an inode when it evicts it, so
    /// that `df` after `rm` shows the space free: through the FUSE mount
    /// the inode goes at the kernel's FORGET, on a request thread that may
    /// have no further request, and with nothing else dirty no commit came
    /// either, so a removed 100 MiB file stayed counted as used until the
    /// next change. Does nothing inside a handle, on a mount that stopped
    /// writing, or when nothing waits; a failure is logged (it stops
    /// writes, as any write error does).
    fn reap_queued(&self) {
        let (Some(rw), Some(j)) = (&self.rw, self.journal()) else {
            return;
        };
        // Relaxed: see `rw`.
        if rw.dead.is_empty()
            || Handle::nested(j)
            || rw.failed.load(Ordering::Relaxed)
            || rw.unmounted.load(Ordering::Relaxed)
        {
            return;
        }
        let partial = {
            let Ok(_h) = self.handle() else { return };
            let dead = rw.dead.drain_all();
            if dead.is_empty() {
                return;
            }
            self.reap_some(false, Some(&dead)).unwrap_or_else(|e| {
                eprintln!("scalevfs-ext4: freeing unlinked inodes failed: {e}");
                Vec::new()
            })
        };
        if let Err(e) = self.reap_rest(partial) {
            eprintln!("scalevfs-ext4: freeing unlinked inodes failed: {e}");
        }
    }

    /// Finish freeing the unlinked inodes `partial` (`reap_some` freed a
    /// step of each): a step per inode per handle, outside the caller's
    /// handle, so that each handle may commit first.
    fn reap_rest(&self, mut partial: Vec<u32>) -> Result<()> {
        while !partial.is_empty() {
            let _h = self.handle()?;
            partial = self.reap_some(false, Some(&partial))?;
        }
        Ok(())
    }

    /// Unmount: free the unlinked inodes, write everything back, mark the
    /// filesystem clean and refuse any later change (EROFS). Dropping the
    /// last `Arc<Ext4>` does the same, but a `Vfs` may release its
    /// filesystem late (epoch-deferred), so an owner that knows it is done
    /// calls this. A second call does nothing.
    pub fn unmount(&self) -> Result<()> {
        let Some(rw) = &self.rw else { return Ok(()) };
        // Relaxed: see `rw`.
        if rw.unmounted.load(Ordering::Relaxed) {
            return Ok(());
        }
        let r = self.writeback(true);
        // Relaxed: see `rw`.
        rw.unmounted.store(true, Ordering::Relaxed);
        // Nothing is written from here on: the image may be opened
        // read-write again, even while inodes freed after a grace period
        // still hold this filesystem (and so its device) a while.
        self.dev.release_claim();
        r
    }

    fn writeback(&self, clean: bool) -> Result<()> {
        let Some(rw) = &self.rw else { return Ok(()) };
        if let Some(j) = rw.journal.get() {
            if !clean {
                return self.commit();
            }
            // The last commit (every unlinked inode freed), then a
            // checkpoint and an empty log without needs_recovery.
            scalevfs::flush_deferred_frees();
            // Unlinked inodes still queued (open until now) are freed one
            // per handle, a large one a step per handle, as the mount's
            // orphan processing does: each handle may commit first, so
            // the last commit does not free them all at once.
            let mut queued = Vec::new();
            rw.unlinked
                .for_each(true, |l| queued.extend(l.iter().map(|(i, _, _)| *i)));
            for ino in queued {
                let mut only = vec![ino];
                // Relaxed: see `rw`.
                while !only.is_empty() && !rw.failed.load(Ordering::Relaxed) {
                    let _h = self.handle()?;
                    only = self.reap_some(true, Some(&only))?;
                }
            }
            // Any queued meanwhile; too large for that commit: a step per
            // handle (each may commit).
            // Relaxed: see `rw`.
            while !rw.failed.load(Ordering::Relaxed) {
                let _h = self.handle()?;
                if self.reap(true)?.is_empty() {
                    break;
                }
            }
            // Declared first, dropped last: the sleepers wake after the
            // lock is released.
            let _wake = Released(j);
            let mut st = j.commit.lock();
            self.commit_locked(j, &mut st, true)?;
            if let Some(log) = st.log.take() {
                log.close()?;
            }
            rw.bufs.checkpointed(u64::MAX);
            // Slots still used on disk. (An inode left on the fallback
            // orphan list keeps `s_last_orphan`, which the superblock
            // written below carries.)
            let orphans_left = self.orphan_disk().is_some_and(|od| {
                let per = od.file.slots_per_block();
                (0..od.file.blocks()).any(|b| od.file.free_slots(b) as usize != per)
            });
            {
                let mut raw = rw.sb_raw.lock();
                let inc = u32::from_le_bytes([raw[0x60], raw[0x61], raw[0x62], raw[0x63]])
                    & !INCOMPAT_RECOVER;
                raw[0x60..0x64].copy_from_slice(&inc.to_le_bytes());
                // Every unlinked orphan was freed by the last commit; a
                // long truncate that failed half-way (`truncate_rest`)
                // keeps its record for the next mount, and the flag.
                if !orphans_left {
                    let ro = u32::from_le_bytes([raw[0x64], raw[0x65], raw[0x66], raw[0x67]])
                        & !RO_COMPAT_ORPHAN_PRESENT;
                    raw[0x64..0x68].copy_from_slice(&ro.to_le_bytes());
                }
            }
            self.write_super(true)?;
            self.dev.flush()?;
            return Ok(());
        }
        // Relaxed: see `rw`.
        if !rw.failed.load(Ordering::Relaxed) {
            self.reap(clean)?;
        }
        // Relaxed: see `rw`.
        if rw.failed.load(Ordering::Relaxed) {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::EROFS)));
        }
        let (_, io) = self.rw()?;
        rw.alloc
            .write_descs(&io, |gdb| gdt_block(&self.sb, gdb), true)?;
        rw.bufs.write_back(&*self.dev)?;
        self.write_super(clean)?;
        self.dev.flush()?;
        Ok(())
    }

    /// Read and check inode `ino`.
    pub fn read_inode(&self, ino: u32) -> Result<RawInode> {
        if ino == 0 || ino > self.sb.inodes_count {
            return Err(corrupt(format!("inode {ino}"), "inode number out of range"));
        }
        let ipg = self.sb.inodes_per_group;
        let g = (ino - 1) / ipg;
        let idx = (ino - 1) % ipg;
        let gd = self
            .groups
            .get(g as usize)
            .ok_or_else(|| corrupt(format!("inode {ino}"), "group out of range"))?;
        let isz = self.sb.inode_size();
        let off = idx as usize * isz;
        let blk = gd.inode_table + (off / self.bs) as u64;
        let mut b = BlockBuf::zeroed(self.bs);
        self.read_block(blk, &mut b)?;
        let inb = off % self.bs;
        RawInode::parse(&self.sb, ino, &b[inb..inb + isz])
    }

    /// The VFS inode for `ino` (cached). A miss reads the inode with no
    /// lock held; if the inode was forgotten (its last name went) during
    /// that read, the copy is from before and it reads again (`forgot`).
    pub fn iget(&self, ino: u32) -> Result<Arc<Inode>> {
        let mut start = {
            let mut c = self.icache(ino);
            if let Some(i) = c.map.get(&ino).and_then(Weak::upgrade) {
                return Ok(i);
            }
            c.loading += 1;
            c.forget_gen
        };
        // Bounded: each retry follows a forget of this very inode during
        // the read before it (one per unlink of a name it had).
        let mut tries = 0;
        loop {
            let r = self.load_inode(ino);
            let mut c = self.icache(ino);
            let stale = c.forgot.get(&ino).is_some_and(|&g| g > start);
            if r.is_ok() && stale && tries < 8 {
                tries += 1;
                start = c.forget_gen;
                continue;
            }
            c.loading -= 1;
            if c.loading == 0 {
                c.forgot.clear();
            }
            drop(c);
            if stale {
                return Err(corrupt(
                    format!("inode {ino}"),
                    "removed again and again while being read",
                ));
            }
            return self.icache_insert(ino, r?);
        }
    }

    /// The type of the inode a directory entry names, for an entry that
    /// does not carry one (images without `filetype`): from the cached
    /// inode, else from the stored mode, read without the checks and the
    /// cache of `iget` (an unlink running beside the listing may have
    /// freed it: the listing goes on, as the kernel's, which reads no
    /// inode at all). What cannot be read lists as a regular file (the VFS
    /// has no DT_UNKNOWN).
    fn entry_type(&self, ino: u32) -> FileType {
        // The shard's lock is gone before the inode may drop.
        let cached = self.icache(ino).map.get(&ino).and_then(Weak::upgrade);
        if let Some(i) = cached {
            return i.file_type();
        }
        self.read_inode(ino)
            .ok()
            .and_then(|r| FileType::from_mode(u32::from(r.mode)))
            .unwrap_or(FileType::Regular)
    }

    /// Whether `ino` is one of the filesystem's own inodes (below
    /// `first_ino`, the root included, the journal, the orphan file, quota
    /// files), which no name and no orphan record may name (the kernel's
    /// `__ext4_iget` with `EXT4_IGET_NORMAL`).
    pub(crate) fn is_reserved_ino(&self, ino: u32) -> bool {
        let sb = &self.sb;
        ino < sb.first_ino()
            || (ino == sb.journal_inum && sb.has_compat(COMPAT_HAS_JOURNAL))
            || (ino == sb.orphan_file_inum && sb.orphan_file_inum != 0)
            || sb.quota_inums().contains(&ino)
    }

    /// Read inode `ino` and make its VFS inode (not cached yet). The
    /// filesystem's own inodes (below `first_ino` but the root, the
    /// journal, the orphan file, quota files, xattr value inodes) are
    /// never files a name may reach: a directory entry naming one is
    /// corruption, as the kernel's `__ext4_iget` says, not a way to write
    /// into the journal or free the orphan file's blocks.
    fn load_inode(&self, ino: u32) -> Result<Arc<Inode>> {
        if self.is_reserved_ino(ino) && ino != inode::ROOT_INO {
            return Err(corrupt(
                format!("inode {ino}"),
                "a name refers to a reserved inode",
            ));
        }
        let raw = self.read_inode(ino)?;
        if raw.flags & inode::FL_EA_INODE != 0 {
            return Err(corrupt(
                format!("inode {ino}"),
                "a name refers to an xattr value inode",
            ));
        }
        if raw.links_count == 0 {
            return Err(corrupt(
                format!("inode {ino}"),
                "a name refers to a free inode",
            ));
        }
        let Some(ft) = FileType::from_mode(u32::from(raw.mode)) else {
            return Err(corrupt(
                format!("inode {ino}"),
                format!("mode {:#o}", raw.mode),
            ));
        };
        if raw.flags & inode::FL_INLINE_DATA != 0 && !self.sb.has_incompat(INCOMPAT_INLINE_DATA) {
            // The flag without the feature is corruption (EUCLEAN).
            return Err(corrupt(
                format!("inode {ino}"),
                "inline data flag without the feature",
            ));
        }
        let rdev = match ft {
            FileType::CharDevice | FileType::BlockDevice => raw.rdev(),
            _ => 0,
        };
        if ft == FileType::Symlink && raw.size > 4096 {
            return Err(corrupt(
                format!("inode {ino}"),
                format!("symlink length {}", raw.size),
            ));
        }
        let attr = Attr {
            mode: u32::from(raw.mode),
            uid: raw.uid,
            gid: raw.gid,
            nlink: u32::from(raw.links_count),
            size: raw.size,
            blocks: raw.blocks,
            rdev,
            atime_sec: raw.atime.0,
            atime_nsec: raw.atime.1,
            mtime_sec: raw.mtime.0,
            mtime_nsec: raw.mtime.1,
            ctime_sec: raw.ctime.0,
            ctime_nsec: raw.ctime.1,
        };
        let generation = raw.generation;
        let crtime = raw
            .crtime
            .map(|(sec, nsec)| scalevfs::types::Timespec { sec, nsec });
        let chattr = raw.flags & scalevfs::inode::FS_FL_SETTABLE;
        let acl_raw = (raw.ibody_xattrs || raw.file_acl != 0).then(|| raw.clone());
        let mapped = raw.file_type_bits() == libc::S_IFREG
            && block_mapped(&raw, self.bs, self.has_ea_inode());
        let inline_file =
            raw.file_type_bits() == libc::S_IFREG && raw.flags & inode::FL_INLINE_DATA != 0;
        let new = Arc::new(
            Inode::new(
                u64::from(ino),
                self.devno,
                attr,
                Box::new(Ext4Inode {
                    link: fast_link(&raw, self.bs, self.has_ea_inode()).map(Box::from),
                    raw: OMutex::new(Class::Ext4Raw, raw),
                    dir_lock: ORwLock::new(Class::Ext4Dir, ()),
                    data: ORwLock::new(Class::Ext4File, ()),
                    on_drop: OnceLock::new(),
                    // Made or read inside a handle: possibly new in its commit.
                    last_tid: AtomicU64::new(current_tid()),
                    mapped,
                    may_inline: AtomicBool::new(inline_file),
                    reshaping: AtomicBool::new(false),
                }),
            )
            .with_generation(generation)
            .with_birth(crtime)
            .with_blkbits(self.bs.trailing_zeros() as u8),
        );
        // chattr flags as stored (immutable and append-only are enforced by
        // the core, as the kernel enforces them).
        new.set_fs_flags(chattr);
        // POSIX ACLs, which the core checks from its cache (Linux's i_acl).
        if let Some(raw) = acl_raw {
            self.load_acls(&new, &raw);
        }
        Ok(new)
    }

    /// Put `new` (just read) in the cache, unless another thread put one
    /// for `ino` there meanwhile (then that one: one inode per number).
    fn icache_insert(&self, ino: u32, new: Arc<Inode>) -> Result<Arc<Inode>> {
        // Inodes the recent list lets go are dropped after the shard's lock
        // (nothing is taken under it; a last reference's drop may take
        // other locks).
        let mut evicted = Vec::new();
        let sweep = {
            let mut c = self.icache(ino);
            if let Some(i) = c.map.get(&ino).and_then(Weak::upgrade) {
                // Another thread read it meanwhile: one inode per number.
                return Ok(i);
            }
            c.map.insert(ino, Arc::downgrade(&new));
            c.recent.push_back((ino, new.clone()));
            while c.recent.len() > self.cache_cap.div_ceil(ICACHE_SHARDS) {
                evicted.extend(c.recent.pop_front());
            }
            c.map.len() > 2 * c.swept.max(self.cache_cap.div_ceil(ICACHE_SHARDS))
        };
        drop(evicted);
        // Sweep dead entries when the map doubled (after the drops above, so
        // the inodes just let go count as dead).
        if sweep {
            let mut c = self.icache(ino);
            c.map.retain(|_, w| w.strong_count() > 0);
            c.swept = c.map.len();
        }
        Ok(new)
    }

    /// Number of inode numbers in the cache's map (live or not yet swept).
    pub fn cached_inodes(&self) -> usize {
        self.cache.iter().map(|c| c.lock().map.len()).sum()
    }

    pub(crate) fn node(i: &Inode) -> VfsResult<RawInode> {
        i.private::<Ext4Inode>().map(|n| n.raw()).ok_or(Errno::EIO)
    }

    /// The largest file size, as the kernel's ext4_max_size: 2^32 - 1
    /// blocks (ee_block is 32 bits, one block kept so that an extent can
    /// reach the end); without huge_file also i_blocks' 2^32 - 1 sectors.
    pub(crate) fn max_size(&self) -> u64 {
        let bits = self.bs.trailing_zeros();
        let res = ((1u64 << 32) - 1) << bits;
        if self.sb.has_ro_compat(RO_COMPAT_HUGE_FILE) {
            res
        } else {
            res.min((((1u64 << 32) - 1) >> bits.saturating_sub(9)) << bits)
        }
    }

    /// The largest size of a block-mapped file, as the kernel's
    /// ext4_max_bitmap_size (`s_bitmap_maxbytes`): what 12 direct
    /// pointers and a single, double and triple indirect block reach,
    /// unless `i_blocks` (2^32 - 1 sectors without huge_file, else 2^48 - 1
    /// blocks), counting the map's own blocks, ends it first.
    pub(crate) fn bitmap_max_size(&self) -> u64 {
        let bits = self.bs.trailing_zeros();
        let ppb = 1u64 << (bits - 2);
        let mut limit = if self.sb.has_ro_compat(RO_COMPAT_HUGE_FILE) {
            (1u64 << 48) - 1
        } else {
            ((1u64 << 32) - 1) >> (bits - 9)
        };
        let reach = 12 + ppb + ppb * ppb + ppb * ppb * ppb;
        let meta = 1 + (1 + ppb) + (1 + ppb + ppb * ppb);
        let blocks = if reach + meta <= limit {
            reach
        } else {
            // The blocks `limit` leaves once the map blocks addressing
            // them are counted.
            let res = limit;
            limit -= 12 + ppb;
            let mut meta = 1;
            if limit < ppb * ppb {
                meta += 1 + limit.div_ceil(ppb);
            } else {
                meta += 1 + ppb;
                limit -= ppb * ppb;
                meta += 1 + limit.div_ceil(ppb) + limit.div_ceil(ppb * ppb);
            }
            res - meta
        };
        (blocks << bits).min(i64::MAX as u64)
    }

    /// Where logical block `lblk` of `raw` lives. Data that would lie in
    /// the filesystem's metadata is EFSCORRUPTED (`check_not_meta`).
    pub fn map_block(&self, raw: &RawInode, lblk: u32) -> Result<Mapping> {
        let m = if raw.flags & inode::FL_EXTENTS != 0 {
            self.map_extent(raw, lblk)?
        } else {
            self.map_indirect(raw, lblk)?
        };
        if let Mapping::Data { pblk, count, .. } = m {
            self.check_not_meta(raw.ino, pblk, count)?;
        }
        Ok(m)
    }

    /// EFSCORRUPTED where blocks `[start, start + len)`, which inode `ino`
    /// names as data or as blocks of its tree or map, overlap the
    /// filesystem's metadata (`MetaZone`: superblocks, descriptors,
    /// bitmaps, inode tables, the journal), as the kernel's
    /// `ext4_inode_block_valid`: a write there would go over an inode
    /// table or a bitmap, a free would hand the block out again. The
    /// journal's and the resize inode's own blocks are theirs.
    pub(crate) fn check_not_meta(&self, ino: u32, start: u64, len: u64) -> Result<()> {
        /// The resize inode's number (EXT2_RESIZE_INO).
        const RESIZE_INO: u32 = 7;
        let own = ino == self.sb.journal_inum || ino == self.sb.orphan_file_inum;
        if ino == RESIZE_INO || (own && ino != 0) {
            return Ok(());
        }
        if self
            .meta_zone()?
            .overlaps(start, start.saturating_add(len.max(1)))
        {
            return Err(corrupt(
                format!("inode {ino}"),
                format!("blocks {start}+{len} overlap the filesystem's metadata"),
            ));
        }
        Ok(())
    }

    /// `check_not_meta` for every block extent node `node` of inode `ino`
    /// names (its extents, or its children).
    pub(crate) fn check_node_not_meta(&self, ino: u32, node: &extent::Node) -> Result<()> {
        match node {
            extent::Node::Index(_, v) => v
                .iter()
                .try_for_each(|ix| self.check_not_meta(ino, ix.leaf, 1)),
            extent::Node::Leaf(_, v) => v
                .iter()
                .try_for_each(|x| self.check_not_meta(ino, x.start, u64::from(x.len))),
        }
    }

    /// The extent tree walked without decoding its nodes: one binary
    /// search over each node's raw entries (`extent::search`), and only
    /// the entries it lands on decoded and checked. A tree block is
    /// checked whole (`check_node`: checksum, order, bounds) once per
    /// cached generation, as the kernel's `buffer_verified`, and searched
    /// where it lies in the buffer cache (`BufCache::with_cached`), not
    /// copied out; so a lookup in a warm tree costs O(depth * log(entries)).
    fn map_extent(&self, raw: &RawInode, lblk: u32) -> Result<Mapping> {
        let what = ino_what(raw.ino);
        let fs_blocks = self.sb.blocks_count;
        let h = extent::check_node(&raw.block, &what, None, None, fs_blocks)?;
        let seed = self.sb.has_metadata_csum().then_some(raw.csum_seed);
        let key = u64::from(lblk);
        // (The end of the range the node covers, exclusive.)
        let mut step = map_in_node(&raw.block, h, key, 1 << 32, &what, fs_blocks)?;
        let mut buf: Option<BlockBuf> = None;
        // Depth is at most MAX_DEPTH and falls by one each step.
        loop {
            let (child, depth, limit) = match step {
                MapStep::Found(m) => return Ok(m),
                MapStep::Child(c, d, l) => (c, d, l),
            };
            let w = || format!("inode {} extent block {child}", raw.ino);
            // One node: checked whole unless this content was, then
            // searched.
            let visit = |b: &[u8], verified: bool| -> (Result<MapStep>, bool) {
                let h = if verified {
                    extent::check_header(b, &w, Some(depth))
                } else {
                    extent::check_node(b, &w, Some(depth), seed, fs_blocks)
                };
                match h {
                    Ok(h) => (map_in_node(b, h, key, limit, &w, fs_blocks), !verified),
                    Err(e) => (Err(e), false),
                }
            };
            let cached = match &self.rw {
                Some(rw) if child < fs_blocks => rw.bufs.with_cached(child, visit),
                _ => None,
            };
            step = match cached {
                Some(r) => r?,
                None => {
                    let b = buf.get_or_insert_with(|| BlockBuf::zeroed(self.bs));
                    let r = self.read_meta(child, b)?;
                    let (s, checked) = visit(b, r.verified);
                    if checked {
                        self.verified_meta(&r);
                    }
                    s?
                }
            };
        }
    }

    /// The ext2/3 block map: 12 direct pointers, then single, double and
    /// triple indirect blocks. A hole reports how far it reaches: to the
    /// end of the missing indirect block's span (or past the last block
    /// the map can hold), so a walk over a sparse file (SEEK_DATA, FIEMAP)
    /// skips a missing subtree in one step.
    fn map_indirect(&self, raw: &RawInode, lblk: u32) -> Result<Mapping> {
        let per = (self.bs / 4) as u64;
        let mut l = u64::from(lblk);
        let (mut ptr, levels) = if l < 12 {
            (raw.block_word(l as usize), 0)
        } else {
            l -= 12;
            if l < per {
                (raw.block_word(12), 1)
            } else if l - per < per * per {
                l -= per;
                (raw.block_word(13), 2)
            } else {
                l -= per + per * per;
                if l >= per * per * per {
                    return Ok(Mapping::Hole {
                        count: (1u64 << 32) - u64::from(lblk),
                    });
                }
                (raw.block_word(14), 3)
            }
        };
        let mut buf = BlockBuf::zeroed(self.bs);
        for level in (0..levels).rev() {
            if ptr == 0 {
                // The missing block would map per^(level + 1) blocks.
                let span = per.pow(level + 1);
                return Ok(Mapping::Hole {
                    count: span - l % span,
                });
            }
            self.read_block(u64::from(ptr), &mut buf)?;
            let idx = (l / per.pow(level)) % per;
            ptr = crate::format::le32(&buf, idx as usize * 4);
        }
        if ptr == 0 {
            return Ok(Mapping::Hole { count: 1 });
        }
        if u64::from(ptr) >= self.sb.blocks_count {
            return Err(corrupt(
                format!("inode {}", raw.ino),
                format!("block pointer {ptr}"),
            ));
        }
        Ok(Mapping::Data {
            pblk: u64::from(ptr),
            count: 1,
            uninit: false,
        })
    }

    /// Read file data of `raw` at `off` (clipped to its size).
    fn read_data(&self, raw: &RawInode, off: u64, buf: &mut [u8]) -> Result<usize> {
        if off >= raw.size {
            return Ok(0);
        }
        let want = (buf.len() as u64).min(raw.size - off) as usize;
        if raw.flags & inode::FL_INLINE_DATA != 0 {
            // The stored bytes, then zeros up to the size.
            let d = self.inline_file(raw)?;
            let have = (d.len() as u64).saturating_sub(off).min(want as u64) as usize;
            if have > 0 {
                buf[..have].copy_from_slice(&d[off as usize..off as usize + have]);
            }
            buf[have..want].fill(0);
            return Ok(want);
        }
        let bs = self.bs as u64;
        let mut done = 0usize;
        while done < want {
            let pos = off + done as u64;
            let lblk = pos / bs;
            let inb = pos % bs;
            let rest = want - done;
            let (map, cap) = match u32::try_from(lblk) {
                Ok(l) => {
                    let m = self.map_block(raw, l)?;
                    let count = match m {
                        Mapping::Data { count, .. } | Mapping::Hole { count } => count,
                    };
                    (m, count.max(1).saturating_mul(bs) - inb)
                }
                Err(_) => (Mapping::Hole { count: 1 }, u64::MAX),
            };
            let n = (rest as u64).min(cap) as usize;
            let dst = &mut buf[done..done + n];
            match map {
                Mapping::Data {
                    pblk,
                    uninit: false,
                    count,
                } => {
                    if !matches!(pblk.checked_add(count), Some(e) if e <= self.sb.blocks_count) {
                        return Err(corrupt(format!("inode {}", raw.ino), "data beyond the end"));
                    }
                    self.dev.read_at(pblk * bs + inb, dst)?;
                }
                _ => dst.fill(0),
            }
            done += n;
        }
        Ok(done)
    }

    /// SEEK_DATA (`data`) / SEEK_HOLE from `off`, as ext4_llseek on a clean
    /// image: unwritten extents count as holes, EOF is a hole.
    fn seek_raw(&self, raw: &RawInode, off: u64, data: bool) -> Result<Option<u64>> {
        if off >= raw.size {
            return Ok(None);
        }
        if raw.flags & inode::FL_INLINE_DATA != 0 {
            // Inline data: the bytes the inode holds are data (the
            // kernel's iomap reports them as one inline extent), and what
            // a size past them adds is a hole. (There the kernel answers
            // ENOENT, its inline iomap's "no extent", from any offset.)
            let held = (self.inline_bytes(raw)?.len() as u64).min(raw.size);
            return Ok(match (data, off < held) {
                (true, true) => Some(off),
                (true, false) => None,
                (false, true) => Some(held),
                (false, false) => Some(off),
            });
        }
        let bs = self.bs as u64;
        let mut lblk = off / bs;
        // Each step passes one extent or one hole between extents; the
        // extents of a file are bounded by its tree, itself by the image.
        while lblk * bs < raw.size {
            let Ok(l) = u32::try_from(lblk) else {
                break;
            };
            let (is_data, count) = match self.map_block(raw, l)? {
                Mapping::Data {
                    uninit: false,
                    count,
                    ..
                } => (true, count),
                Mapping::Data { count, .. } | Mapping::Hole { count } => (false, count),
            };
            if is_data == data {
                return Ok(Some((lblk * bs).max(off)));
            }
            lblk += count.max(1);
        }
        // Past the last extent: a hole up to EOF, and no more data.
        Ok(if data { None } else { Some(raw.size) })
    }

    /// Block `lblk` of directory `raw` into `buf`; a hole is corruption.
    pub(crate) fn dir_block(&self, raw: &RawInode, lblk: u32, buf: &mut [u8]) -> Result<MetaRead> {
        match self.map_block(raw, lblk)? {
            Mapping::Data { pblk, uninit, .. } => {
                if uninit {
                    return Err(corrupt(
                        format!("directory {}", raw.ino),
                        format!("block {lblk} is unwritten"),
                    ));
                }
                self.read_meta(pblk, buf)
            }
            Mapping::Hole { .. } => Err(corrupt(
                format!("directory {}", raw.ino),
                format!("hole at block {lblk}"),
            )),
        }
    }

    pub(crate) fn dir_blocks(&self, raw: &RawInode) -> Result<u32> {
        let n = raw.size.div_ceil(self.bs as u64);
        if n > self.sb.blocks_count || n > u64::from(u32::MAX) {
            return Err(corrupt(
                format!("directory {}", raw.ino),
                format!("size {}", raw.size),
            ));
        }
        Ok(n as u32)
    }

    pub(crate) fn is_htree(&self, raw: &RawInode) -> bool {
        raw.flags & inode::FL_INDEX != 0 && self.sb.has_compat(COMPAT_DIR_INDEX)
    }

    pub(crate) fn csum_seed(&self, raw: &RawInode) -> Option<u32> {
        self.sb.has_metadata_csum().then_some(raw.csum_seed)
    }

    /// Whether directory block `b` is an htree interior node (one empty
    /// entry covering the whole block, so no room for a dirent tail).
    pub(crate) fn is_dx_node(&self, b: &[u8]) -> bool {
        crate::format::le32(b, 0) == 0
            && dir::rec_len_from_disk(crate::format::le16(b, 4), self.bs) == self.bs
    }

    /// Whether directory block `b` of indexed directory `raw`, reached as
    /// a leaf, is an index node after all: `is_dx_node`'s fake entry
    /// (name length and type 0) with a count/limit header that fits. A
    /// leaf whose names were all removed also starts with one free entry
    /// spanning the block (on images without metadata_csum, where no
    /// tail follows it): its header bytes are a removed name's or zeros,
    /// which fail this (a count of 0, or a limit past the room). The
    /// kernel tells the two apart by position only; it used to be
    /// EUCLEAN for every lookup and create that reached such a leaf
    /// (review, stop 38).
    fn looks_like_dx_node(&self, raw: &RawInode, b: &[u8]) -> bool {
        if !self.is_dx_node(b) || b[6] != 0 || b[7] != 0 {
            return false;
        }
        let (limit, count) = (crate::format::le16(b, 8), crate::format::le16(b, 10));
        let tail = if self.csum_seed(raw).is_some() {
            htree::DX_TAIL_SIZE
        } else {
            0
        };
        let room = (self.bs - htree::NODE_COUNT_OFF - tail) / htree::DX_ENTRY_SIZE;
        count >= 1 && count <= limit && usize::from(limit) <= room
    }

    /// The live entries of directory block `lblk` (`b` holds it); `None` for
    /// an htree index block.
    pub(crate) fn leaf_entries<'a>(
        &self,
        raw: &RawInode,
        lblk: u32,
        b: &'a [u8],
    ) -> Result<Option<Vec<Entry<'a>>>> {
        self.leaf_entries_at(raw, lblk, b, None)
    }

    /// `leaf_entries` of a block read by `read_meta` (`read`): its tail
    /// checksum is checked once per cached generation.
    pub(crate) fn leaf_entries_at<'a>(
        &self,
        raw: &RawInode,
        lblk: u32,
        b: &'a [u8],
        read: Option<&MetaRead>,
    ) -> Result<Option<Vec<Entry<'a>>>> {
        let what = || format!("directory {} block {lblk}", raw.ino);
        if !self.leaf_checked(raw, lblk, b, read, &what)? {
            return Ok(None);
        }
        let filetype = self.sb.has_incompat(INCOMPAT_FILETYPE);
        let v = dir::entries(b, self.csum_seed(raw).is_some(), filetype, &what)?;
        Ok(Some(v))
    }

    /// Whether leaf block `lblk` of directory `raw` (in `b`, read as `read`
    /// says) has room for a `name_len`-byte name: its tail checksum checked
    /// once per cached generation, then its entries up to the first with
    /// room, each as it is reached, as the kernel's `ext4_find_dest_de`
    /// (the block is not decoded whole). `None` for an htree index block.
    pub(crate) fn leaf_room(
        &self,
        raw: &RawInode,
        lblk: u32,
        b: &[u8],
        read: &MetaRead,
        name_len: usize,
    ) -> Result<Option<bool>> {
        let what = || format!("directory {} block {lblk}", raw.ino);
        if !self.leaf_checked(raw, lblk, b, Some(read), &what)? {
            return Ok(None);
        }
        let need = dir::rec_len_needed(name_len);
        let filetype = self.sb.has_incompat(INCOMPAT_FILETYPE);
        let tail = self.csum_seed(raw).is_some();
        dir::scan(b, tail, filetype, &what, |e| dir::has_room(&e, need)).map(Some)
    }

    /// Whether directory block `lblk` (in `b`) is a leaf (false: an htree
    /// index block), its tail checksum checked once per cached generation
    /// (`read`).
    fn leaf_checked(
        &self,
        raw: &RawInode,
        lblk: u32,
        b: &[u8],
        read: Option<&MetaRead>,
        what: &dyn Fn() -> String,
    ) -> Result<bool> {
        if self.is_htree(raw) && (lblk == 0 || self.looks_like_dx_node(raw, b)) {
            return Ok(false);
        }
        if let Some(s) = self.csum_seed(raw) {
            if !read.is_some_and(|r| r.verified) {
                dir::verify_tail(b, s, what)?;
                if let Some(r) = read {
                    self.verified_meta(r);
                }
            }
        }
        Ok(true)
    }

    /// The live entry `name` in directory block `lblk` (in `b`, read as
    /// `read` says): its inode. See `entry_in_block`.
    fn find_in_block(
        &self,
        raw: &RawInode,
        lblk: u32,
        b: &[u8],
        read: &MetaRead,
        name: &[u8],
    ) -> Result<Option<u32>> {
        Ok(self
            .entry_in_block(raw, lblk, b, Some(read), name)?
            .map(|(e, _)| e.inode))
    }

    /// The live entry `name` in directory block `lblk` (in `b`; `read`:
    /// how it was read, for its checksum) and the offset of the entry
    /// before it; `None` for an htree index block or no such name. The
    /// entries are checked as the scan reaches them and it stops at the
    /// name, as the kernel's ext4_search_dir: no list of the block's
    /// entries is built.
    pub(crate) fn entry_in_block<'a>(
        &self,
        raw: &RawInode,
        lblk: u32,
        b: &'a [u8],
        read: Option<&MetaRead>,
        name: &[u8],
    ) -> Result<Option<(Entry<'a>, Option<usize>)>> {
        let what = || format!("directory {} block {lblk}", raw.ino);
        if !self.leaf_checked(raw, lblk, b, read, &what)? {
            return Ok(None);
        }
        let filetype = self.sb.has_incompat(INCOMPAT_FILETYPE);
        let tail = self.csum_seed(raw).is_some();
        let (mut found, mut prev) = (None, None);
        dir::scan(b, tail, filetype, &what, |e| {
            if e.inode != 0 && e.name == name {
                found = Some((e, prev));
                return true;
            }
            prev = Some(e.offset);
            false
        })?;
        Ok(found)
    }

    /// Look `name` up by a linear scan of every block.
    pub fn lookup_linear(&self, raw: &RawInode, name: &[u8]) -> Result<Option<u32>> {
        let n = self.dir_blocks(raw)?;
        let mut b = BlockBuf::zeroed(self.bs);
        for lblk in 0..n {
            let r = self.dir_block(raw, lblk, &mut b)?;
            if let Some(i) = self.find_in_block(raw, lblk, &b, &r, name)? {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// Read an htree index block and its entries.
    pub(crate) fn dx_node(
        &self,
        raw: &RawInode,
        lblk: u32,
        buf: &mut [u8],
    ) -> Result<htree::DxEntries> {
        let what = || format!("directory {} htree node {lblk}", raw.ino);
        let nblocks = self.dir_blocks(raw)?;
        if lblk == 0 || lblk >= nblocks {
            return Err(corrupt(what(), "index points outside the directory"));
        }
        self.dir_block(raw, lblk, buf)?;
        if !self.is_dx_node(buf) {
            return Err(corrupt(what(), "not an index block"));
        }
        htree::parse_entries(buf, htree::NODE_COUNT_OFF, self.csum_seed(raw), &what)
    }

    /// Look `name` up through the htree index (the kernel's dx_probe and
    /// ext4_htree_next_block for hash collisions across blocks).
    pub fn lookup_htree(&self, raw: &RawInode, name: &[u8]) -> Result<Option<u32>> {
        self.htree_search(raw, name, &mut |lblk, b, r| {
            self.find_in_block(raw, lblk, b, r, name)
        })
    }

    /// The path from the root of indexed directory `raw` to the leaf that
    /// hash `target(version)` selects (the root's hash version, the
    /// image's unsigned flag applied): `frames[i]` = (index entries,
    /// chosen one) at level i; with the number of index levels below the
    /// root and the version. An unknown hash version is corruption.
    #[allow(clippy::type_complexity)]
    fn htree_path(
        &self,
        raw: &RawInode,
        b: &mut [u8],
        target: &mut dyn FnMut(u8) -> u32,
    ) -> Result<(Vec<(htree::DxEntries, usize)>, usize, u8)> {
        let what = || format!("directory {} htree root", raw.ino);
        self.dir_block(raw, 0, b)?;
        let max_levels = if self.sb.has_incompat(INCOMPAT_LARGEDIR) {
            htree::MAX_LEVELS_LARGEDIR
        } else {
            htree::MAX_LEVELS
        };
        let info = htree::parse_root_info(b, max_levels, &what)?;
        let mut version = info.hash_version;
        if version <= htree::HASH_TEA && self.sb.flags & FLAG_UNSIGNED_HASH != 0 {
            version += 3;
        }
        if htree::dirhash(b"", version, &self.sb.hash_seed).is_none() {
            return Err(corrupt(what(), format!("hash version {version}")));
        }
        let hash = target(version);
        let count_off = htree::ROOT_INFO_OFF + usize::from(info.info_length);
        let root = htree::parse_entries(b, count_off, self.csum_seed(raw), &what)?;
        let pick = |e: &htree::DxEntries| e.entries.partition_point(|x| x.0 <= hash).max(1) - 1;
        let mut frames: Vec<(htree::DxEntries, usize)> = Vec::new();
        let at = pick(&root);
        frames.push((root, at));
        let levels = usize::from(info.indirect_levels);
        while frames.len() <= levels {
            let (e, at) = &frames[frames.len() - 1];
            let child = e.entries[*at].1;
            let node = self.dx_node(raw, child, b)?;
            let at = pick(&node);
            frames.push((node, at));
        }
        Ok((frames, levels, version))
    }

    /// Run `f` on each leaf block (logical number, bytes) of htree
    /// directory `raw` that may hold `name` — the leaf its hash selects,
    /// then the next ones while they continue a run of that hash — until
    /// `f` returns something.
    pub(crate) fn htree_search<T>(
        &self,
        raw: &RawInode,
        name: &[u8],
        f: &mut LeafVisit<'_, T>,
    ) -> Result<Option<T>> {
        let what = || format!("directory {} htree root", raw.ino);
        let nblocks = self.dir_blocks(raw)?;
        let mut b = BlockBuf::zeroed(self.bs);
        let mut hash = 0;
        let (mut frames, levels, _) = self.htree_path(raw, &mut b, &mut |version| {
            hash = htree::dirhash(name, version, &self.sb.hash_seed).unwrap_or(0);
            hash
        })?;
        // Each pass moves to a later leaf: at most nblocks passes.
        for _ in 0..nblocks {
            let (e, at) = &frames[frames.len() - 1];
            let leaf = e.entries[*at].1;
            if leaf == 0 || leaf >= nblocks {
                return Err(corrupt(what(), format!("leaf block {leaf}")));
            }
            let r = self.dir_block(raw, leaf, &mut b)?;
            if self.looks_like_dx_node(raw, &b) {
                return Err(corrupt(what(), format!("leaf {leaf} is an index block")));
            }
            if let Some(i) = f(leaf, &b, &r)? {
                return Ok(Some(i));
            }
            // Continue only while the next leaf starts with our hash (a
            // collision run spanning blocks).
            match self.next_leaf(raw, &mut frames, levels, &mut b)? {
                Some(h) if h & !1 == hash => {}
                _ => return Ok(None),
            }
        }
        Ok(None)
    }

    /// List a directory: `f(ino, name)` for each live entry ("." and ".."
    /// left out) until it returns false.
    pub fn list(&self, raw: &RawInode, f: &mut dyn FnMut(u32, &[u8]) -> bool) -> Result<()> {
        if raw.file_type_bits() != libc::S_IFDIR {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::ENOTDIR)));
        }
        self.readdir_raw(raw, 0, &mut |e| f(e.ino as u32, &e.name))
    }

    /// Look `name` up in directory `raw` (htree or linear, as the directory is).
    pub fn lookup_name(&self, raw: &RawInode, name: &[u8]) -> Result<Option<u32>> {
        if raw.file_type_bits() != libc::S_IFDIR {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::ENOTDIR)));
        }
        self.lookup_ino(raw, name)
    }

    /// The inode number in directory `raw`'s ".." entry: the second
    /// entry of block 0 (in the dx_root of an htree directory, whose
    /// entries at bytes 0 and 12 are the fake "." and "..").
    pub fn dotdot(&self, raw: &RawInode) -> Result<u32> {
        if raw.file_type_bits() != libc::S_IFDIR {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::ENOTDIR)));
        }
        if raw.flags & inode::FL_INLINE_DATA != 0 {
            return Ok(self.inline_dir(raw)?.0);
        }
        let mut b = BlockBuf::zeroed(self.bs);
        self.dir_block(raw, 0, &mut b)?;
        let no = || corrupt(format!("directory {}", raw.ino), "no \"..\" entry");
        let ino = if self.is_htree(raw) {
            // ".." at byte 12: inode (4), rec_len (2), name_len (1),
            // file type (1), the name.
            match b.get(12..22) {
                Some(e) if e[6] == 2 && &e[8..10] == b".." => {
                    u32::from_le_bytes([e[0], e[1], e[2], e[3]])
                }
                _ => return Err(no()),
            }
        } else {
            self.leaf_entries(raw, 0, &b)?
                .and_then(|v| v.iter().find(|e| e.name == b"..").map(|e| e.inode))
                .ok_or_else(no)?
        };
        if ino == 0 || ino > self.sb.inodes_count {
            return Err(corrupt(
                format!("directory {}", raw.ino),
                format!("\"..\" names inode {ino}"),
            ));
        }
        Ok(ino)
    }

    /// Whether inode `ino` (in range) is marked in use in its group's
    /// bitmap; false in a group whose inodes were never initialised.
    fn inode_allocated(&self, ino: u32) -> Result<bool> {
        if let Some(rw) = &self.rw {
            // The allocator's group descriptors are the current ones.
            let io = Io {
                sb: &self.sb,
                dev: &*self.dev,
                bufs: &rw.bufs,
            };
            return rw.alloc.inode_in_use(&io, ino);
        }
        let ipg = self.sb.inodes_per_group.max(1);
        let (g, i) = (((ino - 1) / ipg) as usize, ((ino - 1) % ipg) as usize);
        let Some(gd) = self.groups.get(g) else {
            return Ok(false);
        };
        if gd.flags & group_desc::BG_INODE_UNINIT != 0 {
            return Ok(false);
        }
        let mut b = BlockBuf::zeroed(self.bs);
        self.read_block(gd.inode_bitmap, &mut b)?;
        Ok(b.get(i / 8).is_some_and(|&x| x & (1 << (i % 8)) != 0))
    }

    /// The live inode numbered `ino` for a decoded file handle (the
    /// kernel's `ext4_nfs_get_inode`): `None` for a number out of range, a
    /// reserved or internal inode other than the root (the kernel's
    /// `is_special_ino`: below `first_ino`, the journal, the orphan file;
    /// an xattr value inode), one not in use, and one with no name left.
    fn inode_for_handle(&self, ino: u64) -> Result<Option<Arc<Inode>>> {
        let Ok(n) = u32::try_from(ino) else {
            return Ok(None);
        };
        let special = (n < self.sb.first_ino() && n != inode::ROOT_INO)
            || n == self.sb.journal_inum
            || n == self.sb.orphan_file_inum;
        if n == 0 || n > self.sb.inodes_count || special {
            return Ok(None);
        }
        let cached = self.icache(n).map.get(&n).and_then(Weak::upgrade);
        if let Some(i) = cached {
            // In memory: its link count is the current one (an unlinked
            // file still open has 0).
            return Ok((i.attr().nlink > 0).then_some(i));
        }
        if !self.inode_allocated(n)? {
            return Ok(None);
        }
        let raw = self.read_inode(n)?;
        if raw.links_count == 0 || raw.flags & inode::FL_EA_INODE != 0 {
            return Ok(None);
        }
        let i = self.iget(n)?;
        Ok((i.attr().nlink > 0).then_some(i))
    }

    pub(crate) fn lookup_ino(&self, raw: &RawInode, name: &[u8]) -> Result<Option<u32>> {
        if raw.flags & inode::FL_INLINE_DATA != 0 {
            let (_, v) = self.inline_dir(raw)?;
            return Ok(v.into_iter().find(|e| e.name == name).map(|e| e.inode));
        }
        if self.is_htree(raw) {
            self.lookup_htree(raw, name)
        } else {
            self.lookup_linear(raw, name)
        }
    }

    fn readdir_raw(
        &self,
        raw: &RawInode,
        cookie: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        let bs = self.bs as u64;
        let start = cookie.saturating_sub(COOKIE_BASE);
        if raw.flags & inode::FL_INLINE_DATA != 0 {
            let (_, v) = self.inline_dir(raw)?;
            if self.sb.has_compat(COMPAT_DIR_INDEX) {
                // In hash order, as the kernel lists an inline directory
                // on a dir_index image (`ext4_htree_fill_tree` through
                // `ext4_inlinedir_to_tree`), and as the one block it moves
                // out to is listed: a listing that goes on across the move
                // keeps its place.
                let version = self.unindexed_hash_version();
                let mut group = Vec::new();
                for e in v {
                    let pos = self.list_pos(version, &e.name).ok_or_else(|| {
                        corrupt(
                            format!("inline directory {}", raw.ino),
                            format!("hash version {version}"),
                        )
                    })?;
                    if pos >= start {
                        group.push((pos, e.name, e.inode, e.file_type));
                    }
                }
                self.emit_hashed(group, start, emit)?;
                return Ok(());
            }
            // Without dir_index, positions in the inline space moved by
            // `INLINE_DIR_SHIFT` (the kernel's `ext4_read_inline_dir`,
            // whose `.` and `..` the VFS adds): the byte offsets the
            // entries get in the block the directory moves out to.
            for e in v
                .into_iter()
                .map(|e| InlineEntry {
                    pos: e.pos + INLINE_DIR_SHIFT,
                    next: e.next + INLINE_DIR_SHIFT,
                    ..e
                })
                .filter(|e| e.pos >= start)
            {
                let file_type = match ft_from_dirent(e.file_type) {
                    Some(t) => t,
                    None => self.entry_type(e.inode),
                };
                let ent = DirEntry {
                    ino: u64::from(e.inode),
                    next_cookie: e.next + COOKIE_BASE,
                    file_type,
                    name: e.name,
                };
                if !emit(ent) {
                    return Ok(());
                }
            }
            return Ok(());
        }
        if self.is_htree(raw) {
            return self.readdir_htree(raw, start, emit);
        }
        let n = self.dir_blocks(raw)?;
        if n == 1 && self.sb.has_compat(COMPAT_DIR_INDEX) {
            return self.readdir_block0_hashed(raw, start, emit);
        }
        let mut b = BlockBuf::zeroed(self.bs);
        let first = start / bs;
        if first >= u64::from(n) {
            return Ok(());
        }
        for lblk in first as u32..n {
            let r = self.dir_block(raw, lblk, &mut b)?;
            let Some(v) = self.leaf_entries_at(raw, lblk, &b, Some(&r))? else {
                continue;
            };
            let base = u64::from(lblk) * bs;
            for e in v {
                if base + (e.offset as u64) < start {
                    continue;
                }
                if e.inode == 0 || e.name == b"." || e.name == b".." {
                    continue;
                }
                if e.inode > self.sb.inodes_count {
                    return Err(corrupt(
                        format!("directory {} block {lblk}", raw.ino),
                        format!("entry names inode {}", e.inode),
                    ));
                }
                let file_type = match ft_from_dirent(e.file_type) {
                    Some(t) => t,
                    None => self.entry_type(e.inode),
                };
                let ent = DirEntry {
                    ino: u64::from(e.inode),
                    next_cookie: base + (e.offset + e.rec_len) as u64 + COOKIE_BASE,
                    file_type,
                    name: e.name.to_vec(),
                };
                if !emit(ent) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// `readdir_raw` of an indexed directory: in hash order, as the
    /// kernel's `ext4_dx_readdir`, each name at the position `(major >> 1)
    /// << 31 | minor >> 1` of its hash (62 bits: cookies stay below 2^63
    /// with `COOKIE_BASE`), listed from `start` on. A leaf split moves
    /// names to another block but not to another hash, so a listing that
    /// resumes (or a seekdir to an older cookie) returns each name present
    /// throughout exactly once; byte offsets, used before, repeated and
    /// skipped names when leaves split (review, stop 38).
    ///
    /// From the leaf that `start`'s hash selects, leaves are read in index
    /// order, a leaf together with the ones after it that continue a run
    /// of its last hash (the continuation bit), each such group sorted by
    /// (position, name). Names sharing a position are returned together:
    /// the cookie after one that is not the last of its run is the run's
    /// own position, so a listing that stops inside a run returns it again
    /// whole; except when the call started at that position (the run did
    /// not fit one call), where the rest of the run is passed over so that
    /// the listing always moves on. Such runs need names colliding in all
    /// 62 bits (with the legacy hash, whose minor is 0, in its 31).
    fn readdir_htree(
        &self,
        raw: &RawInode,
        start: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        let what = || format!("directory {} htree root", raw.ino);
        let nblocks = self.dir_blocks(raw)?;
        let mut b = BlockBuf::zeroed(self.bs);
        let start_major = ((start >> 31).min(u64::from(u32::MAX >> 1)) as u32) << 1;
        let (mut frames, levels, version) = self.htree_path(raw, &mut b, &mut |_| start_major)?;
        // Leaves visited: at most one per block, each once (an index that
        // names one leaf again and again would gather its names that
        // many times, gigabytes from a few crafted blocks; review, stop
        // 48).
        let mut left = nblocks;
        let mut seen = std::collections::HashSet::new();
        let mut done = false;
        while !done {
            // (position, name, inode, file type) of one group of leaves.
            let mut group: Vec<(u64, Vec<u8>, u32, u8)> = Vec::new();
            loop {
                let (e, at) = &frames[frames.len() - 1];
                let leaf = e.entries[*at].1;
                if leaf == 0 || leaf >= nblocks {
                    return Err(corrupt(what(), format!("leaf block {leaf}")));
                }
                if left == 0 {
                    return Err(corrupt(what(), "more leaves than blocks"));
                }
                if !seen.insert(leaf) {
                    return Err(corrupt(what(), format!("leaf block {leaf} indexed twice")));
                }
                left -= 1;
                let r = self.dir_block(raw, leaf, &mut b)?;
                if !self.hashed_entries(raw, leaf, &b, &r, version, start, &mut group)? {
                    return Err(corrupt(what(), format!("leaf {leaf} is an index block")));
                }
                match self.next_leaf(raw, &mut frames, levels, &mut b)? {
                    None => {
                        done = true;
                        break;
                    }
                    // The next leaf continues this run of one hash.
                    Some(h) if h & 1 != 0 => {}
                    Some(_) => break,
                }
            }
            if !self.emit_hashed(group, start, emit)? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// The listing position of `name` in a directory hashed with
    /// `version`: `(major >> 1) << 31 | minor >> 1`. The legacy hash has
    /// no minor (0) and collides easily ("c575" and "c775"), so its
    /// listing minor is the name's half_md4 hash instead: names then
    /// share a position only if they collide in both (leaves are placed
    /// by the major alone; the listing only sorts by it). `None`: an
    /// unknown version.
    fn list_pos(&self, version: u8, name: &[u8]) -> Option<u64> {
        let seed = &self.sb.hash_seed;
        let (major, mut minor) = htree::dirhash2(name, version, seed)?;
        if version == htree::HASH_LEGACY || version == htree::HASH_LEGACY_UNSIGNED {
            minor = htree::dirhash2(name, htree::HASH_HALF_MD4, seed)?.0;
        }
        Some((u64::from(major >> 1) << 31) | u64::from(minor >> 1))
    }

    /// Emit `group` ((position, name, inode, file type); positions at
    /// least `start`) in (position, name) order, with the cookies
    /// `readdir_htree` describes. False: `emit` stopped.
    fn emit_hashed(
        &self,
        mut group: Vec<(u64, Vec<u8>, u32, u8)>,
        start: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<bool> {
        group.sort_unstable_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        for i in 0..group.len() {
            let (pos, ino, ft) = (group[i].0, group[i].2, group[i].3);
            let last_of_run = group.get(i + 1).is_none_or(|n| n.0 != pos);
            let next = if last_of_run || pos == start {
                pos + 1
            } else {
                pos
            };
            let file_type = match ft_from_dirent(ft) {
                Some(t) => t,
                None => self.entry_type(ino),
            };
            let ent = DirEntry {
                ino: u64::from(ino),
                next_cookie: next + COOKIE_BASE,
                file_type,
                name: std::mem::take(&mut group[i].1),
            };
            if !emit(ent) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// `readdir_raw` of a one-block directory that is not indexed, on an
    /// image with dir_index: in hash order (the image's default hash), as
    /// the kernel lists such a directory (`is_dx_dir`), so that its
    /// cookies keep their meaning when it fills and becomes indexed in
    /// the middle of a listing (byte offsets read as hashes then repeated
    /// every name already listed; review, stop 38).
    fn readdir_block0_hashed(
        &self,
        raw: &RawInode,
        start: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        let version = self.unindexed_hash_version();
        let mut b = BlockBuf::zeroed(self.bs);
        let r = self.dir_block(raw, 0, &mut b)?;
        let mut group = Vec::new();
        self.hashed_entries(raw, 0, &b, &r, version, start, &mut group)?;
        self.emit_hashed(group, start, emit)?;
        Ok(())
    }

    /// The hash a directory without an index is listed by: the image's
    /// default, made unsigned where the superblock says so (as the
    /// kernel's `ext4_htree_fill_tree` for such a directory).
    fn unindexed_hash_version(&self) -> u8 {
        let version = self.sb.def_hash_version;
        if version <= htree::HASH_TEA && self.sb.flags & FLAG_UNSIGNED_HASH != 0 {
            version + 3
        } else {
            version
        }
    }

    /// Add the live names of leaf `lblk` of directory `raw` (in `b`, read
    /// as `r` says) whose listing position with hash `version` is at
    /// least `start` to `group` ((position, name, inode, file type)); `.`
    /// and `..` left out. False: the block is an index node.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn hashed_entries(
        &self,
        raw: &RawInode,
        lblk: u32,
        b: &[u8],
        r: &MetaRead,
        version: u8,
        start: u64,
        group: &mut Vec<(u64, Vec<u8>, u32, u8)>,
    ) -> Result<bool> {
        let what = || format!("directory {} block {lblk}", raw.ino);
        let Some(v) = self.leaf_entries_at(raw, lblk, b, Some(r))? else {
            return Ok(false);
        };
        for e in v {
            if e.inode == 0 || e.name == b"." || e.name == b".." {
                continue;
            }
            if e.inode > self.sb.inodes_count {
                return Err(corrupt(what(), format!("entry names inode {}", e.inode)));
            }
            let pos = self
                .list_pos(version, e.name)
                .ok_or_else(|| corrupt(what(), format!("hash version {version}")))?;
            if pos >= start {
                group.push((pos, e.name.to_vec(), e.inode, e.file_type));
            }
        }
        Ok(true)
    }

    /// Move `frames` (a path from the htree root to a leaf, `levels`
    /// index levels below the root) to the next leaf in index order;
    /// returns the hash of the index entry that leads to it (its low bit:
    /// the continuation of a run of one hash), or `None` after the last.
    fn next_leaf(
        &self,
        raw: &RawInode,
        frames: &mut Vec<(htree::DxEntries, usize)>,
        levels: usize,
        b: &mut [u8],
    ) -> Result<Option<u32>> {
        let mut lvl = frames.len();
        loop {
            if lvl == 0 {
                return Ok(None);
            }
            lvl -= 1;
            let (e, at) = &mut frames[lvl];
            if *at + 1 < e.entries.len() {
                *at += 1;
                break;
            }
        }
        frames.truncate(lvl + 1);
        let h = frames[lvl].0.entries[frames[lvl].1].0;
        while frames.len() <= levels {
            let (e, at) = &frames[frames.len() - 1];
            let child = e.entries[*at].1;
            let node = self.dx_node(raw, child, b)?;
            frames.push((node, 0));
        }
        Ok(Some(h))
    }

    /// The inline data of `raw` (an inode with `FL_INLINE_DATA`, on an
    /// inline_data image): the 60 bytes of `i_block`, then the value of
    /// its `system.data` attribute in the inode body, as the kernel's
    /// `ext4_read_inline_data` joins them. Bounded by the inode's size.
    pub(crate) fn inline_bytes(&self, raw: &RawInode) -> Result<Vec<u8>> {
        let mut v = raw.block.to_vec();
        let area = match self.ibody_area(raw)? {
            Some((_, area)) => xattr::parse_ibody(&area, raw.ino)?,
            None => Vec::new(),
        };
        match area
            .into_iter()
            .find(|e| e.index == INLINE_XATTR_INDEX && e.name == INLINE_XATTR_NAME)
        {
            Some(xattr::Entry {
                value: xattr::Value::Here(d),
                ..
            }) => v.extend_from_slice(&d),
            Some(_) => {
                return Err(corrupt(
                    format!("inode {}", raw.ino),
                    "inline data in a value inode",
                ))
            }
            None => {}
        }
        Ok(v)
    }

    /// An inline file's or symlink's stored bytes, at most its size: a
    /// file may be longer than its inline data (the kernel's ext4 writes
    /// inline into a file truncated longer while empty), and reads past
    /// them as zeros.
    pub(crate) fn inline_file(&self, raw: &RawInode) -> Result<Vec<u8>> {
        let mut v = self.inline_bytes(raw)?;
        v.truncate(usize::try_from(raw.size).unwrap_or(usize::MAX));
        Ok(v)
    }

    /// An inline directory: its parent (the first 4 bytes of `i_block`)
    /// and its live entries, from the rest of `i_block` and then from the
    /// `system.data` value, each region a run of directory entries filling
    /// it (no `.`, no checksum tail), as the kernel's ext4 lays them out.
    pub(crate) fn inline_dir(&self, raw: &RawInode) -> Result<(u32, Vec<InlineEntry>)> {
        let what = || format!("inline directory {}", raw.ino);
        let d = self.inline_bytes(raw)?;
        let parent = crate::format::le32(&d, 0);
        if parent == 0 || parent > self.sb.inodes_count {
            return Err(corrupt(what(), format!("parent inode {parent}")));
        }
        let filetype = self.sb.has_incompat(INCOMPAT_FILETYPE);
        let mut out = Vec::new();
        let i_block = raw.block.len();
        for (base, region) in [(4, &d[4..i_block]), (i_block, &d[i_block..])] {
            if region.is_empty() {
                continue;
            }
            for e in dir::entries(region, false, filetype, &what)? {
                if e.inode == 0 {
                    continue;
                }
                if e.inode > self.sb.inodes_count {
                    return Err(corrupt(what(), format!("entry names inode {}", e.inode)));
                }
                out.push(InlineEntry {
                    pos: (base + e.offset) as u64,
                    next: (base + e.offset + e.rec_len) as u64,
                    inode: e.inode,
                    file_type: e.file_type,
                    name: e.name.to_vec(),
                });
            }
        }
        Ok((parent, out))
    }

    fn read_link(&self, raw: &RawInode) -> Result<Vec<u8>> {
        let what = || format!("symlink {}", raw.ino);
        let len = raw.size as usize;
        if len == 0 || len > 4096 {
            return Err(corrupt(what(), format!("length {len}")));
        }
        if let Some(t) = fast_link(raw, self.bs, self.has_ea_inode()) {
            return Ok(t.to_vec());
        }
        if raw.flags & inode::FL_INLINE_DATA != 0 {
            let t = self.inline_file(raw)?;
            if t.len() != len {
                return Err(corrupt(
                    what(),
                    format!("{} of {len} bytes inline", t.len()),
                ));
            }
            return Ok(t);
        }
        // Read through the buffer cache: a read-write mount writes slow
        // symlink targets there (journaled metadata), and the home copy
        // may not be written yet. At most 4096 bytes: 4 blocks of 1 KiB.
        let mut v = Vec::with_capacity(len);
        let mut b = BlockBuf::zeroed(self.bs);
        let mut lblk = 0u32;
        while v.len() < len {
            match self.map_block(raw, lblk)? {
                Mapping::Data {
                    pblk,
                    uninit: false,
                    ..
                } => self.read_block(pblk, &mut b)?,
                _ => return Err(corrupt(what(), "short target")),
            }
            let take = (len - v.len()).min(self.bs);
            v.extend_from_slice(&b[..take]);
            lblk += 1;
        }
        Ok(v)
    }

    /// `statfs` as Linux's ext4_statfs computes it: f_blocks is the block
    /// count minus the metadata overhead (s_overhead_clusters if set, else
    /// superblock copies, descriptor tables, bitmaps, inode tables and the
    /// internal journal), f_bavail leaves out the reserved blocks and the
    /// kernel's own reserve (2% up to 4096 clusters).
    fn compute_statfs(&self) -> Result<StatFs> {
        let sb = &self.sb;
        let ratio = sb.cluster_ratio();
        let ngroups = sb.group_count();
        let overhead_blocks = if sb.overhead_clusters != 0 {
            u64::from(sb.overhead_clusters) * ratio
        } else {
            let mut o = u64::from(sb.first_data_block);
            let itb = group_desc::inode_table_blocks(sb);
            for g in 0..ngroups {
                o += 2 + itb + sb.base_meta_blocks(g);
            }
            if sb.has_compat(COMPAT_HAS_JOURNAL) && sb.journal_inum != 0 {
                let j = self.read_inode(sb.journal_inum)?;
                o = o.saturating_add(j.size / self.bs as u64);
            }
            o
        };
        let free_clusters: u64 = self
            .groups
            .iter()
            .map(|g| u64::from(g.free_blocks_count))
            .sum();
        let free_inodes: u64 = self
            .groups
            .iter()
            .map(|g| u64::from(g.free_inodes_count))
            .sum();
        // Image-controlled values: saturate rather than overflow.
        let bfree = free_clusters.saturating_mul(ratio);
        let resv = sb.resv_blocks();
        Ok(StatFs {
            fs_type: EXT4_SUPER_MAGIC,
            bsize: self.bs as u64,
            blocks: sb.blocks_count.saturating_sub(overhead_blocks),
            bfree,
            bavail: bfree.saturating_sub(sb.r_blocks_count.saturating_add(resv)),
            files: u64::from(sb.inodes_count),
            ffree: free_inodes,
            namelen: 255,
            frsize: self.bs as u64,
            flags: libc::ST_RDONLY,
        })
    }
}

/// Readdir cookies 0 and 1 are the VFS's "." and ".."; byte offset `o` in
/// the directory is cookie `o + 2`.
const COOKIE_BASE: u64 = 2;

fn ft_from_dirent(ft: u8) -> Option<FileType> {
    Some(match ft {
        dir::FT_REG => FileType::Regular,
        dir::FT_DIR => FileType::Directory,
        dir::FT_CHR => FileType::CharDevice,
        dir::FT_BLK => FileType::BlockDevice,
        dir::FT_FIFO => FileType::Fifo,
        dir::FT_SOCK => FileType::Socket,
        dir::FT_SYMLINK => FileType::Symlink,
        _ => return None,
    })
}

/// What `Ext4::release_step` (extent_write.rs) did with an unlinked inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Release {
    /// Freed one step's worth from the end: more steps remain.
    Stepped,
    /// Needs steps, none taken (not allowed): nothing changed.
    Later,
    /// Nothing yet: the rest is freed in one go (`release_inode`),
    /// changing the bitmaps of these groups (`groups_of`; a handle's
    /// budget counts them).
    Fits(Vec<u64>),
}

/// Whether `raw` (without the extents flag) maps blocks through `i_block`
/// (ext2/3 style): a regular file, directory or slow symlink, not inline.
/// Devices keep their number there, fast symlinks their target
/// (`fast_link`; `ea_inode`: the filesystem has the ea_inode feature).
pub(crate) fn block_mapped(raw: &RawInode, bs: usize, ea_inode: bool) -> bool {
    matches!(
        raw.file_type_bits(),
        libc::S_IFREG | libc::S_IFDIR | libc::S_IFLNK
    ) && raw.flags & (inode::FL_EXTENTS | inode::FL_INLINE_DATA) == 0
        && fast_link(raw, bs, ea_inode).is_none()
}

/// Whether the extent root in `raw`'s `i_block` maps nothing (a new
/// file's): no entries at depth 0.
pub(crate) fn extent_root_empty(raw: &RawInode) -> bool {
    let le16 = |o: usize| u16::from_le_bytes([raw.block[o], raw.block[o + 1]]);
    le16(0) == extent::EXTENT_MAGIC && le16(2) == 0 && le16(6) == 0
}

/// The target of a fast symlink (stored in `i_block`), as the kernel's
/// ext4_inode_is_fast_symlink decides: no data blocks besides an xattr
/// block; with the ea_inode feature, by its size alone (1 to 59 bytes),
/// since `i_blocks` there also counts the value inodes' blocks its
/// attributes hold (a symlink with a large attribute would otherwise be
/// taken for a slow one, and its target's bytes for block numbers).
fn fast_link(raw: &RawInode, bs: usize, ea_inode: bool) -> Option<&[u8]> {
    if raw.file_type_bits() != libc::S_IFLNK || raw.size >= 60 {
        return None;
    }
    if ea_inode {
        if raw.size == 0 || raw.flags & inode::FL_INLINE_DATA != 0 {
            return None;
        }
    } else {
        let ea = if raw.file_acl != 0 {
            bs as u64 / 512
        } else {
            0
        };
        if raw.blocks != ea {
            return None;
        }
    }
    raw.block.get(..raw.size as usize)
}

fn vfs<T>(r: Result<T>) -> VfsResult<T> {
    r.map_err(|e| e.errno())
}

impl Filesystem for Ext4 {
    fn name(&self) -> &'static str {
        "ext4"
    }

    fn root(&self) -> Arc<Inode> {
        self.root.clone()
    }

    fn dcache_authoritative(&self) -> bool {
        false
    }

    fn lookup(&self, d: &Arc<Inode>, name: &[u8]) -> VfsResult<Option<Arc<Inode>>> {
        if !d.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let _dl = self.dir_read_lock(d);
        let raw = &Ext4::node(d)?;
        match vfs(self.lookup_ino(raw, name))? {
            None => Ok(None),
            // A name (not "." or "..") for the directory itself: the
            // kernel's ext4_lookup calls it corrupt (a loop in the tree).
            Some(ino) if u64::from(ino) == d.ino() && name != b"." && name != b".." => {
                Err(corrupt(
                    format!("directory {ino}"),
                    "an entry names the directory itself",
                )
                .errno())
            }
            Some(ino) => Ok(Some(vfs(self.iget(ino))?)),
        }
    }

    fn get_parent(&self, d: &Arc<Inode>) -> VfsResult<Arc<Inode>> {
        if !d.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let ino = {
            let _dl = self.dir_read_lock(d);
            let raw = &Ext4::node(d)?;
            vfs(self.dotdot(raw))?
        };
        self.inode_by_number(u64::from(ino))
    }

    fn inode_by_number(&self, ino: u64) -> VfsResult<Arc<Inode>> {
        // An unreadable or damaged inode is no file the handle can name.
        match self.inode_for_handle(ino) {
            Ok(Some(i)) => Ok(i),
            Ok(None) | Err(_) => Err(Errno::ESTALE),
        }
    }

    fn create(
        &self,
        dir: &Arc<Inode>,
        name: &[u8],
        node: NewNode<'_>,
        owner: (u32, u32),
    ) -> VfsResult<Arc<Inode>> {
        vfs(self.journaled(|| self.create_node(dir, name, node.clone(), owner)))
    }

    fn create_tmpfile(
        &self,
        dir: &Arc<Inode>,
        mode: u32,
        owner: (u32, u32),
    ) -> VfsResult<Arc<Inode>> {
        vfs(self.journaled(|| self.create_unnamed(dir, mode, owner)))
    }

    fn link(&self, dir: &Arc<Inode>, name: &[u8], inode: &Arc<Inode>) -> VfsResult<()> {
        vfs(self.journaled(|| self.add_link(dir, name, inode)))
    }

    fn unlink(&self, dir: &Arc<Inode>, name: &[u8], inode: &Arc<Inode>) -> VfsResult<()> {
        vfs(self.journaled(|| self.remove_name(dir, name, inode, false)))
    }

    fn rmdir(&self, dir: &Arc<Inode>, name: &[u8], inode: &Arc<Inode>) -> VfsResult<()> {
        vfs(self.journaled(|| self.remove_name(dir, name, inode, true)))
    }

    fn rename(
        &self,
        old_dir: &Arc<Inode>,
        old_name: &[u8],
        new_dir: &Arc<Inode>,
        new_name: &[u8],
        moved: &Arc<Inode>,
        replaced: Option<&Arc<Inode>>,
        exchange: bool,
    ) -> VfsResult<()> {
        if self.rw.is_none() {
            return Err(Errno::EROFS);
        }
        if exchange {
            let other = replaced.ok_or(Errno::ENOENT)?;
            return vfs(self.journaled(|| {
                self.exchange_entries(old_dir, old_name, new_dir, new_name, moved, other)
            }));
        }
        vfs(self
            .journaled(|| self.rename_entry(old_dir, old_name, new_dir, new_name, moved, replaced)))
    }

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
        if self.rw.is_none() {
            return Err(Errno::EROFS);
        }
        // Both in one handle, so in one transaction (as the kernel's
        // ext4_rename makes the whiteout in its handle): a crash shows the
        // old name, or the new name and the whiteout. The whiteout's own
        // failure is returned inside, so that the handle's ENOSPC retry
        // does not run the rename twice.
        let node = NewNode::Node {
            mode: libc::S_IFCHR,
            rdev: 0,
        };
        let r = self.journaled(|| {
            self.rename_entry(old_dir, old_name, new_dir, new_name, moved, replaced)?;
            Ok(self.create_node(old_dir, old_name, node.clone(), owner))
        });
        Ok(vfs(vfs(r)?))
    }

    fn readlink(&self, i: &Arc<Inode>) -> VfsResult<Vec<u8>> {
        if i.file_type() != FileType::Symlink {
            return Err(Errno::EINVAL);
        }
        vfs(self.read_link(&Ext4::node(i)?))
    }

    fn get_link_cached<'i>(&self, i: &'i Inode) -> Option<&'i [u8]> {
        i.private::<Ext4Inode>()?
            .link
            .as_deref()
            .filter(|t| !t.is_empty())
    }

    fn set_fs_flags(
        &self,
        inode: &Arc<Inode>,
        flags: u32,
        ctime: scalevfs::types::Timespec,
    ) -> VfsResult<()> {
        if self.rw.is_none() {
            return Err(Errno::EROFS);
        }
        vfs(self.journaled(|| self.set_chattr_flags(inode, flags, (ctime.sec, ctime.nsec))))
    }

    /// A size goes first, as `truncate` does it (a long one in steps, each
    /// in its own handle, its orphan record removed by the last), then the
    /// rest in one handle. Both in one handle, as before, a failure after
    /// a long truncate had begun left its orphan record (and the blocks
    /// past the size) until the next mount, and a rerun of the handle for
    /// space recorded the inode twice. (No caller of the core passes a
    /// size here today: the VFS truncates through `truncate`.)
    fn setattr(&self, inode: &Arc<Inode>, set: &SetAttr) -> VfsResult<()> {
        if let Some(size) = set.size {
            if inode.file_type() != FileType::Regular {
                return Err(Errno::EINVAL);
            }
            if size > scalevfs::fstype::Filesystem::max_file_size(self) {
                return Err(Errno::EFBIG);
            }
            scalevfs::fstype::Filesystem::truncate(self, inode, size)?;
        }
        let rest = SetAttr { size: None, ..*set };
        if rest != SetAttr::default() {
            vfs(self.journaled(|| self.set_attr(inode, &rest)))?;
        }
        Ok(())
    }

    fn readdir(
        &self,
        d: &Arc<Inode>,
        cookie: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> VfsResult<()> {
        if !d.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        if self.rw.is_none() {
            return vfs(self.readdir_raw(&Ext4::node(d)?, cookie, emit));
        }
        // Read-write: a batch is read under the directory's shared lock
        // and handed out after it is dropped (emit may take VFS locks).
        const BATCH: usize = 512;
        let mut cookie = cookie;
        loop {
            let mut batch = Vec::new();
            let r = {
                let _dl = self.dir_read_lock(d);
                vfs(self.readdir_raw(&Ext4::node(d)?, cookie, &mut |e| {
                    batch.push(e);
                    batch.len() < BATCH
                }))
            };
            let full = batch.len() == BATCH;
            // The entries read before an error (a bad block further on)
            // are handed out first, as the read-only path and the
            // kernel's ext4_readdir do; the caller decides (getdents
            // returns them and meets the error on its next call).
            for e in batch {
                cookie = e.next_cookie;
                if !emit(e) {
                    return Ok(());
                }
            }
            r?;
            // Each batch moves the cookie forward through a finite
            // directory.
            if !full {
                return Ok(());
            }
        }
    }

    fn statfs(&self) -> StatFs {
        self.reap_queued();
        let mut st = self.statfs;
        if let Some(rw) = &self.rw {
            let ratio = self.sb.cluster_ratio();
            // Relaxed: a setting, read alone.
            let resv = rw.resv.load(Ordering::Relaxed);
            st.bfree = rw.alloc.free_blocks().saturating_mul(ratio);
            if let Some(j) = rw.journal.get() {
                // Blocks freed in the running transaction count as free
                // now, as the kernel's free counter counts them when they
                // are freed (they become allocatable after the commit; an
                // allocation that finds none commits and retries).
                let mut pending = 0u64;
                j.pending.for_each(false, |l| pending += l.len() as u64);
                st.bfree = st.bfree.saturating_add(pending).min(st.blocks);
            }
            st.bavail = st
                .bfree
                .saturating_sub(self.sb.r_blocks_count.saturating_add(resv));
            st.ffree = rw.alloc.free_inodes();
            st.flags &= !libc::ST_RDONLY;
        }
        st
    }

    fn fsync(&self, inode: &Arc<Inode>, _datasync: bool) -> VfsResult<()> {
        // Journaled: wait for the commit that carries the inode's last
        // change (the whole running transaction commits, as jbd2's does);
        // data went home before its handle ended, and that commit's first
        // flush made it durable before the commit block. If that commit is
        // done already, only overwrites in place may be in flight: flush.
        let (Some(j), Some(e)) = (self.journal(), inode.private::<Ext4Inode>()) else {
            return vfs(self.sync());
        };
        if Handle::nested(j) {
            return Err(Errno::EIO);
        }
        // Relaxed: see `Ext4Inode::set_raw`.
        let t = e.last_tid.load(Ordering::Relaxed);
        // SeqCst: see `Journal::next_commit`.
        if t <= j.done.load(Ordering::SeqCst) {
            // A stopped filesystem reports it here too: its commit may have
            // failed after this inode's (an overwrite in place since then
            // never reached the image).
            vfs(self.check_failed())?;
            // Relaxed: a statistic.
            j.requests.fetch_add(1, Ordering::Relaxed);
            return vfs(self.dev.flush().map_err(Error::Io));
        }
        vfs(self.commit_until(j, t))
    }

    fn max_file_size(&self) -> u64 {
        self.max_size()
    }

    fn clamp_time(&self, t: scalevfs::Timespec) -> scalevfs::Timespec {
        // As the kernel's ext4_fill_super sets s_time_min/max and the
        // granularity: inodes of 144 bytes or more hold the _extra words
        // (2 epoch bits, nanoseconds), smaller ones 32-bit seconds only.
        let extra = self.sb.inode_size() >= 0x90;
        let min = i64::from(i32::MIN);
        let max = if extra {
            (1i64 << 34) - 1 + i64::from(i32::MIN)
        } else {
            i64::from(i32::MAX)
        };
        if t.sec <= min || t.sec >= max {
            return scalevfs::Timespec {
                sec: t.sec.clamp(min, max),
                nsec: 0,
            };
        }
        scalevfs::Timespec {
            sec: t.sec,
            nsec: if extra { t.nsec } else { 0 },
        }
    }

    fn max_file_size_of(&self, inode: &Inode) -> u64 {
        match inode.private::<Ext4Inode>() {
            Some(ei) if ei.mapped => self.bitmap_max_size(),
            // A file whose data is inline has no extent flag, and the
            // kernel limits such a file as a block-mapped one (setattr,
            // the write checks and llseek test EXT4_INODE_EXTENTS): a
            // truncate past `s_bitmap_maxbytes` is EFBIG until the data
            // has moved to blocks. `may_inline` (Relaxed: a hint, see the
            // field) spares every other file the inode's lock.
            Some(ei)
                if ei.may_inline.load(Ordering::Relaxed)
                    && ei.raw.lock().flags & inode::FL_INLINE_DATA != 0 =>
            {
                self.bitmap_max_size()
            }
            _ => self.max_size(),
        }
    }

    fn read(&self, i: &Arc<Inode>, off: u64, buf: &mut [u8]) -> VfsResult<usize> {
        match i.file_type() {
            FileType::Directory => return Err(Errno::EISDIR),
            FileType::Regular => {}
            _ => return Err(Errno::EINVAL),
        }
        let _g = self.file_read_settled(i);
        vfs(self.read_data(&Ext4::node(i)?, off, buf))
    }

    fn fiemap(
        &self,
        i: &Arc<Inode>,
        start: u64,
        len: u64,
        flags: u32,
    ) -> VfsResult<Vec<scalevfs::fstype::FiemapExtent>> {
        // The tree lock of the kind the inode has, shared.
        let _g = match i.file_type() {
            FileType::Directory => self.dir_read_lock(i),
            _ => self.file_read_settled(i),
        };
        let raw = Ext4::node(i)?;
        let len = self.fiemap_check(&raw, start, len, flags)?;
        vfs(self.fiemap_raw(&raw, start, len))
    }

    /// As the kernel's ext4_dir_llseek: a hashed directory (dir_index and
    /// an htree, one block, or inline entries: the kernel's is_dx_dir)
    /// ends at the 64-bit htree end cookie, a linear one at its size
    /// (ext4_llseek; a directory has no holes).
    fn dir_seek_bounds(&self, dir: &Arc<Inode>) -> Option<(u64, u64)> {
        let raw = Ext4::node(dir).ok()?;
        let dx = self.sb.has_compat(COMPAT_DIR_INDEX)
            && (raw.flags & (inode::FL_INDEX | inode::FL_INLINE_DATA) != 0
                || raw.size == self.bs as u64);
        if dx {
            Some((i64::MAX as u64, i64::MAX as u64))
        } else if raw.flags & inode::FL_EXTENTS == 0 {
            // Block-mapped or inline (no extent flag): ext4_llseek's
            // s_bitmap_maxbytes.
            Some((raw.size, self.bitmap_max_size()))
        } else {
            Some((raw.size, self.max_size()))
        }
    }

    fn seek_data_hole(&self, i: &Arc<Inode>, off: u64, data: bool) -> VfsResult<u64> {
        let _g = self.file_read_settled(i);
        vfs(self.seek_raw(&Ext4::node(i)?, off, data))?.ok_or(Errno::ENXIO)
    }

    fn write(&self, inode: &Arc<Inode>, off: u64, buf: &[u8]) -> VfsResult<usize> {
        // A write ends short when its allocations fill one step
        // (`Ext4::step_groups`; the rest goes in new handles, each may
        // commit first) or on an error after some bytes. The rest is
        // written until a call fails: an ENOSPC while blocks freed by the
        // running transaction wait for its commit is retried after a
        // commit by `journaled` (a loop that truncates and rewrites a
        // file frees and needs the same space every round: generic/129
        // saw "short write: 32768 of 102400"); any failure then ends the
        // write with the bytes written so far.
        let mut n = 0;
        let mut trimmed = false;
        while n < buf.len() {
            let at = off + n as u64;
            match self.journaled(|| self.file_write(inode, at, &buf[n..])) {
                Ok(0) => break,
                Ok(k) => n += k,
                // A failed trim after some bytes went out: those bytes
                // are written (the size already covers them), so the
                // call reports them, not the trim's error.
                Err(e)
                    if e.errno() == Errno::ENOSPC
                        && !trimmed
                        && match self.trim_failed_write(inode, at, off + buf.len() as u64) {
                            Ok(t) => t,
                            Err(_) if n > 0 => break,
                            Err(te) => return Err(te),
                        } =>
                {
                    trimmed = true;
                }
                Err(e) if n == 0 => return Err(e.errno()),
                Err(_) => break,
            }
        }
        Ok(n)
    }

    fn truncate(&self, inode: &Arc<Inode>, size: u64) -> VfsResult<()> {
        if let Some(slot) = vfs(self.journaled(|| self.file_truncate(inode, size)))? {
            vfs(self.truncate_rest(inode, slot))?;
        }
        Ok(())
    }

    fn fallocate(&self, inode: &Arc<Inode>, punch: bool, off: u64, len: u64) -> VfsResult<()> {
        if self.rw.is_none() {
            return Err(Errno::EROFS);
        }
        // Ranges larger than one handle run as several (`extent_write.rs`).
        if punch {
            if let Some((from, to)) = vfs(self.journaled(|| self.file_punch(inode, off, len)))? {
                vfs(self.punch_rest(inode, from, to))?;
            }
            return Ok(());
        }
        let end = off.checked_add(len).ok_or(Errno::EFBIG)?;
        let mut at = off;
        while let Some(next) = vfs(self.journaled(|| self.file_fallocate(inode, at, end - at)))? {
            at = next;
        }
        Ok(())
    }

    fn fallocate_range(
        &self,
        inode: &Arc<Inode>,
        op: scalevfs::fstype::RangeOp,
        off: u64,
        len: u64,
    ) -> VfsResult<()> {
        use scalevfs::fstype::RangeOp;
        if self.rw.is_none() {
            return Err(Errno::EROFS);
        }
        // Ranges larger than one handle run as several (`extent_write.rs`).
        match op {
            RangeOp::Zero => {
                let end = off.checked_add(len).ok_or(Errno::EFBIG)?;
                let mut at = off;
                while let Some(next) =
                    vfs(self.journaled(|| self.file_zero_range(inode, at, end - at)))?
                {
                    at = next;
                }
                Ok(())
            }
            // A tree too large to rewrite in one transaction shifts a leaf
            // per handle (`shift_step`), as the kernel's ext4 does always.
            // Neither adds data: the tree blocks they may need come from
            // every free block (`nofail`), as the kernel's split and
            // removal do (EXT4_GET_BLOCKS_METADATA_NOFAIL).
            // Readers wait for either to end (`reshaping`).
            RangeOp::Collapse => self.reshaping(inode, || {
                nofail(|| {
                    let pre = vfs(self.journaled(|| self.collapse_prefree(inode, off, len)))?;
                    if let Some((from, to)) = pre {
                        vfs(self.punch_rest(inode, from, to))?;
                    }
                    if vfs(self.journaled(|| self.file_collapse(inode, off, len)))? {
                        return Ok(());
                    }
                    vfs(self.collapse_stepped(inode, off, len))
                })
            }),
            RangeOp::Insert => self.reshaping(inode, || {
                nofail(|| {
                    if vfs(self.journaled(|| self.file_insert(inode, off, len)))? {
                        return Ok(());
                    }
                    vfs(self.insert_stepped(inode, off, len))
                })
            }),
        }
    }

    // Extended attributes: in the inode body and the xattr block
    // (`format/xattr.rs`); changes in `xattr_write.rs`. On a read-write
    // mount a reader holds the shared side of the lock a change holds
    // (`inode_change_lock`: a directory's lock, else the data lock), so it
    // never sees a change half made or a freed xattr block.

    fn getxattr(&self, i: &Arc<Inode>, name: &[u8]) -> VfsResult<Vec<u8>> {
        let _g = self.inode_read_lock(i);
        let raw = Ext4::node(i)?;
        let e = vfs(self.xattrs(&raw))?
            .into_iter()
            .find(|e| e.name == name && e.index != INLINE_XATTR_INDEX)
            .ok_or(Errno::ENODATA)?;
        vfs(self.xattr_value(&raw, &e))
    }

    fn listxattr(&self, i: &Arc<Inode>) -> VfsResult<Vec<Vec<u8>>> {
        let _g = self.inode_read_lock(i);
        let raw = Ext4::node(i)?;
        // `system.data` (inline data) has no handler in the kernel's
        // ext4 either: not listed.
        Ok(vfs(self.xattrs(&raw))?
            .into_iter()
            .filter(|e| e.index != INLINE_XATTR_INDEX)
            .map(|e| e.name)
            .collect())
    }

    fn setxattr(&self, i: &Arc<Inode>, name: &[u8], value: &[u8], flags: u32) -> VfsResult<()> {
        self.rw().map_err(|_| Errno::EROFS)?;
        vfs(self.journaled(|| self.xattr_change(i, name, Some(value), flags)))
    }

    fn removexattr(&self, i: &Arc<Inode>, name: &[u8]) -> VfsResult<()> {
        self.rw().map_err(|_| Errno::EROFS)?;
        vfs(self.journaled(|| self.xattr_change(i, name, None, 0)))
    }
}

impl Ext4 {
    /// Fill the core's ACL cache of a freshly read inode: its access ACL
    /// and whether it (a directory) has a default ACL; and mark a file with
    /// capabilities (`security.capability`). An attribute that
    /// cannot be read or parsed leaves the cache empty (the mode decides;
    /// `getxattr` reports the corruption).
    fn load_acls(&self, i: &Inode, raw: &RawInode) {
        let Ok(entries) = self.xattrs(raw) else {
            return;
        };
        for e in &entries {
            if e.name == scalevfs::xattr::POSIX_ACL_ACCESS {
                let acl = self
                    .xattr_value(raw, e)
                    .ok()
                    .and_then(|v| scalevfs::xattr::parse_acl(&v).ok().flatten());
                i.set_access_acl(acl);
            } else if e.name == scalevfs::xattr::POSIX_ACL_DEFAULT {
                i.mark_default_acl(true);
            } else if e.name == b"security.capability" {
                // Removed by the next write (`file_remove_privs`).
                i.mark_file_caps();
            }
        }
    }

    /// The extended attributes of `raw`: those in its body, then those in
    /// its xattr block (the kernel's order), checked (`stored_xattrs`).
    fn xattrs(&self, raw: &RawInode) -> Result<Vec<xattr::Entry>> {
        let st = self.stored_xattrs(raw)?;
        let mut out = xattr::named_entries(&st.body);
        if let Some((_, block)) = &st.block {
            out.extend(xattr::named_entries(block));
        }
        Ok(out)
    }

    /// An attribute's value as the VFS returns it: ACLs converted from
    /// ext4's format, values in an `ea_inode` read from its data.
    fn xattr_value(&self, raw: &RawInode, e: &xattr::Entry) -> Result<Vec<u8>> {
        let what = || {
            format!(
                "inode {} xattr {}",
                raw.ino,
                String::from_utf8_lossy(&e.name)
            )
        };
        let v = match &e.value {
            xattr::Value::Here(v) => v.clone(),
            &xattr::Value::Inode { ino, size } => self.read_ea_value(ino, size, raw, &what)?,
        };
        if matches!(e.index, 2 | 3) {
            return xattr::acl_to_xattr(&v, &what);
        }
        Ok(v)
    }
}

/// Block number of group descriptor block `gdb` (meta_bg puts the blocks of
/// later meta groups in the first group of each).
impl Drop for Ext4 {
    fn drop(&mut self) {
        // Unmount: write everything back and mark the filesystem clean.
        if let Err(e) = self.unmount() {
            eprintln!("scalevfs-ext4: writeback at unmount failed: {e}");
        }
    }
}

/// Refuse a read-write mount of an image the writer would damage.
fn check_rw(sb: &Superblock, journal: bool) -> Result<()> {
    // Orphans present: only a journaled mount with the orphan file frees
    // them (`orphan.rs`).
    let orphans_ok = journal
        && sb.feature_compat & COMPAT_HAS_JOURNAL != 0
        && sb.feature_compat & COMPAT_ORPHAN_FILE != 0;
    let ok = RO_COMPAT_RW_OK
        | if orphans_ok {
            RO_COMPAT_ORPHAN_PRESENT
        } else {
            0
        };
    let bad = sb.feature_ro_compat & !ok;
    if bad != 0 {
        return Err(Error::Incompatible(format!(
            "read-only compatible feature(s) {bad:#x} are not kept by the writer: mount read-only"
        )));
    }
    // An orphan list left by a crash is freed only by a journaled mount
    // (`orphan_list.rs`); written around, its inodes could be reused.
    let journaled = journal && sb.feature_compat & COMPAT_HAS_JOURNAL != 0 && sb.journal_inum != 0;
    if sb.last_orphan != 0 && !journaled {
        return Err(Error::Incompatible(format!(
            "an orphan list (first inode {}) is freed only by a journaled mount: mount with \
             the journal, run e2fsck, or mount read-only",
            sb.last_orphan
        )));
    }
    // Without the extent feature (ext2/3) new files, directories and slow
    // symlinks are block-mapped, and block-mapped files keep their maps
    // (`block_map.rs`), as in the kernel's ext4. An inline file or
    // directory moves out to an extent-mapped block (`inline_write.rs`),
    // which such an image's readers would reject.
    if sb.feature_incompat & INCOMPAT_EXTENTS == 0
        && sb.feature_incompat & INCOMPAT_INLINE_DATA != 0
    {
        return Err(Error::Incompatible(
            "inline_data without the extent feature is read-only here: inline inodes move \
             out to extent-mapped blocks; `tune2fs -O extent IMAGE` first, or mount read-only"
                .into(),
        ));
    }
    // inline_data: written as the kernel's ext4 writes it
    // (`inline_write.rs`): new directories and small files inline, moved
    // out to a block when they outgrow the inode.
    // MMP needs its block kept alive. (EA_INODE is written: `ea_inode.rs`.)
    if sb.feature_incompat & INCOMPAT_MMP != 0 {
        return Err(Error::Incompatible(format!(
            "feature(s) {} are not kept by the writer: mount read-only",
            incompat_name(INCOMPAT_MMP)
        )));
    }
    // Directory rec_len is stored as is (64 KiB blocks encode it).
    if sb.block_size() > 32768 {
        return Err(Error::Incompatible(
            "64 KiB blocks are read-only in this build".into(),
        ));
    }
    if sb.state & STATE_VALID == 0 || sb.state & STATE_ERROR != 0 {
        return Err(Error::Incompatible(
            "the filesystem was not cleanly unmounted or has errors: run e2fsck first, \
             or mount read-only"
                .into(),
        ));
    }
    Ok(())
}

fn gdt_block(sb: &Superblock, gdb: u64) -> u64 {
    // The block after the superblock's (block 1 of 1 KiB blocks even with
    // bigalloc, whose first data block is 0).
    let sb_block = SB_OFFSET / sb.block_size() as u64;
    if !sb.has_incompat(INCOMPAT_META_BG) || gdb < u64::from(sb.first_meta_bg) {
        return sb_block + 1 + gdb;
    }
    let per_block = (sb.block_size() / usize::from(sb.desc_size())) as u64;
    let group = gdb * per_block;
    let mut has_super = u64::from(sb.group_has_super(group));
    if group == 0 && sb.block_size() == 1024 && sb.first_data_block == 0 {
        has_super += 1;
    }
    group * u64::from(sb.blocks_per_group) + u64::from(sb.first_data_block) + has_super
}

/// Dropped after the commit lock is released by a commit request: bump
/// `Journal::released` and wake the threads sleeping on it
/// (`Ext4::commit_until`).
struct Released<'a>(&'a Journal);

impl Drop for Released<'_> {
    fn drop(&mut self) {
        // Relaxed: a hint (see `Journal::committing`).
        self.0.committing.store(false, Ordering::Relaxed);
        // SeqCst: after the holder's store of `done` (see `commit_until`).
        self.0.released.notify();
    }
}

/// The commit thread: every `interval` seconds, commit what is dirty
/// (and free the unlinked inodes that wait for it); ends when the
/// filesystem is gone or unmounted.
fn commit_thread(fs: std::sync::Weak<Ext4>, interval: u64) {
    let step = std::time::Duration::from_millis(100);
    let mut waited = 0u64;
    loop {
        std::thread::sleep(step);
        waited += 100;
        let Some(fs) = fs.upgrade() else { return };
        let Some(rw) = &fs.rw else { return };
        // Relaxed: see `Ext4::rw`.
        if rw.unmounted.load(Ordering::Relaxed) || rw.failed.load(Ordering::Relaxed) {
            return;
        }
        if waited < interval.saturating_mul(1000) {
            continue;
        }
        waited = 0;
        // Unlinked inodes whose last reference went wait for a handle or
        // a commit (`Ext4Inode::on_drop`): with nothing else to do, the
        // commit frees them.
        let busy = rw.bufs.dirty_count() > 0
            || rw.journal.get().is_some_and(|j| !j.pending.is_empty())
            || !rw.dead.is_empty();
        if busy {
            if let Err(e) = fs.commit() {
                eprintln!("scalevfs-ext4: commit failed: {e}");
            }
        }
    }
}

/// The attribute that holds inline data past `i_block`: `system.data`
/// (name index 7, the kernel's EXT4_XATTR_INDEX_SYSTEM_DATA).
const INLINE_XATTR_INDEX: u8 = 7;
const INLINE_XATTR_NAME: &[u8] = b"system.data";

/// How far an inline directory's entries move when it moves out to a
/// block: its 4-byte parent field gives way to `.` and `..` of 12 bytes
/// each (the kernel's `extra_offset` in `ext4_read_inline_dir`).
pub(crate) const INLINE_DIR_SHIFT: u64 = 20;

/// One live entry of an inline directory: its position in the inline
/// space and the next one's.
pub(crate) struct InlineEntry {
    pos: u64,
    next: u64,
    pub(crate) inode: u32,
    pub(crate) file_type: u8,
    pub(crate) name: Vec<u8>,
}
