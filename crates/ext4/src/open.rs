//! Opening an image: [`Ext4::open`] and [`Ext4::open_device`], the public
//! entries. They replay a journal that needs recovery as
//! [`Ext4Options::replay`] says (`journal::replay_on_open`), then open the
//! recovered image (`fs.rs`). Above both: the journal's replay itself opens
//! the image (with needs_recovery masked) to find the journal's blocks, so
//! `fs.rs` may not call the journal.

use std::path::Path;
use std::sync::Arc;

use crate::device::{BlockDevice, FileDevice, MmapDevice};
use crate::error::Result;
use crate::fs::{Ext4, Ext4Options, IoMode};
use crate::journal::writer::LogWriter;

impl Ext4 {
    /// Open the image (or block device) at `path`, read-only unless
    /// `opts.ro` is false.
    pub fn open(path: &Path, opts: Ext4Options) -> Result<Arc<Ext4>> {
        let dev: Box<dyn BlockDevice> = match mapped(path, &opts) {
            Some(dev) => Box::new(dev),
            None => Box::new(FileDevice::open(path, !opts.ro)?),
        };
        Ext4::open_device(dev, opts)
    }

    /// Open a filesystem on `dev` (read-only unless `opts.ro` is false).
    /// A read-write open of an image with a journal writes through it
    /// (`Ext4Options::journal`, the default): the log writer is installed
    /// here, above both the journal and `fs.rs`.
    pub fn open_device(dev: Box<dyn BlockDevice>, opts: Ext4Options) -> Result<Arc<Ext4>> {
        let dev = crate::journal::replay_on_open(dev, opts.replay)?;
        let (journal, interval, orphans) =
            (opts.journal && !opts.ro, opts.commit_interval, opts.orphans);
        let fs = Ext4::open_unreplayed(dev, opts)?;
        let sb = fs.superblock();
        if journal && fs.rw_journaled() {
            let r = LogWriter::open(fs.device(), sb.has_metadata_csum())
                .and_then(|log| fs.install_journal(Box::new(log), interval, orphans));
            if let Err(e) = r {
                fs.abandon();
                return Err(e);
            }
        }
        Ok(fs)
    }
}

/// The lazily mapped device for `path` where `opts` and the host allow it
/// (`IoMode::Auto`): a read-write open of a regular file on a host
/// filesystem whose `fallocate` reserves space for later writes through a
/// mapping (tmpfs, ext4, XFS). `None` for everything else, and where the
/// mapping cannot be made, so that the caller opens it with `pread`/`pwrite`.
fn mapped(path: &Path, opts: &Ext4Options) -> Option<MmapDevice> {
    use crate::device::{host_fs_magic, EXT4_HOST_MAGIC, TMPFS_MAGIC, XFS_MAGIC};
    if opts.ro || opts.io != IoMode::Auto {
        return None;
    }
    let probe = std::fs::File::open(path).ok()?;
    if !probe.metadata().ok()?.is_file() {
        return None;
    }
    let kind = host_fs_magic(&probe)?;
    if ![TMPFS_MAGIC, EXT4_HOST_MAGIC, XFS_MAGIC].contains(&kind) {
        return None;
    }
    drop(probe);
    MmapDevice::open_lazy(path).ok()
}
