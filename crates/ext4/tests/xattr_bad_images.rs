//! Extended attributes of corrupt images: what the kernel's
//! `check_xattrs` / `ext4_xattr_check_block` / `ext4_inode_block_valid`
//! and e2fsck's `check_ext_attr` refuse, we refuse too.
//! - an entry naming a value inode on an image without `ea_inode`;
//! - values over each other, over the entry table or its end mark, past
//!   their area once padded; a NUL in a name;
//! - an `i_file_acl` naming filesystem metadata (the journal, an inode
//!   table, the reserved descriptor blocks, a bitmap) or a block past the
//!   end, even when the block there holds a well-formed xattr block.
//!
//! Each case: `getxattr` and `listxattr` of the bad inode are EUCLEAN,
//! the other files read as before, and after a `setxattr`, a
//! `removexattr` or an `unlink` of the bad inode (each on its own copy of
//! the image, mounted read-write with its journal, then unmounted) the
//! bytes the bad inode points at are as they were and its block still in
//! use (a block it names is never written for it, nor freed).

mod common;

use std::path::{Path, PathBuf};

use scalevfs::Errno;
use scalevfs_ext4::format::xattr::{entry_hash, set_block_csum};
use scalevfs_ext4::{Ext4, Ext4Options};

use common::*;

const BS: u64 = 1024;

/// `i_file_acl` of `p`.
fn file_acl(img: &Path, p: &str) -> u64 {
    num_after(&debugfs_ro(img, &format!("stat {p}")), "File ACL:")
}

/// Byte offset in the image of inode `spec`'s slot.
fn slot_of(img: &Path, spec: &str) -> u64 {
    let out = debugfs_ro(img, &format!("imap {spec}"));
    let blk = num_after(&out, "located at block");
    let off = out
        .split("offset 0x")
        .nth(1)
        .and_then(|r| u64::from_str_radix(r.split_whitespace().next()?, 16).ok())
        .unwrap_or_else(|| panic!("imap {spec}: {out}"));
    blk * BS + off
}

/// The physical block of block `l` of inode `spec`.
fn bmap(img: &Path, spec: &str, l: u64) -> u64 {
    let out = debugfs_ro(img, &format!("bmap {spec} {l}"));
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("bmap {spec} {l}: {out}"))
}

fn read_at(img: &Path, off: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; len];
    std::fs::File::open(img)
        .unwrap()
        .read_exact_at(&mut b, off)
        .unwrap();
    b
}

fn write_at(img: &Path, off: u64, b: &[u8]) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new()
        .write(true)
        .open(img)
        .unwrap()
        .write_all_at(b, off)
        .unwrap();
}

fn sh(img: &Path, req: &str) {
    assert!(debugfs(img, req), "debugfs {req}");
}

/// Write `b` as an xattr block at block `blk`, its checksum (metadata_csum)
/// made for that block number: it parses there as well as where it came
/// from.
fn put_xattr_block(img: &Path, blk: u64, mut b: Vec<u8>) {
    let e = Ext4::open(img, Ext4Options::default()).unwrap();
    let sb = e.superblock();
    if sb.has_metadata_csum() {
        set_block_csum(&mut b, blk, sb.csum_seed());
    }
    drop(e);
    write_at(img, blk * BS, &b);
}

/// The entries of an xattr table in `b` from `pos`: (offset of the entry,
/// its name).
fn table(b: &[u8], mut pos: usize) -> Vec<(usize, Vec<u8>)> {
    let mut out = Vec::new();
    while b[pos..pos + 4] != [0; 4] {
        let n = usize::from(b[pos]);
        out.push((pos, b[pos + 16..pos + 16 + n].to_vec()));
        pos += (16 + n + 3) & !3;
    }
    out
}

fn le16(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn le32(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
}

/// A scratch directory and an image: /f with user.a and user.b (200
/// bytes each, in its xattr block) and user.s (in its body), /g with
/// user.k (its block) and user.t (its body), /d with data.
struct Base {
    s: Scratch,
    img: PathBuf,
}

const A200: [u8; 200] = [b'A'; 200];
const G200: [u8; 200] = [b'G'; 200];
const DATA: &[u8] = b"the data of /d\n";

fn base(tag: &str, features: &str) -> Option<Base> {
    if !have_tools() {
        return None;
    }
    let s = Scratch::new(tag);
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "1024", "-O", features], "16M");
    let a = s.0.join("a");
    std::fs::write(&a, A200).unwrap();
    let g = s.0.join("g");
    std::fs::write(&g, G200).unwrap();
    let d = s.0.join("d");
    std::fs::write(&d, DATA).unwrap();
    let script = format!(
        "write /dev/null f\nwrite /dev/null g\nwrite {d} d\n\
         ea_set -f {a} f user.a\nea_set -f {a} f user.b\nea_set f user.s small\n\
         ea_set -f {g} g user.k\nea_set g user.t tiny\n",
        a = a.display(),
        g = g.display(),
        d = d.display()
    );
    let sf = s.0.join("script");
    std::fs::write(&sf, script).unwrap();
    let out = std::process::Command::new(tool("debugfs"))
        .args(["-w", "-f"])
        .arg(&sf)
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_ne!(file_acl(&img, "f"), 0, "/f has an xattr block");
    assert_ne!(file_acl(&img, "g"), 0, "/g has an xattr block");
    Some(Base { s, img })
}

/// The reads of a mounted image with a bad /f: `bad` (an attribute /f
/// has) and the list are EUCLEAN; /g's attributes and /d's data read.
fn reads(t: &scalevfs::Task, bad: &str) {
    assert_eq!(t.xattr_value("/f", bad, 0), Err(Errno::EUCLEAN), "{bad}");
    assert_eq!(t.xattr_names("/f", 0), Err(Errno::EUCLEAN));
    assert_eq!(t.xattr_value("/g", "user.k", 0).unwrap(), G200);
    assert_eq!(t.xattr_value("/g", "user.t", 0).unwrap(), b"tiny");
    let mut names = t.xattr_names("/g", 0).unwrap();
    names.sort();
    assert_eq!(names, [b"user.k".to_vec(), b"user.t".to_vec()]);
    let fd = t.open("/d", scalevfs::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 100];
    let n = t.read(fd, &mut buf).unwrap();
    t.close(fd).unwrap();
    assert_eq!(&buf[..n], DATA);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Set,
    Remove,
    Unlink,
}

/// The checks of the module doc on `img` (a bad /f whose attribute `bad`
/// exists): for each of `ops` on its own copy, the reads, the op (EUCLEAN
/// for the attribute calls; an unlink succeeds, the release of the inode
/// fails later), an unmount, and the byte ranges `keep` (offset, length)
/// as they were, the blocks `in_use` still in use in their bitmap.
fn writes_leave_alone(img: &Path, bad: &str, keep: &[(u64, usize)], in_use: &[u64], ops: &[Op]) {
    // Read-only first: the same answers.
    {
        let e = Ext4::open(img, Ext4Options::default()).unwrap();
        let vfs = scalevfs::Vfs::with_root_fs(Default::default(), e.clone());
        reads(&vfs.root_task(), bad);
    }
    let before: Vec<Vec<u8>> = keep.iter().map(|&(o, l)| read_at(img, o, l)).collect();
    for &op in ops {
        let copy = img.with_extension(format!("{op:?}"));
        std::fs::copy(img, &copy).unwrap();
        let (e, vfs) = mount(&copy);
        let t = vfs.root_task();
        reads(&t, bad);
        match op {
            Op::Set => assert_eq!(
                t.setxattr("/f", bad, b"new value", 0),
                Err(Errno::EUCLEAN),
                "setxattr"
            ),
            Op::Remove => assert_eq!(t.removexattr("/f", bad), Err(Errno::EUCLEAN), "remove"),
            Op::Unlink => {
                // The name goes; freeing the inode (at the latest at
                // unmount) is where its attributes are released.
                let _ = t.unlink("/f");
            }
        }
        drop(t);
        drop(vfs);
        let _ = e.unmount();
        drop(e);
        for (&(o, l), b) in keep.iter().zip(&before) {
            assert!(
                read_at(&copy, o, l) == *b,
                "{op:?}: the {l} bytes at {o} changed"
            );
        }
        for &blk in in_use {
            let st = debugfs_ro(&copy, &format!("testb {blk}"));
            assert!(st.contains("marked in use"), "{op:?}: block {blk}: {st}");
        }
        let _ = std::fs::remove_file(&copy);
    }
}

const ALL: &[Op] = &[Op::Set, Op::Remove, Op::Unlink];

/// /f's xattr block copied to `to` (a metadata block) and /f pointed at
/// the copy: a well-formed xattr block where none may be.
fn point_f_at_copy(img: &Path, to: u64) {
    let from = file_acl(img, "f");
    let b = read_at(img, from * BS, BS as usize);
    put_xattr_block(img, to, b);
    sh(img, &format!("sif f file_acl {to}"));
    assert_eq!(file_acl(img, "f"), to);
}

#[test]
fn an_xattr_block_in_the_journal_is_refused_and_never_written() {
    let Some(b) = base("xbad-journal", "metadata_csum") else {
        return;
    };
    // A block near the journal's end (our commits write its start).
    let jsize = num_after(&debugfs_ro(&b.img, "stat <8>"), "Size:");
    let j = bmap(&b.img, "<8>", jsize / BS - 2);
    point_f_at_copy(&b.img, j);
    writes_leave_alone(&b.img, "user.a", &[(j * BS, BS as usize)], &[j], ALL);
}

#[test]
fn an_xattr_block_in_an_inode_table_is_refused_and_never_written() {
    let Some(b) = base("xbad-itable", "metadata_csum") else {
        return;
    };
    // The table block of the last inode (unused), in group 1's table,
    // which flex_bg puts in group 0.
    let last = num_after(&sb_field_all(&b.img), "Inode count:");
    let t = slot_of(&b.img, &format!("<{last}>")) / BS;
    point_f_at_copy(&b.img, t);
    writes_leave_alone(&b.img, "user.a", &[(t * BS, BS as usize)], &[t], ALL);
}

#[test]
fn an_xattr_block_in_the_reserved_descriptors_is_refused_and_never_written() {
    let Some(b) = base("xbad-rgdt", "^metadata_csum") else {
        return;
    };
    let text = sb_field_all(&b.img);
    let r = num_after(&text, "Reserved GDT blocks at");
    assert!(r > 2, "{text}");
    point_f_at_copy(&b.img, r);
    writes_leave_alone(&b.img, "user.a", &[(r * BS, BS as usize)], &[r], ALL);
}

#[test]
fn an_xattr_block_in_the_resize_inodes_index_is_refused_and_never_written() {
    let Some(b) = base("xbad-resize", "^metadata_csum") else {
        return;
    };
    // The resize inode's double indirect block (i_block[13]).
    let st = debugfs_ro(&b.img, "stat <7>");
    let dind = st
        .split("(DIND):")
        .nth(1)
        .and_then(|r| {
            r.split(|c: char| !c.is_ascii_digit())
                .find(|x| !x.is_empty())
        })
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no DIND block:\n{st}"));
    point_f_at_copy(&b.img, dind);
    writes_leave_alone(&b.img, "user.a", &[(dind * BS, BS as usize)], &[dind], ALL);
}

/// Pointers whose block does not parse as an xattr block (a bitmap, an
/// inode table) or lies past the end: refused as before, and never
/// written either.
#[test]
fn xattr_pointers_to_metadata_that_does_not_parse_leave_it_alone() {
    let Some(b) = base("xbad-bitmap", "metadata_csum") else {
        return;
    };
    let text = sb_field_all(&b.img);
    let bitmap = num_after(&text, "Block bitmap at");
    let itable = num_after(&text, "Inode table at");
    let keep = [(bitmap * BS, BS as usize), (itable * BS, BS as usize)];
    for to in [bitmap, itable] {
        let img = b.s.0.join(format!("img{to}"));
        std::fs::copy(&b.img, &img).unwrap();
        sh(&img, &format!("sif f file_acl {to}"));
        writes_leave_alone(&img, "user.a", &keep, &[bitmap, itable], ALL);
    }
    let blocks = num_after(&text, "Block count:");
    sh(&b.img, &format!("sif f file_acl {}", blocks + 10));
    writes_leave_alone(&b.img, "user.a", &keep, &[bitmap, itable], ALL);
}

#[test]
fn a_value_inode_without_the_ea_inode_feature_is_corrupt() {
    let Some(b) = base("xbad-eainode", "ea_inode") else {
        return;
    };
    let big = b.s.0.join("big");
    std::fs::write(&big, [b'B'; 1000]).unwrap();
    sh(&b.img, &format!("ea_set -f {} f user.big", big.display()));
    let st = debugfs_ro(&b.img, "stat f");
    assert!(st.contains("user.big (1000)"), "{st}");
    // The value inode: the first after /f, /g and /d.
    let f = ino_of(&b.img, "f");
    let v = (f + 1..f + 8)
        .find(|i| debugfs_ro(&b.img, &format!("stat <{i}>")).contains("Flags: 0x280000"))
        .expect("a value inode");
    let slot = slot_of(&b.img, &format!("<{v}>"));
    let data = bmap(&b.img, &format!("<{v}>"), 0);
    // Readable while the image has the feature.
    {
        let e = Ext4::open(&b.img, Ext4Options::default()).unwrap();
        let vfs = scalevfs::Vfs::with_root_fs(Default::default(), e.clone());
        let t = vfs.root_task();
        assert_eq!(t.xattr_value("/f", "user.big", 0).unwrap(), [b'B'; 1000]);
    }
    sh(&b.img, "feature -ea_inode");
    assert!(!sb_field(&b.img, "Filesystem features").contains("ea_inode"));
    writes_leave_alone(
        &b.img,
        "user.big",
        &[(slot, 256), (data * BS, BS as usize)],
        &[data],
        ALL,
    );
}

/// A defect written into a block or an inode slot.
type Edit = Box<dyn Fn(&mut [u8])>;

/// Defects of /f's xattr block, made on a copy of `b`'s image by `edit`
/// (the block's bytes; its entries' hashes and checksum are made right
/// afterwards, so only the defect is wrong). Returns the image.
fn block_defect(b: &Base, tag: &str, edit: impl FnOnce(&mut [u8])) -> PathBuf {
    let img = b.s.0.join(tag);
    std::fs::copy(&b.img, &img).unwrap();
    let blk = file_acl(&img, "f");
    let mut x = read_at(&img, blk * BS, BS as usize);
    edit(&mut x);
    // Each entry's hash over its name and (whatever) value bytes now.
    for (pos, name) in table(&x, 32) {
        let (offs, size) = (le16(&x, pos + 2), le32(&x, pos + 8));
        let v = x[offs..(offs + size).min(BS as usize)].to_vec();
        let h = entry_hash(&name, &v, false);
        x[pos + 12..pos + 16].copy_from_slice(&h.to_le_bytes());
    }
    put_xattr_block(&img, blk, x);
    img
}

#[test]
fn xattr_block_values_out_of_place_are_corrupt() {
    let Some(b) = base("xbad-values", "metadata_csum") else {
        return;
    };
    let blk = file_acl(&b.img, "f");
    let keep = [(blk * BS, BS as usize)];
    // The table: user.a at 32, user.b at 52, the end mark at 72.
    let x = read_at(&b.img, blk * BS, BS as usize);
    let t = table(&x, 32);
    assert_eq!(
        t.iter().map(|(p, n)| (*p, n.clone())).collect::<Vec<_>>(),
        [(32, b"a".to_vec()), (52, b"b".to_vec())]
    );
    let cases: [(&str, Edit); 4] = [
        // user.b's value is user.a's (the same bytes: hashes hold).
        (
            "overlap",
            Box::new(|x: &mut [u8]| {
                let a = [x[34], x[35]];
                x[54..56].copy_from_slice(&a);
            }),
        ),
        // user.a's value starts at user.b's entry.
        (
            "over-table",
            Box::new(|x: &mut [u8]| x[34..36].copy_from_slice(&52u16.to_le_bytes())),
        ),
        // user.a: 199 bytes ending at the block's end, 200 once padded.
        (
            "padded-past-end",
            Box::new(|x: &mut [u8]| {
                x[34..36].copy_from_slice(&825u16.to_le_bytes());
                x[40..44].copy_from_slice(&199u32.to_le_bytes());
            }),
        ),
        // A NUL for user.b's name.
        ("nul-name", Box::new(|x: &mut [u8]| x[52 + 16] = 0)),
    ];
    for (tag, edit) in cases {
        let img = block_defect(&b, tag, |x| edit(x));
        // The whole block is refused, user.a (well-formed) with it.
        writes_leave_alone(&img, "user.a", &keep, &[blk], ALL);
    }
}

/// Defects of /f's in-inode attributes (user.x "abc" and user.y "abcd",
/// after user.s): written raw, the inode checksum made right after.
#[test]
fn in_inode_values_out_of_place_are_corrupt() {
    let Some(b) = base("xbad-ibody", "metadata_csum") else {
        return;
    };
    // /f's body: user.s from `base`, then user.x and user.y.
    sh(&b.img, "ea_set f user.x abc");
    sh(&b.img, "ea_set f user.y abcd");
    let slot = slot_of(&b.img, "f");
    let s = read_at(&b.img, slot, 256);
    let extra = le16(&s, 0x80);
    // The area: magic at `area`, entries (and offsets) from `area + 4`.
    let area = 128 + extra;
    assert_eq!(le32(&s, area), 0xEA02_0000);
    let first = area + 4;
    let t = table(&s, first);
    let names: Vec<&[u8]> = t.iter().map(|(_, n)| &n[..]).collect();
    assert_eq!(names, [&b"s"[..], b"x", b"y"], "debugfs's body order");
    let (x, y) = (t[1].0, t[2].0);
    let len = 256 - first;
    let cases: Vec<(&str, Edit)> = vec![
        // user.x's value in user.y's bytes.
        (
            "overlap",
            Box::new(move |s: &mut [u8]| {
                let yo = [s[y + 2], s[y + 3]];
                s[x + 2..x + 4].copy_from_slice(&yo);
            }),
        ),
        // user.x's value at the first entry.
        (
            "over-table",
            Box::new(move |s: &mut [u8]| s[x + 2..x + 4].copy_from_slice(&0u16.to_le_bytes())),
        ),
        // user.x ("abc", 3 bytes) ending at the area's end: 4 padded.
        (
            "padded-past-end",
            Box::new(move |s: &mut [u8]| {
                s[x + 2..x + 4].copy_from_slice(&((len - 3) as u16).to_le_bytes());
            }),
        ),
        // A NUL for user.x's name.
        ("nul-name", Box::new(move |s: &mut [u8]| s[x + 16] = 0)),
        // user.x larger than the area (refused before too).
        (
            "too-large",
            Box::new(move |s: &mut [u8]| s[x + 8..x + 12].copy_from_slice(&200u32.to_le_bytes())),
        ),
    ];
    for (tag, edit) in cases {
        let img = b.s.0.join(tag);
        std::fs::copy(&b.img, &img).unwrap();
        let mut s2 = s.clone();
        edit(&mut s2);
        write_at(&img, slot, &s2);
        // -n: debugfs reads the inode despite its stale checksum.
        let out = std::process::Command::new(tool("debugfs"))
            .args(["-w", "-n", "-R", "sif f checksum calc"])
            .arg(&img)
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Checksum set"),
            "{out:?}"
        );
        let fixed = read_at(&img, slot, 256);
        // An unlink frees the inode (its body names no value inode: the
        // kernel reads none there either): only the attribute calls.
        writes_leave_alone(&img, "user.x", &[(slot, 256)], &[], &[Op::Set, Op::Remove]);
        assert_eq!(read_at(&img, slot, 256), fixed);
    }
}

/// `dumpe2fs` (superblock and groups).
fn sb_field_all(img: &Path) -> String {
    let out = std::process::Command::new(tool("dumpe2fs"))
        .arg(img)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}
