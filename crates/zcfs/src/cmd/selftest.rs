//! `zcfs selftest-writer IMAGE` (hidden): writes files into a volume and prints `synced N`
//! after each fsync, so a test can SIGKILL it and check every synced file survived.
//! The test (`tests/cli.rs`) holds its own copy of the content rule.

use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;
use zcfs_volume::{Cred, Volume, VolumeConfig, ROOT_INO};

#[derive(Debug, clap::Args)]
pub struct SelftestWriterArgs {
    image: PathBuf,
    #[arg(long, default_value_t = 1000)]
    files: u64,
    #[arg(long, default_value_t = 10)]
    fsync_every: u64,
}

/// Deterministic content of selftest file `i`.
fn content(i: u64) -> Vec<u8> {
    let len = (i * 7919) % 20000 + 1;
    (0..len)
        .map(|j| (i as u8).wrapping_mul(17).wrapping_add(j as u8))
        .collect()
}

pub fn run(a: &SelftestWriterArgs) -> Result<i32> {
    let vol = Volume::open(&a.image, VolumeConfig::default())?;
    let dir = match vol.lookup(&Cred::ROOT, ROOT_INO, b"selftest") {
        Ok(attr) => attr.ino,
        Err(_) => vol.mkdir(&Cred::ROOT, ROOT_INO, b"selftest", 0o755)?.ino,
    };
    let mut out = std::io::stdout().lock();
    for i in 0..a.files {
        let name = format!("f{i:06}");
        let attr = vol.create(&Cred::ROOT, dir, name.as_bytes(), 0o644, 0)?;
        vol.write(&Cred::ROOT, attr.ino, 0, &content(i))?;
        if (i + 1) % a.fsync_every == 0 {
            vol.fsync(attr.ino)?;
            writeln!(out, "synced {i}")?;
            out.flush()?;
        }
    }
    Ok(0)
}
