//! `zcfs`: the command-line tool. This file parses the command line and hands it to the
//! subcommand's module; errors come back here and are printed with what failed and what
//! to do (the libraries below return typed errors).

mod backend;
mod cmd;
mod mount;
mod persistence;
mod process;
mod secret;
mod server_report;
mod source;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "zcfs",
    version,
    about = "zcfs: a zero-copy, crash-consistent file system for persistent memory"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a volume on IMAGE (a file, e.g. in /dev/shm, or a /dev/dax device).
    Mkfs(cmd::mkfs::MkfsArgs),
    /// Check a volume. Exit status: 0 clean, 1 problems all repaired, 4 problems left,
    /// 8 the check could not run.
    Fsck(cmd::fsck::FsckArgs),
    /// Geometry, usage, log state and persistence mode of a volume image, or the
    /// counters of a running server (TARGET = HOST:PORT).
    Stat(cmd::stat::StatArgs),
    /// Export a volume (or `null`) over TCP.
    Serve(cmd::serve::ServeArgs),
    /// Mount SOURCE (a volume image, HOST:PORT, or `null`) on MOUNTPOINT through FUSE.
    /// Runs in the foreground until unmounted or sent SIGINT/SIGTERM.
    Mount(mount::MountArgs),
    /// Unmount a zcfs mount.
    Umount {
        mountpoint: PathBuf,
        /// Detach now even if busy; the mount goes away when no longer used.
        #[arg(long)]
        lazy: bool,
    },
    /// Install /sbin/mount.fuse.zcfs so `mount -t fuse.zcfs` and fstab lines work.
    InstallHelper {
        #[arg(long, default_value = "/sbin/mount.fuse.zcfs")]
        path: PathBuf,
    },
    /// Test helper: write files into a volume, printing each fsync it completes.
    #[command(hide = true)]
    SelftestWriter(cmd::selftest::SelftestWriterArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let code = match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("zcfs: {e:#}");
            8
        }
    };
    std::process::exit(code);
}

fn run() -> Result<i32> {
    let argv0 = std::env::args().next().unwrap_or_default();
    if argv0.ends_with("mount.fuse.zcfs") {
        return mount::helper_main(std::env::args().skip(1).collect());
    }
    match Cli::parse().cmd {
        Cmd::Mkfs(a) => cmd::mkfs::run(&a),
        Cmd::Fsck(a) => cmd::fsck::run(&a),
        Cmd::Stat(a) => cmd::stat::run(&a),
        Cmd::Serve(a) => cmd::serve::run(&a),
        Cmd::Mount(a) => mount::mount(&a),
        Cmd::Umount { mountpoint, lazy } => mount::umount(&mountpoint, lazy),
        Cmd::InstallHelper { path } => {
            let exe = std::env::current_exe()?;
            let _ = std::fs::remove_file(&path);
            std::os::unix::fs::symlink(&exe, &path)
                .with_context(|| format!("linking {} to {}", path.display(), exe.display()))?;
            println!("{} -> {}: `mount -t fuse.zcfs SOURCE MOUNTPOINT -o OPTIONS` and fstab lines now work", path.display(), exe.display());
            Ok(0)
        }
        Cmd::SelftestWriter(a) => cmd::selftest::run(&a),
    }
}
