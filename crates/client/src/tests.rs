//! The client against fake servers: restarts, lost connections, resends.
use super::*;
use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use zcfs_protocol::Op;
use zcfs_protocol::{LookupName, LookupReq, MkdirReq, Name, NodeRef, PingReq, ReqHeader, REQ_HDR};

/// A stand-in server: handshakes (every connection a new server instance when
/// `restarts`, else the same one resuming the session), answers every request with
/// an empty success, except that the first request of operation `drop_first` ends
/// its connection unanswered. Records (op, id) of what it received.
struct Fake {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<(Op, u64)>>>,
}

fn fake(restarts: bool, drop_first: Option<Op>) -> Fake {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    std::thread::spawn(move || {
        let dropped = Arc::new(AtomicBool::new(false));
        for (n, s) in l.incoming().enumerate() {
            let Ok(mut s) = s else { return };
            let instance = if restarts { n as u64 + 1 } else { 1 };
            let hs = zcfs_transport::server_handshake(
                &mut s,
                None,
                Integrity::Headers,
                8,
                instance,
                Duration::from_secs(5),
                &mut |_| Ok(!restarts && n > 0),
            );
            if hs.is_err() {
                continue;
            }
            let (seen, dropped) = (seen2.clone(), dropped.clone());
            std::thread::spawn(move || loop {
                let mut hb = [0u8; REQ_HDR];
                if s.read_exact(&mut hb).is_err() {
                    return;
                }
                let h = ReqHeader::decode(&hb).unwrap();
                let mut body = vec![0u8; (h.body_len + h.data_len) as usize];
                s.read_exact(&mut body).unwrap();
                lock(&seen).push((h.op, h.id));
                if Some(h.op) == drop_first && !dropped.swap(true, Ordering::SeqCst) {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                    return;
                }
                let r = RespHeader::ok(h.op, h.id, 0, 0).encode();
                if std::io::Write::write_all(&mut s, &r).is_err() {
                    return;
                }
            });
        }
    });
    Fake { addr, seen }
}

fn client(f: &Fake) -> Client {
    let mut cfg = ClientConfig::new(&f.addr.to_string());
    cfg.connections = 1;
    cfg.timeout = Duration::from_secs(5);
    Client::new(cfg)
}

/// A client connected to `fake(restarts, Some(cut))` exchanges `req`, whose first send
/// is cut: the fake, the client, the result and whether `req` was resent.
fn exchange_cut(
    restarts: bool,
    cut: Op,
    req: &Request,
) -> (Fake, Client, Result<Response, Error>, bool) {
    let f = fake(restarts, Some(cut));
    let c = client(&f);
    c.connect().unwrap();
    let (r, resent) = c.exchange(req, Caller::default(), &[]);
    (f, c, r, resent)
}

fn ping() -> Request {
    PingReq {}.into()
}

/// The revalidation runs before the new connection is handed out: when the hook
/// runs no connection of the new session is in use (a lookup on it would take a
/// reference the hook then forgets), and the hook's own requests go out on it.
#[test]
fn a_lost_session_is_revalidated_before_its_connection_is_handed_out() {
    let f = fake(true, None);
    let c = client(&f);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    c.set_on_restart(Box::new(move |c: &Client, conn: &ConnRef, epoch| {
        // The slot is still held by the reconnection (nothing handed out), or
        // holds no connection that is up.
        let handed_out = c.conns[0]
            .try_lock()
            .is_ok_and(|slot| slot.as_ref().is_some_and(|x| x.is_up()));
        let ping = c.call_on(conn, &ping(), Caller::default()).map(|r| r.epoch);
        lock(&seen2).push((handed_out, epoch, ping.ok()));
    }));
    c.connect().unwrap();
    assert_eq!(c.call(&ping(), Caller::default(), &[]).unwrap().epoch, 0);
    c.disconnect();
    let r = c.call(&ping(), Caller::default(), &[]).unwrap();
    assert_eq!(*lock(&seen), vec![(false, 1, Some(1))]);
    assert_eq!((r.epoch, c.epoch()), (1, 1));
}

fn mkdir() -> Request {
    MkdirReq {
        umask: 0,
        parent: NodeRef::ino(1),
        name: Name::new("d").unwrap(),
        mode: 0o755,
    }
    .into()
}

/// A request lost with its connection is sent again with the same id when the
/// session was resumed (the server's reply cache makes it count once).
#[test]
fn a_lost_request_is_resent_with_its_id_into_the_same_session() {
    let (f, c, r, resent) = exchange_cut(false, Op::Mkdir, &mkdir());
    assert!(r.is_ok() && resent);
    let mk: Vec<u64> = lock(&f.seen)
        .iter()
        .filter(|(op, _)| *op == Op::Mkdir)
        .map(|x| x.1)
        .collect();
    assert!(mk.len() == 2 && mk[0] == mk[1], "{mk:?}");
    assert_eq!(c.epoch(), 0);
}

/// Into a new session (the server restarted), a request that is not idempotent is
/// not sent again (what it did went with the old session or stayed done); an
/// idempotent one is.
#[test]
fn only_idempotent_requests_are_resent_into_a_new_session() {
    let (f, _c, r, resent) = exchange_cut(true, Op::Mkdir, &mkdir());
    assert_eq!(r.unwrap_err().errno, libc::ENOTCONN);
    assert!(!resent);
    let count = |op| lock(&f.seen).iter().filter(|(o, _)| *o == op).count();
    assert_eq!(count(Op::Mkdir), 1);
    let lookup: Request = LookupReq {
        parent: NodeRef::ino(1),
        name: LookupName::new("x").unwrap(),
    }
    .into();
    let (_f, c, r, resent) = exchange_cut(true, Op::Lookup, &lookup);
    assert!(r.is_ok() && resent);
    assert_eq!((r.unwrap().epoch, c.epoch()), (1, 1));
}

/// What was posted to a session that is gone is not sent into the next one.
#[test]
fn posts_of_a_lost_session_are_dropped() {
    let f = fake(true, None);
    let c = client(&f);
    c.connect().unwrap();
    c.disconnect();
    c.post(&ping(), Caller::default(), 0);
    assert_eq!(c.posted_unanswered(), 1);
    c.call(&ping(), Caller::default(), &[]).unwrap();
    assert_eq!(c.epoch(), 1);
    assert_eq!(c.posted_unanswered(), 0);
    c.post(&ping(), Caller::default(), 0);
    assert_eq!(c.posted_unanswered(), 0, "posted against an old epoch");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(lock(&f.seen).len(), 1, "only the call went out");
}
