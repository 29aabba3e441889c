//! Configuration of a `Vfs`: every mechanism's variant, selectable at run
//! time so one process can compare "before" and "after".

use scalevfs_sync::LockRefVariant;

use crate::dcache::{DcacheConfig, DcacheIndex, DentryLayout};
use crate::memfs::MemFsOptions;

/// How the path walk runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WalkMode {
    /// Lock-free first, references only at the leaf (default).
    #[default]
    LockFree,
    /// Reference mode for every component (a lock/ref per step: "before").
    RefOnly,
}

/// Configuration of a `Vfs`: every mechanism's variant, selectable at run
/// time so one process can compare them.
#[derive(Clone, Debug, Default)]
pub struct VfsConfig {
    pub dcache: DcacheConfig,
    pub walk: WalkMode,
    /// `stat` takes and drops a reference on the leaf, as Linux does
    /// (the default takes none).
    pub stat_takes_ref: bool,
    /// Listing a directory locks each child's dentry, as Linux's libfs does.
    pub readdir_locking: bool,
    /// Options of the root memfs.
    pub memfs: MemFsOptions,
    /// How `lseek` on a regular file synchronises (key `llseek`).
    pub llseek: LlseekVariant,
    /// Orphan-file algorithm of every mounted filesystem (key `orphan`).
    pub orphan: scalevfs_orphan::OrphanVariant,
    /// Blocks in each orphan file (key `orphan-blocks`; 0 = default 16).
    pub orphan_blocks: usize,
    /// Linux's `fs.protected_hardlinks=0` (key `protected-hardlinks=0|1`;
    /// default 1, on): anyone may link any file they can reach. A front end
    /// whose kernel already checked (FUSE: do_linkat's may_linkat runs
    /// before FUSE_LINK, with the host's sysctl) turns the check off here.
    pub protected_hardlinks_off: bool,
    /// Linux's `fs.nr_open` (key `nr-open`; 0 = default
    /// [`crate::file::NR_OPEN`]): the most a task's fd limit may be set to.
    pub nr_open: usize,
}

/// How `lseek` on a regular file synchronises (DESIGN 2.4, seed 003).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LlseekVariant {
    /// No inode lock: SEEK_SET/SEEK_END are stores, SEEK_CUR an atomic update.
    #[default]
    Lockless,
    /// The 2005 behaviour: every lseek takes the inode's lock.
    Locked,
}

impl VfsConfig {
    pub(crate) fn nr_open(&self) -> usize {
        if self.nr_open == 0 {
            crate::file::NR_OPEN
        } else {
            self.nr_open
        }
    }

    pub(crate) fn new_orphan_file(&self) -> scalevfs_orphan::OrphanFile {
        let blocks = if self.orphan_blocks == 0 {
            16
        } else {
            self.orphan_blocks
        };
        scalevfs_orphan::OrphanFile::new(self.orphan, blocks)
    }
}

impl VfsConfig {
    /// Set a variant by name (`lockref=spin`, `layout=packed`,
    /// `index=per-dir`, `walk=ref`, `stat=ref`, `readdir=locking`,
    /// `llseek=locked|lockless`, `orphan=locked|lockless|none`,
    /// `orphan-blocks=N`, `parent-refs=spares|counted`,
    /// `protected-hardlinks=0|1`, `nr-open=N`, the root
    /// memfs's `size=` and `nr_inodes=` as tmpfs spells them).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "lockref" => self.dcache.lockref = value.parse::<LockRefVariant>()?,
            "layout" => {
                self.dcache.layout = match value {
                    "separated" => DentryLayout::Separated,
                    "packed" => DentryLayout::Packed,
                    _ => return Err(format!("unknown layout {value}")),
                }
            }
            "index" => {
                self.dcache.index = match value {
                    "hash" | "global-hash" => DcacheIndex::GlobalHash,
                    "per-dir" => DcacheIndex::PerDir,
                    _ => return Err(format!("unknown index {value}")),
                }
            }
            "walk" => {
                self.walk = match value {
                    "lockfree" | "lock-free" => WalkMode::LockFree,
                    "ref" | "rwlock" => WalkMode::RefOnly,
                    _ => return Err(format!("unknown walk mode {value}")),
                }
            }
            "stat" => self.stat_takes_ref = value == "ref",
            "readdir" => self.readdir_locking = value == "locking",
            "llseek" => {
                self.llseek = match value {
                    "lockless" | "light" => LlseekVariant::Lockless,
                    "locked" | "locked-llseek" => LlseekVariant::Locked,
                    _ => return Err(format!("unknown llseek variant {value} (lockless, locked)")),
                }
            }
            "orphan" => self.orphan = value.parse()?,
            "orphan-blocks" => self.orphan_blocks = value.parse().map_err(|e| format!("{e}"))?,
            "max-entries" => self.dcache.max_entries = value.parse().map_err(|e| format!("{e}"))?,
            "parent-refs" => {
                self.dcache.parent_spares = match value {
                    "spares" => true,
                    "counted" => false,
                    _ => return Err(format!("unknown parent-refs {value} (spares, counted)")),
                }
            }
            "max-bytes" => self.dcache.max_bytes = value.parse().map_err(|e| format!("{e}"))?,
            "nr-open" => {
                let n: usize = value.parse().map_err(|e| format!("{e}"))?;
                if !(crate::file::NR_OPEN_MIN..=crate::file::NR_OPEN_MAX).contains(&n) {
                    return Err(format!(
                        "nr-open={n}: {}..={}",
                        crate::file::NR_OPEN_MIN,
                        crate::file::NR_OPEN_MAX
                    ));
                }
                self.nr_open = n;
            }
            "protected-hardlinks" => {
                self.protected_hardlinks_off = match value {
                    "0" => true,
                    "1" => false,
                    _ => return Err(format!("protected-hardlinks={value}: 0 or 1")),
                }
            }
            "size" => self.memfs.max_bytes = MemFsOptions::parse_size(value)?,
            "nr_inodes" | "nr-inodes" => self.memfs.max_inodes = MemFsOptions::parse_inodes(value)?,
            _ => return Err(format!("unknown option {key}")),
        }
        Ok(())
    }
}
