//! A file preallocated (unwritten) and then written one block in two, in
//! a random order, so that every write splits an unwritten extent in the
//! middle of some leaf: about 24,000 extents, a tree that grows from the
//! inode to depth 3 with 1 KiB blocks (84 entries per node). Writes
//! before the first extent move the first key of the leftmost nodes;
//! punches and preallocations of a few blocks, and a truncate, then
//! change single leaves too.
//!
//! Leaves and index nodes split in place (`split_path`), so the tree ends
//! with nodes about two thirds full, unlike a tree rewritten from its
//! extent list, whose nodes are full: the test checks that shape (debugfs
//! counts the entries at each level), e2fsck checks every key and
//! checksum, and the file reads back as the model says through scalevfs
//! (live and after a remount) and through the kernel's ext4.

mod common;

use common::{
    debugfs_ro, fresh, fresh_with, fsck_clean, have_tools, mount, mount_fresh, unmount_clean,
    KMount, Rng, Scratch,
};
use scalevfs::{Vfs, O_CREAT, O_RDWR};
use scalevfs_ext4::Ext4;

/// Entries per level in debugfs's `ex` listing: `(levels, per level)`.
fn levels(ex: &str) -> (usize, Vec<usize>) {
    let mut count: Vec<usize> = Vec::new();
    let mut depth = 0;
    for l in ex.lines().skip(1) {
        // " 1/ 3   5/ 46 ...": this entry's level and the tree's depth.
        let Some((lv, rest)) = l.trim_start().split_once('/') else {
            continue;
        };
        let (Ok(lv), Some(Ok(d))) = (
            lv.trim().parse::<usize>(),
            rest.split_whitespace().next().map(str::parse::<usize>),
        ) else {
            continue;
        };
        depth = d;
        if count.len() <= lv {
            count.resize(lv + 1, 0);
        }
        count[lv] += 1;
    }
    (depth, count)
}

/// `name` read back as `model` says: through a read-only remount by
/// scalevfs, then through the kernel's ext4 (a loop mount, where the
/// machine allows).
fn reads_back(s: &Scratch, img: &std::path::Path, name: &str, model: &[u8]) {
    {
        let e = Ext4::open(img, Default::default()).unwrap();
        let vfs = Vfs::with_root_fs(Default::default(), e);
        let got = scalevfs::fs::Fs::new(vfs.root_task())
            .read(format!("/{name}"))
            .unwrap();
        assert!(got == model, "after remount: {name} differs");
    }
    if let Some(_k) = KMount::new(img, &s.0.join("mnt")) {
        let got = std::fs::read(s.0.join("mnt").join(name)).unwrap();
        assert!(got == model, "the kernel reads other bytes in {name}");
    }
}

/// Fisher-Yates with the test's generator.
fn shuffle(v: &mut [usize], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i as u64 + 1) as usize);
    }
}

#[test]
fn a_tree_split_in_place_to_depth_three_reads_back_everywhere() {
    let Some((s, img, e, vfs)) = mount_fresh("extsplits", "96M") else {
        return;
    };
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    let bs = 1024usize;
    // Blocks 1000..25000 unwritten; every other one written below.
    let (first, nblk) = (1000usize, 24_000usize);
    t.fallocate(fd, 0, (first * bs) as i64, (nblk * bs) as i64)
        .unwrap();
    let mut model = vec![0u8; (first + nblk) * bs];
    let mut order: Vec<usize> = (0..nblk / 2).map(|k| first + 2 * k).collect();
    let mut rng = Rng(0x05EE_D0F5_B117_u64);
    shuffle(&mut order, &mut rng);
    let put = |model: &mut Vec<u8>, blk: usize, v: u8| {
        let data = vec![v; bs];
        assert_eq!(t.pwrite(fd, &data, (blk * bs) as i64).unwrap(), bs);
        model[blk * bs..(blk + 1) * bs].copy_from_slice(&data);
    };
    for (k, &b) in order.iter().enumerate() {
        put(&mut model, b, (k % 251 + 1) as u8);
        if k == order.len() / 2 {
            let mut got = vec![0u8; model.len()];
            assert_eq!(t.pread(fd, &mut got, 0).unwrap(), model.len());
            assert!(got == model, "halfway: content differs");
        }
    }
    // Before the first extent: the leftmost keys move down, a level each.
    for b in [999, 700, 5, 0] {
        put(&mut model, b, 0xEE);
    }
    // Punches and preallocations of a few blocks inside leaves, which
    // change those leaves alone (a punch at a leaf's first block moves its
    // key up), then a truncate inside the last leaf.
    let (keep, punch) = (
        scalevfs::io::FALLOC_FL_KEEP_SIZE,
        scalevfs::io::FALLOC_FL_PUNCH_HOLE,
    );
    for _ in 0..3000 {
        let b = first + rng.below(nblk as u64) as usize;
        let n = 1 + rng.below(3) as usize;
        if rng.below(2) == 0 {
            t.fallocate(fd, punch | keep, (b * bs) as i64, (n * bs) as i64)
                .unwrap();
            model[b * bs..(b + n) * bs].fill(0);
        } else {
            t.fallocate(fd, keep, (b * bs) as i64, (n * bs) as i64)
                .unwrap();
        }
    }
    let size = model.len() - 50 * bs - 7;
    t.ftruncate(fd, size as i64).unwrap();
    model.truncate(size);
    let mut got = vec![0u8; model.len()];
    assert_eq!(t.pread(fd, &mut got, 0).unwrap(), model.len());
    assert!(got == model, "live: content differs");
    t.fsync(fd).unwrap();
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);

    let (depth, count) = levels(&debugfs_ro(&img, "ex f"));
    eprintln!("depth {depth}, entries per level {count:?}");
    assert_eq!(depth, 3, "a tree of depth 3: {count:?}");
    let (leaves, extents) = (count[depth - 1], count[depth]);
    // About 12,000 written blocks between unwritten ones (a few punched
    // or joined), and the four written before them.
    assert!(extents >= 20_000, "{extents} extents");
    // Split nodes are not full: a rewrite from the list would give
    // ceil(extents / 84) leaves.
    assert!(
        leaves * 84 > extents * 5 / 4,
        "{leaves} leaves for {extents} extents: packed, not split"
    );

    reads_back(&s, &img, "f", &model);
}

/// A truncate in one handle that frees whole leaves removes them from
/// their parents one by one (and the parents' keys follow), instead of
/// rewriting the tree: the nodes left keep their fill, e2fsck finds no
/// leaked tree block and a right `i_blocks`, and the kernel and a remount
/// read the file the model holds; then a truncate to nothing leaves a
/// tree of depth 0 that e2fsck passes too.
#[test]
fn truncates_remove_whole_leaves_from_the_path() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("extremove");
    let img = fresh(&s.0, 1024, "64M");
    let bs = 1024usize;
    let nblk = 8000usize;
    let mut model = vec![0u8; nblk * bs];
    {
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        let fd = t.open("/g", O_CREAT | O_RDWR, 0o644).unwrap();
        t.fallocate(fd, 0, 0, (nblk * bs) as i64).unwrap();
        let mut order: Vec<usize> = (0..nblk / 2).map(|k| 2 * k + 1).collect();
        shuffle(&mut order, &mut Rng(0x0BAD_5EED_1234_5678));
        for (k, &b) in order.iter().enumerate() {
            let data = vec![(k % 253 + 1) as u8; bs];
            assert_eq!(t.pwrite(fd, &data, (b * bs) as i64).unwrap(), bs);
            model[b * bs..(b + 1) * bs].copy_from_slice(&data);
        }
        // Removes the last ~3,000 blocks' extents: dozens of whole
        // leaves, and part of one.
        let size = 5000 * bs + 123;
        t.ftruncate(fd, size as i64).unwrap();
        model.truncate(size);
        t.close(fd).unwrap();
        unmount_clean(t, vfs, e, &img);
    }
    let (depth, count) = levels(&debugfs_ro(&img, "ex g"));
    eprintln!("after the truncate: depth {depth}, entries per level {count:?}");
    assert!(depth >= 2, "a deep tree: {count:?}");
    let (leaves, extents) = (count[depth - 1], count[depth]);
    assert!(extents > 4000 && extents < 6000, "{extents} extents");
    assert!(
        leaves * 84 > extents * 5 / 4,
        "{leaves} leaves for {extents} extents: the tree was rewritten"
    );
    reads_back(&s, &img, "g", &model);
    {
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        t.truncate("/g", 0).unwrap();
        assert_eq!(t.stat("/g").unwrap().blocks, 0);
        unmount_clean(t, vfs, e, &img);
    }
    let (depth, count) = levels(&debugfs_ro(&img, "ex g"));
    assert!(depth == 0 && count.iter().sum::<usize>() == 0, "{count:?}");
}

/// Random writes, punches, preallocations, ZERO_RANGE and truncates (up
/// and down) on a file whose tree starts at depth 2 and changes leaf by
/// leaf, some ranges crossing leaves (4,000 of them; EXT4_EXTENT_SEED
/// replays another sequence): after every 250 operations the file
/// reads back as a byte model says, and at the end e2fsck passes and the
/// kernel and a remount read the model.
#[test]
fn random_range_changes_on_a_deep_tree_match_a_model() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("extrandom");
    let img = fresh(&s.0, 1024, "64M");
    let bs = 1024usize;
    let nblk = 6000usize;
    let mut model: Vec<u8>;
    {
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        let fd = t.open("/h", O_CREAT | O_RDWR, 0o644).unwrap();
        model = vec![0u8; nblk * bs];
        // Every third block written: 2,000 extents to begin with.
        for b in (0..nblk).step_by(3) {
            let data = vec![(b % 251) as u8 | 1; bs];
            t.pwrite(fd, &data, (b * bs) as i64).unwrap();
            model[b * bs..(b + 1) * bs].copy_from_slice(&data);
        }
        // EXT4_EXTENT_SEED replays another sequence.
        let seed = std::env::var("EXT4_EXTENT_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0xFEED_5EED_0000_0001u64);
        let mut rng = Rng(seed);
        use scalevfs::io::FALLOC_FL_ZERO_RANGE as ZERO;
        use scalevfs::io::{FALLOC_FL_KEEP_SIZE as KEEP, FALLOC_FL_PUNCH_HOLE as PUNCH};
        for round in 0..4000u64 {
            let size = model.len();
            let span = (size + 64 * bs) as u64;
            let at = rng.below(span) as usize;
            // Mostly a few blocks; sometimes a range over many leaves.
            let len = if rng.below(10) == 0 {
                1 + rng.below(400 * bs as u64) as usize
            } else {
                1 + rng.below(4 * bs as u64) as usize
            };
            match rng.below(6) {
                0 | 1 => {
                    let v = (round % 250 + 1) as u8;
                    let data = vec![v; len];
                    assert_eq!(t.pwrite(fd, &data, at as i64).unwrap(), len);
                    if model.len() < at + len {
                        model.resize(at + len, 0);
                    }
                    model[at..at + len].fill(v);
                }
                2 => {
                    t.fallocate(fd, PUNCH | KEEP, at as i64, len as i64)
                        .unwrap();
                    let end = (at + len).min(model.len());
                    if at < end {
                        model[at..end].fill(0);
                    }
                }
                3 => {
                    t.fallocate(fd, KEEP, at as i64, len as i64).unwrap();
                }
                4 => {
                    t.fallocate(fd, ZERO | KEEP, at as i64, len as i64).unwrap();
                    let end = (at + len).min(model.len());
                    if at < end {
                        model[at..end].fill(0);
                    }
                }
                _ => {
                    // Down by up to ~16 blocks, or up a little.
                    let new = if rng.below(3) == 0 {
                        size + rng.below(8 * bs as u64) as usize
                    } else {
                        size.saturating_sub(rng.below(16 * bs as u64) as usize)
                    };
                    t.ftruncate(fd, new as i64).unwrap();
                    model.resize(new, 0);
                }
            }
            if round % 250 == 249 {
                let mut got = vec![0u8; model.len() + 1];
                let n = t.pread(fd, &mut got, 0).unwrap();
                assert_eq!(n, model.len(), "round {round}: size");
                assert!(got[..n] == model[..], "round {round}: content differs");
            }
        }
        t.close(fd).unwrap();
        unmount_clean(t, vfs, e, &img);
    }
    let (depth, count) = levels(&debugfs_ro(&img, "ex h"));
    eprintln!("at the end: depth {depth}, entries per level {count:?}");
    reads_back(&s, &img, "h", &model);
}

/// A line of debugfs's `ex` listing: its level, the first and last
/// logical block, the physical block (the child node for an index entry,
/// the first block for an extent), and whether the extent is unwritten.
struct ExRow {
    level: usize,
    first: u64,
    last: u64,
    phys: u64,
    uninit: bool,
}

fn ex_rows(ex: &str) -> Vec<ExRow> {
    ex.lines()
        .skip(1)
        .filter_map(|l| {
            // " 2/ 2   1/ 84     0 -   999  2345 -  3344   1000 Uninit":
            // level / depth, entry / entries, logical first - last,
            // physical (first - last for an extent), length, flags.
            let spaced = l.replace('/', " / ");
            let f: Vec<&str> = spaced.split_whitespace().collect();
            if f.len() < 10 || f[1] != "/" || f[4] != "/" || f[7] != "-" {
                return None;
            }
            Some(ExRow {
                level: f[0].parse().ok()?,
                first: f[6].parse().ok()?,
                last: f[8].parse().ok()?,
                phys: f[9].parse().ok()?,
                uninit: l.contains("Uninit"),
            })
        })
        .collect()
}

/// Leaf lines of debugfs's `ex` listing: (first logical block, last,
/// unwritten).
fn leaf_extents(ex: &str) -> Vec<(u64, u64, bool)> {
    let (depth, _) = levels(ex);
    ex_rows(ex)
        .into_iter()
        .filter(|r| r.level == depth)
        .map(|r| (r.first, r.last, r.uninit))
        .collect()
}

/// Blocks written one at a time, in order, into the unwritten extents of
/// a deep tree join the written extent before them (a write decodes only
/// the entries around its blocks, `leaf_window`, and that must include
/// the neighbour it merges with): the written run ends as a few extents,
/// not one per block; and a block written into a hole right after a
/// written one joins it too.
#[test]
fn sequential_writes_in_a_deep_tree_join_their_neighbours() {
    let Some((s, img, e, vfs)) = mount_fresh("extjoin", "32M") else {
        return;
    };
    let t = vfs.root_task();
    let fd = t.open("/j", O_CREAT | O_RDWR, 0o644).unwrap();
    let bs = 1024usize;
    // Blocks 0..6000 preallocated; every other block of 2000..6000
    // written, for a tree deeper than the inode.
    t.fallocate(fd, 0, 0, (6000 * bs) as i64).unwrap();
    let mut model = vec![0u8; 7000 * bs];
    let mut put = |b: usize, v: u8| {
        let data = vec![v; bs];
        assert_eq!(t.pwrite(fd, &data, (b * bs) as i64).unwrap(), bs);
        model[b * bs..(b + 1) * bs].copy_from_slice(&data);
    };
    for b in (2000..6000).step_by(2) {
        put(b, 0x11);
    }
    // In order through the unwritten run, then through a hole past EOF.
    for b in (0..1500).chain(6000..7000) {
        put(b, (b % 251) as u8 + 1);
    }
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
    let ex = debugfs_ro(&img, "ex j");
    let (depth, _) = levels(&ex);
    assert!(depth >= 1, "a tree deeper than the inode:\n{ex}");
    let leaves = leaf_extents(&ex);
    let written_in = |lo: u64, hi: u64| {
        leaves
            .iter()
            .filter(|&&(a, b, u)| !u && a >= lo && b < hi)
            .count()
    };
    let (head, tail) = (written_in(0, 1500), written_in(6000, 7000));
    eprintln!("depth {depth}: {head} written extents over 0..1500, {tail} over 6000..7000");
    // One per physical piece of the preallocation and per leaf boundary;
    // without the joins, one per block.
    assert!((1..=8).contains(&head), "{head} extents for blocks 0..1500");
    assert!(
        (1..=8).contains(&tail),
        "{tail} extents for blocks 6000..7000"
    );
    reads_back(&s, &img, "j", &model);
}

/// A leaf whose header gives less room than the block holds (`eh_max`
/// 82 with 1 KiB blocks, where 84 fit: e2fsck accepts down to two less,
/// the kernel any smaller room) that a write grows past that room is
/// written back with the usual room, not spliced in place past its own
/// `eh_max` (which the next read, e2fsck and the kernel would refuse).
#[test]
fn a_leaf_with_less_room_than_its_block_grows_correctly() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("extmax");
    // Without metadata_csum, so that the patched header needs no new
    // checksum tail.
    let img = fresh_with(&s.0, 1024, "16M", "^metadata_csum");
    let bs = 1024usize;
    let mut model = vec![0u8; 2000 * bs];
    {
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        let fd = t.open("/m", O_CREAT | O_RDWR, 0o644).unwrap();
        t.fallocate(fd, 0, 0, (2000 * bs) as i64).unwrap();
        for b in (1..2000).step_by(4) {
            let data = vec![0x22; bs];
            assert_eq!(t.pwrite(fd, &data, (b * bs) as i64).unwrap(), bs);
            model[b * bs..(b + 1) * bs].copy_from_slice(&data);
        }
        // Two unwritten extents of the first leaf (full: appends split
        // full then the rest) punched away: it holds 82 extents.
        let (keep, punch) = (
            scalevfs::io::FALLOC_FL_KEEP_SIZE,
            scalevfs::io::FALLOC_FL_PUNCH_HOLE,
        );
        for b in [2, 6] {
            t.fallocate(fd, punch | keep, (b * bs) as i64, (3 * bs) as i64)
                .unwrap();
        }
        t.close(fd).unwrap();
        unmount_clean(t, vfs, e, &img);
    }
    // A leaf that is not full (the index entries one level above the
    // leaves name them), and in it an unwritten extent of three blocks.
    let ex = debugfs_ro(&img, "ex m");
    let (depth, _) = levels(&ex);
    assert!(depth >= 1, "{ex}");
    let mut bytes = std::fs::read(&img).unwrap();
    let le16 = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let (at, entries) = ex_rows(&ex)
        .into_iter()
        .filter(|r| r.level == depth - 1)
        .map(|r| (r.phys as usize * bs, le16(&bytes, r.phys as usize * bs + 2)))
        .find(|&(_, n)| n == 82)
        .expect("a leaf of 82 extents");
    let mid = (0..usize::from(entries))
        .map(|i| at + 12 + 12 * i)
        .find(|&o| le16(&bytes, o + 4) == 32768 + 3)
        .map(|o| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap()) as usize + 1)
        .expect("an unwritten extent of 3 blocks");
    // Its room cut to its 82 entries.
    bytes[at + 4..at + 6].copy_from_slice(&entries.to_le_bytes());
    std::fs::write(&img, &bytes).unwrap();
    fsck_clean(&img);
    {
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        let fd = t.open("/m", O_RDWR, 0).unwrap();
        // Into the middle of an unwritten extent of that leaf: it splits
        // in three, two entries more than the leaf held.
        let data = vec![0x33; bs];
        assert_eq!(t.pwrite(fd, &data, (mid * bs) as i64).unwrap(), bs);
        model[mid * bs..(mid + 1) * bs].copy_from_slice(&data);
        let mut got = vec![0u8; model.len()];
        assert_eq!(t.pread(fd, &mut got, 0).unwrap(), model.len());
        assert!(got == model, "live: content differs");
        t.close(fd).unwrap();
        unmount_clean(t, vfs, e, &img);
    }
    reads_back(&s, &img, "m", &model);
}
