//! The volume: open/mkfs, transactions, the operation log, group commit, checkpoint.
//!
//! Commit protocol (one batch of operations, see docs/format.md):
//! 1. each operation writes its data into fresh blocks and its log entry (the redo
//!    records of every metadata change, plus op type, inode, data address and size,
//!    sequence number, checksum) into the ring, each written back, no fence;
//! 2. commit: one fence; the 8-byte tail word; write back; fence. The batch is durable;
//! 3. the records are applied to their home locations (written back; the next fence
//!    orders them);
//! 4. checkpoint (when the log is half full or blocks are short): fence; head word = tail;
//!    write back; fence. Only now are blocks freed by the checkpointed entries reusable,
//!    so replaying a redo record can never land on a block that was reused for data.

use crate::alloc::{BlockAlloc, InodeAlloc};
use crate::dir::Dir;
use crate::error::{FsError, Result};
use crate::layout::*;
use crate::map::{FileMap, MapSink};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use std::time::{Duration, Instant};
use zcfs_pmem::{OpenParams, PersistMode, Region};

/// A fault injected into the commit path, only to prove the crash suite can fail.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitFault {
    /// Skip the write-back of data blocks before their log entry commits.
    SkipDataFlush,
    /// Skip the fence between the log entries and the tail store.
    SkipFenceBeforeTail,
}

#[derive(Debug, Clone)]
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

#[derive(Debug, Clone)]
pub struct MkfsOptions {
    pub inodes: Option<u64>,
    pub log_bytes: Option<u64>,
}

/// Counters, readable while the volume runs.
#[derive(Debug, Default)]
pub struct Stats {
    pub ops: AtomicU64,
    pub commits: AtomicU64,
    pub checkpoints: AtomicU64,
    pub log_bytes: AtomicU64,
    pub data_bytes_written: AtomicU64,
    pub data_bytes_read: AtomicU64,
    /// Bytes copied in user space on the data paths (memcpy into or out of PM).
    pub user_copy_bytes: AtomicU64,
    /// Bytes handed out as borrowed PM slices or attached pages (no copy).
    pub zero_copy_bytes: AtomicU64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct StatsSnapshot {
    pub ops: u64,
    pub commits: u64,
    pub checkpoints: u64,
    pub log_bytes: u64,
    pub data_bytes_written: u64,
    pub data_bytes_read: u64,
    pub user_copy_bytes: u64,
    pub zero_copy_bytes: u64,
}

impl Stats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            ops: g(&self.ops),
            commits: g(&self.commits),
            checkpoints: g(&self.checkpoints),
            log_bytes: g(&self.log_bytes),
            data_bytes_written: g(&self.data_bytes_written),
            data_bytes_read: g(&self.data_bytes_read),
            user_copy_bytes: g(&self.user_copy_bytes),
            zero_copy_bytes: g(&self.zero_copy_bytes),
        }
    }
}

/// An inode in DRAM: the persistent record plus its map and xattrs.
#[derive(Debug, Clone)]
pub(crate) struct Inode {
    pub rec: InodeRec,
    pub map: FileMap,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Inode {
    /// The record as it goes to PM, with derived fields brought up to date.
    pub fn encode(&self) -> [u8; INODE_SIZE] {
        let mut r = self.rec.clone();
        r.map_root = self.map.root;
        r.map_height = self.map.height;
        r.blocks = self.map.owned_blocks() + (r.xattr_block != 0) as u64;
        r.encode()
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
    /// Freed blocks waiting for the checkpoint that makes their reuse safe.
    pub deferred_frees: Vec<u64>,
    /// Blocks attached to callers' address spaces (zcopy_to): not reused while pinned.
    pub pins: HashMap<u64, u32>,
    /// Open handles per inode (frontends call open_handle/release_handle).
    pub open: HashMap<u64, u32>,
}

/// A transaction being built: one log entry.
pub(crate) struct Txn {
    pub op: OpType,
    pub ino: u64,
    pub records: Vec<Record>,
    pub dirty: BTreeSet<u64>,
    pub releases: Vec<u64>,
    pub data_addr: u64,
    pub data_size: u64,
}

impl Txn {
    pub fn new(op: OpType, ino: u64) -> Txn {
        Txn {
            op,
            ino,
            records: Vec::new(),
            dirty: BTreeSet::new(),
            releases: Vec::new(),
            data_addr: 0,
            data_size: 0,
        }
    }

    /// Add a redo record, merging with the previous one when contiguous.
    pub fn push_bytes(&mut self, addr: u64, bytes: &[u8]) {
        if let Some(Record {
            addr: a,
            data: RecData::Bytes(b),
        }) = self.records.last_mut()
        {
            if *a + b.len() as u64 == addr && b.len() + bytes.len() <= BLOCK {
                b.extend_from_slice(bytes);
                return;
            }
        }
        self.records.push(Record {
            addr,
            data: RecData::Bytes(bytes.to_vec()),
        });
    }

    pub fn push_zero(&mut self, addr: u64, len: usize) {
        self.records.push(Record {
            addr,
            data: RecData::Zero(len as u32),
        });
    }
}

/// Map side effects into a transaction.
pub(crate) struct Sink<'a> {
    pub region: &'a Region,
    pub balloc: &'a mut BlockAlloc,
    pub txn: &'a mut Txn,
}

impl MapSink for Sink<'_> {
    fn new_node(&mut self) -> Result<u64> {
        let b = self.balloc.alloc_one()?;
        let off = (b * BLOCK_U64) as usize;
        self.region.zero(off, BLOCK);
        self.region.flush(off, BLOCK);
        Ok(b)
    }
    fn set_ptr(&mut self, node: u64, slot: usize, val: u64) {
        self.txn
            .push_bytes(FileMap::ptr_addr(node, slot), &val.to_le_bytes());
    }
    fn zero_ptrs(&mut self, node: u64, slot: usize, n: usize) {
        self.txn.push_zero(FileMap::ptr_addr(node, slot), n * 8);
    }
    fn release(&mut self, block: u64) {
        self.txn.releases.push(block);
    }
}

pub struct Volume {
    pub(crate) region: Region,
    pub(crate) geo: Geometry,
    pub(crate) sb: Mutex<Superblock>,
    pub(crate) cfg: VolumeConfig,
    pub(crate) state: RwLock<State>,
    pub stats: Stats,
    /// Set when the volume must not write its clean flag on drop (simulated crash).
    abandoned: AtomicBool,
    stop_flusher: Arc<AtomicBool>,
    /// What recovery found at open (entries replayed, where it stopped).
    pub(crate) recovery: RecoveryReport,
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
}

/// Checkpoint once this many freed blocks wait for reuse (4 MiB): a checkpoint is two
/// fences and one store, while a large backlog of unusable free blocks makes writes
/// cycle through more memory than the caches hold.
const CHECKPOINT_FREES: usize = 1024;

impl Volume {
    /// Create a new volume on `path` (the file is created or grown to `size`).
    pub fn mkfs(path: &Path, size: u64, opts: &MkfsOptions) -> Result<()> {
        let region = Region::open(
            path,
            &OpenParams {
                create_size: Some(size),
                ..Default::default()
            },
        )?;
        Self::mkfs_region(&region, opts)
    }

    /// Format a mapped region.
    pub fn mkfs_region(region: &Region, opts: &MkfsOptions) -> Result<()> {
        let geo = Geometry::plan(region.len() as u64, opts.inodes, opts.log_bytes)?;
        // Invalidate any previous volume first, so a crash mid-mkfs leaves no valid
        // superblock pointing at half-initialized metadata.
        region.zero(0, 2 * BLOCK);
        region.persist(0, 2 * BLOCK);
        let meta_end = (geo.data_start * BLOCK_U64) as usize;
        let start = (geo.log_start * BLOCK_U64) as usize;
        for off in (start..meta_end).step_by(1 << 20) {
            let len = (meta_end - off).min(1 << 20);
            // Avoid dirtying pages of a fresh sparse file that are already zero.
            // SAFETY: no one else uses the region during mkfs.
            if unsafe { region.slice(off, len) }.iter().any(|&b| b != 0) {
                region.zero(off, len);
                region.flush(off, len);
            }
        }
        let now = Timespec::now();
        let root = InodeRec {
            ino: ROOT_INO,
            gen: 1,
            mode: S_IFDIR | 0o755,
            nlink: 2,
            atime: now,
            mtime: now,
            ctime: now,
            parent: ROOT_INO,
            ..Default::default()
        };
        region.write(geo.inode_off(ROOT_INO), &root.encode());
        region.flush(geo.inode_off(ROOT_INO), INODE_SIZE);
        region.fence();
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
            region.write(off + 8, &enc[8..]);
            region.persist(off, SB_SIZE);
            region.write_u64(off, u64::from_le_bytes(enc[..8].try_into().unwrap()));
            region.persist(off, 8);
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

    /// Open the volume on `path`, recovering from a crash if needed.
    pub fn open(path: &Path, cfg: VolumeConfig) -> Result<Arc<Volume>> {
        let region = Region::open(
            path,
            &OpenParams {
                force_mode: cfg.persist,
                // Read-only opens still replay the log: into a private copy.
                private: cfg.read_only,
                ..Default::default()
            },
        )?;
        Self::open_region(region, cfg)
    }

    /// Open a mapped region (anonymous regions in tests, private maps in fsck).
    pub fn open_region(region: Region, cfg: VolumeConfig) -> Result<Arc<Volume>> {
        Self::open_region_with(region, cfg, None)
    }

    /// Open, collecting load problems into `lenient` instead of failing (fsck).
    pub(crate) fn open_region_with(
        region: Region,
        cfg: VolumeConfig,
        lenient: Option<&mut Vec<String>>,
    ) -> Result<Arc<Volume>> {
        let (sb, which) = read_superblock(&region)?;
        let geo = sb.geo;
        if geo.total_blocks * BLOCK_U64 > region.len() as u64 {
            return Err(FsError::Corrupt(format!(
                "superblock says {} bytes, the image has {}",
                geo.total_blocks * BLOCK_U64,
                region.len()
            )));
        }
        let (log, mut report) = crate::recovery::replay(&region, &geo)?;
        report.was_clean = sb.clean;
        let state = match lenient {
            None => {
                crate::recovery::load_state(&region, &geo, log, &mut |p| Err(FsError::Corrupt(p)))?
            }
            Some(list) => crate::recovery::load_state(&region, &geo, log, &mut |p| {
                list.push(p);
                Ok(())
            })?,
        };
        let vol = Arc::new(Volume {
            region,
            geo,
            sb: Mutex::new(sb),
            cfg,
            state: RwLock::new(state),
            stats: Stats::default(),
            abandoned: AtomicBool::new(false),
            stop_flusher: Arc::new(AtomicBool::new(false)),
            recovery: report,
        });
        if !vol.cfg.read_only {
            // The ring is written over and over: back it with pages now rather than
            // faulting through it during the first lap.
            vol.region.prefault(geo.ring_off(), geo.ring_len() as usize);
            vol.write_superblock(false, which)?;
            let reaped = vol.reap_orphans()?;
            if reaped > 0 {
                tracing::info!(
                    reaped,
                    "freed files that were unlinked while open before a crash"
                );
            }
            if vol.cfg.batch_ops > 1 {
                spawn_flusher(&vol);
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
    fn write_superblock(&self, clean: bool, last: usize) -> Result<()> {
        let mut sb = self.sb.lock().unwrap();
        sb.generation += 1;
        sb.clean = clean;
        if !clean {
            sb.mount_count += 1;
        }
        let target = if last == 0 { BLOCK } else { 0 };
        self.region.write(target, &sb.encode());
        self.region.persist(target, SB_SIZE);
        Ok(())
    }

    pub fn region(&self) -> &Region {
        &self.region
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
    pub(crate) fn write_state(&self) -> Result<RwLockWriteGuard<'_, State>> {
        if self.cfg.read_only {
            return Err(FsError::ReadOnly);
        }
        Ok(self.state.write().unwrap())
    }

    /// Make every operation so far durable (fsync, fdatasync, syncfs).
    pub fn sync(&self) -> Result<()> {
        if self.cfg.read_only {
            return Ok(());
        }
        let mut st = self.state.write().unwrap();
        self.commit_batch(&mut st);
        Ok(())
    }

    /// Commit and checkpoint now: the log is empty afterwards.
    pub fn checkpoint_now(&self) -> Result<()> {
        let mut st = self.write_state()?;
        self.commit_batch(&mut st);
        self.checkpoint(&mut st);
        Ok(())
    }

    /// Simulate a crash: nothing more is written, not even the clean flag.
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
        self.stop_flusher.store(true, Ordering::SeqCst);
    }

    /// Make sure `n` blocks can be allocated, checkpointing to release deferred frees.
    pub(crate) fn ensure_blocks(&self, st: &mut State, n: u64) -> Result<()> {
        if st.balloc.free_count() >= n {
            return Ok(());
        }
        self.commit_batch(st);
        self.checkpoint(st);
        if st.balloc.free_count() >= n {
            Ok(())
        } else {
            Err(FsError::NoSpace)
        }
    }

    /// Finish a transaction: encode dirty inodes, append the log entry, and commit the
    /// batch when it is full.
    pub(crate) fn finish(&self, st: &mut State, mut txn: Txn) -> Result<()> {
        for &ino in &txn.dirty {
            let bytes = match st.inodes.get(&ino) {
                Some(i) => i.encode(),
                None => InodeRec::free_slot(st.gens[(ino - 1) as usize]),
            };
            txn.records.push(Record {
                addr: self.geo.inode_off(ino) as u64,
                data: RecData::Bytes(bytes.to_vec()),
            });
        }
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        if self.cfg.no_log {
            for r in &txn.records {
                self.apply(r);
            }
            self.region.fence();
            for b in txn.releases {
                st.balloc.free(b);
            }
            return Ok(());
        }
        let mut entry = LogEntry {
            op: txn.op,
            seq: 0,
            lsn: 0,
            ino: txn.ino,
            data_addr: txn.data_addr,
            data_size: txn.data_size,
            records: txn.records,
        };
        let len = entry.encoded_len() as u64;
        let ring = self.geo.ring_len();
        if len > ring / 2 {
            return Err(FsError::TooBig);
        }
        let pad = |next: u64| {
            let pos = next % ring;
            if pos + len > ring {
                ring - pos
            } else {
                0
            }
        };
        if st.log.next + pad(st.log.next) + len - st.log.head > ring {
            self.commit_batch(st);
            self.checkpoint(st);
        }
        let p = pad(st.log.next);
        if p > 0 {
            st.log.seq += 1;
            let hdr = LogEntry::encode_pad(st.log.seq, st.log.next, p as u32);
            let off = self.geo.ring_off() + (st.log.next % ring) as usize;
            self.region.write(off, &hdr);
            self.region.flush(off, hdr.len());
            st.log.next += p;
        }
        st.log.seq += 1;
        entry.seq = st.log.seq;
        entry.lsn = st.log.next;
        let bytes = entry.encode();
        let off = self.geo.ring_off() + (st.log.next % ring) as usize;
        self.region.write(off, &bytes);
        self.region.flush(off, bytes.len());
        st.log.next += len;
        self.stats.log_bytes.fetch_add(len + p, Ordering::Relaxed);
        let b = &mut st.batch;
        b.apply.append(&mut entry.records);
        b.frees.extend(txn.releases);
        b.ops += 1;
        b.bytes += len + txn.data_size;
        b.since.get_or_insert_with(Instant::now);
        if b.ops >= self.cfg.batch_ops || b.bytes >= self.cfg.batch_bytes {
            self.commit_batch(st);
        }
        Ok(())
    }

    fn apply(&self, r: &Record) {
        match &r.data {
            RecData::Bytes(b) => self.region.write(r.addr as usize, b),
            RecData::Zero(n) => self.region.zero(r.addr as usize, *n as usize),
        }
        self.region.flush(r.addr as usize, r.len());
    }

    /// Commit the pending batch: fence, tail store, fence, then apply to home locations.
    pub(crate) fn commit_batch(&self, st: &mut State) {
        if st.batch.ops == 0 {
            return;
        }
        if self.cfg.fault != Some(CommitFault::SkipFenceBeforeTail) {
            self.region.fence();
        }
        let tail_off = self.geo.log_header_off() + TAIL_WORD;
        self.region.write_u64(tail_off, st.log.next);
        self.region.flush(tail_off, 8);
        self.region.fence();
        st.log.tail = st.log.next;
        let batch = std::mem::take(&mut st.batch);
        for r in &batch.apply {
            self.apply(r);
        }
        st.deferred_frees.extend(batch.frees);
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        let ring = self.geo.ring_len();
        if st.log.tail - st.log.head > ring / 2 || st.deferred_frees.len() > CHECKPOINT_FREES {
            self.checkpoint(st);
        }
    }

    /// Make applied records durable, move the head to the tail, release deferred frees.
    pub(crate) fn checkpoint(&self, st: &mut State) {
        if st.log.head == st.log.tail && st.deferred_frees.is_empty() {
            return;
        }
        self.region.fence();
        let head_off = self.geo.log_header_off() + HEAD_WORD;
        self.region.write_u64(head_off, st.log.tail);
        self.region.flush(head_off, 8);
        self.region.fence();
        st.log.head = st.log.tail;
        let frees = std::mem::take(&mut st.deferred_frees);
        for b in frees {
            if st.pins.contains_key(&b) {
                st.deferred_frees.push(b);
            } else {
                st.balloc.free(b);
            }
        }
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
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
        if due {
            let mut st = self.state.write().unwrap();
            self.commit_batch(&mut st);
        }
    }
}

fn spawn_flusher(vol: &Arc<Volume>) {
    let weak: Weak<Volume> = Arc::downgrade(vol);
    let stop = vol.stop_flusher.clone();
    let delay = vol.cfg.batch_delay.max(Duration::from_micros(100));
    std::thread::Builder::new()
        .name("zcfs-flusher".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(delay);
                match weak.upgrade() {
                    Some(v) => v.flush_if_due(),
                    None => break,
                }
            }
        })
        .expect("spawn flusher thread");
}

impl Drop for Volume {
    fn drop(&mut self) {
        self.stop_flusher.store(true, Ordering::SeqCst);
        if self.abandoned.load(Ordering::SeqCst) || self.cfg.read_only {
            return;
        }
        let mut st = self.state.write().unwrap();
        self.commit_batch(&mut st);
        // Force a checkpoint so a clean volume has an empty log.
        if st.log.head != st.log.tail || !st.deferred_frees.is_empty() {
            self.checkpoint(&mut st);
        }
        drop(st);
        let which = read_superblock(&self.region).map(|(_, w)| w).unwrap_or(0);
        let _ = self.write_superblock(true, which);
        tracing::info!(stats = ?self.stats.snapshot(), "volume closed cleanly");
    }
}

/// The newest valid superblock copy and its index (0 or 1).
pub(crate) fn read_superblock(region: &Region) -> Result<(Superblock, usize)> {
    if region.len() < 2 * BLOCK {
        return Err(FsError::Corrupt(format!(
            "image of {} bytes is too small",
            region.len()
        )));
    }
    // SAFETY: superblocks are only written by the volume owning this region, and not
    // concurrently with opening it.
    let a = Superblock::decode(unsafe { region.slice(0, SB_SIZE) });
    // SAFETY: as above.
    let b = Superblock::decode(unsafe { region.slice(BLOCK, SB_SIZE) });
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
