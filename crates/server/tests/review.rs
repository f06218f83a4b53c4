//! Adversarial review of protocol v2 and the server/client rework (issue 8). Each test
//! shows one defect: it asserts the behaviour the protocol and design promise and fails
//! on the reviewed code.

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
use zcfs_protocol::{
    Cred, Op, ReqHeader, Request, RespHeader, WriteReq, NodeRef, MAX_DATA, REQ_HDR, RESP_HDR,
};
use zcfs_server::ServerConfig;

const MIB: usize = 1 << 20;

fn file(fs: &dyn Backend, name: &[u8]) -> (Attr, u64) {
    fs.create(&ctx(), ROOT, name, libc::S_IFREG | 0o644, libc::O_RDWR)
        .unwrap()
}

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
                let Ok(s) = TcpStream::connect(server) else { return };
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

fn pump(mut from: TcpStream, mut to: TcpStream, up: bool, cut: Arc<Mutex<Cut>>, fired: Arc<AtomicBool>) {
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
        let want = if up { Cut::BeforeRequest(op) } else { Cut::BeforeReply(op) };
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
    for i in 0..8 {
        let (e, h) = fs
            .create(&c, d.ino, format!("e{i}").as_bytes(), libc::S_IFREG | 0o644, 0)
            .unwrap();
        fs.release(e.ino, h).unwrap();
        fs.forget(e.ino, 1);
    }
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
    // The listing handed x to the caller: one reference each side.
    assert_eq!(fs.references(x), (1, 1));
    assert!(srv.report().references_held >= 1);
}

