//! The zcfs client: `Client` moves requests over a few pipelined TCP connections;
//! `RemoteFs` is the Backend on top of it.
//!
//! - Each connection has one reader thread that matches replies to requests by id, so
//!   any number of callers (and `submit` without waiting) keep many requests in flight.
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

mod remote;

pub use remote::RemoteFs;

use std::collections::HashMap;
use std::io::{IoSlice, Read};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use zcfs_backend::Error;
use zcfs_protocol::handshake::Welcome;
use zcfs_protocol::{Cred, Op, Request, RespHeader, RESP_HDR};
use zcfs_transport::{client_handshake, tune, write_all_vectored, TransportError};

#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// HOST:PORT of the server.
    pub addr: String,
    pub secret: Option<Vec<u8>>,
    pub connections: usize,
    /// Bound on connecting and on waiting for any reply.
    pub timeout: Duration,
    /// How long attributes and names are cached (0 = not at all).
    pub attr_ttl: Duration,
}

impl ClientConfig {
    pub fn new(addr: &str) -> ClientConfig {
        ClientConfig {
            addr: addr.to_string(),
            secret: None,
            connections: 2,
            timeout: Duration::from_secs(10),
            attr_ttl: Duration::from_secs(1),
        }
    }
}

/// A reply: header, body and (for reads) the data.
#[derive(Debug)]
pub struct Response {
    pub hdr: RespHeader,
    pub body: Vec<u8>,
    pub data: Vec<u8>,
}

type Slot = SyncSender<Result<Response, Error>>;

struct Conn {
    writer: Mutex<TcpStream>,
    /// The same socket, to shut it down without waiting for a writer.
    control: TcpStream,
    pending: Mutex<HashMap<u64, (Op, Slot)>>,
    broken: AtomicBool,
    welcome: Welcome,
    inflight: (Mutex<u32>, Condvar),
}

impl Conn {
    fn break_with(&self, why: &str) {
        if !self.broken.swap(true, Ordering::SeqCst) {
            tracing::warn!("connection lost: {why}");
        }
        self.close(why);
    }

    /// Shut the socket (the reader thread then ends) and fail what is pending.
    fn close(&self, why: &str) {
        self.broken.store(true, Ordering::SeqCst);
        let _ = self.control.shutdown(std::net::Shutdown::Both);
        for (_, (_, slot)) in self.pending.lock().unwrap().drain() {
            let _ = slot.try_send(Err(Error::new(
                libc::ENOTCONN,
                format!("connection to the server lost: {why}"),
            )));
        }
    }
}

/// A submitted request; `wait` for its reply.
pub struct Ticket {
    rx: Receiver<Result<Response, Error>>,
    conn: Arc<Conn>,
    id: u64,
    timeout: Duration,
    addr: String,
}

impl Ticket {
    pub fn wait(self) -> Result<Response, Error> {
        let r = match self.rx.recv_timeout(self.timeout) {
            Ok(r) => r,
            Err(_) => {
                self.conn.pending.lock().unwrap().remove(&self.id);
                self.conn.break_with("reply timed out");
                Err(Error::new(
                    libc::ETIMEDOUT,
                    format!(
                        "no reply from {} within {:?} (server or link down?)",
                        self.addr, self.timeout
                    ),
                ))
            }
        };
        let resp = r?;
        if resp.hdr.status != 0 {
            return Err(Error::errno(resp.hdr.status));
        }
        Ok(resp)
    }
}

impl Drop for Ticket {
    /// Release the in-flight slot, waited for or not.
    fn drop(&mut self) {
        let (m, cv) = &self.conn.inflight;
        *m.lock().unwrap() -= 1;
        cv.notify_one();
    }
}

/// Run after a (re)connection found the session gone: the server no longer holds
/// this client's handles and references.
type RestartHook = Box<dyn Fn(&Client) + Send + Sync>;

pub struct Client {
    cfg: ClientConfig,
    /// Random, never 0; sent in every Hello.
    session: u64,
    conns: Vec<Mutex<Option<Arc<Conn>>>>,
    next: AtomicUsize,
    ids: AtomicU64,
    /// Instance id of the server last connected to.
    instance: AtomicU64,
    /// Some connection's handshake succeeded before: the server knew our session.
    had_session: AtomicBool,
    /// Called when the session was lost (handle revalidation).
    on_restart: Mutex<Option<RestartHook>>,
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub reconnects: AtomicU64,
    /// Reconnections that found the session still held by the server.
    pub resumed: AtomicU64,
    /// Times the revalidation hook ran (session lost or server restarted).
    pub revalidations: AtomicU64,
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
        TransportError::Io(io) => Error::new(
            io.raw_os_error().unwrap_or(libc::EIO),
            format!("{addr}: {io}"),
        ),
        other => Error::new(libc::EIO, format!("{addr}: {other}")),
    }
}

impl Client {
    pub fn new(cfg: ClientConfig) -> Client {
        let n = cfg.connections.max(1);
        Client {
            cfg,
            session: rand::random::<u64>().max(1),
            conns: (0..n).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            ids: AtomicU64::new(1),
            instance: AtomicU64::new(0),
            had_session: AtomicBool::new(false),
            on_restart: Mutex::new(None),
            bytes_sent: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            resumed: AtomicU64::new(0),
            revalidations: AtomicU64::new(0),
        }
    }

    /// Connect now (all connections), to fail early with a clear error.
    pub fn connect(&self) -> Result<(), Error> {
        for i in 0..self.conns.len() {
            self.conn(i)?;
        }
        Ok(())
    }

    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// The session id this client's connections carry.
    pub fn session(&self) -> u64 {
        self.session
    }

    /// Close every connection now (the next call connects again). What the server
    /// holds for this client stays for its grace period.
    pub fn disconnect(&self) {
        for slot in &self.conns {
            if let Some(c) = slot.lock().unwrap().take() {
                c.close("the client disconnected");
            }
        }
    }

    pub(crate) fn set_on_restart(&self, f: RestartHook) {
        *self.on_restart.lock().unwrap() = Some(f);
    }

    fn resolve(&self) -> Result<SocketAddr, Error> {
        self.cfg
            .addr
            .to_socket_addrs()
            .map_err(|e| Error::new(libc::EINVAL, format!("{}: {e}", self.cfg.addr)))?
            .next()
            .ok_or_else(|| Error::new(libc::EINVAL, format!("{}: no address", self.cfg.addr)))
    }

    fn dial(&self) -> Result<Arc<Conn>, Error> {
        let addr = self.resolve()?;
        let mut s = TcpStream::connect_timeout(&addr, self.cfg.timeout).map_err(|e| {
            Error::new(
                e.raw_os_error().unwrap_or(libc::EIO),
                format!("connecting to {}: {e}", self.cfg.addr),
            )
        })?;
        let _ = tune(&s);
        s.set_read_timeout(Some(self.cfg.timeout))
            .map_err(|e| Error::new(libc::EIO, e.to_string()))?;
        // Writes to a dead link must not block forever either.
        s.set_write_timeout(Some(self.cfg.timeout))
            .map_err(|e| Error::new(libc::EIO, e.to_string()))?;
        let welcome = client_handshake(&mut s, self.cfg.secret.as_deref(), self.session)
            .map_err(|e| terr(&self.cfg.addr, e))?;
        s.set_read_timeout(None)
            .map_err(|e| Error::new(libc::EIO, e.to_string()))?;
        let clone = || {
            s.try_clone()
                .map_err(|e| Error::new(libc::EIO, e.to_string()))
        };
        let (reader, control) = (clone()?, clone()?);
        let conn = Arc::new(Conn {
            writer: Mutex::new(s),
            control,
            pending: Mutex::new(HashMap::new()),
            broken: AtomicBool::new(false),
            welcome,
            inflight: (Mutex::new(0), Condvar::new()),
        });
        let c2 = conn.clone();
        std::thread::Builder::new()
            .name("zcfs-client-rx".into())
            .spawn(move || read_loop(reader, c2))
            .map_err(|e| Error::new(libc::EIO, e.to_string()))?;
        Ok(conn)
    }

    /// The `i`th connection, (re)connecting if needed.
    fn conn(&self, i: usize) -> Result<Arc<Conn>, Error> {
        let mut slot = self.conns[i].lock().unwrap();
        if let Some(c) = slot.as_ref() {
            if !c.broken.load(Ordering::SeqCst) {
                return Ok(c.clone());
            }
            self.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        let c = self.dial()?;
        *slot = Some(c.clone());
        drop(slot);
        let old = self.instance.swap(c.welcome.instance, Ordering::SeqCst);
        let had_session = self.had_session.swap(true, Ordering::SeqCst);
        let restarted = old != 0 && old != c.welcome.instance;
        if c.welcome.resumed {
            self.resumed.fetch_add(1, Ordering::Relaxed);
        }
        if restarted || (had_session && !c.welcome.resumed) {
            tracing::warn!(
                addr = %self.cfg.addr,
                restarted,
                "the server no longer holds this client's session: revalidating handles"
            );
            self.revalidations.fetch_add(1, Ordering::Relaxed);
            if let Some(f) = self.on_restart.lock().unwrap().as_ref() {
                f(self);
            }
        }
        Ok(c)
    }

    /// Send a request (and write data) without waiting for the reply.
    pub fn submit(&self, req: &Request, cred: Cred, data: &[&[u8]]) -> Result<Ticket, Error> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let conn = self.conn(i)?;
        Ok(self.submit_on(conn, req, cred, data))
    }

    /// Send a request on a connection that is up, without connecting and without
    /// waiting for the reply; false when no connection is up (then a lost session
    /// makes the request moot: forget).
    pub fn post(&self, req: &Request, cred: Cred) -> bool {
        let live = self.conns.iter().find_map(|slot| {
            slot.lock()
                .unwrap()
                .as_ref()
                .filter(|c| !c.broken.load(Ordering::SeqCst))
                .cloned()
        });
        match live {
            Some(conn) => {
                drop(self.submit_on(conn, req, cred, &[]));
                true
            }
            None => false,
        }
    }

    fn submit_on(&self, conn: Arc<Conn>, req: &Request, cred: Cred, data: &[&[u8]]) -> Ticket {
        {
            let (m, cv) = &conn.inflight;
            let mut n = m.lock().unwrap();
            while *n >= conn.welcome.max_inflight {
                n = cv.wait(n).unwrap();
            }
            *n += 1;
        }
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = sync_channel(1);
        conn.pending.lock().unwrap().insert(id, (req.op(), tx));
        let (hdr, body) = req.encode(id, cred);
        let mut iov = Vec::with_capacity(2 + data.len());
        iov.push(IoSlice::new(&hdr));
        iov.push(IoSlice::new(&body));
        iov.extend(data.iter().map(|d| IoSlice::new(d)));
        let n: usize = iov.iter().map(|s| s.len()).sum();
        let r = write_all_vectored(&mut *conn.writer.lock().unwrap(), &mut iov);
        let ticket = Ticket {
            rx,
            conn: conn.clone(),
            id,
            timeout: self.cfg.timeout,
            addr: self.cfg.addr.clone(),
        };
        if let Err(e) = r {
            conn.break_with(&format!("send failed: {e}"));
            // The ticket now holds the ENOTCONN the break delivered.
            return ticket;
        }
        self.bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
        ticket
    }

    /// Send and wait; idempotent requests are retried once after a lost connection.
    pub fn call(&self, req: &Request, cred: Cred, data: &[&[u8]]) -> Result<Response, Error> {
        let mut attempt = 0;
        loop {
            let r = self.submit(req, cred, data).and_then(Ticket::wait);
            match r {
                Err(e) if attempt == 0 && req.op().idempotent() && is_transport(&e) => {
                    attempt += 1;
                    tracing::info!("retrying {} after: {}", req.op().name(), e.msg());
                }
                other => return other,
            }
        }
    }
}

/// Errors of the link rather than of the file system.
fn is_transport(e: &Error) -> bool {
    matches!(
        e.errno,
        libc::ENOTCONN | libc::ECONNRESET | libc::EPIPE | libc::ETIMEDOUT | libc::ECONNREFUSED
    )
}

fn read_loop(mut s: TcpStream, conn: Arc<Conn>) {
    let why = loop {
        let mut hb = [0u8; RESP_HDR];
        if let Err(e) = s.read_exact(&mut hb) {
            break format!("receive: {e}");
        }
        let h = match RespHeader::decode(&hb) {
            Ok(h) => h,
            Err(e) => break format!("malformed reply: {e}"),
        };
        // Into fresh capacity: no zero-fill of a buffer the kernel is about to write.
        let (mut body, mut data) = (
            Vec::with_capacity(h.body_len as usize),
            Vec::with_capacity(h.data_len as usize),
        );
        let got = zcfs_transport::recv_into_vec(&s, &mut body, h.body_len as usize)
            .and_then(|_| zcfs_transport::recv_into_vec(&s, &mut data, h.data_len as usize));
        if let Err(e) = got {
            break format!("receive: {e}");
        }
        let Some((op, slot)) = conn.pending.lock().unwrap().remove(&h.id) else {
            // A reply to a request that timed out: drop it.
            continue;
        };
        if op != h.op {
            break format!(
                "reply {} for {} carries op {}",
                h.id,
                op.name(),
                h.op.name()
            );
        }
        let _ = slot.try_send(Ok(Response { hdr: h, body, data }));
    };
    conn.break_with(&why);
}
