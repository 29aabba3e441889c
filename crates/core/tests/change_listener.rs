//! The change-notification hook: which events each changing call reports,
//! that reads and failed calls report nothing, that quiet tasks report
//! nothing, that listeners run with the operation's locks released, and
//! that removing a listener stops it.

use std::sync::{Arc, Mutex};

use scalevfs::io::FALLOC_FL_KEEP_SIZE;
use scalevfs::*;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    Entry(u64, u64, Vec<u8>),
    Inode(u64, u64),
}

struct Recorder {
    events: Mutex<Vec<Ev>>,
    /// A quiet task that re-enters the core from inside the callback: it
    /// renames the changed name onto itself, which takes the directory and
    /// name locks the reporting operation used (a deadlock if they were
    /// still held).
    probe: Mutex<Option<(Task, u64, String)>>,
}

impl Recorder {
    fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            events: Mutex::new(Vec::new()),
            probe: Mutex::new(None),
        })
    }
    fn take(&self) -> Vec<Ev> {
        std::mem::take(&mut *self.events.lock().unwrap())
    }
}

impl ChangeListener for Recorder {
    fn entry_changed(&self, parent_ino: u64, dev: u64, name: &[u8]) {
        self.events
            .lock()
            .unwrap()
            .push(Ev::Entry(parent_ino, dev, name.to_vec()));
        if let Some((t, dir, path)) = &*self.probe.lock().unwrap() {
            if *dir == parent_ino {
                let p = format!("{path}/{}", String::from_utf8_lossy(name));
                let _ = t.rename(&p, &p);
                let _ = t.fstatat(AT_FDCWD, &p, AT_SYMLINK_NOFOLLOW);
            }
        }
    }
    fn inode_changed(&self, ino: u64, dev: u64) {
        self.events.lock().unwrap().push(Ev::Inode(ino, dev));
    }
}

fn e(dir: u64, name: &str) -> Ev {
    Ev::Entry(dir, 1, name.as_bytes().to_vec())
}
fn i(ino: u64) -> Ev {
    Ev::Inode(ino, 1)
}

#[test]
fn events_of_each_call() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let rec = Recorder::new();
    let l: Arc<dyn ChangeListener> = rec.clone();
    vfs.add_change_listener(l.clone());
    let root = t.stat("/").unwrap().ino;

    t.mkdir("/d", 0o755).unwrap();
    let d = t.stat("/d").unwrap().ino;
    assert_eq!(rec.take(), vec![e(root, "d"), i(root)]);
    *rec.probe.lock().unwrap() = Some((
        {
            let mut q = vfs.root_task();
            q.set_quiet_changes(true);
            q
        },
        d,
        "/d".to_string(),
    ));

    let fd = t.open("/d/f", O_CREAT | O_RDWR, 0o644).unwrap();
    let f = t.fstat(fd).unwrap().ino;
    assert_eq!(rec.take(), vec![e(d, "f"), i(d)]);
    t.write(fd, b"hello").unwrap();
    assert_eq!(rec.take(), vec![i(f)]);
    t.pwrite(fd, b"xy", 10).unwrap();
    assert_eq!(rec.take(), vec![i(f)]);
    t.ftruncate(fd, 4).unwrap();
    assert_eq!(rec.take(), vec![i(f)]);
    t.fallocate(fd, 0, 0, 100).unwrap();
    assert_eq!(rec.take(), vec![i(f)]);
    t.fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 200).unwrap();
    assert_eq!(rec.take(), vec![i(f)]);
    t.truncate("/d/f", 3).unwrap();
    assert_eq!(rec.take(), vec![i(f)]);
    // An empty write changes nothing.
    t.write(fd, b"").unwrap();
    assert_eq!(rec.take(), vec![]);

    t.chmod("/d/f", 0o600).unwrap();
    assert_eq!(rec.take(), vec![i(f)]);
    t.fchown(fd, 7, 7).unwrap();
    assert_eq!(rec.take(), vec![i(f)]);
    t.utimensat(AT_FDCWD, "/d/f", None, 0).unwrap();
    assert_eq!(rec.take(), vec![i(f)]);
    t.close(fd).unwrap();

    // O_TRUNC of an existing file; a plain open is not a change.
    let fd = t.open("/d/f", O_WRONLY | O_TRUNC, 0).unwrap();
    t.close(fd).unwrap();
    assert_eq!(rec.take(), vec![i(f)]);
    let fd = t.open("/d/f", O_RDWR | O_CREAT, 0o644).unwrap();
    let mut buf = [0u8; 8];
    t.pread(fd, &mut buf, 0).unwrap();
    t.close(fd).unwrap();

    // Reads, stats, listings and failures report nothing.
    t.stat("/d/f").unwrap();
    t.read_dir("/d").unwrap();
    assert_eq!(t.mkdir("/d", 0o755), Err(Errno::EEXIST));
    assert_eq!(t.unlink("/d/nope"), Err(Errno::ENOENT));
    assert_eq!(rec.take(), vec![]);

    t.link("/d/f", "/d/g").unwrap();
    assert_eq!(rec.take(), vec![e(d, "g"), i(d), i(f)]);
    t.rename("/d/g", "/h").unwrap();
    assert_eq!(
        rec.take(),
        vec![e(d, "g"), i(d), e(root, "h"), i(root), i(f)]
    );
    t.symlink("f", "/d/s").unwrap();
    let s = t.lstat("/d/s").unwrap().ino;
    assert_eq!(rec.take(), vec![e(d, "s"), i(d)]);
    t.mknodat(AT_FDCWD, "/d/n", S_IFIFO | 0o644, 0).unwrap();
    let n = t.lstat("/d/n").unwrap().ino;
    assert_eq!(rec.take(), vec![e(d, "n"), i(d)]);
    // Rename over an existing name: both inodes.
    t.rename("/d/s", "/d/n").unwrap();
    assert_eq!(rec.take(), vec![e(d, "s"), i(d), e(d, "n"), i(s), i(n)]);
    // Exchange.
    t.renameat2(AT_FDCWD, "/d/n", AT_FDCWD, "/h", RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(
        rec.take(),
        vec![e(d, "n"), i(d), e(root, "h"), i(root), i(s), i(f)]
    );
    t.unlink("/d/n").unwrap();
    assert_eq!(rec.take(), vec![e(d, "n"), i(d), i(f)]);
    t.unlink("/h").unwrap();
    assert_eq!(rec.take(), vec![e(root, "h"), i(root), i(s)]);
    t.unlink("/d/f").unwrap();
    assert_eq!(rec.take(), vec![e(d, "f"), i(d), i(f)]);
    *rec.probe.lock().unwrap() = None;
    t.rmdir("/d").unwrap();
    assert_eq!(rec.take(), vec![e(root, "d"), i(root), i(d)]);

    // Removed: no more events.
    assert!(vfs.remove_change_listener(&l));
    assert!(!vfs.remove_change_listener(&l));
    t.mkdir("/after", 0o755).unwrap();
    assert_eq!(rec.take(), vec![]);
}

#[test]
fn quiet_tasks_report_nothing() {
    let vfs = Vfs::new();
    let rec = Recorder::new();
    vfs.add_change_listener(rec.clone());
    let mut q = vfs.root_task();
    assert!(!q.quiet_changes());
    q.set_quiet_changes(true);
    // Threads and children of a quiet task are quiet too.
    for t in [q.clone_thread(), q.fork()] {
        assert!(t.quiet_changes());
    }
    let t = q.fork();
    t.mkdir("/d", 0o755).unwrap();
    let fd = t.open("/d/f", O_CREAT | O_RDWR, 0o644).unwrap();
    t.write(fd, b"data").unwrap();
    t.ftruncate(fd, 1).unwrap();
    t.fchmod(fd, 0o600).unwrap();
    t.close(fd).unwrap();
    t.link("/d/f", "/d/g").unwrap();
    t.rename("/d/g", "/g").unwrap();
    t.unlink("/g").unwrap();
    t.unlink("/d/f").unwrap();
    t.rmdir("/d").unwrap();
    assert_eq!(rec.take(), vec![]);
    // Loud again.
    q.set_quiet_changes(false);
    q.mkdir("/e", 0o755).unwrap();
    assert_eq!(rec.take().len(), 2);
}

#[test]
fn every_listener_is_told() {
    let vfs = Vfs::new();
    let (a, b) = (Recorder::new(), Recorder::new());
    let la: Arc<dyn ChangeListener> = a.clone();
    vfs.add_change_listener(la.clone());
    vfs.add_change_listener(b.clone());
    let t = vfs.root_task();
    t.mkdir("/x", 0o755).unwrap();
    assert_eq!(a.take().len(), 2);
    assert_eq!(b.take().len(), 2);
    assert!(vfs.remove_change_listener(&la));
    t.rmdir("/x").unwrap();
    assert_eq!(a.take(), vec![]);
    assert_eq!(b.take().len(), 3);
}
