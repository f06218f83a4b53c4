//! The zcfs network server: exports any Backend over TCP.
//!
//! Each connection is served by one thread, in order, so many requests may be in flight
//! on it (the client pipelines; TCP carries the queue). Data paths:
//! - read: the backend hands out borrowed slices (PM blocks for a local volume) and the
//!   reply is one writev of header and slices: no user-space copy;
//! - write: the header names target and size, the backend reserves the destination
//!   blocks, the payload is received with readv straight into them, then committed
//!   through the operation log: no intermediate buffer. `one_copy` receives into a
//!   buffer and copies instead (the RZCFS ablation).
//!
//! A reply is sent after the operation is committed to the log; fsync replies after the
//! data is durable. Malformed or hostile input drops the connection with a logged
//! reason and is counted; it never reaches the volume.

use std::io::{IoSlice, IoSliceMut, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use zcfs_backend::{Backend, Ctx, Error};
use zcfs_protocol::{
    Op, ProtoError, Reply, ReqHeader, Request, RespHeader, ALL_OPS, ATTR_LEN, MAX_BODY, REQ_HDR,
};
use zcfs_transport::{discard, read_exact_vectored, server_handshake, tune, write_all_vectored};

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
        }
    }
}

#[derive(Debug, Default)]
struct OpStats {
    count: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
    max_nanos: AtomicU64,
}

/// Counters of a running server.
#[derive(Debug, Default)]
pub struct ServerStats {
    ops: [OpStats; 32],
    pub connections: AtomicU64,
    pub active: AtomicUsize,
    pub rejected_malformed: AtomicU64,
    pub rejected_auth: AtomicU64,
    pub rejected_limit: AtomicU64,
    /// Payload bytes copied in user space by the server itself (one-copy mode).
    pub user_copy_bytes: AtomicU64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct OpReport {
    pub count: u64,
    pub errors: u64,
    pub bytes: u64,
    pub mean_us: f64,
    pub max_us: f64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StatsReport {
    pub ops: std::collections::BTreeMap<String, OpReport>,
    pub connections_total: u64,
    pub connections_active: usize,
    pub rejected_malformed: u64,
    pub rejected_auth: u64,
    pub rejected_limit: u64,
    pub payload_bytes_read: u64,
    pub payload_bytes_written: u64,
    /// Bytes copied in user space on the server per payload byte (backend + server).
    pub user_copies_per_payload_byte: f64,
    pub backend_user_copy_bytes: u64,
    pub server_user_copy_bytes: u64,
}

impl ServerStats {
    fn record(&self, op: Op, ok: bool, bytes: u64, t: Instant) {
        let s = &self.ops[op as usize];
        let ns = t.elapsed().as_nanos() as u64;
        s.count.fetch_add(1, Ordering::Relaxed);
        if !ok {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
        s.bytes.fetch_add(bytes, Ordering::Relaxed);
        s.nanos.fetch_add(ns, Ordering::Relaxed);
        s.max_nanos.fetch_max(ns, Ordering::Relaxed);
    }

    pub fn report(&self, backend: &dyn Backend) -> StatsReport {
        let mut ops = std::collections::BTreeMap::new();
        for op in ALL_OPS {
            let s = &self.ops[op as usize];
            let count = s.count.load(Ordering::Relaxed);
            if count == 0 {
                continue;
            }
            ops.insert(
                op.name().to_string(),
                OpReport {
                    count,
                    errors: s.errors.load(Ordering::Relaxed),
                    bytes: s.bytes.load(Ordering::Relaxed),
                    mean_us: s.nanos.load(Ordering::Relaxed) as f64 / count as f64 / 1e3,
                    max_us: s.max_nanos.load(Ordering::Relaxed) as f64 / 1e3,
                },
            );
        }
        let bytes = |op: Op| self.ops[op as usize].bytes.load(Ordering::Relaxed);
        let (r, w) = (bytes(Op::Read), bytes(Op::Write));
        let cs = backend.copy_stats();
        let server_copies = self.user_copy_bytes.load(Ordering::Relaxed);
        // In one-copy mode the backend's own copy is the server's buffer-to-PM copy.
        let total = cs.user_copy_bytes.max(server_copies);
        StatsReport {
            ops,
            connections_total: self.connections.load(Ordering::Relaxed),
            connections_active: self.active.load(Ordering::Relaxed),
            rejected_malformed: self.rejected_malformed.load(Ordering::Relaxed),
            rejected_auth: self.rejected_auth.load(Ordering::Relaxed),
            rejected_limit: self.rejected_limit.load(Ordering::Relaxed),
            payload_bytes_read: r,
            payload_bytes_written: w,
            user_copies_per_payload_byte: if r + w == 0 {
                0.0
            } else {
                total as f64 / (r + w) as f64
            },
            backend_user_copy_bytes: cs.user_copy_bytes,
            server_user_copy_bytes: server_copies,
        }
    }
}

/// A running server: accepts until `shutdown`.
pub struct Server {
    backend: Arc<dyn Backend>,
    cfg: ServerConfig,
    pub stats: Arc<ServerStats>,
    listener: TcpListener,
    stopping: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<(u64, TcpStream)>>>,
    instance: u64,
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

/// Why a connection was dropped.
#[derive(Debug, thiserror::Error)]
enum ConnEnd {
    #[error("peer closed the connection")]
    Closed,
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed message: {0}")]
    Malformed(#[from] ProtoError),
}

impl Server {
    pub fn bind(backend: Arc<dyn Backend>, cfg: ServerConfig) -> Result<Server, ServerError> {
        let listener = TcpListener::bind(cfg.listen).map_err(|source| ServerError::Bind {
            addr: cfg.listen,
            source,
        })?;
        Ok(Server {
            backend,
            cfg,
            stats: Arc::new(ServerStats::default()),
            listener,
            stopping: Arc::new(AtomicBool::new(false)),
            conns: Arc::new(Mutex::new(Vec::new())),
            instance: rand::random(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("bound listener has an address")
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Accept connections until `shutdown`; each is served on its own thread.
    pub fn run(&self) -> Vec<std::thread::JoinHandle<()>> {
        let mut threads = Vec::new();
        let mut next_id = 0u64;
        for s in self.listener.incoming() {
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            let mut s = match s {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    continue;
                }
            };
            let peer = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
            if self.stats.active.load(Ordering::SeqCst) >= self.cfg.max_connections {
                self.stats.rejected_limit.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, limit = self.cfg.max_connections, "connection refused: connection limit reached");
                continue;
            }
            let _ = tune(&s);
            next_id += 1;
            let id = next_id;
            if let Ok(c) = s.try_clone() {
                self.conns.lock().unwrap().push((id, c));
            }
            self.stats.active.fetch_add(1, Ordering::SeqCst);
            self.stats.connections.fetch_add(1, Ordering::Relaxed);
            let (backend, stats, cfg, conns, instance) = (
                self.backend.clone(),
                self.stats.clone(),
                self.cfg.clone(),
                self.conns.clone(),
                self.instance,
            );
            threads.retain(|t: &std::thread::JoinHandle<()>| !t.is_finished());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("zcfs-conn-{id}"))
                    .spawn(move || {
                        match server_handshake(&mut s, cfg.secret.as_deref(), cfg.max_inflight, instance) {
                            Ok(_) => {
                                tracing::info!(%peer, "client connected");
                                let mut conn = Conn { s, backend: &*backend, stats: &stats, cfg: &cfg };
                                match conn.serve() {
                                    Ok(()) | Err(ConnEnd::Closed) => tracing::info!(%peer, "client disconnected"),
                                    Err(ConnEnd::Malformed(e)) => {
                                        stats.rejected_malformed.fetch_add(1, Ordering::Relaxed);
                                        tracing::warn!(%peer, "dropping client: malformed message: {e}");
                                    }
                                    Err(e) => tracing::info!(%peer, "client dropped: {e}"),
                                }
                            }
                            Err(zcfs_transport::TransportError::AuthFailed) => {
                                stats.rejected_auth.fetch_add(1, Ordering::Relaxed);
                                tracing::warn!(%peer, "dropping client: authentication failed");
                            }
                            Err(zcfs_transport::TransportError::Closed) => {
                                tracing::info!(%peer, "client hung up during the handshake");
                            }
                            Err(e) => {
                                stats.rejected_malformed.fetch_add(1, Ordering::Relaxed);
                                tracing::warn!(%peer, "dropping client: handshake failed: {e}");
                            }
                        }
                        conns.lock().unwrap().retain(|(i, _)| *i != id);
                        stats.active.fetch_sub(1, Ordering::SeqCst);
                    })
                    .expect("spawn connection thread"),
            );
        }
        threads
    }

    /// Stop accepting and close every connection (their threads then end).
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for (_, c) in self.conns.lock().unwrap().iter() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        // Wake the accept loop.
        let _ = TcpStream::connect(self.local_addr());
    }

    pub fn report(&self) -> StatsReport {
        self.stats.report(&*self.backend)
    }
}

struct Conn<'a> {
    s: TcpStream,
    backend: &'a dyn Backend,
    stats: &'a ServerStats,
    cfg: &'a ServerConfig,
}

fn ro() -> Error {
    Error::new(libc::EROFS, "the export is read-only")
}

impl Conn<'_> {
    fn serve(&mut self) -> Result<(), ConnEnd> {
        loop {
            let mut hb = [0u8; REQ_HDR];
            if let Err(e) = self.s.read_exact(&mut hb) {
                return Err(if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    ConnEnd::Closed
                } else {
                    e.into()
                });
            }
            let h = ReqHeader::decode(&hb)?;
            let mut body = vec![0u8; h.body_len as usize];
            self.s.read_exact(&mut body)?;
            let req = Request::decode(&h, &body)?;
            let t = Instant::now();
            let op = req.op();
            let ctx = Ctx {
                uid: h.uid,
                gid: h.gid,
                pid: 0,
            };
            match req {
                Request::Write {
                    ino,
                    fh,
                    offset,
                    size,
                } => self.write(&h, ino, fh, offset, size, t)?,
                Request::Read {
                    ino,
                    fh,
                    offset,
                    size,
                } => self.read(&h, ino, fh, offset, size, t)?,
                other => {
                    let r = self.handle(&ctx, other);
                    self.stats.record(op, r.is_ok(), 0, t);
                    self.reply(&h, r)?;
                }
            }
        }
    }

    fn reply(&mut self, h: &ReqHeader, r: Result<Reply, Error>) -> std::io::Result<()> {
        let (status, body, aux) = match r {
            Ok(rep) => {
                let (b, aux) = rep.encode();
                (0, b, aux)
            }
            Err(e) => (e.errno.clamp(1, 4095), Vec::new(), 0),
        };
        let rh = RespHeader {
            op: h.op,
            status,
            id: h.id,
            body_len: body.len() as u32,
            data_len: 0,
            aux,
        }
        .encode();
        write_all_vectored(&mut self.s, &mut [IoSlice::new(&rh), IoSlice::new(&body)])
    }

    fn read(
        &mut self,
        h: &ReqHeader,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        t: Instant,
    ) -> Result<(), ConnEnd> {
        let s = &mut self.s;
        let mut sent = false;
        let mut n = 0u64;
        let r = self.backend.read(ino, fh, offset, size, &mut |slices| {
            // Header and the borrowed slices in one writev: no copy on our side.
            n = slices.iter().map(|x| x.len() as u64).sum();
            let rh = RespHeader {
                op: h.op,
                status: 0,
                id: h.id,
                body_len: 0,
                data_len: n as u32,
                aux: 0,
            }
            .encode();
            let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(slices.len() + 1);
            iov.push(IoSlice::new(&rh));
            iov.extend(slices.iter().map(|x| IoSlice::new(x)));
            sent = true;
            write_all_vectored(s, &mut iov).map_err(|e| Error::new(libc::EIO, e.to_string()))
        });
        self.stats.record(Op::Read, r.is_ok(), n, t);
        match r {
            Ok(()) => Ok(()),
            // The reply went out partly: the stream is no longer in step.
            Err(e) if sent => Err(ConnEnd::Io(std::io::Error::other(e.msg))),
            Err(e) => Ok(self.reply(h, Err(e))?),
        }
    }

    fn write(
        &mut self,
        h: &ReqHeader,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        t: Instant,
    ) -> Result<(), ConnEnd> {
        if self.cfg.read_only {
            discard(&mut self.s, size as usize)?;
            self.stats.record(Op::Write, false, 0, t);
            return Ok(self.reply(h, Err(ro()))?);
        }
        let mut received = false;
        let mut recv_err: Option<std::io::Error> = None;
        let r = if self.cfg.one_copy {
            let mut buf = vec![0u8; size as usize];
            match self.s.read_exact(&mut buf) {
                Ok(()) => {
                    received = true;
                    self.stats
                        .user_copy_bytes
                        .fetch_add(size as u64, Ordering::Relaxed);
                    self.backend.write(ino, fh, offset, &buf)
                }
                Err(e) => {
                    received = true;
                    recv_err = Some(e);
                    Err(Error::errno(libc::EIO))
                }
            }
        } else {
            let s = &mut self.s;
            self.backend.write_with(ino, fh, offset, size, &mut |dst| {
                // Straight from the socket into the reserved destination blocks.
                received = true;
                let mut iov: Vec<IoSliceMut<'_>> =
                    dst.iter_mut().map(|d| IoSliceMut::new(d)).collect();
                read_exact_vectored(s, &mut iov).map_err(|e| {
                    let m = e.to_string();
                    recv_err = Some(e);
                    Error::new(libc::EIO, m)
                })
            })
        };
        if let Some(e) = recv_err {
            return Err(e.into());
        }
        if !received {
            // Rejected before the payload was read (no such file, no space, ...).
            discard(&mut self.s, size as usize)?;
        }
        self.stats.record(
            Op::Write,
            r.is_ok(),
            if r.is_ok() { size as u64 } else { 0 },
            t,
        );
        Ok(self.reply(h, r.map(Reply::Written))?)
    }

    fn handle(&self, ctx: &Ctx, req: Request) -> Result<Reply, Error> {
        let b = self.backend;
        if req.op().mutates() && self.cfg.read_only {
            return Err(ro());
        }
        Ok(match req {
            Request::Lookup { parent, name } => Reply::Attr(b.lookup(ctx, parent, &name)?),
            Request::Getattr { ino } => Reply::Attr(b.getattr(ino)?),
            Request::Setattr { ino, set } => Reply::Attr(b.setattr(ctx, ino, &set)?),
            Request::Readlink { ino } => Reply::Bytes(b.readlink(ino)?),
            Request::Mknod {
                parent,
                name,
                mode,
                rdev,
            } => Reply::Attr(b.mknod(ctx, parent, &name, mode, rdev)?),
            Request::Mkdir { parent, name, mode } => {
                Reply::Attr(b.mkdir(ctx, parent, &name, mode)?)
            }
            Request::Unlink { parent, name } => {
                b.unlink(ctx, parent, &name).map(|_| Reply::Empty)?
            }
            Request::Rmdir { parent, name } => b.rmdir(ctx, parent, &name).map(|_| Reply::Empty)?,
            Request::Symlink {
                parent,
                name,
                target,
            } => Reply::Attr(b.symlink(ctx, parent, &name, &target)?),
            Request::Rename {
                parent,
                name,
                newparent,
                newname,
                flags,
            } => b
                .rename(ctx, parent, &name, newparent, &newname, flags)
                .map(|_| Reply::Empty)?,
            Request::Link {
                ino,
                newparent,
                newname,
            } => Reply::Attr(b.link(ctx, ino, newparent, &newname)?),
            Request::Open { ino, flags } => {
                let write = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
                if write && self.cfg.read_only {
                    return Err(ro());
                }
                Reply::Handle(b.open(ctx, ino, flags)?)
            }
            Request::Create {
                parent,
                name,
                mode,
                flags,
            } => {
                let (a, fh) = b.create(ctx, parent, &name, mode, flags)?;
                Reply::Created(a, fh)
            }
            Request::Flush { ino, fh } => b.flush(ino, fh).map(|_| Reply::Empty)?,
            Request::Release { ino, fh } => b.release(ino, fh).map(|_| Reply::Empty)?,
            Request::Fsync { ino, fh, datasync } => {
                b.fsync(ino, fh, datasync).map(|_| Reply::Empty)?
            }
            Request::Readdir {
                ino,
                cookie,
                plus,
                max_entries,
            } => {
                let mut out = Vec::new();
                let mut budget = MAX_BODY - 4;
                b.readdir(ino, cookie, plus, &mut |e| {
                    let need = 8
                        + 4
                        + 8
                        + 1
                        + 2
                        + e.name.len()
                        + if e.attr.is_some() { ATTR_LEN } else { 0 };
                    if need > budget || out.len() >= max_entries as usize {
                        return false;
                    }
                    budget -= need;
                    out.push(e);
                    true
                })?;
                Reply::Entries(out)
            }
            Request::Statfs => Reply::StatFs(b.statfs()?),
            Request::Setxattr {
                ino,
                name,
                value,
                flags,
            } => b
                .setxattr(ino, &name, &value, flags)
                .map(|_| Reply::Empty)?,
            Request::Getxattr { ino, name } => Reply::Bytes(b.getxattr(ino, &name)?),
            Request::Listxattr { ino } => Reply::Names(b.listxattr(ino)?),
            Request::Removexattr { ino, name } => {
                b.removexattr(ino, &name).map(|_| Reply::Empty)?
            }
            Request::Fallocate {
                ino,
                fh,
                offset,
                len,
                mode,
            } => b
                .fallocate(ino, fh, offset, len, mode)
                .map(|_| Reply::Empty)?,
            Request::SyncAll => b.sync_all().map(|_| Reply::Empty)?,
            Request::Ping => Reply::Empty,
            Request::Stats => {
                let r = self.stats.report(b);
                Reply::Stats(
                    serde_json::to_vec(&r).map_err(|e| Error::new(libc::EIO, e.to_string()))?,
                )
            }
            Request::Read { .. } | Request::Write { .. } => {
                unreachable!("handled on the data path")
            }
        })
    }
}
