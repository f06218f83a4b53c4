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
}
