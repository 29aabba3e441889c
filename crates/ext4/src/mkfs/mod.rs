//! `mkfs`: make a new, empty ext4 filesystem the way e2fsprogs 1.47's
//! `mke2fs -t ext4` does (same default features, same layout rules), plus
//! `orphan_file`.
//!
//! The layout is planned first ([`plan`]), with every size and count
//! checked arithmetically, before anything is written; the writer then puts
//! down all metadata and writes the superblocks last, so an interrupted run
//! leaves no image that claims to be valid. Inode tables are never zeroed
//! by hand: a fresh image file is sparse and reads as zeros, so every group
//! is marked `ITABLE_ZEROED`; groups with no inodes in use are
//! `INODE_UNINIT` and groups holding nothing but superblock backups are
//! `BLOCK_UNINIT` (metadata_csum's `uninit_bg` semantics), which is what
//! makes a 1 GiB mkfs instant.
//!
//! `scalevfs mkfs --from DIR` (fill the image from a host directory, as
//! `mke2fs -d`) opens the new image read-write and copies the tree through
//! the VFS (`crates/cli/src/mkfs.rs`).

mod encode;

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::Path;

use crate::device::{BlockDevice, FileDevice};
use crate::error::{Error, Result};
use crate::format::features::*;

use encode::*;

/// Inode numbers mke2fs uses.
pub const ROOT_INO: u32 = 2;
pub const RESIZE_INO: u32 = 7;
pub const JOURNAL_INO: u32 = 8;
pub const LOST_FOUND_INO: u32 = 11;
/// The first non-reserved inode (`s_first_ino`).
pub const FIRST_INO: u32 = 11;

/// The largest block count this mkfs makes (32-bit block numbers keep the
/// resize inode and the journal's block map valid; 16 TiB at 4 KiB).
pub const MAX_BLOCKS: u64 = (1 << 32) - 1;

/// What to make. `Default` gives mke2fs's defaults for `size`.
#[derive(Debug, Clone, Default)]
pub struct MkfsOptions {
    /// Size of the filesystem in bytes (rounded down to whole blocks).
    pub size: u64,
    /// 1024, 2048 or 4096; `None`: 1024 below 512 MiB, else 4096 (mke2fs's
    /// "small"/"floppy" types).
    pub block_size: Option<u32>,
    /// Bytes per inode; `None`: 8192 below 3 MiB, 4096 below 512 MiB, 16384
    /// up to 4 TiB, 32768 up to 16 TiB (mke2fs.conf's usage types).
    pub inode_ratio: Option<u32>,
    /// 128..=block size, a power of two; `None`: 256. Extra inode fields
    /// (timestamps with nanoseconds, the high checksum half) need > 128.
    pub inode_size: Option<u16>,
    /// Volume label, at most 16 bytes.
    pub label: String,
    /// The filesystem UUID; `None`: random.
    pub uuid: Option<[u8; 16]>,
    /// The directory hash seed; `None`: random.
    pub hash_seed: Option<[u8; 16]>,
    /// Feature edits as mke2fs's `-O`: `name` turns one on, `^name` off.
    pub features: Vec<String>,
    /// Creation time (seconds since the epoch); `None`: now.
    pub now: Option<u32>,
}

/// What was made.
#[derive(Debug, Clone)]
pub struct Report {
    pub block_size: u32,
    pub blocks: u64,
    pub groups: u32,
    pub blocks_per_group: u32,
    pub inodes: u32,
    pub inodes_per_group: u32,
    pub free_blocks: u64,
    pub free_inodes: u32,
    pub reserved_blocks: u64,
    pub reserved_gdt_blocks: u32,
    pub journal_blocks: u32,
    pub orphan_file_blocks: u32,
    /// Groups holding a backup superblock.
    pub backup_groups: Vec<u32>,
    /// Enabled features, by mke2fs's names, in dumpe2fs's order.
    pub features: Vec<&'static str>,
    pub uuid: [u8; 16],
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::Incompatible(msg.into())
}

/// Parse a size: a number with an optional K, M, G or T suffix (powers of
/// 1024), as mke2fs reads them; a bare number is bytes (mke2fs reads a
/// bare number as 1 KiB blocks: `--size 65536` is 64 KiB here, 64 MiB
/// there).
pub fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(invalid(format!("size {s:?}: unknown suffix {c:?}"))),
            };
            (&s[..i], 1u64 << shift)
        }
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| invalid(format!("size {s:?}: not a number")))?;
    n.checked_mul(mul)
        .ok_or_else(|| invalid(format!("size {s:?}: too large")))
}

/// Parse a UUID written as 32 hex digits with optional dashes.
pub fn parse_uuid(s: &str) -> Result<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|&b| b != b'-').collect();
    if hex.len() != 32 || !hex.iter().all(u8::is_ascii_hexdigit) {
        return Err(invalid(format!("UUID {s:?}: want 32 hex digits")));
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let pair = std::str::from_utf8(&hex[2 * i..2 * i + 2]).unwrap_or("00");
        *o = u8::from_str_radix(pair, 16).unwrap_or(0);
    }
    Ok(out)
}

/// Format a UUID the usual way (8-4-4-4-12).
pub fn format_uuid(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

fn random16() -> Result<[u8; 16]> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(Error::Io)?;
    // A version-4, variant-1 UUID.
    b[6] = (b[6] & 0x0F) | 0x40;
    b[8] = (b[8] & 0x3F) | 0x80;
    Ok(b)
}

/// The features this mkfs can make and their superblock bits, in the order
/// dumpe2fs lists them (compat, incompat, ro_compat; low bit first).
const FEATURES: &[(&str, Kind, u32)] = &[
    ("has_journal", Kind::Compat, COMPAT_HAS_JOURNAL),
    ("ext_attr", Kind::Compat, COMPAT_EXT_ATTR),
    ("resize_inode", Kind::Compat, COMPAT_RESIZE_INODE),
    ("dir_index", Kind::Compat, COMPAT_DIR_INDEX),
    ("orphan_file", Kind::Compat, COMPAT_ORPHAN_FILE),
    ("filetype", Kind::Incompat, INCOMPAT_FILETYPE),
    ("extent", Kind::Incompat, INCOMPAT_EXTENTS),
    ("64bit", Kind::Incompat, INCOMPAT_64BIT),
    ("flex_bg", Kind::Incompat, INCOMPAT_FLEX_BG),
    ("inline_data", Kind::Incompat, INCOMPAT_INLINE_DATA),
    ("sparse_super", Kind::RoCompat, RO_COMPAT_SPARSE_SUPER),
    ("large_file", Kind::RoCompat, RO_COMPAT_LARGE_FILE),
    ("huge_file", Kind::RoCompat, RO_COMPAT_HUGE_FILE),
    ("dir_nlink", Kind::RoCompat, RO_COMPAT_DIR_NLINK),
    ("extra_isize", Kind::RoCompat, RO_COMPAT_EXTRA_ISIZE),
    ("metadata_csum", Kind::RoCompat, RO_COMPAT_METADATA_CSUM),
];

/// Features this mkfs makes only when asked (`-O inline_data`), as mke2fs's
/// ext4 defaults leave them out.
const OFF_BY_DEFAULT: &[&str] = &["inline_data"];

/// Features that cannot be turned off here (the writer relies on them).
const REQUIRED: &[&str] = &["filetype", "extent", "64bit", "metadata_csum"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Compat,
    Incompat,
    RoCompat,
}

/// The feature set after `-O` edits: mke2fs 1.47's ext4 defaults plus
/// orphan_file.
#[derive(Debug, Clone, Copy)]
struct Features {
    compat: u32,
    incompat: u32,
    ro_compat: u32,
    /// has_journal / orphan_file were asked for by name.
    asked_journal: bool,
    asked_orphan: bool,
}

impl Features {
    fn has(&self, name: &str) -> bool {
        FEATURES
            .iter()
            .find(|f| f.0 == name)
            .is_some_and(|&(_, k, bit)| match k {
                Kind::Compat => self.compat & bit != 0,
                Kind::Incompat => self.incompat & bit != 0,
                Kind::RoCompat => self.ro_compat & bit != 0,
            })
    }

    fn names(&self) -> Vec<&'static str> {
        FEATURES
            .iter()
            .filter(|f| self.has(f.0))
            .map(|f| f.0)
            .collect()
    }

    fn parse(edits: &[String]) -> Result<Features> {
        let mut f = Features {
            compat: 0,
            incompat: 0,
            ro_compat: 0,
            asked_journal: false,
            asked_orphan: false,
        };
        for &(name, k, bit) in FEATURES {
            if OFF_BY_DEFAULT.contains(&name) {
                continue;
            }
            match k {
                Kind::Compat => f.compat |= bit,
                Kind::Incompat => f.incompat |= bit,
                Kind::RoCompat => f.ro_compat |= bit,
            }
        }
        for edit in edits.iter().flat_map(|e| e.split(',')) {
            let edit = edit.trim();
            if edit.is_empty() {
                continue;
            }
            let (on, name) = match edit.strip_prefix('^') {
                Some(n) => (false, n),
                None => (true, edit.strip_prefix('+').unwrap_or(edit)),
            };
            let Some(&(_, k, bit)) = FEATURES.iter().find(|f| f.0 == name) else {
                return Err(invalid(format!(
                    "feature {name:?} is not supported by this mkfs (it knows: {})",
                    FEATURES.iter().map(|f| f.0).collect::<Vec<_>>().join(" ")
                )));
            };
            if !on && REQUIRED.contains(&name) {
                return Err(invalid(format!(
                    "feature {name} cannot be turned off: this mkfs always makes it"
                )));
            }
            let word = match k {
                Kind::Compat => &mut f.compat,
                Kind::Incompat => &mut f.incompat,
                Kind::RoCompat => &mut f.ro_compat,
            };
            if on && name == "has_journal" {
                f.asked_journal = true;
            }
            if on && name == "orphan_file" {
                f.asked_orphan = true;
            }
            if on {
                *word |= bit;
            } else {
                *word &= !bit;
            }
        }
        // The orphan file lives with the journal (e2fsck refuses one
        // without the other).
        if f.compat & COMPAT_HAS_JOURNAL == 0 && f.compat & COMPAT_ORPHAN_FILE != 0 {
            if f.asked_orphan {
                return Err(invalid("orphan_file needs has_journal"));
            }
            f.compat &= !COMPAT_ORPHAN_FILE;
        }
        // The resize inode's reserved blocks list their backups in one
        // indirect block (block size / 4 entries), which a backup in every
        // group overflows: mke2fs refuses the pair ("reserved online resize
        // blocks not supported on non-sparse filesystem"), and so do we.
        if f.compat & COMPAT_RESIZE_INODE != 0 && f.ro_compat & RO_COMPAT_SPARSE_SUPER == 0 {
            return Err(invalid(
                "resize_inode needs sparse_super (as mke2fs): add -O ^resize_inode",
            ));
        }
        Ok(f)
    }

    /// Drop the journal (and with it the orphan file) from a filesystem
    /// too small for one, as mke2fs does; an error where they were asked for.
    fn drop_journal(&mut self) -> Result<()> {
        if self.asked_journal || self.asked_orphan {
            return Err(invalid(
                "too small for a journal (at least 2048 blocks): drop -O has_journal/orphan_file",
            ));
        }
        self.compat &= !(COMPAT_HAS_JOURNAL | COMPAT_ORPHAN_FILE);
        Ok(())
    }
}

fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// The planned layout: every number the writer needs, all checked.
#[derive(Debug, Clone)]
pub struct Layout {
    features: Features,
    block_size: u32,
    blocks: u64,
    first_data_block: u64,
    blocks_per_group: u32,
    groups: u32,
    inodes_per_group: u32,
    itable_blocks: u32,
    inode_size: u16,
    desc_blocks: u32,
    reserved_gdt: u32,
    log_flex: u8,
    reserved_blocks: u64,
    journal_blocks: u32,
    orphan_blocks: u32,
    uuid: [u8; 16],
    hash_seed: [u8; 16],
    label: [u8; 16],
    now: u32,
}

impl Layout {
    fn bs(&self) -> u64 {
        u64::from(self.block_size)
    }

    /// The last inode number mkfs uses (lost+found's, or the orphan
    /// file's after it); those up to it are taken, the rest are free.
    fn last_used_ino(&self) -> u32 {
        if self.orphan_blocks > 0 {
            FIRST_INO + 1
        } else {
            LOST_FOUND_INO
        }
    }

    /// The inodes the new filesystem has free (the files and directories
    /// `mkfs --from` may copy into it).
    pub fn free_inodes(&self) -> u64 {
        u64::from(self.groups) * u64::from(self.inodes_per_group)
            - u64::from(self.last_used_ino().min(self.inodes_per_group))
    }

    fn has_super(&self, g: u32) -> bool {
        if g <= 1 || !self.features.has("sparse_super") {
            return true;
        }
        [3u32, 5, 7].iter().any(|&p| {
            let mut x = g;
            while x.is_multiple_of(p) {
                x /= p;
            }
            x == 1
        })
    }

    fn group_first(&self, g: u32) -> u64 {
        self.first_data_block + u64::from(g) * u64::from(self.blocks_per_group)
    }

    /// Blocks in group `g` (the last may be short).
    fn group_len(&self, g: u32) -> u64 {
        (self.blocks - self.group_first(g)).min(u64::from(self.blocks_per_group))
    }

    /// Blocks of the superblock, descriptors and reserved GDT at the
    /// start of group `g` (0 where it has no backup).
    fn super_overhead(&self, g: u32) -> u64 {
        if self.has_super(g) {
            1 + u64::from(self.desc_blocks) + u64::from(self.reserved_gdt)
        } else {
            0
        }
    }
}

/// Plan the layout for `o`, refusing impossible requests with a message.
pub fn plan(o: &MkfsOptions) -> Result<Layout> {
    let mut features = Features::parse(&o.features)?;
    const MEG: u64 = 1 << 20;
    let bs = match o.block_size {
        Some(b @ (1024 | 2048 | 4096)) => b,
        Some(b) => {
            return Err(invalid(format!(
                "block size {b}: must be 1024, 2048 or 4096"
            )))
        }
        None if o.size < 512 * MEG => 1024,
        None => 4096,
    };
    let bs64 = u64::from(bs);
    let mut blocks = o.size / bs64;
    if blocks > MAX_BLOCKS {
        return Err(invalid(format!(
            "size {} is too large for {bs}-byte blocks: at most {} bytes ({} blocks)",
            o.size,
            MAX_BLOCKS * bs64,
            MAX_BLOCKS
        )));
    }
    let inode_size = o.inode_size.unwrap_or(256);
    if !(inode_size.is_power_of_two() && inode_size >= 128 && u32::from(inode_size) <= bs) {
        return Err(invalid(format!(
            "inode size {inode_size}: must be a power of two from 128 to the block size"
        )));
    }
    if inode_size < 256 && features.has("extra_isize") {
        return Err(invalid(
            "inode size 128 leaves no room for extra inode fields: add -O ^extra_isize",
        ));
    }
    // Inline data lives in the inode body's attributes (as mke2fs checks).
    if features.has("inline_data") && (inode_size < 256 || !features.has("ext_attr")) {
        return Err(invalid(
            "inline_data needs ext_attr and inodes of at least 256 bytes",
        ));
    }
    let inode_ratio = match o.inode_ratio {
        Some(r) if (1024..=(1 << 26)).contains(&r) && r >= bs => r,
        Some(r) => {
            return Err(invalid(format!(
                "inode ratio {r}: must be between the block size and 64 MiB"
            )))
        }
        None if o.size < 3 * MEG => 8192,
        None if o.size < 512 * MEG => 4096,
        None if o.size < (4 << 40) => 16384,
        None if o.size < (16 << 40) => 32768,
        None => 65536,
    };
    if o.label.len() > 16 {
        return Err(invalid(format!(
            "label {:?} is {} bytes: at most 16",
            o.label,
            o.label.len()
        )));
    }
    let mut label = [0u8; 16];
    label[..o.label.len()].copy_from_slice(o.label.as_bytes());

    let first_data_block: u64 = if bs == 1024 { 1 } else { 0 };
    let mut bpg = bs * 8;
    let gdpb = bs / 64;
    let ipb = bs / u32::from(inode_size);
    if blocks < 2048 && features.has("has_journal") {
        features.drop_journal()?;
    }
    let journal = features.has("has_journal");
    let too_small = |why: &str| {
        invalid(format!(
            "size {} is too small for an ext4 filesystem with {bs}-byte blocks ({why})",
            o.size
        ))
    };
    // mke2fs's own floor (ext2fs_initialize and the journal's 1024 blocks).
    if blocks < 64 {
        return Err(too_small("at least 64 blocks"));
    }
    // The inode count asked for, from the size before a short last group
    // is dropped (mke2fs sets s_inodes_count once; ext2fs_initialize's
    // retry spreads it over the remaining groups).
    let want_inodes = (blocks * bs64 / u64::from(inode_ratio)).max(u64::from(FIRST_INO) + 1);
    let asked_blocks = blocks;
    // 5% kept for root; rescaled where a short last group is dropped and,
    // as in ext2fs_initialize, kept when smaller groups restart the plan.
    let mut reserved = asked_blocks * 5 / 100;
    loop {
        let groups64 = div_ceil(blocks.saturating_sub(first_data_block), u64::from(bpg));
        // Dropping a short last group can leave none at all (one group whose
        // leftover holds its metadata but not 50 blocks more): as in
        // ext2fs_initialize's retry, that is "too small", and it keeps the
        // divisions by the group count below from seeing zero.
        if groups64 == 0 {
            return Err(too_small("no block group left"));
        }
        let groups = u32::try_from(groups64).map_err(|_| too_small("group count"))?;
        let desc_blocks = div_ceil(groups64, u64::from(gdpb)) as u32;
        // Inodes: the ratio, spread over the groups, rounded to fill whole
        // inode-table blocks and to a multiple of 8.
        let mut ipg = div_ceil(want_inodes, groups64);
        // More inodes per group than a bitmap block holds: smaller groups,
        // as ext2fs_initialize retries (from the size asked for).
        if ipg > bs64 * 8 && bpg >= 256 {
            bpg -= 8;
            blocks = asked_blocks;
            continue;
        }
        ipg = ipg.min(bs64 * 8);
        let max_ipg = u64::from(bpg).min(65536 - u64::from(ipb));
        ipg = ipg.clamp(16, max_ipg);
        let mut itb = div_ceil(ipg * u64::from(inode_size), bs64);
        ipg = (itb * bs64 / u64::from(inode_size)) & !7;
        itb = div_ceil(ipg * u64::from(inode_size), bs64);
        while ipg * groups64 > u64::from(u32::MAX) {
            ipg -= 8;
            itb = div_ceil(ipg * u64::from(inode_size), bs64);
        }
        let reserved_gdt = if features.has("resize_inode") {
            let max_blocks = if blocks < u64::from(u32::MAX) / 1024 {
                blocks * 1024
            } else {
                u64::from(u32::MAX)
            };
            let rsv_groups = div_ceil(max_blocks - first_data_block, u64::from(bpg));
            let rsv = div_ceil(rsv_groups, u64::from(gdpb)).saturating_sub(u64::from(desc_blocks));
            rsv.min(u64::from(bs / 4)) as u32
        } else {
            0
        };
        if u64::from(desc_blocks) + u64::from(reserved_gdt) > u64::from(bpg) * 3 / 4 {
            return Err(invalid(format!(
                "{groups} groups need {desc_blocks} descriptor blocks: that needs meta_bg, \
                 which this mkfs does not make; use a larger block size"
            )));
        }
        let overhead = 3 + itb + u64::from(desc_blocks) + u64::from(reserved_gdt);
        if overhead > u64::from(bpg) {
            return Err(invalid(
                "too many inodes for one block group; raise the inode ratio",
            ));
        }
        // A short last group must hold its own metadata plus a little.
        let mut l = Layout {
            features,
            block_size: bs,
            blocks,
            first_data_block,
            blocks_per_group: bpg,
            groups,
            inodes_per_group: ipg as u32,
            itable_blocks: itb as u32,
            inode_size,
            desc_blocks,
            reserved_gdt,
            log_flex: if features.has("flex_bg") { 4 } else { 0 },
            reserved_blocks: reserved,
            journal_blocks: 0,
            orphan_blocks: 0,
            uuid: [0; 16],
            hash_seed: [0; 16],
            label,
            now: 0,
        };
        let last_overhead = 2 + itb + l.super_overhead(groups - 1);
        let rem = (blocks - first_data_block) % u64::from(bpg);
        if groups == 1 && rem != 0 && rem < last_overhead {
            return Err(too_small("the metadata of one block group does not fit"));
        }
        if rem != 0 && rem < last_overhead + 50 {
            // With one group, dropping its short tail leaves no group:
            // say so here rather than planning an empty filesystem.
            if groups == 1 {
                return Err(too_small(
                    "one block group's metadata leaves fewer than 50 blocks",
                ));
            }
            blocks -= rem;
            reserved = reserved_blocks(asked_blocks, blocks);
            continue;
        }
        // The journal: mke2fs's default size for the block count.
        if journal {
            l.journal_blocks = match blocks {
                b if b < 2048 => return Err(too_small("no room for a journal")),
                b if b < 32768 => 1024,
                b if b < 256 * 1024 => 4096,
                b if b < 512 * 1024 => 8192,
                b if b < 4096 * 1024 => 16384,
                b if b < 8192 * 1024 => 32768,
                b if b < 16384 * 1024 => 65536,
                b if b < 32768 * 1024 => 131072,
                _ => 262144,
            };
        }
        if features.has("orphan_file") {
            l.orphan_blocks = match blocks {
                b if b < 128 * 1024 => 32,
                b if b < 2 * 1024 * 1024 => (b / 4096) as u32,
                _ => 512,
            };
        }
        // Everything must fit with room to spare: metadata of all groups,
        // the journal, the orphan file and the two directories.
        let meta: u64 = (0..groups)
            .map(|g| l.super_overhead(g) + 2 + itb)
            .sum::<u64>()
            + u64::from(l.journal_blocks)
            + u64::from(l.orphan_blocks)
            + 1
            + 16
            + 1;
        if meta + first_data_block >= blocks {
            return Err(too_small(&format!(
                "{meta} blocks of metadata and journal in {blocks} blocks"
            )));
        }
        l.uuid = match o.uuid {
            Some(u) => u,
            None => random16()?,
        };
        l.hash_seed = match o.hash_seed {
            Some(u) => u,
            None => random16()?,
        };
        l.now = o.now.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as u32)
                .unwrap_or(0)
        });
        return Ok(l);
    }
}

/// Used block ranges (start -> length), merged lazily; an allocator that
/// hands out first-fit runs.
#[derive(Debug, Default)]
struct Used {
    map: BTreeMap<u64, u64>,
}

impl Used {
    fn mark(&mut self, start: u64, len: u64) {
        if len > 0 {
            self.map.insert(start, len);
        }
    }

    /// The first used range that ends after `b`, if any, as (start, end).
    fn next_used(&self, b: u64) -> Option<(u64, u64)> {
        if let Some((&s, &l)) = self.map.range(..=b).next_back() {
            if s + l > b {
                return Some((s, s + l));
            }
        }
        self.map.range(b + 1..).next().map(|(&s, &l)| (s, s + l))
    }

    /// First free run of `len` blocks at or after `goal`, below `limit`.
    fn alloc_run(&mut self, goal: u64, len: u64, limit: u64) -> Option<u64> {
        let mut b = goal;
        loop {
            if b + len > limit {
                return None;
            }
            match self.next_used(b) {
                Some((s, e)) if s < b + len => b = e.max(b + 1),
                _ => {
                    self.mark(b, len);
                    return Some(b);
                }
            }
        }
    }

    /// `len` blocks from `goal` on, in as few runs as they come (wrapping
    /// to `first` once): the runs as (start, len).
    fn alloc_scattered(&mut self, goal: u64, len: u64, first: u64, limit: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut need = len;
        let mut b = goal;
        let mut wrapped = false;
        while need > 0 {
            if b >= limit {
                if wrapped {
                    break;
                }
                wrapped = true;
                b = first;
            }
            match self.next_used(b) {
                Some((s, e)) if s <= b => b = e,
                next => {
                    let end = next.map_or(limit, |(s, _)| s).min(limit);
                    let take = (end - b).min(need);
                    out.push((b, take));
                    need -= take;
                    b += take;
                }
            }
        }
        for &(s, l) in &out {
            self.mark(s, l);
        }
        out
    }

    /// Count of used blocks in [start, end).
    fn count_in(&self, start: u64, end: u64) -> u64 {
        let mut n = 0;
        let mut b = start;
        while let Some((s, e)) = self.next_used(b) {
            if s >= end {
                break;
            }
            n += e.min(end) - s.max(b);
            b = e;
            if b >= end {
                break;
            }
        }
        n
    }

    /// Set the bits of used blocks in [start, end) into `bitmap` (bit 0 =
    /// `start`).
    fn fill_bitmap(&self, start: u64, end: u64, bitmap: &mut [u8]) {
        let mut b = start;
        while let Some((s, e)) = self.next_used(b) {
            if s >= end {
                break;
            }
            for x in s.max(b)..e.min(end) {
                let i = (x - start) as usize;
                bitmap[i / 8] |= 1 << (i % 8);
            }
            b = e;
            if b >= end {
                break;
            }
        }
    }
}

/// Per-group numbers the writer fills in.
#[derive(Debug, Clone, Default)]
struct Group {
    block_bitmap: u64,
    inode_bitmap: u64,
    inode_table: u64,
    free_blocks: u32,
    free_inodes: u32,
    used_dirs: u32,
    flags: u16,
    itable_unused: u32,
    block_bitmap_csum: u32,
    inode_bitmap_csum: u32,
}

/// 5% of the blocks kept for root, as mke2fs: of the size asked for, and
/// where a short last group was dropped, that count scaled to the blocks
/// left by ext2fs_initialize's ratio in doubles (so 262278 blocks cut to
/// 262144 keep 13106, not 13107).
fn reserved_blocks(asked: u64, blocks: u64) -> u64 {
    let first = asked * 5 / 100;
    if blocks == asked || asked == 0 {
        return first;
    }
    let ratio = 100.0 * first as f64 / asked as f64;
    (ratio * blocks as f64 / 100.0) as u64
}

/// Make a filesystem in the regular file `path`, creating it or cutting it
/// to the size (its old contents are discarded first, so the image reads as
/// zeros and no inode table needs writing). On error the file is left empty.
/// A block device `path` is written in place instead ([`make_on_blockdev`]).
pub fn make(path: &Path, o: &MkfsOptions) -> Result<Report> {
    let layout = plan(o)?;
    let meta = std::fs::metadata(path);
    if let Ok(m) = &meta {
        use std::os::unix::fs::FileTypeExt;
        if m.file_type().is_block_device() {
            return make_on_blockdev(path, o);
        }
        if !m.is_file() {
            return Err(invalid(format!(
                "{}: neither a regular file nor a block device",
                path.display()
            )));
        }
    }
    // Not truncated at open: an image another scalevfs has open
    // read-write (and maybe mapped, where a truncation is SIGBUS) is
    // refused by its lock first.
    #[allow(clippy::suspicious_open_options)] // truncated below, once locked
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .open(path)
        .map_err(Error::Io)?;
    let size = layout.blocks * layout.bs();
    // Refused before anything is changed (nor cleaned up below).
    crate::device::lock_exclusive(&file).map_err(Error::Io)?;
    let result = file
        .set_len(0)
        .and_then(|()| file.set_len(size))
        .and_then(|()| FileDevice::from_file(file))
        .map_err(Error::Io)
        .and_then(|dev| write(&dev, &layout, true));
    if result.is_err() {
        // Leave nothing that looks like a filesystem.
        if let Ok(f) = OpenOptions::new().write(true).open(path) {
            let _ = f.set_len(0);
        }
    }
    result
}

/// Make a filesystem on the block device `path` (SIZE at most the
/// device's), as mke2fs does: opened `O_EXCL`, so a mounted device is
/// refused (EBUSY); its old contents are not known to be zero, so group
/// 0's inode table is zeroed and the others are left to the kernel's lazy
/// init. The primary superblock area is zeroed first and again on failure,
/// so a half-made filesystem (or the old one) is not left looking valid.
pub fn make_on_blockdev(path: &Path, o: &MkfsOptions) -> Result<Report> {
    use std::os::unix::fs::OpenOptionsExt;
    let layout = plan(o)?;
    // Held open for the whole run: the O_EXCL claim on the device.
    let _claim = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_EXCL)
        .open(path)
        .map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    let dev = FileDevice::open(path, true).map_err(Error::Io)?;
    let need = layout.blocks * layout.bs();
    if dev.size() < need {
        return Err(invalid(format!(
            "{}: the device has {} bytes, --size asks for {need}",
            path.display(),
            dev.size()
        )));
    }
    // Bytes 1024..2048 hold the ext4 superblock at every block size.
    let wipe = |d: &FileDevice| d.write_at(1024, &[0u8; 1024]).and_then(|()| d.flush());
    wipe(&dev).map_err(Error::Io)?;
    let result = write(&dev, &layout, false);
    if result.is_err() {
        let _ = wipe(&dev);
    }
    result
}

/// Make a filesystem on `dev` (which must be at least the planned size).
/// `zeroed`: the device reads as zeros (inode tables are then marked
/// zeroed; otherwise the kernel zeroes them lazily after mount).
pub fn make_on(dev: &dyn BlockDevice, o: &MkfsOptions, zeroed: bool) -> Result<Report> {
    let layout = plan(o)?;
    if dev.size() < layout.blocks * layout.bs() {
        return Err(invalid(format!(
            "device has {} bytes, the filesystem needs {}",
            dev.size(),
            layout.blocks * layout.bs()
        )));
    }
    write(dev, &layout, zeroed)
}

fn write(dev: &dyn BlockDevice, l: &Layout, zeroed: bool) -> Result<Report> {
    let bs = l.bs();
    let ngroups = l.groups as usize;
    let mut used = Used::default();
    // Superblocks, descriptors and reserved GDT blocks of every group.
    for g in 0..l.groups {
        used.mark(l.group_first(g), l.super_overhead(g));
    }
    if l.first_data_block == 1 {
        used.mark(0, 1);
    }
    // Bitmaps and inode tables, packed at the start of each flex group.
    let flex = 1u32 << l.log_flex;
    let mut groups = vec![Group::default(); ngroups];
    let mut f0 = 0u32;
    while f0 < l.groups {
        let n = flex.min(l.groups - f0);
        let start = l.group_first(f0);
        let mut cur = start;
        for g in f0..f0 + n {
            let b = used
                .alloc_run(cur, 1, l.blocks)
                .ok_or_else(|| invalid("no room for the block bitmaps"))?;
            groups[g as usize].block_bitmap = b;
            cur = b + 1;
        }
        for g in f0..f0 + n {
            let b = used
                .alloc_run(cur, 1, l.blocks)
                .ok_or_else(|| invalid("no room for the inode bitmaps"))?;
            groups[g as usize].inode_bitmap = b;
            cur = b + 1;
        }
        for g in f0..f0 + n {
            let b = used
                .alloc_run(cur, u64::from(l.itable_blocks), l.blocks)
                .ok_or_else(|| invalid("no room for the inode tables"))?;
            groups[g as usize].inode_table = b;
            cur = b + u64::from(l.itable_blocks);
        }
        f0 += n;
    }
    let data_start = l.first_data_block;
    let alloc = |used: &mut Used, n: u64, what: &str| -> Result<Vec<(u64, u64)>> {
        let runs = used.alloc_scattered(data_start, n, data_start, l.blocks);
        if runs.iter().map(|r| r.1).sum::<u64>() != n {
            return Err(invalid(format!("no room for {what}")));
        }
        Ok(runs)
    };
    let root_runs = alloc(&mut used, 1, "the root directory")?;
    // lost+found: mke2fs grows it to 16 KiB (at least 2 blocks, at most 12).
    let lpf_blocks = (16384 / bs).clamp(2, 12);
    let lpf_blocks = if bs == 1024 { 12 } else { lpf_blocks };
    let lpf_runs = alloc(&mut used, lpf_blocks, "lost+found")?;
    let dind = if l.features.has("resize_inode") {
        Some(alloc(&mut used, 1, "the resize inode")?[0].0)
    } else {
        None
    };
    // Journal: near the middle of the filesystem, as mke2fs places it.
    let mut journal_runs = Vec::new();
    if l.journal_blocks > 0 {
        let goal = midpoint_group_start(l, &used);
        journal_runs =
            used.alloc_scattered(goal, u64::from(l.journal_blocks), data_start, l.blocks);
        if journal_runs.iter().map(|r| r.1).sum::<u64>() != u64::from(l.journal_blocks) {
            return Err(invalid("no room for the journal"));
        }
    }
    let mut orphan_runs = Vec::new();
    if l.orphan_blocks > 0 {
        orphan_runs = alloc(&mut used, u64::from(l.orphan_blocks), "the orphan file")?;
    }
    // Extent trees with more than 4 extents need a leaf block.
    let journal_tree = ExtentTree::plan(&journal_runs, bs);
    let orphan_tree = ExtentTree::plan(&orphan_runs, bs);
    if !journal_tree.fits() || !orphan_tree.fits() {
        return Err(invalid(
            "the journal or orphan file is too fragmented for one extent leaf",
        ));
    }
    let journal_leaf = if journal_tree.needs_leaf() {
        // mke2fs puts it just before the journal when that block is free.
        let before = journal_runs[0].0 - 1;
        if before >= data_start && used.next_used(before).is_none_or(|(s, _)| s > before) {
            used.mark(before, 1);
            Some(before)
        } else {
            Some(alloc(&mut used, 1, "the journal's extent block")?[0].0)
        }
    } else {
        None
    };
    let orphan_leaf = if orphan_tree.needs_leaf() {
        Some(alloc(&mut used, 1, "the orphan file's extent block")?[0].0)
    } else {
        None
    };

    let seed = crate::format::checksum::crc32c(!0, &l.uuid);
    let enc = Enc { l, seed };
    let ino_size = usize::from(l.inode_size);

    // Inodes of group 0 (all special inodes live there).
    let orphan_ino = (l.orphan_blocks > 0).then_some(FIRST_INO + 1);
    let last_used_ino = l.last_used_ino();
    if last_used_ino > l.inodes_per_group {
        return Err(invalid("too few inodes per group for the special inodes"));
    }
    let mut itable0 = vec![0u8; last_used_ino as usize * ino_size];
    {
        let mut put = |ino: u32, raw: Vec<u8>| {
            let off = (ino as usize - 1) * ino_size;
            itable0[off..off + ino_size].copy_from_slice(&raw);
        };
        for ino in 1..FIRST_INO {
            let mut i = InodeBuf::new(l, false);
            if ino == 1 {
                i.times(l.now, false);
            }
            put(ino, enc.finish_inode(ino, i));
        }
        // Root.
        let mut root = InodeBuf::new(l, true);
        root.times(l.now, true);
        root.mode(0o040755);
        root.links(3);
        root.size(bs);
        root.extents(&ExtentTree::plan(&root_runs, bs), None);
        put(ROOT_INO, enc.finish_inode(ROOT_INO, root));
        // lost+found.
        let mut lpf = InodeBuf::new(l, true);
        lpf.times(l.now, true);
        lpf.mode(0o040700);
        lpf.links(2);
        lpf.size(lpf_blocks * bs);
        lpf.extents(&ExtentTree::plan(&lpf_runs, bs), None);
        put(LOST_FOUND_INO, enc.finish_inode(LOST_FOUND_INO, lpf));
        // Resize inode.
        if let Some(dind) = dind {
            let nbackups = (1..l.groups).filter(|&g| l.has_super(g)).count() as u64;
            let blocks = 1 + u64::from(l.reserved_gdt) * (1 + nbackups);
            let apb = bs / 4;
            let mut r = InodeBuf::new(l, true);
            r.times(l.now, true);
            r.mode(0o100600);
            r.links(1);
            r.size((apb * apb + apb + 12) * bs);
            r.sectors(blocks * bs / 512);
            r.block_ptr(13, dind as u32);
            put(RESIZE_INO, enc.finish_inode(RESIZE_INO, r));
        }
        if l.journal_blocks > 0 {
            let mut j = InodeBuf::new(l, true);
            j.times(l.now, true);
            j.mode(0o100600);
            j.links(1);
            j.size(u64::from(l.journal_blocks) * bs);
            j.extents(&journal_tree, journal_leaf);
            put(JOURNAL_INO, enc.finish_inode(JOURNAL_INO, j));
        }
        if let Some(ino) = orphan_ino {
            let mut o = InodeBuf::new(l, true);
            o.times(l.now, true);
            o.mode(0o100600);
            o.links(1);
            o.size(u64::from(l.orphan_blocks) * bs);
            o.extents(&orphan_tree, orphan_leaf);
            put(ino, enc.finish_inode(ino, o));
        }
    }

    // Data blocks: directories, resize inode map, journal superblock,
    // orphan blocks, extent leaves.
    let io = |off: u64, buf: &[u8]| dev.write_at(off, buf).map_err(Error::Io);
    io(
        root_runs[0].0 * bs,
        &enc.dir_block(ROOT_INO, Some(ROOT_INO), true),
    )?;
    let mut lpf_blocks_list = runs_blocks(&lpf_runs);
    let first = lpf_blocks_list.remove(0);
    io(
        first * bs,
        &enc.dir_block(LOST_FOUND_INO, Some(ROOT_INO), false),
    )?;
    for b in lpf_blocks_list {
        io(b * bs, &enc.dir_block(LOST_FOUND_INO, None, false))?;
    }
    if let Some(dind) = dind {
        let apb = (bs / 4) as usize;
        let mut dbuf = vec![0u8; bs as usize];
        let pblk0 = l.first_data_block + 1 + u64::from(l.desc_blocks);
        for i in 0..u64::from(l.reserved_gdt) {
            let pblk = pblk0 + i;
            let slot = ((u64::from(l.desc_blocks) + i) as usize) % apb;
            dbuf[slot * 4..slot * 4 + 4].copy_from_slice(&(pblk as u32).to_le_bytes());
            let mut ind = vec![0u8; bs as usize];
            let mut k = 0;
            for g in 1..l.groups {
                if !l.has_super(g) {
                    continue;
                }
                if k >= apb {
                    break;
                }
                let b = pblk + u64::from(g) * u64::from(l.blocks_per_group);
                ind[k * 4..k * 4 + 4].copy_from_slice(&(b as u32).to_le_bytes());
                k += 1;
            }
            io(pblk * bs, &ind)?;
        }
        io(dind * bs, &dbuf)?;
    }
    if let Some(&(jstart, _)) = journal_runs.first() {
        io(jstart * bs, &enc.journal_superblock())?;
    }
    if !zeroed {
        // The log itself, as mke2fs zeroes it (without lazy_journal_init):
        // an old filesystem's log with the same UUID, left in place, could
        // hold a transaction 2 whose checksums (seeded with the UUID and
        // the sequence) pass after the new log's transaction 1, and a
        // replay after a crash would write the old metadata over the new.
        let zero = vec![0u8; 1 << 20];
        for (i, &(start, n)) in journal_runs.iter().enumerate() {
            // The first run's first block is the journal superblock.
            let (mut b, end) = (start + u64::from(i == 0), start + n);
            while b < end {
                let k = (end - b).min(zero.len() as u64 / bs);
                io(b * bs, &zero[..(k * bs) as usize])?;
                b += k;
            }
        }
    }
    if let Some(ino) = orphan_ino {
        for b in runs_blocks(&orphan_runs) {
            io(b * bs, &enc.orphan_block(ino, b))?;
        }
    }
    if let Some(leaf) = journal_leaf {
        io(leaf * bs, &journal_tree.leaf_block(&enc, JOURNAL_INO, bs))?;
    }
    if let Some(leaf) = orphan_leaf {
        if let Some(ino) = orphan_ino {
            io(leaf * bs, &orphan_tree.leaf_block(&enc, ino, bs))?;
        }
    }
    if !zeroed {
        // Group 0's inode table beyond the written inodes.
        let itb = u64::from(l.itable_blocks) * bs;
        let zero = vec![0u8; bs as usize];
        let mut off = itable0.len() as u64;
        while off < itb {
            let n = (itb - off).min(bs);
            io(groups[0].inode_table * bs + off, &zero[..n as usize])?;
            off += n;
        }
    }
    io(groups[0].inode_table * bs, &itable0)?;

    // Bitmaps and descriptors.
    let ipg = l.inodes_per_group;
    let mut free_blocks_total = 0u64;
    let mut free_inodes_total = 0u64;
    for g in 0..l.groups {
        let gi = g as usize;
        let start = l.group_first(g);
        let len = l.group_len(g);
        let nused = used.count_in(start, start + len);
        let gr = &mut groups[gi];
        gr.free_blocks = (len - nused) as u32;
        let inodes_used = if g == 0 { last_used_ino } else { 0 };
        gr.free_inodes = ipg - inodes_used;
        gr.used_dirs = if g == 0 { 2 } else { 0 };
        gr.itable_unused = ipg - inodes_used;
        let mut flags = 0u16;
        if zeroed {
            flags |= crate::format::group_desc::BG_INODE_ZEROED;
        }
        if inodes_used == 0 {
            flags |= crate::format::group_desc::BG_INODE_UNINIT;
        }
        if g + 1 < l.groups && nused == l.super_overhead(g) {
            flags |= crate::format::group_desc::BG_BLOCK_UNINIT;
        }
        gr.flags = flags;
        free_blocks_total += u64::from(gr.free_blocks);
        free_inodes_total += u64::from(gr.free_inodes);
        if flags & crate::format::group_desc::BG_BLOCK_UNINIT == 0 {
            let mut bm = vec![0u8; bs as usize];
            used.fill_bitmap(start, start + len, &mut bm);
            // Padding past the end of a short last group.
            for i in len as usize..(bs as usize * 8) {
                bm[i / 8] |= 1 << (i % 8);
            }
            // The kernel sums blocks-per-group bits (less than the block
            // where groups were shrunk for the inode count).
            gr.block_bitmap_csum =
                crate::format::checksum::crc32c(seed, &bm[..(l.blocks_per_group / 8) as usize]);
            io(gr.block_bitmap * bs, &bm)?;
        }
        if flags & crate::format::group_desc::BG_INODE_UNINIT == 0 {
            let mut im = vec![0u8; bs as usize];
            for i in 0..inodes_used as usize {
                im[i / 8] |= 1 << (i % 8);
            }
            for i in ipg as usize..(bs as usize * 8) {
                im[i / 8] |= 1 << (i % 8);
            }
            gr.inode_bitmap_csum = crate::format::checksum::crc32c(seed, &im[..(ipg / 8) as usize]);
            io(gr.inode_bitmap * bs, &im)?;
        }
    }
    let mut gdt = vec![0u8; l.desc_blocks as usize * bs as usize];
    for (g, gr) in groups.iter().enumerate() {
        enc.group_desc(g as u32, gr, &mut gdt[g * 64..g * 64 + 64]);
    }
    for g in 0..l.groups {
        if l.has_super(g) {
            io((l.group_first(g) + 1) * bs, &gdt)?;
        }
    }
    dev.flush().map_err(Error::Io)?;

    // Superblocks last: backups first, the primary at the very end.
    let journal_iblock = {
        let mut j = InodeBuf::new(l, true);
        j.extents(&journal_tree, journal_leaf);
        j.iblock()
    };
    let sbi = SuperInfo {
        free_blocks: free_blocks_total,
        free_inodes: free_inodes_total as u32,
        journal_iblock,
        orphan_ino: orphan_ino.unwrap_or(0),
    };
    for g in 1..l.groups {
        if l.has_super(g) {
            io(l.group_first(g) * bs, &enc.superblock(&sbi, g))?;
        }
    }
    dev.flush().map_err(Error::Io)?;
    io(1024, &enc.superblock(&sbi, 0))?;
    dev.flush().map_err(Error::Io)?;

    Ok(Report {
        block_size: l.block_size,
        blocks: l.blocks,
        groups: l.groups,
        blocks_per_group: l.blocks_per_group,
        inodes: ipg * l.groups,
        inodes_per_group: ipg,
        free_blocks: free_blocks_total,
        free_inodes: free_inodes_total as u32,
        reserved_blocks: l.reserved_blocks,
        reserved_gdt_blocks: l.reserved_gdt,
        journal_blocks: l.journal_blocks,
        orphan_file_blocks: l.orphan_blocks,
        backup_groups: (1..l.groups).filter(|&g| l.has_super(g)).collect(),
        features: l.features.names(),
        uuid: l.uuid,
    })
}

fn runs_blocks(runs: &[(u64, u64)]) -> Vec<u64> {
    runs.iter().flat_map(|&(s, n)| s..s + n).collect()
}

/// mke2fs's journal goal: the first block of the group with the most free
/// blocks around the middle of the filesystem (flex-aligned when there are
/// more groups than one flex group holds).
fn midpoint_group_start(l: &Layout, used: &Used) -> u64 {
    let free = |g: u32| {
        let s = l.group_first(g);
        l.group_len(g) - used.count_in(s, s + l.group_len(g))
    };
    let mid = (l.blocks - l.first_data_block) / 2;
    let mut group = (mid.saturating_sub(l.first_data_block) / u64::from(l.blocks_per_group)) as u32;
    group = group.min(l.groups - 1);
    let log_flex = 1u32 << l.log_flex;
    let start;
    if l.log_flex > 0 && group > log_flex {
        group &= !(log_flex - 1);
        while group < l.groups && free(group) == 0 {
            group += 1;
        }
        if group == l.groups {
            group = 0;
        }
        start = group;
    } else {
        start = group.saturating_sub(1);
    }
    let end = if group + 1 < l.groups {
        group + 1
    } else {
        group
    };
    let mut best = start;
    for g in start + 1..=end {
        if free(g) > free(best) {
            best = g;
        }
    }
    l.group_first(best)
}
