//! Issue 12, found by stress-ng's sync-file stressor on the FUSE mount:
//! after an overwrite of existing pages and a delete, the file's space and
//! memory stayed taken while the server was idle. In its own process: the
//! epoch can only advance when no other thread of the process is pinned,
//! and the test counts on one `flush_deferred_frees` to finish the job.

use scalevfs::*;

/// Issue 12, found by stress-ng's sync-file stressor on the mount: after an
/// overwrite of existing pages (each replaced page is its own deferred
/// free) and a delete, one `flush_deferred_frees` (what the FUSE server
/// runs after an unlink, release or forget) must free the file: it used to
/// collect 32 bags, leaving the file's pages, and the inode queued behind
/// them, until later traffic (an idle server has none).
#[test]
fn flush_after_overwrite_frees_deleted_file() {
    const MIB: usize = 1 << 20;
    let mut cfg = VfsConfig::default();
    cfg.set("size", "256m").unwrap();
    let vfs = Vfs::with_config(cfg);
    let t = vfs.root_task();
    let full = t.statfs("/").unwrap().bfree;
    let chunk = vec![7u8; MIB];
    // Twice: the first round also checks a backlog left by nothing else.
    for round in 0..2 {
        let f = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
        for _pass in 0..2 {
            for i in 0..64 {
                assert_eq!(t.pwrite(f, &chunk, (i * MIB) as i64).unwrap(), MIB);
            }
        }
        t.close(f).unwrap();
        t.unlink("/f").unwrap();
        flush_deferred_frees();
        assert_eq!(
            t.statfs("/").unwrap().bfree,
            full,
            "round {round}: the deleted file's pages are still counted"
        );
    }
}
