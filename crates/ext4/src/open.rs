//! Opening an image: [`Ext4::open`] and [`Ext4::open_device`], the public
//! entries. They replay a journal that needs recovery as
//! [`Ext4Options::replay`] says (`journal::replay_on_open`), then open the
//! recovered image (`fs.rs`). Above both: the journal's replay itself opens
//! the image (with needs_recovery masked) to find the journal's blocks, so
//! `fs.rs` may not call the journal.

use std::path::Path;
use std::sync::Arc;

use crate::device::{BlockDevice, FileDevice};
use crate::error::Result;
use crate::fs::{Ext4, Ext4Options};
use crate::journal::writer::LogWriter;

impl Ext4 {
    /// Open the image (or block device) at `path`, read-only unless
    /// `opts.ro` is false.
    pub fn open(path: &Path, opts: Ext4Options) -> Result<Arc<Ext4>> {
        let dev = FileDevice::open(path, !opts.ro)?;
        Ext4::open_device(Box::new(dev), opts)
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
