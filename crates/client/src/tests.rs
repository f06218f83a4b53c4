//! The client against fake servers: restarts, lost connections, resends.
use super::*;
use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use zcfs_protocol::Op;
use zcfs_protocol::{LookupName, LookupReq, MkdirReq, Name, NodeRef, PingReq, ReqHeader, REQ_HDR};

/// The next request on a fake server's connection: its header and its body and data.
/// None once the client has gone.
fn read_request(s: &mut std::net::TcpStream) -> Option<(ReqHeader, Vec<u8>)> {
    let mut hb = [0u8; REQ_HDR];
    s.read_exact(&mut hb).ok()?;
    let h = ReqHeader::decode(&hb).unwrap();
    let mut body = vec![0u8; (h.body_len + h.data_len) as usize];
    s.read_exact(&mut body).ok()?;
    Some((h, body))
}

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
                &mut |_| {
                    Ok(zcfs_transport::Joined {
                        resumed: !restarts && n > 0,
                        serial: 1,
                    })
                },
            );
            if hs.is_err() {
                continue;
            }
            let (seen, dropped) = (seen2.clone(), dropped.clone());
            std::thread::spawn(move || loop {
                let Some((h, _)) = read_request(&mut s) else {
                    return;
                };
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
        true
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

/// `wait_posted` waits for the replies of requests posted before it (a lookup of "."
/// must not overtake the FORGET before it), also of one that waited for a connection.
#[test]
fn wait_posted_waits_for_earlier_posts_out_on_a_connection() {
    let f = Scripted::new();
    let c = client_of(f.addr, Duration::from_secs(5));
    c.post(&ping(), Caller::default(), 0);
    let posted = f.next();
    assert!(
        !c.wait_posted(Duration::from_millis(100)).unwrap(),
        "not answered yet"
    );
    f.answer(posted);
    assert!(c.wait_posted(Duration::from_secs(5)).unwrap());
    assert_eq!(c.posted_unanswered(), 0);
    // Posted with no connection up: wait_posted makes the connection it goes out on
    // first, and waits for its reply there (a request sent after it on another
    // connection could overtake it: review 28b).
    let f = fake(false, None);
    let c = client(&f);
    c.connect().unwrap();
    c.disconnect();
    c.post(&ping(), Caller::default(), 0);
    assert_eq!(c.posted_unanswered(), 1);
    let t0 = std::time::Instant::now();
    assert!(c.wait_posted(Duration::from_secs(5)).unwrap());
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!(c.posted_unanswered(), 0);
}

/// A stand-in server for one connection whose replies the test writes: requests
/// arrive on `requests` as (op, id); `answer` replies to one with its id as body.
struct Scripted {
    addr: SocketAddr,
    requests: Mutex<std::sync::mpsc::Receiver<(Op, u64)>>,
    socket: Arc<Mutex<Option<std::net::TcpStream>>>,
}

impl Scripted {
    fn new() -> Scripted {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, requests) = std::sync::mpsc::channel();
        let socket = Arc::new(Mutex::new(None));
        let socket2 = socket.clone();
        std::thread::spawn(move || {
            let Ok((mut s, _)) = l.accept() else { return };
            zcfs_transport::server_handshake(
                &mut s,
                None,
                Integrity::Headers,
                64,
                1,
                Duration::from_secs(5),
                &mut |_| {
                    Ok(zcfs_transport::Joined {
                        resumed: false,
                        serial: 1,
                    })
                },
            )
            .unwrap();
            *lock(&socket2) = Some(s.try_clone().unwrap());
            loop {
                let Some((h, _)) = read_request(&mut s) else {
                    return;
                };
                if tx.send((h.op, h.id)).is_err() {
                    return;
                }
            }
        });
        Scripted {
            addr,
            requests: Mutex::new(requests),
            socket,
        }
    }

    fn next(&self) -> (Op, u64) {
        lock(&self.requests)
            .recv_timeout(Duration::from_secs(5))
            .unwrap()
    }

    fn answer(&self, (op, id): (Op, u64)) {
        let mut w = lock(&self.socket);
        let s = w.as_mut().unwrap();
        std::io::Write::write_all(s, &RespHeader::ok(op, id, 8, 0).encode()).unwrap();
        std::io::Write::write_all(s, &id.to_le_bytes()).unwrap();
    }

    fn answer_error(&self, (op, id): (Op, u64), errno: i32) {
        let mut w = lock(&self.socket);
        let s = w.as_mut().unwrap();
        std::io::Write::write_all(s, &RespHeader::error(op, id, errno).encode()).unwrap();
    }

    fn close(&self) {
        if let Some(s) = lock(&self.socket).take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn client_of(addr: SocketAddr, timeout: Duration) -> Client {
    let mut cfg = ClientConfig::new(&addr.to_string());
    cfg.connections = 1;
    cfg.timeout = timeout;
    let c = Client::new(cfg);
    c.connect().unwrap();
    c
}

fn the_conn(c: &Client) -> Arc<Conn> {
    lock(&c.conns[0]).as_ref().unwrap().clone()
}

/// Leader/follower: a caller alone on its connection reads its own reply (it took the
/// reader once per call, and the reply was not handed over by another thread).
#[test]
fn a_lone_callers_reply_is_read_on_its_own_thread() {
    let f = Scripted::new();
    let c = client_of(f.addr, Duration::from_secs(5));
    let conn = the_conn(&c);
    let before = conn.leads.load(Ordering::Relaxed);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..3 {
                let r = f.next();
                f.answer(r);
            }
        });
        for _ in 0..3 {
            let r = c.call(&ping(), Caller::default(), &[]).unwrap();
            assert_eq!(r.body, r.hdr.id.to_le_bytes());
        }
    });
    assert_eq!(
        conn.leads.load(Ordering::Relaxed) - before,
        3,
        "one lead per call"
    );
}

/// A caller reading for its own reply hands the replies that come first to their
/// waiters, whatever the order; each waiter gets its own.
#[test]
fn a_leader_hands_replies_in_any_order_to_their_waiters() {
    let f = Scripted::new();
    let c = client_of(f.addr, Duration::from_secs(5));
    let conn = the_conn(&c);
    std::thread::scope(|s| {
        let check = |t: Ticket| {
            let id = t.id;
            let r = t.wait().unwrap();
            assert_eq!(r.body, id.to_le_bytes(), "the reply of another request");
        };
        // The first caller is alone: it leads, and waits in its read.
        let first = c.submit(&ping(), Caller::default(), &[]).unwrap();
        let leader = s.spawn(move || check(first));
        let first_req = f.next();
        let t0 = std::time::Instant::now();
        while lock(&conn.reader).is_some() && t0.elapsed() < Duration::from_secs(4) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            lock(&conn.reader).is_none(),
            "the first caller holds the reader"
        );
        let waiters: Vec<_> = (0..7)
            .map(|_| {
                let t = c.submit(&ping(), Caller::default(), &[]).unwrap();
                s.spawn(move || check(t))
            })
            .collect();
        let mut rest: Vec<_> = (0..7).map(|_| f.next()).collect();
        rest.reverse();
        for r in rest {
            f.answer(r);
        }
        // Every other reply was read by the leader (the background reader cannot
        // have had the reader): their waiters got them now.
        for w in waiters {
            w.join().unwrap();
        }
        f.answer(first_req);
        leader.join().unwrap();
    });
    assert!(conn.is_up());
    assert!(lock(&conn.pending).is_empty());
}

/// A posted request's reply is read with no caller waiting on the connection.
#[test]
fn a_posted_reply_is_read_without_a_caller() {
    let f = Scripted::new();
    let c = client_of(f.addr, Duration::from_secs(5));
    c.post(&ping(), Caller::default(), 0);
    assert_eq!(c.posted_unanswered(), 1);
    f.answer(f.next());
    let t0 = std::time::Instant::now();
    while c.posted_unanswered() > 0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(c.posted_unanswered(), 0);
    assert!(
        t0.elapsed() < conn::IDLE_WATCH + conn::BACKGROUND_TICK * 5,
        "{:?}",
        t0.elapsed()
    );
}

/// A leader whose reply never comes gives up at its timeout (not a read timeout
/// later), and a caller waiting behind it is told the connection is gone.
#[test]
fn a_leader_without_a_reply_times_out_in_its_time_and_frees_the_others() {
    let f = Scripted::new();
    let timeout = Duration::from_millis(300);
    let c = client_of(f.addr, timeout);
    std::thread::scope(|s| {
        let t0 = std::time::Instant::now();
        // Submitted and waited for (no resend on a new connection, as `call` would).
        let first = c.submit(&ping(), Caller::default(), &[]).unwrap();
        let first = s.spawn(move || first.wait());
        f.next();
        let second = c.submit(&ping(), Caller::default(), &[]).unwrap();
        f.next();
        let e = first.join().unwrap().unwrap_err();
        assert_eq!(e.errno, libc::ETIMEDOUT);
        let took = t0.elapsed();
        assert!(took >= timeout && took < timeout * 2, "{took:?}");
        let e2 = second.wait().unwrap_err();
        assert!(
            matches!(e2.errno, libc::ENOTCONN | libc::ETIMEDOUT),
            "{e2:?}"
        );
        assert!(t0.elapsed() < timeout * 3);
    });
}

/// A connection the server closes while no one calls is known to be down before the
/// next call (which then goes out on a new connection, not into the dead one).
#[test]
fn an_idle_connection_closed_by_the_server_is_noticed_without_a_call() {
    let f = Scripted::new();
    let c = client_of(f.addr, Duration::from_secs(5));
    let conn = the_conn(&c);
    std::thread::scope(|s| {
        s.spawn(|| f.answer(f.next()));
        c.call(&ping(), Caller::default(), &[]).unwrap();
    });
    // Past the background reader's tick: the connection is idle now.
    std::thread::sleep(conn::BACKGROUND_TICK * 3);
    f.close();
    let t0 = std::time::Instant::now();
    while conn.is_up() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!conn.is_up());
    assert!(t0.elapsed() < conn::IDLE_WATCH + conn::BACKGROUND_TICK * 5);
}

/// A caller that reads its own reply must still give up at its deadline when the
/// reply trickles in (a slow or misbehaving server, or a congested link): the read
/// timeout bounds each read, not the whole reply. Before leader/follower the caller
/// waited on its channel with its deadline and got ETIMEDOUT in time.
#[test]
fn a_leader_gives_up_at_its_deadline_while_its_reply_trickles_in() {
    let f = Scripted::new();
    let timeout = Duration::from_millis(300);
    let c = client_of(f.addr, timeout);
    std::thread::scope(|s| {
        s.spawn(|| {
            let (op, id) = f.next();
            let mut w = lock(&f.socket);
            let Some(sock) = w.as_mut() else { return };
            // 40 body bytes, one every 50 ms: 2 s for the whole reply.
            let _ = std::io::Write::write_all(sock, &RespHeader::ok(op, id, 40, 0).encode());
            for _ in 0..40 {
                if std::io::Write::write_all(sock, &[0u8]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let t0 = std::time::Instant::now();
        let r = c.submit(&ping(), Caller::default(), &[]).unwrap().wait();
        let took = t0.elapsed();
        assert!(
            took < timeout * 2,
            "the call took {took:?} with a timeout of {timeout:?}: {:?}",
            r.map(|r| r.hdr.id)
        );
        f.close();
    });
}

/// A caller that finds no reply on its channel and then becomes the leader may find
/// that its reply was read meanwhile by the one who held the reader (and handed to
/// its channel): it must not then read the socket for a reply that will never come.
/// Two callers on one connection against a server that answers at once, each waiting
/// a little after it submits (as write-behind and pipelined tickets are waited): no
/// call may take anywhere near the timeout. (Fails within seconds: the caller times
/// out with its reply in its channel, and the connection is broken for everyone.)
#[test]
fn no_caller_leads_for_a_reply_already_handed_to_it() {
    let f = Scripted::new();
    let timeout = Duration::from_secs(2);
    let c = client_of(f.addr, timeout);
    let stop = AtomicBool::new(false);
    let slow = Mutex::new(Vec::new());
    let calls = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let r = lock(&f.requests).recv_timeout(Duration::from_millis(50));
                if let Err(std::sync::mpsc::RecvTimeoutError::Disconnected) = r {
                    return;
                }
                if let Ok(r) = r {
                    if let Some(sock) = lock(&f.socket).as_ref() {
                        let _ = sock.set_nodelay(true);
                    }
                    f.answer(r);
                }
            }
        });
        let callers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let t_end = std::time::Instant::now() + Duration::from_secs(20);
                    while std::time::Instant::now() < t_end && lock(&slow).is_empty() {
                        let t0 = std::time::Instant::now();
                        let t = match c.submit(&ping(), Caller::default(), &[]) {
                            Ok(t) => t,
                            // The connection was broken by the other caller's timeout
                            // (the fake server takes one connection).
                            Err(e) => {
                                lock(&slow).push(format!("submit: {e:?}"));
                                break;
                            }
                        };
                        // Waited a little later (as write-behind and pipelined tickets
                        // are): its reply may be being read by then.
                        let lag = Duration::from_nanos(rand::random::<u64>() % 80_000);
                        while t0.elapsed() < lag {
                            std::hint::spin_loop();
                        }
                        let r = t.wait();
                        calls.fetch_add(1, Ordering::Relaxed);
                        if t0.elapsed() > timeout / 2 || r.is_err() {
                            lock(&slow).push(format!("{:?} {:?}", t0.elapsed(), r.map(|_| ())));
                        }
                    }
                })
            })
            .collect();
        let joined: Vec<_> = callers.into_iter().map(|c| c.join()).collect();
        stop.store(true, Ordering::Relaxed);
        joined.into_iter().for_each(|j| j.unwrap());
    });
    let slow = lock(&slow);
    assert!(
        slow.is_empty(),
        "after {} calls: {slow:?}",
        calls.load(Ordering::Relaxed)
    );
}

impl Scripted {
    /// Reply to `(op, id)` with `body`.
    fn answer_body(&self, (op, id): (Op, u64), body: &[u8]) {
        let mut w = lock(&self.socket);
        let s = w.as_mut().unwrap();
        std::io::Write::write_all(s, &RespHeader::ok(op, id, body.len() as u32, 0).encode())
            .unwrap();
        std::io::Write::write_all(s, body).unwrap();
    }
}

/// Review of c88a07e (3): only getattr and the directory attributes of a dir-op reply
/// check the invalidation token; a lookup's entry (like readdirplus, setattr, hold,
/// unlink's `removed`) caches its attributes unconditionally. A lookup that the server
/// ran before a setxattr, whose reply is handled after the setxattr returned (its
/// thread was slow, or the replies came in another order), caches the attributes from
/// before the setxattr, `no_xattrs` included: the ACL just set is then answered
/// ENODATA from the cache, without asking, for the attribute timeout.
#[test]
fn a_lookup_reply_older_than_a_setxattr_does_not_hide_the_xattr_set() {
    use zcfs_backend::{Attr, Backend, Ctx, Time, ROOT};
    use zcfs_protocol::{EntryReply, Reply};
    let f = Scripted::new();
    let mut cfg = ClientConfig::new(&f.addr.to_string());
    cfg.connections = 1;
    cfg.timeout = Duration::from_secs(5);
    cfg.attr_ttl = Duration::from_secs(30);
    let fs = crate::RemoteFs::connect(cfg).unwrap();
    let ctx = Ctx::user(0, 0);
    let before = Attr {
        ino: 5,
        generation: 1,
        mode: libc::S_IFREG | 0o644,
        nlink: 1,
        ctime: Time { sec: 100, nsec: 0 },
        no_xattrs: true,
        ..Default::default()
    };
    const ACL: &[u8] = b"system.posix_acl_access";
    std::thread::scope(|s| {
        // The lookup goes out first and the server runs it first ...
        let look = s.spawn(|| fs.lookup(&ctx, ROOT, b"f"));
        let lreq = f.next();
        assert_eq!(lreq.0, Op::Lookup);
        let set = s.spawn(|| fs.setxattr(&ctx, 5, ACL, b"\x02\0\0\0", 0));
        let sreq = f.next();
        assert_eq!(sreq.0, Op::Setxattr);
        // ... but its reply is handled after the setxattr is done.
        f.answer_body(sreq, &[]);
        set.join().unwrap().unwrap();
        let body = Reply::Lookup(EntryReply {
            attr: before.clone(),
        })
        .encode();
        f.answer_body(lreq, &body);
        look.join().unwrap().unwrap();
        // What a getxattr should now ask the server for (answered if it does).
        let get = s.spawn(|| fs.getxattr(&ctx, 5, ACL));
        if let Ok(r) = lock(&f.requests).recv_timeout(Duration::from_millis(500)) {
            assert_eq!(r.0, Op::Getxattr);
            f.answer_body(
                r,
                &Reply::Getxattr(zcfs_protocol::GetxattrReply {
                    value: zcfs_protocol::XattrValue::new(b"\x02\0\0\0").unwrap(),
                })
                .encode(),
            );
        }
        let got = get.join().unwrap();
        assert!(
            got.is_ok(),
            "the ACL just set is answered {got:?} from attributes older than the setxattr"
        );
    });
}

/// What `call_then` completions received, and on which threads they ran.
type Outcomes = Arc<Mutex<Vec<(Result<Vec<u8>, i32>, std::thread::ThreadId)>>>;

fn collect(outcomes: &Outcomes) -> Completion {
    let o = outcomes.clone();
    Box::new(move |r: Result<Response, Error>| {
        lock(&o).push((
            r.map(|r| r.body).map_err(|e| e.errno),
            std::thread::current().id(),
        ))
    })
}

fn wait_for(outcomes: &Outcomes, n: usize) -> Vec<(Result<Vec<u8>, i32>, std::thread::ThreadId)> {
    let t0 = std::time::Instant::now();
    while lock(outcomes).len() < n && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    lock(outcomes).clone()
}

/// `call_then` returns once the request is sent; the reader thread completes each
/// request with its own reply, in whatever order they come, an error status as that
/// error, and gives every in-flight slot back.
#[test]
fn call_then_completes_each_request_with_its_reply_off_the_callers_thread() {
    let f = Scripted::new();
    let c = Arc::new(client_of(f.addr, Duration::from_secs(5)));
    let conn = the_conn(&c);
    let outcomes: Outcomes = Default::default();
    for _ in 0..6 {
        c.call_then(ping(), collect(&outcomes));
    }
    assert!(lock(&outcomes).is_empty(), "completed before any reply");
    assert_eq!(*lock(&conn.inflight.0), 6, "each holds an in-flight slot");
    let mut reqs: Vec<_> = (0..6).map(|_| f.next()).collect();
    reqs.reverse();
    let failed = reqs.pop().unwrap();
    f.answer_error(failed, libc::EACCES);
    for r in &reqs {
        f.answer(*r);
    }
    let got = wait_for(&outcomes, 6);
    assert_eq!(got.len(), 6);
    let me = std::thread::current().id();
    assert!(
        got.iter().all(|(_, t)| *t != me),
        "ran on the caller's thread"
    );
    let mut bodies: Vec<Vec<u8>> = got.iter().filter_map(|(r, _)| r.clone().ok()).collect();
    bodies.sort();
    let mut want: Vec<Vec<u8>> = reqs
        .iter()
        .map(|(_, id)| id.to_le_bytes().to_vec())
        .collect();
    want.sort();
    assert_eq!(bodies, want, "each request's own reply");
    assert_eq!(
        got.iter().filter(|(r, _)| *r == Err(libc::EACCES)).count(),
        1,
        "an error status is that error"
    );
    assert_eq!(*lock(&conn.inflight.0), 0, "every slot given back");
    assert!(lock(&conn.pending).is_empty());
}

/// With the in-flight slots all taken, `call_then` waits for one to come back (it
/// bounds what is outstanding, as `call` does).
#[test]
fn call_then_waits_for_a_free_in_flight_slot() {
    let f = Scripted::new();
    let c = Arc::new(client_of(f.addr, Duration::from_secs(5)));
    let conn = the_conn(&c);
    let max = conn.welcome.max_inflight as usize;
    let outcomes: Outcomes = Default::default();
    for _ in 0..max {
        c.call_then(ping(), collect(&outcomes));
    }
    let reqs: Vec<_> = (0..max).map(|_| f.next()).collect();
    let (sent, was_sent) = std::sync::mpsc::channel();
    let (c2, o2) = (c.clone(), outcomes.clone());
    // Not joined: a slot never given back would leave it waiting for good.
    std::thread::spawn(move || {
        c2.call_then(ping(), collect(&o2));
        let _ = sent.send(());
    });
    assert!(
        was_sent.recv_timeout(Duration::from_millis(100)).is_err(),
        "sent past the in-flight bound"
    );
    f.answer(reqs[0]);
    was_sent
        .recv_timeout(Duration::from_secs(5))
        .expect("the slot given back by a completion was not reused");
    let last = f.next();
    for r in reqs[1..].iter().chain([&last]) {
        f.answer(*r);
    }
    assert_eq!(wait_for(&outcomes, max + 1).len(), max + 1);
    assert!(wait_for(&outcomes, max + 1).iter().all(|(r, _)| r.is_ok()));
    assert_eq!(*lock(&conn.inflight.0), 0);
}

/// A request whose connection is lost is sent again (through `call`, which
/// reconnects) and completes with the answer; it is completed once.
#[test]
fn call_then_sends_a_request_lost_with_its_connection_again() {
    let f = fake(false, Some(Op::Ping));
    let c = Arc::new(client(&f));
    c.connect().unwrap();
    let outcomes: Outcomes = Default::default();
    c.call_then(ping(), collect(&outcomes));
    let got = wait_for(&outcomes, 1);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(lock(&outcomes).len(), 1, "completed twice");
    assert!(got[0].0.is_ok(), "{:?}", got[0].0);
    let pings = lock(&f.seen)
        .iter()
        .filter(|(op, _)| *op == Op::Ping)
        .count();
    assert_eq!(pings, 2, "sent once, lost, sent again");
}

/// A request that must not run twice goes through `call` on the caller's thread
/// (its resend rules stay `call`'s): complete when `call_then` returns.
#[test]
fn call_then_of_a_request_that_is_not_idempotent_is_a_call() {
    let f = fake(false, None);
    let c = Arc::new(client(&f));
    c.connect().unwrap();
    let outcomes: Outcomes = Default::default();
    c.call_then(mkdir(), collect(&outcomes));
    let got = lock(&outcomes).clone();
    assert_eq!(got.len(), 1);
    assert!(got[0].0.is_ok());
    assert_eq!(got[0].1, std::thread::current().id());
}

/// A server that goes away with requests outstanding: each completes (with the
/// error `call` gives after its own resend fails), none hangs.
#[test]
fn call_then_completes_when_the_server_is_gone() {
    let f = Scripted::new();
    let c = Arc::new(client_of(f.addr, Duration::from_secs(2)));
    let outcomes: Outcomes = Default::default();
    for _ in 0..3 {
        c.call_then(ping(), collect(&outcomes));
    }
    for _ in 0..3 {
        f.next();
    }
    f.close();
    let t0 = std::time::Instant::now();
    while lock(&outcomes).len() < 3 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let got = lock(&outcomes).clone();
    assert_eq!(got.len(), 3, "a completion never ran");
    assert!(got.iter().all(|(r, _)| r.is_err()));
}

/// A server that echoes each request's body as its reply's, and cuts its connection
/// (unanswered) at every `cut_every`th request it reads, whatever the connection; the
/// session is resumed on the next connection.
fn echo_cutting(cut_every: u64) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let seen = Arc::new(AtomicU64::new(0));
        for (n, s) in l.incoming().enumerate() {
            let Ok(mut s) = s else { return };
            if zcfs_transport::server_handshake(
                &mut s,
                None,
                Integrity::Headers,
                8,
                1,
                Duration::from_secs(5),
                &mut |_| {
                    Ok(zcfs_transport::Joined {
                        resumed: n > 0,
                        serial: 1,
                    })
                },
            )
            .is_err()
            {
                continue;
            }
            let seen = seen.clone();
            std::thread::spawn(move || loop {
                let Some((h, body)) = read_request(&mut s) else {
                    return;
                };
                if (seen.fetch_add(1, Ordering::SeqCst) + 1).is_multiple_of(cut_every) {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                    return;
                }
                let r = RespHeader::ok(h.op, h.id, body.len() as u32, 0).encode();
                if std::io::Write::write_all(&mut s, &[&r[..], &body[..]].concat()).is_err() {
                    return;
                }
            });
        }
    });
    addr
}

fn lookup_of(name: &str) -> Request {
    LookupReq {
        parent: NodeRef::ino(1),
        name: LookupName::new(name).unwrap(),
    }
    .into()
}

/// Many `call_then`s, with sync calls leading among them, while the server cuts its
/// connections now and then: every completion runs, with its own request's reply (or
/// an error), and in the end every connection has its in-flight slots back and
/// nothing pending.
#[test]
fn call_then_under_cut_connections_completes_each_request_once_with_its_reply() {
    let addr = echo_cutting(13);
    let mut cfg = ClientConfig::new(&addr.to_string());
    cfg.connections = 2;
    cfg.timeout = Duration::from_secs(3);
    let c = Arc::new(Client::new(cfg));
    c.connect().unwrap();
    const THEN_THREADS: usize = 4;
    const PER: usize = 300;
    let done = Arc::new(AtomicU64::new(0));
    let wrong = Arc::new(Mutex::new(Vec::<String>::new()));
    let errors = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for t in 0..THEN_THREADS {
            let (c, done, wrong, errors) = (c.clone(), done.clone(), wrong.clone(), errors.clone());
            s.spawn(move || {
                for i in 0..PER {
                    let name = format!("t{t}-{i}");
                    let want = lookup_of(&name);
                    let (done, wrong, errors) = (done.clone(), wrong.clone(), errors.clone());
                    let key = name.clone();
                    c.call_then(
                        want,
                        Box::new(move |r| {
                            match r {
                                Ok(r) => {
                                    if !r.body.windows(key.len()).any(|w| w == key.as_bytes()) {
                                        lock(&wrong).push(key);
                                    }
                                }
                                Err(e) => {
                                    assert!(is_transport(&e), "{key}: {e}");
                                    errors.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                            done.fetch_add(1, Ordering::SeqCst);
                        }),
                    );
                }
            });
        }
        for t in 0..2 {
            let c = c.clone();
            s.spawn(move || {
                for i in 0..100 {
                    let name = format!("s{t}-{i}");
                    if let Ok(r) = c.call(&lookup_of(&name), Caller::default(), &[]) {
                        assert!(r.body.windows(name.len()).any(|w| w == name.as_bytes()));
                    }
                }
            });
        }
    });
    let want = (THEN_THREADS * PER) as u64;
    let t0 = std::time::Instant::now();
    while done.load(Ordering::SeqCst) < want && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "done {} of {want}, errors {}, resent {}",
        done.load(Ordering::SeqCst),
        errors.load(Ordering::SeqCst),
        c.resent.load(Ordering::Relaxed)
    );
    assert_eq!(done.load(Ordering::SeqCst), want, "completions missing");
    assert!(
        lock(&wrong).is_empty(),
        "another request's reply: {:?}",
        lock(&wrong)
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        done.load(Ordering::SeqCst),
        want,
        "completed more than once"
    );
    for slot in &c.conns {
        if let Some(conn) = lock(slot).as_ref() {
            assert_eq!(*lock(&conn.inflight.0), 0, "in-flight slots not given back");
            assert!(lock(&conn.pending).is_empty());
        }
    }
}

/// A server whose every reply carries `data` (a read's reply with more than asked).
fn answering_with_data(data: usize) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            if zcfs_transport::server_handshake(
                &mut s,
                None,
                Integrity::Headers,
                8,
                1,
                Duration::from_secs(5),
                &mut |_| {
                    Ok(zcfs_transport::Joined {
                        resumed: false,
                        serial: 1,
                    })
                },
            )
            .is_err()
            {
                continue;
            }
            std::thread::spawn(move || loop {
                let Some((h, _)) = read_request(&mut s) else {
                    return;
                };
                let r = RespHeader::ok(h.op, h.id, 0, data as u32).encode();
                let out = [&r[..], &vec![0xAB; data][..]].concat();
                if std::io::Write::write_all(&mut s, &out).is_err() {
                    return;
                }
            });
        }
    });
    addr
}

/// A read whose reply carries more bytes than asked fails (EIO) through `read_then` as
/// through `read`; one with what was asked hands the bytes on.
#[test]
fn read_then_refuses_a_reply_with_more_than_asked() {
    use zcfs_backend::Backend;
    for (sent, want) in [
        (8192usize, Err(libc::EIO)),
        (4096, Ok(4096usize)),
        (100, Ok(100)),
    ] {
        let addr = answering_with_data(sent);
        let mut cfg = ClientConfig::new(&addr.to_string());
        cfg.timeout = Duration::from_secs(3);
        let fs = crate::RemoteFs::connect(cfg).unwrap();
        assert!(fs.reads_then());
        let (tx, rx) = std::sync::mpsc::channel();
        fs.read_then(
            7,
            0,
            0,
            4096,
            Box::new(move |r| {
                let _ = tx.send(r.map(|d| d.len()).map_err(|e| e.errno));
            }),
        );
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("never completed");
        assert_eq!(got, want, "read_then of 4096 answered with {sent}");
        let sync = fs
            .read(7, 0, 0, 4096, &mut |_: &[&[u8]]| Ok(()))
            .map_err(|e| e.errno);
        assert_eq!(
            sync.is_ok(),
            want.is_ok(),
            "read of 4096 answered with {sent}"
        );
    }
}

/// A server that answers every request but one: the `call_then` left unanswered is
/// completed (with an error) within about the client's timeout, though the connection
/// never goes quiet; the others are answered.
#[test]
fn call_then_of_a_request_the_server_never_answers_completes_in_its_time() {
    let f = Scripted::new();
    let timeout = Duration::from_millis(500);
    let c = Arc::new(client_of(f.addr, timeout));
    let outcomes: Outcomes = Default::default();
    let t0 = std::time::Instant::now();
    c.call_then(ping(), collect(&outcomes));
    let _never = f.next();
    // Keep replies coming, each well inside the timeout, for four timeouts.
    let mut answered = 0;
    let failed = |o: &Outcomes| lock(o).iter().any(|(r, _)| r.is_err());
    while !failed(&outcomes) && t0.elapsed() < timeout * 4 {
        c.call_then(ping(), collect(&outcomes));
        if let Ok(r) = lock(&f.requests).recv_timeout(Duration::from_millis(100)) {
            f.answer(r);
            answered += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let waited = t0.elapsed();
    let first_error = lock(&outcomes).iter().any(|(r, _)| r.is_err());
    assert!(answered > 2, "the server answered the others");
    assert!(
        first_error,
        "the unanswered request never completed ({waited:?})"
    );
    assert!(
        waited < timeout * 3,
        "it took {waited:?} with a timeout of {timeout:?}"
    );
}

/// Review 27d (b69edae): a `call_then` request's deadline starts before it is sent, so
/// time spent waiting for the connection's writer (another caller's long send) counts
/// against it: a healthy connection, answering everything promptly once it is sent, is
/// given up as "reply timed out" and every request on it fails over.
#[test]
fn call_then_waiting_for_the_writer_does_not_break_a_healthy_connection() {
    let f = Scripted::new();
    let timeout = Duration::from_millis(600);
    let c = Arc::new(client_of(f.addr, timeout));
    let conn = the_conn(&c);
    let epoch = conn.epoch.load(Ordering::SeqCst);
    // Replies that keep coming while the writer is held (posted: no deadline of their own).
    for _ in 0..6 {
        c.post(&ping(), Caller::process(), epoch);
    }
    let posted: Vec<_> = (0..6).map(|_| f.next()).collect();
    // Another caller's send, as long as one and a half timeouts.
    let held = {
        let conn = conn.clone();
        std::thread::spawn(move || {
            let _w = lock(&conn.writer);
            std::thread::sleep(Duration::from_millis(900));
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    let outcomes: Outcomes = Default::default();
    let sender = {
        let (c, done) = (c.clone(), collect(&outcomes));
        std::thread::spawn(move || c.call_then(ping(), done))
    };
    for r in posted {
        std::thread::sleep(Duration::from_millis(150));
        assert!(
            conn.is_up(),
            "the healthy connection was broken while the writer was held"
        );
        f.answer(r);
    }
    held.join().unwrap();
    sender.join().unwrap();
    // Sent only now: answered at once.
    if let Ok(r) = lock(&f.requests).recv_timeout(Duration::from_secs(2)) {
        f.answer(r);
    }
    let got = wait_for(&outcomes, 1);
    assert!(
        got.first().is_some_and(|(r, _)| r.is_ok()),
        "the request sent late was answered at once: {got:?}"
    );
    assert!(conn.is_up(), "the healthy connection was broken");
}

/// A stand-in server for review 28b: every connection resumes the session; each
/// connection's requests run in order, as the server runs them; a FORGET takes `slow`
/// (its connection busy), everything else is answered at once. Records each request:
/// operation, id, when it arrived and when it was answered.
type Served28b = Arc<Mutex<Vec<(Op, u64, std::time::Instant, std::time::Instant)>>>;

fn slow_forgets(slow: Duration) -> (SocketAddr, Served28b) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let log: Served28b = Default::default();
    let log2 = log.clone();
    std::thread::spawn(move || {
        for (n, s) in l.incoming().enumerate().take(16) {
            let Ok(mut s) = s else { return };
            if zcfs_transport::server_handshake(
                &mut s,
                None,
                Integrity::Headers,
                8,
                1,
                Duration::from_secs(5),
                &mut |_| {
                    Ok(zcfs_transport::Joined {
                        resumed: n > 0,
                        serial: 1,
                    })
                },
            )
            .is_err()
            {
                continue;
            }
            let log = log2.clone();
            std::thread::spawn(move || loop {
                let Some((h, body)) = read_request(&mut s) else {
                    return;
                };
                let arrived = std::time::Instant::now();
                if h.op == Op::Forget {
                    std::thread::sleep(slow);
                }
                lock(&log).push((h.op, h.id, arrived, std::time::Instant::now()));
                // A lookup of "." names its node; any other name is node 5.
                let body = match Request::decode_with_groups(&h, &body) {
                    Ok((Request::Lookup(l), _)) if l.name.as_bytes() == b"." => {
                        entry_of(l.parent.ino)
                    }
                    Ok((Request::Lookup(_), _)) => entry_of(5),
                    _ => Vec::new(),
                };
                let r = RespHeader::ok(h.op, h.id, body.len() as u32, 0).encode();
                if std::io::Write::write_all(&mut s, &[&r[..], &body[..]].concat()).is_err() {
                    return;
                }
            });
        }
    });
    (addr, log)
}

/// An entry reply for a regular file `ino` (generation 1).
fn entry_of(ino: u64) -> Vec<u8> {
    zcfs_protocol::Reply::Lookup(zcfs_protocol::EntryReply {
        attr: zcfs_backend::Attr {
            ino,
            generation: 1,
            mode: libc::S_IFREG | 0o644,
            nlink: 1,
            ..Default::default()
        },
    })
    .encode()
}

/// Review 28b, (1): `wait_posted` does not wait for a posted FORGET whose connection
/// was lost ("it goes out first on the next one made"). But the next connection made
/// is that lane's: `pick` dials the lost lane again (which sends the FORGET again
/// there, not waited for) and then sends the lookup of "." on the other lane, so the
/// server runs the two side by side and may run the lookup first, handing out the
/// inode whose last reference the FORGET gives back (what 6e59793 was to end). A
/// connection lost while a FORGET is out on it is an ordinary event: a reply on it
/// that timed out gives it up (`Ticket::timed_out`), as does a send that failed.
#[test]
fn a_lookup_after_wait_posted_is_not_overtaken_by_a_forget_resent_on_a_new_connection() {
    use zcfs_protocol::{ForgetItem, ForgetReq, List};
    let slow = Duration::from_millis(300);
    let (addr, log) = slow_forgets(slow);
    let mut cfg = ClientConfig::new(&addr.to_string());
    cfg.connections = 2;
    cfg.timeout = Duration::from_secs(5);
    let c = Client::new(cfg);
    c.connect().unwrap();
    // The kernel forgets node 7 (its last reference): posted, on the first lane.
    let forget: Request = ForgetReq {
        items: List::new(vec![ForgetItem { ino: 7, count: 1 }]).unwrap(),
    }
    .into();
    c.post(&forget, Caller::process(), c.epoch());
    assert_eq!(c.posted_unanswered(), 1);
    // That connection is given up before the reply (as a reply timing out on it does).
    let first = lock(&c.conns[0]).clone().unwrap();
    first.break_with("review 28b: a reply on it timed out");
    // Then the kernel looks node 7 up by its number (RemoteFs::hold): wait_posted, then
    // the lookup, whose turn (round robin) is the other lane.
    c.next.store(1, Ordering::SeqCst);
    let t0 = std::time::Instant::now();
    assert!(c.wait_posted(Duration::from_secs(5)).unwrap());
    let waited = t0.elapsed();
    c.call(&lookup_of("."), Caller::process(), &[]).unwrap();
    let unanswered = c.posted_unanswered();
    // Let the server finish the FORGETs, then compare the times it saw.
    let t = std::time::Instant::now();
    while c.posted_unanswered() > 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let log = lock(&log).clone();
    let lookup_arrived = log
        .iter()
        .find(|e| e.0 == Op::Lookup)
        .map(|e| e.2)
        .expect("the lookup reached the server");
    let forgets: Vec<_> = log.iter().filter(|e| e.0 == Op::Forget).collect();
    assert!(!forgets.is_empty(), "the FORGET reached the server");
    let overtaken = forgets.iter().filter(|e| e.3 > lookup_arrived).count();
    assert!(
        overtaken == 0 && unanswered == 0,
        "the lookup reached the server {:?} after the wait began (wait_posted returned \
         after {waited:?}) while {overtaken} of {} copies of the FORGET posted before it \
         were still running there ({unanswered} posted unanswered when the lookup's \
         reply came): the server may run the lookup first",
        lookup_arrived - t0,
        forgets.len()
    );
}

/// Review 28b, (1): `RemoteFs::hold` waits for the replies of every request posted
/// before it, whatever node they name. The FORGET that must not be overtaken is one of
/// the node being held; a FORGET of any other node is waited for too, so a lookup of
/// "." (an NFS export's or `open_by_handle_at`'s file handle) takes as long as the
/// slowest queue a FORGET is in: the server runs each connection's requests in order,
/// and FORGETs go on the first connection up, behind whatever it carries (write-behind
/// writes, a long fsync), up to the client's timeout (10 s by default) per lookup.
/// Here a FORGET of node 5 takes the server 1 s; the lookup of node 9 by its number
/// waits for it, although the other connection is idle.
#[test]
fn a_hold_does_not_wait_for_forgets_of_other_nodes() {
    use zcfs_backend::{Backend, Ctx, ROOT};
    let slow = Duration::from_secs(1);
    let (addr, log) = slow_forgets(slow);
    let mut cfg = ClientConfig::new(&addr.to_string());
    cfg.connections = 2;
    cfg.timeout = Duration::from_secs(5);
    let fs = crate::RemoteFs::connect(cfg).unwrap();
    let ctx = Ctx::user(0, 0);
    // A name looked up (node 5), then given back: a FORGET of node 5 goes out and
    // takes the server a while.
    let a = fs.lookup(&ctx, ROOT, b"a").unwrap();
    assert_eq!(a.ino, 5);
    fs.forget(a.ino, 1);
    assert_eq!(fs.client().posted_unanswered(), 1);
    // The lookup's turn is the other, idle connection (round robin).
    fs.client().next.store(1, Ordering::SeqCst);
    let t0 = std::time::Instant::now();
    let b = fs.hold(9, 0).unwrap();
    let took = t0.elapsed();
    assert_eq!(b.ino, 9);
    fs.forget(9, 1);
    let t = std::time::Instant::now();
    while fs.client().posted_unanswered() > 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(lock(&log).iter().any(|e| e.0 == Op::Forget));
    assert!(
        took < slow / 2,
        "holding node 9 took {took:?}: it waited for the FORGET of node {} (the server \
         needed {slow:?} for it)",
        a.ino
    );
}

/// A stand-in server whose first connection is served as `slow_forgets(0)`'s are, and
/// that then takes connections in but never shakes hands on them (a server that hangs,
/// or whose listener is wedged): each dial waits out the client's timeout. Holds the
/// sockets it took (at most 16) for 20 s.
fn serves_once_then_hangs() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for (n, s) in l.incoming().enumerate().take(16) {
            let Ok(mut s) = s else { return };
            if n > 0 {
                held.push(s);
                continue;
            }
            if zcfs_transport::server_handshake(
                &mut s,
                None,
                Integrity::Headers,
                8,
                1,
                Duration::from_secs(5),
                &mut |_| {
                    Ok(zcfs_transport::Joined {
                        resumed: false,
                        serial: 1,
                    })
                },
            )
            .is_err()
            {
                return;
            }
            std::thread::spawn(move || loop {
                let Some((h, body)) = read_request(&mut s) else {
                    return;
                };
                let body = match Request::decode_with_groups(&h, &body) {
                    Ok((Request::Lookup(l), _)) if l.name.as_bytes() == b"." => {
                        entry_of(l.parent.ino)
                    }
                    Ok((Request::Lookup(_), _)) => entry_of(5),
                    _ => Vec::new(),
                };
                let r = RespHeader::ok(h.op, h.id, body.len() as u32, 0).encode();
                if std::io::Write::write_all(&mut s, &[&r[..], &body[..]].concat()).is_err() {
                    return;
                }
            });
        }
        std::thread::sleep(Duration::from_secs(20));
        drop(held);
    });
    addr
}

/// Review 29, finding 2 (79e51a7): with a FORGET of the node lost with its connection,
/// `RemoteFs::hold` now dials once in `wait_posted_for` (to send the FORGET again) and,
/// when that dial fails, logs and sends its lookup anyway, which dials again: with the
/// server unreachable a lookup of a node by its number (an NFS export's file handle,
/// `open_by_handle_at`) fails after two client timeouts rather than one (three rather
/// than two when the dial's error is one `exchange` retries, a connect timeout). The
/// wait's failed dial is the answer the lookup would get ("the caller's request meets
/// the same", as its comment says); the lookup need not wait it out a second time.
#[test]
fn a_hold_with_a_lost_forget_fails_within_one_timeout_when_the_server_is_unreachable() {
    use zcfs_backend::{Backend, Ctx, ROOT};
    let addr = serves_once_then_hangs();
    let t_out = Duration::from_millis(600);
    let mut cfg = ClientConfig::new(&addr.to_string());
    cfg.connections = 1;
    cfg.timeout = t_out;
    let fs = crate::RemoteFs::connect(cfg).unwrap();
    let ctx = Ctx::user(0, 0);
    let a = fs.lookup(&ctx, ROOT, b"a").unwrap();
    assert_eq!(a.ino, 5);
    // The kernel forgets node 5 (posted); its connection is lost before the reply
    // counts (a reply on it timed out), and the server can no longer be reached.
    let first = lock(&fs.client().conns[0]).clone().unwrap();
    fs.forget(a.ino, 1);
    first.break_with("review 29: a reply on it timed out");
    assert_eq!(fs.client().posted_unanswered(), 1);
    // Then the kernel looks node 5 up by its number.
    let t0 = std::time::Instant::now();
    let r = fs.hold(5, 0);
    let took = t0.elapsed();
    assert!(r.is_err(), "{r:?}");
    assert!(
        took < t_out * 3 / 2,
        "holding node 5 failed after {took:?}, the client's timeout being {t_out:?}: it \
         dialled the unreachable server twice, once in wait_posted_for and again for the \
         lookup"
    );
}

/// Full connection attempts after stalls in a row: one second after the first, doubling
/// with each further stall, never more than `STALLED_DIAL_RETRY_MAX` (and no overflow
/// however many stalls).
#[test]
fn full_attempts_after_stalls_back_off_up_to_their_bound() {
    assert_eq!(full_attempt_after(0), STALLED_DIAL_RETRY);
    assert_eq!(full_attempt_after(1), STALLED_DIAL_RETRY);
    assert_eq!(full_attempt_after(2), STALLED_DIAL_RETRY * 2);
    assert_eq!(full_attempt_after(3), STALLED_DIAL_RETRY * 4);
    assert_eq!(full_attempt_after(6), STALLED_DIAL_RETRY_MAX);
    assert_eq!(full_attempt_after(7), STALLED_DIAL_RETRY_MAX);
    assert_eq!(full_attempt_after(u32::MAX), STALLED_DIAL_RETRY_MAX);
    let d = DialStall::default();
    assert!(d.last().is_none());
    let e = Error::new(libc::ETIMEDOUT, "stalled");
    d.record(&e);
    let (_, _, full_now) = d.last().unwrap();
    assert!(!full_now, "a full attempt right after a stall");
    d.record(&e);
    assert_eq!(lock(&d.0).as_ref().unwrap().in_a_row, 2);
    d.clear();
    assert!(d.last().is_none());
    d.record(&e);
    assert_eq!(
        lock(&d.0).as_ref().unwrap().in_a_row,
        1,
        "counted again after a success"
    );
}

/// A short attempt's patience follows the link: three times the quickest of the last
/// `RECENT_HANDSHAKES` handshakes, never below `STALLED_DIAL_PATIENCE` and never above
/// half the timeout; one slow handshake (a server resuming) does not lengthen it.
#[test]
fn a_short_attempt_has_the_patience_of_the_link() {
    let mut cfg = ClientConfig::new("127.0.0.1:9");
    cfg.timeout = Duration::from_secs(10);
    let c = Client::new(cfg);
    let add = |ms| lock(&c.handshakes).add(Duration::from_millis(ms));
    assert_eq!(
        c.short_patience(),
        STALLED_DIAL_PATIENCE,
        "nothing known yet"
    );
    add(1);
    assert_eq!(c.short_patience(), STALLED_DIAL_PATIENCE, "a fast link");
    add(1500);
    assert_eq!(
        c.short_patience(),
        STALLED_DIAL_PATIENCE,
        "one slow handshake"
    );
    for _ in 0..RECENT_HANDSHAKES - 1 {
        add(200);
    }
    assert_eq!(
        c.short_patience(),
        Duration::from_millis(600),
        "a link now long"
    );
    for _ in 0..RECENT_HANDSHAKES {
        add(60_000);
    }
    assert_eq!(
        c.short_patience(),
        Duration::from_secs(5),
        "at most half the timeout"
    );
    let mut cfg = ClientConfig::new("127.0.0.1:9");
    cfg.timeout = Duration::from_millis(50);
    let c = Client::new(cfg);
    assert_eq!(
        c.short_patience(),
        Duration::from_millis(50),
        "never above the timeout"
    );
}
