//! The shared secret of `serve`, `mount` and `stat` (`--secret-file`, `-o secret_file=`).

use anyhow::{bail, Context, Result};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Read a shared secret (trailing whitespace dropped). Refused, as ssh refuses a key,
/// when the file may be read or written by its group or others. The secret itself is
/// never logged nor put in an error.
pub fn read_secret(path: &Path) -> Result<Vec<u8>> {
    let mode = std::fs::metadata(path)
        .with_context(|| format!("reading the secret file {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        bail!(
            "the secret file {} is accessible by group or others (mode {:03o}): run `chmod 600 {}`",
            path.display(),
            mode & 0o777,
            path.display()
        );
    }
    let bytes = std::fs::read(path)
        .with_context(|| format!("reading the secret file {}", path.display()))?;
    let secret: Vec<u8> = bytes.trim_ascii_end().to_vec();
    if secret.is_empty() {
        bail!("the secret file {} is empty", path.display());
    }
    if secret.len() < 16 {
        tracing::warn!("the secret in {} is shorter than 16 bytes", path.display());
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A secret file with `mode`, in a fresh private directory.
    fn secret_file(tag: &str, mode: u32) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("zcfs-secret-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("secret");
        std::fs::write(&p, "a-secret-of-enough-length\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn a_secret_file_open_to_group_or_others_is_refused_naming_the_fix() {
        for mode in [0o640, 0o604, 0o660, 0o644, 0o610, 0o601] {
            let p = secret_file(&format!("{mode:o}"), mode);
            let e = format!("{:#}", read_secret(&p).unwrap_err());
            assert!(e.contains(&format!("chmod 600 {}", p.display())), "{e}");
            assert!(
                !e.contains("a-secret"),
                "the secret leaked into the error: {e}"
            );
            std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
        }
        for mode in [0o600, 0o400] {
            let p = secret_file(&format!("{mode:o}"), mode);
            assert_eq!(read_secret(&p).unwrap(), b"a-secret-of-enough-length");
            std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
        }
    }
}
