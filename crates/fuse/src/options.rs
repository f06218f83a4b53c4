//! What a mount may cache and how it counts what crosses /dev/fuse.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// How much the kernel may cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    /// Nothing: attributes and entries revalidated on every use, data uncached.
    None,
    /// Attributes and entries for the timeout; data not kept in the page cache.
    Metadata,
    /// Attributes and entries for the timeout; the page cache is dropped on open.
    Auto,
    /// Long timeouts and the page cache kept across opens (single-writer workloads).
    Always,
}

impl std::str::FromStr for CacheMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "none" | "no" => CacheMode::None,
            "metadata" => CacheMode::Metadata,
            "auto" => CacheMode::Auto,
            "always" | "yes" => CacheMode::Always,
            _ => {
                return Err(format!(
                    "cache mode {s:?}: use none, metadata, auto or always"
                ))
            }
        })
    }
}

#[derive(Debug, Clone)]
pub struct FuseOptions {
    pub cache: CacheMode,
    /// Attribute and entry timeout (for metadata/auto).
    pub timeout: Duration,
    pub writeback: bool,
    /// Buffered writes (not O_DIRECT, O_SYNC, O_DSYNC) are answered once sent to the
    /// backend, which reports their errors at flush (close) or fsync
    /// (`Backend::write_behind`). Off: every write waits for its outcome.
    pub write_behind: bool,
    pub direct_io: bool,
    pub readdirplus: bool,
    /// Read requests from /dev/fuse with splice(2) and send large buffered writes'
    /// data from the pipe into the socket (`Backend::write_behind_piped`): the bytes
    /// never pass through this process's memory.
    pub splice: bool,
    pub max_write: u32,
    /// Show every file as owned by this uid/gid (sshfs-style `uid=`, `gid=`).
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Clear these permission bits in what is shown (`umask=`).
    pub umask: Option<u32>,
    /// The kernel checks permissions (mounted with default_permissions). The backend
    /// keeps checking unless the kernel also enforces ACLs (`kernel_checks_suffice`):
    /// mode bits alone would ignore a stored ACL's entries.
    pub default_permissions: bool,
    /// Ask the kernel to enforce and cache POSIX ACLs (FUSE_POSIX_ACL, which turns
    /// default_permissions on) and to leave the umask to the backend (FUSE_DONT_MASK),
    /// which applies a directory's default ACL instead when it has one. Off with `noacl`:
    /// the kernel then checks the mode bits alone.
    pub acl: bool,
    /// Carry LSM security labels (`crate::SECURITY_LABELS`: SELinux's and Smack's) as
    /// stored xattrs (`seclabel`). Off by default, as on an NFS mount without labeled
    /// NFS: the mount then answers EOPNOTSUPP for them and leaves them out of listings.
    /// A label is the policy of the host that enforces it; a client whose kernel
    /// enforces SELinux answers `security.selinux` itself and never asks the file
    /// system. Carried, a label costs `ls -l` one request per file; refused, one per
    /// `ls` (coreutils remembers the answer for the device).
    pub seclabel: bool,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            cache: CacheMode::Auto,
            timeout: Duration::from_secs(1),
            writeback: false,
            write_behind: true,
            direct_io: false,
            readdirplus: true,
            splice: true,
            max_write: 1 << 20,
            uid: None,
            gid: None,
            umask: None,
            default_permissions: false,
            acl: true,
            seclabel: false,
        }
    }
}

/// Frontend counters (what crossed /dev/fuse and what it cost), and per FUSE operation
/// its count, errors and latency histogram (indexed by `FuseOp`).
#[derive(Debug)]
pub struct FuseStats {
    pub ops: zcfs_metrics::OpTable,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub user_copy_bytes: AtomicU64,
    /// Write bytes moved from /dev/fuse to the socket by splice(2), never copied here.
    pub spliced_write_bytes: AtomicU64,
}

impl Default for FuseStats {
    fn default() -> Self {
        FuseStats {
            ops: crate::metrics::fuse_op_table(),
            read_bytes: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
            user_copy_bytes: AtomicU64::new(0),
            spliced_write_bytes: AtomicU64::new(0),
        }
    }
}

impl FuseStats {
    /// Requests answered so far (every operation's count).
    pub fn requests(&self) -> u64 {
        crate::metrics::ran(&self.ops)
            .iter()
            .map(|(_, s)| s.count)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_modes_parse_with_their_aliases() {
        assert_eq!("none".parse::<CacheMode>(), Ok(CacheMode::None));
        assert_eq!("no".parse::<CacheMode>(), Ok(CacheMode::None));
        assert_eq!("metadata".parse::<CacheMode>(), Ok(CacheMode::Metadata));
        assert_eq!("yes".parse::<CacheMode>(), Ok(CacheMode::Always));
        assert!("sometimes"
            .parse::<CacheMode>()
            .unwrap_err()
            .contains("use none"));
        let o = FuseOptions::default();
        assert_eq!((o.cache, o.max_write), (CacheMode::Auto, 1 << 20));
    }
}
