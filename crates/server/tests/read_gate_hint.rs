//! `Backend::read_then_may_wait` of the remote client: a mount that keeps a FUSE
//! thread's turn at the device for a read gives it back when the read may wait after
//! all (writes of the file in flight here, no connection to send on).

mod common;
use common::*;
use zcfs_backend::{Backend, ROOT};

#[test]
fn a_read_that_may_wait_is_told_so() {
    let fs = memory_fs(64 << 20);
    let srv = Running::start(fs.clone(), config());
    file(&*fs, b"quiet");
    file(&*fs, b"written");
    let c = srv.client();
    let quiet = c.lookup(&ctx(), ROOT, b"quiet").unwrap().ino;
    let written = c.lookup(&ctx(), ROOT, b"written").unwrap().ino;
    assert!(!c.read_then_may_wait(quiet), "connected, nothing written");
    let fh = c.open(&ctx(), written, libc::O_RDWR).unwrap();
    c.write_behind(&ctx(), written, fh, 0, b"in flight, or just landed")
        .unwrap();
    assert!(c.read_then_may_wait(written), "a file written here");
    assert!(!c.read_then_may_wait(quiet));
    c.fsync(written, fh, false).unwrap();
    c.release(written, fh).unwrap();
    assert!(!c.read_then_may_wait(written), "its last handle closed");
    c.client().disconnect();
    assert!(c.read_then_may_wait(quiet), "no connection to send on");
    c.client().connect().unwrap();
    assert!(!c.read_then_may_wait(quiet));
}
