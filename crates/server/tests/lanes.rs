//! A connection that takes over its lane fences the older one (see the server's
//! `session::Lanes`): a request the client gave up on is never executed after what the
//! client sends on the new connection.

mod common;

use common::*;
use std::time::Duration;
use zcfs_backend::{Attr, Backend};
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
