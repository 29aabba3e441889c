//! Feature flags of the superblock and what this build does with them.

use crate::error::{Error, Result};

// s_feature_compat
pub const COMPAT_DIR_PREALLOC: u32 = 0x1;
pub const COMPAT_IMAGIC_INODES: u32 = 0x2;
pub const COMPAT_HAS_JOURNAL: u32 = 0x4;
pub const COMPAT_EXT_ATTR: u32 = 0x8;
pub const COMPAT_RESIZE_INODE: u32 = 0x10;
pub const COMPAT_DIR_INDEX: u32 = 0x20;
pub const COMPAT_SPARSE_SUPER2: u32 = 0x200;
pub const COMPAT_FAST_COMMIT: u32 = 0x400;
pub const COMPAT_STABLE_INODES: u32 = 0x800;
pub const COMPAT_ORPHAN_FILE: u32 = 0x1000;

// s_feature_ro_compat
pub const RO_COMPAT_SPARSE_SUPER: u32 = 0x1;
pub const RO_COMPAT_LARGE_FILE: u32 = 0x2;
pub const RO_COMPAT_HUGE_FILE: u32 = 0x8;
pub const RO_COMPAT_GDT_CSUM: u32 = 0x10;
pub const RO_COMPAT_DIR_NLINK: u32 = 0x20;
pub const RO_COMPAT_EXTRA_ISIZE: u32 = 0x40;
pub const RO_COMPAT_QUOTA: u32 = 0x100;
pub const RO_COMPAT_BIGALLOC: u32 = 0x200;
pub const RO_COMPAT_METADATA_CSUM: u32 = 0x400;
pub const RO_COMPAT_READONLY: u32 = 0x1000;
pub const RO_COMPAT_PROJECT: u32 = 0x2000;
pub const RO_COMPAT_VERITY: u32 = 0x8000;
pub const RO_COMPAT_ORPHAN_PRESENT: u32 = 0x10000;

// s_feature_incompat
pub const INCOMPAT_COMPRESSION: u32 = 0x1;
pub const INCOMPAT_FILETYPE: u32 = 0x2;
pub const INCOMPAT_RECOVER: u32 = 0x4;
pub const INCOMPAT_JOURNAL_DEV: u32 = 0x8;
pub const INCOMPAT_META_BG: u32 = 0x10;
pub const INCOMPAT_EXTENTS: u32 = 0x40;
pub const INCOMPAT_64BIT: u32 = 0x80;
pub const INCOMPAT_MMP: u32 = 0x100;
pub const INCOMPAT_FLEX_BG: u32 = 0x200;
pub const INCOMPAT_EA_INODE: u32 = 0x400;
pub const INCOMPAT_DIRDATA: u32 = 0x1000;
pub const INCOMPAT_CSUM_SEED: u32 = 0x2000;
pub const INCOMPAT_LARGEDIR: u32 = 0x4000;
pub const INCOMPAT_INLINE_DATA: u32 = 0x8000;
pub const INCOMPAT_ENCRYPT: u32 = 0x10000;
pub const INCOMPAT_CASEFOLD: u32 = 0x20000;

/// INCOMPAT features the reader handles. (MMP matters to writers; a
/// read-write open refuses it, and inline_data, in `fs.rs`.)
pub const INCOMPAT_SUPPORTED: u32 = INCOMPAT_INLINE_DATA
    | INCOMPAT_FILETYPE
    | INCOMPAT_META_BG
    | INCOMPAT_EXTENTS
    | INCOMPAT_64BIT
    | INCOMPAT_MMP
    | INCOMPAT_FLEX_BG
    | INCOMPAT_EA_INODE
    | INCOMPAT_CSUM_SEED
    | INCOMPAT_LARGEDIR;

const INCOMPAT_NAMES: &[(u32, &str)] = &[
    (INCOMPAT_COMPRESSION, "compression"),
    (INCOMPAT_FILETYPE, "filetype"),
    (INCOMPAT_RECOVER, "needs_recovery"),
    (INCOMPAT_JOURNAL_DEV, "journal_dev"),
    (INCOMPAT_META_BG, "meta_bg"),
    (INCOMPAT_EXTENTS, "extent"),
    (INCOMPAT_64BIT, "64bit"),
    (INCOMPAT_MMP, "mmp"),
    (INCOMPAT_FLEX_BG, "flex_bg"),
    (INCOMPAT_EA_INODE, "ea_inode"),
    (INCOMPAT_DIRDATA, "dirdata"),
    (INCOMPAT_CSUM_SEED, "metadata_csum_seed"),
    (INCOMPAT_LARGEDIR, "large_dir"),
    (INCOMPAT_INLINE_DATA, "inline_data"),
    (INCOMPAT_ENCRYPT, "encrypt"),
    (INCOMPAT_CASEFOLD, "casefold"),
];

/// The name mke2fs gives an INCOMPAT bit ("FEATURE_I17" for unknown ones).
pub fn incompat_name(bit: u32) -> String {
    INCOMPAT_NAMES
        .iter()
        .find(|(b, _)| *b == bit)
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| format!("FEATURE_I{}", bit.trailing_zeros()))
}

/// Refuse an image whose INCOMPAT features this reader cannot honour. A
/// journal that needs recovery gets its own message.
pub fn check_incompat(incompat: u32) -> Result<()> {
    if incompat & INCOMPAT_RECOVER != 0 {
        return Err(Error::Incompatible(
            "the journal needs recovery (needs_recovery): open it with \
             Ext4Options::replay = Replay::InMemory (read-only view) or Replay::OnDevice, \
             or replay it with e2fsck -fy IMAGE"
                .into(),
        ));
    }
    let bad = incompat & !INCOMPAT_SUPPORTED;
    if bad != 0 {
        let names: Vec<String> = (0..32)
            .map(|i| 1u32 << i)
            .filter(|b| bad & b != 0)
            .map(incompat_name)
            .collect();
        return Err(Error::Incompatible(format!(
            "incompatible feature(s) not supported: {}",
            names.join(", ")
        )));
    }
    Ok(())
}
