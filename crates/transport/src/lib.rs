//! TCP transport for zcfs: exact vectored reads and writes (so headers, bodies and bulk
//! data move without being joined into one buffer), the handshake on both sides, and
//! socket options. Other transports (AF_XDP) will sit beside this one.

use rand::RngCore;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::TcpStream;
use std::time::Duration;
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
    #[error("the peer closed the connection")]
    Closed,
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
pub fn recv_into_vec(s: &TcpStream, buf: &mut Vec<u8>, n: usize) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
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

/// Low latency for small messages, keepalive to notice dead peers.
pub fn tune(s: &TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let fd = std::os::unix::io::AsRawFd::as_raw_fd(s);
    // Keepalive after 10 s idle, probes every 5 s, 3 misses: a dead peer shows in ~25 s.
    let opts: [(i32, i32, libc::c_int); 4] = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 10),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 5),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
    ];
    for (level, name, value) in opts {
        // SAFETY: setting an int socket option on our own socket; the pointer and
        // length describe `value`.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                &value as *const _ as *const libc::c_void,
                4,
            );
        }
    }
    Ok(())
}

fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut n);
    n
}

/// Client side of the handshake. Returns the server's welcome (limits, instance).
pub fn client_handshake(s: &mut TcpStream, secret: Option<&[u8]>) -> Result<Welcome> {
    let cn = nonce();
    s.write_all(
        &Hello {
            version: VERSION,
            features: FEATURES,
            nonce: cn,
        }
        .encode(),
    )?;
    let mut wb = [0u8; WELCOME_LEN];
    s.read_exact(&mut wb).map_err(eof_closed)?;
    let w = Welcome::decode(&wb)?;
    if !w.auth {
        return Ok(w);
    }
    let secret = secret.ok_or(TransportError::SecretRequired)?;
    // The server proves itself first: we never answer a server that does not know
    // the secret.
    verify_server(secret, &cn, &w.nonce, &w.proof).map_err(|_| TransportError::AuthFailed)?;
    s.write_all(&client_proof(secret, &w.nonce, &cn))?;
    let mut v = [0u8; VERDICT_LEN];
    s.read_exact(&mut v).map_err(eof_closed)?;
    if u64::from_le_bytes(v) != 0 {
        return Err(TransportError::AuthFailed);
    }
    Ok(w)
}

/// Server side of the handshake, with a deadline so a silent peer cannot hold a slot.
pub fn server_handshake(
    s: &mut TcpStream,
    secret: Option<&[u8]>,
    max_inflight: u32,
    instance: u64,
) -> Result<Hello> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut hb = [0u8; HELLO_LEN];
    s.read_exact(&mut hb).map_err(eof_closed)?;
    let h = Hello::decode(&hb)?;
    let sn = nonce();
    let w = Welcome {
        version: VERSION,
        features: h.features & FEATURES,
        auth: secret.is_some(),
        nonce: sn,
        proof: secret
            .map(|k| server_proof(k, &h.nonce, &sn))
            .unwrap_or([0; 32]),
        max_inflight,
        max_data: MAX_DATA as u32,
        instance,
    };
    s.write_all(&w.encode())?;
    if let Some(k) = secret {
        let mut p = [0u8; PROOF_LEN];
        s.read_exact(&mut p).map_err(eof_closed)?;
        let ok = verify_client(k, &sn, &h.nonce, &p).is_ok();
        s.write_all(&(if ok { 0u64 } else { libc::EACCES as u64 }).to_le_bytes())?;
        if !ok {
            return Err(TransportError::AuthFailed);
        }
    }
    s.set_read_timeout(None)?;
    Ok(h)
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
            server_handshake(&mut s, server_secret, 32, 99)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let w = client_handshake(&mut c, client_secret);
        drop(c);
        (t.join().unwrap(), w)
    }

    #[test]
    fn handshake_with_and_without_secret() {
        let (s, c) = pair(None, None);
        assert!(s.is_ok());
        assert_eq!(c.unwrap().instance, 99);
        let (s, c) = pair(Some(b"k"), Some(b"k"));
        assert!(s.is_ok() && c.is_ok());
        let (_, c) = pair(Some(b"k"), Some(b"wrong"));
        assert!(
            matches!(c, Err(TransportError::AuthFailed)),
            "client must reject a server with another secret"
        );
        let (_, c) = pair(Some(b"k"), None);
        assert!(matches!(c, Err(TransportError::SecretRequired)));
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
