//! The fixed request and reply headers. Everything a receiver needs to frame a message
//! is here, checked against the limits, so a body error never desynchronizes a stream.

use crate::*;

/// Caller identity carried by each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
}

/// The fixed 32-byte request header.
///
/// | off | size | field |
/// |----:|-----:|-------|
/// | 0 | 2 | magic "ZQ" |
/// | 2 | 1 | version |
/// | 3 | 1 | operation |
/// | 4 | 4 | body length (≤ `MAX_BODY`) |
/// | 8 | 8 | request id |
/// | 16 | 4 | data length (write payload ≤ `MAX_DATA`; 0 for every other operation) |
/// | 20 | 4 | caller uid |
/// | 24 | 4 | caller gid |
/// | 28 | 4 | number of the caller's supplementary groups (≤ `MAX_GROUPS`); their gids
/// (u32 each) open the body and count in its length |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqHeader {
    pub op: Op,
    pub body_len: u32,
    pub id: u64,
    pub data_len: u32,
    pub uid: u32,
    pub gid: u32,
    /// How many supplementary group ids open the body. Over `MAX_GROUPS`, or more
    /// than the body holds, the request is answered EINVAL (the frame is fine).
    pub ngroups: u32,
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

fn check_frame(what: &'static str, len: u32, max: usize) -> Result<()> {
    if len as usize > max {
        return Err(ProtoError::FrameTooLarge {
            what,
            len: len as usize,
            max,
        });
    }
    Ok(())
}

fn check_magic_version(b: &[u8], magic: u16) -> Result<()> {
    let m = u16::from_le_bytes([b[0], b[1]]);
    if m != magic {
        return Err(ProtoError::BadMagic(m));
    }
    if b[2] != VERSION {
        return Err(ProtoError::BadVersion(b[2] as u16));
    }
    Ok(())
}

impl ReqHeader {
    pub fn new(op: Op, id: u64, body_len: u32, data_len: u32, cred: Cred) -> ReqHeader {
        ReqHeader {
            op,
            body_len,
            id,
            data_len,
            uid: cred.uid,
            gid: cred.gid,
            ngroups: 0,
        }
    }

    pub fn encode(&self) -> [u8; REQ_HDR] {
        let mut b = [0u8; REQ_HDR];
        b[0..2].copy_from_slice(&REQ_MAGIC.to_le_bytes());
        b[2] = VERSION;
        b[3] = self.op as u8;
        b[4..8].copy_from_slice(&self.body_len.to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..20].copy_from_slice(&self.data_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.uid.to_le_bytes());
        b[24..28].copy_from_slice(&self.gid.to_le_bytes());
        b[28..32].copy_from_slice(&self.ngroups.to_le_bytes());
        b
    }

    /// Decode and check what framing depends on. Every error here is a framing error.
    pub fn decode(b: &[u8; REQ_HDR]) -> Result<ReqHeader> {
        check_magic_version(b, REQ_MAGIC)?;
        let op = Op::from_u8(b[3])?;
        let h = ReqHeader {
            op,
            body_len: u32_at(b, 4),
            id: u64_at(b, 8),
            data_len: u32_at(b, 16),
            uid: u32_at(b, 20),
            gid: u32_at(b, 24),
            ngroups: u32_at(b, 28),
        };
        check_frame("request body", h.body_len, MAX_BODY)?;
        check_frame("request data", h.data_len, MAX_DATA)?;
        if h.data_len != 0 && op != Op::Write {
            return Err(ProtoError::BadFrame("data on a request other than write"));
        }
        Ok(h)
    }

    pub fn cred(&self) -> Cred {
        Cred {
            uid: self.uid,
            gid: self.gid,
        }
    }
}

/// The fixed 32-byte reply header.
///
/// | off | size | field |
/// |----:|-----:|-------|
/// | 0 | 2 | magic "ZR" |
/// | 2 | 1 | version |
/// | 3 | 1 | operation (as requested) |
/// | 4 | 4 | status: 0 or an errno (1..=4095) |
/// | 8 | 8 | request id |
/// | 16 | 4 | body length (≤ `MAX_BODY`; 0 with an errno) |
/// | 20 | 4 | data length (read data ≤ `MAX_DATA`; 0 for every other reply) |
/// | 24 | 8 | reserved (0) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RespHeader {
    pub op: Op,
    pub status: i32,
    pub id: u64,
    pub body_len: u32,
    pub data_len: u32,
    pub reserved: u64,
}

impl RespHeader {
    /// A successful reply's header.
    pub fn ok(op: Op, id: u64, body_len: u32, data_len: u32) -> RespHeader {
        RespHeader {
            op,
            status: 0,
            id,
            body_len,
            data_len,
            reserved: 0,
        }
    }

    /// An error reply's header (no body, no data); the errno is clamped to 1..=4095.
    pub fn error(op: Op, id: u64, errno: i32) -> RespHeader {
        RespHeader {
            op,
            status: errno.clamp(1, MAX_ERRNO),
            id,
            body_len: 0,
            data_len: 0,
            reserved: 0,
        }
    }

    pub fn encode(&self) -> [u8; RESP_HDR] {
        let mut b = [0u8; RESP_HDR];
        b[0..2].copy_from_slice(&RESP_MAGIC.to_le_bytes());
        b[2] = VERSION;
        b[3] = self.op as u8;
        b[4..8].copy_from_slice(&self.status.to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..20].copy_from_slice(&self.body_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.data_len.to_le_bytes());
        b[24..32].copy_from_slice(&self.reserved.to_le_bytes());
        b
    }

    /// Decode and check what framing depends on. Every error here is a framing error.
    pub fn decode(b: &[u8; RESP_HDR]) -> Result<RespHeader> {
        check_magic_version(b, RESP_MAGIC)?;
        let op = Op::from_u8(b[3])?;
        let h = RespHeader {
            op,
            status: i32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            id: u64_at(b, 8),
            body_len: u32_at(b, 16),
            data_len: u32_at(b, 20),
            reserved: u64_at(b, 24),
        };
        if !(0..=MAX_ERRNO).contains(&h.status) {
            return Err(ProtoError::BadFrame("status outside 0..=4095"));
        }
        check_frame("reply body", h.body_len, MAX_BODY)?;
        check_frame("reply data", h.data_len, MAX_DATA)?;
        if h.data_len != 0 && op != Op::Read {
            return Err(ProtoError::BadFrame("data on a reply other than read"));
        }
        if h.status != 0 && (h.body_len != 0 || h.data_len != 0) {
            return Err(ProtoError::BadFrame("an error reply with a body or data"));
        }
        Ok(h)
    }
}
