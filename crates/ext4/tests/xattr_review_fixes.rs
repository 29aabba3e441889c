//! Fixes from a review of the xattr write path (stop 37):
//! - a block changed in place is ours alone at the moment of the change:
//!   whether it is was read earlier, and another file with the same
//!   attributes could join it in between (its attribute then changed
//!   under it, and the block's count was lost);
//! - storing an attribute sets `ext_attr` in the superblock when the image
//!   lacks it, as the kernel does (e2fsck clears attributes otherwise);
//! - a value inode whose own attributes name value inodes (a crafted
//!   image) is corruption, not a chain freed one stack frame set per link.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::*;

/// An empty regular file at `p`.
fn touch(t: &scalevfs::Task, p: &str) {
    let fd = t
        .open(p, scalevfs::O_CREAT | scalevfs::O_WRONLY, 0o644)
        .unwrap();
    t.close(fd).unwrap();
}

fn uniq(i: usize) -> Vec<u8> {
    let mut v = vec![b'u'; 300];
    v[..8].copy_from_slice(&(i as u64).to_le_bytes());
    v
}

/// One thread changes /a's attribute in place (V and a value of its own,
/// in turn) while three others give their files V, which shares /a's
/// block whenever it holds V, check it, and remove it.
#[test]
fn a_block_changed_in_place_is_never_one_another_file_just_joined() {
    let iters: usize = 4000;
    let Some((_s, img, e, vfs)) = mount_fresh("xattr-inplace-race", "64M") else {
        return;
    };
    let t0 = vfs.root_task();
    touch(&t0, "/a");
    for k in 0..3 {
        touch(&t0, &format!("/b{k}"));
    }
    let v = vec![b'v'; 300];
    let stop = AtomicBool::new(false);
    let bad = AtomicUsize::new(0);
    let errs = AtomicUsize::new(0);
    let first: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    std::thread::scope(|sc| {
        {
            let t = t0.clone_thread();
            let (v, stop, errs, first) = (&v, &stop, &errs, &first);
            sc.spawn(move || {
                for i in 0..iters {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let val = if i % 2 == 0 { v.clone() } else { uniq(i) };
                    if let Err(e) = t.setxattr("/a", "user.big", &val, 0) {
                        errs.fetch_add(1, Ordering::Relaxed);
                        first
                            .lock()
                            .unwrap()
                            .get_or_insert(format!("owner set: {e:?}"));
                        stop.store(true, Ordering::Relaxed);
                        break;
                    }
                }
                stop.store(true, Ordering::Relaxed);
            });
        }
        for k in 0..3 {
            let t = t0.clone_thread();
            let (v, stop, bad, errs, first) = (&v, &stop, &bad, &errs, &first);
            sc.spawn(move || {
                let p = format!("/b{k}");
                while !stop.load(Ordering::Relaxed) {
                    if let Err(e) = t.setxattr(p.as_str(), "user.big", v, 0) {
                        errs.fetch_add(1, Ordering::Relaxed);
                        first
                            .lock()
                            .unwrap()
                            .get_or_insert(format!("sharer set: {e:?}"));
                        break;
                    }
                    match t.xattr_value(p.as_str(), "user.big", 0) {
                        Ok(got) if &got == v => {}
                        Ok(got) => {
                            bad.fetch_add(1, Ordering::Relaxed);
                            first.lock().unwrap().get_or_insert(format!(
                                "{p}: read back {:?}.. (set v*300)",
                                &got[..12]
                            ));
                            stop.store(true, Ordering::Relaxed);
                            break;
                        }
                        Err(e) => {
                            errs.fetch_add(1, Ordering::Relaxed);
                            first
                                .lock()
                                .unwrap()
                                .get_or_insert(format!("sharer get: {e:?}"));
                            break;
                        }
                    }
                    if let Err(e) = t.removexattr(p.as_str(), "user.big") {
                        errs.fetch_add(1, Ordering::Relaxed);
                        first
                            .lock()
                            .unwrap()
                            .get_or_insert(format!("sharer remove: {e:?}"));
                        break;
                    }
                }
            });
        }
    });
    drop(t0);
    let _ = e.unmount();
    drop(vfs);
    drop(e);
    let first = first.lock().unwrap().clone();
    assert_eq!(
        bad.load(Ordering::Relaxed),
        0,
        "a sharer's value changed under it: {first:?}"
    );
    assert_eq!(errs.load(Ordering::Relaxed), 0, "{first:?}");
    fsck_clean(&img);
}

#[test]
fn storing_an_attribute_sets_ext_attr() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("xattr-feature");
    let img = fresh_with(&s.0, 1024, "16M", "^ext_attr");
    assert!(!sb_field(&img, "Filesystem features").contains("ext_attr"));
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    touch(&t, "/f");
    t.setxattr("/f", "user.big", &[b'v'; 300], 0).unwrap();
    t.setxattr("/f", "user.small", b"s", 0).unwrap();
    unmount_clean(t, vfs, e, &img);
    assert!(sb_field(&img, "Filesystem features").contains("ext_attr"));
}

#[test]
fn a_value_inode_naming_value_inodes_is_corrupt() {
    if !have_tools() {
        return;
    }
    // /f names value inode V1, whose own attribute names V2, and so on.
    let n = 4usize;
    let s = Scratch::new("xattr-chain");
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "1024", "-O", "ea_inode"], "16M");
    tool_ok("debugfs", &["-w", "-R", "write /dev/null f"], &img);
    let first = ino_of(&img, "/f");
    // Values over 968 bytes go to a value inode; the value inodes are
    // taken in order, so V_k is first + k.
    let mut script = String::new();
    for k in 0..n {
        let mut v = vec![b'a' + k as u8; 1100];
        v[..8].copy_from_slice(&(k as u64).to_le_bytes());
        let vf = s.0.join(format!("val{k}"));
        std::fs::write(&vf, &v).unwrap();
        script.push_str(&format!(
            "ea_set -f {} <{}> user.v\n",
            vf.display(),
            first as usize + k
        ));
    }
    let sf = s.0.join("script");
    std::fs::write(&sf, &script).unwrap();
    let out = std::process::Command::new(tool("debugfs"))
        .args(["-w", "-f"])
        .arg(&sf)
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success());
    let st = debugfs_ro(&img, &format!("stat <{}>", first as usize + 2));
    assert!(
        st.contains("0x280000") || st.contains("EA_INODE"),
        "V2 is a value inode: {st}"
    );
    let (e, vfs) = mount(&img);
    let t = vfs.root_task();
    let r = t.removexattr("/f", "user.v");
    assert_eq!(r, Err(scalevfs::Errno::EUCLEAN));
    drop(t);
    drop(vfs);
    let _ = e.unmount();
}

/// On an image without 64bit, `i_file_acl`'s high half (byte 0x76 of the
/// inode) is not part of the block number, as the kernel and e2fsprogs
/// read it: other layouts keep other things there (review, stop 48).
/// Before, a non-zero high half made the block number past the end, and
/// every attribute of the file EUCLEAN; a write of the inode clears it.
#[test]
fn file_acl_high_is_ignored_without_64bit() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("acl-high");
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "1024", "-O", "^64bit"], "8M");
    let (e, vfs) = mount(&img);
    {
        let t = vfs.root_task();
        touch(&t, "/f");
        // Too large for the inode's room: in a block.
        t.setxattr("/f", "user.k", &uniq(7), 0).unwrap();
    }
    unmount_clean(vfs.root_task(), vfs, e, &img);
    assert!(debugfs(&img, "sif /f file_acl_hi 5"));
    let (e, vfs) = mount(&img);
    {
        let t = vfs.root_task();
        assert_eq!(t.xattr_value("/f", "user.k", 0).unwrap(), uniq(7));
        // Written back, the field is zero, as the kernel writes it (and
        // as e2fsck wants it: "i_file_acl_hi ... should be zero").
        t.chmod("/f", 0o600).unwrap();
    }
    unmount_clean(vfs.root_task(), vfs, e, &img);
}
