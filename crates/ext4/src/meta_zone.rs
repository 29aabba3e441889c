//! The blocks that hold filesystem metadata, where no xattr block (or
//! other block a file names) may lie: `xattr_write.rs` builds the zone
//! once per mount (`Ext4::meta_zone`) and checks `i_file_acl` against it.
//! A module of its own, below `fs` and `xattr_write`, which both name it.

/// The blocks that hold filesystem metadata (the kernel's system zone,
/// `block_validity.c`): block 0 up to the first data block, each group's
/// superblock and descriptor copies with the reserved descriptor blocks,
/// its bitmaps and inode table, the resize inode's double indirect block,
/// and the internal journal's blocks. Sorted,
/// disjoint, merged `[start, end)` ranges; built once per mount
/// (`Ext4::meta_zone`), from the descriptors (fixed while mounted) and the
/// journal inode. At most a few ranges per group.
#[derive(Debug, Default)]
pub(crate) struct MetaZone {
    ranges: Vec<(u64, u64)>,
}

impl MetaZone {
    pub(crate) fn new(mut v: Vec<(u64, u64)>) -> MetaZone {
        v.retain(|r| r.0 < r.1);
        v.sort_unstable();
        let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (s, e) in v {
            match ranges.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => ranges.push((s, e)),
            }
        }
        MetaZone { ranges }
    }

    /// Whether `blk` is a metadata block.
    pub(crate) fn contains(&self, blk: u64) -> bool {
        self.overlaps(blk, blk.saturating_add(1))
    }

    /// Whether any block of `[start, end)` is a metadata block.
    pub(crate) fn overlaps(&self, start: u64, end: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.1 <= start);
        self.ranges.get(i).is_some_and(|r| r.0 < end)
    }
}

#[cfg(test)]
mod tests {
    use super::MetaZone;

    #[test]
    fn meta_zone_merges_and_finds() {
        let z = MetaZone::new(vec![(10, 12), (0, 2), (11, 20), (30, 31), (5, 5), (20, 22)]);
        assert_eq!(z.ranges, [(0, 2), (10, 22), (30, 31)]);
        for b in [0, 1, 10, 15, 21, 30] {
            assert!(z.contains(b), "{b}");
        }
        for b in [2, 5, 9, 22, 29, 31, u64::MAX] {
            assert!(!z.contains(b), "{b}");
        }
        assert!(!MetaZone::default().contains(0));
        // Ranges: a start inside, an end inside, one around, none.
        for (a, b, want) in [
            (0, 1, true),
            (2, 10, false),
            (2, 11, true),
            (21, 30, true),
            (22, 30, false),
            (5, 40, true),
            (31, u64::MAX, false),
        ] {
            assert_eq!(z.overlaps(a, b), want, "[{a}, {b})");
        }
    }
}
