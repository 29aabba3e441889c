//! `scalevfs mount` without the rest of the CLI:
//! `cargo run -p scalevfs-fuse --example mount -- DIR -f`.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: scalevfs_fuse::MountArgs,
}

fn main() -> std::process::ExitCode {
    scalevfs_fuse::run_mount(Cli::parse().args)
}
