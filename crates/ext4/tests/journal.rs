//! jbd2 recovery against outside referees: images made by mkfs.ext4, logs
//! written by debugfs (`jo`/`jw`/`jc`) or by our own builders; a copy
//! replayed by `e2fsck -fy -E journal_only` and a copy replayed by scalevfs
//! must come out identical (the only allowed differences are named and
//! explained in `compare`), and `e2fsck -fn` must pass on ours.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::{mkfs, Scratch};
use scalevfs_ext4::journal::{self, format as jf, Replay};
use scalevfs_ext4::{BlockDevice, Ext4, Ext4Options, FileDevice, MemDevice};

fn tool(name: &str) -> PathBuf {
    mkfs().unwrap().with_file_name(name)
}

fn tools() -> bool {
    let ok = mkfs().is_some() && tool("debugfs").exists() && tool("e2fsck").exists();
    if !ok {
        eprintln!("SKIP: e2fsprogs (mkfs.ext4, debugfs, e2fsck) not found");
    }
    ok
}

/// An image with a 64-block file `/data`, and where its blocks are.
struct Img {
    _dir: Scratch,
    dir: PathBuf,
    path: PathBuf,
    bs: usize,
    data_blocks: Vec<u64>,
}

fn make(bs: usize, tag: &str) -> Img {
    let dir = Scratch::new(tag);
    let src = dir.0.join("src");
    std::fs::create_dir(&src).unwrap();
    let pat: Vec<u8> = (0..64 * bs).map(|i| (i % 251) as u8).collect();
    std::fs::write(src.join("data"), &pat).unwrap();
    std::fs::write(src.join("small"), b"small file\n").unwrap();
    let path = dir.0.join("img");
    let size = if bs == 1024 { "8M" } else { "32M" };
    let out = Command::new(mkfs().unwrap())
        .args(["-q", "-F", "-b", &bs.to_string(), "-O", "orphan_file", "-d"])
        .arg(&src)
        .arg(&path)
        .arg(size)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(tool("debugfs"))
        .args(["-R", "blocks /data"])
        .arg(&path)
        .output()
        .unwrap();
    let data_blocks: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(data_blocks.len(), 64, "blocks of /data");
    Img {
        dir: dir.0.clone(),
        _dir: dir,
        path,
        bs,
        data_blocks,
    }
}

/// Run a debugfs -w script (one request a line) on `img`.
fn debugfs_script(img: &Path, script: &str) {
    let f = img.with_extension("cmds");
    std::fs::write(&f, script).unwrap();
    let out = Command::new(tool("debugfs"))
        .arg("-w")
        .arg("-f")
        .arg(&f)
        .arg(img)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "debugfs: {err}");
    // debugfs reports request errors on stderr but exits 0.
    for l in err.lines() {
        assert!(
            !l.contains("rror") && !l.contains("nvalid"),
            "debugfs: {err}"
        );
    }
}

fn copy(img: &Path, name: &str) -> PathBuf {
    let p = img.with_file_name(name);
    std::fs::copy(img, &p).unwrap();
    p
}

/// Let e2fsck replay the journal only (no -f: with it e2fsck 1.47 goes on
/// to a full check, which could repair more than the journal).
fn e2fsck_replay(img: &Path) -> String {
    let out = Command::new(tool("e2fsck"))
        .args(["-y", "-E", "journal_only"])
        .arg(img)
        .output()
        .unwrap();
    let s = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        matches!(out.status.code(), Some(0..=2)),
        "e2fsck -E journal_only: {s}"
    );
    s
}

/// `e2fsck -fn` finds nothing.
fn e2fsck_clean(img: &Path) -> Result<(), String> {
    let out = Command::new(tool("e2fsck"))
        .arg("-fn")
        .arg(img)
        .output()
        .unwrap();
    if out.status.code() == Some(0) {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Replay with scalevfs, on the device.
fn our_replay(img: &Path) -> journal::Recovered {
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(img, true).unwrap());
    journal::recover(&dev).unwrap()
}

/// Superblock fields that may differ: s_wtime and s_wtime_hi (both set
/// the time of the write, a second apart or not), s_kbytes_written
/// (e2fsck adds what its own I/O wrote; we leave it) and the checksum
/// over them.
const SB_ALLOWED: &[(usize, usize)] = &[(0x30, 4), (0x274, 1), (0x178, 8), (0x3FC, 4)];

/// The byte ranges where A and B differ, as (offset, len); panics on a
/// difference outside the primary superblock's allowed fields.
fn compare(a: &Path, b: &Path) {
    let a = std::fs::read(a).unwrap();
    let b = std::fs::read(b).unwrap();
    assert_eq!(a.len(), b.len());
    let mut bad = Vec::new();
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        if x != y {
            let ok = i >= 1024
                && i < 2048
                && SB_ALLOWED
                    .iter()
                    .any(|&(o, l)| (1024 + o..1024 + o + l).contains(&i));
            if !ok {
                bad.push(i);
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} bytes differ, first at {:#x?}",
        bad.len(),
        &bad[..bad.len().min(16)]
    );
}

/// Write `n` blocks of pattern `seed` to a file for `jw -b`.
fn pattern_file(dir: &Path, name: &str, bs: usize, n: usize, seed: u8) -> PathBuf {
    let p = dir.join(name);
    let v: Vec<u8> = (0..n * bs)
        .map(|i| seed ^ (i / bs) as u8 ^ (i as u8).rotate_left(3))
        .collect();
    std::fs::write(&p, v).unwrap();
    p
}

fn list(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// Replay `img` both ways, compare, check ours with e2fsck -fn.
fn referee(img: &Img) -> journal::Recovered {
    let a = copy(&img.path, "a.img");
    let b = copy(&img.path, "b.img");
    let log = e2fsck_replay(&a);
    let r = our_replay(&b);
    compare(&a, &b);
    e2fsck_clean(&b).unwrap_or_else(|e| {
        panic!("e2fsck -fn after our replay: {e}\n(e2fsck replay said: {log})")
    });
    r
}

#[test]
fn one_transaction_both_block_sizes() {
    if !tools() {
        return;
    }
    for bs in [1024, 4096] {
        let img = make(bs, "j1");
        let f = pattern_file(&img.dir, "p", bs, 4, 1);
        debugfs_script(
            &img.path,
            &format!(
                "jo\njw -b {} {}\njc\n",
                list(&img.data_blocks[..4]),
                f.display()
            ),
        );
        let r = referee(&img);
        assert_eq!(r.plan.writes.len(), 4);
        assert_eq!(r.plan.end_transaction - r.plan.start_transaction, 1);
    }
}
