//! How requests and replies ride the layer-2 lane's commands (docs/protocol.md,
//! "The layer-2 lane"). A command is at most one frame's payload (`zcfs_l2::MAX_COMMAND`
//! bytes); everything in it is checked here, so a bad command from a peer is an error,
//! never a panic.
//!
//! - A **request** command: kind 1, the read transfer id (u32, 0 for none) and the
//!   blocks the client expects in it (u32), then the request exactly as on TCP: its
//!   header, body and, for a small write, its data inline.
//! - A **reply** command: kind 2, then the reply header and body as on TCP; a read's data
//!   (`data_len` bytes) is the transfer the request named, whole blocks, the tail of the
//!   last one zero.
//! - A **resend on TCP** command: kind 3 and the request id: the reply does not fit a
//!   command. A cached operation's reply is in the session's reply cache by then, so the
//!   client sends the same request (same id) on TCP and gets it from there.

use crate::{ProtoError, ReqHeader, RespHeader, Result, REQ_HDR, RESP_HDR};

/// Kind byte of a request command.
pub const KIND_REQUEST: u8 = 1;
/// Kind byte of a reply command.
pub const KIND_REPLY: u8 = 2;
/// Kind byte of a "resend on TCP" command.
pub const KIND_RESEND_TCP: u8 = 3;
/// Bytes in front of a request's header in a request command.
pub const REQUEST_PREFIX: usize = 9;
/// Bytes in front of a reply's header in a reply command.
pub const REPLY_PREFIX: usize = 1;
/// The most bytes one read over layer 2 carries: one extent of 32 blocks
/// (`zcfs_l2::MAX_EXTENT_BLOCKS` of `zcfs_l2::BLOCK_SIZE`).
pub const MAX_READ: u32 = 32 * 4096;
/// The context of the layer-2 tag key's derivation.
pub const KEY_CONTEXT: &str = "zcfs 2026 layer-2 session key v1";

/// A request command, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct L2Request<'a> {
    /// The client's receive transfer for a read's data (0: none).
    pub xfer: u32,
    /// Blocks the client expects in that transfer.
    pub blocks: u32,
    pub header: ReqHeader,
    pub body: &'a [u8],
    /// A write's data, inline.
    pub data: &'a [u8],
}

/// A command from the server, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum L2Reply<'a> {
    Reply { header: RespHeader, body: &'a [u8] },
    ResendTcp { id: u64 },
}

/// The request command for `hdr`, `body` and inline `data`.
pub fn encode_request(
    xfer: u32,
    blocks: u32,
    hdr: &[u8; REQ_HDR],
    body: &[u8],
    data: &[&[u8]],
) -> Vec<u8> {
    let n: usize = data.iter().map(|d| d.len()).sum();
    let mut out = Vec::with_capacity(REQUEST_PREFIX + REQ_HDR + body.len() + n);
    out.push(KIND_REQUEST);
    out.extend_from_slice(&xfer.to_le_bytes());
    out.extend_from_slice(&blocks.to_le_bytes());
    out.extend_from_slice(hdr);
    out.extend_from_slice(body);
    data.iter().for_each(|d| out.extend_from_slice(d));
    out
}

/// Bytes of the request command for a header, a body of `body` bytes and `data` bytes.
pub fn request_len(body: usize, data: usize) -> usize {
    REQUEST_PREFIX + REQ_HDR + body + data
}

/// Decode a request command: header checks as on TCP, and exactly the body and data
/// its header says.
pub fn decode_request(b: &[u8]) -> Result<L2Request<'_>> {
    if b.len() < REQUEST_PREFIX + REQ_HDR {
        return Err(ProtoError::Truncated(
            "a layer-2 request shorter than its header",
        ));
    }
    if b[0] != KIND_REQUEST {
        return Err(ProtoError::BadFrame(
            "a layer-2 command that is not a request",
        ));
    }
    let xfer = u32::from_le_bytes(b[1..5].try_into().expect("4 bytes"));
    let blocks = u32::from_le_bytes(b[5..9].try_into().expect("4 bytes"));
    let hb: &[u8; REQ_HDR] = b[REQUEST_PREFIX..REQUEST_PREFIX + REQ_HDR]
        .try_into()
        .expect("checked length");
    let header = ReqHeader::decode(hb)?;
    let rest = &b[REQUEST_PREFIX + REQ_HDR..];
    let (bl, dl) = (header.body_len as usize, header.data_len as usize);
    if rest.len() != bl + dl {
        return Err(ProtoError::BadFrame(
            "a layer-2 request whose length differs from its header's",
        ));
    }
    if (xfer == 0) != (blocks == 0) {
        return Err(ProtoError::BadFrame(
            "a layer-2 transfer id without blocks, or blocks without one",
        ));
    }
    Ok(L2Request {
        xfer,
        blocks,
        header,
        body: &rest[..bl],
        data: &rest[bl..],
    })
}

/// A reply command: the encoded reply (header and body) as the TCP path (and the reply
/// cache) has it.
pub fn encode_reply(msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(REPLY_PREFIX + msg.len());
    out.push(KIND_REPLY);
    out.extend_from_slice(msg);
    out
}

/// A "resend on TCP" command for request `id`.
pub fn encode_resend_tcp(id: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(9);
    out.push(KIND_RESEND_TCP);
    out.extend_from_slice(&id.to_le_bytes());
    out
}

/// Decode a command from the server.
pub fn decode_reply(b: &[u8]) -> Result<L2Reply<'_>> {
    match b.first() {
        Some(&KIND_REPLY) => {
            let rest = &b[1..];
            if rest.len() < RESP_HDR {
                return Err(ProtoError::Truncated(
                    "a layer-2 reply shorter than its header",
                ));
            }
            let hb: &[u8; RESP_HDR] = rest[..RESP_HDR].try_into().expect("checked length");
            let header = RespHeader::decode(hb)?;
            let body = &rest[RESP_HDR..];
            if body.len() != header.body_len as usize {
                return Err(ProtoError::BadFrame(
                    "a layer-2 reply whose length differs from its header's",
                ));
            }
            Ok(L2Reply::Reply { header, body })
        }
        Some(&KIND_RESEND_TCP) if b.len() == 9 => Ok(L2Reply::ResendTcp {
            id: u64::from_le_bytes(b[1..9].try_into().expect("8 bytes")),
        }),
        _ => Err(ProtoError::BadFrame("an unknown layer-2 command")),
    }
}

/// The key the layer-2 frame tags are derived from (`zcfs_l2::TagKey::derive`): from the
/// shared secret and the server's nonce when the session is authenticated, so only the
/// two peers can tag frames; else the nonce itself, which anyone who saw the TCP set-up
/// knows (docs/security.md).
pub fn tag_key_material(secret: Option<&[u8]>, nonce: &[u8]) -> Vec<u8> {
    match secret {
        Some(s) => {
            let mut m = Vec::with_capacity(s.len() + nonce.len() + 8);
            m.extend_from_slice(&(s.len() as u64).to_le_bytes());
            m.extend_from_slice(s);
            m.extend_from_slice(nonce);
            blake3::derive_key(KEY_CONTEXT, &m).to_vec()
        }
        None => nonce.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cred, GetattrReq, NodeRef, Request};

    #[test]
    fn a_request_round_trips_and_bad_ones_are_errors() {
        let req: Request = GetattrReq {
            node: NodeRef { ino: 5, gen: 1 },
        }
        .into();
        let (h, body) = req.encode(9, Cred::default());
        let c = encode_request(0, 0, &h, &body, &[]);
        assert_eq!(c.len(), request_len(body.len(), 0));
        let d = decode_request(&c).unwrap();
        assert_eq!(d.header.id, 9);
        assert_eq!(d.body, &body[..]);
        // Every truncation and one byte too many are errors.
        for n in 0..c.len() {
            assert!(decode_request(&c[..n]).is_err(), "{n}");
        }
        let mut long = c.clone();
        long.push(0);
        assert!(decode_request(&long).is_err());
        // A transfer id without blocks.
        let c = encode_request(3, 0, &h, &body, &[]);
        assert!(decode_request(&c).is_err());
    }

    #[test]
    fn replies_round_trip_and_bad_ones_are_errors() {
        let rh = RespHeader::ok(crate::Op::Getattr, 7, 2, 0).encode();
        let mut msg = rh.to_vec();
        msg.extend_from_slice(&[1, 2]);
        let c = encode_reply(&msg);
        match decode_reply(&c).unwrap() {
            L2Reply::Reply { header, body } => {
                assert_eq!(header.id, 7);
                assert_eq!(body, &[1, 2]);
            }
            other => panic!("{other:?}"),
        }
        for n in 0..c.len() {
            assert!(decode_reply(&c[..n]).is_err(), "{n}");
        }
        assert_eq!(
            decode_reply(&encode_resend_tcp(11)).unwrap(),
            L2Reply::ResendTcp { id: 11 }
        );
        assert!(decode_reply(&[9]).is_err());
    }

    #[test]
    fn the_key_depends_on_the_secret_when_there_is_one() {
        let n = [7u8; 32];
        assert_eq!(tag_key_material(None, &n), n.to_vec());
        let a = tag_key_material(Some(b"s1"), &n);
        assert_ne!(a, tag_key_material(Some(b"s2"), &n));
        assert_ne!(a, n.to_vec());
    }
}
