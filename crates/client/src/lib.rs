//! The zcfs client: `Client` moves requests over a few pipelined TCP connections;
//! `RemoteFs` is the Backend on top of it.
//!
//! - Replies are matched to requests by id, so any number of callers (and `submit`
//!   without waiting) keep many requests in flight on one connection. A waiting caller
//!   reads replies itself when no one else is (`conn`), so a lone caller's reply needs
//!   no hand-off between threads; a background reader reads the rest.
//! - Every call has a bounded timeout: a dead server or link gives ETIMEDOUT/ENOTCONN,
//!   never a hang. A broken connection is replaced on the next call; idempotent
//!   requests are retried once on the new one.
//! - Every connection of a `Client` carries its random session id, so the server keeps
//!   the client's handles and references across a lost connection (for its grace
//!   period). When a reconnection finds the session gone (not resumed, or a restarted
//!   server: new instance id) the revalidation hook runs: open handles are re-opened,
//!   caches dropped, the count of server references reset.
//! - Only metadata is cached (attributes and names, with a timeout); file data never.
//! - Writes go out with one writev of header and the caller's buffer; read data is
//!   received into a buffer handed to the caller: no user-space copy on either path.

mod conn;
pub mod l2;
mod remote;

pub use conn::Ticket;
pub use remote::{
    ReadTicket, RemoteFs, WriteTicket, COMMIT_WRITE_MAX, GATHER_BYTES, GATHER_DELAY, GATHER_WRITES,
    GATHER_WRITE_MAX, WRITE_BEHIND_MAX,
};

use conn::{background_reader, Conn, Posted, PostedTable, Reader, Writer};

use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;
use zcfs_backend::{Error, PipedData};
use zcfs_protocol::channel::{Integrity, TAG_LEN};
use zcfs_protocol::handshake::Lane;
use zcfs_protocol::{Cred, Request, RespHeader, MAX_GROUPS, OP_SLOTS, REQ_HDR};
use zcfs_transport::{
    client_handshake_within, tune, write_all_vectored, Address, Established, RecvBuf, Stream,
    TransportError,
};

/// The first pause before dialling again after a server refused a connection at one
/// of its bounds; it doubles up to `DIAL_RETRY_MAX_PAUSE`, within the client's timeout.
pub const DIAL_RETRY_FIRST_PAUSE: Duration = Duration::from_millis(20);
pub const DIAL_RETRY_MAX_PAUSE: Duration = Duration::from_millis(500);
/// After a connection attempt stalled (waited out at least half the client's timeout
/// before it failed: a server that stopped answering, a link gone quiet), the next
/// attempt with the client's whole timeout is made this long after it at the soonest;
/// requests in between make short ones (`STALLED_DIAL_PATIENCE`), and while any attempt
/// is under way the others fail at once (`DialStall`). Each further stall in a row
/// doubles the wait, up to `STALLED_DIAL_RETRY_MAX`: the caller whose request makes a
/// full attempt waits out the whole timeout, so over a long outage that is rare.
pub const STALLED_DIAL_RETRY: Duration = Duration::from_secs(1);
pub const STALLED_DIAL_RETRY_MAX: Duration = Duration::from_secs(32);
/// The least patience of an attempt between full ones after a stall (more on a slow
/// link: `Client::short_patience`): long enough for
/// a server that was restarted or resumed to answer a handshake on a loaded host, short
/// enough that a request to one still stopped fails about at once.
pub const STALLED_DIAL_PATIENCE: Duration = Duration::from_millis(100);

/// Whether a handshake failed because the server closed the connection before it said
/// anything (what it does at its connection bounds), rather than refusing us.
fn closed_before_welcome(e: &TransportError) -> bool {
    match e {
        TransportError::Closed => true,
        TransportError::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

/// Lock a mutex whether or not a panicking thread held it: the client's tables are
/// changed in small consistent steps, and one panicking caller must not take the
/// mount down for every other.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The server's address: `unix:PATH`, `tcp:HOST:PORT` or `HOST:PORT`.
    pub addr: String,
    pub secret: Option<Vec<u8>>,
    pub connections: usize,
    /// Bound on connecting and on waiting for any reply.
    pub timeout: Duration,
    /// How long attributes and names are cached (0 = not at all).
    pub attr_ttl: Duration,
    /// `Full`: require the server to MAC bulk data too (needs a secret).
    pub integrity: Integrity,
    /// Offer the server the layer-2 lane on this interface (`l2`).
    pub l2: Option<l2::L2Options>,
    /// A remote mount's small buffered writes are gathered and sent several in one
    /// send (`remote::GATHER_WRITES`); off: each is sent by its writer.
    pub gather_writes: bool,
}

impl ClientConfig {
    pub fn new(addr: &str) -> ClientConfig {
        ClientConfig {
            addr: addr.to_string(),
            secret: None,
            connections: 2,
            timeout: Duration::from_secs(10),
            attr_ttl: Duration::from_secs(1),
            integrity: Integrity::Headers,
            l2: None,
            gather_writes: true,
        }
    }
}

/// Who a request is sent as: uid and gid (the header), and the supplementary groups
/// (at most `MAX_GROUPS`; their gids open the body).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caller<'a> {
    pub cred: Cred,
    pub groups: &'a [u32],
}

impl Caller<'_> {
    /// This process's own uid and gid, without groups: for requests made for no
    /// caller in particular (forget, release, reads through a handle). A server that
    /// knows this process (a Unix socket) lets it act as itself, whoever it is.
    pub fn process() -> Caller<'static> {
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Caller {
            cred: Cred { uid, gid },
            groups: &[],
        }
    }

    /// Requests for a caller in more groups than the protocol carries are refused here,
    /// before anything is sent.
    fn check(&self) -> Result<(), Error> {
        if self.groups.len() > MAX_GROUPS {
            return Err(Error::new(
                libc::EINVAL,
                format!(
                    "the caller is in {} supplementary groups; a request carries at most {MAX_GROUPS}",
                    self.groups.len()
                ),
            ));
        }
        Ok(())
    }
}

/// A reply: header, body and (for reads) the data.
#[derive(Debug)]
pub struct Response {
    pub hdr: RespHeader,
    pub body: Vec<u8>,
    pub data: Vec<u8>,
    /// The session epoch of the connection it came on (see `Client::epoch`): what it
    /// says about the server's references belongs to that session only.
    pub epoch: u64,
}

/// Where a request's outcome goes when its reply is read (or its connection lost).
pub(crate) enum Slot {
    /// A caller waits for it on the channel (`Ticket`).
    Waiter(SyncSender<Result<Response, Error>>),
    /// `Client::call_then`: run by whoever reads the reply.
    Then(conn::Then),
}

impl Slot {
    /// Hands the outcome on; run with no lock of the connection held (a `Then` runs
    /// its caller's completion).
    pub(crate) fn deliver(self, r: Result<Response, Error>) {
        match self {
            Slot::Waiter(tx) => {
                let _ = tx.try_send(r);
            }
            Slot::Then(then) => then.run(r),
        }
    }
}

/// What `Client::call_then` calls with the outcome `call` would have returned.
pub type Completion = Box<dyn FnOnce(Result<Response, Error>) + Send>;

/// Run when a (re)connection found the session gone (before that connection is handed
/// out to anyone): the server no longer holds this client's handles and references.
/// Gets the new connection (to re-open files on) and the new session epoch. Returns
/// whether it finished: false when the connection was lost on the way, and then it is
/// run again, with the same epoch, on the next connection made (review 32b: a
/// revalidation cut short left the files it had not reached stale for good, since
/// that next connection resumes the new session and would not revalidate).
pub(crate) type RestartHook = Box<dyn Fn(&Client, &ConnRef, u64) -> bool + Send + Sync>;

/// A connection, as the restart hook sees it (opaque: `Client::call_on`).
pub(crate) struct ConnRef(Arc<Conn>);

pub struct Client {
    cfg: ClientConfig,
    /// Random, never 0; sent in every Hello.
    session: u64,
    conns: Vec<Mutex<Option<Arc<Conn>>>>,
    /// Per connection index (lane), the generation of its last dial: a new connection
    /// on a lane makes the server fence the one it replaces (`Lane`).
    lane_generations: Vec<AtomicU32>,
    next: AtomicUsize,
    ids: AtomicU64,
    /// Instance id of the server last connected to.
    instance: AtomicU64,
    /// Some connection's handshake succeeded before: the server knew our session.
    had_session: AtomicBool,
    /// The serial of the server's session we last joined (`Welcome::session_serial`).
    session_serial: AtomicU64,
    /// The restart hook did not finish for the current epoch (`RestartHook`).
    revalidation_owed: AtomicBool,
    /// How long the last connections made took to make, each its successful attempt's
    /// connect and handshake alone (`short_patience`).
    handshakes: Mutex<RecentHandshakes>,
    /// Counts the sessions this client has had (bumped when one was found gone);
    /// changed only under `dialing` and `reval`.
    epoch: AtomicU64,
    /// Held while a connection is made, checked (and the session revalidated) and
    /// handed out: no request of a new session goes out before the revalidation.
    dialing: DialGate,
    /// The last connection attempt that stalled, for failing fast after it.
    stall: DialStall,
    /// Held to change `epoch` and to post against it.
    reval: Mutex<()>,
    /// Posted requests without a reply yet.
    posted: Arc<PostedTable>,
    /// Called when the session was lost (handle revalidation).
    on_restart: Mutex<Option<RestartHook>>,
    /// A mount's small writes that went out gathered (`remote::GATHER_WRITES`), and
    /// the sends that carried them.
    gathered_writes: AtomicU64,
    gather_sends: AtomicU64,
    pub bytes_sent: AtomicU64,
    /// Some connection's channel tags the data too (full integrity, which the server
    /// may ask for when this client did not): piped data must then be read to be hashed.
    data_tagged_channel: AtomicBool,
    pub bytes_received: AtomicU64,
    pub reconnects: AtomicU64,
    /// Reconnections that found the session still held by the server.
    pub resumed: AtomicU64,
    /// Times the revalidation hook ran (session lost or server restarted).
    pub revalidations: AtomicU64,
    /// Requests sent again after a lost connection (same id), and posted requests
    /// sent again after their connection was lost.
    pub resent: AtomicU64,
    /// The layer-2 lane: not tried yet, being set up, up (or lost), or off.
    l2: Mutex<L2State>,
    /// Requests per path on the lane.
    pub l2_counters: l2::L2Counters,
    /// Requests sent on TCP, per operation code (a resend counts again).
    pub tcp_requests: [AtomicU64; OP_SLOTS],
    /// Why the lane was not set up (refused, no interface; stats).
    l2_refused: Mutex<String>,
    /// A lane of this client has carried a round trip: its interface reaches the
    /// server's (a lane set up again later and silent is retried, not given up at
    /// once).
    l2_worked: AtomicBool,
    /// Lanes set up again in a row that were silent (see [`l2::L2_SILENT_RETRIES`]).
    l2_silent: AtomicU32,
    /// Offers refused busy in a row (their back-off).
    l2_busy: AtomicU32,
}

/// The lane as a request finds it.
enum LaneNow {
    Up(Arc<l2::L2Lane>),
    /// Down, and the server has not answered its fence yet: lane requests may still
    /// run there.
    Unfenced(Arc<l2::L2Lane>),
    /// No lane: TCP.
    Tcp,
}

/// What became of a request offered to the lane.
enum L2Try {
    /// Answered (or failed for good) there.
    Done(Result<Response, Error>),
    /// Sent on the lane in this session epoch without an answer: it may have run.
    FellOff(u64),
    /// Not sent on the lane.
    Tcp,
}

/// Why the lane was not set up.
enum L2SetupError {
    /// Before or at the offer, or a local failure after it.
    Failed(String),
    /// Set up at both ends, but no reply came over it (the probe); given back to the
    /// server.
    Silent(Arc<l2::L2Lane>, String),
    /// The server's interface serves another session's lane now (a refusal whose
    /// reason begins `busy`): it may be free later.
    Busy(String),
}

impl std::fmt::Display for L2SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            L2SetupError::Failed(why) | L2SetupError::Silent(_, why) | L2SetupError::Busy(why) => {
                f.write_str(why)
            }
        }
    }
}

enum L2State {
    Untried,
    Trying,
    Up(Arc<l2::L2Lane>),
    /// Lost and fenced (kept for its counters): set up again from this time on.
    Retry(Arc<l2::L2Lane>, std::time::Instant),
    /// Refused busy: offered again from this time on (no lane of ours to keep).
    Later(std::time::Instant),
    Off,
}

impl Drop for Client {
    /// Close the connections, so the server sees this client go (and starts its grace
    /// period) and the reader threads end.
    fn drop(&mut self) {
        self.disconnect();
    }
}

fn terr(addr: &str, e: TransportError) -> Error {
    match e {
        TransportError::SecretRequired => Error::new(
            libc::EACCES,
            format!("{addr}: the server requires a secret (--secret-file)"),
        ),
        TransportError::AuthFailed => Error::new(
            libc::EACCES,
            format!("{addr}: authentication failed (wrong secret?)"),
        ),
        e @ TransportError::ServerUnauthenticated => {
            Error::new(libc::EACCES, format!("{addr}: {e}"))
        }
        e @ TransportError::IntegrityRefused => {
            Error::new(libc::EPROTONOSUPPORT, format!("{addr}: {e}"))
        }
        TransportError::Io(io) => Error::new(
            io.raw_os_error()
                .unwrap_or(if io.kind() == std::io::ErrorKind::TimedOut {
                    libc::ETIMEDOUT
                } else {
                    libc::EIO
                }),
            format!("{addr}: {io}"),
        ),
        other => Error::new(libc::EIO, format!("{addr}: {other}")),
    }
}

/// Lets one connection be made at a time; a caller waits for its turn at most for the
/// client's timeout (calls stay bounded while the server is unreachable).
#[derive(Default)]
struct DialGate {
    busy: Mutex<bool>,
    free: Condvar,
}

/// A turn at the `DialGate`, given back on drop.
struct DialTurn<'a>(&'a DialGate);

impl DialGate {
    fn enter(&self, patience: Duration, addr: &str) -> Result<DialTurn<'_>, Error> {
        let deadline = std::time::Instant::now() + patience;
        let mut busy = lock(&self.busy);
        while *busy {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(Error::new(
                    libc::ETIMEDOUT,
                    format!("connecting to {addr}: another connection attempt is still under way"),
                ));
            }
            busy = self
                .free
                .wait_timeout(busy, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *busy = true;
        Ok(DialTurn(self))
    }

    /// A turn now, or None while another caller has it.
    fn try_enter(&self) -> Option<DialTurn<'_>> {
        let mut busy = lock(&self.busy);
        if *busy {
            return None;
        }
        *busy = true;
        Some(DialTurn(self))
    }
}

/// How long the last `RECENT_HANDSHAKES` connections made took (their own attempts).
#[derive(Default)]
struct RecentHandshakes(std::collections::VecDeque<Duration>);

/// How many handshakes `RecentHandshakes` keeps: a link that became slower is learnt
/// once this many in a row were slow.
const RECENT_HANDSHAKES: usize = 8;

impl RecentHandshakes {
    fn add(&mut self, took: Duration) {
        if self.0.len() == RECENT_HANDSHAKES {
            self.0.pop_front();
        }
        self.0.push_back(took);
    }

    /// The quickest of them (zero when none is known).
    fn quickest(&self) -> Duration {
        self.0.iter().copied().min().unwrap_or_default()
    }
}

/// The last connection attempt that stalled, and when it ended. Without it, every
/// request to a stopped server dialled again and waited out the attempt: through a
/// mount, an open took 20 s and each 1 MiB buffered write about 10 s, for minutes.
#[derive(Default)]
struct DialStall(Mutex<Option<Stall>>);

/// A stall on record: when the last one ended, its error, and how many in a row.
struct Stall {
    at: std::time::Instant,
    error: Error,
    in_a_row: u32,
}

/// How long after the `in_a_row`th stall in a row the next full attempt may go:
/// `STALLED_DIAL_RETRY`, doubled for each stall before it, at most
/// `STALLED_DIAL_RETRY_MAX`.
fn full_attempt_after(in_a_row: u32) -> Duration {
    let doublings = in_a_row.saturating_sub(1).min(16);
    (STALLED_DIAL_RETRY * (1u32 << doublings)).min(STALLED_DIAL_RETRY_MAX)
}

impl DialStall {
    /// The stall on record, if any: its error, how long ago it ended, and whether the
    /// next full attempt may go now.
    fn last(&self) -> Option<(Error, Duration, bool)> {
        lock(&self.0).as_ref().map(|s| {
            let ago = s.at.elapsed();
            (s.error.clone(), ago, ago >= full_attempt_after(s.in_a_row))
        })
    }

    /// A full attempt stalled with `e`: fail fast from now on.
    fn record(&self, e: &Error) {
        let mut g = lock(&self.0);
        let in_a_row = g.as_ref().map_or(0, |s| s.in_a_row).saturating_add(1);
        *g = Some(Stall {
            at: std::time::Instant::now(),
            error: e.clone(),
            in_a_row,
        });
    }

    /// A connection was made: the server answers again.
    fn clear(&self) {
        *lock(&self.0) = None;
    }
}

/// The error a request gets at once while a stall is on record (`e`, `ago` old):
/// ETIMEDOUT whatever the attempt met (a socket's own timeout would be EAGAIN), so that
/// callers treat it as the lost link it is (a release is posted for later, a write
/// behind is reported as EIO), and applications are not invited to try again at once.
fn stalled(e: &Error, ago: Duration, why: &str) -> Error {
    Error::new(
        libc::ETIMEDOUT,
        format!("{} ({:.1} s ago; {why})", e.msg(), ago.as_secs_f64()),
    )
}

impl Drop for DialTurn<'_> {
    fn drop(&mut self) {
        *lock(&self.0.busy) = false;
        self.0.free.notify_one();
    }
}

/// How one attempt of a request ended: its result, and the session epoch of the
/// connection it went out on (None: it never left).
type Attempt = (Result<Response, Error>, Option<u64>);

impl Client {
    pub fn new(cfg: ClientConfig) -> Client {
        let n = cfg.connections.max(1);
        Client {
            cfg,
            session: rand::random::<u64>().max(1),
            conns: (0..n).map(|_| Mutex::new(None)).collect(),
            lane_generations: (0..n).map(|_| AtomicU32::new(0)).collect(),
            next: AtomicUsize::new(0),
            ids: AtomicU64::new(1),
            instance: AtomicU64::new(0),
            had_session: AtomicBool::new(false),
            session_serial: AtomicU64::new(0),
            revalidation_owed: AtomicBool::new(false),
            handshakes: Mutex::default(),
            epoch: AtomicU64::new(0),
            dialing: DialGate::default(),
            stall: DialStall::default(),
            reval: Mutex::new(()),
            posted: Arc::new(PostedTable::default()),
            on_restart: Mutex::new(None),
            bytes_sent: AtomicU64::new(0),
            gathered_writes: AtomicU64::new(0),
            gather_sends: AtomicU64::new(0),
            data_tagged_channel: AtomicBool::new(false),
            bytes_received: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            resumed: AtomicU64::new(0),
            revalidations: AtomicU64::new(0),
            resent: AtomicU64::new(0),
            l2: Mutex::new(L2State::Untried),
            l2_counters: l2::L2Counters::new(),
            tcp_requests: std::array::from_fn(|_| AtomicU64::new(0)),
            l2_refused: Mutex::new(String::new()),
            l2_worked: AtomicBool::new(false),
            l2_silent: AtomicU32::new(0),
            l2_busy: AtomicU32::new(0),
        }
    }

    /// The layer-2 lane for `zcfs stat` and the metrics (None: not asked for): its
    /// state, and the requests per operation on each path.
    pub fn lane_report(&self) -> Option<zcfs_metrics::LaneReport> {
        let o = self.cfg.l2.as_ref()?;
        let mut r = zcfs_metrics::LaneReport {
            iface: o.iface.clone(),
            poll: poll_name(o.poll).into(),
            ..Default::default()
        };
        match &*lock(&self.l2) {
            L2State::Up(l) | L2State::Retry(l, _) => {
                r.bind_mode = bind_mode_name(l.mode).into();
                r.up = l.is_up();
                r.reason = l.reason();
            }
            L2State::Off => r.reason = lock(&self.l2_refused).clone(),
            L2State::Later(_) => r.reason = lock(&self.l2_refused).clone(),
            L2State::Untried | L2State::Trying => {}
        }
        for op in zcfs_protocol::ALL_OPS {
            let c = zcfs_metrics::PathCounts {
                l2: self.l2_counters.requests[*op as usize].load(Ordering::Relaxed),
                tcp: self.tcp_requests[*op as usize].load(Ordering::Relaxed),
            };
            if c.l2 + c.tcp > 0 {
                r.requests.insert(op.name().into(), c);
            }
        }
        let c = &self.l2_counters;
        for (name, v) in [
            ("fell_back", &c.fell_back),
            ("landed", &c.landed),
            ("landed_bytes", &c.landed_bytes),
        ] {
            r.counters.insert(name.into(), v.load(Ordering::Relaxed));
        }
        Some(r)
    }

    /// Whether the layer-2 lane is up, and its sockets' bind mode (None: no lane).
    pub fn l2_status(&self) -> Option<(bool, zcfs_xsk::BindMode)> {
        match &*lock(&self.l2) {
            L2State::Up(l) | L2State::Retry(l, _) => Some((l.is_up(), l.mode)),
            _ => None,
        }
    }

    /// The lane endpoint's protocol counters.
    pub fn l2_endpoint_stats(&self) -> Option<zcfs_l2::Stats> {
        match &*lock(&self.l2) {
            L2State::Up(l) | L2State::Retry(l, _) => Some(l.endpoint_stats()),
            _ => None,
        }
    }

    /// The lane endpoint's counters and recent protocol events (for diagnosing a test).
    pub fn l2_debug_state(&self) -> Option<String> {
        match &*lock(&self.l2) {
            L2State::Up(l) | L2State::Retry(l, _) => Some(l.debug_state()),
            _ => None,
        }
    }

    /// The lane, set up on first use when the configuration asks for it: the local
    /// interface opened, the offer on TCP, then one round trip over the lane (the
    /// probe). Any failure or a refusal leaves the session on TCP with one log line;
    /// so does a probe without an answer, unless a lane of this client worked before
    /// (the interfaces were right: the server's lane may be busy or restarting), when
    /// the lane is tried again after [`l2::L2_RETRY_AFTER`], at most
    /// [`l2::L2_SILENT_RETRIES`] times in a row. A lane that went down is `Unfenced`
    /// until the server has answered its fence, then set up again after
    /// [`l2::L2_RETRY_AFTER`].
    fn l2_lane(&self) -> LaneNow {
        let Some(o) = self.cfg.l2.as_ref() else {
            return LaneNow::Tcp;
        };
        {
            let mut st = lock(&self.l2);
            match &*st {
                L2State::Up(l) if l.is_up() => return LaneNow::Up(l.clone()),
                L2State::Up(l) => match l.fenced_at() {
                    Some(at) => {
                        // A lane lost with data due that never brought any is one more
                        // silent retry, bounded like those (review 27b: a lane that carried
                        // the probe and small commands but not a read's full-size data
                        // frames, an MTU mismatch, was set up again for ever; 27c: also
                        // when it sat idle for a while first). One that carried only
                        // commands is set up again as often as it is lost (27d: a
                        // metadata-only lane was given up for good after four losses).
                        // Per kind of full-size frame (review 28b): blocks that got
                        // through one way do not vouch for a read's data the other way.
                        if l.data_never_came() {
                            if self.l2_silent.fetch_add(1, Ordering::SeqCst)
                                >= l2::L2_SILENT_RETRIES
                            {
                                let why = format!(
                                "{} lanes in a row were lost without bringing the data due on them",
                                l2::L2_SILENT_RETRIES + 1
                            );
                                tracing::warn!(iface = %o.iface, "layer-2 lane not used any more, the session stays on TCP: {why}");
                                *lock(&self.l2_refused) = why;
                                *st = L2State::Off;
                                return LaneNow::Tcp;
                            }
                        } else if l.data_came() {
                            self.l2_silent.store(0, Ordering::SeqCst);
                        }
                        *st = L2State::Retry(l.clone(), at + l2::L2_RETRY_AFTER);
                        return LaneNow::Tcp;
                    }
                    None => return LaneNow::Unfenced(l.clone()),
                },
                L2State::Untried => *st = L2State::Trying,
                // The old lane is dropped here, before the new one takes the interface.
                L2State::Retry(_, at) if std::time::Instant::now() >= *at => *st = L2State::Trying,
                L2State::Later(at) if std::time::Instant::now() >= *at => *st = L2State::Trying,
                _ => return LaneNow::Tcp,
            }
        }
        let r = self.l2_setup(o);
        let mut st = lock(&self.l2);
        match r {
            Ok(lane) => {
                // The count of silent retries goes on until a lane brings data.
                self.l2_worked.store(true, Ordering::SeqCst);
                self.l2_busy.store(0, Ordering::SeqCst);
                *st = L2State::Up(lane.clone());
                LaneNow::Up(lane)
            }
            Err(L2SetupError::Silent(lane, why))
                if self.l2_worked.load(Ordering::SeqCst)
                    && self.l2_silent.fetch_add(1, Ordering::SeqCst) < l2::L2_SILENT_RETRIES =>
            {
                tracing::warn!(iface = %o.iface, "layer-2 lane set up again but silent, tried again in {:?}: {why}", l2::L2_RETRY_AFTER);
                *st = L2State::Retry(lane, std::time::Instant::now() + l2::L2_RETRY_AFTER);
                LaneNow::Tcp
            }
            Err(L2SetupError::Busy(why)) => {
                // Offered again later, each time twice as late (up to L2_BUSY_RETRY_MAX):
                // the lane is used once the other session gives it back. Logged once.
                let n = self.l2_busy.fetch_add(1, Ordering::SeqCst);
                let wait = l2::L2_RETRY_AFTER
                    .saturating_mul(1 << n.min(16))
                    .min(l2::L2_BUSY_RETRY_MAX);
                if n == 0 {
                    tracing::warn!(iface = %o.iface, "layer-2 lane busy, requests go on TCP and the lane is offered again later: {why}");
                }
                *lock(&self.l2_refused) = why;
                *st = L2State::Later(std::time::Instant::now() + wait);
                LaneNow::Tcp
            }
            Err(e) => {
                let why = e.to_string();
                tracing::warn!(iface = %o.iface, "layer-2 lane not used, the session stays on TCP: {why}");
                *lock(&self.l2_refused) = why;
                *st = L2State::Off;
                LaneNow::Tcp
            }
        }
    }

    fn l2_setup(&self, o: &l2::L2Options) -> Result<Arc<l2::L2Lane>, L2SetupError> {
        let local = l2::open_local(o).map_err(L2SetupError::Failed)?;
        let req: Request = zcfs_protocol::L2SetupReq {
            mac: zcfs_protocol::mac_to_u64(local.mac),
            cmd_queue: l2::CMD_QUEUE,
            data_queue: l2::DATA_QUEUE,
            geometry: zcfs_protocol::Blob::new(local.geometry.encode().to_vec()).expect("24 bytes"),
        }
        .into();
        let r = self
            .call(&req, Caller::process(), &[])
            .map_err(|e| L2SetupError::Failed(format!("the offer failed: {}", e.msg())))?;
        let reply = match zcfs_protocol::Reply::decode(zcfs_protocol::Op::L2Setup, &r.body) {
            Ok(zcfs_protocol::Reply::L2Setup(a)) => a,
            Ok(_) => {
                return Err(L2SetupError::Failed(
                    "the server answered another operation".into(),
                ))
            }
            Err(e) => return Err(L2SetupError::Failed(format!("the server's answer: {e}"))),
        };
        if !reply.accepted {
            let reason = String::from_utf8_lossy(&reply.reason);
            let why = format!("the server refused: {reason}");
            return Err(if reason.starts_with(zcfs_protocol::l2::BUSY_REASON) {
                L2SetupError::Busy(why)
            } else {
                L2SetupError::Failed(why)
            });
        }
        // Accepted: the server holds its interface for this session from here on, so a
        // failure below gives it back (`L2Release`) rather than leave it held until
        // the connection ends.
        let release = |why: String| {
            let req: Request = zcfs_protocol::L2ReleaseReq {}.into();
            match self.call(&req, Caller::process(), &[]) {
                Ok(_) => why,
                Err(e) => format!(
                    "{why}; giving the lane back failed ({}): the server frees it when this \
                     connection ends",
                    e.msg()
                ),
            }
        };
        if reply.cmd_queue != l2::CMD_QUEUE || reply.data_queue != l2::DATA_QUEUE {
            return Err(L2SetupError::Failed(release(format!(
                "the server's queues (command {}, data {}) differ from ours",
                reply.cmd_queue, reply.data_queue
            ))));
        }
        let key = zcfs_protocol::l2::tag_key_material(self.cfg.secret.as_deref(), &reply.nonce);
        // The same condition as the key's: a secret both ends share, or none.
        let open_tags = self.cfg.secret.is_none();
        // Writes land in place only up to what the server takes (0: none).
        let mut o = o.clone();
        o.land_max = Some(
            o.land_max
                .unwrap_or(l2::default_land_max(o.poll))
                .min(reply.land_max),
        );
        let lane = l2::L2Lane::new(
            local,
            &o,
            zcfs_protocol::mac_from_u64(reply.mac),
            &key,
            open_tags,
        )
        .map_err(|why| L2SetupError::Failed(release(why)))?;
        let lane = Arc::new(lane);
        if let Err(e) = lane.start_flusher() {
            return Err(L2SetupError::Failed(release(format!(
                "no flusher thread: {e}"
            ))));
        }
        if let Err(why) = self.l2_probe(&lane, &o.iface) {
            return Err(L2SetupError::Silent(lane, release(why)));
        }
        tracing::info!(iface = %o.iface, mode = ?lane.mode, land_max = ?o.land_max, "layer-2 lane up");
        Ok(lane)
    }

    /// One round trip over a lane just set up: a `Ping` on it, answered within
    /// [`l2::L2_REPLY_TIMEOUT`]. Counted as a layer-2 ping when it is answered (the
    /// server counts it so too); a probe without an answer is not a request that fell
    /// back to TCP, and is counted nowhere.
    fn l2_probe(&self, lane: &l2::L2Lane, iface: &str) -> Result<(), String> {
        let id = self.next_id();
        let req: Request = zcfs_protocol::PingReq {}.into();
        let who = Caller::process();
        let (hdr, body) = req
            .encode_with_groups(id, who.cred, who.groups)
            .map_err(|e| format!("the lane's probe: {e}"))?;
        let probe = l2::L2Counters::new();
        match lane.call(&req, &hdr, &body, &[], &probe) {
            Ok(_) => {
                self.l2_counters.requests[zcfs_protocol::Op::Ping as usize]
                    .fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(l2::Fallback) if !lane.is_up() => Err(format!(
                "no reply over layer 2 within {:?}: {iface} does not reach the server's \
                 --l2 interface (not on its Ethernet segment?)",
                l2::L2_REPLY_TIMEOUT
            )),
            Err(l2::Fallback) => Err("the lane's probe could not be sent on it".into()),
        }
    }

    /// Connect now (all connections), to fail early with a clear error.
    pub fn connect(&self) -> Result<(), Error> {
        for i in 0..self.conns.len() {
            self.conn(i)?;
        }
        self.l2_lane();
        Ok(())
    }

    /// The fewest in-flight requests a connection up now takes (0 with none up).
    pub fn max_inflight(&self) -> u32 {
        // A slot being dialled after a stall is passed over, not waited for.
        (0..self.conns.len())
            .filter_map(|i| self.slot(i).ok()?.as_ref().map(|c| c.welcome.max_inflight))
            .min()
            .unwrap_or(0)
    }

    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// The most data one read or write may carry to this server: the least of what
    /// every connection's Welcome allowed and the protocol's `MAX_DATA` (connecting the
    /// connections that are not up).
    pub fn max_data(&self) -> Result<usize, Error> {
        let mut max = zcfs_protocol::MAX_DATA;
        for i in 0..self.conns.len() {
            max = max.min(self.conn(i)?.welcome.max_data as usize);
        }
        Ok(max)
    }

    /// The session id this client's connections carry.
    pub fn session(&self) -> u64 {
        self.session
    }

    /// The session epoch: 0 for the first session, one more each time a reconnection
    /// found the session gone (server restarted, or grace period over).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Close every connection now (the next call connects again). What the server
    /// holds for this client stays for its grace period.
    pub fn disconnect(&self) {
        for slot in &self.conns {
            if let Some(c) = lock(slot).take() {
                c.close("the client disconnected");
            }
        }
    }

    pub(crate) fn set_on_restart(&self, f: RestartHook) {
        *lock(&self.on_restart) = Some(f);
    }

    fn resolve(&self) -> Result<Address, Error> {
        let a: Address = self
            .cfg
            .addr
            .parse()
            .map_err(|e| Error::new(libc::EINVAL, format!("{e}")))?;
        if let Address::Tcp(_) = a {
            a.resolve()
                .map_err(|e| Error::new(libc::EINVAL, format!("{}: {e}", self.cfg.addr)))?
                .ok_or_else(|| {
                    Error::new(libc::EINVAL, format!("{}: no address", self.cfg.addr))
                })?;
        }
        Ok(a)
    }

    /// Connect and shake hands. A server at one of its connection bounds closes a new
    /// connection before its Welcome: that is tried again, with growing pauses, until
    /// the client's timeout (a host starting many clients at once gets in as places
    /// free up); every other failure is reported at once.
    /// Ok: the connection, and how long its own attempt (connect and handshake, not
    /// the attempts and pauses before it) took.
    fn dial(&self, lane: usize, patience: Duration) -> Result<(Arc<Conn>, Duration), Error> {
        let deadline = std::time::Instant::now() + patience;
        let mut pause = DIAL_RETRY_FIRST_PAUSE;
        let (s, established, took) = loop {
            // Each attempt a newer generation: an attempt the server took in but we
            // gave up on must not keep the lane from the next.
            let lane = Lane {
                index: u16::try_from(lane).unwrap_or(u16::MAX),
                generation: self.lane_generations[lane].fetch_add(1, Ordering::SeqCst) + 1,
            };
            // Each attempt gets what is left of the patience, not all of it again
            // (review 32b: a connect took about twice the client's timeout).
            let left = deadline
                .saturating_duration_since(std::time::Instant::now())
                .max(Duration::from_millis(1));
            let attempt = std::time::Instant::now();
            match self.connect_and_handshake(lane, left) {
                Ok((s, est)) => break (s, est, attempt.elapsed()),
                Err((e, refused)) if refused && std::time::Instant::now() + pause < deadline => {
                    tracing::debug!("connection refused ({e}); trying again in {pause:?}");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(DIAL_RETRY_MAX_PAUSE);
                }
                Err((e, _)) => return Err(e),
            }
        };
        Ok((self.attach_conn(s, established)?, took))
    }

    /// One attempt: Err carries whether the server closed the connection before its
    /// Welcome (refused at a bound, worth another try).
    fn connect_and_handshake(
        &self,
        lane: Lane,
        patience: Duration,
    ) -> Result<(Stream, Established), (Error, bool)> {
        let addr = self.resolve().map_err(|e| (e, false))?;
        // The whole attempt, connect and handshake, within `patience`.
        let deadline = std::time::Instant::now() + patience;
        let mut s = Stream::connect(&addr, patience).map_err(|e| {
            (
                Error::new(
                    e.raw_os_error().unwrap_or(libc::EIO),
                    format!("connecting to {}: {e}", self.cfg.addr),
                ),
                false,
            )
        })?;
        let _ = tune(&s);
        if self.cfg.integrity == Integrity::Full && self.cfg.secret.is_none() {
            return Err((
                Error::new(
                    libc::EINVAL,
                    "integrity full needs a secret (--secret-file): without one there are no MACs",
                ),
                false,
            ));
        }
        // What is left of the patience, for the handshake as a whole (each of its
        // reads and writes gets the time left; at least 1 ms: zero would mean none).
        let left = deadline
            .saturating_duration_since(std::time::Instant::now())
            .max(Duration::from_millis(1));
        match client_handshake_within(
            &mut s,
            self.cfg.secret.as_deref(),
            self.session,
            lane,
            self.cfg.integrity,
            left,
        ) {
            Ok(est) => Ok((s, est)),
            Err(e) => {
                let refused = closed_before_welcome(&e);
                Err((terr(&self.cfg.addr, e), refused))
            }
        }
    }

    /// A connection that finished its handshake, set up for calls.
    fn attach_conn(&self, s: Stream, established: Established) -> Result<Arc<Conn>, Error> {
        let welcome = established.welcome;
        let (tx, rx) = match established.channel {
            Some((tx, rx)) => (Some(tx), Some(rx)),
            None => (None, None),
        };
        if tx
            .as_ref()
            .is_some_and(|m| m.integrity() == Integrity::Full)
        {
            self.data_tagged_channel.store(true, Ordering::Relaxed);
        }
        s.set_read_timeout(None)
            .map_err(|e| Error::new(libc::EIO, e.to_string()))?;
        // The attempt may have had less patience (`STALLED_DIAL_PATIENCE`).
        s.set_write_timeout(Some(self.cfg.timeout))
            .map_err(|e| Error::new(libc::EIO, e.to_string()))?;
        let clone = || {
            s.try_clone()
                .map_err(|e| Error::new(libc::EIO, e.to_string()))
        };
        let (reader, control) = (clone()?, clone()?);
        let conn = Arc::new(Conn {
            writer: Mutex::new(Writer { s, mac: tx }),
            reader: Mutex::new(Some(Reader {
                s: reader,
                mac: rx,
                rb: RecvBuf::default(),
            })),
            rx_wake: (Mutex::new(false), Condvar::new()),
            leads: AtomicU64::new(0),
            timeout: self.cfg.timeout,
            control,
            pending: Mutex::new(HashMap::new()),
            posted: self.posted.clone(),
            broken: AtomicBool::new(false),
            peer_closed: AtomicBool::new(false),
            welcome,
            epoch: AtomicU64::new(u64::MAX),
            inflight: (Mutex::new(0), Condvar::new()),
        });
        let c2 = conn.clone();
        std::thread::Builder::new()
            .name("zcfs-client-rx".into())
            .spawn(move || background_reader(c2))
            .map_err(|e| Error::new(libc::EIO, e.to_string()))?;
        Ok(conn)
    }

    /// Lane `i`'s slot. While a stall is on record a slot someone holds (dialling
    /// it, a full timeout against a stopped server) is not waited for: Err with the
    /// stall's error, and the caller fails at once.
    fn slot(&self, i: usize) -> Result<MutexGuard<'_, Option<Arc<Conn>>>, Error> {
        match self.conns[i].try_lock() {
            Ok(slot) => Ok(slot),
            Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => match self.stall.last() {
                Some((e, ago, _)) => Err(stalled(&e, ago, "another attempt is under way")),
                None => Ok(lock(&self.conns[i])),
            },
        }
    }

    /// The `i`th connection, (re)connecting if needed. A new connection is handed out
    /// only after what its handshake says is dealt with: a lost session revalidated
    /// (the restart hook), posted requests its predecessor lost sent again.
    /// Connections are made one at a time (`dialing`): a handshake's `resumed` then
    /// always speaks of the session as the connections made before left it, never of
    /// one a sibling connection created and has not revalidated yet.
    fn conn(&self, i: usize) -> Result<Arc<Conn>, Error> {
        // After a stalled attempt, one caller at a time tries again (a full attempt
        // only now and then: `DialStall`); the others fail at once with the stall's
        // error rather than wait for it (a lane's slot is held while it is dialled).
        let mut slot = self.slot(i)?;
        if let Some(c) = slot.as_ref() {
            if c.is_up() {
                return Ok(c.clone());
            }
            self.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        // Who may dial, and with what patience (`DialStall`): with no stall on record,
        // a full attempt, waiting for the gate; after a stall, callers never wait for
        // the gate (it is held by an attempt that may take the whole timeout), and a
        // full attempt goes only now and then (`full_attempt_after`), short ones between.
        let stall = self.stall.last();
        let _dialing = match &stall {
            Some((e, ago, _)) => self
                .dialing
                .try_enter()
                .ok_or_else(|| stalled(e, *ago, "another attempt is under way"))?,
            None => self.dialing.enter(self.cfg.timeout, &self.cfg.addr)?,
        };
        // The attempt this caller waited for may have stalled meanwhile.
        let stall = stall.or_else(|| self.stall.last());
        let short = stall
            .filter(|(_, _, full_now)| !full_now)
            .map(|(e, ago, _)| (e, ago));
        let patience = match short {
            Some(_) => self.short_patience(),
            None => self.cfg.timeout,
        };
        let started = std::time::Instant::now();
        let dialed = self.dial(i, patience);
        let took = started.elapsed();
        let c = match (dialed, short) {
            (Ok((c, handshake)), _) => {
                self.stall.clear();
                lock(&self.handshakes).add(handshake);
                c
            }
            // A short attempt that ran out of patience says nothing new: the stall's
            // error, and its record (and so the next full attempt) stay as they were.
            (Err(_), Some((e, ago))) if took >= patience / 2 => {
                return Err(stalled(&e, ago, "still not answering"))
            }
            // A quick failure (refused: the server is gone) is its own news.
            (Err(e), Some(_)) => return Err(e),
            (Err(e), None) if took >= self.cfg.timeout / 2 => {
                self.stall.record(&e);
                // As `stalled` says it to the requests after this one.
                return Err(Error::new(
                    libc::ETIMEDOUT,
                    format!("{} (the connection attempt stalled)", e.msg()),
                ));
            }
            (Err(e), None) => return Err(e),
        };
        let old = self.instance.swap(c.welcome.instance, Ordering::SeqCst);
        let had_session = self.had_session.swap(true, Ordering::SeqCst);
        let old_serial = self
            .session_serial
            .swap(c.welcome.session_serial, Ordering::SeqCst);
        let restarted = old != 0 && old != c.welcome.instance;
        if c.welcome.resumed {
            self.resumed.fetch_add(1, Ordering::Relaxed);
        }
        // `resumed` alone is not enough: an attempt we gave up on after the server
        // took it in (a short attempt, a lost Verdict) may have started the session
        // again after ours expired, and this connection then resumes that new one.
        let started_again = had_session && old_serial != c.welcome.session_serial;
        if restarted || (had_session && !c.welcome.resumed) || started_again {
            tracing::warn!(
                addr = %self.cfg.addr,
                restarted,
                started_again,
                "the server no longer holds this client's session: revalidating handles"
            );
            let epoch = {
                let _reval = lock(&self.reval);
                let epoch = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
                // What was posted to the old session went with it.
                lock(&self.posted.map).retain(|_, p| p.epoch == epoch);
                self.posted.gone.notify_all();
                epoch
            };
            c.epoch.store(epoch, Ordering::SeqCst);
            self.revalidations.fetch_add(1, Ordering::Relaxed);
            self.run_restart_hook(&c, epoch);
        } else {
            let epoch = self.epoch();
            c.epoch.store(epoch, Ordering::SeqCst);
            if self.revalidation_owed.load(Ordering::SeqCst) {
                tracing::info!("finishing a revalidation a lost connection cut short");
                self.run_restart_hook(&c, epoch);
            }
        }
        *slot = Some(c.clone());
        self.resend_posted(&c);
        Ok(c)
    }

    /// The patience of a short attempt after a stall: `STALLED_DIAL_PATIENCE`, or three
    /// times the quickest of the last handshakes if that is more (a long link: a short
    /// attempt that can never succeed would leave a server that is back unreached until
    /// the next full attempt, up to 32 s later; review 32d), at most half the client's
    /// timeout. The quickest, not the last: a handshake that waited for a server to
    /// resume, or for a place at its bounds, says nothing of the link (review 32e).
    fn short_patience(&self) -> Duration {
        let link = lock(&self.handshakes).quickest();
        let cap = (self.cfg.timeout / 2)
            .max(STALLED_DIAL_PATIENCE)
            .min(self.cfg.timeout);
        link.saturating_mul(3).max(STALLED_DIAL_PATIENCE).min(cap)
    }

    /// The restart hook on `c` for `epoch`, remembering whether it is still owed.
    /// (Called with the dial gate held: one at a time.)
    fn run_restart_hook(&self, c: &Arc<Conn>, epoch: u64) {
        let done = match lock(&self.on_restart).as_ref() {
            Some(f) => f(self, &ConnRef(c.clone()), epoch),
            None => true,
        };
        self.revalidation_owed.store(!done, Ordering::SeqCst);
    }

    /// Whether a revalidation cut short waits for the next connection.
    pub fn revalidation_owed(&self) -> bool {
        self.revalidation_owed.load(Ordering::SeqCst)
    }

    /// Send again (with their ids) the posted requests of this session whose
    /// connection was lost before their replies came: the server's reply cache answers
    /// any it did execute.
    fn resend_posted(&self, c: &Arc<Conn>) {
        let epoch = c.epoch.load(Ordering::SeqCst);
        let lost: Vec<(u64, Request)> = {
            let mut posted = lock(&self.posted.map);
            posted
                .iter_mut()
                .filter(|(_, p)| {
                    p.epoch == epoch && p.conn.upgrade().filter(|x| x.is_up()).is_none()
                })
                .map(|(&id, p)| {
                    p.conn = Arc::downgrade(c);
                    (id, p.req.clone())
                })
                .collect()
        };
        for (id, req) in lost {
            self.resent.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                id,
                "sending {} again after a lost connection",
                req.op().name()
            );
            drop(self.submit_on(
                c.clone(),
                id,
                &req,
                Caller::process(),
                Payload::Mem(&[]),
                false,
            ));
        }
    }

    /// A connection to send on (round robin), connecting if needed.
    ///
    /// Every lane whose connection was given up on (a reply timed out, or it broke) is
    /// dialled again first, whichever lane the request goes out on: dialling a lane
    /// fences its old connection at the server (`Lane`), so what the caller was told had
    /// failed there is executed before this request or never. Fencing only the lane the
    /// request goes out on would leave a request the client gave up on (a retry in
    /// `exchange` on the other lane, say) free to arrive after it.
    fn pick(&self) -> Result<Arc<Conn>, Error> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        for j in (0..self.conns.len()).filter(|&j| j != i) {
            let given_up = self.slot(j)?.as_ref().is_some_and(|c| !c.is_up());
            if given_up {
                self.conn(j)?;
            }
        }
        self.conn(i)
    }

    /// Make the connections that were lost again (the server closed them, a reply
    /// timed out, the client let them go or never made them), running the session's
    /// revalidation if the server lost the session. A caller about to read state the
    /// revalidation renews (the server handles of open files) then reads the new
    /// session's. (Review 32c: a
    /// connection lost to a quiet link was left to the request's own dial, which
    /// found the session gone and re-opened the file while the request carried the
    /// old session's handle: EBADF. A dial that fails here is the request's failure:
    /// it is not dialled for again.)
    /// Err: no connection could be made (what the caller's request would have met).
    pub fn revive_lost(&self) -> Result<(), Error> {
        let mut lost = false;
        for i in 0..self.conns.len() {
            // (None: never made, or let go by `disconnect`.)
            lost |= self.slot(i)?.as_ref().is_none_or(|c| !c.is_up());
        }
        // A revalidation cut short is finished by the next connection made: the one
        // it was cut on is down, and `pick` makes it again.
        let owed = self.revalidation_owed();
        if lost || owed {
            let c = self.pick()?;
            if owed && self.revalidation_owed() {
                // No connection was down after all: finish it on this one.
                let _dialing = self.dialing.enter(self.cfg.timeout, &self.cfg.addr)?;
                // Only for the epoch it is owed in, on a connection of that epoch (a
                // newer session may have come while we waited: its dial ran the hook).
                let epoch = self.epoch();
                if self.revalidation_owed() && c.is_up() && c.epoch.load(Ordering::SeqCst) == epoch
                {
                    self.run_restart_hook(&c, epoch);
                }
            }
        }
        Ok(())
    }

    /// Send a request (and write data) without waiting for the reply. It goes on TCP,
    /// but after the lane's fence as `call`'s requests do (`l2_unfenced`): with the lane
    /// down and not yet fenced at the server, a lane request the caller was told had
    /// failed may still run there, and must not overtake this one (review rv9: a
    /// write-behind write was overwritten by a lane write that had failed before it).
    pub fn submit(&self, req: &Request, cred: Caller<'_>, data: &[&[u8]]) -> Result<Ticket, Error> {
        self.submit_payload(req, cred, Payload::Mem(data))
    }

    /// `submit` of a write whose bytes are in a pipe (`PipedData`): they go into the
    /// socket with splice(2) behind the header, never through memory here. With full
    /// integrity (data tags, which need the bytes) they are read into memory instead;
    /// [`Client::sends_piped`] says which.
    pub fn submit_piped(
        &self,
        req: &Request,
        cred: Caller<'_>,
        data: &mut dyn PipedData,
    ) -> Result<Ticket, Error> {
        self.submit_payload(req, cred, Payload::Piped(data))
    }

    /// Whether `submit_piped` moves piped bytes without reading them: requests go on
    /// sockets, and no data tag needs them hashed (integrity `headers`, or no secret).
    pub fn sends_piped(&self) -> bool {
        let asked = self.cfg.integrity == Integrity::Full && self.cfg.secret.is_some();
        !asked && !self.data_tagged_channel.load(Ordering::Relaxed)
    }

    fn submit_payload(
        &self,
        req: &Request,
        cred: Caller<'_>,
        data: Payload<'_, '_>,
    ) -> Result<Ticket, Error> {
        cred.check()?;
        self.fence_lane_before(l2::free_of_effects(req.op()))?;
        let conn = self.pick()?;
        let id = self.next_id();
        self.submit_on(conn, id, req, cred, data, true)
    }

    /// Before requests go on TCP with the lane down and not yet fenced at the server:
    /// start the fence (requests `free_of_effects`), or wait for it (see `submit`).
    fn fence_lane_before(&self, free_of_effects: bool) -> Result<(), Error> {
        if let Some(lane) = self.l2_down_unfenced() {
            if free_of_effects {
                self.l2_fence_start(&lane, false);
            } else {
                self.l2_fence(&lane)?;
            }
        }
        Ok(())
    }

    /// Count a send of `n` gathered writes (`RemoteFs`'s gather).
    pub(crate) fn count_gathered(&self, n: usize) {
        self.gathered_writes.fetch_add(n as u64, Ordering::Relaxed);
        self.gather_sends.fetch_add(1, Ordering::Relaxed);
    }

    /// A mount's small writes that went out gathered, and the sends that carried them.
    pub fn gathered_writes(&self) -> (u64, u64) {
        (
            self.gathered_writes.load(Ordering::Relaxed),
            self.gather_sends.load(Ordering::Relaxed),
        )
    }

    /// `submit` of several requests, each with its data in memory, in one send on one
    /// connection (the mount's gathered small writes): the server runs them in this
    /// order, and the network stack and the server's receive are paid once for all.
    /// Checked before anything is sent: every caller's groups, the lane's fence, a
    /// connection. A failed send breaks the connection; every ticket then holds the
    /// ENOTCONN the break delivered, as `submit`'s does.
    pub fn submit_batch(
        &self,
        msgs: &[(Request, Caller<'_>, &[u8])],
    ) -> Result<Vec<Ticket>, Error> {
        if msgs.len() > SUBMIT_BATCH_MAX {
            return Err(Error::new(
                libc::EINVAL,
                format!(
                    "a batch of {} requests: at most {SUBMIT_BATCH_MAX} go in one send",
                    msgs.len()
                ),
            ));
        }
        for (_, cred, _) in msgs {
            cred.check()?;
        }
        if msgs.is_empty() {
            return Ok(Vec::new());
        }
        self.fence_lane_before(msgs.iter().all(|(r, _, _)| l2::free_of_effects(r.op())))?;
        let conn = self.pick()?;
        // At most half the connection's slots per send (write-behind keeps the other
        // half for calls): a batch gathered under a larger bound (a server restarted
        // with a smaller max_inflight) goes out in parts, each answered before the
        // next is sent, its tickets then holding no slot. Taking a slot per request of
        // a batch larger than the slots would wait for the batch's own (review 34).
        let part = (conn.welcome.max_inflight as usize / 2).max(1);
        let mut tickets = Vec::with_capacity(msgs.len());
        let mut encoded = Vec::with_capacity(msgs.len());
        for (req, cred, _) in msgs {
            let id = self.next_id();
            let (hdr, body) = req
                .encode_with_groups(id, cred.cred, cred.groups)
                .map_err(|e| Error::new(e.errno(), e.to_string()))?;
            encoded.push((id, hdr, body));
        }
        let parts = msgs.chunks(part).zip(encoded.chunks(part));
        let count = msgs.len().div_ceil(part);
        for (k, (msgs, encoded)) in parts.enumerate() {
            let sent = self.send_batch_on(&conn, msgs, encoded);
            if k + 1 < count {
                tickets.extend(sent.into_iter().map(Ticket::into_answered));
            } else {
                tickets.extend(sent);
            }
        }
        Ok(tickets)
    }

    /// One send of `msgs` (encoded as `encoded`) on `conn`, a slot taken for each: their
    /// tickets. A failed send breaks the connection (every ticket then holds ENOTCONN).
    fn send_batch_on(
        &self,
        conn: &Arc<Conn>,
        msgs: &[(Request, Caller<'_>, &[u8])],
        encoded: &[(u64, [u8; REQ_HDR], Vec<u8>)],
    ) -> Vec<Ticket> {
        let mut tickets = Vec::with_capacity(msgs.len());
        for ((req, _, _), (id, _, _)) in msgs.iter().zip(encoded) {
            conn.take_inflight_slot();
            let (tx, rx) = sync_channel(1);
            lock(&conn.pending).insert(*id, (req.op(), Some(Slot::Waiter(tx))));
            tickets.push(self.ticket(conn, *id, rx));
        }
        let parts: Vec<OutMessage<'_>> = encoded
            .iter()
            .zip(msgs)
            .map(|((_, hdr, body), (_, _, data))| (&hdr[..], &body[..], std::slice::from_ref(data)))
            .collect();
        let mut w = lock(&conn.writer);
        let r = send_messages(&mut w, &parts);
        drop(w);
        self.sent_or_broke(conn, r, msgs.iter().map(|(req, _, _)| req.op()));
        tickets
    }

    /// The ticket of request `id`, sent on `conn` with one of its in-flight slots.
    fn ticket(&self, conn: &Arc<Conn>, id: u64, rx: Receiver<Result<Response, Error>>) -> Ticket {
        Ticket {
            rx,
            conn: conn.clone(),
            id,
            timeout: self.cfg.timeout,
            addr: self.cfg.addr.clone(),
            holds_slot: true,
        }
    }

    /// After a send of requests `ops` on `conn`: counted, or (failed) the connection
    /// broken, which fails every request in flight on it. Whether it was sent.
    fn sent_or_broke(
        &self,
        conn: &Conn,
        r: std::io::Result<usize>,
        ops: impl Iterator<Item = zcfs_protocol::Op>,
    ) -> bool {
        match r {
            Ok(n) => {
                self.bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
                for op in ops {
                    self.tcp_requests[op as usize].fetch_add(1, Ordering::Relaxed);
                }
                true
            }
            Err(e) => {
                if conn::closed_by_peer(&e) && !conn.broken.load(Ordering::SeqCst) {
                    conn.peer_closed.store(true, Ordering::SeqCst);
                }
                conn.break_with(&format!("send failed: {e}"));
                false
            }
        }
    }

    /// `submit` on the connection `after` went out on, so the server runs it after
    /// `after`'s request (it runs one connection's requests in order): a close's FLUSH
    /// sent behind the file's writes in flight. ENOTCONN when that connection is down
    /// or the lane's fence is still owed (the caller then waits and sends as usual).
    pub fn submit_behind(
        &self,
        after: &Ticket,
        req: &Request,
        cred: Caller<'_>,
        data: &[&[u8]],
    ) -> Result<Ticket, Error> {
        cred.check()?;
        if self.l2_down_unfenced().is_some() || !after.conn.is_up() {
            return Err(Error::new(
                libc::ENOTCONN,
                "the connection to send behind is down (or the lane not fenced yet)",
            ));
        }
        let id = self.next_id();
        self.submit_on(after.conn.clone(), id, req, cred, Payload::Mem(data), true)
    }

    /// Send a request without waiting for its reply, as part of session `epoch` (what
    /// the caller counted it against). It goes out on a connection of that session that
    /// is up, or, with none up, on the next one made; one lost with its connection goes
    /// out again (same id) on the next. Dropped if that session is gone: the server
    /// gave back everything the session held.
    pub fn post(&self, req: &Request, cred: Caller<'_>, epoch: u64) {
        if let Err(e) = cred.check() {
            tracing::warn!("not posting {}: {}", req.op().name(), e.msg());
            return;
        }
        let id = self.next_id();
        {
            // Registered first (as not sent): from here on, every connection made
            // sends it if it is still without a reply then.
            let _reval = lock(&self.reval);
            if epoch != self.epoch() {
                return;
            }
            lock(&self.posted.map).insert(
                id,
                Posted {
                    req: req.clone(),
                    epoch,
                    conn: Weak::new(),
                },
            );
        }
        // Send it on a connection that is up. One lost after it was chosen has (or will
        // have) a successor that sends it; one already replaced when chosen is not
        // enough, so go on to the next.
        loop {
            let live = (0..self.conns.len()).find_map(|i| {
                self.slot(i)
                    .ok()?
                    .as_ref()
                    .filter(|c| c.is_up() && c.epoch.load(Ordering::SeqCst) == epoch)
                    .cloned()
            });
            let Some(conn) = live else { return };
            match lock(&self.posted.map).get_mut(&id) {
                Some(p) => p.conn = Arc::downgrade(&conn),
                // Answered already (sent by a reconnection meanwhile).
                None => return,
            }
            drop(self.submit_on(conn.clone(), id, req, cred, Payload::Mem(&[]), false));
            if conn.is_up() {
                return;
            }
        }
    }

    /// Requests posted and not answered yet (tests).
    pub fn posted_unanswered(&self) -> usize {
        lock(&self.posted.map).len()
    }

    /// Wait, at most `within`, until every request posted before this call that is out
    /// on a live connection has been answered (or dropped with its session): whether
    /// none is left. The server runs each connection's requests in order but the
    /// connections side by side, so a request that must come after a posted one (a
    /// lookup of "." after the FORGET of that node's last reference) waits for it
    /// here rather than going out on another connection and overtaking it. One whose
    /// connection was lost (or never made) is sent again on one made here, and waited
    /// for too. Ok(false): `within` passed first; Err: that connection could not be
    /// made (what a request sent now would meet).
    pub fn wait_posted(&self, within: Duration) -> Result<bool, Error> {
        self.wait_posted_if(within, |_| true)
    }

    /// [`Client::wait_posted`] for the posted requests that name inode `ino` (a FORGET
    /// with an item of it, a RELEASE of it): a lookup of "." of one node does not wait
    /// for FORGETs of others queued behind other traffic (review 28b: up to the timeout).
    pub fn wait_posted_for(&self, ino: u64, within: Duration) -> Result<bool, Error> {
        self.wait_posted_if(within, |r| match r {
            Request::Forget(f) => f.items.iter().any(|i| i.ino == ino),
            Request::Release(rel) => rel.node.ino == ino,
            _ => false,
        })
    }

    fn wait_posted_if(
        &self,
        within: Duration,
        names: impl Fn(&Request) -> bool,
    ) -> Result<bool, Error> {
        let mark = self.ids.load(Ordering::SeqCst);
        let deadline = std::time::Instant::now() + within;
        let out = |posted: &HashMap<u64, Posted>| -> Vec<Arc<Conn>> {
            posted
                .iter()
                .filter(|(&id, p)| id < mark && names(&p.req))
                .filter_map(|(_, p)| p.conn.upgrade().filter(|c| c.is_up()))
                .collect()
        };
        // Ones of this session whose connection is lost: they go out again on the next
        // connection made, and the caller's request would be sent beside them (on
        // another lane) and could overtake them (review 28b). Make that connection
        // now, so they are out on a live one and waited for below.
        let stranded = |posted: &HashMap<u64, Posted>| -> bool {
            let epoch = self.epoch();
            posted.iter().any(|(&id, p)| {
                id < mark
                    && p.epoch == epoch
                    && names(&p.req)
                    && p.conn.upgrade().filter(|c| c.is_up()).is_none()
            })
        };
        let mut posted = lock(&self.posted.map);
        loop {
            if stranded(&posted) {
                drop(posted);
                // The connections `pick` makes (every lane given up on, and the next
                // one) send them again. If none can be made, the caller's request
                // would meet the same (review 29: it dialled again, a second timeout).
                self.pick()?;
                posted = lock(&self.posted.map);
            }
            let conns = out(&posted);
            if conns.is_empty() {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            // No caller may be reading those connections: their replies would wait for
            // the background reader's next tick. Have it read them now.
            drop(posted);
            for c in &conns {
                c.wake_background();
            }
            posted = lock(&self.posted.map);
            if out(&posted).is_empty() {
                return Ok(true);
            }
            // A connection that breaks signals nothing here: look again each tick.
            posted = self
                .posted
                .gone
                .wait_timeout(posted, left.min(conn::BACKGROUND_TICK))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn submit_on(
        &self,
        conn: Arc<Conn>,
        id: u64,
        req: &Request,
        cred: Caller<'_>,
        data: Payload<'_, '_>,
        wait: bool,
    ) -> Result<Ticket, Error> {
        let (hdr, body) = req
            .encode_with_groups(id, cred.cred, cred.groups)
            .map_err(|e| Error::new(e.errno(), e.to_string()))?;
        conn.take_inflight_slot();
        let (tx, rx) = sync_channel(1);
        // A failed send broke the connection: the ticket then holds the ENOTCONN the
        // break delivered.
        self.send_on(
            &conn,
            id,
            req,
            &hdr,
            &body,
            data,
            wait.then_some(Slot::Waiter(tx)),
        );
        Ok(self.ticket(&conn, id, rx))
    }

    /// Register `slot` for request `id` (its in-flight slot taken) and send the
    /// request. False: the send failed and broke the connection (the slot has had
    /// ENOTCONN).
    #[allow(clippy::too_many_arguments)]
    fn send_on(
        &self,
        conn: &Arc<Conn>,
        id: u64,
        req: &Request,
        hdr: &[u8],
        body: &[u8],
        data: Payload<'_, '_>,
        slot: Option<Slot>,
    ) -> bool {
        lock(&conn.pending).insert(id, (req.op(), slot));
        let mut w = lock(&conn.writer);
        let r = match data {
            Payload::Mem(data) => send_message(&mut w, hdr, body, data),
            Payload::Piped(data) => send_piped_message(&mut w, hdr, body, data),
        };
        drop(w);
        self.sent_or_broke(conn, r, std::iter::once(req.op()))
    }

    /// `call` without waiting: `done` gets what `call` would have returned, on the
    /// thread that reads the reply (the connection's reader, or a caller reading its
    /// own), so it must not block. A FUSE read so frees its thread for the next request
    /// while the server works: no thread waits per request, and no hand-off wakes one
    /// (at queue depth 16 most of the mount's CPU was that switching).
    ///
    /// Sent as the process (`Caller::process`). Only for idempotent requests on TCP:
    /// with the layer-2 lane configured, or a request that must not run twice, it is
    /// `call` on this thread. A lost connection sends it again through `call` on a
    /// thread of its own (the reader must not wait for a reconnection).
    pub fn call_then(self: &Arc<Self>, req: Request, done: Completion) {
        if self.cfg.l2.is_some() || !req.op().idempotent() {
            return done(self.call(&req, Caller::process(), &[]));
        }
        let cred = Caller::process();
        if let Err(e) = cred.check() {
            return done(Err(e));
        }
        let conn = match self.pick() {
            Ok(c) => c,
            // No connection to be had: `call` would have failed the same way.
            Err(e) => return done(Err(e)),
        };
        let id = self.next_id();
        let (hdr, body) = match req.encode_with_groups(id, cred.cred, cred.groups) {
            Ok(e) => e,
            Err(e) => return done(Err(Error::new(e.errno(), e.to_string()))),
        };
        conn.take_inflight_slot();
        let then = conn::Then::new(&conn, Arc::downgrade(self), req.clone(), done);
        if self.send_on(
            &conn,
            id,
            &req,
            &hdr,
            &body,
            Payload::Mem(&[]),
            Some(Slot::Then(then)),
        ) {
            conn.arm_then(id);
            // No caller waits to read the reply: the reader thread does.
            conn.wake_background();
        }
    }

    fn attempt(
        &self,
        conn: Result<Arc<Conn>, Error>,
        id: u64,
        req: &Request,
        cred: Caller<'_>,
        data: &[&[u8]],
    ) -> Attempt {
        match conn {
            Ok(c) => {
                let epoch = c.epoch.load(Ordering::SeqCst);
                (
                    self.submit_on(c, id, req, cred, Payload::Mem(data), true)
                        .and_then(Ticket::wait),
                    Some(epoch),
                )
            }
            Err(e) => (Err(e), None),
        }
    }

    /// Send and wait. After a lost connection the request is sent once more, with the
    /// same id: any request into the same session (the server's reply cache answers
    /// one it already executed, so it is executed once), an idempotent one also into a
    /// new session (the old one is gone with what the first attempt did to it).
    pub fn call(&self, req: &Request, cred: Caller<'_>, data: &[&[u8]]) -> Result<Response, Error> {
        self.exchange(req, cred, data).0
    }

    /// `call`, also saying whether the request was sent again.
    pub fn exchange(
        &self,
        req: &Request,
        cred: Caller<'_>,
        data: &[&[u8]],
    ) -> (Result<Response, Error>, bool) {
        if let Err(e) = cred.check() {
            return (Err(e), false);
        }
        let id = self.next_id();
        let op = req.op();
        let conn = match self.try_l2(id, req, cred, data) {
            L2Try::Done(r) => return (r, false),
            L2Try::Tcp => self.pick(),
            // As a resend on TCP: a request that may have run in a session now gone
            // goes again only if it is idempotent (the new session has no reply cache
            // entry for it: a mkdir would run twice).
            L2Try::FellOff(epoch) => match self.pick() {
                Ok(c) if !op.idempotent() && c.epoch.load(Ordering::SeqCst) != epoch => {
                    return (
                        Err(Error::new(
                            libc::ETIMEDOUT,
                            format!(
                                "{} got no answer on the layer-2 lane and the server's session \
                                 is gone since: it may or may not have run",
                                op.name()
                            ),
                        )),
                        false,
                    )
                }
                c => c,
            },
        };
        let (r, sent_in) = self.attempt(conn, id, req, cred, data);
        let e = match r {
            // Sent and lost with its connection: once more, on a new one. A request
            // that never went out (no connection could be made) is not: a second dial
            // right after a failed one would only double the wait (two timeouts
            // against a stopped server).
            Err(e) if is_transport(&e) && sent_in.is_some() => e,
            r => return (r, false),
        };
        let conn = match self.pick() {
            Ok(c) => c,
            Err(e2) => return (Err(e2), false),
        };
        if !op.idempotent() && sent_in.is_some_and(|ep| ep != conn.epoch.load(Ordering::SeqCst)) {
            return (Err(e), false);
        }
        self.resent.fetch_add(1, Ordering::Relaxed);
        tracing::info!("sending {} again after: {}", op.name(), e.msg());
        (self.attempt(Ok(conn), id, req, cred, data).0, true)
    }

    /// Request `id` over the layer-2 lane when it is up and the request rides it (else
    /// it goes on TCP with the same id: the server's reply cache makes a request the
    /// lane delivered but did not answer count once in a session).
    fn try_l2(&self, id: u64, req: &Request, cred: Caller<'_>, data: &[&[u8]]) -> L2Try {
        let lane = match self.l2_lane() {
            LaneNow::Up(lane) => lane,
            LaneNow::Unfenced(lane) => return self.l2_unfenced(&lane, req, None),
            LaneNow::Tcp => return L2Try::Tcp,
        };
        let n: usize = data.iter().map(|d| d.len()).sum();
        let Ok((hdr, body)) = req.encode_with_groups(id, cred.cred, cred.groups) else {
            return L2Try::Tcp;
        };
        // A landing write's command carries no data: it must fit one command.
        let lands = lane.lands(req, n)
            && zcfs_protocol::l2::request_len(body.len(), 0) <= zcfs_l2::MAX_COMMAND;
        if !lands && !l2::rides_l2(req, body.len(), n, lane.read_max(), lane.write_max()) {
            return L2Try::Tcp;
        }
        let epoch = self.epoch();
        match lane.call(req, &hdr, &body, data, &self.l2_counters) {
            Ok(mut r) => {
                r.epoch = epoch;
                if r.hdr.status != 0 {
                    return L2Try::Done(Err(Error::errno(r.hdr.status)));
                }
                L2Try::Done(Ok(r))
            }
            Err(l2::Fallback) if lane.is_up() => L2Try::FellOff(epoch),
            Err(l2::Fallback) => self.l2_unfenced(&lane, req, Some(epoch)),
        }
    }

    /// A request meets a lane that went down with requests on it that the server may
    /// still run from its queue. Only requests without effects (reads, lookups, attribute
    /// reads, flush and fsync) go to TCP at once and just start the fence: one may run
    /// twice, harmlessly. Any other waits for the fence, and fails if it cannot be had:
    /// a write or lseek is in no reply cache, and a cached one (an unlink, say) would
    /// run again from its stale lane copy once its reply-cache entry is evicted (review
    /// rv9: files made since were removed).
    fn l2_unfenced(&self, lane: &Arc<l2::L2Lane>, req: &Request, sent_in: Option<u64>) -> L2Try {
        if l2::free_of_effects(req.op()) {
            self.l2_fence_start(lane, false);
        } else if let Err(e) = self.l2_fence(lane) {
            return L2Try::Done(Err(e));
        }
        match sent_in {
            Some(epoch) => L2Try::FellOff(epoch),
            None => L2Try::Tcp,
        }
    }

    /// The lane, if it is down and the server has not answered its fence yet (what
    /// `l2_lane` calls `Unfenced`, without setting a lane up).
    fn l2_down_unfenced(&self) -> Option<Arc<l2::L2Lane>> {
        match &*lock(&self.l2) {
            L2State::Up(l) if !l.is_up() && l.fenced_at().is_none() => Some(l.clone()),
            _ => None,
        }
    }

    /// Send the fence (`L2Release` on TCP) unless it is under way or done, or failed
    /// less than [`l2::FENCE_RETRY_AFTER`] ago (`now`: regardless); a thread waits for
    /// the answer. Returns without waiting for it.
    fn l2_fence_start(&self, lane: &Arc<l2::L2Lane>, now: bool) {
        {
            let mut f = lock(&lane.fence);
            match &*f {
                l2::Fence::Open => {}
                l2::Fence::Failed(at, _) if now || at.elapsed() >= l2::FENCE_RETRY_AFTER => {}
                _ => return,
            }
            // Claimed: no other caller sends it meanwhile (the lock is not held across
            // a dial).
            *f = l2::Fence::Sent;
        }
        let settle = |lane: &l2::L2Lane, to: l2::Fence| {
            *lock(&lane.fence) = to;
            lane.fence_changed.notify_all();
        };
        let failed = |e: Error| l2::Fence::Failed(std::time::Instant::now(), e);
        let ticket = self.pick().and_then(|conn| {
            let id = self.next_id();
            let req: Request = zcfs_protocol::L2ReleaseReq {}.into();
            self.submit_on(conn, id, &req, Caller::process(), Payload::Mem(&[]), true)
        });
        let ticket = match ticket {
            Ok(t) => t,
            Err(e) => return settle(lane, failed(e)),
        };
        let waiter = lane.clone();
        let spawned = std::thread::Builder::new()
            .name("zcfs-l2-fence".into())
            .spawn(move || {
                let to = match ticket.wait() {
                    Ok(_) => {
                        tracing::info!(
                            "layer-2 lane fenced at the server; set up again in {:?}",
                            l2::L2_RETRY_AFTER
                        );
                        l2::Fence::Done(std::time::Instant::now())
                    }
                    Err(e) => {
                        tracing::warn!("layer-2 lane's fence failed: {}", e.msg());
                        l2::Fence::Failed(std::time::Instant::now(), e)
                    }
                };
                settle(&waiter, to);
            });
        if let Err(e) = spawned {
            settle(
                lane,
                failed(Error::new(
                    libc::EAGAIN,
                    format!("no thread for the layer-2 lane's fence: {e}"),
                )),
            );
        }
    }

    /// Wait until the lane is fenced at the server: the fence under way, else sent now,
    /// and sent once more if that attempt fails (as `call` resends after a lost
    /// connection). Bounded: each attempt by the request timeout.
    fn l2_fence(&self, lane: &Arc<l2::L2Lane>) -> Result<(), Error> {
        let mut sent = 0;
        loop {
            {
                let deadline = std::time::Instant::now() + self.cfg.timeout * 2;
                let mut f = lock(&lane.fence);
                while matches!(&*f, l2::Fence::Sent) {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(Error::new(
                            libc::ETIMEDOUT,
                            "the layer-2 lane's fence got no answer",
                        ));
                    }
                    f = lane
                        .fence_changed
                        .wait_timeout(f, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                match &*f {
                    l2::Fence::Done(_) => return Ok(()),
                    l2::Fence::Failed(_, e) if sent == 2 => return Err(e.clone()),
                    _ => {}
                }
            }
            self.l2_fence_start(lane, true);
            sent += 1;
        }
    }

    /// Send on the given connection and wait (the restart hook re-opening files before
    /// the connection is handed out).
    pub(crate) fn call_on(
        &self,
        conn: &ConnRef,
        req: &Request,
        cred: Caller<'_>,
    ) -> Result<Response, Error> {
        self.call_on_id(conn, self.next_id(), req, cred)
    }

    /// `call_on` with request id `id`: sent again with the id of an attempt whose
    /// reply was lost, the server's reply cache answers it if it ran (once).
    pub(crate) fn call_on_id(
        &self,
        conn: &ConnRef,
        id: u64,
        req: &Request,
        cred: Caller<'_>,
    ) -> Result<Response, Error> {
        self.submit_on(conn.0.clone(), id, req, cred, Payload::Mem(&[]), true)
            .and_then(Ticket::wait)
    }

    /// A new request id.
    pub(crate) fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }
}

/// A bind mode as the stats name it.
pub fn bind_mode_name(m: zcfs_xsk::BindMode) -> &'static str {
    match m {
        zcfs_xsk::BindMode::Copy => "copy",
        zcfs_xsk::BindMode::ZeroCopy => "zero-copy",
    }
}

/// A poll mode as the stats (and `--l2-poll`) name it.
pub fn poll_name(p: l2::L2Poll) -> &'static str {
    match p {
        l2::L2Poll::Busy => "busy",
        l2::L2Poll::Wait => "wait",
    }
}

/// Errors of the link rather than of the file system.
pub(crate) fn is_transport(e: &Error) -> bool {
    matches!(
        e.errno,
        libc::ENOTCONN | libc::ECONNRESET | libc::EPIPE | libc::ETIMEDOUT | libc::ECONNREFUSED
    )
}

#[cfg(test)]
mod tests;

/// A request's data as its sender has it.
pub(crate) enum Payload<'a, 'b> {
    /// In memory: sent with the header in one writev.
    Mem(&'a [&'b [u8]]),
    /// In a pipe: spliced into the socket behind the header.
    Piped(&'a mut dyn PipedData),
}

/// Send one message whose data is in memory: header, body, tag (with a secret), data,
/// and in full integrity mode the data tag (hashed where the caller has the bytes).
/// The bytes sent.
fn send_message(
    w: &mut conn::Writer,
    hdr: &[u8],
    body: &[u8],
    data: &[&[u8]],
) -> std::io::Result<usize> {
    send_messages(w, &[(hdr, body, data)])
}

/// The most requests [`Client::submit_batch`] sends at once: each is at most five
/// iovecs (header, body, tag, data, data tag), well under IOV_MAX (1,024).
pub const SUBMIT_BATCH_MAX: usize = 64;

/// A message to send: its header, body and data slices.
type OutMessage<'a> = (&'a [u8], &'a [u8], &'a [&'a [u8]]);

/// Messages whose data is in memory in one vectored write, each as header, body, tag
/// (with a secret), data, and in full integrity mode the data tag (hashed where the
/// caller has the bytes); tags computed in the order the messages go out. The bytes
/// sent.
fn send_messages(w: &mut conn::Writer, msgs: &[OutMessage<'_>]) -> std::io::Result<usize> {
    let mut tags = Vec::with_capacity(msgs.len());
    for (hdr, body, data) in msgs {
        let (mut tag, mut data_tag) = ([0u8; TAG_LEN], None);
        if let Some(mac) = w.mac.as_mut() {
            let mut m = mac.begin(hdr, body);
            tag = m.tag();
            let n: usize = data.iter().map(|d| d.len()).sum();
            if mac.data_tagged(n) {
                data.iter().for_each(|d| m.data(d));
                data_tag = Some(m.data_tag());
            }
        }
        tags.push((tag, data_tag));
    }
    let slices: usize = msgs.iter().map(|(_, _, d)| d.len()).sum();
    let mut iov = Vec::with_capacity(4 * msgs.len() + slices);
    for ((hdr, body, data), (tag, data_tag)) in msgs.iter().zip(&tags) {
        iov.push(IoSlice::new(hdr));
        iov.push(IoSlice::new(body));
        if w.mac.is_some() {
            iov.push(IoSlice::new(tag));
        }
        iov.extend(data.iter().map(|d| IoSlice::new(d)));
        if let Some(t) = data_tag {
            iov.push(IoSlice::new(t));
        }
    }
    let n: usize = iov.iter().map(|s| s.len()).sum();
    write_all_vectored(&mut w.s, &mut iov)?;
    Ok(n)
}

/// Send one message whose data is in a pipe: header, body and tag with MSG_MORE (so
/// TCP puts them in the data's first segment), then the data spliced from the pipe.
/// Data that must be tagged (full integrity) is read into memory and sent as
/// `send_message` sends it. The bytes sent.
fn send_piped_message(
    w: &mut conn::Writer,
    hdr: &[u8],
    body: &[u8],
    data: &mut dyn PipedData,
) -> std::io::Result<usize> {
    let n = data.remaining();
    if w.mac.as_ref().is_some_and(|m| m.data_tagged(n)) {
        let mut buf = vec![0u8; n];
        data.read_into(&mut buf)?;
        return send_message(w, hdr, body, &[&buf]);
    }
    let mut tag = [0u8; TAG_LEN];
    if let Some(mac) = w.mac.as_mut() {
        tag = mac.begin(hdr, body).tag();
    }
    let tag_len = if w.mac.is_some() { TAG_LEN } else { 0 };
    let mut iov = [
        IoSlice::new(hdr),
        IoSlice::new(body),
        IoSlice::new(&tag[..tag_len]),
    ];
    zcfs_transport::send_all_more(&w.s, &mut iov)?;
    data.splice_into(std::os::fd::AsFd::as_fd(&w.s))?;
    Ok(hdr.len() + body.len() + tag_len + n)
}
