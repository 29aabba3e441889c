//! `scalevfs mkfs IMAGE --size SIZE`: make an empty ext4 image file
//! (`scalevfs_ext4::mkfs`), as `mke2fs -t ext4` would.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use scalevfs::{
    Task, Timespec, Vfs, AT_FDCWD, AT_SYMLINK_NOFOLLOW, O_CREAT, O_EXCL, O_WRONLY, S_IFMT,
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
    /// Bytes per inode (default as mke2fs: 4096 below 512M, else 16384).
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
    let r = mkfs::make(&a.image, &o).map_err(|e| format!("mkfs {}: {e}", a.image.display()))?;
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
        watch_signals();
        let n = populate(&a.image, from, top, entries, a.quiet).map_err(|e| {
            // A half-filled image must not pass for a good one.
            let wiped = match unmake(&a.image) {
                Ok(()) => String::new(),
                Err(w) => format!(" (and wiping the half-filled image failed: {w})"),
            };
            format!("mkfs --from {}: {e}{wiped}", from.display())
        })?;
        if !a.quiet {
            println!("copied {} entries from {}", n.0, from.display());
            println!("free after copying: {} blocks, {} inodes", n.1, n.2);
        }
    }
    Ok(())
}

/// Set when SIGINT, SIGTERM or SIGHUP arrives during a fill
/// (`watch_signals`): the fill stops at its next entry or chunk, and the
/// half-filled image is wiped (`unmake`) before the process exits.
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

/// One host entry to copy: its path below the source and its metadata.
struct Entry {
    rel: PathBuf,
    md: std::fs::Metadata,
}

/// The metadata of `from` (a directory) and its tree (`scan`), less the
/// image itself should it lie inside (it would be copied into itself,
/// half made): that entry is left out with a message.
fn scan_source(from: &Path, image: &Path) -> Result<(std::fs::Metadata, Vec<Entry>), String> {
    let top = std::fs::metadata(from).map_err(|e| format!("{}: {e}", from.display()))?;
    if !top.is_dir() {
        return Err(format!("{} is not a directory", from.display()));
    }
    let mut entries = scan(from)?;
    if let Ok(img) = std::fs::metadata(image) {
        entries.retain(|e| {
            let own = e.md.dev() == img.dev() && e.md.ino() == img.ino();
            if own {
                eprintln!(
                    "mkfs --from: leaving out {}: it is the image being made",
                    from.join(&e.rel).display()
                );
            }
            !own
        });
    }
    Ok((top, entries))
}

/// The tree below `from`, parents before children (an explicit stack: no
/// recursion, so a deep tree cannot overflow the stack).
fn scan(from: &Path) -> Result<Vec<Entry>, String> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = from.join(&rel);
        let rd = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut names: Vec<_> = rd
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        names.sort();
        for name in names {
            let rel = rel.join(name);
            let path = from.join(&rel);
            let md =
                std::fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            if md.is_dir() {
                stack.push(rel.clone());
            }
            out.push(Entry { rel, md });
        }
    }
    Ok(out)
}

fn vpath(rel: &Path) -> Vec<u8> {
    let mut v = b"/".to_vec();
    v.extend_from_slice(rel.as_os_str().as_bytes());
    v
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
/// entries copied and the free blocks and inodes left.
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
    // ENOSPC says which of the image's limits the source passed.
    let err = |p: &[u8], what: &str, e: scalevfs::Errno| {
        let hint = match (e, t.statfs("/")) {
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
            String::from_utf8_lossy(p),
            e.message()
        )
    };
    let mut links: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    let mut buf = vec![0u8; 1 << 20];
    let bs = fs.block_size();
    for e in &entries {
        check_interrupt()?;
        let p = vpath(&e.rel);
        let src = from.join(&e.rel);
        let ft = e.md.file_type();
        if !ft.is_dir() && e.md.nlink() > 1 {
            // Any other name of an inode already copied is a link to it
            // (files, symlinks, FIFOs, sockets and devices alike).
            if let Some(first) = links.get(&(e.md.dev(), e.md.ino())) {
                t.linkat(AT_FDCWD, first, AT_FDCWD, &p, 0)
                    .map_err(|x| err(&p, "link", x))?;
                continue;
            }
            links.insert((e.md.dev(), e.md.ino()), p.clone());
        }
        if ft.is_dir() {
            match t.mkdir(&p, 0o700) {
                // mkfs made /lost+found: the source's goes into it.
                Err(x) if x == scalevfs::Errno::EEXIST && p == b"/lost+found" => {}
                r => r.map_err(|x| err(&p, "mkdir", x))?,
            }
        } else if ft.is_file() {
            let f = std::fs::File::open(&src).map_err(|x| format!("{}: {x}", src.display()))?;
            let fd = t
                .open(&p, O_CREAT | O_EXCL | O_WRONLY, 0o600)
                .map_err(|x| err(&p, "create", x))?;
            // Only the host's data runs are read, and all-zero blocks in
            // them skipped; the size is set at the end, so holes stay
            // holes (as mke2fs -d keeps sparse files sparse). The size is
            // the open file's (it may have changed since the scan).
            let size = f
                .metadata()
                .map_err(|x| format!("{}: {x}", src.display()))?
                .len();
            let r = (|| -> Result<(), String> {
                let mut seen = 0u64;
                'runs: for (start, end) in data_runs(&f, size) {
                    let mut pos = start;
                    while pos < end {
                        check_interrupt()?;
                        let want = ((end - pos) as usize).min(buf.len());
                        let n = f
                            .read_at(&mut buf[..want], pos)
                            .map_err(|x| format!("{}: {x}", src.display()))?;
                        if n == 0 {
                            // Fewer bytes than its size (it shrank while
                            // being copied, or a /proc or /sys file that
                            // reports a size it does not hold): the rest
                            // would read as zeros in the image.
                            eprintln!(
                                "mkfs --from: {}: ended at byte {pos} of {size}; the rest is zeros in the image",
                                src.display()
                            );
                            break 'runs;
                        }
                        write_nonzero(&t, fd, &buf[..n], pos, bs)
                            .map_err(|x| err(&p, "write", x))?;
                        pos += n as u64;
                    }
                    // The hole before the run and the run itself.
                    bar.inc(end.saturating_sub(seen));
                    seen = end;
                }
                bar.inc(size.saturating_sub(seen));
                let size = i64::try_from(size).map_err(|_| "file too large".to_string())?;
                t.ftruncate(fd, size).map_err(|x| err(&p, "truncate", x))
            })();
            t.close(fd).map_err(|x| err(&p, "close", x))?;
            r?;
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&src).map_err(|x| format!("{}: {x}", src.display()))?;
            t.symlinkat(target.as_os_str().as_bytes(), AT_FDCWD, &p)
                .map_err(|x| err(&p, "symlink", x))?;
        } else {
            // FIFOs, sockets, character and block devices.
            t.mknodat(AT_FDCWD, &p, e.md.mode() & (S_IFMT | 0o7777), e.md.rdev())
                .map_err(|x| err(&p, "mknod", x))?;
        }
        set_attrs(&t, &p, &e.md).map_err(|x| err(&p, "set attributes of", x))?;
        if !ft.is_dir() {
            copy_xattrs(&t, &src, &p)?;
        }
    }
    // Directory times last (their children changed them), deepest first,
    // and their attributes: a default ACL set before the children were
    // made would have been inherited by them (an access ACL on a file the
    // host has none on, widening who may read it), where mke2fs -d copies
    // each entry's attributes as they are.
    for e in entries.iter().rev().filter(|e| e.md.is_dir()) {
        let p = vpath(&e.rel);
        set_attrs(&t, &p, &e.md).map_err(|x| err(&p, "set attributes of", x))?;
        copy_xattrs(&t, &from.join(&e.rel), &p)?;
    }
    set_attrs(&t, b"/", &top).map_err(|x| err(b"/", "set attributes of", x))?;
    copy_xattrs(&t, from, b"/")?;
    check_interrupt()?;
    bar.finish_and_clear();
    let st = t.statfs("/").map_err(|x| err(b"/", "statfs", x))?;
    drop(t);
    drop(vfs);
    fs.unmount()
        .map_err(|e| format!("{}: {e}", image.display()))?;
    Ok((entries.len() as u64, st.bfree, st.ffree))
}
