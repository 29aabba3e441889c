//! `scalevfs mount`'s checks before mounting: clear messages and a failure
//! status, with nothing mounted, for a mount point that is not empty or not
//! there, and for a bad option (reported before an image is opened).

use std::path::PathBuf;
use std::process::Command;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("scalevfs-mount-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn mount(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_scalevfs"))
        .arg("mount")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn refuses_a_non_empty_or_missing_mount_point() {
    let dir = scratch("nonempty");
    std::fs::write(dir.join("file"), b"x").unwrap();
    let (ok, err) = mount(&[dir.to_str().unwrap(), "--foreground"]);
    assert!(!ok);
    assert!(err.contains("is not empty"), "{err}");
    let (ok, err) = mount(&["/nonexistent/scalevfs-mnt", "-f"]);
    assert!(!ok);
    assert!(err.contains("/nonexistent/scalevfs-mnt"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_option_is_reported_before_the_image_is_opened() {
    let dir = scratch("badopt");
    // The image does not exist: the option error must come first.
    let (ok, err) = mount(&[
        dir.to_str().unwrap(),
        "-f",
        "--image",
        "/nonexistent/image.ext4",
        "-o",
        "frobnicate",
    ]);
    assert!(!ok);
    if std::path::Path::new("/dev/fuse").exists() {
        assert!(err.contains("unknown mount option `frobnicate`"), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// ext4's own options: a bad orphan scheme or commit interval is named,
/// and they are refused without `--image` (memfs has neither).
#[test]
fn ext4_options_are_checked() {
    let dir = scratch("ext4opt");
    let d = dir.to_str().unwrap();
    let img = ["--image", "/nonexistent/image.ext4"];
    let (ok, err) = mount(&[d, "-f", img[0], img[1], "-o", "orphan=sometimes"]);
    assert!(!ok);
    assert!(
        err.contains("orphan=sometimes: expected auto, file, list or none"),
        "{err}"
    );
    let (ok, err) = mount(&[d, "-f", img[0], img[1], "-o", "commit=soon"]);
    assert!(!ok);
    assert!(err.contains("commit=soon: expected seconds"), "{err}");
    for o in ["orphan=list", "mmap", "pwrite"] {
        let (ok, err) = mount(&[d, "-f", "-o", o]);
        assert!(!ok);
        assert!(
            err.contains("applies to ext4 images (--image) only"),
            "{o}: {err}"
        );
    }
    // A good one gets as far as opening the (missing) image.
    for good in ["orphan=list,commit=1,mmap", "pwrite"] {
        let (ok, err) = mount(&[d, "-f", img[0], img[1], "-o", good]);
        assert!(!ok);
        assert!(err.contains("/nonexistent/image.ext4"), "{good}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
