//! The shared secret of `serve`, `mount` and `stat` (`--secret-file`, `-o secret_file=`).

use anyhow::{bail, Context, Result};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Read a shared secret (trailing whitespace dropped); warn when others may read it.
pub fn read_secret(path: &Path) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("reading the secret file {}", path.display()))?;
    let secret: Vec<u8> = bytes.trim_ascii_end().to_vec();
    if secret.is_empty() {
        bail!("the secret file {} is empty", path.display());
    }
    if secret.len() < 16 {
        tracing::warn!("the secret in {} is shorter than 16 bytes", path.display());
    }
    if std::fs::metadata(path)?.permissions().mode() & 0o077 != 0 {
        tracing::warn!("{} is readable by others: chmod 600 it", path.display());
    }
    Ok(secret)
}
