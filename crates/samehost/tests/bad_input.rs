//! Hostile or broken applications: a full ring, corrupt ring counters, garbage on the
//! control socket, bounds of rings and handles. Each gets an errno or its connection
//! closed; the service goes on serving others.

mod common;
use common::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use zcfs_samehost::client::{Client, Error, Options};
use zcfs_samehost::proto::{Request, MAX_MESSAGE, PROTOCOL_VERSION};
use zcfs_samehost::ring::{op, Sqe, MAX_RING_ENTRIES, MIN_RING_ENTRIES};
use zcfs_samehost::server::MAX_HANDLES;

/// The service still answers a fresh client.
fn still_serving(s: &Served) {
    let mut c = Client::connect(&s.sock).unwrap();
    c.call(Sqe {
        op: op::NOP,
        ..Default::default()
    })
    .unwrap();
}

#[test]
fn a_full_ring_refuses_more_until_completions_are_reaped() {
    let s = serve("full");
    let o = Options {
        entries: MIN_RING_ENTRIES,
        ..Default::default()
    };
    let mut c = Client::connect_with(&s.sock, &o).unwrap();
    let nop = Sqe {
        op: op::NOP,
        ..Default::default()
    };
    c.submit(&[nop; MIN_RING_ENTRIES as usize]).unwrap();
    let e = c.submit(&[nop]).unwrap_err();
    assert!(matches!(e, Error::RingFull));
    assert_eq!(e.errno(), libc::EAGAIN);
    assert_eq!(
        c.wait(MIN_RING_ENTRIES as usize).unwrap().len(),
        MIN_RING_ENTRIES as usize
    );
    c.submit(&[nop; MIN_RING_ENTRIES as usize]).unwrap();
    assert_eq!(
        c.wait(MIN_RING_ENTRIES as usize).unwrap().len(),
        MIN_RING_ENTRIES as usize
    );
}

#[test]
fn ring_sizes_outside_the_bounds_are_refused() {
    let s = serve("sizes");
    for bad in [0, 1, 3, MAX_RING_ENTRIES * 2] {
        let o = Options {
            entries: bad,
            ..Default::default()
        };
        let e = Client::connect_with(&s.sock, &o).err().unwrap();
        assert_eq!(e.errno(), libc::EINVAL, "{bad} entries");
    }
    for good in [MIN_RING_ENTRIES, MAX_RING_ENTRIES] {
        let o = Options {
            entries: good,
            ..Default::default()
        };
        let mut c = Client::connect_with(&s.sock, &o).unwrap();
        c.call(Sqe {
            op: op::NOP,
            ..Default::default()
        })
        .unwrap();
    }
}

#[test]
fn corrupt_submission_counters_close_the_connection() {
    let s = serve("corrupt-sq");
    let c = Client::connect(&s.sock).unwrap();
    // SAFETY: only the counters are damaged; no reservation exists.
    let r = unsafe { c.rings_for_tests() };
    let head = r.sq_head().load(Ordering::Acquire);
    r.sq_tail()
        .store(head.wrapping_add(r.entries + 5), Ordering::Release);
    c.doorbell_for_tests();
    let mut c = c;
    eventually("the corrupt ring is noticed", || {
        s.svc.stats().corrupt_rings == 1
    });
    let e = c
        .call(Sqe {
            op: op::NOP,
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(e, Error::Disconnected | Error::RingFull), "{e:?}");
    still_serving(&s);
}

#[test]
fn corrupt_completion_counters_close_the_connection() {
    let s = serve("corrupt-cq");
    let mut c = Client::connect(&s.sock).unwrap();
    c.call(Sqe {
        op: op::NOP,
        ..Default::default()
    })
    .unwrap();
    // SAFETY: only the counters are damaged; no reservation exists.
    let r = unsafe { c.rings_for_tests() };
    r.cq_head().store(12345, Ordering::Release);
    let e = c
        .call(Sqe {
            op: op::NOP,
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(e, Error::Disconnected), "{e:?}");
    assert_eq!(s.svc.stats().corrupt_rings, 1);
    still_serving(&s);
}

#[test]
fn garbage_entries_get_errnos() {
    let s = serve("garbage");
    let mut c = Client::connect(&s.sock).unwrap();
    let buf = c.register_buffer(4096).unwrap();
    let mut x: u64 = 0x1234_5678_9abc_def1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..2000 {
        let e = Sqe {
            user_data: next(),
            op: (next() % 12) as u8,
            flags: next() as u8,
            handle: next() as u32,
            offset: next(),
            len: next() % (1 << 40),
            buf: (next() % 3) as u32,
            buf_off: next() % 8192,
            aux: next(),
            aux2: next(),
            ..Default::default()
        };
        // SAFETY: this client reserves nothing by its typed calls, so no window
        // exists (garbage COMMIT and RESERVATION_RELEASE entries included on purpose).
        match unsafe { c.call_unchecked(e) } {
            Ok(_) | Err(Error::Errno(_)) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    let _ = buf;
    still_serving(&s);
}

fn raw(s: &Served) -> UnixStream {
    let u = UnixStream::connect(&s.sock).unwrap();
    u.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    u
}

/// Read to the end: the server closed the connection (after at most one reply).
fn closed(mut u: UnixStream) {
    let mut rest = Vec::new();
    match u.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.len() < 2 * MAX_MESSAGE),
        // Closed with our bytes unread.
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset),
    }
}

#[test]
fn garbage_on_the_control_socket_closes_that_connection_only() {
    let s = serve("ctl");
    // Not a Hello first.
    let u = raw(&s);
    zcfs_samehost::proto::send(&u, &Request::Stats.encode(), &[]).unwrap();
    closed(u);
    // A wrong version.
    let u = raw(&s);
    let hello = Request::Hello {
        version: PROTOCOL_VERSION + 1,
        want_direct: false,
    };
    zcfs_samehost::proto::send(&u, &hello.encode(), &[]).unwrap();
    closed(u);
    // Random bytes, an oversized length, a truncated message.
    let mut u = raw(&s);
    u.write_all(&[0xff; 64]).unwrap();
    closed(u);
    let mut u = raw(&s);
    u.write_all(&((MAX_MESSAGE as u32) + 1).to_le_bytes())
        .unwrap();
    closed(u);
    let mut u = raw(&s);
    u.write_all(&[10, 0, 0, 0, 1]).unwrap();
    u.shutdown(std::net::Shutdown::Write).unwrap();
    closed(u);
    // A RegisterBuffer without its descriptor.
    let u = raw(&s);
    let hello = Request::Hello {
        version: PROTOCOL_VERSION,
        want_direct: false,
    };
    zcfs_samehost::proto::send(&u, &hello.encode(), &[]).unwrap();
    zcfs_samehost::proto::recv(&u).unwrap().unwrap();
    zcfs_samehost::proto::send(&u, &Request::RegisterBuffer { len: 4096 }.encode(), &[]).unwrap();
    closed(u);
    still_serving(&s);
}

#[test]
fn open_handles_are_bounded() {
    let s = serve("handles");
    let mut c = Client::connect(&s.sock).unwrap();
    c.open("/f", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    for _ in 1..MAX_HANDLES {
        c.open("/f", libc::O_RDONLY, 0).unwrap();
    }
    assert_eq!(
        c.open("/f", libc::O_RDONLY, 0).unwrap_err().errno(),
        libc::EMFILE
    );
    drop(c);
    eventually("the connection closes", || {
        s.svc.stats().connections_open == 0
    });
    let ino = s.vol.lookup(&zcfs_volume::Cred::ROOT, 1, b"f").unwrap().ino;
    assert_eq!(s.vol.references(ino), 0, "handles not released");
}

#[test]
fn open_checks_paths_and_flags() {
    let s = serve("open");
    let mut c = Client::connect(&s.sock).unwrap();
    let e = |r: Result<zcfs_samehost::client::File, Error>| r.unwrap_err().errno();
    assert_eq!(e(c.open("/nope", libc::O_RDONLY, 0)), libc::ENOENT);
    assert_eq!(e(c.open("/", libc::O_RDONLY, 0)), libc::EISDIR);
    c.open("/a", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    assert_eq!(
        e(c.open("/a", libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o644)),
        libc::EEXIST
    );
    assert_eq!(e(c.open("/a/b", libc::O_RDONLY, 0)), libc::ENOTDIR);
    s.vol
        .mkdir(&zcfs_volume::Cred::ROOT, 1, b"d", 0o755)
        .unwrap();
    assert_eq!(e(c.open("/d", libc::O_RDONLY, 0)), libc::EISDIR);
    c.open("/d/../d/./x", libc::O_WRONLY | libc::O_CREAT, 0o600)
        .unwrap();
    s.vol
        .symlink(&zcfs_volume::Cred::ROOT, 1, b"l", b"/a")
        .unwrap();
    assert_eq!(e(c.open("/l", libc::O_RDONLY, 0)), libc::ELOOP);
}
