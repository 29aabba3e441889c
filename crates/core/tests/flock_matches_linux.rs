//! BSD file locks (`Task::flock`, `fs::File::lock` and friends) against
//! the host kernel: the same scenarios run on scalevfs and, with
//! `libc::flock`, on tmpfs (/dev/shm), and their results (0 or the errno,
//! in order) must be equal. Then what the host cannot show side by side
//! without sleeps: blocking waits, the release at the last close, races of
//! a grant with that close, and that the lock table does not grow.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use scalevfs::*;

/// The calls a scenario makes; paths are relative to a fresh directory.
trait Sys {
    /// A new fd, or the errno negated.
    fn open(&self, path: &str, flags: i32) -> i32;
    /// 0 or the errno.
    fn flock(&self, fd: i32, op: i32) -> i32;
    fn close(&self, fd: i32);
    fn dup(&self, fd: i32) -> i32;
    fn link(&self, old: &str, new: &str);
    fn mkdir(&self, path: &str);
}

struct Ours(Task);

impl Sys for Ours {
    fn open(&self, path: &str, flags: i32) -> i32 {
        match self
            .0
            .open(format!("/{path}").as_str(), flags as u32, 0o644)
        {
            Ok(fd) => fd,
            Err(e) => -e.raw(),
        }
    }
    fn flock(&self, fd: i32, op: i32) -> i32 {
        self.0.flock(fd, op as u32).err().map_or(0, |e| e.raw())
    }
    fn close(&self, fd: i32) {
        self.0.close(fd).unwrap();
    }
    fn dup(&self, fd: i32) -> i32 {
        self.0.dup(fd).unwrap()
    }
    fn link(&self, old: &str, new: &str) {
        self.0
            .link(format!("/{old}").as_str(), format!("/{new}").as_str())
            .unwrap();
    }
    fn mkdir(&self, path: &str) {
        self.0.mkdir(format!("/{path}").as_str(), 0o755).unwrap();
    }
}

struct Host(String);

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

impl Host {
    fn new(name: &str) -> Option<Host> {
        if !std::path::Path::new("/dev/shm").is_dir() {
            eprintln!("host side skipped: no /dev/shm");
            return None;
        }
        let dir = format!("/dev/shm/scalevfs-flock-{}-{name}", std::process::id());
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        Some(Host(dir))
    }
    fn c(&self, path: &str) -> CString {
        CString::new(format!("{}/{path}", self.0)).unwrap()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Sys for Host {
    fn open(&self, path: &str, flags: i32) -> i32 {
        // SAFETY: a NUL-terminated path that lives across the call.
        let fd = unsafe { libc::open(self.c(path).as_ptr(), flags, 0o644) };
        if fd < 0 {
            -errno()
        } else {
            fd
        }
    }
    fn flock(&self, fd: i32, op: i32) -> i32 {
        // SAFETY: plain system call.
        if unsafe { libc::flock(fd, op) } == 0 {
            0
        } else {
            errno()
        }
    }
    fn close(&self, fd: i32) {
        // SAFETY: an fd this scenario opened and owns.
        assert_eq!(unsafe { libc::close(fd) }, 0);
    }
    fn dup(&self, fd: i32) -> i32 {
        // SAFETY: plain system call.
        let n = unsafe { libc::dup(fd) };
        assert!(n >= 0);
        n
    }
    fn link(&self, old: &str, new: &str) {
        std::fs::hard_link(format!("{}/{old}", self.0), format!("{}/{new}", self.0)).unwrap();
    }
    fn mkdir(&self, path: &str) {
        std::fs::create_dir(format!("{}/{path}", self.0)).unwrap();
    }
}

type Log = Vec<(&'static str, i32)>;

/// Run `scenario` on both and compare; returns our log.
fn both(name: &str, scenario: fn(&dyn Sys, &mut Log)) -> Log {
    let vfs = Vfs::new();
    let mut ours = Log::new();
    scenario(&Ours(vfs.root_task()), &mut ours);
    if let Some(h) = Host::new(name) {
        let mut host = Log::new();
        scenario(&h, &mut host);
        eprintln!("{name} on the host: {host:?}");
        assert_eq!(ours, host, "{name}: scalevfs (left) vs Linux (right)");
    }
    ours
}

const RW: i32 = libc::O_RDWR | libc::O_CREAT;
const SH: i32 = libc::LOCK_SH;
const EX: i32 = libc::LOCK_EX;
const NB: i32 = libc::LOCK_NB;
const UN: i32 = libc::LOCK_UN;
const EAGAIN: i32 = libc::EAGAIN;

#[test]
fn constants_are_linuxs() {
    assert_eq!(
        (LOCK_SH, LOCK_EX, LOCK_NB, LOCK_UN, LOCK_MAND),
        (1, 2, 4, 8, 32)
    );
    assert_eq!(libc::EWOULDBLOCK, EAGAIN);
}

#[test]
fn errno_order_matches_linux() {
    let log = both("errno", |s, log| {
        let fd = s.open("f", RW);
        let p = s.open("f", libc::O_PATH);
        let bad = 999;
        // LOCK_MAND: ignored, before anything is checked.
        log.push(("mand, bad fd", s.flock(bad, 32 | SH)));
        log.push(("mand alone, bad fd", s.flock(bad, 32)));
        log.push(("mand|ex, fd", s.flock(fd, 32 | EX)));
        // An unknown command is EINVAL before the fd is looked at.
        for (what, op) in [
            ("0, bad fd", 0),
            ("sh|ex, bad fd", SH | EX),
            ("nb alone, bad fd", NB),
            ("sh|un, bad fd", SH | UN),
            ("16, bad fd", 16),
            ("64, bad fd", 64),
            ("sh|64, fd", SH | 64),
            ("every bit but mand, fd", !32),
        ] {
            log.push((
                what,
                s.flock(if what.ends_with("bad fd") { bad } else { fd }, op),
            ));
        }
        log.push(("sh, bad fd", s.flock(bad, SH)));
        log.push(("un, bad fd", s.flock(bad, UN)));
        log.push(("ex, -1", s.flock(-1, EX)));
        // O_PATH.
        for (what, op) in [
            ("o_path sh", SH),
            ("o_path ex|nb", EX | NB),
            ("o_path un", UN),
            ("o_path un|nb", UN | NB),
            ("o_path 0", 0),
        ] {
            log.push((what, s.flock(p, op)));
        }
        // Unlock with nothing held; NB on an unlock.
        log.push(("un unheld", s.flock(fd, UN)));
        log.push(("un|nb unheld", s.flock(fd, UN | NB)));
        // The access mode does not matter.
        let wo = s.open("f", libc::O_WRONLY);
        log.push(("o_wronly sh|nb", s.flock(wo, SH | NB)));
        s.close(wo);
        let ro = s.open("f", libc::O_RDONLY);
        log.push(("o_rdonly ex|nb", s.flock(ro, EX | NB)));
        s.close(ro);
        // A directory locks too.
        s.mkdir("d");
        let d = s.open("d", libc::O_RDONLY | libc::O_DIRECTORY);
        log.push(("dir ex|nb", s.flock(d, EX | NB)));
        let d2 = s.open("d", libc::O_RDONLY | libc::O_DIRECTORY);
        log.push(("dir other sh|nb", s.flock(d2, SH | NB)));
        for f in [fd, p, d, d2] {
            s.close(f);
        }
    });
    let get = |k: &str| log.iter().find(|(w, _)| *w == k).unwrap().1;
    assert_eq!(get("mand, bad fd"), 0);
    assert_eq!(get("0, bad fd"), libc::EINVAL);
    assert_eq!(get("sh, bad fd"), libc::EBADF);
    assert_eq!(get("o_path sh"), libc::EBADF);
    // fdget refuses O_PATH files whatever the command (Linux 6.18).
    assert_eq!(get("o_path un"), libc::EBADF);
    assert_eq!(get("dir other sh|nb"), EAGAIN);
}

#[test]
fn two_descriptions_match_linux() {
    let log = both("two", |s, log| {
        let a = s.open("f", RW);
        let b = s.open("f", RW);
        log.push(("a sh", s.flock(a, SH | NB)));
        log.push(("b sh", s.flock(b, SH | NB)));
        log.push(("b ex|nb (a sh)", s.flock(b, EX | NB)));
        // b's failed conversion left b without a lock: a converts.
        log.push(("a ex|nb", s.flock(a, EX | NB)));
        log.push(("b sh|nb (a ex)", s.flock(b, SH | NB)));
        log.push(("b ex|nb (a ex)", s.flock(b, EX | NB)));
        // The same description again: no conflict with itself.
        log.push(("a ex again", s.flock(a, EX | NB)));
        let a2 = s.dup(a);
        log.push(("dup of a ex|nb", s.flock(a2, EX | NB)));
        log.push(("dup of a sh|nb (a converts)", s.flock(a2, SH | NB)));
        log.push(("b sh|nb (a sh)", s.flock(b, SH | NB)));
        log.push(("b un", s.flock(b, UN)));
        log.push(("a un via dup", s.flock(a2, UN)));
        log.push(("b ex|nb (none)", s.flock(b, EX | NB)));
        for f in [a, a2, b] {
            s.close(f);
        }
    });
    let want = [0, 0, EAGAIN, 0, EAGAIN, EAGAIN, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(log.iter().map(|x| x.1).collect::<Vec<_>>(), want, "{log:?}");
}

#[test]
fn dup_shares_and_last_close_releases_match_linux() {
    let log = both("dup", |s, log| {
        let a = s.open("f", RW);
        let b = s.open("f", RW);
        log.push(("a ex", s.flock(a, EX)));
        let a2 = s.dup(a);
        let a3 = s.dup(a2);
        s.close(a);
        log.push(("b ex|nb after closing a", s.flock(b, EX | NB)));
        s.close(a2);
        log.push(("b sh|nb after closing a2", s.flock(b, SH | NB)));
        // The last fd: released at once, no sleep, no retry.
        s.close(a3);
        log.push(("b ex|nb after the last close", s.flock(b, EX | NB)));
        s.close(b);
    });
    assert_eq!(
        log.iter().map(|x| x.1).collect::<Vec<_>>(),
        [0, EAGAIN, EAGAIN, 0]
    );
}

#[test]
fn conversion_matches_linux() {
    let log = both("convert", |s, log| {
        let a = s.open("f", RW);
        let b = s.open("f", RW);
        let c = s.open("f", RW);
        log.push(("a sh", s.flock(a, SH)));
        log.push(("b sh", s.flock(b, SH)));
        // Upgrade with NB against another shared holder: fails, and a
        // holds nothing afterwards (Linux removes the old lock first).
        log.push(("a ex|nb", s.flock(a, EX | NB)));
        log.push(("c ex|nb (b sh)", s.flock(c, EX | NB)));
        log.push(("b ex|nb (a lost its lock)", s.flock(b, EX | NB)));
        log.push(("a sh|nb (b ex)", s.flock(a, SH | NB)));
        // Downgrade: always granted, and others may then share.
        log.push(("b sh (downgrade)", s.flock(b, SH)));
        log.push(("a sh|nb", s.flock(a, SH | NB)));
        log.push(("c ex|nb (a, b sh)", s.flock(c, EX | NB)));
        log.push(("a un", s.flock(a, UN)));
        log.push(("b un", s.flock(b, UN)));
        log.push(("c ex|nb", s.flock(c, EX | NB)));
        log.push(("c sh (downgrade)", s.flock(c, SH)));
        log.push(("c ex (upgrade, alone)", s.flock(c, EX)));
        for f in [a, b, c] {
            s.close(f);
        }
    });
    assert_eq!(
        log.iter().map(|x| x.1).collect::<Vec<_>>(),
        [0, 0, EAGAIN, EAGAIN, 0, EAGAIN, 0, 0, EAGAIN, 0, 0, 0, 0, 0]
    );
}

#[test]
fn hard_links_share_matches_linux() {
    let log = both("links", |s, log| {
        let a = s.open("f", RW);
        s.link("f", "g");
        let b = s.open("g", RW);
        log.push(("a ex", s.flock(a, EX | NB)));
        log.push(("b (other name) sh|nb", s.flock(b, SH | NB)));
        let o = s.open("other", RW);
        log.push(("another file ex|nb", s.flock(o, EX | NB)));
        s.close(a);
        log.push(("b ex|nb after a's close", s.flock(b, EX | NB)));
        for f in [b, o] {
            s.close(f);
        }
    });
    assert_eq!(
        log.iter().map(|x| x.1).collect::<Vec<_>>(),
        [0, EAGAIN, 0, 0]
    );
}

/// A fork shares the descriptions: the lock goes only when the last fd
/// in either table closes (here: the child task's drop).
#[test]
fn fork_shares_the_lock() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let a = t.open("/f", O_RDWR | O_CREAT, 0o644).unwrap();
    let b = t.open("/f", O_RDWR, 0).unwrap();
    t.flock(a, LOCK_EX).unwrap();
    let child = t.fork();
    t.close(a).unwrap();
    assert_eq!(t.flock(b, LOCK_EX | LOCK_NB), Err(Errno::EAGAIN));
    assert_eq!(child.flock(b, LOCK_EX | LOCK_NB), Err(Errno::EAGAIN));
    drop(child);
    t.flock(b, LOCK_EX | LOCK_NB).unwrap();
}

fn vfs_with_file() -> (Vfs, Arc<Task>) {
    let vfs = Vfs::new();
    let t = Arc::new(vfs.root_task());
    t.close(t.open("/f", O_RDWR | O_CREAT, 0o644).unwrap())
        .unwrap();
    (vfs, t)
}

/// `wait_for` on another thread: the result goes through the channel.
fn blocking(
    t: &Arc<Task>,
    fd: i32,
    op: u32,
    released: &Arc<AtomicBool>,
) -> mpsc::Receiver<(VfsResult<()>, bool)> {
    let (tx, rx) = mpsc::channel();
    let (t, released) = (t.clone(), released.clone());
    std::thread::spawn(move || {
        let r = t.flock(fd, op);
        // Whether the holder had let go when the call returned.
        tx.send((r, released.load(Ordering::SeqCst))).unwrap();
    });
    rx
}

#[test]
fn blocking_exclusive_waits_for_unlock() {
    let (_vfs, t) = vfs_with_file();
    let a = t.open("/f", O_RDWR, 0).unwrap();
    let b = t.open("/f", O_RDWR, 0).unwrap();
    t.flock(a, LOCK_SH).unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let rx = blocking(&t, b, LOCK_EX, &released);
    assert!(
        matches!(
            rx.recv_timeout(Duration::from_millis(300)),
            Err(mpsc::RecvTimeoutError::Timeout)
        ),
        "LOCK_EX returned while a shared lock was held"
    );
    released.store(true, Ordering::SeqCst);
    t.flock(a, LOCK_UN).unwrap();
    let (r, after) = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("LOCK_EX still waiting 5 s after the unlock");
    assert_eq!(r, Ok(()));
    assert!(after, "granted before the holder let go");
    assert_eq!(t.flock(a, LOCK_SH | LOCK_NB), Err(Errno::EAGAIN));
}

/// Two threads of one description wait for a shared lock behind another
/// description's exclusive one: once it goes, the description holds one
/// shared lock, and its unlock leaves the file free (review, stop 51: each
/// waiter counted itself on the entry with one holder bit between them,
/// the unlock took one back, and every exclusive lock of the inode was
/// refused from then on). Likewise a thread waiting for an exclusive lock
/// while another thread of its description is granted a shared one takes
/// it over (a conversion) instead of waiting on its own description.
#[test]
fn waiters_of_one_description_share_its_lock() {
    let (_vfs, t) = vfs_with_file();
    let a = t.open("/f", O_RDWR, 0).unwrap();
    let d = t.open("/f", O_RDWR, 0).unwrap();
    let other = t.open("/f", O_RDWR, 0).unwrap();
    t.flock(a, LOCK_EX).unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let r1 = blocking(&t, d, LOCK_SH, &released);
    let r2 = blocking(&t, d, LOCK_SH, &released);
    // Both asleep behind `a` (if one is not yet, it finds the
    // description's lock when it comes: the same end).
    std::thread::sleep(Duration::from_millis(200));
    released.store(true, Ordering::SeqCst);
    t.flock(a, LOCK_UN).unwrap();
    for rx in [r1, r2] {
        let (r, _) = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("still waiting");
        assert_eq!(r, Ok(()));
    }
    assert_eq!(t.flock(other, LOCK_EX | LOCK_NB), Err(Errno::EAGAIN));
    t.flock(d, LOCK_UN).unwrap();
    assert_eq!(
        t.flock(other, LOCK_EX | LOCK_NB),
        Ok(()),
        "the description's unlock left the file locked"
    );
    t.flock(other, LOCK_UN).unwrap();

    // An exclusive waiter and a shared one of one description.
    t.flock(a, LOCK_EX).unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let rx_ex = blocking(&t, d, LOCK_EX, &released);
    let rx_sh = blocking(&t, d, LOCK_SH, &released);
    std::thread::sleep(Duration::from_millis(200));
    released.store(true, Ordering::SeqCst);
    t.flock(a, LOCK_UN).unwrap();
    for rx in [rx_ex, rx_sh] {
        let (r, _) = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("a thread waits on its own description");
        assert_eq!(r, Ok(()));
    }
    t.flock(d, LOCK_UN).unwrap();
    assert_eq!(t.flock(other, LOCK_EX | LOCK_NB), Ok(()));
}

/// A shared waiter behind an exclusive holder is woken by the close of
/// the holder's last fd; an upgrade waits for the other shared holder.
#[test]
fn blocking_waits_end_at_last_close_and_upgrade() {
    let (_vfs, t) = vfs_with_file();
    let a = t.open("/f", O_RDWR, 0).unwrap();
    let b = t.open("/f", O_RDWR, 0).unwrap();
    t.flock(a, LOCK_EX).unwrap();
    let a2 = t.dup(a).unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let rx = blocking(&t, b, LOCK_SH, &released);
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    t.close(a).unwrap();
    // One dup left: still held.
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    released.store(true, Ordering::SeqCst);
    t.close(a2).unwrap();
    let (r, after) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((r, after), (Ok(()), true));

    // b shared; c shared; c upgrades and waits for b.
    let c = t.open("/f", O_RDWR, 0).unwrap();
    t.flock(c, LOCK_SH).unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let rx = blocking(&t, c, LOCK_EX, &released);
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    // The waiting upgrade gave its shared lock up first: b may upgrade
    // with LOCK_NB now (and then c waits for b's exclusive lock).
    t.flock(b, LOCK_EX | LOCK_NB).unwrap();
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    released.store(true, Ordering::SeqCst);
    t.flock(b, LOCK_UN).unwrap();
    let (r, after) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((r, after), (Ok(()), true));
    for fd in [b, c] {
        t.close(fd).unwrap();
    }
}

/// Threads taking one exclusive lock in turn (each on its own
/// description), with no lost wake-up and never two inside.
#[test]
fn exclusive_waiters_take_turns() {
    let (_vfs, t) = vfs_with_file();
    let inside = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel();
    for _ in 0..4 {
        let (t, inside, done, tx) = (t.clone(), inside.clone(), done.clone(), tx.clone());
        std::thread::spawn(move || {
            let fd = t.open("/f", O_RDWR, 0).unwrap();
            for i in 0..200 {
                t.flock(fd, if i % 2 == 0 { LOCK_EX } else { LOCK_SH })
                    .unwrap();
                if i % 2 == 0 {
                    assert!(
                        !inside.swap(true, Ordering::SeqCst),
                        "two exclusive holders"
                    );
                    std::thread::yield_now();
                    inside.store(false, Ordering::SeqCst);
                }
                t.flock(fd, LOCK_UN).unwrap();
            }
            t.close(fd).unwrap();
            done.fetch_add(1, Ordering::SeqCst);
            tx.send(()).unwrap();
        });
    }
    for _ in 0..4 {
        rx.recv_timeout(Duration::from_secs(30))
            .expect("a waiter never woke");
    }
    assert_eq!(done.load(Ordering::SeqCst), 4);
}

/// A grant racing with the close of the description's last fd: the lock
/// never outlives the close (another description gets it at once after
/// both are done), whichever comes first.
#[test]
fn grant_racing_with_last_close_leaves_no_lock() {
    let (_vfs, t) = vfs_with_file();
    let other = t.open("/f", O_RDWR, 0).unwrap();
    for i in 0..300 {
        let fd = t.open("/f", O_RDWR, 0).unwrap();
        let t2 = t.clone();
        let h = std::thread::spawn(move || {
            let _ = t2.flock(fd, if i % 2 == 0 { LOCK_EX } else { LOCK_SH });
        });
        t.close(fd).unwrap();
        h.join().unwrap();
        t.flock(other, LOCK_EX | LOCK_NB)
            .unwrap_or_else(|e| panic!("round {i}: a lock outlived its last close: {e:?}"));
        t.flock(other, LOCK_UN).unwrap();
    }
}

/// Entries go when nothing holds or waits: many files locked and unlocked
/// (by LOCK_UN, by the last close, after failed LOCK_NB tries) leave the
/// table as small as before. (Other tests of this binary may hold a few.)
#[test]
fn table_does_not_grow() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    for round in 0..3 {
        let mut fds = Vec::new();
        for i in 0..500 {
            let path = format!("/f{i}");
            let a = t.open(path.as_str(), O_RDWR | O_CREAT, 0o644).unwrap();
            let b = t.open(path.as_str(), O_RDWR, 0).unwrap();
            t.flock(a, LOCK_EX).unwrap();
            assert_eq!(t.flock(b, LOCK_SH | LOCK_NB), Err(Errno::EAGAIN));
            match round {
                0 => t.flock(a, LOCK_UN).unwrap(),
                1 => t.close(a).unwrap(),
                _ => {
                    t.flock(a, LOCK_SH).unwrap();
                    t.flock(b, LOCK_SH).unwrap();
                }
            }
            fds.push(a);
            fds.push(b);
        }
        if round == 2 {
            assert!(flock_table_entries() >= 500);
        }
        for fd in fds {
            let _ = t.close(fd);
        }
        let n = flock_table_entries();
        assert!(n <= 16, "round {round}: {n} entries left");
    }
}

#[test]
fn std_shaped_file_locks() {
    use scalevfs::fs::{Fs, OpenOptionsExt, TryLockError};
    let fs = Fs::new(Vfs::new().root_task());
    let a = fs
        .options()
        .read(true)
        .write(true)
        .create(true)
        .open("/f")
        .unwrap();
    let b = fs.options().read(true).write(true).open("/f").unwrap();
    a.lock().unwrap();
    assert!(matches!(b.try_lock(), Err(TryLockError::WouldBlock)));
    assert!(matches!(b.try_lock_shared(), Err(TryLockError::WouldBlock)));
    // A clone is the same description: it holds the lock too.
    let a2 = a.try_clone().unwrap();
    a2.try_lock().unwrap();
    drop(a);
    assert!(matches!(b.try_lock(), Err(TryLockError::WouldBlock)));
    a2.unlock().unwrap();
    b.try_lock_shared().unwrap();
    a2.lock_shared().unwrap();
    // b's upgrade fails against a2's shared lock (and, as Linux's, leaves
    // b with none); the error converts as std's does.
    let e = b.try_lock().unwrap_err();
    assert!(matches!(e, TryLockError::WouldBlock));
    let e = std::io::Error::from(e);
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    assert_eq!(e.raw_os_error(), Some(libc::EWOULDBLOCK));
    a2.try_lock().unwrap();
    // An fd error is an Error, not WouldBlock.
    let p = fs
        .options()
        .read(true)
        .custom_flags(O_PATH as i32)
        .open("/f");
    if let Ok(p) = p {
        assert!(
            matches!(p.try_lock(), Err(TryLockError::Error(e)) if e.raw_os_error() == Some(libc::EBADF))
        );
    }
    drop(a2);
    b.try_lock().unwrap();
    b.unlock().unwrap();
    b.unlock().unwrap();
}
