//! A checkpoint that fails at the start of a commit (a write home of a
//! logged block refused: EIO from the host, ENOSPC in a hole of a sparse
//! image on a full host) stops the filesystem, as any other failed
//! commit does. It used to return with writes still allowed: the commit
//! had already taken the transaction's dirty blocks and counted itself
//! started, so on a fast device the next commit was marked done past it
//! and its changes were never logged (a file whose creation was synced
//! vanished, e2fsck: "Unattached zero-length inode"), and where commits
//! wait for each other every later sync hung. Also: once stopped, an
//! fsync of a file committed before the failure reports it (review of the
//! device layer, stop 51).

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use scalevfs::{Vfs, O_CREAT, O_RDWR};
use scalevfs_ext4::{BlockDevice, Ext4, MemDevice};

#[test]
fn a_failed_checkpoint_stops_the_filesystem() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    let s = Scratch::new("ckpt-eio");
    let img = s.0.join("img");
    // 1 KiB blocks and the smallest journal: a checkpoint every few dozen
    // synced creates.
    mkfs_args(&img, &["-b", "1024", "-J", "size=1"], "16M");
    let journal: BTreeSet<u64> = debugfs_ro(&img, "blocks <8>")
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(journal.len() >= 1024, "{} journal blocks", journal.len());
    let mem = Arc::new(MemDevice::new(std::fs::read(&img).unwrap()));
    let armed = Arc::new(AtomicBool::new(false));
    // Writes outside the journal fail (EIO) once armed.
    let mut dev = Hooked::new(mem.clone());
    let on = armed.clone();
    dev.on_write = Box::new(move |off, buf| {
        let (first, last) = (off / 1024, (off + buf.len() as u64).div_ceil(1024));
        if on.load(Ordering::SeqCst) && (first..last).any(|b| !journal.contains(&b)) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    });
    let mut opts = rw_journaled();
    // No background commits: every commit is one of ours.
    opts.commit_interval = 0;
    let e = Ext4::open_device(Box::new(dev), opts).unwrap();
    let vfs = Vfs::with_root_fs(Default::default(), e.clone());
    let t = vfs.root_task();
    let early = t.open("/early", O_CREAT | O_RDWR, 0o644).unwrap();
    t.write(early, b"early").unwrap();
    t.fsync(early).unwrap();
    armed.store(true, Ordering::SeqCst);
    // Synced creates until a commit has to checkpoint (and fails).
    let mut synced = Vec::new();
    let mut failed_at = None;
    for k in 0..5000 {
        let name = format!("/f{k}");
        let fd = t.open(&name, O_CREAT | O_RDWR, 0o644);
        let r = fd.and_then(|fd| {
            let r = t.fsync(fd);
            t.close(fd).unwrap();
            r
        });
        match r {
            Ok(()) => synced.push(name),
            Err(err) => {
                failed_at = Some((k, err));
                break;
            }
        }
    }
    let (k, err) = failed_at.expect("no commit had to checkpoint");
    eprintln!("the checkpoint failed at create {k}: {err:?}");
    // Stopped: every later sync, fsync (even of a file committed before)
    // and change fails; none hangs, none reports success.
    assert!(e.sync().is_err(), "a sync after the failure succeeded");
    assert!(
        t.fsync(early).is_err(),
        "an fsync after the failure succeeded"
    );
    let r = t
        .open("/late", O_CREAT | O_RDWR, 0o644)
        .and_then(|fd| t.fsync(fd));
    assert!(r.is_err(), "a synced create after the failure succeeded");
    drop(t);
    drop(vfs);
    let _ = e.unmount();
    drop(e);
    // What the device holds: the journal has every commit that returned;
    // e2fsck replays it and finds every file whose fsync returned Ok.
    let after = s.0.join("after");
    let mut bytes = vec![0u8; mem.size() as usize];
    mem.read_at(0, &mut bytes).unwrap();
    std::fs::write(&after, bytes).unwrap();
    let (code, out) = e2fsck(&after, "-fy");
    assert!(code <= 1, "e2fsck -fy: {code}\n{out}");
    fsck_clean(&after);
    let listing = debugfs_ro(&after, "ls -l /");
    for name in synced.iter().chain(std::iter::once(&"/early".to_string())) {
        assert!(
            listing.contains(&format!(" {}", &name[1..])),
            "{name}, synced, is gone:\n{listing}"
        );
    }
}
