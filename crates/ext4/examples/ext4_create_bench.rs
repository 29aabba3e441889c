//! Create-and-write throughput on a read-write ext4 image (a figure, not a
//! test): `cargo run --release -p scalevfs-ext4 --example ext4_create_bench
//! -- [FILES_PER_THREAD] [THREADS...]`. Each thread makes its own directory
//! and creates FILES_PER_THREAD files of 4 KiB in it, on a fresh 4 KiB-block
//! image in /dev/shm (mkfs.ext4 from e2fsprogs). Prints files/s per thread
//! count and checks the image with e2fsck -fn afterwards.

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use scalevfs::fs::Fs;
use scalevfs::{Filesystem, Vfs, VfsConfig};
use scalevfs_ext4::{Ext4, Ext4Options};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers"))
        .collect();
    let per = args.first().copied().unwrap_or(2000);
    let threads: Vec<usize> = if args.len() > 1 {
        args[1..].to_vec()
    } else {
        vec![1, 2]
    };
    for &n in &threads {
        let img = format!("/dev/shm/scalevfs-ext4-bench-{}-{n}", std::process::id());
        let ok = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096", "-O", "orphan_file", &img, "1G"])
            .status()
            .expect("mkfs.ext4")
            .success();
        assert!(ok, "mkfs.ext4 failed");
        let e = Ext4::open(
            img.as_ref(),
            Ext4Options {
                ro: false,
                ..Ext4Options::default()
            },
        )
        .expect("open");
        let fsd: Arc<dyn Filesystem> = e.clone();
        let vfs = Vfs::with_root_fs(VfsConfig::default(), fsd);
        let data = vec![0x5Au8; 4096];
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for t in 0..n {
                let vfs = &vfs;
                let data = &data;
                s.spawn(move || {
                    let fs = Fs::new(vfs.root_task());
                    fs.create_dir(format!("/t{t}")).unwrap();
                    for i in 0..per {
                        fs.write(format!("/t{t}/f{i}"), data).unwrap();
                    }
                });
            }
        });
        let dt = t0.elapsed().as_secs_f64();
        e.unmount().expect("unmount");
        let fsck = Command::new("e2fsck")
            .args(["-fn", &img])
            .output()
            .expect("e2fsck");
        println!(
            "threads {n}: {} files of 4 KiB in {dt:.2} s = {:.0} files/s; e2fsck -fn {}",
            n * per,
            (n * per) as f64 / dt,
            if fsck.status.success() {
                "clean"
            } else {
                "FAILED"
            }
        );
        let _ = std::fs::remove_file(&img);
    }
}
