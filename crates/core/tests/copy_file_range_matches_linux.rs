//! `copy_file_range(2)` against the host kernel: the same cases run on a
//! scalevfs `Vfs` and on files in the host's /dev/shm (tmpfs), comparing
//! each call's result (bytes copied or errno), the positions it leaves and
//! the target's contents. Without /dev/shm only the annotated expectations
//! are checked.

use std::ffi::CString;

use scalevfs::*;

/// The fds a case uses, opened the same way on both sides.
#[derive(Clone, Copy, Debug)]
enum F {
    /// "a": 100 bytes of 'a'..; O_RDWR.
    A,
    /// "b": empty; O_RDWR.
    B,
    /// "a" again, O_RDONLY.
    ARo,
    /// "b" again, O_WRONLY.
    BWo,
    /// "c": O_RDWR|O_APPEND.
    CAppend,
    /// The directory itself, O_RDONLY.
    Dir,
    /// "a" as O_PATH.
    APath,
    /// An fd number that is not open.
    Bad,
}

struct Case {
    what: &'static str,
    fin: F,
    off_in: Option<i64>,
    fout: F,
    off_out: Option<i64>,
    len: usize,
    flags: u32,
    /// What Linux gives (checked on both sides): Ok(n) or Err(errno).
    expect: Result<usize, i32>,
}

fn cases() -> Vec<Case> {
    use F::*;
    let c = |what, fin, off_in, fout, off_out, len, flags, expect| Case {
        what,
        fin,
        off_in,
        fout,
        off_out,
        len,
        flags,
        expect,
    };
    vec![
        c("plain", A, Some(0), B, Some(0), 10, 0, Ok(10)),
        c(
            "to an offset past EOF (hole)",
            A,
            Some(5),
            B,
            Some(50),
            20,
            0,
            Ok(20),
        ),
        c(
            "source shorter than len",
            A,
            Some(90),
            B,
            Some(0),
            1000,
            0,
            Ok(10),
        ),
        c(
            "past the source's end",
            A,
            Some(200),
            B,
            Some(0),
            10,
            0,
            Ok(0),
        ),
        c("len 0", A, Some(0), B, Some(0), 0, 0, Ok(0)),
        c(
            "positions used (a at 100 after its write)",
            A,
            None,
            B,
            None,
            10,
            0,
            Ok(0),
        ),
        c(
            "source position, target offset",
            ARo,
            None,
            B,
            Some(3),
            7,
            0,
            Ok(7),
        ),
        c("flags", A, Some(0), B, Some(0), 10, 1, Err(libc::EINVAL)),
        c(
            "directory in",
            Dir,
            Some(0),
            B,
            Some(0),
            10,
            0,
            Err(libc::EISDIR),
        ),
        c(
            "directory out",
            A,
            Some(0),
            Dir,
            Some(0),
            10,
            0,
            Err(libc::EISDIR),
        ),
        c(
            "read-only target",
            A,
            Some(0),
            ARo,
            Some(0),
            10,
            0,
            Err(libc::EBADF),
        ),
        c(
            "write-only source",
            BWo,
            Some(0),
            A,
            Some(0),
            10,
            0,
            Err(libc::EBADF),
        ),
        c(
            "append target",
            A,
            Some(0),
            CAppend,
            Some(0),
            10,
            0,
            Err(libc::EBADF),
        ),
        c(
            "O_PATH source",
            APath,
            Some(0),
            B,
            Some(0),
            10,
            0,
            Err(libc::EBADF),
        ),
        c("bad fd", Bad, Some(0), B, Some(0), 10, 0, Err(libc::EBADF)),
        c(
            "negative offset in",
            A,
            Some(-1),
            B,
            Some(0),
            10,
            0,
            Err(libc::EOVERFLOW),
        ),
        c(
            "negative offset out",
            A,
            Some(0),
            B,
            Some(-1),
            10,
            0,
            Err(libc::EOVERFLOW),
        ),
        c(
            "target at the size limit: short",
            A,
            Some(0),
            B,
            Some(i64::MAX - 4),
            10,
            0,
            Ok(4),
        ),
        c(
            "overlap in one file",
            A,
            Some(0),
            A,
            Some(5),
            10,
            0,
            Err(libc::EINVAL),
        ),
        c(
            "one file, no overlap",
            A,
            Some(0),
            A,
            Some(50),
            10,
            0,
            Ok(10),
        ),
        c("huge len", A, Some(0), B, Some(0), 1 << 62, 0, Ok(100)),
    ]
}

const SRC: usize = 100;

fn src_data() -> Vec<u8> {
    (0..SRC).map(|i| b'a' + (i % 26) as u8).collect()
}

/// Result, the two positions after (None for fds without one), and the
/// contents of "b" (sparse: length and a hash of its bytes).
type Outcome = (Result<usize, i32>, Option<u64>, Option<u64>, u64, u64);

fn digest(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn run_scalevfs(c: &Case) -> Outcome {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.mkdir("/d", 0o755).unwrap();
    let a = t.open("/d/a", O_CREAT | O_RDWR, 0o644).unwrap();
    t.write(a, &src_data()).unwrap();
    let b = t.open("/d/b", O_CREAT | O_RDWR, 0o644).unwrap();
    let c_ = t.open("/d/c", O_CREAT | O_RDWR | O_APPEND, 0o644).unwrap();
    let aro = t.open("/d/a", O_RDONLY, 0).unwrap();
    let bwo = t.open("/d/b", O_WRONLY, 0).unwrap();
    let dir = t.open("/d", O_RDONLY | O_DIRECTORY, 0).unwrap();
    let apath = t.open("/d/a", O_PATH, 0).unwrap();
    let fd = |f: F| match f {
        F::A => a,
        F::B => b,
        F::ARo => aro,
        F::BWo => bwo,
        F::CAppend => c_,
        F::Dir => dir,
        F::APath => apath,
        F::Bad => 900,
    };
    let r = t
        .copy_file_range(fd(c.fin), c.off_in, fd(c.fout), c.off_out, c.len, c.flags)
        .map_err(|e| e.raw());
    let pos = |f: F| match f {
        F::Bad | F::APath | F::Dir => None,
        f => Some(t.lseek(fd(f), 0, scalevfs::io::SEEK_CUR).unwrap()),
    };
    let st = t.stat("/d/b").unwrap();
    let mut data = vec![0u8; st.size.min(1 << 20) as usize];
    let n = t.pread(b, &mut data, 0).unwrap();
    data.truncate(n);
    (r, pos(c.fin), pos(c.fout), st.size, digest(&data))
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// The same on the host, in a fresh directory of /dev/shm.
fn run_host(c: &Case, k: usize) -> Option<Outcome> {
    let dir = format!("/dev/shm/scalevfs-cfr-{}-{k}", std::process::id());
    std::fs::create_dir(&dir).ok()?;
    let open = |name: &str, flags: i32| {
        let p = cstr(&format!("{dir}/{name}"));
        // SAFETY: open with a valid C string.
        let fd = unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC, 0o644) };
        assert!(fd >= 0, "open {name}");
        fd
    };
    let a = open("a", libc::O_CREAT | libc::O_RDWR);
    let data = src_data();
    // SAFETY: writing our buffer to our fd.
    let w = unsafe { libc::write(a, data.as_ptr().cast(), data.len()) };
    assert_eq!(w, SRC as isize);
    let b = open("b", libc::O_CREAT | libc::O_RDWR);
    let c_ = open("c", libc::O_CREAT | libc::O_RDWR | libc::O_APPEND);
    let aro = open("a", libc::O_RDONLY);
    let bwo = open("b", libc::O_WRONLY);
    let dfd = open("", libc::O_RDONLY | libc::O_DIRECTORY);
    let apath = open("a", libc::O_PATH);
    let fd = |f: F| match f {
        F::A => a,
        F::B => b,
        F::ARo => aro,
        F::BWo => bwo,
        F::CAppend => c_,
        F::Dir => dfd,
        F::APath => apath,
        F::Bad => 900,
    };
    let mut oi = c.off_in.unwrap_or(0);
    let mut oo = c.off_out.unwrap_or(0);
    let pi: *mut i64 = if c.off_in.is_some() {
        &mut oi
    } else {
        std::ptr::null_mut()
    };
    let po: *mut i64 = if c.off_out.is_some() {
        &mut oo
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: fds are ours (or deliberately not open); the offset pointers
    // are null or point at live locals.
    let n = unsafe { libc::copy_file_range(fd(c.fin), pi, fd(c.fout), po, c.len, c.flags) };
    let r = if n < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(n as usize)
    };
    let pos = |f: F| match f {
        F::Bad | F::APath | F::Dir => None,
        // SAFETY: lseek on our fd.
        f => Some(unsafe { libc::lseek(fd(f), 0, libc::SEEK_CUR) } as u64),
    };
    let (p1, p2) = (pos(c.fin), pos(c.fout));
    let meta = std::fs::metadata(format!("{dir}/b")).unwrap();
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(format!("{dir}/b")).unwrap();
    let mut buf = vec![0u8; meta.len().min(1 << 20) as usize];
    let got = f.read_at(&mut buf, 0).unwrap();
    buf.truncate(got);
    for x in [a, b, c_, aro, bwo, dfd, apath] {
        // SAFETY: closing our fds.
        unsafe { libc::close(x) };
    }
    let _ = std::fs::remove_dir_all(&dir);
    Some((r, p1, p2, meta.len(), digest(&buf)))
}

#[test]
fn copy_file_range_matches_linux() {
    let mut host_ran = 0;
    for (k, c) in cases().iter().enumerate() {
        let ours = run_scalevfs(c);
        assert_eq!(ours.0, c.expect, "{}: scalevfs result", c.what);
        if let Some(host) = run_host(c, k) {
            host_ran += 1;
            assert_eq!(
                host.0, c.expect,
                "{}: the host's result (annotation wrong?)",
                c.what
            );
            assert_eq!(
                ours, host,
                "{}: scalevfs vs host (result, positions, target)",
                c.what
            );
        }
    }
    if host_ran == 0 {
        eprintln!("host comparison skipped: /dev/shm is not usable here");
    }
}

/// A copy moves data between files of one mount without the caller's
/// buffer, in bounded steps: a 5 MiB copy arrives intact.
#[test]
fn a_large_copy_arrives_intact() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let data: Vec<u8> = (0..5 << 20)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let a = t.open("/a", O_CREAT | O_RDWR, 0o644).unwrap();
    t.write(a, &data).unwrap();
    let b = t.open("/b", O_CREAT | O_RDWR, 0o644).unwrap();
    assert_eq!(
        t.copy_file_range(a, Some(0), b, Some(0), data.len(), 0),
        Ok(data.len())
    );
    let mut back = vec![0u8; data.len()];
    assert_eq!(t.pread(b, &mut back, 0), Ok(data.len()));
    assert!(back == data);
    // Across mounts: EXDEV, as between two tmpfs.
    t.mkdir("/m", 0o755).unwrap();
    t.mount(
        "/m",
        std::sync::Arc::new(scalevfs::memfs::MemFs::new(7, Default::default())),
        false,
    )
    .unwrap();
    let c = t.open("/m/c", O_CREAT | O_RDWR, 0o644).unwrap();
    assert_eq!(
        t.copy_file_range(a, Some(0), c, Some(0), 10, 0),
        Err(Errno::EXDEV)
    );
}
