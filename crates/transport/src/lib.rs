//! Socket transport for zcfs (TCP or a Unix domain socket, `Stream`): exact vectored
//! reads and writes (so headers, bodies and bulk data move without being joined into
//! one buffer), the handshake on both sides, and socket options. Other transports
//! (AF_XDP) will sit beside this one.

mod stream;

pub use stream::{
    peer_cred, peer_groups, Address, AddressError, Listener, Peer, PeerCred, Socket, Stream,
    UNIX_SOCKET_MODE,
};

use rand::RngCore;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::TcpStream;
use std::os::unix::io::AsRawFd;
use std::time::{Duration, Instant};
use zcfs_protocol::channel::{derive_keys, Integrity, Mac, TAG_LEN};
use zcfs_protocol::handshake::*;
use zcfs_protocol::{ProtoError, MAX_DATA, VERSION};

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Proto(#[from] ProtoError),
    #[error("the server requires a secret (use --secret-file)")]
    SecretRequired,
    #[error("authentication failed: the peer does not know the shared secret")]
    AuthFailed,
    #[error("the server did not authenticate itself (its Welcome has auth=0) but this client has a secret: refusing to talk to it (a rogue server, or one started without --secret-file)")]
    ServerUnauthenticated,
    #[error("the server does not offer --integrity full, which this client requires")]
    IntegrityRefused,
    #[error("the peer closed the connection")]
    Closed,
    /// The server would not take the connection into its session now (closed without a
    /// word: the client sees `Closed` and dials again).
    #[error("connection refused: {0}")]
    Refused(String),
}

pub type Result<T> = std::result::Result<T, TransportError>;

/// Write every byte of `bufs` (one writev per round; partial writes are resumed).
pub fn write_all_vectored(w: &mut impl Write, mut bufs: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fill every byte of `bufs` (readv, resumed until full); EOF is an error.
pub fn read_exact_vectored(
    r: &mut impl Read,
    mut bufs: &mut [IoSliceMut<'_>],
) -> std::io::Result<()> {
    IoSliceMut::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match r.read_vectored(bufs) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => IoSliceMut::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Append exactly `n` bytes from a socket to `buf`, receiving straight into its spare
/// capacity: no zero-fill, and recv asks for everything still missing each time.
pub fn recv_into_vec(s: &impl AsRawFd, buf: &mut Vec<u8>, n: usize) -> std::io::Result<()> {
    buf.reserve(n);
    let start = buf.len();
    let mut got = 0;
    while got < n {
        // SAFETY: `start + n <= capacity` (reserved above); recv writes at most
        // `n - got` bytes through the raw pointer into spare capacity, and no
        // reference to uninitialized memory is created.
        let r = unsafe {
            libc::recv(
                s.as_raw_fd(),
                buf.as_mut_ptr().add(start + got) as *mut libc::c_void,
                n - got,
                0,
            )
        };
        match r {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            r if r > 0 => got += r as usize,
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    // SAFETY: the `n` bytes after `start` were written by recv above.
    unsafe { buf.set_len(start + n) };
    Ok(())
}

/// Read and discard `n` bytes (a rejected write's payload, to stay in step).
pub fn discard(r: &mut impl Read, mut n: usize) -> std::io::Result<()> {
    let mut buf = [0u8; 64 << 10];
    while n > 0 {
        let k = n.min(buf.len());
        r.read_exact(&mut buf[..k])?;
        n -= k;
    }
    Ok(())
}

fn set_int_option(s: &TcpStream, level: i32, name: i32, value: libc::c_int) -> std::io::Result<()> {
    let fd = s.as_raw_fd();
    // SAFETY: setting an int socket option on our own socket; the pointer and length
    // describe `value`.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &value as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Low latency for small messages, keepalive to notice dead peers (TCP; a Unix socket
/// needs neither).
pub fn tune(s: &impl Socket) -> std::io::Result<()> {
    let Some(s) = s.tcp() else {
        return Ok(());
    };
    s.set_nodelay(true)?;
    // Keepalive after 10 s idle, probes every 5 s, 3 misses: a dead peer shows in ~25 s.
    let opts: [(i32, i32, libc::c_int); 4] = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 10),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 5),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
    ];
    for (level, name, value) in opts {
        // Best effort: a socket without keepalive still works.
        let _ = set_int_option(s, level, name, value);
    }
    Ok(())
}

/// Bound how long a peer may stall us: a send that makes no progress for `patience`
/// fails (SO_SNDTIMEO), data left unacknowledged that long breaks the connection
/// (TCP_USER_TIMEOUT), and so does a receive (SO_RCVTIMEO; see `read_message_start`
/// for waiting on an idle connection).
pub fn set_peer_timeout(s: &impl Socket, patience: Duration) -> std::io::Result<()> {
    let patience = patience.max(Duration::from_millis(1));
    s.set_write_timeout(Some(patience))?;
    s.set_read_timeout(Some(patience))?;
    let Some(s) = s.tcp() else {
        return Ok(());
    };
    let ms = patience.as_millis().min(libc::c_int::MAX as u128) as libc::c_int;
    set_int_option(s, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms)
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// How a wait for the next message ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The first `buf.len()` bytes of a message are in.
    Message,
    /// The peer closed the connection between messages.
    Closed,
    /// No byte came for the idle timeout.
    Idle,
}

/// Read the first `buf.len()` bytes of a message from a socket whose receive timeout is
/// `patience` (`set_peer_timeout`): while no byte has come the connection is idle and
/// we wait on, up to `idle` (an idle peer is not a stalled one); once one has, the rest
/// must come within `patience`.
pub fn read_message_start(
    s: &mut impl Socket,
    buf: &mut [u8],
    patience: Duration,
    idle: Duration,
) -> std::io::Result<Start> {
    let started = Instant::now();
    let mut got = 0;
    let mut shortened = false;
    let r = loop {
        if got == buf.len() {
            break Ok(Start::Message);
        }
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => break Ok(Start::Closed),
            Ok(0) => break Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                if got == 0 && shortened {
                    // The rest of the message gets the full patience.
                    s.set_read_timeout(Some(patience))?;
                    shortened = false;
                }
                got += n;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if got == 0 && timed_out(&e) => {
                let left = idle.saturating_sub(started.elapsed());
                if left.is_zero() {
                    break Ok(Start::Idle);
                }
                if left < patience {
                    s.set_read_timeout(Some(left))?;
                    shortened = true;
                }
            }
            Err(e) => break Err(e),
        }
    };
    if shortened {
        s.set_read_timeout(Some(patience))?;
    }
    r
}

/// The slowest a peer may send bulk data once a message has begun: a message of `n`
/// data bytes must arrive within the peer timeout plus `n / MIN_DATA_RATE` seconds.
pub const MIN_DATA_RATE: u64 = 1 << 20;

/// The time a message with `data_len` bytes of bulk data has, from its header on.
pub fn message_time(patience: Duration, data_len: u64) -> Duration {
    patience + Duration::from_secs_f64(data_len as f64 / MIN_DATA_RATE as f64)
}

/// Reads from a socket (whose receive timeout is `patience`) under one deadline for a
/// whole message: a peer trickling bytes cannot stretch a message beyond it. The
/// socket's timeout is shortened only near the deadline (no extra system call on the
/// fast path) and put back when this is dropped.
pub struct Patient<'a, S: Socket> {
    s: &'a mut S,
    deadline: Instant,
    patience: Duration,
    shortened: bool,
}

impl<'a, S: Socket> Patient<'a, S> {
    pub fn new(s: &'a mut S, deadline: Instant, patience: Duration) -> Patient<'a, S> {
        Patient {
            s,
            deadline,
            patience,
            shortened: false,
        }
    }

    fn before(&mut self) -> std::io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the message did not arrive within its deadline",
            ));
        }
        if left < self.patience {
            self.s.set_read_timeout(Some(left))?;
            self.shortened = true;
        }
        Ok(())
    }
}

impl<S: Socket> Read for Patient<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.before()?;
        self.s.read(buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> std::io::Result<usize> {
        self.before()?;
        self.s.read_vectored(bufs)
    }
}

impl<S: Socket> Drop for Patient<'_, S> {
    fn drop(&mut self) {
        if self.shortened {
            let _ = self.s.set_read_timeout(Some(self.patience));
        }
    }
}

fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut n);
    n
}

/// How long a server gives a peer to complete the whole handshake (every read and
/// write of it together, not each one).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// One deadline for a sequence of reads and writes on a socket: each waits at most for
/// the time left, so a peer that trickles bytes cannot stretch it.
struct Deadline(Instant);

impl Deadline {
    fn after(d: Duration) -> Deadline {
        Deadline(Instant::now() + d)
    }

    fn left(&self) -> std::io::Result<Duration> {
        let left = self.0.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the handshake was not finished within its deadline",
            ));
        }
        Ok(left)
    }

    fn read_exact(&self, s: &mut impl Socket, buf: &mut [u8]) -> std::io::Result<()> {
        let mut got = 0;
        while got < buf.len() {
            s.set_read_timeout(Some(self.left()?))?;
            match s.read(&mut buf[got..]) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                // Timed out (or woken early): `left` decides on the next round.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted || timed_out(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn write_all(&self, s: &mut impl Socket, mut buf: &[u8]) -> std::io::Result<()> {
        while !buf.is_empty() {
            s.set_write_timeout(Some(self.left()?))?;
            match s.write(buf) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted || timed_out(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// What a finished handshake gives the client: the server's Welcome (with `resumed` as
/// the Verdict said it) and, with a secret, the channel's MACs (send, receive).
#[derive(Debug)]
pub struct Established {
    pub welcome: Welcome,
    pub channel: Option<(Mac, Mac)>,
}

/// Client side of the handshake, for the client's `session` (random, not 0). With a
/// secret the server must prove it knows it (a Welcome without auth is refused), and
/// the connection gets its MACs; `integrity` Full is required of the server.
pub fn client_handshake(
    s: &mut impl Socket,
    secret: Option<&[u8]>,
    session: u64,
    integrity: Integrity,
) -> Result<Established> {
    client_handshake_on_lane(s, secret, session, Lane::NONE, integrity)
}

/// `client_handshake` for a connection on `lane` of the session (see `Lane`): the server
/// fences the session's older connection on that lane before it answers.
pub fn client_handshake_on_lane(
    s: &mut impl Socket,
    secret: Option<&[u8]>,
    session: u64,
    lane: Lane,
    integrity: Integrity,
) -> Result<Established> {
    let cn = nonce();
    let hello = Hello {
        version: VERSION as u16,
        features: match integrity {
            Integrity::Full => FEATURE_INTEGRITY_FULL,
            Integrity::Headers => 0,
        },
        nonce: cn,
        session,
        lane,
    }
    .encode();
    s.write_all(&hello)?;
    let mut wb = [0u8; WELCOME_LEN];
    s.read_exact(&mut wb).map_err(eof_closed)?;
    let mut w = Welcome::decode(&wb)?;
    let Some(secret) = secret else {
        if w.auth {
            return Err(TransportError::SecretRequired);
        }
        if integrity == Integrity::Full {
            return Err(TransportError::IntegrityRefused);
        }
        return Ok(Established {
            welcome: w,
            channel: None,
        });
    };
    if !w.auth {
        // A server that does not prove it knows the secret is never sent a request.
        return Err(TransportError::ServerUnauthenticated);
    }
    // The server proves itself first (over the whole transcript): we never answer a
    // server that does not know the secret, nor one whose Welcome was changed.
    verify_server(secret, &hello, &wb).map_err(|_| TransportError::AuthFailed)?;
    let full = w.features & FEATURE_INTEGRITY_FULL != 0;
    if integrity == Integrity::Full && !full {
        return Err(TransportError::IntegrityRefused);
    }
    s.write_all(&client_proof(secret, &hello, &wb))?;
    let mut vb = [0u8; VERDICT_LEN];
    s.read_exact(&mut vb).map_err(eof_closed)?;
    let v = Verdict::decode(&vb)?;
    if v.status != 0 {
        return Err(TransportError::AuthFailed);
    }
    let mode = if full {
        Integrity::Full
    } else {
        Integrity::Headers
    };
    let keys = derive_keys(secret, &hello, &wb);
    let (send, mut receive) = Mac::pair(&keys, mode, true);
    // An accepted Verdict is the server's first authenticated message: what it says
    // of the session (resumed or not) decides whether the client revalidates, so a
    // flipped bit on the path must not go unnoticed.
    let mut tag = [0u8; TAG_LEN];
    s.read_exact(&mut tag).map_err(eof_closed)?;
    receive
        .begin(&vb, &[])
        .verify(&tag)
        .map_err(|_| TransportError::AuthFailed)?;
    w.resumed = v.resumed;
    Ok(Established {
        welcome: w,
        channel: Some((send, receive)),
    })
}

/// What a finished handshake gives the server: the client's Hello and, with a secret,
/// the channel's MACs (send, receive).
#[derive(Debug)]
pub struct Accepted {
    pub hello: Hello,
    pub channel: Option<(Mac, Mac)>,
}

/// Server side of the handshake, all of it within `timeout` (`HANDSHAKE_TIMEOUT`), so a
/// silent or trickling peer cannot hold a connection for longer. With a secret,
/// `integrity` is the mode every connection uses (Full is refused without a secret by
/// the caller's configuration; here it is ignored then).
///
/// `attach` is called with the client's hello once the peer may have a session: after
/// its proof checked out when there is a secret (so a peer that does not know the
/// secret never touches one, nor learns whether it exists), before the welcome
/// otherwise. It says whether the session was resumed, which the verdict (or, without a
/// secret, the welcome) carries. If the handshake fails after `attach` (the peer went
/// away before the last message reached it), the caller undoes the attachment. The
/// socket's timeouts are left as the deadline set them: the caller sets its own.
pub fn server_handshake(
    s: &mut impl Socket,
    secret: Option<&[u8]>,
    integrity: Integrity,
    max_inflight: u32,
    instance: u64,
    timeout: Duration,
    attach: &mut dyn FnMut(&Hello) -> Result<bool>,
) -> Result<Accepted> {
    let deadline = Deadline::after(timeout);
    let mut hb = [0u8; HELLO_LEN];
    deadline.read_exact(s, &mut hb).map_err(eof_closed)?;
    let h = Hello::decode(&hb)?;
    let sn = nonce();
    let resumed = match secret {
        None => attach(&h)?,
        Some(_) => false,
    };
    let full = secret.is_some() && integrity == Integrity::Full;
    let mut w = Welcome {
        version: VERSION as u16,
        features: if full { FEATURE_INTEGRITY_FULL } else { 0 },
        auth: secret.is_some(),
        resumed,
        nonce: sn,
        proof: [0; 32],
        max_inflight,
        max_data: MAX_DATA as u32,
        instance,
    };
    if let Some(k) = secret {
        w.proof = server_proof(k, &hb, &w.encode());
    }
    let wb = w.encode();
    deadline.write_all(s, &wb)?;
    let Some(k) = secret else {
        return Ok(Accepted {
            hello: h,
            channel: None,
        });
    };
    let mut p = [0u8; PROOF_LEN];
    deadline.read_exact(s, &mut p).map_err(eof_closed)?;
    if verify_client(k, &hb, &wb, &p).is_err() {
        // Best effort: the peer is dropped either way.
        let _ = deadline.write_all(s, &Verdict::refused(libc::EACCES).encode());
        return Err(TransportError::AuthFailed);
    }
    let resumed = attach(&h)?;
    let mode = if full {
        Integrity::Full
    } else {
        Integrity::Headers
    };
    let keys = derive_keys(k, &hb, &wb);
    let (mut send, receive) = Mac::pair(&keys, mode, false);
    // The accepted Verdict goes out with a tag (the first message of this direction).
    let verdict = Verdict::accepted(resumed).encode();
    let tag = send.begin(&verdict, &[]).tag();
    let mut msg = [0u8; VERDICT_LEN + TAG_LEN];
    msg[..VERDICT_LEN].copy_from_slice(&verdict);
    msg[VERDICT_LEN..].copy_from_slice(&tag);
    deadline.write_all(s, &msg)?;
    Ok(Accepted {
        hello: h,
        channel: Some((send, receive)),
    })
}

fn eof_closed(e: std::io::Error) -> TransportError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        TransportError::Closed
    } else {
        TransportError::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair(
        server_secret: Option<&'static [u8]>,
        client_secret: Option<&'static [u8]>,
    ) -> (Result<Hello>, Result<Welcome>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut attached = 0;
            let r = server_handshake(
                &mut s,
                server_secret,
                Integrity::Headers,
                32,
                99,
                HANDSHAKE_TIMEOUT,
                &mut |h| {
                    attached += 1;
                    Ok(h.session == 42)
                },
            )
            .map(|a| a.hello);
            (r, attached)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let w = client_handshake(&mut c, client_secret, 42, Integrity::Headers).map(|e| e.welcome);
        drop(c);
        let (s, attached) = t.join().unwrap();
        assert_eq!(
            attached,
            s.is_ok() as usize,
            "attached exactly when it succeeded"
        );
        (s, w)
    }

    #[test]
    fn handshake_with_and_without_secret() {
        let (s, c) = pair(None, None);
        assert_eq!(s.unwrap().session, 42);
        let w = c.unwrap();
        assert_eq!(w.instance, 99);
        assert!(w.resumed, "the attach callback's answer reaches the client");
        let (s, c) = pair(Some(b"k"), Some(b"k"));
        assert!(s.is_ok());
        assert!(c.unwrap().resumed, "with a secret, the verdict carries it");
        let (_, c) = pair(Some(b"k"), Some(b"wrong"));
        assert!(
            matches!(c, Err(TransportError::AuthFailed)),
            "client must reject a server with another secret"
        );
        let (_, c) = pair(Some(b"k"), None);
        assert!(matches!(c, Err(TransportError::SecretRequired)));
        let (_, c) = pair(None, Some(b"k"));
        assert!(
            matches!(c, Err(TransportError::ServerUnauthenticated)),
            "a client with a secret refuses a server that does not authenticate"
        );
    }

    /// A peer without the secret that answers with a made-up proof: refused, never
    /// attached, and the welcome told it nothing about the session.
    #[test]
    fn a_failed_proof_attaches_nothing_and_learns_nothing() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut attached = false;
            let r = server_handshake(
                &mut s,
                Some(b"k"),
                Integrity::Headers,
                32,
                99,
                HANDSHAKE_TIMEOUT,
                &mut |_| {
                    attached = true;
                    Ok(true)
                },
            );
            (r, attached)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(
            &Hello {
                version: VERSION as u16,
                features: 0,
                nonce: [1; 32],
                session: 42,
                lane: Lane::NONE,
            }
            .encode(),
        )
        .unwrap();
        let mut w = [0u8; WELCOME_LEN];
        c.read_exact(&mut w).unwrap();
        assert!(!Welcome::decode(&w).unwrap().resumed);
        c.write_all(&[0u8; PROOF_LEN]).unwrap();
        let mut v = [0u8; VERDICT_LEN];
        c.read_exact(&mut v).unwrap();
        assert_eq!(Verdict::decode(&v).unwrap(), Verdict::refused(libc::EACCES));
        let (r, attached) = t.join().unwrap();
        assert!(matches!(r, Err(TransportError::AuthFailed)));
        assert!(!attached);
    }

    /// The deadline covers the whole handshake: a peer sending its hello a byte at a
    /// time (each read gets a byte well within the deadline) is dropped at the deadline,
    /// and one that finishes just within it is served.
    #[test]
    fn the_deadline_bounds_the_whole_handshake() {
        let timeout = Duration::from_millis(600);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut out = Vec::new();
            for _ in 0..2 {
                let (mut s, _) = l.accept().unwrap();
                let t = Instant::now();
                let r = server_handshake(
                    &mut s,
                    None,
                    Integrity::Headers,
                    32,
                    1,
                    timeout,
                    &mut |_| Ok(false),
                );
                out.push((r.map(|a| a.hello.session), t.elapsed()));
            }
            out
        });
        let hello = Hello {
            version: VERSION as u16,
            features: 0,
            nonce: [1; 32],
            session: 9,
            lane: Lane::NONE,
        }
        .encode();
        // 64 bytes, one every 50 ms: 3.2 s, far past the deadline.
        let mut c = TcpStream::connect(addr).unwrap();
        for b in hello {
            if c.write_all(&[b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(c);
        // Half the hello, a pause of half the deadline, the rest: within it.
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(&hello[..32]).unwrap();
        std::thread::sleep(timeout / 2);
        c.write_all(&hello[32..]).unwrap();
        let mut w = [0u8; WELCOME_LEN];
        c.read_exact(&mut w).unwrap();
        let out = server.join().unwrap();
        match &out[0] {
            (Err(TransportError::Io(e)), took) => {
                assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
                assert!(*took >= timeout && *took < timeout * 2, "{took:?}");
            }
            other => panic!("a trickling peer was not dropped at the deadline: {other:?}"),
        }
        assert_eq!(out[1].0.as_ref().unwrap(), &9);
    }

    #[test]
    fn an_idle_peer_is_waited_for_a_stalled_one_is_not() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut c = TcpStream::connect(addr).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let patience = Duration::from_millis(100);
        set_peer_timeout(&s, patience).unwrap();
        let t = std::thread::spawn(move || {
            // Idle for three timeouts, then a whole message start.
            std::thread::sleep(patience * 3);
            c.write_all(&[1u8; 8]).unwrap();
            // Half a message start, then a stall.
            c.write_all(&[2u8; 4]).unwrap();
            std::thread::sleep(patience * 5);
            c
        });
        let mut buf = [0u8; 8];
        let idle = Duration::from_secs(3600);
        assert_eq!(
            read_message_start(&mut s, &mut buf, patience, idle).unwrap(),
            Start::Message
        );
        assert_eq!(buf, [1u8; 8]);
        let started = std::time::Instant::now();
        let e = read_message_start(&mut s, &mut buf, patience, idle).unwrap_err();
        assert!(timed_out(&e), "{e}");
        assert!(started.elapsed() < patience * 4, "{:?}", started.elapsed());
        drop(t.join().unwrap());
        // A close between messages is a clean end.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        set_peer_timeout(&s, patience).unwrap();
        drop(c);
        assert_eq!(
            read_message_start(&mut s, &mut buf, patience, idle).unwrap(),
            Start::Closed
        );
    }

    /// A connection idle for the idle timeout ends (at the idle timeout, even when it
    /// is not a multiple of the peer timeout).
    #[test]
    fn an_idle_connection_ends_at_the_idle_timeout() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let patience = Duration::from_millis(200);
        set_peer_timeout(&s, patience).unwrap();
        let idle = Duration::from_millis(300);
        let started = Instant::now();
        let mut buf = [0u8; 8];
        assert_eq!(
            read_message_start(&mut s, &mut buf, patience, idle).unwrap(),
            Start::Idle
        );
        let took = started.elapsed();
        assert!(took >= idle && took < idle + patience, "{took:?}");
        assert_eq!(
            s.read_timeout().unwrap(),
            Some(patience),
            "patience put back"
        );
        drop(c);
    }

    /// A message's deadline holds however the peer trickles: each read gets a byte
    /// well within the patience, yet the whole message is cut at its deadline.
    #[test]
    fn a_trickled_message_is_cut_at_its_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let patience = Duration::from_millis(300);
        set_peer_timeout(&s, patience).unwrap();
        let t = std::thread::spawn(move || {
            for _ in 0..40 {
                if c.write_all(&[7]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let started = Instant::now();
        let mut p = Patient::new(&mut s, started + message_time(patience, 0), patience);
        let mut buf = [0u8; 40];
        let e = p.read_exact(&mut buf).unwrap_err();
        assert!(timed_out(&e), "{e}");
        let took = started.elapsed();
        assert!(took < patience * 2, "{took:?}");
        drop(p);
        assert_eq!(
            s.read_timeout().unwrap(),
            Some(patience),
            "patience put back"
        );
        drop(s);
        t.join().unwrap();
    }

    #[test]
    fn vectored_io_moves_every_byte() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut a = vec![0u8; 3];
            let mut b = vec![0u8; 5 << 20];
            read_exact_vectored(
                &mut s,
                &mut [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)],
            )
            .unwrap();
            (a, b)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let big: Vec<u8> = (0..5u32 << 20).map(|i| i as u8).collect();
        write_all_vectored(&mut c, &mut [IoSlice::new(b"abc"), IoSlice::new(&big)]).unwrap();
        let (a, b) = t.join().unwrap();
        assert_eq!(a, b"abc");
        assert!(b == big);
    }
}
