//! Requests that arrive together: a client with several requests in flight on one
//! connection, whose bytes the server takes with one recv into its receive buffer
//! (`zcfs_transport::RecvBuf`), and replies that the client takes the same way. Every
//! message must be answered, in order, with the right bytes, whatever the boundaries
//! of the buffer fall on: inside a header, a body, a payload or its tag.

mod common;
use common::*;
use std::io::Write;
use zcfs_backend::ROOT;
use zcfs_client::{Client, ClientConfig};
use zcfs_protocol::channel::Integrity;
use zcfs_protocol::{Cred, GetattrReq, NodeRef, ReadReq, Request, Wire, WriteReq};
use zcfs_server::ServerConfig;
use zcfs_transport::RECV_BUF_SIZE;

/// Payload sizes around the receive buffer's size and a page's.
const SIZES: [usize; 14] = [
    0,
    1,
    100,
    4095,
    4096,
    RECV_BUF_SIZE - 200,
    RECV_BUF_SIZE - 1,
    RECV_BUF_SIZE,
    RECV_BUF_SIZE + 1,
    RECV_BUF_SIZE + 300,
    2 * RECV_BUF_SIZE + 7,
    40_000,
    70_001,
    300_000,
];

/// Bytes that differ by position and by message.
fn pattern(seed: usize, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(131) ^ (i >> 9)) as u8)
        .collect()
}

/// Write `data` into the model at `off`.
fn put(model: &mut Vec<u8>, off: usize, data: &[u8]) {
    if model.len() < off + data.len() {
        model.resize(off + data.len(), 0);
    }
    model[off..off + data.len()].copy_from_slice(data);
}

/// What a read of `size` at `off` returns from the model (short at its end).
fn expect(model: &[u8], off: usize, size: usize) -> Vec<u8> {
    let end = (off + size).min(model.len());
    model.get(off..end).map_or(Vec::new(), |s| s.to_vec())
}

/// Writes of every size in `SIZES`, each followed by a read of what it wrote and a
/// getattr, all in ONE write to the socket: the server's first recv takes many of them
/// at once, and buffer boundaries fall everywhere. Every reply comes in order and right.
#[test]
fn requests_sent_in_one_segment_are_each_answered_in_order() {
    let fs = memory_fs(64 << 20);
    let srv = Running::start(fs.clone(), config());
    let (a, fh) = file(&*fs, b"f");
    let mut raw = srv.raw(7);
    let node = NodeRef::ino(a.ino);
    let mut model = Vec::new();
    let mut wire = Vec::new();
    // (id, what the reply must carry: written count, read data, or attributes)
    enum Want {
        Written(u32),
        Data(Vec<u8>),
        Attr,
    }
    let mut wants = Vec::new();
    let mut id = 100u64;
    let mut off = 0usize;
    for (k, &n) in SIZES.iter().enumerate() {
        let data = pattern(k, n);
        let reqs: [(Request, &[u8], Want); 3] = [
            (
                WriteReq {
                    node,
                    fh: 0,
                    offset: off as u64,
                    size: n as u32,
                    commit: false,
                }
                .into(),
                &data,
                Want::Written(n as u32),
            ),
            (
                ReadReq {
                    node,
                    fh: 0,
                    offset: off as u64,
                    size: n as u32 + 10,
                }
                .into(),
                &[],
                Want::Data(Vec::new()),
            ),
            (GetattrReq { node }.into(), &[], Want::Attr),
        ];
        put(&mut model, off, &data);
        for (req, payload, want) in reqs {
            id += 1;
            let (h, body) = req.encode_with_groups(id, Cred::default(), &[]).unwrap();
            wire.extend_from_slice(&h);
            wire.extend_from_slice(&body);
            wire.extend_from_slice(payload);
            let want = match (&req, want) {
                (Request::Read(r), Want::Data(_)) => {
                    Want::Data(expect(&model, r.offset as usize, r.size as usize))
                }
                (_, w) => w,
            };
            wants.push((id, want));
        }
        // The next write begins inside this one's last bytes: overlaps are applied in
        // order too.
        off += n.max(1) - n.min(3);
    }
    raw.s.write_all(&wire).unwrap();
    for (id, want) in wants {
        let r = raw.receive(id);
        assert_eq!(r.status, 0, "request {id}");
        match want {
            Want::Written(n) => {
                let w = zcfs_protocol::WriteReply::decode(&r.body).unwrap();
                assert_eq!(w.written, n, "request {id}");
            }
            Want::Data(d) => assert!(r.data == d, "request {id}: the read's bytes differ"),
            Want::Attr => assert!(!r.body.is_empty()),
        }
    }
    assert!(read_all(&*fs, a.ino, fh, 0, model.len() as u32 + 1).unwrap() == model);
    // The buffer did take payload bytes (the test reached the path it is about), and
    // never more of one message than the buffer holds.
    let st = srv.report();
    let payload: usize = SIZES.iter().sum();
    assert!(st.recv_buffer_payload_bytes > 0, "{st:?}");
    assert!(
        st.recv_buffer_payload_bytes as usize <= payload.min(SIZES.len() * RECV_BUF_SIZE),
        "{st:?}"
    );
}

/// Large writes one after another: at most one buffer's worth of the first one's
/// payload passes through the buffer (it came behind a header read whole), and none of
/// the writes after it (after a write the server takes only the next header).
#[test]
fn writes_after_a_write_are_received_in_place() {
    let fs = memory_fs(64 << 20);
    let srv = Running::start(fs.clone(), config());
    let (a, fh) = file(&*fs, b"f");
    let mut raw = srv.raw(8);
    let data = pattern(9, 4 << 20);
    for (i, part) in data.chunks(1 << 20).enumerate() {
        let w = WriteReq {
            node: NodeRef::ino(a.ino),
            fh: 0,
            offset: (i << 20) as u64,
            size: part.len() as u32,
            commit: false,
        };
        assert_eq!(raw.call_with(w, part).status, 0);
    }
    assert!(read_all(&*fs, a.ino, fh, 0, 4 << 20).unwrap() == data);
    let st = srv.report();
    assert!(
        st.recv_buffer_payload_bytes <= RECV_BUF_SIZE as u64,
        "{} bytes copied out of the buffer for four 1 MiB writes",
        st.recv_buffer_payload_bytes
    );
}

/// Writes that arrive together (a client's gathered writes, which do not ask to be
/// committed): their replies are held back while the next request is already here
/// whole and go out several per send, every one in order; a request with nothing behind
/// it is answered at once (never held waiting for a request that does not come).
#[test]
fn replies_to_requests_already_here_go_out_together() {
    let fs = memory_fs(64 << 20);
    let srv = Running::start(fs.clone(), config());
    let (a, fh) = file(&*fs, b"f");
    let mut raw = srv.raw(10);
    raw.s
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let node = NodeRef::ino(a.ino);
    const WRITES: u64 = 48;
    let mut wire = Vec::new();
    let mut model = Vec::new();
    for i in 0..WRITES {
        let data = pattern(i as usize, 4096);
        let w = WriteReq {
            node,
            fh: 0,
            offset: i * 4096,
            size: 4096,
            commit: false,
        };
        let (h, body) = Request::from(w)
            .encode_with_groups(1000 + i, Cred::default(), &[])
            .unwrap();
        wire.extend_from_slice(&h);
        wire.extend_from_slice(&body);
        wire.extend_from_slice(&data);
        model.extend_from_slice(&data);
    }
    raw.s.write_all(&wire).unwrap();
    for i in 0..WRITES {
        let r = raw.receive(1000 + i);
        assert_eq!(r.status, 0, "write {i}");
        let w = zcfs_protocol::WriteReply::decode(&r.body).unwrap();
        assert_eq!(w.written, 4096, "write {i}");
    }
    assert!(read_all(&*fs, a.ino, fh, 0, model.len() as u32).unwrap() == model);
    let st = srv.report();
    assert!(
        st.replies_held >= WRITES / 2,
        "{} of {WRITES} replies held back",
        st.replies_held
    );
    assert!(
        st.held_reply_sends * 2 <= st.replies_held,
        "{} sends for {} held replies",
        st.held_reply_sends,
        st.replies_held
    );
    // Nothing behind it: answered now (the read timeout above bounds the wait).
    for _ in 0..20 {
        assert_eq!(raw.call(GetattrReq { node }).status, 0);
    }
}

/// A bad message behind good ones ends the connection, but the replies of the good
/// ones, held back while it was already there, still go out first.
#[test]
fn replies_held_back_go_out_before_a_bad_message_ends_the_connection() {
    let fs = memory_fs(64 << 20);
    let srv = Running::start(fs.clone(), config());
    let (a, _) = file(&*fs, b"f");
    let mut raw = srv.raw(11);
    raw.s
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut wire = Vec::new();
    for i in 0..5u64 {
        let w = WriteReq {
            node: NodeRef::ino(a.ino),
            fh: 0,
            offset: i * 512,
            size: 512,
            commit: false,
        };
        let (h, body) = Request::from(w)
            .encode_with_groups(500 + i, Cred::default(), &[])
            .unwrap();
        wire.extend_from_slice(&h);
        wire.extend_from_slice(&body);
        wire.extend_from_slice(&pattern(i as usize, 512));
    }
    wire.extend_from_slice(&[0xff; zcfs_protocol::REQ_HDR]);
    raw.s.write_all(&wire).unwrap();
    for i in 0..5u64 {
        assert_eq!(raw.receive(500 + i).status, 0, "write {i}");
    }
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut raw.s, &mut rest);
    assert!(rest.is_empty(), "nothing answers the bad message");
}

const SECRET: &[u8] = b"a-pipelining-test-secret";

/// The client library with many requests in flight on one connection (submitted, then
/// waited for in order), in each channel mode: payload tags (full integrity) fall
/// across buffer boundaries on both sides. Reads see every write before them.
fn pipelined_through_the_client(secret: Option<&[u8]>, integrity: Integrity) {
    let fs = memory_fs(64 << 20);
    let srv = Running::start(
        fs.clone(),
        ServerConfig {
            secret: secret.map(|s| s.to_vec()),
            integrity,
            ..config()
        },
    );
    let (a, fh) = file(&*fs, b"f");
    let mut cfg = ClientConfig::new(&srv.addr().to_string());
    cfg.secret = secret.map(|s| s.to_vec());
    cfg.integrity = integrity;
    cfg.connections = 1;
    cfg.timeout = std::time::Duration::from_secs(10);
    let c = Client::new(cfg);
    let caller = zcfs_client::Caller {
        cred: Cred {
            uid: 1000,
            gid: 1000,
        },
        groups: &[],
    };
    let node = NodeRef::ino(a.ino);
    let mut model = Vec::new();
    for round in 0..3 {
        let mut tickets = Vec::new();
        let mut off = round * 1000;
        for (k, &n) in SIZES.iter().enumerate() {
            let data = pattern(round * 100 + k, n);
            let w: Request = WriteReq {
                node,
                fh: 0,
                offset: off as u64,
                size: n as u32,
                commit: false,
            }
            .into();
            put(&mut model, off, &data);
            tickets.push((c.submit(&w, caller, &[&data]).unwrap(), None));
            let r: Request = ReadReq {
                node,
                fh: 0,
                offset: off.saturating_sub(50) as u64,
                size: n as u32 + 100,
            }
            .into();
            let want = expect(&model, off.saturating_sub(50), n + 100);
            tickets.push((c.submit(&r, caller, &[]).unwrap(), Some(want)));
            off += n / 2 + 1;
        }
        for (i, (t, want)) in tickets.into_iter().enumerate() {
            let r = t
                .wait()
                .unwrap_or_else(|e| panic!("round {round}, request {i}: {e}"));
            if let Some(want) = want {
                assert!(r.data == want, "round {round}, request {i}: read differs");
            }
        }
    }
    assert!(read_all(&*fs, a.ino, fh, 0, model.len() as u32 + 1).unwrap() == model);
    let _ = ROOT;
}

#[test]
fn pipelined_requests_without_a_secret() {
    pipelined_through_the_client(None, Integrity::Headers);
}

#[test]
fn pipelined_requests_with_header_macs() {
    pipelined_through_the_client(Some(SECRET), Integrity::Headers);
}

#[test]
fn pipelined_requests_with_payload_macs() {
    pipelined_through_the_client(Some(SECRET), Integrity::Full);
}

/// `Client::submit_batch` at its bound: SUBMIT_BATCH_MAX writes go out in one call and
/// each lands; one more is refused (EINVAL) before anything is sent.
#[test]
fn a_batch_at_its_bound_is_sent_and_one_over_it_is_refused() {
    use zcfs_client::{Caller, SUBMIT_BATCH_MAX};
    let vol = memory_fs(64 << 20);
    let (f, fh) = file(&*vol, b"b");
    let srv = Running::start(vol.clone(), config());
    let client = srv.client().client().clone();
    // (fh 0: no handle, as the other requests here send.)
    let sfh = 0;
    let batch = |n: usize, seed: usize| -> Vec<(Request, Vec<u8>)> {
        (0..n)
            .map(|i| {
                let w = WriteReq {
                    node: NodeRef::ino(f.ino),
                    fh: sfh,
                    offset: (i * 512) as u64,
                    size: 512,
                    commit: false,
                };
                (w.into(), pattern(seed + i, 512))
            })
            .collect()
    };
    let over = batch(SUBMIT_BATCH_MAX + 1, 1000);
    let msgs: Vec<(Request, Caller<'_>, &[u8])> = over
        .iter()
        .map(|(r, d)| (r.clone(), Caller::process(), &d[..]))
        .collect();
    let e = client
        .submit_batch(&msgs)
        .err()
        .expect("one over the bound");
    assert_eq!(e.errno, libc::EINVAL);
    assert!(
        read_all(&*vol, f.ino, fh, 0, 512).unwrap().is_empty(),
        "nothing sent"
    );
    let at = batch(SUBMIT_BATCH_MAX, 0);
    let msgs: Vec<(Request, Caller<'_>, &[u8])> = at
        .iter()
        .map(|(r, d)| (r.clone(), Caller::process(), &d[..]))
        .collect();
    for t in client.submit_batch(&msgs).unwrap() {
        t.wait().unwrap();
    }
    let model: Vec<u8> = at.iter().flat_map(|(_, d)| d.clone()).collect();
    assert!(read_all(&*vol, f.ino, fh, 0, model.len() as u32).unwrap() == model);
}
