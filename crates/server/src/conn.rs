//! One connection: framing, the data paths (read, write) and replies. A header error
//! ends the connection; a body error is answered with its errno and the stream goes on.
//! Once a message has begun to arrive, each receive of the rest must get bytes within
//! the peer timeout (SO_RCVTIMEO), and each send of a reply must make progress within it
//! (SO_SNDTIMEO): a peer that stalls longer is dropped.

use crate::session::{Access, Begin, Claim, Session};
use crate::{PeerRule, Shared};
use std::io::{IoSlice, IoSliceMut, Read};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use zcfs_backend::{Ctx, Error};
use zcfs_protocol::{
    EmptyReply, NodeRef, Op, ProtoError, ReadReq, Reply, ReqHeader, Request, RespHeader,
    WriteReply, WriteReq, MAX_BODY, REQ_HDR, RESP_HDR,
};
use zcfs_transport::{
    discard, read_exact_vectored, read_message_start, write_all_vectored, Stream,
};

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnEnd {
    #[error("peer closed the connection")]
    Closed,
    #[error("peer stalled past the peer timeout while {0}")]
    Stalled(&'static str),
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
    #[error("malformed header: {0}")]
    Malformed(#[from] ProtoError),
    #[error("a {op} request panicked: {what}")]
    Panicked { op: &'static str, what: String },
}

impl ConnEnd {
    fn io(what: &'static str, e: std::io::Error) -> ConnEnd {
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => ConnEnd::Stalled(what),
            _ => ConnEnd::Io(what, e),
        }
    }
}

pub(crate) struct Conn<'a> {
    pub s: Stream,
    /// What the peer may name as its identity.
    pub rule: PeerRule,
    pub shared: &'a Shared,
    pub session: &'a Session,
    /// Some of the current request's reply went out (after a panic no answer fits).
    pub replying: bool,
}

/// What a panic carried, for the log.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

pub(crate) fn ro() -> Error {
    Error::new(libc::EROFS, "the export is read-only")
}

impl<'a> Conn<'a> {
    pub fn serve(&mut self) -> Result<(), ConnEnd> {
        let session: &'a Session = self.session;
        loop {
            let mut hb = [0u8; REQ_HDR];
            match read_message_start(&mut self.s, &mut hb) {
                Ok(true) => {}
                Ok(false) => return Err(ConnEnd::Closed),
                Err(e) => return Err(ConnEnd::io("receiving a header", e)),
            }
            let t = Instant::now();
            let h = ReqHeader::decode(&hb)?;
            let mut body = vec![0u8; h.body_len as usize];
            self.s
                .read_exact(&mut body)
                .map_err(|e| ConnEnd::io("receiving a body", e))?;
            self.replying = false;
            let (req, groups) = match Request::decode_with_groups(&h, &body) {
                Ok(r) => r,
                Err(e) => {
                    // Well framed, semantically wrong: answer it and stay in step.
                    self.shared
                        .stats
                        .rejected_invalid
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(op = h.op.name(), "invalid request: {e}");
                    self.discard(h.data_len)?;
                    self.shared.stats.record(h.op, false, 0, t);
                    self.reply(&h, Err(Error::new(e.errno(), e.to_string())), None)?;
                    continue;
                }
            };
            // A request with session side effects is executed once per id: a resend
            // (after a lost connection) is answered from the session's reply cache.
            let mut claim = None;
            if h.op.cached() {
                match session.begin(h.id, h.op) {
                    Begin::Replay(reply) => {
                        self.shared
                            .stats
                            .replies_replayed
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(
                            op = h.op.name(),
                            id = h.id,
                            "resend answered from the reply cache"
                        );
                        self.send(&reply)?;
                        continue;
                    }
                    Begin::Run(c) => claim = Some(c),
                }
            }
            // A panic (a bug reached by this request) ends this connection only: it is
            // answered with EIO if nothing of its reply went out yet, and the caller's
            // guards give back the slot, the socket and the session.
            let r = catch_unwind(AssertUnwindSafe(|| {
                self.handle(&h, req, groups, t, &mut claim)
            }));
            match r {
                Ok(r) => r?,
                Err(p) => {
                    let what = panic_message(&*p);
                    self.shared.stats.panics.fetch_add(1, Ordering::Relaxed);
                    self.shared.stats.record(h.op, false, 0, t);
                    if !self.replying {
                        let _ = self.reply(
                            &h,
                            Err(Error::new(libc::EIO, "the server failed this request")),
                            claim.take(),
                        );
                    }
                    return Err(ConnEnd::Panicked {
                        op: h.op.name(),
                        what,
                    });
                }
            }
        }
    }

    /// One decoded request, answered.
    fn handle(
        &mut self,
        h: &ReqHeader,
        req: Request,
        groups: Vec<u32>,
        t: Instant,
        claim: &mut Option<Claim<'a>>,
    ) -> Result<(), ConnEnd> {
        // Who the peer may be, then who the export lets it be.
        let cred = match self.rule.check(h.uid, h.gid, groups) {
            Ok(c) => self.shared.cfg.identity.map(c),
            Err(e) => {
                self.shared
                    .stats
                    .rejected_identity
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(op = h.op.name(), "refused: {}", e.msg());
                self.discard(h.data_len)?;
                self.shared.stats.record(h.op, false, 0, t);
                return self.reply(h, Err(e), claim.take());
            }
        };
        let ctx = Ctx { cred, pid: 0 };
        match req {
            Request::Write(w) => self.write(&ctx, h, w, t),
            Request::Read(r) => self.read(h, r, t),
            other => {
                let op = other.op();
                let r = self.dispatch(&ctx, other);
                self.shared.stats.record(op, r.is_ok(), 0, t);
                self.reply(h, r, claim.take())
            }
        }
    }

    fn discard(&mut self, n: u32) -> Result<(), ConnEnd> {
        discard(&mut self.s, n as usize).map_err(|e| ConnEnd::io("discarding a payload", e))
    }

    /// Send an encoded reply (header and body).
    fn send(&mut self, msg: &[u8]) -> Result<(), ConnEnd> {
        self.replying = true;
        write_all_vectored(&mut self.s, &mut [IoSlice::new(msg)])
            .map_err(|e| ConnEnd::io("sending a reply", e))
    }

    /// Answer `h` with `r`; with a claim, the reply is kept in the session's reply
    /// cache (before it is sent, so a resend racing it finds it).
    fn reply(
        &mut self,
        h: &ReqHeader,
        r: Result<Reply, Error>,
        claim: Option<Claim<'_>>,
    ) -> Result<(), ConnEnd> {
        let (rh, body) = match r.map(|rep| rep.encode()) {
            Ok(body) if body.len() <= MAX_BODY => {
                (RespHeader::ok(h.op, h.id, body.len() as u32, 0), body)
            }
            Ok(body) => {
                tracing::warn!(
                    op = h.op.name(),
                    len = body.len(),
                    "reply body over the limit"
                );
                (RespHeader::error(h.op, h.id, libc::EIO), Vec::new())
            }
            Err(e) => (RespHeader::error(h.op, h.id, e.errno), Vec::new()),
        };
        let rh = rh.encode();
        if let Some(claim) = claim {
            let mut msg = Vec::with_capacity(RESP_HDR + body.len());
            msg.extend_from_slice(&rh);
            msg.extend_from_slice(&body);
            let msg: Arc<[u8]> = msg.into();
            claim.finish(msg.clone());
            return self.send(&msg);
        }
        self.replying = true;
        write_all_vectored(&mut self.s, &mut [IoSlice::new(&rh), IoSlice::new(&body)])
            .map_err(|e| ConnEnd::io("sending a reply", e))
    }

    /// The backend handle a request names, checked against the session: fh 0 is "no
    /// handle"; any other must be this session's handle for that inode, opened for
    /// `access` (EBADF otherwise, as for a file descriptor). Also says whether the
    /// node's generation still needs a check (the handle vouches for it when it was
    /// opened at a known generation).
    pub(crate) fn resolve(
        &self,
        node: NodeRef,
        fh: u64,
        access: Access,
    ) -> Result<(u64, bool), Error> {
        if fh == 0 {
            return Ok((0, node.gen != 0));
        }
        let h = self.session.handle(fh, node.ino, access)?;
        if node.gen != 0 && h.gen != 0 {
            if node.gen != h.gen {
                return Err(crate::dispatch::stale(node));
            }
            return Ok((h.backend_fh, false));
        }
        Ok((h.backend_fh, node.gen != 0))
    }

    fn read(&mut self, h: &ReqHeader, r: ReadReq, t: Instant) -> Result<(), ConnEnd> {
        let backend = &*self.shared.backend;
        let checked = self
            .resolve(r.node, r.fh, Access::Read)
            .and_then(|(bfh, check)| {
                let held = if check {
                    Some(self.hold([r.node])?)
                } else {
                    None
                };
                Ok((bfh, held))
            });
        let (bfh, held) = match checked {
            Ok(x) => x,
            Err(e) => {
                self.shared.stats.record(Op::Read, false, 0, t);
                return self.reply(h, Err(e), None);
            }
        };
        let (s, replying) = (&mut self.s, &mut self.replying);
        let mut sent = false;
        let mut send_err: Option<std::io::Error> = None;
        let mut n = 0u64;
        let res = backend.read(r.node.ino, bfh, r.offset, r.size, &mut |slices| {
            // Header and the borrowed slices in one writev: no copy on our side.
            n = slices.iter().map(|x| x.len() as u64).sum();
            if n > r.size as u64 {
                return Err(Error::new(libc::EIO, "backend returned more than asked"));
            }
            let rh = RespHeader::ok(Op::Read, h.id, 0, n as u32).encode();
            let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(slices.len() + 1);
            iov.push(IoSlice::new(&rh));
            iov.extend(slices.iter().map(|x| IoSlice::new(x)));
            sent = true;
            *replying = true;
            write_all_vectored(s, &mut iov).map_err(|e| {
                let m = e.to_string();
                send_err = Some(e);
                Error::new(libc::EIO, m)
            })
        });
        drop(held);
        self.shared.stats.record(Op::Read, res.is_ok(), n, t);
        if let Some(e) = send_err {
            // The reply went out partly: the stream is no longer in step.
            return Err(ConnEnd::io("sending read data", e));
        }
        match res {
            Ok(()) if sent => Ok(()),
            // A backend that never called the sink: an empty read.
            Ok(()) => self.reply(h, Ok(Reply::Read(EmptyReply {})), None),
            Err(e) if sent => Err(ConnEnd::Io(
                "sending read data",
                std::io::Error::other(e.msg().into_owned()),
            )),
            Err(e) => self.reply(h, Err(e), None),
        }
    }

    fn write(&mut self, ctx: &Ctx, h: &ReqHeader, w: WriteReq, t: Instant) -> Result<(), ConnEnd> {
        let shared = self.shared;
        let backend = &*shared.backend;
        let checked = if shared.cfg.read_only {
            Err(ro())
        } else {
            self.resolve(w.node, w.fh, Access::Write)
                .and_then(|(bfh, check)| {
                    let held = if check {
                        Some(self.hold([w.node])?)
                    } else {
                        None
                    };
                    Ok((bfh, held))
                })
        };
        let (bfh, held) = match checked {
            Ok(x) => x,
            Err(e) => {
                self.discard(w.size)?;
                shared.stats.record(Op::Write, false, 0, t);
                return self.reply(h, Err(e), None);
            }
        };
        // Payload bytes taken off the socket; the rest is discarded after the call,
        // whatever the backend did, so the stream stays in step.
        let mut received = 0usize;
        let mut recv_err: Option<std::io::Error> = None;
        let size = w.size;
        let r = if shared.cfg.one_copy {
            let mut buf = vec![0u8; size as usize];
            received = buf.len();
            match self.s.read_exact(&mut buf) {
                Ok(()) => {
                    shared
                        .stats
                        .user_copy_bytes
                        .fetch_add(size as u64, Ordering::Relaxed);
                    backend.write(ctx, w.node.ino, bfh, w.offset, &buf)
                }
                Err(e) => {
                    recv_err = Some(e);
                    Err(Error::errno(libc::EIO))
                }
            }
        } else {
            let s = &mut self.s;
            backend.write_with(ctx, w.node.ino, bfh, w.offset, size, &mut |dst| {
                // Straight from the socket into the reserved destination blocks.
                let want: usize = dst.iter().map(|d| d.len()).sum();
                if received + want > size as usize {
                    return Err(Error::new(
                        libc::EIO,
                        "backend asked for more than the payload",
                    ));
                }
                received += want;
                let mut iov: Vec<IoSliceMut<'_>> =
                    dst.iter_mut().map(|d| IoSliceMut::new(d)).collect();
                read_exact_vectored(s, &mut iov).map_err(|e| {
                    let m = e.to_string();
                    recv_err = Some(e);
                    Error::new(libc::EIO, m)
                })
            })
        };
        // Refused for room before any byte was taken: copy-on-write wants room for the
        // whole payload at once, but an overwrite larger than the free space still fits
        // in pieces. Take the payload into memory (one copy, counted) and let the backend
        // write it piece by piece.
        let r = match r {
            Err(e) if e.errno == libc::ENOSPC && received == 0 && recv_err.is_none() => {
                let mut buf = vec![0u8; size as usize];
                received = buf.len();
                match self.s.read_exact(&mut buf) {
                    Ok(()) => {
                        shared
                            .stats
                            .user_copy_bytes
                            .fetch_add(size as u64, Ordering::Relaxed);
                        backend.write(ctx, w.node.ino, bfh, w.offset, &buf)
                    }
                    Err(e) => {
                        recv_err = Some(e);
                        Err(Error::errno(libc::EIO))
                    }
                }
            }
            r => r,
        };
        drop(held);
        if let Some(e) = recv_err {
            return Err(ConnEnd::io("receiving write data", e));
        }
        // Rejected before the payload was read (no such file, no space, ...).
        self.discard(size - received as u32)?;
        shared.stats.record(
            Op::Write,
            r.is_ok(),
            if r.is_ok() { size as u64 } else { 0 },
            t,
        );
        self.reply(
            h,
            r.map(|written| Reply::Write(WriteReply { written })),
            None,
        )
    }
}
