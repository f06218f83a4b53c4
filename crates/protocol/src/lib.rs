//! The zcfs wire format, version 5 (docs/protocol.md). Pure: bytes in, typed messages
//! out, every field checked against explicit limits; no I/O, so it is fuzzed and shared
//! by client and server.
//!
//! A connection starts with a handshake (version, session id, optional mutual
//! HMAC-SHA256 authentication). Then each request is a fixed 32-byte header, a body (one
//! struct per operation, with named fields) and, for writes only, the bulk data; each
//! reply is a fixed 32-byte header, a body and, for reads only, the bulk data.
//!
//! **Framing is decided by the header alone**: the header says how many body and data
//! bytes follow, within fixed limits. A receiver that has a valid header can always
//! skip the rest of the message, so an error in a *body* is answered with an errno and
//! the stream stays in step; only a bad header (a [`ProtoError::is_framing`] error)
//! ends a connection. A write's header and body (target and size) come before its data,
//! so a server can reserve the destination blocks and receive the data straight into
//! them.
//!
//! Adding an operation: a line in the table in `ops.rs`, its request and reply structs
//! in `messages.rs`, the server's dispatch and the client's call.

pub mod channel;
pub mod handshake;
mod header;
pub mod l2;
mod messages;
mod ops;
mod types;
mod wire;

pub use header::{Cred, ReqHeader, RespHeader};
pub use messages::*;
pub use ops::{Op, Operation, Reply, Request, ALL_OPS, OP_SLOTS};
pub use types::{
    Blob, List, LookupName, Name, NodeRef, RenameFlags, SymlinkTarget, XattrName, XattrValue,
    ATTR_FLAGS_KNOWN, ATTR_NO_XATTRS,
};
pub use wire::{Reader, Wire};

/// Protocol version (header byte 2, handshake): peers must match exactly. Version 3
/// moved `resumed` after authentication (the Verdict) and added the session reply cache
/// (clients resend any request after a lost connection, which a version 2 server would
/// execute twice). Version 5 authenticates every message after a handshake with a
/// secret (`channel`: a MAC trailer after each body, optionally a payload MAC) and
/// binds the handshake proofs to its whole transcript. Version 8 adds `L2Setup` (the
/// layer-2 lane, `l2`); version 9 `L2Release` (the lane's fence, so writes may ride it).
/// Version 10: the replies of operations that change a directory carry its attributes
/// after the change (`MadeReply`, `RemovedReply`, `CreateReply::parent`), as NFS's
/// post-operation attributes, so a client need not ask for them again. Version 11: they
/// also carry the directory's name-set version (`DirState`; mkdir the new directory's
/// too), so a client that knows every name of a directory answers a lookup of another
/// name itself. Version 12: a layer-2 request longer than one command goes in request
/// parts (`l2::KIND_REQUEST_PART`), so writes up to `l2::MAX_WRITE` ride the lane; a
/// version 11 server drops every part as malformed, and the lane of a client that sends
/// them falls at each such write; and frames of a lane without a shared secret tag their
/// payload with a keyed SipHash (`zcfs_l2::TagKey::derive_open`). Version 13: writes
/// larger than a request carries may land in place (`l2::KIND_LANDING_WRITE`, answered
/// by `l2::KIND_SEND_DATA`): their blocks go as a layer-2 transfer straight into the
/// volume's blocks that keep them. Version 14: the Welcome (or, with a secret, the
/// Verdict, now 16 bytes) carries the session's serial, so a client whose session ended
/// and was started again by a connection attempt it gave up on still learns that it
/// must revalidate (`handshake::Welcome::session_serial`).
pub const VERSION: u8 = 14;
pub const REQ_MAGIC: u16 = 0x515a; // "ZQ"
pub const RESP_MAGIC: u16 = 0x525a; // "ZR"
/// Size of the fixed request header.
pub const REQ_HDR: usize = 32;
/// Size of the fixed reply header.
pub const RESP_HDR: usize = 32;
/// Largest request or reply body (names, attributes, directory listings).
pub const MAX_BODY: usize = 256 << 10;
/// Largest bulk data of one read or write.
pub const MAX_DATA: usize = 16 << 20;
/// Longest file name (bytes).
pub const MAX_NAME: usize = 255;
/// Longest symlink target (bytes).
pub const MAX_SYMLINK: usize = 4095;
/// Longest extended attribute name (bytes).
pub const MAX_XATTR_NAME: usize = 255;
/// Largest extended attribute value (bytes).
pub const MAX_XATTR_VALUE: usize = 64 << 10;
/// Most bytes of names (each with its NUL, as Linux counts them: XATTR_LIST_MAX) in one
/// listxattr reply; a longer list is answered E2BIG, as the kernel does.
pub const MAX_XATTR_LIST: usize = 64 << 10;
/// The largest xattr reply or request fits a body: a 64 KiB value with its name, and a
/// list of `MAX_XATTR_LIST` bytes of one-byte names (3 bytes each on the wire, against 2
/// counted).
const _: () = assert!(MAX_XATTR_VALUE + MAX_XATTR_NAME + 64 <= MAX_BODY);
const _: () = assert!(8 + MAX_XATTR_LIST / 2 * 3 <= MAX_BODY);
/// Most names in one listxattr reply (each at least 3 bytes on the wire, so this many
/// fit in a body).
pub const MAX_XATTR_NAMES: usize = 65_536;
/// Most directory entries in one readdir reply.
pub const MAX_ENTRIES: usize = 4096;
/// Most supplementary groups a request may carry (their gids open its body). Linux
/// allows more (NGROUPS_MAX 65536); a client refuses to send a request for a caller
/// in more (EINVAL), and a server answers one that names more with EINVAL.
pub const MAX_GROUPS: usize = 256;
/// Most (inode, count) pairs in one forget request.
pub const MAX_FORGET_ITEMS: usize = 1024;
/// Offsets and offset + length stay at or below this (a file offset is an off_t).
pub const MAX_OFFSET: u64 = i64::MAX as u64;
/// Largest errno a reply may carry.
pub const MAX_ERRNO: i32 = 4095;
/// Encoded size of an `Attr` (the fields, then zero padding).
pub const ATTR_LEN: usize = 96;

/// Why bytes could not be decoded. [`is_framing`](ProtoError::is_framing) tells the
/// errors that break framing (the connection must end) from the errors in a body
/// (answered with [`errno`](ProtoError::errno); the stream stays in step).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    #[error("unsupported protocol version {0}")]
    BadVersion(u16),
    #[error("unknown operation {0}")]
    UnknownOp(u8),
    #[error("{what} of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("bad header: {0}")]
    BadFrame(&'static str),
    #[error("message truncated: {0}")]
    Truncated(&'static str),
    #[error("invalid field: {0}")]
    Invalid(&'static str),
    #[error("{what} of {len} exceeds the limit of {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
        /// What a POSIX call reports for this (ENAMETOOLONG, ERANGE, E2BIG, EINVAL).
        errno: i32,
    },
    #[error("authentication failed")]
    AuthFailed,
}

impl ProtoError {
    /// The header itself is wrong: the receiver cannot know where the next message
    /// starts, so the connection must end.
    pub fn is_framing(&self) -> bool {
        matches!(
            self,
            ProtoError::BadMagic(_)
                | ProtoError::BadVersion(_)
                | ProtoError::UnknownOp(_)
                | ProtoError::FrameTooLarge { .. }
                | ProtoError::BadFrame(_)
        )
    }

    /// The errno a server answers a body error with (and a client returns when it
    /// refuses to send such a request).
    pub fn errno(&self) -> i32 {
        match self {
            ProtoError::TooLong { errno, .. } => *errno,
            ProtoError::Truncated(_) | ProtoError::Invalid(_) => libc::EINVAL,
            ProtoError::AuthFailed => libc::EACCES,
            _ => libc::EPROTO,
        }
    }
}

pub type Result<T> = std::result::Result<T, ProtoError>;

/// `len` within the limit `max`, or `TooLong` naming `what` (reported to a caller as
/// `errno`).
pub(crate) fn check_limit(what: &'static str, len: usize, max: usize, errno: i32) -> Result<()> {
    if len > max {
        return Err(ProtoError::TooLong {
            what,
            len,
            max,
            errno,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
