//! Review of session 34's change (54aa4ab: replies of a connection's thread held back
//! while the next request is already here). Each test shows one defect: it asserts the
//! behaviour the server promised before the change and fails on the reviewed code.

#[macro_use]
mod common;
use common::*;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcfs_backend::*;
use zcfs_protocol::{
    Cred, LookupName, LookupReq, NodeRef, OpenReq, Operation, Request, RespHeader, Wire, WriteReq,
    RESP_HDR,
};

const MIB: usize = 1 << 20;

/// Passes everything on; a lookup of "boom" panics (a backend bug reached by one
/// request).
struct PanicsOnBoom {
    inner: Arc<dyn Backend>,
}

impl Backend for PanicsOnBoom {
    pass_on_the_rest!();
    pass_on! {
        statfs() -> Result<StatFs>;
        write_with(ctx: &Ctx, ino: u64, fh: u64, offset: u64, payload: &mut dyn WritePayload) -> Result<u32>;
    }
    fn lookup(&self, c: &Ctx, p: u64, n: &[u8]) -> Result<Attr> {
        if n == b"boom" {
            panic!("backend bug on lookup of boom");
        }
        self.inner.lookup(c, p, n)
    }
}

/// Every reply (id, status) that reaches the peer until the server closes the
/// connection (or 5 s pass).
fn replies_until_closed(s: &mut zcfs_transport::Stream) -> Vec<(u64, i32)> {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let t = Instant::now();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    while t.elapsed() < Duration::from_secs(5) {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let mut out = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= RESP_HDR {
        let h = RespHeader::decode(bytes[at..at + RESP_HDR].try_into().unwrap()).unwrap();
        out.push((h.id, h.status));
        at += RESP_HDR + h.body_len as usize + h.data_len as usize;
    }
    out
}

/// Finding 1 (server). A write that ran is answered; then a request behind it, already
/// in the server's receive buffer, panics. Before the change the write's reply was on
/// its way before the next request was read, and the panicking request was answered
/// EIO ("it is answered with EIO if nothing of its reply went out yet", conn.rs). Now
/// both replies are only appended to `Writer.held` (the next request was here), and
/// the panic ends the connection (`ConnEnd::Panicked`, then `Out::close`) without
/// `held` ever being written: the client never learns that its write ran (its ticket
/// gets ENOTCONN: a write-behind write is then reported EIO at close although it
/// landed), and the request that hit the bug gets no EIO. The same holds for every
/// other early end of `serve` (a malformed or forged request behind replies held).
#[test]
fn replies_held_before_a_panicking_request_are_sent_before_the_connection_ends() {
    let vol = memory_fs(64 * MIB);
    let (f, _) = file(&*vol, b"f");
    let srv = Running::start(Arc::new(PanicsOnBoom { inner: vol.clone() }), config());
    let mut raw = srv.raw(0x3434);
    let r = raw.call(OpenReq {
        node: NodeRef::ino(f.ino),
        flags: libc::O_RDWR,
    });
    assert_eq!(r.status, 0);
    let sfh = <OpenReq as Operation>::Reply::decode(&r.body).unwrap().fh;
    // A write and, behind it in the same send, the request that panics.
    let data = vec![0x5au8; 4096];
    let (wh, wb) = Request::from(WriteReq {
        node: NodeRef::ino(f.ino),
        fh: sfh,
        offset: 0,
        size: data.len() as u32,
        commit: true,
    })
    .encode(100, Cred::default());
    let (lh, lb) = Request::from(LookupReq {
        parent: NodeRef::ino(ROOT),
        name: LookupName::new("boom").unwrap(),
    })
    .encode(101, Cred::default());
    let mut msg = Vec::new();
    msg.extend_from_slice(&wh);
    msg.extend_from_slice(&wb);
    msg.extend_from_slice(&data);
    msg.extend_from_slice(&lh);
    msg.extend_from_slice(&lb);
    raw.s.write_all(&msg).unwrap();
    let got = replies_until_closed(&mut raw.s);
    // The write ran (its bytes are in the file) ...
    let landed = read_all(&*vol, f.ino, open_for_read(&*vol, f.ino), 0, 4096).unwrap();
    assert_eq!(landed, data, "the write did not run at all");
    // ... so its reply must reach the client, and the panicking request its EIO.
    assert!(
        got.contains(&(100, 0)),
        "the write ran but its reply never reached the client (replies seen: {got:?})"
    );
    assert!(
        got.contains(&(101, libc::EIO)),
        "the panicking request was not answered EIO (replies seen: {got:?})"
    );
}

fn open_for_read(vol: &dyn Backend, ino: u64) -> u64 {
    vol.open(&ctx(), ino, libc::O_RDONLY).unwrap()
}

/// Finding 2 (server). A reply is held for as long as the next request takes to arrive
/// and run: `flush_held_unless` looks only at whether its first bytes are here, and
/// HELD_REPLIES_MAX / HELD_REPLY_BYTES bound how many replies wait, not for how long.
/// Here a getattr is followed (one send) by a 1 MiB write whose payload the client
/// sends over ~3 s (a slow or busy link; a 16 MiB write at 10 Mbit/s takes 13 s). Before
/// the change the getattr's reply left at once; now it waits for the whole payload and
/// the write's execution, and with pipelined writes behind it for up to 15 of them: a
/// client's 10 s call timeout then gives up on a connection whose server is well
/// (a call another thread makes is stuck behind a stranger's bulk transfer).
#[test]
fn a_reply_is_not_held_while_the_next_requests_payload_is_still_coming() {
    let vol = memory_fs(64 * MIB);
    let (f, _) = file(&*vol, b"f");
    let srv = Running::start(vol.clone(), config());
    let mut raw = srv.raw(0x3435);
    let r = raw.call(OpenReq {
        node: NodeRef::ino(f.ino),
        flags: libc::O_RDWR,
    });
    assert_eq!(r.status, 0);
    let sfh = <OpenReq as Operation>::Reply::decode(&r.body).unwrap().fh;
    let (gh, gb) = Request::from(zcfs_protocol::GetattrReq {
        node: NodeRef::ino(f.ino),
    })
    .encode(200, Cred::default());
    let data = vec![0x33u8; MIB];
    let (wh, wb) = Request::from(WriteReq {
        node: NodeRef::ino(f.ino),
        fh: sfh,
        offset: 0,
        size: data.len() as u32,
        commit: false,
    })
    .encode(201, Cred::default());
    let mut first = Vec::new();
    first.extend_from_slice(&gh);
    first.extend_from_slice(&gb);
    first.extend_from_slice(&wh);
    first.extend_from_slice(&wb);
    first.extend_from_slice(&data[..4096]);
    let mut tx = raw.s.try_clone().unwrap();
    let sent = Instant::now();
    tx.write_all(&first).unwrap();
    // The rest of the payload, in 16 pieces over ~3 s.
    let trickle = std::thread::spawn(move || {
        let rest = &data[4096..];
        for piece in rest.chunks(rest.len().div_ceil(16)) {
            std::thread::sleep(Duration::from_millis(190));
            tx.write_all(piece).unwrap();
        }
    });
    raw.s
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (id, r) = raw.receive_any();
    let waited = sent.elapsed();
    trickle.join().unwrap();
    assert_eq!((id, r.status), (200, 0));
    assert!(
        waited < Duration::from_secs(1),
        "the getattr's reply was held {waited:?}, until the write behind it had all its \
         payload"
    );
    let (id, r) = raw.receive_any();
    assert_eq!((id, r.status), (201, 0));
}

/// Run `f` on a thread of its own; fail if it takes longer than `limit` (a hang).
fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(t)) => t,
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(_) => panic!("still running after {limit:?}: hung"),
    }
}

/// Finding 3 (client). `Client::submit_batch` takes one in-flight slot per request
/// (`take_inflight_slot`) before sending any of them, and the slots are given back only
/// by the tickets' replies (or drops). A batch of more requests than the connection's
/// `max_inflight` (the server's, 64 by default; `SUBMIT_BATCH_MAX` is 64, and nothing
/// checks the batch against the connection it picked) so waits for a slot that only
/// its own unsent requests hold: it never returns, and the mount's gather (every
/// close, fsync, stat or read of the inodes in it: `InodeQueue::all_sent`) waits with
/// it. A mount reaches it when its gather holds more writes than the connection it is
/// sent on has slots: `WriteBehind`'s bound is taken from `max_inflight()` when each
/// write is queued, and a server restarted with a lower `max_inflight` (or a client
/// whose connections differ) is sent what was gathered under the old bound.
#[test]
fn a_batch_larger_than_the_connections_in_flight_slots_is_sent_not_hung() {
    let srv = Running::start(
        memory_fs(64 * MIB),
        zcfs_server::ServerConfig {
            max_inflight: 8,
            ..config()
        },
    );
    let fs = srv.client();
    let (f, _fh) = file(&fs, b"b");
    let client = fs.client().clone();
    // The server's handle (the client's own table is private): a raw open.
    let mut raw = srv.raw(0x3436);
    let r = raw.call(OpenReq {
        node: NodeRef::ino(f.ino),
        flags: libc::O_RDWR,
    });
    assert_eq!(r.status, 0);
    let sfh = <OpenReq as Operation>::Reply::decode(&r.body).unwrap().fh;
    let (ino, size) = (f.ino, 12usize);
    let written = bounded(Duration::from_secs(15), move || {
        let data = vec![7u8; 4096];
        let reqs: Vec<Request> = (0..size)
            .map(|i| {
                WriteReq {
                    node: NodeRef::ino(ino),
                    fh: sfh,
                    offset: (i * 4096) as u64,
                    size: 4096,
                    commit: false,
                }
                .into()
            })
            .collect();
        let msgs: Vec<(Request, zcfs_client::Caller<'_>, &[u8])> = reqs
            .iter()
            .map(|r| (r.clone(), zcfs_client::Caller::process(), &data[..]))
            .collect();
        let tickets = client.submit_batch(&msgs).unwrap();
        let n = tickets.len();
        for t in tickets {
            t.wait().expect("a write of the batch failed");
        }
        n
    });
    assert_eq!(written, size);
}
