//! Basic namespace behaviour on memfs, end to end through `Task`.
use scalevfs::*;

#[test]
fn create_stat_rename_unlink() {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    t.mkdir("/a", 0o755).unwrap();
    t.mkdir("/a/b", 0o755).unwrap();
    let fd = t.open("/a/b/f", O_CREAT | O_WRONLY, 0o644).unwrap();
    assert_eq!(t.write(fd, b"hello").unwrap(), 5);
    t.close(fd).unwrap();
    let st = t.stat("/a/b/f").unwrap();
    assert_eq!(st.size, 5);
    assert_eq!(st.mode & 0o777, 0o644);
    assert_eq!(t.stat("/a/b/../b/./f").unwrap().ino, st.ino);
    assert_eq!(t.stat("/a/x"), Err(Errno::ENOENT));
    assert_eq!(t.stat("/a/b/f/x"), Err(Errno::ENOTDIR));
    t.rename("/a/b", "/c").unwrap();
    assert_eq!(t.stat("/c/f").unwrap().ino, st.ino);
    assert_eq!(t.stat("/a/b/f"), Err(Errno::ENOENT));
    t.symlink("/c/f", "/l").unwrap();
    assert_eq!(t.stat("/l").unwrap().ino, st.ino);
    assert_eq!(t.readlink("/l").unwrap(), b"/c/f");
    assert_eq!(t.rmdir("/c"), Err(Errno::ENOTEMPTY));
    t.unlink("/c/f").unwrap();
    t.rmdir("/c").unwrap();
    assert_eq!(t.stat("/l"), Err(Errno::ENOENT));
    let names: Vec<_> = t
        .read_dir("/")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(
        names,
        vec![b".".to_vec(), b"..".to_vec(), b"a".to_vec(), b"l".to_vec()]
    );
    t.chdir("/a").unwrap();
    assert_eq!(t.getcwd().unwrap(), b"/a");
    assert_eq!(t.stat("..").unwrap().ino, t.stat("/").unwrap().ino);
}

#[test]
fn all_variants_basic() {
    for v in LockRefVariant::ALL {
        for idx in [DcacheIndex::GlobalHash, DcacheIndex::PerDir] {
            for auth in [true, false] {
                let mut c = VfsConfig::default();
                c.dcache.lockref = v;
                c.dcache.index = idx;
                c.memfs.authoritative = auth;
                let vfs = Vfs::with_config(c);
                let t = vfs.root_task();
                t.mkdir("/d", 0o755).unwrap();
                t.mknodat(AT_FDCWD, "/d/x", S_IFREG | 0o600, 0).unwrap();
                assert_eq!(t.stat("/d/x").unwrap().mode & 0o777, 0o600);
                assert_eq!(t.stat("/d/y"), Err(Errno::ENOENT));
                t.rename("/d/x", "/d/y").unwrap();
                assert!(t.stat("/d/y").is_ok());
                assert_eq!(t.stat("/d/x"), Err(Errno::ENOENT));
                t.unlink("/d/y").unwrap();
                assert_eq!(t.stat("/d/y"), Err(Errno::ENOENT));
            }
        }
    }
}
