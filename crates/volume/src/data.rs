//! File data: zero-copy reads (borrowed PM slices, pinned rather than locked),
//! copy-on-write writes through reservations (reserve fresh blocks, let the caller fill
//! them, commit), truncate and fsync. The FLAC/SLS page calls are in `flac.rs`.

use crate::commit::{Sink, Txn, ENTRY_OVERHEAD, INODE_RECORD};
use crate::config::Stats;
use crate::error::{FsError, Result};
use crate::layout::*;
use crate::map::FileMap;
use crate::perm;
use crate::pm::{BlockNo, FreshBlock};
use crate::trace::Traced;
use crate::volume::{State, Volume};
use std::sync::Arc;
use zcfs_types::Cred;

static ZERO_BLOCK: [u8; BLOCK] = [0; BLOCK];

/// Largest single reservation (and the piece `write` hands to one): bigger writes are
/// split. Within a reservation, the commit is split again into pieces that each fit one
/// log entry; each piece is atomic (see `Volume::write_pieces`).
pub const MAX_RESERVATION: usize = 64 << 20;

/// Bytes a layer-2 receiver needs in front of an extent it lands frames in: the
/// kernel's untouched XDP headroom (256) and the frame header that survives, clobbered
/// (46). A copy of `zcfs_l2::MIN_FRONT` (this crate does not depend on the transport; a
/// test checks the two agree).
pub const LANDING_FRONT: u64 = 302;
/// Bytes in front of an extent that the landing frames overwrite (the header of the
/// extent's lowest segment): `zcfs_l2::HEADER_LEN`.
pub const LANDING_CLOBBER: u64 = 46;
/// Free blocks a landing reservation holds in front of each extent (its gap): one block
/// covers [`LANDING_FRONT`] bytes.
pub const LANDING_GAP_BLOCKS: u64 = 1;
/// Bytes of the gap in front of each extent.
pub const LANDING_GAP_BYTES: u64 = LANDING_GAP_BLOCKS * BLOCK_U64;
/// Bytes behind an extent that the kernel's receive chunk of its last slot reaches
/// (`zcfs_l2::MIN_TAIL`): a frame longer than the protocol allows, written there by a
/// NIC in zero-copy mode before anything could drop it, ends within them.
pub const LANDING_TAIL: u64 = 2326;
/// Bytes of the guard behind each extent (the next extent's gap, or a block of its
/// own), which the reservation holds too (review 28).
pub const LANDING_GUARD_BYTES: u64 = BLOCK_U64;
/// Most blocks in one landing extent: `zcfs_l2::MAX_EXTENT_BLOCKS`, the largest extent
/// a layer-2 transfer lands as a whole.
pub const LANDING_EXTENT_MAX_BLOCKS: u32 = 32;
const _: () = assert!(LANDING_GAP_BYTES >= LANDING_FRONT && LANDING_FRONT >= LANDING_CLOBBER);

/// One extent of a landing reservation ([`Volume::reserve_write_landing`]): `blocks`
/// contiguous fresh blocks at byte `offset` of the volume image, for file bytes
/// `[file_offset, file_offset + blocks * BLOCK)`. The [`LANDING_GAP_BYTES`] in front
/// of `offset` belong to the reservation too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LandingExtent {
    pub offset: u64,
    pub blocks: u32,
    pub file_offset: u64,
}

impl LandingExtent {
    pub fn bytes(&self) -> u64 {
        self.blocks as u64 * BLOCK_U64
    }
}

pub(crate) fn check_file(st: &State, ino: u64) -> Result<()> {
    let i = st.inode(ino)?;
    if i.rec.is_dir() {
        return Err(FsError::IsDir);
    }
    if !i.rec.is_reg() {
        return Err(FsError::Invalid("not a regular file".into()));
    }
    Ok(())
}

/// The volume a reservation belongs to: borrowed for a write that ends within the
/// caller's borrow, or shared for one that outlives it (a layer-2 landing waits for its
/// frames across the server's polls: [`Volume::reserve_write_landing_shared`]).
enum VolRef<'v> {
    Borrowed(&'v Volume),
    Shared(Arc<Volume>),
}

impl std::ops::Deref for VolRef<'_> {
    type Target = Volume;
    fn deref(&self) -> &Volume {
        match self {
            VolRef::Borrowed(v) => v,
            VolRef::Shared(v) => v,
        }
    }
}

/// Fresh blocks reserved for a write of `[off, off+len)` of one file.
pub struct WriteReservation<'v> {
    vol: VolRef<'v>,
    ino: u64,
    gen: u32,
    off: u64,
    len: usize,
    /// One fresh block per file block in the range, ascending; those still here at
    /// the end (not committed) go back to the allocator.
    blocks: Vec<FreshBlock>,
    /// Whether the caller's bytes were already written back (copy_persist path).
    written_back: bool,
    /// Who writes: decides whether the write drops the file's set-user-ID and
    /// set-group-ID bits (in the same entry).
    writer: perm::Writer,
    /// Blocks drawn from the file's copy-on-write reserve (falloc.rs) for the mapped
    /// blocks this write replaces; settled at commit or drop.
    drawn: u64,
    /// Landing reservations: the gap block in front of each extent (freed at commit
    /// and at drop, never in a file), and the extents.
    gaps: Vec<FreshBlock>,
    extents: Vec<LandingExtent>,
    done: bool,
}

impl WriteReservation<'_> {
    pub fn ino(&self) -> u64 {
        self.ino
    }
    pub fn offset(&self) -> u64 {
        self.off
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this is a landing reservation ([`Volume::reserve_write_landing`]).
    pub fn is_landing(&self) -> bool {
        !self.extents.is_empty()
    }

    /// A landing reservation's extents, in file order (empty for an ordinary one).
    pub fn landing_extents(&self) -> &[LandingExtent] {
        &self.extents
    }

    /// A landing reservation's bytes as a receiver may write them, one slice per extent:
    /// its gap block ([`LANDING_GAP_BYTES`]) and then its blocks, so the extent's data
    /// starts at `LANDING_GAP_BYTES` of the slice. For a receiver that lands frames
    /// through this mapping (tests, simulators); the server's AF_XDP UMEM writes the
    /// same bytes through its own mapping. The gap's bytes are never read.
    pub fn landing_mut(&mut self) -> Vec<&mut [u8]> {
        self.written_back = false;
        let exts = self.extents.clone();
        exts.iter()
            .map(|e| {
                let gap = BlockNo(e.offset / BLOCK_U64 - LANDING_GAP_BLOCKS);
                // SAFETY: the gap and the extent's blocks are fresh and held by this
                // reservation until commit or drop; `&mut self` keeps the views unique,
                // and extents (each behind its own gap) do not overlap.
                unsafe {
                    self.vol
                        .fresh_run_mut(gap, 0, (LANDING_GAP_BYTES + e.bytes()) as usize)
                }
            })
            .collect()
    }

    /// The destination in file order, as runs of physically adjacent blocks: (index in
    /// `blocks` of the run's first block, byte offset in it, length).
    fn runs(&self) -> Vec<(usize, usize, usize)> {
        let mut out: Vec<(usize, usize, usize)> = Vec::new();
        let first = self.off / BLOCK_U64;
        let mut pos = self.off;
        let end = self.off + self.len as u64;
        for (i, b) in self.blocks.iter().enumerate() {
            let bstart = (first + i as u64) * BLOCK_U64;
            let s = pos.max(bstart);
            let e = end.min(bstart + BLOCK_U64);
            let (at, n) = ((s - bstart) as usize, (e - s) as usize);
            match out.last_mut() {
                // The run's end is past its first block once it spans several: its
                // address is counted from that block's start, not through `at` (which
                // takes offsets within one block).
                Some((j, a, l))
                    if self.blocks[*j].no().at(0).off() + *a + *l == b.no().at(at as u64).off() =>
                {
                    *l += n
                }
                _ => out.push((i, at, n)),
            }
            pos = e;
        }
        out
    }

    /// Number of pieces the destination is in (physically adjacent blocks merged).
    pub fn pieces(&self) -> usize {
        self.runs().len()
    }

    /// Mutable slices over the destination bytes, for filling in place (e.g. straight
    /// from a socket). Stores through them are written back at commit.
    pub fn slices_mut(&mut self) -> Vec<&mut [u8]> {
        self.written_back = false;
        self.runs()
            .into_iter()
            .map(|(i, at, n)| {
                // SAFETY: the run's blocks are fresh and held by this reservation until
                // commit; `&mut self` keeps the views unique, and runs do not overlap.
                unsafe { self.vol.fresh_run_mut(self.blocks[i].no(), at, n) }
            })
            .collect()
    }

    /// Fill from a buffer (one copy, non-temporal where the mapping is synchronous).
    pub fn fill_from(&mut self, data: &[u8]) {
        assert_eq!(
            data.len(),
            self.len,
            "fill_from with a buffer of the wrong size"
        );
        let skip_flush = self.vol.cfg.fault == Some(crate::config::CommitFault::SkipDataFlush);
        let mut at = 0;
        for (i, o, n) in self.runs() {
            self.vol
                .fresh_fill(&self.blocks[i], o, &data[at..at + n], !skip_flush);
            at += n;
        }
        Stats::add(&self.vol.stats.user_copy_bytes, data.len() as u64);
        self.written_back = true;
    }

    /// Put the bytes into the file. All or nothing, unless the write is larger than one
    /// log entry can hold: then it commits in pieces, each atomic, in file order.
    pub fn commit(mut self) -> Result<usize> {
        self.done = true;
        let shared;
        let vol: &Volume = match &self.vol {
            VolRef::Borrowed(v) => v,
            VolRef::Shared(v) => {
                shared = v.clone();
                &shared
            }
        };
        let r = vol.commit_write(&mut self);
        let mut back = std::mem::take(&mut self.blocks);
        back.append(&mut self.gaps);
        vol.give_back(back);
        if self.drawn > 0 && r.is_err() {
            // commit_write settles the draw on success (under its lock hold).
            let mut st = vol.state.write().unwrap();
            st.end_draw(self.ino, self.gen, self.drawn, 0);
        }
        r
    }
}

impl Drop for WriteReservation<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut back = std::mem::take(&mut self.blocks);
            back.append(&mut self.gaps);
            self.vol.give_back(back);
            if self.drawn > 0 {
                let mut st = self.vol.state.write().unwrap();
                st.end_draw(self.ino, self.gen, self.drawn, 0);
            }
        }
    }
}

/// Where read bytes are: a run of adjacent live blocks (first block, offset, length),
/// or a hole within one block (offset, length).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Run {
    Data(BlockNo, usize, usize),
    Hole(usize, usize),
}

/// One atomic piece of a write: `count` file blocks from `start` (an index into the
/// reservation), and the bound on its log entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece {
    pub start: u64,
    pub count: u64,
    pub bound: u64,
}

impl Volume {
    /// Read `[off, off+len)` as borrowed PM slices (holes read as a shared zero page).
    /// `f` runs **without** the volume lock (it may send the slices to a slow socket):
    /// the blocks are pinned instead, so no write, truncate or checkpoint reuses them
    /// until `f` returns (see pins.rs).
    pub fn read_with<R>(
        &self,
        ino: u64,
        off: u64,
        len: usize,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Result<R> {
        let (runs, pin) = {
            let st = self.read_state();
            check_file(&st, ino)?;
            let runs = self.data_runs(&st, ino, off, len)?;
            let pin = self.readers.pin(runs.iter().filter_map(|r| match *r {
                Run::Data(b, at, n) => Some((b.0, b.0 + (at + n).div_ceil(BLOCK) as u64)),
                Run::Hole(..) => None,
            }));
            (runs, pin)
        };
        let slices: Vec<&[u8]> = runs
            .iter()
            .map(|r| match *r {
                Run::Data(b, at, n) => self.live_run(&pin, b.at(at as u64), n),
                Run::Hole(at, n) => &ZERO_BLOCK[at..at + n],
            })
            .collect();
        let total: usize = slices.iter().map(|s| s.len()).sum();
        Stats::add(&self.stats.data_bytes_read, total as u64);
        Stats::add(&self.stats.zero_copy_bytes, total as u64);
        let r = f(&slices);
        drop(slices);
        drop(pin);
        Ok(r)
    }

    /// Where the bytes of `[off, off+len)` of a file are: runs of physically adjacent
    /// data blocks, and holes (one per block).
    pub(crate) fn data_runs(&self, st: &State, ino: u64, off: u64, len: usize) -> Result<Vec<Run>> {
        let i = st.inode(ino)?;
        let end = (off.saturating_add(len as u64)).min(i.rec.size);
        let mut runs: Vec<Run> = Vec::new();
        if off >= end {
            return Ok(runs);
        }
        let fb0 = off / BLOCK_U64;
        let n = (end - 1) / BLOCK_U64 + 1 - fb0;
        i.map.for_range(fb0, n, |fb, b| {
            let bstart = fb * BLOCK_U64;
            let s = off.max(bstart);
            let e = end.min(bstart + BLOCK_U64);
            let (a, l) = ((s - bstart) as usize, (e - s) as usize);
            match (b, runs.last_mut()) {
                // A run's end lies past its first block once it spans several.
                (Some(b), Some(Run::Data(b0, a0, l0)))
                    if b0.at(0).off() + *a0 + *l0 == BlockNo(b).at(a as u64).off() =>
                {
                    *l0 += l
                }
                (Some(b), _) => runs.push(Run::Data(BlockNo(b), a, l)),
                (None, _) => runs.push(Run::Hole(a, l)),
            }
        });
        Ok(runs)
    }

    /// Read into a buffer (one copy). Returns bytes read (short at end of file).
    pub fn read(&self, ino: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        let n = self.read_with(ino, off, buf.len(), |slices| {
            let mut at = 0;
            for s in slices {
                buf[at..at + s.len()].copy_from_slice(s);
                at += s.len();
            }
            at
        })?;
        // Copied after all: counted as a copy, not as handed out.
        Stats::sub(&self.stats.zero_copy_bytes, n as u64);
        Stats::add(&self.stats.user_copy_bytes, n as u64);
        Ok(n)
    }

    /// Write a buffer at `off` (copy-on-write; one copy into PM). Any size the volume
    /// has room for: it goes in reservations of at most `MAX_RESERVATION` bytes, each
    /// committed in atomic pieces. If a later reservation fails, the bytes written so far
    /// are reported (a short write, as POSIX allows); if the first fails, its error.
    ///
    /// Permission to write was checked when the caller opened the file; a write by an
    /// unprivileged `cred` drops the file's set-user-ID and set-group-ID bits.
    pub fn write(&self, cred: &Cred, ino: u64, off: u64, data: &[u8]) -> Result<usize> {
        let mut done = 0;
        while done < data.len() {
            let pos = off + done as u64;
            let len = self.write_chunk(ino, pos, data.len() - done);
            let chunk = &data[done..done + len];
            let r = self.reserve_write(cred, ino, pos, len).and_then(|mut r| {
                r.fill_from(chunk);
                r.commit()
            });
            match r {
                Ok(n) => done += n,
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// How much of a write at `pos` with `left` bytes to go one reservation takes: at
    /// most MAX_RESERVATION, and no more than the free space allows. Copy-on-write
    /// needs room for the new blocks before the old ones are freed, so an overwrite
    /// larger than the free space goes in pieces, each freeing the old blocks the next
    /// one reuses. Pieces end on block boundaries.
    /// A preallocated file's overwrites may also use its reserve (falloc.rs).
    fn write_chunk(&self, ino: u64, pos: u64, left: usize) -> usize {
        let drawable = {
            let st = self.read_state();
            st.inodes.get(&ino).map_or(0, |i| {
                i.rec.cow_reserve - st.drawing.get(&(ino, i.rec.gen)).copied().unwrap_or(0)
            })
        };
        let free = (self.statfs().bfree + drawable).saturating_sub(WRITE_MARGIN_BLOCKS);
        let room = (free.max(1) * BLOCK_U64 - pos % BLOCK_U64) as usize;
        let len = left.min(MAX_RESERVATION).min(room);
        if len == left {
            return len;
        }
        let end = (pos + len as u64) / BLOCK_U64 * BLOCK_U64;
        if end > pos {
            (end - pos) as usize
        } else {
            len
        }
    }

    /// Reserve fresh blocks for a write of `len` bytes at `off`. The bytes of partially
    /// covered edge blocks are copied in at commit, from the blocks current then.
    pub fn reserve_write(
        &self,
        cred: &Cred,
        ino: u64,
        off: u64,
        len: usize,
    ) -> Result<WriteReservation<'_>> {
        self.reserve_write_of(cred, ino, off, len, false)
    }

    /// Reserve fresh blocks for a write of `len` bytes at `off` that a layer-2 receiver
    /// lands in place (docs/format.md, "Landing reservations"): the blocks come as
    /// extents of 1..=[`LANDING_EXTENT_MAX_BLOCKS`] contiguous blocks
    /// ([`WriteReservation::landing_extents`]), each right behind a free block of its
    /// own, the gap, which the reservation holds too: the [`LANDING_FRONT`] bytes in
    /// front of an extent, where the frames clobber [`LANDING_CLOBBER`] bytes, hold no
    /// file's data and no metadata. Commit is `reserve_write`'s (the edge bytes outside
    /// the write come from the file at commit, whatever landed there); the gaps go back
    /// to the allocator at commit or drop and are never part of a file.
    ///
    /// Fails with `NoSpace`, having changed nothing, when the free space does not hold
    /// the blocks and their gaps (too little, or too fragmented: a free block with no
    /// free block in front takes no extent); a caller can then fall back to an ordinary
    /// reservation (and receive the bytes another way).
    ///
    /// The caller must not commit or drop the reservation while the kernel may still
    /// write into its extents (receive entries posted for them): after that the blocks
    /// are a file's, or another reservation's.
    pub fn reserve_write_landing(
        &self,
        cred: &Cred,
        ino: u64,
        off: u64,
        len: usize,
    ) -> Result<WriteReservation<'_>> {
        self.reserve_write_of(cred, ino, off, len, true)
    }

    /// [`Volume::reserve_write_landing`] for a receiver that holds the reservation
    /// beyond its borrow of the volume (the server's layer-2 lane keeps it while the
    /// frames arrive, across many polls): the reservation holds the volume itself.
    pub fn reserve_write_landing_shared(
        self: &Arc<Self>,
        cred: &Cred,
        ino: u64,
        off: u64,
        len: usize,
    ) -> Result<WriteReservation<'static>> {
        let mut r = self.reserve_write_of(cred, ino, off, len, true)?;
        let shared = WriteReservation {
            vol: VolRef::Shared(self.clone()),
            ino: r.ino,
            gen: r.gen,
            off: r.off,
            len: r.len,
            blocks: std::mem::take(&mut r.blocks),
            written_back: r.written_back,
            writer: r.writer,
            drawn: std::mem::take(&mut r.drawn),
            gaps: std::mem::take(&mut r.gaps),
            extents: std::mem::take(&mut r.extents),
            done: false,
        };
        // Everything moved: the borrowed one gives nothing back when dropped.
        r.done = true;
        Ok(shared)
    }

    fn reserve_write_of(
        &self,
        cred: &Cred,
        ino: u64,
        off: u64,
        len: usize,
        landing: bool,
    ) -> Result<WriteReservation<'_>> {
        if len > MAX_RESERVATION {
            return Err(FsError::Invalid(format!(
                "one reservation is at most {MAX_RESERVATION} bytes"
            )));
        }
        off.checked_add(len as u64)
            .filter(|e| *e <= max_file_size())
            .ok_or(FsError::TooBig)?;
        let mut st = self.write_state()?;
        check_file(&st, ino)?;
        let rec = &st.inode(ino)?.rec;
        let (gen, writer) = (rec.gen, perm::Writer::of(cred, rec.gid));
        let mut drawn = 0;
        let (mut gaps, mut extents) = (Vec::new(), Vec::new());
        let blocks = if len == 0 {
            Vec::new()
        } else if landing {
            let n = (off + len as u64 - 1) / BLOCK_U64 - off / BLOCK_U64 + 1;
            if st.inode(ino)?.rec.cow_reserve > 0 {
                let mut mapped = 0;
                st.inode(ino)?
                    .map
                    .for_range(off / BLOCK_U64, n, |_, b| mapped += b.is_some() as u64);
                drawn = st.draw_reserve(ino, gen, mapped);
            }
            match self.reserve_landing(&mut st, n) {
                Ok(plan) => {
                    let mut blocks = Vec::with_capacity(n as usize);
                    let mut fo = off / BLOCK_U64 * BLOCK_U64;
                    for (gap, first, k) in plan {
                        // A gap, or a guard behind the last extent of a run (no blocks).
                        gaps.push(FreshBlock::from_allocator(gap));
                        if k == 0 {
                            continue;
                        }
                        blocks.extend((first..first + k).map(FreshBlock::from_allocator));
                        extents.push(LandingExtent {
                            offset: first * BLOCK_U64,
                            blocks: k as u32,
                            file_offset: fo,
                        });
                        fo += k * BLOCK_U64;
                    }
                    blocks
                }
                Err(e) => {
                    st.end_draw(ino, gen, drawn, 0);
                    return Err(e);
                }
            }
        } else {
            let n = (off + len as u64 - 1) / BLOCK_U64 - off / BLOCK_U64 + 1;
            // Overwrites of a preallocated file draw from its reserve (falloc.rs).
            if st.inode(ino)?.rec.cow_reserve > 0 {
                let mut mapped = 0;
                st.inode(ino)?
                    .map
                    .for_range(off / BLOCK_U64, n, |_, b| mapped += b.is_some() as u64);
                drawn = st.draw_reserve(ino, gen, mapped);
            }
            let mut txn = Txn::new(OpType::Write, ino);
            if let Err(e) = self.reserve_blocks(&mut st, &mut txn, n) {
                st.end_draw(ino, gen, drawn, 0);
                return Err(e);
            }
            let mut b = std::mem::take(&mut txn.pool);
            b.sort_unstable_by_key(FreshBlock::no); // ascending: adjacent blocks merge
            b
        };
        Ok(WriteReservation {
            vol: VolRef::Borrowed(self),
            ino,
            gen,
            off,
            len,
            blocks,
            written_back: len == 0,
            writer,
            drawn,
            gaps,
            extents,
            done: false,
        })
    }

    /// Take `n` blocks for a landing reservation, with their gaps: `(gap, first,
    /// blocks)` per extent, in file order. Checks everything before it takes a block;
    /// a failure changes nothing (a checkpoint may have released deferred frees).
    fn reserve_landing(&self, st: &mut State, n: u64) -> Result<Vec<(u64, u64, u64)>> {
        self.fault_point(|| FsError::NoSpace)?;
        let max = LANDING_EXTENT_MAX_BLOCKS as u64;
        let plan = match st.balloc.plan_landing(n, max) {
            Some(p) => p,
            None => {
                // Blocks freed by committed operations may fill the holes.
                self.commit_batch(st)?;
                self.checkpoint(st)?;
                st.balloc.plan_landing(n, max).ok_or(FsError::NoSpace)?
            }
        };
        // The blocks promised to preallocated files and the metadata reserve stay
        // untouched; this only checkpoints (the plan stays free) or fails.
        self.ensure_blocks(st, n + plan.len() as u64)?;
        st.balloc.take_planned(&plan);
        Ok(plan)
    }

    /// Copy the bytes of edge block `i` of a reservation outside the write range from
    /// the file's current block (or zeros), under the state lock.
    fn fill_edge(&self, st: &State, r: &WriteReservation<'_>, i: usize, src: Option<u64>) {
        let fb = r.off / BLOCK_U64 + i as u64;
        let bstart = fb * BLOCK_U64;
        let ws = r.off.max(bstart) - bstart;
        let we = (r.off + r.len as u64).min(bstart + BLOCK_U64) - bstart;
        let dst = &r.blocks[i];
        for (s, e) in [(0, ws), (we, BLOCK_U64)] {
            if s >= e {
                continue;
            }
            let (s, n) = (s as usize, (e - s) as usize);
            match src {
                Some(b) => self.fresh_copy_live(st, dst, BlockNo(b), s, n),
                None => self.fresh_zero(dst, s, n),
            }
            self.fresh_flush(dst, s, n);
        }
    }

    pub(crate) fn give_back(&self, blocks: Vec<FreshBlock>) {
        if blocks.is_empty() {
            return;
        }
        let mut st = self.state.write().unwrap();
        for b in blocks {
            st.balloc.free(b.publish());
        }
    }

    /// Split setting file blocks `first..first+n` into pieces whose log entries each
    /// fit the log, with a bound for each. Leaves are never split (one leaf's record is
    /// at most 4 KiB, and the smallest ring holds two such entries).
    pub(crate) fn write_pieces(&self, map: &FileMap, first: u64, n: u64) -> Result<Vec<Piece>> {
        let max = self.max_entry();
        let fixed = ENTRY_OVERHEAD + INODE_RECORD;
        let mut pieces: Vec<Piece> = Vec::new();
        let mut cur = Piece {
            start: 0,
            count: 0,
            bound: fixed,
        };
        let mut fb = first;
        let end = first + n;
        while fb < end {
            let leaf_end = ((fb >> crate::layout::NODE_SHIFT) + 1) << crate::layout::NODE_SHIFT;
            let k = leaf_end.min(end) - fb;
            let cost = map.plan_set(fb, k).record_bytes(k);
            if cur.count > 0 && cur.bound + cost > max {
                pieces.push(cur);
                cur = Piece {
                    start: fb - first,
                    count: 0,
                    bound: fixed,
                };
            }
            if cur.bound + cost > max {
                return Err(FsError::TransactionTooLarge {
                    bytes: cur.bound + cost,
                    max,
                });
            }
            cur.count += k;
            cur.bound += cost;
            fb += k;
        }
        pieces.push(cur);
        Ok(pieces)
    }

    fn commit_write(&self, r: &mut WriteReservation<'_>) -> Result<usize> {
        if r.len == 0 {
            return Ok(0);
        }
        let mut guard = self.write_state()?;
        let st = &mut *guard;
        match st.inodes.get(&r.ino) {
            Some(i) if i.rec.gen == r.gen && i.rec.is_reg() => {}
            _ => return Err(FsError::Stale),
        }
        // Check: the pieces, and the map nodes the whole write needs.
        let first = r.off / BLOCK_U64;
        let n = r.blocks.len() as u64;
        let map = &st.inodes[&r.ino].map;
        let pieces = self.write_pieces(map, first, n)?;
        let nodes = map.plan_set(first, n).new_nodes;
        let mut reserved = Txn::new(OpType::Write, r.ino);
        for p in &pieces {
            self.reserve_log(&mut reserved, p.bound)?;
        }
        // After the checks, under the lock the write commits in: a capability set while
        // the bytes were arriving goes too (as the inode lock orders setcap and write on
        // Linux). Its rewrite gives back what it takes, so the blocks below still fit.
        self.kill_capability(st, r.ino)?;
        self.reserve_blocks(st, &mut reserved, nodes)?;
        // Apply. The bytes of partial edge blocks come from the blocks current now,
        // under the lock, so a write that committed since the reservation was made is
        // kept (whatever block numbers the allocator handed out meanwhile).
        let end = r.off + r.len as u64;
        let head_partial =
            !r.off.is_multiple_of(BLOCK_U64) || (n == 1 && !end.is_multiple_of(BLOCK_U64));
        let tail_partial = !end.is_multiple_of(BLOCK_U64);
        let map = &st.inodes[&r.ino].map;
        let (head_src, tail_src) = (map.get(first), map.get(first + n - 1));
        if head_partial {
            self.fill_edge(st, r, 0, head_src);
        }
        if tail_partial && n > 1 {
            self.fill_edge(st, r, n as usize - 1, tail_src);
        }
        let skip_flush = self.cfg.fault == Some(crate::config::CommitFault::SkipDataFlush);
        if !r.written_back && !skip_flush {
            for (i, at, len) in r.runs() {
                self.fresh_flush(&r.blocks[i], at, len);
            }
        }
        let mut pool = std::mem::take(&mut reserved.pool);
        let mut blocks = std::mem::take(&mut r.blocks).into_iter();
        for p in pieces {
            let mut txn = Txn::new(OpType::Write, r.ino);
            txn.pool = std::mem::take(&mut pool);
            txn.log_bound = p.bound;
            let piece_start = (r.off).max((first + p.start) * BLOCK_U64);
            let piece_end = end.min((first + p.start + p.count) * BLOCK_U64);
            txn.data_size = piece_end - piece_start;
            let piece: Vec<FreshBlock> = blocks.by_ref().take(p.count as usize).collect();
            txn.data_addr = piece[0].no().at(0).0;
            let word = first_word(self, &piece[0], piece_start, r.len);
            let inode = st.inodes.get_mut(&r.ino).expect("checked above");
            let mut sink = Sink {
                vol: self,
                txn: &mut txn,
            };
            let mut replaced = 0;
            for (i, b) in (p.start..).zip(piece) {
                if let Some(old) = inode.map.set(first + i, b.publish(), &mut sink) {
                    sink.txn.releases.push(old);
                    replaced += 1;
                }
            }
            if piece_end > inode.rec.size {
                inode.rec.size = piece_end;
            }
            let now = Time::now();
            inode.rec.mtime = now;
            inode.rec.ctime = now;
            inode.rec.mode = r.writer.mode_after_write(inode.rec.mode, inode.rec.gid);
            st.spend_draw(r.ino, r.gen, &mut r.drawn, replaced);
            txn.dirty.insert(r.ino);
            pool = std::mem::take(&mut txn.pool);
            self.trace(|| Traced::Write {
                ino: r.ino,
                offset: piece_start,
                len: piece_end - piece_start,
                first_word: word,
            });
            if let Err(e) = self.finish(st, txn) {
                r.blocks = blocks.collect();
                for b in pool {
                    st.balloc.free(b.publish());
                }
                return Err(e);
            }
        }
        for b in pool {
            st.balloc.free(b.publish());
        }
        // What was drawn and not spent is promised again.
        st.end_draw(r.ino, r.gen, r.drawn, 0);
        r.drawn = 0;
        Stats::add(&self.stats.data_bytes_written, r.len as u64);
        Ok(r.len)
    }

    /// Set a file's size, through a handle `cred` opened for writing (the permission was
    /// checked at open; see `setattr` for a truncate by name). Shrinking frees whole
    /// blocks past the end and copies the new last block with its tail zeroed (bytes
    /// past EOF are always zero on PM). An unprivileged caller's truncate drops the
    /// set-user-ID and set-group-ID bits.
    pub fn truncate(&self, cred: &Cred, ino: u64, size: u64) -> Result<()> {
        let mut st = self.write_state()?;
        let st = &mut *st;
        truncate_blocks(st, ino, size)?; // checked before the capability goes
        self.kill_capability(st, ino)?;
        let mut txn = Txn::new(OpType::Truncate, ino);
        self.reserve_log(&mut txn, ENTRY_OVERHEAD + INODE_RECORD + TRUNCATE_RECORDS)?;
        self.plan_truncate(st, &mut txn, ino, size)?;
        self.apply_truncate(st, &mut txn, ino, size);
        let rec = &mut st.inode_mut(ino).expect("planned").rec;
        rec.mode = perm::mode_after_write(cred, rec);
        txn.dirty.insert(ino);
        self.trace(|| Traced::Truncate { ino, size });
        self.finish(st, txn)
    }

    /// Check a truncate and reserve what it needs (the new last block, if partial):
    /// its last step reserves blocks, so the caller checks log space before.
    pub(crate) fn plan_truncate(
        &self,
        st: &mut State,
        txn: &mut Txn,
        ino: u64,
        size: u64,
    ) -> Result<()> {
        let need = truncate_blocks(st, ino, size)?;
        self.reserve_blocks(st, txn, need)
    }

    /// Apply a planned truncate (cannot fail).
    pub(crate) fn apply_truncate(&self, st: &mut State, txn: &mut Txn, ino: u64, size: u64) {
        let shrink = size < st.inodes[&ino].rec.size;
        let keep = size.div_ceil(BLOCK_U64);
        // The new last block, when partial: its head copied, its tail zero (bytes past
        // EOF are always zero on PM).
        let new_last = match st.inodes[&ino].map.get(keep.wrapping_sub(1)) {
            Some(old) if shrink && !size.is_multiple_of(BLOCK_U64) => {
                let partial = (size % BLOCK_U64) as usize;
                let nb = txn.take_block();
                self.fresh_copy_live(st, &nb, BlockNo(old), 0, partial);
                self.fresh_zero(&nb, partial, BLOCK - partial);
                self.fresh_flush(&nb, 0, BLOCK);
                Some(nb)
            }
            _ => None,
        };
        let inode = st.inodes.get_mut(&ino).expect("planned");
        if shrink {
            let mut sink = Sink { vol: self, txn };
            inode.map.truncate_blocks(keep, &mut sink);
            if let Some(nb) = new_last {
                if let Some(o) = inode.map.set(keep - 1, nb.publish(), &mut sink) {
                    sink.txn.releases.push(o);
                }
            }
        }
        inode.rec.size = size;
        let now = Time::now();
        inode.rec.mtime = now;
        inode.rec.ctime = now;
        st.clamp_reserve(ino);
    }

    /// fsync / fdatasync: everything written so far is durable on return.
    pub fn fsync(&self, ino: u64) -> Result<()> {
        self.read_state().inode(ino)?;
        self.sync()
    }
}

/// The first (up to) 8 bytes a write puts at file offset `at`, in its fresh block `b`
/// (for the trace).
fn first_word(vol: &Volume, b: &FreshBlock, at: u64, len: usize) -> u64 {
    let o = (at % BLOCK_U64) as usize;
    let n = 8.min(BLOCK - o).min(len);
    let mut w = [0u8; 8];
    w[..n].copy_from_slice(vol.fresh_read(b, o, n));
    u64::from_le_bytes(w)
}

/// Blocks a write leaves free for the map nodes its pieces need.
const WRITE_MARGIN_BLOCKS: u64 = 16;

/// Redo bytes of a truncate besides the inode: the punch, and the new last block.
pub(crate) const TRUNCATE_RECORDS: u64 =
    FileMap::PUNCH_MAX_RECORDS * REC_HDR as u64 + REC_HDR as u64 + 8;

/// Check a truncate of `ino` to `size` and count the fresh blocks it takes (a new
/// partial last block), without reserving them: a caller that needs blocks for more
/// than the truncate reserves them all at once, after every check.
pub(crate) fn truncate_blocks(st: &State, ino: u64, size: u64) -> Result<u64> {
    if size > max_file_size() {
        return Err(FsError::TooBig);
    }
    check_file(st, ino)?;
    let i = st.inode(ino)?;
    let partial = !size.is_multiple_of(BLOCK_U64);
    Ok((size < i.rec.size && partial && i.map.get(size / BLOCK_U64).is_some()) as u64)
}

/// Largest file size: the map reaches 512^6 blocks, but offsets stay within i64.
pub fn max_file_size() -> u64 {
    i64::MAX as u64
}

#[cfg(test)]
mod landing_tests {
    use super::*;
    use crate::config::{MkfsOptions, VolumeConfig};
    use std::sync::Arc;
    use zcfs_pmem::Region;

    fn volume(size: usize) -> Arc<Volume> {
        let mut region = Region::anonymous(size);
        let opts = MkfsOptions {
            inodes: Some(64),
            log_bytes: Some(32 << 10),
            ..Default::default()
        };
        Volume::mkfs_region(&mut region, &opts).unwrap();
        Volume::open_region(region, VolumeConfig::synchronous()).unwrap()
    }

    fn file(vol: &Volume) -> u64 {
        vol.create(&Cred::ROOT, crate::layout::ROOT_INO, b"f", 0o644, 0)
            .unwrap()
            .ino
    }

    fn is_free(vol: &Volume, b: u64) -> bool {
        let mut a = vol.read_state().balloc.clone();
        // A block is free if marking it used succeeds.
        a.mark_used(b)
    }

    #[test]
    fn the_gap_covers_the_landing_front_at_the_bound() {
        // The kernel's headroom (256) and the surviving header (46).
        assert_eq!(LANDING_FRONT, 256 + LANDING_CLOBBER);
        assert_eq!(LANDING_CLOBBER, 46);
        const { assert!(LANDING_GAP_BYTES >= LANDING_FRONT) };
        // One block fewer would leave no front at all: the gap is the smallest whole
        // number of blocks that covers it.
        const { assert!((LANDING_GAP_BLOCKS - 1) * BLOCK_U64 < LANDING_FRONT) };
        // The guard behind an extent covers what the kernel's receive chunk of its last
        // slot reaches past it.
        const { assert!(LANDING_GUARD_BYTES >= LANDING_TAIL) };
    }

    #[test]
    fn every_extent_sits_behind_a_gap_the_reservation_holds() {
        let vol = volume(4 << 20);
        let f = file(&vol);
        let free0 = vol.read_state().balloc.free_count();
        let data_start = vol.geo.data_start;
        // 100 blocks, unaligned at both ends: 101 file blocks.
        let (off, len) = (1000u64, 100 * BLOCK);
        let r = vol.reserve_write_landing(&Cred::ROOT, f, off, len).unwrap();
        assert!(r.is_landing());
        let ext = r.landing_extents().to_vec();
        let blocks: u64 = ext.iter().map(|e| e.blocks as u64).sum();
        assert_eq!(blocks, 101);
        // A gap in front of every extent, and a guard behind the last of each run.
        assert!(r.gaps.len() > ext.len(), "{} gaps", r.gaps.len());
        let held: std::collections::HashSet<u64> = r.gaps.iter().map(|g| g.no().0).collect();
        assert_eq!(ext[0].file_offset, 0);
        let mut fo = 0;
        for e in &ext {
            assert!((1..=LANDING_EXTENT_MAX_BLOCKS).contains(&e.blocks));
            assert_eq!(e.offset % BLOCK_U64, 0);
            assert_eq!(e.file_offset, fo);
            fo += e.bytes();
            // The gap is the block right in front, the guard the block right behind,
            // both held (not free), in the data area.
            let first = e.offset / BLOCK_U64;
            let (gap, guard) = (first - LANDING_GAP_BLOCKS, first + e.blocks as u64);
            assert!(held.contains(&gap) && held.contains(&guard), "{e:?}");
            assert!(gap >= data_start);
            assert!(first > data_start);
            assert!(!is_free(&vol, gap) && !is_free(&vol, guard));
        }
        assert_eq!(
            vol.read_state().balloc.free_count(),
            free0 - 101 - r.gaps.len() as u64
        );
        // Abort: everything goes back.
        drop(r);
        assert_eq!(vol.read_state().balloc.free_count(), free0);
        for e in &ext {
            assert!(is_free(&vol, e.offset / BLOCK_U64 - 1));
        }
    }

    #[test]
    fn commit_frees_the_gaps_and_keeps_the_blocks() {
        let vol = volume(4 << 20);
        let f = file(&vol);
        let len = 40 * BLOCK;
        let mut r = vol.reserve_write_landing(&Cred::ROOT, f, 0, len).unwrap();
        let ext = r.landing_extents().to_vec();
        assert_eq!(ext.len(), 2, "{ext:?}");
        for (i, s) in r.landing_mut().into_iter().enumerate() {
            let gap = LANDING_GAP_BYTES as usize;
            // Clobber the whole front, as a receiver may, and fill the blocks.
            s[..gap].fill(0xEE);
            s[gap..].fill(i as u8 + 1);
        }
        assert_eq!(r.commit().unwrap(), len);
        for e in &ext {
            assert!(is_free(&vol, e.offset / BLOCK_U64 - 1), "gap not freed");
            assert!(!is_free(&vol, e.offset / BLOCK_U64), "data block freed");
        }
        let mut buf = vec![0u8; len];
        assert_eq!(vol.read(f, 0, &mut buf).unwrap(), len);
        let first = ext[0].blocks as usize * BLOCK;
        assert!(buf[..first].iter().all(|&b| b == 1));
        assert!(buf[first..].iter().all(|&b| b == 2));
        let report = crate::fsck::check_volume(&vol);
        assert!(report.is_clean(), "{:?}", report.problems);
    }

    #[test]
    fn the_first_data_block_is_a_gap_at_most() {
        let vol = volume(4 << 20);
        // A file no directory names: no directory block takes the first data block.
        let f = vol
            .tmpfile_held(&Cred::ROOT, crate::layout::ROOT_INO, 0o644, false)
            .unwrap()
            .ino;
        let ds = vol.geo.data_start;
        let total = vol.geo.total_blocks;
        // Take every free block; give back the first data block (if it was free) and
        // isolated blocks at the end for the metadata reserve: nothing can land.
        let taken = {
            let mut st = vol.state.write().unwrap();
            let n = st.balloc.free_count() as usize;
            st.balloc.alloc(n).unwrap()
        };
        assert!(taken.contains(&ds) && taken.contains(&(ds + 1)));
        let singles: Vec<u64> = (0..2 * vol.metadata_reserve() + 4)
            .map(|i| total - 1 - 2 * i)
            .collect();
        {
            let mut st = vol.state.write().unwrap();
            st.balloc.free(ds);
            for &b in &singles {
                st.balloc.free(b);
            }
        }
        let before = vol.read_state().balloc.clone();
        let r = vol.reserve_write_landing(&Cred::ROOT, f, 0, 10);
        assert!(matches!(r, Err(FsError::NoSpace)), "{:?}", r.err());
        assert_eq!(vol.read_state().balloc.free_count(), before.free_count());
        // An ordinary reservation still fits.
        drop(vol.reserve_write(&Cred::ROOT, f, 0, 10).unwrap());
        // With the second data block free too, still none: no guard behind it.
        vol.state.write().unwrap().balloc.free(ds + 1);
        let r = vol.reserve_write_landing(&Cred::ROOT, f, 0, 10);
        assert!(matches!(r, Err(FsError::NoSpace)), "{:?}", r.err());
        // With the third free too, the first one is its gap and the third its guard.
        vol.state.write().unwrap().balloc.free(ds + 2);
        let r = vol.reserve_write_landing(&Cred::ROOT, f, 0, 10).unwrap();
        assert_eq!(
            r.landing_extents(),
            &[LandingExtent {
                offset: (ds + 1) * BLOCK_U64,
                blocks: 1,
                file_offset: 0
            }]
        );
        assert_eq!(r.gaps[0].no().0, ds);
        assert_eq!(r.gaps[1].no().0, ds + 2);
        drop(r);
        let mut st = vol.state.write().unwrap();
        for b in taken {
            if b != ds && b != ds + 1 && b != ds + 2 && !singles.contains(&b) {
                st.balloc.free(b);
            }
        }
    }

    /// Free blocks, one by one (the allocator's state as far as a landing can see).
    fn free_map(vol: &Volume) -> Vec<bool> {
        let st = vol.read_state();
        (vol.geo.data_start..vol.geo.total_blocks)
            .map(|b| st.balloc.is_free_block(b))
            .collect()
    }

    #[test]
    fn a_fragmented_volume_refuses_a_landing_and_changes_nothing() {
        let vol = volume(4 << 20);
        let f = file(&vol);
        // A file of 8 contiguous blocks, deleted later.
        let g = vol
            .create(&Cred::ROOT, crate::layout::ROOT_INO, b"g", 0o644, 0)
            .unwrap()
            .ino;
        vol.write(&Cred::ROOT, g, 0, &[7; 8 * BLOCK]).unwrap();
        let g_blocks = vol.test_door().file_blocks(g).unwrap();
        assert!(
            g_blocks.windows(2).all(|w| w[1] == w[0] + 1),
            "{g_blocks:?}"
        );
        // Every other free block taken: plenty of free space, no two adjacent blocks.
        let taken = {
            let mut st = vol.state.write().unwrap();
            let n = st.balloc.free_count() as usize;
            let all = st.balloc.alloc(n).unwrap();
            for b in all.iter().step_by(2) {
                st.balloc.free(*b);
            }
            all
        };
        let (free, map) = (vol.statfs().bfree, free_map(&vol));
        assert!(free > 100, "{free}");
        for len in [1, BLOCK, 10 * BLOCK] {
            let r = vol.reserve_write_landing(&Cred::ROOT, f, 0, len);
            assert!(matches!(r, Err(FsError::NoSpace)), "{len}: {:?}", r.err());
            assert_eq!(vol.statfs().bfree, free);
            assert_eq!(
                free_map(&vol),
                map,
                "a refused landing changed the allocator"
            );
        }
        // An ordinary reservation fits.
        drop(vol.reserve_write(&Cred::ROOT, f, 0, 10 * BLOCK).unwrap());
        assert_eq!(free_map(&vol), map);
        // Blocks freed by a committed unlink wait for a checkpoint; a landing that
        // finds no room takes it, and lands in them.
        vol.unlink(&Cred::ROOT, crate::layout::ROOT_INO, b"g")
            .unwrap();
        assert!(
            !vol.test_door().block_is_free(g_blocks[0]),
            "freed before a checkpoint"
        );
        let r = vol
            .reserve_write_landing(&Cred::ROOT, f, 0, 4 * BLOCK)
            .unwrap();
        let e = r.landing_extents()[0];
        assert_eq!(r.landing_extents().len(), 1);
        let b = e.offset / BLOCK_U64;
        assert!(
            g_blocks.contains(&(b - 1)) && g_blocks.contains(&(b + 3)),
            "{e:?}"
        );
        drop(r);
        let mut st = vol.state.write().unwrap();
        for b in taken.iter().skip(1).step_by(2) {
            st.balloc.free(*b);
        }
    }
}
