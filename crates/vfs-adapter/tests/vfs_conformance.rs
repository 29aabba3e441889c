//! The `vfs` crate's own conformance suite against [`ScaleFS`]: served
//! whole (a fresh memfs per test), and served from a subdirectory as
//! `PhysicalFS` serves one.

// The macro's own code (not ours) trips these.
#![allow(clippy::useless_vec)]

use scalevfs::stdfs::Fs;
use scalevfs_vfs_adapter::ScaleFS;

mod whole {
    use super::*;
    vfs::test_vfs!(ScaleFS::new_memory());
}

mod subdir {
    use super::*;
    fn in_subdir() -> ScaleFS {
        let fs = Fs::new(scalevfs::Vfs::new().root_task());
        fs.create_dir_all("/srv/root").unwrap();
        ScaleFS::with_root(fs, "/srv/root/")
    }
    vfs::test_vfs!(in_subdir());
}
