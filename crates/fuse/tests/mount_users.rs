//! The FUSE mount as several users: permission checks that the kernel's
//! caches must not bypass, and execute-only programs.
//!
//! The second user is `nobody` (uid/gid 65534), reached with `setpriv`, so
//! these tests need root. Without /dev/fuse, root or setpriv each test
//! prints why it is skipped and passes; with `SCALEVFS_REQUIRE_FUSE=1` that
//! is a failure instead (CI sets it).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use scalevfs::Vfs;
use scalevfs_fuse::{spawn_mount, FuseConfig, MountConfig};

mod common;
use common::*;

const NOBODY: &str = "65534";

/// FUSE (see `common`), root and setpriv: the second user is reached with
/// setpriv.
fn fuse_ok(test: &str) -> bool {
    let why = fuse_unavailable().or_else(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            Some("not root: cannot act as a second user".into())
        } else if Command::new("setpriv").arg("--version").output().is_err() {
            Some("setpriv (util-linux) is not installed".into())
        } else {
            None
        }
    });
    requirement_ok(test, why)
}

fn mounted(tag: &str, options: &[&str], fuse: FuseConfig) -> Mounted {
    // The mount's root is the caller's (root's), mode 0755.
    Mounted::with(tag, options, fuse, 2)
}

/// Run `prog args` as nobody:nogroup with no supplementary groups.
fn as_nobody(prog: &Path, args: &[&Path]) -> Output {
    // A program written just before is "busy" (ETXTBSY) while a child that
    // another test thread forks still holds a copy of the writer's fd until
    // it execs (fd tables are copied at fork; O_CLOEXEC acts only at exec).
    // That is the test process's race, not the mount's: retry it, as Go's
    // os/exec does.
    for _ in 0..50 {
        let out = Command::new("setpriv")
            .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
            .arg(prog)
            .args(args)
            .output()
            .expect("setpriv");
        if !String::from_utf8_lossy(&out.stderr).contains("Text file busy") {
            return out;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("{}: still ETXTBSY after 1 s", prog.display());
}

/// The case of issue 12 item 9: root reads `private/f` (so the kernel caches
/// the names), then nobody, who may not search `private`, tries within the
/// entry timeout. Linux (tmpfs): EACCES.
fn private_file_case(m: &Mounted) {
    fs::create_dir(m.p("private")).unwrap();
    fs::write(m.p("private/f"), b"secret\n").unwrap();
    fs::set_permissions(m.p("private/f"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::set_permissions(m.p("private"), fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(fs::read(m.p("private/f")).unwrap(), b"secret\n");
    let out = as_nobody(Path::new("/bin/cat"), &[&m.p("private/f")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && out.stdout.is_empty(),
        "nobody read a file in a directory it may not search: {:?} {:?}",
        String::from_utf8_lossy(&out.stdout),
        stderr
    );
    assert!(
        stderr.contains("Permission denied"),
        "expected EACCES, got {stderr:?}"
    );
    // Root still reads it (the entry is still cached).
    assert_eq!(fs::read(m.p("private/f")).unwrap(), b"secret\n");
}

/// The mode as `stat -c %A` gets it (xfstests): statx asking for the mode
/// alone, which the kernel answers from its cache unless told otherwise (a
/// write only marks times and size stale).
fn mode_only(p: &Path) -> u32 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statx is plain data.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and out pointer.
    let r = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_MODE, &mut stx) };
    assert_eq!(r, 0, "statx {}", p.display());
    u32::from(stx.stx_mode) & 0o7777
}

/// Long entry and attribute timeouts: the kernel surely still has the names
/// when nobody tries.
fn long_cache() -> FuseConfig {
    let long = std::time::Duration::from_secs(60);
    FuseConfig {
        attr_timeout: long,
        entry_timeout: long,
        negative_timeout: long,
        readdirplus: true,
        ..FuseConfig::default()
    }
}

#[test]
fn cached_names_do_not_skip_search_permission_default_options() {
    if !fuse_ok("cached_names_do_not_skip_search_permission_default_options") {
        return;
    }
    let m = mounted("priv-default", &[], long_cache());
    private_file_case(&m);
}

#[test]
fn cached_names_do_not_skip_search_permission_allow_other() {
    if !fuse_ok("cached_names_do_not_skip_search_permission_allow_other") {
        return;
    }
    let m = mounted("priv-other", &["allow_other"], long_cache());
    private_file_case(&m);
    // nobody can still read what it may.
    fs::create_dir(m.p("open")).unwrap();
    fs::write(m.p("open/f"), b"public\n").unwrap();
    let out = as_nobody(Path::new("/bin/cat"), &[&m.p("open/f")]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"public\n");
}

/// The documented opt-out: scalevfs checks alone, and with names not
/// cached every walk reaches it, so the case is still denied.
#[test]
fn cached_names_do_not_skip_search_permission_no_default_permissions() {
    if !fuse_ok("cached_names_do_not_skip_search_permission_no_default_permissions") {
        return;
    }
    let m = mounted(
        "priv-nodp",
        &["allow_other", "no_default_permissions"],
        long_cache(),
    );
    private_file_case(&m);
}

#[test]
fn contradictory_permission_options_are_refused() {
    let dir = scratch_dir("contra");
    let cfg = MountConfig {
        fuse: FuseConfig::default(),
        options: vec![
            "default_permissions".into(),
            "no_default_permissions".into(),
        ],
        threads: 1,
    };
    let e = spawn_mount(Vfs::new(), &dir, &cfg).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
    fs::remove_dir(&dir).unwrap();
}

/// xfstests generic/126: a mode 0711 binary runs for another user (exec
/// needs execute permission, not read), and a 0644 one does not.
fn exec_only_case(m: &Mounted) {
    fs::copy("/bin/true", m.p("true711")).unwrap();
    fs::set_permissions(m.p("true711"), fs::Permissions::from_mode(0o711)).unwrap();
    let out = as_nobody(&m.p("true711"), &[]);
    assert!(
        out.status.success(),
        "nobody cannot run a 0711 program: {:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nor may nobody read it.
    let out = as_nobody(Path::new("/bin/cat"), &[&m.p("true711")]);
    assert!(!out.status.success() && out.stdout.is_empty(), "{out:?}");
    // Without any execute bit for others: EACCES.
    fs::copy("/bin/true", m.p("true744")).unwrap();
    fs::set_permissions(m.p("true744"), fs::Permissions::from_mode(0o744)).unwrap();
    let out = as_nobody(&m.p("true744"), &[]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{out:?}"
    );
    // Root may run it (an execute bit is set).
    // (ETXTBSY retried as in `as_nobody`.)
    let mut ran = Command::new(m.p("true744")).status();
    for _ in 0..50 {
        match &ran {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(std::time::Duration::from_millis(20));
                ran = Command::new(m.p("true744")).status();
            }
            _ => break,
        }
    }
    assert!(ran.unwrap().success());
}

#[test]
fn execute_only_program_runs_for_another_user() {
    if !fuse_ok("execute_only_program_runs_for_another_user") {
        return;
    }
    let m = mounted("exec", &["allow_other"], FuseConfig::default());
    exec_only_case(&m);
}

#[test]
fn execute_only_program_runs_for_another_user_no_default_permissions() {
    if !fuse_ok("execute_only_program_runs_for_another_user_no_default_permissions") {
        return;
    }
    let m = mounted(
        "exec-nodp",
        &["allow_other", "no_default_permissions"],
        FuseConfig::default(),
    );
    exec_only_case(&m);
}

/// xfstests generic/193: a truncate (or an O_TRUNC open) by a caller
/// without CAP_FSETID clears setuid, and setgid where group-exec is set, as
/// Linux does; root's keeps them.
#[test]
fn truncate_by_another_user_clears_set_id_bits() {
    if !fuse_ok("truncate_by_another_user_clears_set_id_bits") {
        return;
    }
    let m = mounted("setid", &["allow_other"], FuseConfig::default());
    let f = m.p("f");
    let mode = mode_only;
    let set = |p: &Path, mo: u32| {
        std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        fs::set_permissions(p, fs::Permissions::from_mode(mo)).unwrap();
    };
    fs::write(&f, b"data").unwrap();
    // (mode before, mode after a truncate by the owner, nobody)
    for (before, after) in [
        (0o6644, 0o2644),
        (0o6744, 0o2744),
        (0o6654, 0o0654),
        (0o6754, 0o0754),
    ] {
        set(&f, before);
        let out = as_nobody(Path::new("/usr/bin/truncate"), &[Path::new("-s0"), &f]);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(mode(&f), after, "truncate of {before:o}");
        // An O_TRUNC open (the shell's `>`).
        set(&f, before);
        let out = Command::new("setpriv")
            .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
            .args(["/bin/sh", "-c", "echo x > \"$0\""])
            .arg(&f)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(mode(&f), after, "O_TRUNC open of {before:o}");
    }
    // Root (CAP_FSETID) keeps them.
    set(&f, 0o6754);
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(0)
        .unwrap();
    assert_eq!(mode(&f), 0o6754);
}

/// xfstests generic/355 (and 193's writes): a write, direct (O_DIRECT) or
/// not, by a caller without CAP_FSETID clears the set-id bits, and the
/// kernel, which caches the mode (here for a minute) and gets no attributes
/// with a write's reply, sees that at once.
#[test]
fn write_by_another_user_clears_set_id_bits() {
    if !fuse_ok("write_by_another_user_clears_set_id_bits") {
        return;
    }
    let m = mounted("setid-write", &["allow_other"], long_cache());
    let f = m.p("f");
    fs::write(&f, vec![0u8; 8192]).unwrap();
    for (before, after, direct) in [
        (0o6644, 0o2644, true),
        (0o6754, 0o0754, true),
        (0o6644, 0o2644, false),
    ] {
        std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(before)).unwrap();
        let mut args = vec![
            "if=/dev/zero".to_string(),
            format!("of={}", f.display()),
            "bs=4096".into(),
            "count=1".into(),
            "conv=notrunc".into(),
        ];
        if direct {
            args.push("oflag=direct".into());
        }
        let args: Vec<&Path> = args.iter().map(Path::new).collect();
        let out = as_nobody(Path::new("/bin/dd"), &args);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            mode_only(&f),
            after,
            "write (direct: {direct}) to {before:o}"
        );
    }
}

/// chown(f, -1, -1) by someone who neither owns the file nor may write
/// it: Linux says EPERM when the file has set-id bits (clearing them is a
/// mode change, the owner's); through the mount the kernel empties the
/// SETATTR and checks no owner, and the daemon cleared the bits for
/// anyone. The owner's own chown(-1, -1) clears them.
#[test]
fn chown_minus_one_by_a_stranger_keeps_set_id_bits() {
    if !fuse_ok("chown_minus_one_by_a_stranger_keeps_set_id_bits") {
        return;
    }
    let m = mounted("setid-chown", &["allow_other"], long_cache());
    let f = m.p("prog");
    fs::write(&f, b"#!/bin/sh\n").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o6755)).unwrap();
    let script = Path::new("chown -1, -1, $ARGV[0] or die \"chown: $!\\n\"");
    let out = as_nobody(Path::new("/usr/bin/perl"), &[Path::new("-e"), script, &f]);
    assert!(
        !out.status.success(),
        "a stranger's chown(-1, -1) succeeded: {out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"),
        "{out:?}"
    );
    assert_eq!(mode_only(&f), 0o6755, "a stranger cleared the set-id bits");
    // The owner's (root's) clears both (setgid with group-exec), as on
    // the host's tmpfs.
    std::os::unix::fs::chown(&f, None, None).unwrap();
    assert_eq!(mode_only(&f), 0o755);
}

/// xfstests generic/683, 684: fallocate (and punch hole) by a caller
/// without CAP_FSETID clears the set-id bits as a write does; setgid
/// without group-exec goes too when the caller is not in the file's group
/// (Linux's setattr_should_drop_sgid).
#[test]
fn fallocate_by_another_user_clears_set_id_bits() {
    if !fuse_ok("fallocate_by_another_user_clears_set_id_bits") {
        return;
    }
    let m = mounted("setid-falloc", &["allow_other"], long_cache());
    let f = m.p("f");
    fs::write(&f, vec![1u8; 16384]).unwrap();
    // root:root 6666: nobody may write but is not in the group.
    for (args, before, after) in [
        (&["-l", "65536"][..], 0o6666, 0o0666),
        (&["-p", "-o", "0", "-l", "4096"][..], 0o6666, 0o0666),
        (&["-l", "65536"][..], 0o6676, 0o0676),
    ] {
        fs::set_permissions(&f, fs::Permissions::from_mode(before)).unwrap();
        let mut a: Vec<&Path> = args.iter().map(Path::new).collect();
        a.push(&f);
        let out = as_nobody(Path::new("/usr/bin/fallocate"), &a);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(mode_only(&f), after, "fallocate {args:?} on {before:o}");
    }
    // A write by someone outside the group drops setgid without
    // group-exec as well.
    fs::set_permissions(&f, fs::Permissions::from_mode(0o6666)).unwrap();
    let of = format!("of={}", f.display());
    let words = [
        "if=/dev/zero",
        of.as_str(),
        "bs=512",
        "count=1",
        "conv=notrunc",
    ];
    let args: Vec<&Path> = words.iter().map(Path::new).collect();
    let out = as_nobody(Path::new("/bin/dd"), &args);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(mode_only(&f), 0o0666, "write to 6666");
}
