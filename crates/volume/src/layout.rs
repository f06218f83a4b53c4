//! On-PM byte layout: superblock, inode records, directory entries, log entries,
//! xattr blocks. Little-endian throughout; see docs/format.md. Every decoder validates
//! and returns `Corrupt` on bad input; none panics.

use crate::error::{FsError, Result};

pub const BLOCK: usize = 4096;
pub const BLOCK_U64: u64 = BLOCK as u64;
pub const MAGIC: &[u8; 8] = b"ZCFSVOL1";
/// On-PM format version. 2: log entries count records in 32 bits (version 1 clamped the
/// count to 16 bits).
pub const VERSION: u32 = 2;
pub const SB_SIZE: usize = 512;
pub const INODE_SIZE: usize = 128;
pub const INODES_PER_BLOCK: usize = BLOCK / INODE_SIZE;
pub const PTRS_PER_NODE: usize = BLOCK / 8;
pub const NODE_SHIFT: u32 = 9;
pub const DIRENT_UNIT: usize = 32;
pub const UNITS_PER_BLOCK: usize = BLOCK / DIRENT_UNIT;
pub const DIRENT_HDR: usize = 16;
pub const NAME_MAX: usize = 255;
pub const ROOT_INO: u64 = 1;
pub const LOG_ENTRY_MAGIC: u32 = 0x474f_4c5a; // "ZLOG"
pub const LOG_HDR: usize = 64;
pub const REC_HDR: usize = 16;
/// Offsets of the two 8-byte commit words in the log header block; separate lines.
pub const TAIL_WORD: usize = 0;
pub const HEAD_WORD: usize = 64;
pub const XATTR_MAGIC: u32 = 0x5441_585a; // "ZXAT"
pub const XATTR_HDR: usize = 16;

const _: () = assert!(INODE_SIZE * INODES_PER_BLOCK == BLOCK);
const _: () = assert!(PTRS_PER_NODE == 1 << NODE_SHIFT);
const _: () = assert!(UNITS_PER_BLOCK == 128, "dir block free map is one u128");
const _: () = assert!(DIRENT_HDR + NAME_MAX <= 9 * DIRENT_UNIT);
const _: () = assert!(SB_SIZE <= BLOCK && LOG_HDR.is_multiple_of(64));

fn corrupt(what: impl Into<String>) -> FsError {
    FsError::Corrupt(what.into())
}

pub(crate) fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
pub(crate) fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
pub(crate) fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}
fn put16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

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
        if total_blocks < 32 {
            return Err(FsError::Invalid(format!(
                "volume of {total_bytes} bytes is too small (minimum {} bytes)",
                32 * BLOCK
            )));
        }
        // Log: 1/64 of the volume, between 64 KiB and 64 MiB, plus the header block.
        let log_ring = log_bytes
            .unwrap_or((total_bytes / 64).clamp(64 << 10, 64 << 20))
            .div_ceil(BLOCK_U64)
            .max(4);
        // One inode per 16 KiB by default, at least 64.
        let inode_count = inodes
            .unwrap_or(total_bytes / (16 << 10))
            .max(64)
            .div_ceil(INODES_PER_BLOCK as u64)
            * INODES_PER_BLOCK as u64;
        let itable_blocks = inode_count / INODES_PER_BLOCK as u64;
        let log_start = 2;
        let log_blocks = 1 + log_ring;
        let itable_start = log_start + log_blocks;
        let data_start = itable_start + itable_blocks;
        if data_start + 8 > total_blocks {
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

    fn validate(&self) -> Result<()> {
        let ok = self.log_start == 2
            && self.log_blocks >= 2
            && self.itable_start == self.log_start + self.log_blocks
            && self.itable_blocks * INODES_PER_BLOCK as u64 == self.inode_count
            && self.inode_count >= 1
            && self.data_start == self.itable_start + self.itable_blocks
            && self.data_start + self.data_blocks == self.total_blocks
            && self.data_blocks >= 1;
        if ok {
            Ok(())
        } else {
            Err(corrupt(format!(
                "superblock geometry is inconsistent: {self:?}"
            )))
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub generation: u64,
    pub clean: bool,
    pub uuid: [u8; 16],
    pub geo: Geometry,
    pub mkfs_time: i64,
    pub mount_count: u64,
}

impl Superblock {
    pub fn encode(&self) -> [u8; SB_SIZE] {
        let mut b = [0u8; SB_SIZE];
        b[0..8].copy_from_slice(MAGIC);
        put32(&mut b, 8, VERSION);
        put32(&mut b, 12, self.clean as u32);
        put64(&mut b, 16, self.generation);
        b[24..40].copy_from_slice(&self.uuid);
        put32(&mut b, 40, BLOCK as u32);
        put32(&mut b, 44, INODE_SIZE as u32);
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
            put64(&mut b, 48 + i * 8, v);
        }
        put64(&mut b, 112, self.mkfs_time as u64);
        put64(&mut b, 120, self.mount_count);
        let crc = crc32c::crc32c(&b[..SB_SIZE - 4]);
        put32(&mut b, SB_SIZE - 4, crc);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock> {
        if b.len() < SB_SIZE {
            return Err(corrupt("superblock truncated"));
        }
        if &b[0..8] != MAGIC {
            return Err(FsError::NotZcfs);
        }
        if crc32c::crc32c(&b[..SB_SIZE - 4]) != u32_at(b, SB_SIZE - 4) {
            return Err(corrupt("superblock checksum mismatch"));
        }
        let version = u32_at(b, 8);
        if version != VERSION {
            return Err(FsError::Unsupported(format!(
                "volume format version {version}, this build reads {VERSION}"
            )));
        }
        if u32_at(b, 40) as usize != BLOCK || u32_at(b, 44) as usize != INODE_SIZE {
            return Err(corrupt("superblock block or inode size is not 4096/128"));
        }
        let f = |i: usize| u64_at(b, 48 + i * 8);
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
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[24..40]);
        Ok(Superblock {
            generation: u64_at(b, 16),
            clean: u32_at(b, 12) & 1 == 1,
            uuid,
            geo,
            mkfs_time: u64_at(b, 112) as i64,
            mount_count: u64_at(b, 120),
        })
    }
}

/// Seconds + nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, serde::Serialize)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

impl Timespec {
    pub fn now() -> Timespec {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }
}

pub const S_IFMT: u32 = 0o170000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFLNK: u32 = 0o120000;
pub const S_IFIFO: u32 = 0o010000;
pub const S_IFSOCK: u32 = 0o140000;
pub const S_IFCHR: u32 = 0o020000;
pub const S_IFBLK: u32 = 0o060000;
pub const S_ISGID: u32 = 0o2000;

pub fn valid_file_type(mode: u32) -> bool {
    matches!(
        mode & S_IFMT,
        S_IFREG | S_IFDIR | S_IFLNK | S_IFIFO | S_IFSOCK | S_IFCHR | S_IFBLK
    )
}

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
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub rdev: u32,
    /// Parent directory (directories only; ".." and rename loop checks).
    pub parent: u64,
    pub map_root: u64,
    pub map_height: u8,
    pub xattr_block: u64,
}

impl InodeRec {
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
        put64(&mut b, 0, self.ino);
        put32(&mut b, 8, self.gen);
        put32(&mut b, 12, self.mode);
        put32(&mut b, 16, self.uid);
        put32(&mut b, 20, self.gid);
        put32(&mut b, 24, self.nlink);
        put32(&mut b, 28, self.flags);
        put64(&mut b, 32, self.size);
        put64(&mut b, 40, self.blocks);
        put64(&mut b, 48, self.atime.sec as u64);
        put64(&mut b, 56, self.mtime.sec as u64);
        put64(&mut b, 64, self.ctime.sec as u64);
        put32(&mut b, 72, self.atime.nsec);
        put32(&mut b, 76, self.mtime.nsec);
        put32(&mut b, 80, self.ctime.nsec);
        put32(&mut b, 84, self.rdev);
        put64(&mut b, 88, self.parent);
        put64(&mut b, 96, self.map_root);
        put64(&mut b, 104, self.xattr_block);
        b[112] = self.map_height;
        let crc = crc32c::crc32c(&b[..INODE_SIZE - 4]);
        put32(&mut b, INODE_SIZE - 4, crc);
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
        if crc32c::crc32c(&b[..INODE_SIZE - 4]) != u32_at(b, INODE_SIZE - 4) {
            return Err(corrupt("inode record checksum mismatch"));
        }
        let ts = |s: usize, n: usize| Timespec {
            sec: u64_at(b, s) as i64,
            nsec: u32_at(b, n),
        };
        let r = InodeRec {
            ino: u64_at(b, 0),
            gen: u32_at(b, 8),
            mode: u32_at(b, 12),
            uid: u32_at(b, 16),
            gid: u32_at(b, 20),
            nlink: u32_at(b, 24),
            flags: u32_at(b, 28),
            size: u64_at(b, 32),
            blocks: u64_at(b, 40),
            atime: ts(48, 72),
            mtime: ts(56, 76),
            ctime: ts(64, 80),
            rdev: u32_at(b, 84),
            parent: u64_at(b, 88),
            map_root: u64_at(b, 96),
            xattr_block: u64_at(b, 104),
            map_height: b[112],
        };
        if r.ino != 0 && !valid_file_type(r.mode) {
            return Err(corrupt(format!(
                "inode {} has invalid mode {:o}",
                r.ino, r.mode
            )));
        }
        if r.map_height > 6 {
            return Err(corrupt(format!(
                "inode {} map height {} > 6",
                r.ino, r.map_height
            )));
        }
        Ok(r)
    }
}

/// File-type code stored in directory entries (DT_* values).
pub fn dtype_of(mode: u32) -> u8 {
    ((mode & S_IFMT) >> 12) as u8
}

/// A directory entry as stored in a directory block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirent {
    pub ino: u64,
    pub dtype: u8,
    pub name: Vec<u8>,
}

pub fn dirent_units(name_len: usize) -> usize {
    (DIRENT_HDR + name_len).div_ceil(DIRENT_UNIT)
}

impl Dirent {
    pub fn encode(&self) -> Vec<u8> {
        let units = dirent_units(self.name.len());
        let mut b = vec![0u8; units * DIRENT_UNIT];
        put64(&mut b, 0, self.ino);
        put16(&mut b, 8, self.name.len() as u16);
        b[10] = self.dtype;
        b[11] = units as u8;
        b[DIRENT_HDR..DIRENT_HDR + self.name.len()].copy_from_slice(&self.name);
        let crc = dirent_crc(&b, self.name.len());
        put32(&mut b, 12, crc);
        b
    }

    /// Decode the entry starting at `unit` of a directory block. Ok(None) = free unit.
    pub fn decode_at(block: &[u8], unit: usize) -> Result<Option<(Dirent, usize)>> {
        let o = unit * DIRENT_UNIT;
        let b = &block[o..];
        let ino = u64_at(b, 0);
        if ino == 0 {
            return Ok(None);
        }
        let name_len = u16_at(b, 8) as usize;
        let units = b[11] as usize;
        if name_len == 0
            || name_len > NAME_MAX
            || units != dirent_units(name_len)
            || unit + units > UNITS_PER_BLOCK
        {
            return Err(corrupt(format!(
                "directory entry at unit {unit} has bad length"
            )));
        }
        if dirent_crc(b, name_len) != u32_at(b, 12) {
            return Err(corrupt(format!(
                "directory entry at unit {unit} checksum mismatch"
            )));
        }
        let name = b[DIRENT_HDR..DIRENT_HDR + name_len].to_vec();
        check_name(&name).map_err(|_| {
            corrupt(format!(
                "directory entry at unit {unit} has an invalid name"
            ))
        })?;
        Ok(Some((
            Dirent {
                ino,
                dtype: b[10],
                name,
            },
            units,
        )))
    }
}

fn dirent_crc(b: &[u8], name_len: usize) -> u32 {
    let c = crc32c::crc32c(&b[0..12]);
    crc32c::crc32c_append(c, &b[DIRENT_HDR..DIRENT_HDR + name_len])
}

/// Names: 1..=255 bytes, no '/', no NUL, not "." or "..".
pub fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.iter().any(|&c| c == b'/' || c == 0)
    {
        return Err(FsError::Invalid(format!(
            "invalid name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

/// Operation types recorded in log entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[repr(u16)]
pub enum OpType {
    Pad = 0,
    Create = 1,
    Mkdir = 2,
    Symlink = 3,
    Link = 4,
    Unlink = 5,
    Rmdir = 6,
    Rename = 7,
    Write = 8,
    Truncate = 9,
    SetAttr = 10,
    SetXattr = 11,
    RemoveXattr = 12,
    PunchHole = 13,
    PflushCommit = 14,
    Repair = 15,
}

impl OpType {
    pub fn from_u16(v: u16) -> Option<OpType> {
        use OpType::*;
        Some(match v {
            0 => Pad,
            1 => Create,
            2 => Mkdir,
            3 => Symlink,
            4 => Link,
            5 => Unlink,
            6 => Rmdir,
            7 => Rename,
            8 => Write,
            9 => Truncate,
            10 => SetAttr,
            11 => SetXattr,
            12 => RemoveXattr,
            13 => PunchHole,
            14 => PflushCommit,
            15 => Repair,
            _ => return None,
        })
    }
}

/// A redo record: the new contents of a metadata range (or zeros).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecData {
    Bytes(Vec<u8>),
    Zero(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub addr: u64,
    pub data: RecData,
}

impl Record {
    pub fn len(&self) -> usize {
        match &self.data {
            RecData::Bytes(b) => b.len(),
            RecData::Zero(n) => *n as usize,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn encoded_len(&self) -> usize {
        REC_HDR
            + match &self.data {
                RecData::Bytes(b) => b.len().div_ceil(8) * 8,
                RecData::Zero(_) => 0,
            }
    }
}

/// A log entry: one operation, all of its metadata changes.
///
/// Header (64 bytes): magic u32 @0, op u16 @4, reserved u16 @6, length u32 @8 (a multiple
/// of 64, header included), CRC32C u32 @12 (of the whole entry with this field zero;
/// of the header only for padding), sequence u64 @16, LSN u64 @24, inode u64 @32, record
/// count u32 @40, reserved u32 @44, data address u64 @48, data size u64 @56. Then the
/// records, each a 16-byte header (address u64, length u32, kind u16: 1 bytes, 2 zeros)
/// and, for bytes, the payload padded to 8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub op: OpType,
    pub seq: u64,
    pub lsn: u64,
    pub ino: u64,
    /// Data blocks the operation wrote (first block's byte address) and byte count.
    pub data_addr: u64,
    pub data_size: u64,
    pub records: Vec<Record>,
}

impl LogEntry {
    pub fn encoded_len(&self) -> usize {
        let body: usize = self.records.iter().map(Record::encoded_len).sum();
        (LOG_HDR + body).div_ceil(64) * 64
    }

    pub fn encode(&self) -> Vec<u8> {
        let len = self.encoded_len();
        let mut b = vec![0u8; len];
        let nrec = u32::try_from(self.records.len()).expect("an entry holds < 2^32 records");
        let len32 = u32::try_from(len).expect("an entry is < 4 GiB (bounded by the ring)");
        put32(&mut b, 0, LOG_ENTRY_MAGIC);
        put16(&mut b, 4, self.op as u16);
        put32(&mut b, 8, len32);
        put64(&mut b, 16, self.seq);
        put64(&mut b, 24, self.lsn);
        put64(&mut b, 32, self.ino);
        put32(&mut b, 40, nrec);
        put64(&mut b, 48, self.data_addr);
        put64(&mut b, 56, self.data_size);
        let mut o = LOG_HDR;
        for r in &self.records {
            put64(&mut b, o, r.addr);
            put32(&mut b, o + 8, r.len() as u32);
            match &r.data {
                RecData::Bytes(d) => {
                    put16(&mut b, o + 12, 1);
                    b[o + REC_HDR..o + REC_HDR + d.len()].copy_from_slice(d);
                }
                RecData::Zero(_) => put16(&mut b, o + 12, 2),
            }
            o += r.encoded_len();
        }
        let crc = crc32c::crc32c(&b);
        put32(&mut b, 12, crc);
        b
    }

    /// A padding entry that fills the ring up to its end (entries never wrap).
    /// Its checksum covers the 64-byte header only.
    pub fn encode_pad(seq: u64, lsn: u64, len: u32) -> [u8; LOG_HDR] {
        let mut b = [0u8; LOG_HDR];
        put32(&mut b, 0, LOG_ENTRY_MAGIC);
        put16(&mut b, 4, OpType::Pad as u16);
        put32(&mut b, 8, len);
        put64(&mut b, 16, seq);
        put64(&mut b, 24, lsn);
        let crc = crc32c::crc32c(&b);
        put32(&mut b, 12, crc);
        b
    }

    /// Length field of a header, for stepping through the ring before full decoding.
    pub fn peek_len(b: &[u8]) -> Option<usize> {
        if b.len() < LOG_HDR || u32_at(b, 0) != LOG_ENTRY_MAGIC {
            return None;
        }
        Some(u32_at(b, 8) as usize)
    }

    /// Decode and verify an entry; `region_len` bounds record addresses.
    pub fn decode(b: &[u8], region_len: u64) -> Result<LogEntry> {
        let len = Self::peek_len(b).ok_or_else(|| corrupt("log entry: bad magic"))?;
        if len < LOG_HDR || len % 64 != 0 || len > b.len() {
            return Err(corrupt(format!("log entry: bad length {len}")));
        }
        let b = &b[..len];
        let op = OpType::from_u16(u16_at(b, 4)).ok_or_else(|| corrupt("log entry: unknown op"))?;
        let covered = if op == OpType::Pad { LOG_HDR } else { len };
        let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..12]), &[0u8; 4]);
        let crc = crc32c::crc32c_append(crc, &b[16..covered]);
        if crc != u32_at(b, 12) {
            return Err(corrupt("log entry: checksum mismatch"));
        }
        let nrec = u32_at(b, 40) as usize;
        if u16_at(b, 6) != 0 || u32_at(b, 44) != 0 {
            return Err(corrupt("log entry: reserved header bytes are not zero"));
        }
        if op == OpType::Pad && nrec != 0 {
            return Err(corrupt("log entry: padding with records"));
        }
        let mut records = Vec::with_capacity(nrec.min(len / REC_HDR));
        let mut o = LOG_HDR;
        for _ in 0..nrec {
            if o + REC_HDR > len {
                return Err(corrupt("log entry: record header past end"));
            }
            let addr = u64_at(b, o);
            let rlen = u32_at(b, o + 8) as usize;
            let kind = u16_at(b, o + 12);
            if addr.checked_add(rlen as u64).is_none_or(|e| e > region_len) {
                return Err(corrupt("log entry: record outside the volume"));
            }
            let data = match kind {
                1 => {
                    let padded = rlen.div_ceil(8) * 8;
                    if o + REC_HDR + padded > len {
                        return Err(corrupt("log entry: record payload past end"));
                    }
                    let d = b[o + REC_HDR..o + REC_HDR + rlen].to_vec();
                    o += REC_HDR + padded;
                    RecData::Bytes(d)
                }
                2 => {
                    o += REC_HDR;
                    RecData::Zero(rlen as u32)
                }
                _ => return Err(corrupt("log entry: unknown record kind")),
            };
            records.push(Record { addr, data });
        }
        // The records must fill the entry: a count that does not match its records is
        // an entry that would be applied only in part.
        if op != OpType::Pad && o.div_ceil(64) * 64 != len {
            return Err(corrupt(format!(
                "log entry: {nrec} records end at byte {o} of a {len}-byte entry"
            )));
        }
        Ok(LogEntry {
            op,
            seq: u64_at(b, 16),
            lsn: u64_at(b, 24),
            ino: u64_at(b, 32),
            data_addr: u64_at(b, 48),
            data_size: u64_at(b, 56),
            records,
        })
    }
}

/// Extended attributes of one inode, serialized into one block.
pub fn encode_xattrs(x: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>) -> Result<Vec<u8>> {
    let mut b = vec![0u8; XATTR_HDR];
    for (k, v) in x {
        b.push(k.len() as u8);
        b.push(0);
        b.extend_from_slice(&(v.len() as u16).to_le_bytes());
        b.extend_from_slice(k);
        b.extend_from_slice(v);
    }
    if b.len() > BLOCK {
        return Err(FsError::NoSpaceXattr);
    }
    let used = b.len() as u32;
    put32(&mut b, 0, XATTR_MAGIC);
    put32(&mut b, 4, x.len() as u32);
    put32(&mut b, 8, used);
    let crc = crc32c::crc32c(&b[XATTR_HDR..]);
    put32(&mut b, 12, crc);
    Ok(b)
}

pub fn xattrs_size(x: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>) -> usize {
    XATTR_HDR + x.iter().map(|(k, v)| 4 + k.len() + v.len()).sum::<usize>()
}

pub fn decode_xattrs(b: &[u8]) -> Result<std::collections::BTreeMap<Vec<u8>, Vec<u8>>> {
    if b.len() < XATTR_HDR || u32_at(b, 0) != XATTR_MAGIC {
        return Err(corrupt("xattr block: bad magic"));
    }
    let count = u32_at(b, 4) as usize;
    let used = u32_at(b, 8) as usize;
    if used < XATTR_HDR || used > b.len() {
        return Err(corrupt("xattr block: bad length"));
    }
    if crc32c::crc32c(&b[XATTR_HDR..used]) != u32_at(b, 12) {
        return Err(corrupt("xattr block: checksum mismatch"));
    }
    let mut out = std::collections::BTreeMap::new();
    let mut o = XATTR_HDR;
    for _ in 0..count {
        if o + 4 > used {
            return Err(corrupt("xattr block: entry past end"));
        }
        let kl = b[o] as usize;
        let vl = u16_at(b, o + 2) as usize;
        o += 4;
        if kl == 0 || o + kl + vl > used {
            return Err(corrupt("xattr block: entry past end"));
        }
        out.insert(b[o..o + kl].to_vec(), b[o + kl..o + kl + vl].to_vec());
        o += kl + vl;
    }
    if o != used {
        return Err(corrupt("xattr block: trailing bytes"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trip_and_corruption() {
        let sb = Superblock {
            generation: 7,
            clean: true,
            uuid: [3; 16],
            geo: Geometry::plan(64 << 20, None, None).unwrap(),
            mkfs_time: 123,
            mount_count: 2,
        };
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

    #[test]
    fn inode_round_trip() {
        let r = InodeRec {
            ino: 5,
            gen: 2,
            mode: S_IFREG | 0o644,
            uid: 1000,
            gid: 100,
            nlink: 1,
            size: 12345,
            blocks: 4,
            mtime: Timespec {
                sec: -5,
                nsec: 999_999_999,
            },
            map_root: 99,
            map_height: 2,
            ..Default::default()
        };
        assert_eq!(InodeRec::decode(&r.encode()).unwrap(), r);
        let mut b = r.encode();
        b[33] ^= 0x10;
        assert!(InodeRec::decode(&b).is_err());
        assert_eq!(InodeRec::decode(&[0u8; 128]).unwrap().ino, 0);
    }

    #[test]
    fn dirent_round_trip_and_limits() {
        let d = Dirent {
            ino: 9,
            dtype: 8,
            name: vec![b'a'; 255],
        };
        let enc = d.encode();
        assert_eq!(enc.len(), 9 * DIRENT_UNIT);
        let mut block = vec![0u8; BLOCK];
        block[32..32 + enc.len()].copy_from_slice(&enc);
        let (got, units) = Dirent::decode_at(&block, 1).unwrap().unwrap();
        assert_eq!((got, units), (d, 9));
        assert!(Dirent::decode_at(&block, 0).unwrap().is_none());
        block[40] ^= 1; // name_len
        assert!(Dirent::decode_at(&block, 1).is_err());
        assert!(
            check_name(b"..").is_err()
                && check_name(b"a/b").is_err()
                && check_name(&[b'x'; 256]).is_err()
        );
    }

    #[test]
    fn log_entry_round_trip_and_torn() {
        let e = LogEntry {
            op: OpType::Rename,
            seq: 3,
            lsn: 4096,
            ino: 7,
            data_addr: 0,
            data_size: 0,
            records: vec![
                Record {
                    addr: 100,
                    data: RecData::Bytes(vec![1, 2, 3]),
                },
                Record {
                    addr: 200,
                    data: RecData::Zero(64),
                },
            ],
        };
        let b = e.encode();
        assert_eq!(b.len() % 64, 0);
        assert_eq!(LogEntry::decode(&b, 1 << 20).unwrap(), e);
        for i in [0usize, 5, 20, 70, b.len() - 1] {
            let mut t = b.clone();
            t[i] ^= 0x40;
            assert!(
                LogEntry::decode(&t, 1 << 20).is_err(),
                "flip at {i} accepted"
            );
        }
        assert!(
            LogEntry::decode(&b, 150).is_err(),
            "record outside volume accepted"
        );
    }

    #[test]
    fn seventy_thousand_records_round_trip_and_a_wrong_count_is_refused() {
        let records: Vec<Record> = (0..70_000u64)
            .map(|i| Record {
                addr: 4096 + i * 64,
                data: if i % 2 == 0 {
                    RecData::Zero(8)
                } else {
                    RecData::Bytes(i.to_le_bytes().to_vec())
                },
            })
            .collect();
        let e = LogEntry {
            op: OpType::Truncate,
            seq: 1,
            lsn: 0,
            ino: 9,
            data_addr: 0,
            data_size: 0,
            records,
        };
        let b = e.encode();
        let d = LogEntry::decode(&b, 1 << 32).unwrap();
        assert_eq!(d.records.len(), 70_000);
        assert_eq!(d, e);
        // A record count that leaves records unparsed (as a 16-bit clamp did) is corrupt.
        let mut t = b.clone();
        t[40..44].copy_from_slice(&(70_000u32 - 65_536).to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&t[..12]), &[0u8; 4]);
        let crc = crc32c::crc32c_append(crc, &t[16..]);
        t[12..16].copy_from_slice(&crc.to_le_bytes());
        let err = LogEntry::decode(&t, 1 << 32).unwrap_err().to_string();
        assert!(err.contains("records end at byte"), "{err}");
    }

    #[test]
    fn xattr_round_trip() {
        let mut x = std::collections::BTreeMap::new();
        x.insert(b"user.a".to_vec(), b"1".to_vec());
        x.insert(b"user.empty".to_vec(), vec![]);
        let b = encode_xattrs(&x).unwrap();
        assert_eq!(b.len(), xattrs_size(&x));
        assert_eq!(decode_xattrs(&b).unwrap(), x);
        x.insert(b"user.big".to_vec(), vec![0; 5000]);
        assert!(encode_xattrs(&x).is_err());
    }

    #[test]
    fn geometry_plans_and_rejects() {
        let g = Geometry::plan(1 << 30, None, None).unwrap();
        assert_eq!(g.data_start + g.data_blocks, g.total_blocks);
        assert!(Geometry::plan(4096 * 10, None, None).is_err());
    }
}
