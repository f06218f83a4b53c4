//! Review 26b: the connection thread leaves its ring loop for a waiting control
//! message (20ab8ff, `control_waiting`), with the ring's NEED_WAKEUP flag clear.
//! Guards: an entry submitted (no doorbell: the flags say awake) just before a control
//! message is run after it, and writes interleaved with opens and closes all land.

mod common;
use common::*;
use std::time::{Duration, Instant};
use zcfs_samehost::client::Client;
use zcfs_samehost::ring::{op, Sqe};

/// Runs `f` on a thread; fails if it has not finished within `limit` (a lost entry or
/// doorbell would leave `Client::wait` waiting forever).
fn within(limit: Duration, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(limit) {
        Ok(()) => t.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            t.join().unwrap(); // re-raises the panic
        }
        Err(e) => panic!("not done within {limit:?} ({e}): an entry or a doorbell was lost"),
    }
}

fn rounds(spin: Duration, name: &'static str) {
    let s = serve_with(name, |cfg| cfg.spin = spin);
    let sock = s.sock.clone();
    within(Duration::from_secs(20), move || {
        let mut c = Client::connect(&sock).unwrap();
        let f = c.open("/r", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
        let buf = c.register_buffer(8192).unwrap();
        let t = Instant::now();
        let mut i = 0u64;
        while i < 400 && t.elapsed() < Duration::from_secs(8) {
            let v = (i % 251) as u8;
            c.buffer_mut(buf).unwrap()[..4096].fill(v);
            // An entry on the ring without waiting for it, then at once a control
            // message, then its completion.
            c.submit(&[Sqe {
                op: op::WRITE,
                handle: f.handle,
                offset: (i % 16) * 4096,
                len: 4096,
                buf,
                buf_off: 0,
                user_data: i + 1,
                ..Default::default()
            }])
            .unwrap();
            let g = c
                .open(format!("/t{}", i % 8), libc::O_RDWR | libc::O_CREAT, 0o644)
                .unwrap();
            c.close(g.handle).unwrap();
            let done = c.wait(1).unwrap();
            assert_eq!(done.len(), 1);
            assert_eq!(done[0].user_data, i + 1);
            assert_eq!(done[0].result, 4096, "round {i}");
            assert_eq!(
                c.read(f.handle, (i % 16) * 4096, buf, 4096, 4096).unwrap(),
                4096
            );
            assert!(
                c.buffer(buf).unwrap()[4096..].iter().all(|&b| b == v),
                "round {i}: the write before the control message did not land"
            );
            i += 1;
        }
        assert!(i >= 50, "only {i} rounds in 8 s");
    });
    drop(s);
}

#[test]
fn entries_submitted_right_before_a_control_message_complete_with_a_long_spin() {
    rounds(Duration::from_secs(5), "r26b-long");
}

#[test]
fn entries_submitted_right_before_a_control_message_complete_without_a_spin() {
    rounds(Duration::ZERO, "r26b-nospin");
}
