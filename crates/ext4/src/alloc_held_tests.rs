//! The allocator holds back the blocks a commit freed until that commit
//! is durable (`alloc.rs`): tested through a read-write mount, in a module
//! of its own so that `alloc` does not import `fs` (the layer above it).

use crate::device::MemDevice;
use crate::fs::Ext4Options;
use crate::mkfs::{self, MkfsOptions};
use crate::Ext4;

/// A fresh 16 MiB image with 1 KiB blocks (our mkfs), mounted read-write
/// and journaled from memory, no commit thread. Also the lock-order tests'.
pub(crate) fn rw_fs() -> std::sync::Arc<Ext4> {
    let path = std::env::temp_dir().join(format!(
        "scalevfs-rwfs-{}-{:?}.img",
        std::process::id(),
        std::thread::current().id()
    ));
    let o = MkfsOptions {
        size: 16 << 20,
        block_size: Some(1024),
        ..Default::default()
    };
    mkfs::make(&path, &o).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let opts = Ext4Options {
        ro: false,
        commit_interval: 0,
        ..Ext4Options::default()
    };
    Ext4::open_device(Box::new(MemDevice::new(bytes)), opts).unwrap()
}

/// A block freed by commit `n` is not handed out again until commit
/// `n` is durable, even when the allocation asks for exactly that block
/// as its goal; after `set_durable(n)` it is. When the held blocks are
/// all a group has free, the allocation goes to another group instead
/// of failing.
#[test]
fn freed_blocks_wait_for_their_commit() {
    let fs = rw_fs();
    let (rw, io) = fs.rw().unwrap();
    let a = &rw.alloc;
    let base = a.durable();
    let b = a.alloc_block(&io, 0, 0).unwrap();
    a.free_block_held(&io, b, base + 5).unwrap();
    assert!(a.holds_blocks());
    for _ in 0..50 {
        let c = a.alloc_block(&io, b, 0).unwrap();
        assert_ne!(c, b, "a held block was handed out");
    }
    a.set_durable(base + 4);
    assert_ne!(a.alloc_block(&io, b, 0).unwrap(), b);
    a.set_durable(base + 5);
    assert_eq!(a.alloc_block(&io, b, 0).unwrap(), b);
    assert!(!a.holds_blocks());

    // A group whose only free blocks are held is passed over.
    let sb = io.sb;
    let g = ((b - u64::from(sb.first_data_block)) / u64::from(sb.blocks_per_group)) as usize;
    let mut taken = Vec::new();
    while a.desc(g).free_blocks_count > 0 {
        let c = a.alloc_block(&io, b, 0).unwrap();
        assert_eq!(
            (c - u64::from(sb.first_data_block)) / u64::from(sb.blocks_per_group),
            g as u64
        );
        taken.push(c);
    }
    let n = base + 10;
    for &c in &taken[..3] {
        a.free_block_held(&io, c, n).unwrap();
    }
    let c = a.alloc_block(&io, taken[0], 0).unwrap();
    assert!(!taken[..3].contains(&c), "got held block {c}");
    a.set_durable(n);
    assert!(taken[..3].contains(&a.alloc_block(&io, taken[0], 0).unwrap()));
}

/// Held blocks are kept as runs and a group's durable runs go at its next
/// free (review, stop 49): before, one entry per freed block stayed until
/// an allocation visited the group again, so deleting a large file left
/// 16 bytes per block held in memory for as long as the allocator looked
/// elsewhere (about 4 GB after deleting 1 TiB).
#[test]
fn held_blocks_are_runs_and_go_when_durable() {
    let fs = rw_fs();
    let (rw, io) = fs.rw().unwrap();
    let a = &rw.alloc;
    let base = a.durable();
    let blocks: Vec<u64> = (0..200)
        .map(|_| a.alloc_block(&io, 0, 0).unwrap())
        .collect();
    let g = a.group_of(&io, blocks[0]);
    assert!(blocks.iter().all(|&b| a.group_of(&io, b) == g));
    // Freed in order by one commit: one run, whatever the direction.
    for &b in &blocks[..100] {
        a.free_block_held(&io, b, base + 1).unwrap();
    }
    for &b in blocks[100..].iter().rev() {
        a.free_block_held(&io, b, base + 1).unwrap();
    }
    assert_eq!(a.held_runs(g), (2, 200));
    // The commit durable: the next free in the group drops its runs.
    a.set_durable(base + 1);
    let c = a.alloc_block(&io, blocks[0], 0).unwrap();
    assert_eq!(a.held_runs(g), (0, 0), "an allocation prunes");
    a.free_block_held(&io, c, base + 2).unwrap();
    let d = blocks[150];
    assert_ne!(
        a.alloc_block(&io, d, 0).unwrap(),
        c,
        "held block handed out"
    );
    a.set_durable(base + 2);
    a.free_block_held(&io, d, base + 3).unwrap();
    assert_eq!(a.held_runs(g), (1, 1), "a free prunes the durable runs");
    assert!(a.holds_blocks());
}
