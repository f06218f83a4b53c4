//! DRAM allocators for data blocks and inode slots.
//!
//! Neither is persistent: both are rebuilt at mount from what the inodes reach (see
//! docs/format.md, "Why no allocation bitmap"). So a crash can never leak a block or
//! leave a block marked free that is in use.

use crate::error::{FsError, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bitmap allocator over the data area: recently freed blocks first (LIFO), then
/// next-fit. Reusing warm blocks keeps the working set small: on a sparse /dev/shm
/// volume every never-touched block costs a page fault and a zeroed page, and on PM
/// it keeps lines and TLB entries hot.
#[derive(Debug, Clone)]
pub struct BlockAlloc {
    start: u64,
    count: u64,
    bits: Vec<u64>,
    free: u64,
    cursor: u64,
    /// Recently freed blocks; entries may be stale (taken since by the scan).
    recent: Vec<u64>,
    /// Where the next-fit scan goes on (an absolute block number), for a thread that
    /// backs the blocks ahead of it with pages (`Volume::prefault_in_background`).
    frontier: Arc<AtomicU64>,
    /// Free blocks known to hold zeros (same indexing as `bits`). Invariant: a set bit
    /// is a free block whose bytes in the mapping are all zero. Set only by
    /// [`BlockAlloc::mark_clean`] (a hole of the image at open, or a free block zeroed
    /// since); cleared when the block is taken, whatever takes it. A freed block comes
    /// back unknown (dirty). DRAM only: after a crash every free block is unknown until
    /// shown zero again (see `Volume::note_zero_blocks`).
    clean: Vec<u64>,
    clean_count: u64,
    /// The clean blocks that were zeroed while free (`mark_zeroed`), not found in a
    /// hole: their pages are backed (they were in use once), so filling them costs no
    /// page allocation. A subset of `clean`.
    zeroed: Vec<u64>,
    zeroed_count: u64,
    /// No clean block lies in a word below this one (a word index of `clean`).
    clean_low: usize,
    /// Where the search for free blocks not known clean goes on (a word index).
    dirty_cursor: usize,
}

const RECENT_MAX: usize = 1 << 16;

/// Smallest allocation [`BlockAlloc::alloc_clean_first`] serves from clean blocks.
/// Smaller ones take blocks as any allocation does (recently freed first: warm in the
/// caches and, for a same-host application, often in its page tables) and are zeroed
/// by the caller: zeroing up to 15 pages costs a few µs, less than the page faults of
/// blocks the application never touched (4 KiB direct write, fill p50 0.3 µs on a
/// recently freed block, 1.9-2.2 µs on a clean one).
pub const CLEAN_FIRST_MIN: usize = 16;

impl BlockAlloc {
    /// All blocks in `[start, start+count)` free.
    pub fn new(start: u64, count: u64) -> BlockAlloc {
        let mut bits = vec![0u64; count.div_ceil(64) as usize];
        // Mark the padding past `count` as used so it is never handed out.
        for b in count..bits.len() as u64 * 64 {
            bits[(b / 64) as usize] |= 1 << (b % 64);
        }
        BlockAlloc {
            start,
            count,
            bits,
            free: count,
            cursor: 0,
            recent: Vec::new(),
            frontier: Arc::new(AtomicU64::new(start)),
            clean: vec![0u64; count.div_ceil(64) as usize],
            clean_count: 0,
            zeroed: vec![0u64; count.div_ceil(64) as usize],
            zeroed_count: 0,
            clean_low: 0,
            dirty_cursor: 0,
        }
    }

    /// Up to `max` free blocks not known to hold zeros (absolute numbers, ascending
    /// within a pass), from where the last search stopped; takes nothing.
    pub fn dirty_free(&mut self, max: usize) -> Vec<u64> {
        let mut out = Vec::new();
        if max == 0 || self.free == self.clean_count {
            return out;
        }
        let words = self.bits.len();
        let mut w = self.dirty_cursor.min(words.saturating_sub(1));
        let mut seen = 0;
        // Each word once: this takes nothing, so a second look would find the same.
        while out.len() < max && seen < words {
            // Free and not clean; padding past `count` is marked used.
            let mut m = !(self.bits[w] | self.clean[w]);
            while m != 0 && out.len() < max {
                let bit = m.trailing_zeros() as u64;
                m &= m - 1;
                out.push(self.start + w as u64 * 64 + bit);
            }
            if out.len() < max {
                w = (w + 1) % words;
                seen += 1;
            }
        }
        self.dirty_cursor = w;
        out
    }

    /// Free blocks known to hold zeros.
    pub fn clean_count(&self) -> u64 {
        self.clean_count
    }

    /// Whether absolute block `b` is free and known to hold zeros.
    pub fn is_clean(&self, b: u64) -> bool {
        (self.start..self.start + self.count).contains(&b) && {
            let i = b - self.start;
            self.clean[(i / 64) as usize] & (1 << (i % 64)) != 0
        }
    }

    /// Record that absolute block `b`, free, holds zeros (the caller has made sure:
    /// a hole of the image, or zeroed while free under the state lock). Returns false,
    /// changing nothing, for a block outside the range or not free.
    pub fn mark_clean(&mut self, b: u64) -> bool {
        if !self.is_free_block(b) {
            return false;
        }
        let i = b - self.start;
        let w = &mut self.clean[(i / 64) as usize];
        let m = 1 << (i % 64);
        if *w & m == 0 {
            *w |= m;
            self.clean_count += 1;
        }
        self.clean_low = self.clean_low.min((i / 64) as usize);
        true
    }

    /// `mark_clean` for a free block the caller has just zeroed (not a hole).
    pub fn mark_zeroed(&mut self, b: u64) -> bool {
        if !self.mark_clean(b) {
            return false;
        }
        let i = b - self.start;
        let w = &mut self.zeroed[(i / 64) as usize];
        let m = 1 << (i % 64);
        if *w & m == 0 {
            *w |= m;
            self.zeroed_count += 1;
        }
        true
    }

    /// Clean blocks that were zeroed while free (see `zeroed`).
    pub fn zeroed_count(&self) -> u64 {
        self.zeroed_count
    }

    /// Tests: forget every clean block.
    #[cfg(test)]
    pub fn forget_clean(&mut self) {
        self.clean.iter_mut().for_each(|w| *w = 0);
        self.zeroed.iter_mut().for_each(|w| *w = 0);
        self.clean_count = 0;
        self.zeroed_count = 0;
    }

    /// Forget that relative block `i` is clean (it is being taken).
    fn unclean(&mut self, i: u64) {
        let (x, m) = ((i / 64) as usize, 1 << (i % 64));
        if self.clean[x] & m != 0 {
            self.clean[x] &= !m;
            self.clean_count -= 1;
        }
        if self.zeroed[x] & m != 0 {
            self.zeroed[x] &= !m;
            self.zeroed_count -= 1;
        }
    }

    /// Allocate `n` blocks, clean ones first (for pages handed out to be filled, which
    /// must read as zero where they are not written): the lowest known-zero blocks,
    /// then, when there are too few, the rest as [`BlockAlloc::alloc`] takes them.
    /// Returns the blocks in ascending order and, for each, whether it holds zeros
    /// already (only those not need zeroing).
    ///
    /// Lowest first: below the next-fit cursor every block was in use once, so its
    /// page is backed (on /dev/shm a never-touched page costs its first writer a page
    /// fault, an allocation and the kernel's clearing, 2 µs and more per page where
    /// the application fills it); just above the cursor the prefault thread backs the
    /// pages ahead (`Volume::prefault_in_background`). Taking blocks past the cursor
    /// moves it (and the prefault thread's frontier) past them, as `alloc` does.
    pub fn alloc_clean_first(&mut self, n: usize) -> Result<Vec<(u64, bool)>> {
        if (n as u64) > self.free {
            return Err(FsError::NoSpace);
        }
        if n < CLEAN_FIRST_MIN {
            let mut got = self.alloc(n)?;
            got.sort_unstable();
            return Ok(got.into_iter().map(|b| (b, false)).collect());
        }
        let mut out: Vec<(u64, bool)> = Vec::with_capacity(n);
        let words = self.clean.len();
        let mut w = self.clean_low;
        while out.len() < n && self.clean_count > 0 && w < words {
            while self.clean[w] != 0 && out.len() < n {
                let bit = self.clean[w].trailing_zeros() as u64;
                let i = w as u64 * 64 + bit;
                self.unclean(i);
                debug_assert!(self.is_free(i), "a clean block is free");
                self.bits[w] |= 1 << bit;
                self.free -= 1;
                out.push((self.start + i, true));
            }
            if self.clean[w] == 0 {
                w += 1;
            }
        }
        self.clean_low = w;
        if let Some(&(last, _)) = out.last() {
            // As `alloc` leaves it: at the word of the last block taken, so the next
            // allocation (a commit's map nodes, say) takes the rest of that word and
            // the next reservation's clean blocks follow them, adjacent.
            let past = (last - self.start) / 64 * 64;
            if past > self.cursor {
                self.cursor = past;
                self.frontier
                    .store(self.start + self.cursor, Ordering::Relaxed);
            }
        }
        if out.len() < n {
            // Too few clean blocks: the rest come as any allocation's do.
            let rest = self.alloc(n - out.len())?;
            out.extend(rest.into_iter().map(|b| (b, false)));
        }
        out.sort_unstable();
        Ok(out)
    }

    pub fn free_count(&self) -> u64 {
        self.free
    }
    /// Mark a block used during rebuild. Returns false if it already was (double owner).
    pub fn mark_used(&mut self, block: u64) -> bool {
        if block < self.start || block >= self.start + self.count {
            return false;
        }
        let i = block - self.start;
        let w = &mut self.bits[(i / 64) as usize];
        let m = 1 << (i % 64);
        if *w & m != 0 {
            return false;
        }
        *w |= m;
        self.free -= 1;
        self.unclean(i);
        true
    }

    /// Where new blocks are taken from next (shared: it follows the allocations).
    pub fn frontier(&self) -> Arc<AtomicU64> {
        self.frontier.clone()
    }

    /// Allocate `n` blocks, preferring one contiguous run from the cursor on.
    pub fn alloc(&mut self, n: usize) -> Result<Vec<u64>> {
        if (n as u64) > self.free {
            return Err(FsError::NoSpace);
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let Some(b) = self.recent.pop() else { break };
            let i = b - self.start;
            let w = &mut self.bits[(i / 64) as usize];
            if *w & (1 << (i % 64)) == 0 {
                *w |= 1 << (i % 64);
                self.unclean(i);
                out.push(b);
            }
        }
        // Ascending order, so blocks freed together stay physically contiguous in files.
        out.sort_unstable();
        let from_recent = out.len();
        let words = self.bits.len() as u64;
        let mut w = self.cursor / 64;
        let mut scanned = 0u64;
        while out.len() < n && scanned <= words {
            while self.bits[w as usize] != u64::MAX && out.len() < n {
                let bit = (!self.bits[w as usize]).trailing_zeros() as u64;
                self.bits[w as usize] |= 1 << bit;
                self.unclean(w * 64 + bit);
                out.push(self.start + w * 64 + bit);
            }
            if out.len() < n {
                w = (w + 1) % words;
                scanned += 1;
            }
        }
        debug_assert_eq!(out.len(), n);
        self.free -= n as u64;
        if out.len() > from_recent {
            self.cursor = w * 64;
            self.frontier
                .store(self.start + self.cursor, Ordering::Relaxed);
        }
        Ok(out)
    }

    #[cfg(test)]
    pub fn alloc_one(&mut self) -> Result<u64> {
        Ok(self.alloc(1)?[0])
    }

    /// Whether absolute block `b` is in the range and free.
    pub fn is_free_block(&self, b: u64) -> bool {
        (self.start..self.start + self.count).contains(&b) && self.is_free(b - self.start)
    }

    /// Whether block `i` (relative to `start`) is free.
    fn is_free(&self, i: u64) -> bool {
        self.bits[(i / 64) as usize] & (1 << (i % 64)) == 0
    }

    /// The first block index in `[i, end)` (relative to `start`) whose bit is `used`,
    /// or `end`; whole words are skipped.
    fn next_with(&self, mut i: u64, end: u64, used: bool) -> u64 {
        while i < end {
            let w = self.bits[(i / 64) as usize];
            let w = if used { w } else { !w };
            let rest = w >> (i % 64);
            if rest != 0 {
                return (i + rest.trailing_zeros() as u64).min(end);
            }
            i = (i / 64 + 1) * 64;
        }
        end
    }

    /// Plan a landing reservation (data.rs): `n` blocks as extents of at most `max_run`
    /// contiguous free blocks, each right behind one more free block (its gap) and right
    /// before another (its guard: the next extent's gap, or a block of its own), the
    /// next-fit scan from the cursor on. Returns `(gap, first, blocks)` per extent in
    /// scan order, absolute block numbers, with `(guard, guard + 1, 0)` after the last
    /// extent of each free run, or `None` if the free space does not hold them (too
    /// little, or too fragmented: a run of fewer than three free blocks takes no
    /// extent). Takes nothing: [`BlockAlloc::take_planned`] does, after the caller's
    /// other checks.
    ///
    /// The guard behind an extent keeps a frame that lands in the extent's last slot
    /// longer than the protocol allows (written by a NIC in zero-copy mode before any
    /// program could drop it) out of the next block, another file's (review 28).
    ///
    /// A gap is always a block of this allocator, so never the block before `start`
    /// (the end of the metadata region): the first data block can be a gap, never the
    /// first block of an extent.
    pub fn plan_landing(&self, n: u64, max_run: u64) -> Option<Vec<(u64, u64, u64)>> {
        assert!(max_run > 0, "extents of at least one block");
        if n == 0 {
            return Some(Vec::new());
        }
        // Gaps need blocks too: at least one per `max_run` blocks, and a guard.
        if n + n.div_ceil(max_run) + 1 > self.free {
            return None;
        }
        let mut out = Vec::new();
        let mut left = n;
        let cursor = self.cursor.min(self.count);
        for (lo, hi) in [(cursor, self.count), (0, cursor)] {
            let mut i = lo;
            while left > 0 && i < hi {
                let s = self.next_with(i, hi, false);
                let e = self.next_with(s, hi, true);
                // The free run [s, e): gap, extent, gap, extent, ..., guard.
                let mut pos = s;
                let mut any = false;
                while left > 0 && e - pos >= 3 {
                    let k = (e - pos - 2).min(max_run).min(left);
                    out.push((self.start + pos, self.start + pos + 1, k));
                    left -= k;
                    pos += k + 1;
                    any = true;
                }
                if any {
                    // `pos` is free and in the run: k <= e - pos - 2 above.
                    out.push((self.start + pos, self.start + pos + 1, 0));
                }
                i = e;
            }
        }
        (left == 0).then_some(out)
    }

    /// Take the blocks of a plan from [`BlockAlloc::plan_landing`] (gaps and extents),
    /// made since with no other allocation in between.
    pub fn take_planned(&mut self, plan: &[(u64, u64, u64)]) {
        for &(gap, first, k) in plan {
            debug_assert_eq!(gap + 1, first);
            for b in gap..first + k {
                let i = b - self.start;
                assert!(self.is_free(i), "planned block {b} is not free");
                self.bits[(i / 64) as usize] |= 1 << (i % 64);
                self.free -= 1;
                self.unclean(i);
            }
        }
        if let Some(&(_, first, k)) = plan.last() {
            // Next-fit goes on after the last extent, as `alloc` does.
            let words = self.bits.len() as u64;
            self.cursor = (first + k - self.start) / 64 % words * 64;
            self.frontier
                .store(self.start + self.cursor, Ordering::Relaxed);
        }
    }

    pub fn free(&mut self, block: u64) {
        let i = block - self.start;
        let w = &mut self.bits[(i / 64) as usize];
        let m = 1 << (i % 64);
        // The allocator is rebuilt from the inodes at mount, so a double free is a bug
        // of ours, and going on could hand one block to two files.
        assert!(*w & m != 0, "block {block} freed twice");
        *w &= !m;
        self.free += 1;
        // Taking a block cleared its bit: a freed block is unknown (it may hold a
        // deleted file's bytes) until zeroed again.
        debug_assert!(!self.is_clean(block), "a taken block was still clean");
        if self.recent.len() < RECENT_MAX {
            self.recent.push(block);
        }
    }
}

/// Free inode slots (numbers 1..=count), lowest first so numbers stay dense.
#[derive(Debug, Clone, Default)]
pub struct InodeAlloc {
    free: std::collections::BTreeSet<u64>,
}

impl InodeAlloc {
    pub fn insert(&mut self, ino: u64) {
        self.free.insert(ino);
    }
    pub fn alloc(&mut self) -> Result<u64> {
        self.free.pop_first().ok_or(FsError::NoInodes)
    }
    pub fn free_count(&self) -> u64 {
        self.free.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_and_exhaust() {
        let mut a = BlockAlloc::new(100, 130);
        let got = a.alloc(130).unwrap();
        let set: std::collections::HashSet<_> = got.iter().copied().collect();
        assert_eq!(set.len(), 130);
        assert!(got.iter().all(|&b| (100..230).contains(&b)));
        assert!(matches!(a.alloc(1), Err(FsError::NoSpace)));
        a.free(150);
        assert_eq!(a.alloc_one().unwrap(), 150);
        assert!(!a.mark_used(150));
        assert!(!a.mark_used(99));
    }

    #[test]
    fn clean_blocks_come_first_and_only_free_blocks_are_clean() {
        let mut a = BlockAlloc::new(100, 256);
        let used = a.alloc(10).unwrap(); // 100..110
        assert!(!a.mark_clean(105), "a used block is never clean");
        assert!(!a.mark_clean(99) && !a.mark_clean(356), "outside the range");
        for b in 200..204 {
            assert!(a.mark_clean(b));
        }
        assert!(a.mark_clean(200), "marking twice is harmless");
        assert_eq!(a.clean_count(), 4);
        // Clean ones first, flagged; the rest as `alloc` takes them, not flagged.
        let got = a.alloc_clean_first(CLEAN_FIRST_MIN + 2).unwrap();
        let clean: Vec<u64> = got.iter().filter(|g| g.1).map(|g| g.0).collect();
        assert_eq!(clean, vec![200, 201, 202, 203]);
        assert_eq!(got.iter().filter(|g| !g.1).count(), CLEAN_FIRST_MIN - 2);
        assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "ascending");
        assert_eq!(a.clean_count(), 0);
        assert_eq!(a.free_count(), 256 - 10 - CLEAN_FIRST_MIN as u64 - 2);
        // A freed block comes back unknown, even one handed out clean.
        a.free(201);
        a.free(used[0]);
        assert!(!a.is_clean(201) && !a.is_clean(used[0]));
        let again = a.alloc_clean_first(CLEAN_FIRST_MIN).unwrap();
        assert!(again.iter().all(|g| !g.1));
    }

    #[test]
    fn zeroed_blocks_are_counted_apart_from_holes_until_taken() {
        let mut a = BlockAlloc::new(0, 256);
        a.alloc(100).unwrap();
        a.free(3);
        assert!(a.mark_zeroed(3));
        assert!(!a.mark_zeroed(4), "a used block");
        assert!(a.mark_clean(200));
        assert_eq!((a.clean_count(), a.zeroed_count()), (2, 1));
        let got = a.alloc_clean_first(CLEAN_FIRST_MIN).unwrap();
        assert_eq!(got[0], (3, true));
        assert_eq!((a.clean_count(), a.zeroed_count()), (0, 0));
        a.free(3);
        assert_eq!(a.zeroed_count(), 0, "freed: unknown again");
    }

    #[test]
    fn allocations_below_clean_first_min_take_recent_blocks_and_say_none_is_clean() {
        let mut a = BlockAlloc::new(0, 1024);
        a.alloc(64).unwrap();
        a.free(7);
        for b in 500..600 {
            assert!(a.mark_clean(b));
        }
        let small = a.alloc_clean_first(CLEAN_FIRST_MIN - 1).unwrap();
        assert_eq!(small[0], (7, false), "the recently freed block first");
        assert!(small.iter().all(|g| !g.1), "the caller zeroes them all");
        let big = a.alloc_clean_first(CLEAN_FIRST_MIN).unwrap();
        assert!(big.iter().all(|g| g.1), "clean blocks at the bound");
        assert_eq!(big[0].0, 500);
    }

    #[test]
    fn clean_blocks_are_taken_lowest_first_and_move_the_cursor_past_them() {
        let mut a = BlockAlloc::new(0, 1024);
        a.alloc(200).unwrap(); // cursor at 192
        a.free(150);
        a.free(5);
        for b in [5, 150, 600, 601] {
            assert!(a.mark_clean(b));
        }
        for b in 700..700 + CLEAN_FIRST_MIN as u64 {
            assert!(a.mark_clean(b));
        }
        let got: Vec<u64> = a
            .alloc_clean_first(CLEAN_FIRST_MIN)
            .unwrap()
            .iter()
            .map(|g| g.0)
            .collect();
        assert_eq!(got[..5], [5, 150, 600, 601, 700], "lowest first");
        assert_eq!(a.cursor, 704, "next-fit goes on from the last block taken");
        assert_eq!(a.frontier().load(Ordering::Relaxed), 704);
        // A block marked clean below the lowest one searched is found again.
        a.free(5);
        assert!(a.mark_clean(5));
        let got = a.alloc_clean_first(CLEAN_FIRST_MIN).unwrap();
        assert_eq!(got[0], (5, true));
    }

    #[test]
    fn every_way_of_taking_a_block_forgets_that_it_was_clean() {
        let mut a = BlockAlloc::new(0, 128);
        for b in 0..128 {
            assert!(a.mark_clean(b));
        }
        let got = a.alloc(3).unwrap();
        assert!(got.iter().all(|&b| !a.is_clean(b)));
        let plan = a.plan_landing(4, 32).unwrap();
        a.take_planned(&plan);
        for &(gap, first, k) in &plan {
            assert!((gap..first + k).all(|b| !a.is_clean(b)));
        }
        assert!(!a.mark_used(got[0]));
        assert!(a.mark_used(100));
        assert!(!a.is_clean(100));
        assert_eq!(a.clean_count(), a.free_count());
    }

    #[test]
    fn dirty_free_finds_free_blocks_not_known_clean_up_to_its_bound() {
        let mut a = BlockAlloc::new(10, 130); // padding past 130 in the last word
        a.alloc(130).unwrap();
        for b in [12, 75, 139] {
            a.free(b);
        }
        a.mark_clean(75);
        assert_eq!(a.dirty_free(1), vec![12]);
        let mut rest = a.dirty_free(8);
        rest.sort_unstable();
        assert_eq!(rest, vec![12, 139], "never 75 (clean) nor padding");
        a.mark_clean(12);
        a.mark_clean(139);
        assert!(a.dirty_free(8).is_empty());
        assert!(a.dirty_free(0).is_empty());
    }

    /// Check a plan: extents of 1..=max blocks, each right behind its gap and right
    /// before a planned block (the next gap, or a guard of no blocks), all of them free
    /// and in the allocator's range, no block twice, `n` blocks in all.
    fn check_plan(a: &BlockAlloc, plan: &[(u64, u64, u64)], n: u64, max: u64) {
        let mut seen = std::collections::HashSet::new();
        let mut total = 0;
        for (i, &(gap, first, k)) in plan.iter().enumerate() {
            assert_eq!(gap + 1, first);
            if k > 0 {
                let behind = plan.get(i + 1).map(|p| p.0);
                assert_eq!(behind, Some(first + k), "no guard behind extent {i}");
            } else {
                assert!(
                    i > 0 && plan[i - 1].2 > 0,
                    "a guard with no extent before it"
                );
            }
            assert!(k <= max, "extent of {k} blocks");
            assert!(gap >= a.start, "gap {gap} before the allocator's range");
            for b in gap..first + k {
                assert!(b < a.start + a.count);
                assert!(a.is_free(b - a.start), "block {b} is not free");
                assert!(seen.insert(b), "block {b} planned twice");
            }
            total += k;
        }
        assert_eq!(total, n);
    }

    #[test]
    fn a_landing_plan_puts_a_free_gap_before_every_extent() {
        let mut a = BlockAlloc::new(100, 200);
        let plan = a.plan_landing(70, 32).unwrap();
        check_plan(&a, &plan, 70, 32);
        // One free run: gap, 32, gap, 32, gap, 6, guard.
        assert_eq!(
            plan,
            vec![(100, 101, 32), (133, 134, 32), (166, 167, 6), (173, 174, 0)],
            "extents of the largest size, packed"
        );
        let free = a.free_count();
        a.take_planned(&plan);
        assert_eq!(a.free_count(), free - 74);
        // The next plan goes on after the guard and avoids the taken blocks.
        let next = a.plan_landing(10, 32).unwrap();
        check_plan(&a, &next, 10, 32);
        assert!(next[0].0 >= 174, "{next:?}");
    }

    #[test]
    fn the_first_data_block_is_never_the_first_block_of_an_extent() {
        // Only the first block of the range and its neighbour are free: the first one
        // can only be a gap (the block before it is metadata).
        let mut a = BlockAlloc::new(100, 64);
        let all = a.alloc(64).unwrap();
        assert_eq!(all.len(), 64);
        a.free(100);
        a.free(101);
        assert_eq!(a.plan_landing(1, 32), None, "block 99 would be the gap");
        a.free(102);
        assert_eq!(
            a.plan_landing(1, 32),
            Some(vec![(100, 101, 1), (102, 103, 0)])
        );
        assert_eq!(
            a.plan_landing(2, 32),
            None,
            "no guard behind a second block"
        );
    }

    #[test]
    fn a_fragmented_allocator_has_no_landing_plan_and_stays_as_it_was() {
        // Every other block free: lots of free space, no two adjacent free blocks.
        let mut a = BlockAlloc::new(0, 256);
        a.alloc(256).unwrap();
        for b in (0..256).step_by(2) {
            a.free(b);
        }
        let before = a.clone();
        assert_eq!(a.plan_landing(1, 32), None);
        assert_eq!(a.bits, before.bits);
        assert_eq!(a.free_count(), 128);
        // An ordinary allocation still works.
        assert_eq!(a.alloc(128).unwrap().len(), 128);
    }

    #[test]
    fn a_landing_plan_needs_room_for_its_gaps_at_the_bound() {
        // 34 free blocks hold 32 blocks, one gap and one guard, not 33 blocks.
        let a = BlockAlloc::new(0, 34);
        assert_eq!(a.plan_landing(32, 32), Some(vec![(0, 1, 32), (33, 34, 0)]));
        assert_eq!(a.plan_landing(33, 32), None);
        let a = BlockAlloc::new(0, 33);
        assert_eq!(a.plan_landing(32, 32), None, "no room for the guard");
        // A run crossing the cursor is split in two, each with a gap.
        let mut a = BlockAlloc::new(0, 128);
        a.cursor = 64;
        let plan = a.plan_landing(100, 32).unwrap();
        check_plan(&a, &plan, 100, 32);
        a.take_planned(&plan);
        assert_eq!(a.free_count(), 128 - 100 - plan.len() as u64);
        assert!(a.cursor < 128, "cursor {} outside the bitmap", a.cursor);
        a.alloc(a.free_count() as usize).unwrap();
    }
}
