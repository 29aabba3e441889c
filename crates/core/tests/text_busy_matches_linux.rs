//! "Text file busy": a file open to be executed (`Task::open_exec`, Linux's
//! `open_exec`) and a file open for writing exclude each other (Linux's
//! `i_writecount`). Every open or truncate that would change a running
//! program fails with ETXTBSY and changes nothing; the hold ends with the
//! last close of the exec description. The Linux side of each case is
//! measured on the host (a running copy of `sleep` in /dev/shm) and
//! compared, where the host allows it.

use scalevfs::*;

const DATA: &[u8] = b"\x7fELF not really a program";

/// The library's answers for: open O_WRONLY, open O_RDWR, open
/// O_RDONLY|O_TRUNC, truncate — while the file is held by an exec.
fn library_busy_errnos() -> Vec<Option<i32>> {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let fd = t.open("/prog", O_CREAT | O_WRONLY, 0o755).unwrap();
    assert_eq!(t.write(fd, DATA).unwrap(), DATA.len());
    t.close(fd).unwrap();
    let x = t.open_exec(AT_FDCWD, "/prog").unwrap();
    let mut out = Vec::new();
    for flags in [O_WRONLY, O_RDWR, O_RDONLY | O_TRUNC] {
        out.push(match t.open("/prog", flags, 0) {
            Ok(fd) => {
                t.close(fd).unwrap();
                None
            }
            Err(e) => Some(e.raw()),
        });
    }
    out.push(t.truncate("/prog", 1).err().map(|e| e.raw()));
    // Nothing changed.
    assert_eq!(t.stat("/prog").unwrap().size, DATA.len() as u64);
    t.close(x).unwrap();
    out
}

/// The host kernel's answers for the same four calls on a running program
/// in /dev/shm (None: the host cannot run the experiment here).
fn host_busy_errnos() -> Option<Vec<Option<i32>>> {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::path::Path::new("/dev/shm");
    if !dir.is_dir() {
        return None;
    }
    let prog = dir.join(format!("scalevfs-txtbsy-{}", std::process::id()));
    std::fs::copy("/bin/sleep", &prog).ok()?;
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).ok()?;
    let Ok(mut child) = std::process::Command::new(&prog).arg("30").spawn() else {
        let _ = std::fs::remove_file(&prog);
        return None;
    };
    let c = std::ffi::CString::new(prog.as_os_str().as_encoded_bytes()).unwrap();
    let mut out = Vec::new();
    for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
        // SAFETY: open with a valid C string; a returned fd is closed.
        let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
        let e = std::io::Error::last_os_error().raw_os_error();
        if fd >= 0 {
            // SAFETY: our fd.
            unsafe { libc::close(fd) };
            out.push(None);
        } else {
            out.push(e);
        }
    }
    // SAFETY: truncate with a valid C string.
    let r = unsafe { libc::truncate(c.as_ptr(), 1) };
    out.push((r != 0).then(|| std::io::Error::last_os_error().raw_os_error().unwrap()));
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&prog);
    Some(out)
}

#[test]
fn a_running_program_is_text_busy_as_on_linux() {
    let ours = library_busy_errnos();
    let etxtbsy = Some(libc::ETXTBSY);
    assert_eq!(ours, vec![etxtbsy; 4], "scalevfs");
    match host_busy_errnos() {
        Some(host) => assert_eq!(ours, host, "scalevfs vs the host kernel"),
        None => eprintln!("host comparison skipped: cannot run a program from /dev/shm here"),
    }
}

#[test]
fn writers_keep_programs_out_and_the_hold_ends_with_the_last_close() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let w = t.open("/prog", O_CREAT | O_WRONLY, 0o755).unwrap();
    // Open for writing: it cannot be executed (execve's ETXTBSY).
    assert_eq!(t.open_exec(AT_FDCWD, "/prog"), Err(Errno::ETXTBSY));
    t.close(w).unwrap();
    let x = t.open_exec(AT_FDCWD, "/prog").unwrap();
    // A second running copy is fine; a dup keeps the hold.
    let x2 = t.open_exec(AT_FDCWD, "/prog").unwrap();
    let xd = t.dup(x).unwrap();
    t.close(x).unwrap();
    t.close(x2).unwrap();
    assert_eq!(t.open("/prog", O_WRONLY, 0), Err(Errno::ETXTBSY));
    // Read-only opens and O_PATH are not writers.
    let r = t.open("/prog", O_RDONLY, 0).unwrap();
    let p = t.open("/prog", O_PATH, 0).unwrap();
    t.close(xd).unwrap();
    // The last exec description is closed: writers may come back, and the
    // read-only and O_PATH descriptions never counted.
    let w = t.open("/prog", O_WRONLY | O_TRUNC, 0).unwrap();
    assert_eq!(t.stat("/prog").unwrap().size, 0);
    assert_eq!(t.open_exec(AT_FDCWD, "/prog"), Err(Errno::ETXTBSY));
    for fd in [w, r, p] {
        t.close(fd).unwrap();
    }
    assert!(t.open_exec(AT_FDCWD, "/prog").is_ok());
}
