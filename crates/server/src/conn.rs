//! One connection: framing, the data paths (read, write) and replies. A header error
//! ends the connection; a body error is answered with its errno and the stream goes on.
//! Once a message has begun to arrive, each receive of the rest must get bytes within
//! the peer timeout (SO_RCVTIMEO), and each send of a reply must make progress within it
//! (SO_SNDTIMEO): a peer that stalls longer is dropped.
//!
//! A connection's requests run one by one on its thread, except a reply that waits for
//! something the requests after it need not wait for (`Awaited`: the layer-2 fence, a
//! resend whose first attempt still runs). Such a reply waits on a thread of its own
//! (at most `MAX_WAITING_REPLIES` per connection; beyond, on the connection's thread,
//! watching the socket for the connection's end since nothing reads it meanwhile) and
//! goes out when it is ready; the client matches replies by id. Every reply is written whole under the connection's
//! writer lock (`Out`), so tags follow wire order.

use crate::dispatch::Held;
use crate::session::{lock, Access, Begin, Claim, Session};
use crate::{PeerRule, Shared};
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zcfs_backend::{payload_to_vec, Ctx, Error, WritePayload, R_OK, W_OK};
use zcfs_protocol::channel::{Mac, MacError, MessageMac, TAG_LEN};
use zcfs_protocol::{
    EmptyReply, NodeRef, Op, ProtoError, ReadReq, Reply, ReqHeader, Request, RespHeader,
    WriteReply, WriteReq, MAX_BODY, REQ_HDR, RESP_HDR,
};
use zcfs_transport::{
    fill_message_start, message_time, write_all_vectored, Patient, RecvBuf, Start, Stream, Take,
};

/// Most replies one connection has waiting off its thread at once (`Awaited`). A
/// client has one fence and a few resends out at a time; beyond the bound such a reply
/// waits on the connection's own thread (correct, but the requests after it on the
/// connection wait too), so a peer cannot make the server start threads without end.
pub const MAX_WAITING_REPLIES: usize = 8;
/// How often a waiting reply looks whether its connection ended (no one to answer).
const WAIT_SLICE: Duration = Duration::from_millis(50);

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
    #[error("{0}")]
    Forged(#[from] MacError),
    #[error("idle for the idle timeout")]
    Idle,
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

/// What a request is executed in, whichever lane (TCP or layer 2) it came by: the
/// session, and what the connection that set the session up may name as its identity.
/// Permission, identity and handle logic live here, once for both lanes.
#[derive(Clone)]
pub(crate) struct Lane<'a> {
    /// What the peer may name as its identity.
    pub rule: PeerRule,
    pub shared: &'a Shared,
    pub session: &'a Session,
}

impl<'a> Lane<'a> {
    /// The caller of request `h` as the export lets it be, or the error to answer
    /// (counted).
    pub(crate) fn caller(&self, h: &ReqHeader, groups: Vec<u32>) -> Result<Ctx, Error> {
        match self.rule.check(h.uid, h.gid, groups) {
            Ok(c) => Ok(Ctx {
                cred: self.shared.cfg.identity.map(c),
                pid: 0,
            }),
            Err(e) => {
                self.shared
                    .stats
                    .rejected_identity
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(op = h.op.name(), "refused: {}", e.msg());
                Err(e)
            }
        }
    }

    /// The backend handle a request names, checked against the session: fh 0 is "no
    /// handle"; any other must be this session's handle for that inode, opened for
    /// `access` (EBADF otherwise, as for a file descriptor). Also says whether the
    /// node still needs `hold` (always without a handle; with one, the handle vouches
    /// for it when it was opened at a known generation).
    pub(crate) fn resolve(
        &self,
        ctx: &Ctx,
        node: NodeRef,
        fh: u64,
        access: Access,
    ) -> Result<(u64, bool), Error> {
        if fh == 0 {
            // No handle: nothing was authorized at an open, so the caller is checked
            // now, as open would check it (the backend trusts its handle 0).
            let mask = match access {
                Access::Read => R_OK,
                Access::Write => W_OK,
                Access::Any => 0,
            };
            if mask != 0 {
                self.shared.backend.access(ctx, node.ino, mask)?;
            }
            // Held for the operation (`hold`), with or without a generation: the
            // node must be reachable by this session.
            return Ok((0, true));
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

    /// `resolve`, with the node's generation check held for the operation when the
    /// handle did not already answer for it.
    pub(crate) fn resolve_held(
        &self,
        ctx: &Ctx,
        node: NodeRef,
        fh: u64,
        access: Access,
    ) -> Result<(u64, Option<Held<'a, 1>>), Error> {
        let (bfh, check) = self.resolve(ctx, node, fh, access)?;
        let held = if check {
            Some(self.hold([node])?)
        } else {
            None
        };
        Ok((bfh, held))
    }
}

/// Starts a waiting reply's thread (scoped to the connection's: it ends before the
/// connection gives its lane and session back).
pub(crate) type Spawn<'a> = dyn Fn(Box<dyn FnOnce() + Send + 'a>) -> std::io::Result<()> + 'a;

/// The `Spawn` of a connection served inside `scope`.
pub(crate) fn spawner<'s, 'e>(scope: &'s std::thread::Scope<'s, 'e>) -> Box<Spawn<'s>> {
    Box::new(move |job| {
        std::thread::Builder::new()
            .name("zcfs-reply-wait".into())
            .spawn_scoped(scope, job)
            .map(drop)
    })
}

pub(crate) struct Conn<'a> {
    /// The socket requests are read from (replies go out through `out`).
    pub s: Stream,
    pub lane: Lane<'a>,
    /// The session (`lane.session`), to hand to the layer-2 lane.
    pub attached: Arc<Session>,
    /// This connection's hold of the server's layer-2 interface (given back when the
    /// connection ends).
    pub l2_hold: Option<crate::l2::Hold>,
    /// Some of the current request's reply went out (after a panic no answer fits).
    pub replying: bool,
    /// The current request's reply may be held back (`Out::reply_as`): it is a write
    /// (write-behind sends them in streams), or more requests came with it. A lone
    /// request's reply goes out at once, without asking the socket what is waiting.
    pub hold_reply: bool,
    /// The channel's receive MAC when authenticated (the send MAC is in `out`).
    pub rx: Option<Mac>,
    /// The message being received: its deadline and what is left of its payload.
    pub inbound: Inbound,
    /// Bytes received ahead: the current message's header and body, and the
    /// messages behind it when the client had several in flight.
    pub rb: RecvBuf,
    /// Where replies are written, by this thread and the waiting replies' threads.
    pub out: &'a Out,
    pub spawn: Box<Spawn<'a>>,
}

/// The sending side of a connection: the socket and its send MAC, held together (a
/// reply's tag is computed in the order it goes on the wire), shared by the
/// connection's thread and its waiting replies. The lock is held for one reply's
/// write, which the send timeout bounds, and only this connection's replies wait for
/// it: it is the connection's own socket.
pub(crate) struct Out {
    w: Mutex<Writer>,
    /// The same socket, to shut it down without waiting for the writer.
    control: Stream,
    /// The connection ended: waiting replies stop waiting.
    closed: AtomicBool,
    /// Replies waiting on threads of their own now (at most `MAX_WAITING_REPLIES`).
    waiting: AtomicUsize,
    /// Where the held-back replies are counted.
    stats: Arc<crate::ServerStats>,
}

struct Writer {
    s: Stream,
    tx: Option<Mac>,
    /// A write failed part way: the stream is out of step, nothing more goes out.
    broken: bool,
    /// Replies of the connection's thread held back while more requests were already
    /// here (`Out::reply_as`), tags computed: they go out before anything else is
    /// written, and before the thread waits for the next request.
    held: Vec<u8>,
    held_replies: usize,
}

/// The most replies held back at once (`Out::reply_as`) ...
pub const HELD_REPLIES_MAX: usize = 16;
/// ... and the most bytes of them.
pub const HELD_REPLY_BYTES: usize = 16 << 10;

impl Out {
    pub fn new(
        s: &Stream,
        tx: Option<Mac>,
        stats: Arc<crate::ServerStats>,
    ) -> std::io::Result<Out> {
        Ok(Out {
            w: Mutex::new(Writer {
                s: s.try_clone()?,
                tx,
                broken: false,
                held: Vec::new(),
                held_replies: 0,
            }),
            control: s.try_clone()?,
            closed: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            stats,
        })
    }

    /// The connection ended (or must): waiting replies stop, a write in progress fails
    /// now, and the connection's thread stops reading.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = self.control.shutdown(std::net::Shutdown::Both);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Write one reply with `f`, which gets the socket and the send MAC, under the
    /// writer's lock. After a failed write nothing more is sent and the connection
    /// ends: the stream is out of step.
    fn write(
        &self,
        f: impl FnOnce(&mut Stream, Option<&mut Mac>) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let mut w = lock(&self.w);
        if w.broken || self.is_closed() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the connection's replies ended",
            ));
        }
        if w.held_replies > 0 {
            self.stats
                .replies_held
                .fetch_add(w.held_replies as u64, Ordering::Relaxed);
            self.stats.held_reply_sends.fetch_add(1, Ordering::Relaxed);
        }
        let Writer { s, tx, held, .. } = &mut *w;
        let r = Self::write_held(s, held).and_then(|()| f(s, tx.as_mut()));
        w.held_replies = 0;
        if r.is_err() {
            w.broken = true;
            drop(w);
            self.close();
        }
        r
    }

    /// The replies held back go out (cleared either way: after a failed write the
    /// connection ends).
    fn write_held(s: &mut Stream, held: &mut Vec<u8>) -> std::io::Result<()> {
        if held.is_empty() {
            return Ok(());
        }
        let r = write_all_vectored(s, &mut [IoSlice::new(held)]);
        held.clear();
        // One large reply (a readdir's) held back does not keep its memory for the
        // connection's life.
        if held.capacity() > 2 * HELD_REPLY_BYTES {
            held.shrink_to(HELD_REPLY_BYTES);
        }
        r
    }

    /// Send the replies held back, unless `more_here` says another request is
    /// already here (its reply then joins them). Called by the connection's thread
    /// before it reads the next request: it never waits for a request with replies
    /// held.
    fn flush_held_unless(&self, more_here: impl FnOnce() -> bool) -> Result<(), ConnEnd> {
        let w = lock(&self.w);
        if w.held.is_empty() || (w.held_replies < HELD_REPLIES_MAX && more_here()) {
            return Ok(());
        }
        drop(w);
        self.send_held()
    }

    /// Send the replies held back now (`write` sends them before anything).
    fn send_held(&self) -> Result<(), ConnEnd> {
        self.write(|_, _| Ok(()))
            .map_err(|e| ConnEnd::io("sending replies", e))
    }

    /// A reply's header and body (and tag) held back (`hold`) or sent now. Held ones
    /// are sent once `HELD_REPLIES_MAX` or `HELD_REPLY_BYTES` are reached.
    fn send_parts_as(&self, rh: &[u8], body: &[u8], hold: bool) -> Result<(), ConnEnd> {
        if !hold {
            return self.send_parts(rh, body);
        }
        let full = {
            let mut w = lock(&self.w);
            if w.broken || self.is_closed() {
                drop(w);
                return self.send_parts(rh, body);
            }
            let Writer { tx, held, .. } = &mut *w;
            let tag = tx.as_mut().map(|tx| tx.begin(rh, body).tag());
            held.extend_from_slice(rh);
            held.extend_from_slice(body);
            if let Some(t) = &tag {
                held.extend_from_slice(t);
            }
            w.held_replies += 1;
            w.held_replies >= HELD_REPLIES_MAX || w.held.len() >= HELD_REPLY_BYTES
        };
        if full {
            return self.send_held();
        }
        Ok(())
    }

    /// Send a reply's header and body, with their tag on an authenticated connection.
    fn send_parts(&self, rh: &[u8], body: &[u8]) -> Result<(), ConnEnd> {
        self.write(|s, tx| {
            let tag = tx.map(|tx| tx.begin(rh, body).tag());
            let tag: &[u8] = tag.as_ref().map_or(&[], |t| t);
            write_all_vectored(
                s,
                &mut [IoSlice::new(rh), IoSlice::new(body), IoSlice::new(tag)],
            )
        })
        .map_err(|e| ConnEnd::io("sending a reply", e))
    }

    /// Send an encoded reply (header and body).
    fn send(&self, msg: &[u8]) -> Result<(), ConnEnd> {
        self.send_as(msg, false)
    }

    fn send_as(&self, msg: &[u8], hold: bool) -> Result<(), ConnEnd> {
        self.send_parts_as(&msg[..RESP_HDR], &msg[RESP_HDR..], hold)
    }

    /// Answer `h` with `r`; with a claim, the reply is kept in the session's reply
    /// cache (before it is sent, so a resend racing it finds it).
    fn reply(
        &self,
        h: &ReqHeader,
        r: Result<Reply, Error>,
        claim: Option<Claim<'_>>,
    ) -> Result<(), ConnEnd> {
        self.reply_as(h, r, claim, false)
    }

    /// `reply`, or (`hold`, from the connection's own thread only) held back while
    /// more requests are already here (`flush_held_unless`), so that a client's stream
    /// of requests (gathered writes) is answered by one send instead of one per
    /// request.
    fn reply_as(
        &self,
        h: &ReqHeader,
        r: Result<Reply, Error>,
        claim: Option<Claim<'_>>,
        hold: bool,
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
            return self.send_as(&msg, hold);
        }
        self.send_parts_as(&rh, &body, hold)
    }
}

/// A connection's place for a waiting reply (counted in the server's
/// `replies_waiting` too), given back when dropped: its thread ended, or never started.
struct WaitingPlace<'a>(&'a Out, &'a crate::ServerStats);

impl Drop for WaitingPlace<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
        self.1.replies_waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a reply waits for that the requests after it on its connection need not.
#[derive(Clone)]
enum Awaited {
    /// The fence (`L2Release`): until no layer-2 request of the session runs.
    Fence,
    /// A resend (same id) of a cached request whose first attempt still runs (on the
    /// lane, or on a connection the client gave up on): until that attempt's reply is
    /// in the cache. Should it end without one (it panicked), this one runs.
    Resend { req: Request, groups: Vec<u32> },
}

/// Whether the socket `s` was hung up: the peer shut its side down or reset it, or this
/// server shut it down (`Server::shutdown`, a lane's fence), with the reason the
/// connection ends. Only looks (a poll that does not wait): nothing is read, so the
/// bytes of a request after the one waiting stay where they are.
fn hung_up(s: &Stream) -> Option<ConnEnd> {
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: `p` is one valid pollfd that lives across the call, the count is 1, and
    // the descriptor is this connection's socket, open for as long as `s` is.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n <= 0 {
        // Nothing (or the poll failed, EINTR say): looked at again in a slice, and
        // the wait stays bounded by its deadline whatever poll says.
        return None;
    }
    if p.revents & libc::POLLERR != 0 {
        let e = match s {
            Stream::Tcp(t) => t.take_error(),
            Stream::Unix(u) => u.take_error(),
        };
        let e = match e {
            Ok(Some(e)) | Err(e) => e,
            Ok(None) => std::io::Error::other("the socket reported an error"),
        };
        return Some(ConnEnd::io("waiting for a reply", e));
    }
    (p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLNVAL) != 0).then_some(ConnEnd::Closed)
}

/// How a waiting reply learns that its connection ended.
#[derive(Clone, Copy)]
enum Watch<'s> {
    /// On a thread of its own: the connection's thread reads on, meets the end and
    /// closes `Out`.
    Closed,
    /// On the connection's thread (over the bound): no one reads, so the wait watches
    /// the socket itself (`hung_up`) besides `Out`, and the connection ends with it.
    Socket(&'s Stream),
}

/// Wait for `what`, at most the peer timeout from the request's arrival `t`, and answer
/// `h` (ETIMEDOUT when it is not there by then: the client asks again). Returns early,
/// unanswered, once the connection ended: no one is left to answer (with the reason
/// when it waits on the connection's thread, `Watch::Socket`, whose connection then
/// ends: nothing after it is read).
fn answer_awaited(
    lane: &Lane<'_>,
    out: &Out,
    h: &ReqHeader,
    t: Instant,
    what: Awaited,
    watch: Watch<'_>,
) -> Result<(), ConnEnd> {
    // Ok(()) once the connection ended (no one to answer), or the end, for the wait on
    // the connection's thread.
    let ended = || -> Option<Result<(), ConnEnd>> {
        match watch {
            Watch::Closed => out.is_closed().then_some(Ok(())),
            Watch::Socket(s) => {
                if out.is_closed() {
                    // A waiting reply's write failed, or a panic: the socket is shut.
                    return Some(Err(ConnEnd::Closed));
                }
                hung_up(s).map(Err)
            }
        }
    };
    let shared = lane.shared;
    let patience = shared.cfg.peer_timeout;
    let deadline = t + patience;
    let slice = || (Instant::now() + WAIT_SLICE).min(deadline);
    let timed_out = |what: &str| {
        shared.stats.record(h.op, false, 0, t);
        Err(Error::new(
            libc::ETIMEDOUT,
            format!("{what} still runs after {patience:?}"),
        ))
    };
    match what {
        Awaited::Fence => loop {
            if let Some(end) = ended() {
                return end;
            }
            let quiet = shared
                .l2
                .get()
                .is_none_or(|svc| svc.wait_quiet(lane.session, slice()));
            if quiet {
                shared.stats.record(Op::L2Release, true, 0, t);
                return out.reply(h, Ok(Reply::L2Release(EmptyReply {})), None);
            }
            if Instant::now() >= deadline {
                return out.reply(h, timed_out("a layer-2 request of this session"), None);
            }
        },
        Awaited::Resend { req, groups } => loop {
            if let Some(end) = ended() {
                return end;
            }
            match lane.session.begin_until(h.id, h.op, slice()) {
                Some(Begin::Replay(reply)) => {
                    shared
                        .stats
                        .replies_replayed
                        .fetch_add(1, Ordering::Relaxed);
                    return out.send(&reply);
                }
                Some(Begin::Run(claim)) => {
                    // Cached requests carry no payload and are none of read, write or
                    // the lane's own: `dispatch` runs them all.
                    let r = lane
                        .caller(h, groups)
                        .and_then(|ctx| lane.dispatch(&ctx, req));
                    shared.stats.record(h.op, r.is_ok(), 0, t);
                    return out.reply(h, r, Some(claim));
                }
                None if Instant::now() >= deadline => {
                    return out.reply(h, timed_out("its first attempt"), None);
                }
                None => {}
            }
        },
    }
}

/// The rest of the message being received after its header and body: one deadline for
/// all of it, and (in full integrity mode) the MAC its payload is checked with.
pub(crate) struct Inbound {
    deadline: Instant,
    /// Payload bytes not taken off the socket yet.
    left: usize,
    /// Payload bytes that came out of the receive buffer (copied) rather than
    /// straight off the socket.
    from_buffer: u64,
    /// Full mode: the message's MAC, continued over the payload; its data tag is
    /// read and checked when the last payload byte is in.
    mac: Option<MessageMac>,
}

impl Inbound {
    pub fn new() -> Inbound {
        Inbound {
            deadline: Instant::now(),
            left: 0,
            from_buffer: 0,
            mac: None,
        }
    }

    /// Receive exactly `bufs` of the payload (within the message's deadline); in full
    /// mode the data tag is checked as soon as the last byte is in, before anyone
    /// uses the payload.
    fn recv(
        &mut self,
        s: &mut Stream,
        rb: &mut RecvBuf,
        patience: std::time::Duration,
        dst: &mut [&mut [u8]],
    ) -> Result<(), ConnEnd> {
        let n: usize = dst.iter().map(|b| b.len()).sum();
        if n > self.left {
            return Err(ConnEnd::Io(
                "receiving write data",
                std::io::Error::other("more than the payload asked for"),
            ));
        }
        let mut r = Patient::new(s, self.deadline, patience);
        // What the receive buffer holds is copied; the rest lands in `dst` directly.
        self.from_buffer +=
            rb.read_exact_vectored_through(&mut r, dst)
                .map_err(|e| ConnEnd::io("receiving write data", e))? as u64;
        self.left -= n;
        if let Some(m) = &mut self.mac {
            for b in dst.iter() {
                m.data(b);
            }
            if self.left == 0 {
                let mut tag = [0u8; TAG_LEN];
                rb.read_exact_through(&mut r, &mut tag)
                    .map_err(|e| ConnEnd::io("receiving a payload tag", e))?;
                self.mac.take().expect("checked above").verify_data(&tag)?;
            }
        }
        Ok(())
    }

    /// Take what is left of the payload off the socket and drop it (a write refused
    /// before its data was used), checking its tag all the same.
    fn discard(
        &mut self,
        s: &mut Stream,
        rb: &mut RecvBuf,
        patience: std::time::Duration,
    ) -> Result<(), ConnEnd> {
        let mut buf = vec![0u8; self.left.min(64 << 10)];
        while self.left > 0 {
            let k = self.left.min(buf.len());
            self.recv(s, rb, patience, &mut [&mut buf[..k]])?;
        }
        Ok(())
    }
}

/// A write's payload still on the socket. The backend takes it straight into the
/// blocks that will hold it; dropping the payload discards what was not taken (checking
/// its tag in full mode), so the stream stays in step. A receive that fails leaves the
/// connection's end in `failed` and the backend an EIO.
struct SocketPayload<'c> {
    s: &'c mut Stream,
    rb: &'c mut RecvBuf,
    inbound: &'c mut Inbound,
    patience: std::time::Duration,
    failed: &'c mut Option<ConnEnd>,
}

impl WritePayload for SocketPayload<'_> {
    fn remaining(&self) -> usize {
        self.inbound.left
    }
    fn fill(&mut self, dst: &mut [&mut [u8]]) -> zcfs_backend::Result<()> {
        if self.failed.is_some() {
            return Err(Error::new(libc::EIO, "the payload was lost"));
        }
        self.inbound
            .recv(self.s, self.rb, self.patience, dst)
            .map_err(|e| {
                let err = Error::new(libc::EIO, e.to_string());
                *self.failed = Some(e);
                err
            })
    }
}

impl Drop for SocketPayload<'_> {
    fn drop(&mut self) {
        if self.failed.is_none() {
            if let Err(e) = self.inbound.discard(self.s, self.rb, self.patience) {
                *self.failed = Some(e);
            }
        }
    }
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

impl<'a> std::ops::Deref for Conn<'a> {
    type Target = Lane<'a>;
    fn deref(&self) -> &Lane<'a> {
        &self.lane
    }
}

impl<'a> Conn<'a> {
    pub fn serve(&mut self) -> Result<(), ConnEnd> {
        let end = self.serve_requests();
        // Replies held back when the connection ends (a bad message after good ones,
        // a peer that stopped sending mid-message) are of requests that ran: they go
        // out if the socket still takes them.
        if end.is_err() {
            let _ = self.out.flush_held_unless(|| false);
        }
        end
    }

    fn serve_requests(&mut self) -> Result<(), ConnEnd> {
        let session: &'a Session = self.session;
        let patience = self.shared.cfg.peer_timeout;
        let idle = self.shared.cfg.idle_timeout;
        let mut after_write = false;
        loop {
            // After a write, the next request is likely another: its payload must stay
            // on the socket to be received in place, so take only its header. Else
            // take whatever came (the requests behind this one, when a client has
            // several in flight).
            let take = if after_write {
                Take::Exact
            } else {
                Take::Greedy
            };
            // Replies held back go out now, unless the next request is already here
            // whole (header, body, tags and payload: nothing below waits for the
            // peer) and may run without waiting (review 34b: held while a header's
            // rest or a body was still coming).
            let tag_len = if self.rx.is_some() { TAG_LEN } else { 0 };
            let (rb, s, rx) = (&self.rb, &self.s, &self.rx);
            self.out.flush_held_unless(|| {
                next_here_whole(rb, s, tag_len, |n| {
                    rx.as_ref().is_some_and(|rx| rx.data_tagged(n))
                })
                .is_some_and(|op| matches!(op, Op::Getattr | Op::Lookup | Op::Forget | Op::Write))
            })?;
            match fill_message_start(&mut self.s, &mut self.rb, REQ_HDR, take, patience, idle) {
                Ok(Start::Message) => {}
                Ok(Start::Closed) => return Err(ConnEnd::Closed),
                Ok(Start::Idle) => return Err(ConnEnd::Idle),
                Err(e) => return Err(ConnEnd::io("receiving a header", e)),
            }
            let mut hb = [0u8; REQ_HDR];
            self.rb.take_into(&mut hb);
            let t = Instant::now();
            let h = ReqHeader::decode(&hb)?;
            after_write = h.op == Op::Write;
            self.shared.stats.tcp_requests[h.op as usize].fetch_add(1, Ordering::Relaxed);
            // From the header on, the whole message has one deadline.
            self.inbound = Inbound {
                deadline: t + message_time(patience, h.data_len as u64),
                left: h.data_len as usize,
                from_buffer: 0,
                mac: None,
            };
            let tag_len = if self.rx.is_some() { TAG_LEN } else { 0 };
            let mut body = vec![0u8; h.body_len as usize + tag_len];
            self.rb
                .read_exact_through(
                    &mut Patient::new(&mut self.s, self.inbound.deadline, patience),
                    &mut body,
                )
                .map_err(|e| ConnEnd::io("receiving a body", e))?;
            if let Some(rx) = &mut self.rx {
                // Nothing of a message is acted on before its tag checked out.
                let tag: [u8; TAG_LEN] = body[h.body_len as usize..].try_into().expect("TAG_LEN");
                body.truncate(h.body_len as usize);
                let m = rx.begin(&hb, &body);
                m.verify(&tag)?;
                if rx.data_tagged(h.data_len as usize) {
                    self.inbound.mac = Some(m);
                }
            }
            self.replying = false;
            self.hold_reply = h.op == Op::Write || self.rb.len() >= REQ_HDR;
            let (req, groups) = match Request::decode_with_groups(&h, &body) {
                Ok(r) => r,
                Err(e) => {
                    // Well framed, semantically wrong: answer it and stay in step.
                    self.shared
                        .stats
                        .rejected_invalid
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(op = h.op.name(), "invalid request: {e}");
                    self.discard()?;
                    self.shared.stats.record(h.op, false, 0, t);
                    self.reply(&h, Err(Error::new(e.errno(), e.to_string())), None)?;
                    continue;
                }
            };
            // Replies held back wait only for a request that runs at once: the loop's
            // top saw it here whole; a write that commits runs the backend's flush,
            // which may wait (review 34b), so they go out before it.
            if matches!(&req, Request::Write(w) if w.commit) {
                self.out.flush_held_unless(|| false)?;
            }
            // A request with session side effects is executed once per id: a resend
            // (after a lost connection) is answered from the session's reply cache.
            let mut claim = None;
            let mut first_runs = false;
            if h.op.cached() {
                match session.begin_until(h.id, h.op, Instant::now()) {
                    Some(Begin::Replay(reply)) => {
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
                    Some(Begin::Run(c)) => claim = Some(c),
                    None => first_runs = true,
                }
            }
            // A panic (a bug reached by this request) ends this connection only: it is
            // answered with EIO if nothing of its reply went out yet, and the caller's
            // guards give back the slot, the socket and the session.
            let r = catch_unwind(AssertUnwindSafe(|| {
                if first_runs {
                    // Its first attempt is still running: the reply waits for it off
                    // this thread, so the requests after it here do not.
                    self.wait_then_answer(&h, t, Awaited::Resend { req, groups })
                } else {
                    self.handle(&h, req, groups, t, &mut claim)
                }
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
        let ctx = match self.lane.caller(h, groups) {
            Ok(c) => c,
            Err(e) => {
                self.discard()?;
                self.shared.stats.record(h.op, false, 0, t);
                return self.reply(h, Err(e), claim.take());
            }
        };
        match req {
            Request::Write(w) => self.write(&ctx, h, w, t),
            Request::Read(r) => self.read(&ctx, h, r, t),
            Request::L2Setup(r) => {
                let reply = match self.shared.l2.get() {
                    Some(svc) => svc.setup(
                        self.shared.cfg.secret.as_deref(),
                        self.attached.clone(),
                        self.lane.rule.clone(),
                        &r,
                        &mut self.l2_hold,
                    ),
                    None => crate::l2::refusal(
                        "the server has no layer-2 interface (zcfs serve --l2 IFACE)",
                    ),
                };
                self.shared.stats.record(Op::L2Setup, reply.accepted, 0, t);
                self.reply(h, Ok(Reply::L2Setup(reply)), claim.take())
            }
            Request::L2Release(_) => {
                // The fence: the lane is the session's no more at once; answered once
                // no lane request of this session runs (at once when none does).
                let quiet = self
                    .shared
                    .l2
                    .get()
                    .is_none_or(|svc| svc.release(self.lane.session));
                self.l2_hold = None;
                if !quiet {
                    return self.wait_then_answer(h, t, Awaited::Fence);
                }
                self.shared.stats.record(Op::L2Release, true, 0, t);
                self.reply(h, Ok(Reply::L2Release(EmptyReply {})), claim.take())
            }
            other => {
                let op = other.op();
                let r = self.dispatch(&ctx, other);
                self.shared.stats.record(op, r.is_ok(), 0, t);
                self.reply(h, r, claim.take())
            }
        }
    }

    /// Drop what is left of the current request's payload.
    fn discard(&mut self) -> Result<(), ConnEnd> {
        let patience = self.shared.cfg.peer_timeout;
        self.inbound.discard(&mut self.s, &mut self.rb, patience)
    }

    /// Send an encoded reply (header and body).
    fn send(&mut self, msg: &[u8]) -> Result<(), ConnEnd> {
        self.replying = true;
        self.out.send_as(msg, self.hold_reply)
    }

    /// Answer `h` with `r` (`Out::reply`).
    fn reply(
        &mut self,
        h: &ReqHeader,
        r: Result<Reply, Error>,
        claim: Option<Claim<'_>>,
    ) -> Result<(), ConnEnd> {
        self.replying = true;
        self.out.reply_as(h, r, claim, self.hold_reply)
    }

    /// Answer `h` once `what` is there, on a thread of its own while the connection
    /// has fewer than `MAX_WAITING_REPLIES` waiting (else, or with no thread to be
    /// had, here: the requests after it wait too, as they all did before).
    fn wait_then_answer(
        &mut self,
        h: &ReqHeader,
        t: Instant,
        what: Awaited,
    ) -> Result<(), ConnEnd> {
        let out = self.out;
        let placed = out
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_WAITING_REPLIES).then_some(n + 1)
            })
            .is_ok();
        if placed {
            // Given back with the job, run or not.
            self.shared
                .stats
                .replies_waiting
                .fetch_add(1, Ordering::Relaxed);
            let place = WaitingPlace(out, &self.shared.stats);
            let (lane, h2, what2) = (self.lane.clone(), *h, what.clone());
            let job = Box::new(move || {
                let _place = place;
                let r = catch_unwind(AssertUnwindSafe(|| {
                    answer_awaited(&lane, out, &h2, t, what2, Watch::Closed)
                }));
                match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(op = h2.op.name(), "a waiting reply failed: {e}");
                        out.close();
                    }
                    Err(p) => {
                        // As a panic on the connection's thread: the connection ends.
                        lane.shared.stats.panics.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(
                            op = h2.op.name(),
                            "a waiting reply panicked: {}",
                            panic_message(&*p)
                        );
                        out.close();
                    }
                }
            });
            match (self.spawn)(job) {
                Ok(()) => return Ok(()),
                Err(e) => tracing::warn!(
                    op = h.op.name(),
                    "no thread for a waiting reply, it waits on its connection's: {e}"
                ),
            }
        } else {
            tracing::debug!(
                op = h.op.name(),
                limit = MAX_WAITING_REPLIES,
                "replies waiting at the bound: this one waits on its connection's thread"
            );
        }
        // It may wait long, for something the client does after the replies held
        // back reach it: they go out first.
        out.flush_held_unless(|| false)?;
        self.replying = true;
        answer_awaited(&self.lane, out, h, t, what, Watch::Socket(&self.s))
    }

    fn read(&mut self, ctx: &Ctx, h: &ReqHeader, r: ReadReq, t: Instant) -> Result<(), ConnEnd> {
        let backend = &*self.shared.backend;
        let checked = self.resolve_held(ctx, r.node, r.fh, Access::Read);
        let (bfh, held) = match checked {
            Ok(x) => x,
            Err(e) => {
                self.shared.stats.record(Op::Read, false, 0, t);
                return self.reply(h, Err(e), None);
            }
        };
        let (out, replying) = (self.out, &mut self.replying);
        let mut sent = false;
        let mut send_err: Option<std::io::Error> = None;
        let mut n = 0u64;
        let res = backend.read(
            r.node.ino,
            bfh,
            r.offset,
            r.size,
            &mut |slices: &[&[u8]]| {
                // Header and the borrowed slices in one writev: no copy on our side.
                n = slices.iter().map(|x| x.len() as u64).sum();
                if n > r.size as u64 {
                    return Err(Error::new(libc::EIO, "backend returned more than asked"));
                }
                let rh = RespHeader::ok(Op::Read, h.id, 0, n as u32).encode();
                sent = true;
                *replying = true;
                out.write(|s, tx| {
                    // The tags: over the header, and (full mode) over the data too,
                    // hashed where it lies (no copy).
                    let tagged = tx.is_some();
                    let (mut tag, mut data_tag) = ([0u8; TAG_LEN], None);
                    if let Some(tx) = tx {
                        let mut m = tx.begin(&rh, &[]);
                        tag = m.tag();
                        if tx.data_tagged(n as usize) {
                            slices.iter().for_each(|x| m.data(x));
                            data_tag = Some(m.data_tag());
                        }
                    }
                    let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(slices.len() + 3);
                    iov.push(IoSlice::new(&rh));
                    if tagged {
                        iov.push(IoSlice::new(&tag));
                    }
                    iov.extend(slices.iter().map(|x| IoSlice::new(x)));
                    if let Some(t) = &data_tag {
                        iov.push(IoSlice::new(t));
                    }
                    write_all_vectored(s, &mut iov)
                })
                .map_err(|e| {
                    let m = e.to_string();
                    send_err = Some(e);
                    Error::new(libc::EIO, m)
                })
            },
        );
        drop(held);
        self.shared.stats.record(Op::Read, res.is_ok(), n, t);
        if let Some(e) = send_err {
            // The reply went out partly: the stream is no longer in step.
            return Err(ConnEnd::io("sending read data", e));
        }
        match res {
            Ok(()) if sent => Ok(()),
            // A backend that never sent a reply (against the contract): an empty read.
            Ok(()) => self.reply(h, Ok(Reply::Read(EmptyReply {})), None),
            Err(e) if sent => Err(ConnEnd::Io(
                "sending read data",
                std::io::Error::other(e.msg().into_owned()),
            )),
            Err(e) => self.reply(h, Err(e), None),
        }
    }

    /// The one-copy path: the payload into memory (counted as a user-space copy), then
    /// the backend's buffered write.
    fn write_buffered(
        shared: &Shared,
        ctx: &Ctx,
        w: &WriteReq,
        bfh: u64,
        payload: &mut SocketPayload<'_>,
    ) -> zcfs_backend::Result<u32> {
        let buf = payload_to_vec(payload)?;
        shared
            .stats
            .user_copy_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        shared.backend.write(ctx, w.node.ino, bfh, w.offset, &buf)
    }

    fn write(&mut self, ctx: &Ctx, h: &ReqHeader, w: WriteReq, t: Instant) -> Result<(), ConnEnd> {
        let shared = self.shared;
        let backend = &*shared.backend;
        let checked = if shared.cfg.read_only {
            Err(ro())
        } else {
            self.resolve_held(ctx, w.node, w.fh, Access::Write)
        };
        let (bfh, held) = match checked {
            Ok(x) => x,
            Err(e) => {
                self.discard()?;
                shared.stats.record(Op::Write, false, 0, t);
                return self.reply(h, Err(e), None);
            }
        };
        let mut recv_err: Option<ConnEnd> = None;
        let size = w.size;
        let (r, from_buffer) = {
            let mut payload = SocketPayload {
                s: &mut self.s,
                rb: &mut self.rb,
                inbound: &mut self.inbound,
                patience: shared.cfg.peer_timeout,
                failed: &mut recv_err,
            };
            let r = if shared.cfg.one_copy {
                Self::write_buffered(shared, ctx, &w, bfh, &mut payload)
            } else {
                // Straight from the socket into the reserved destination blocks.
                backend.write_with(ctx, w.node.ino, bfh, w.offset, &mut payload)
            };
            let r = match r {
                // Refused for room before any byte was taken: copy-on-write wants room
                // for the whole payload at once, but an overwrite larger than the free
                // space still fits in pieces. Take the payload into memory (one copy,
                // counted) and let the backend write it piece by piece.
                Err(e)
                    if e.errno == libc::ENOSPC
                        && payload.remaining() == size as usize
                        && payload.failed.is_none() =>
                {
                    Self::write_buffered(shared, ctx, &w, bfh, &mut payload)
                }
                r => r,
            };
            // Payload bytes the write took out of the receive buffer (copied), not
            // those of a remainder discarded after it.
            (r, payload.inbound.from_buffer)
            // The payload drops here: what the backend did not take is discarded (its
            // tag checked all the same), so the stream stays in step.
        };
        shared
            .stats
            .recv_buffer_payload_bytes
            .fetch_add(from_buffer, Ordering::Relaxed);
        let committed = recv_err.is_none() && commit_if_asked(shared, &w, bfh, &r);
        drop(held);
        if let Some(e) = recv_err {
            return Err(e);
        }
        shared.stats.record(
            Op::Write,
            r.is_ok(),
            if r.is_ok() { size as u64 } else { 0 },
            t,
        );
        self.reply(
            h,
            r.map(|written| Reply::Write(WriteReply { written, committed })),
            None,
        )
    }
}

/// The operation of the next request when all of it (header, body, their tag, payload
/// and its tag) is in `rb` or waiting on `s`, so that reading it waits for nothing;
/// None otherwise (or when its header does not decode: the loop reads it and ends the
/// connection as usual). `data_tagged(n)`: a payload of n bytes carries a tag.
fn next_here_whole(
    rb: &RecvBuf,
    s: &Stream,
    tag_len: usize,
    data_tagged: impl Fn(usize) -> bool,
) -> Option<Op> {
    let waiting = if rb.len() >= REQ_HDR {
        None
    } else {
        Some(zcfs_transport::bytes_waiting(s).ok()?)
    };
    let mut hb = [0u8; REQ_HDR];
    let have = rb.len().min(REQ_HDR);
    hb[..have].copy_from_slice(&rb.buffered()[..have]);
    if have < REQ_HDR {
        // The header's rest is the socket's next bytes (the buffer's were taken off it).
        if rb.len() + waiting.unwrap_or(0) < REQ_HDR
            || zcfs_transport::peek_waiting(s, &mut hb[have..]).ok()? < REQ_HDR - have
        {
            return None;
        }
    }
    let h = ReqHeader::decode(&hb).ok()?;
    let data = h.data_len as usize;
    let need = REQ_HDR
        + h.body_len as usize
        + tag_len
        + data
        + if data_tagged(data) { TAG_LEN } else { 0 };
    if rb.len() >= need {
        return Some(h.op);
    }
    let waiting = match waiting {
        Some(n) => n,
        None => zcfs_transport::bytes_waiting(s).ok()?,
    };
    (rb.len().saturating_add(waiting) >= need).then_some(h.op)
}

/// A write that asked to be made durable before its reply (`WriteReq::commit`) and
/// took bytes: commit now, as a FLUSH would. False if not asked, nothing was written,
/// or the commit failed (the client then sends a FLUSH at close, which reports it).
pub(crate) fn commit_if_asked(
    shared: &Shared,
    w: &WriteReq,
    bfh: u64,
    r: &zcfs_backend::Result<u32>,
) -> bool {
    if !w.commit || !matches!(r, Ok(n) if *n > 0) {
        return false;
    }
    match shared.backend.flush(w.node.ino, bfh) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(ino = w.node.ino, "commit after a write failed: {e:?}");
            false
        }
    }
}
