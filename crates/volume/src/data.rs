//! File data: zero-copy reads (borrowed PM slices), copy-on-write writes through
//! reservations (reserve fresh blocks, let the caller fill them, commit), truncate,
//! and the FLAC/SLS calls: page attachment (`zcopy_to`), atomic multi-page commits
//! (`pflush_add` / `pflush_commit`) and atomic page release (`pfree`).

use crate::error::{FsError, Result};
use crate::layout::*;
use crate::volume::{Sink, State, Txn, Volume};
use std::sync::atomic::Ordering;

static ZERO_BLOCK: [u8; BLOCK] = [0; BLOCK];

/// Largest single write committed as one log entry (bigger writes are split; each
/// piece is atomic).
pub const MAX_ATOMIC_WRITE: usize = 64 << 20;

fn check_file(st: &State, ino: u64) -> Result<()> {
    let i = st.inode(ino)?;
    if i.rec.is_dir() {
        return Err(FsError::IsDir);
    }
    if !i.rec.is_reg() {
        return Err(FsError::Invalid("not a regular file".into()));
    }
    Ok(())
}

/// Fresh blocks reserved for a write of `[off, off+len)` of one file.
pub struct WriteReservation<'v> {
    vol: &'v Volume,
    ino: u64,
    gen: u32,
    off: u64,
    len: usize,
    /// One fresh block per file block in the range.
    blocks: Vec<u64>,
    /// For the first and last block when partially written: the block whose bytes
    /// outside the range were copied in (None = zeros).
    edges: Vec<(usize, Option<u64>)>,
    /// Whether the caller's bytes were already written back (copy_persist path).
    written_back: bool,
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

    /// (region offset, length) of each piece of the destination, in file order;
    /// physically adjacent blocks are merged.
    pub fn pieces(&self) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = Vec::new();
        let first = self.off / BLOCK_U64;
        let mut pos = self.off;
        let end = self.off + self.len as u64;
        for (i, &b) in self.blocks.iter().enumerate() {
            let fb = first + i as u64;
            let bstart = fb * BLOCK_U64;
            let s = pos.max(bstart);
            let e = end.min(bstart + BLOCK_U64);
            let roff = (b * BLOCK_U64 + (s - bstart)) as usize;
            let n = (e - s) as usize;
            match out.last_mut() {
                Some(last) if last.0 + last.1 == roff => last.1 += n,
                _ => out.push((roff, n)),
            }
            pos = e;
        }
        out
    }

    /// Mutable slices over the destination bytes, for filling in place (e.g. straight
    /// from a socket). Stores through them are written back at commit.
    pub fn slices_mut(&mut self) -> Vec<&mut [u8]> {
        self.written_back = false;
        self.pieces()
            .into_iter()
            // SAFETY: the blocks are fresh, owned by this reservation alone until commit.
            .map(|(o, n)| unsafe { self.vol.region.slice_mut(o, n) })
            .collect()
    }

    /// Fill from a buffer (one copy, non-temporal where the mapping is synchronous).
    pub fn fill_from(&mut self, data: &[u8]) {
        assert_eq!(
            data.len(),
            self.len,
            "fill_from with a buffer of the wrong size"
        );
        let skip_flush = self.vol.cfg.fault == Some(crate::volume::CommitFault::SkipDataFlush);
        let mut at = 0;
        for (o, n) in self.pieces() {
            if skip_flush {
                self.vol.region.write(o, &data[at..at + n]);
            } else {
                self.vol.region.copy_persist(o, &data[at..at + n]);
            }
            at += n;
        }
        self.vol
            .stats
            .user_copy_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        self.written_back = true;
    }

    pub fn commit(mut self) -> Result<usize> {
        self.done = true;
        let vol = self.vol;
        let r = vol.commit_write(&self);
        if r.is_err() {
            vol.give_back(&self.blocks);
        }
        r
    }
}

impl Drop for WriteReservation<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.vol.give_back(&self.blocks);
        }
    }
}

/// Pages attached to the caller's address space copy-on-write (see `zcopy_to`).
pub struct AttachedPages<'v> {
    vol: &'v Volume,
    ptr: *mut u8,
    len: usize,
    pinned: Vec<u64>,
}

impl AttachedPages<'_> {
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is our private mapping, alive until drop.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    /// Writable: the first store to a page gives the caller a private copy; the file
    /// is never changed through this mapping.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AttachedPages<'_> {
    fn drop(&mut self) {
        // SAFETY: unmapping the range we mapped; no borrow outlives `self`.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
        let mut st = self.vol.state.write().unwrap();
        for b in &self.pinned {
            if let Some(c) = st.pins.get_mut(b) {
                *c -= 1;
                if *c == 0 {
                    st.pins.remove(b);
                }
            }
        }
    }
}

/// Caller-filled pages waiting to be placed into files atomically (`pflush_*`).
pub struct PageBuf<'v> {
    vol: &'v Volume,
    blocks: Vec<u64>,
    placed: bool,
}

impl PageBuf<'_> {
    pub fn pages(&self) -> usize {
        self.blocks.len()
    }
    /// The `i`th page, to fill in place.
    pub fn page_mut(&mut self, i: usize) -> &mut [u8] {
        let off = (self.blocks[i] * BLOCK_U64) as usize;
        // SAFETY: the block is fresh and owned by this buffer until committed.
        unsafe { self.vol.region.slice_mut(off, BLOCK) }
    }
}

impl Drop for PageBuf<'_> {
    fn drop(&mut self) {
        if !self.placed {
            self.vol.give_back(&self.blocks);
        }
    }
}

/// A set of page placements committed as one log entry.
#[derive(Default)]
pub struct PflushTxn<'v> {
    items: Vec<(u64, u64, PageBuf<'v>, Option<u64>)>,
}

impl<'v> PflushTxn<'v> {
    /// Place `pages` at block-aligned `offset` of `ino`. The file grows to `new_size`
    /// (which must end inside the last page) or, without it, to the end of the last page;
    /// it never shrinks.
    pub fn pflush_add(
        &mut self,
        ino: u64,
        offset: u64,
        pages: PageBuf<'v>,
        new_size: Option<u64>,
    ) -> Result<()> {
        if !offset.is_multiple_of(BLOCK_U64) || pages.blocks.is_empty() {
            return Err(FsError::Invalid(
                "pflush_add needs a 4 KiB aligned offset and at least one page".into(),
            ));
        }
        let end = offset
            .checked_add(pages.blocks.len() as u64 * BLOCK_U64)
            .filter(|e| *e <= max_file_size())
            .ok_or(FsError::TooBig)?;
        if let Some(ns) = new_size {
            if ns <= end - BLOCK_U64 || ns > end {
                return Err(FsError::Invalid(
                    "pflush_add new_size must end inside the last page".into(),
                ));
            }
        }
        self.items.push((ino, offset, pages, new_size));
        Ok(())
    }
}

impl Volume {
    /// Read `[off, off+len)` as borrowed PM slices (holes read as a shared zero page);
    /// `f` runs under the read lock, so the blocks cannot be freed meanwhile.
    pub fn read_with<R>(
        &self,
        ino: u64,
        off: u64,
        len: usize,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Result<R> {
        let st = self.read_state();
        check_file(&st, ino)?;
        let i = st.inode(ino)?;
        let end = (off.saturating_add(len as u64)).min(i.rec.size);
        let mut slices: Vec<&[u8]> = Vec::new();
        if off < end {
            let fb0 = off / BLOCK_U64;
            let n = (end - 1) / BLOCK_U64 + 1 - fb0;
            let mut last_end: Option<usize> = None;
            i.map.for_range(fb0, n, |fb, b| {
                let bstart = fb * BLOCK_U64;
                let s = off.max(bstart);
                let e = end.min(bstart + BLOCK_U64);
                let (a, l) = ((s - bstart) as usize, (e - s) as usize);
                match b {
                    Some(b) => {
                        let roff = (b * BLOCK_U64) as usize + a;
                        if last_end == Some(roff) {
                            let prev = slices.pop().unwrap();
                            // SAFETY: two adjacent ranges of live data blocks; see below.
                            slices.push(unsafe {
                                self.region.slice(roff - prev.len(), prev.len() + l)
                            });
                        } else {
                            // SAFETY: data blocks reachable from a map are never written
                            // in place (copy-on-write) and cannot be freed and reused
                            // while the read lock is held.
                            slices.push(unsafe { self.region.slice(roff, l) });
                        }
                        last_end = Some(roff + l);
                    }
                    None => {
                        slices.push(&ZERO_BLOCK[a..a + l]);
                        last_end = None;
                    }
                }
            });
        }
        let total: usize = slices.iter().map(|s| s.len()).sum();
        self.stats
            .data_bytes_read
            .fetch_add(total as u64, Ordering::Relaxed);
        self.stats
            .zero_copy_bytes
            .fetch_add(total as u64, Ordering::Relaxed);
        Ok(f(&slices))
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
        self.stats
            .zero_copy_bytes
            .fetch_sub(n as u64, Ordering::Relaxed);
        self.stats
            .user_copy_bytes
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Write a buffer at `off` (copy-on-write; one copy into PM).
    pub fn write(&self, ino: u64, off: u64, data: &[u8]) -> Result<usize> {
        let mut done = 0;
        for chunk in data.chunks(MAX_ATOMIC_WRITE) {
            let mut r = self.reserve_write(ino, off + done as u64, chunk.len())?;
            r.fill_from(chunk);
            done += r.commit()?;
        }
        Ok(done)
    }

    /// Reserve fresh blocks for a write of `len` bytes at `off`. Bytes of partially
    /// covered edge blocks are copied in from the current blocks.
    pub fn reserve_write(&self, ino: u64, off: u64, len: usize) -> Result<WriteReservation<'_>> {
        if len > MAX_ATOMIC_WRITE {
            return Err(FsError::Invalid(format!(
                "one reservation is at most {MAX_ATOMIC_WRITE} bytes"
            )));
        }
        off.checked_add(len as u64)
            .filter(|e| *e <= max_file_size())
            .ok_or(FsError::TooBig)?;
        let mut st = self.write_state()?;
        check_file(&st, ino)?;
        let gen = st.inode(ino)?.rec.gen;
        if len == 0 {
            return Ok(WriteReservation {
                vol: self,
                ino,
                gen,
                off,
                len,
                blocks: vec![],
                edges: vec![],
                written_back: true,
                done: false,
            });
        }
        let first = off / BLOCK_U64;
        let last = (off + len as u64 - 1) / BLOCK_U64;
        let n = (last - first + 1) as usize;
        // Data blocks plus the worst case of new map nodes.
        self.ensure_blocks(&mut st, n as u64 + (n as u64 / 256) + 16)?;
        let blocks = st.balloc.alloc(n)?;
        let mut edges = Vec::new();
        let end = off + len as u64;
        let head_partial =
            !off.is_multiple_of(BLOCK_U64) || (n == 1 && !end.is_multiple_of(BLOCK_U64));
        let tail_partial = !end.is_multiple_of(BLOCK_U64);
        let map = &st.inode(ino)?.map;
        if head_partial {
            edges.push((0, map.get(first)));
        }
        if tail_partial && (n > 1 || !head_partial) {
            edges.push((n - 1, map.get(last)));
        }
        let r = WriteReservation {
            vol: self,
            ino,
            gen,
            off,
            len,
            blocks,
            edges,
            written_back: false,
            done: false,
        };
        for &(i, src) in &r.edges {
            self.fill_edge(&r, i, src);
        }
        Ok(r)
    }

    /// Copy the bytes of edge block `i` outside the write range from `src` (or zeros).
    fn fill_edge(&self, r: &WriteReservation<'_>, i: usize, src: Option<u64>) {
        let fb = r.off / BLOCK_U64 + i as u64;
        let bstart = fb * BLOCK_U64;
        let ws = r.off.max(bstart) - bstart;
        let we = (r.off + r.len as u64).min(bstart + BLOCK_U64) - bstart;
        let dst = (r.blocks[i] * BLOCK_U64) as usize;
        for (s, e) in [(0, ws), (we, BLOCK_U64)] {
            if s >= e {
                continue;
            }
            let (s, e) = (s as usize, e as usize);
            match src {
                Some(b) => {
                    // SAFETY: `b` is a live data block (never written in place) read
                    // under the state lock; `dst` is our fresh block.
                    let from = unsafe { self.region.slice((b * BLOCK_U64) as usize + s, e - s) };
                    self.region.write(dst + s, from);
                }
                None => self.region.zero(dst + s, e - s),
            }
            self.region.flush(dst + s, e - s);
        }
    }

    fn give_back(&self, blocks: &[u64]) {
        if blocks.is_empty() {
            return;
        }
        let mut st = self.state.write().unwrap();
        for &b in blocks {
            st.balloc.free(b);
        }
    }

    fn commit_write(&self, r: &WriteReservation<'_>) -> Result<usize> {
        if r.len == 0 {
            return Ok(0);
        }
        let mut st = self.write_state()?;
        let st = &mut *st;
        match st.inodes.get(&r.ino) {
            Some(i) if i.rec.gen == r.gen => {}
            _ => return Err(FsError::Stale),
        }
        // A concurrent write may have replaced an edge block since we copied from it:
        // copy its bytes again so both writes survive.
        let first = r.off / BLOCK_U64;
        for &(i, src) in &r.edges {
            let now = st.inodes[&r.ino].map.get(first + i as u64);
            if now != src {
                self.fill_edge(r, i, now);
            }
        }
        if !r.written_back {
            for (o, n) in r.pieces() {
                self.region.flush(o, n);
            }
        }
        self.ensure_blocks(st, (r.blocks.len() as u64 / 256) + 8)?;
        let mut txn = Txn::new(OpType::Write, r.ino);
        txn.data_addr = r.blocks[0] * BLOCK_U64;
        txn.data_size = r.len as u64;
        let inode = st.inodes.get_mut(&r.ino).unwrap();
        let mut sink = Sink {
            region: &self.region,
            balloc: &mut st.balloc,
            txn: &mut txn,
        };
        for (i, &b) in r.blocks.iter().enumerate() {
            if let Some(old) = inode.map.set(first + i as u64, b, &mut sink)? {
                sink.txn.releases.push(old);
            }
        }
        let end = r.off + r.len as u64;
        if end > inode.rec.size {
            inode.rec.size = end;
        }
        let now = Timespec::now();
        inode.rec.mtime = now;
        inode.rec.ctime = now;
        txn.dirty.insert(r.ino);
        self.finish(st, txn)?;
        self.stats
            .data_bytes_written
            .fetch_add(r.len as u64, Ordering::Relaxed);
        Ok(r.len)
    }

    /// Set a file's size. Shrinking frees whole blocks past the end and copies the new
    /// last block with its tail zeroed (bytes past EOF are always zero on PM).
    pub fn truncate(&self, ino: u64, size: u64) -> Result<()> {
        if size > max_file_size() {
            return Err(FsError::TooBig);
        }
        let mut st = self.write_state()?;
        let st = &mut *st;
        check_file(st, ino)?;
        self.ensure_blocks(st, 8)?;
        let mut txn = Txn::new(OpType::Truncate, ino);
        let inode = st.inodes.get_mut(&ino).unwrap();
        if size < inode.rec.size {
            let keep = size.div_ceil(BLOCK_U64);
            let mut sink = Sink {
                region: &self.region,
                balloc: &mut st.balloc,
                txn: &mut txn,
            };
            inode.map.truncate_blocks(keep, &mut sink);
            let partial = (size % BLOCK_U64) as usize;
            if partial != 0 {
                if let Some(old) = inode.map.get(keep - 1) {
                    let nb = sink.balloc.alloc_one()?;
                    let dst = (nb * BLOCK_U64) as usize;
                    // SAFETY: `old` is a live data block, read under the write lock.
                    let head = unsafe { self.region.slice((old * BLOCK_U64) as usize, partial) };
                    self.region.write(dst, head);
                    self.region.zero(dst + partial, BLOCK - partial);
                    self.region.flush(dst, BLOCK);
                    if let Some(o) = inode.map.set(keep - 1, nb, &mut sink)? {
                        sink.txn.releases.push(o);
                    }
                }
            }
        }
        inode.rec.size = size;
        let now = Timespec::now();
        inode.rec.mtime = now;
        inode.rec.ctime = now;
        txn.dirty.insert(ino);
        self.finish(st, txn)
    }

    /// fsync / fdatasync: everything written so far is durable on return.
    pub fn fsync(&self, ino: u64) -> Result<()> {
        self.read_state().inode(ino)?;
        self.sync()
    }

    /// FLAC `pfree`: release the pages of `[off, off+len)` atomically (a hole remains;
    /// partially covered edge pages are zeroed over the range by copy-on-write).
    pub fn pfree(&self, ino: u64, off: u64, len: u64) -> Result<()> {
        let end = off.saturating_add(len);
        let first_full = off.div_ceil(BLOCK_U64);
        let end_full = end / BLOCK_U64;
        // Zero partial edges through the normal write path first, then punch whole
        // blocks; both edges and the punch are separate atomic steps only when the
        // range is unaligned.
        let size = {
            let st = self.read_state();
            check_file(&st, ino)?;
            st.inode(ino)?.rec.size
        };
        let mut edges = vec![(off, (first_full * BLOCK_U64).min(end))];
        if first_full <= end_full {
            edges.push(((end_full * BLOCK_U64).max(off), end));
        }
        for (s, e) in edges {
            let e = e.min(size);
            if s < e && (s % BLOCK_U64 != 0 || e % BLOCK_U64 != 0) {
                self.write(ino, s, &ZERO_BLOCK[..(e - s) as usize])?;
            }
        }
        if first_full >= end_full {
            return Ok(());
        }
        let mut st = self.write_state()?;
        let st = &mut *st;
        check_file(st, ino)?;
        self.ensure_blocks(st, 4)?;
        let mut txn = Txn::new(OpType::PunchHole, ino);
        let inode = st.inodes.get_mut(&ino).unwrap();
        let mut sink = Sink {
            region: &self.region,
            balloc: &mut st.balloc,
            txn: &mut txn,
        };
        inode.map.punch(first_full, end_full, &mut sink);
        inode.rec.mtime = Timespec::now();
        inode.rec.ctime = inode.rec.mtime;
        txn.dirty.insert(ino);
        self.finish(st, txn)
    }

    /// FLAC: fresh pages for the caller to fill, later placed with `pflush_commit`.
    pub fn reserve_pages(&self, n: usize) -> Result<PageBuf<'_>> {
        let mut st = self.write_state()?;
        self.ensure_blocks(&mut st, n as u64 + 16)?;
        let blocks = st.balloc.alloc(n)?;
        Ok(PageBuf {
            vol: self,
            blocks,
            placed: false,
        })
    }

    /// FLAC: commit every placement of `txn` and the metadata they change as one log
    /// entry: after a crash, all of them are in the files or none is.
    pub fn pflush_commit(&self, mut t: PflushTxn<'_>) -> Result<()> {
        let mut st = self.write_state()?;
        let st = &mut *st;
        for (ino, _, _, _) in &t.items {
            check_file(st, *ino)?;
        }
        let total: u64 = t.items.iter().map(|i| i.2.blocks.len() as u64).sum();
        self.ensure_blocks(st, total / 256 + 8 * t.items.len() as u64)?;
        let mut txn = Txn::new(OpType::PflushCommit, t.items.first().map_or(0, |i| i.0));
        let now = Timespec::now();
        for (ino, offset, pages, new_size) in &mut t.items {
            for &b in &pages.blocks {
                self.region.flush((b * BLOCK_U64) as usize, BLOCK);
            }
            let inode = st.inodes.get_mut(ino).unwrap();
            let mut sink = Sink {
                region: &self.region,
                balloc: &mut st.balloc,
                txn: &mut txn,
            };
            let fb0 = *offset / BLOCK_U64;
            for (i, &b) in pages.blocks.iter().enumerate() {
                if let Some(old) = inode.map.set(fb0 + i as u64, b, &mut sink)? {
                    sink.txn.releases.push(old);
                }
            }
            let end = *offset + pages.blocks.len() as u64 * BLOCK_U64;
            let want = new_size.unwrap_or(end);
            if want >= inode.rec.size {
                inode.rec.size = want;
                // Bytes past EOF are always zero on PM.
                let tail = (want % BLOCK_U64) as usize;
                if tail != 0 {
                    let last = (pages.blocks[pages.blocks.len() - 1] * BLOCK_U64) as usize;
                    self.region.zero(last + tail, BLOCK - tail);
                    self.region.flush(last + tail, BLOCK - tail);
                }
            }
            inode.rec.mtime = now;
            inode.rec.ctime = now;
            txn.data_size += pages.blocks.len() as u64 * BLOCK_U64;
            txn.dirty.insert(*ino);
            pages.placed = true;
        }
        self.finish(st, txn)
    }

    /// FLAC `zcopy_to`: attach the file's pages for `[off, off+len)` (block aligned) to
    /// the caller's address space copy-on-write, without copying. The blocks stay
    /// reserved while attached. Volumes without a shared file (anonymous regions)
    /// fall back to a copy.
    pub fn zcopy_to(&self, ino: u64, off: u64, len: usize) -> Result<AttachedPages<'_>> {
        if !off.is_multiple_of(BLOCK_U64) || !len.is_multiple_of(BLOCK) || len == 0 {
            return Err(FsError::Invalid(
                "zcopy_to needs a 4 KiB aligned offset and length".into(),
            ));
        }
        let mut st = self.state.write().unwrap();
        check_file(&st, ino)?;
        // Reserve address space, then map each block over it (holes stay zero pages).
        let base = mmap_anon(len)?;
        let mut pinned = Vec::new();
        let fd = self.region.shared_fd();
        let fb0 = off / BLOCK_U64;
        let size = st.inode(ino)?.rec.size;
        let mut blocks = Vec::new();
        st.inode(ino)?
            .map
            .for_range(fb0, (len / BLOCK) as u64, |fb, b| blocks.push((fb, b)));
        let mut copied = 0;
        // Runs of file blocks that are also contiguous in the volume: one mmap each,
        // populated at once (no fault per page later).
        let mut runs: Vec<(u64, u64, u64)> = Vec::new(); // (first file block, first block, count)
        for (fb, b) in blocks {
            let Some(b) = b else { continue };
            if fb * BLOCK_U64 >= size {
                continue;
            }
            match runs.last_mut() {
                Some((f0, b0, n)) if *f0 + *n == fb && *b0 + *n == b => *n += 1,
                _ => runs.push((fb, b, 1)),
            }
        }
        for &(f0, b0, n) in &runs {
            let len_run = n as usize * BLOCK;
            // SAFETY: `base` maps `len` bytes; the run lies within it.
            let dst = unsafe { base.add(((f0 - fb0) as usize) * BLOCK) };
            match fd {
                Some(fd) => {
                    // SAFETY: MAP_FIXED over part of our own reservation; the file range
                    // holds live data blocks of the volume.
                    let p = unsafe {
                        libc::mmap(
                            dst as *mut libc::c_void,
                            len_run,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_POPULATE,
                            fd,
                            (b0 * BLOCK_U64) as libc::off_t,
                        )
                    };
                    if p == libc::MAP_FAILED {
                        let e = std::io::Error::last_os_error();
                        // SAFETY: unmapping our own reservation.
                        unsafe { libc::munmap(base as *mut libc::c_void, len) };
                        return Err(e.into());
                    }
                }
                None => {
                    // SAFETY: live data blocks under the lock; `dst` is our private range.
                    let src = unsafe { self.region.slice((b0 * BLOCK_U64) as usize, len_run) };
                    // SAFETY: `dst` has `len_run` private bytes we own.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, len_run) };
                    copied += len_run;
                }
            }
            for b in b0..b0 + n {
                *st.pins.entry(b).or_insert(0) += 1;
                pinned.push(b);
            }
        }
        // Bytes past EOF in the last page must read as zero: they are on PM already
        // (invariant), so nothing to do.
        if copied > 0 {
            self.stats
                .user_copy_bytes
                .fetch_add(copied as u64, Ordering::Relaxed);
        } else {
            self.stats
                .zero_copy_bytes
                .fetch_add(len as u64, Ordering::Relaxed);
        }
        Ok(AttachedPages {
            vol: self,
            ptr: base,
            len,
            pinned,
        })
    }
}

fn mmap_anon(len: usize) -> Result<*mut u8> {
    // SAFETY: a fresh anonymous private mapping chosen by the kernel.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(p as *mut u8)
}

/// Largest file size: the map reaches 512^6 blocks, but offsets stay within i64.
pub fn max_file_size() -> u64 {
    i64::MAX as u64
}
