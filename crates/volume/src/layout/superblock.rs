//! The superblock (512 bytes, two copies in blocks 0 and 1).

use super::*;
use crate::error::{FsError, Result};

fields! {
    SB_MAGIC: 8,
    SB_VERSION: 4,
    /// Bit 0: the volume was closed cleanly.
    SB_FLAGS: 4,
    /// The valid copy with the highest generation wins.
    SB_GENERATION: 8,
    SB_UUID: 16,
    SB_BLOCK_SIZE: 4,
    SB_INODE_SIZE: 4,
    /// Eight u64: total, log start, log blocks, inode table start and blocks, inode
    /// count, data start, data blocks.
    SB_GEOMETRY: 64,
    SB_MKFS_TIME: 8,
    SB_MOUNT_COUNT: 8,
    SB_RESERVED: SB_SIZE - 128 - 4,
    /// CRC32C of everything before it.
    SB_CRC: 4,
}
const _: () = assert!(SB_CRC.end == SB_SIZE);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub generation: u64,
    pub clean: bool,
    pub uuid: [u8; 16],
    pub geo: Geometry,
    pub mkfs_time: i64,
    pub mount_count: u64,
}

fn geometry_field(i: usize) -> std::ops::Range<usize> {
    SB_GEOMETRY.start + i * 8..SB_GEOMETRY.start + i * 8 + 8
}

impl Superblock {
    pub fn encode(&self) -> [u8; SB_SIZE] {
        let mut b = [0u8; SB_SIZE];
        b[SB_MAGIC].copy_from_slice(MAGIC);
        put32(&mut b, SB_VERSION, VERSION);
        put32(&mut b, SB_FLAGS, self.clean as u32);
        put64(&mut b, SB_GENERATION, self.generation);
        b[SB_UUID].copy_from_slice(&self.uuid);
        put32(&mut b, SB_BLOCK_SIZE, BLOCK as u32);
        put32(&mut b, SB_INODE_SIZE, INODE_SIZE as u32);
        let g = &self.geo;
        for (i, v) in [
            g.total_blocks,
            g.log_start,
            g.log_blocks,
            g.itable_start,
            g.itable_blocks,
            g.inode_count,
            g.data_start,
            g.data_blocks,
        ]
        .into_iter()
        .enumerate()
        {
            put64(&mut b, geometry_field(i), v);
        }
        put64(&mut b, SB_MKFS_TIME, self.mkfs_time as u64);
        put64(&mut b, SB_MOUNT_COUNT, self.mount_count);
        let crc = crc32c::crc32c(&b[..SB_CRC.start]);
        put32(&mut b, SB_CRC, crc);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock> {
        if b.len() < SB_SIZE {
            return Err(corrupt("superblock truncated"));
        }
        if &b[SB_MAGIC] != MAGIC {
            return Err(FsError::NotZcfs);
        }
        if crc32c::crc32c(&b[..SB_CRC.start]) != u32_at(b, SB_CRC) {
            return Err(corrupt("superblock checksum mismatch"));
        }
        let version = u32_at(b, SB_VERSION);
        if !(OLDEST_VERSION..=VERSION).contains(&version) {
            return Err(FsError::Unsupported(format!(
                "volume format version {version}, this build reads versions {OLDEST_VERSION} to {VERSION}"
            )));
        }
        if u32_at(b, SB_BLOCK_SIZE) as usize != BLOCK
            || u32_at(b, SB_INODE_SIZE) as usize != INODE_SIZE
        {
            return Err(corrupt("superblock block or inode size is not 4096/128"));
        }
        let f = |i: usize| u64_at(b, geometry_field(i));
        let geo = Geometry {
            total_blocks: f(0),
            log_start: f(1),
            log_blocks: f(2),
            itable_start: f(3),
            itable_blocks: f(4),
            inode_count: f(5),
            data_start: f(6),
            data_blocks: f(7),
        };
        geo.validate()?;
        Ok(Superblock {
            generation: u64_at(b, SB_GENERATION),
            clean: u32_at(b, SB_FLAGS) & 1 == 1,
            uuid: b[SB_UUID].try_into().expect("16 bytes"),
            geo,
            mkfs_time: u64_at(b, SB_MKFS_TIME) as i64,
            mount_count: u64_at(b, SB_MOUNT_COUNT),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trip_and_corruption() {
        let sb = Superblock::sample();
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        let mut bad = b;
        bad[60] ^= 1;
        assert!(matches!(Superblock::decode(&bad), Err(FsError::Corrupt(_))));
        let mut bad = b;
        bad[0] = b'X';
        assert!(matches!(Superblock::decode(&bad), Err(FsError::NotZcfs)));
        assert!(Superblock::decode(&b[..100]).is_err());
    }
}
