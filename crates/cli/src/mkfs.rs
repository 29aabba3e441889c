//! `scalevfs mkfs IMAGE --size SIZE`: make an empty ext4 image file
//! (`scalevfs_ext4::mkfs`), as `mke2fs -t ext4` would.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use scalevfs::{
    Task, Timespec, Vfs, AT_FDCWD, AT_SYMLINK_NOFOLLOW, O_CREAT, O_DIRECTORY, O_EXCL, O_NOFOLLOW,
    O_PATH, O_WRONLY, S_IFMT,
};
use scalevfs_ext4::mkfs::{self, MkfsOptions};
use scalevfs_ext4::{Ext4, Ext4Options};

#[derive(Args, Debug)]
pub struct MkfsArgs {
    /// The image file to write (created, or cut to SIZE; its old contents
    /// are lost), or a block device (not mounted; SIZE must fit in it).
    image: PathBuf,
    /// Filesystem size: bytes, or a number with K, M, G or T (e.g. 64M, 1G).
    #[arg(long)]
    size: String,
    /// Block size: 1024, 2048 or 4096 (default: 1024 below 512M, else 4096).
    #[arg(long, short = 'b')]
    block_size: Option<u32>,
    /// Inode size in bytes (default 256).
    #[arg(long, short = 'I')]
    inode_size: Option<u16>,
    /// Bytes per inode (default as mke2fs: 8192 below 3M, 4096 below 512M,
    /// 16384 below 4T, 32768 below 16T, else 65536).
    #[arg(long, short = 'i')]
    inode_ratio: Option<u32>,
    /// Volume label (at most 16 bytes).
    #[arg(long, short = 'L', default_value = "")]
    label: String,
    /// Filesystem UUID (default: random).
    #[arg(long, short = 'U')]
    uuid: Option<String>,
    /// Feature edits as mke2fs -O: `feature` on, `^feature` off
    /// (comma-separated or repeated).
    #[arg(long = "features", short = 'O')]
    features: Vec<String>,
    /// Fill the new filesystem from this host directory (as mke2fs -d):
    /// directories, regular files, symlinks, FIFOs, sockets, devices and
    /// hard links, with their owners, modes and times, through the
    /// read-write ext4 type. No root needed.
    #[arg(long, short = 'd')]
    from: Option<PathBuf>,
    /// Print nothing on success.
    #[arg(long, short)]
    quiet: bool,
}

pub fn run(a: MkfsArgs) -> Result<(), String> {
    let size = mkfs::parse_size(&a.size).map_err(|e| e.to_string())?;
    let uuid = match &a.uuid {
        Some(u) => Some(mkfs::parse_uuid(u).map_err(|e| e.to_string())?),
        None => None,
    };
    let o = MkfsOptions {
        size,
        block_size: a.block_size,
        inode_size: a.inode_size,
        inode_ratio: a.inode_ratio,
        label: a.label,
        uuid,
        features: a.features,
        ..Default::default()
    };
    // With --from the termination signals are taken from here on, before
    // the scan and the make: a Ctrl-C during either is seen (the scan
    // stops; a made image is wiped) rather than killing the process with
    // a made but empty image that passes for the filled one.
    if a.from.is_some() {
        watch_signals();
    }
    // The source is read before the image is made: a typo in --from, a
    // file where a directory should be or an unreadable subdirectory is
    // an error that leaves an existing image as it was.
    let entries = match &a.from {
        Some(from) => Some(
            scan_source(from, &a.image)
                .map_err(|e| format!("mkfs --from {}: {e}", from.display()))?,
        ),
        None => None,
    };
    if let (Some(from), Some((_, entries))) = (&a.from, &entries) {
        // A source with more entries than the image has inodes fails
        // here, before the image is made, not after copying most of it.
        let free = mkfs::plan(&o)
            .map_err(|e| format!("mkfs {}: {e}", a.image.display()))?
            .free_inodes();
        let need = inodes_needed(entries);
        if need > free {
            return Err(format!(
                "mkfs --from {}: the source has {need} files and directories, more than the \
                 {free} free inodes the image would have (a smaller --inode-ratio or a larger \
                 --size gives more)",
                from.display()
            ));
        }
    }
    let r = mkfs::make(&a.image, &o).map_err(|e| format!("mkfs {}: {e}", a.image.display()))?;
    if let (Some(from), Err(e)) = (&a.from, check_interrupt()) {
        return Err(format!(
            "mkfs --from {}: {e}{}",
            from.display(),
            wipe_note(&a.image)
        ));
    }
    if !a.quiet {
        println!(
            "{}: ext4, {} blocks of {} bytes, {} inodes, {} groups, journal {} blocks",
            a.image.display(),
            r.blocks,
            r.block_size,
            r.inodes,
            r.groups,
            r.journal_blocks
        );
        println!("UUID {}", mkfs::format_uuid(&r.uuid));
        println!("features: {}", r.features.join(" "));
        if !r.backup_groups.is_empty() {
            let b: Vec<String> = r
                .backup_groups
                .iter()
                .map(|&g| {
                    (u64::from(g) * u64::from(r.blocks_per_group) + u64::from(r.block_size == 1024))
                        .to_string()
                })
                .collect();
            println!("superblock backups at blocks: {}", b.join(", "));
        }
        println!("free: {} blocks, {} inodes", r.free_blocks, r.free_inodes);
    }
    if let (Some(from), Some((top, entries))) = (&a.from, entries) {
        let n = fill_or_wipe(&a.image, || populate(&a.image, from, top, entries, a.quiet))
            .map_err(|e| format!("mkfs --from {}: {e}", from.display()))?;
        if !a.quiet {
            println!("copied {} entries from {}", n.0, from.display());
            println!("free after copying: {} blocks, {} inodes", n.1, n.2);
        }
    }
    Ok(())
}

/// Set when SIGINT, SIGTERM or SIGHUP arrives during `mkfs --from`
/// (`watch_signals`): the scan or the fill stops at its next entry or
/// chunk, and a made image is wiped (`unmake`) before the process exits.
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);

/// Take the termination signals from here on: they are blocked in every
/// thread (those the filesystem starts later inherit the mask) and a
/// thread of their own records the first in `INTERRUPTED`.
fn watch_signals() {
    let set = crate::mount::block_signals();
    let r = std::thread::Builder::new()
        .name("scalevfs-mkfs-signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: `set` is a valid, initialised sigset_t and `sig` a
            // valid place for the signal number.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                INTERRUPTED.store(sig, Ordering::SeqCst);
            }
        });
    if let Err(e) = r {
        eprintln!(
            "mkfs: cannot watch for signals ({e}); an interrupt leaves the image half-filled"
        );
    }
}

/// Err when a termination signal came (`watch_signals`).
fn check_interrupt() -> Result<(), String> {
    match INTERRUPTED.load(Ordering::SeqCst) {
        0 => Ok(()),
        sig => Err(format!("interrupted by signal {sig}")),
    }
}

/// Run `fill` (the copy into the made `image`); where it fails, or
/// panics, wipe the image (`unmake`): a half-filled image must not pass
/// for a good one. A panic (a bug, here or in the ext4 type) becomes an
/// error like any other, so the command fails with the image wiped
/// rather than unwinding past the wipe. `fill` unmounts the image as it
/// returns or unwinds (populate's UnmountOnDrop), before the wipe.
fn fill_or_wipe<T>(image: &Path, fill: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    // AssertUnwindSafe: after a panic nothing `fill` touched is used
    // again; only the image, by its path, is cut.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(fill)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_string());
        Err(format!("internal error (panic: {what})"))
    });
    r.map_err(|e| format!("{e}{}", wipe_note(image)))
}

/// Wipe `image` after a failed or interrupted fill (`unmake`): nothing
/// to add to the error where that worked, else why it did not.
fn wipe_note(image: &Path) -> String {
    match unmake(image) {
        Ok(()) => String::new(),
        Err(w) => format!(" (and wiping the half-filled image failed: {w})"),
    }
}

/// Make `image` stop passing for a filesystem after a fill failed: a file
/// is cut to nothing; on a block device (which cannot be cut) the primary
/// superblock, bytes 1024..2048 at every block size, is zeroed, as mkfs
/// does before it starts.
fn unmake(image: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{FileExt, FileTypeExt};
    if std::fs::metadata(image)?.file_type().is_block_device() {
        let f = std::fs::OpenOptions::new().write(true).open(image)?;
        f.write_all_at(&[0u8; 1024], 1024)?;
        f.sync_all()
    } else {
        std::fs::File::create(image).map(|_| ())
    }
}

/// Extended attributes as (name, value) pairs.
type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// The extended attributes of host path `p` (not following a symlink):
/// none where its filesystem keeps none.
fn host_xattrs(p: &Path) -> Result<Xattrs, String> {
    let c = CString::new(p.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let fail = |what: &str| {
        format!(
            "{what} {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        )
    };
    let unsupported = || std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOTSUP);
    // A size query, then the read; ERANGE when it grew between: again.
    let list = loop {
        // SAFETY: `c` is a NUL-terminated path; a null buffer of length 0
        // asks for the size.
        let n = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
        if n < 0 {
            return if unsupported() {
                Ok(Vec::new())
            } else {
                Err(fail("llistxattr"))
            };
        }
        let mut v = vec![0u8; n as usize];
        // SAFETY: `v` has `v.len()` writable bytes.
        let m = unsafe { libc::llistxattr(c.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        if m >= 0 {
            v.truncate(m as usize);
            break v;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::ERANGE) {
            return Err(fail("llistxattr"));
        }
    };
    let mut out = Vec::new();
    for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cn = CString::new(name).map_err(|e| e.to_string())?;
        let value = loop {
            // SAFETY: NUL-terminated path and name; a size query.
            let n = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), std::ptr::null_mut(), 0) };
            if n < 0 {
                return Err(fail("lgetxattr"));
            }
            let mut v = vec![0u8; n as usize];
            // SAFETY: `v` has `v.len()` writable bytes.
            let m =
                unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
            if m >= 0 {
                v.truncate(m as usize);
                break v;
            }
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::ERANGE) {
                return Err(fail("lgetxattr"));
            }
        };
        out.push((name.to_vec(), value));
    }
    Ok(out)
}

/// Copy host path `src`'s extended attributes (POSIX ACLs among them) to
/// `p`, after its owner and mode (a chown would clear a capability).
fn copy_xattrs(t: &Task, src: &Path, p: &[u8]) -> Result<(), String> {
    for (name, value) in host_xattrs(src)? {
        t.lsetxattr(p, &name, &value, 0).map_err(|x| {
            // ENOSPC here is ext4's limit on one file's attributes (the
            // inode and one block), with room left in the image.
            let hint = if x == scalevfs::Errno::ENOSPC {
                " (the attributes do not fit the inode and one block)"
            } else {
                ""
            };
            format!(
                "setxattr {} {}: {}{hint}",
                String::from_utf8_lossy(p),
                String::from_utf8_lossy(&name),
                x.message()
            )
        })?;
    }
    Ok(())
}

/// The data runs of host file `f` (`size` bytes) as [start, end) byte
/// ranges, from SEEK_DATA/SEEK_HOLE, so that a huge sparse file is not
/// read hole by hole; the whole file where the host cannot tell.
fn data_runs(f: &std::fs::File, size: u64) -> Vec<(u64, u64)> {
    use std::os::unix::io::AsRawFd;
    let fd = f.as_raw_fd();
    let mut out = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        // SAFETY: lseek on an open descriptor.
        let data = unsafe { libc::lseek(fd, pos as i64, libc::SEEK_DATA) };
        if data < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                break;
            }
            // No SEEK_DATA here: everything from `pos` is data.
            out.push((pos, size));
            break;
        }
        let data = data as u64;
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data as i64, libc::SEEK_HOLE) };
        let hole = if hole < 0 {
            size
        } else {
            (hole as u64).min(size)
        };
        if hole <= data {
            out.push((data, size));
            break;
        }
        out.push((data, hole));
        pos = hole;
    }
    out
}

/// One host entry to copy, in depth-first order (a directory before its
/// children, its children before its next sibling): its depth below the
/// source (0 for the source's own children), its name and its metadata.
/// Entries hold names, not paths: a tree deeper than PATH_MAX is walked
/// one directory at a time (`Cwd`), as mke2fs -d walks it.
struct Entry {
    depth: usize,
    name: OsString,
    md: std::fs::Metadata,
}

/// An inode's identity on the host: (device, inode number).
fn host_id(md: &std::fs::Metadata) -> (u64, u64) {
    (md.dev(), md.ino())
}

/// The inodes a copy of `entries` takes: one per directory (less a
/// top-level lost+found, which goes into the one mkfs made) and one per
/// other inode, however many names it has.
fn inodes_needed(entries: &[Entry]) -> u64 {
    let mut linked = std::collections::HashSet::new();
    entries
        .iter()
        .filter(|e| {
            if e.md.is_dir() {
                !(e.depth == 0 && e.name == "lost+found")
            } else {
                e.md.nlink() == 1 || linked.insert(host_id(&e.md))
            }
        })
        .count() as u64
}

/// The metadata of `from` (a directory) and its tree (`scan`), less the
/// image itself should it lie inside (it would be copied into itself,
/// half made): that entry is left out with a message.
fn scan_source(from: &Path, image: &Path) -> Result<(std::fs::Metadata, Vec<Entry>), String> {
    let top = std::fs::metadata(from).map_err(|e| format!("{}: {e}", from.display()))?;
    if !top.is_dir() {
        return Err(format!("{} is not a directory", from.display()));
    }
    let own = std::fs::metadata(image).ok().map(|m| host_id(&m));
    let entries = scan(from, &top, own)?;
    Ok((top, entries))
}

/// The process's working directory, gone back to when this drops: the
/// walks below change it as they go (the only way to reach a directory
/// whose path is longer than PATH_MAX without holding a descriptor per
/// level).
struct Cwd(std::fs::File);

impl Cwd {
    fn save() -> Result<Cwd, String> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(".")
            .map(Cwd)
            .map_err(|e| format!("the working directory: {e}"))
    }
}

impl Drop for Cwd {
    fn drop(&mut self) {
        use std::os::unix::io::AsRawFd;
        // SAFETY: fchdir on a descriptor this value owns.
        if unsafe { libc::fchdir(self.0.as_raw_fd()) } != 0 {
            eprintln!(
                "mkfs --from: cannot return to the working directory: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Make host directory `name` (below the working directory, not through
/// a symlink) the working directory, if it is still the inode `md`
/// describes.
fn host_enter(name: &OsStr, md: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let d = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(name)?;
    if host_id(&d.metadata()?) != host_id(md) {
        return Err(std::io::Error::other("replaced during the copy"));
    }
    // SAFETY: fchdir on an open directory descriptor.
    if unsafe { libc::fchdir(d.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Go up to the parent directory, which must be the inode `parent`
/// identifies (the tree is not expected to move while it is copied).
fn host_leave(parent: (u64, u64)) -> std::io::Result<()> {
    std::env::set_current_dir("..")?;
    if host_id(&std::fs::metadata(".")?) != parent {
        return Err(std::io::Error::other("moved during the copy"));
    }
    Ok(())
}

/// The names in the working directory, sorted, last first (popped in
/// order).
fn dir_names() -> std::io::Result<Vec<OsString>> {
    let mut names: Vec<OsString> = std::fs::read_dir(".")?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok(names)
}

/// The tree below `from` (metadata `top`) in depth-first order, leaving
/// out the inode `own` (the image). An explicit stack, not recursion: a
/// deep tree cannot overflow the stack.
fn scan(
    from: &Path,
    top: &std::fs::Metadata,
    own: Option<(u64, u64)>,
) -> Result<Vec<Entry>, String> {
    let _back = Cwd::save()?;
    let mut rel = PathBuf::new();
    let at = |rel: &Path| from.join(rel).display().to_string();
    std::env::set_current_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
    if host_id(&std::fs::metadata(".").map_err(|e| format!("{}: {e}", at(&rel)))?) != host_id(top) {
        return Err(format!("{}: replaced during the copy", from.display()));
    }
    // Per open level: the names left to visit and the directory's id.
    let mut stack = vec![(
        dir_names().map_err(|e| format!("{}: {e}", at(&rel)))?,
        host_id(top),
    )];
    let mut out = Vec::new();
    while let Some((names, _)) = stack.last_mut() {
        // A large tree takes a while to scan: a Ctrl-C stops it here,
        // before the image is touched.
        check_interrupt()?;
        let Some(name) = names.pop() else {
            stack.pop();
            if let Some(&(_, parent)) = stack.last() {
                host_leave(parent).map_err(|e| format!("{}/..: {e}", at(&rel)))?;
                rel.pop();
            }
            continue;
        };
        let depth = stack.len() - 1;
        let md = std::fs::symlink_metadata(&name)
            .map_err(|e| format!("{}: {e}", at(&rel.join(&name))))?;
        if Some(host_id(&md)) == own && !md.is_dir() {
            eprintln!(
                "mkfs --from: leaving out {}: it is the image being made",
                at(&rel.join(&name))
            );
            continue;
        }
        if md.is_dir() {
            rel.push(&name);
            host_enter(&name, &md).map_err(|e| format!("{}: {e}", at(&rel)))?;
            let names = dir_names().map_err(|e| format!("{}: {e}", at(&rel)))?;
            stack.push((names, host_id(&md)));
        }
        out.push(Entry { depth, name, md });
    }
    Ok(out)
}

/// Owner, mode (after the owner: a chown clears set-id bits) and times of
/// `p`, as the host has them.
fn set_attrs(t: &Task, p: &[u8], md: &std::fs::Metadata) -> scalevfs::VfsResult<()> {
    t.fchownat(AT_FDCWD, p, md.uid(), md.gid(), AT_SYMLINK_NOFOLLOW)?;
    if !md.file_type().is_symlink() {
        t.fchmodat(AT_FDCWD, p, md.mode() & 0o7777, 0)?;
    }
    let times = [
        Timespec {
            sec: md.atime(),
            nsec: md.atime_nsec(),
        },
        Timespec {
            sec: md.mtime(),
            nsec: md.mtime_nsec(),
        },
    ];
    t.utimensat(AT_FDCWD, p, Some(times), AT_SYMLINK_NOFOLLOW)
}

/// Write `data` (at byte `pos` of the file) to `fd`, leaving out the
/// filesystem blocks (`bs` bytes, counted from the file's start) that
/// hold only zeros; the blocks between are written a run at a time.
fn write_nonzero(t: &Task, fd: i32, data: &[u8], pos: u64, bs: usize) -> scalevfs::VfsResult<()> {
    // Block-sized pieces of `data` as (start, end, all zeros).
    let mut pieces = Vec::new();
    let mut k = 0usize;
    while k < data.len() {
        let at = pos + k as u64;
        let n = (bs - (at % bs as u64) as usize).min(data.len() - k);
        pieces.push((k, k + n, data[k..k + n].iter().all(|&b| b == 0)));
        k += n;
    }
    for run in pieces.chunk_by(|a, b| a.2 == b.2) {
        if run[0].2 {
            continue;
        }
        let (a, b) = (run[0].0, run[run.len() - 1].1);
        let mut done = a;
        while done < b {
            let off = i64::try_from(pos + done as u64).map_err(|_| scalevfs::Errno::EFBIG)?;
            match t.pwrite(fd, &data[done..b], off)? {
                0 => return Err(scalevfs::Errno::EIO),
                n => done += n,
            }
        }
    }
    Ok(())
}

/// Copy the tree at `from` into the image (made just before): returns the
/// entries copied and the free blocks and inodes left. Both walks go one
/// directory at a time: the host's working directory and the image task's
/// follow the entry being copied, so every call names one entry (no path
/// is longer than a name, however deep the tree).
fn populate(
    image: &Path,
    from: &Path,
    top: std::fs::Metadata,
    entries: Vec<Entry>,
    quiet: bool,
) -> Result<(u64, u64, u64), String> {
    let total: u64 = entries
        .iter()
        .filter(|e| e.md.is_file())
        .map(|e| e.md.len())
        .sum();
    let fs = Ext4::open(
        image,
        Ext4Options {
            ro: false,
            ..Default::default()
        },
    )
    .map_err(|e| format!("{}: {e}", image.display()))?;
    // On an error return the filesystem is unmounted here, after the task
    // and the VFS go (declared after it, they drop first) and before the
    // caller wipes the image: nothing is written after the wipe (the last
    // reference could otherwise go in the commit thread, later, and write
    // back into the truncated file). A second unmount does nothing.
    struct UnmountOnDrop(std::sync::Arc<Ext4>);
    impl Drop for UnmountOnDrop {
        fn drop(&mut self) {
            let _ = self.0.unmount();
        }
    }
    let _unmount = UnmountOnDrop(fs.clone());
    let vfs = Vfs::with_root_fs(Default::default(), fs.clone());
    let t = vfs.root_task();
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    };
    // The host's working directory comes back when this returns (after
    // the image was opened by its path: a relative one still names it).
    let _back = Cwd::save()?;
    std::env::set_current_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
    if std::fs::metadata(".").map(|m| host_id(&m)).ok() != Some(host_id(&top)) {
        return Err(format!("{}: replaced during the copy", from.display()));
    }
    let mut w = Walk {
        t: &t,
        from,
        rel: PathBuf::new(),
        vp: b"/".to_vec(),
        open: vec![(None, host_id(&top))],
    };
    let mut links: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    let mut buf = vec![0u8; 1 << 20];
    let bs = fs.block_size();
    for (i, e) in entries.iter().enumerate() {
        check_interrupt()?;
        while w.open.len() > e.depth + 1 {
            w.leave(&entries)?;
        }
        let name = e.name.as_bytes();
        let ft = e.md.file_type();
        if !ft.is_dir() && e.md.nlink() > 1 {
            // Any other name of an inode already copied is a link to it
            // (files, symlinks, FIFOs, sockets and devices alike).
            if let Some(first) = links.get(&host_id(&e.md)) {
                link_long(&t, first, name).map_err(|x| w.err(name, "link", x))?;
                continue;
            }
            links.insert(host_id(&e.md), w.image_path(name));
        }
        if ft.is_dir() {
            match t.mkdir(name, 0o700) {
                // mkfs made /lost+found: the source's goes into it.
                Err(x) if x == scalevfs::Errno::EEXIST && w.vp == b"/" && name == b"lost+found" => {
                }
                r => r.map_err(|x| w.err(name, "mkdir", x))?,
            }
            w.enter(i, e)?;
            continue;
        }
        if ft.is_file() {
            copy_file(&w, e, &mut buf, bs, &bar)?;
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&e.name).map_err(|x| w.host_err(&e.name, x))?;
            t.symlinkat(target.as_os_str().as_bytes(), AT_FDCWD, name)
                .map_err(|x| w.err(name, "symlink", x))?;
        } else {
            // FIFOs, sockets, character and block devices.
            t.mknodat(AT_FDCWD, name, e.md.mode() & (S_IFMT | 0o7777), e.md.rdev())
                .map_err(|x| w.err(name, "mknod", x))?;
        }
        set_attrs(&t, name, &e.md).map_err(|x| w.err(name, "set attributes of", x))?;
        copy_xattrs(&t, Path::new(&e.name), name).map_err(|x| w.in_dir(x))?;
    }
    while w.open.len() > 1 {
        w.leave(&entries)?;
    }
    set_attrs(&t, b"/", &top).map_err(|x| w.err(b"", "set attributes of", x))?;
    copy_xattrs(&t, Path::new("."), b"/").map_err(|x| w.in_dir(x))?;
    check_interrupt()?;
    bar.finish_and_clear();
    let st = t.statfs("/").map_err(|x| w.err(b"", "statfs", x))?;
    drop(t);
    drop(vfs);
    fs.unmount()
        .map_err(|e| format!("{}: {e}", image.display()))?;
    Ok((entries.len() as u64, st.bfree, st.ffree))
}

/// Where a fill stands: the directory being filled, on the host and in
/// the image (both also the working directories), and the directories
/// open above it.
struct Walk<'a> {
    t: &'a Task,
    from: &'a Path,
    /// The host directory below `from`, for messages.
    rel: PathBuf,
    /// The image directory, "/" or "/a/b" (for messages and hard links).
    vp: Vec<u8>,
    /// Per directory entered: its entry's index (None for the top) and its
    /// host id.
    open: Vec<(Option<usize>, (u64, u64))>,
}

impl Walk<'_> {
    /// Image path of `name` in the current directory.
    fn image_path(&self, name: &[u8]) -> Vec<u8> {
        let mut p = self.vp.clone();
        if p.len() > 1 {
            p.push(b'/');
        }
        p.extend_from_slice(name);
        p
    }

    /// A message for an image call on `name` that failed: ENOSPC says
    /// which of the image's limits the source passed.
    fn err(&self, name: &[u8], what: &str, e: scalevfs::Errno) -> String {
        let hint = match (e, self.t.statfs("/")) {
            (scalevfs::Errno::ENOSPC, Ok(st)) if st.ffree == 0 => format!(
                " (all {} inodes are used: a smaller --inode-ratio or a larger --size gives more)",
                st.files
            ),
            (scalevfs::Errno::ENOSPC, _) => {
                " (no free blocks left: --size is too small for the source)".to_string()
            }
            _ => String::new(),
        };
        format!(
            "{} {}: {}{hint}",
            what,
            String::from_utf8_lossy(&self.image_path(name)),
            e.message()
        )
    }

    /// A message for a host call on `name` that failed.
    fn host_err(&self, name: &OsStr, e: std::io::Error) -> String {
        format!("{}: {e}", self.from.join(&self.rel).join(name).display())
    }

    /// A message from a helper that named a host path relative to the
    /// current directory: where that directory is.
    fn in_dir(&self, m: String) -> String {
        format!("{m} (in {})", self.from.join(&self.rel).display())
    }

    /// Step into directory entry `i` (`e`), just made in the image.
    fn enter(&mut self, i: usize, e: &Entry) -> Result<(), String> {
        let name = e.name.as_bytes();
        host_enter(&e.name, &e.md).map_err(|x| self.host_err(&e.name, x))?;
        if let Err(x) = self.t.chdir(name) {
            // Back out on the host too, so both stay in step.
            let parent = self.open.last().map(|o| o.1).unwrap_or_default();
            let _ = host_leave(parent);
            return Err(self.err(name, "chdir", x));
        }
        self.rel.push(&e.name);
        self.vp = self.image_path(name);
        self.open.push((Some(i), host_id(&e.md)));
        Ok(())
    }

    /// Step out of the current directory, done: it gets its attributes
    /// now, after its children changed its times and were made (a default
    /// ACL set before them would have been inherited by them, widening
    /// who may read files the host has no ACL on, where mke2fs -d copies
    /// each entry's attributes as they are).
    fn leave(&mut self, entries: &[Entry]) -> Result<(), String> {
        let Some((Some(i), _)) = self.open.pop() else {
            return Ok(());
        };
        let parent = self.open.last().map(|o| o.1).unwrap_or_default();
        host_leave(parent).map_err(|x| self.host_err(OsStr::new(".."), x))?;
        self.t
            .chdir(b"..")
            .map_err(|x| self.err(b"..", "chdir", x))?;
        self.rel.pop();
        let cut = self.vp.iter().rposition(|&b| b == b'/').unwrap_or(0);
        self.vp.truncate(cut.max(1));
        let e = &entries[i];
        let name = e.name.as_bytes();
        set_attrs(self.t, name, &e.md).map_err(|x| self.err(name, "set attributes of", x))?;
        copy_xattrs(self.t, Path::new(&e.name), name).map_err(|x| self.in_dir(x))
    }
}

/// Open host regular file `path` for reading, if it is still the inode
/// `md` (from the scan) describes. The name is opened again long after
/// the scan, and meanwhile may name something else: a FIFO (whose
/// blocking open would hang the copy, past Ctrl-C, which only sets a
/// flag), a device (not to be read as data) or another file (whose data
/// would be copied under the scanned inode's owner, mode and links).
/// O_NONBLOCK makes the open of a FIFO or device return at once, and the
/// descriptor's own identity is checked before anything is read; the
/// flag is cleared after (reads of a regular file never block anyway, but
/// the descriptor then behaves as an ordinary one).
///
/// A WouldBlock error is the scanned file under a lease (O_NONBLOCK does
/// not wait for its holder to let go): the caller tries again.
fn open_scanned(path: &Path, md: &std::fs::Metadata) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let same = |now: &std::fs::Metadata| {
        if !now.is_file() {
            Err(std::io::Error::other(
                "replaced during the copy (no longer a regular file)",
            ))
        } else if host_id(now) != host_id(md) {
            Err(std::io::Error::other(
                "replaced during the copy (a different file)",
            ))
        } else {
            Ok(())
        }
    };
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        // Only a lease on the scanned file is waited for: anything else
        // that answers so (a device, say) is not the scanned file.
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            same(&std::fs::symlink_metadata(path)?)?;
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    same(&f.metadata()?)?;
    let fd = f.as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL on a descriptor `f` owns and keeps open.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above; only O_NONBLOCK changes.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(f)
}

/// Copy regular file `e` (in the current directory) into a new file of
/// that name in the image's current directory.
fn copy_file(
    w: &Walk,
    e: &Entry,
    buf: &mut [u8],
    bs: usize,
    bar: &ProgressBar,
) -> Result<(), String> {
    let (t, name) = (w.t, e.name.as_bytes());
    // A file under a lease (a file server's, say) answers WouldBlock until
    // its holder lets go, at most the kernel's lease-break-time: wait for
    // it, as a blocking open would, but a Ctrl-C still ends the wait.
    let f = loop {
        match open_scanned(Path::new(&e.name), &e.md) {
            Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => {
                check_interrupt()?;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => break r.map_err(|x| w.host_err(&e.name, x))?,
        }
    };
    let fd = t
        .open(name, O_CREAT | O_EXCL | O_WRONLY, 0o600)
        .map_err(|x| w.err(name, "create", x))?;
    // Only the host's data runs are read, and all-zero blocks in them
    // skipped; the size is set at the end, so holes stay holes (as mke2fs
    // -d keeps sparse files sparse). The size is the open file's (it may
    // have changed since the scan).
    let r = (|| -> Result<(), String> {
        let size = f.metadata().map_err(|x| w.host_err(&e.name, x))?.len();
        let mut seen = 0u64;
        'runs: for (start, end) in data_runs(&f, size) {
            let mut pos = start;
            while pos < end {
                check_interrupt()?;
                let want = ((end - pos) as usize).min(buf.len());
                let n = f
                    .read_at(&mut buf[..want], pos)
                    .map_err(|x| w.host_err(&e.name, x))?;
                if n == 0 {
                    // Fewer bytes than its size (it shrank while being
                    // copied, or a /proc or /sys file that reports a size
                    // it does not hold): the rest would read as zeros in
                    // the image.
                    eprintln!(
                        "mkfs --from: {}: ended at byte {pos} of {size}; the rest is zeros in the image",
                        w.from.join(&w.rel).join(&e.name).display()
                    );
                    break 'runs;
                }
                write_nonzero(t, fd, &buf[..n], pos, bs).map_err(|x| w.err(name, "write", x))?;
                pos += n as u64;
            }
            // The hole before the run and the run itself.
            bar.inc(end.saturating_sub(seen));
            seen = end;
        }
        bar.inc(size.saturating_sub(seen));
        let size = i64::try_from(size).map_err(|_| "file too large".to_string())?;
        t.ftruncate(fd, size)
            .map_err(|x| w.err(name, "truncate", x))
    })();
    t.close(fd).map_err(|x| w.err(name, "close", x))?;
    r
}

/// `linkat(first, name)` in the current directory, where `first` is an
/// absolute image path of any length: one longer than a path may be is
/// reached a piece at a time from the root.
fn link_long(t: &Task, first: &[u8], name: &[u8]) -> scalevfs::VfsResult<()> {
    const PIECE: usize = 3072;
    if first.len() < PIECE {
        return t.linkat(AT_FDCWD, first, AT_FDCWD, name, 0);
    }
    let cut = first.iter().rposition(|&b| b == b'/').unwrap_or(0);
    let (dir, last) = (&first[..cut], &first[cut + 1..]);
    let mut fd = t.open(b"/", O_PATH | O_DIRECTORY, 0)?;
    let r = (|| {
        let mut rest = dir.strip_prefix(b"/").unwrap_or(dir);
        while !rest.is_empty() {
            // The longest run of whole names that fits in a piece.
            let take = if rest.len() <= PIECE {
                rest.len()
            } else {
                rest[..=PIECE]
                    .iter()
                    .rposition(|&b| b == b'/')
                    .filter(|&k| k > 0)
                    .ok_or(scalevfs::Errno::ENAMETOOLONG)?
            };
            let next = t.openat(fd, &rest[..take], O_PATH | O_DIRECTORY | O_NOFOLLOW, 0)?;
            let _ = t.close(fd);
            fd = next;
            rest = rest[take..].strip_prefix(b"/").unwrap_or(&rest[take..]);
        }
        t.linkat(fd, last, AT_FDCWD, name, 0)
    })();
    let _ = t.close(fd);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn scratch(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("scalevfs-mkfs-unit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// `open_scanned(p, md)` on a thread, given `secs` to answer: a hang
    /// (a blocking open of a FIFO) fails the test instead of the run.
    fn open_in_time(p: PathBuf, md: std::fs::Metadata, secs: u64) -> std::io::Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(open_scanned(&p, &md).map(|_| ()));
        });
        rx.recv_timeout(Duration::from_secs(secs))
            .expect("open_scanned hung")
    }

    #[test]
    fn open_scanned_takes_the_scanned_file() {
        let d = scratch("same");
        let p = d.join("f");
        std::fs::write(&p, b"data").unwrap();
        let md = std::fs::symlink_metadata(&p).unwrap();
        let f = open_scanned(&p, &md).unwrap();
        // The descriptor is an ordinary blocking one again.
        use std::os::unix::io::AsRawFd;
        // SAFETY: F_GETFL on a descriptor `f` owns.
        let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_NONBLOCK, 0);
        let mut s = String::new();
        use std::io::Read;
        (&f).read_to_string(&mut s).unwrap();
        assert_eq!(s, "data");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn open_scanned_refuses_a_fifo_at_once() {
        let d = scratch("fifo");
        let p = d.join("f");
        std::fs::write(&p, b"data").unwrap();
        let md = std::fs::symlink_metadata(&p).unwrap();
        // The scanned file is replaced by a FIFO no one writes to.
        std::fs::remove_file(&p).unwrap();
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open_in_time(p, md, 10).unwrap_err();
        assert!(e.to_string().contains("replaced"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn open_scanned_refuses_another_file() {
        let d = scratch("other");
        let p = d.join("f");
        std::fs::write(&p, b"data").unwrap();
        let md = std::fs::symlink_metadata(&p).unwrap();
        // Another file renamed over it: a new inode under the same name.
        let q = d.join("g");
        std::fs::write(&q, b"other").unwrap();
        std::fs::rename(&q, &p).unwrap();
        let e = open_in_time(p.clone(), md, 10).unwrap_err();
        assert!(e.to_string().contains("replaced"), "{e}");
        // A symlink to the scanned file is not followed either.
        let r = d.join("r");
        std::fs::write(&r, b"data").unwrap();
        let md = std::fs::symlink_metadata(&r).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(&r, &p).unwrap();
        assert!(open_in_time(p, md, 10).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_fill_that_panics_wipes_the_image() {
        let d = scratch("panic");
        let img = d.join("i.img");
        std::fs::write(&img, vec![1u8; 4096]).unwrap();
        let r: Result<(), String> = fill_or_wipe(&img, || panic!("fill went wrong"));
        let e = r.unwrap_err();
        assert!(
            e.contains("internal error") && e.contains("fill went wrong"),
            "{e}"
        );
        assert_eq!(std::fs::metadata(&img).unwrap().len(), 0);
        // An error return wipes it too; success leaves it.
        std::fs::write(&img, vec![1u8; 4096]).unwrap();
        let e = fill_or_wipe::<()>(&img, || Err("no room".into())).unwrap_err();
        assert_eq!(e, "no room");
        assert_eq!(std::fs::metadata(&img).unwrap().len(), 0);
        std::fs::write(&img, vec![1u8; 4096]).unwrap();
        assert_eq!(fill_or_wipe(&img, || Ok(7)), Ok(7));
        assert_eq!(std::fs::metadata(&img).unwrap().len(), 4096);
        let _ = std::fs::remove_dir_all(&d);
    }
}
