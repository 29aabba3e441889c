//! getdents continuation across htree changes: an entry present for the
//! whole listing comes back exactly once (the `Filesystem::readdir`
//! contract; POSIX readdir), while other names are created and leaves
//! split, from a seekdir cookie taken before the splits, and across the
//! conversion of a one-block directory to an indexed one. Indexed and
//! one-block directories are listed in hash order with hash cookies
//! (`readdir_htree`, as the kernel's `ext4_dx_readdir`); byte-offset
//! cookies repeated and skipped names (review, stop 38).

mod common;

use std::collections::BTreeMap;

use common::*;
use scalevfs::{O_CREAT, O_DIRECTORY, O_RDONLY, O_WRONLY};

fn creat(t: &scalevfs::Task, p: &str) {
    let fd = t.open(p, O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
}

fn size_of(t: &scalevfs::Task, p: &str) -> u64 {
    t.stat(p).unwrap().size
}

/// Names seen by a listing of `/d` (open, `first` entries, then `mid`,
/// then the rest), with counts.
fn list_around(t: &scalevfs::Task, first: usize, mid: &mut dyn FnMut()) -> BTreeMap<String, usize> {
    let fd = t.open("/d", O_RDONLY | O_DIRECTORY, 0).unwrap();
    let mut seen = BTreeMap::new();
    let mut add = |v: Vec<scalevfs::DirEntry>| {
        let n = v.len();
        for e in v {
            *seen.entry(String::from_utf8(e.name).unwrap()).or_insert(0) += 1;
        }
        n
    };
    // "." and ".." first, then `first` names.
    add(t.getdents(fd, first + 2).unwrap());
    mid();
    while add(t.getdents(fd, 64).unwrap()) > 0 {}
    t.close(fd).unwrap();
    seen
}

fn check(seen: &BTreeMap<String, usize>, old: &[String], what: &str) {
    let dup: Vec<_> = old
        .iter()
        .filter(|n| seen.get(*n).copied().unwrap_or(0) > 1)
        .collect();
    let miss: Vec<_> = old.iter().filter(|n| !seen.contains_key(*n)).collect();
    assert!(
        dup.is_empty() && miss.is_empty(),
        "{what}: of {} names present throughout, {} returned twice (e.g. {:?}), {} never (e.g. {:?})",
        old.len(),
        dup.len(),
        dup.iter().take(3).collect::<Vec<_>>(),
        miss.len(),
        miss.iter().take(3).collect::<Vec<_>>()
    );
}

/// An indexed directory of several leaves; a listing reads part of it,
/// creates split leaves (behind and ahead of it), the listing goes on.
#[test]
fn getdents_across_htree_leaf_splits_returns_old_names_once() {
    let Some((_s, img, e, vfs)) = mount_fresh("readdir-split", "32M") else {
        return;
    };
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    let old: Vec<String> = (0..400)
        .map(|i| format!("old-name-number-{i:05}"))
        .collect();
    for n in &old {
        creat(&t, &format!("/d/{n}"));
    }
    let before = size_of(&t, "/d");
    let seen = list_around(&t, 150, &mut || {
        for i in 0..300 {
            creat(&t, &format!("/d/new-name-number-{i:05}"));
        }
    });
    let after = size_of(&t, "/d");
    eprintln!("directory size {before} -> {after} bytes");
    assert!(after > before, "no split happened");
    check(&seen, &old, "htree leaf split during getdents");
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);
}

/// The same with a single create: one leaf split.
#[test]
fn getdents_across_one_leaf_split_returns_old_names_once() {
    let Some((_s, img, e, vfs)) = mount_fresh("readdir-one", "32M") else {
        return;
    };
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    let mut old: Vec<String> = Vec::new();
    for i in 0..200 {
        let n = format!("old-name-number-{i:05}");
        creat(&t, &format!("/d/{n}"));
        old.push(n);
    }
    // Read everything but the last few, then create until one split.
    let total = old.len();
    let mut i = 0;
    let seen = list_around(&t, total - 5, &mut || {
        let s0 = size_of(&t, "/d");
        while size_of(&t, "/d") == s0 {
            creat(&t, &format!("/d/added-{i:05}"));
            i += 1;
        }
    });
    eprintln!("{i} creates made the split");
    check(&seen, &old, "one htree leaf split during getdents");
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);
}

/// A one-block linear directory that becomes indexed (all its names move
/// from block 0 to block 1) while a listing is part way through it.
#[test]
fn getdents_across_conversion_to_htree_returns_old_names_once() {
    let Some((_s, img, e, vfs)) = mount_fresh("readdir-conv", "32M") else {
        return;
    };
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    let mut old: Vec<String> = Vec::new();
    // Fill exactly the one block (1 KiB: 24 bytes of "." and "..").
    let mut i = 0;
    loop {
        let n = format!("n{i:03}-{}", "x".repeat(40));
        creat(&t, &format!("/d/{n}"));
        if size_of(&t, "/d") > 1024 {
            // This one already converted: drop it from the list.
            t.unlink(&format!("/d/{n}")).unwrap();
            break;
        }
        old.push(n);
        i += 1;
    }
    // Start over in a fresh directory with exactly `old`, linear.
    t.mkdir("/e", 0o755).unwrap();
    for n in &old {
        creat(&t, &format!("/e/{n}"));
    }
    assert_eq!(size_of(&t, "/e"), 1024);
    t.rename("/d", "/z").unwrap();
    t.rename("/e", "/d").unwrap();
    let seen = list_around(&t, 5, &mut || {
        creat(
            &t,
            "/d/one-more-name-that-makes-it-indexed-xxxxxxxxxxxxxxxxxxxxxx",
        );
        assert!(size_of(&t, "/d") > 1024, "not converted");
    });
    check(&seen, &old, "conversion to htree during getdents");
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);
}

/// telldir/seekdir: a cookie taken before a split, used after it, goes on
/// from where the listing was (every old name after it, none before it,
/// is what a stable cookie gives; here: the rest of the old names exactly
/// once when the two halves are joined).
#[test]
fn seekdir_cookie_from_before_a_split_stays_valid() {
    let Some((_s, img, e, vfs)) = mount_fresh("readdir-seek", "32M") else {
        return;
    };
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    let old: Vec<String> = (0..300)
        .map(|i| format!("old-name-number-{i:05}"))
        .collect();
    for n in &old {
        creat(&t, &format!("/d/{n}"));
    }
    let fd = t.open("/d", O_RDONLY | O_DIRECTORY, 0).unwrap();
    let head = t.getdents(fd, 2 + 120).unwrap();
    let cookie = t.lseek(fd, 0, libc::SEEK_CUR as u32).unwrap();
    t.close(fd).unwrap();
    for i in 0..300 {
        creat(&t, &format!("/d/new-name-number-{i:05}"));
    }
    let fd = t.open("/d", O_RDONLY | O_DIRECTORY, 0).unwrap();
    t.lseek(fd, cookie as i64, libc::SEEK_SET as u32).unwrap();
    let mut seen = BTreeMap::new();
    for e in head {
        *seen.entry(String::from_utf8(e.name).unwrap()).or_insert(0) += 1;
    }
    loop {
        let v = t.getdents(fd, 64).unwrap();
        if v.is_empty() {
            break;
        }
        for e in v {
            *seen.entry(String::from_utf8(e.name).unwrap()).or_insert(0) += 1;
        }
    }
    t.close(fd).unwrap();
    check(&seen, &old, "seekdir to a cookie from before the splits");
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);
}

/// Names present throughout that a listing never returns: a split
/// rewrites the leaf being read, packed and in hash order, so entries that
/// sat past the listing's byte offset can land before it.
#[test]
fn getdents_across_splits_never_skips_an_old_name() {
    let Some((_s, img, e, vfs)) = mount_fresh("readdir-skip", "64M") else {
        return;
    };
    let t = vfs.root_task();
    let mut worst = (0, String::new());
    for (k, first) in (7..400).step_by(29).enumerate() {
        let d = format!("/d{k}");
        t.mkdir(&d, 0o755).unwrap();
        let old: Vec<String> = (0..400)
            .map(|i| format!("old-name-number-{i:05}"))
            .collect();
        for n in &old {
            creat(&t, &format!("{d}/{n}"));
        }
        t.rename(&d, "/d").unwrap();
        let seen = list_around(&t, first, &mut || {
            for i in 0..300 {
                creat(&t, &format!("/d/new-name-number-{i:05}"));
            }
        });
        t.rename("/d", &d).unwrap();
        let miss: Vec<_> = old.iter().filter(|n| !seen.contains_key(*n)).collect();
        eprintln!("first {first}: {} old names never returned", miss.len());
        if miss.len() > worst.0 {
            worst = (
                miss.len(),
                format!("first {first}: e.g. {:?}", &miss[..miss.len().min(3)]),
            );
        }
    }
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);
    assert!(
        worst.0 == 0,
        "old names skipped by a listing: {} ({})",
        worst.0,
        worst.1
    );
}

/// An inline directory (inline_data image) that moves out to a block
/// while a listing is part way through it: with dir_index both forms are
/// listed in hash order (the kernel lists an inline directory through
/// `ext4_inlinedir_to_tree` there); without it, inline positions are the
/// byte offsets the entries keep in the block they move to. Before,
/// inline positions were read as hashes or as offsets of a repacked
/// block, and names came back twice.
#[test]
fn getdents_across_an_inline_directory_moving_out_returns_old_names_once() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    for features in ["inline_data", "inline_data,^dir_index"] {
        let s = Scratch::new("readdir-inline");
        let img = fresh_with(&s.0, 1024, "8M", features);
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        t.mkdir("/d", 0o755).unwrap();
        // Four names of 12 bytes fill i_block's 56; the rest go to the
        // system.data value (68 bytes on 256-byte inodes).
        let old: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        for n in &old {
            creat(&t, &format!("/d/{n}"));
        }
        assert!(size_of(&t, "/d") > 60, "{features}: not in the attribute");
        for first in 1..old.len() {
            let seen = list_around(&t, first, &mut || {
                assert!(size_of(&t, "/d") < 1024, "{features}: not inline");
                creat(&t, &format!("/d/{}", "m".repeat(100)));
                assert_eq!(size_of(&t, "/d"), 1024, "{features}: not moved out");
            });
            check(&seen, &old, &format!("{features}: move out after {first}"));
            // Inline again for the next round.
            t.unlink(&format!("/d/{}", "m".repeat(100))).unwrap();
            t.rename("/d", &format!("/moved{first}")).unwrap();
            t.mkdir("/d", 0o755).unwrap();
            for n in &old {
                creat(&t, &format!("/d/{n}"));
            }
        }
        unmount_clean(t, vfs, e, &img);
    }
}
