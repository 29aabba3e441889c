//! POSIX ACLs through a real FUSE mount, compared with the host's tmpfs:
//! one shell script (setfacl/getfacl as root, reads, writes and creates as
//! uid 1000 through `setpriv`) runs in a directory of /dev/shm and on a
//! `-o allow_other,default_permissions` mount, and the two transcripts
//! must be equal. On such a mount the kernel checks ACLs itself
//! (FUSE_POSIX_ACL) and leaves the umask to scalevfs (FUSE_DONT_MASK), so
//! default ACLs are inherited as on a local filesystem (xfstests generic/
//! 099, 318, 319, 375, 444 exercise the same rules).
//!
//! Needs root, /dev/fuse, setpriv and the acl tools; without them the test
//! prints why it is skipped and passes (a failure with
//! `SCALEVFS_REQUIRE_FUSE=1`, as CI sets). If the host's tmpfs takes no
//! ACLs, only the scalevfs transcript's key lines are checked.

use std::path::Path;
use std::process::Command;

use scalevfs_fuse::FuseConfig;

mod common;
use common::*;

const SCRIPT: &str = r#"
cd "$1" || exit 1
umask 022
asu() {
  if setpriv --reuid=1000 --regid=1000 --clear-groups -- sh -c "umask 022; $1" >/dev/null 2>&1
  then echo "user $1: ok"; else echo "user $1: denied"; fi
}
acl() { getfacl -cn "$1" 2>&1 | grep -v '^$' | tr '\n' ' '; echo; }
echo hi > a; chmod 640 a; setfacl -m u:1000:r a; acl a; stat -c '%a' a
asu "cat a"; asu "echo x >> a"
echo hi > b; chmod 600 b; setfacl -m u:1000:rw,m::r b; asu "cat b"; asu "echo x >> b"
echo hi > c; chmod 666 c; chgrp 1000 c; setfacl -m g::-,g:4242:r c; acl c; asu "cat c"
mkdir s; chmod 755 s; echo hi > s/f; setfacl -m u:1000:- s; asu "cat s/f"; asu "ls s"
chmod 600 a; acl a; asu "cat a"
chmod 640 a; setfacl -b a; acl a; stat -c '%a' a; asu "cat a"
mkdir i; chmod 777 i; setfacl -d -m u:1000:rwx,o::- i; acl i
touch i/f; stat -c '%a' i/f; acl i/f
mkdir i/d; stat -c '%a' i/d; acl i/d
asu "touch i/u"; stat -c '%a' i/u; acl i/u
asu "mkdir i/ud"; stat -c '%a' i/ud; acl i/ud
setfacl -k i; touch i/g; stat -c '%a' i/g; acl i/g
"#;

fn run(dir: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(SCRIPT)
        .arg("sh")
        .arg(dir)
        .output()
        .expect("sh");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn tools_ok(test: &str) -> bool {
    let why = fuse_unavailable().or_else(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            Some("not root: cannot act as a second user".into())
        } else if Command::new("setpriv").arg("--version").output().is_err() {
            Some("setpriv (util-linux) is not installed".into())
        } else if Command::new("setfacl").arg("--version").output().is_err() {
            Some("setfacl (acl) is not installed".into())
        } else {
            None
        }
    });
    requirement_ok(test, why)
}

#[test]
fn acls_through_fuse_match_tmpfs() {
    if !tools_ok("acls_through_fuse_match_tmpfs") {
        return;
    }
    let m = Mounted::with(
        "acl",
        &["allow_other", "default_permissions"],
        FuseConfig::default(),
        2,
    );
    let ours = run(&m.dir);
    drop(m);
    for want in [
        "user cat a: ok",
        "user echo x >> a: denied",
        "user echo x >> b: denied",
        "user cat c: denied",
        "user cat s/f: denied",
        "user touch i/u: ok",
    ] {
        assert!(
            ours.lines().any(|l| l == want),
            "missing {want:?} in:\n{ours}"
        );
    }
    let host = std::path::PathBuf::from(format!("/dev/shm/scalevfs-facl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&host);
    std::fs::create_dir(&host).unwrap();
    // Probe: a tmpfs built without ACLs cannot be compared with.
    let probe = Command::new("setfacl")
        .args(["-m", "u:1000:r"])
        .arg(&host)
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        let _ = std::fs::remove_dir_all(&host);
        eprintln!("host comparison skipped: the host's tmpfs takes no ACLs");
        return;
    }
    let _ = Command::new("setfacl").arg("-b").arg(&host).status();
    let theirs = run(&host);
    let _ = std::fs::remove_dir_all(&host);
    assert_eq!(
        theirs, ours,
        "tmpfs (left) and the FUSE mount (right) differ"
    );
}
