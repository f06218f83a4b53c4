//! A directory entry: 32-byte units, 128 per block, never crossing a block.

use super::*;
use crate::error::{FsError, Result};

fields! {
    /// 0 = a free unit.
    D_INO: 8,
    D_NAME_LEN: 2,
    /// DT_* file type.
    D_TYPE: 1,
    /// Units used: ceil((16 + name length) / 32).
    D_UNITS: 1,
    /// CRC32C of the fields before it and of the name.
    D_CRC: 4,
}
const _: () = assert!(D_CRC.end == DIRENT_HDR, "the name follows the header");

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
        put64(&mut b, D_INO, self.ino);
        put16(&mut b, D_NAME_LEN, self.name.len() as u16);
        b[D_TYPE.start] = self.dtype;
        b[D_UNITS.start] = units as u8;
        b[DIRENT_HDR..DIRENT_HDR + self.name.len()].copy_from_slice(&self.name);
        let crc = dirent_crc(&b, self.name.len());
        put32(&mut b, D_CRC, crc);
        b
    }

    /// Decode the entry starting at `unit` of a directory block. Ok(None) = free unit.
    pub fn decode_at(block: &[u8], unit: usize) -> Result<Option<(Dirent, usize)>> {
        let b = &block[unit * DIRENT_UNIT..];
        let ino = u64_at(b, D_INO);
        if ino == 0 {
            return Ok(None);
        }
        let name_len = u16_at(b, D_NAME_LEN) as usize;
        let units = b[D_UNITS.start] as usize;
        if name_len == 0
            || name_len > NAME_MAX
            || units != dirent_units(name_len)
            || unit + units > UNITS_PER_BLOCK
        {
            return Err(corrupt(format!(
                "directory entry at unit {unit} has bad length"
            )));
        }
        if dirent_crc(b, name_len) != u32_at(b, D_CRC) {
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
                dtype: b[D_TYPE.start],
                name,
            },
            units,
        )))
    }
}

fn dirent_crc(b: &[u8], name_len: usize) -> u32 {
    let c = crc32c::crc32c(&b[..D_CRC.start]);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirent_round_trip_and_limits() {
        let d = Dirent {
            ino: 9,
            dtype: 8,
            name: vec![b'a'; NAME_MAX],
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
                && check_name(&[b'x'; NAME_MAX + 1]).is_err()
                && check_name(&[b'x'; NAME_MAX]).is_ok()
        );
    }
}
