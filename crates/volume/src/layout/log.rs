//! Log entries: a 64-byte header, then the redo records, padded to 64 bytes.

use super::*;
use crate::error::Result;

fields! {
    L_MAGIC: 4,
    /// `OpType`; 0 = padding to the end of the ring.
    L_OP: 2,
    L_RESERVED_A: 2,
    /// Bytes of the whole entry, a multiple of 64.
    L_LEN: 4,
    /// CRC32C of the entry with this field zero (of the header only, for padding).
    L_CRC: 4,
    /// Each entry is the previous one's + 1.
    L_SEQ: 8,
    /// Where the entry starts in the log (rejects entries of an earlier lap).
    L_LSN: 8,
    L_INO: 8,
    /// Number of records; they must fill the entry exactly.
    L_NREC: 4,
    L_RESERVED_B: 4,
    /// First data block the operation wrote (byte address), and bytes written.
    L_DATA_ADDR: 8,
    L_DATA_SIZE: 8,
}
const _: () = assert!(L_DATA_SIZE.end == LOG_HDR);

fields! {
    R_ADDR: 8,
    R_LEN: 4,
    /// 1: `len` bytes follow, padded to 8; 2: zero-fill.
    R_KIND: 2,
    R_PAD: 2,
}
const _: () = assert!(R_PAD.end == REC_HDR);

const KIND_BYTES: u16 = 1;
const KIND_ZERO: u16 = 2;

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
    Fallocate = 16,
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
            16 => Fallocate,
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
        put32(&mut b, L_MAGIC, LOG_ENTRY_MAGIC);
        put16(&mut b, L_OP, self.op as u16);
        put32(&mut b, L_LEN, len32);
        put64(&mut b, L_SEQ, self.seq);
        put64(&mut b, L_LSN, self.lsn);
        put64(&mut b, L_INO, self.ino);
        put32(&mut b, L_NREC, nrec);
        put64(&mut b, L_DATA_ADDR, self.data_addr);
        put64(&mut b, L_DATA_SIZE, self.data_size);
        let mut o = LOG_HDR;
        for r in &self.records {
            put64(&mut b, at(o, R_ADDR), r.addr);
            put32(&mut b, at(o, R_LEN), r.len() as u32);
            match &r.data {
                RecData::Bytes(d) => {
                    put16(&mut b, at(o, R_KIND), KIND_BYTES);
                    b[o + REC_HDR..o + REC_HDR + d.len()].copy_from_slice(d);
                }
                RecData::Zero(_) => put16(&mut b, at(o, R_KIND), KIND_ZERO),
            }
            o += r.encoded_len();
        }
        let crc = crc32c::crc32c(&b);
        put32(&mut b, L_CRC, crc);
        b
    }

    /// A padding entry that fills the ring up to its end (entries never wrap).
    /// Its checksum covers the 64-byte header only.
    pub fn encode_pad(seq: u64, lsn: u64, len: u32) -> [u8; LOG_HDR] {
        let mut b = [0u8; LOG_HDR];
        put32(&mut b, L_MAGIC, LOG_ENTRY_MAGIC);
        put16(&mut b, L_OP, OpType::Pad as u16);
        put32(&mut b, L_LEN, len);
        put64(&mut b, L_SEQ, seq);
        put64(&mut b, L_LSN, lsn);
        let crc = crc32c::crc32c(&b);
        put32(&mut b, L_CRC, crc);
        b
    }

    /// Length field of a header, for stepping through the ring before full decoding.
    pub fn peek_len(b: &[u8]) -> Option<usize> {
        if b.len() < LOG_HDR || u32_at(b, L_MAGIC) != LOG_ENTRY_MAGIC {
            return None;
        }
        Some(u32_at(b, L_LEN) as usize)
    }

    /// Decode and verify an entry; `region_len` bounds record addresses.
    pub fn decode(b: &[u8], region_len: u64) -> Result<LogEntry> {
        let len = Self::peek_len(b).ok_or_else(|| corrupt("log entry: bad magic"))?;
        if len < LOG_HDR || len % 64 != 0 || len > b.len() {
            return Err(corrupt(format!("log entry: bad length {len}")));
        }
        let b = &b[..len];
        let op =
            OpType::from_u16(u16_at(b, L_OP)).ok_or_else(|| corrupt("log entry: unknown op"))?;
        let covered = if op == OpType::Pad { LOG_HDR } else { len };
        let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..L_CRC.start]), &[0u8; 4]);
        let crc = crc32c::crc32c_append(crc, &b[L_CRC.end..covered]);
        if crc != u32_at(b, L_CRC) {
            return Err(corrupt("log entry: checksum mismatch"));
        }
        let nrec = u32_at(b, L_NREC) as usize;
        if u16_at(b, L_RESERVED_A) != 0 || u32_at(b, L_RESERVED_B) != 0 {
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
            let addr = u64_at(b, at(o, R_ADDR));
            let rlen = u32_at(b, at(o, R_LEN)) as usize;
            let kind = u16_at(b, at(o, R_KIND));
            if addr.checked_add(rlen as u64).is_none_or(|e| e > region_len) {
                return Err(corrupt("log entry: record outside the volume"));
            }
            let data = match kind {
                KIND_BYTES => {
                    let padded = rlen.div_ceil(8) * 8;
                    if o + REC_HDR + padded > len {
                        return Err(corrupt("log entry: record payload past end"));
                    }
                    let d = b[o + REC_HDR..o + REC_HDR + rlen].to_vec();
                    o += REC_HDR + padded;
                    RecData::Bytes(d)
                }
                KIND_ZERO => {
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
            seq: u64_at(b, L_SEQ),
            lsn: u64_at(b, L_LSN),
            ino: u64_at(b, L_INO),
            data_addr: u64_at(b, L_DATA_ADDR),
            data_size: u64_at(b, L_DATA_SIZE),
            records,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_entry_round_trip_and_torn() {
        let e = LogEntry::sample(0, 0);
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
}
