//! The zcfs network server: exports any Backend over TCP or a Unix domain socket
//! (docs/protocol.md).
//!
//! Each connection is served by one thread, in order, so many requests may be in flight
//! on it (the client pipelines; TCP carries the queue). A reply that waits for another
//! attempt (the layer-2 fence, a resend whose first attempt still runs) waits on a
//! thread of its own, so the requests after it are not held (`conn.rs`). Data paths:
//! - read: the backend hands out borrowed slices (PM blocks for a local volume) and the
//!   reply is one writev of header and slices: no user-space copy;
//! - write: the header and body name target and size, the backend reserves the
//!   destination blocks, the payload is received with readv straight into them, then
//!   committed through the operation log: no intermediate buffer. `one_copy` receives
//!   into a buffer and copies instead (the RZCFS ablation).
//!
//! A reply is sent after the operation is committed to the log; fsync replies after the
//! data is durable. A header that breaks framing drops the connection with a logged
//! reason and is counted; a well-framed request with an invalid body is answered with
//! an errno (and counted), and never reaches the backend.
//!
//! Connections belong to sessions (`session.rs`): a client's handles and the inode
//! references taken for it live in its session, outlive a lost connection by
//! `ServerConfig::grace`, and are given back to the backend after that. A peer that
//! stalls (stops reading replies, or stops sending in the middle of a message) for
//! `ServerConfig::peer_timeout` is dropped; no lock of the server is held across
//! socket I/O, so it delays no one else.
//!
//! Before authentication a peer is given little: the whole handshake must be done
//! within `ServerConfig::handshake_timeout`, at most `max_handshakes` connections (and
//! `max_handshakes_per_addr` from one address) may be in it at once, fewer than
//! `max_connections`, and it touches no session until its proof checked out.
//!
//! A request that panics (a bug) is answered with EIO and ends its connection only: a
//! guard gives back the connection's slot, socket and session however its thread
//! ends, and the shared tables' locks are not poisoned by it.

mod conn;
mod dispatch;
mod identity;
pub mod l2;
mod session;
mod stats;

pub use conn::MAX_WAITING_REPLIES;
pub use identity::{IdentityMap, PeerRule, Squash, DEFAULT_ANON_ID};
pub use session::{REPLY_CACHE_BYTES, REPLY_CACHE_ENTRIES};
pub use stats::{BucketCount, OpReport, ServerStats, StatsReport};
pub use zcfs_transport::{Address, HANDSHAKE_TIMEOUT};

use conn::{Conn, ConnEnd};
use session::{lock, Attachment, Sessions};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zcfs_backend::Backend;
use zcfs_protocol::channel::Integrity;
use zcfs_transport::{
    server_handshake, set_peer_timeout, tune, Listener, Peer, Stream, TransportError,
};

/// How long a session outlives its last connection by default.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);
/// How long a peer may stall a message or a reply by default.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may stay idle (no request begun) by default before the server
/// closes it (the client reconnects on its next call; the session survives its grace).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Most open handles one session may hold by default.
pub const DEFAULT_MAX_SESSION_HANDLES: usize = 1 << 20;
/// Most connections in the handshake at once by default (a quarter of the default
/// `max_connections`: peers that have not authenticated never hold the rest).
pub const DEFAULT_MAX_HANDSHAKES: usize = 16;
/// Most connections in the handshake at once from one address by default (a client
/// dials its connections one after the other; a host starting several clients at once
/// dials several).
pub const DEFAULT_MAX_HANDSHAKES_PER_ADDR: usize = 8;
/// Most connections open at once from one source (IP address; uid on a Unix socket) by
/// default: a client uses a few, and no one source may hold every slot.
pub const DEFAULT_MAX_CONNECTIONS_PER_SOURCE: usize = 16;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen: a TCP address or a Unix socket.
    pub listen: Address,
    pub secret: Option<Vec<u8>>,
    pub read_only: bool,
    pub max_connections: usize,
    /// Advertised to clients: how many requests each may pipeline.
    pub max_inflight: u32,
    /// Receive write payloads into a buffer and copy them (measurement only).
    pub one_copy: bool,
    /// How long a session's handles and references outlive its last connection.
    pub grace: Duration,
    /// How long a peer may stall in the middle of a message or leave a reply unread
    /// before it is dropped.
    pub peer_timeout: Duration,
    /// Most open handles per session (EMFILE beyond).
    pub max_session_handles: usize,
    /// How long a peer has for the whole handshake.
    pub handshake_timeout: Duration,
    /// Most connections in the handshake at once; always kept below `max_connections`
    /// (see `handshake_limits`).
    pub max_handshakes: usize,
    /// Most connections in the handshake at once from one IP address (one uid, on a
    /// Unix socket).
    pub max_handshakes_per_addr: usize,
    /// Most connections open at once from one IP address (one uid, on a Unix socket);
    /// always kept below `max_connections` (see `connection_limit_per_source`).
    pub max_connections_per_source: usize,
    /// How long a connection may stay idle between messages.
    pub idle_timeout: Duration,
    /// What the message MACs cover (with a secret; `Full` needs one).
    pub integrity: Integrity,
    /// Whose identity is replaced by the anonymous one (root squash by default).
    pub identity: IdentityMap,
}

impl ServerConfig {
    /// The bounds on connections in the handshake as applied: (total, per address).
    /// The total stays below `max_connections` (when it is above 1), so peers that
    /// have not authenticated cannot hold every connection slot, and the per-address
    /// bound within the total.
    pub fn handshake_limits(&self) -> (usize, usize) {
        let total = self
            .max_handshakes
            .min(self.max_connections.saturating_sub(1))
            .max(1);
        (total, self.max_handshakes_per_addr.clamp(1, total))
    }

    /// The bound on open connections per source as applied: below `max_connections`
    /// (when it is above 1), so one source (one local user, one host) can never take
    /// every slot from the others.
    pub fn connection_limit_per_source(&self) -> usize {
        self.max_connections_per_source
            .min(self.max_connections.saturating_sub(1))
            .max(1)
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: Address::Tcp("127.0.0.1:7070".into()),
            secret: None,
            read_only: false,
            max_connections: 64,
            max_inflight: 64,
            one_copy: false,
            grace: DEFAULT_GRACE,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            max_session_handles: DEFAULT_MAX_SESSION_HANDLES,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
            max_handshakes_per_addr: DEFAULT_MAX_HANDSHAKES_PER_ADDR,
            max_connections_per_source: DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            integrity: Integrity::Headers,
            identity: IdentityMap::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("--integrity full needs a secret (--secret-file): without one there are no MACs")]
    IntegrityWithoutSecret,
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: Address,
        #[source]
        source: std::io::Error,
    },
}

/// What every connection thread shares.
pub(crate) struct Shared {
    backend: Arc<dyn Backend>,
    cfg: ServerConfig,
    stats: Arc<ServerStats>,
    sessions: Sessions,
    instance: u64,
    /// The layer-2 lane, when the server has an interface for it (`Server::start_l2`).
    l2: std::sync::OnceLock<Arc<l2::L2Service>>,
    /// Bumped whenever a removed name leaves an inode with no link, before the sessions
    /// holding it are asked (`Lane::orphaned`): a request that took a reference or ran
    /// an open meanwhile asks again for itself (`Lane::dispatch`).
    names_removed: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn report(&self) -> StatsReport {
        let mut r = self.stats.report(&*self.backend, &self.sessions);
        r.l2 = self.l2.get().map(|l| l.report(&self.stats));
        r
    }

    /// The server's families, then the lane's (`zcfs_server_l2_*`,
    /// `zcfs_server_path_requests_total`) when it has one.
    fn prometheus(&self) -> String {
        let mut text = self.stats.prometheus(&*self.backend, &self.sessions);
        if let Some(l) = self.l2.get() {
            let mut e = zcfs_metrics::Exposition::new();
            l.report(&self.stats).prometheus(&mut e, "zcfs_server");
            text += &e.finish();
        }
        text
    }
}

/// What the per-source handshake bound counts by: the IP address of a TCP peer, the
/// uid of a Unix socket peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Ip(IpAddr),
    Uid(u32),
}

impl From<&Peer> for Source {
    fn from(p: &Peer) -> Source {
        match p {
            Peer::Tcp(a) => Source::Ip(a.ip()),
            Peer::Unix(c) => Source::Uid(c.uid),
        }
    }
}

/// Connections in the handshake: in all, and by peer address; and the connections
/// open (in the handshake or past it) by source.
#[derive(Default)]
struct Handshakes {
    total: usize,
    by_addr: HashMap<Source, usize>,
    open_by_source: HashMap<Source, usize>,
}

/// A running server: accepts until `shutdown`.
pub struct Server {
    shared: Arc<Shared>,
    pub stats: Arc<ServerStats>,
    listener: Listener,
    stopping: AtomicBool,
    /// Open connections (a clone of each socket), to close them at shutdown.
    conns: Arc<Mutex<Vec<(u64, Stream)>>>,
    handshakes: Arc<Mutex<Handshakes>>,
}

/// A connection's hold on the server's resources: its slot (`active`), its place in the
/// handshake bounds while it is in the handshake, and the clone of its socket. Given
/// back on drop, however the connection's thread ends (a panic included).
struct Slot {
    id: u64,
    ip: Source,
    stats: Arc<ServerStats>,
    conns: Arc<Mutex<Vec<(u64, Stream)>>>,
    handshakes: Arc<Mutex<Handshakes>>,
    handshaking: bool,
}

impl Slot {
    /// The handshake ended (either way): its place in the handshake bounds is free.
    fn handshake_done(&mut self) {
        if !std::mem::take(&mut self.handshaking) {
            return;
        }
        let mut h = lock(&self.handshakes);
        h.total -= 1;
        if let Some(n) = h.by_addr.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                h.by_addr.remove(&self.ip);
            }
        }
        self.stats.handshaking.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.handshake_done();
        {
            let mut h = lock(&self.handshakes);
            if let Some(n) = h.open_by_source.get_mut(&self.ip) {
                *n -= 1;
                if *n == 0 {
                    h.open_by_source.remove(&self.ip);
                }
            }
        }
        let mut conns = lock(&self.conns);
        if let Some(i) = conns.iter().position(|(i, _)| *i == self.id) {
            let (_, s) = conns.swap_remove(i);
            // The peer sees the end now, not when the last clone goes.
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        drop(conns);
        self.stats.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Server {
    pub fn bind(backend: Arc<dyn Backend>, cfg: ServerConfig) -> Result<Server, ServerError> {
        if cfg.integrity == Integrity::Full && cfg.secret.is_none() {
            return Err(ServerError::IntegrityWithoutSecret);
        }
        let listener = Listener::bind(&cfg.listen).map_err(|source| ServerError::Bind {
            addr: cfg.listen.clone(),
            source,
        })?;
        let stats = Arc::new(ServerStats::default());
        let shared = Arc::new(Shared {
            backend,
            // As many sessions may wait out their grace as there may be connections.
            sessions: Sessions::new(cfg.grace, cfg.max_session_handles)
                .with_max_in_grace(cfg.max_connections),
            cfg,
            stats: stats.clone(),
            instance: rand::random(),
            l2: std::sync::OnceLock::new(),
            names_removed: std::sync::atomic::AtomicU64::new(0),
        });
        Ok(Server {
            shared,
            stats,
            listener,
            stopping: AtomicBool::new(false),
            conns: Arc::new(Mutex::new(Vec::new())),
            handshakes: Arc::new(Mutex::new(Handshakes::default())),
        })
    }

    /// The address the server listens on (with the port chosen, for a TCP port 0).
    pub fn local_addr(&self) -> Address {
        self.listener
            .local_addr()
            .expect("bound listener has an address")
    }

    /// The TCP address the server listens on (None on a Unix socket).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        match &self.listener {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix(..) => None,
        }
    }

    /// Serve the layer-2 lane on `port` (see `l2`): sessions that offer it (`L2Setup`)
    /// move small requests and reads there, one session at a time.
    pub fn start_l2(&self, port: l2::L2Port, poll: l2::L2Poll) -> std::io::Result<()> {
        let svc = l2::start(port, self.shared.clone(), poll)?;
        if self.shared.l2.set(svc).is_err() {
            return Err(std::io::Error::other("the layer-2 lane is started already"));
        }
        Ok(())
    }

    /// Requests executed from layer-2 commands, per operation code (zeros without a
    /// lane).
    pub fn l2_requests(&self) -> Vec<u64> {
        match self.shared.l2.get() {
            Some(l) => l
                .counters
                .requests
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            None => vec![0; zcfs_protocol::OP_SLOTS],
        }
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.shared.backend
    }

    /// Accept connections until `shutdown`, each served on its own thread; then wait
    /// for every connection to end and give every session's handles and references
    /// back to the backend.
    pub fn run(&self) {
        let reaper = {
            let shared = self.shared.clone();
            std::thread::Builder::new()
                .name("zcfs-reaper".into())
                .spawn(move || shared.sessions.reap(&*shared.backend, &shared.stats))
                .expect("spawn the session reaper")
        };
        let mut threads: Vec<std::thread::JoinHandle<()>> = Vec::new();
        let mut next_id = 0u64;
        loop {
            let accepted = self.listener.accept();
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            let (s, who) = match accepted {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    continue;
                }
            };
            let source = Source::from(&who);
            let peer = who.to_string();
            let stats = &self.shared.stats;
            let cfg = &self.shared.cfg;
            if stats.active.load(Ordering::SeqCst) >= cfg.max_connections {
                stats.rejected_limit.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, limit = cfg.max_connections, "connection refused: connection limit reached");
                continue;
            }
            {
                let (total, per_addr) = cfg.handshake_limits();
                let per_source = cfg.connection_limit_per_source();
                let mut h = lock(&self.handshakes);
                if h.open_by_source.get(&source).copied().unwrap_or(0) >= per_source {
                    drop(h);
                    stats.rejected_limit.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, per_source, "connection refused: too many connections from this source");
                    continue;
                }
                let from_addr = h.by_addr.get(&source).copied().unwrap_or(0);
                if h.total >= total || from_addr >= per_addr {
                    drop(h);
                    stats
                        .rejected_handshake_limit
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, total, per_addr, "connection refused: too many connections in the handshake");
                    continue;
                }
                h.total += 1;
                *h.by_addr.entry(source).or_default() += 1;
                *h.open_by_source.entry(source).or_default() += 1;
                stats.handshaking.fetch_add(1, Ordering::SeqCst);
            }
            next_id += 1;
            let id = next_id;
            stats.active.fetch_add(1, Ordering::SeqCst);
            // From here on the slot gives everything back when dropped.
            let mut slot = Slot {
                id,
                ip: source,
                stats: stats.clone(),
                conns: self.conns.clone(),
                handshakes: self.handshakes.clone(),
                handshaking: true,
            };
            let _ = tune(&s);
            match s.try_clone() {
                Ok(c) => lock(&self.conns).push((id, c)),
                Err(e) => {
                    tracing::warn!(%peer, "connection refused: {e}");
                    continue;
                }
            }
            // A shutdown that began meanwhile may have missed this connection.
            if self.stopping.load(Ordering::SeqCst) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            stats.connections.fetch_add(1, Ordering::Relaxed);
            let shared = self.shared.clone();
            threads.retain(|t| !t.is_finished());
            let spawned = std::thread::Builder::new()
                .name(format!("zcfs-conn-{id}"))
                .spawn(move || connection(s, who, &peer, &shared, &mut slot));
            match spawned {
                Ok(t) => threads.push(t),
                // The closure (and the slot in it) is dropped: everything given back.
                Err(e) => tracing::warn!("connection refused: spawning its thread: {e}"),
            }
        }
        for t in threads {
            let _ = t.join();
        }
        self.shared
            .sessions
            .stop(&*self.shared.backend, &self.shared.stats);
        let _ = reaper.join();
    }

    /// Stop accepting and close every connection (their threads then end, and `run`
    /// releases what the sessions held).
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(l2) = self.shared.l2.get() {
            l2.stop();
        }
        for (_, c) in lock(&self.conns).iter() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        // Wake the accept loop.
        let _ = Stream::connect(&self.local_addr(), Duration::from_secs(1));
    }

    pub fn report(&self) -> StatsReport {
        self.shared.report()
    }

    /// The counters and per-operation latency histograms in the Prometheus text
    /// format (`zcfs serve --metrics`).
    pub fn prometheus(&self) -> String {
        self.shared.prometheus()
    }
}

/// A connection's place in its session, given back when dropped (however the
/// connection's thread ends): the last connection of a session starts its grace period.
struct Attached<'a> {
    sessions: &'a Sessions,
    attachment: Option<Attachment>,
}

impl Drop for Attached<'_> {
    fn drop(&mut self) {
        if let Some(a) = self.attachment.take() {
            self.sessions.detach(a);
        }
    }
}

/// Serve one connection: handshake (joining its session once authenticated), requests,
/// and the end.
fn connection(mut s: Stream, who: Peer, peer: &str, shared: &Shared, slot: &mut Slot) {
    let stats = &shared.stats;
    let rule = match peer_rule(&s, &who) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(%peer, "dropping client: its groups: {e}");
            return;
        }
    };
    if let Err(e) = set_peer_timeout(&s, shared.cfg.peer_timeout) {
        tracing::warn!(%peer, "dropping client: socket options: {e}");
        return;
    }
    let mut attachment = None;
    let mut lane_hold = None;
    let control = match s.try_clone() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(%peer, "dropping client: {e}");
            return;
        }
    };
    let fence: session::Fence = Arc::new(move || {
        let _ = control.shutdown(std::net::Shutdown::Both);
    });
    let hs = server_handshake(
        &mut s,
        shared.cfg.secret.as_deref(),
        shared.cfg.integrity,
        shared.cfg.max_inflight,
        shared.instance,
        shared.cfg.handshake_timeout,
        &mut |hello| {
            let a = shared.sessions.attach(hello.session);
            let joined = zcfs_transport::Joined {
                resumed: a.resumed,
                serial: a.session.serial,
            };
            // Before the client hears it may send: its older connection on this lane
            // is closed and done (see `session::Lanes`).
            // Waited for no longer than the handshake may take: a refusal (Busy) then
            // reaches the client within its timeout as a connection closed before its
            // Welcome, which it dials again after, and the handshake place is free.
            let wait = shared.cfg.handshake_timeout.min(shared.cfg.peer_timeout);
            let held = a.session.lanes.take_over(hello.lane, fence.clone(), wait);
            attachment = Some(a);
            match held {
                Ok(h) => lane_hold = h,
                Err(e) => return Err(TransportError::Refused(e.to_string())),
            }
            Ok(joined)
        },
    );
    slot.handshake_done();
    let hs = hs.and_then(|h| {
        // Back from the handshake's deadline to the peer timeout.
        set_peer_timeout(&s, shared.cfg.peer_timeout)?;
        Ok(h)
    });
    match hs {
        Ok(accepted) => {
            let (tx, rx) = match accepted.channel {
                Some((tx, rx)) => (Some(tx), Some(rx)),
                None => (None, None),
            };
            let attached = Attached {
                sessions: &shared.sessions,
                attachment,
            };
            // Given up when this thread is done with requests (before `attached`).
            let _lane = lane_hold;
            let a = attached
                .attachment
                .as_ref()
                .expect("attached during the handshake");
            let (session, resumed) = (&*a.session, a.resumed);
            if resumed {
                stats.sessions_resumed.fetch_add(1, Ordering::Relaxed);
            }
            tracing::info!(%peer, session = format!("{:016x}", session.id), resumed, "client connected");
            let out = match conn::Out::new(&s, tx, shared.stats.clone()) {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!(%peer, "dropping client: {e}");
                    return;
                }
            };
            // Replies that wait off this thread (`conn::Awaited`) run in this scope: the
            // connection gives its lane and session back only after they ended.
            let end = std::thread::scope(|scope| {
                let mut conn = Conn {
                    s,
                    lane: conn::Lane {
                        rule,
                        shared,
                        session,
                    },
                    attached: a.session.clone(),
                    l2_hold: None,
                    replying: false,
                    hold_reply: false,
                    rx,
                    inbound: conn::Inbound::new(),
                    rb: zcfs_transport::RecvBuf::default(),
                    out: &out,
                    spawn: conn::spawner(scope),
                };
                let end = conn.serve();
                // No one is left to answer: waiting replies stop now.
                out.close();
                end
            });
            match end {
                Ok(()) | Err(ConnEnd::Closed) => tracing::info!(%peer, "client disconnected"),
                Err(ConnEnd::Malformed(e)) => {
                    stats.rejected_malformed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, "dropping client: malformed message: {e}");
                }
                Err(e @ ConnEnd::Forged(_)) => {
                    stats.rejected_forged.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, "dropping client: {e}");
                }
                Err(ConnEnd::Idle) => {
                    stats.dropped_idle.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(%peer, idle = ?shared.cfg.idle_timeout, "closing an idle connection");
                }
                Err(e @ ConnEnd::Stalled(_)) => {
                    stats.dropped_stalled.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, "dropping client: {e}");
                }
                Err(e @ ConnEnd::Panicked { .. }) => {
                    tracing::error!(%peer, "dropping client: {e}");
                }
                Err(e) => tracing::info!(%peer, "client dropped: {e}"),
            }
            // `attached` detaches here, then the slot is given back by the caller.
        }
        Err(e) => {
            // Attached only if the peer authenticated and then went away before the
            // last message reached it: as if it had never come.
            if let Some(a) = attachment {
                shared.sessions.abandon(a);
            }
            match e {
                TransportError::AuthFailed => {
                    stats.rejected_auth.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, "dropping client: authentication failed");
                }
                TransportError::Closed => {
                    tracing::info!(%peer, "client hung up during the handshake");
                }
                TransportError::Refused(why) => {
                    tracing::info!(%peer, "connection refused: {why}");
                }
                TransportError::Io(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                    ) =>
                {
                    stats.dropped_stalled.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, "dropping client: handshake not done within {:?}", shared.cfg.handshake_timeout);
                }
                e => {
                    stats.rejected_malformed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, "dropping client: handshake failed: {e}");
                }
            }
        }
    }
}

/// What the peer may name as its identity: a process that is not root on the Unix
/// socket only itself (its uid, gid and groups as the kernel knows them); anyone else
/// any identity.
fn peer_rule(s: &Stream, who: &Peer) -> std::io::Result<PeerRule> {
    match who {
        Peer::Unix(c) if c.uid != 0 => Ok(PeerRule::Only {
            uid: c.uid,
            gid: c.gid,
            groups: zcfs_transport::peer_groups(s, c.pid)?,
        }),
        _ => Ok(PeerRule::Any),
    }
}
