//! Socket transport for zcfs (TCP or a Unix domain socket, `Stream`): exact vectored
//! reads and writes (so headers, bodies and bulk data move without being joined into
//! one buffer), the handshake on both sides, and socket options. Other transports
//! (AF_XDP) will sit beside this one.

mod handshake;
mod recvbuf;
mod stream;

pub use handshake::{
    client_handshake, client_handshake_on_lane, client_handshake_within, server_handshake,
    Accepted, Established, Joined, HANDSHAKE_TIMEOUT,
};
pub use recvbuf::{RecvBuf, RecvFd, RECV_BUF_SIZE};
pub use stream::{
    bytes_waiting, peek_waiting, peer_cred, peer_groups, Address, AddressError, Listener, Peer,
    PeerCred, Socket, Stream, UNIX_SOCKET_MODE,
};

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::TcpStream;
use std::os::unix::io::AsRawFd;
use std::time::{Duration, Instant};
use zcfs_protocol::ProtoError;

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
        let n = moved(w.write_vectored(bufs), std::io::ErrorKind::WriteZero)?;
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// `write_all_vectored` on a socket with MSG_MORE: more of the same message follows
/// at once (spliced data), so TCP holds these bytes for the segment that carries it
/// instead of sending them alone.
pub fn send_all_more(s: &impl AsRawFd, mut bufs: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        // SAFETY: a msghdr with no name and no control data whose iovecs are the
        // caller's slices (IoSlice is ABI-compatible with iovec); sendmsg only reads them.
        let r = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = bufs.as_mut_ptr().cast();
            msg.msg_iovlen = bufs.len() as _;
            libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_MORE | libc::MSG_NOSIGNAL)
        };
        let r = if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r as usize)
        };
        let n = moved(r, std::io::ErrorKind::WriteZero)?;
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// One round of a loop that moves every byte: the bytes a call moved (0 when it was
/// interrupted, to call again); a call that moved none is the error `none`.
fn moved(r: std::io::Result<usize>, none: std::io::ErrorKind) -> std::io::Result<usize> {
    match r {
        Ok(0) => Err(none.into()),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(0),
        r => r,
    }
}

/// Fill every byte of `bufs` (readv, resumed until full); EOF is an error.
pub fn read_exact_vectored(
    r: &mut impl Read,
    mut bufs: &mut [IoSliceMut<'_>],
) -> std::io::Result<()> {
    IoSliceMut::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let n = moved(r.read_vectored(bufs), std::io::ErrorKind::UnexpectedEof)?;
        IoSliceMut::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// Append exactly `n` bytes from a socket to `buf`, receiving straight into its spare
/// capacity: no zero-fill, and recv asks for everything still missing each time.
pub fn recv_into_vec(s: &impl AsRawFd, buf: &mut Vec<u8>, n: usize) -> std::io::Result<()> {
    recv_into_vec_with(s, buf, n, &mut || Ok(()))
}

/// `recv_into_vec`, calling `before` ahead of every recv (a reader with a deadline for
/// the whole message checks it there and shortens the socket's timeout); its error
/// ends the receive. On any error, `buf` keeps its length (the bytes are lost).
pub fn recv_into_vec_with(
    s: &impl AsRawFd,
    buf: &mut Vec<u8>,
    n: usize,
    before: &mut dyn FnMut() -> std::io::Result<()>,
) -> std::io::Result<()> {
    buf.reserve(n);
    let start = buf.len();
    // SAFETY: `start + n <= capacity` (reserved above): the `n` bytes from `start` are
    // spare capacity of `buf`, written only through the raw pointer.
    unsafe { recv_exact_raw(s, buf.as_mut_ptr().add(start), n, before)? };
    // SAFETY: the `n` bytes after `start` were written by recv above.
    unsafe { buf.set_len(start + n) };
    Ok(())
}

/// Fill `buf` exactly from a socket, calling `before` ahead of every recv (as
/// `recv_into_vec_with`).
pub fn recv_exact_with(
    s: &impl AsRawFd,
    buf: &mut [u8],
    before: &mut dyn FnMut() -> std::io::Result<()>,
) -> std::io::Result<()> {
    // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
    unsafe { recv_exact_raw(s, buf.as_mut_ptr(), buf.len(), before) }
}

/// recv until `n` bytes have arrived at `dst`.
///
/// # Safety
/// `dst` must be valid for `n` bytes of writes, and nothing may read those bytes
/// through a reference while this runs.
unsafe fn recv_exact_raw(
    s: &impl AsRawFd,
    dst: *mut u8,
    n: usize,
    before: &mut dyn FnMut() -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut got = 0;
    while got < n {
        before()?;
        // SAFETY: `got < n`, so `dst + got` and the `n - got` bytes after it are within
        // what the caller vouched for; no reference to them is created.
        let r = unsafe { libc::recv(s.as_raw_fd(), dst.add(got).cast(), n - got, 0) };
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
/// (TCP_USER_TIMEOUT), and so does a receive (SO_RCVTIMEO; see `fill_message_start`
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

/// How much a receive into a buffer may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// Whatever the peer sent, up to the buffer's room: the messages behind this one
    /// too.
    Greedy,
    /// Only the `need` bytes asked for: what follows stays on the socket (a write's
    /// payload, to be received straight into its place).
    Exact,
}

/// Receive the first `need` bytes of a message into `rb` from a socket whose receive
/// timeout is `patience` (`set_peer_timeout`), each recv taking what `take` allows (at
/// once when they are buffered already: no system call). While no byte has come the
/// connection is idle and we wait on, up to `idle` (an idle peer is not a stalled one);
/// once one has (bytes already buffered count), the rest must come within `patience`.
pub fn fill_message_start(
    s: &mut impl Socket,
    rb: &mut RecvBuf,
    need: usize,
    take: Take,
    patience: Duration,
    idle: Duration,
) -> std::io::Result<Start> {
    assert!(
        need <= rb.capacity(),
        "a message start larger than the buffer"
    );
    let mut got = rb.len();
    let started = Instant::now();
    let mut shortened = false;
    let r = loop {
        if got >= need {
            break Ok(Start::Message);
        }
        let read = match take {
            Take::Greedy => rb.fill_once(s),
            Take::Exact => rb.fill_once_upto(s, need - got),
        };
        match read {
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

/// Tests: a client socket connected to a thread that runs `serve` on the server side.
#[cfg(test)]
pub(crate) fn served<T: Send + 'static>(
    serve: impl FnOnce(TcpStream) -> T + Send + 'static,
) -> (TcpStream, std::thread::JoinHandle<T>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || serve(l.accept().unwrap().0));
    (TcpStream::connect(addr).unwrap(), t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

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
        let mut rb = RecvBuf::new(8);
        let idle = Duration::from_secs(3600);
        let mut start =
            |s: &mut TcpStream| fill_message_start(s, &mut rb, 8, Take::Exact, patience, idle);
        assert_eq!(start(&mut s).unwrap(), Start::Message);
        let mut buf = [0u8; 8];
        rb.take_into(&mut buf);
        assert_eq!(buf, [1u8; 8]);
        let mut start =
            |s: &mut TcpStream| fill_message_start(s, &mut rb, 8, Take::Exact, patience, idle);
        let started = std::time::Instant::now();
        let e = start(&mut s).unwrap_err();
        assert!(timed_out(&e), "{e}");
        assert!(started.elapsed() < patience * 4, "{:?}", started.elapsed());
        drop(t.join().unwrap());
        // A close between messages is a clean end.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        set_peer_timeout(&s, patience).unwrap();
        drop(c);
        let mut rb = RecvBuf::new(8);
        assert_eq!(
            fill_message_start(&mut s, &mut rb, 8, Take::Exact, patience, idle).unwrap(),
            Start::Closed
        );
    }

    /// Through a receive buffer: an idle peer is waited for, a message start already
    /// buffered is there at once, one begun (part of it buffered) must finish within
    /// the peer timeout, and two messages sent together come in with one recv.
    #[test]
    fn a_buffered_message_start_keeps_the_idle_and_stall_rules() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let patience = Duration::from_millis(100);
        set_peer_timeout(&s, patience).unwrap();
        let idle = Duration::from_secs(3600);
        let mut rb = RecvBuf::new(64);
        let t = std::thread::spawn(move || {
            std::thread::sleep(patience * 3);
            // Two 8-byte message starts and half of a third, then a stall.
            c.write_all(&[[1u8; 8], [2u8; 8]].concat()).unwrap();
            std::thread::sleep(patience);
            c.write_all(&[3u8; 4]).unwrap();
            std::thread::sleep(patience * 5);
            c
        });
        let start = |s: &mut TcpStream, rb: &mut RecvBuf| {
            fill_message_start(s, rb, 8, Take::Greedy, patience, idle)
        };
        assert_eq!(start(&mut s, &mut rb).unwrap(), Start::Message);
        assert!(rb.len() >= 8);
        let mut m = [0u8; 8];
        rb.take_into(&mut m);
        assert_eq!(m, [1u8; 8]);
        // The second came with the first (sent in one write, received in one recv here
        // unless the kernel split them); either way it is whole now.
        assert_eq!(start(&mut s, &mut rb).unwrap(), Start::Message);
        rb.take_into(&mut m);
        assert_eq!(m, [2u8; 8]);
        let began = Instant::now();
        let e = start(&mut s, &mut rb).unwrap_err();
        assert!(timed_out(&e), "{e}");
        assert!(began.elapsed() < patience * 4, "{:?}", began.elapsed());
        assert_eq!(rb.buffered(), &[3u8; 4], "the partial start stays buffered");
        // Bytes already buffered count as a message begun: no idle wait.
        let began = Instant::now();
        assert!(start(&mut s, &mut rb).is_err());
        assert!(began.elapsed() < patience * 4, "{:?}", began.elapsed());
        drop(t.join().unwrap());
        // A close between messages is a clean end; inside one, an error.
        assert_eq!(
            fill_message_start(
                &mut s,
                &mut RecvBuf::new(64),
                8,
                Take::Exact,
                patience,
                idle
            )
            .unwrap(),
            Start::Closed
        );
        assert!(fill_message_start(&mut s, &mut rb, 8, Take::Exact, patience, idle).is_err());
    }

    /// `Take::Exact` takes the message start asked for and nothing behind it: the
    /// bytes after it stay on the socket for a reader that wants them in place.
    #[test]
    fn an_exact_message_start_leaves_what_follows_on_the_socket() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let patience = Duration::from_secs(5);
        set_peer_timeout(&s, patience).unwrap();
        c.write_all(&[[1u8; 8], [2u8; 8], [3u8; 8]].concat())
            .unwrap();
        let mut rb = RecvBuf::new(64);
        // Two bytes of the first were buffered already: six more come, no more.
        rb.fill_once_upto(&mut s, 2).unwrap();
        let exact = fill_message_start(&mut s, &mut rb, 8, Take::Exact, patience, patience);
        assert_eq!(exact.unwrap(), Start::Message);
        assert_eq!(rb.buffered(), &[1u8; 8]);
        rb.consume(8);
        let mut rest = [0u8; 16];
        s.read_exact(&mut rest).unwrap();
        assert_eq!(rest, *[[2u8; 8], [3u8; 8]].concat());
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
        let mut rb = RecvBuf::new(8);
        assert_eq!(
            fill_message_start(&mut s, &mut rb, 8, Take::Exact, patience, idle).unwrap(),
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
        let (mut c, t) = served(|mut s| {
            let mut a = vec![0u8; 3];
            let mut b = vec![0u8; 5 << 20];
            read_exact_vectored(
                &mut s,
                &mut [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)],
            )
            .unwrap();
            (a, b)
        });
        let big: Vec<u8> = (0..5u32 << 20).map(|i| i as u8).collect();
        write_all_vectored(&mut c, &mut [IoSlice::new(b"abc"), IoSlice::new(&big)]).unwrap();
        let (a, b) = t.join().unwrap();
        assert_eq!(a, b"abc");
        assert!(b == big);
    }
}
