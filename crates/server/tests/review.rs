//! Adversarial review of protocol v2 and the server/client rework (issue 8). Each test
//! shows one defect: it asserts the behaviour the protocol and design promise and fails
//! on the reviewed code.

#[macro_use]
mod common;
use common::*;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zcfs_backend::*;
use zcfs_client::{ClientConfig, RemoteFs};
use zcfs_protocol::handshake::{HELLO_LEN, WELCOME_LEN};
use zcfs_protocol::Wire;
use zcfs_protocol::{Cred, NodeRef, Op, ReqHeader, Request, RespHeader, WriteReq, MAX_DATA};
use zcfs_server::ServerConfig;

const MIB: usize = 1 << 20;

fn remote(addr: SocketAddr, tweak: impl FnOnce(&mut ClientConfig)) -> RemoteFs {
    let mut cfg = ClientConfig::new(&addr.to_string());
    cfg.timeout = Duration::from_secs(5);
    tweak(&mut cfg);
    RemoteFs::connect(cfg).unwrap()
}

/// Where a `Proxy` cuts the link (once): both sockets are shut, nothing more forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    None,
    /// When the client sends a request with this operation (the server never sees it).
    BeforeRequest(Op),
    /// When the server's reply to this operation comes (the client never sees it).
    BeforeReply(Op),
}

/// A TCP proxy between client and server that understands framing, so a test can lose
/// exactly one message with its connection, as a network failure would.
struct Proxy {
    addr: SocketAddr,
    cut: Arc<Mutex<Cut>>,
    fired: Arc<AtomicBool>,
}

impl Proxy {
    fn start(server: SocketAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let cut = Arc::new(Mutex::new(Cut::None));
        let fired = Arc::new(AtomicBool::new(false));
        let (cut2, fired2) = (cut.clone(), fired.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let Ok(s) = TcpStream::connect(server) else {
                    return;
                };
                let _ = c.set_nodelay(true);
                let _ = s.set_nodelay(true);
                for up in [true, false] {
                    let (from, to) = if up {
                        (c.try_clone().unwrap(), s.try_clone().unwrap())
                    } else {
                        (s.try_clone().unwrap(), c.try_clone().unwrap())
                    };
                    let (cut, fired) = (cut2.clone(), fired2.clone());
                    std::thread::spawn(move || pump(from, to, up, cut, fired));
                }
            }
        });
        Proxy { addr, cut, fired }
    }

    fn cut(&self, c: Cut) {
        self.fired.store(false, Ordering::SeqCst);
        *self.cut.lock().unwrap() = c;
    }
}

fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    up: bool,
    cut: Arc<Mutex<Cut>>,
    fired: Arc<AtomicBool>,
) {
    let close = |a: &TcpStream, b: &TcpStream| {
        let _ = a.shutdown(Shutdown::Both);
        let _ = b.shutdown(Shutdown::Both);
    };
    let mut first = vec![0u8; if up { HELLO_LEN } else { WELCOME_LEN }];
    if from.read_exact(&mut first).is_err() || to.write_all(&first).is_err() {
        return close(&from, &to);
    }
    loop {
        let mut hb = [0u8; 32];
        if from.read_exact(&mut hb).is_err() {
            return close(&from, &to);
        }
        let (op, rest) = if up {
            let h = ReqHeader::decode(&hb).unwrap();
            (h.op, h.body_len as usize + h.data_len as usize)
        } else {
            let h = RespHeader::decode(&hb).unwrap();
            (h.op, h.body_len as usize + h.data_len as usize)
        };
        let mut msg = vec![0u8; rest];
        if from.read_exact(&mut msg).is_err() {
            return close(&from, &to);
        }
        let want = if up {
            Cut::BeforeRequest(op)
        } else {
            Cut::BeforeReply(op)
        };
        if *cut.lock().unwrap() == want && !fired.swap(true, Ordering::SeqCst) {
            *cut.lock().unwrap() = Cut::None;
            return close(&from, &to);
        }
        if to.write_all(&hb).is_err() || to.write_all(&msg).is_err() {
            return close(&from, &to);
        }
    }
}

/// Finding 1. Two listings of one directory at once, or a listing and the kernel's
/// FORGET of one of its entries (fuser runs them on different threads): RemoteFs'
/// readdirplus counts the server's references for the whole batch first and the
/// caller's one entry at a time, so a forget in between drops the node (and sends the
/// listing's own reference back to the server); the listing then panics on
/// `expect("present")` with the metadata lock held, poisoning it for every later call.
#[test]
fn readdirplus_survives_a_forget_of_an_entry_during_the_listing() {
    let srv = Running::start(memory_fs(64 * MIB), config());
    let fs = srv.client();
    let c = ctx();
    let d = fs.mkdir(&c, ROOT, b"d", 0o755).unwrap();
    empty_files(&fs, d.ino, "e", 8);
    // The last entry of the listing; our caller holds one reference to it.
    let mut order = Vec::new();
    fs.readdir(d.ino, 0, false, &mut |e| {
        order.push(e.name);
        true
    })
    .unwrap();
    let last = order.last().unwrap().clone();
    let x = fs.lookup(&c, d.ino, &last).unwrap().ino;
    assert_eq!(fs.references(x), (1, 1));
    let mut seen = Vec::new();
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
        fs.readdir(d.ino, 0, true, &mut |e| {
            if seen.is_empty() {
                // The caller's last reference to x goes back while the listing runs.
                fs.forget(x, 1);
            }
            seen.push(e.ino);
            true
        })
    }));
    assert!(r.is_ok(), "readdirplus panicked");
    assert!(r.unwrap().is_ok());
    assert!(seen.contains(&x));
    // The listing handed x to the caller: one reference each side, and the server still
    // holds one for x once the caller gave every other entry back.
    assert_eq!(fs.references(x), (1, 1));
    for &i in seen.iter().filter(|&&i| i != x) {
        fs.forget(i, 1);
    }
    // (and d's, from the mkdir: given back too, so that x's is the only one left)
    fs.forget(d.ino, 1);
    eventually(
        Duration::from_secs(5),
        "the server holds x's reference",
        || srv.report().references_held == 1,
    );
}

/// A Backend that passes everything on, except that a full-size write at offset 0 is
/// short (half written): the Backend contract and the protocol allow it (`written`),
/// and the volume does it when a later piece of an in-memory overwrite finds no room.
/// With `.1`, a lookup of that name panics (a backend bug).
struct ShortFirstWrite {
    inner: Arc<dyn Backend>,
    panic_on: Option<&'static [u8]>,
}

impl Backend for ShortFirstWrite {
    pass_on_the_rest!();
    pass_on! {
        statfs() -> Result<StatFs>;
    }
    fn lookup(&self, c: &Ctx, p: u64, n: &[u8]) -> Result<Attr> {
        if self.panic_on == Some(n) {
            panic!("backend bug on lookup of {:?}", String::from_utf8_lossy(n));
        }
        self.inner.lookup(c, p, n)
    }
    fn write_with(
        &self,
        c: &Ctx,
        i: u64,
        fh: u64,
        o: u64,
        payload: &mut dyn WritePayload,
    ) -> Result<u32> {
        let len = payload.remaining();
        let take = if o == 0 && len == MAX_DATA {
            len / 2
        } else {
            len
        };
        self.inner.write_with(
            c,
            i,
            fh,
            o,
            &mut Prefix {
                inner: payload,
                left: take,
            },
        )
    }
}

/// Finding 2. RemoteFs::write splits a buffer into 16 MiB requests and, after a short
/// reply, sends the *next chunk of the buffer* at `offset + done`: the bytes after the
/// short write land at the wrong offset, and the count returned covers them as if they
/// were the right ones.
#[test]
fn a_short_chunk_does_not_shift_the_rest_of_a_large_remote_write() {
    let srv = Running::start(
        Arc::new(ShortFirstWrite {
            inner: memory_fs(96 * MIB),
            panic_on: None,
        }),
        config(),
    );
    let fs = srv.client();
    let (f, fh) = file(&fs, b"big");
    let data: Vec<u8> = (0..2 * MAX_DATA as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let n = fs.write(&ctx(), f.ino, fh, 0, &data).unwrap() as usize;
    assert!(n > 0 && n <= data.len());
    // Whatever was reported written must be the caller's bytes, at their offsets.
    let mut at = 0;
    while at < n {
        let len = (n - at).min(8 * MIB);
        let got = read_all(&fs, f.ino, fh, at as u64, len as u32).unwrap();
        if let Some(i) = (0..len).find(|&i| got[i] != data[at + i]) {
            panic!(
                "write reported {n} bytes written, but byte {} differs (reply for the first \
                 chunk was short: the second chunk went to the wrong offset)",
                at + i
            );
        }
        at += len;
    }
    fs.release(f.ino, fh).unwrap();
}

/// A server, a client of it through a `Proxy`, and a file "f" with a MiB of data that
/// the client created and holds open (the handle).
fn through_proxy_with_a_big_file() -> (Running, Proxy, RemoteFs, Attr, u64) {
    let srv = Running::start(memory_fs(64 * MIB), config());
    let proxy = Proxy::start(srv.addr());
    let fs = remote(proxy.addr, |_| {});
    let (f, fh) = file(&fs, b"f");
    fs.write(&ctx(), f.ino, fh, 0, &vec![0x55; MIB]).unwrap();
    (srv, proxy, fs, f, fh)
}

/// `eventually` (5 s), with a call through `fs` (a statfs) before each check.
fn eventually_while_calling(fs: &RemoteFs, what: &str, f: impl Fn() -> bool) {
    eventually(Duration::from_secs(5), what, || {
        fs.statfs().unwrap();
        f()
    });
}

/// Finding 3. Release is not idempotent, so the client does not resend it after a lost
/// connection; it has already dropped the handle from its table, and the session (still
/// alive: the client reconnects and resumes it) keeps the server's handle for as long as
/// the client lives. An unlinked file released that way is never freed while the mount
/// stands. (Forget, posted and never resent, loses references the same way.)
#[test]
fn a_release_lost_with_its_connection_does_not_leak_the_handle() {
    let (srv, proxy, fs, f, fh) = through_proxy_with_a_big_file();
    fs.unlink(&ctx(), ROOT, b"f").unwrap();
    fs.forget(f.ino, 1);
    let held = fs.statfs().unwrap().bfree;
    proxy.cut(Cut::BeforeRequest(Op::Release));
    let r = fs.release(f.ino, fh);
    assert!(proxy.fired.load(Ordering::SeqCst));
    eprintln!("release: {r:?}");
    // The client goes on (reconnects, resumes its session) and holds nothing of f.
    assert_eq!(fs.references(f.ino), (0, 0));
    eventually_while_calling(&fs, "the session released f's handle", || {
        srv.report().handles_open == 0
    });
    assert!(fs.statfs().unwrap().bfree >= held + (MIB / 4096) as u64);
}

/// Finding 3, the same for a forget: posted once, never resent; the resumed session
/// keeps the reference, and an unlinked file is not freed while the client lives.
#[test]
fn a_forget_lost_with_its_connection_does_not_leak_the_reference() {
    let (srv, proxy, fs, f, fh) = through_proxy_with_a_big_file();
    fs.release(f.ino, fh).unwrap();
    fs.unlink(&ctx(), ROOT, b"f").unwrap();
    proxy.cut(Cut::BeforeRequest(Op::Forget));
    fs.forget(f.ino, 1);
    eventually(Duration::from_secs(5), "the forget went out", || {
        proxy.fired.load(Ordering::SeqCst)
    });
    assert_eq!(fs.references(f.ino), (0, 0));
    eventually_while_calling(&fs, "the session gave f's reference back", || {
        srv.report().references_held == 0
    });
}

/// Finding 4. A create (or mkdir, mknod, symlink, link; or an open/lookup whose retry
/// doubles it) whose reply is lost with its connection: the server registered a handle
/// and a reference in the session, the client reports the call failed and never learns
/// of them. The session is resumed on reconnection, so they stay for the client's life:
/// the file, unlinked later, is never freed while the mount stands.
#[test]
fn a_create_whose_reply_is_lost_leaves_nothing_held_in_the_session() {
    let srv = Running::start(memory_fs(64 * MIB), config());
    let proxy = Proxy::start(srv.addr());
    let fs = remote(proxy.addr, |_| {});
    let c = ctx();
    proxy.cut(Cut::BeforeReply(Op::Create));
    let r = fs.create(&c, ROOT, b"f", libc::S_IFREG | 0o644, libc::O_RDWR);
    assert!(proxy.fired.load(Ordering::SeqCst));
    eprintln!("create: {:?}", r.as_ref().map(|(a, fh)| (a.ino, *fh)));
    // Whatever the client was told, it cleans up after itself.
    if let Ok((a, fh)) = &r {
        fs.release(a.ino, *fh).unwrap();
        fs.forget(a.ino, 1);
    }
    let ino = fs.lookup(&c, ROOT, b"f").unwrap().ino;
    fs.unlink(&c, ROOT, b"f").unwrap();
    fs.forget(ino, 1);
    assert_eq!(fs.references(ino), (0, 0));
    eventually(
        Duration::from_secs(5),
        "nothing of f held by the session",
        || {
            let r = srv.report();
            r.handles_open == 0 && r.references_held == 0
        },
    );
}

/// Finding 5. "The server gives a peer 5 s to finish the handshake" — but the deadline is
/// a receive timeout per read, so a peer that sends its Hello one byte a second keeps a
/// connection slot for a minute (and the Proof another half minute), without knowing
/// the secret. `max_connections` such peers lock every client out.
#[test]
fn the_handshake_deadline_bounds_the_whole_handshake() {
    let srv = Running::start(
        memory_fs(16 * MIB),
        ServerConfig {
            secret: Some(b"k".to_vec()),
            max_connections: 2,
            ..config()
        },
    );
    let stop = Arc::new(AtomicBool::new(false));
    let trickler = {
        let (addr, stop) = (srv.addr(), stop.clone());
        std::thread::spawn(move || {
            let mut peers: Vec<TcpStream> =
                (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
            let hello = zcfs_protocol::handshake::Hello {
                version: zcfs_protocol::VERSION as u16,
                features: 0,
                nonce: [7; 32],
                session: 42,
                lane: zcfs_protocol::handshake::Lane::NONE,
            }
            .encode();
            for b in hello {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                for p in &mut peers {
                    let _ = p.write_all(&[b]);
                }
                std::thread::sleep(Duration::from_millis(1000));
            }
        })
    };
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(6500));
    let active = srv.report().connections_active;
    let legit = remote_with_secret(srv.addr());
    stop.store(true, Ordering::SeqCst);
    trickler.join().unwrap();
    assert_eq!(
        active,
        0,
        "{:?} after they connected, peers still in the handshake hold {active} slots \
         (a client with the secret: {:?})",
        started.elapsed(),
        legit.as_ref().err()
    );
    assert!(
        legit.is_ok(),
        "a client with the secret was locked out: {:?}",
        legit.err()
    );
}

fn remote_with_secret(addr: SocketAddr) -> zcfs_backend::Result<RemoteFs> {
    let mut cfg = ClientConfig::new(&addr.to_string());
    cfg.timeout = Duration::from_secs(2);
    cfg.connections = 1;
    cfg.secret = Some(b"k".to_vec());
    RemoteFs::connect(cfg)
}

/// Finding 6. With a secret, the server attaches a Hello to its session *before* the
/// peer has proved anything; a failed proof then `abandon`s it, which for a session that
/// holds something restarts its grace period. A peer that does not know the secret but
/// has a session id (it is in the server's logs) keeps that session, its handles and
/// the unlinked files they pin, alive for ever — and the Welcome's `resumed` flag tells
/// any unauthenticated peer whether a session id exists.
#[test]
fn an_unauthenticated_peer_cannot_keep_a_session_from_expiring() {
    let grace = Duration::from_millis(600);
    let srv = Running::start(
        memory_fs(64 * MIB),
        ServerConfig {
            secret: Some(b"k".to_vec()),
            grace,
            ..config()
        },
    );
    let a = remote_with_secret(srv.addr()).unwrap();
    let (f, fh) = file(&a, b"f");
    a.write(&ctx(), f.ino, fh, 0, &vec![1; MIB]).unwrap();
    a.unlink(&ctx(), ROOT, b"f").unwrap();
    let session = a.client().session();
    drop(a);
    eventually(Duration::from_secs(5), "A's session in grace", || {
        srv.report().sessions_in_grace == 1
    });
    let started = Instant::now();
    let mut told_resumed = false;
    while started.elapsed() < grace * 4 {
        let mut s = TcpStream::connect(srv.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let hello = zcfs_protocol::handshake::Hello {
            version: zcfs_protocol::VERSION as u16,
            features: 0,
            nonce: [3; 32],
            session,
            lane: zcfs_protocol::handshake::Lane::NONE,
        };
        s.write_all(&hello.encode()).unwrap();
        let mut w = [0u8; WELCOME_LEN];
        s.read_exact(&mut w).unwrap();
        told_resumed |= zcfs_protocol::handshake::Welcome::decode(&w)
            .unwrap()
            .resumed;
        s.write_all(&[0u8; 32]).unwrap(); // a proof made up without the secret
        let mut v = [0u8; 8];
        s.read_exact(&mut v).unwrap();
        assert_ne!(u64::from_le_bytes(v), 0, "refused");
        std::thread::sleep(grace / 4);
    }
    let r = srv.report();
    assert_eq!(
        (r.sessions_expired, r.expired_handles),
        (1, 1),
        "after {:?} (grace {grace:?}) A's session is still held (an unauthenticated peer \
         was told resumed = {told_resumed})",
        started.elapsed()
    );
}

/// Finding 7. A handle's open flags are stored in the session and never checked: a
/// write through a handle opened O_RDONLY succeeds (POSIX and the kernel say EBADF), so
/// the handle check does not stand for what the handle was opened for.
#[test]
fn a_handle_opened_read_only_does_not_write() {
    let srv = Running::start(memory_fs(64 * MIB), config());
    let fs = srv.client();
    let (f, fh) = file(&fs, b"f");
    fs.write(&ctx(), f.ino, fh, 0, b"original").unwrap();
    let mut raw = srv.raw(0x77);
    let r = raw.call(zcfs_protocol::OpenReq {
        node: NodeRef::new(f.ino, f.generation),
        flags: libc::O_RDONLY,
    });
    assert_eq!(r.status, 0);
    let rofh = zcfs_protocol::OpenReply::decode(&r.body).unwrap().fh;
    let w = raw.call_with(
        WriteReq {
            node: NodeRef::new(f.ino, f.generation),
            fh: rofh,
            offset: 0,
            size: 8,
            commit: false,
        },
        b"CHANGED!",
    );
    assert_eq!(
        (w.status, read_all(&fs, f.ino, fh, 0, 8).unwrap()),
        (libc::EBADF, b"original".to_vec()),
        "a write through an O_RDONLY handle"
    );
}

/// Finding 1, as FUSE meets it: two readdirplus listings of one directory at once (two
/// `ls -l`), each taking fewer entries than RemoteFs fetched (a FUSE reply buffer holds
/// ~25 of the 128 fetched). One listing gives back the entries it did not pass on while
/// the other is still passing them: the node is gone and the other listing panics.
#[test]
fn concurrent_readdirplus_listings_of_one_directory_do_not_panic() {
    let srv = Running::start(memory_fs(64 * MIB), config());
    let fs = Arc::new(srv.client());
    let c = ctx();
    let d = fs.mkdir(&c, ROOT, b"d", 0o755).unwrap();
    empty_files(&*fs, d.ino, "entry-", 100);
    let started = Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut rounds = 0;
                while rounds < 300 && started.elapsed() < Duration::from_secs(10) {
                    let mut got = Vec::new();
                    // Thread 0 takes 25 entries (a full FUSE buffer), thread 1 all of them.
                    fs.readdir(d.ino, 0, true, &mut |e| {
                        got.push(e.ino);
                        t == 1 || got.len() < 25
                    })
                    .unwrap();
                    for ino in got {
                        fs.forget(ino, 1);
                    }
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
    let panicked = results.iter().filter(|r| r.is_err()).count();
    assert_eq!(panicked, 0, "{panicked} listing thread(s) panicked");
}

/// Finding 8. A connection thread that panics (any backend bug reached by one request)
/// skips the code after `connection()`: `active` is never decremented (after
/// `max_connections` such requests the server refuses everyone) and the session's
/// connection count never drops (it never enters grace: its handles and references are
/// never released).
#[test]
fn a_panicking_request_gives_back_its_connection_slot_and_session() {
    let srv = Running::start(
        Arc::new(ShortFirstWrite {
            inner: memory_fs(64 * MIB),
            panic_on: Some(b"boom"),
        }),
        ServerConfig {
            grace: Duration::from_millis(200),
            ..config()
        },
    );
    let mut raw = srv.raw(0xbad);
    let r = raw.call(zcfs_protocol::OpenReq {
        node: NodeRef::ino(ROOT),
        flags: 0,
    });
    assert_eq!(r.status, 0);
    let (h, body) = Request::from(zcfs_protocol::LookupReq {
        parent: NodeRef::ino(ROOT),
        name: zcfs_protocol::LookupName::new("boom").unwrap(),
    })
    .encode(99, Cred::default());
    raw.send(&h, &body, &[]);
    // The peer should see the connection end, after at most an EIO reply to the
    // request that panicked (no other reply can come).
    raw.s
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut rest = Vec::new();
    let closed = raw.s.read_to_end(&mut rest).is_ok()
        && (rest.is_empty()
            || rest.len() == zcfs_protocol::RESP_HDR
                && RespHeader::decode(rest[..].try_into().unwrap())
                    .is_ok_and(|h| h.id == 99 && h.status == libc::EIO));
    drop(raw);
    let t = Instant::now();
    while closed && t.elapsed() < Duration::from_secs(3) {
        let r = srv.report();
        if r.connections_active == 0 && r.sessions_expired == 1 && r.handles_open == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = srv.report();
    panic!(
        "after the request panicked: connection closed to the peer: {closed}; then \
         {} connection(s) active, {} session(s) active, {} expired, {} handle(s) open",
        r.connections_active, r.sessions_active, r.sessions_expired, r.handles_open
    );
}

/// Finding 9. Read pins are epochs, volume-wide: while one peer leaves a read reply
/// unread (for up to the peer timeout; for ever if it reads a byte now and then), no
/// block freed by *anyone* after its read began is reused. On a volume with little free
/// space every other client's overwrites (copy-on-write: fresh blocks, then the old ones
/// freed) soon fail with ENOSPC — the stalled peer does not delay only itself.
#[test]
fn a_stalled_reader_does_not_make_other_clients_overwrites_fail() {
    let peer_timeout = Duration::from_secs(6);
    let vol = memory_fs(24 * MIB);
    let (r, rh) = file(&*vol, b"r");
    vol.write(&ctx(), r.ino, rh, 0, &vec![1u8; 4 * MIB])
        .unwrap();
    let (w, wh) = file(&*vol, b"w");
    vol.write(&ctx(), w.ino, wh, 0, &vec![2u8; 4 * MIB])
        .unwrap();
    // Without a stalled reader, overwriting w in a loop works for ever.
    for i in 0..8u8 {
        vol.write(&ctx(), w.ino, wh, 0, &vec![i; 4 * MIB]).unwrap();
    }
    let srv = Running::start(
        vol.clone(),
        ServerConfig {
            peer_timeout,
            ..config()
        },
    );
    let mut stalled = Raw::connect_small_window(srv.addr(), 0x5, 16 << 10);
    let (h, body) = Request::from(zcfs_protocol::ReadReq {
        node: NodeRef::ino(r.ino),
        fh: 0,
        offset: 0,
        size: (4 * MIB) as u32,
    })
    .encode(1, Cred::default());
    stalled.send(&h, &body, &[]);
    std::thread::sleep(Duration::from_millis(300));
    let fs = srv.client();
    let started = Instant::now();
    let mut results = Vec::new();
    for i in 0..8u8 {
        results.push(
            fs.write(&ctx(), w.ino, 0, 0, &vec![0x10 + i; 4 * MIB])
                .map_err(|e| e.errno),
        );
    }
    let within = started.elapsed();
    let bfree = fs.statfs().unwrap().bfree;
    drop(stalled);
    assert!(within < peer_timeout, "the writes overlapped the stall");
    assert!(
        results.iter().all(|r| r.is_ok()),
        "overwrites of another client while a reader stalls: {results:?} (statfs bfree {bfree})"
    );
    vol.release(r.ino, rh).unwrap();
    vol.release(w.ino, wh).unwrap();
}

/// The first `left` bytes of a payload, as if that were all of it.
struct Prefix<'p> {
    inner: &'p mut dyn WritePayload,
    left: usize,
}

impl WritePayload for Prefix<'_> {
    fn remaining(&self) -> usize {
        self.left
    }
    fn fill(&mut self, dst: &mut [&mut [u8]]) -> Result<()> {
        let n: usize = dst.iter().map(|d| d.len()).sum();
        assert!(n <= self.left, "a fill past the prefix");
        self.left -= n;
        self.inner.fill(dst)
    }
}
