//! Review rv23b of small writes committed before their reply (protocol 11,
//! `WriteReq::commit`, ba58d82) and of non-write changes counted as not committed
//! (c8202ad): a close or fsync that needs no round trip must only skip it when what it
//! promises is durable. Findings as tests, and guards for properties found holding.
//! Root required (network namespaces), as in CI.
//!
//! Durability pattern: the server is killed (SIGKILL) right after the close or fsync
//! returns, before its group commit's delay (2 ms) would commit anything left, and the
//! bytes are checked after it starts again.

mod common;
use common::remote::*;
use std::time::Duration;
use zcfs_backend::{Backend, SetAttr, ROOT};
use zcfs_client::{RemoteFs, COMMIT_WRITE_MAX};

fn fill(byte: u8, n: usize) -> Vec<u8> {
    vec![byte; n]
}

/// A write larger than `COMMIT_WRITE_MAX`: sent without `commit`.
const LARGE: usize = COMMIT_WRITE_MAX + 4096;

/// Make a file `name`, durable and empty, open for writing.
fn made(fs: &RemoteFs, name: &str) -> (u64, u64) {
    let (f, fh) = create_file(fs, name, libc::O_RDWR);
    fs.fsync(f.ino, fh, false).unwrap();
    (f.ino, fh)
}

/// What is left in the queue's count of committed replies after a flush or fsync
/// made every write of a handle durable by a round trip must not pay for a later
/// change. A small (committed) write and a larger (not committed) one are in flight
/// when an fsync goes out behind them: it collects both (the small one's count is kept
/// for the next `settle_taking_commits`) and makes the handle's `uncommitted` 0. A
/// later large write (collected by a getattr) or a truncate then counts 1, the stale
/// count takes it back to 0, and the close sends no FLUSH: what it covers is lost.
fn stale_count_rounds(tag: &str, by_truncate: bool) {
    const ROUNDS: usize = 4;
    let net = Net::new();
    let mut srv = Served::new(&net, tag, &[]);
    for round in 0..ROUNDS {
        let name = format!("s{round}");
        let late = fill(0x40 + round as u8, LARGE);
        let late_off = (2 * LARGE) as u64;
        let shrink_to = 4096 + round as u64;
        let (skipped, fsynced_size) = net.in_cli(|| {
            let fs = srv.client(&net, Duration::from_secs(10));
            let c = ctx();
            let (ino, fh) = made(&fs, &name);
            assert_eq!(
                fs.write_behind(&c, ino, fh, 0, &fill(1, 4096)).unwrap(),
                4096
            );
            let n = fs.write_behind(&c, ino, fh, LARGE as u64, &fill(2, LARGE));
            assert_eq!(n.unwrap(), LARGE as u32);
            // Both in flight: sent behind them, this fsync is a round trip.
            fs.fsync(ino, fh, false).unwrap();
            let fsynced_size = (2 * LARGE) as u64;
            if by_truncate {
                let set = SetAttr {
                    size: Some(shrink_to),
                    ..Default::default()
                };
                fs.setattr(&c, ino, &set, fh).unwrap();
            } else {
                let n = fs.write_behind(&c, ino, fh, late_off, &late);
                assert_eq!(n.unwrap(), LARGE as u32);
                // Collected here (as a stat between write and close would).
                fs.getattr(ino).unwrap();
            }
            let before = fs.durable_without_round_trip();
            fs.flush(ino, fh).unwrap();
            let skipped = fs.durable_without_round_trip() - before;
            srv.kill(libc::SIGKILL);
            (skipped, fsynced_size)
        });
        srv.start(&net, &[]);
        net.in_cli(|| {
            let fs = srv.client(&net, Duration::from_secs(10));
            let a = fs.lookup(&ctx(), ROOT, name.as_bytes()).unwrap();
            if by_truncate {
                assert_eq!(
                    a.size, shrink_to,
                    "round {round}: the truncate was lost after a close that said 0 \
                     (close skipped its FLUSH: {skipped}; size at the fsync {fsynced_size})"
                );
            } else {
                assert_eq!(
                    a.size,
                    late_off + LARGE as u64,
                    "round {round}: a write lost after a close that said 0 \
                     (close skipped its FLUSH: {skipped})"
                );
                assert!(
                    read_all(&fs, a.ino, 0, late_off, LARGE as u32) == late,
                    "round {round}: a write lost after a close that said 0 \
                     (close skipped its FLUSH: {skipped})"
                );
            }
            // A truncate through the open file is committed before its reply
            // (`SetattrReq::commit`, 8774853): the close may skip its FLUSH then, and
            // the size above is what shows it was right to.
            if !by_truncate {
                assert_eq!(skipped, 0, "round {round}: the close skipped its FLUSH");
            }
        });
    }
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

#[test]
fn a_commit_count_left_from_before_an_fsync_does_not_cover_a_later_write() {
    stale_count_rounds("rv23b-stale-w", false);
}

#[test]
fn a_commit_count_left_from_before_an_fsync_does_not_cover_a_later_truncate() {
    stale_count_rounds("rv23b-stale-t", true);
}

/// A file truncated at open (the kernel sends SETATTR with the new handle: no
/// FUSE_ATOMIC_O_TRUNC) and closed without a write: the truncate counts against the
/// handle (c8202ad), so the close must send its FLUSH. Without a write-behind queue for
/// the inode (none written since its last handle here was closed), the flush's "clean"
/// check looked at `written > durable` only and skipped it.
#[test]
fn a_truncate_at_open_then_close_is_durable() {
    const ROUNDS: usize = 6;
    let net = Net::new();
    let mut srv = Served::new(&net, "rv23b-otrunc", &[]);
    for round in 0..ROUNDS {
        let name = format!("o{round}");
        let shrink_to = round as u64 * 100;
        net.in_cli(|| {
            let fs = srv.client(&net, Duration::from_secs(10));
            let c = ctx();
            let (ino, fh) = made(&fs, &name);
            for i in 0..4u64 {
                let n = fs.write_behind(&c, ino, fh, i * 4096, &fill(3, 4096));
                assert_eq!(n.unwrap(), 4096);
            }
            fs.flush(ino, fh).unwrap();
            fs.release(ino, fh).unwrap();
            // Durable for sure (not only by the commits above), then the O_TRUNC open.
            let fh = fs.open(&c, ino, libc::O_WRONLY).unwrap();
            fs.fsync(ino, fh, false).unwrap();
            let set = SetAttr {
                size: Some(shrink_to),
                ..Default::default()
            };
            fs.setattr(&c, ino, &set, fh).unwrap();
            fs.flush(ino, fh).unwrap();
            srv.kill(libc::SIGKILL);
        });
        srv.start(&net, &[]);
        net.in_cli(|| {
            let fs = srv.client(&net, Duration::from_secs(10));
            let a = fs.lookup(&ctx(), ROOT, name.as_bytes()).unwrap();
            assert_eq!(
                a.size, shrink_to,
                "round {round}: the truncate at open was lost after a close that said 0"
            );
        });
    }
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

/// The server restarts while handle A has a write not known durable (a large one,
/// not committed by its reply). A's close reports EIO and A is released; handle B of
/// the same file (open all along, never written through) is then fsynced: fsync is of
/// the file, so it must report the loss too (`peer_lost`, as before ba58d82), not
/// return 0 because B has nothing uncommitted.
#[test]
fn an_fsync_reports_a_restart_that_lost_another_handles_write() {
    let net = Net::new();
    let mut srv = Served::new(&net, "rv23b-peer", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(10));
        let c = ctx();
        let (ino, a) = made(&fs, "p");
        let b = fs.open(&c, ino, libc::O_RDWR).unwrap();
        let n = fs.write_behind(&c, ino, a, 0, &fill(5, LARGE));
        assert_eq!(n.unwrap(), LARGE as u32);
        // Its reply collected (answered: written, not committed).
        fs.getattr(ino).unwrap();
        srv.kill(libc::SIGKILL);
        srv.start(&net, &[]);
        // The client finds the new instance first, so the restart is known before the
        // flush (what this tests is the reporting, not how a request meets the dead
        // connection).
        let t = std::time::Instant::now();
        while fs.getattr(ino).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10), "no reconnection");
            std::thread::sleep(Duration::from_millis(50));
        }
        // An error either way: EIO, or ENOTCONN when it is sent on the other
        // connection, still the dead one (a flush is not sent again into a new
        // session).
        let ra = fs.flush(ino, a);
        assert!(
            matches!(
                ra.as_ref().err().map(|e| e.errno),
                Some(libc::EIO | libc::ENOTCONN)
            ),
            "A's close after the restart: {ra:?}"
        );
        let _ = fs.release(ino, a);
        let rb = fs.fsync(ino, b, false);
        assert_eq!(
            rb.as_ref().err().map(|e| e.errno),
            Some(libc::EIO),
            "fsync of the file through B after a restart lost A's write: {rb:?}"
        );
        let _ = fs.release(ino, b);
    });
    srv.kill(libc::SIGTERM);
}

/// A truncate racing a close of a dup of the descriptor (the same handle): the
/// truncate counts against the handle before it is sent, but the close's FLUSH (a
/// round trip: a waited-for write came before) may run on the server before the
/// SETATTR does, and its success set the count back to 0. A later close (after the
/// truncate returned) then needed no FLUSH by the counts and skipped it: the truncate
/// was lost when the server was killed right after that close.
#[test]
fn a_truncate_racing_a_close_is_durable_at_the_next_close() {
    const ROUNDS: usize = 24;
    let net = Net::new();
    let mut srv = Served::new(&net, "rv23b-race", &[]);
    let mut lost = Vec::new();
    let mut skips = 0;
    for round in 0..ROUNDS {
        let name = format!("r{round}");
        let shrink_to = 1000 + round as u64;
        let skipped = net.in_cli(|| {
            let fs = srv.client(&net, Duration::from_secs(10));
            let c = ctx();
            let (ino, fh) = made(&fs, &name);
            for i in 0..4u64 {
                let n = fs.write_behind(&c, ino, fh, i * 4096, &fill(7, 4096));
                assert_eq!(n.unwrap(), 4096);
            }
            fs.flush(ino, fh).unwrap();
            // A write waited for (O_SYNC, say), not committed: the racing close sends
            // a FLUSH round trip.
            assert_eq!(fs.write(&c, ino, fh, 0, &fill(8, 512)).unwrap(), 512);
            let set = SetAttr {
                size: Some(shrink_to),
                ..Default::default()
            };
            std::thread::scope(|s| {
                let t = s.spawn(|| fs.flush(ino, fh));
                std::thread::sleep(Duration::from_micros(10 * (round % 8) as u64));
                fs.setattr(&c, ino, &set, fh).unwrap();
                t.join().unwrap().unwrap();
            });
            let before = fs.durable_without_round_trip();
            fs.flush(ino, fh).unwrap();
            let skipped = fs.durable_without_round_trip() - before;
            srv.kill(libc::SIGKILL);
            skipped
        });
        skips += skipped;
        srv.start(&net, &[]);
        net.in_cli(|| {
            let fs = srv.client(&net, Duration::from_secs(10));
            let a = fs.lookup(&ctx(), ROOT, name.as_bytes()).unwrap();
            if a.size != shrink_to {
                lost.push((round, a.size, skipped));
            }
        });
    }
    srv.kill(libc::SIGTERM);
    srv.fsck();
    eprintln!("closes that skipped their FLUSH after the race: {skips} of {ROUNDS}");
    assert!(
        lost.is_empty(),
        "truncates lost after a close that said 0 (round, size, close skipped): {lost:?}"
    );
}
