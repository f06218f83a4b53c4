//! The FLAC/SLS calls: page attachment (`zcopy_to`), atomic multi-page commits
//! (`reserve_pages`, `pflush_add`, `pflush_commit`) and atomic page release (`pfree`).

use crate::commit::{Sink, Txn, ENTRY_OVERHEAD, INODE_RECORD};
use crate::config::Stats;
use crate::data::{check_file, max_file_size};
use crate::error::{FsError, Result};
use crate::layout::*;
use crate::map::FileMap;
use crate::pm::{BlockNo, FreshBlock};
use crate::trace::Traced;
use crate::volume::Volume;
use std::sync::atomic::Ordering;
use zcfs_types::Cred;

static ZERO_BLOCK: [u8; BLOCK] = [0; BLOCK];

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
    pub(crate) vol: &'v Volume,
    /// Fresh blocks; empty once placed by a pflush commit.
    pub(crate) blocks: Vec<FreshBlock>,
}

impl PageBuf<'_> {
    pub fn pages(&self) -> usize {
        self.blocks.len()
    }
    /// The `i`th page, to fill in place.
    pub fn page_mut(&mut self, i: usize) -> &mut [u8] {
        // SAFETY: the block is fresh and held by this buffer until committed; `&mut
        // self` keeps the view unique.
        unsafe { self.vol.fresh_run_mut(self.blocks[i].no(), 0, BLOCK) }
    }
}

impl Drop for PageBuf<'_> {
    fn drop(&mut self) {
        self.vol.give_back(std::mem::take(&mut self.blocks));
    }
}

/// One placement of a pflush transaction.
struct Placement<'v> {
    ino: u64,
    /// Block-aligned file offset of the first page.
    offset: u64,
    pages: PageBuf<'v>,
    /// Size the file grows to (inside the last page), or the end of the last page.
    new_size: Option<u64>,
}

/// A set of page placements committed as one log entry.
#[derive(Default)]
pub struct PflushTxn<'v> {
    items: Vec<Placement<'v>>,
    /// Who writes the pages (`written_by`): a writer without privilege clears
    /// set-user-ID (and set-group-ID where due) as a write does. None: the
    /// in-process caller (privileged).
    writer: Option<Cred>,
}

impl<'v> PflushTxn<'v> {
    /// The placements are a write by `cred` (the mode bits a write clears are cleared).
    pub fn written_by(mut self, cred: &Cred) -> Self {
        self.writer = Some(cred.clone());
        self
    }

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
        self.items.push(Placement {
            ino,
            offset,
            pages,
            new_size,
        });
        Ok(())
    }
}

impl Volume {
    /// FLAC `pfree`: release the pages of `[off, off+len)` atomically (a hole remains;
    /// partially covered edge pages are zeroed over the range by copy-on-write).
    pub fn pfree(&self, cred: &Cred, ino: u64, off: u64, len: u64) -> Result<()> {
        let end = off
            .checked_add(len)
            .filter(|e| *e <= max_file_size())
            .ok_or(FsError::TooBig)?;
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
                self.write(cred, ino, s, &ZERO_BLOCK[..(e - s) as usize])?;
            }
        }
        if first_full >= end_full {
            return Ok(());
        }
        let mut st = self.write_state()?;
        let st = &mut *st;
        check_file(st, ino)?;
        // The edges' writes took it if there were any; a punch alone takes it here.
        self.kill_capability(st, ino)?;
        let mut txn = Txn::new(OpType::PunchHole, ino);
        self.reserve_log(
            &mut txn,
            ENTRY_OVERHEAD + INODE_RECORD + FileMap::PUNCH_MAX_RECORDS * REC_HDR as u64,
        )?;
        let inode = st.inodes.get_mut(&ino).expect("checked");
        let mut sink = Sink {
            vol: self,
            txn: &mut txn,
        };
        inode.map.punch(first_full, end_full, &mut sink);
        inode.rec.mtime = Time::now();
        inode.rec.ctime = inode.rec.mtime;
        inode.rec.mode = crate::perm::mode_after_write(cred, &inode.rec);
        st.clamp_reserve(ino);
        txn.dirty.insert(ino);
        self.trace(|| Traced::Pages { ino });
        self.finish(st, txn)
    }

    /// FLAC: fresh pages for the caller to fill, later placed with `pflush_commit`.
    /// They come zeroed: a recycled block must not show a deleted file's bytes where
    /// the caller does not write. Blocks known to hold zeros (a hole of the image at
    /// open, or zeroed while free: `clean_free_blocks`) are taken first and not zeroed
    /// again; only the others are.
    pub fn reserve_pages(&self, n: usize) -> Result<PageBuf<'_>> {
        let (blocks, clean) = {
            let mut st = self.write_state()?;
            let mut txn = Txn::new(OpType::PflushCommit, 0);
            let clean = self.reserve_clean_blocks(&mut st, &mut txn, n as u64)?;
            (std::mem::take(&mut txn.pool), clean)
        };
        let mut zeroed = 0;
        for (b, clean) in blocks.iter().zip(clean) {
            if !clean {
                self.fresh_zero(b, 0, BLOCK);
                zeroed += 1;
            }
        }
        Stats::add(&self.stats.reserve_zeroed_blocks, zeroed);
        Stats::add(
            &self.stats.reserve_clean_blocks,
            blocks.len() as u64 - zeroed,
        );
        Ok(PageBuf { vol: self, blocks })
    }

    /// FLAC: commit every placement of `t` and the metadata they change as one log
    /// entry: after a crash, all of them are in the files or none is. A set larger than
    /// one log entry can hold is refused (`TransactionTooLarge`) before anything changes.
    pub fn pflush_commit(&self, mut t: PflushTxn<'_>) -> Result<()> {
        let mut st = self.write_state()?;
        let st = &mut *st;
        let mut txn = Txn::new(OpType::PflushCommit, t.items.first().map_or(0, |i| i.ino));
        // Check: files, log space, map nodes.
        let mut bound = ENTRY_OVERHEAD;
        let mut nodes = 0;
        let mut files = std::collections::BTreeSet::new();
        for p in &t.items {
            check_file(st, p.ino)?;
            let map = &st.inode(p.ino)?.map;
            let k = p.pages.blocks.len() as u64;
            let plan = map.plan_set(p.offset / BLOCK_U64, k);
            bound += plan.record_bytes(k);
            nodes += plan.new_nodes;
            files.insert(p.ino);
        }
        bound += INODE_RECORD * files.len() as u64;
        self.reserve_log(&mut txn, bound)?;
        // After the checks (the size bound too), under the lock the pages are placed
        // in, whoever places them.
        for &ino in &files {
            self.kill_capability(st, ino)?;
        }
        self.reserve_blocks(st, &mut txn, nodes)?;
        // Apply.
        let now = Time::now();
        for p in &mut t.items {
            let pages = std::mem::take(&mut p.pages.blocks);
            let count = pages.len() as u64;
            let end = p.offset + count * BLOCK_U64;
            let want = p.new_size.unwrap_or(end);
            let old_size = st.inodes[&p.ino].rec.size;
            let grows = want >= old_size;
            // Bytes past EOF are always zero on PM: zero the placed page that holds the
            // file's end afterwards, from the end on.
            let eof = want.max(old_size);
            if eof >= p.offset && eof < end && !eof.is_multiple_of(BLOCK_U64) {
                let page = &pages[((eof - p.offset) / BLOCK_U64) as usize];
                let tail = (eof % BLOCK_U64) as usize;
                self.fresh_zero(page, tail, BLOCK - tail);
            }
            for b in &pages {
                self.fresh_flush(b, 0, BLOCK);
            }
            let inode = st.inodes.get_mut(&p.ino).expect("checked");
            let mut sink = Sink {
                vol: self,
                txn: &mut txn,
            };
            let fb0 = p.offset / BLOCK_U64;
            for (fb, b) in (fb0..).zip(pages) {
                if let Some(old) = inode.map.set(fb, b.publish(), &mut sink) {
                    sink.txn.releases.push(old);
                }
            }
            if grows {
                inode.rec.size = want;
            }
            inode.rec.mtime = now;
            inode.rec.ctime = now;
            if let Some(w) = &t.writer {
                inode.rec.mode = crate::perm::mode_after_write(w, &inode.rec);
            }
            txn.data_size += count * BLOCK_U64;
            txn.dirty.insert(p.ino);
            let ino = p.ino;
            self.trace(|| Traced::Pages { ino });
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
                    let src = self.live_run(&*st, BlockNo(b0).at(0), len_run);
                    // SAFETY: `dst` has `len_run` private bytes we own.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, len_run) };
                    copied += len_run;
                }
            }
            pinned.extend(b0..b0 + n);
        }
        // Pinned only once every run is mapped: a failure above leaves no pin behind.
        for &b in &pinned {
            *st.pins.entry(b).or_insert(0) += 1;
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
