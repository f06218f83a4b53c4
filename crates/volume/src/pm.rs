//! Every access of the volume to its mapped region, and the proofs that keep the
//! region's access contract (zcfs_pmem: a store is alone with its range; a borrow sees
//! no concurrent store).
//!
//! The volume writes three kinds of places, each behind its own proof:
//! - **fresh blocks** ([`FreshBlock`]): taken from the allocator for one transaction or
//!   reservation, reachable from no file and no log record yet. Only the holder of the
//!   token knows the number, so its stores race with nothing. The token is not `Clone`
//!   and is given up ([`FreshBlock::publish`]) when the block is linked into a file.
//! - **metadata homes and the log** (inode table, map nodes, directory blocks, the log
//!   ring and its words): written only with `&mut State` in hand, i.e. under the state's
//!   write lock (or before the state is shared). Nothing borrows them at run time: reads
//!   go through the DRAM index.
//! - **free blocks** (zero.rs): zeroed ahead of need only with `&mut State` in hand,
//!   so no transaction can take them meanwhile; a free block is reachable from no file,
//!   held by no transaction or reservation and pinned by no reader (a block is freed
//!   only once unpinned), so nothing else reads or writes it.
//! - nothing else: live data blocks are never written in place (copy-on-write).
//!
//! Live data blocks are borrowed for reading with a [`Live`] proof: the state lock (a
//! block reachable now cannot be freed while the lock is held) or a read pin (it cannot
//! be reused until the pin drops, see pins.rs).

use crate::layout::{BLOCK, BLOCK_U64};
use crate::pins::ReadPin;
use crate::volume::{State, Volume};

/// A block number (block 0 holds the first superblock copy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub(crate) struct BlockNo(pub u64);

/// A byte address in the volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub(crate) struct PmAddr(pub u64);

impl BlockNo {
    /// Address of byte `at` of this block.
    pub fn at(self, at: u64) -> PmAddr {
        debug_assert!(at <= BLOCK_U64);
        PmAddr(self.0 * BLOCK_U64 + at)
    }
}

impl PmAddr {
    pub fn off(self) -> usize {
        self.0 as usize
    }
}

/// A block only its holder knows (see the module docs).
#[derive(Debug)]
#[must_use = "a fresh block is published into a file or given back"]
pub(crate) struct FreshBlock(BlockNo);

impl FreshBlock {
    /// Only the allocator's reservations make these.
    pub(crate) fn from_allocator(b: u64) -> FreshBlock {
        FreshBlock(BlockNo(b))
    }
    pub fn no(&self) -> BlockNo {
        self.0
    }
    /// The block is linked into a file (or given back): its number goes public.
    pub fn publish(self) -> u64 {
        self.0 .0
    }
}

/// Proof that live data blocks stay as they are while borrowed.
pub(crate) trait Live {}
impl Live for State {}
impl Live for ReadPin<'_> {}

impl Volume {
    /// Store into a fresh block (not written back; see `fresh_flush`).
    pub(crate) fn fresh_write(&self, b: &FreshBlock, at: usize, data: &[u8]) {
        assert!(at + data.len() <= BLOCK, "store past the end of a block");
        // SAFETY: a fresh block is known to its holder alone (module docs).
        unsafe { self.region.write(b.no().at(at as u64).off(), data) }
    }

    /// Zero part of a fresh block (not written back).
    pub(crate) fn fresh_zero(&self, b: &FreshBlock, at: usize, len: usize) {
        assert!(at + len <= BLOCK, "store past the end of a block");
        // SAFETY: as in `fresh_write`.
        unsafe { self.region.zero(b.no().at(at as u64).off(), len) }
    }

    /// Copy `len` bytes at `at` of live block `src` into the same place of a fresh
    /// block, under the state lock that keeps `src` alive.
    pub(crate) fn fresh_copy_live(
        &self,
        st: &State,
        b: &FreshBlock,
        src: BlockNo,
        at: usize,
        len: usize,
    ) {
        let from = self.live(st, src, at, len);
        self.fresh_write(b, at, from);
    }

    /// Read back bytes of a fresh block its holder stored.
    pub(crate) fn fresh_read<'a>(&'a self, b: &'a FreshBlock, at: usize, len: usize) -> &'a [u8] {
        assert!(at + len <= BLOCK, "read past the end of a block");
        // SAFETY: as in `fresh_write`; the borrow is tied to the token.
        unsafe { self.region.slice(b.no().at(at as u64).off(), len) }
    }

    pub(crate) fn fresh_flush(&self, b: &FreshBlock, at: usize, len: usize) {
        self.region.flush(b.no().at(at as u64).off(), len);
    }

    /// Fill a run of fresh blocks (physically contiguous, starting at `first`) from a
    /// buffer, written back; non-temporal stores where the mapping is synchronous.
    pub(crate) fn fresh_fill(&self, first: &FreshBlock, at: usize, data: &[u8], persist: bool) {
        let off = first.no().at(at as u64).off();
        if persist {
            // SAFETY: the caller holds the whole run of fresh blocks (a reservation).
            unsafe { self.region.copy_persist(off, data) }
        } else {
            // SAFETY: as above.
            unsafe { self.region.write(off, data) }
        }
    }

    /// Mutable view of `len` bytes of a run of fresh blocks held by one reservation.
    ///
    /// # Safety
    /// The blocks from `first` over `at + len` bytes are fresh and held by the caller
    /// (a reservation owns its run until commit), and `&mut self` on the holder keeps
    /// the views unique.
    #[allow(clippy::mut_from_ref)] // the contract (fresh blocks held by the caller) makes it unique
    pub(crate) unsafe fn fresh_run_mut(&self, first: BlockNo, at: usize, len: usize) -> &mut [u8] {
        // SAFETY: the caller's contract above is the region's access contract.
        unsafe { self.region.slice_mut(first.at(at as u64).off(), len) }
    }

    /// Zero a whole free block (under the write lock: `&mut State`; not written back:
    /// what a crash leaves in a free block does not matter, only what the running
    /// volume knows, see zero.rs).
    pub(crate) fn free_zero(&self, st: &mut State, b: BlockNo) {
        assert!(
            st.balloc.is_free_block(b.0),
            "zeroing block {} that is not free",
            b.0
        );
        // SAFETY: a free block is known to no file, transaction, reservation or reader
        // (module docs), and the write lock we hold keeps the allocator from handing it
        // out while we store.
        unsafe { self.region.zero(b.at(0).off(), BLOCK) }
    }

    /// Store a metadata home or log range (under the write lock: `&mut State`).
    pub(crate) fn meta_write(&self, _locked: &mut State, addr: PmAddr, data: &[u8]) {
        // SAFETY: metadata homes and the log are written only with the write lock held
        // and never borrowed at run time (module docs).
        unsafe { self.region.write(addr.off(), data) }
    }

    pub(crate) fn meta_zero(&self, _locked: &mut State, addr: PmAddr, len: usize) {
        // SAFETY: as in `meta_write`.
        unsafe { self.region.zero(addr.off(), len) }
    }

    /// Read a metadata home (inode table, map node, directory block) under the state
    /// lock, which keeps `meta_write` out.
    pub(crate) fn meta_read<'a>(
        &'a self,
        _locked: &'a State,
        addr: PmAddr,
        len: usize,
    ) -> &'a [u8] {
        // SAFETY: metadata homes are written only under the write lock (module docs);
        // holding the state (read or write) excludes that.
        unsafe { self.region.slice(addr.off(), len) }
    }

    /// Borrow bytes of a live data block, kept alive by `proof`.
    pub(crate) fn live<'a>(
        &'a self,
        proof: &'a dyn Live,
        b: BlockNo,
        at: usize,
        len: usize,
    ) -> &'a [u8] {
        assert!(at + len <= BLOCK, "borrow past the end of a block");
        self.live_run(proof, b.at(at as u64), len)
    }

    /// Borrow `len` bytes of physically adjacent live blocks from `from`.
    pub(crate) fn live_run<'a>(
        &'a self,
        _proof: &'a dyn Live,
        from: PmAddr,
        len: usize,
    ) -> &'a [u8] {
        // SAFETY: live data blocks are never written in place, and the proof keeps each
        // block of the run from being freed and reused while borrowed.
        unsafe { self.region.slice(from.off(), len) }
    }
}
