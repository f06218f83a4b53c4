//! fallocate(2) and lseek's SEEK_DATA/SEEK_HOLE.
//!
//! Preallocation keeps fallocate's promise on a copy-on-write volume: the holes of the
//! range get zeroed blocks at once, and as many blocks again are *held back* for the
//! first copy-on-write overwrite of each: a write replaces a block with a fresh one
//! before the old one is freed, so without that a write into a preallocated range
//! could still run out of space.
//!
//! The reserve is a per-inode counter, `cow_reserve` in the inode record (format
//! version 3), committed in the same log entries that change the map, so a crash keeps
//! it consistent with the blocks. `State::reserved` is the volume's sum of the
//! counters less what write reservations have drawn and not committed yet; the
//! allocator hands out only blocks beyond it (`ensure_blocks`), and statfs counts it as
//! used. A write of a file that replaces mapped blocks draws up to that many blocks
//! from the file's reserve; at commit, the blocks it actually replaced are taken off
//! the counter, and what it drew and did not use goes back. A file's counter never
//! exceeds its data blocks (truncate and hole punching lower it), and freeing the
//! inode releases it. At mount the sum is recomputed from the records.
//!
//! The counter does not say which blocks were preallocated: any overwrite of the file
//! draws from it. The promise kept is therefore "after fallocate of n blocks, the next
//! n block overwrites of the file do not fail for space" (an overwrite of other blocks
//! of the file frees their old blocks, which other files may then take).

use crate::commit::{Sink, Txn};
use crate::data::check_file;
use crate::error::{FsError, Result};
use crate::layout::*;
use crate::perm;
use crate::pm::{BlockNo, FreshBlock};
use crate::trace::Traced;
use crate::volume::{State, Volume};
use zcfs_types::Cred;

/// What fallocate does to its range (PUNCH_HOLE is `Volume::pfree`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallocMode {
    /// Mode 0 (`keep_size` false) or FALLOC_FL_KEEP_SIZE: allocate zeroed blocks for
    /// the holes of the range and reserve their copy-on-write overwrite.
    Allocate { keep_size: bool },
    /// FALLOC_FL_ZERO_RANGE (optionally with KEEP_SIZE): the range reads as zeros and
    /// is allocated as with `Allocate`.
    ZeroRange { keep_size: bool },
}

impl FallocMode {
    /// From Linux's mode bits; EOPNOTSUPP for what is not supported here (PUNCH_HOLE
    /// goes to `pfree`, COLLAPSE_RANGE, INSERT_RANGE, UNSHARE_RANGE are not offered).
    pub fn from_bits(mode: i32) -> Result<FallocMode> {
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        match mode {
            0 => Ok(FallocMode::Allocate { keep_size: false }),
            KEEP => Ok(FallocMode::Allocate { keep_size: true }),
            ZERO => Ok(FallocMode::ZeroRange { keep_size: false }),
            m if m == ZERO | KEEP => Ok(FallocMode::ZeroRange { keep_size: true }),
            m => Err(FsError::Unsupported(format!("fallocate mode {m:#x}"))),
        }
    }
}

/// lseek's two questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seek {
    Data,
    Hole,
}

impl State {
    /// Lower `ino`'s reserve to its data blocks (it never needs more); `reserved`
    /// follows. Draws of writes in flight beyond the new reserve are forfeited: those
    /// writes already hold their blocks, and when they end only what is still counted
    /// in `drawing` is promised again (`end_draw`), so the reserve the truncate or punch
    /// commits is the one the file keeps.
    pub(crate) fn clamp_reserve(&mut self, ino: u64) {
        let Some(i) = self.inodes.get(&ino) else {
            return;
        };
        let key = (ino, i.rec.gen);
        let reserve = i.rec.cow_reserve;
        let target = reserve.min(i.map.data_blocks());
        if target == reserve {
            return;
        }
        let drawn = self.drawing.get(&key).copied().unwrap_or(0);
        let kept_draw = drawn.min(target);
        // `reserved` holds the undrawn part: from reserve - drawn to target - kept_draw.
        self.reserved = self.reserved - (reserve - drawn) + (target - kept_draw);
        self.inodes.get_mut(&ino).expect("checked").rec.cow_reserve = target;
        if kept_draw == 0 {
            self.drawing.remove(&key);
        } else {
            self.drawing.insert(key, kept_draw);
        }
    }

    /// `ino` is being freed: its undrawn reserve is no longer promised. What writes
    /// in flight drew is forgotten with it (their blocks go back to the allocator).
    pub(crate) fn drop_reserve(&mut self, ino: u64) {
        let Some(i) = self.inodes.get(&ino) else {
            return;
        };
        let key = (ino, i.rec.gen);
        let drawn = self.drawing.remove(&key).unwrap_or(0);
        self.reserved -= i.rec.cow_reserve - drawn;
    }

    /// Draw up to `want` blocks of `ino`'s reserve for a write reservation.
    pub(crate) fn draw_reserve(&mut self, ino: u64, gen: u32, want: u64) -> u64 {
        let Some(i) = self.inodes.get(&ino) else {
            return 0;
        };
        let d = self.drawing.entry((ino, gen)).or_insert(0);
        let a = want.min(i.rec.cow_reserve - *d);
        *d += a;
        self.reserved -= a;
        a
    }

    /// A write reservation that drew `drawn` ends; `used` of them were spent
    /// (committed overwrites), the rest is promised again. Only what `drawing` still
    /// counts (a truncate or punch may have forfeited some, `clamp_reserve`) goes back.
    pub(crate) fn end_draw(&mut self, ino: u64, gen: u32, drawn: u64, used: u64) {
        if drawn == 0 {
            return;
        }
        let key = (ino, gen);
        let Some(d) = self.drawing.get_mut(&key) else {
            return; // freed meanwhile (drop_reserve), or all forfeited (clamp_reserve)
        };
        let live = drawn.min(*d);
        *d -= live;
        if *d == 0 {
            self.drawing.remove(&key);
        }
        let i = self.inodes.get_mut(&ino).expect("a drawing inode exists");
        let used = used.min(live);
        i.rec.cow_reserve -= used;
        self.reserved += live - used;
        debug_assert!(
            self.drawing.get(&key).copied().unwrap_or(0) <= i.rec.cow_reserve,
            "a file's draws never exceed its reserve"
        );
    }

    /// A piece of a write that drew from `ino`'s reserve replaced `replaced` mapped
    /// blocks: that many (at most `*drawn`) leave the reserve for good, in the piece's
    /// own inode record. The caller's transaction writes the record.
    pub(crate) fn spend_draw(&mut self, ino: u64, gen: u32, drawn: &mut u64, replaced: u64) {
        let k = replaced.min(*drawn);
        if k == 0 {
            return;
        }
        self.end_draw(ino, gen, k, k);
        *drawn -= k;
    }
}

impl Volume {
    /// fallocate(2) of `[off, off+len)`: see the module comment. All blocks are
    /// reserved before anything changes, so a volume without room fails with ENOSPC
    /// and changes nothing. A range whose map records exceed one log entry commits in
    /// pieces (each atomic, in file order; a crash may keep a prefix, each piece with
    /// its blocks and its reserve).
    pub fn fallocate(
        &self,
        cred: &Cred,
        ino: u64,
        off: u64,
        len: u64,
        mode: FallocMode,
    ) -> Result<()> {
        if len == 0 {
            return Err(FsError::Invalid("fallocate of zero bytes".into()));
        }
        let end = off
            .checked_add(len)
            .filter(|e| *e <= max_file_size())
            .ok_or(FsError::TooBig)?;
        match mode {
            FallocMode::Allocate { keep_size } => {
                self.allocate(cred, ino, off, end, keep_size, false)
            }
            FallocMode::ZeroRange { keep_size } => {
                self.allocate(cred, ino, off, end, keep_size, true)
            }
        }
    }

    /// Allocate zeroed blocks for the holes of `[off, end)`, or (`zero`) for every
    /// block of it: a mapped block is replaced copy-on-write by a fresh one holding
    /// its bytes outside the range and zeros inside (ZERO_RANGE), all in one
    /// transaction (or pieces, see `fallocate`).
    fn allocate(
        &self,
        cred: &Cred,
        ino: u64,
        off: u64,
        end: u64,
        keep_size: bool,
        zero: bool,
    ) -> Result<()> {
        let mut g = self.write_state()?;
        let st = &mut *g;
        check_file(st, ino)?;
        self.kill_capability(st, ino)?;
        let first = off / BLOCK_U64;
        let n = end.div_ceil(BLOCK_U64) - first;
        // At least `n - blocks` blocks of the range are holes (the file owns `blocks`
        // blocks in all): a request that cannot fit is refused before its blocks are
        // listed, so the walk below is bounded by the volume's size.
        let at_least = n.saturating_sub(st.inode(ino)?.rec.blocks);
        if at_least > 0 {
            self.ensure_blocks(st, at_least.saturating_mul(2))?;
        }
        let i = st.inode(ino)?;
        // Bytes past the end of the file are zero already: ZERO_RANGE replaces only
        // blocks holding bytes of the file.
        let live_end = i.rec.size.div_ceil(BLOCK_U64);
        let mut holes: Vec<(u64, Option<u64>)> = Vec::new();
        i.map.for_range(first, n, |fb, b| {
            if b.is_none() || (zero && fb < live_end) {
                holes.push((fb, b));
            }
        });
        let h = holes.len() as u64;
        let grows = !keep_size && end > i.rec.size;
        if h == 0 && !grows {
            return Ok(());
        }
        // Check: the log pieces, then the blocks (holes, nodes) with the reserve on
        // top; only then change anything.
        let pieces = self.write_pieces(&i.map, first, n)?;
        let nodes = i.map.plan_set(first, n).new_nodes;
        let mut reserved = Txn::new(OpType::Fallocate, ino);
        for p in &pieces {
            self.reserve_log(&mut reserved, p.bound)?;
        }
        self.ensure_blocks(st, 2 * h + nodes)?;
        self.reserve_blocks(st, &mut reserved, h + nodes)?;
        let mut pool = std::mem::take(&mut reserved.pool);
        // Pop from the end in ascending order: adjacent file blocks stay adjacent.
        pool.sort_unstable_by_key(|b| std::cmp::Reverse(b.no()));
        let mut holes = holes.into_iter().peekable();
        let npieces = pieces.len();
        for (k, p) in pieces.into_iter().enumerate() {
            let mut txn = Txn::new(OpType::Fallocate, ino);
            txn.log_bound = p.bound;
            let piece_end = first + p.start + p.count;
            let mut here: Vec<(u64, FreshBlock)> = Vec::new();
            while let Some((fb, old)) = holes.next_if(|&(fb, _)| fb < piece_end) {
                let b = pool.pop().expect("reserved a block per hole");
                self.fresh_zero(&b, 0, BLOCK);
                if let Some(old) = old {
                    // Keep the bytes outside the range.
                    let bstart = fb * BLOCK_U64;
                    let zs = (off.max(bstart) - bstart) as usize;
                    let ze = (end.min(bstart + BLOCK_U64) - bstart) as usize;
                    if zs > 0 {
                        self.fresh_copy_live(st, &b, BlockNo(old), 0, zs);
                    }
                    if ze < BLOCK {
                        self.fresh_copy_live(st, &b, BlockNo(old), ze, BLOCK - ze);
                    }
                }
                self.fresh_flush(&b, 0, BLOCK);
                here.push((fb, b));
            }
            let last = k + 1 == npieces;
            if here.is_empty() && !(last && grows) {
                txn.pool = Vec::new();
                drop(txn);
                continue;
            }
            // The nodes this piece needs come from the shared pool.
            txn.pool = std::mem::take(&mut pool);
            if let Some((_, b)) = here.first() {
                txn.data_addr = b.no().at(0).0;
            }
            let added = here.len() as u64;
            let inode = st.inodes.get_mut(&ino).expect("checked");
            let mut sink = Sink {
                vol: self,
                txn: &mut txn,
            };
            for (fb, b) in here {
                if let Some(old) = inode.map.set(fb, b.publish(), &mut sink) {
                    sink.txn.releases.push(old);
                }
            }
            inode.rec.cow_reserve += added;
            let now = Time::now();
            if last && grows {
                inode.rec.size = end;
                inode.rec.mtime = now;
            }
            inode.rec.ctime = now;
            inode.rec.mode = perm::mode_after_write(cred, &inode.rec);
            st.reserved += added;
            st.clamp_reserve(ino);
            txn.dirty.insert(ino);
            pool = std::mem::take(&mut txn.pool);
            // For the models: zeroed blocks change no bytes; a size change is a
            // truncate upwards.
            match last && grows {
                true => self.trace(|| Traced::Truncate { ino, size: end }),
                false => self.trace(|| Traced::Pages { ino }),
            }
            if let Err(e) = self.finish(st, txn) {
                for b in pool {
                    st.balloc.free(b.publish());
                }
                return Err(e);
            }
        }
        for b in pool {
            st.balloc.free(b.publish());
        }
        Ok(())
    }

    /// lseek(SEEK_DATA / SEEK_HOLE) from `off`: answered from the block map (a mapped
    /// block is data, preallocated ones included; the end of the file is a hole).
    /// ENXIO at or past the end of the file, or when no data follows.
    pub fn seek(&self, ino: u64, off: u64, what: Seek) -> Result<u64> {
        let st = self.read_state();
        check_file(&st, ino)?;
        let i = st.inode(ino)?;
        let size = i.rec.size;
        if off >= size {
            return Err(FsError::PastEnd);
        }
        let fb = off / BLOCK_U64;
        match what {
            Seek::Data => match i.map.next_data(fb) {
                Some(d) if d * BLOCK_U64 < size => Ok(off.max(d * BLOCK_U64)),
                _ => Err(FsError::PastEnd),
            },
            Seek::Hole => {
                let h = i.map.next_hole(fb).saturating_mul(BLOCK_U64);
                Ok(off.max(h).min(size))
            }
        }
    }
}

use crate::data::max_file_size;
