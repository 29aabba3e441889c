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
    // Whichever check fails first, the image is not what failed: it is
    // never opened (without /dev/fuse, that is the error named instead).
    assert!(!err.contains("/nonexistent/image.ext4"), "{err}");
    if std::path::Path::new("/dev/fuse").exists() {
        assert!(err.contains("unknown mount option `frobnicate`"), "{err}");
    } else {
        eprintln!("SKIP the option message: no /dev/fuse (the mount stops at that first)");
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
    // Past the kernel's bound (INT_MAX / HZ): refused, not overflowed.
    let (ok, err) = mount(&[d, "-f", img[0], img[1], "-o", "commit=18446744073709552"]);
    assert!(!ok);
    assert!(err.contains("at most 2147483 seconds"), "{err}");
    // memfs's limits with an image: refused, not ignored.
    for o in ["size=1g", "nr_inodes=100"] {
        let (ok, err) = mount(&[d, "-f", img[0], img[1], "-o", o]);
        assert!(!ok);
        assert!(err.contains("applies to memfs only"), "{o}: {err}");
    }
    let (ok, err) = mount(&[d, "-f", img[0], img[1], "--size", "1G"]);
    assert!(!ok);
    assert!(err.contains("applies to memfs only"), "--size: {err}");
    // An explicit memfs with an image: refused, not served as ext4.
    let (ok, err) = mount(&[d, "-f", "--fs", "memfs", img[0], img[1]]);
    assert!(!ok);
    assert!(err.contains("an image is served as ext4"), "{err}");
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

/// An 8 MiB image made by `scalevfs mkfs` in `dir`, and an empty mount
/// point beside it.
fn image_and_mount_point(dir: &std::path::Path) -> (PathBuf, PathBuf) {
    let img = dir.join("img");
    let out = Command::new(env!("CARGO_BIN_EXE_scalevfs"))
        .args(["mkfs", img.to_str().unwrap(), "--size", "8M"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    (img, mnt)
}

/// Whether FUSE mounts can be made here (/dev/fuse and fusermount3).
fn fuse_available() -> bool {
    std::path::Path::new("/dev/fuse").exists()
        && Command::new("sh")
            .args(["-c", "command -v fusermount3"])
            .output()
            .is_ok_and(|o| o.status.success())
}

/// Take the exclusive `flock` a read-write scalevfs takes on an image,
/// without waiting; whether it was free.
fn try_claim(f: &std::fs::File) -> bool {
    use std::os::unix::io::AsRawFd;
    // SAFETY: a plain syscall on a descriptor the caller owns.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// An image another process holds open read-write (its `flock`, as a
/// running mount's daemon does until it has written the image back): the
/// mount says it waits, and fails after 10 s with the reason; let go
/// within that time, and the mount goes ahead.
#[test]
fn a_mount_of_an_image_held_elsewhere_waits_for_it() {
    let dir = scratch("held");
    let (img, mnt) = image_and_mount_point(&dir);
    let hold = || {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&img)
            .unwrap();
        assert!(try_claim(&f), "the image was free");
        f
    };
    let held = hold();
    let t0 = std::time::Instant::now();
    let (ok, err) = mount(&[
        mnt.to_str().unwrap(),
        "-f",
        "--image",
        img.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("waiting up to 10 s"), "{err}");
    assert!(err.contains("open read-write elsewhere"), "{err}");
    assert!(t0.elapsed() >= std::time::Duration::from_secs(9));
    drop(held);
    let fuse = fuse_available();
    if !fuse {
        eprintln!("SKIP: the mount after the wait needs /dev/fuse and fusermount3");
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    // Held, then let go after a second: the mount waits and goes ahead.
    let held = hold();
    let letgo = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(1));
        drop(held);
    });
    let (ok, err) = mount(&[mnt.to_str().unwrap(), "--image", img.to_str().unwrap()]);
    letgo.join().unwrap();
    assert!(ok, "{err}");
    assert!(err.contains("waiting up to 10 s"), "{err}");
    std::fs::write(mnt.join("f"), b"mounted").unwrap();
    // The daemon (a background mount) holds the image while it serves.
    // The parent opened the image before forking, and on its way out
    // unmounted it under the daemon (a final commit, the journal marked
    // clean, the claim let go, so a second writer could mount it too).
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        !try_claim(&std::fs::File::open(&img).unwrap()),
        "the daemon's claim on the image was let go while it serves"
    );
    let st = Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success());
    // The daemon writes the image back and exits: its claim goes with it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if try_claim(&std::fs::File::open(&img).unwrap()) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon kept the image"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A background mount whose caller gives up (Ctrl-C, here SIGKILL) while
/// the daemon still waits for the image: once the image is free, the
/// daemon finds nobody to report to and unmounts instead of serving a
/// mount nobody asked for any more (it detaches before opening the image,
/// so the caller's signal does not reach it).
#[test]
fn a_background_mount_whose_caller_gave_up_does_not_serve() {
    let fuse = fuse_available();
    if !fuse {
        eprintln!("SKIP: needs /dev/fuse and fusermount3");
        return;
    }
    let dir = scratch("gaveup");
    let (img, mnt) = image_and_mount_point(&dir);
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&img)
        .unwrap();
    assert!(try_claim(&held), "the image was free");
    let mut caller = Command::new(env!("CARGO_BIN_EXE_scalevfs"))
        .arg("mount")
        .arg(&mnt)
        .arg("--image")
        .arg(&img)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The daemon is waiting for the image (up to 10 s); its caller goes.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    caller.kill().unwrap();
    caller.wait().unwrap();
    drop(held);
    let mounted = || {
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(mnt.to_str().unwrap()))
    };
    // A process serving `mnt`: the daemon (its command line names it).
    let daemon = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                c.split(|&b| b == 0)
                    .any(|a| a == mnt.as_os_str().as_encoded_bytes())
            })
        })
    };
    // The daemon opens the image, mounts, finds its caller gone and
    // unmounts; then it writes the image back, lets it go and exits.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut gone = false;
    while std::time::Instant::now() < deadline {
        if !daemon() {
            gone = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    gone = gone && !mounted() && try_claim(&std::fs::File::open(&img).unwrap());
    if !gone && mounted() {
        let _ = Command::new("fusermount3").arg("-u").arg(&mnt).status();
    }
    assert!(gone, "the daemon served a mount its caller had given up");
    std::fs::remove_dir_all(&dir).unwrap();
}
