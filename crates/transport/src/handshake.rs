//! The handshake on both sides of a connection: Hello, Welcome, proofs and Verdict (see
//! docs/protocol.md), the server's side under one deadline.

use crate::{timed_out, Result, Socket, TransportError};
use rand::RngCore;
use std::io::ErrorKind;
use std::time::{Duration, Instant};
use zcfs_protocol::channel::{derive_keys, Integrity, Mac, TAG_LEN};
use zcfs_protocol::handshake::*;
use zcfs_protocol::{MAX_DATA, VERSION};

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
                ErrorKind::TimedOut,
                "the handshake was not finished within its deadline",
            ));
        }
        Ok(left)
    }

    /// Move `len` bytes by calls of `step(done, time left)`, each bounded by the time
    /// left; a call that moves nothing is the error `none`.
    fn exact(
        &self,
        len: usize,
        none: ErrorKind,
        mut step: impl FnMut(usize, Duration) -> std::io::Result<usize>,
    ) -> std::io::Result<()> {
        let mut done = 0;
        while done < len {
            match step(done, self.left()?) {
                Ok(0) => return Err(none.into()),
                Ok(n) => done += n,
                // Timed out (or woken early): `left` decides on the next round.
                Err(e) if e.kind() == ErrorKind::Interrupted || timed_out(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn read_exact(&self, s: &mut impl Socket, buf: &mut [u8]) -> std::io::Result<()> {
        self.exact(buf.len(), ErrorKind::UnexpectedEof, |done, left| {
            s.set_read_timeout(Some(left))?;
            s.read(&mut buf[done..])
        })
    }

    fn write_all(&self, s: &mut impl Socket, buf: &[u8]) -> std::io::Result<()> {
        self.exact(buf.len(), ErrorKind::WriteZero, |done, left| {
            s.set_write_timeout(Some(left))?;
            s.write(&buf[done..])
        })
    }
}

/// The channel's mode: Full when the handshake settled on it (the server offers it).
fn agreed_mode(full: bool) -> Integrity {
    if full {
        Integrity::Full
    } else {
        Integrity::Headers
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
    client_handshake_by(s, secret, session, lane, integrity, None)
}

/// `client_handshake_on_lane` finished within `timeout` as a whole (every read and
/// write gets the time left; the socket's timeouts are left as the last one set them):
/// an attempt with little patience (a client's short attempt after a stall) cannot
/// take a multiple of it over several messages.
pub fn client_handshake_within(
    s: &mut impl Socket,
    secret: Option<&[u8]>,
    session: u64,
    lane: Lane,
    integrity: Integrity,
    timeout: Duration,
) -> Result<Established> {
    client_handshake_by(
        s,
        secret,
        session,
        lane,
        integrity,
        Some(Deadline::after(timeout)),
    )
}

/// `buf` from `s`, within the deadline if there is one (else the socket's timeouts).
fn receive_exact(
    s: &mut impl Socket,
    buf: &mut [u8],
    deadline: Option<&Deadline>,
) -> std::io::Result<()> {
    match deadline {
        Some(d) => d.read_exact(s, buf),
        None => s.read_exact(buf),
    }
}

/// `buf` to `s`, within the deadline if there is one (else the socket's timeouts).
fn send(s: &mut impl Socket, buf: &[u8], deadline: Option<&Deadline>) -> std::io::Result<()> {
    match deadline {
        Some(d) => d.write_all(s, buf),
        None => s.write_all(buf),
    }
}

fn client_handshake_by(
    s: &mut impl Socket,
    secret: Option<&[u8]>,
    session: u64,
    lane: Lane,
    integrity: Integrity,
    deadline: Option<Deadline>,
) -> Result<Established> {
    let d = deadline.as_ref();
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
    send(s, &hello, d)?;
    let mut wb = [0u8; WELCOME_LEN];
    receive_exact(s, &mut wb, d).map_err(eof_closed)?;
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
    let transcript = Transcript::new(secret, &hello, &wb);
    transcript
        .verify_server()
        .map_err(|_| TransportError::AuthFailed)?;
    let full = w.features & FEATURE_INTEGRITY_FULL != 0;
    if integrity == Integrity::Full && !full {
        return Err(TransportError::IntegrityRefused);
    }
    send(s, &transcript.client_proof(), d)?;
    let mut vb = [0u8; VERDICT_LEN];
    receive_exact(s, &mut vb, d).map_err(eof_closed)?;
    let v = Verdict::decode(&vb)?;
    if v.status != 0 {
        return Err(TransportError::AuthFailed);
    }
    let keys = derive_keys(secret, &hello, &wb);
    let (send, mut receive) = Mac::pair(&keys, agreed_mode(full), true);
    // An accepted Verdict is the server's first authenticated message: what it says
    // of the session (resumed or not) decides whether the client revalidates, so a
    // flipped bit on the path must not go unnoticed.
    let mut tag = [0u8; TAG_LEN];
    receive_exact(s, &mut tag, d).map_err(eof_closed)?;
    receive
        .begin(&vb, &[])
        .verify(&tag)
        .map_err(|_| TransportError::AuthFailed)?;
    w.resumed = v.resumed;
    w.session_serial = v.session_serial;
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

/// What `server_handshake`'s `attach` says of the session a connection joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Joined {
    /// The session was there before this connection (its handles are intact).
    pub resumed: bool,
    /// The session's serial, not 0: a new one each time the session is started
    /// (`Welcome::session_serial`).
    pub serial: u64,
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
    attach: &mut dyn FnMut(&Hello) -> Result<Joined>,
) -> Result<Accepted> {
    let deadline = Deadline::after(timeout);
    let mut hb = [0u8; HELLO_LEN];
    deadline.read_exact(s, &mut hb).map_err(eof_closed)?;
    let h = Hello::decode(&hb)?;
    let sn = nonce();
    // With a secret, nothing of the session before the proof (the Verdict says it).
    let joined = match secret {
        None => attach(&h)?,
        Some(_) => Joined {
            resumed: false,
            serial: 0,
        },
    };
    let full = secret.is_some() && integrity == Integrity::Full;
    let mut w = Welcome {
        version: VERSION as u16,
        features: if full { FEATURE_INTEGRITY_FULL } else { 0 },
        auth: secret.is_some(),
        resumed: joined.resumed,
        nonce: sn,
        proof: [0; 32],
        max_inflight,
        max_data: MAX_DATA as u32,
        instance,
        session_serial: joined.serial,
    };
    if let Some(k) = secret {
        let welcome = w.encode();
        w.proof = Transcript::new(k, &hb, &welcome).server_proof();
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
    if Transcript::new(k, &hb, &wb).verify_client(&p).is_err() {
        // Best effort: the peer is dropped either way.
        let _ = deadline.write_all(s, &Verdict::refused(libc::EACCES).encode());
        return Err(TransportError::AuthFailed);
    }
    let joined = attach(&h)?;
    let keys = derive_keys(k, &hb, &wb);
    let (mut send, receive) = Mac::pair(&keys, agreed_mode(full), false);
    // The accepted Verdict goes out with a tag (the first message of this direction).
    let verdict = Verdict::accepted(joined.resumed, joined.serial).encode();
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
    if e.kind() == ErrorKind::UnexpectedEof {
        TransportError::Closed
    } else {
        TransportError::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::served;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    fn pair(
        server_secret: Option<&'static [u8]>,
        client_secret: Option<&'static [u8]>,
    ) -> (Result<Hello>, Result<Welcome>) {
        let (mut c, t) = served(move |mut s| {
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
                    Ok(Joined {
                        resumed: h.session == 42,
                        serial: 1,
                    })
                },
            )
            .map(|a| a.hello);
            (r, attached)
        });
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
        let (mut c, t) = served(|mut s| {
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
                    Ok(Joined {
                        resumed: true,
                        serial: 1,
                    })
                },
            );
            (r, attached)
        });
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
                    &mut |_| {
                        Ok(Joined {
                            resumed: false,
                            serial: 1,
                        })
                    },
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
}
