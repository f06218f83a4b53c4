//! A connection that takes over its lane fences the older one (see the server's
//! `session::Lanes`): a request the client gave up on is never executed after what the
//! client sends on the new connection.

#[macro_use]
mod common;

use common::*;
use std::sync::Arc;
use std::time::Duration;
use zcfs_backend::{Attr, Backend, ROOT};
use zcfs_protocol::handshake::Lane;
use zcfs_protocol::{Cred, NodeRef, Request, WriteReq};

const SESSION: u64 = 0x1a4e;

fn lane(generation: u32) -> Lane {
    Lane {
        index: 0,
        generation,
    }
}

fn write_req(ino: u64, len: usize) -> Request {
    WriteReq {
        node: NodeRef::ino(ino),
        fh: 0,
        offset: 0,
        size: len as u32,
        commit: false,
    }
    .into()
}

/// A server, a client of it and an empty file "f" the client created (and closed).
fn server_with_file() -> (Running, zcfs_client::RemoteFs, Attr) {
    let srv = Running::start(memory_fs(32 << 20), config());
    let fs = srv.client();
    let (f, fh) = file(&fs, b"f");
    fs.release(f.ino, fh).unwrap();
    (srv, fs, f)
}

/// The cut-link case made exact: a write's last bytes reach the server only after the
/// client has reconnected and written again. The stale write must not land.
#[test]
fn a_write_left_on_a_replaced_connection_never_lands_after_the_next_one() {
    let (srv, fs, f) = server_with_file();

    let mut old = Raw::connect_on_lane(srv.addr(), SESSION, lane(1)).unwrap();
    let during = b"during!!";
    let (h, body) = write_req(f.ino, during.len()).encode(2, Cred::default());
    // The header, the body and half the payload: the server's thread for this
    // connection now waits for the rest (as it would on a cut link).
    old.send(&h, &body, &during[..4]);
    std::thread::sleep(Duration::from_millis(100));

    // The client gave up on it and dials the lane again: the server closes the old
    // connection before it says welcome.
    let mut new = Raw::connect_on_lane(srv.addr(), SESSION, lane(2)).unwrap();
    let after = b"after!!!";
    assert_eq!(
        new.call_with(write_req(f.ino, after.len()), after).status,
        0
    );
    // The rest of the old write arrives (a retransmission once the link is back).
    let _ = std::io::Write::write_all(&mut old.s, &during[4..]);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(read_all(&fs, f.ino, 0, 0, 64).unwrap(), after);
}

#[test]
fn a_late_connection_of_an_older_generation_is_refused_and_changes_nothing() {
    let (srv, fs, f) = server_with_file();
    let mut current = Raw::connect_on_lane(srv.addr(), SESSION, lane(5)).unwrap();
    for g in [4, 5] {
        assert!(
            Raw::connect_on_lane(srv.addr(), SESSION, lane(g)).is_err(),
            "generation {g}"
        );
    }
    // The current connection was not fenced by them.
    let data = b"still here";
    assert_eq!(
        current.call_with(write_req(f.ino, data.len()), data).status,
        0
    );
    assert_eq!(read_all(&fs, f.ino, 0, 0, 64).unwrap(), data);
    // Other lanes and other sessions are not affected by lane 0 of this one.
    let other = Lane {
        index: 1,
        generation: 1,
    };
    Raw::connect_on_lane(srv.addr(), SESSION, other).unwrap();
    Raw::connect_on_lane(srv.addr(), SESSION + 1, lane(1)).unwrap();
    assert_eq!(current.call_with(write_req(f.ino, 2), b"ok").status, 0);
}

/// A TCP relay in front of the server whose links can be frozen, as a cut link: what
/// either side sends on a frozen link is held, and goes on when it thaws (the kernel
/// retransmitting once the link is back). Links made while others are frozen flow.
struct Relay {
    addr: std::net::SocketAddr,
    links: std::sync::Arc<std::sync::Mutex<Vec<Link>>>,
}

struct Link {
    /// true while frozen.
    gate: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    pumps: Vec<std::thread::JoinHandle<()>>,
}

impl Relay {
    fn start(to: std::net::SocketAddr) -> Relay {
        use std::net::{TcpListener, TcpStream};
        use std::sync::{Arc, Condvar, Mutex};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let links: Arc<Mutex<Vec<Link>>> = Arc::default();
        let links2 = links.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let Ok(s) = TcpStream::connect(to) else {
                    return;
                };
                let gate = Arc::new((Mutex::new(false), Condvar::new()));
                let pump = |mut from: TcpStream, mut to: TcpStream| {
                    let gate = gate.clone();
                    std::thread::spawn(move || {
                        use std::io::{Read, Write};
                        let mut b = vec![0u8; 1 << 16];
                        loop {
                            let n = from.read(&mut b).unwrap_or(0);
                            // Held while frozen.
                            let (m, cv) = &*gate;
                            let mut frozen = m.lock().unwrap();
                            while *frozen {
                                frozen = cv.wait(frozen).unwrap();
                            }
                            drop(frozen);
                            if n == 0 || to.write_all(&b[..n]).is_err() {
                                let _ = to.shutdown(std::net::Shutdown::Write);
                                return;
                            }
                        }
                    })
                };
                let pumps = vec![
                    pump(c.try_clone().unwrap(), s.try_clone().unwrap()),
                    pump(s, c),
                ];
                links2.lock().unwrap().push(Link { gate, pumps });
            }
        });
        Relay { addr, links }
    }

    /// Freeze every link there is now.
    fn freeze(&self) {
        for l in self.links.lock().unwrap().iter() {
            *l.gate.0.lock().unwrap() = true;
        }
    }

    /// Thaw the frozen links and wait until each has delivered what it held and both
    /// its ends have closed (the server executed what it read, or had fenced it).
    fn thaw_frozen(&self) {
        let frozen: Vec<Link> = {
            let mut links = self.links.lock().unwrap();
            let (f, rest) = links.drain(..).partition(|l| *l.gate.0.lock().unwrap());
            *links = rest;
            f
        };
        assert!(!frozen.is_empty(), "nothing was frozen");
        for l in frozen {
            *l.gate.0.lock().unwrap() = false;
            l.gate.1.notify_all();
            for p in l.pumps {
                p.join().unwrap();
            }
        }
    }
}

/// The same cut-link case through the real client with its two connections: the write
/// whose reply times out on one lane is sent again (same id) on the other lane, times
/// out there too, and the caller gets the error. The next write redials a lane and is
/// executed; then the link comes back and the held copies arrive. The copy held on the
/// *other* lane (never redialled, so never fenced) must not land after the next write.
#[test]
fn a_write_given_up_on_another_lane_never_lands_after_the_next_one() {
    let srv = Running::start(memory_fs(32 << 20), config());
    let relay = Relay::start(srv.addr());
    let mut cfg = zcfs_client::ClientConfig::new(&relay.addr.to_string());
    cfg.connections = 2;
    cfg.timeout = Duration::from_millis(500);
    let fs = zcfs_client::RemoteFs::connect(cfg).unwrap();
    let (f, fh) = fs
        .create(&ctx(), ROOT, b"f", libc::S_IFREG | 0o644, libc::O_RDWR)
        .unwrap();
    // Both lanes connected (requests go round robin).
    for _ in 0..2 {
        write_until_done(&fs, f.ino, fh, b"before");
    }
    relay.freeze();
    let e = fs.write(&ctx(), f.ino, fh, 0, b"during").unwrap_err();
    assert_eq!(e.errno, libc::ETIMEDOUT, "{e}");
    // The link is back for new connections: the next write goes through (tried again
    // if this machine is slow enough for the short timeout to pass: it writes the same
    // bytes, so the check below holds either way).
    write_until_done(&fs, f.ino, fh, b"after!");
    // What the old connections held arrives now.
    relay.thaw_frozen();
    let fresh = srv.client();
    assert_eq!(read_all(&fresh, f.ino, 0, 0, 64).unwrap(), b"after!");
}

/// Write `data` at offset 0, trying again (bounded) while the client's short timeout
/// passes on a slow machine: the same bytes each time, so a late copy changes nothing.
fn write_until_done(fs: &zcfs_client::RemoteFs, ino: u64, fh: u64, data: &[u8]) {
    let t = std::time::Instant::now();
    while let Err(e) = fs.write(&ctx(), ino, fh, 0, data) {
        assert!(t.elapsed() < Duration::from_secs(20), "no recovery: {e}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Backend whose statfs waits until the gate opens: a request still executing when
/// its connection is fenced.
struct SlowStatfs {
    inner: Arc<dyn Backend>,
    gate: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
}

mod slow_impl {
    use super::SlowStatfs;
    use zcfs_backend::*;
    impl Backend for SlowStatfs {
        pass_on_the_rest!();
        pass_on! {
            lookup(ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
            write_with(ctx: &Ctx, ino: u64, fh: u64, offset: u64, payload: &mut dyn WritePayload) -> Result<u32>;
        }
        fn statfs(&self) -> Result<StatFs> {
            let (m, cv) = &*self.gate;
            let mut closed = m.lock().unwrap();
            while *closed {
                closed = cv.wait(closed).unwrap();
            }
            drop(closed);
            self.inner.statfs()
        }
    }
}

/// A new connection whose lane's old connection is still executing a request is
/// refused within the handshake's time (closed before its Welcome, which the client
/// takes as "dial again"), not held in the handshake for the peer timeout, past the
/// client's own timeout (the client then saw a timeout and gave up at once) and
/// holding one of the source's few handshake places all that time.
#[test]
fn a_fence_on_a_busy_connection_is_refused_within_the_handshake_time() {
    use std::sync::{Arc, Condvar, Mutex};
    let gate = Arc::new((Mutex::new(true), Condvar::new()));
    let mut cfg = config();
    cfg.handshake_timeout = Duration::from_secs(1);
    cfg.peer_timeout = Duration::from_secs(60);
    let srv = Running::start(
        Arc::new(SlowStatfs {
            inner: memory_fs(32 << 20),
            gate: gate.clone(),
        }),
        cfg,
    );
    let mut old = Raw::connect_on_lane(srv.addr(), SESSION, lane(1)).unwrap();
    let (h, body) = Request::from(zcfs_protocol::StatfsReq {}).encode(7, Cred::default());
    old.send(&h, &body, &[]);
    std::thread::sleep(Duration::from_millis(100));
    // Raw waits 10 s for the Welcome.
    let r = Raw::connect_on_lane(srv.addr(), SESSION, lane(2));
    *gate.0.lock().unwrap() = false;
    gate.1.notify_all();
    assert!(
        matches!(r, Err(zcfs_transport::TransportError::Closed)),
        "{:?}",
        r.err()
    );
    // Once the old request is done, the lane is taken.
    eventually(Duration::from_secs(10), "the lane taken", || {
        Raw::connect_on_lane(srv.addr(), SESSION, lane(3)).is_ok()
    });
}
