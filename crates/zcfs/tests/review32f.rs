//! Review 32f of 6fb420a (a re-open lost for a file closed meanwhile is kept as an
//! orphan by the restart hook; short attempts' patience from the quickest of the last 8
//! handshakes). Root required (network namespaces), as in CI.
mod common;
use common::relay::{relay, Plan};
use common::remote::*;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcfs_backend::Backend;

/// FINDING 1 (minor). An orphan recorded twice: a file whose re-open is already owed
/// (`reopen_id` X, from a revalidation cut short) is closed while the next hook run's
/// re-open X is in flight, and that reply is lost too. `release` records orphan X (the
/// file is `reopen_owed`), and the hook, finding the file gone with a transport error,
/// records orphan X again (6fb420a). The next run sends X twice: the reply cache gives
/// the same handle twice, and it is released twice (the second RELEASE fails EBADF on
/// the server).
/// Here: the session expires; connections 1 and 2 (one request) have the re-open's
/// reply held 2 s (timeout 800 ms: owed, id X); connection 3 (session resumed)
/// re-sends X, its reply held 2 s, and the file is closed 300 ms into it; the next
/// connection finishes.
/// Seen: the server counts a failed RELEASE (the duplicate).
#[test]
fn an_owed_reopen_lost_again_after_its_close_is_released_once() {
    owed_reopen_closed_meanwhile("r32f-dup", Duration::from_secs(2));
}

/// FINDING 1b (minor, before 6fb420a too). As above, but connection 3's reply comes
/// (500 ms late, within the timeout): the hook releases the handle it got for the
/// closed file, and the orphan `release` recorded for the same id is sent again in the
/// same run and releases that handle a second time (EBADF on the server).
#[test]
fn an_owed_reopen_answered_after_its_close_is_released_once() {
    owed_reopen_closed_meanwhile("r32f-dup-ok", Duration::from_millis(500));
}

/// Connections 1 and 2 lose the re-open's reply (id X owed); connection 3's comes
/// `third` late, and the file is closed 300 ms into it (200 ms if `third` < 1 s).
fn owed_reopen_closed_meanwhile(name: &str, third: Duration) {
    let net = Net::new();
    let _srv = Served::new(&net, name, &["--grace", "4"]);
    net.in_cli(|| {
        let observer = client(&net, Duration::from_secs(10));
        // How many of the next connections have their re-open's reply (chunk 2) 2 s late.
        let arm = Arc::new(AtomicU32::new(0));
        let a2 = arm.clone();
        // Set for the third connection: its reply comes `third` late.
        let third_armed = Arc::new(AtomicBool::new(false));
        let t2 = third_armed.clone();
        let relay = relay("198.18.100.2:0", net.addr(), move || {
            let n = a2.load(Ordering::SeqCst);
            (n > 0).then(|| {
                a2.store(n - 1, Ordering::SeqCst);
                Plan::Delay {
                    at: 2,
                    by: if t2.load(Ordering::SeqCst) {
                        third
                    } else {
                        Duration::from_secs(2)
                    },
                }
            })
        });
        let fs = secret_client_to(&relay, Duration::from_millis(800), 1);
        let (f, fh) = create_file(&fs, "one", libc::O_RDWR);
        fs.write(&ctx(), f.ino, fh, 0, b"one").unwrap();
        fs.fsync(f.ino, fh, false).unwrap();
        fs.client().disconnect();
        wait_for_expired_sessions(&observer, 1);
        let releases_failed = |o: &zcfs_client::RemoteFs| {
            server_stats_json(o)["ops"]["release"]["errors"]
                .as_u64()
                .unwrap_or(0)
        };
        let failed_before = releases_failed(&observer);
        arm.store(2, Ordering::SeqCst);
        // Connections 1 and 2 (one request makes both): the re-open's reply is lost
        // on each (owed, id X).
        let first = fs.server_stats().map(|_| ());
        let owed1 = fs.client().revalidation_owed();
        assert_eq!(
            arm.load(Ordering::SeqCst),
            0,
            "precondition: two connections"
        );
        third_armed.store(true, Ordering::SeqCst);
        arm.store(1, Ordering::SeqCst);
        // Connection 2: X again, its reply lost too; the file is closed meanwhile.
        let (second, released) = std::thread::scope(|s| {
            let a = s.spawn(|| fs.server_stats().map(|_| ()));
            std::thread::sleep(if third < Duration::from_secs(1) {
                Duration::from_millis(200)
            } else {
                Duration::from_millis(300)
            });
            let r = fs.release(f.ino, fh);
            (a.join().unwrap(), r)
        });
        eprintln!(
            "first {first:?} (owed {owed1}); second {second:?}; release {released:?}; owed {}",
            fs.client().revalidation_owed()
        );
        assert!(owed1, "precondition: the first re-open's reply was lost");
        assert_eq!(
            arm.load(Ordering::SeqCst),
            0,
            "precondition: the third connection's re-open reply was held"
        );
        let mut again = None;
        for _ in 0..20 {
            again = Some(fs.server_stats().map(|_| ()));
            if again.as_ref().unwrap().is_ok() && !fs.client().revalidation_owed() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let held = handles_open_settled(&observer, Duration::from_secs(4));
        let failed = releases_failed(&observer) - failed_before;
        eprintln!(
            "next {again:?}; handles held {held:?}; RELEASEs failed {failed}; release op {}",
            server_stats_json(&observer)["ops"]["release"]
        );
        assert_eq!(held, Some(0), "a handle leaked");
        assert_eq!(
            failed, 0,
            "one re-open's handle was released twice (the orphan `release` recorded for \
             the file, reopen_owed, and the hook's own: an orphan pushed for the same id \
             when the reply was lost, or a release of the handle when it came), the \
             second RELEASE failing on the server"
        );
    });
}

/// FINDING 2. The quickest of the last 8 handshakes is the only one while there is one:
/// a client whose first connection was made while the server was stopped (the kernel
/// took it into the backlog; the Welcome came on resume, 1.5 s later) has that as its
/// link's handshake time until it reconnects. At the next stop, every short attempt
/// waits half the timeout instead of about 100 ms on a sub-ms link (review 32e's
/// finding 2, for the first connection of a client's life, e.g. a mount made while
/// the server is paused or being resumed).
/// Here: timeout 4 s; the server is stopped while the client connects and resumed
/// 1.5 s later; then stopped again until a full attempt stalled; the next request
/// makes a short attempt.
/// Seen: the short attempt takes about 2 s (half the timeout).
#[test]
#[ignore = "known limit (README): a client whose only handshakes so far were slow (its first connection made while the server was stopped) makes short attempts of up to half the timeout until a quicker one is made"]
fn a_first_connection_the_server_resumed_in_keeps_short_attempts_short() {
    const TIMEOUT: Duration = Duration::from_secs(4);
    let net = Net::new();
    let srv = Served::new(&net, "r32f-first-resume", &[]);
    net.in_cli(|| {
        srv.signal(libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(100));
        let (fs, took) = std::thread::scope(|s| {
            let a = s.spawn(|| {
                let t = Instant::now();
                (secret_client_to(&net.addr(), TIMEOUT, 1), t.elapsed())
            });
            std::thread::sleep(Duration::from_millis(1500));
            srv.signal(libc::SIGCONT);
            a.join().unwrap()
        });
        eprintln!("first connection made in {took:?}");
        assert!(
            took >= Duration::from_millis(1000),
            "precondition: it waited for the server to resume ({took:?})"
        );
        fs.server_stats().unwrap();
        srv.signal(libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(200));
        until_a_full_attempt_stalls(&fs, TIMEOUT);
        let r = Instant::now();
        let e = fs.server_stats().unwrap_err();
        let after = r.elapsed();
        eprintln!("a short attempt failed in {after:?}: {e}");
        srv.signal(libc::SIGCONT);
        assert!(
            after < Duration::from_millis(500),
            "on a sub-millisecond link a short attempt waited {after:?}: its patience \
             came from the client's only handshake, made while the server was stopped \
             (the quickest of one), not from the link"
        );
    });
}
