//! What a connection runs over: a TCP socket or a Unix domain socket. Both carry the
//! same bytes (handshake, headers, bodies, bulk data); they differ in how the peer is
//! known (an address, or the kernel's word on its process: SO_PEERCRED) and in the
//! socket options that make sense.

use std::fmt;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

/// Where a server listens and a client connects: `unix:PATH` (or an absolute path) or
/// `tcp:HOST:PORT` (or plain `HOST:PORT`). Displayed with its prefix, and that text
/// parses back to the same address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Address {
    Tcp(String),
    Unix(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("an empty address (want unix:PATH or [tcp:]HOST:PORT)")]
    Empty,
    #[error("{0:?}: a Unix socket path must be absolute (unix:/PATH)")]
    RelativeUnix(String),
    #[error("{0:?}: a TCP address is HOST:PORT")]
    NoPort(String),
}

impl FromStr for Address {
    type Err = AddressError;

    fn from_str(s: &str) -> Result<Address, AddressError> {
        if s.is_empty() {
            return Err(AddressError::Empty);
        }
        if let Some(p) = s.strip_prefix("unix:") {
            if !p.starts_with('/') {
                return Err(AddressError::RelativeUnix(s.into()));
            }
            return Ok(Address::Unix(p.into()));
        }
        if s.starts_with('/') {
            return Ok(Address::Unix(s.into()));
        }
        let hp = s.strip_prefix("tcp:").unwrap_or(s);
        match hp.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => {
                Ok(Address::Tcp(hp.into()))
            }
            _ => Err(AddressError::NoPort(s.into())),
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Tcp(hp) => write!(f, "tcp:{hp}"),
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl From<SocketAddr> for Address {
    fn from(a: SocketAddr) -> Address {
        Address::Tcp(a.to_string())
    }
}

impl Address {
    /// The first socket address a TCP address resolves to.
    pub fn resolve(&self) -> std::io::Result<Option<SocketAddr>> {
        match self {
            Address::Tcp(hp) => Ok(hp.to_socket_addrs()?.next()),
            Address::Unix(_) => Ok(None),
        }
    }

    /// Whether this is a TCP address on a loopback interface.
    pub fn is_loopback(&self) -> bool {
        matches!(self.resolve(), Ok(Some(a)) if a.ip().is_loopback())
    }
}

/// The kernel's word on the process at the other end of a Unix socket (SO_PEERCRED:
/// its credentials when it connected).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// Who is at the other end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    Tcp(SocketAddr),
    Unix(PeerCred),
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Tcp(a) => write!(f, "{a}"),
            Peer::Unix(c) => write!(f, "unix pid {} uid {} gid {}", c.pid, c.uid, c.gid),
        }
    }
}

/// A connected socket of either kind.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl From<TcpStream> for Stream {
    fn from(s: TcpStream) -> Stream {
        Stream::Tcp(s)
    }
}

impl From<UnixStream> for Stream {
    fn from(s: UnixStream) -> Stream {
        Stream::Unix(s)
    }
}

/// SO_PEERCRED of a Unix socket.
pub fn peer_cred(s: &impl AsRawFd) -> std::io::Result<PeerCred> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `c`, which is a ucred of
    // exactly that size; the descriptor is our own socket.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut c as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: c.pid,
        uid: c.uid,
        gid: c.gid,
    })
}

/// SO_PEERGROUPS (asm-generic/socket.h; Linux 4.13): not in the libc crate for Linux.
/// Known on the architectures that use the generic socket option numbers.
const SO_PEERGROUPS: Option<libc::c_int> = if cfg!(any(
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "riscv64",
    target_arch = "loongarch64",
    target_arch = "s390x"
)) {
    Some(59)
} else {
    None
};

/// Most supplementary groups a process can have on Linux (NGROUPS_MAX).
pub const MAX_PEER_GROUPS: usize = 65_536;

/// The supplementary groups of the process at the other end of a Unix socket, as
/// they were when it connected (SO_PEERGROUPS); where the kernel does not say, those
/// /proc/PID/status shows for its pid now.
pub fn peer_groups(s: &impl AsRawFd, pid: i32) -> std::io::Result<Vec<u32>> {
    if let Some(opt) = SO_PEERGROUPS {
        let mut groups = vec![0 as libc::gid_t; 64];
        loop {
            let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
            // SAFETY: getsockopt writes at most `len` bytes into `groups`, which holds
            // exactly that many; the descriptor is our own socket.
            let r = unsafe {
                libc::getsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    groups.as_mut_ptr() as *mut libc::c_void,
                    &mut len,
                )
            };
            let n = len as usize / std::mem::size_of::<libc::gid_t>();
            if r == 0 {
                groups.truncate(n.min(groups.len()));
                return Ok(groups);
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                // The kernel says how much room it needs.
                Some(libc::ERANGE) if n > groups.len() && n <= MAX_PEER_GROUPS => {
                    groups.resize(n, 0)
                }
                Some(libc::ENOPROTOOPT) => break,
                _ => return Err(e),
            }
        }
    }
    proc_groups(pid)
}

/// The `Groups:` line of /proc/PID/status.
fn proc_groups(pid: i32) -> std::io::Result<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .ok_or_else(|| std::io::Error::other(format!("/proc/{pid}/status has no Groups line")))?;
    line.split_whitespace()
        .map(|g| {
            g.parse::<u32>()
                .map_err(|e| std::io::Error::other(format!("/proc/{pid}/status: group {g:?}: {e}")))
        })
        .collect()
}

impl Stream {
    /// Connect to `addr`, waiting at most `timeout` (for TCP; a Unix socket connects at
    /// once or fails).
    pub fn connect(addr: &Address, timeout: Duration) -> std::io::Result<Stream> {
        match addr {
            Address::Tcp(_) => {
                let a = addr.resolve()?.ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::NotFound, "no address")
                })?;
                Ok(Stream::Tcp(TcpStream::connect_timeout(&a, timeout)?))
            }
            Address::Unix(p) => Ok(Stream::Unix(UnixStream::connect(p)?)),
        }
    }

    pub fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub fn shutdown(&self, how: Shutdown) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        }
    }

    pub fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(d),
            Stream::Unix(s) => s.set_read_timeout(d),
        }
    }

    pub fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(d),
            Stream::Unix(s) => s.set_write_timeout(d),
        }
    }

    /// Who is at the other end: its address, or its process's credentials.
    pub fn peer(&self) -> std::io::Result<Peer> {
        match self {
            Stream::Tcp(s) => Ok(Peer::Tcp(s.peer_addr()?)),
            Stream::Unix(s) => Ok(Peer::Unix(peer_cred(s)?)),
        }
    }

    pub fn as_tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Tcp(s) => Some(s),
            Stream::Unix(_) => None,
        }
    }
}

/// How many bytes the socket has received that no one has read yet (FIONREAD): a
/// server answering one request knows whether another is already here.
pub fn bytes_waiting(s: &impl AsRawFd) -> std::io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points at `n`, alive
    // for the call; the descriptor is borrowed from `s` for as long.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n as *mut libc::c_int) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n.max(0) as usize)
}

/// Copy up to `buf.len()` bytes the socket has received into `buf` without taking them
/// off it and without waiting (MSG_PEEK | MSG_DONTWAIT): how many were there (0 if
/// none).
pub fn peek_waiting(s: &impl AsRawFd, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: recv writes at most `buf.len()` bytes into `buf`, which is valid and
    // exclusively borrowed for the call; the descriptor is borrowed from `s`.
    let r = unsafe {
        libc::recv(
            s.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(r as usize)
}

impl std::os::fd::AsFd for Stream {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
}

macro_rules! both {
    ($self:expr, $s:ident => $e:expr) => {
        match $self {
            Stream::Tcp($s) => $e,
            Stream::Unix($s) => $e,
        }
    };
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        both!(self, s => s.read(buf))
    }
    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> std::io::Result<usize> {
        both!(self, s => s.read_vectored(bufs))
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        both!(self, s => s.write(buf))
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        both!(self, s => s.write_vectored(bufs))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        both!(self, s => s.flush())
    }
}

/// A socket the handshake and the message loops can drive: read, write, and bound how
/// long each read or write may wait.
pub trait Socket: Read + Write + AsRawFd {
    fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()>;
    fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()>;
    /// The TCP socket under it, for TCP-only options.
    fn tcp(&self) -> Option<&TcpStream>;
}

/// `Socket` for each stream type: its own timeouts, and the TCP socket under it as given.
macro_rules! sockets {
    ($($t:ty => |$s:ident| $tcp:expr;)*) => {
        $(impl Socket for $t {
            fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
                <$t>::set_read_timeout(self, d)
            }
            fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
                <$t>::set_write_timeout(self, d)
            }
            fn tcp(&self) -> Option<&TcpStream> {
                let $s = self;
                $tcp
            }
        })*
    };
}

sockets! {
    TcpStream => |s| Some(s);
    UnixStream => |_s| None;
    Stream => |s| s.as_tcp();
}

/// Mode of a server's Unix socket: anyone may connect; what a peer may do is decided
/// by who it is (SO_PEERCRED), not by the socket's mode.
pub const UNIX_SOCKET_MODE: u32 = 0o666;

/// A listening socket of either kind. A Unix socket's file is removed when the
/// listener is dropped.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Listen on `addr`. For a Unix socket, a stale socket file left by a server that
    /// is gone is replaced; one a live server answers on is not (AddrInUse). The
    /// socket file gets `UNIX_SOCKET_MODE`.
    pub fn bind(addr: &Address) -> std::io::Result<Listener> {
        match addr {
            Address::Tcp(hp) => Ok(Listener::Tcp(TcpListener::bind(hp.as_str())?)),
            Address::Unix(p) => {
                remove_stale_socket(p)?;
                let l = UnixListener::bind(p)?;
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(UNIX_SOCKET_MODE))?;
                Ok(Listener::Unix(l, p.clone()))
            }
        }
    }

    pub fn local_addr(&self) -> std::io::Result<Address> {
        match self {
            Listener::Tcp(l) => Ok(Address::from(l.local_addr()?)),
            Listener::Unix(_, p) => Ok(Address::Unix(p.clone())),
        }
    }

    /// The next connection and who made it.
    pub fn accept(&self) -> std::io::Result<(Stream, Peer)> {
        match self {
            Listener::Tcp(l) => {
                let (s, a) = l.accept()?;
                Ok((Stream::Tcp(s), Peer::Tcp(a)))
            }
            Listener::Unix(l, _) => {
                let (s, _) = l.accept()?;
                let c = peer_cred(&s)?;
                Ok((Stream::Unix(s), Peer::Unix(c)))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn remove_stale_socket(p: &Path) -> std::io::Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(p) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", p.display()),
        ));
    }
    match UnixStream::connect(p) {
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("a server is listening on {} already", p.display()),
        )),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => std::fs::remove_file(p),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_print_back() {
        for (text, want) in [
            (
                "unix:/run/zcfs/v.sock",
                Address::Unix("/run/zcfs/v.sock".into()),
            ),
            ("/run/zcfs/v.sock", Address::Unix("/run/zcfs/v.sock".into())),
            ("tcp:127.0.0.1:7070", Address::Tcp("127.0.0.1:7070".into())),
            ("127.0.0.1:7070", Address::Tcp("127.0.0.1:7070".into())),
            ("[::1]:7070", Address::Tcp("[::1]:7070".into())),
            ("server:7070", Address::Tcp("server:7070".into())),
        ] {
            let a: Address = text.parse().unwrap();
            assert_eq!(a, want, "{text}");
            assert_eq!(a.to_string().parse::<Address>().unwrap(), a, "{text}");
        }
        for bad in [
            "",
            "unix:rel.sock",
            "127.0.0.1",
            "tcp:host",
            ":7070",
            "host:99999",
        ] {
            assert!(bad.parse::<Address>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn a_unix_listener_knows_its_peer_and_replaces_only_stale_sockets() {
        let dir = std::env::temp_dir().join(format!("zcfs-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s.sock");
        let addr = Address::Unix(p.clone());
        let l = Listener::bind(&addr).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, UNIX_SOCKET_MODE);
        let mut c = Stream::connect(&addr, Duration::from_secs(1)).unwrap();
        let (mut s, peer) = l.accept().unwrap();
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        assert_eq!(
            peer,
            Peer::Unix(PeerCred {
                pid: std::process::id() as i32,
                uid,
                gid
            })
        );
        // SAFETY: getgroups with a buffer of the size given.
        let mine = unsafe {
            let mut g = vec![0 as libc::gid_t; 65_536];
            let n = libc::getgroups(g.len() as libc::c_int, g.as_mut_ptr());
            assert!(n >= 0);
            g.truncate(n as usize);
            g
        };
        let Stream::Unix(us) = &s else { unreachable!() };
        assert_eq!(peer_groups(us, std::process::id() as i32).unwrap(), mine);
        assert_eq!(proc_groups(std::process::id() as i32).unwrap(), mine);
        c.write_all(b"hi").unwrap();
        let mut b = [0u8; 2];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"hi");
        assert_eq!(
            Listener::bind(&addr).unwrap_err().kind(),
            std::io::ErrorKind::AddrInUse,
            "a live socket is not taken over"
        );
        // A stale socket (its listener gone without removing it) is replaced.
        let UnixListenerParts(path) = leak_file(l);
        assert!(path.exists());
        let l2 = Listener::bind(&addr).unwrap();
        drop(l2);
        assert!(!p.exists(), "the socket file goes with its listener");
        let _ = std::fs::remove_dir_all(&dir);
    }

    struct UnixListenerParts(PathBuf);

    /// Close a Unix listener but keep its socket file, as a crashed server would.
    fn leak_file(l: Listener) -> UnixListenerParts {
        let l = std::mem::ManuallyDrop::new(l);
        match &*l {
            Listener::Unix(u, p) => {
                // SAFETY: the listener is never dropped (ManuallyDrop), so its
                // descriptor is closed once, here.
                unsafe { libc::close(u.as_raw_fd()) };
                UnixListenerParts(p.clone())
            }
            Listener::Tcp(_) => unreachable!(),
        }
    }
}

#[cfg(test)]
mod bytes_waiting_tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn counts_what_was_sent_and_not_read() {
        let (mut a, b) = UnixStream::pair().unwrap();
        assert_eq!(bytes_waiting(&b).unwrap(), 0);
        a.write_all(&[7u8; 100]).unwrap();
        assert_eq!(bytes_waiting(&b).unwrap(), 100);
        let mut buf = [0u8; 40];
        std::io::Read::read_exact(&mut &b, &mut buf).unwrap();
        assert_eq!(bytes_waiting(&b).unwrap(), 60);
        let mut peeked = [0u8; 100];
        assert_eq!(peek_waiting(&b, &mut peeked).unwrap(), 60);
        assert_eq!(bytes_waiting(&b).unwrap(), 60, "a peek takes nothing");
        let (_a2, empty) = UnixStream::pair().unwrap();
        assert_eq!(
            peek_waiting(&empty, &mut peeked).unwrap(),
            0,
            "and never waits"
        );
    }
}
