//! New directories on an inline_data image live in their inode, as the
//! kernel's ext4 makes them (`ext4_try_create_inline_dir`): entries go
//! into `i_block`, then into the `system.data` attribute grown to the
//! room the inode body has, and the directory moves out to a block only
//! when neither has room (`ext4_try_add_inline_entry`); removals leave it
//! inline. The same script runs through scalevfs on one copy of a fresh
//! image and through the kernel (loop mount) on another: each directory
//! is inline in both or in neither, with the same size, the free block
//! counts agree, e2fsck passes ours, and the kernel reads our tree back
//! as scalevfs does.

mod common;

use std::path::Path;

use common::*;

/// One step of the script, on paths under the root.
enum Step {
    Mkdir(&'static str),
    Create(String),
    Unlink(String),
    Rmdir(&'static str),
    Rename(&'static str, &'static str),
    Exchange(&'static str, &'static str),
}

fn script() -> Vec<Step> {
    use Step::*;
    let mut s = vec![Mkdir("/empty"), Mkdir("/few"), Mkdir("/spill")];
    s.push(Mkdir("/full"));
    s.push(Mkdir("/shrunk"));
    s.push(Mkdir("/long"));
    s.push(Mkdir("/nest"));
    s.push(Mkdir("/nest/sub"));
    s.push(Mkdir("/nest/gone"));
    // Three entries of 12 bytes fit the 56 of i_block.
    for i in 0..3 {
        s.push(Create(format!("/few/f{i}")));
    }
    // Six spill into system.data (three fit i_block at 16 bytes each,
    // four the attribute's 68 on 256-byte inodes).
    for i in 0..6 {
        s.push(Create(format!("/spill/name-{i}")));
    }
    // Thirty need a block.
    for i in 0..30 {
        s.push(Create(format!("/full/entry-{i:02}")));
    }
    for i in 0..8 {
        s.push(Create(format!("/shrunk/s{i}")));
    }
    for i in [0, 2, 5, 7] {
        s.push(Unlink(format!("/shrunk/s{i}")));
    }
    // A name longer than both regions: a block at once.
    s.push(Create(format!("/long/{}", "n".repeat(100))));
    s.push(Rmdir("/nest/gone"));
    s.push(Create("/nest/sub/leaf".into()));
    // Renames: within an inline directory (the insert spills into the
    // attribute), across two, over an existing name, a moved directory
    // (its `..` in its inode), one that no longer fits (a block), and
    // exchanges of files and of directories between inline parents.
    s.push(Rename("/few/f0", "/few/renamed-f0"));
    s.push(Rename("/few/f1", "/shrunk/s0"));
    s.push(Rename("/few/f2", "/shrunk/s1"));
    s.push(Mkdir("/moves"));
    s.push(Mkdir("/moves/a"));
    s.push(Mkdir("/moves/b"));
    s.push(Rename("/moves/a", "/nest/sub/a"));
    s.push(Create("/moves/b/x".into()));
    s.push(Exchange("/moves/b", "/nest/sub/a"));
    s.push(Exchange("/nest/sub/leaf", "/nest/sub/a/x"));
    s.push(Mkdir("/tight"));
    for i in 0..7 {
        s.push(Create(format!("/tight/t{i}")));
    }
    s.push(Rename("/shrunk/s3", "/tight/a-name-longer-than-the-room"));
    s
}

const DIRS: [&str; 12] = [
    "/empty",
    "/few",
    "/spill",
    "/full",
    "/shrunk",
    "/long",
    "/nest",
    "/nest/sub",
    "/nest/sub/a",
    "/moves",
    "/moves/b",
    "/tight",
];

/// Inline flag and size of `path` in `img`, as debugfs shows them.
fn shape(img: &Path, path: &str) -> (bool, u64) {
    let out = debugfs_ro(img, &format!("stat {path}"));
    let field = |key: &str| {
        out.split(key)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no {key} in debugfs stat {path}: {out}"))
            .to_string()
    };
    let flags = u32::from_str_radix(&field("Flags: 0x"), 16).unwrap();
    (flags & 0x1000_0000 != 0, field("Size: ").parse().unwrap())
}

/// renameat2(RENAME_EXCHANGE) on the host.
fn exchange(a: &Path, b: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let (a, b) = (c(a), c(b));
    // SAFETY: both are valid NUL-terminated paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(r, 0, "{:?}", std::io::Error::last_os_error());
}

fn free_blocks(img: &Path) -> u64 {
    sb_field(img, "Free blocks").parse().unwrap()
}

#[test]
fn new_directories_are_inline_as_the_kernels() {
    if !have_tools() {
        eprintln!("skipped: mkfs.ext4/e2fsck not found");
        return;
    }
    for bs in [1024usize, 4096] {
        let s = Scratch::new("inline-dirs");
        let ours = fresh_with(&s.0, bs, "16M", "inline_data,orphan_file");
        let theirs = s.0.join("theirs");
        std::fs::copy(&ours, &theirs).unwrap();
        let before = free_blocks(&ours);
        {
            let (e, vfs) = mount(&ours);
            let t = vfs.root_task();
            for step in script() {
                match step {
                    Step::Mkdir(p) => t.mkdir(p, 0o755).unwrap(),
                    Step::Create(p) => {
                        let fd = t
                            .open(&p, scalevfs::O_CREAT | scalevfs::O_WRONLY, 0o644)
                            .unwrap();
                        t.close(fd).unwrap();
                    }
                    Step::Unlink(p) => t.unlink(&p).unwrap(),
                    Step::Rmdir(p) => t.rmdir(p).unwrap(),
                    Step::Rename(a, b) => t.rename(a, b).unwrap(),
                    Step::Exchange(a, b) => t
                        .renameat2(
                            scalevfs::AT_FDCWD,
                            a,
                            scalevfs::AT_FDCWD,
                            b,
                            scalevfs::RENAME_EXCHANGE,
                        )
                        .unwrap(),
                }
            }
            // While mounted: the listing and the sizes the VFS shows.
            let mut names: Vec<String> = t
                .read_dir("/shrunk")
                .unwrap()
                .into_iter()
                .map(|d| String::from_utf8(d.name.to_vec()).unwrap())
                .filter(|n| n != "." && n != "..")
                .collect();
            names.sort();
            assert_eq!(names, ["s0", "s1", "s4", "s6"], "bs {bs}");
            unmount_clean(t, vfs, e, &ours);
        }
        // Ours took no block for the inline directories: only /full's and
        // /long's (and the htree or nothing else).
        let used = before - free_blocks(&ours);
        let Some(km) = KMount::rw(&theirs, &s.0.join("kmnt")) else {
            // Without the kernel: at least the shapes the rules give.
            assert_eq!(shape(&ours, "/empty"), (true, 60), "bs {bs}");
            assert!(!shape(&ours, "/full").0, "bs {bs}");
            continue;
        };
        for step in script() {
            let p = |q: &str| km.0.join(q.trim_start_matches('/'));
            match step {
                Step::Mkdir(q) => std::fs::create_dir(p(q)).unwrap(),
                Step::Create(q) => drop(std::fs::File::create(p(&q)).unwrap()),
                Step::Unlink(q) => std::fs::remove_file(p(&q)).unwrap(),
                Step::Rmdir(q) => std::fs::remove_dir(p(q)).unwrap(),
                Step::Rename(a, b) => std::fs::rename(p(a), p(b)).unwrap(),
                Step::Exchange(a, b) => exchange(&p(a), &p(b)),
            }
        }
        drop(km);
        fsck_clean(&theirs);
        for d in DIRS {
            assert_eq!(shape(&ours, d), shape(&theirs, d), "bs {bs}: {d}");
        }
        assert!(shape(&ours, "/spill").1 > 60, "bs {bs}: /spill grew");
        assert_eq!(used, before - free_blocks(&theirs), "bs {bs}: blocks used");
        // The kernel reads our tree as scalevfs wrote it.
        let km = KMount::new(&ours, &s.0.join("kmnt2")).unwrap();
        let tree = host_tree(&km.0);
        drop(km);
        let km = KMount::new(&theirs, &s.0.join("kmnt3")).unwrap();
        let expect = host_tree(&km.0);
        drop(km);
        let names = |t: &std::collections::BTreeMap<String, Node>| -> Vec<String> {
            t.keys().cloned().collect()
        };
        assert_eq!(names(&tree), names(&expect), "bs {bs}");
    }
}
