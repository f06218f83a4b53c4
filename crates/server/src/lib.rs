//! The zcfs network server: exports any Backend over TCP (protocol version 2,
//! docs/protocol.md).
//!
//! Each connection is served by one thread, in order, so many requests may be in flight
//! on it (the client pipelines; TCP carries the queue). Data paths:
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

mod conn;
mod dispatch;
mod session;
mod stats;

pub use stats::{OpReport, ServerStats, StatsReport};

use conn::{Conn, ConnEnd};
use session::Sessions;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zcfs_backend::Backend;
use zcfs_transport::{server_handshake, set_peer_timeout, tune, TransportError};

/// How long a session outlives its last connection by default.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);
/// How long a peer may stall a message or a reply by default.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// Most open handles one session may hold by default.
pub const DEFAULT_MAX_SESSION_HANDLES: usize = 1 << 20;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
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
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:7070".parse().unwrap(),
            secret: None,
            read_only: false,
            max_connections: 64,
            max_inflight: 64,
            one_copy: false,
            grace: DEFAULT_GRACE,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            max_session_handles: DEFAULT_MAX_SESSION_HANDLES,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
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
}

impl Shared {
    fn report(&self) -> StatsReport {
        self.stats.report(&*self.backend, &self.sessions)
    }
}

/// A running server: accepts until `shutdown`.
pub struct Server {
    shared: Arc<Shared>,
    pub stats: Arc<ServerStats>,
    listener: TcpListener,
    stopping: AtomicBool,
    /// Open connections (a clone of each socket), to close them at shutdown.
    conns: Arc<Mutex<Vec<(u64, TcpStream)>>>,
}

impl Server {
    pub fn bind(backend: Arc<dyn Backend>, cfg: ServerConfig) -> Result<Server, ServerError> {
        let listener = TcpListener::bind(cfg.listen).map_err(|source| ServerError::Bind {
            addr: cfg.listen,
            source,
        })?;
        let stats = Arc::new(ServerStats::default());
        let shared = Arc::new(Shared {
            backend,
            sessions: Sessions::new(cfg.grace, cfg.max_session_handles),
            cfg,
            stats: stats.clone(),
            instance: rand::random(),
        });
        Ok(Server {
            shared,
            stats,
            listener,
            stopping: AtomicBool::new(false),
            conns: Arc::new(Mutex::new(Vec::new())),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("bound listener has an address")
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
        for s in self.listener.incoming() {
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            let s = match s {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    continue;
                }
            };
            let peer = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
            let stats = &self.shared.stats;
            if stats.active.load(Ordering::SeqCst) >= self.shared.cfg.max_connections {
                stats.rejected_limit.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, limit = self.shared.cfg.max_connections, "connection refused: connection limit reached");
                continue;
            }
            let _ = tune(&s);
            next_id += 1;
            let id = next_id;
            match s.try_clone() {
                Ok(c) => self.conns.lock().unwrap().push((id, c)),
                Err(e) => {
                    tracing::warn!(%peer, "connection refused: {e}");
                    continue;
                }
            }
            // A shutdown that began meanwhile may have missed this connection.
            if self.stopping.load(Ordering::SeqCst) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            stats.active.fetch_add(1, Ordering::SeqCst);
            stats.connections.fetch_add(1, Ordering::Relaxed);
            let (shared, conns) = (self.shared.clone(), self.conns.clone());
            threads.retain(|t| !t.is_finished());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("zcfs-conn-{id}"))
                    .spawn(move || {
                        connection(s, &peer, &shared);
                        conns.lock().unwrap().retain(|(i, _)| *i != id);
                        shared.stats.active.fetch_sub(1, Ordering::SeqCst);
                    })
                    .expect("spawn connection thread"),
            );
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
        for (_, c) in self.conns.lock().unwrap().iter() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        // Wake the accept loop.
        let _ = TcpStream::connect(self.local_addr());
    }

    pub fn report(&self) -> StatsReport {
        self.shared.report()
    }
}

/// Serve one connection: handshake (joining its session), requests, and the end.
fn connection(mut s: TcpStream, peer: &str, shared: &Shared) {
    let stats = &shared.stats;
    if let Err(e) = set_peer_timeout(&s, shared.cfg.peer_timeout) {
        tracing::warn!(%peer, "dropping client: socket options: {e}");
        return;
    }
    let mut session = None;
    let hs = server_handshake(
        &mut s,
        shared.cfg.secret.as_deref(),
        shared.cfg.max_inflight,
        shared.instance,
        &mut |hello| {
            let (sess, resumed) = shared.sessions.attach(hello.session);
            session = Some((sess, resumed));
            resumed
        },
    );
    let handshake_ok = hs.is_ok();
    match hs {
        Ok(_) => {
            let (session, resumed) = session.as_ref().expect("attached during the handshake");
            let (session, resumed) = (&**session, *resumed);
            if resumed {
                stats.sessions_resumed.fetch_add(1, Ordering::Relaxed);
            }
            tracing::info!(%peer, session = format!("{:016x}", session.id), resumed, "client connected");
            // Back from the handshake's deadline to the peer timeout.
            if let Err(e) = s.set_read_timeout(Some(shared.cfg.peer_timeout)) {
                tracing::warn!(%peer, "dropping client: socket options: {e}");
            } else {
                let mut conn = Conn { s, shared, session };
                match conn.serve() {
                    Ok(()) | Err(ConnEnd::Closed) => tracing::info!(%peer, "client disconnected"),
                    Err(ConnEnd::Malformed(e)) => {
                        stats.rejected_malformed.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%peer, "dropping client: malformed message: {e}");
                    }
                    Err(e @ ConnEnd::Stalled(_)) => {
                        stats.dropped_stalled.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%peer, "dropping client: {e}");
                    }
                    Err(e) => tracing::info!(%peer, "client dropped: {e}"),
                }
            }
        }
        Err(TransportError::AuthFailed) => {
            stats.rejected_auth.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, "dropping client: authentication failed");
        }
        Err(TransportError::Closed) => {
            tracing::info!(%peer, "client hung up during the handshake");
        }
        Err(e) => {
            stats.rejected_malformed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, "dropping client: handshake failed: {e}");
        }
    }
    if let Some((sess, _)) = session {
        if handshake_ok {
            shared.sessions.detach(&sess);
        } else {
            shared.sessions.abandon(&sess);
        }
    }
}
