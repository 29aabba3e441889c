//! `ext4ls IMAGE [PATH]`: list a directory of an ext4 image through the
//! library (no VFS), printing full error messages. A debugging aid.

use scalevfs::Filesystem;
use scalevfs_ext4::{Ext4, Ext4Options};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(img) = args.get(1) else {
        eprintln!("usage: ext4ls IMAGE [PATH]");
        std::process::exit(2);
    };
    let fs = match Ext4::open(img.as_ref(), Ext4Options::default()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let mut raw = fs.read_inode(2).expect("root");
    for comp in args.get(2).map(|s| s.as_str()).unwrap_or("").split('/') {
        if comp.is_empty() {
            continue;
        }
        match fs.lookup_name(&raw, comp.as_bytes()) {
            Ok(Some(ino)) => raw = fs.read_inode(ino).expect("inode"),
            Ok(None) => {
                eprintln!("{comp}: not found");
                std::process::exit(1);
            }
            Err(e) => {
                eprintln!("{comp}: {e}");
                std::process::exit(1);
            }
        }
    }
    let r = fs.list(&raw, &mut |ino, name| {
        println!("{ino:8} {}", String::from_utf8_lossy(name));
        true
    });
    if let Err(e) = r {
        eprintln!("{e}");
        std::process::exit(1);
    }
    let st = fs.statfs();
    eprintln!("statfs: {st:?}");
}
