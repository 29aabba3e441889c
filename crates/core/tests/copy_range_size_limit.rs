//! `copy_file_range(2)` to an offset at the filesystem's size limit
//! (i64::MAX on tmpfs and memfs) is EFBIG whatever the count: Linux's
//! `generic_write_check_limits` refuses `pos >= s_maxbytes` before the
//! copy is shortened to nothing (a source at its end, or `len` 0) and
//! before `len == 0` returns. memfs returned 0 for those. Each case runs
//! on files in the host's /dev/shm and on a memfs and must match the
//! annotation on both.

use std::ffi::CString;

use scalevfs::*;

/// (what, off_in, off_out, len, what Linux returns); the source holds 100
/// bytes, the target is empty.
type Case = (&'static str, i64, i64, usize, Result<usize, i32>);

const CASES: &[Case] = &[
    ("copy to i64::MAX", 0, i64::MAX, 10, Err(libc::EFBIG)),
    ("nothing to i64::MAX", 0, i64::MAX, 0, Err(libc::EFBIG)),
    (
        "from past the source's end to i64::MAX",
        200,
        i64::MAX,
        10,
        Err(libc::EFBIG),
    ),
    ("to one below i64::MAX: short", 0, i64::MAX - 1, 10, Ok(1)),
    (
        "nothing to one below i64::MAX",
        200,
        i64::MAX - 1,
        10,
        Ok(0),
    ),
    (
        "offset overflow first",
        0,
        i64::MAX,
        usize::MAX,
        Err(libc::EOVERFLOW),
    ),
];

fn host(dir: &str, off_in: i64, off_out: i64, len: usize) -> Result<usize, i32> {
    let src = CString::new(format!("{dir}/src")).unwrap();
    let dst = CString::new(format!("{dir}/dst")).unwrap();
    // SAFETY: plain system calls on files we own, with buffers and offsets
    // that outlive them.
    unsafe {
        let a = libc::open(
            src.as_ptr(),
            libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC,
            0o644,
        );
        let b = libc::open(
            dst.as_ptr(),
            libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC,
            0o644,
        );
        assert!(a >= 0 && b >= 0);
        assert_eq!(libc::write(a, [1u8; 100].as_ptr().cast(), 100), 100);
        let (mut i, mut o) = (off_in, off_out);
        let r = libc::copy_file_range(a, &mut i, b, &mut o, len, 0);
        let r = if r < 0 {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap())
        } else {
            Ok(r as usize)
        };
        libc::close(a);
        libc::close(b);
        r
    }
}

#[test]
fn copy_to_the_size_limit_is_efbig() {
    let dir = format!("/dev/shm/review-bounds-cfr-{}", std::process::id());
    let have_host = match std::fs::create_dir(&dir) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("SKIP the host tmpfs half: cannot make {dir}: {e}; memfs only");
            false
        }
    };
    let vfs = Vfs::new();
    let t = vfs.root_task();
    for &(what, off_in, off_out, len, want) in CASES {
        if have_host {
            assert_eq!(host(&dir, off_in, off_out, len), want, "{what}: host tmpfs");
        }
        let a = t.open("/src", O_CREAT | O_RDWR | O_TRUNC, 0o644).unwrap();
        let b = t.open("/dst", O_CREAT | O_RDWR | O_TRUNC, 0o644).unwrap();
        assert_eq!(t.write(a, &[1u8; 100]), Ok(100));
        let got = t
            .copy_file_range(a, Some(off_in), b, Some(off_out), len, 0)
            .map_err(|e| e.raw());
        assert_eq!(got, want, "{what}: memfs");
        // Nothing written past the limit, the target's size as the copy left it.
        let size = t.fstat(b).unwrap().size;
        assert_eq!(
            size,
            if got == Ok(1) { i64::MAX as u64 } else { 0 },
            "{what}"
        );
        t.close(a).unwrap();
        t.close(b).unwrap();
    }
    if have_host {
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
