//! The volume: mkfs, open (with recovery), the one-writer lock, configuration, counters,
//! the superblock, and close. Transactions and the log are in `commit.rs`.

use crate::alloc::{BlockAlloc, InodeAlloc};
use crate::dir::Dir;
use crate::error::{FsError, Result};
use crate::layout::*;
use crate::map::FileMap;
use crate::pins::ReadPins;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};
use zcfs_pmem::{LockMode, OpenParams, PmemError, Region};

use crate::config::*;

/// An inode in DRAM: the persistent record plus its map and xattrs.
#[derive(Debug, Clone)]
pub(crate) struct Inode {
    pub rec: InodeRec,
    pub map: FileMap,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The blocks holding the xattr set: none, the head block (`rec.xattr_block`)
    /// alone, or the head (an index) then the data blocks it lists.
    pub xattr_blocks: Vec<u64>,
}

impl Inode {
    /// The record as it goes to PM, with derived fields brought up to date.
    pub fn encode(&self) -> [u8; INODE_SIZE] {
        let mut r = self.rec.clone();
        r.map_root = self.map.root;
        r.map_height = self.map.height;
        r.blocks = self.owned_blocks();
        r.encode()
    }

    /// Point the inode at the blocks of its xattr set (head first; none for no set).
    pub fn set_xattr_blocks(&mut self, blocks: Vec<u64>) {
        self.rec.xattr_block = blocks.first().copied().unwrap_or(0);
        self.xattr_blocks = blocks;
    }

    /// Data-area blocks the inode owns: its map's and its xattr set's.
    pub fn owned_blocks(&self) -> u64 {
        self.map.owned_blocks() + self.xattr_blocks.len() as u64
    }
}

#[derive(Debug, Default)]
pub(crate) struct LogState {
    /// Logical byte offsets (LSN); physical position = lsn % ring_len.
    pub head: u64,
    pub tail: u64,
    pub next: u64,
    pub seq: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub apply: Vec<Record>,
    /// Blocks freed by the batch's entries.
    pub frees: Vec<u64>,
    pub ops: usize,
    pub bytes: u64,
    pub since: Option<Instant>,
}

pub(crate) struct State {
    pub inodes: HashMap<u64, Inode>,
    pub dirs: HashMap<u64, Dir>,
    pub balloc: BlockAlloc,
    pub ialloc: InodeAlloc,
    /// Generation of every slot (index ino-1), kept for free slots too.
    pub gens: Vec<u32>,
    pub log: LogState,
    pub batch: Batch,
    /// Freed blocks waiting for the checkpoint that makes their reuse safe and for the
    /// readers that may still use them.
    pub deferred_frees: Vec<u64>,
    /// How many of `deferred_frees` were still pinned at the last checkpoint.
    pub deferred_pinned: usize,
    /// Blocks attached to callers' address spaces (zcopy_to): not reused while pinned.
    pub pins: HashMap<u64, u32>,
    /// Inodes sharing a block with another (damaged image, seen only by fsck): never
    /// freed by reaping or repair, which would free the block twice.
    pub tainted: HashSet<u64>,
    /// Inodes whose xattr set could not be read (a damaged head, index or stream;
    /// fsck only): a repair drops the set and releases the blocks it owns.
    pub damaged_xattrs: HashSet<u64>,
    /// O_TMPFILE files (link count 0) that may still get their first name (tmpfile.rs);
    /// DRAM only: after a crash they are reaped.
    pub linkable: HashSet<u64>,
    /// Blocks promised to files for copy-on-write overwrites of their preallocated
    /// blocks and not drawn yet: Σ (`cow_reserve` − `drawing`) over the inodes. Other
    /// allocations leave this many free blocks alone (see falloc.rs).
    pub reserved: u64,
    /// Per (inode, generation): reserve drawn by write reservations not committed yet.
    pub drawing: HashMap<(u64, u32), u64>,
}

/// How far ahead of the block allocator `prefault_in_background` keeps pages: at 2
/// GB/s of writes that is over 100 ms of headroom, and a large volume on /dev/shm does
/// not take all its memory at once.
pub const PREFAULT_AHEAD: u64 = 256 << 20;
/// How often the prefault thread looks at the allocator when it is ahead.
pub const PREFAULT_POLL: std::time::Duration = std::time::Duration::from_millis(20);
/// Bytes populated per step of the prefault thread. Closing the volume waits for the
/// step in progress, and the thread runs at the lowest priority: on a loaded machine a
/// 32 MiB step held a closing mount past the 5 s a remount waits for the volume
/// (`unmount_then_mount_again_at_once_keeps_the_new_mount`); 1 MiB is ~256 pages.
pub const PREFAULT_CHUNK: usize = 1 << 20;

pub struct Volume {
    pub(crate) region: Region,
    pub(crate) geo: Geometry,
    pub(crate) sb: Mutex<Superblock>,
    pub(crate) cfg: VolumeConfig,
    pub(crate) state: RwLock<State>,
    pub stats: Stats,
    /// Readers using data blocks without the state lock.
    pub(crate) readers: ReadPins,
    /// References to inodes (open handles and frontends' lookups): an inode whose last
    /// name is removed lives on, as an orphan, until its references are gone.
    /// Lock order: `state` before `refs`.
    pub(crate) refs: Mutex<HashMap<u64, u64>>,
    /// Set when making stores durable failed: the volume is read-only from then on.
    failed: AtomicBool,
    /// Set when the volume must not write its clean flag on drop (simulated crash).
    abandoned: AtomicBool,
    /// The batch flusher thread (batched volumes), stopped and joined by `Drop`.
    flusher: Flusher,
    /// What recovery found at open (entries replayed, where it stopped).
    pub(crate) recovery: RecoveryReport,
    /// Whether this process wrote the holder record (and clears it at close).
    holds_volume: bool,
    /// Per-inode change counters for same-host readers, from the first
    /// `change_counters` call on (changes.rs).
    pub(crate) changes: std::sync::OnceLock<crate::changes::ChangeCounters>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RecoveryReport {
    pub was_clean: bool,
    pub entries_replayed: u64,
    pub records_applied: u64,
    /// Why replay stopped before the tail, if it did.
    pub stopped_early: Option<String>,
}

/// Geometry, usage and log state, for `zcfs stat`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VolumeInfo {
    pub uuid: String,
    pub geometry: Geometry,
    pub persistence: String,
    pub size_bytes: u64,
    pub data_blocks_total: u64,
    pub data_blocks_free: u64,
    pub inodes_total: u64,
    pub inodes_free: u64,
    pub log_ring_bytes: u64,
    pub log_head: u64,
    pub log_tail: u64,
    pub log_used_bytes: u64,
    pub batch_pending_ops: usize,
    pub mount_count: u64,
    pub recovery: RecoveryReport,
    pub stats: StatsSnapshot,
    /// Set when making stores durable failed and the volume turned read-only.
    pub failed: bool,
}

impl Volume {
    /// Create a new volume on `path`: the file is created, or cut to `size` (a fresh
    /// file stays sparse). Refused while another process has the volume open.
    pub fn mkfs(path: &Path, size: u64, opts: &MkfsOptions) -> Result<()> {
        let guard = crate::holder::lock_path(path, size)?;
        let mut region = Region::open(
            path,
            &OpenParams {
                create_size: Some(size),
                ..Default::default()
            },
        )?;
        Self::mkfs_region(&mut region, opts)?;
        drop(guard);
        Ok(())
    }

    /// Format a mapped region (held alone: `&mut`).
    pub fn mkfs_region(region: &mut Region, opts: &MkfsOptions) -> Result<()> {
        if opts.root.mode & !0o7777 != 0 {
            return Err(FsError::Invalid(format!(
                "root directory mode {:o}: only permission bits (at most 7777)",
                opts.root.mode
            )));
        }
        let geo = Geometry::plan(region.len() as u64, opts.inodes, opts.log_bytes)?;
        let fence = |r: std::result::Result<(), PmemError>| r.map_err(FsError::from);
        // Invalidate any previous volume first, so a crash mid-mkfs leaves no valid
        // superblock pointing at half-initialized metadata.
        region.store_zero(0, 2 * BLOCK);
        fence(region.persist(0, 2 * BLOCK))?;
        let meta_end = (geo.data_start * BLOCK_U64) as usize;
        let start = (geo.log_start * BLOCK_U64) as usize;
        for off in (start..meta_end).step_by(1 << 20) {
            let len = (meta_end - off).min(1 << 20);
            // Avoid dirtying pages of a fresh sparse file that are already zero.
            if region.bytes()[off..off + len].iter().any(|&b| b != 0) {
                region.store_zero(off, len);
                region.flush(off, len);
            }
        }
        let now = Time::now();
        let root = InodeRec {
            ino: ROOT_INO,
            gen: 1,
            mode: S_IFDIR | opts.root.mode,
            uid: opts.root.uid,
            gid: opts.root.gid,
            nlink: 2,
            atime: now,
            mtime: now,
            ctime: now,
            parent: ROOT_INO,
            ..Default::default()
        };
        region.store(geo.inode_off(ROOT_INO), &root.encode());
        region.flush(geo.inode_off(ROOT_INO), INODE_SIZE);
        fence(region.fence())?;
        let sb = Superblock {
            generation: 1,
            clean: true,
            uuid: *uuid::Uuid::new_v4().as_bytes(),
            geo,
            mkfs_time: now.sec,
            mount_count: 0,
        };
        // Each copy: the body with the magic left zero, durable; then the 8-byte magic
        // (one atomic store), durable. A crash leaves a copy either valid or without
        // magic, so a half-made volume reads as "not a zcfs volume", never as corrupt.
        let enc = sb.encode();
        for off in [0, BLOCK] {
            region.store(off + 8, &enc[8..]);
            fence(region.persist(off, SB_SIZE))?;
            region.write_u64(off, u64::from_le_bytes(enc[..8].try_into().unwrap()));
            fence(region.persist(off, 8))?;
        }
        Ok(())
    }

    /// Whether a path holds something that looks like a zcfs volume (either superblock).
    pub fn probe(path: &Path) -> bool {
        let Ok(data) = std::fs::File::open(path).and_then(|mut f| {
            use std::io::Read;
            let mut b = vec![0u8; 2 * BLOCK];
            f.read_exact(&mut b).map(|_| b)
        }) else {
            return false;
        };
        data[0..8] == MAGIC[..] || data[BLOCK..BLOCK + 8] == MAGIC[..]
    }

    /// Open the volume on `path`, recovering from a crash if needed. A read-write open
    /// takes the volume for this process alone: a second opener (read-write or
    /// read-only) gets `Busy`, naming the holder. Read-only opens may share.
    pub fn open(path: &Path, cfg: VolumeConfig) -> Result<Arc<Volume>> {
        let region = Region::open(
            path,
            &OpenParams {
                force_mode: cfg.persist,
                // Read-only opens still replay the log: into a private copy.
                private: cfg.read_only,
                lock: if cfg.read_only {
                    LockMode::Shared
                } else {
                    LockMode::Exclusive
                },
                ..Default::default()
            },
        )
        .map_err(|e| crate::holder::busy_or(path, e))?;
        Self::open_region_inner(region, cfg, None, true)
    }

    /// Open a mapped region (anonymous regions in tests, private maps in fsck).
    pub fn open_region(region: Region, cfg: VolumeConfig) -> Result<Arc<Volume>> {
        Self::open_region_inner(region, cfg, None, false)
    }

    /// Open, collecting load problems into `lenient` instead of failing (fsck).
    pub(crate) fn open_region_with(
        region: Region,
        cfg: VolumeConfig,
        lenient: Option<&mut Vec<String>>,
        owner: bool,
    ) -> Result<Arc<Volume>> {
        Self::open_region_inner(region, cfg, lenient, owner)
    }

    fn open_region_inner(
        mut region: Region,
        cfg: VolumeConfig,
        lenient: Option<&mut Vec<String>>,
        owner: bool,
    ) -> Result<Arc<Volume>> {
        let (sb, which) = read_superblock(region.bytes())?;
        let geo = sb.geo;
        if geo.total_blocks * BLOCK_U64 > region.len() as u64 {
            return Err(FsError::Corrupt(format!(
                "superblock says {} bytes, the image has {}",
                geo.total_blocks * BLOCK_U64,
                region.len()
            )));
        }
        let (log, mut report) = crate::recovery::replay(&mut region, &geo)?;
        report.was_clean = sb.clean;
        let img = region.bytes();
        let state = match lenient {
            None => crate::recovery::load_state(img, &geo, log, &mut |p| Err(FsError::Corrupt(p)))?,
            Some(list) => crate::recovery::load_state(img, &geo, log, &mut |p| {
                list.push(p);
                Ok(())
            })?,
        };
        let holds_volume = owner && !cfg.read_only;
        if holds_volume {
            crate::holder::write(&mut region)?;
        }
        let vol = Arc::new(Volume {
            region,
            geo,
            sb: Mutex::new(sb),
            cfg,
            state: RwLock::new(state),
            stats: Stats::default(),
            readers: ReadPins::default(),
            refs: Mutex::new(HashMap::new()),
            failed: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            flusher: Flusher::default(),
            recovery: report,
            holds_volume,
            changes: std::sync::OnceLock::new(),
        });
        if !vol.cfg.read_only {
            // The ring is written over and over: back it with pages now rather than
            // faulting through it during the first lap.
            vol.region.prefault(geo.ring_off(), geo.ring_len() as usize);
            vol.write_superblock(false, which)?;
            // Then the copy it was read from: a copy left at an older format version
            // would let an older build open the volume from it after a crash.
            vol.rewrite_superblock_copy(which)?;
            let reaped = vol.reap_orphans()?;
            if reaped > 0 {
                tracing::info!(
                    reaped,
                    "freed files that were unlinked while open before a crash"
                );
            }
            // After every free of the open (orphans): which free blocks are holes.
            let clean = {
                let mut st = vol.state.write().unwrap();
                vol.note_zero_blocks(&mut st)
            };
            tracing::debug!(clean, "free blocks known to hold zeros");
            if vol.cfg.batch_ops > 1 {
                vol.flusher.start(&vol);
            }
        }
        tracing::info!(
            mode = %vol.region.mode(),
            clean = vol.recovery.was_clean,
            replayed = vol.recovery.entries_replayed,
            "volume opened"
        );
        Ok(vol)
    }

    /// Write the superblock into the copy not last written, with a new generation.
    pub(crate) fn write_superblock(&self, clean: bool, last: usize) -> Result<()> {
        let mut sb = self.sb.lock().unwrap();
        sb.generation += 1;
        sb.clean = clean;
        if !clean {
            sb.mount_count += 1;
        }
        let target = if last == 0 { BLOCK } else { 0 };
        // SAFETY: the superblock copies are written only here and read only by
        // `superblock_copies`, both under `self.sb`, whose guard we hold (or before the
        // volume is shared).
        unsafe { self.region.write(target, &sb.encode()) };
        self.region
            .persist(target, SB_SIZE)
            .map_err(|e| self.persistence_failed(e))
    }

    /// Write the superblock as it stands (same mount) to copy `copy` (0 or 1), with a
    /// new generation.
    fn rewrite_superblock_copy(&self, copy: usize) -> Result<()> {
        let mut sb = self.sb.lock().unwrap();
        sb.generation += 1;
        let target = if copy == 0 { 0 } else { BLOCK };
        // SAFETY: as in `write_superblock`: the copies are written only under `self.sb`,
        // whose guard we hold.
        unsafe { self.region.write(target, &sb.encode()) };
        self.region
            .persist(target, SB_SIZE)
            .map_err(|e| self.persistence_failed(e))
    }

    /// A copy of blocks 0 and 1 (both superblock copies), read under the superblock
    /// lock (fsck of a live volume).
    pub(crate) fn superblock_copies(&self) -> Vec<u8> {
        let _sb = self.sb.lock().unwrap();
        // SAFETY: see `write_superblock`; the holder record in block 0 is written only
        // before the volume is shared and after it is dropped.
        unsafe { self.region.slice(0, 2 * BLOCK) }.to_vec()
    }

    /// The narrow door tests and fuzzing use to record, crash and copy the raw image.
    #[doc(hidden)]
    pub fn test_door(&self) -> TestDoor<'_> {
        TestDoor(self)
    }
    /// Keep the [`PREFAULT_AHEAD`] bytes of the data area ahead of the block
    /// allocator backed with writable pages, from a background thread at the lowest
    /// CPU priority: a write then takes no first-touch page fault (and, on /dev/shm, no
    /// page clearing) on its path. On a fresh /dev/shm volume those were a third of a
    /// server's CPU time per byte written (docs/benchmarks.md). Populating does not
    /// change contents. The thread ends when the volume is closed. Nothing for a
    /// read-only volume, an image with holes or one on a disk file system.
    pub fn prefault_in_background(&self) {
        // Only where it costs page tables alone (`Region::populating_is_free`): a hole
        // of a sparse image would take memory (and, on a full tmpfs, SIGBUS this
        // process), a page of a file on disk would be written back.
        if self.cfg.read_only || !self.region.populating_is_free() {
            return;
        }
        let g = self.geo;
        let (data_start, data_end) = (
            g.data_start * BLOCK_U64,
            (g.data_start + g.data_blocks) * BLOCK_U64,
        );
        let frontier = self.read_state().balloc.frontier();
        // The thread holds the mapping, not the volume: closing the volume (a clean
        // shutdown) never waits for it beyond one step.
        let pages = self.region.prefaulter();
        let spawned = std::thread::Builder::new()
            .name("zcfs-prefault".into())
            .spawn(move || {
                zcfs_pmem::run_this_thread_when_idle();
                let mut done = data_start;
                loop {
                    let ahead = frontier.load(std::sync::atomic::Ordering::Relaxed) * BLOCK_U64;
                    let want = ahead.saturating_add(PREFAULT_AHEAD).min(data_end);
                    if want > done {
                        let n = (want - done).min(PREFAULT_CHUNK as u64);
                        if !pages.populate(done as usize, n as usize) {
                            return;
                        }
                        done += n;
                    } else {
                        std::thread::sleep(PREFAULT_POLL);
                        if !pages.live() {
                            return;
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no prefault thread: {e}");
        }
    }

    /// The descriptor of the volume's image file, when it is a file-backed shared
    /// mapping (not anonymous memory): for handing the image to trusted same-host
    /// applications (zcfs-samehost), which reopen it through /proc/self/fd.
    pub fn image_fd(&self) -> Option<std::os::unix::io::RawFd> {
        self.region.shared_fd()
    }
    pub fn geometry(&self) -> Geometry {
        self.geo
    }
    pub fn config(&self) -> &VolumeConfig {
        &self.cfg
    }
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    pub(crate) fn read_state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap()
    }

    /// The state, for a change: refused on read-only volumes and after a persistence
    /// failure.
    pub(crate) fn write_state(&self) -> Result<RwLockWriteGuard<'_, State>> {
        if self.cfg.read_only {
            return Err(FsError::ReadOnly);
        }
        if self.failed.load(Ordering::SeqCst) {
            return Err(FsError::Failed);
        }
        Ok(self.state.write().unwrap())
    }

    /// Record a persistence failure: one log line, the volume read-only from now on,
    /// and EIO for the caller.
    pub(crate) fn persistence_failed(&self, e: PmemError) -> FsError {
        if !self.failed.swap(true, Ordering::SeqCst) {
            tracing::error!(
                "persisting the volume failed ({e}): it is read-only from now on; \
                 what was written since the last successful sync may be lost \
                 (fix the cause, then run `zcfs fsck`)"
            );
        }
        FsError::Io(std::io::Error::other(format!(
            "persisting the volume failed: {e}"
        )))
    }

    /// Whether a persistence failure turned the volume read-only.
    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Make every operation so far durable (fsync, fdatasync, syncfs). After a
    /// persistence failure this reports EIO: nothing can be promised any more.
    pub fn sync(&self) -> Result<()> {
        if self.cfg.read_only {
            return Ok(());
        }
        if self.has_failed() {
            return Err(FsError::Io(std::io::Error::from_raw_os_error(libc::EIO)));
        }
        let mut st = self.state.write().unwrap();
        self.commit_batch(&mut st)
    }

    /// Commit and checkpoint now: the log is empty afterwards.
    pub fn checkpoint_now(&self) -> Result<()> {
        let mut st = self.write_state()?;
        self.commit_batch(&mut st)?;
        self.checkpoint(&mut st)
    }

    /// Simulate a crash: nothing more is written, not even the clean flag.
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
        self.flusher.stop();
    }

    /// A budget check of an operation (test hook: it may be told to fail).
    pub(crate) fn fault_point(&self, err: impl FnOnce() -> FsError) -> Result<()> {
        match &self.cfg.faults {
            Some(f) if f.hit() => Err(err()),
            _ => Ok(()),
        }
    }

    /// Report an operation to the test trace hook (under the state lock).
    pub(crate) fn trace(&self, t: impl FnOnce() -> crate::trace::Traced) {
        if let Some(hook) = &self.cfg.trace {
            hook(&t());
        }
    }

    /// The per-inode change counters (changes.rs), made on the first call: every
    /// transaction from then on raises the counter of each inode it rewrites.
    pub fn change_counters(&self) -> Result<&crate::changes::ChangeCounters> {
        if let Some(c) = self.changes.get() {
            return Ok(c);
        }
        // Made under the state's write lock, so no transaction is between its first
        // raise and a lease taken after this returns.
        // (A read-only volume never changes: the write lock itself is enough there.)
        let st = self.state.write().unwrap();
        let made = crate::changes::ChangeCounters::new()?;
        let _ = self.changes.set(made);
        drop(st);
        Ok(self.changes.get().expect("set above"))
    }

    /// The (device, inode) of the image file this volume maps shared, if it does:
    /// byte offsets of the image (block numbers times the block size) are offsets of
    /// that file, and a shared mapping of it elsewhere sees the same bytes.
    pub fn image_file_id(&self) -> Option<(u64, u64)> {
        self.region.shared_file_id()
    }

    pub fn info(&self) -> VolumeInfo {
        let st = self.read_state();
        let sb = self.sb.lock().unwrap();
        VolumeInfo {
            uuid: uuid::Uuid::from_bytes(sb.uuid).to_string(),
            geometry: self.geo,
            persistence: self.region.mode().to_string(),
            size_bytes: self.geo.total_blocks * BLOCK_U64,
            data_blocks_total: self.geo.data_blocks,
            data_blocks_free: st.balloc.free_count() + st.deferred_frees.len() as u64,
            inodes_total: self.geo.inode_count,
            inodes_free: st.ialloc.free_count(),
            log_ring_bytes: self.geo.ring_len(),
            log_head: st.log.head,
            log_tail: st.log.tail,
            log_used_bytes: st.log.next - st.log.head,
            batch_pending_ops: st.batch.ops,
            mount_count: sb.mount_count,
            recovery: self.recovery.clone(),
            stats: self.stats.snapshot(),
            failed: self.has_failed(),
        }
    }

    /// Commit the pending batch if it is older than the batch delay (flusher thread).
    fn flush_if_due(&self) {
        let due = {
            let st = self.read_state();
            st.batch
                .since
                .is_some_and(|t| t.elapsed() >= self.cfg.batch_delay)
        };
        if due && !self.has_failed() {
            let mut st = self.state.write().unwrap();
            // A failure is logged and turns the volume read-only; nothing else to do.
            let _ = self.commit_batch(&mut st);
        }
    }
}

/// The thread that commits a pending batch once it is older than the batch delay.
///
/// It must never own the volume: if it held the last `Arc`, the close (and the release
/// of the one-writer lock) would run late, on its thread, or be cut off at process exit.
/// So it reaches the volume through a pointer that `Volume::drop` withdraws, under the
/// same mutex, before anything is torn down, and then joins the thread.
#[derive(Default)]
struct Flusher {
    target: Arc<(Mutex<Option<VolumePtr>>, std::sync::Condvar)>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The volume's address, for the flusher (see `Flusher`).
struct VolumePtr(*const Volume);
// SAFETY: the pointer is only dereferenced under `Flusher::target`'s mutex while it is
// `Some`, and `Volume::drop` sets it to `None` under that mutex before the volume's
// fields are dropped; `Volume` itself is `Sync`.
unsafe impl Send for VolumePtr {}

impl Flusher {
    fn start(&self, vol: &Arc<Volume>) {
        *self.target.0.lock().unwrap() = Some(VolumePtr(Arc::as_ptr(vol)));
        let target = self.target.clone();
        let delay = vol.cfg.batch_delay.max(Duration::from_micros(100));
        let t = std::thread::Builder::new()
            .name("zcfs-flusher".into())
            .spawn(move || {
                let (lock, wake) = &*target;
                let mut guard = lock.lock().unwrap();
                // Checked before every wait, so a `stop` that came before this thread
                // first took the mutex is not missed.
                while guard.is_some() {
                    // Waits without the mutex; `stop` wakes it at once.
                    guard = wake.wait_timeout(guard, delay).unwrap().0;
                    if let Some(p) = &*guard {
                        // SAFETY: see `VolumePtr`: the volume lives while the pointer
                        // is `Some`, and we hold the mutex `stop` takes to withdraw it.
                        unsafe { (*p.0).flush_if_due() }
                    }
                }
            })
            .expect("spawn flusher thread");
        *self.thread.lock().unwrap() = Some(t);
    }

    /// Withdraw the volume (waiting for a flush in progress) and join the thread.
    fn stop(&self) {
        self.target.0.lock().unwrap().take();
        self.target.1.notify_all();
        if let Some(t) = self.thread.lock().unwrap().take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        // First, before the image can be opened again: every kept lease is invalid.
        if let Some(c) = self.changes.get() {
            c.retire();
        }
        self.flusher.stop();
        if self.abandoned.load(Ordering::SeqCst) || self.cfg.read_only || self.has_failed() {
            return;
        }
        let mut st = self.state.write().unwrap();
        // Force a checkpoint so a clean volume has an empty log.
        let closed = self
            .commit_batch(&mut st)
            .and_then(|_| self.checkpoint(&mut st));
        drop(st);
        if closed.is_err() {
            return; // logged; the volume stays marked in use, recovery will run
        }
        let which = read_superblock(self.region.bytes())
            .map(|(_, w)| w)
            .unwrap_or(0);
        if self.write_superblock(true, which).is_ok() && self.holds_volume {
            let _ = crate::holder::clear(&mut self.region);
        }
        tracing::info!(stats = ?self.stats.snapshot(), "volume closed cleanly");
    }
}

/// The test door (see `Volume::test_door`).
#[doc(hidden)]
pub struct TestDoor<'a>(&'a Volume);

impl TestDoor<'_> {
    /// Record every store, flush and fence from now on (crash testing).
    ///
    /// # Safety
    /// No other thread may use the volume until `take_recording`.
    pub unsafe fn start_recording(&self) {
        // SAFETY: passed on to the caller.
        unsafe { self.0.region.start_recording() }
    }
    pub fn take_recording(&self) -> Option<zcfs_pmem::Recording> {
        self.0.region.take_recording()
    }
    /// A marker in the recording (operation boundaries).
    pub fn mark(&self, tag: u64) {
        self.0.region.mark(tag)
    }
    /// The `n`-th fence from now reports a persistence failure.
    pub fn inject_fence_failure(&self, n: i64) {
        self.0.region.inject_fence_failure(n)
    }
    /// A store the volume neither makes nor writes back, as a NIC's DMA into a landing
    /// reservation: recorded (crash testing) as in flight until something flushes it.
    ///
    /// # Safety
    /// `[off, off + data.len())` must be fresh blocks the caller holds (a reservation's),
    /// with no view of them alive.
    pub unsafe fn store_unflushed(&self, off: usize, data: &[u8]) {
        // SAFETY: the caller's contract is the region's.
        unsafe { self.0.region.write(off, data) }
    }
    /// Whether data block `b` is free in the allocator (not waiting for a checkpoint).
    pub fn block_is_free(&self, b: u64) -> bool {
        self.0.read_state().balloc.is_free_block(b)
    }
    /// The data blocks mapped in file `ino` (block numbers, in file order).
    pub fn file_blocks(&self, ino: u64) -> Result<Vec<u64>> {
        let st = self.0.read_state();
        let i = st.inode(ino)?;
        let mut out = Vec::new();
        i.map
            .for_range(0, i.rec.size.div_ceil(BLOCK_U64), |_, b| out.extend(b));
        Ok(out)
    }
    /// A copy of the whole image.
    ///
    /// # Safety
    /// No operation may run meanwhile (a reservation being filled races with the copy).
    pub unsafe fn image(&self) -> Vec<u8> {
        let _st = self.0.state.write().unwrap();
        // SAFETY: the caller's contract, and the write lock keeps committers out.
        unsafe { self.0.region.slice(0, self.0.region.len()) }.to_vec()
    }
}

/// The newest valid superblock copy and its index (0 or 1), from an image's first bytes.
pub(crate) fn read_superblock(img: &[u8]) -> Result<(Superblock, usize)> {
    if img.len() < 2 * BLOCK {
        return Err(FsError::Corrupt(format!(
            "image of {} bytes is too small",
            img.len()
        )));
    }
    let a = Superblock::decode(&img[0..SB_SIZE]);
    let b = Superblock::decode(&img[BLOCK..BLOCK + SB_SIZE]);
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(if b.generation > a.generation {
            (b, 1)
        } else {
            (a, 0)
        }),
        (Ok(a), Err(e)) => {
            tracing::warn!("superblock copy 2 unusable ({e}); using copy 1");
            Ok((a, 0))
        }
        (Err(e), Ok(b)) => {
            tracing::warn!("superblock copy 1 unusable ({e}); using copy 2");
            Ok((b, 1))
        }
        (Err(FsError::NotZcfs), Err(FsError::NotZcfs)) => Err(FsError::NotZcfs),
        (Err(e), Err(_)) => Err(e),
    }
}
