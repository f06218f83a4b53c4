//! The server side: a Unix socket beside the network server's, one thread per
//! connected application. The thread answers control messages (proto.rs) and runs the
//! application's rings (ring.rs): it drains the submission ring, runs each entry
//! against the volume, posts the completion, and spins a bounded while
//! ([`DEFAULT_SPIN`]) before it sets NEED_WAKEUP and sleeps on its eventfd.
//!
//! Everything the application controls is hostile: ring counters, entries, buffer
//! contents and sizes. Entries are copied out before use, every buffer range is checked
//! before any change, and a ring whose counters are impossible gets the connection
//! closed (with a log line). Handles, leases and reservations belong to the connection
//! and all go when it closes (the application exited, died, or the socket broke):
//! leased blocks are unpinned, reserved blocks go back to the allocator.

use crate::proto::{self, MapGeometry, Reply, Request, PROTOCOL_VERSION};
use crate::ring::{self, op, Cqe, ExtentDesc, Mapping, Placement, Rings, Sqe};
use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::fd::{AsFd, AsRawFd, OwnedFd};
use rustix::fs::{MemfdFlags, SealFlags};
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zcfs_types::identity::IdentityMap;
use zcfs_volume::{Cred, FsError, Lease, OwnedPages, PflushTxn, Volume, BLOCK, ROOT_INO};

/// How long the connection thread keeps polling its submission ring (yielding the CPU
/// between looks) after the last entry before it sleeps on the eventfd (NEED_WAKEUP).
/// Measured on this 2-vCPU machine under load average ~5 (examples/figures.rs, 4 KiB
/// read p50 from another process, shared / direct): no spin 8.6 / 12.2 us (every
/// request a wakeup); 20 us 5.7 / 5.4 us; 50 us 3.5 / 3.1-4.2 us. A pure busy spin
/// (no yield) of 50 us cost 107 us per read there (the spinner holds the CPU the
/// other side needs). 50 us: a lone request burns at most that much CPU.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);
/// Most applications connected at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Most buffers one connection registers.
pub const MAX_BUFFERS: usize = 64;
/// Largest registered buffer.
pub const MAX_BUFFER_LEN: u64 = 1 << 34;
/// Most files one connection has open.
pub const MAX_HANDLES: usize = 4096;
/// Most leases one connection holds at once (READ_EXTENTS beyond: -ENOBUFS).
pub const MAX_LEASES: usize = 1024;
/// Most data blocks one connection's leases pin at once (256 MiB).
pub const MAX_LEASED_BLOCKS: u64 = 65_536;
/// Most reservations one connection holds at once (RESERVE beyond: -ENOBUFS).
pub const MAX_RESERVATIONS: usize = 1024;
/// Most blocks one connection's reservations hold at once (256 MiB).
pub const MAX_RESERVED_BLOCKS: u64 = 65_536;
/// Most placements in one COMMIT.
pub const MAX_PLACEMENTS: u64 = 4096;
/// Longest a control message may take to arrive once begun; also how long a new
/// connection has to say Hello.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);
/// Most connections one user (other than root) has at once: one user cannot take
/// every slot of `MAX_CONNECTIONS` (the socket is open to every local user).
pub const MAX_CONNECTIONS_PER_USER: usize = 32;
/// Free blocks a connection that reserves pages zeroes per step of its idle time
/// (`Volume::clean_free_blocks`, up to the volume's `CLEAN_TARGET`): 64 KiB, a few µs,
/// which is how long a request arriving meanwhile waits at most for it.
pub const CLEAN_STEP: usize = 16;
/// Whether the control socket has something to read (a message, or its end), without
/// waiting. The ring's spin and idle zeroing look at it between steps: before, an
/// `open` or `close` sent right after ring work waited out the whole spin (50 µs) or the
/// zeroing of up to `CLEAN_TARGET` blocks.
fn control_waiting(sock: &UnixStream) -> bool {
    let mut fds = [PollFd::new(sock, PollFlags::IN)];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).is_ok_and(|n| n > 0)
}

/// How often the accept loop looks for a shutdown.
const ACCEPT_POLL: Duration = Duration::from_millis(100);

/// How the service runs.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The socket's path (made 0666: the server decides by identity).
    pub path: PathBuf,
    /// The export's identity map, as on the network server's Unix socket.
    pub identity: IdentityMap,
    /// Members of this group are trusted with the direct map (besides root and the
    /// image file's owner).
    pub trust_group: Option<u32>,
    /// See [`DEFAULT_SPIN`].
    pub spin: Duration,
    pub read_only: bool,
}

impl ServiceConfig {
    pub fn new(path: impl Into<PathBuf>) -> ServiceConfig {
        ServiceConfig {
            path: path.into(),
            identity: IdentityMap::default(),
            trust_group: None,
            spin: DEFAULT_SPIN,
            read_only: false,
        }
    }
}

/// Counters of the service (see [`StatsSnapshot`]).
#[derive(Debug, Default)]
pub struct Counters {
    pub shared_read_ops: AtomicU64,
    pub shared_read_bytes: AtomicU64,
    pub shared_write_ops: AtomicU64,
    pub shared_write_bytes: AtomicU64,
    /// Payload bytes the server copied between PM and applications' buffers.
    pub shared_copied_bytes: AtomicU64,
    pub direct_read_ops: AtomicU64,
    pub direct_read_bytes: AtomicU64,
    pub direct_commit_ops: AtomicU64,
    pub direct_commit_bytes: AtomicU64,
    /// Payload bytes copied for direct-map operations (none: they hand out places).
    pub direct_copied_bytes: AtomicU64,
    pub leases_active: AtomicU64,
    pub reservations_active: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_open: AtomicU64,
    pub ring_errors: AtomicU64,
    pub corrupt_rings: AtomicU64,
    pub refused_direct_map: AtomicU64,
}

/// What [`Service::stats`] reports (and the Stats control message, as JSON).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StatsSnapshot {
    pub shared_read_ops: u64,
    pub shared_read_bytes: u64,
    pub shared_write_ops: u64,
    pub shared_write_bytes: u64,
    pub shared_copied_bytes: u64,
    /// Copies per payload byte in shared-buffer mode (1: PM <-> buffer).
    pub shared_copies_per_byte: f64,
    pub direct_read_ops: u64,
    pub direct_read_bytes: u64,
    pub direct_commit_ops: u64,
    pub direct_commit_bytes: u64,
    pub direct_copied_bytes: u64,
    /// Copies per payload byte in direct-map mode (0).
    pub direct_copies_per_byte: f64,
    pub leases_active: u64,
    pub reservations_active: u64,
    pub connections_total: u64,
    pub connections_open: u64,
    pub ring_errors: u64,
    pub corrupt_rings: u64,
    pub refused_direct_map: u64,
}

impl Counters {
    pub fn snapshot(&self) -> StatsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let ratio = |c: u64, b: u64| if b == 0 { 0.0 } else { c as f64 / b as f64 };
        let shared = g(&self.shared_read_bytes) + g(&self.shared_write_bytes);
        let direct = g(&self.direct_read_bytes) + g(&self.direct_commit_bytes);
        StatsSnapshot {
            shared_read_ops: g(&self.shared_read_ops),
            shared_read_bytes: g(&self.shared_read_bytes),
            shared_write_ops: g(&self.shared_write_ops),
            shared_write_bytes: g(&self.shared_write_bytes),
            shared_copied_bytes: g(&self.shared_copied_bytes),
            shared_copies_per_byte: ratio(g(&self.shared_copied_bytes), shared),
            direct_read_ops: g(&self.direct_read_ops),
            direct_read_bytes: g(&self.direct_read_bytes),
            direct_commit_ops: g(&self.direct_commit_ops),
            direct_commit_bytes: g(&self.direct_commit_bytes),
            direct_copied_bytes: g(&self.direct_copied_bytes),
            direct_copies_per_byte: ratio(g(&self.direct_copied_bytes), direct),
            leases_active: g(&self.leases_active),
            reservations_active: g(&self.reservations_active),
            connections_total: g(&self.connections_total),
            connections_open: g(&self.connections_open),
            ring_errors: g(&self.ring_errors),
            corrupt_rings: g(&self.corrupt_rings),
            refused_direct_map: g(&self.refused_direct_map),
        }
    }
}

fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}
fn sub(a: &AtomicU64, n: u64) {
    a.fetch_sub(n, Ordering::Relaxed);
}

/// Errors of the service itself (not of an application's request).
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{path}: {source}")]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the same-host interface needs a volume image file (not anonymous memory)")]
    NoImage,
}

struct Shared {
    vol: Arc<Volume>,
    cfg: ServiceConfig,
    counters: Counters,
    stop: AtomicBool,
    /// Handle numbers are unique across connections, so another connection's handle
    /// is never one of ours.
    next_handle: AtomicU32,
    /// Every connection's socket, to shut down at `shutdown`.
    conns: Mutex<HashMap<u64, UnixStream>>,
    /// Owner of the image file (trusted with the direct map).
    image_owner: u32,
}

/// The same-host service of one volume.
pub struct Service {
    shared: Arc<Shared>,
    listener: UnixListener,
}

impl Service {
    /// Listen on `cfg.path` (a stale socket there is replaced).
    pub fn bind(vol: Arc<Volume>, cfg: ServiceConfig) -> Result<Service, ServiceError> {
        let fd = vol.image_fd().ok_or(ServiceError::NoImage)?;
        let image_owner = std::fs::metadata(format!("/proc/self/fd/{fd}"))
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .map_err(|source| ServiceError::Bind {
                path: cfg.path.clone(),
                source,
            })?;
        let bind_err = |source| ServiceError::Bind {
            path: cfg.path.clone(),
            source,
        };
        if std::fs::symlink_metadata(&cfg.path)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
            && UnixStream::connect(&cfg.path).is_err()
        {
            let _ = std::fs::remove_file(&cfg.path);
        }
        let listener = UnixListener::bind(&cfg.path).map_err(bind_err)?;
        std::fs::set_permissions(&cfg.path, std::fs::Permissions::from_mode(0o666))
            .map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(bind_err)?;
        Ok(Service {
            shared: Arc::new(Shared {
                vol,
                cfg,
                counters: Counters::default(),
                stop: AtomicBool::new(false),
                next_handle: AtomicU32::new(1),
                conns: Mutex::new(HashMap::new()),
                image_owner,
            }),
            listener,
        })
    }

    pub fn path(&self) -> &Path {
        &self.shared.cfg.path
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.shared.counters.snapshot()
    }

    /// Accept applications until `shutdown`; then close every connection and wait for
    /// their threads (which release what each held).
    pub fn run(&self) {
        // Each connection's thread and its peer's uid.
        let mut threads: Vec<(std::thread::JoinHandle<()>, u32)> = Vec::new();
        let mut next_conn = 0u64;
        while !self.shared.stop.load(Ordering::Acquire) {
            threads.retain(|(t, _)| !t.is_finished());
            match self.listener.accept() {
                Ok((s, _)) => {
                    let _ = s.set_nonblocking(false);
                    // Root is not held to the bounds (it can take the machine anyway);
                    // any other user to its share and to the total.
                    let uid = zcfs_transport::peer_cred(&s).map_or(u32::MAX, |p| p.uid);
                    let mine = threads.iter().filter(|(_, u)| *u == uid).count();
                    let others = threads.iter().filter(|(_, u)| *u != 0).count();
                    let refuse = if uid == 0 {
                        None
                    } else if mine >= MAX_CONNECTIONS_PER_USER {
                        Some(format!(
                            "too many same-host connections of uid {uid} (at most {MAX_CONNECTIONS_PER_USER})"
                        ))
                    } else if others >= MAX_CONNECTIONS {
                        Some("too many same-host connections".to_string())
                    } else {
                        None
                    };
                    if let Some(why) = refuse {
                        let _ = proto::send(&s, &Reply::error(libc::EAGAIN, why).encode(), &[]);
                        continue;
                    }
                    next_conn += 1;
                    let id = next_conn;
                    if let Ok(c) = s.try_clone() {
                        self.shared.conns.lock().unwrap().insert(id, c);
                    }
                    let shared = self.shared.clone();
                    let t = std::thread::Builder::new()
                        .name("zcfs-samehost".into())
                        .spawn(move || {
                            connection(&shared, s);
                            shared.conns.lock().unwrap().remove(&id);
                        });
                    match t {
                        Ok(t) => threads.push((t, uid)),
                        Err(e) => tracing::warn!("samehost: no thread for a connection: {e}"),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let mut p = [PollFd::new(&self.listener, PollFlags::IN)];
                    let t = rustix::event::Timespec {
                        tv_sec: 0,
                        tv_nsec: ACCEPT_POLL.as_nanos() as _,
                    };
                    let _ = rustix::event::poll(&mut p, Some(&t));
                }
                Err(e) => {
                    tracing::warn!("samehost: accept: {e}");
                    std::thread::sleep(ACCEPT_POLL);
                }
            }
        }
        for s in self.shared.conns.lock().unwrap().values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for (t, _) in threads {
            let _ = t.join();
        }
    }

    /// Stop `run` (from another thread).
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Release);
        for s in self.shared.conns.lock().unwrap().values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.shared.cfg.path);
    }
}

struct OpenFile {
    ino: u64,
    read: bool,
    write: bool,
}

struct RingState {
    rings: Rings,
    /// Our copies of the counters we own (the shared ones are only published).
    sq_head: u32,
    cq_tail: u32,
    bell_in: OwnedFd,
    bell_out: OwnedFd,
}

/// Why a connection ends early.
#[derive(Debug, thiserror::Error)]
enum Close {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Proto(#[from] proto::ProtoError),
    #[error("corrupt ring: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Refused(String),
}

struct Conn<'s> {
    sh: &'s Shared,
    sock: UnixStream,
    peer: String,
    cred: Cred,
    trusted: bool,
    hello: bool,
    direct: bool,
    ring: Option<RingState>,
    bufs: HashMap<u32, Mapping>,
    next_buf: u32,
    files: HashMap<u32, OpenFile>,
    leases: HashMap<u64, Lease>,
    leased_blocks: u64,
    reservations: HashMap<u64, OwnedPages>,
    reserved_blocks: u64,
    /// Whether this connection has reserved pages: its idle time then zeroes free
    /// blocks ahead of its next RESERVE.
    reserves: bool,
    next_id: u64,
}

fn connection(sh: &Shared, sock: UnixStream) {
    add(&sh.counters.connections_total, 1);
    add(&sh.counters.connections_open, 1);
    match Conn::new(sh, sock) {
        Ok(mut c) => {
            if let Err(e) = c.serve() {
                if let Close::Corrupt(_) = e {
                    add(&sh.counters.corrupt_rings, 1);
                }
                tracing::warn!(peer = %c.peer, "samehost: closing connection: {e}");
            }
        }
        Err(e) => tracing::warn!("samehost: refusing a connection: {e}"),
    }
    sub(&sh.counters.connections_open, 1);
}

/// The credential of a Unix peer and whether it may have the direct map.
fn identify(sh: &Shared, sock: &UnixStream) -> std::io::Result<(Cred, bool, String)> {
    let pc = zcfs_transport::peer_cred(sock)?;
    let groups = zcfs_transport::peer_groups(sock, pc.pid)?;
    let trusted = pc.uid == 0
        || pc.uid == sh.image_owner
        || sh
            .cfg
            .trust_group
            .is_some_and(|g| g == pc.gid || groups.contains(&g));
    let peer = format!("pid {} uid {} gid {}", pc.pid, pc.uid, pc.gid);
    let cred = sh.cfg.identity.map(Cred::new(pc.uid, pc.gid, groups));
    Ok((cred, trusted, peer))
}

fn eloop() -> FsError {
    FsError::Io(std::io::Error::from_raw_os_error(libc::ELOOP))
}

impl<'s> Conn<'s> {
    fn new(sh: &'s Shared, sock: UnixStream) -> Result<Conn<'s>, Close> {
        sock.set_read_timeout(Some(CONTROL_TIMEOUT))?;
        sock.set_write_timeout(Some(CONTROL_TIMEOUT))?;
        let (cred, trusted, peer) = identify(sh, &sock)?;
        Ok(Conn {
            sh,
            sock,
            peer,
            cred,
            trusted,
            hello: false,
            direct: false,
            ring: None,
            bufs: HashMap::new(),
            next_buf: 1,
            files: HashMap::new(),
            leases: HashMap::new(),
            leased_blocks: 0,
            reservations: HashMap::new(),
            reserved_blocks: 0,
            reserves: false,
            next_id: 1,
        })
    }

    fn serve(&mut self) -> Result<(), Close> {
        let hello_by = Instant::now() + CONTROL_TIMEOUT;
        loop {
            if self.sh.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            let (sock_ready, bell_ready) = {
                let mut fds = vec![PollFd::new(&self.sock, PollFlags::IN)];
                if let Some(r) = &self.ring {
                    fds.push(PollFd::new(&r.bell_in, PollFlags::IN));
                }
                // A connection that has not said Hello in time is closed: an idle one
                // would hold a slot of MAX_CONNECTIONS for good.
                let wait = if self.hello {
                    None
                } else {
                    let left = hello_by.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(Close::Refused(format!(
                            "no Hello within {CONTROL_TIMEOUT:?}"
                        )));
                    }
                    Some(rustix::event::Timespec {
                        tv_sec: left.as_secs() as _,
                        tv_nsec: left.subsec_nanos() as _,
                    })
                };
                match rustix::event::poll(&mut fds, wait.as_ref()) {
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(Close::Io(e.into())),
                }
                (
                    !fds[0].revents().is_empty(),
                    fds.get(1).is_some_and(|f| !f.revents().is_empty()),
                )
            };
            if sock_ready && !self.control()? {
                return Ok(());
            }
            if bell_ready || self.ring.is_some() {
                self.run_rings()?;
            }
        }
    }

    /// Answer one control message; false at the end of the stream.
    fn control(&mut self) -> Result<bool, Close> {
        let Some((body, fds)) = proto::recv_within(&self.sock, Some(CONTROL_TIMEOUT))? else {
            return Ok(false);
        };
        let req = Request::decode(&body)?;
        if req.fds() != fds.len() {
            return Err(proto::ProtoError::Fds {
                got: fds.len(),
                want: req.fds(),
            }
            .into());
        }
        if !self.hello && !matches!(req, Request::Hello { .. }) {
            return Err(Close::Refused("the first message must be Hello".into()));
        }
        let (reply, out): (Reply, Vec<OwnedFd>) = match self.request(req, fds) {
            Ok(r) => r,
            Err(reply) => (reply, Vec::new()),
        };
        let borrowed: Vec<_> = out.iter().map(|f| f.as_fd()).collect();
        proto::send(&self.sock, &reply.encode(), &borrowed)?;
        if let Reply::Error { errno, .. } = reply {
            if errno == libc::EPROTO {
                return Err(Close::Refused("protocol version".into()));
            }
        }
        Ok(true)
    }

    fn request(
        &mut self,
        req: Request,
        mut fds: Vec<OwnedFd>,
    ) -> Result<(Reply, Vec<OwnedFd>), Reply> {
        let io = |what: &str, e: rustix::io::Errno| {
            Reply::error(e.raw_os_error(), format!("{what}: {e}"))
        };
        match req {
            Request::Hello {
                version,
                want_direct: _,
            } => {
                if version != PROTOCOL_VERSION {
                    return Err(Reply::error(
                        libc::EPROTO,
                        format!(
                            "protocol version {version}; this server speaks {PROTOCOL_VERSION}"
                        ),
                    ));
                }
                self.hello = true;
                Ok((
                    Reply::Hello {
                        version: PROTOCOL_VERSION,
                        trusted: self.trusted,
                    },
                    vec![],
                ))
            }
            Request::SetupRings { entries } => {
                if self.ring.is_some() {
                    return Err(Reply::error(libc::EBUSY, "rings are set up already"));
                }
                if !ring::valid_entries(entries) {
                    return Err(Reply::error(
                        libc::EINVAL,
                        format!(
                            "{entries} ring entries: a power of two in {}..={}",
                            ring::MIN_RING_ENTRIES,
                            ring::MAX_RING_ENTRIES
                        ),
                    ));
                }
                let size = ring::ring_size(entries);
                let memfd = rustix::fs::memfd_create(
                    "zcfs-samehost-rings",
                    MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
                )
                .map_err(|e| io("memfd", e))?;
                rustix::fs::ftruncate(&memfd, size as u64).map_err(|e| io("ftruncate", e))?;
                // Sealed: the application can neither shrink it under us (SIGBUS) nor
                // grow it.
                rustix::fs::fcntl_add_seals(
                    &memfd,
                    SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
                )
                .map_err(|e| io("seals", e))?;
                let map = Mapping::map(memfd.as_fd(), 0, size, true).map_err(|e| {
                    Reply::error(e.raw_os_error().unwrap_or(libc::EIO), e.to_string())
                })?;
                let rings = Rings::new(map, entries).expect("valid entries and size");
                rings.init_header();
                let flags = EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK;
                let bell_in = rustix::event::eventfd(0, flags).map_err(|e| io("eventfd", e))?;
                let bell_out = rustix::event::eventfd(0, flags).map_err(|e| io("eventfd", e))?;
                let give = vec![
                    memfd,
                    bell_in
                        .try_clone()
                        .map_err(|e| Reply::error(libc::EMFILE, e.to_string()))?,
                    bell_out
                        .try_clone()
                        .map_err(|e| Reply::error(libc::EMFILE, e.to_string()))?,
                ];
                self.ring = Some(RingState {
                    rings,
                    sq_head: 0,
                    cq_tail: 0,
                    bell_in,
                    bell_out,
                });
                Ok((
                    Reply::Rings {
                        entries,
                        size: size as u64,
                    },
                    give,
                ))
            }
            Request::RegisterBuffer { len } => {
                let fd = fds.pop().expect("count checked");
                if self.bufs.len() >= MAX_BUFFERS {
                    return Err(Reply::error(
                        libc::ENOBUFS,
                        format!("{MAX_BUFFERS} buffers registered already"),
                    ));
                }
                if len == 0 || len > MAX_BUFFER_LEN {
                    return Err(Reply::error(
                        libc::EINVAL,
                        format!("buffer of {len} bytes (1..={MAX_BUFFER_LEN})"),
                    ));
                }
                // Only a memfd sealed against shrinking: a file that can shrink under
                // our mapping would fault the server (SIGBUS).
                let seals = rustix::fs::fcntl_get_seals(&fd)
                    .map_err(|_| Reply::error(libc::EINVAL, "a buffer must be a memfd"))?;
                if !seals.contains(SealFlags::SHRINK) {
                    return Err(Reply::error(
                        libc::EINVAL,
                        "a buffer's memfd must be sealed against shrinking (F_SEAL_SHRINK)",
                    ));
                }
                let size = rustix::fs::fstat(&fd).map_err(|e| io("fstat", e))?.st_size as u64;
                if size < len {
                    return Err(Reply::error(
                        libc::EINVAL,
                        format!("buffer memfd holds {size} bytes, fewer than {len}"),
                    ));
                }
                let map = Mapping::map(fd.as_fd(), 0, len as usize, true).map_err(|e| {
                    Reply::error(
                        e.raw_os_error().unwrap_or(libc::EIO),
                        format!("mapping the buffer: {e}"),
                    )
                })?;
                let id = self.next_buf;
                self.next_buf += 1;
                self.bufs.insert(id, map);
                Ok((Reply::Buffer { id }, vec![]))
            }
            Request::Open { path, flags, mode } => {
                if self.files.len() >= MAX_HANDLES {
                    return Err(Reply::error(
                        libc::EMFILE,
                        format!("{MAX_HANDLES} files open"),
                    ));
                }
                let (ino, size) = self.open(&path, flags, mode).map_err(|e| {
                    Reply::error(
                        e.errno(),
                        format!("{}: {e}", String::from_utf8_lossy(&path)),
                    )
                })?;
                let handle = self.sh.next_handle.fetch_add(1, Ordering::Relaxed);
                let acc = flags & libc::O_ACCMODE;
                self.files.insert(
                    handle,
                    OpenFile {
                        ino,
                        read: acc != libc::O_WRONLY,
                        write: acc != libc::O_RDONLY,
                    },
                );
                let change_slot = zcfs_volume::change_slot(ino) as u32;
                Ok((
                    Reply::Opened {
                        handle,
                        size,
                        change_slot,
                    },
                    vec![],
                ))
            }
            Request::Close { handle } => match self.files.remove(&handle) {
                Some(f) => {
                    let _ = self.sh.vol.release_handle(f.ino);
                    Ok((Reply::Done, vec![]))
                }
                None => Err(Reply::error(libc::EBADF, format!("no handle {handle}"))),
            },
            Request::DirectMap => {
                if !self.trusted {
                    add(&self.sh.counters.refused_direct_map, 1);
                    return Err(Reply::error(
                        libc::EPERM,
                        "the direct map is for root, the image's owner and the trusted group",
                    ));
                }
                let fd = self.sh.vol.image_fd().ok_or_else(|| {
                    Reply::error(libc::EOPNOTSUPP, "the volume has no image file")
                })?;
                let proc = format!("/proc/self/fd/{fd}");
                let open = |write: bool| {
                    std::fs::OpenOptions::new()
                        .read(true)
                        .write(write)
                        .open(&proc)
                        .map(OwnedFd::from)
                        .map_err(|e| {
                            Reply::error(e.raw_os_error().unwrap_or(libc::EIO), e.to_string())
                        })
                };
                let ro = open(false)?;
                let rw = open(!self.sh.cfg.read_only)?;
                // From here on every change of a file raises its counter: leases this
                // peer keeps are checked against them (the client's mapped reads).
                let counters =
                    self.sh.vol.change_counters().map_err(|e| {
                        Reply::error(e.errno(), format!("the change counters: {e}"))
                    })?;
                let changes = std::fs::OpenOptions::new()
                    .read(true)
                    .open(format!("/proc/self/fd/{}", counters.fd().as_raw_fd()))
                    .map(OwnedFd::from)
                    .map_err(|e| {
                        Reply::error(e.raw_os_error().unwrap_or(libc::EIO), e.to_string())
                    })?;
                let image_size = rustix::fs::fstat(&ro).map_err(|e| io("fstat", e))?.st_size as u64;
                let g = self.sh.vol.geometry();
                let b = BLOCK as u64;
                self.direct = true;
                Ok((
                    Reply::DirectMap(MapGeometry {
                        data_start: g.data_start * b,
                        data_end: (g.data_start + g.data_blocks) * b,
                        block_size: BLOCK as u32,
                        image_size,
                        change_slots: zcfs_volume::CHANGE_SLOTS as u32,
                    }),
                    vec![ro, rw, changes],
                ))
            }
            Request::Stats => {
                let json = serde_json::to_vec(&self.sh.counters.snapshot()).unwrap_or_default();
                Ok((Reply::Stats { json }, vec![]))
            }
        }
    }

    /// Open (or create) `path` as the peer: every component looked up with its
    /// permission checks, the file's access checked against the flags. Symbolic links
    /// are not followed (ELOOP). Returns the inode (one reference taken) and its size.
    fn open(&self, path: &[u8], flags: i32, mode: u32) -> zcfs_volume::Result<(u64, u64)> {
        let vol = &self.sh.vol;
        let cred = &self.cred;
        let parts: Vec<&[u8]> = path
            .split(|&c| c == b'/')
            .filter(|p| !p.is_empty() && *p != b".")
            .collect();
        let Some((last, dirs)) = parts.split_last() else {
            return Err(FsError::IsDir);
        };
        let mut dir = ROOT_INO;
        for d in dirs {
            dir = if *d == b".." {
                vol.parent_of(cred, dir)?
            } else {
                let a = vol.lookup(cred, dir, d)?;
                if a.mode & libc::S_IFMT == libc::S_IFLNK {
                    return Err(eloop());
                }
                a.ino
            };
        }
        let wants_write = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        if wants_write && self.sh.cfg.read_only {
            return Err(FsError::ReadOnly);
        }
        let a = match vol.lookup_held(cred, dir, last) {
            Ok(a) => {
                if flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0 {
                    let _ = vol.forget(a.ino, 1);
                    return Err(FsError::Exists);
                }
                let check = || -> zcfs_volume::Result<()> {
                    match a.mode & libc::S_IFMT {
                        libc::S_IFREG => {}
                        libc::S_IFDIR => return Err(FsError::IsDir),
                        libc::S_IFLNK => return Err(eloop()),
                        _ => return Err(FsError::Invalid("not a regular file".into())),
                    }
                    vol.access(cred, a.ino, zcfs_volume::perm::open_mask(flags))?;
                    if flags & libc::O_TRUNC != 0 {
                        vol.truncate(cred, a.ino, 0)?;
                    }
                    Ok(())
                };
                if let Err(e) = check() {
                    let _ = vol.forget(a.ino, 1);
                    return Err(e);
                }
                a
            }
            Err(FsError::NotFound) if flags & libc::O_CREAT != 0 => {
                if *last == b".." {
                    return Err(FsError::Exists);
                }
                vol.create_held(cred, dir, last, libc::S_IFREG | (mode & 0o7777), 0)?
            }
            Err(e) => return Err(e),
        };
        let size = vol.getattr(a.ino).map(|a| a.size).unwrap_or(0);
        Ok((a.ino, size))
    }

    /// Drain the submission ring, then spin a bounded while for more, then ask to be
    /// woken (NEED_WAKEUP) and return.
    fn run_rings(&mut self) -> Result<(), Close> {
        let Some(r) = &self.ring else {
            return Ok(());
        };
        ring::clear_bell(r.bell_in.as_fd());
        r.rings.server_flags().store(0, Ordering::SeqCst);
        let spin = self.sh.cfg.spin;
        let mut last = Instant::now();
        loop {
            // Shutting down: stop here, however busy the ring (`serve` then finds the
            // socket shut down and ends the connection).
            if self.sh.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            if self.drain()? > 0 {
                last = Instant::now();
                continue;
            }
            // A control message waits for nothing this loop does for the ring: go
            // answer it (`serve` runs the ring again after it, so an entry submitted
            // meanwhile, while the flags still say awake, is not left behind).
            if control_waiting(&self.sock) {
                return Ok(());
            }
            // Idle: a connection that reserves pages zeroes free blocks for its next
            // RESERVE (which then need not), a step at a time, looking at the ring
            // between steps, until the volume has its target of clean blocks.
            if self.reserves && self.sh.vol.clean_free_blocks(CLEAN_STEP).unwrap_or(0) > 0 {
                continue;
            }
            if last.elapsed() < spin {
                // Yield rather than burn: on 2 loaded vCPUs the application may need
                // this CPU to submit (a pure spin measured 107 us per read there).
                std::thread::yield_now();
                continue;
            }
            let r = self.ring.as_ref().expect("set");
            r.rings
                .server_flags()
                .store(ring::NEED_WAKEUP, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            // Sleep unless there is work and room for its completion (a full
            // completion ring waits for the application to reap: it rings then).
            let work = r.rings.sq_tail().load(Ordering::Acquire) != r.sq_head;
            let full = r
                .cq_tail
                .wrapping_sub(r.rings.cq_head().load(Ordering::Acquire))
                >= r.rings.entries;
            if !work || full {
                return Ok(());
            }
            r.rings.server_flags().store(0, Ordering::SeqCst);
        }
    }

    /// Run what is in the submission ring (as much as the completion ring has room
    /// for). Returns entries run.
    fn drain(&mut self) -> Result<usize, Close> {
        let r = self.ring.as_ref().expect("rings set up");
        let entries = r.rings.entries;
        let tail = r.rings.sq_tail().load(Ordering::Acquire);
        let avail = tail.wrapping_sub(r.sq_head);
        if avail > entries {
            return Err(Close::Corrupt(format!(
                "submission tail {tail} is {avail} entries past head {}; the ring has {entries}",
                r.sq_head
            )));
        }
        let cq_head = r.rings.cq_head().load(Ordering::Acquire);
        let used = r.cq_tail.wrapping_sub(cq_head);
        if used > entries {
            return Err(Close::Corrupt(format!(
                "completion head {cq_head} is {} entries behind tail {}; the ring has {entries}",
                used, r.cq_tail
            )));
        }
        let n = avail.min(entries - used);
        for _ in 0..n {
            let r = self.ring.as_ref().expect("set");
            let sqe = r.rings.read_sqe(r.sq_head);
            let (result, extra, extra2) = match self.exec(&sqe) {
                Ok(v) => v,
                Err(e) => {
                    add(&self.sh.counters.ring_errors, 1);
                    (-(e as i64), 0, 0)
                }
            };
            let r = self.ring.as_mut().expect("set");
            r.rings.write_cqe(
                r.cq_tail,
                &Cqe {
                    user_data: sqe.user_data,
                    result,
                    extra,
                    extra2,
                },
            );
            r.sq_head = r.sq_head.wrapping_add(1);
            r.cq_tail = r.cq_tail.wrapping_add(1);
        }
        if n > 0 {
            let r = self.ring.as_ref().expect("set");
            r.rings.sq_head().store(r.sq_head, Ordering::Release);
            r.rings.cq_tail().store(r.cq_tail, Ordering::Release);
            fence(Ordering::SeqCst);
            if r.rings.app_flags().load(Ordering::Relaxed) & ring::APP_WAITING != 0 {
                ring::ring_bell(r.bell_out.as_fd());
            }
        }
        Ok(n as usize)
    }

    fn file(&self, handle: u32, write: bool) -> Result<u64, i32> {
        match self.files.get(&handle) {
            Some(f) if (write && f.write) || (!write && f.read) => Ok(f.ino),
            _ => Err(libc::EBADF),
        }
    }

    /// `len` bytes of buffer `buf` at `off`, if registered and inside it.
    fn buf(&self, buf: u32, off: u64, len: u64) -> Result<(&Mapping, *mut u8), i32> {
        let m = self.bufs.get(&buf).ok_or(libc::EFAULT)?;
        let p = m.range(off, len).ok_or(libc::EFAULT)?;
        Ok((m, p))
    }

    fn need_direct(&self) -> Result<(), i32> {
        if self.direct {
            Ok(())
        } else {
            Err(libc::EPERM)
        }
    }

    fn writable(&self) -> Result<(), i32> {
        if self.sh.cfg.read_only {
            Err(libc::EROFS)
        } else {
            Ok(())
        }
    }

    /// Run one entry: (result, extra, extra2) or an errno.
    fn exec(&mut self, e: &Sqe) -> Result<(i64, u64, u64), i32> {
        let vol = self.sh.vol.clone();
        let c = &self.sh.counters;
        let fs = |e: FsError| e.errno();
        match e.op {
            op::NOP => Ok((0, 0, 0)),
            op::READ => {
                let ino = self.file(e.handle, false)?;
                let (_, dst) = self.buf(e.buf, e.buf_off, e.len)?;
                let len = usize::try_from(e.len).map_err(|_| libc::EINVAL)?;
                let n = vol
                    .read_with(ino, e.offset, len, |slices| {
                        let mut at = 0;
                        for s in slices {
                            // SAFETY: `dst..dst+len` is inside the registered buffer
                            // (checked above) and the slices total at most `len`.
                            unsafe {
                                std::ptr::copy_nonoverlapping(s.as_ptr(), dst.add(at), s.len())
                            };
                            at += s.len();
                        }
                        at
                    })
                    .map_err(fs)?;
                add(&c.shared_read_ops, 1);
                add(&c.shared_read_bytes, n as u64);
                add(&c.shared_copied_bytes, n as u64);
                Ok((n as i64, 0, 0))
            }
            op::WRITE => {
                self.writable()?;
                let ino = self.file(e.handle, true)?;
                let (_, src) = self.buf(e.buf, e.buf_off, e.len)?;
                let len = usize::try_from(e.len).map_err(|_| libc::EINVAL)?;
                // SAFETY: inside the registered buffer (checked above), which stays
                // mapped while `self` lives. The application may store into it
                // meanwhile: then the file gets whichever bytes the copy saw, its own
                // race; u8 has no invalid values and the volume only copies from it.
                let data = unsafe { std::slice::from_raw_parts(src as *const u8, len) };
                let n = vol.write(&self.cred, ino, e.offset, data).map_err(fs)?;
                add(&c.shared_write_ops, 1);
                add(&c.shared_write_bytes, n as u64);
                add(&c.shared_copied_bytes, n as u64);
                Ok((n as i64, 0, 0))
            }
            op::FSYNC => {
                let f = self.files.get(&e.handle).ok_or(libc::EBADF)?;
                vol.fsync(f.ino).map_err(fs)?;
                Ok((0, 0, 0))
            }
            op::PFREE => {
                self.writable()?;
                let ino = self.file(e.handle, true)?;
                vol.pfree(&self.cred, ino, e.offset, e.len).map_err(fs)?;
                Ok((0, 0, 0))
            }
            op::READ_EXTENTS => {
                self.need_direct()?;
                let ino = self.file(e.handle, false)?;
                let cap = e.aux;
                let area = cap
                    .checked_mul(ring::EXTENT_DESC_SIZE as u64)
                    .ok_or(libc::EFAULT)?;
                self.buf(e.buf, e.buf_off, area)?;
                if e.len > MAX_LEASED_BLOCKS * BLOCK as u64 {
                    return Err(libc::ENOBUFS);
                }
                if self.leases.len() >= MAX_LEASES {
                    return Err(libc::ENOBUFS);
                }
                let lease = vol.lease(ino, e.offset, e.len as usize).map_err(fs)?;
                if self.leased_blocks + lease.blocks() > MAX_LEASED_BLOCKS {
                    return Err(libc::ENOBUFS);
                }
                let exts = lease.extents();
                if exts.len() as u64 > cap {
                    return Err(libc::EOVERFLOW);
                }
                let (m, _) = self.buf(e.buf, e.buf_off, area)?;
                for (i, x) in exts.iter().enumerate() {
                    let d = ExtentDesc {
                        file_offset: x.file_offset,
                        image_offset: x.image_offset,
                        len: x.len,
                        flags: if x.hole { ring::EXTENT_HOLE } else { 0 },
                    };
                    m.write_from(e.buf_off + (i * ring::EXTENT_DESC_SIZE) as u64, &d.encode());
                }
                let (n, bytes) = (exts.len() as i64, lease.bytes());
                let id = self.next_id;
                self.next_id += 1;
                self.leased_blocks += lease.blocks();
                self.leases.insert(id, lease);
                add(&c.leases_active, 1);
                add(&c.direct_read_ops, 1);
                add(&c.direct_read_bytes, bytes);
                Ok((n, id, bytes))
            }
            op::LEASE_RELEASE => {
                let l = self.leases.remove(&e.aux).ok_or(libc::EINVAL)?;
                self.leased_blocks -= l.blocks();
                sub(&c.leases_active, 1);
                Ok((0, 0, 0))
            }
            op::RESERVE => {
                self.need_direct()?;
                self.writable()?;
                let n = e.len;
                if n == 0 {
                    return Err(libc::EINVAL);
                }
                if self.reservations.len() >= MAX_RESERVATIONS
                    || n > MAX_RESERVED_BLOCKS - self.reserved_blocks
                {
                    return Err(libc::ENOBUFS);
                }
                let (m, _) = self.buf(e.buf, e.buf_off, n * 8)?;
                let pages = vol.reserve_pages_owned(n as usize).map_err(fs)?;
                for (i, off) in pages.image_offsets().into_iter().enumerate() {
                    m.write_from(e.buf_off + i as u64 * 8, &off.to_le_bytes());
                }
                let id = self.next_id;
                self.next_id += 1;
                self.reserved_blocks += n;
                self.reserves = true;
                self.reservations.insert(id, pages);
                add(&c.reservations_active, 1);
                Ok((n as i64, id, 0))
            }
            op::RESERVATION_RELEASE => {
                let p = self.reservations.remove(&e.aux).ok_or(libc::EINVAL)?;
                self.reserved_blocks -= p.pages() as u64;
                sub(&c.reservations_active, 1);
                Ok((0, 0, 0))
            }
            op::COMMIT => {
                self.need_direct()?;
                self.writable()?;
                self.commit(e)
            }
            _ => Err(libc::EINVAL),
        }
    }

    /// COMMIT: check every placement (handle writable, reservation ours and named
    /// once, offset aligned, size inside the last page), then place them all in one
    /// pflush commit. A commit refused by the checks changes nothing; past them every
    /// named reservation is consumed: one the volume refuses (no room in the log, no
    /// space for map nodes), or that fails anywhere after the checks, gives all its
    /// reservations back.
    fn commit(&mut self, e: &Sqe) -> Result<(i64, u64, u64), i32> {
        let n = e.len;
        if n == 0 || n > MAX_PLACEMENTS {
            return Err(libc::EINVAL);
        }
        let (m, _) = self.buf(e.buf, e.buf_off, n * ring::PLACEMENT_SIZE as u64)?;
        let mut list = Vec::with_capacity(n as usize);
        for i in 0..n {
            let mut b = [0u8; ring::PLACEMENT_SIZE];
            m.read_into(e.buf_off + i * ring::PLACEMENT_SIZE as u64, &mut b);
            list.push(Placement::decode(&b));
        }
        let mut seen = std::collections::HashSet::new();
        let bs = BLOCK as u64;
        for p in &list {
            self.file(p.handle, true)?;
            let pages = self.reservations.get(&p.reservation).ok_or(libc::EINVAL)?;
            if !seen.insert(p.reservation) || !p.file_offset.is_multiple_of(bs) {
                return Err(libc::EINVAL);
            }
            let end = p
                .file_offset
                .checked_add(pages.pages() as u64 * bs)
                .filter(|e| *e <= zcfs_volume::max_file_size())
                .ok_or(libc::EFBIG)?;
            if p.new_size != ring::NO_NEW_SIZE && (p.new_size <= end - bs || p.new_size > end) {
                return Err(libc::EINVAL);
            }
        }
        let vol = self.sh.vol.clone();
        // Past the checks every named reservation is consumed, whatever fails next
        // (their blocks go back to the allocator as they drop): taken out all at once,
        // so a failure part way through cannot leave some consumed and some held.
        let mut taken = Vec::with_capacity(list.len());
        for p in &list {
            let pages = self.reservations.remove(&p.reservation).expect("checked");
            self.reserved_blocks -= pages.pages() as u64;
            sub(&self.sh.counters.reservations_active, 1);
            taken.push(pages);
        }
        let mut txn = PflushTxn::default().written_by(&self.cred);
        let mut bytes = 0;
        for (p, pages) in list.iter().zip(taken) {
            let ino = self.files[&p.handle].ino;
            bytes += pages.pages() as u64 * bs;
            let pb = pages.into_page_buf(&vol).map_err(|e| e.errno())?;
            let size = (p.new_size != ring::NO_NEW_SIZE).then_some(p.new_size);
            txn.pflush_add(ino, p.file_offset, pb, size)
                .map_err(|e| e.errno())?;
        }
        vol.pflush_commit(txn).map_err(|e| e.errno())?;
        // FLAC's pflush_commit returns once the pages are durable, not only atomic: the
        // volume may batch commits (group commit), so make the batch durable now (a
        // server killed after COMMIT returned lost a checkpoint's manifest otherwise).
        vol.sync().map_err(|e| e.errno())?;
        add(&self.sh.counters.direct_commit_ops, 1);
        add(&self.sh.counters.direct_commit_bytes, bytes);
        Ok((0, 0, 0))
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        let c = &self.sh.counters;
        sub(&c.leases_active, self.leases.len() as u64);
        sub(&c.reservations_active, self.reservations.len() as u64);
        // Leases unpin and reservations give their blocks back as they drop.
        self.leases.clear();
        self.reservations.clear();
        for (_, f) in self.files.drain() {
            let _ = self.sh.vol.release_handle(f.ino);
        }
    }
}
