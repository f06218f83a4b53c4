//! `zcfs stat TARGET`: a volume image's geometry, usage, log state and persistence mode,
//! the counters and latencies of the server at TARGET = HOST:PORT, or those of the
//! mount TARGET is a directory of.

use crate::backend::{client_config, connect};
use crate::persistence::persistence_of;
use crate::server_report::format_report;
use crate::source::Source;
use anyhow::{anyhow, bail, Result};
use std::path::{Path, PathBuf};
use zcfs_volume::{Volume, VolumeConfig};

#[derive(Debug, clap::Args)]
pub struct StatArgs {
    /// A volume image, a server's address (HOST:PORT, unix:PATH), or a zcfs mount
    /// point (any directory in the mount): its live per-operation figures.
    target: String,
    #[arg(long)]
    json: bool,
    /// Shared secret for a server that requires one.
    #[arg(long)]
    secret_file: Option<PathBuf>,
}

pub fn run(a: &StatArgs) -> Result<i32> {
    if Path::new(&a.target).is_dir() || is_dead_mount(&a.target) {
        return crate::mount_stats::mount_stat(Path::new(&a.target), a.json);
    }
    match a.target.parse::<Source>()? {
        Source::Image(image) => image_stat(&image, a.json),
        Source::Remote(addr) => server_stat(&addr, a.secret_file.as_deref(), a.json),
        Source::Null => bail!("`null` has nothing to show: give a volume image or HOST:PORT"),
    }
}

/// A FUSE mount whose process is gone (stat(2) fails with ENOTCONN): a mount point.
fn is_dead_mount(target: &str) -> bool {
    std::fs::metadata(target).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))
}

fn image_stat(image: &Path, json: bool) -> Result<i32> {
    let vol = match Volume::open(
        image,
        VolumeConfig {
            read_only: true,
            ..Default::default()
        },
    ) {
        Ok(v) => v,
        Err(zcfs_volume::FsError::Busy(m)) => {
            // A live volume's image changes under a reader: ask its server instead.
            bail!("{m}; for a served volume, `zcfs stat ADDRESS` shows its figures")
        }
        Err(e) => return Err(anyhow!(e).context(format!("opening {}", image.display()))),
    };
    let mut info = vol.info();
    info.persistence = persistence_of(image);
    if json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(0);
    }
    let g = &info.geometry;
    let used = info.data_blocks_total - info.data_blocks_free;
    println!("volume     {}", image.display());
    println!("uuid       {}", info.uuid);
    println!(
        "size       {} bytes ({} blocks of 4 KiB)",
        info.size_bytes, g.total_blocks
    );
    println!(
        "layout     superblocks 0-1, log {}+{}, inode table {}+{}, data {}+{}",
        g.log_start, g.log_blocks, g.itable_start, g.itable_blocks, g.data_start, g.data_blocks
    );
    println!(
        "data       {} of {} blocks used ({:.1} %)",
        used,
        info.data_blocks_total,
        100.0 * used as f64 / info.data_blocks_total.max(1) as f64
    );
    println!(
        "inodes     {} of {} used",
        info.inodes_total - info.inodes_free,
        info.inodes_total
    );
    println!(
        "log        ring {} KiB; at open: {} entries replayed{}",
        info.log_ring_bytes / 1024,
        info.recovery.entries_replayed,
        if info.recovery.was_clean {
            " (clean shutdown)"
        } else {
            " (recovered from a crash)"
        }
    );
    println!("mounts     {}", info.mount_count);
    println!("persist    {}", info.persistence);
    Ok(0)
}

fn server_stat(addr: &str, secret_file: Option<&Path>, json: bool) -> Result<i32> {
    let mut cfg = client_config(addr, secret_file)?;
    cfg.connections = 1;
    let fs = connect(cfg)?;
    let raw = fs.server_stats().map_err(|e| anyhow!("{addr}: {e}"))?;
    let r: zcfs_server::StatsReport = serde_json::from_slice(&raw)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", format_report(&r));
    }
    Ok(0)
}
