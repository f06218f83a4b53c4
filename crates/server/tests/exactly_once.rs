//! What the fixes of the wire review (issue 8) promise beyond the review's own tests
//! (`review.rs`): the session reply cache (a resent request executes once, within the
//! cache's bounds), the bounds on connections in the handshake, open flags, posted
//! forgets surviving a lost connection, references across a lost session, and ".." of a
//! directory whose parent's number was reused.

mod common;
use common::*;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;
use zcfs_backend::*;
use zcfs_protocol::{
    Cred, FallocateReq, GetattrReq, MadeReply, MkdirReq, Name, NodeRef, OpenReply, OpenReq,
    ReadReq, Request, Wire, WriteReq,
};
use zcfs_server::{ServerConfig, REPLY_CACHE_ENTRIES};

const MIB: usize = 1 << 20;

/// Send `req` with request id `id` on `raw` and wait for its reply.
fn call_id(raw: &mut Raw, id: u64, req: impl Into<Request>) -> RawReply {
    let (h, body) = req.into().encode(id, Cred::default());
    raw.send(&h, &body, &[]);
    raw.receive(id)
}

fn mkdir(name: &str) -> MkdirReq {
    MkdirReq {
        umask: 0,
        parent: NodeRef::ino(ROOT),
        name: Name::new(name).unwrap(),
        mode: 0o755,
    }
}

/// A request sent again with its id, on another connection of the session (as a client
/// does after a lost connection), is answered with the first reply and not executed
/// again: the directory is made once, the session holds one reference to it.
#[test]
fn a_resent_request_is_answered_from_the_reply_cache() {
    let srv = Running::start(memory_fs(64 * MIB), config());
    let mut a = srv.raw(0x5e55);
    let first = call_id(&mut a, 7, mkdir("d"));
    assert_eq!(first.status, 0);
    let d = MadeReply::decode(&first.body).unwrap().attr;
    drop(a);
    let mut b = srv.raw(0x5e55);
    let again = call_id(&mut b, 7, mkdir("d"));
    assert_eq!((again.status, again.body), (0, first.body));
    let r = srv.report();
    assert_eq!((r.replies_replayed, r.references_held), (1, 1));
    assert_eq!(r.ops["mkdir"].count, 1, "executed once");
    // Another id is another request: executed (the name exists now).
    assert_eq!(call_id(&mut b, 8, mkdir("d")).status, libc::EEXIST);
    // Ids are per session: another client's id 7 is its own.
    let mut other = srv.raw(0x07e4);
    assert_eq!(call_id(&mut other, 7, mkdir("d")).status, libc::EEXIST);
    // An id reused for another operation is a new request, not a replay.
    let g = call_id(
        &mut b,
        7,
        GetattrReq {
            node: NodeRef::new(d.ino, d.generation),
        },
    );
    assert_eq!(g.status, 0);
    assert_eq!(srv.report().replies_replayed, 1);
}

/// The cache keeps the last REPLY_CACHE_ENTRIES replies of a session: a request resent
/// after that many others is still answered from it; one more, and it executes again.
#[test]
fn the_reply_cache_keeps_the_last_replies_of_a_session() {
    let srv = Running::start(memory_fs(64 * MIB), config());
    let mut raw = srv.raw(0xcace);
    // Header and body go out in separate writes: without this, each request waits for
    // a delayed ACK.
    raw.s.as_tcp().unwrap().set_nodelay(true).unwrap();
    assert_eq!(call_id(&mut raw, 1, mkdir("d")).status, 0);
    let getattr = || GetattrReq {
        node: NodeRef::ino(ROOT),
    };
    for id in 2..=REPLY_CACHE_ENTRIES as u64 {
        assert_eq!(call_id(&mut raw, id, getattr()).status, 0);
    }
    let r = srv.report();
    assert_eq!(r.replies_cached, REPLY_CACHE_ENTRIES as u64);
    assert!(r.reply_cache_bytes > 0);
    assert_eq!(call_id(&mut raw, 1, mkdir("d")).status, 0, "replayed");
    assert_eq!(
        call_id(&mut raw, REPLY_CACHE_ENTRIES as u64 + 1, getattr()).status,
        0
    );
    assert_eq!(srv.report().replies_cached, REPLY_CACHE_ENTRIES as u64);
    assert_eq!(
        call_id(&mut raw, 1, mkdir("d")).status,
        libc::EEXIST,
        "evicted: executed again"
    );
}

/// A TCP connection from `src` (any 127/8 address works on loopback).
fn connect_from(src: Ipv4Addr, to: SocketAddr) -> TcpStream {
    use std::os::unix::io::FromRawFd;
    let SocketAddr::V4(to) = to else {
        panic!("IPv4 only")
    };
    let sa = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: socket, bind and connect on a descriptor we own, with pointers to locals
    // of the right type and their sizes; the descriptor goes to TcpStream, which closes
    // it.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let from = sa(src, 0);
        let r = libc::bind(fd, &from as *const _ as *const libc::sockaddr, len);
        assert_eq!(r, 0, "bind {src}: {}", std::io::Error::last_os_error());
        let dst = sa(*to.ip(), to.port());
        let r = libc::connect(fd, &dst as *const _ as *const libc::sockaddr, len);
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        TcpStream::from_raw_fd(fd)
    }
}

/// Whether the server closed `s` (refused it) rather than waiting for its hello.
fn refused(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        other => panic!("{other:?}"),
    }
}

/// Connections in the handshake are bounded in all and per address, below the
/// connection limit: exactly the bound is served, one more is refused at once, and a
/// place that frees up is taken again; an authenticated client still gets in.
#[test]
fn connections_in_the_handshake_are_bounded_in_all_and_per_address() {
    let cfg = ServerConfig {
        max_connections: 8,
        max_handshakes: 3,
        max_handshakes_per_addr: 2,
        ..config()
    };
    assert_eq!(cfg.handshake_limits(), (3, 2));
    let srv = Running::start(memory_fs(16 * MIB), cfg);
    let addr = srv.addr();
    let local = |n: u8| Ipv4Addr::new(127, 0, 0, n);
    let waiting = |n: usize| {
        eventually(
            Duration::from_secs(5),
            "connections in the handshake",
            || srv.report().connections_handshaking == n,
        )
    };
    let mut a1 = connect_from(local(1), addr);
    let mut a2 = connect_from(local(1), addr);
    waiting(2);
    let mut a3 = connect_from(local(1), addr);
    assert!(refused(&mut a3), "a third from one address");
    assert!(!refused(&mut a1) && !refused(&mut a2));
    let mut b1 = connect_from(local(2), addr);
    waiting(3);
    assert!(!refused(&mut b1), "another address, within the total");
    let mut c1 = connect_from(local(3), addr);
    assert!(refused(&mut c1), "over the total");
    assert_eq!(srv.report().rejected_handshake_limit, 2);
    assert_eq!(srv.report().connections_active, 3);
    drop(a1);
    waiting(2);
    let mut a4 = connect_from(local(1), addr);
    waiting(3);
    assert!(!refused(&mut a4), "the freed place is taken again");
    drop((a2, a4, b1));
    waiting(0);
    // A client finishes its handshake and is no longer counted in it.
    let fs = srv.client_with(|c| c.connections = 1);
    fs.statfs().unwrap();
    let r = srv.report();
    assert_eq!((r.connections_handshaking, r.connections_active), (0, 1));
    // The bounds as applied: below max_connections, the per-address one within.
    let limits = |max_connections, max_handshakes, max_handshakes_per_addr| {
        ServerConfig {
            max_connections,
            max_handshakes,
            max_handshakes_per_addr,
            ..config()
        }
        .handshake_limits()
    };
    assert_eq!(limits(64, 16, 4), (16, 4));
    assert_eq!(limits(2, 16, 4), (1, 1));
    assert_eq!(limits(10, 100, 100), (9, 9));
    assert_eq!(limits(1, 16, 4), (1, 1));
}

/// EBADF for a read through a handle opened write-only and for fallocate through one
/// opened read-only; a handle opened read-write does both.
#[test]
fn a_handle_does_only_what_it_was_opened_for() {
    let srv = Running::start(memory_fs(64 * MIB), config());
    let fs = srv.client();
    let (f, fh) = file(&fs, b"f");
    fs.write(&ctx(), f.ino, fh, 0, b"contents").unwrap();
    let node = NodeRef::new(f.ino, f.generation);
    let mut raw = srv.raw(0xf1a6);
    let open = |raw: &mut Raw, flags| {
        let r = raw.call(OpenReq { node, flags });
        assert_eq!(r.status, 0);
        OpenReply::decode(&r.body).unwrap().fh
    };
    let (wo, ro, rw) = (
        open(&mut raw, libc::O_WRONLY),
        open(&mut raw, libc::O_RDONLY),
        open(&mut raw, libc::O_RDWR),
    );
    let read = |fh| ReadReq {
        node,
        fh,
        offset: 0,
        size: 8,
    };
    let fallocate = |fh| FallocateReq {
        node,
        fh,
        offset: 0,
        len: 2 * MIB as u64,
        mode: 0,
    };
    assert_eq!(raw.call(read(wo)).status, libc::EBADF);
    assert_eq!(raw.call(fallocate(ro)).status, libc::EBADF);
    let write = WriteReq {
        node,
        fh: wo,
        offset: 0,
        size: 3,
        commit: false,
    };
    assert_eq!(raw.call_with(write, b"new").status, 0);
    let r = raw.call(read(rw));
    assert_eq!((r.status, &r.data[..]), (0, &b"newtents"[..]));
    assert_eq!(raw.call(fallocate(rw)).status, 0);
    assert_eq!(fs.getattr(f.ino).unwrap().size, 2 * MIB as u64);
    fs.release(f.ino, fh).unwrap();
}

/// A forget the client has to send while no connection is up is sent with the next
/// one (the session is resumed and would keep the reference otherwise).
#[test]
fn a_forget_made_while_disconnected_goes_out_with_the_next_connection() {
    let srv = Running::start(memory_fs(64 * MIB), config());
    let fs = srv.client();
    let (f, fh) = file(&fs, b"f");
    fs.release(f.ino, fh).unwrap();
    assert_eq!(srv.report().references_held, 1);
    fs.client().disconnect();
    fs.forget(f.ino, 1);
    assert_eq!(fs.client().posted_unanswered(), 1);
    fs.statfs().unwrap();
    eventually(
        Duration::from_secs(5),
        "the forget reached the server",
        || srv.report().references_held == 0,
    );
    eventually(Duration::from_secs(5), "its reply came", || {
        fs.client().posted_unanswered() == 0
    });
    assert!(
        fs.client()
            .resumed
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
}

/// Lookups racing a reconnection that finds the session gone: every reference a lookup
/// of the new session took is counted (none is wiped by the revalidation), so once the
/// caller gave all of its back the server holds none.
#[test]
fn lookups_racing_a_lost_session_leave_no_reference_behind() {
    let grace = Duration::from_millis(100);
    let srv = Running::start(memory_fs(64 * MIB), ServerConfig { grace, ..config() });
    let fs = Arc::new(srv.client_with(|c| c.connections = 4));
    empty_files(&*fs, ROOT, "f", 4);
    for round in 0..10 {
        fs.client().disconnect();
        eventually(Duration::from_secs(5), "the session expired", || {
            srv.report().sessions_expired == round + 1
        });
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let fs = fs.clone();
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        let a = fs.lookup(&ctx(), ROOT, format!("f{i}").as_bytes()).unwrap();
                        fs.forget(a.ino, 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        eventually(Duration::from_secs(5), "every reference given back", || {
            srv.report().references_held == 0
        });
    }
    assert_eq!(
        fs.client()
            .revalidations
            .load(std::sync::atomic::Ordering::Relaxed),
        10
    );
}

/// ".." of a directory that was removed while referenced is ENOENT: its parent's number
/// may have been reused meanwhile, and a reference taken without a generation would
/// reach the new inode. ".." of a live directory is its parent, with a reference.
#[test]
fn dotdot_never_reaches_an_inode_that_reused_the_parents_number() {
    let srv = Running::start(memory_fs(64 * MIB), config());
    let fs = srv.client();
    let c = ctx();
    let a = fs.mkdir(&c, ROOT, b"a", 0o755).unwrap();
    let b = fs.mkdir(&c, a.ino, b"b", 0o755).unwrap();
    let up = fs.lookup(&c, b.ino, b"..").unwrap();
    assert_eq!((up.ino, up.generation), (a.ino, a.generation));
    fs.forget(up.ino, 1);
    // b stays referenced (our caller holds it) after it and its parent are removed.
    fs.rmdir(&c, a.ino, b"b").unwrap();
    fs.rmdir(&c, ROOT, b"a").unwrap();
    fs.forget(a.ino, 1);
    eventually(Duration::from_secs(5), "a freed", || {
        srv.report().references_held == 1
    });
    // The lowest free number is a's: the next directory takes it.
    let n = fs.mkdir(&c, ROOT, b"n", 0o755).unwrap();
    assert_eq!(
        n.ino, a.ino,
        "the number was not reused: the test proves nothing"
    );
    match fs.lookup(&c, b.ino, b"..") {
        Err(e) => assert_eq!(e.errno, libc::ENOENT),
        Ok(x) => panic!(
            "\"..\" of a removed directory is inode {} generation {} (the new \"n\" is \
             generation {})",
            x.ino, x.generation, n.generation
        ),
    }
    fs.forget(b.ino, 1);
    fs.forget(n.ino, 1);
    eventually(Duration::from_secs(5), "nothing held", || {
        srv.report().references_held == 0
    });
}

/// A server at its handshake bound closes a new connection before its Welcome; the
/// client tries again (within its timeout) and gets in once a place frees up, instead of
/// failing at once: a host starting many clients together is not turned away.
#[test]
fn a_client_refused_at_a_bound_gets_in_once_a_place_frees_up() {
    let cfg = ServerConfig {
        max_connections: 8,
        max_handshakes: 1,
        max_handshakes_per_addr: 1,
        ..config()
    };
    let srv = Running::start(memory_fs(16 * MIB), cfg);
    // A peer that says nothing holds the one place in the handshake for a while.
    let hog = TcpStream::connect(srv.addr()).unwrap();
    eventually(
        Duration::from_secs(5),
        "the silent peer in the handshake",
        || srv.report().connections_handshaking == 1,
    );
    let freer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(hog);
    });
    let fs = srv.client_with(|c| c.connections = 1);
    fs.statfs().unwrap();
    freer.join().unwrap();
    assert!(
        srv.report().rejected_handshake_limit >= 1,
        "the client was never refused: the test proves nothing"
    );
}
