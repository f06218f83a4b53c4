//! The xattr block: one per inode, replaced copy-on-write on every change.

use super::*;
use crate::error::{FsError, Result};

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
/// Bytes of an entry's header.
const XE_HDR: usize = XE_VALUE_LEN.end;

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
    put32(&mut b, X_MAGIC, XATTR_MAGIC);
    put32(&mut b, X_COUNT, x.len() as u32);
    put32(&mut b, X_USED, used);
    let crc = crc32c::crc32c(&b[XATTR_HDR..]);
    put32(&mut b, X_CRC, crc);
    Ok(b)
}

pub fn xattrs_size(x: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>) -> usize {
    XATTR_HDR
        + x.iter()
            .map(|(k, v)| XE_HDR + k.len() + v.len())
            .sum::<usize>()
}

pub fn decode_xattrs(b: &[u8]) -> Result<std::collections::BTreeMap<Vec<u8>, Vec<u8>>> {
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
    let mut out = std::collections::BTreeMap::new();
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
}
