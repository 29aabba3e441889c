//! Listing indexed directories in hash order (`readdir_htree`), the
//! cases a review found (stop 38), each failing before its fix:
//! - legacy-hash names that collide ("c575" and "c775": the legacy hash
//!   has no minor) were listed twice or skipped by small getdents and at
//!   the 512-entry batch boundary: their listing minor is now the name's
//!   half_md4 hash (`list_pos`);
//! - a one-block directory converted to an indexed one in the middle of
//!   a listing repeated every name listed so far: one-block directories
//!   are listed in hash order too, as the kernel does
//!   (`readdir_block0_hashed`);
//! - and, passing: churn of other names between getdents calls on a
//!   two-level tree, and a seek past the end.
mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use common::*;
use scalevfs::{O_CREAT, O_DIRECTORY, O_RDONLY, O_WRONLY};
use scalevfs_ext4::format::htree;

fn creat(t: &scalevfs::Task, p: &str) {
    let fd = t.open(p, O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
}

fn legacy_pos(name: &[u8]) -> u64 {
    let (maj, min) = htree::dirhash2(name, htree::HASH_LEGACY, &[0; 4]).unwrap();
    (u64::from(maj >> 1) << 31) | u64::from(min >> 1)
}

/// Two short ASCII names with the same legacy (dx_hack) hash: one
/// position (the legacy minor is 0).
fn legacy_collision() -> (String, String) {
    let mut seen: HashMap<u32, String> = HashMap::new();
    for i in 0u64.. {
        let n = format!("c{i:x}");
        let (maj, _) = htree::dirhash2(n.as_bytes(), htree::HASH_LEGACY, &[0; 4]).unwrap();
        if let Some(o) = seen.insert(maj, n.clone()) {
            return (o, n);
        }
    }
    unreachable!()
}

/// A fresh 1 KiB-block image whose new indexed directories use the
/// legacy hash (as an old ext3 image's), mounted.
fn legacy_mount(
    tag: &str,
) -> Option<(
    Scratch,
    std::path::PathBuf,
    std::sync::Arc<scalevfs_ext4::Ext4>,
    scalevfs::Vfs,
)> {
    if !have_tools() {
        return None;
    }
    let s = Scratch::new(tag);
    let img = fresh(&s.0, 1024, "32M");
    assert!(debugfs(&img, "ssv def_hash_version legacy"));
    let (e, vfs) = mount(&img);
    Some((s, img, e, vfs))
}

/// Every name of /d by getdents(fd, k) until empty, with counts.
fn list_by(t: &scalevfs::Task, k: usize) -> BTreeMap<String, usize> {
    let fd = t.open("/d", O_RDONLY | O_DIRECTORY, 0).unwrap();
    let mut seen = BTreeMap::new();
    let mut calls = 0;
    loop {
        let v = t.getdents(fd, k).unwrap();
        if v.is_empty() {
            break;
        }
        calls += 1;
        assert!(calls < 1_000_000, "listing does not end");
        for e in v {
            *seen.entry(String::from_utf8(e.name).unwrap()).or_insert(0) += 1;
        }
    }
    t.close(fd).unwrap();
    seen
}

fn bad(seen: &BTreeMap<String, usize>, want: &[String]) -> (Vec<String>, Vec<String>) {
    let dup = want
        .iter()
        .filter(|n| seen.get(*n).copied().unwrap_or(0) > 1)
        .cloned()
        .collect();
    let miss = want
        .iter()
        .filter(|n| !seen.contains_key(*n))
        .cloned()
        .collect();
    (dup, miss)
}

/// A pair of names at one hash position (legacy hash) in an indexed
/// directory: a listing whose getdents calls end between them returns the
/// first twice; with one entry a call, the second is never returned.
#[test]
fn legacy_hash_collision_listed_once_by_small_getdents() {
    let Some((_s, img, e, vfs)) = legacy_mount("hashlist-coll") else {
        return;
    };
    let (a, b) = legacy_collision();
    eprintln!("colliding names {a} {b} at {:#x}", legacy_pos(a.as_bytes()));
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    let mut want: Vec<String> = (0..200).map(|i| format!("filler-name-{i:04}")).collect();
    want.push(a.clone());
    want.push(b.clone());
    for n in &want {
        creat(&t, &format!("/d/{n}"));
    }
    assert!(t.stat("/d").unwrap().size > 1024, "not indexed");
    let mut fails = Vec::new();
    for k in 1..=40 {
        let seen = list_by(&t, k);
        let (dup, miss) = bad(&seen, &want);
        if !dup.is_empty() || !miss.is_empty() {
            fails.push(format!("getdents({k}): twice {dup:?}, never {miss:?}"));
        }
    }
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);
    assert!(
        fails.is_empty(),
        "{} listings wrong: {:#?}",
        fails.len(),
        fails
    );
}

/// The same pair at the 512th and 513th names of the directory in hash
/// order: Filesystem::readdir reads 512 at a time (read-write mount), so
/// one large getdents returns the first name twice.
#[test]
fn legacy_hash_collision_at_the_readdir_batch_boundary() {
    let Some((_s, img, e, vfs)) = legacy_mount("hashlist-batch") else {
        return;
    };
    let (a, b) = legacy_collision();
    let p = legacy_pos(a.as_bytes());
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    let mut want = vec![a.clone(), b.clone()];
    let (mut below, mut above) = (0, 0);
    let mut i = 0;
    while below < 511 || above < 100 {
        let n = format!("filler-name-{i:05}");
        i += 1;
        let q = legacy_pos(n.as_bytes());
        if q < p && below < 511 {
            below += 1;
        } else if q > p && above < 100 {
            above += 1;
        } else {
            continue;
        }
        want.push(n);
    }
    for n in &want {
        creat(&t, &format!("/d/{n}"));
    }
    let fd = t.open("/d", O_RDONLY | O_DIRECTORY, 0).unwrap();
    let v = t.getdents(fd, 5000).unwrap();
    t.close(fd).unwrap();
    let mut seen = BTreeMap::new();
    for e in v {
        *seen.entry(String::from_utf8(e.name).unwrap()).or_insert(0) += 1;
    }
    let (dup, miss) = bad(&seen, &want);
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);
    assert!(
        dup.is_empty() && miss.is_empty(),
        "one getdents of {} names: twice {dup:?}, never {miss:?}",
        want.len()
    );
}

/// A name never seen twice / missed: churn (creates, unlinks, renames of
/// other names, leaf and index splits at 2 levels) between small getdents
/// calls, and a seekdir to cookies taken earlier.
#[test]
fn churn_between_getdents_two_levels() {
    let Some((_s, img, e, vfs)) = mount_fresh("hashlist-churn", "64M") else {
        return;
    };
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    let long = |tag: &str, i: usize| format!("{tag}-{i:06}-{}", "x".repeat(180));
    let keep: Vec<String> = (0..500).map(|i| long("keep", i)).collect();
    for n in &keep {
        creat(&t, &format!("/d/{n}"));
    }
    let mut x: u64 = 88172645463325252;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut churn: BTreeSet<String> = BTreeSet::new();
    let mut next = 0usize;
    let mut fails = Vec::new();
    for round in 0..6 {
        let fd = t.open("/d", O_RDONLY | O_DIRECTORY, 0).unwrap();
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut cookies: Vec<(u64, BTreeMap<String, usize>)> = Vec::new();
        loop {
            let k = 1 + (rnd() % 9) as usize;
            let v = t.getdents(fd, k).unwrap();
            if v.is_empty() {
                break;
            }
            for e in v {
                *seen.entry(String::from_utf8(e.name).unwrap()).or_insert(0) += 1;
            }
            if rnd() % 10 == 0 {
                let c = t.lseek(fd, 0, libc::SEEK_CUR as u32).unwrap();
                cookies.push((c, seen.clone()));
            }
            for _ in 0..(rnd() % 12) {
                match rnd() % 4 {
                    0 | 1 => {
                        let n = long("new", next);
                        next += 1;
                        creat(&t, &format!("/d/{n}"));
                        churn.insert(n);
                    }
                    2 => {
                        if let Some(n) = churn
                            .iter()
                            .nth((rnd() as usize) % churn.len().max(1))
                            .cloned()
                        {
                            t.unlink(&format!("/d/{n}")).unwrap();
                            churn.remove(&n);
                        }
                    }
                    _ => {
                        if let Some(n) = churn
                            .iter()
                            .nth((rnd() as usize) % churn.len().max(1))
                            .cloned()
                        {
                            let m = long("ren", next);
                            next += 1;
                            t.rename(&format!("/d/{n}"), &format!("/d/{m}")).unwrap();
                            churn.remove(&n);
                            churn.insert(m);
                        }
                    }
                }
            }
        }
        t.close(fd).unwrap();
        let (dup, miss) = bad(&seen, &keep);
        if !dup.is_empty() || !miss.is_empty() {
            fails.push(format!(
                "round {round}: twice {}, never {}",
                dup.len(),
                miss.len()
            ));
        }
        // seekdir back to each cookie (after more churn), list the rest.
        for (c, prefix) in cookies.iter().take(5) {
            let fd = t.open("/d", O_RDONLY | O_DIRECTORY, 0).unwrap();
            t.lseek(fd, *c as i64, libc::SEEK_SET as u32).unwrap();
            let mut s = prefix.clone();
            loop {
                let v = t.getdents(fd, 1 + (rnd() % 50) as usize).unwrap();
                if v.is_empty() {
                    break;
                }
                for e in v {
                    *s.entry(String::from_utf8(e.name).unwrap()).or_insert(0) += 1;
                }
            }
            t.close(fd).unwrap();
            let (dup, miss) = bad(&s, &keep);
            if !dup.is_empty() || !miss.is_empty() {
                fails.push(format!(
                    "round {round} seek {c}: twice {}, never {}",
                    dup.len(),
                    miss.len()
                ));
            }
        }
    }
    let lv = {
        drop(t);
        drop(vfs);
        e.unmount().unwrap();
        debugfs_ro(&img, "htree_dump /d").lines().find_map(|l| {
            l.trim()
                .strip_prefix("Indirect levels:")
                .map(|v| v.trim().to_string())
        })
    };
    eprintln!("indirect levels {lv:?}, names made {next}");
    fsck_clean(&img);
    assert!(fails.is_empty(), "{fails:#?}");
}

/// The documented gap: a one-block (linear) directory converted to an
/// indexed one while a listing is part way through it.
#[test]
fn listing_across_linear_to_htree_conversion() {
    let Some((_s, img, e, vfs)) = mount_fresh("hashlist-conv", "32M") else {
        return;
    };
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    let old: Vec<String> = (0..30).map(|i| format!("old-{i:03}")).collect();
    for n in &old {
        creat(&t, &format!("/d/{n}"));
    }
    let fd = t.open("/d", O_RDONLY | O_DIRECTORY, 0).unwrap();
    let mut seen = BTreeMap::new();
    for e in t.getdents(fd, 20).unwrap() {
        *seen.entry(String::from_utf8(e.name).unwrap()).or_insert(0) += 1;
    }
    let mut i = 0;
    while t.stat("/d").unwrap().size == 1024 {
        creat(&t, &format!("/d/new-{i:03}"));
        i += 1;
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
    let (dup, miss) = bad(&seen, &old);
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);
    assert!(
        dup.is_empty() && miss.is_empty(),
        "twice {dup:?}, never {miss:?}"
    );
}

/// seekdir to cookies past every name (up to i64::MAX): an empty rest,
/// no panic, no wrap.
#[test]
fn seek_past_the_end_lists_nothing() {
    let Some((_s, img, e, vfs)) = mount_fresh("hashlist-far", "32M") else {
        return;
    };
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    for i in 0..300 {
        creat(&t, &format!("/d/name-{i:04}"));
    }
    for c in [
        (1i64 << 62) + 2,
        (1i64 << 62) + 3,
        (1i64 << 62) + 4,
        i64::MAX - 1,
        i64::MAX,
    ] {
        let fd = t.open("/d", O_RDONLY | O_DIRECTORY, 0).unwrap();
        t.lseek(fd, c, libc::SEEK_SET as u32).unwrap();
        let v = t.getdents(fd, 100).unwrap();
        assert!(v.is_empty(), "cookie {c:#x}: {} entries", v.len());
        t.close(fd).unwrap();
    }
    // Every cookie handed out is below 2^62 + 3 and increases.
    let fd = t.open("/d", O_RDONLY | O_DIRECTORY, 0).unwrap();
    let mut last = 0;
    loop {
        let v = t.getdents(fd, 64).unwrap();
        if v.is_empty() {
            break;
        }
        for e in v {
            assert!(
                e.next_cookie > last && e.next_cookie < (1 << 62) + 3,
                "{:#x}",
                e.next_cookie
            );
            last = e.next_cookie;
        }
    }
    t.close(fd).unwrap();
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);
}
