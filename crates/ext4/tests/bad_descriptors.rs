//! Group descriptors that place a bitmap or inode table on the superblock,
//! on the descriptor table, or outside the filesystem's blocks are refused
//! at mount, as the kernel's `ext4_check_descriptors` refuses them (review,
//! stop 49). Before, only "below the block count" was checked, so a crafted
//! descriptor (with a valid checksum) let the allocator set bits in the
//! superblock or the descriptor table: the image was damaged by the first
//! allocation in that group. The image is left as it was.

mod common;

use common::*;
use scalevfs_ext4::{Ext4, Ext4Options};

fn crafted(dir: &std::path::Path, name: &str, cmds: &str) -> std::path::PathBuf {
    let img = dir.join(name);
    mkfs_args(&img, &["-b", "4096"], "512M");
    let script = dir.join(format!("{name}.cmd"));
    std::fs::write(&script, cmds).unwrap();
    let out = std::process::Command::new(tool("debugfs"))
        .args(["-w", "-f"])
        .arg(&script)
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "debugfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    img
}

#[test]
fn misplaced_group_metadata_is_refused() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck/debugfs not found");
        return;
    }
    let s = Scratch::new("bad_descriptors");
    let cases = [
        ("bb_on_sb", "set_bg 1 block_bitmap 0\n", "superblock"),
        (
            "ib_on_gdt",
            "set_bg 2 inode_bitmap 1\n",
            "group descriptors",
        ),
        (
            "it_past_end",
            "set_bg 3 inode_table 131070\n",
            "inode table",
        ),
    ];
    for (name, cmd, why) in cases {
        let img = crafted(&s.0, name, &format!("{cmd}set_bg 0 checksum calc\nset_bg 1 checksum calc\nset_bg 2 checksum calc\nset_bg 3 checksum calc\n"));
        let before = std::fs::read(&img).unwrap();
        for ro in [false, true] {
            let opts = Ext4Options {
                ro,
                ..Ext4Options::default()
            };
            match Ext4::open(&img, opts) {
                Ok(_) => panic!("{name} (ro {ro}): mounted"),
                Err(e) => {
                    let m = e.to_string();
                    assert!(m.contains(why), "{name}: {m}");
                }
            }
        }
        assert!(
            std::fs::read(&img).unwrap() == before,
            "{name}: the image changed"
        );
    }
}
