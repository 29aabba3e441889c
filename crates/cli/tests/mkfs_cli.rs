//! `scalevfs mkfs` from the command line: options reach the image
//! (label, UUID, features, block size) as dumpe2fs reads them, e2fsck
//! passes, and bad options exit non-zero with a message, never a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scalevfs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_scalevfs"))
        .args(args)
        .output()
        .expect("run scalevfs")
}

fn tool(name: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("scalevfs-mkfs-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn mkfs_options_reach_the_image() {
    let d = scratch("ok");
    let img = d.join("a.img");
    let img_s = img.to_str().unwrap();
    let out = scalevfs(&[
        "mkfs",
        img_s,
        "--size",
        "64M",
        "-b",
        "2048",
        "-L",
        "scratch",
        "-U",
        "0123456789abcdef0123456789abcdef",
        "-O",
        "^orphan_file",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("32768 blocks of 2048 bytes"), "{text}");
    let Some(dumpe2fs) = tool("dumpe2fs") else {
        eprintln!("SKIP: dumpe2fs not found");
        return;
    };
    let h = Command::new(dumpe2fs).arg("-h").arg(&img).output().unwrap();
    let h = String::from_utf8_lossy(&h.stdout);
    assert!(h.contains("Filesystem volume name:   scratch"), "{h}");
    assert!(
        h.contains("Filesystem UUID:          01234567-89ab-cdef-0123-456789abcdef"),
        "{h}"
    );
    assert!(h.contains("Block size:               2048"), "{h}");
    assert!(!h.contains("orphan_file"), "{h}");
    if let Some(e2fsck) = tool("e2fsck") {
        let st = Command::new(e2fsck).arg("-fn").arg(&img).output().unwrap();
        assert!(
            st.status.success(),
            "{}",
            String::from_utf8_lossy(&st.stdout)
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn bad_options_exit_with_a_message() {
    let d = scratch("bad");
    let img = d.join("b.img");
    let img_s = img.to_str().unwrap();
    for (args, want) in [
        (vec!["--size", "64M", "-b", "3000"], "block size 3000"),
        (vec!["--size", "17T", "-b", "1024"], "too large"),
        (vec!["--size", "20K"], "too small"),
        (vec!["--size", "lots"], "size \"lots\""),
        (vec!["--size", "64M", "-U", "nope"], "UUID"),
        (
            vec!["--size", "64M", "-O", "^extent"],
            "cannot be turned off",
        ),
    ] {
        let mut a = vec!["mkfs", img_s];
        a.extend(args);
        let out = scalevfs(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{a:?} succeeded");
        assert!(err.contains(want), "{a:?}: {err}");
        assert!(!err.contains("panicked"), "{a:?}: {err}");
        assert!(!img.exists(), "{a:?} left a file");
    }
    let _ = std::fs::remove_dir_all(&d);
}
