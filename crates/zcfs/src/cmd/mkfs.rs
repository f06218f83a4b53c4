//! `zcfs mkfs IMAGE --size SIZE`: make a volume on a file or a DAX device.

use crate::persistence::persistence_of;
use anyhow::{bail, Context, Result};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use zcfs_volume::{MkfsOptions, RootDir, Volume, VolumeConfig};

#[derive(Debug, clap::Args)]
pub struct MkfsArgs {
    image: PathBuf,
    /// Volume size, e.g. 1G, 512M, 65536 (ignored for DAX devices).
    #[arg(long, value_parser = parse_size)]
    size: u64,
    /// Overwrite an existing volume or a non-empty file.
    #[arg(long)]
    force: bool,
    /// Number of inodes (default: one per 16 KiB).
    #[arg(long)]
    inodes: Option<u64>,
    /// Size of the operation log ring (default: 1/64 of the volume, 64 KiB..64 MiB).
    #[arg(long, value_parser = parse_size)]
    log_size: Option<u64>,
    /// Owner of the root directory, UID:GID (default 0:0), as mke2fs's root_owner: a
    /// volume a user exports needs no root to set up.
    #[arg(long, value_parser = parse_owner)]
    root_owner: Option<(u32, u32)>,
    /// Permission bits of the root directory, in octal (default 755).
    #[arg(long, value_parser = parse_mode)]
    root_mode: Option<u32>,
    /// Leave a file image sparse: its memory is taken as it is written (by default it
    /// is allocated now, so a full /dev/shm is found here rather than by the server
    /// getting SIGBUS on a write, and no write pays for clearing fresh pages).
    #[arg(long)]
    sparse: bool,
}

fn parse_owner(s: &str) -> std::result::Result<(u32, u32), String> {
    let (u, g) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: give UID:GID, e.g. 1000:1000"))?;
    let num = |x: &str| {
        x.parse::<u32>()
            .map_err(|_| format!("{x:?} in {s:?} is not a number"))
    };
    Ok((num(u)?, num(g)?))
}

fn parse_mode(s: &str) -> std::result::Result<u32, String> {
    match u32::from_str_radix(s, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(format!(
            "{s:?}: give permission bits in octal, at most 7777"
        )),
    }
}

/// A byte count with an optional binary unit: 65536, 64K, 512M, 4G, 1T (KB, KiB, ... too).
fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let m = match s[i..].to_ascii_lowercase().as_str() {
                "k" | "kb" | "kib" => 1u64 << 10,
                "m" | "mb" | "mib" => 1 << 20,
                "g" | "gb" | "gib" => 1 << 30,
                "t" | "tb" | "tib" => 1 << 40,
                other => return Err(format!("unknown size unit {other:?} (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        None => (s, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a size: {s:?}"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// Refuse, before anything is written, an image the file system holding it has no room
/// to allocate (what the file already has allocated counts as room).
fn room_for(image: &Path, size: u64) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let dir = match image.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: statvfs is plain integers, for which all zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs the call fills in.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Ok(()); // Cannot tell: fallocate will.
    }
    let free = st.f_bavail as u64 * st.f_frsize as u64;
    let have = std::fs::metadata(image).map_or(0, |m| m.blocks() * 512);
    if size > free.saturating_add(have) {
        bail!(
            "{}: the file system holding it has {} bytes free, the volume needs {size} (add \
             --sparse to take memory only as the volume fills, at the risk of running out later)",
            image.display(),
            free.saturating_add(have)
        );
    }
    Ok(())
}

/// Allocate every byte of the image file now (fallocate; contents unchanged). A file
/// system without fallocate leaves it sparse, with a note.
fn preallocate(image: &Path) -> Result<()> {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(image)
        .with_context(|| format!("opening {} to allocate it", image.display()))?;
    let len = f.metadata()?.len();
    // SAFETY: fallocate on a descriptor we own, mode 0 (allocate, keep contents and
    // size); no memory is passed.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => eprintln!(
                "note: {} cannot be allocated ahead (no fallocate there); it stays sparse",
                image.display()
            ),
            Some(libc::ENOSPC) => bail!(
                "{}: the file system holding it has no room for {len} bytes (add --sparse to \
                 take memory only as the volume fills, at the risk of running out later)",
                image.display()
            ),
            _ => return Err(e).with_context(|| format!("allocating {}", image.display())),
        }
    }
    Ok(())
}

pub fn run(a: &MkfsArgs) -> Result<i32> {
    let image = a.image.as_path();
    let meta = std::fs::metadata(image).ok();
    let is_file = meta.as_ref().is_none_or(|m| m.is_file());
    if !a.force {
        if Volume::probe(image) {
            bail!(
                "{} already holds a zcfs volume; add --force to overwrite it",
                image.display()
            );
        }
        if meta.as_ref().is_some_and(|m| m.is_file() && m.len() > 0) {
            bail!(
                "{} exists and is not empty; add --force to overwrite it",
                image.display()
            );
        }
    }
    if !is_file
        && meta
            .as_ref()
            .is_some_and(|m| !m.file_type().is_char_device())
    {
        bail!(
            "{} is neither a regular file nor a DAX device",
            image.display()
        );
    }
    if is_file && !a.sparse {
        room_for(image, a.size)?;
    }
    Volume::mkfs(
        image,
        a.size,
        &MkfsOptions {
            inodes: a.inodes,
            log_bytes: a.log_size,
            root: RootDir {
                uid: a.root_owner.map_or(0, |o| o.0),
                gid: a.root_owner.map_or(0, |o| o.1),
                mode: a.root_mode.unwrap_or(0o755),
            },
        },
    )
    .with_context(|| format!("making a volume on {}", image.display()))?;
    if is_file && !a.sparse {
        preallocate(image)?;
    }
    let vol = Volume::open(
        image,
        VolumeConfig {
            read_only: true,
            ..Default::default()
        },
    )?;
    let info = vol.info();
    println!(
        "created {}: {} bytes, {} data blocks of 4 KiB, {} inodes, {} KiB log, persistence {}",
        image.display(),
        info.size_bytes,
        info.data_blocks_total,
        info.inodes_total,
        info.log_ring_bytes / 1024,
        persistence_of(image)
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size(" 512mib "), Ok(512 << 20));
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert!(parse_size("12Q").unwrap_err().contains("unknown size unit"));
        assert!(parse_size("G").unwrap_err().contains("not a size"));
        assert!(parse_size("99999999T").unwrap_err().contains("too large"));
    }
}
