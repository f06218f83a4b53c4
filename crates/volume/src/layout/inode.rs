//! The inode record (128 bytes; inode number = slot + 1; the root is 1).

use super::*;
use crate::error::Result;

fields! {
    /// 0 = a free slot.
    I_INO: 8,
    /// Kept in free slots, increased on reuse, so a reused number is told apart.
    I_GEN: 4,
    I_MODE: 4,
    I_UID: 4,
    I_GID: 4,
    I_NLINK: 4,
    I_FLAGS: 4,
    I_SIZE: 8,
    /// Data-area blocks owned (data, map nodes, the xattr block).
    I_BLOCKS: 8,
    I_ATIME_SEC: 8,
    I_MTIME_SEC: 8,
    I_CTIME_SEC: 8,
    I_ATIME_NSEC: 4,
    I_MTIME_NSEC: 4,
    I_CTIME_NSEC: 4,
    I_RDEV: 4,
    /// Parent directory (directories only).
    I_PARENT: 8,
    I_MAP_ROOT: 8,
    I_XATTR_BLOCK: 8,
    I_MAP_HEIGHT: 1,
    I_RESERVED: 3,
    /// Blocks held back for copy-on-write overwrites of preallocated blocks
    /// (fallocate; format version 3, zero in version 2 images).
    I_COW_RESERVE: 8,
    /// CRC32C of everything before it.
    I_CRC: 4,
}
const _: () = assert!(I_CRC.end == INODE_SIZE);

/// Highest map height a record may claim (`map::MAX_HEIGHT`).
const MAX_MAP_HEIGHT: u8 = 6;

/// The persistent part of an inode (128 bytes on PM).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InodeRec {
    pub ino: u64,
    pub gen: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub flags: u32,
    pub size: u64,
    /// Data-area blocks owned: data, map nodes and the xattr block.
    pub blocks: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub rdev: u32,
    /// Parent directory (directories only; ".." and rename loop checks).
    pub parent: u64,
    pub map_root: u64,
    pub map_height: u8,
    pub xattr_block: u64,
    /// Blocks held back from the allocator for copy-on-write overwrites of the
    /// file's preallocated blocks (fallocate); see `falloc.rs`.
    pub cow_reserve: u64,
}

impl InodeRec {
    /// One more link. Callers check MAX_LINKS first; past u32 is a broken invariant,
    /// not something to wrap or clamp.
    pub fn link_added(&mut self) {
        self.nlink = self
            .nlink
            .checked_add(1)
            .expect("link count checked before");
    }
    /// One link less. Callers know the inode has it; below zero is a broken invariant.
    pub fn link_dropped(&mut self) {
        self.nlink = self
            .nlink
            .checked_sub(1)
            .expect("link count checked before");
    }
    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }
    pub fn is_reg(&self) -> bool {
        self.mode & S_IFMT == S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.mode & S_IFMT == S_IFLNK
    }

    pub fn encode(&self) -> [u8; INODE_SIZE] {
        let mut b = [0u8; INODE_SIZE];
        put64(&mut b, I_INO, self.ino);
        put32(&mut b, I_GEN, self.gen);
        put32(&mut b, I_MODE, self.mode);
        put32(&mut b, I_UID, self.uid);
        put32(&mut b, I_GID, self.gid);
        put32(&mut b, I_NLINK, self.nlink);
        put32(&mut b, I_FLAGS, self.flags);
        put64(&mut b, I_SIZE, self.size);
        put64(&mut b, I_BLOCKS, self.blocks);
        put64(&mut b, I_ATIME_SEC, self.atime.sec as u64);
        put64(&mut b, I_MTIME_SEC, self.mtime.sec as u64);
        put64(&mut b, I_CTIME_SEC, self.ctime.sec as u64);
        put32(&mut b, I_ATIME_NSEC, self.atime.nsec);
        put32(&mut b, I_MTIME_NSEC, self.mtime.nsec);
        put32(&mut b, I_CTIME_NSEC, self.ctime.nsec);
        put32(&mut b, I_RDEV, self.rdev);
        put64(&mut b, I_PARENT, self.parent);
        put64(&mut b, I_MAP_ROOT, self.map_root);
        put64(&mut b, I_XATTR_BLOCK, self.xattr_block);
        b[I_MAP_HEIGHT.start] = self.map_height;
        put64(&mut b, I_COW_RESERVE, self.cow_reserve);
        let crc = crc32c::crc32c(&b[..I_CRC.start]);
        put32(&mut b, I_CRC, crc);
        b
    }

    /// The record of a free slot: keeps the generation so a reused number is told apart.
    pub fn free_slot(gen: u32) -> [u8; INODE_SIZE] {
        InodeRec {
            gen,
            ..Default::default()
        }
        .encode()
    }

    /// Decode a slot. An all-zero slot (never used) decodes as free.
    pub fn decode(b: &[u8]) -> Result<InodeRec> {
        if b.len() < INODE_SIZE {
            return Err(corrupt("inode record truncated"));
        }
        if b[..INODE_SIZE].iter().all(|&x| x == 0) {
            return Ok(InodeRec::default());
        }
        if crc32c::crc32c(&b[..I_CRC.start]) != u32_at(b, I_CRC) {
            return Err(corrupt("inode record checksum mismatch"));
        }
        let ts = |s, n| Time {
            sec: u64_at(b, s) as i64,
            nsec: u32_at(b, n),
        };
        let r = InodeRec {
            ino: u64_at(b, I_INO),
            gen: u32_at(b, I_GEN),
            mode: u32_at(b, I_MODE),
            uid: u32_at(b, I_UID),
            gid: u32_at(b, I_GID),
            nlink: u32_at(b, I_NLINK),
            flags: u32_at(b, I_FLAGS),
            size: u64_at(b, I_SIZE),
            blocks: u64_at(b, I_BLOCKS),
            atime: ts(I_ATIME_SEC, I_ATIME_NSEC),
            mtime: ts(I_MTIME_SEC, I_MTIME_NSEC),
            ctime: ts(I_CTIME_SEC, I_CTIME_NSEC),
            rdev: u32_at(b, I_RDEV),
            parent: u64_at(b, I_PARENT),
            map_root: u64_at(b, I_MAP_ROOT),
            xattr_block: u64_at(b, I_XATTR_BLOCK),
            map_height: b[I_MAP_HEIGHT.start],
            cow_reserve: u64_at(b, I_COW_RESERVE),
        };
        if r.ino != 0 && !valid_file_type(r.mode) {
            return Err(corrupt(format!(
                "inode {} has invalid mode {:o}",
                r.ino, r.mode
            )));
        }
        if r.map_height > MAX_MAP_HEIGHT {
            return Err(corrupt(format!(
                "inode {} map height {} > {MAX_MAP_HEIGHT}",
                r.ino, r.map_height
            )));
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_round_trip() {
        let r = InodeRec::sample();
        assert_eq!(InodeRec::decode(&r.encode()).unwrap(), r);
        let mut b = r.encode();
        b[33] ^= 0x10;
        assert!(InodeRec::decode(&b).is_err());
        assert_eq!(InodeRec::decode(&[0u8; 128]).unwrap().ino, 0);
    }
}
