//! Inline files whose `i_extra_isize` is 28 (an older kernel's layout,
//! made here with debugfs), written until their data leaves the inode
//! while another thread renames them (issue 14). The write reads the
//! in-inode attribute area (`system.data`) and writes it back later; the
//! rename stamps the file's ctime without its locks, and that stamp
//! grows `i_extra_isize` to 32, moving the area. A write that found the
//! area moved under it stopped all writing on the mount ("i_extra_isize
//! changed under an xattr write"). Writes now settle the area first
//! (`Ext4::settle_extra_isize`): every write and rename succeeds, the
//! data reads back, and e2fsck passes.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Barrier;

use common::{fsck_clean, have_tools, mkfs_args, rw_journaled, tool, Scratch};
use scalevfs::{Vfs, O_RDONLY, O_RDWR};
use scalevfs_ext4::Ext4;

const FILES: usize = 400;

#[test]
fn inline_writes_racing_renames_of_short_extra_inodes_keep_the_mount_writing() {
    if !have_tools() {
        return;
    }
    let s = Scratch::new("inline-extra-race");
    let img = s.0.join("img");
    mkfs_args(&img, &["-b", "4096", "-O", "inline_data"], "16M");
    let small = s.0.join("small");
    std::fs::write(&small, b"hello").unwrap();
    // Each file: written inline, its system.data taken off, the fixed
    // part cut to 28 bytes, and system.data put back behind it.
    let mut script = String::new();
    for k in 0..FILES {
        script.push_str(&format!(
            "write {} f{k}\nea_rm f{k} system.data\nsif f{k} extra_isize 28\nea_set f{k} system.data \"\"\n",
            small.display()
        ));
    }
    let mut dbg = Command::new(tool("debugfs"))
        .args(["-w", "-f", "-"])
        .arg(&img)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    dbg.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(dbg.wait().unwrap().success());
    fsck_clean(&img);
    let e = Ext4::open(&img, rw_journaled()).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let data: Vec<u8> = (0..300u32).map(|i| b'a' + (i % 26) as u8).collect();
    for k in 0..FILES {
        let go = Barrier::new(2);
        std::thread::scope(|sc| {
            let (vfs, go, data) = (&vfs, &go, &data);
            let w = sc.spawn(move || {
                let t = vfs.root_task();
                let fd = t.open(&format!("/f{k}"), O_RDWR, 0).unwrap();
                go.wait();
                // Out of the inode: 300 bytes do not fit its 60 + xattr room.
                let r = t.pwrite(fd, data, 0);
                t.close(fd).unwrap();
                r
            });
            let t = vfs.root_task();
            go.wait();
            let r = t.rename(&format!("/f{k}"), &format!("/g{k}"));
            assert!(r.is_ok(), "file {k}: rename: {r:?}");
            let r = w.join().unwrap();
            assert_eq!(r, Ok(data.len()), "file {k}: write");
        });
    }
    let t = vfs.root_task();
    for k in 0..FILES {
        let fd = t.open(&format!("/g{k}"), O_RDONLY, 0).unwrap();
        let mut b = vec![0u8; 400];
        let n = t.read(fd, &mut b).unwrap();
        assert_eq!(&b[..n], &data[..], "file {k}");
        t.close(fd).unwrap();
    }
    drop(t);
    drop(vfs);
    e.unmount().unwrap();
    fsck_clean(&img);
}
