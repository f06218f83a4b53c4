//! The list of operations. Everything per operation — the `Op` code, `ALL_OPS`, its
//! name, whether it changes the file system, whether a client may resend it, its
//! request and reply types, and the `Request`/`Reply` encode/decode dispatch — is
//! generated from the one table at the bottom of this file.

use crate::wire::{Reader, Wire};
use crate::*;

/// A request type: its operation code and the type of its reply body.
pub trait Operation: Wire + Into<Request> {
    const OP: Op;
    type Reply: Wire;
}

macro_rules! operations {
    ($(
        $code:literal $variant:ident $name:literal : $req:ident -> $rep:ident,
        mutates $mutates:literal, idempotent $idem:literal;
    )*) => {
        /// Operation codes (header byte 3).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Op {
            $( $variant = $code, )*
        }

        /// Every operation, in code order.
        pub const ALL_OPS: &[Op] = &[ $( Op::$variant, )* ];

        impl Op {
            pub fn from_u8(v: u8) -> Result<Op> {
                match v {
                    $( $code => Ok(Op::$variant), )*
                    _ => Err(ProtoError::UnknownOp(v)),
                }
            }

            pub fn name(self) -> &'static str {
                match self {
                    $( Op::$variant => $name, )*
                }
            }

            /// Changes the file system (refused by a read-only export). Open is decided
            /// by its flags, so it is not listed.
            pub fn mutates(self) -> bool {
                match self {
                    $( Op::$variant => $mutates, )*
                }
            }

            /// Safe to send again after a lost connection: the result does not depend
            /// on whether the first attempt was applied.
            pub fn idempotent(self) -> bool {
                match self {
                    $( Op::$variant => $idem, )*
                }
            }

            /// The server keeps this operation's reply in the session's reply cache
            /// and answers a repeated request id from it without executing again:
            /// everything but the data paths (read, write: idempotent, and their
            /// payloads too large to keep) and ping and stats (no side effects).
            pub fn cached(self) -> bool {
                !matches!(
                    self,
                    Op::Read
                        | Op::Write
                        | Op::Lseek
                        | Op::Ping
                        | Op::Stats
                        | Op::L2Setup
                        | Op::L2Release
                )
            }
        }

        /// A decoded request body (a write's data travels after it).
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Request {
            $( $variant($req), )*
        }

        /// A decoded reply body, one variant per operation.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Reply {
            $( $variant($rep), )*
        }

        $(
            impl Operation for $req {
                const OP: Op = Op::$variant;
                type Reply = $rep;
            }
            impl From<$req> for Request {
                fn from(r: $req) -> Request {
                    Request::$variant(r)
                }
            }
        )*

        impl Request {
            pub fn op(&self) -> Op {
                match self {
                    $( Request::$variant(_) => Op::$variant, )*
                }
            }

            fn put_body(&self, out: &mut Vec<u8>) {
                match self {
                    $( Request::$variant(r) => r.put(out), )*
                }
            }

            fn get_body(op: Op, r: &mut Reader<'_>) -> Result<Request> {
                Ok(match op {
                    $( Op::$variant => Request::$variant(<$req>::get(r)?), )*
                })
            }
        }

        impl Reply {
            pub fn op(&self) -> Op {
                match self {
                    $( Reply::$variant(_) => Op::$variant, )*
                }
            }

            /// The body bytes of this reply.
            pub fn encode(&self) -> Vec<u8> {
                let mut out = Vec::new();
                match self {
                    $( Reply::$variant(r) => r.put(&mut out), )*
                }
                out
            }

            /// Decode the body of a successful reply to `op`.
            pub fn decode(op: Op, body: &[u8]) -> Result<Reply> {
                let mut r = Reader::new(body);
                let v = match op {
                    $( Op::$variant => Reply::$variant(<$rep>::get(&mut r)?), )*
                };
                r.end()?;
                Ok(v)
            }
        }
    };
}

impl Request {
    /// Bytes of bulk data that follow the body (a write's payload).
    pub fn data_len(&self) -> u32 {
        match self {
            Request::Write(w) => w.size,
            _ => 0,
        }
    }

    /// Header and body for this request (a write's data goes after them), sent as a
    /// caller without supplementary groups.
    pub fn encode(&self, id: u64, cred: Cred) -> ([u8; REQ_HDR], Vec<u8>) {
        self.encode_with_groups(id, cred, &[])
            .expect("a request without groups fits its limits")
    }

    /// Header and body for this request sent as `cred` with the supplementary
    /// `groups`: their count in the header, the gids opening the body. More than
    /// `MAX_GROUPS` groups, or a body that would pass `MAX_BODY` with them, is an
    /// error (nothing to send).
    pub fn encode_with_groups(
        &self,
        id: u64,
        cred: Cred,
        groups: &[u32],
    ) -> Result<([u8; REQ_HDR], Vec<u8>)> {
        check_limit(
            "supplementary groups",
            groups.len(),
            MAX_GROUPS,
            libc::EINVAL,
        )?;
        let mut body = Vec::with_capacity(groups.len() * 4);
        for g in groups {
            body.extend_from_slice(&g.to_le_bytes());
        }
        self.put_body(&mut body);
        check_limit("request body", body.len(), MAX_BODY, libc::E2BIG)?;
        let mut h = ReqHeader::new(self.op(), id, body.len() as u32, self.data_len(), cred);
        h.ngroups = groups.len() as u32;
        Ok((h.encode(), body))
    }

    /// Decode a request body under its (already checked) header, without the
    /// caller's supplementary groups (see `decode_with_groups`).
    pub fn decode(h: &ReqHeader, body: &[u8]) -> Result<Request> {
        Request::decode_with_groups(h, body).map(|(r, _)| r)
    }

    /// Decode a request body under its (already checked) header: the caller's
    /// supplementary groups and the request. Every error here is a body error: the
    /// header framed the message, so the receiver answers it.
    pub fn decode_with_groups(h: &ReqHeader, body: &[u8]) -> Result<(Request, Vec<u32>)> {
        if body.len() != h.body_len as usize {
            return Err(ProtoError::Truncated(
                "request body shorter than its header says",
            ));
        }
        check_limit(
            "supplementary groups",
            h.ngroups as usize,
            MAX_GROUPS,
            libc::EINVAL,
        )?;
        let glen = h.ngroups as usize * 4;
        if glen > body.len() {
            return Err(ProtoError::Truncated(
                "supplementary groups longer than the body",
            ));
        }
        let groups = body[..glen]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        let mut r = Reader::new(&body[glen..]);
        let req = Request::get_body(h.op, &mut r)?;
        r.end()?;
        if req.data_len() != h.data_len {
            return Err(ProtoError::Invalid(
                "write size differs from the header's data length",
            ));
        }
        Ok((req, groups))
    }
}

const fn slots() -> usize {
    let mut max = 0;
    let mut i = 0;
    while i < ALL_OPS.len() {
        if ALL_OPS[i] as usize > max {
            max = ALL_OPS[i] as usize;
        }
        i += 1;
    }
    max + 1
}

/// Size of a table indexed by operation code.
pub const OP_SLOTS: usize = slots();

operations! {
    // code name                   request          reply
    1  Lookup      "lookup"      : LookupReq      -> EntryReply,     mutates false, idempotent true;
    2  Getattr     "getattr"     : GetattrReq     -> AttrReply,      mutates false, idempotent true;
    3  Setattr     "setattr"     : SetattrReq     -> SetattrReply,   mutates true,  idempotent true;
    4  Readlink    "readlink"    : ReadlinkReq    -> ReadlinkReply,  mutates false, idempotent true;
    5  Mknod       "mknod"       : MknodReq       -> MadeReply,      mutates true,  idempotent false;
    6  Mkdir       "mkdir"       : MkdirReq       -> MadeReply,      mutates true,  idempotent false;
    7  Unlink      "unlink"      : UnlinkReq      -> RemovedReply,   mutates true,  idempotent false;
    8  Rmdir       "rmdir"       : RmdirReq       -> RemovedReply,   mutates true,  idempotent false;
    9  Symlink     "symlink"     : SymlinkReq     -> MadeReply,      mutates true,  idempotent false;
    10 Rename      "rename"      : RenameReq      -> EmptyReply,     mutates true,  idempotent false;
    11 Link        "link"        : LinkReq        -> MadeReply,      mutates true,  idempotent false;
    12 Open        "open"        : OpenReq        -> OpenReply,      mutates false, idempotent true;
    13 Create      "create"      : CreateReq      -> CreateReply,    mutates true,  idempotent false;
    14 Read        "read"        : ReadReq        -> EmptyReply,     mutates false, idempotent true;
    15 Write       "write"       : WriteReq       -> WriteReply,     mutates true,  idempotent true;
    16 Flush       "flush"       : FlushReq       -> EmptyReply,     mutates false, idempotent true;
    17 Release     "release"     : ReleaseReq     -> EmptyReply,     mutates false, idempotent false;
    18 Fsync       "fsync"       : FsyncReq       -> EmptyReply,     mutates false, idempotent true;
    19 Readdir     "readdir"     : ReaddirReq     -> ReaddirReply,   mutates false, idempotent true;
    20 Statfs      "statfs"      : StatfsReq      -> StatfsReply,    mutates false, idempotent true;
    21 Setxattr    "setxattr"    : SetxattrReq    -> EmptyReply,     mutates true,  idempotent false;
    22 Getxattr    "getxattr"    : GetxattrReq    -> GetxattrReply,  mutates false, idempotent true;
    23 Listxattr   "listxattr"   : ListxattrReq   -> ListxattrReply, mutates false, idempotent true;
    24 Removexattr "removexattr" : RemovexattrReq -> EmptyReply,     mutates true,  idempotent false;
    25 Fallocate   "fallocate"   : FallocateReq   -> EmptyReply,     mutates true,  idempotent false;
    26 SyncAll     "syncall"     : SyncAllReq     -> EmptyReply,     mutates false, idempotent true;
    27 Ping        "ping"        : PingReq        -> EmptyReply,     mutates false, idempotent true;
    28 Stats       "stats"       : StatsReq       -> StatsReply,     mutates false, idempotent true;
    29 Forget      "forget"      : ForgetReq      -> EmptyReply,     mutates false, idempotent false;
    30 Access      "access"      : AccessReq      -> EmptyReply,     mutates false, idempotent true;
    31 Lseek       "lseek"       : LseekReq       -> LseekReply,     mutates false, idempotent true;
    32 TmpFile     "tmpfile"     : TmpFileReq     -> CreateReply,    mutates true,  idempotent false;
    33 L2Setup     "l2setup"     : L2SetupReq     -> L2SetupReply,   mutates false, idempotent true;
    34 L2Release   "l2release"   : L2ReleaseReq   -> EmptyReply,     mutates false, idempotent true;
}
