//! Volume geometry: where the log, the inode table and the data area are, in blocks.

use super::{corrupt, BLOCK, BLOCK_U64, INODES_PER_BLOCK, INODE_SIZE};
use crate::error::{FsError, Result};

/// Fewest blocks a volume can have.
pub const MIN_VOLUME_BLOCKS: u64 = 32;
/// Fewest ring blocks of the log: an entry may take half the ring, and the largest
/// entry that cannot be split (one leaf of map pointers, or a rename) needs 8 KiB.
pub const MIN_RING_BLOCKS: u64 = 4;
/// Fewest inode slots.
pub const MIN_INODES: u64 = 64;
/// Fewest data blocks mkfs leaves.
pub const MIN_DATA_BLOCKS: u64 = 8;

/// Volume geometry, in blocks. Block 0 and 1 hold the two superblock copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Geometry {
    pub total_blocks: u64,
    /// First block of the log: the header block (tail, head words), then the ring.
    pub log_start: u64,
    pub log_blocks: u64,
    pub itable_start: u64,
    pub itable_blocks: u64,
    pub inode_count: u64,
    pub data_start: u64,
    pub data_blocks: u64,
}

impl Geometry {
    /// Lay out a volume of `total_bytes`, with optional inode count and log size.
    pub fn plan(total_bytes: u64, inodes: Option<u64>, log_bytes: Option<u64>) -> Result<Geometry> {
        let total_blocks = total_bytes / BLOCK_U64;
        if total_blocks < MIN_VOLUME_BLOCKS {
            return Err(FsError::Invalid(format!(
                "volume of {total_bytes} bytes is too small (minimum {} bytes)",
                MIN_VOLUME_BLOCKS * BLOCK_U64
            )));
        }
        // Log: 1/64 of the volume, between 64 KiB and 64 MiB, plus the header block.
        let log_ring = log_bytes
            .unwrap_or((total_bytes / 64).clamp(64 << 10, 64 << 20))
            .div_ceil(BLOCK_U64)
            .max(MIN_RING_BLOCKS);
        // One inode per 16 KiB by default, at least MIN_INODES.
        let inode_count = inodes
            .unwrap_or(total_bytes / (16 << 10))
            .max(MIN_INODES)
            .div_ceil(INODES_PER_BLOCK as u64)
            * INODES_PER_BLOCK as u64;
        let itable_blocks = inode_count / INODES_PER_BLOCK as u64;
        let log_start = 2;
        let log_blocks = 1 + log_ring;
        let itable_start = log_start + log_blocks;
        let data_start = itable_start + itable_blocks;
        if data_start + MIN_DATA_BLOCKS > total_blocks {
            return Err(FsError::Invalid(format!(
                "volume of {total_bytes} bytes leaves no room for data after a {} KiB log and {inode_count} inodes",
                log_ring * 4
            )));
        }
        Ok(Geometry {
            total_blocks,
            log_start,
            log_blocks,
            itable_start,
            itable_blocks,
            inode_count,
            data_start,
            data_blocks: total_blocks - data_start,
        })
    }

    pub fn log_header_off(&self) -> usize {
        (self.log_start * BLOCK_U64) as usize
    }
    pub fn ring_off(&self) -> usize {
        ((self.log_start + 1) * BLOCK_U64) as usize
    }
    pub fn ring_len(&self) -> u64 {
        (self.log_blocks - 1) * BLOCK_U64
    }
    pub fn inode_off(&self, ino: u64) -> usize {
        (self.itable_start * BLOCK_U64 + (ino - 1) * INODE_SIZE as u64) as usize
    }
    pub fn is_data_block(&self, b: u64) -> bool {
        b >= self.data_start && b < self.total_blocks
    }

    /// What a superblock read from an image must satisfy before anything trusts it.
    pub(super) fn validate(&self) -> Result<()> {
        let ok = self.log_start == 2
            && self.log_blocks > MIN_RING_BLOCKS
            && self.itable_start == self.log_start + self.log_blocks
            && self.itable_blocks * INODES_PER_BLOCK as u64 == self.inode_count
            && self.inode_count >= 1
            && self.data_start == self.itable_start + self.itable_blocks
            && self.data_start + self.data_blocks == self.total_blocks
            && self.data_blocks >= 1
            && self.total_blocks <= (usize::MAX / BLOCK) as u64;
        if ok {
            Ok(())
        } else {
            Err(corrupt(format!(
                "superblock geometry is inconsistent: {self:?}"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_plans_and_rejects_at_the_bounds() {
        let g = Geometry::plan(1 << 30, None, None).unwrap();
        assert_eq!(g.data_start + g.data_blocks, g.total_blocks);
        assert!(Geometry::plan(MIN_VOLUME_BLOCKS * BLOCK_U64 - 1, None, None).is_err());
        let g = Geometry::plan(64 << 20, Some(1), Some(1)).unwrap();
        assert_eq!(g.log_blocks - 1, MIN_RING_BLOCKS);
        assert_eq!(g.inode_count, MIN_INODES);
        g.validate().unwrap();
        let small = Geometry {
            log_blocks: MIN_RING_BLOCKS,
            itable_start: g.itable_start - 1,
            data_start: g.data_start - 1,
            data_blocks: g.data_blocks + 1,
            ..g
        };
        assert!(
            small.validate().is_err(),
            "a ring below the minimum accepted"
        );
    }
}
