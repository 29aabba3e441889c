//! Block-mapped directories on ext3 growing to thousands of names
//! (indexed, past the single indirect block), names removed and renamed,
//! a big directory emptied and removed; symlinks of 60..4095 bytes, hard
//! links, O_TMPFILE; the kernel reads our image the same.

mod common;

use std::collections::BTreeSet;

use common::*;
use scalevfs::{O_CREAT, O_RDWR};

fn names(t: &scalevfs::Task, dir: &str) -> BTreeSet<String> {
    let fd = t
        .open(dir, scalevfs::O_RDONLY | scalevfs::O_DIRECTORY, 0)
        .unwrap();
    let mut out = BTreeSet::new();
    loop {
        let v = t.getdents(fd, 1 << 16).unwrap();
        if v.is_empty() {
            break;
        }
        for d in v {
            let n = String::from_utf8_lossy(&d.name).into_owned();
            if n != "." && n != ".." {
                assert!(out.insert(n.clone()), "{dir}: {n} listed twice");
            }
        }
    }
    t.close(fd).unwrap();
    out
}

#[test]
fn big_block_mapped_directories() {
    if !have_tools() {
        return;
    }
    for bs in [1024usize, 4096] {
        let s = Scratch::new(&format!("blockmap-dirs-{bs}"));
        let img = s.0.join("img");
        mkfs_args(&img, &["-t", "ext3", "-b", &bs.to_string()], "128M");
        let (e, vfs) = mount(&img);
        let t = vfs.root_task();
        t.mkdir("/d", 0o755).unwrap();
        t.mkdir("/e", 0o755).unwrap();
        let long = "n".repeat(200);
        let count = if bs == 1024 { 6000 } else { 12000 };
        for i in 0..count {
            let p = format!("/d/{i:05}-{long}");
            let fd = t.open(p.as_str(), O_CREAT | O_RDWR, 0o644).unwrap();
            t.close(fd).unwrap();
            if i % 2 == 0 {
                let fd = t
                    .open(
                        format!("/e/{i:05}-{long}").as_str(),
                        O_CREAT | O_RDWR,
                        0o644,
                    )
                    .unwrap();
                t.close(fd).unwrap();
            }
        }
        for i in (0..count).step_by(3) {
            t.unlink(format!("/d/{i:05}-{long}").as_str()).unwrap();
        }
        for i in (1..count).step_by(7) {
            if i % 3 == 0 {
                continue;
            }
            t.rename(
                format!("/d/{i:05}-{long}").as_str(),
                format!("/d/r{i:05}").as_str(),
            )
            .unwrap();
        }
        for i in (0..count).step_by(2) {
            t.unlink(format!("/e/{i:05}-{long}").as_str()).unwrap();
        }
        t.rmdir("/e").unwrap();
        // Symlinks around the fast/slow boundary and up to 4095 bytes.
        let lens: Vec<usize> = [59usize, 60, 61, 1023, 1024, 1025, 4095]
            .into_iter()
            .filter(|&n| n < bs)
            .collect();
        for &n in &lens {
            let tg = "s".repeat(n);
            t.symlink(tg.as_str(), format!("/l{n}").as_str()).unwrap();
        }
        assert_eq!(
            t.symlink("s".repeat(bs).as_str(), "/lbs"),
            Err(scalevfs::Errno::ENAMETOOLONG)
        );
        let ours = names(&t, "/d");
        for &n in &lens {
            assert_eq!(
                t.readlink(format!("/l{n}").as_str()).unwrap(),
                "s".repeat(n).into_bytes()
            );
        }
        let st = t.stat("/d").unwrap();
        unmount_clean(t, vfs, e, &img);
        let st_dbg = debugfs_ro(&img, "stat /d");
        assert!(!st_dbg.contains("EXTENTS"), "{st_dbg}");
        let Some(km) = KMount::new(&img, &s.0.join("mnt")) else {
            continue;
        };
        let theirs: BTreeSet<String> = std::fs::read_dir(km.0.join("d"))
            .unwrap()
            .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(ours.len(), theirs.len(), "bs {bs}");
        assert!(ours == theirs, "bs {bs}: listings differ");
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(km.0.join("d")).unwrap();
        assert_eq!((m.size(), m.blocks()), (st.size, st.blocks), "bs {bs}: /d");
        for &n in &lens {
            let l = std::fs::read_link(km.0.join(format!("l{n}"))).unwrap();
            assert_eq!(l.to_string_lossy(), "s".repeat(n));
            let m = std::fs::symlink_metadata(km.0.join(format!("l{n}"))).unwrap();
            assert_eq!(m.size(), n as u64);
        }
        drop(km);
    }
}

#[test]
fn tmpfile_and_links_on_ext3() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("blockmap-tmpfile");
    let img = s.0.join("img");
    mkfs_args(&img, &["-t", "ext3", "-b", "1024"], "32M");
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    let fd = t
        .open("/d", scalevfs::O_TMPFILE | O_RDWR, 0o600)
        .expect("O_TMPFILE");
    let per = 256i64;
    t.pwrite(fd, &vec![5u8; 3000], (12 + per + 3) * 1024)
        .unwrap();
    t.fsync(fd).unwrap();
    // A second one kept open, the first closed (freed).
    let fd2 = t
        .open("/d", scalevfs::O_TMPFILE | O_RDWR, 0o600)
        .expect("O_TMPFILE");
    t.pwrite(fd2, &vec![6u8; 5000], 20 * 1024).unwrap();
    t.close(fd).unwrap();
    // Hard links of a block-mapped file with indirect blocks.
    let f = t.open("/d/f", O_CREAT | O_RDWR, 0o644).unwrap();
    t.pwrite(f, &vec![7u8; 100_000], 0).unwrap();
    t.close(f).unwrap();
    t.link("/d/f", "/g").unwrap();
    t.unlink("/d/f").unwrap();
    assert_eq!(t.stat("/g").unwrap().nlink, 1);
    t.close(fd2).unwrap();
    unmount_clean(t, vfs, e, &img);
}
