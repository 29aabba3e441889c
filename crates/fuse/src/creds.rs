//! Credentials of a FUSE request.
//!
//! The request header carries the caller's fsuid, fsgid and thread id. The
//! supplementary groups are not in it: they are read from
//! `/proc/<tid>/status` (credentials are per thread on Linux). Root's are
//! skipped: uid 0 passes every check the groups could matter for.

use scalevfs::Cred;

/// The credentials of the caller of a request.
pub(crate) fn request_cred(uid: u32, gid: u32, pid: u32) -> Cred {
    let groups = if uid == 0 || pid == 0 {
        Vec::new()
    } else {
        proc_groups(pid)
    };
    Cred { uid, gid, groups }
}

/// Supplementary groups of thread `pid` (none for pid 0, a request the
/// kernel makes itself).
pub(crate) fn groups_of(pid: u32) -> Vec<u32> {
    if pid == 0 {
        return Vec::new();
    }
    proc_groups(pid)
}

/// Supplementary groups of thread `pid`; empty if it is gone (a request from
/// a thread that has exited gets no supplementary groups, as nothing can
/// observe the difference any more).
fn proc_groups(pid: u32) -> Vec<u32> {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    parse_groups(&s)
}

fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_line() {
        let s = "Name:\tx\nUid:\t1\t1\t1\t1\nGroups:\t4 24 27 \nNgid:\t0\n";
        assert_eq!(parse_groups(s), vec![4, 24, 27]);
        assert_eq!(parse_groups("Groups:\n"), Vec::<u32>::new());
        assert_eq!(parse_groups(""), Vec::<u32>::new());
    }

    /// This process's supplementary groups (getgroups), sorted.
    fn my_groups() -> Vec<u32> {
        // SAFETY: a size query with a null buffer.
        let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
        assert!(n >= 0, "getgroups: {}", std::io::Error::last_os_error());
        let mut v = vec![0 as libc::gid_t; n as usize];
        // SAFETY: `v` has room for `n` group ids.
        let m = unsafe { libc::getgroups(n, v.as_mut_ptr()) };
        assert!(m >= 0, "getgroups: {}", std::io::Error::last_os_error());
        v.truncate(m as usize);
        v.sort_unstable();
        v
    }

    fn sorted(mut v: Vec<u32>) -> Vec<u32> {
        v.sort_unstable();
        v
    }

    #[test]
    fn own_groups_readable() {
        let me = std::process::id();
        let c = request_cred(1000, 1000, me);
        assert_eq!((c.uid, c.gid), (1000, 1000));
        assert_eq!(sorted(c.groups), my_groups(), "groups of pid {me}");
        assert_eq!(sorted(groups_of(me)), my_groups());
        // Root's groups are not read, nor those of pid 0 (the kernel's own
        // requests); a thread that is gone has none.
        let root = request_cred(0, 0, me);
        assert_eq!((root.uid, root.gid, root.groups), (0, 0, vec![]));
        let kernel = request_cred(1000, 1000, 0);
        assert_eq!(
            (kernel.uid, kernel.gid, kernel.groups),
            (1000, 1000, vec![])
        );
        assert_eq!(groups_of(0), Vec::<u32>::new());
        // Above any pid_max (2^22 at most).
        assert_eq!(request_cred(1000, 1000, u32::MAX).groups, Vec::<u32>::new());
    }

    /// The groups of another process, set to a known list (this one's may
    /// be empty, which an implementation returning nothing would match).
    #[test]
    fn child_groups_readable() {
        use std::os::unix::process::CommandExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP child_groups_readable: setgroups needs root");
            return;
        }
        let want: [libc::gid_t; 3] = [27, 4, 24];
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        // SAFETY: setgroups is async-signal-safe and touches only `want`,
        // which outlives the spawn.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setgroups(want.len(), want.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn sleep with groups");
        // spawn returns once the child has exec'd: its groups are set.
        let c = request_cred(1000, 1000, child.id());
        let g = groups_of(child.id());
        let root = request_cred(0, 0, child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!((c.uid, c.gid), (1000, 1000));
        assert_eq!(sorted(c.groups), vec![4, 24, 27]);
        assert_eq!(sorted(g), vec![4, 24, 27]);
        assert_eq!(root.groups, Vec::<u32>::new(), "root's groups are skipped");
    }
}
