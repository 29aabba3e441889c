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

    #[test]
    fn own_groups_readable() {
        let me = std::process::id();
        let _ = request_cred(1000, 1000, me);
    }
}
