//! On-PM byte layout, one file per record: superblock, inode record, directory entry,
//! log entry, xattr block, and the volume's geometry. Little-endian throughout; see
//! docs/format.md. Every field's place is a named range derived from the end of the
//! field before it (`fields!`), so a field cannot silently overlap another, and each
//! record's size is checked at compile time. Every decoder validates and returns
//! `Corrupt` on bad input; none panics.

mod dirent;
mod geometry;
mod inode;
mod log;
mod superblock;
mod xattr;

pub use dirent::{check_name, dirent_units, Dirent};
pub use geometry::Geometry;
pub use inode::InodeRec;
pub use log::{LogEntry, OpType, RecData, Record};
pub use superblock::Superblock;
pub use xattr::{
    decode_xattr_head, decode_xattr_stream, decode_xattrs, encode_xattr_set, encode_xattrs,
    xattr_set_cost, xattrs_size, EncodedXattrs, XattrHead, XATTR_ENTRY_COST, XATTR_LIST_MAX,
    XATTR_MAX_DATA_BLOCKS, XATTR_NAME_MAX, XATTR_SET_MAX, XATTR_SIZE_MAX,
};

use crate::error::FsError;

pub const BLOCK: usize = 4096;
pub const BLOCK_U64: u64 = BLOCK as u64;
pub const MAGIC: &[u8; 8] = b"ZCFSVOL1";
/// On-PM format version. 2: log entries count records in 32 bits (version 1 clamped the
/// count to 16 bits). 3: the inode record's copy-on-write reserve (fallocate) and the
/// fallocate log entry. 4: an inode's xattrs may span blocks (the xattr index block,
/// `ZXAI`, listing the blocks of the encoded set; values up to 64 KiB).
pub const VERSION: u32 = 4;
/// Oldest version this build opens. A version 2 image reads as version 3 with no
/// reserves (the field was zero), a version 3 image as version 4 whose xattr sets all
/// have the single-block form; its superblock is rewritten as the current version at
/// the first read-write open, after which older builds refuse it by version.
pub const OLDEST_VERSION: u32 = 2;
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
/// Magic of an xattr index block (format version 4).
pub const XATTR_INDEX_MAGIC: u32 = 0x4941_585a; // "ZXAI"

const _: () = assert!(INODE_SIZE * INODES_PER_BLOCK == BLOCK);
const _: () = assert!(PTRS_PER_NODE == 1 << NODE_SHIFT);
const _: () = assert!(UNITS_PER_BLOCK == 128, "dir block free map is one u128");
const _: () = assert!(DIRENT_HDR + NAME_MAX <= 9 * DIRENT_UNIT);
const _: () = assert!(SB_SIZE <= BLOCK && LOG_HDR.is_multiple_of(64));

/// Named, contiguous field ranges of a record: each starts where the previous ends.
macro_rules! fields {
    ($($(#[$doc:meta])* $name:ident: $len:expr),* $(,)?) => {
        fields!(@ 0usize; $($(#[$doc])* $name: $len),*);
    };
    (@ $off:expr; $(#[$doc:meta])* $name:ident: $len:expr $(, $(#[$rdoc:meta])* $rest:ident: $rlen:expr)*) => {
        $(#[$doc])*
        #[allow(dead_code)] // reserved fields are named for the layout, not read
        pub(crate) const $name: std::ops::Range<usize> = $off..$off + $len;
        fields!(@ $off + $len; $($(#[$rdoc])* $rest: $rlen),*);
    };
    (@ $off:expr;) => {};
}
pub(crate) use fields;

pub(crate) fn corrupt(what: impl Into<String>) -> FsError {
    FsError::Corrupt(what.into())
}

pub(crate) fn u16_at(b: &[u8], f: std::ops::Range<usize>) -> u16 {
    u16::from_le_bytes(b[f].try_into().expect("a 2-byte field"))
}
pub(crate) fn u32_at(b: &[u8], f: std::ops::Range<usize>) -> u32 {
    u32::from_le_bytes(b[f].try_into().expect("a 4-byte field"))
}
pub(crate) fn u64_at(b: &[u8], f: std::ops::Range<usize>) -> u64 {
    u64::from_le_bytes(b[f].try_into().expect("an 8-byte field"))
}
pub(crate) fn put16(b: &mut [u8], f: std::ops::Range<usize>, v: u16) {
    b[f].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put32(b: &mut [u8], f: std::ops::Range<usize>, v: u32) {
    b[f].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put64(b: &mut [u8], f: std::ops::Range<usize>, v: u64) {
    b[f].copy_from_slice(&v.to_le_bytes());
}

/// A field range moved to start at `base` (a record inside a larger buffer).
pub(crate) fn at(base: usize, f: std::ops::Range<usize>) -> std::ops::Range<usize> {
    base + f.start..base + f.end
}

pub use zcfs_types::Time;

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

/// File-type code stored in directory entries (DT_* values).
pub fn dtype_of(mode: u32) -> u8 {
    ((mode & S_IFMT) >> 12) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Every record encodes exactly as before the layout moved to named fields (bytes
    /// captured from the earlier encoder): the format did not change by accident.
    #[test]
    fn records_encode_to_the_captured_bytes() {
        let golden: std::collections::HashMap<&str, &str> = include_str!("golden.txt")
            .lines()
            .filter_map(|l| l.split_once(' '))
            .collect();
        let sb = Superblock::sample();
        let ino = InodeRec::sample();
        let d = Dirent {
            ino: 9,
            dtype: 8,
            name: b"hello".to_vec(),
        };
        let e = LogEntry::sample(8192, 100);
        let mut x = std::collections::BTreeMap::new();
        x.insert(b"user.a".to_vec(), b"1".to_vec());
        assert_eq!(hex(&sb.encode()), golden["SB"]);
        assert_eq!(hex(&ino.encode()), golden["INO"]);
        assert_eq!(hex(&d.encode()), golden["DIRENT"]);
        assert_eq!(hex(&e.encode()), golden["LOG"]);
        assert_eq!(hex(&LogEntry::encode_pad(9, 128, 4096)), golden["PAD"]);
        assert_eq!(hex(&encode_xattrs(&x).unwrap()), golden["XATTR"]);
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        assert_eq!(InodeRec::decode(&ino.encode()).unwrap(), ino);
        assert_eq!(LogEntry::decode(&e.encode(), 1 << 20).unwrap(), e);
        // Version 3 added the copy-on-write reserve in bytes that were zero: a
        // version 2 superblock still opens, and a record without a reserve encodes
        // exactly as in version 2 (the INO bytes above).
        let v2 = unhex(golden["SB_V2"]);
        assert_eq!(u32_at(&v2, 8..12), 2);
        assert_eq!(Superblock::decode(&v2).unwrap(), sb);
        // Version 4 added the xattr index block; a version 3 superblock still opens and
        // its single-block xattr sets decode as before (the XATTR bytes above).
        let v3 = unhex(golden["SB_V3"]);
        assert_eq!(u32_at(&v3, 8..12), 3);
        assert_eq!(Superblock::decode(&v3).unwrap(), sb);
        let mut block = unhex(golden["XATTR"]);
        block.resize(BLOCK, 0xee);
        assert_eq!(
            decode_xattr_head(&block).unwrap(),
            XattrHead::Single(x.clone())
        );
        // The index form (version 4): a set too large for one block, its stream in
        // blocks 300..=302 listed by the index.
        let big: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = (0..3u8)
            .map(|i| (vec![b'u', b'.', b'a' + i], vec![i; 4000]))
            .collect();
        let enc = encode_xattr_set(&big).unwrap();
        let EncodedXattrs::Stream { ref padded, .. } = enc else {
            panic!("three 4000-byte values take the index form");
        };
        assert_eq!(hex(&padded[..16]), golden["XATTR_STREAM_HEAD"]);
        let index = enc.index_block(&[300, 301, 302]);
        assert_eq!(hex(&index), golden["XATTR_INDEX"]);
        let mut block = index.clone();
        block.resize(BLOCK, 0xee);
        let XattrHead::Index {
            count,
            used,
            crc,
            blocks,
        } = decode_xattr_head(&block).unwrap()
        else {
            panic!("an index block");
        };
        assert_eq!(blocks, [300, 301, 302]);
        assert_eq!(decode_xattr_stream(padded, count, used, crc).unwrap(), big);
        let with_reserve = InodeRec {
            cow_reserve: 0x0102_0304_0506_0708,
            ..ino
        };
        let b = with_reserve.encode();
        assert_eq!(u64_at(&b, 116..124), 0x0102_0304_0506_0708); // docs/format.md
        assert_eq!(InodeRec::decode(&b).unwrap(), with_reserve);
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// A version this build does not read is refused with a clear error.
    #[test]
    fn other_versions_are_refused_by_number() {
        for v in [OLDEST_VERSION - 1, VERSION + 1] {
            let mut b = Superblock::sample().encode();
            put32(&mut b, 8..12, v); // the version field (docs/format.md)
            let crc = crc32c::crc32c(&b[..508]);
            put32(&mut b, 508..512, crc);
            let e = Superblock::decode(&b).unwrap_err().to_string();
            assert!(e.contains(&format!("version {v}")), "{e}");
        }
    }
}

/// The records the tests encode (the golden bytes were captured from these).
#[cfg(test)]
mod samples {
    use super::*;

    impl Superblock {
        pub(crate) fn sample() -> Superblock {
            Superblock {
                generation: 7,
                clean: true,
                uuid: [3; 16],
                geo: Geometry::plan(64 << 20, None, None).unwrap(),
                mkfs_time: 123,
                mount_count: 2,
            }
        }
    }

    impl InodeRec {
        pub(crate) fn sample() -> InodeRec {
            InodeRec {
                ino: 5,
                gen: 2,
                mode: S_IFREG | 0o644,
                uid: 1000,
                gid: 100,
                nlink: 1,
                flags: 0,
                size: 12345,
                blocks: 4,
                atime: Time { sec: 1, nsec: 2 },
                mtime: Time {
                    sec: -5,
                    nsec: 999_999_999,
                },
                ctime: Time { sec: 3, nsec: 4 },
                rdev: 9,
                parent: 77,
                map_root: 99,
                map_height: 2,
                xattr_block: 55,
                cow_reserve: 0,
            }
        }
    }

    impl LogEntry {
        /// With the data range `data_addr`/`data_size`.
        pub(crate) fn sample(data_addr: u64, data_size: u64) -> LogEntry {
            LogEntry {
                op: OpType::Rename,
                seq: 3,
                lsn: 4096,
                ino: 7,
                data_addr,
                data_size,
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
            }
        }
    }
}
