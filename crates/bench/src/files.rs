//! `zcfs-bench create-files DIR COUNT`: the small-file test of `scripts/bench.sh`, COUNT
//! files of 4 KiB each created, written and closed (f0, f1, ...), as a program saving
//! many small files does.

use anyhow::{Context, Result};
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

pub fn create_files(dir: &Path, count: usize) -> Result<()> {
    let buf = [b'x'; 4096];
    for i in 0..count {
        let path = dir.join(format!("f{i}"));
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        f.write_all(&buf)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
