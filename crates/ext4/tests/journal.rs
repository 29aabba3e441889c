//! jbd2 recovery against outside referees: images made by mkfs.ext4, logs
//! written by debugfs (`jo`/`jw`/`jc`) or by our own builders; a copy
//! replayed by `e2fsck -fy -E journal_only` and a copy replayed by scalevfs
//! must come out identical (the only allowed differences are named and
//! explained in `compare`), and `e2fsck -fn` must pass on ours.

mod common;
#[path = "support/journal_images.rs"]
mod journal_images;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::{mkfs, Scratch};
use journal_images::*;
use scalevfs_ext4::journal::{self, format as jf, Replay};
use scalevfs_ext4::{BlockDevice, Ext4, Ext4Options, FileDevice, MemDevice};

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

/// Panics on a difference between A and B outside the primary
/// superblock's allowed fields.
fn compare(a: &Path, b: &Path) {
    let bad = differences(a, b);
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

/// Set or clear needs_recovery in the image's superblock (checksum kept).
fn set_needs_recovery(img: &Path, on: bool) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut sb = vec![0u8; 1024];
    f.read_exact_at(&mut sb, 1024).unwrap();
    let mut inc = u32::from_le_bytes(sb[0x60..0x64].try_into().unwrap());
    if on {
        inc |= 4;
    } else {
        inc &= !4;
    }
    sb[0x60..0x64].copy_from_slice(&inc.to_le_bytes());
    let c = scalevfs_ext4::format::checksum::crc32c(!0, &sb[..0x3FC]);
    sb[0x3FC..].copy_from_slice(&c.to_le_bytes());
    f.write_all_at(&sb, 1024).unwrap();
}

/// debugfs `journal_open` variants: no checksums, csum v3, csum v2.
const OPENS: [&str; 3] = ["jo", "jo -c", "jo -c -v 2"];

#[test]
fn one_transaction_both_block_sizes() {
    if !tools() {
        return;
    }
    for bs in [1024, 4096] {
        for jo in OPENS {
            let img = make(bs, "j1");
            let f = pattern_file(&img.dir, "p", bs, 4, 1);
            debugfs_script(
                &img.path,
                &format!(
                    "{jo}\njw -b {} {}\njc\n",
                    list(&img.data_blocks[..4]),
                    f.display()
                ),
            );
            let r = referee(&img);
            assert_eq!(r.plan.writes.len(), 4);
            assert_eq!(r.plan.end_transaction - r.plan.start_transaction, 1);
            assert_eq!(r.journal.csum_v2or3(), jo.contains("-c"));
            assert_eq!(
                r.journal.has_incompat(jf::INCOMPAT_CSUM_V2),
                jo.contains("-v 2")
            );
        }
    }
}

/// Five committed transactions (revokes in two of them, a block logged
/// again after its revoke) and an uncommitted sixth that must not replay.
#[test]
fn many_transactions_revokes_and_an_uncommitted_tail() {
    if !tools() {
        return;
    }
    for bs in [1024, 4096] {
        for jo in OPENS {
            let img = make(bs, "jmany");
            let d = &img.data_blocks;
            let f: Vec<PathBuf> = (0..4)
                .map(|i| pattern_file(&img.dir, &format!("p{i}"), bs, 4, 10 + i as u8))
                .collect();
            let script = format!(
                "{jo}\n\
                 jw -b {} {}\n\
                 jw -b {},{} {}\n\
                 jw -r {} {}\n\
                 jw -b {},{} {}\n\
                 jw -r {} {}\n\
                 jw -b {} -c {}\n\
                 jc\n",
                list(&d[..4]),
                f[0].display(),
                d[2],
                d[4],
                f[1].display(),
                d[0],
                f[0].display(),
                d[0],
                d[5],
                f[2].display(),
                d[4],
                f[0].display(),
                d[6],
                f[3].display(),
            );
            debugfs_script(&img.path, &script);
            let r = referee(&img);
            let homes: Vec<u64> = r.plan.writes.keys().copied().collect();
            let mut want = vec![d[0], d[1], d[2], d[3], d[5]];
            want.sort_unstable();
            assert_eq!(homes, want, "bs {bs} {jo}");
            assert_eq!(r.plan.end_transaction - r.plan.start_transaction, 5);
            assert_eq!(r.plan.revoke_hits, 2, "d0 in T1 and d4 in T2");
            // The uncommitted block kept its old contents.
            let b = read_block(&img.path.with_file_name("b.img"), bs, d[6]);
            assert_eq!(b, read_block(&img.path, bs, d[6]));
        }
    }
}

/// A logged block that starts with the jbd2 magic is stored escaped and
/// must come home with its magic restored.
#[test]
fn escaped_block() {
    if !tools() {
        return;
    }
    for bs in [1024, 4096] {
        for jo in OPENS {
            let img = make(bs, "jesc");
            let f = img.dir.join("magic");
            let mut v = vec![0x5Au8; 2 * bs];
            v[..4].copy_from_slice(&jf::MAGIC.to_be_bytes());
            v[bs..bs + 4].copy_from_slice(&jf::MAGIC.to_be_bytes());
            v[bs + 4..bs + 12].copy_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1]);
            std::fs::write(&f, &v).unwrap();
            debugfs_script(
                &img.path,
                &format!(
                    "{jo}\njw -b {} {}\njc\n",
                    list(&img.data_blocks[8..10]),
                    f.display()
                ),
            );
            let r = referee(&img);
            assert!(
                r.plan.writes.values().all(|l| l.escape),
                "{:?}",
                r.plan.writes
            );
            let b = read_block(&img.path.with_file_name("b.img"), bs, img.data_blocks[9]);
            assert_eq!(b, v[bs..]);
        }
    }
}

/// The last committed transaction's commit block fails its checksum: the
/// log ends before it (and e2fsck marks the filesystem as having errors).
#[test]
fn corrupt_commit_ends_the_log() {
    if !tools() {
        return;
    }
    for bs in [1024, 4096] {
        let img = make(bs, "jtorn");
        let f = pattern_file(&img.dir, "p", bs, 4, 3);
        let d = &img.data_blocks;
        debugfs_script(
            &img.path,
            &format!(
                "jo -c\njw -b {} {}\njw -b {} {}\njc\n",
                list(&d[..2]),
                f.display(),
                list(&d[2..4]),
                f.display()
            ),
        );
        // Find the commit block of the second transaction and garble its checksum.
        let (js, jb) = journal_sb(&img);
        let mut found = false;
        for &p in &jb[1..js.maxlen as usize] {
            let mut b = read_block(&img.path, bs, p);
            if jf::header(&b) == Some((jf::COMMIT_BLOCK, js.sequence + 1)) {
                b[0x10] ^= 0xFF;
                write_block(&img.path, bs, p, &b);
                found = true;
                break;
            }
        }
        assert!(found, "no second commit block");
        let a = copy(&img.path, "a.img");
        let b = copy(&img.path, "b.img");
        e2fsck_replay(&a);
        let r = our_replay(&b);
        compare(&a, &b);
        assert_eq!(r.plan.failed_commit, Some(js.sequence + 1));
        let homes: Vec<u64> = r.plan.writes.keys().copied().collect();
        assert_eq!(homes, d[..2].to_vec());
    }
}

/// Write, with our builders, a log that wraps around the end of the
/// journal: T1 logs four blocks (one escaped) across the wrap, T2 revokes
/// one of them and logs a fifth; needs_recovery set. Returns the data T1
/// logged and the sequence of T1.
fn craft_wrapping_log(img: &Img, v3: bool) -> (Vec<Vec<u8>>, u32) {
    let bs = img.bs;
    let (mut js, jb) = journal_sb(img);
    if v3 {
        js.feature_incompat |= jf::INCOMPAT_CSUM_V3;
        js.checksum_type = jf::CHECKSUM_CRC32C;
    }
    let d = &img.data_blocks;
    let last = js.last();
    let seq = js.sequence.wrapping_add(41);
    let mut at = last - 2;
    let mut put = |b: &[u8]| {
        write_block(&img.path, bs, jb[at as usize], b);
        at = js.wrap_next(at);
    };
    let data: Vec<Vec<u8>> = (0..4)
        .map(|i| {
            let mut v = vec![0x30 + i as u8; bs];
            if i == 2 {
                v[..4].copy_from_slice(&jf::MAGIC.to_be_bytes());
            }
            v
        })
        .collect();
    let esc: Vec<(Vec<u8>, bool)> = data.iter().map(|v| jf::escape(v)).collect();
    let tags: Vec<(u64, &[u8], bool)> = (0..4)
        .map(|i| (d[20 + i], esc[i].0.as_slice(), esc[i].1))
        .collect();
    put(&jf::build_descriptor(&js, seq, &tags));
    for (v, _) in &esc {
        put(v);
    }
    put(&jf::build_commit(&js, seq, 1_700_000_000, 0));
    put(&jf::build_revoke(&js, seq + 1, &[d[21]]));
    let v = vec![0x77u8; bs];
    put(&jf::build_descriptor(&js, seq + 1, &[(d[24], &v, false)]));
    put(&v);
    put(&jf::build_commit(&js, seq + 1, 1_700_000_001, 0));
    js.start = last - 2;
    js.sequence = seq;
    if !v3 {
        // An aborted journal: recovery moves the error to the filesystem.
        js.errno = -5;
    }
    let mut b = read_block(&img.path, bs, jb[0]);
    b[..1024].copy_from_slice(&js.to_bytes());
    write_block(&img.path, bs, jb[0], &b);
    set_needs_recovery(&img.path, true);
    (data, seq)
}

/// Our log, wrapping around the end of the journal, with a revoke; csum v3
/// and none. e2fsck replays it the same way: this proves both the writer's
/// format and the wrap handling to the referee.
#[test]
fn our_log_wrapping_around_the_end() {
    if !tools() {
        return;
    }
    for bs in [1024, 4096] {
        for v3 in [true, false] {
            let img = make(bs, "jwrap");
            let (data, seq) = craft_wrapping_log(&img, v3);
            let d = &img.data_blocks;
            let r = referee(&img);
            let homes: Vec<u64> = r.plan.writes.keys().copied().collect();
            assert_eq!(homes, vec![d[20], d[22], d[23], d[24]]);
            assert_eq!(r.plan.revoke_hits, 1);
            assert_eq!(r.plan.next_sequence(), seq + 3);
            let b = read_block(&img.path.with_file_name("b.img"), bs, d[22]);
            assert_eq!(b, data[2], "escaped block restored");
            // The aborted journal's error went to s_state (as e2fsck puts it).
            let sb = std::fs::read(img.path.with_file_name("b.img")).unwrap();
            assert_eq!(sb[1024 + 0x3A] & 2 != 0, !v3, "EXT2_ERROR_FS");
        }
    }
}

/// One big transaction from `build_transaction` (several descriptor
/// blocks, a block that needs escaping) and a second one with several
/// revoke blocks: e2fsck replays them as we do.
#[test]
fn our_multi_block_transactions() {
    if !tools() {
        return;
    }
    for bs in [1024, 4096] {
        for v3 in [true, false] {
            let img = make(bs, "jbig");
            let (mut js, jb) = journal_sb(&img);
            if v3 {
                js.feature_incompat |= jf::INCOMPAT_CSUM_V3;
                js.checksum_type = jf::CHECKSUM_CRC32C;
            }
            let d = &img.data_blocks;
            let tpd = jf::tags_per_descriptor(&js);
            let n = (2 * tpd + 5).min(d.len());
            assert!(n > tpd + 1, "{n} blocks: want two descriptors at least");
            let data: Vec<Vec<u8>> = (0..n)
                .map(|i| {
                    let mut v = vec![(i % 200) as u8 + 1; bs];
                    if i % 17 == 0 {
                        v[..4].copy_from_slice(&jf::MAGIC.to_be_bytes());
                    }
                    v
                })
                .collect();
            let blocks: Vec<(u64, &[u8])> = (0..n).map(|i| (d[i], data[i].as_slice())).collect();
            let seq = js.sequence;
            let mut log = jf::build_transaction(&js, seq, &blocks, &[], 1_700_000_000);
            // T2 revokes every other block of T1 plus many that were never
            // logged: more records than one revoke block holds.
            let mut revokes: Vec<u64> = d[..n].iter().copied().step_by(2).collect();
            let extra = jf::revokes_per_block(&js) as u64 + 3;
            revokes.extend((0..extra).map(|i| 1_000_000 + i));
            let t2 = jf::build_transaction(&js, seq + 1, &[], &revokes, 1_700_000_001);
            assert!(t2.len() >= 3, "two revoke blocks and a commit");
            log.extend(t2);
            assert!(log.len() < (js.maxlen - js.first) as usize);
            for (i, b) in log.iter().enumerate() {
                write_block(&img.path, bs, jb[js.first as usize + i], b);
            }
            js.start = js.first;
            let mut b = read_block(&img.path, bs, jb[0]);
            b[..1024].copy_from_slice(&js.to_bytes());
            write_block(&img.path, bs, jb[0], &b);
            set_needs_recovery(&img.path, true);
            let r = referee(&img);
            assert_eq!(r.plan.writes.len(), n / 2);
            assert_eq!(r.plan.revoke_hits as usize, n.div_ceil(2));
            assert_eq!(r.plan.revokes as usize, revokes.len());
            let got = read_block(&img.path.with_file_name("b.img"), bs, d[17]);
            assert_eq!(got, data[17], "escaped block restored");
        }
    }
}

/// The host kernel replays our csum-v3 log at mount (a read-write loop
/// mount: a read-only one may not replay) and /data reads the same as
/// after our replay. Skipped where loop mounts are not possible.
#[test]
fn kernel_replays_our_log() {
    if !tools() {
        return;
    }
    for bs in [1024, 4096] {
        let img = make(bs, "jkern");
        craft_wrapping_log(&img, true);
        let b = copy(&img.path, "b.img");
        our_replay(&b);
        let ours = {
            let fs = Ext4::open(&b, Ext4Options::default()).unwrap();
            let root = fs.read_inode(2).unwrap();
            let ino = fs.lookup_name(&root, b"data").unwrap().unwrap();
            let raw = fs.read_inode(ino).unwrap();
            let mut out = Vec::new();
            for l in 0..64 {
                match fs.map_block(&raw, l).unwrap() {
                    scalevfs_ext4::Mapping::Data { pblk, .. } => {
                        out.extend(read_block(&b, bs, pblk))
                    }
                    m => panic!("{m:?}"),
                }
            }
            out
        };
        assert!(
            ours[20 * bs..21 * bs].iter().all(|&x| x == 0x30),
            "replayed"
        );
        assert_eq!(&ours[22 * bs..22 * bs + 4], &jf::MAGIC.to_be_bytes());
        let k = copy(&img.path, "k.img");
        let mnt = img.dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let out = Command::new("mount")
            .args(["-t", "ext4", "-o", "loop"])
            .arg(&k)
            .arg(&mnt)
            .output()
            .unwrap();
        if !out.status.success() {
            eprintln!(
                "SKIP: cannot loop-mount ext4 here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return;
        }
        let kernel = std::fs::read(mnt.join("data"));
        let _ = Command::new("umount").arg(&mnt).status();
        let kernel = kernel.unwrap();
        assert!(
            kernel[..64 * bs] == ours[..],
            "bs {bs}: the kernel's replay differs"
        );
        e2fsck_clean(&k).unwrap();
    }
}

/// Opening through `Ext4`: refused by default, replayed in memory without
/// writing the device, or on the device.
#[test]
fn open_refuses_or_replays() {
    if !tools() {
        return;
    }
    let img = make(1024, "jopen");
    let f = pattern_file(&img.dir, "p", 1024, 64, 9);
    debugfs_script(
        &img.path,
        &format!(
            "jo -c\njw -b {} {}\njc\n",
            list(&img.data_blocks[..64]),
            f.display()
        ),
    );
    let before = std::fs::read(&img.path).unwrap();
    let e = Ext4::open(&img.path, Ext4Options::default()).unwrap_err();
    assert!(e.to_string().contains("needs recovery"), "{e}");
    let want = std::fs::read(&f).unwrap();
    // /data as the filesystem shows it (through the VFS).
    let vfs_data = |e: Arc<Ext4>| {
        let fs: Arc<dyn scalevfs::Filesystem> = e;
        let vfs = scalevfs::Vfs::with_root_fs(scalevfs::VfsConfig::default(), fs);
        let data = scalevfs::fs::Fs::new(vfs.root_task())
            .read("/data")
            .unwrap();
        data[..64 * 1024].to_vec()
    };
    // On-device replay of a read-only device: refused, nothing written.
    let e = Ext4::open(
        &img.path,
        Ext4Options {
            replay: Replay::OnDevice,
            ..Ext4Options::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("cannot be written"), "{e}");
    assert!(std::fs::read(&img.path).unwrap() == before);
    let mem = Ext4::open_device(
        Box::new(FileDevice::open(&img.path, false).unwrap()),
        Ext4Options {
            replay: Replay::InMemory,
            ..Ext4Options::default()
        },
    )
    .unwrap();
    assert!(
        !mem.superblock().has_incompat(4),
        "needs_recovery cleared in the view"
    );
    assert!(vfs_data(mem) == want, "the view shows the replayed data");
    // The device is untouched.
    assert!(std::fs::read(&img.path).unwrap() == before);
    let dev = Ext4::open_device(
        Box::new(FileDevice::open(&img.path, true).unwrap()),
        Ext4Options {
            replay: Replay::OnDevice,
            ..Ext4Options::default()
        },
    )
    .unwrap();
    assert!(vfs_data(dev) == want, "replayed on the device");
    e2fsck_clean(&img.path).unwrap();
    // Clean now: a default open succeeds.
    Ext4::open(&img.path, Ext4Options::default()).unwrap();
}

/// Random byte mutations of the journal never panic or hang; a failed
/// recovery writes nothing; a successful one leaves needs_recovery clear.
#[test]
fn fuzz_journal_mutations() {
    if !tools() {
        return;
    }
    let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut outcomes = [0usize; 2];
    for (bs, jo) in [(1024, "jo -c"), (1024, "jo"), (4096, "jo -c")] {
        let img = make(bs, "jfuzz");
        let d = &img.data_blocks;
        let f = pattern_file(&img.dir, "p", bs, 4, 5);
        debugfs_script(
            &img.path,
            &format!(
                "{jo}\njw -b {} {}\njw -b {} -r {} {}\njw -r {} {}\njc\n",
                list(&d[..4]),
                f.display(),
                list(&d[4..6]),
                d[1],
                f.display(),
                d[4],
                f.display()
            ),
        );
        let base = std::fs::read(&img.path).unwrap();
        let (js, jb) = journal_sb(&img);
        // The blocks that hold the log (superblock included).
        let hot: Vec<u64> = jb[..(js.first as usize + 12).min(jb.len())].to_vec();
        for _ in 0..fuzz_cases(150) {
            let mut m = base.clone();
            for _ in 0..1 + next() % 8 {
                let blk = hot[(next() % hot.len() as u64) as usize];
                let off = blk as usize * bs
                    + (next() % 64) as usize
                    + if next() % 2 == 0 {
                        0
                    } else {
                        (next() % bs as u64) as usize
                    };
                m[off.min(blk as usize * bs + bs - 1)] ^= 1 << (next() % 8);
            }
            let mem = Arc::new(MemDevice::new(m.clone()));
            let dev: Arc<dyn BlockDevice> = mem.clone();
            match journal::recover(&dev) {
                Ok(_) => {
                    outcomes[0] += 1;
                    let fs = Ext4::open_device(
                        Box::new(MemDevice::new(snapshot(&*mem))),
                        Ext4Options::default(),
                    );
                    if let Err(e) = fs {
                        assert!(!e.to_string().contains("needs recovery"), "{e}");
                    }
                }
                Err(_) => {
                    outcomes[1] += 1;
                    assert!(
                        snapshot(&*mem) == m,
                        "a failed recovery wrote to the device"
                    );
                }
            }
        }
    }
    eprintln!("fuzz: {} recovered, {} refused", outcomes[0], outcomes[1]);
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
}

/// Cases per fuzz configuration: `EXT4_FUZZ_CASES` (as fuzz.rs) or `default`.
fn fuzz_cases(default: u64) -> u64 {
    std::env::var("EXT4_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Differential fuzz: where our recovery accepts a mutated journal, e2fsck
/// must replay it to the same image.
#[test]
fn mutations_agree_with_e2fsck() {
    if !tools() {
        return;
    }
    let mut rng: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut agreed, mut refused) = (0, 0);
    for jo in ["jo -c", "jo"] {
        let img = make(1024, "jdiff");
        let d = &img.data_blocks;
        let f = pattern_file(&img.dir, "p", 1024, 4, 5);
        debugfs_script(
            &img.path,
            &format!(
                "{jo}\njw -b {} {}\njw -b {} -r {} {}\njw -r {} {}\njc\n",
                list(&d[..4]),
                f.display(),
                list(&d[4..6]),
                d[1],
                f.display(),
                d[4],
                f.display()
            ),
        );
        let base = std::fs::read(&img.path).unwrap();
        let (js, jb) = journal_sb(&img);
        let hot: Vec<u64> = jb[..js.first as usize + 12].to_vec();
        let (a, b) = (img.dir.join("a.img"), img.dir.join("b.img"));
        for _ in 0..fuzz_cases(60) {
            let mut m = base.clone();
            let blk = hot[(next() % hot.len() as u64) as usize] as usize;
            // Headers, tags and the superblock's fields live in the first bytes.
            let off = blk * 1024 + (next() % 96) as usize;
            let bit = next() % 8;
            m[off] ^= 1 << bit;
            std::fs::write(&b, &m).unwrap();
            let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&b, true).unwrap());
            if journal::recover(&dev).is_err() {
                refused += 1;
                assert_eq!(std::fs::read(&b).unwrap(), m, "a refused recovery wrote");
                continue;
            }
            std::fs::write(&a, &m).unwrap();
            let said = e2fsck_replay(&a);
            let diff = differences(&a, &b);
            assert!(
                diff.is_empty(),
                "{jo}: bit {bit} of byte {:#x} of block {blk} flipped: we and e2fsck differ \
                 at {:#x?}; e2fsck said: {said}",
                off % 1024,
                &diff[..diff.len().min(8)]
            );
            agreed += 1;
        }
    }
    eprintln!("differential fuzz: {agreed} identical to e2fsck, {refused} refused");
    assert!(agreed > 0);
}

/// Recovery crashed at any point — after any flush, with any subset of the
/// writes in flight — recovers again to the same image.
#[test]
fn recovery_survives_crashes() {
    use scalevfs_ext4::crashdev::{CrashLog, RecordingDevice};
    if !tools() {
        return;
    }
    let mut states = 0;
    for bs in [1024, 4096] {
        let img = make(bs, "jcrash");
        let d = &img.data_blocks;
        let f = pattern_file(&img.dir, "p", bs, 8, 7);
        debugfs_script(
            &img.path,
            &format!(
                "jo -c\njw -b {} {}\njw -b {} -r {} {}\njc\n",
                list(&d[..8]),
                f.display(),
                list(&d[8..12]),
                d[3],
                f.display()
            ),
        );
        let base = std::fs::read(&img.path).unwrap();
        let rec = Arc::new(RecordingDevice::new(MemDevice::new(base.clone()), 1000));
        let dev: Arc<dyn BlockDevice> = rec.clone();
        journal::recover(&dev).unwrap();
        let want = snapshot(&*dev);
        let log = CrashLog {
            base,
            ops: rec.ops(),
        };
        assert_eq!(
            log.epochs().len(),
            4,
            "home blocks | journal sb | sb | nothing"
        );
        // Bytes of the superblock that hold the time of the write; and the
        // journal's s_sequence (with its checksum): a recovery of a journal
        // already marked empty still starts the next transaction one later,
        // as e2fsck's does.
        let jsb = journal_blocks(&img.path)[0] as usize * bs;
        let time_bytes = |i: usize| {
            (1024 + 0x30..1024 + 0x34).contains(&i)
                || i == 1024 + 0x274
                || (1024 + 0x3FC..2048).contains(&i)
                || (jsb + 0x18..jsb + 0x1C).contains(&i)
                || (jsb + 0xFC..jsb + 0x100).contains(&i)
        };
        states += log.states(16, bs as u64, &mut |s| {
            let mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(s.image.clone()));
            let needs = s.image[1024 + 0x60] & 4 != 0;
            if needs {
                journal::recover(&mem).unwrap();
            }
            let got = snapshot(&*mem);
            assert_eq!(&got[jsb + 0x1C..jsb + 0x20], &[0; 4], "s_start 0");
            let diff: Vec<usize> = (0..got.len())
                .filter(|&i| got[i] != want[i] && !time_bytes(i))
                .collect();
            assert!(
                diff.is_empty(),
                "crash state (flushed {}, in flight {:?}) recovers differently at {:?}",
                s.flushed_writes,
                s.in_flight,
                &diff[..diff.len().min(8)]
            );
            Ext4::open_device(Box::new(MemDevice::new(got)), Ext4Options::default()).unwrap();
            true
        });
    }
    eprintln!("recovery crash test: {states} crash states, each recovered to the same image");
    assert!(states > 40);
}

/// A copy of a mounted image and the files of `/d` the kernel showed then.
type Snapshot = (PathBuf, Vec<(String, Vec<u8>)>);

/// `e2fsck -fn`'s report, without the image's name.
fn e2fsck_report(img: &Path) -> String {
    let out = Command::new(tool("e2fsck"))
        .arg("-fn")
        .arg(img)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).replace(img.to_str().unwrap(), "IMG")
}

/// Journals the kernel wrote: an image loop-mounted read-write, a workload,
/// `sync` (the transactions commit to the journal, not yet checkpointed),
/// and a copy of the image taken while still mounted — an image that needs
/// recovery, as after a crash. e2fsck and we replay each snapshot to the
/// same bytes, e2fsck -fn says the same of both (the kernel's free counts
/// and orphan_present live in memory until unmount, so it is not clean), and
/// the tree read through our Ext4 is the one the kernel showed.
#[test]
fn kernel_journal_snapshots() {
    if !tools() {
        return;
    }
    for bs in [4096, 1024] {
        let s = Scratch::new("jksnap");
        let img = s.0.join("k.img");
        let out = Command::new(mkfs().unwrap())
            .args(["-q", "-F", "-b", &bs.to_string(), "-O", "orphan_file"])
            .arg(&img)
            .arg("64M")
            .output()
            .unwrap();
        assert!(out.status.success());
        let mnt = s.0.join("m");
        std::fs::create_dir(&mnt).unwrap();
        let out = Command::new("mount")
            .args(["-t", "ext4", "-o", "loop"])
            .arg(&img)
            .arg(&mnt)
            .output()
            .unwrap();
        if !out.status.success() {
            eprintln!(
                "SKIP: cannot loop-mount ext4 here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return;
        }
        // (snapshot, files and their contents as the kernel shows them)
        let mut snaps: Vec<Snapshot> = Vec::new();
        let step = |n: usize, snaps: &mut Vec<Snapshot>| {
            let st = Command::new("sync").arg("-f").arg(&mnt).status().unwrap();
            assert!(st.success());
            let p = s.0.join(format!("snap{n}.img"));
            std::fs::copy(&img, &p).unwrap();
            let mut files = Vec::new();
            for e in std::fs::read_dir(mnt.join("d")).unwrap() {
                let e = e.unwrap();
                let name = e.file_name().into_string().unwrap();
                files.push((name, std::fs::read(e.path()).unwrap()));
            }
            files.sort();
            snaps.push((p, files));
        };
        let run = || -> Result<(), std::io::Error> {
            std::fs::create_dir(mnt.join("d"))?;
            for i in 0..40 {
                std::fs::write(
                    mnt.join(format!("d/f{i}")),
                    format!("file {i}\n").repeat(i * 50),
                )?;
            }
            Ok(())
        };
        let r = run();
        step(0, &mut snaps);
        let r2 = (|| -> Result<(), std::io::Error> {
            for i in (0..40).step_by(3) {
                std::fs::remove_file(mnt.join(format!("d/f{i}")))?;
            }
            std::fs::rename(mnt.join("d/f1"), mnt.join("d/renamed"))?;
            std::fs::write(mnt.join("d/f2"), vec![0xAB; 3 * bs + 17])?;
            Ok(())
        })();
        step(1, &mut snaps);
        // A big directory (many blocks, an htree) removed again: freeing
        // its metadata blocks makes the kernel log revoke records.
        let r3 = (|| -> Result<(), std::io::Error> {
            std::fs::create_dir(mnt.join("big"))?;
            for i in 0..600 {
                std::fs::write(mnt.join(format!("big/entry-with-a-long-name-{i:04}")), b"x")?;
            }
            Ok(())
        })();
        step(2, &mut snaps);
        let r4 = std::fs::remove_dir_all(mnt.join("big"));
        step(3, &mut snaps);
        let _ = Command::new("umount").arg(&mnt).status();
        r.unwrap();
        r2.unwrap();
        r3.unwrap();
        r4.unwrap();
        let mut revokes = 0;
        let mut sb_logged = false;
        for (snap, files) in &snaps {
            let mut sb = vec![0u8; 1024];
            {
                use std::os::unix::fs::FileExt;
                std::fs::File::open(snap)
                    .unwrap()
                    .read_exact_at(&mut sb, 1024)
                    .unwrap();
            }
            assert!(sb[0x60] & 4 != 0, "the snapshot needs recovery");
            let a = copy(snap, "a.img");
            let b = copy(snap, "b.img");
            e2fsck_replay(&a);
            let rec = our_replay(&b);
            revokes += rec.plan.revokes;
            assert!(rec.plan.writes.len() > 3, "{:?}", rec.plan);
            assert!(rec.journal.has_incompat(jf::INCOMPAT_CSUM_V3));
            compare(&a, &b);
            assert_eq!(e2fsck_report(&a), e2fsck_report(&b));
            // The superblock's block is among the logged ones (the kernel
            // journals it): the replay writes it with needs_recovery clear.
            sb_logged |= rec.plan.writes.contains_key(&(1024 / bs as u64));
            let read_d = |e: Arc<Ext4>| {
                let fs: Arc<dyn scalevfs::Filesystem> = e;
                let vfs = scalevfs::Vfs::with_root_fs(scalevfs::VfsConfig::default(), fs);
                let f = scalevfs::fs::Fs::new(vfs.root_task());
                let mut got = Vec::new();
                for e in f.read_dir("/d").unwrap() {
                    let name = e.unwrap().file_name().into_string().unwrap();
                    let data = f.read(format!("/d/{name}")).unwrap();
                    got.push((name, data));
                }
                got.sort();
                got
            };
            let ours = read_d(Ext4::open(&b, Ext4Options::default()).unwrap());
            assert!(ours == *files, "bs {bs} {}: tree differs", snap.display());
            // The same through the in-memory view of the untouched snapshot.
            let view = Ext4::open(
                snap,
                Ext4Options {
                    replay: Replay::InMemory,
                    ..Ext4Options::default()
                },
            )
            .unwrap();
            assert!(read_d(view) == *files, "bs {bs}: in-memory view differs");
        }
        assert!(revokes > 0, "bs {bs}: the kernel logged no revoke records");
        assert!(sb_logged, "bs {bs}: the kernel never logged the superblock");
    }
}

/// A deterministic workload for the log writer: transaction t logs
/// `1..=max` distinct blocks among `homes`, each filled from (t, block).
fn writer_workload(
    homes: &[u64],
    bs: usize,
    n: usize,
    max: usize,
    seed: u64,
) -> Vec<Vec<(u64, Vec<u8>)>> {
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    (0..n)
        .map(|t| {
            let k = 1 + (next() % max as u64) as usize;
            let mut picked: Vec<u64> = (0..k)
                .map(|_| homes[(next() % homes.len() as u64) as usize])
                .collect();
            picked.sort_unstable();
            picked.dedup();
            picked
                .into_iter()
                .map(|h| {
                    let mut v: Vec<u8> = (0..bs)
                        .map(|i| (t as u8) ^ (h as u8) ^ (i as u8).wrapping_mul(7))
                        .collect();
                    if (t + h as usize).is_multiple_of(11) {
                        v[..4].copy_from_slice(&jf::MAGIC.to_be_bytes());
                    }
                    (h, v)
                })
                .collect()
        })
        .collect()
}

/// The contents of each home block after the first `k` transactions.
fn model(
    base: &[u8],
    bs: usize,
    txs: &[Vec<(u64, Vec<u8>)>],
    k: usize,
) -> std::collections::BTreeMap<u64, Vec<u8>> {
    let mut m = std::collections::BTreeMap::new();
    for t in txs {
        for (h, _) in t {
            m.insert(*h, base[*h as usize * bs..(*h as usize + 1) * bs].to_vec());
        }
    }
    for t in &txs[..k] {
        for (h, v) in t {
            m.insert(*h, v.clone());
        }
    }
    m
}

fn matches_model(img: &[u8], bs: usize, m: &std::collections::BTreeMap<u64, Vec<u8>>) -> bool {
    m.iter()
        .all(|(h, v)| &img[*h as usize * bs..(*h as usize + 1) * bs] == v.as_slice())
}

/// Our log writer: many transactions through a small log (wrapping and
/// checkpointing), csum v3 and none; a "crash" after the last commit is
/// replayed by e2fsck exactly as by us, with every transaction in; a clean
/// close leaves a clean image with the same contents.
#[test]
fn writer_log_replays_like_e2fsck() {
    use scalevfs_ext4::journal::writer::LogWriter;
    if !tools() {
        return;
    }
    for bs in [1024, 4096] {
        for v3 in [true, false] {
            let img = make(bs, "jwriter");
            let base = std::fs::read(&img.path).unwrap();
            let (js, _) = journal_sb(&img);
            // Enough blocks to go round the log about three times.
            let max = 40;
            let n = 3 * js.log_len() as usize / (max / 2 + 2);
            let txs = writer_workload(&img.data_blocks, bs, n, max, bs as u64 + u64::from(v3));
            let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&img.path, true).unwrap());
            let mut w = LogWriter::open(dev.clone(), v3).unwrap();
            // Every 5th transaction also revokes a block of the one before
            // (not logged again by itself): its contents stop mattering
            // until a later transaction logs it again.
            let mut revoked = std::collections::BTreeSet::new();
            for (t, tx) in txs.iter().enumerate() {
                let blocks: Vec<(u64, &[u8])> =
                    tx.iter().map(|(h, v)| (*h, v.as_slice())).collect();
                let mut rv = Vec::new();
                if t % 5 == 4 {
                    if let Some((h, _)) = txs[t - 1]
                        .iter()
                        .find(|(h, _)| !tx.iter().any(|(x, _)| x == h))
                    {
                        rv.push(*h);
                    }
                }
                for (h, _) in tx {
                    revoked.remove(h);
                }
                revoked.extend(rv.iter().copied());
                w.commit(&blocks, &rv, 1_700_000_000 + t as u64).unwrap();
            }
            drop(w); // a crash: no checkpoint of the last transactions
            drop(dev); // and the image's claim (its flock) with it
            let r = referee(&img);
            assert!(r.journal.start != 0 && !r.plan.writes.is_empty());
            assert!(r.plan.revokes > 0 || revoked.is_empty());
            let b = std::fs::read(img.path.with_file_name("b.img")).unwrap();
            let mut m = model(&base, bs, &txs, n);
            m.retain(|h, _| !revoked.contains(h));
            assert!(matches_model(&b, bs, &m), "bs {bs} v3 {v3}");
            // The same workload closed cleanly.
            std::fs::write(&img.path, &base).unwrap();
            let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&img.path, true).unwrap());
            let mut w = LogWriter::open(dev, v3).unwrap();
            for tx in &txs {
                let blocks: Vec<(u64, &[u8])> =
                    tx.iter().map(|(h, v)| (*h, v.as_slice())).collect();
                w.commit(&blocks, &[], 1_700_000_000).unwrap();
            }
            w.close().unwrap();
            let c = std::fs::read(&img.path).unwrap();
            assert_eq!(c[1024 + 0x60] & 4, 0, "clean after close");
            assert!(matches_model(&c, bs, &model(&base, bs, &txs, n)));
            e2fsck_clean(&img.path).unwrap();
        }
    }
}

/// Crash states of the log writer (every flush prefix plus random subsets
/// of the writes in flight): each recovers to the state after k
/// transactions, where k is at least the number whose commit was flushed
/// and at most one more; every 8th state e2fsck's replay is the same.
#[test]
fn writer_crash_states() {
    use scalevfs_ext4::crashdev::{CrashLog, RecordingDevice};
    use scalevfs_ext4::journal::writer::LogWriter;
    if !tools() {
        return;
    }
    let mut total = 0;
    for (bs, v3) in [(1024, true), (1024, false)] {
        let img = make(bs, "jwcrash");
        let base = std::fs::read(&img.path).unwrap();
        let (js, _) = journal_sb(&img);
        let max = js.log_len() as usize / 3;
        let txs = writer_workload(&img.data_blocks, bs, 8, max, 99 + u64::from(v3));
        let rec = Arc::new(RecordingDevice::new(MemDevice::new(base.clone()), 100_000));
        let dev: Arc<dyn BlockDevice> = rec.clone();
        let mut w = LogWriter::open(dev, v3).unwrap();
        // Writes recorded when each commit returned (its commit block is
        // the last write before its final flush).
        let mut committed_at = Vec::new();
        for tx in &txs {
            let blocks: Vec<(u64, &[u8])> = tx.iter().map(|(h, v)| (*h, v.as_slice())).collect();
            w.commit(&blocks, &[], 1_700_000_000).unwrap();
            let writes = rec
                .ops()
                .iter()
                .filter(|o| matches!(o, scalevfs_ext4::crashdev::Op::Write { .. }))
                .count();
            committed_at.push(writes);
        }
        drop(w);
        let log = CrashLog {
            base: base.clone(),
            ops: rec.ops(),
        };
        let models: Vec<_> = (0..=txs.len()).map(|k| model(&base, bs, &txs, k)).collect();
        let (a, bimg) = (img.dir.join("a.img"), img.dir.join("b.img"));
        let mut i = 0usize;
        total += log.states(6, 5 + bs as u64, &mut |s| {
            i += 1;
            let durable = committed_at.iter().filter(|&&c| c <= s.flushed_writes).count();
            let mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(s.image.clone()));
            if s.image[1024 + 0x60] & 4 != 0 {
                journal::recover(&mem).unwrap_or_else(|e| panic!("state {i}: {e}"));
            }
            let got = snapshot(&*mem);
            let k = (durable..=(durable + 1).min(txs.len()))
                .find(|&k| matches_model(&got, bs, &models[k]));
            assert!(
                k.is_some(),
                "state {i} (flushed {}, in flight {:?}): not the state after {durable} or {} transactions",
                s.flushed_writes,
                s.in_flight,
                durable + 1
            );
            if i.is_multiple_of(8) {
                std::fs::write(&a, &s.image).unwrap();
                std::fs::write(&bimg, &got).unwrap();
                if s.image[1024 + 0x60] & 4 != 0 {
                    e2fsck_replay(&a);
                    compare(&a, &bimg);
                }
            }
            true
        });
    }
    eprintln!("log writer crash test: {total} crash states, each recovered to a committed prefix");
    assert!(total > 100);
}

/// The host kernel replays what our log writer left after a crash (wrapped
/// log, checkpoints, csum v3): /data reads as the model says.
#[test]
fn kernel_replays_our_writer_log() {
    use scalevfs_ext4::journal::writer::LogWriter;
    if !tools() {
        return;
    }
    for bs in [1024, 4096] {
        let img = make(bs, "jwkern");
        let base = std::fs::read(&img.path).unwrap();
        let (js, _) = journal_sb(&img);
        let n = 3 * js.log_len() as usize / 22;
        let txs = writer_workload(&img.data_blocks, bs, n, 40, 7);
        let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&img.path, true).unwrap());
        let mut w = LogWriter::open(dev, true).unwrap();
        for tx in &txs {
            let blocks: Vec<(u64, &[u8])> = tx.iter().map(|(h, v)| (*h, v.as_slice())).collect();
            w.commit(&blocks, &[], 1_700_000_000).unwrap();
        }
        drop(w);
        let m = model(&base, bs, &txs, n);
        let mnt = img.dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let out = Command::new("mount")
            .args(["-t", "ext4", "-o", "loop"])
            .arg(&img.path)
            .arg(&mnt)
            .output()
            .unwrap();
        if !out.status.success() {
            eprintln!(
                "SKIP: cannot loop-mount ext4 here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return;
        }
        let data = std::fs::read(mnt.join("data"));
        let _ = Command::new("umount").arg(&mnt).status();
        let data = data.unwrap();
        for (i, h) in img.data_blocks.iter().enumerate() {
            if let Some(v) = m.get(h) {
                assert!(
                    &data[i * bs..(i + 1) * bs] == v.as_slice(),
                    "bs {bs}: block {h}"
                );
            }
        }
        e2fsck_clean(&img.path).unwrap();
    }
}

/// Write `log` (blocks in order) from the first log block, point the
/// journal superblock `js` at it and set needs_recovery.
fn install_log(img: &Img, js: &mut jf::JournalSuperblock, jb: &[u64], log: &[Vec<u8>]) {
    assert!(log.len() < js.log_len() as usize);
    for (i, b) in log.iter().enumerate() {
        write_block(&img.path, img.bs, jb[js.first as usize + i], b);
    }
    js.start = js.first;
    let mut b = read_block(&img.path, img.bs, jb[0]);
    b[..1024].copy_from_slice(&js.to_bytes());
    write_block(&img.path, img.bs, jb[0], &b);
    set_needs_recovery(&img.path, true);
}

/// Checksum v1 (COMPAT_CHECKSUM, one crc32_be per transaction in its
/// commit block), with and without async_commit: a transaction whose data
/// was damaged after the checksum ends the log, as e2fsck decides too.
#[test]
fn checksum_v1_transactions() {
    if !tools() {
        return;
    }
    for bs in [1024, 4096] {
        for async_commit in [false, true] {
            let img = make(bs, "jv1");
            let (mut js, jb) = journal_sb(&img);
            js.feature_compat |= jf::COMPAT_CHECKSUM;
            js.feature_incompat &= !(jf::INCOMPAT_CSUM_V2 | jf::INCOMPAT_CSUM_V3);
            if async_commit {
                js.feature_incompat |= jf::INCOMPAT_ASYNC_COMMIT;
            }
            let d = &img.data_blocks;
            let seq = js.sequence;
            let data: Vec<Vec<u8>> = (0..9).map(|i| vec![0x40 + i as u8; bs]).collect();
            let tx = |t: u32, k: usize| -> Vec<Vec<u8>> {
                let blocks: Vec<(u64, &[u8])> = (0..3)
                    .map(|i| (d[30 + 3 * k + i], data[3 * k + i].as_slice()))
                    .collect();
                jf::build_transaction(&js, t, &blocks, &[], 1_700_000_000 + u64::from(t))
            };
            let mut log = tx(seq, 0);
            let mut t2 = tx(seq + 1, 1);
            t2[2][7] ^= 1; // a data block damaged after its checksum
            log.extend(t2);
            log.extend(tx(seq + 2, 2));
            install_log(&img, &mut js, &jb, &log);
            let r = referee_allow_errors(&img);
            assert_eq!(r.plan.end_transaction, seq + 1, "async {async_commit}");
            assert_eq!(r.plan.failed_commit, Some(seq + 1));
            let homes: Vec<u64> = r.plan.writes.keys().copied().collect();
            assert_eq!(homes, d[30..33].to_vec());
        }
    }
}

/// As `referee`, for images e2fsck leaves marked with errors (a corrupt
/// commit): the same bytes, and the same `e2fsck -fn` report.
fn referee_allow_errors(img: &Img) -> journal::Recovered {
    let a = copy(&img.path, "a.img");
    let b = copy(&img.path, "b.img");
    e2fsck_replay(&a);
    let r = our_replay(&b);
    compare(&a, &b);
    assert_eq!(e2fsck_report(&a), e2fsck_report(&b));
    r
}
