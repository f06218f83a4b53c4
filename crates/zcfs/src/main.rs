//! `zcfs`: the command-line tool. This file parses the command line and hands it to the
//! subcommand's module; errors come back here and are printed with what failed and what
//! to do (the libraries below return typed errors).

mod backend;
mod cmd;
mod files;
mod location;
mod mount_stats;
mod persistence;
mod pipeline;
mod process;
mod secret;
mod server_report;
mod source;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::ffi::OsString;

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
    Mount(cmd::mount::MountArgs),
    /// Unmount a zcfs mount.
    Umount(cmd::mount::UmountArgs),
    /// Install /sbin/mount.fuse.zcfs so `mount -t fuse.zcfs` and fstab lines work.
    InstallHelper(cmd::helper::InstallHelperArgs),
    /// Copy files between local paths and servers (HOST:PORT:/path), as cp and scp.
    Cp(cmd::cp::CpArgs),
    /// Write files on a server (HOST:PORT:/path) to standard output.
    Cat(cmd::cat::CatArgs),
    /// List a directory on a server (HOST:PORT:/path); -l for details.
    Ls(cmd::ls::LsArgs),
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
    let args = command_line()?;
    match Cli::parse_from(&args).cmd {
        Cmd::Mkfs(a) => cmd::mkfs::run(&a),
        Cmd::Fsck(a) => cmd::fsck::run(&a),
        Cmd::Stat(a) => cmd::stat::run(&a),
        Cmd::Serve(a) => cmd::serve::run(&a),
        Cmd::Mount(a) => cmd::mount::run(&a, &args[1..]),
        Cmd::Umount(a) => cmd::mount::run_umount(&a),
        Cmd::InstallHelper(a) => cmd::helper::install(&a),
        Cmd::SelftestWriter(a) => cmd::selftest::run(&a),
        Cmd::Cp(a) => cmd::cp::run(&a),
        Cmd::Cat(a) => cmd::cat::run(&a),
        Cmd::Ls(a) => cmd::ls::run(&a),
    }
}

/// This process's arguments, or, when run as mount(8)'s helper `mount.fuse.zcfs` (a link
/// to this binary), the `zcfs mount --daemon` command line that call stands for.
fn command_line() -> Result<Vec<OsString>> {
    let args: Vec<OsString> = std::env::args_os().collect();
    let helper = args
        .first()
        .is_some_and(|a0| a0.to_string_lossy().ends_with("mount.fuse.zcfs"));
    if helper {
        cmd::helper::as_mount_command(args)
    } else {
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_mount_helper_call_parses_as_a_daemon_mount() {
        let argv = [
            "/sbin/mount.fuse.zcfs",
            "-src:7070",
            "/mnt/z",
            "-o",
            "-x,=y",
            "-odefault_permissions",
        ]
        .map(OsString::from)
        .to_vec();
        let command = cmd::helper::as_mount_command(argv).unwrap();
        let Cmd::Mount(m) = Cli::try_parse_from(command).unwrap().cmd else {
            panic!("not a mount");
        };
        assert_eq!(
            (m.source.as_str(), m.mountpoint.to_str().unwrap()),
            ("-src:7070", "/mnt/z")
        );
        assert_eq!(m.options, ["-x,=y", "default_permissions"]);
        assert!(m.daemon);
    }
}
