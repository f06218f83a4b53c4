//! Review 32 of 1a54761..b4ea3d9 (after a stalled connection attempt, requests make
//! short attempts, STALLED_DIAL_PATIENCE = 100 ms for connect and handshake together).
//! Root required (network namespaces), as in CI.
mod common;
use common::relay::{relay, Plan};
use common::remote::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use zcfs_backend::Backend;
use zcfs_client::ClientConfig;

const TIMEOUT: Duration = Duration::from_secs(2);

/// A TCP relay (call inside the client namespace) to `upstream` that passes bytes on
/// at once, except the server's second message on each connection (the handshake's
/// Verdict), held `hold` first: what a lost segment costs (TCP's retransmission
/// timeout is 200 ms at least). Returns the address to dial.
fn relay_holding_verdicts(upstream: String, hold: Duration) -> String {
    relay("198.18.100.2:0", upstream, move || {
        Some(Plan::Delay { at: 1, by: hold })
    })
}

/// FINDING 1. A short attempt (STALLED_DIAL_PATIENCE, 100 ms) gives up on a Verdict
/// that comes late (one lost segment: TCP's retransmission timeout is >= 200 ms) after
/// it sent its proof; the server has by then attached the session (created it, if it
/// had expired) and answered. The client's next connection is then told `resumed`, so
/// a client whose session the server had dropped (grace over while it was away) does
/// not revalidate: its open files keep server handles the server no longer has, and
/// writes through them fail EBADF for the rest of the mount. Before b4ea3d9 every
/// attempt had the whole timeout (a retransmission is well inside it); now every
/// request in the second after a stall makes a 100 ms attempt. (The handshake's
/// `resumed` is only right if no attempt was abandoned after the server attached.)
/// Seen: after recovery, write and fsync through the open handle fail with errno 9
/// (EBADF), `revalidations` 0. Should: the session loss is noticed and the file
/// re-opened (revalidations >= 1), the write succeeds.
#[test]
fn a_short_attempt_given_up_mid_handshake_does_not_hide_a_lost_session() {
    let net = Net::new();
    let srv = Served::new(&net, "r32-phantom", &["--grace", "3"]);
    net.in_cli(|| {
        let observer = client(&net, Duration::from_secs(10));
        // Each handshake's Verdict comes 250 ms late (a lost segment, retransmitted).
        let relay = relay_holding_verdicts(net.addr(), Duration::from_millis(250));
        let fs = secret_client_to(&relay, TIMEOUT, ClientConfig::new(&relay).connections);
        let (f, fh) = create_file(&fs, "f", libc::O_RDWR);
        fs.write(&ctx(), f.ino, fh, 0, b"before").unwrap();
        fs.fsync(f.ino, fh, false).unwrap();
        // The client goes away for longer than the grace period: the server gives the
        // session (and the handle) back.
        fs.client().disconnect();
        wait_for_expired_sessions(&observer, 1);
        // A stall on record: the server stops, the next request's attempt stalls.
        srv.signal(libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(100));
        let e = fs.server_stats().unwrap_err();
        eprintln!("stalled: {e}");
        srv.signal(libc::SIGCONT);
        // Requests in the second after it make short attempts.
        let t = Instant::now();
        let mut last = None;
        let recovered = loop {
            match fs.server_stats() {
                Ok(_) => break true,
                Err(e) => last = Some(e.to_string()),
            }
            if t.elapsed() > TIMEOUT * 5 {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        eprintln!(
            "recovered {recovered} after {:?}; last error {last:?}",
            t.elapsed()
        );
        assert!(recovered, "no recovery: {last:?}");
        let revalidations = fs.client().revalidations.load(Ordering::Relaxed);
        let w = fs.write(&ctx(), f.ino, fh, 0, b"after!");
        let s = fs.fsync(f.ino, fh, false);
        assert!(
            w.is_ok() && s.is_ok(),
            "the server lost the session, the client did not revalidate ({revalidations} \
             revalidations): write {w:?}, fsync {s:?}"
        );
        assert_eq!(read_all(&fs, f.ino, fh, 0, 6), b"after!");
    });
}
