//! One connection of a client: its writer (socket and MAC, held together), its reader
//! (the same, for replies), the table of requests waiting for replies, and the ticket a
//! caller waits on.
//!
//! Replies are read by whoever holds the reader (leader/follower): a caller waiting for
//! its reply takes the reader when no one has it and reads until its own reply comes,
//! handing others' replies to their waiters on the way. A lone caller so gets its reply
//! on its own thread, with no wake-up of another thread in between (on 2 vCPUs that
//! hand-off was a large share of a 4 KiB round trip). A background reader takes over
//! when a caller gives the reader back with replies still owed (to callers that wait on
//! their channel, or to posted requests no one waits for), and watches an idle socket
//! so that a server that goes away is noticed before the next request is sent.
//!
//! A request sent by `Client::call_then` has no waiter: its completion runs on the
//! thread that reads its reply (usually the background reader, woken when it is sent),
//! and a lost connection hands it to a thread of its own that sends it again.

use crate::{is_transport, lock, Caller, Client, Completion, Response, Slot};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};
use zcfs_backend::Error;
use zcfs_protocol::channel::{Mac, TAG_LEN};
use zcfs_protocol::handshake::Welcome;
use zcfs_protocol::{Op, Request, RespHeader, RESP_HDR};
use zcfs_transport::{recv_into_vec_with, RecvBuf, RecvFd, Stream};

/// A request sent without waiting for its reply (a forget), kept until the reply
/// comes, to send again (with its id) if its connection is lost first.
pub(crate) struct Posted {
    pub(crate) req: Request,
    /// The session epoch it belongs to: moot once the session is gone.
    pub(crate) epoch: u64,
    /// The connection it went out on (dead: not sent yet, or lost).
    pub(crate) conn: Weak<Conn>,
}

/// Posted requests without a reply yet, by id. `gone` is signalled whenever some leave
/// (answered, or dropped with their session): `Client::wait_posted` waits on it.
#[derive(Default)]
pub(crate) struct PostedTable {
    pub(crate) map: Mutex<HashMap<u64, Posted>>,
    pub(crate) gone: Condvar,
}

impl PostedTable {
    /// Request `id`'s reply came: nothing to send again.
    pub(crate) fn answered(&self, id: u64) {
        if lock(&self.map).remove(&id).is_some() {
            self.gone.notify_all();
        }
    }
}

/// The sending side of a connection: the socket, and its MAC when authenticated (held
/// together: a message's sequence number is its place on the wire).
pub(crate) struct Writer {
    pub(crate) s: Stream,
    pub(crate) mac: Option<Mac>,
}

/// The receiving side of a connection: the socket and, when authenticated, the MAC
/// that checks replies (held together: a reply's sequence number is its place on the
/// wire). Whoever holds it reads.
pub(crate) struct Reader {
    pub(crate) s: Stream,
    pub(crate) mac: Option<Mac>,
    /// Replies received ahead: a reply's header with its body and (small) data in one
    /// recv, and the replies behind it when several came together.
    pub(crate) rb: RecvBuf,
}

/// How often the background reader looks whether callers stopped leading, and how long
/// an idle connection's socket is watched per round (a waiter never depends on either:
/// a caller that gives the reader back with replies owed wakes the background reader,
/// and a posted request's reply is read within a tick).
pub const BACKGROUND_TICK: Duration = Duration::from_millis(10);
pub const IDLE_WATCH: Duration = Duration::from_millis(200);

pub(crate) struct Conn {
    pub(crate) writer: Mutex<Writer>,
    /// The reader, when no one is reading (None: a caller or the background reader has
    /// it).
    pub(crate) reader: Mutex<Option<Reader>>,
    /// Set and signalled when the reader is given back with replies still owed.
    pub(crate) rx_wake: (Mutex<bool>, Condvar),
    /// How many times a caller took the reader (the background reader watches the
    /// socket only once this stops moving).
    pub(crate) leads: AtomicU64,
    /// The client's request timeout: how long a reply may take to arrive whole.
    pub(crate) timeout: Duration,
    /// The same socket, to shut it down without waiting for a writer.
    pub(crate) control: Stream,
    /// Requests waiting for their replies: operation, and where the reply goes (None:
    /// posted, no one waits; its reply only clears it from `posted`).
    pub(crate) pending: Mutex<HashMap<u64, (Op, Option<Slot>)>>,
    pub(crate) posted: Arc<PostedTable>,
    pub(crate) broken: AtomicBool,
    /// The server closed it (end of stream, reset): its process went away or restarted,
    /// rather than the link going quiet.
    pub(crate) peer_closed: AtomicBool,
    pub(crate) welcome: Welcome,
    /// The client's session epoch when this connection was handed out.
    pub(crate) epoch: AtomicU64,
    pub(crate) inflight: (Mutex<u32>, Condvar),
}

impl Conn {
    pub(crate) fn break_with(&self, why: &str) {
        if !self.broken.swap(true, Ordering::SeqCst) {
            tracing::warn!("connection lost: {why}");
        }
        self.close(why);
    }

    /// Shut the socket (the reader thread then ends) and fail what is pending.
    pub(crate) fn close(&self, why: &str) {
        self.broken.store(true, Ordering::SeqCst);
        let _ = self.control.shutdown(std::net::Shutdown::Both);
        // Taken out first: a `Then` runs its completion with no lock held.
        let failed: Vec<Slot> = lock(&self.pending)
            .drain()
            .filter_map(|(_, (_, slot))| slot)
            .collect();
        for slot in failed {
            slot.deliver(Err(Error::new(
                libc::ENOTCONN,
                format!("connection to the server lost: {why}"),
            )));
        }
    }

    pub(crate) fn is_up(&self) -> bool {
        !self.broken.load(Ordering::SeqCst)
    }

    /// Take one of the connection's in-flight slots, waiting while all are taken
    /// (given back by the `Ticket`'s drop, or by a `Then` when it runs).
    pub(crate) fn take_inflight_slot(&self) {
        let (m, cv) = &self.inflight;
        let mut n = lock(m);
        while *n >= self.welcome.max_inflight {
            n = cv.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        *n += 1;
    }

    fn give_inflight_slot(&self) {
        let (m, cv) = &self.inflight;
        *lock(m) -= 1;
        cv.notify_one();
    }

    /// Whether a `call_then` request waits for its reply past its deadline.
    fn then_overdue(&self, now: Instant) -> bool {
        lock(&self.pending).values().any(
            |(_, slot)| matches!(slot, Some(Slot::Then(t)) if t.deadline.is_some_and(|d| d <= now)),
        )
    }

    /// Start request `id`'s deadline, now that it is sent (as a waiting caller's
    /// timeout starts once its request is out: time spent waiting for the writer does
    /// not count). Nothing if it was answered meanwhile.
    pub(crate) fn arm_then(&self, id: u64) {
        if let Some((_, Some(Slot::Then(t)))) = lock(&self.pending).get_mut(&id) {
            t.deadline = Some(Instant::now() + self.timeout);
        }
    }

    fn take_reader(&self) -> Option<Reader> {
        lock(&self.reader).take()
    }

    /// Give the reader back; with replies still owed, wake the background reader to
    /// read them. (Back first, then the look at `pending`: a caller that registers a
    /// request and then finds the reader taken is so always either seen here or finds
    /// it back.)
    fn give_back(&self, r: Reader) {
        *lock(&self.reader) = Some(r);
        if !lock(&self.pending).is_empty() {
            self.wake_background();
        }
    }

    /// Make the background reader look for replies owed now (it is reading already
    /// when the reader is taken: nothing to do then).
    pub(crate) fn wake_background(&self) {
        if lock(&self.reader).is_none() {
            return;
        }
        let (m, cv) = &self.rx_wake;
        *lock(m) = true;
        cv.notify_one();
    }
}

/// What happened to a reply read off the wire.
enum Dispatched {
    /// The reply the reader was waiting for itself.
    Own(Response),
    /// Someone else's (handed to its waiter), or one no one waits for any more.
    Other,
}

/// Hand a reply to whoever waits for it; `own` is the reader's own request, whose reply
/// it returns instead. Err: why the connection must end.
fn dispatch(conn: &Conn, r: Received, own: Option<u64>) -> Result<Dispatched, String> {
    let (h, body, data) = r;
    let Some((op, slot)) = lock(&conn.pending).remove(&h.id) else {
        // A reply to a request that timed out: drop it.
        return Ok(Dispatched::Other);
    };
    if op != h.op {
        return Err(format!(
            "reply {} for {} carries op {}",
            h.id,
            op.name(),
            h.op.name()
        ));
    }
    let epoch = conn.epoch.load(Ordering::SeqCst);
    let resp = Response {
        hdr: h,
        body,
        data,
        epoch,
    };
    if own == Some(resp.hdr.id) {
        return Ok(Dispatched::Own(resp));
    }
    match slot {
        Some(slot) => slot.deliver(Ok(resp)),
        // A posted request answered: nothing to send again.
        None => conn.posted.answered(resp.hdr.id),
    }
    Ok(Dispatched::Other)
}

/// A receive failed: the waiter of a reply that failed its check gets EIO (it must not
/// get data it cannot trust, nor a resend of a request whose answer was tampered
/// with), and the connection ends.
fn receive_failed(conn: &Conn, f: RecvFail) {
    // Not after our own break: its shutdown reads as an end of stream too.
    if f.peer_closed && !conn.broken.load(Ordering::SeqCst) {
        conn.peer_closed.store(true, Ordering::SeqCst);
    }
    if let Some(id) = f.forged {
        let owed = lock(&conn.pending).remove(&id);
        if let Some((_, Some(slot))) = owed {
            slot.deliver(Err(Error::new(
                libc::EIO,
                format!("the reply failed its integrity check: {}", f.why),
            )));
        }
    }
    conn.break_with(&f.why);
}

/// How a caller's turn as the reader ended.
enum Led {
    Own(Response),
    /// Its deadline passed first (the connection is given up, as on any timeout).
    TimedOut,
    /// The connection ended; the caller's slot holds why (or it had its reply).
    Ended,
}

/// Read replies until the one for `own` comes, handing the others to their waiters.
fn lead(conn: &Conn, rd: &mut Reader, own: u64, deadline: Instant) -> Led {
    conn.leads.fetch_add(1, Ordering::Relaxed);
    if Instant::now() >= deadline {
        return Led::TimedOut;
    }
    loop {
        // The whole reply is due by the caller's deadline, however slowly it comes.
        let r = match recv_reply(&rd.s, &mut rd.rb, &mut rd.mac, Some(deadline)) {
            Ok(r) => r,
            Err(f) if f.timed_out => return Led::TimedOut,
            Err(f) => {
                receive_failed(conn, f);
                return Led::Ended;
            }
        };
        match dispatch(conn, r, Some(own)) {
            Ok(Dispatched::Own(resp)) => return Led::Own(resp),
            Ok(Dispatched::Other) if Instant::now() >= deadline => return Led::TimedOut,
            Ok(Dispatched::Other) => {}
            Err(why) => {
                conn.break_with(&why);
                return Led::Ended;
            }
        }
    }
}

/// A submitted request; `wait` for its reply.
pub struct Ticket {
    pub(crate) rx: Receiver<Result<Response, Error>>,
    pub(crate) conn: Arc<Conn>,
    pub(crate) id: u64,
    pub(crate) timeout: Duration,
    pub(crate) addr: String,
    /// It holds one of the connection's in-flight slots (given back when dropped);
    /// an answered ticket (`into_answered`) holds none.
    pub(crate) holds_slot: bool,
}

impl Ticket {
    /// Wait for the reply now and keep it in a ticket that holds no in-flight slot:
    /// the slot is free for the next request (a batch larger than the slots free,
    /// `Client::submit_batch`).
    pub(crate) fn into_answered(self) -> Ticket {
        let r = self.receive();
        let (tx, rx) = sync_channel(1);
        tx.send(r).expect("the receiver is alive");
        Ticket {
            rx,
            conn: self.conn.clone(),
            id: self.id,
            timeout: self.timeout,
            addr: self.addr.clone(),
            holds_slot: false,
        }
    }

    /// Whether both requests went out on the same connection (the server runs them in
    /// the order they were sent).
    pub fn same_connection(&self, other: &Ticket) -> bool {
        Arc::ptr_eq(&self.conn, &other.conn)
    }

    pub fn wait(self) -> Result<Response, Error> {
        let resp = self.receive()?;
        if resp.hdr.status != 0 {
            return Err(Error::errno(resp.hdr.status));
        }
        Ok(resp)
    }

    /// The reply, read on this thread when no one else is reading (see the module
    /// doc), else waited for on the ticket's channel.
    fn receive(&self) -> Result<Response, Error> {
        let deadline = Instant::now() + self.timeout;
        match self.rx.try_recv() {
            Ok(r) => return r,
            // No one holds the sender: the request is gone from `pending` unanswered.
            Err(TryRecvError::Disconnected) => return Err(self.timed_out()),
            Err(TryRecvError::Empty) => {}
        }
        // With others in flight the background reader reads: a second thread then
        // reads replies while callers send (measured: library 4 KiB QD16 lost a fifth
        // of its IOPS when callers led there too).
        if lock(&self.conn.pending).len() > 1 {
            self.conn.wake_background();
        } else if let Some(mut rd) = self.conn.take_reader() {
            // Our reply may have been handed to our channel since we looked there (by
            // the reader's last holder): then there is nothing to read for us (review
            // finding: we read until our timeout). No one can take it from `pending`
            // while we hold the reader, so one look suffices.
            if !lock(&self.conn.pending).contains_key(&self.id) {
                self.conn.give_back(rd);
            } else {
                let led = lead(&self.conn, &mut rd, self.id, deadline);
                match led {
                    Led::Own(resp) => {
                        self.conn.give_back(rd);
                        return Ok(resp);
                    }
                    Led::TimedOut => {
                        // Broken before the reader goes back: what we left half read
                        // must not be read by anyone as the start of a reply.
                        let e = self.timed_out();
                        self.conn.give_back(rd);
                        return Err(e);
                    }
                    // The break failed every waiter: our channel holds why.
                    Led::Ended => self.conn.give_back(rd),
                }
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                Err(self.timed_out())
            }
        }
    }

    /// No reply in time: the request is given up and the connection with it (a late
    /// reply must not be taken for another's, and what was sent may still run).
    fn timed_out(&self) -> Error {
        lock(&self.conn.pending).remove(&self.id);
        self.conn.break_with("reply timed out");
        Error::new(
            libc::ETIMEDOUT,
            format!(
                "no reply from {} within {:?} (server or link down?)",
                self.addr, self.timeout
            ),
        )
    }
}

impl Drop for Ticket {
    /// Release the in-flight slot, waited for or not.
    fn drop(&mut self) {
        if self.holds_slot {
            self.conn.give_inflight_slot();
        }
    }
}

/// A request sent by `Client::call_then`: its completion, run once with the outcome by
/// whoever reads the reply, and its connection's in-flight slot, held until then.
pub(crate) struct Then {
    done: Option<Completion>,
    /// The connection whose in-flight slot it holds (weak: the connection holds this).
    conn: Weak<Conn>,
    /// To send the request again through `call` after a lost connection.
    client: Weak<Client>,
    req: Request,
    /// When its reply is overdue (from when it was sent: `Conn::arm_then`): the
    /// connection is given up then, as a waiting caller's timeout gives it up (a server
    /// answering everything but this request must not leave it waiting for good).
    deadline: Option<Instant>,
}

impl Then {
    /// The in-flight slot must have been taken (`Conn::take_inflight_slot`).
    pub(crate) fn new(
        conn: &Arc<Conn>,
        client: Weak<Client>,
        req: Request,
        done: Completion,
    ) -> Then {
        Then {
            done: Some(done),
            conn: Arc::downgrade(conn),
            client,
            req,
            deadline: None,
        }
    }

    /// The outcome as `call` gives it: a reply with an error status is that error; a
    /// lost connection sends the request again through `call`, on a thread of its own
    /// (this one may be the connection's reader).
    pub(crate) fn run(mut self, r: Result<Response, Error>) {
        let Some(done) = self.done.take() else { return };
        self.release();
        let r = r.and_then(|resp| match resp.hdr.status {
            0 => Ok(resp),
            status => Err(Error::errno(status)),
        });
        match r {
            Err(e) if is_transport(&e) => {
                let (client, req) = (self.client.clone(), self.req.clone());
                // `done` moves into the thread only if it starts; else it runs here.
                let slot = Arc::new(Mutex::new(Some(done)));
                let theirs = slot.clone();
                let spawned = std::thread::Builder::new()
                    .name("zcfs-resend".into())
                    .spawn(move || {
                        let Some(done) = lock(&theirs).take() else {
                            return;
                        };
                        match client.upgrade() {
                            Some(c) => done(c.call(&req, Caller::process(), &[])),
                            None => done(Err(e)),
                        }
                    });
                if let Err(spawn) = spawned {
                    if let Some(done) = lock(&slot).take() {
                        done(Err(Error::new(
                            libc::EAGAIN,
                            format!("cannot start a thread to send the request again: {spawn}"),
                        )));
                    }
                }
            }
            r => done(r),
        }
    }

    /// Gives the connection's in-flight slot back (once).
    fn release(&mut self) {
        if let Some(conn) = std::mem::take(&mut self.conn).upgrade() {
            conn.give_inflight_slot();
        }
    }
}

impl Drop for Then {
    /// Dropped without running (a reply no one should get): the slot goes back, and
    /// the caller hears of it rather than waiting for ever.
    fn drop(&mut self) {
        self.release();
        if let Some(done) = self.done.take() {
            done(Err(Error::new(
                libc::EIO,
                "the request was dropped unanswered",
            )));
        }
    }
}

/// A reply as received: header, body, data.
pub(crate) type Received = (RespHeader, Vec<u8>, Vec<u8>);

/// Why a reply could not be received: the connection must end. `forged`: the id of a
/// reply that failed its check; `timed_out`: the read waited past the reader's timeout.
pub(crate) struct RecvFail {
    why: String,
    forged: Option<u64>,
    timed_out: bool,
    /// The server closed the connection (`Conn::peer_closed`).
    peer_closed: bool,
}

/// Whether `e` says the other end closed the connection (not that the link went quiet).
pub(crate) fn closed_by_peer(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::BrokenPipe
    )
}

impl RecvFail {
    fn io(e: std::io::Error) -> RecvFail {
        let timed_out = matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        );
        RecvFail {
            why: format!("receive: {e}"),
            forged: None,
            timed_out,
            peer_closed: closed_by_peer(&e),
        }
    }

    fn bad(why: String, forged: Option<u64>) -> RecvFail {
        RecvFail {
            why,
            forged,
            timed_out: false,
            peer_closed: false,
        }
    }
}

/// Receive one reply (header, body, tag, data, data tag) and check its tags. `until`:
/// the reply must have arrived whole by then (a reader waiting for its own reply),
/// else each read waits at most the socket's timeout.
pub(crate) fn recv_reply(
    s: &Stream,
    rb: &mut RecvBuf,
    mac: &mut Option<Mac>,
    until: Option<Instant>,
) -> Result<Received, RecvFail> {
    // Set up at the first recv: a reply already in the buffer costs no system call.
    let mut clock: Option<Deadline> = None;
    let mut before = || match until {
        Some(at) => clock.get_or_insert_with(|| Deadline::new(s, at)).before(s),
        None => Ok(()),
    };
    // The header into the buffer, with whatever came after it.
    while rb.len() < RESP_HDR {
        before().map_err(RecvFail::io)?;
        match rb.fill_once(&mut RecvFd(s)) {
            Ok(0) => return Err(RecvFail::io(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(RecvFail::io(e)),
        }
    }
    let mut hb = [0u8; RESP_HDR];
    rb.take_into(&mut hb);
    // A part of the reply: what the buffer holds, then the rest straight into `v`.
    let mut part = |v: &mut Vec<u8>, n: usize| {
        let k = rb.take_to_vec(v, n);
        recv_into_vec_with(s, v, n - k, &mut before)
    };
    let h = RespHeader::decode(&hb)
        .map_err(|e| RecvFail::bad(format!("malformed reply: {e}"), None))?;
    let tag_len = if mac.is_some() { TAG_LEN } else { 0 };
    // Into fresh capacity: no zero-fill of a buffer the kernel is about to write.
    let (mut body, mut data) = (
        Vec::with_capacity(h.body_len as usize + tag_len),
        Vec::with_capacity(h.data_len as usize + tag_len),
    );
    part(&mut body, h.body_len as usize + tag_len).map_err(RecvFail::io)?;
    let mut m = None;
    if let Some(mac) = mac.as_mut() {
        let tag: [u8; TAG_LEN] = body[h.body_len as usize..]
            .try_into()
            .expect("TAG_LEN bytes");
        body.truncate(h.body_len as usize);
        let mm = mac.begin(&hb, &body);
        mm.verify(&tag)
            .map_err(|e| RecvFail::bad(e.to_string(), Some(h.id)))?;
        if mac.data_tagged(h.data_len as usize) {
            m = Some(mm);
        }
    }
    part(&mut data, h.data_len as usize).map_err(RecvFail::io)?;
    if let Some(mut mm) = m {
        let mut tag = Vec::with_capacity(TAG_LEN);
        part(&mut tag, TAG_LEN).map_err(RecvFail::io)?;
        mm.data(&data);
        let tag: [u8; TAG_LEN] = tag[..].try_into().expect("TAG_LEN bytes");
        mm.verify_data(&tag)
            .map_err(|e| RecvFail::bad(e.to_string(), Some(h.id)))?;
    }
    Ok((h, body, data))
}

/// How much past the time left the socket's timeout may be before it is shortened, so
/// that a reply arriving whole costs no extra system call. (The kernel rounds the
/// timeout up to a jiffy, so a trickled reply ends a few ms past its deadline.)
pub const DEADLINE_SLACK: Duration = Duration::from_millis(1);

/// A deadline for a whole reply: before each read, the time left, and the socket's
/// timeout shortened to it (each read waits at most that long).
struct Deadline {
    at: Instant,
    /// The socket's read timeout as last set.
    set: Duration,
}

impl Deadline {
    fn new(s: &Stream, at: Instant) -> Deadline {
        // Not zero: that would mean no timeout.
        let left = at
            .saturating_duration_since(Instant::now())
            .max(Duration::from_micros(1));
        // A timeout that cannot be set leaves an earlier holder's (bounded too), and
        // `before` still ends the reply at the deadline.
        let _ = s.set_read_timeout(Some(left));
        Deadline { at, set: left }
    }

    fn before(&mut self, s: &Stream) -> std::io::Result<()> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the reply did not arrive whole within the caller's timeout",
            ));
        }
        if left + DEADLINE_SLACK < self.set {
            s.set_read_timeout(Some(left))?;
            self.set = left;
        }
        Ok(())
    }
}

/// Whether `fd` has something to read (or hung up) within `wait`.
fn readable(fd: &impl AsRawFd, wait: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    let ms = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `p` is one valid pollfd that lives across the call, and the count is 1.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n > 0
}

/// The background reader of a connection (its own thread, until the connection ends):
/// reads the replies owed when no caller reads them, and watches the idle socket.
pub(crate) fn background_reader(conn: Arc<Conn>) {
    let mut leads_seen = conn.leads.load(Ordering::Relaxed);
    while conn.is_up() {
        let woken = {
            let (m, cv) = &conn.rx_wake;
            let mut w = lock(m);
            if !*w {
                w = cv
                    .wait_timeout(w, BACKGROUND_TICK)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            std::mem::take(&mut *w)
        };
        let leads = conn.leads.load(Ordering::Relaxed);
        let callers_led = leads != leads_seen;
        leads_seen = leads;
        let owed = !lock(&conn.pending).is_empty();
        // Replies owed that no caller reads: a caller left them to us (woken), or they
        // waited a whole tick with no caller reading (posted requests, tickets not
        // waited for yet). Not otherwise: a caller that just sent is about to read.
        if owed && (woken || !callers_led) {
            if let Some(mut rd) = conn.take_reader() {
                serve_owed(&conn, &mut rd);
                conn.give_back(rd);
            }
            continue;
        }
        if owed || callers_led {
            continue;
        }
        // Idle: watch the socket, so that the server closing (or a late reply to a
        // request given up on) is read now rather than found by the next caller, who
        // would send into a dead connection.
        if readable(&conn.control, IDLE_WATCH) && lock(&conn.pending).is_empty() {
            if let Some(mut rd) = conn.take_reader() {
                // Looked at again now that no one else can read: a caller may have
                // begun meanwhile (its reply is its own to read) or read what woke us.
                if lock(&conn.pending).is_empty() && readable(&rd.s, Duration::ZERO) {
                    let _ = rd.s.set_read_timeout(Some(conn.timeout));
                    read_one(&conn, &mut rd);
                }
                conn.give_back(rd);
            }
        }
    }
}

/// Read replies while any are owed (to waiters on their channels, or posted). Each is
/// coming: a waiter that gives up breaks the connection, which ends the read.
fn serve_owed(conn: &Conn, rd: &mut Reader) {
    let _ = rd.s.set_read_timeout(Some(conn.timeout));
    let mut looked = Instant::now();
    while conn.is_up() && !lock(&conn.pending).is_empty() {
        read_one(conn, rd);
        // Other replies keep coming, so no read times out: look for a `call_then`
        // request past its deadline once a tick.
        if looked.elapsed() >= BACKGROUND_TICK {
            looked = Instant::now();
            if conn.then_overdue(looked) {
                conn.break_with("reply timed out");
            }
        }
    }
}

/// Read and hand on one reply (within the read timeout set); a failure ends the
/// connection.
fn read_one(conn: &Conn, rd: &mut Reader) {
    match recv_reply(&rd.s, &mut rd.rb, &mut rd.mac, None) {
        Ok(r) => {
            if let Err(why) = dispatch(conn, r, None) {
                conn.break_with(&why);
            }
        }
        Err(f) => receive_failed(conn, f),
    }
}
