//! An inode's extended attributes, replaced copy-on-write as a whole on every change.
//! The inode's `xattr_block` names the head block, in one of two forms:
//!
//! - **single** (`ZXAT`, every format version): a set that fits one block, with the
//!   attributes in it (4-byte entry headers, values below 64 KiB);
//! - **index** (`ZXAI`, format version 4): a larger set, encoded as a stream of entries
//!   with 8-byte headers (values up to `XATTR_SIZE_MAX`), spread over up to
//!   `XATTR_MAX_DATA_BLOCKS` data blocks that the index block lists in order.
//!
//! Writers use the single form whenever the set fits it, so small sets keep costing one
//! block and encode exactly as in version 3.

use super::*;
use crate::error::{FsError, Result};
use std::collections::BTreeMap;

/// Longest xattr name (Linux XATTR_NAME_MAX).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest xattr value (Linux XATTR_SIZE_MAX): larger is E2BIG.
pub const XATTR_SIZE_MAX: usize = 64 << 10;
/// Largest listxattr answer (Linux XATTR_LIST_MAX): names and their NULs. A longer list
/// is E2BIG, as the kernel answers it.
pub const XATTR_LIST_MAX: usize = 64 << 10;
/// Bytes an attribute costs in the encoded set besides its name and value.
pub const XATTR_ENTRY_COST: usize = XS_HDR;
/// Most bytes of one inode's encoded xattr set (the sum of `XATTR_ENTRY_COST` + name +
/// value over its attributes): 1 MiB, so sixteen 64 KiB values less their names fit, or
/// thousands of small attributes. A set larger than this is ENOSPC.
pub const XATTR_SET_MAX: usize = 1 << 20;
/// Most data blocks an index block lists.
pub const XATTR_MAX_DATA_BLOCKS: usize = XATTR_SET_MAX / BLOCK;

fields! {
    X_MAGIC: 4,
    X_COUNT: 4,
    /// Bytes used, header included.
    X_USED: 4,
    /// CRC32C of the bytes after the header, up to `used`.
    X_CRC: 4,
}
const _: () = assert!(X_CRC.end == XATTR_HDR);

fields! {
    XE_KEY_LEN: 1,
    XE_PAD: 1,
    XE_VALUE_LEN: 2,
}
/// Bytes of a single-form entry's header.
const XE_HDR: usize = XE_VALUE_LEN.end;

fields! {
    XI_MAGIC: 4,
    /// Attributes in the stream.
    XI_COUNT: 4,
    /// Bytes of the stream (the last data block is zero past them).
    XI_USED: 4,
    /// Data blocks listed (`used` rounded up to blocks).
    XI_BLOCKS: 4,
    /// CRC32C of the stream's `used` bytes.
    XI_DATA_CRC: 4,
    XI_RESERVED: 8,
    /// CRC32C of the header before it, then of the listed block numbers.
    XI_CRC: 4,
}
/// Bytes of the index block's header; the block numbers (8 bytes each) follow.
pub const XATTR_INDEX_HDR: usize = XI_CRC.end;
const _: () = assert!(XATTR_INDEX_HDR.is_multiple_of(8));
const _: () = assert!(XATTR_INDEX_HDR + 8 * XATTR_MAX_DATA_BLOCKS <= BLOCK);
const _: () = assert!(XATTR_SET_MAX.is_multiple_of(BLOCK));

fields! {
    XS_KEY_LEN: 1,
    XS_PAD: 3,
    XS_VALUE_LEN: 4,
}
/// Bytes of a stream entry's header.
const XS_HDR: usize = XS_VALUE_LEN.end;

/// The bytes an xattr set costs against `XATTR_SET_MAX`.
pub fn xattr_set_cost(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> usize {
    x.iter()
        .map(|(k, v)| XATTR_ENTRY_COST + k.len() + v.len())
        .sum()
}

/// Bytes of the single form of `x` (fits when at most a block).
pub fn xattrs_size(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> usize {
    XATTR_HDR
        + x.iter()
            .map(|(k, v)| XE_HDR + k.len() + v.len())
            .sum::<usize>()
}

/// An xattr set encoded for PM: one block, or data blocks for an index to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodedXattrs {
    /// The single form: this block is the whole set.
    Single(Vec<u8>),
    /// The index form: the stream, zero-padded to whole blocks, to be written into
    /// `data_blocks()` blocks and listed by `index_block`.
    Stream {
        count: u32,
        used: u32,
        crc: u32,
        padded: Vec<u8>,
    },
}

impl EncodedXattrs {
    /// Blocks the set takes on PM (the index block included).
    pub fn blocks(&self) -> u64 {
        match self {
            EncodedXattrs::Single(_) => 1,
            EncodedXattrs::Stream { .. } => 1 + self.data_blocks() as u64,
        }
    }

    /// Data blocks of the index form (0 for the single form).
    pub fn data_blocks(&self) -> usize {
        match self {
            EncodedXattrs::Single(_) => 0,
            EncodedXattrs::Stream { padded, .. } => padded.len() / BLOCK,
        }
    }

    /// The index block listing `data` (the blocks the stream was written to, in order).
    pub fn index_block(&self, data: &[u64]) -> Vec<u8> {
        let EncodedXattrs::Stream {
            count, used, crc, ..
        } = self
        else {
            panic!("index_block of a single-form set");
        };
        assert_eq!(data.len(), self.data_blocks(), "one block per stream block");
        let mut b = vec![0u8; XATTR_INDEX_HDR + 8 * data.len()];
        put32(&mut b, XI_MAGIC, XATTR_INDEX_MAGIC);
        put32(&mut b, XI_COUNT, *count);
        put32(&mut b, XI_USED, *used);
        put32(&mut b, XI_BLOCKS, data.len() as u32);
        put32(&mut b, XI_DATA_CRC, *crc);
        for (i, &p) in data.iter().enumerate() {
            let o = XATTR_INDEX_HDR + 8 * i;
            put64(&mut b, o..o + 8, p);
        }
        let crc = index_crc(&b);
        put32(&mut b, XI_CRC, crc);
        b
    }
}

fn index_crc(b: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&b[..XI_CRC.start]), &b[XATTR_INDEX_HDR..])
}

/// Encode an xattr set: the single form when it fits a block, else the index form.
/// The caller has checked names and values; a set costing more than `XATTR_SET_MAX` is
/// `NoSpaceXattr`.
pub fn encode_xattr_set(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<EncodedXattrs> {
    if xattrs_size(x) <= BLOCK {
        return encode_xattrs(x).map(EncodedXattrs::Single);
    }
    let cost = xattr_set_cost(x);
    if cost > XATTR_SET_MAX {
        return Err(FsError::NoSpaceXattr);
    }
    let mut s = Vec::with_capacity(cost.next_multiple_of(BLOCK));
    for (k, v) in x {
        let mut h = [0u8; XS_HDR];
        h[XS_KEY_LEN.start] = k.len() as u8;
        put32(&mut h, XS_VALUE_LEN, v.len() as u32);
        s.extend_from_slice(&h);
        s.extend_from_slice(k);
        s.extend_from_slice(v);
    }
    let used = s.len();
    let crc = crc32c::crc32c(&s);
    s.resize(used.next_multiple_of(BLOCK), 0);
    Ok(EncodedXattrs::Stream {
        count: x.len() as u32,
        used: used as u32,
        crc,
        padded: s,
    })
}

/// Extended attributes of one inode, serialized into one block (the single form).
pub fn encode_xattrs(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<Vec<u8>> {
    if xattrs_size(x) > BLOCK {
        return Err(FsError::NoSpaceXattr);
    }
    let mut b = vec![0u8; XATTR_HDR];
    for (k, v) in x {
        b.push(k.len() as u8);
        b.push(0);
        b.extend_from_slice(&(v.len() as u16).to_le_bytes());
        b.extend_from_slice(k);
        b.extend_from_slice(v);
    }
    let used = b.len() as u32;
    put32(&mut b, X_MAGIC, XATTR_MAGIC);
    put32(&mut b, X_COUNT, x.len() as u32);
    put32(&mut b, X_USED, used);
    let crc = crc32c::crc32c(&b[XATTR_HDR..]);
    put32(&mut b, X_CRC, crc);
    Ok(b)
}

/// What an inode's xattr head block says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XattrHead {
    /// The single form: the whole set.
    Single(BTreeMap<Vec<u8>, Vec<u8>>),
    /// The index form: the data blocks to read, in order (distinct, nonzero; the
    /// caller checks they lie in the data area and are not owned twice).
    Index {
        count: u32,
        used: u32,
        crc: u32,
        blocks: Vec<u64>,
    },
}

/// Decode an inode's xattr head block (either form).
pub fn decode_xattr_head(b: &[u8]) -> Result<XattrHead> {
    if b.len() < BLOCK {
        return Err(corrupt("xattr block truncated"));
    }
    match u32_at(b, X_MAGIC) {
        XATTR_MAGIC => decode_xattrs(b).map(XattrHead::Single),
        XATTR_INDEX_MAGIC => decode_index(b),
        _ => Err(corrupt("xattr block: bad magic")),
    }
}

fn decode_index(b: &[u8]) -> Result<XattrHead> {
    let n = u32_at(b, XI_BLOCKS) as usize;
    if n == 0 || n > XATTR_MAX_DATA_BLOCKS {
        return Err(corrupt(format!(
            "xattr index lists {n} blocks (1 to {XATTR_MAX_DATA_BLOCKS})"
        )));
    }
    let end = XATTR_INDEX_HDR + 8 * n;
    if index_crc(&b[..end]) != u32_at(b, XI_CRC) {
        return Err(corrupt("xattr index: checksum mismatch"));
    }
    let used = u32_at(b, XI_USED);
    if (used as usize).div_ceil(BLOCK) != n || used as usize > XATTR_SET_MAX {
        return Err(corrupt(format!(
            "xattr index: {used} bytes do not fill its {n} blocks"
        )));
    }
    let mut blocks = Vec::with_capacity(n);
    for i in 0..n {
        let o = XATTR_INDEX_HDR + 8 * i;
        let p = u64_at(b, o..o + 8);
        if p == 0 || blocks.contains(&p) {
            return Err(corrupt(format!(
                "xattr index: block {p} listed at {i} is zero or listed twice"
            )));
        }
        blocks.push(p);
    }
    Ok(XattrHead::Index {
        count: u32_at(b, XI_COUNT),
        used,
        crc: u32_at(b, XI_DATA_CRC),
        blocks,
    })
}

/// Decode the stream of an index-form set: `stream` is the listed blocks' bytes in
/// order (at least `used` of them).
pub fn decode_xattr_stream(
    stream: &[u8],
    count: u32,
    used: u32,
    crc: u32,
) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let used = used as usize;
    if used > stream.len() {
        return Err(corrupt("xattr stream: shorter than its index says"));
    }
    let s = &stream[..used];
    if crc32c::crc32c(s) != crc {
        return Err(corrupt("xattr stream: checksum mismatch"));
    }
    let mut out = BTreeMap::new();
    let mut o = 0;
    for _ in 0..count {
        if o + XS_HDR > used {
            return Err(corrupt("xattr stream: entry past end"));
        }
        let kl = s[o + XS_KEY_LEN.start] as usize;
        let vl = u32_at(s, at(o, XS_VALUE_LEN)) as usize;
        o += XS_HDR;
        if kl == 0 || vl > XATTR_SIZE_MAX || o + kl + vl > used {
            return Err(corrupt("xattr stream: bad entry"));
        }
        if out
            .insert(s[o..o + kl].to_vec(), s[o + kl..o + kl + vl].to_vec())
            .is_some()
        {
            return Err(corrupt("xattr stream: a name twice"));
        }
        o += kl + vl;
    }
    if o != used {
        return Err(corrupt("xattr stream: trailing bytes"));
    }
    Ok(out)
}

/// Decode a single-form block.
pub fn decode_xattrs(b: &[u8]) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    if b.len() < XATTR_HDR || u32_at(b, X_MAGIC) != XATTR_MAGIC {
        return Err(corrupt("xattr block: bad magic"));
    }
    let count = u32_at(b, X_COUNT) as usize;
    let used = u32_at(b, X_USED) as usize;
    if used < XATTR_HDR || used > b.len() {
        return Err(corrupt("xattr block: bad length"));
    }
    if crc32c::crc32c(&b[XATTR_HDR..used]) != u32_at(b, X_CRC) {
        return Err(corrupt("xattr block: checksum mismatch"));
    }
    let mut out = BTreeMap::new();
    let mut o = XATTR_HDR;
    for _ in 0..count {
        if o + XE_HDR > used {
            return Err(corrupt("xattr block: entry past end"));
        }
        let kl = b[o + XE_KEY_LEN.start] as usize;
        let vl = u16_at(b, at(o, XE_VALUE_LEN)) as usize;
        o += XE_HDR;
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

    fn set(n: usize, vlen: usize) -> BTreeMap<Vec<u8>, Vec<u8>> {
        (0..n)
            .map(|i| (format!("user.a{i:05}").into_bytes(), vec![i as u8; vlen]))
            .collect()
    }

    /// Decode an index-form set whose data blocks are `blocks` (numbered 10, 11, ...).
    fn round_trip_index(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let e = encode_xattr_set(x).unwrap();
        let EncodedXattrs::Stream { ref padded, .. } = e else {
            panic!("expected the index form");
        };
        let ptrs: Vec<u64> = (10..10 + e.data_blocks() as u64).collect();
        let mut idx = e.index_block(&ptrs);
        idx.resize(BLOCK, 0);
        let XattrHead::Index {
            count,
            used,
            crc,
            blocks,
        } = decode_xattr_head(&idx).unwrap()
        else {
            panic!("expected an index");
        };
        assert_eq!(blocks, ptrs);
        decode_xattr_stream(padded, count, used, crc).unwrap()
    }

    #[test]
    fn xattr_round_trip() {
        let mut x = BTreeMap::new();
        x.insert(b"user.a".to_vec(), b"1".to_vec());
        x.insert(b"user.empty".to_vec(), vec![]);
        let b = encode_xattrs(&x).unwrap();
        assert_eq!(b.len(), xattrs_size(&x));
        assert_eq!(decode_xattrs(&b).unwrap(), x);
        assert_eq!(encode_xattr_set(&x).unwrap(), EncodedXattrs::Single(b));
        x.insert(b"user.big".to_vec(), vec![0; 5000]);
        assert!(encode_xattrs(&x).is_err());
        assert_eq!(round_trip_index(&x), x);
    }

    #[test]
    fn many_and_large_sets_round_trip() {
        for x in [set(500, 100), set(3, XATTR_SIZE_MAX), set(1, 4096)] {
            let e = encode_xattr_set(&x).unwrap();
            assert_eq!(e.blocks(), 1 + xattr_set_cost(&x).div_ceil(BLOCK) as u64);
            assert_eq!(round_trip_index(&x), x);
        }
    }

    /// A set costing exactly `XATTR_SET_MAX` encodes into the most data blocks an
    /// index lists; one byte more is ENOSPC.
    #[test]
    fn the_set_limit_is_exact() {
        let mut x = set(15, XATTR_SIZE_MAX);
        let rest = XATTR_SET_MAX - xattr_set_cost(&x) - XATTR_ENTRY_COST - b"user.last".len();
        x.insert(b"user.last".to_vec(), vec![1; rest]);
        assert_eq!(xattr_set_cost(&x), XATTR_SET_MAX);
        let e = encode_xattr_set(&x).unwrap();
        assert_eq!(e.data_blocks(), XATTR_MAX_DATA_BLOCKS);
        assert_eq!(round_trip_index(&x), x);
        x.get_mut(&b"user.last"[..]).unwrap().push(0);
        assert!(matches!(encode_xattr_set(&x), Err(FsError::NoSpaceXattr)));
    }

    /// Every damaged index or stream is a typed error, never a panic.
    #[test]
    fn damaged_indexes_and_streams_are_errors() {
        let x = set(100, 100);
        let e = encode_xattr_set(&x).unwrap();
        let EncodedXattrs::Stream {
            count,
            used,
            crc,
            ref padded,
        } = e
        else {
            panic!("expected the index form");
        };
        let ptrs: Vec<u64> = (10..10 + e.data_blocks() as u64).collect();
        let mut idx = e.index_block(&ptrs);
        idx.resize(BLOCK, 0);
        for i in 0..XATTR_INDEX_HDR + 8 * ptrs.len() {
            let mut bad = idx.clone();
            bad[i] ^= 0x40;
            assert!(decode_xattr_head(&bad).is_err(), "byte {i}");
        }
        // A block listed twice, with a valid checksum.
        let mut twice = e.index_block(&[10, 10, 12]);
        twice.resize(BLOCK, 0);
        assert!(decode_xattr_head(&twice).is_err());
        assert!(decode_xattr_head(&idx[..100]).is_err());
        for i in (0..used as usize).step_by(7) {
            let mut bad = padded.clone();
            bad[i] ^= 1;
            assert!(decode_xattr_stream(&bad, count, used, crc).is_err());
        }
        assert!(decode_xattr_stream(&padded[..100], count, used, crc).is_err());
        assert!(decode_xattr_stream(padded, count + 1, used, crc).is_err());
    }
}
