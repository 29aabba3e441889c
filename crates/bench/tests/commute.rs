//! The conflict matrix's recorder on known cases (`--features trace-lines`:
//! `cargo test -p scalevfs-bench --features trace-lines --test commute`).
#![cfg(feature = "trace-lines")]

use scalevfs_bench::commute::{self, cases, pairs, record_case, Case, Op};

fn labels(r: &commute::CaseResult) -> Vec<String> {
    r.conflicts.iter().map(|(l, _)| l.clone()).collect()
}

/// `record_case`, up to 3 times until a recording shows no conflict. Some
/// lines are shared by chance in one recording: two names hashing to one
/// of the 1,024 name-lock stripes (the hash is seeded and includes the
/// parent dentry's address), or the allocator placing two threads' new
/// objects on one line. A conflict that the code makes shows up every
/// time; one of chance does not repeat.
fn record_free(a: Op, b: Op, c: Case) -> commute::CaseResult {
    let mut r = record_case(a, b, c);
    for _ in 0..2 {
        if !r.conflicted() {
            break;
        }
        r = record_case(a, b, c);
    }
    r
}

/// Two creates in one directory share no line of the dcache: each new
/// child's reference on its parent comes from its thread's spares
/// (`core/src/spares.rs`; before, every create wrote the parent dentry's
/// count, as Linux's `d_alloc` does). Nor the parent's directory lock (a
/// big-reader lock, whose shared side writes only the taking thread's own
/// slot line) nor the parent's attribute record. (The directory's index is
/// split into lists by name hash and cookie batch: whether the two creates
/// meet in one depends on which batch slots their threads get, so that is
/// not asserted either way.)
#[test]
fn creat_creat_in_one_dir_shares_no_dcache_line() {
    let r = record_case(Op::Creat, Op::Creat, Case::SharedDir);
    assert_eq!(r.error, None);
    let l = labels(&r);
    assert!(
        !l.iter().any(|l| l.contains("dcache")
            || l.contains("lockref")
            || l.contains("dir_lock")
            || l.contains("brlock")
            || l.contains("core/inode.rs")),
        "{l:?}"
    );
}

/// The same in the filesystem's root, which is never hashed: its spares
/// and its use as an uncounted parent last while its mount lives
/// (dcache.rs `D_LIVE_ROOT`). Before, every create there wrote the root
/// dentry's count (the walk counted it, and so did the child).
#[test]
fn creat_creat_and_mkdir_rmdir_in_the_root_share_no_dcache_line() {
    for (a, b) in [
        (Op::Creat, Op::Creat),
        (Op::Mkdir, Op::Rmdir),
        (Op::Unlink, Op::Creat),
    ] {
        let r = record_free(a, b, Case::RootDir);
        assert_eq!(r.error, None, "{a:?} {b:?}");
        let l = labels(&r);
        assert!(
            !l.iter()
                .any(|l| l.contains("dcache") || l.contains("lockref")),
            "{a:?} {b:?}: {l:?}"
        );
    }
}

/// A rename walks to its parents without a count too (they are checked
/// under their directory locks, as a create's): renames and other name
/// operations of different names in one directory share no dcache line.
#[test]
fn renames_in_one_dir_share_no_dcache_line() {
    for b in [Op::Rename, Op::Creat, Op::Unlink, Op::Mkdir, Op::Rmdir] {
        let r = record_case(Op::Rename, b, Case::SharedDir);
        assert_eq!(r.error, None);
        let l = labels(&r);
        assert!(
            !l.iter()
                .any(|l| l.contains("dcache") || l.contains("lockref")),
            "rename x {b:?}: {l:?}"
        );
    }
}

/// The removal of a directory takes its lock exclusive; it reads the slot
/// lines only of the threads that have used that lock, so a create in
/// another directory shares nothing with it.
#[test]
fn rmdir_vs_creat_in_other_directories_is_free() {
    for b in [Op::Creat, Op::Unlink, Op::Mkdir, Op::Rmdir] {
        let r = record_free(Op::Rmdir, b, Case::OwnDirs);
        assert_eq!(r.error, None);
        assert!(!r.conflicted(), "rmdir x {b:?}: {:?}", labels(&r));
    }
}

/// Writes of different pages of one file run under the data lock held
/// shared (a big-reader lock) and publish their copies in different
/// slots: nothing shared.
#[test]
fn writes_of_different_pages_of_one_file_are_free() {
    for (a, b) in [
        (Op::Write, Op::Write),
        (Op::Pwrite, Op::Pwrite),
        (Op::Write, Op::Pwrite),
    ] {
        let r = record_free(a, b, Case::SameFile);
        assert_eq!(r.error, None);
        assert!(!r.conflicted(), "{a:?} x {b:?}: {:?}", labels(&r));
    }
}

/// Two stats of different files share no written line.
#[test]
fn stat_stat_of_different_files_is_free() {
    for case in [Case::SharedDir, Case::OwnDirs, Case::SameFile] {
        let r = record_free(Op::Stat, Op::Stat, case);
        assert_eq!(r.error, None);
        assert!(!r.conflicted(), "{case:?}: {:?}", labels(&r));
        // It did record: a stat walks, so it touches lines (the recorder is on).
    }
}

/// A rename of a file writes nothing a walk of another name reads (issue
/// 16: the walk validates each step with the found dentry's d_seq or, for
/// a miss, the bucket's sequence; the global rename sequence is written by
/// moves of directories only), in another directory or the same one.
#[test]
fn rename_vs_walks_of_other_names_is_free() {
    for b in [
        Op::Stat,
        Op::Lstat,
        Op::Access,
        Op::Open,
        Op::Creat,
        Op::Chmod,
    ] {
        for case in [Case::SharedDir, Case::OwnDirs] {
            if !cases(Op::Rename, b).contains(&case) {
                continue;
            }
            let r = record_free(Op::Rename, b, case);
            assert_eq!(r.error, None);
            if b == Op::Creat && case == Case::SharedDir {
                // One directory's lock and attributes: a known conflict.
                continue;
            }
            assert!(!shared(&r), "rename {b:?} {case:?}: {:?}", labels(&r));
        }
    }
    let r = record_free(Op::Rename, Op::Rename, Case::OwnDirs);
    assert!(!shared(&r), "rename rename: {:?}", labels(&r));
}

/// Whether the case shares a line other than a name-lock stripe: two names
/// fall in one of the 1024 stripes (hashed with the parent's address, new
/// in every case) a few times in a thousand, a real but chance conflict.
fn shared(r: &commute::CaseResult) -> bool {
    labels(r).iter().any(|l| l != "lock VfsInner::name_locks")
}

/// Reads and writes of different pages of one file, within one clock tick:
/// the write finds mtime/ctime already at the tick and writes no attribute,
/// the read's atime is already the tick (Linux's coarse timestamps), and
/// the write's data lock has a line of its own.
#[test]
fn same_file_reads_and_writes_are_free_within_a_tick() {
    for (a, b) in [
        (Op::Read, Op::Write),
        (Op::Pread, Op::Pwrite),
        (Op::Open, Op::Write),
        (Op::Stat, Op::Read),
    ] {
        let r = record_free(a, b, Case::SameFile);
        assert_eq!(r.error, None);
        assert!(!r.conflicted(), "{a:?} {b:?}: {:?}", labels(&r));
    }
}

/// The fixes the matrix led to stay fixed: open/close no longer write the
/// mount's line that reads touch, and two listings no longer take counts on
/// the parent dentry.
#[test]
fn fixed_pairs_stay_free() {
    for (a, b, c) in [
        (Op::Open, Op::Read, Case::SharedDir),
        (Op::Close, Op::Pread, Case::OwnDirs),
        (Op::Open, Op::Chmod, Case::OwnDirs),
        (Op::Getdents, Op::Getdents, Case::OwnDirs),
        // memfs lists without the directory's lock (issue 16).
        (Op::Getdents, Op::Getdents, Case::SharedDir),
    ] {
        let r = record_free(a, b, c);
        assert_eq!(r.error, None);
        assert!(!r.conflicted(), "{a:?} {b:?} {c:?}: {:?}", labels(&r));
    }
}

/// A lowest-fd pair runs as two processes (free in own directories) and is
/// also recorded as two threads of one process, where the fd table is
/// shared (reported, not counted). Two opens there no longer take the
/// table's lock: the first slots from the hint are claimed without it
/// (`FdTable::reserve_at_hint`), and neighbouring fds are on different
/// slot lines, so the pair may even share nothing; whether the hint's line
/// moves depends on the interleaving, so only the lock is asserted.
#[test]
fn lowest_fd_pairs_in_one_process_take_no_table_lock() {
    let r = record_case(Op::Open, Op::Open, Case::OwnDirs);
    assert_eq!(r.error, None);
    assert!(r.two_procs);
    assert!(!r.conflicted(), "{:?}", labels(&r));
    let one = r.one_process.expect("recorded in one process too");
    assert!(
        !one.iter().any(|(l, _)| l.contains("FdTable::lock")),
        "{one:?}"
    );
}

/// Every case of the matrix runs without an operation failing, and the
/// markdown, JSON and SVG come out.
#[test]
fn whole_matrix_runs() {
    let n: usize = pairs().iter().map(|&(a, b)| cases(a, b).len()).sum();
    let opts = commute::CommuteOptions {
        duration: std::time::Duration::ZERO,
        ops: Vec::new(),
        quiet: true,
    };
    let m = commute::run(&opts, "test".into()).unwrap();
    assert_eq!(m.cases.len(), n);
    let errs: Vec<_> = m.cases.iter().filter_map(|c| c.error.clone()).collect();
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(m.n_cases, n);
    assert!(m.n_free > 0 && m.n_free < n);
    let dir = std::env::temp_dir().join(format!("commute-test-{}", std::process::id()));
    let files = m.write(&dir).unwrap();
    assert_eq!(files.len(), 3);
    let svg = std::fs::read_to_string(dir.join("commute.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("utimensat"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Linux row measures a case (functional only: the figures are not
/// asserted).
#[test]
fn linux_row_runs() {
    let l = commute::linux_case(
        Op::Creat,
        Op::Unlink,
        Case::SharedDir,
        std::time::Duration::from_millis(30),
    )
    .unwrap();
    assert!(l.a_alone > 0.0 && l.b_alone > 0.0 && l.a_pair > 0.0 && l.b_pair > 0.0);
    assert!(l.scaling.is_finite());
}
