//! A server that stops answering (SIGSTOP: its sockets stay open, nothing is read or
//! written) must cost a client one timeout, not one per request: after a connection
//! attempt stalls, requests fail at once until one attempt, let through at most every
//! `STALLED_DIAL_RETRY`, connects again. Before, each request dialled again and waited
//! out the attempt: through a mount an open took 20 s and `dd bs=1M` wrote about
//! 1 MiB per 10 s for minutes, with no error. Root required (network namespaces), as
//! in CI. Bounds here are on hangs, in multiples of the client's timeout, not speed.

mod common;
use common::remote::*;
use std::time::{Duration, Instant};
use zcfs_backend::Backend;

const TIMEOUT: Duration = Duration::from_secs(2);

#[test]
fn requests_to_a_stopped_server_fail_at_once_after_one_timeout_and_recover() {
    let net = Net::new();
    let srv = Served::new(&net, "stalled", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, TIMEOUT);
        let (f, fh) = create_file(&fs, "f", libc::O_RDWR);
        fs.write(&ctx(), f.ino, fh, 0, b"kept").unwrap();
        fs.fsync(f.ino, fh, false).unwrap();
        srv.signal(libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(200));
        // The request out when the server stopped times out; the attempt to connect
        // again after it stalls. Each takes about the timeout.
        for _ in 0..2 {
            let t = Instant::now();
            assert!(fs.getattr(f.ino).is_err(), "a stopped server answered");
            assert!(t.elapsed() < TIMEOUT * 3, "took {:?}", t.elapsed());
        }
        // Now each request makes a short attempt (or none, while another is under
        // way) and fails with the stall's error: well inside a timeout each, for as
        // long as the retry interval lasts (then one full attempt is let through).
        for _ in 0..5 {
            let t = Instant::now();
            let e = fs.getattr(f.ino).unwrap_err();
            let took = t.elapsed();
            assert!(
                e.to_string().contains("ago;"),
                "not the stalled attempt's error: {e}"
            );
            assert_eq!(e.errno, libc::ETIMEDOUT, "{e}");
            assert!(
                took < zcfs_client::STALLED_DIAL_PATIENCE * 4,
                "a request after a stalled attempt took {took:?}"
            );
        }
        // Serving again: within a retry interval and an attempt, requests succeed.
        srv.signal(libc::SIGCONT);
        let t = Instant::now();
        let a = loop {
            match fs.getattr(f.ino) {
                Ok(a) => break a,
                Err(e) => {
                    assert!(t.elapsed() < TIMEOUT * 5, "no recovery: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        assert_eq!(a.size, 4);
        assert_eq!(read_all(&fs, f.ino, fh, 0, 4), b"kept");
        fs.release(f.ino, fh).unwrap();
    });
}

/// Through a mount: `dd` of 64 MiB to a stopped server ends with an error within a few
/// timeouts (it wrote about 1 MiB per 10 s before), and the mount serves again after.
#[test]
fn a_writer_to_a_stopped_server_through_a_mount_gets_its_error_within_a_few_timeouts() {
    let net = Net::new();
    let srv = Served::new(&net, "stalled-mount", &[]);
    let m = RemoteMount::new(&net, &srv, "stalled", &["-o", "timeout=2"]);
    let p = m.path("f");
    std::fs::write(&p, b"before").unwrap();
    srv.signal(libc::SIGSTOP);
    let t = Instant::now();
    let out = std::process::Command::new("timeout")
        .args([
            "120",
            "dd",
            "if=/dev/zero",
            "bs=1M",
            "count=64",
            "conv=fsync",
        ])
        .arg(format!("of={p}"))
        .output()
        .unwrap();
    let took = t.elapsed();
    srv.signal(libc::SIGCONT);
    assert!(!out.status.success(), "dd to a stopped server succeeded");
    assert_ne!(
        out.status.code(),
        Some(124),
        "dd was still writing after 120 s"
    );
    assert!(took < TIMEOUT * 10, "dd took {took:?} to fail");
    let t = Instant::now();
    loop {
        match std::fs::write(&p, b"after") {
            Ok(()) => break,
            Err(e) => {
                assert!(t.elapsed() < TIMEOUT * 5, "no recovery: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    assert_eq!(std::fs::read(&p).unwrap(), b"after");
}
