//! Replies that wait for something the requests after them need not (review rv9 #1): a
//! resend whose first attempt still runs waits for that attempt off its connection's
//! thread, at most `MAX_WAITING_REPLIES` per connection, and at most the peer timeout.
//! Replies then come out of request order, each whole, their tags in wire order. One
//! over the bound waits on the connection's thread, watching the socket: the
//! connection still ends at once however it ends. (The other such reply, the lane's
//! fence `L2Release`, is tested in tests/l2lane.rs.)

#[macro_use]
mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use zcfs_backend::*;
use zcfs_protocol::channel::{Integrity, Mac, TAG_LEN};
use zcfs_protocol::{
    Cred, GetattrReq, MkdirReq, Name, NodeRef, Op, PingReq, Request, RespHeader, RESP_HDR,
};
use zcfs_server::{ServerConfig, MAX_WAITING_REPLIES};
use zcfs_transport::Stream;

const SESSION: u64 = 0x3a17;

/// Stalls every mkdir while it is closed (each at most 30 s), counting those stalled.
#[derive(Default)]
struct Gate {
    /// (mkdirs stalled now, open)
    m: Mutex<(usize, bool)>,
    cv: Condvar,
}

impl Gate {
    fn set_open(&self, open: bool) {
        self.m.lock().unwrap().1 = open;
        self.cv.notify_all();
    }

    /// Wait until `n` mkdirs are stalled (at most 10 s).
    fn until_stalled(&self, n: usize) {
        let t = Instant::now();
        let mut st = self.m.lock().unwrap();
        while st.0 != n {
            assert!(t.elapsed() < Duration::from_secs(10), "no mkdir stalled");
            st = self
                .cv
                .wait_timeout(st, Duration::from_millis(20))
                .unwrap()
                .0;
        }
    }
}

struct StallMkdir {
    inner: Arc<dyn Backend>,
    gate: Arc<Gate>,
}

mod stall_impl {
    use super::StallMkdir;
    use zcfs_backend::*;
    impl Backend for StallMkdir {
        pass_on_all_but_mkdir!();
        pass_on_lookup_and_io!();
        fn mkdir(&self, ctx: &Ctx, parent: u64, name: &[u8], mode: u32) -> Result<Attr> {
            let g = &self.gate;
            let mut st = g.m.lock().unwrap();
            st.0 += 1;
            g.cv.notify_all();
            let t = std::time::Instant::now();
            while !st.1 && t.elapsed() < std::time::Duration::from_secs(30) {
                st =
                    g.cv.wait_timeout(st, std::time::Duration::from_millis(20))
                        .unwrap()
                        .0;
            }
            st.0 -= 1;
            drop(st);
            self.inner.mkdir(ctx, parent, name, mode)
        }
    }
}

fn stalling_server(cfg: ServerConfig) -> (Running, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    let backend: Arc<dyn Backend> = Arc::new(StallMkdir {
        inner: memory_fs(32 << 20),
        gate: gate.clone(),
    });
    (Running::start(backend, cfg), gate)
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

fn ping() -> Request {
    PingReq {}.into()
}

/// Send `req` with id `id` on `raw` without waiting for its reply.
fn send(raw: &mut Raw, id: u64, req: &Request) {
    let (h, body) = req.encode(id, Cred::default());
    raw.send(&h, &body, &[]);
}

/// The next reply on `raw` if one comes within `limit`.
fn receive_within(raw: &mut Raw, limit: Duration) -> Option<(u64, RawReply)> {
    raw.s.set_read_timeout(Some(limit)).unwrap();
    let mut first = [0u8; 1];
    let got = match raw.s.read(&mut first) {
        Ok(1) => true,
        Ok(_) => panic!("the server closed the connection"),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            false
        }
        Err(e) => panic!("{e}"),
    };
    raw.s
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    if !got {
        return None;
    }
    // The rest of the header after its first byte, then as `receive_any`.
    let mut hb = [0u8; RESP_HDR];
    hb[0] = first[0];
    raw.s.read_exact(&mut hb[1..]).unwrap();
    let h = RespHeader::decode(&hb).unwrap();
    let mut body = vec![0u8; h.body_len as usize];
    raw.s.read_exact(&mut body).unwrap();
    let mut data = vec![0u8; h.data_len as usize];
    raw.s.read_exact(&mut data).unwrap();
    Some((
        h.id,
        RawReply {
            status: h.status,
            body,
            data,
        },
    ))
}

/// MAX_WAITING_REPLIES resends of a running mkdir wait off their connection: a ping
/// after them is answered at once. One more waits on the connection's thread (the
/// bound), and the ping after it waits with it. Once the mkdir is done every resend
/// gets its reply (run once), and the places are free again.
#[test]
fn resends_of_a_running_request_wait_off_their_connection_up_to_the_bound() {
    let (srv, gate) = stalling_server(config());
    let mut a = srv.raw(SESSION);
    let mut b = srv.raw(SESSION);
    for round in 0..2u64 {
        gate.set_open(false);
        let id = 7 + round;
        let first = mkdir(&format!("d{round}"));
        send(&mut a, id, &first);
        gate.until_stalled(1);
        for _ in 0..MAX_WAITING_REPLIES {
            send(&mut b, id, &first);
        }
        send(&mut b, 1000 + round, &ping());
        let t = Instant::now();
        let (got, r) = receive_within(&mut b, Duration::from_secs(3))
            .expect("a ping after the waiting resends was held behind them");
        assert_eq!((got, r.status), (1000 + round, 0));
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(srv.report().replies_waiting, MAX_WAITING_REPLIES);
        let mut resends = MAX_WAITING_REPLIES;
        if round == 0 {
            // At the bound: this one waits on the connection's thread.
            send(&mut b, id, &first);
            send(&mut b, 2000, &ping());
            assert!(
                receive_within(&mut b, Duration::from_millis(500)).is_none(),
                "a resend over the bound did not wait on its connection's thread"
            );
            assert_eq!(srv.report().replies_waiting, MAX_WAITING_REPLIES);
            resends += 1;
        }
        gate.set_open(true);
        let done = a.receive(id);
        assert_eq!(done.status, 0);
        let mut replies = Vec::new();
        for _ in 0..resends + usize::from(round == 0) {
            replies.push(receive_within(&mut b, Duration::from_secs(5)).expect("a reply"));
        }
        let (ids, _): (Vec<u64>, Vec<_>) = replies.iter().map(|(i, r)| (*i, r.status)).unzip();
        if round == 0 {
            // The inline resend's reply precedes the ping after it.
            let inline_ping = ids.iter().position(|&i| i == 2000).expect("the ping");
            assert_eq!(
                ids[..inline_ping].iter().filter(|&&i| i == id).count(),
                ids[..inline_ping].len(),
                "{ids:?}"
            );
            assert!(inline_ping >= 1, "{ids:?}");
        }
        for (i, r) in replies.iter().filter(|(i, _)| *i == id) {
            assert_eq!(
                (r.status, &r.body),
                (0, &done.body),
                "resend {i} got the first reply"
            );
        }
        assert_eq!(
            replies.iter().filter(|(i, _)| *i == id).count(),
            resends,
            "{ids:?}"
        );
        // Their threads end just after their replies went out: the places are free.
        eventually(Duration::from_secs(5), "the places were given back", || {
            srv.report().replies_waiting == 0
        });
    }
    let r = srv.report();
    assert_eq!(r.ops["mkdir"].count, 2, "each mkdir ran once");
    assert_eq!(
        r.replies_replayed,
        (2 * MAX_WAITING_REPLIES + 1) as u64,
        "every resend was answered from the reply cache"
    );
}

/// A resend still waiting after the peer timeout is answered ETIMEDOUT (the client
/// asks again); its connection goes on, and the first attempt's reply comes as usual.
#[test]
fn a_waiting_resend_is_answered_within_the_peer_timeout() {
    let (srv, gate) = stalling_server(ServerConfig {
        peer_timeout: Duration::from_secs(1),
        ..config()
    });
    let mut a = srv.raw(SESSION);
    let mut b = srv.raw(SESSION);
    send(&mut a, 7, &mkdir("d"));
    gate.until_stalled(1);
    let t = Instant::now();
    send(&mut b, 7, &mkdir("d"));
    let (id, r) = receive_within(&mut b, Duration::from_secs(5)).expect("an answer");
    assert_eq!((id, r.status), (7, libc::ETIMEDOUT));
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    send(&mut b, 8, &ping());
    assert_eq!(b.receive(8).status, 0);
    gate.set_open(true);
    assert_eq!(a.receive(7).status, 0);
}

/// A connection that ends with replies waiting ends at once: they stop waiting (no one
/// is left to answer), and the server does not keep the connection for them.
#[test]
fn a_connection_ending_with_waiting_replies_ends_at_once() {
    let (srv, gate) = stalling_server(config());
    let mut a = srv.raw(SESSION);
    send(&mut a, 7, &mkdir("d"));
    gate.until_stalled(1);
    let mut b = srv.raw(SESSION);
    for _ in 0..3 {
        send(&mut b, 7, &mkdir("d"));
    }
    send(&mut b, 8, &ping());
    assert_eq!(b.receive_any().0, 8);
    assert_eq!(srv.report().connections_active, 2);
    drop(b);
    eventually(Duration::from_secs(2), "b's connection ended", || {
        srv.report().connections_active == 1
    });
    assert_eq!(srv.report().replies_waiting, 0, "ended with the connection");
    gate.set_open(true);
    assert_eq!(a.receive(7).status, 0);
}

/// Put a reply over the bound on `b`'s connection thread: `a` runs a mkdir (stalled at
/// the gate), `b` sends `MAX_WAITING_REPLIES` resends of it (each waiting on a thread of
/// its own) and a ping (answered), then one more resend (waiting on b's connection
/// thread) and a ping behind it, which gets no answer while the resend waits.
fn wait_inline(srv: &Running, gate: &Gate, a: &mut Raw, b: &mut Raw) {
    send(a, 7, &mkdir("d"));
    gate.until_stalled(1);
    for _ in 0..MAX_WAITING_REPLIES {
        send(b, 7, &mkdir("d"));
    }
    send(b, 8, &ping());
    assert_eq!(b.receive_any().0, 8);
    assert_eq!(srv.report().replies_waiting, MAX_WAITING_REPLIES);
    // One over the bound: it waits on b's connection thread.
    send(b, 7, &mkdir("d"));
    send(b, 9, &ping());
    assert!(
        receive_within(b, Duration::from_millis(300)).is_none(),
        "the resend over the bound did not wait inline"
    );
    assert_eq!(srv.report().connections_active, 2);
}

/// Whether the server comes down to `n` active connections within `limit` (looked at
/// every 20 ms), and how long it took.
fn active_within(srv: &Running, n: usize, limit: Duration) -> (bool, Duration) {
    let t = Instant::now();
    let ended = (0..limit.as_millis() / 20).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        srv.report().connections_active == n
    });
    (ended, t.elapsed())
}

/// Review finding (review3), fixed: a resend over the bound waits on its connection's
/// own thread (`wait_then_answer`'s inline path), which reads nothing meanwhile, so it
/// used to look only at `Out::is_closed` (set by that very thread once `serve`
/// returns). When the peer went away the connection lasted until the first attempt
/// ended or the peer timeout (30 s by default) passed, holding its session, its slot,
/// and `Server::run`'s join at shutdown. The inline wait now watches the socket too
/// (a poll for POLLRDHUP/POLLHUP, nothing read).
#[test]
fn a_connection_ending_with_a_reply_waiting_inline_ends_at_once() {
    let (srv, gate) = stalling_server(config());
    let mut a = srv.raw(SESSION);
    let mut b = srv.raw(SESSION);
    wait_inline(&srv, &gate, &mut a, &mut b);
    drop(b);
    let (ended, waited) = active_within(&srv, 1, Duration::from_secs(2));
    gate.set_open(true);
    assert_eq!(a.receive(7).status, 0);
    assert!(
        ended,
        "b's connection did not end within {waited:?} of its peer leaving: its inline \
         waiting reply held it until the first attempt ended"
    );
    eventually(Duration::from_secs(2), "the places were given back", || {
        srv.report().replies_waiting == 0
    });
    assert_eq!(srv.report().ops["mkdir"].count, 1, "the mkdir ran once");
}

/// A peer that shuts down its sending side ends its connection, as its end of stream
/// does when the connection's thread reads it: an inline wait ends it too (nothing
/// more is read, the ping queued after the resend is not answered), rather than
/// keeping it until the first attempt ends.
#[test]
fn a_peer_shutting_its_side_down_ends_an_inline_wait() {
    let (srv, gate) = stalling_server(config());
    let mut a = srv.raw(SESSION);
    let mut b = srv.raw(SESSION);
    wait_inline(&srv, &gate, &mut a, &mut b);
    b.s.shutdown(std::net::Shutdown::Write).unwrap();
    let (ended, waited) = active_within(&srv, 1, Duration::from_secs(2));
    gate.set_open(true);
    assert_eq!(a.receive(7).status, 0);
    assert!(
        ended,
        "b's connection lasted {waited:?} after its peer's FIN"
    );
    // The server closed its side: end of stream, no reply to the ping behind it.
    let mut rest = Vec::new();
    b.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    b.s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{} bytes came after the FIN", rest.len());
}

/// The same over the Unix socket (its poll reports the peer's end as TCP's does).
#[test]
fn a_unix_connection_ending_with_a_reply_waiting_inline_ends_at_once() {
    let path = std::env::temp_dir().join(format!("zcfs-waiting-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let (srv, gate) = stalling_server(ServerConfig {
        listen: zcfs_transport::Address::Unix(path.clone()),
        ..config()
    });
    let mut a = Raw::connect_unix(&path, SESSION);
    let mut b = Raw::connect_unix(&path, SESSION);
    wait_inline(&srv, &gate, &mut a, &mut b);
    drop(b);
    let (ended, waited) = active_within(&srv, 1, Duration::from_secs(2));
    gate.set_open(true);
    assert_eq!(a.receive(7).status, 0);
    drop(srv);
    let _ = std::fs::remove_file(&path);
    assert!(
        ended,
        "b's connection lasted {waited:?} after its peer left"
    );
}

/// `Server::shutdown` shuts every socket down: a connection waiting inline ends at once
/// (before, it waited for the first attempt, holding `Server::run`'s join).
#[test]
fn a_server_shutdown_ends_a_connection_waiting_inline_at_once() {
    let (srv, gate) = stalling_server(config());
    let mut a = srv.raw(SESSION);
    let mut b = srv.raw(SESSION);
    wait_inline(&srv, &gate, &mut a, &mut b);
    srv.server.shutdown();
    // a's thread is inside the stalled mkdir; b's has nothing running.
    let (ended, waited) = active_within(&srv, 1, Duration::from_secs(2));
    gate.set_open(true);
    assert!(ended, "b's connection lasted {waited:?} after the shutdown");
    let t = Instant::now();
    srv.stop();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

/// A new connection on the lane of one waiting inline fences it (shuts its socket
/// down and waits for its thread): the wait ends at once, so the new connection is
/// welcomed rather than refused busy after the handshake timeout.
#[test]
fn a_lane_taken_over_from_a_connection_waiting_inline_is_handed_over_at_once() {
    let lane = |generation| zcfs_protocol::handshake::Lane {
        index: 1,
        generation,
    };
    let (srv, gate) = stalling_server(config());
    let mut a = srv.raw(SESSION);
    let mut b = Raw::connect_on_lane(srv.addr(), SESSION, lane(1)).unwrap();
    wait_inline(&srv, &gate, &mut a, &mut b);
    let t = Instant::now();
    let c = Raw::connect_on_lane(srv.addr(), SESSION, lane(2));
    let took = t.elapsed();
    let mut c = c.unwrap_or_else(|e| panic!("refused after {took:?}: {e}"));
    assert!(took < Duration::from_secs(2), "{took:?}");
    send(&mut c, 10, &ping());
    assert_eq!(c.receive(10).status, 0);
    gate.set_open(true);
    assert_eq!(a.receive(7).status, 0);
    drop(b);
}

const SECRET: &[u8] = b"waiting-replies-test-secret";

/// A connection with MACs, driven by hand.
struct Tagged {
    s: Stream,
    tx: Mac,
    rx: Mac,
}

impl Tagged {
    fn connect(addr: SocketAddr) -> Tagged {
        let mut s: Stream = TcpStream::connect(addr).unwrap().into();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let e = zcfs_transport::client_handshake(&mut s, Some(SECRET), SESSION, Integrity::Full)
            .unwrap();
        let (tx, rx) = e.channel.expect("MACs with a secret");
        Tagged { s, tx, rx }
    }

    fn send(&mut self, id: u64, req: &Request) {
        let (h, body) = req.encode(id, Cred::default());
        let tag = self.tx.begin(&h, &body).tag();
        self.s.write_all(&h).unwrap();
        self.s.write_all(&body).unwrap();
        self.s.write_all(&tag).unwrap();
    }

    /// The next reply, its tag checked in wire order: id, status, body.
    fn receive_any(&mut self) -> (u64, i32, Vec<u8>) {
        let mut hb = [0u8; RESP_HDR];
        self.s.read_exact(&mut hb).unwrap();
        let h = RespHeader::decode(&hb).unwrap();
        let mut body = vec![0u8; h.body_len as usize];
        self.s.read_exact(&mut body).unwrap();
        let mut tag = [0u8; TAG_LEN];
        self.s.read_exact(&mut tag).unwrap();
        self.rx
            .begin(&hb, &body)
            .verify(&tag)
            .expect("replies are tagged in the order they are sent");
        assert_eq!(h.data_len, 0);
        (h.id, h.status, body)
    }
}

/// On an authenticated connection (full integrity) a waiting resend's reply comes
/// after replies to later requests: each is tagged in the order it goes on the wire.
#[test]
fn waiting_replies_are_tagged_in_wire_order() {
    let (srv, gate) = stalling_server(ServerConfig {
        secret: Some(SECRET.to_vec()),
        integrity: Integrity::Full,
        ..config()
    });
    let mut a = Tagged::connect(srv.addr());
    let mut b = Tagged::connect(srv.addr());
    send_tagged_mkdir(&mut a, 7);
    gate.until_stalled(1);
    send_tagged_mkdir(&mut b, 7);
    for id in 8..12 {
        b.send(
            id,
            &GetattrReq {
                node: NodeRef::ino(ROOT),
            }
            .into(),
        );
    }
    for id in 8..12 {
        let (got, status, _) = b.receive_any();
        assert_eq!((got, status), (id, 0), "later requests are answered first");
    }
    gate.set_open(true);
    let (id, status, first) = a.receive_any();
    assert_eq!((id, status), (7, 0));
    let (id, status, again) = b.receive_any();
    assert_eq!((id, status, again), (7, 0, first));
    assert_eq!(srv.report().ops[Op::Mkdir.name()].count, 1);
}

fn send_tagged_mkdir(t: &mut Tagged, id: u64) {
    t.send(id, &mkdir("d"));
}
