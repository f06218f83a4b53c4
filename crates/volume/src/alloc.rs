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
}

const RECENT_MAX: usize = 1 << 16;

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
        }
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
            let word = &mut self.bits[w as usize];
            while *word != u64::MAX && out.len() < n {
                let bit = (!*word).trailing_zeros() as u64;
                *word |= 1 << bit;
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
    /// contiguous free blocks, each right behind one more free block (its gap), the
    /// next-fit scan from the cursor on. Returns `(gap, first, blocks)` per extent in
    /// scan order, absolute block numbers, or `None` if the free space does not hold
    /// them (too little, or too fragmented: a free block alone takes no extent). Takes
    /// nothing: [`BlockAlloc::take_planned`] does, after the caller's other checks.
    ///
    /// A gap is always a block of this allocator, so never the block before `start`
    /// (the end of the metadata region): the first data block can be a gap, never the
    /// first block of an extent.
    pub fn plan_landing(&self, n: u64, max_run: u64) -> Option<Vec<(u64, u64, u64)>> {
        assert!(max_run > 0, "extents of at least one block");
        if n == 0 {
            return Some(Vec::new());
        }
        // Gaps need blocks too: at least one per `max_run` blocks.
        if n + n.div_ceil(max_run) > self.free {
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
                // The free run [s, e): gap, extent, gap, extent, ...
                let mut pos = s;
                while left > 0 && e - pos >= 2 {
                    let k = (e - pos - 1).min(max_run).min(left);
                    out.push((self.start + pos, self.start + pos + 1, k));
                    left -= k;
                    pos += k + 1;
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

    /// Check a plan: extents of 1..=max blocks, each right behind its gap, all of them
    /// free and in the allocator's range, no block twice, `n` blocks in all.
    fn check_plan(a: &BlockAlloc, plan: &[(u64, u64, u64)], n: u64, max: u64) {
        let mut seen = std::collections::HashSet::new();
        let mut total = 0;
        for &(gap, first, k) in plan {
            assert_eq!(gap + 1, first);
            assert!((1..=max).contains(&k), "extent of {k} blocks");
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
        // One free run: gap, 32, gap, 32, gap, 6.
        assert_eq!(
            plan,
            vec![(100, 101, 32), (133, 134, 32), (166, 167, 6)],
            "extents of the largest size, packed"
        );
        let free = a.free_count();
        a.take_planned(&plan);
        assert_eq!(a.free_count(), free - 73);
        // The next plan goes on after the last extent and avoids the taken blocks.
        let next = a.plan_landing(10, 32).unwrap();
        check_plan(&a, &next, 10, 32);
        assert!(next[0].0 >= 173, "{next:?}");
    }

    #[test]
    fn the_first_data_block_is_never_the_first_block_of_an_extent() {
        // Only the first block of the range and its neighbour are free: the first one
        // can only be a gap (the block before it is metadata).
        let mut a = BlockAlloc::new(100, 64);
        let all = a.alloc(64).unwrap();
        assert_eq!(all.len(), 64);
        a.free(100);
        assert_eq!(a.plan_landing(1, 32), None, "block 99 would be the gap");
        a.free(101);
        assert_eq!(a.plan_landing(1, 32), Some(vec![(100, 101, 1)]));
        assert_eq!(a.plan_landing(2, 32), None);
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
        // 33 free blocks hold 32 blocks and one gap, not 33 blocks.
        let a = BlockAlloc::new(0, 33);
        assert_eq!(a.plan_landing(32, 32), Some(vec![(0, 1, 32)]));
        assert_eq!(a.plan_landing(33, 32), None);
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
