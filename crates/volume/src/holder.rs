//! One volume, one writer process (DESIGN invariant 6): the lock and the holder record.
//!
//! A read-write open takes an exclusive `flock` on the image for as long as the volume
//! is open (read-only opens take a shared one), so a second `serve`, `mount`, `fsck
//! --repair` or `mkfs` is refused at once. So that the refusal can say who holds the
//! volume, the holder writes a record (pid, host, program, start time) into the unused
//! rest of block 0, after the first superblock copy, and clears it at a clean close. The
//! record is only informative: the lock decides, and a record left by a crashed holder
//! is simply overwritten by the next one.

use crate::error::{FsError, Result};
use crate::layout::{BLOCK, SB_SIZE};
use std::fs::File;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use zcfs_pmem::{PmemError, Region};

/// Where the record lives: block 0, after the superblock copy.
pub(crate) const HOLDER_OFF: usize = SB_SIZE;
const HOLDER_LEN: usize = 256;
const HOLDER_MAGIC: &[u8; 8] = b"ZCFSHOLD";
const HOST_LEN: usize = 64;
const PROGRAM_LEN: usize = HOLDER_LEN - 24 - HOST_LEN;
const _: () = assert!(HOLDER_OFF + HOLDER_LEN <= BLOCK);

/// Who has a volume open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// Seconds since the epoch when it opened the volume.
    pub since: u64,
    pub host: String,
    pub program: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        write!(
            f,
            "pid {} ({}) on host {}, open for {} s",
            self.pid,
            self.program,
            self.host,
            now.saturating_sub(self.since)
        )
    }
}

fn put_str(b: &mut [u8], s: &str) {
    let n = s.len().min(b.len());
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn get_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn this_process() -> Holder {
    let mut host = [0u8; HOST_LEN];
    // SAFETY: gethostname writes at most `len` bytes into our buffer.
    unsafe { libc::gethostname(host.as_mut_ptr() as *mut libc::c_char, HOST_LEN - 1) };
    let program = std::fs::read("/proc/self/cmdline")
        .map(|c| {
            c.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    Holder {
        pid: std::process::id(),
        since: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        host: get_str(&host),
        program,
    }
}

fn encode(h: &Holder) -> [u8; HOLDER_LEN] {
    let mut b = [0u8; HOLDER_LEN];
    b[0..8].copy_from_slice(HOLDER_MAGIC);
    b[8..12].copy_from_slice(&h.pid.to_le_bytes());
    b[16..24].copy_from_slice(&h.since.to_le_bytes());
    put_str(&mut b[24..24 + HOST_LEN], &h.host);
    put_str(&mut b[24 + HOST_LEN..], &h.program);
    b
}

fn decode(b: &[u8]) -> Option<Holder> {
    if b.len() < HOLDER_LEN || &b[0..8] != HOLDER_MAGIC {
        return None;
    }
    Some(Holder {
        pid: u32::from_le_bytes(b[8..12].try_into().unwrap()),
        since: u64::from_le_bytes(b[16..24].try_into().unwrap()),
        host: get_str(&b[24..24 + HOST_LEN]),
        program: get_str(&b[24 + HOST_LEN..24 + HOST_LEN + PROGRAM_LEN]),
    })
}

/// Record this process as the holder (after taking the lock, before sharing).
pub(crate) fn write(region: &mut Region) -> std::result::Result<(), PmemError> {
    region.store(HOLDER_OFF, &encode(&this_process()));
    region.persist(HOLDER_OFF, HOLDER_LEN)
}

/// Clear the record at a clean close.
pub(crate) fn clear(region: &mut Region) -> std::result::Result<(), PmemError> {
    region.store_zero(HOLDER_OFF, HOLDER_LEN);
    region.persist(HOLDER_OFF, HOLDER_LEN)
}

/// The holder recorded in the image at `path`, if any.
pub fn read_holder(path: &Path) -> Option<Holder> {
    use std::io::Read;
    let mut b = vec![0u8; HOLDER_OFF + HOLDER_LEN];
    File::open(path).ok()?.read_exact(&mut b).ok()?;
    decode(&b[HOLDER_OFF..])
}

/// Whether the recorded holder can be the one holding the lock now. The lock is this
/// host's, so a record from another host, or of a process that is gone (a crash), names
/// nobody.
fn plausible(h: &Holder) -> bool {
    if h.host != this_process().host {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists; no signal is sent.
    let r = unsafe { libc::kill(h.pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn busy(path: &Path) -> FsError {
    FsError::Busy(match read_holder(path).filter(plausible) {
        Some(h) => format!(
            "the volume {} is in use by {h}; stop that process first, or reach the volume through it",
            path.display()
        ),
        None => format!(
            "the volume {} is in use by another process (a reader, such as fsck or a \
             read-only mount, leaves no record); stop it first, or reach the volume through it",
            path.display()
        ),
    })
}

/// Turn a refused lock into `Busy` naming the holder; other errors pass through.
pub(crate) fn busy_or(path: &Path, e: PmemError) -> FsError {
    match e {
        PmemError::Locked { .. } => busy(path),
        other => other.into(),
    }
}

/// For mkfs: create `path` (or open it), take the exclusive lock, and give a regular
/// file exactly `size` bytes (cut first, so a fresh file stays sparse). The returned
/// file holds the lock until dropped.
pub(crate) fn lock_path(path: &Path, size: u64) -> Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)?;
    if let Err(e) = zcfs_pmem::flock_retrying(&f, libc::LOCK_EX) {
        return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            busy(path)
        } else {
            e.into()
        });
    }
    if !f.metadata()?.file_type().is_char_device() {
        f.set_len(0)?;
        f.set_len(size)?;
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_truncates_long_fields() {
        let h = Holder {
            pid: 42,
            since: 7,
            host: "h".repeat(200),
            program: "zcfs serve /dev/shm/x".into(),
        };
        let d = decode(&encode(&h)).unwrap();
        assert_eq!((d.pid, d.since), (42, 7));
        assert_eq!(d.host.len(), HOST_LEN);
        assert_eq!(d.program, h.program);
        assert!(decode(&[0u8; HOLDER_LEN]).is_none());
    }
}
