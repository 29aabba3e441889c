//! `jreplay [--dry-run] IMAGE`: replay the jbd2 journal of an ext4 image
//! (one whose superblock says needs_recovery) onto it, as `e2fsck -y -E
//! journal_only` would, printing what recovery found and how long it took.
//! With `--dry-run` the replay goes to a view in memory and the image is
//! not written.

use std::sync::Arc;
use std::time::Instant;

use scalevfs_ext4::{journal, BlockDevice, FileDevice};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dry = args.iter().any(|a| a == "--dry-run");
    let Some(img) = args.iter().find(|a| !a.starts_with("--")) else {
        eprintln!("usage: jreplay [--dry-run] IMAGE");
        std::process::exit(2);
    };
    let dev = match FileDevice::open(img.as_ref(), !dry) {
        Ok(d) => Arc::new(d) as Arc<dyn BlockDevice>,
        Err(e) => {
            eprintln!("{img}: {e}");
            std::process::exit(1);
        }
    };
    let t = Instant::now();
    let r = if dry {
        journal::recover_in_memory(dev).map(|(_, r)| r)
    } else {
        journal::recover(&dev)
    };
    let el = t.elapsed();
    match r {
        Ok(r) => {
            let p = &r.plan;
            println!(
                "transactions {}..{} replayed ({} tags, {} distinct blocks, {} revoke records, \
                 {} tags revoked){}; next sequence {}; {:.1} ms{}",
                p.start_transaction,
                p.end_transaction,
                p.replays,
                p.writes.len(),
                p.revokes,
                p.revoke_hits,
                p.failed_commit
                    .map(|t| format!("; transaction {t} has a corrupt commit block"))
                    .unwrap_or_default(),
                p.next_sequence(),
                el.as_secs_f64() * 1e3,
                if dry {
                    " (dry run: nothing written)"
                } else {
                    ""
                },
            );
        }
        Err(e) => {
            eprintln!("{img}: {e}");
            std::process::exit(1);
        }
    }
}
