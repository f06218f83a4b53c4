//! The authenticated channel against a peer on the path (issue 10, "a channel that can
//! be trusted"): a man-in-the-middle proxy between a real client and a real server that
//! flips a byte of a header, a body or a payload, replays, drops or reorders a message,
//! or strips the authentication; rogue servers; and peers that hold a connection
//! without finishing a message or without reading their replies. Every change must be
//! detected (the connection ended, the request not executed: the volume is checked
//! directly), never silently accepted.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zcfs_backend::{Backend, ROOT};
use zcfs_client::{Client, ClientConfig};
use zcfs_protocol::channel::{seal_request, Integrity, Mac, TAG_LEN};
use zcfs_protocol::handshake::{HELLO_LEN, PROOF_LEN, VERDICT_LEN, WELCOME_LEN};
use zcfs_protocol::{Cred, MkdirReq, Name, NodeRef, ReadReq, Request, WriteReq, REQ_HDR, RESP_HDR};
use zcfs_server::ServerConfig;

const SECRET: &[u8] = b"a-channel-test-secret";

/// What the proxy does to the messages of one direction (after the handshake) of the
/// first connection through it: it gets each message (index, bytes) and returns what
/// to forward now.
type Hook = Box<dyn FnMut(usize, Vec<u8>) -> Vec<Vec<u8>> + Send>;
/// What it does to the handshake messages of one direction (index, bytes).
type HsHook = Box<dyn FnMut(usize, &mut Vec<u8>) + Send>;

fn pass() -> Hook {
    Box::new(|_, m| vec![m])
}

fn hs_pass() -> HsHook {
    Box::new(|_, _| {})
}

/// A TCP proxy: every connection to it is relayed to `to`; the first one through the
/// hooks. The relays parse the framing (handshake, then header | body | tag | data |
/// data tag) so hooks act on whole messages.
struct Proxy {
    addr: SocketAddr,
}

/// The hooks of one connection: (client to server, server to client), each for the
/// handshake and for the messages.
struct Hooks {
    c2s_hs: HsHook,
    c2s: Hook,
    s2c_hs: HsHook,
    s2c: Hook,
}

impl Hooks {
    fn pass() -> Hooks {
        Hooks {
            c2s_hs: hs_pass(),
            c2s: pass(),
            s2c_hs: hs_pass(),
            s2c: pass(),
        }
    }
}

fn relay(
    mut from: TcpStream,
    mut to: TcpStream,
    handshake: &[usize],
    request: bool,
    full: bool,
    mut hs: HsHook,
    mut hook: Hook,
) {
    let _ = (|| -> std::io::Result<()> {
        for (i, &n) in handshake.iter().enumerate() {
            let mut m = vec![0u8; n];
            from.read_exact(&mut m)?;
            hs(i, &mut m);
            to.write_all(&m)?;
        }
        for i in 0.. {
            let mut m = vec![0u8; REQ_HDR];
            from.read_exact(&mut m)?;
            let at = |o: usize| u32::from_le_bytes(m[o..o + 4].try_into().unwrap()) as usize;
            let (body, data) = if request {
                (at(4), at(16))
            } else {
                (at(16), at(20))
            };
            let rest = body + TAG_LEN + data + if full && data > 0 { TAG_LEN } else { 0 };
            let start = m.len();
            m.resize(start + rest, 0);
            from.read_exact(&mut m[start..])?;
            for out in hook(i, m) {
                to.write_all(&out)?;
            }
        }
        Ok(())
    })();
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}

impl Proxy {
    fn start(to: SocketAddr, full: bool, first: Hooks) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let first = Mutex::new(Some(first));
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let Ok(s) = TcpStream::connect(to) else {
                    return;
                };
                let h = first.lock().unwrap().take().unwrap_or_else(Hooks::pass);
                let (c2, s2) = (c.try_clone().unwrap(), s.try_clone().unwrap());
                let (c2s_hs, c2s, s2c_hs, s2c) = (h.c2s_hs, h.c2s, h.s2c_hs, h.s2c);
                std::thread::spawn(move || {
                    relay(c, s, &[HELLO_LEN, PROOF_LEN], true, full, c2s_hs, c2s)
                });
                std::thread::spawn(move || {
                    relay(
                        s2,
                        c2,
                        &[WELCOME_LEN, VERDICT_LEN + TAG_LEN],
                        false,
                        full,
                        s2c_hs,
                        s2c,
                    )
                });
            }
        });
        Proxy { addr }
    }
}

fn server(integrity: Integrity) -> (Running, Arc<zcfs_local::LocalFs>) {
    let fs = memory_fs(64 << 20);
    let srv = Running::start(
        fs.clone(),
        ServerConfig {
            secret: Some(SECRET.to_vec()),
            integrity,
            ..config()
        },
    );
    (srv, fs)
}

fn client_to(addr: SocketAddr, integrity: Integrity) -> Client {
    let mut cfg = ClientConfig::new(&addr.to_string());
    cfg.secret = Some(SECRET.to_vec());
    cfg.connections = 1;
    cfg.timeout = Duration::from_secs(5);
    cfg.integrity = integrity;
    Client::new(cfg)
}

fn cred() -> Cred {
    Cred {
        uid: 1000,
        gid: 1000,
    }
}

fn caller() -> zcfs_client::Caller<'static> {
    zcfs_client::Caller {
        cred: cred(),
        groups: &[],
    }
}

fn mkdir(name: &str) -> Request {
    MkdirReq {
        umask: 0,
        parent: NodeRef::ino(ROOT),
        name: Name::new(name).unwrap(),
        mode: 0o755,
    }
    .into()
}

fn exists(fs: &zcfs_local::LocalFs, name: &str) -> bool {
    fs.lookup(&ctx(), ROOT, name.as_bytes()).is_ok()
}

/// Wait (bounded) until the server counted a forged message.
fn forged_counted(srv: &Running) -> u64 {
    for _ in 0..200 {
        let n = srv.report().rejected_forged;
        if n > 0 {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    0
}

/// Run `hooks` on the first connection, submit `reqs` pipelined without resends, and
/// return their results.
fn through_proxy(
    srv: &Running,
    hooks: Hooks,
    reqs: &[Request],
) -> Vec<Result<zcfs_client::Response, zcfs_backend::Error>> {
    let p = Proxy::start(srv.addr(), false, hooks);
    let c = client_to(p.addr, Integrity::Headers);
    c.connect().unwrap();
    let tickets: Vec<_> = reqs
        .iter()
        .map(|r| c.submit(r, caller(), &[]).unwrap())
        .collect();
    tickets.into_iter().map(|t| t.wait()).collect()
}

/// Send mkdir requests for `names` through a proxy that changes what the client sends
/// with `c2s`: the server must detect it, execute none of them and count a forged
/// message, and the client must get an error for each. The server and its volume, for
/// more checks.
fn forged_requests_are_refused(c2s: Hook, names: &[&str]) -> (Running, Arc<zcfs_local::LocalFs>) {
    let (srv, fs) = server(Integrity::Headers);
    let hooks = Hooks {
        c2s,
        ..Hooks::pass()
    };
    let reqs: Vec<Request> = names.iter().map(|n| mkdir(n)).collect();
    let r = through_proxy(&srv, hooks, &reqs);
    for (name, r) in names.iter().zip(&r) {
        assert!(r.is_err(), "{name}: a changed request was answered");
        assert!(!exists(&fs, name), "{name}: a changed request was executed");
    }
    assert!(forged_counted(&srv) >= 1, "no forged message counted");
    (srv, fs)
}

#[test]
fn a_flipped_header_byte_is_detected_and_not_executed() {
    let c2s: Hook = Box::new(|_, mut m| {
        m[20] ^= 1; // the caller's uid
        vec![m]
    });
    forged_requests_are_refused(c2s, &["hdr"]);
}

#[test]
fn a_flipped_body_byte_is_detected_and_not_executed() {
    let c2s: Hook = Box::new(|_, mut m| {
        // The last byte of the body: the last letter of the name.
        let body = u32::from_le_bytes(m[4..8].try_into().unwrap()) as usize;
        m[REQ_HDR + body - 1 - 4] ^= 0x01;
        vec![m]
    });
    let (_srv, fs) = forged_requests_are_refused(c2s, &["bodyA"]);
    assert!(!exists(&fs, "body@"), "the changed name was created");
}

#[test]
fn a_replayed_message_is_detected() {
    let (srv, fs) = server(Integrity::Headers);
    let hooks = Hooks {
        c2s: Box::new(|i, m| if i == 0 { vec![m.clone(), m] } else { vec![m] }),
        ..Hooks::pass()
    };
    let r = through_proxy(&srv, hooks, &[mkdir("once")]);
    // The original is executed (and may or may not be answered before the replay
    // ends the connection); the replay is refused.
    let _ = r;
    assert!(exists(&fs, "once"));
    assert!(forged_counted(&srv) >= 1, "a replayed message was accepted");
}

#[test]
fn a_dropped_message_is_detected_and_the_next_not_executed() {
    let c2s: Hook = Box::new(|i, m| if i == 0 { vec![] } else { vec![m] });
    forged_requests_are_refused(c2s, &["dropped", "after"]);
}

#[test]
fn reordered_messages_are_detected_and_not_executed() {
    let held = Arc::new(Mutex::new(None));
    let c2s: Hook = Box::new(move |i, m| match i {
        0 => {
            *held.lock().unwrap() = Some(m);
            vec![]
        }
        1 => vec![m, held.lock().unwrap().take().unwrap()],
        _ => vec![m],
    });
    forged_requests_are_refused(c2s, &["first", "second"]);
}

/// A reply changed on its way back is refused by the client (EIO), not handed out.
#[test]
fn a_flipped_reply_is_refused_by_the_client() {
    let (srv, _fs) = server(Integrity::Headers);
    let hooks = Hooks {
        s2c: Box::new(|_, mut m| {
            m[RESP_HDR + 9] ^= 1; // a byte of the attributes
            vec![m]
        }),
        ..Hooks::pass()
    };
    let r = through_proxy(&srv, hooks, &[mkdir("reply")]);
    assert_eq!(r[0].as_ref().unwrap_err().errno, libc::EIO);
}

/// The Welcome's auth flag cleared on the way: a client with a secret refuses and
/// sends no request.
#[test]
fn stripping_the_auth_exchange_is_refused() {
    let (srv, fs) = server(Integrity::Headers);
    let requests = Arc::new(AtomicUsize::new(0));
    let r2 = requests.clone();
    let hooks = Hooks {
        s2c_hs: Box::new(|i, m| {
            if i == 0 {
                m[10] = 0; // auth = 0
                m[56..88].fill(0); // and no proof
                m[104] = 1; // and a session serial, as a Welcome without auth has
            }
        }),
        c2s: Box::new(move |_, m| {
            r2.fetch_add(1, Ordering::SeqCst);
            vec![m]
        }),
        ..Hooks::pass()
    };
    let p = Proxy::start(srv.addr(), false, hooks);
    let c = client_to(p.addr, Integrity::Headers);
    let e = c.call(&mkdir("stripped"), caller(), &[]).unwrap_err();
    assert_eq!(e.errno, libc::EACCES, "{e}");
    assert!(e.to_string().contains("did not authenticate"), "{e}");
    assert_eq!(requests.load(Ordering::SeqCst), 0);
    assert!(!exists(&fs, "stripped"));
    // Clearing the full-integrity bit a client asked for changes the transcript the
    // proofs cover: refused too.
    let (srv, _fs) = server(Integrity::Full);
    let hooks = Hooks {
        s2c_hs: Box::new(|i, m| {
            if i == 0 {
                m[16] = 0;
            }
        }),
        ..Hooks::pass()
    };
    let p = Proxy::start(srv.addr(), true, hooks);
    let c = client_to(p.addr, Integrity::Headers);
    let e = c.call(&mkdir("downgraded"), caller(), &[]).unwrap_err();
    assert_eq!(e.errno, libc::EACCES, "{e}");
}

/// A rogue server (knows nothing of the secret): one that skips authentication and one
/// that sends a made-up proof. A client with the secret refuses both and sends them
/// nothing after its Hello.
#[test]
fn a_rogue_server_is_refused_before_any_request() {
    for auth in [false, true] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let rogue = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut h = [0u8; HELLO_LEN];
            s.read_exact(&mut h).unwrap();
            let w = zcfs_protocol::handshake::Welcome {
                version: zcfs_protocol::VERSION as u16,
                features: 0,
                auth,
                resumed: false,
                nonce: [3; 32],
                proof: [4; 32],
                max_inflight: 8,
                max_data: 1 << 20,
                instance: 1,
                session_serial: if auth { 0 } else { 1 },
            };
            s.write_all(&w.encode()).unwrap();
            // Everything the client sends afterwards.
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            rest
        });
        let c = client_to(addr, Integrity::Headers);
        let e = c.call(&mkdir("x"), caller(), &[]).unwrap_err();
        assert_eq!(e.errno, libc::EACCES, "{e}");
        drop(c);
        assert!(
            rogue.join().unwrap().is_empty(),
            "the client sent something to a rogue server (auth {auth})"
        );
    }
}

/// `--integrity full`: a payload byte flipped on a write leaves the file unchanged;
/// one flipped on a read gives the caller EIO, not wrong data. In the default mode the
/// same flips are not detected (the payload is not MACed: docs/security.md).
#[test]
fn full_integrity_catches_a_flipped_payload_both_ways() {
    let (srv, fs) = server(Integrity::Full);
    let (a, _) = fs.create(&ctx(), ROOT, b"f", 0o644, libc::O_RDWR).unwrap();
    fs.write(&ctx(), a.ino, 0, 0, &[b'A'; 8192]).unwrap();
    let free = fs.statfs().unwrap().bfree;
    let write: Request = WriteReq {
        node: NodeRef::ino(a.ino),
        fh: 0,
        offset: 0,
        size: 8192,
        commit: false,
    }
    .into();
    let hooks = Hooks {
        c2s: Box::new(|_, mut m| {
            let n = m.len();
            m[n - TAG_LEN - 100] ^= 1; // inside the payload
            vec![m]
        }),
        ..Hooks::pass()
    };
    let p = Proxy::start(srv.addr(), true, hooks);
    let c = client_to(p.addr, Integrity::Full);
    c.connect().unwrap();
    let r = c.submit(&write, caller(), &[&[b'B'; 8192]]).unwrap().wait();
    assert!(r.is_err(), "a write with a changed payload was answered");
    let mut got = Vec::new();
    fs.read(a.ino, 0, 0, 8192, &mut |s: &[&[u8]]| {
        s.iter().for_each(|x| got.extend_from_slice(x));
        Ok(())
    })
    .unwrap();
    assert!(got == vec![b'A'; 8192], "a changed payload was committed");
    assert!(forged_counted(&srv) >= 1);
    assert_eq!(fs.statfs().unwrap().bfree, free, "its reservation released");
    // A read's payload changed on the way back.
    let read: Request = ReadReq {
        node: NodeRef::ino(a.ino),
        fh: 0,
        offset: 0,
        size: 8192,
    }
    .into();
    let hooks = Hooks {
        s2c: Box::new(|_, mut m| {
            m[RESP_HDR + TAG_LEN + 10] ^= 1;
            vec![m]
        }),
        ..Hooks::pass()
    };
    let p = Proxy::start(srv.addr(), true, hooks);
    let c = client_to(p.addr, Integrity::Full);
    c.connect().unwrap();
    let e = c.submit(&read, caller(), &[]).unwrap().wait().unwrap_err();
    assert_eq!(e.errno, libc::EIO, "{e}");
    // The same path without tampering works (and full mode is what was negotiated).
    let c = client_to(srv.addr(), Integrity::Full);
    let r = c.call(&read, caller(), &[]).unwrap();
    assert!(r.data == vec![b'A'; 8192]);
    // A client that requires full integrity refuses a server that does not offer it.
    let (plain, _) = server(Integrity::Headers);
    let e = client_to(plain.addr(), Integrity::Full)
        .connect()
        .unwrap_err();
    assert!(e.to_string().contains("integrity full"), "{e}");
}

/// An authenticated raw connection: socket and the channel's MACs.
fn raw_auth(addr: SocketAddr) -> (TcpStream, Mac, Mac) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let e =
        zcfs_transport::client_handshake(&mut s, Some(SECRET), 4242, Integrity::Headers).unwrap();
    let (tx, rx) = e.channel.unwrap();
    (s, tx, rx)
}

/// Peers that begin a message and never finish it (a trickled body), or never read
/// their replies (a stalled reader), or trickle hellos: each is dropped at its own
/// deadline, and a well-behaved client keeps getting answers meanwhile, within its
/// (short) timeout. A peer dropped in the middle of a write gives its reservation back.
#[test]
fn slow_and_stalled_peers_delay_no_one() {
    let fs = memory_fs(64 << 20);
    let patience = Duration::from_millis(800);
    let srv = Running::start(
        fs.clone(),
        ServerConfig {
            secret: Some(SECRET.to_vec()),
            peer_timeout: patience,
            handshake_timeout: Duration::from_secs(2),
            ..config()
        },
    );
    let good = client_to(srv.addr(), Integrity::Headers);
    let mut good_cfg = good.config().clone();
    good_cfg.timeout = Duration::from_secs(2);
    let good = Client::new(good_cfg);
    good.connect().unwrap();
    let (a, _) = fs
        .create(&ctx(), ROOT, b"big", 0o644, libc::O_RDWR)
        .unwrap();
    fs.write(&ctx(), a.ino, 0, 0, &vec![7u8; 4 << 20]).unwrap();
    let free = fs.statfs().unwrap().bfree;
    // A trickled body: header and tag, then the body a byte at a time.
    let (mut slow, mut tx, _) = raw_auth(srv.addr());
    let m = seal_request(&mut tx, &mkdir("trickled"), 1, cred(), &[]);
    slow.write_all(&m[..REQ_HDR]).unwrap();
    // A write dropped half way: its reservation must come back.
    let (mut half, mut tx2, _) = raw_auth(srv.addr());
    let w: Request = WriteReq {
        node: NodeRef::ino(a.ino),
        fh: 0,
        offset: 8 << 20,
        size: 1 << 20,
        commit: false,
    }
    .into();
    let m2 = seal_request(&mut tx2, &w, 1, cred(), &vec![1u8; 1 << 20]);
    half.write_all(&m2[..m2.len() / 2]).unwrap();
    // A stalled reader: reads of 4 MiB pipelined, never read.
    let (mut stalled, mut tx3, _) = raw_auth(srv.addr());
    for id in 1..=8 {
        let r: Request = ReadReq {
            node: NodeRef::ino(a.ino),
            fh: 0,
            offset: 0,
            size: 4 << 20,
        }
        .into();
        stalled
            .write_all(&seal_request(&mut tx3, &r, id, cred(), &[]))
            .unwrap();
    }
    // Slow hellos: a byte at a time from many sockets (most refused at accept by the
    // bounds on connections in the handshake; the rest dropped at its deadline).
    let hellos: Vec<TcpStream> = (0..64)
        .filter_map(|_| TcpStream::connect(srv.addr()).ok())
        .collect();
    // Meanwhile: the well-behaved client, one call every 100 ms for 3 s (over three
    // peer timeouts), each answered within its 2 s timeout.
    for i in 0..30 {
        let _ = hellos.get(i).map(|mut s| s.write(b"Z"));
        if i < m.len() - REQ_HDR {
            let _ = slow.write_all(&m[REQ_HDR + i..REQ_HDR + i + 1]);
        }
        good.call(&mkdir(&format!("good{i}")), caller(), &[])
            .unwrap_or_else(|e| panic!("call {i} of a well-behaved client failed: {e}"));
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(half);
    let r = srv.report();
    assert!(
        r.dropped_stalled >= 2,
        "the trickler and the stalled reader were not dropped: {r:?}"
    );
    assert!(!exists(&fs, "trickled"));
    for _ in 0..100 {
        if fs.statfs().unwrap().bfree == free {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        fs.statfs().unwrap().bfree,
        free,
        "a dropped write kept its blocks"
    );
    drop(hellos);
}

/// Payloads that take many receives (8 MiB writes and reads) pass in both modes: the
/// payload tag is computed over the destination blocks as filled, not over the
/// scatter list the receive loop advances in place (the bug this caught).
#[test]
fn large_payloads_pass_in_both_modes() {
    for integrity in [Integrity::Headers, Integrity::Full] {
        let (srv, _fs) = server(integrity);
        let fs = srv.client_with(|c| {
            c.secret = Some(SECRET.to_vec());
            c.integrity = integrity;
        });
        let (a, fh) = file(&fs, b"bench");
        let chunk = vec![0x3cu8; 8 << 20];
        for i in 0..4u64 {
            fs.write(&ctx(), a.ino, fh, i * (8 << 20), &chunk)
                .unwrap_or_else(|e| panic!("{integrity} {i}: {e} {:?}", srv.report()));
        }
        let mut got = Vec::new();
        fs.read(a.ino, fh, 8 << 20, 8 << 20, &mut |s: &[&[u8]]| {
            s.iter().for_each(|x| got.extend_from_slice(x));
            Ok(())
        })
        .unwrap();
        assert!(got == chunk, "{integrity}");
        assert_eq!(srv.report().rejected_forged, 0);
    }
}
