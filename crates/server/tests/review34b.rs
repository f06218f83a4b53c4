//! Second review of session 34's held replies (54aa4ab, with the fixes 32aca69, 0fe87c8,
//! 1a7cd74). `flush_held_unless` runs at the loop top (looking only at whether *some*
//! byte of the next request is here) and after the next request's header and body are
//! in (looking at whether it is "here whole and quick"). Between those two points, and
//! inside a request judged quick, the connection's thread can still block or run
//! something slow with replies held. Each test asserts what the server did before the
//! change (a reply leaves before the next request is waited for) and fails on c31ac9f.

#[macro_use]
mod common;
use common::*;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcfs_backend::*;
use zcfs_protocol::{
    Cred, GetattrReq, NodeRef, OpenReq, Operation, Request, Wire, WriteReq, REQ_HDR,
};

const MIB: usize = 1 << 20;

/// A file of a fresh volume, opened through a raw connection: the server's handle.
fn open_raw(raw: &mut Raw, ino: u64) -> u64 {
    let r = raw.call(OpenReq {
        node: NodeRef::ino(ino),
        flags: libc::O_RDWR,
    });
    assert_eq!(r.status, 0);
    <OpenReq as Operation>::Reply::decode(&r.body).unwrap().fh
}

/// A write request (header, body) and its payload, as the wire carries it.
fn write_msg(id: u64, ino: u64, fh: u64, offset: u64, data: &[u8], commit: bool) -> Vec<u8> {
    let (h, b) = Request::from(WriteReq {
        node: NodeRef::ino(ino),
        fh,
        offset,
        size: data.len() as u32,
        commit,
    })
    .encode(id, Cred::default());
    let mut m = Vec::new();
    m.extend_from_slice(&h);
    m.extend_from_slice(&b);
    m.extend_from_slice(data);
    m
}

fn getattr_msg(id: u64, ino: u64) -> (Vec<u8>, Vec<u8>) {
    let (h, b) = Request::from(GetattrReq {
        node: NodeRef::ino(ino),
    })
    .encode(id, Cred::default());
    (h.to_vec(), b)
}

/// Send `first` now and `rest` after `delay` (on another thread); the time until the
/// first reply comes, its id and status; then the second reply's id and status.
fn first_reply_after(
    raw: &mut Raw,
    first: Vec<u8>,
    rest: Vec<u8>,
    delay: Duration,
) -> (Duration, (u64, i32), (u64, i32)) {
    let mut tx = raw.s.try_clone().unwrap();
    raw.s
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let sent = Instant::now();
    tx.write_all(&first).unwrap();
    let later = std::thread::spawn(move || {
        std::thread::sleep(delay);
        tx.write_all(&rest).unwrap();
    });
    let (id1, r1) = raw.receive_any();
    let waited = sent.elapsed();
    later.join().unwrap();
    let (id2, r2) = raw.receive_any();
    (waited, (id1, r1.status), (id2, r2.status))
}

/// Finding A (server). The loop-top flush keeps the replies held when the next
/// request's *header* is in the receive buffer, and the check that the next request is
/// "here whole and quick" (0fe87c8) runs only after its body was read: the body's
/// `read_exact_through` waits (up to the message's deadline, the peer timeout) with
/// the replies held. Here a write and, in the same send, the 32-byte header of a
/// getattr whose body comes 3 s later (a segment lost and sent again, a client thread
/// descheduled between its header and body writes of a multi-part message): the
/// write's reply, which went out at once before 54aa4ab, waits the 3 s.
#[test]
fn a_reply_is_not_held_while_the_next_requests_body_is_still_coming() {
    let vol = memory_fs(64 * MIB);
    let (f, _) = file(&*vol, b"f");
    let srv = Running::start(vol.clone(), config());
    let mut raw = srv.raw(0x34b1);
    let sfh = open_raw(&mut raw, f.ino);
    let mut first = write_msg(300, f.ino, sfh, 0, &[1u8; 4096], false);
    let (gh, gb) = getattr_msg(301, f.ino);
    assert!(!gb.is_empty(), "a getattr has a body");
    first.extend_from_slice(&gh);
    let (waited, w, g) = first_reply_after(&mut raw, first, gb, Duration::from_secs(3));
    assert_eq!(w, (300, 0));
    assert_eq!(g, (301, 0));
    assert!(
        waited < Duration::from_secs(1),
        "the write's reply was held {waited:?}, while the server waited for the body of \
         the request behind it"
    );
}

/// Finding A' (server). The loop-top flush keeps the replies held when FIONREAD says
/// any byte is waiting, and `fill_message_start` then waits (patience) for the rest
/// of the header. After a write the next header is taken exactly (`Take::Exact`), so a
/// partial header stays on the socket and FIONREAD counts it. Here: a write answered,
/// then a second write sent with the first 10 bytes of a getattr's header; the rest of
/// the getattr 3 s later. The second write's reply waits for it.
#[test]
fn a_reply_is_not_held_while_the_next_requests_header_is_still_coming() {
    let vol = memory_fs(64 * MIB);
    let (f, _) = file(&*vol, b"f");
    let srv = Running::start(vol.clone(), config());
    let mut raw = srv.raw(0x34b2);
    let sfh = open_raw(&mut raw, f.ino);
    // A write first: the server then takes the next header exactly (`after_write`).
    raw.s
        .write_all(&write_msg(310, f.ino, sfh, 0, &[1u8; 4096], false))
        .unwrap();
    assert_eq!(raw.receive_any().0, 310);
    let mut first = write_msg(311, f.ino, sfh, 4096, &[2u8; 4096], false);
    let (gh, gb) = getattr_msg(312, f.ino);
    assert_eq!(gh.len(), REQ_HDR);
    first.extend_from_slice(&gh[..10]);
    let mut rest = gh[10..].to_vec();
    rest.extend_from_slice(&gb);
    let (waited, w, g) = first_reply_after(&mut raw, first, rest, Duration::from_secs(3));
    assert_eq!(w, (311, 0));
    assert_eq!(g, (312, 0));
    assert!(
        waited < Duration::from_secs(1),
        "the write's reply was held {waited:?}, while the server waited for the rest of \
         the next request's header"
    );
}

/// Passes everything on; a flush (what a write with `commit` runs after it,
/// `commit_if_asked`) takes 2 s, as a volume's group commit can behind a large batch
/// or a busy lock.
struct SlowFlush {
    inner: Arc<dyn Backend>,
}

impl Backend for SlowFlush {
    pass_on_the_rest!();
    pass_on! {
        lookup(ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
        statfs() -> Result<StatFs>;
        write_with(ctx: &Ctx, ino: u64, fh: u64, offset: u64, payload: &mut dyn WritePayload) -> Result<u32>;
    }
    fn flush(&self, ino: u64, fh: u64) -> Result<()> {
        std::thread::sleep(Duration::from_secs(2));
        self.inner.flush(ino, fh)
    }
}

/// Finding B (server). 0fe87c8 counts every write whose payload is here as "quick",
/// but a write with `WriteReq::commit` (every mount write of at most COMMIT_WRITE_MAX,
/// 64 KiB: all gathered writes) runs the backend's flush before its reply
/// (`commit_if_asked`), on the connection's thread, with the replies before it held.
/// Here a write and, in the same send, a commit write whose flush takes 2 s: the first
/// write's reply, sent at once before 54aa4ab, waits for the second's commit.
#[test]
fn a_reply_is_not_held_while_a_commit_write_behind_it_commits() {
    let vol = memory_fs(64 * MIB);
    let (f, _) = file(&*vol, b"f");
    let srv = Running::start(Arc::new(SlowFlush { inner: vol.clone() }), config());
    let mut raw = srv.raw(0x34b3);
    let sfh = open_raw(&mut raw, f.ino);
    let mut first = write_msg(320, f.ino, sfh, 0, &[1u8; 4096], false);
    first.extend_from_slice(&write_msg(321, f.ino, sfh, 4096, &[2u8; 4096], true));
    let (waited, w, c) = first_reply_after(&mut raw, first, Vec::new(), Duration::ZERO);
    assert_eq!(w, (320, 0));
    assert_eq!(c, (321, 0));
    assert!(
        waited < Duration::from_secs(1),
        "the write's reply was held {waited:?}, while the commit write behind it ran its \
         flush"
    );
}
