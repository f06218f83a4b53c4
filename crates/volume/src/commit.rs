//! Transactions and the operation log: how one operation's changes become one log entry,
//! how a batch of entries commits with one tail store, and how a checkpoint makes freed
//! blocks reusable.
//!
//! Every operation follows the same shape, so that a failure changes nothing:
//! 1. **check**: validate the request and work out what it needs (blocks, an inode, log
//!    space) without changing anything;
//! 2. **reserve**: [`Volume::reserve_log`], then [`Volume::reserve_blocks`] last: the
//!    only steps that can fail for lack of space (a checkpoint may run to release
//!    deferred frees, which changes no file). Blocks come last so that no failure can
//!    leave a transaction holding them;
//! 3. **apply**: change the DRAM state and build the redo records; nothing here can
//!    fail (the map takes its nodes from the reserved blocks);
//! 4. [`Volume::finish`]: append the entry; commit the batch when it is full.
//!
//! Commit protocol (one batch, see docs/format.md):
//! 1. each operation writes its data into fresh blocks and its log entry into the ring,
//!    each written back, no fence;
//! 2. commit: one fence; the 8-byte tail word; write back; fence. The batch is durable;
//! 3. the records are applied to their home locations (written back; the next fence
//!    orders them);
//! 4. checkpoint (when the log is half full or blocks are short): fence; head word = tail;
//!    write back; fence. Only now are blocks freed by the checkpointed entries reusable,
//!    so replaying a redo record can never land on a block that was reused for data —
//!    and only once no reader pins them (pins.rs).

use crate::config::CommitFault;
use crate::error::{FsError, Result};
use crate::layout::*;
use crate::map::{FileMap, MapSink};
use crate::pm::{FreshBlock, PmAddr};
use crate::volume::{State, Volume};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Bytes of one inode record in a log entry.
pub(crate) const INODE_RECORD: u64 = (REC_HDR + INODE_SIZE) as u64;
/// Bytes of one directory-entry record at most (a 255-byte name takes 9 units).
pub(crate) const DIRENT_RECORD: u64 = (REC_HDR + 9 * DIRENT_UNIT) as u64;
/// Fixed part of every entry: the header and the alignment to 64 bytes.
pub(crate) const ENTRY_OVERHEAD: u64 = (LOG_HDR + 64) as u64;
/// Checkpoint once this many freed blocks wait for reuse (4 MiB): a checkpoint is two
/// fences and one store, while a large backlog of unusable free blocks makes writes
/// cycle through more memory than the caches hold.
const CHECKPOINT_FREES: usize = 1024;

/// A transaction being built: one log entry, and the blocks reserved for it.
pub(crate) struct Txn {
    pub op: OpType,
    pub ino: u64,
    pub records: Vec<Record>,
    pub dirty: BTreeSet<u64>,
    /// Blocks the entry takes out of use (reusable after its checkpoint).
    pub releases: Vec<u64>,
    pub data_addr: u64,
    pub data_size: u64,
    /// Blocks reserved for this transaction; what is left at `finish` goes back.
    pub pool: Vec<FreshBlock>,
    /// Upper bound on the encoded entry, checked against the ring before applying.
    pub log_bound: u64,
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
            pool: Vec::new(),
            log_bound: 0,
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

    /// A reserved block (the reservation made room for exactly this many).
    pub fn take_block(&mut self) -> FreshBlock {
        self.pool
            .pop()
            .expect("an operation used more blocks than it reserved")
    }
}

impl Drop for Txn {
    /// Blocks are reserved last, after every check that can fail, and `finish` takes
    /// what is left: a transaction dropped holding blocks would leak them.
    fn drop(&mut self) {
        assert!(
            self.pool.is_empty() || std::thread::panicking(),
            "{:?} transaction dropped with {} reserved blocks",
            self.op,
            self.pool.len()
        );
    }
}

/// Map side effects into a transaction.
pub(crate) struct Sink<'a> {
    pub vol: &'a Volume,
    pub txn: &'a mut Txn,
}

impl MapSink for Sink<'_> {
    fn new_node(&mut self) -> u64 {
        let b = self.txn.take_block();
        self.vol.fresh_zero(&b, 0, BLOCK);
        self.vol.fresh_flush(&b, 0, BLOCK);
        b.publish()
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

/// Most blocks kept back from ordinary allocations for metadata rewrites that give
/// back what they take: copy-on-write needs the new blocks before the old ones are
/// freed, so without a reserve a chmod that rewrites an access ACL, or removing an
/// xattr from a set, would fail with ENOSPC on a full volume, where Linux file systems
/// let a user remove attributes to free space (btrfs keeps a global reserve for the
/// same reason). Enough for the largest xattr set (its data blocks and index: 1 MiB);
/// statfs counts the reserve as used.
pub const METADATA_RESERVE_MAX: u64 = crate::layout::XATTR_MAX_DATA_BLOCKS as u64 + 1;

/// Blocks of a volume with `data_blocks` kept back: [`METADATA_RESERVE_MAX`], and at
/// most 1/16 of a small volume's data area (ext4 keeps 5 % for root).
pub fn metadata_reserve(data_blocks: u64) -> u64 {
    METADATA_RESERVE_MAX.min(data_blocks / 16)
}

impl Volume {
    /// Blocks ordinary allocations leave alone (see [`METADATA_RESERVE_MAX`]).
    pub(crate) fn metadata_reserve(&self) -> u64 {
        metadata_reserve(self.geo.data_blocks)
    }

    /// Make sure `n` blocks can be allocated without touching the blocks promised to
    /// files (`State::reserved`) or, unless `rewrite`, the metadata reserve,
    /// checkpointing to release deferred frees.
    pub(crate) fn ensure_blocks(&self, st: &mut State, n: u64) -> Result<()> {
        self.ensure_blocks_of(st, n, false)
    }

    fn ensure_blocks_of(&self, st: &mut State, n: u64, rewrite: bool) -> Result<()> {
        let held_back = if rewrite { 0 } else { self.metadata_reserve() };
        let unpromised = |st: &State| {
            st.balloc
                .free_count()
                .saturating_sub(st.reserved + held_back)
        };
        if unpromised(st) >= n {
            return Ok(());
        }
        self.commit_batch(st)?;
        self.checkpoint(st)?;
        if unpromised(st) >= n {
            Ok(())
        } else {
            Err(FsError::NoSpace)
        }
    }

    /// Reserve `n` blocks into `txn`'s pool: the only way an operation gets blocks, so
    /// running out is found before anything changes.
    pub(crate) fn reserve_blocks(&self, st: &mut State, txn: &mut Txn, n: u64) -> Result<()> {
        self.reserve_rewrite_blocks(st, txn, n, 0)
    }

    /// `reserve_blocks` for a rewrite that releases `releasing` blocks when it commits:
    /// when it takes no more than it gives back, it may use the metadata reserve.
    pub(crate) fn reserve_rewrite_blocks(
        &self,
        st: &mut State,
        txn: &mut Txn,
        n: u64,
        releasing: u64,
    ) -> Result<()> {
        self.fault_point(|| FsError::NoSpace)?;
        if n == 0 {
            return Ok(());
        }
        self.ensure_blocks_of(st, n, n <= releasing)?;
        let got = st.balloc.alloc(n as usize)?;
        txn.pool
            .extend(got.into_iter().map(FreshBlock::from_allocator));
        Ok(())
    }

    /// `reserve_blocks` for pages handed out to be filled (`reserve_pages`): known-zero
    /// blocks first. Returns, for each block of the pool in order, whether it holds
    /// zeros already.
    pub(crate) fn reserve_clean_blocks(
        &self,
        st: &mut State,
        txn: &mut Txn,
        n: u64,
    ) -> Result<Vec<bool>> {
        self.fault_point(|| FsError::NoSpace)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        self.ensure_blocks_of(st, n, false)?;
        let got = st.balloc.alloc_clean_first(n as usize)?;
        let clean = got.iter().map(|&(_, c)| c).collect();
        txn.pool
            .extend(got.into_iter().map(|(b, _)| FreshBlock::from_allocator(b)));
        Ok(clean)
    }

    /// Check that an entry of at most `bound` bytes fits the log (half the ring, so a
    /// checkpoint can always make room), and remember the bound for `finish`.
    pub(crate) fn reserve_log(&self, txn: &mut Txn, bound: u64) -> Result<()> {
        let max = self.max_entry();
        self.fault_point(|| FsError::TransactionTooLarge { bytes: bound, max })?;
        if bound > max {
            return Err(FsError::TransactionTooLarge { bytes: bound, max });
        }
        txn.log_bound = bound;
        Ok(())
    }

    /// Largest log entry: half the ring.
    pub(crate) fn max_entry(&self) -> u64 {
        self.geo.ring_len() / 2
    }

    /// An inode slot for a new inode, checked before anything changes.
    pub(crate) fn reserve_inode(&self, st: &State) -> Result<()> {
        self.fault_point(|| FsError::NoInodes)?;
        if st.ialloc.free_count() == 0 {
            return Err(FsError::NoInodes);
        }
        Ok(())
    }

    /// Finish a transaction: encode dirty inodes, append the log entry, and commit the
    /// batch when it is full. Nothing can fail here but persistence itself (the volume
    /// then turns read-only).
    pub(crate) fn finish(&self, st: &mut State, mut txn: Txn) -> Result<()> {
        for b in std::mem::take(&mut txn.pool) {
            st.balloc.free(b.publish());
        }
        let changes = self.changes.get();
        for &ino in &txn.dirty {
            // Under the state's write lock: a lease taken after this sees the change.
            if let Some(c) = changes {
                c.raise(ino);
            }
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
        let meta_start = self.geo.itable_start * BLOCK_U64;
        let region_end = self.geo.total_blocks * BLOCK_U64;
        for r in &txn.records {
            assert!(
                r.addr >= meta_start && r.addr + r.len() as u64 <= region_end,
                "redo record {}+{} outside the inode table and data area",
                r.addr,
                r.len()
            );
        }
        if self.cfg.no_log {
            for r in &txn.records {
                self.apply(st, r);
            }
            self.fence()?;
            // Released blocks a reader or a lease still pins wait for a checkpoint
            // that finds them unpinned, as with the log: a free block may be reused or
            // zeroed ahead of need (zero.rs) at once.
            let releases = std::mem::take(&mut txn.releases);
            if !releases.is_empty() {
                let read = self.readers.pinned();
                for b in releases {
                    if st.pins.contains_key(&b) || read.contains(b) {
                        st.deferred_frees.push(b);
                    } else {
                        st.balloc.free(b);
                    }
                }
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
            records: std::mem::take(&mut txn.records),
        };
        let len = entry.encoded_len() as u64;
        let ring = self.geo.ring_len();
        assert!(
            len <= txn.log_bound && len <= ring / 2,
            "{:?} entry of {len} bytes exceeds its reserved bound {} (ring {ring})",
            txn.op,
            txn.log_bound
        );
        let pad = |next: u64| {
            let pos = next % ring;
            if pos + len > ring {
                ring - pos
            } else {
                0
            }
        };
        if st.log.next + pad(st.log.next) + len - st.log.head > ring {
            self.commit_batch(st)?;
            self.checkpoint(st)?;
        }
        let p = pad(st.log.next);
        if p > 0 {
            st.log.seq += 1;
            let hdr = LogEntry::encode_pad(st.log.seq, st.log.next, p as u32);
            let off = self.geo.ring_off() + (st.log.next % ring) as usize;
            self.meta_write(st, PmAddr(off as u64), &hdr);
            self.region.flush(off, hdr.len());
            st.log.next += p;
        }
        st.log.seq += 1;
        entry.seq = st.log.seq;
        entry.lsn = st.log.next;
        let bytes = entry.encode();
        let off = self.geo.ring_off() + (st.log.next % ring) as usize;
        self.meta_write(st, PmAddr(off as u64), &bytes);
        self.region.flush(off, bytes.len());
        st.log.next += len;
        let l = &st.log;
        assert!(
            l.head <= l.tail && l.tail <= l.next && l.next - l.head <= ring,
            "log words out of order: head {} tail {} next {} ring {ring}",
            l.head,
            l.tail,
            l.next
        );
        self.stats.log_bytes.fetch_add(len + p, Ordering::Relaxed);
        let b = &mut st.batch;
        b.apply.append(&mut entry.records);
        b.frees.append(&mut txn.releases);
        b.ops += 1;
        b.bytes += len + txn.data_size;
        b.since.get_or_insert_with(Instant::now);
        if b.ops >= self.cfg.batch_ops || b.bytes >= self.cfg.batch_bytes {
            self.commit_batch(st)?;
        }
        Ok(())
    }

    fn apply(&self, st: &mut State, r: &Record) {
        match &r.data {
            RecData::Bytes(b) => self.meta_write(st, PmAddr(r.addr), b),
            RecData::Zero(n) => self.meta_zero(st, PmAddr(r.addr), *n as usize),
        }
        self.region.flush(r.addr as usize, r.len());
    }

    /// A fence; a persistence failure turns the volume read-only (as ext4's
    /// errors=remount-ro) and is reported as EIO.
    pub(crate) fn fence(&self) -> Result<()> {
        self.region.fence().map_err(|e| self.persistence_failed(e))
    }

    /// Store `value` in the log header's word at `word` (TAIL_WORD, HEAD_WORD), durably:
    /// write, flush, fence.
    fn store_log_word(&self, word: usize, value: u64) -> Result<()> {
        let off = self.geo.log_header_off() + word;
        self.region.write_u64(off, value);
        self.region.flush(off, 8);
        self.fence()
    }

    /// Commit the pending batch: fence, tail store, fence, then apply to home locations.
    pub(crate) fn commit_batch(&self, st: &mut State) -> Result<()> {
        // Re-checked under the lock: a failure may have come while this caller waited,
        // and nothing may be committed (nor reported durable) after one.
        if self.has_failed() {
            return Err(FsError::Io(std::io::Error::from_raw_os_error(libc::EIO)));
        }
        if st.batch.ops == 0 {
            return Ok(());
        }
        if self.cfg.fault != Some(CommitFault::SkipFenceBeforeTail) {
            self.fence()?;
        }
        self.store_log_word(TAIL_WORD, st.log.next)?;
        st.log.tail = st.log.next;
        let batch = std::mem::take(&mut st.batch);
        for r in &batch.apply {
            self.apply(st, r);
        }
        st.deferred_frees.extend(batch.frees);
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        let ring = self.geo.ring_len();
        // Frees still pinned at the last checkpoint do not count: a stalled reader must
        // not turn every commit into a checkpoint.
        let new_frees = st.deferred_frees.len() - st.deferred_pinned;
        if st.log.tail - st.log.head > ring / 2 || new_frees > CHECKPOINT_FREES {
            self.checkpoint(st)?;
        }
        Ok(())
    }

    /// Make applied records durable, move the head to the tail, release the deferred
    /// frees that no reader and no attached page still uses.
    pub(crate) fn checkpoint(&self, st: &mut State) -> Result<()> {
        if self.has_failed() {
            return Err(FsError::Io(std::io::Error::from_raw_os_error(libc::EIO)));
        }
        if st.log.head == st.log.tail && st.deferred_frees.is_empty() {
            return Ok(());
        }
        if st.log.head != st.log.tail {
            self.fence()?;
            self.store_log_word(HEAD_WORD, st.log.tail)?;
            st.log.head = st.log.tail;
            self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        }
        // Only frees of checkpointed entries are here (the batch was committed and the
        // head moved past it).
        let read = self.readers.pinned();
        let frees = std::mem::take(&mut st.deferred_frees);
        for b in frees {
            if st.pins.contains_key(&b) || read.contains(b) {
                st.deferred_frees.push(b);
            } else {
                st.balloc.free(b);
            }
        }
        st.deferred_pinned = st.deferred_frees.len();
        Ok(())
    }
}
