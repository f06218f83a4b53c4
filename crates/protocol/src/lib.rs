//! The zcfs wire format (docs/protocol.md). Pure: bytes in, typed messages out, every
//! field checked against explicit limits; no I/O, so it is fuzzed and shared by client
//! and server.
//!
//! A connection starts with a handshake (version and feature negotiation, optional
//! mutual HMAC-SHA256 authentication). Then each request is a fixed 64-byte header, a
//! small body (names, attributes to set), and for writes the bulk data; each response is
//! a fixed 32-byte header, a body, and for reads the bulk data. The header of a write
//! carries its target and size, so a server can reserve the destination blocks before
//! the data arrives and receive it straight into them.

mod codec;
pub mod handshake;

pub use codec::*;

use zcfs_backend::{Attr, DirEntry, SetAttr, StatFs};

pub const VERSION: u16 = 1;
pub const REQ_MAGIC: u16 = 0x515a; // "ZQ"
pub const RESP_MAGIC: u16 = 0x525a; // "ZR"
pub const REQ_HDR: usize = 64;
pub const RESP_HDR: usize = 32;
/// Largest request or response body (names, attributes, directory listings).
pub const MAX_BODY: usize = 256 << 10;
/// Largest bulk data of one read or write.
pub const MAX_DATA: usize = 16 << 20;
pub const MAX_NAME: usize = 255;
pub const MAX_SYMLINK: usize = 4095;
pub const MAX_XATTR_NAME: usize = 255;
pub const MAX_XATTR_VALUE: usize = 64 << 10;
/// Most directory entries in one readdir reply.
pub const MAX_ENTRIES: usize = 4096;
pub const ATTR_LEN: usize = 96;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    #[error("unsupported protocol version {0}")]
    BadVersion(u16),
    #[error("unknown operation {0}")]
    UnknownOp(u8),
    #[error("{what} of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("message truncated: {0}")]
    Truncated(&'static str),
    #[error("invalid field: {0}")]
    Invalid(&'static str),
    #[error("authentication failed")]
    AuthFailed,
}

pub type Result<T> = std::result::Result<T, ProtoError>;

/// Operation codes: the Backend request set plus protocol housekeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Op {
    Lookup = 1,
    Getattr = 2,
    Setattr = 3,
    Readlink = 4,
    Mknod = 5,
    Mkdir = 6,
    Unlink = 7,
    Rmdir = 8,
    Symlink = 9,
    Rename = 10,
    Link = 11,
    Open = 12,
    Create = 13,
    Read = 14,
    Write = 15,
    Flush = 16,
    Release = 17,
    Fsync = 18,
    Readdir = 19,
    Statfs = 20,
    Setxattr = 21,
    Getxattr = 22,
    Listxattr = 23,
    Removexattr = 24,
    Fallocate = 25,
    SyncAll = 26,
    Ping = 27,
    Stats = 28,
}

pub const ALL_OPS: [Op; 28] = [
    Op::Lookup,
    Op::Getattr,
    Op::Setattr,
    Op::Readlink,
    Op::Mknod,
    Op::Mkdir,
    Op::Unlink,
    Op::Rmdir,
    Op::Symlink,
    Op::Rename,
    Op::Link,
    Op::Open,
    Op::Create,
    Op::Read,
    Op::Write,
    Op::Flush,
    Op::Release,
    Op::Fsync,
    Op::Readdir,
    Op::Statfs,
    Op::Setxattr,
    Op::Getxattr,
    Op::Listxattr,
    Op::Removexattr,
    Op::Fallocate,
    Op::SyncAll,
    Op::Ping,
    Op::Stats,
];

impl Op {
    pub fn from_u8(v: u8) -> Result<Op> {
        ALL_OPS
            .iter()
            .copied()
            .find(|o| *o as u8 == v)
            .ok_or(ProtoError::UnknownOp(v))
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Getattr => "getattr",
            Op::Setattr => "setattr",
            Op::Readlink => "readlink",
            Op::Mknod => "mknod",
            Op::Mkdir => "mkdir",
            Op::Unlink => "unlink",
            Op::Rmdir => "rmdir",
            Op::Symlink => "symlink",
            Op::Rename => "rename",
            Op::Link => "link",
            Op::Open => "open",
            Op::Create => "create",
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Release => "release",
            Op::Fsync => "fsync",
            Op::Readdir => "readdir",
            Op::Statfs => "statfs",
            Op::Setxattr => "setxattr",
            Op::Getxattr => "getxattr",
            Op::Listxattr => "listxattr",
            Op::Removexattr => "removexattr",
            Op::Fallocate => "fallocate",
            Op::SyncAll => "syncall",
            Op::Ping => "ping",
            Op::Stats => "stats",
        }
    }

    /// Changes the file system (refused by a read-only export). Open is decided by its
    /// flags, so it is not listed.
    pub fn mutates(self) -> bool {
        !matches!(
            self,
            Op::Lookup
                | Op::Getattr
                | Op::Readlink
                | Op::Open
                | Op::Read
                | Op::Flush
                | Op::Release
                | Op::Fsync
                | Op::Readdir
                | Op::Statfs
                | Op::Getxattr
                | Op::Listxattr
                | Op::SyncAll
                | Op::Ping
                | Op::Stats
        )
    }

    /// Safe to send again after a lost connection: the result does not depend on
    /// whether the first attempt was applied.
    pub fn idempotent(self) -> bool {
        matches!(
            self,
            Op::Lookup
                | Op::Getattr
                | Op::Readlink
                | Op::Open
                | Op::Read
                | Op::Write
                | Op::Flush
                | Op::Fsync
                | Op::Readdir
                | Op::Statfs
                | Op::Getxattr
                | Op::Listxattr
                | Op::SyncAll
                | Op::Ping
                | Op::Stats
                | Op::Setattr
        )
    }
}

/// The fixed request header. `size` is the bulk data length for writes and the
/// requested length for reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReqHeader {
    pub op: u8,
    pub body_len: u32,
    pub id: u64,
    pub ino: u64,
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub flags: u32,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub aux: u32,
}

/// The fixed response header: `status` is 0 or an errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RespHeader {
    pub op: u8,
    pub status: i32,
    pub id: u64,
    pub body_len: u32,
    pub data_len: u32,
    pub aux: u64,
}

/// Caller identity carried by each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
}

/// A decoded request (write data travels outside, after the body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Lookup {
        parent: u64,
        name: Vec<u8>,
    },
    Getattr {
        ino: u64,
    },
    Setattr {
        ino: u64,
        set: SetAttr,
    },
    Readlink {
        ino: u64,
    },
    Mknod {
        parent: u64,
        name: Vec<u8>,
        mode: u32,
        rdev: u32,
    },
    Mkdir {
        parent: u64,
        name: Vec<u8>,
        mode: u32,
    },
    Unlink {
        parent: u64,
        name: Vec<u8>,
    },
    Rmdir {
        parent: u64,
        name: Vec<u8>,
    },
    Symlink {
        parent: u64,
        name: Vec<u8>,
        target: Vec<u8>,
    },
    Rename {
        parent: u64,
        name: Vec<u8>,
        newparent: u64,
        newname: Vec<u8>,
        flags: u32,
    },
    Link {
        ino: u64,
        newparent: u64,
        newname: Vec<u8>,
    },
    Open {
        ino: u64,
        flags: i32,
    },
    Create {
        parent: u64,
        name: Vec<u8>,
        mode: u32,
        flags: i32,
    },
    Read {
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
    },
    Write {
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
    },
    Flush {
        ino: u64,
        fh: u64,
    },
    Release {
        ino: u64,
        fh: u64,
    },
    Fsync {
        ino: u64,
        fh: u64,
        datasync: bool,
    },
    Readdir {
        ino: u64,
        cookie: u64,
        plus: bool,
        max_entries: u32,
    },
    Statfs,
    Setxattr {
        ino: u64,
        name: Vec<u8>,
        value: Vec<u8>,
        flags: i32,
    },
    Getxattr {
        ino: u64,
        name: Vec<u8>,
    },
    Listxattr {
        ino: u64,
    },
    Removexattr {
        ino: u64,
        name: Vec<u8>,
    },
    Fallocate {
        ino: u64,
        fh: u64,
        offset: u64,
        len: u64,
        mode: i32,
    },
    SyncAll,
    Ping,
    Stats,
}

/// A decoded response body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Empty,
    Attr(Attr),
    /// Create: attributes and handle.
    Created(Attr, u64),
    /// Open: handle.
    Handle(u64),
    /// Write: bytes written.
    Written(u32),
    Bytes(Vec<u8>),
    Entries(Vec<DirEntry>),
    Names(Vec<Vec<u8>>),
    StatFs(StatFs),
    /// Server counters as JSON.
    Stats(Vec<u8>),
}
