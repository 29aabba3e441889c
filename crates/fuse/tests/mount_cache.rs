//! The kernel's caches on a mount with the default settings (issue 14):
//! names, attributes and "no such name" are cached for
//! `scalevfs_fuse::DEFAULT_TIMEOUT` (60 s), so a program that comes back to
//! a file costs no request; yet a change made through the library is seen
//! at once, and the `-o` timeout options turn each cache off again. The
//! request counters (`FuseMount::request_counts`) show which requests
//! reached the daemon.
//!
//! Skipped without FUSE, as the other mount tests (`common`).

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use scalevfs::{Cred, AT_FDCWD, O_CREAT, O_RDONLY, O_WRONLY};
use scalevfs_fuse::{FuseConfig, DEFAULT_TIMEOUT};

mod common;
use common::*;

fn enoent(p: &std::path::Path) {
    let r = fs::symlink_metadata(p);
    assert_eq!(
        r.as_ref().map_err(errno_of).err(),
        Some(libc::ENOENT),
        "{}: {r:?}",
        p.display()
    );
}

#[test]
fn defaults_are_long() {
    let d = FuseConfig::default();
    assert_eq!(DEFAULT_TIMEOUT, Duration::from_secs(60));
    assert_eq!(
        (d.attr_timeout, d.entry_timeout, d.negative_timeout),
        (DEFAULT_TIMEOUT, DEFAULT_TIMEOUT, DEFAULT_TIMEOUT)
    );
}

/// A missing name costs one LOOKUP, then the kernel answers ENOENT itself;
/// the name made afterwards through the library (by an ordinary task, and
/// in a subdirectory too) is seen at once, not after the 60 s.
#[test]
fn negative_entries_are_cached_until_the_name_is_made() {
    if !fuse_ok("negative_entries_are_cached_until_the_name_is_made") {
        return;
    }
    let m = Mounted::new("negcache", FuseConfig::default());
    fs::create_dir(m.p("d")).unwrap();
    enoent(&m.p("x"));
    enoent(&m.p("d/y"));
    let lookups = served(m.mount(), "lookup");
    for _ in 0..10 {
        enoent(&m.p("x"));
        enoent(&m.p("d/y"));
    }
    assert_eq!(
        served(m.mount(), "lookup"),
        lookups,
        "the kernel should answer ENOENT from its negative entries"
    );
    let t = m.vfs.task(Cred::root());
    let fd = t.open("/x", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.write(fd, b"made behind the kernel").unwrap();
    t.close(fd).unwrap();
    t.mkdir("/d/y", 0o755).unwrap();
    assert_eq!(fs::read(m.p("x")).unwrap(), b"made behind the kernel");
    assert!(fs::metadata(m.p("d/y")).unwrap().is_dir());
    // And a name made through the mount replaces its negative entry.
    enoent(&m.p("z"));
    fs::write(m.p("z"), b"z").unwrap();
    assert_eq!(fs::read(m.p("z")).unwrap(), b"z");
    // Removed through the library: gone at once as well.
    t.unlink("/z").unwrap();
    enoent(&m.p("z"));
}

/// `-o negative_timeout=0`: every miss is asked again, so even a file made
/// by a quiet task (which tells the kernel nothing) is seen at once.
#[test]
fn negative_timeout_zero_turns_negative_caching_off() {
    if !fuse_ok("negative_timeout_zero_turns_negative_caching_off") {
        return;
    }
    let m = Mounted::with(
        "negoff",
        &["allow_other", "negative_timeout=0"],
        FuseConfig::default(),
        2,
    );
    enoent(&m.p("q"));
    let lookups = served(m.mount(), "lookup");
    enoent(&m.p("q"));
    enoent(&m.p("q"));
    assert!(
        served(m.mount(), "lookup") >= lookups + 2,
        "each miss should reach the daemon"
    );
    let mut t = m.vfs.task(Cred::root());
    t.set_quiet_changes(true);
    let fd = t.open("/q", O_CREAT | O_WRONLY, 0o644).unwrap();
    t.close(fd).unwrap();
    assert!(fs::metadata(m.p("q")).is_ok());
}

/// A name and its attributes looked up more than a second ago (the old
/// default) still cost no request; `-o attr_timeout=0,entry_timeout=0`
/// makes every `stat` ask again.
#[test]
fn names_and_attributes_outlive_a_second_unless_turned_off() {
    if !fuse_ok("names_and_attributes_outlive_a_second_unless_turned_off") {
        return;
    }
    let m = Mounted::new("longcache", FuseConfig::default());
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/f"), b"abc").unwrap();
    assert_eq!(fs::metadata(m.p("d/f")).unwrap().len(), 3);
    std::thread::sleep(Duration::from_millis(1300));
    let before = (served(m.mount(), "lookup"), served(m.mount(), "getattr"));
    for _ in 0..5 {
        assert_eq!(fs::metadata(m.p("d/f")).unwrap().len(), 3);
    }
    assert_eq!(
        (served(m.mount(), "lookup"), served(m.mount(), "getattr")),
        before,
        "a cached name and attributes should not be asked again"
    );
    drop(m);

    let m = Mounted::with(
        "shortcache",
        &["allow_other", "attr_timeout=0", "entry_timeout=0"],
        FuseConfig::default(),
        2,
    );
    fs::write(m.p("f"), b"abc").unwrap();
    let before = served(m.mount(), "lookup") + served(m.mount(), "getattr");
    for _ in 0..5 {
        assert_eq!(fs::metadata(m.p("f")).unwrap().len(), 3);
    }
    assert!(
        served(m.mount(), "lookup") + served(m.mount(), "getattr") >= before + 5,
        "with the caches off every stat should reach the daemon"
    );
}

/// No FLUSH on close (FOPEN_NOFLUSH): nothing is lost by it, since data
/// reaches the daemon at write(2). After close the library sees the bytes,
/// the size and the mtime the mount shows; after an fsync as well.
#[test]
fn data_size_and_mtime_are_the_daemons_at_close() {
    if !fuse_ok("data_size_and_mtime_are_the_daemons_at_close") {
        return;
    }
    let m = Mounted::new("noflush", FuseConfig::default());
    let t = m.vfs.task(Cred::root());
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
    let mut f = fs::File::create(m.p("w")).unwrap();
    f.write_all(&data).unwrap();
    drop(f);
    let lib = t.fstatat(AT_FDCWD, "/w", 0).unwrap();
    let md = fs::metadata(m.p("w")).unwrap();
    assert_eq!((lib.size, md.len()), (10_000, 10_000));
    assert_eq!(
        (md.mtime(), md.mtime_nsec()),
        (lib.mtime.sec, lib.mtime.nsec)
    );
    let fd = t.open("/w", O_RDONLY, 0).unwrap();
    let mut back = vec![0u8; 20_000];
    let n = t.pread(fd, &mut back, 0).unwrap();
    t.close(fd).unwrap();
    assert_eq!(&back[..n], &data[..]);
    // An append and an fsync: size and bytes again.
    let mut f = fs::OpenOptions::new().append(true).open(m.p("w")).unwrap();
    f.write_all(b"tail").unwrap();
    f.sync_all().unwrap();
    assert_eq!(t.fstatat(AT_FDCWD, "/w", 0).unwrap().size, 10_004);
    drop(f);
    let md = fs::metadata(m.p("w")).unwrap();
    let lib = t.fstatat(AT_FDCWD, "/w", 0).unwrap();
    assert_eq!(md.len(), 10_004);
    assert_eq!(
        (md.mtime(), md.mtime_nsec()),
        (lib.mtime.sec, lib.mtime.nsec)
    );
    assert_eq!(&fs::read(m.p("w")).unwrap()[10_000..], b"tail");
}
