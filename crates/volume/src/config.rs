//! How a volume is made and run: mkfs options (geometry, the root directory's owner),
//! the run-time configuration (batching, persistence mode, read-only, fault plans for
//! the tests), and the counters it keeps.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zcfs_pmem::PersistMode;

/// A fault injected into the commit path, only to prove the crash suite can fail.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitFault {
    /// Skip the write-back of data blocks before their log entry commits.
    SkipDataFlush,
    /// Skip the fence between the log entries and the tail store.
    SkipFenceBeforeTail,
}

#[derive(Clone)]
pub struct VolumeConfig {
    /// Commit a batch after this many operations (1 = every operation synchronously).
    pub batch_ops: usize,
    /// ... or after this many bytes of data and log.
    pub batch_bytes: u64,
    /// A background thread commits a pending batch after this delay.
    pub batch_delay: Duration,
    /// Measurement only: skip the log and apply metadata in place (not crash-safe).
    pub no_log: bool,
    pub read_only: bool,
    /// Force a persistence mode (see `zcfs_pmem::OpenParams::force_mode`).
    pub persist: Option<PersistMode>,
    #[doc(hidden)]
    pub fault: Option<CommitFault>,
    /// Test-only: fail the n-th budget check (blocks, inode slot, log space).
    #[doc(hidden)]
    pub faults: Option<Arc<FaultPlan>>,
    /// Test-only: called under the state lock with every operation, in commit order.
    #[doc(hidden)]
    pub trace: Option<TraceHook>,
}

/// Called with each operation as it commits (under the volume's write lock).
pub type TraceHook = Arc<dyn Fn(&crate::trace::Traced) + Send + Sync>;

/// Failure injection for tests: every budget check an operation makes (blocks, an inode
/// slot, log space) counts as one point; the `n`-th point fails.
#[doc(hidden)]
#[derive(Debug)]
pub struct FaultPlan {
    fail_at: AtomicI64,
    seen: AtomicU64,
}

impl Default for FaultPlan {
    fn default() -> Self {
        FaultPlan {
            fail_at: AtomicI64::new(-1),
            seen: AtomicU64::new(0),
        }
    }
}

impl FaultPlan {
    /// Fail the `n`-th point from now (1 = the next one); `None` disarms.
    pub fn fail_nth(&self, n: Option<u64>) {
        self.seen.store(0, Ordering::SeqCst);
        self.fail_at
            .store(n.map_or(-1, |n| n as i64), Ordering::SeqCst);
    }
    /// Points passed since the last `fail_nth`.
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::SeqCst)
    }
    pub(crate) fn hit(&self) -> bool {
        let n = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
        self.fail_at.load(Ordering::SeqCst) == n as i64
    }
}

impl std::fmt::Debug for VolumeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeConfig")
            .field("batch_ops", &self.batch_ops)
            .field("batch_bytes", &self.batch_bytes)
            .field("batch_delay", &self.batch_delay)
            .field("no_log", &self.no_log)
            .field("read_only", &self.read_only)
            .field("persist", &self.persist)
            .finish_non_exhaustive()
    }
}

impl Default for VolumeConfig {
    fn default() -> Self {
        VolumeConfig {
            batch_ops: 64,
            batch_bytes: 4 << 20,
            batch_delay: Duration::from_millis(2),
            no_log: false,
            read_only: false,
            persist: None,
            fault: None,
            faults: None,
            trace: None,
        }
    }
}

impl VolumeConfig {
    /// Every operation durable before it returns.
    pub fn synchronous() -> VolumeConfig {
        VolumeConfig {
            batch_ops: 1,
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct MkfsOptions {
    pub inodes: Option<u64>,
    pub log_bytes: Option<u64>,
    pub root: RootDir,
}

/// Owner and permission bits of a new volume's root directory (as mke2fs's
/// `root_owner`): an export a user owns needs no root to set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootDir {
    pub uid: u32,
    pub gid: u32,
    /// Permission bits (at most 0o7777).
    pub mode: u32,
}

impl Default for RootDir {
    fn default() -> Self {
        RootDir {
            uid: 0,
            gid: 0,
            mode: 0o755,
        }
    }
}

/// The volume's counters, named once: each is an `AtomicU64` field of `Stats` and a
/// `u64` field of the `StatsSnapshot` that `Stats::snapshot` takes.
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Counters, readable while the volume runs.
        #[derive(Debug, Default)]
        pub struct Stats {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        #[derive(Debug, Clone, serde::Serialize)]
        pub struct StatsSnapshot {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Stats {
            pub fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                }
            }
        }
    };
}

impl Stats {
    /// Count `n` more on counter `c` (one of this struct's).
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Take `n` back from counter `c`.
    pub(crate) fn sub(c: &AtomicU64, n: u64) {
        c.fetch_sub(n, Ordering::Relaxed);
    }
}

counters! {
    ops,
    commits,
    checkpoints,
    log_bytes,
    data_bytes_written,
    data_bytes_read,
    /// Bytes copied in user space on the data paths (memcpy into or out of PM).
    user_copy_bytes,
    /// Bytes handed out as borrowed PM slices or attached pages (no copy).
    zero_copy_bytes,
    /// Blocks `reserve_pages` zeroed before handing them out (not known to be zero).
    reserve_zeroed_blocks,
    /// Blocks `reserve_pages` handed out without zeroing (known to hold zeros).
    reserve_clean_blocks,
    /// Free blocks zeroed ahead of need (`clean_free_blocks`).
    background_zeroed_blocks,
}
