//! Review of issue 11's coherence, xattr shortcut and durability changes: findings as
//! tests (failing before their fix), and guards for the properties found holding.
//! Root required (network namespaces, FUSE), as in CI.

mod common;
use common::remote::*;
use std::time::Duration;
use zcfs_backend::{Backend, ROOT};

const MIB: usize = 1 << 20;

/// How many rounds a race-seeking test runs at most (each a few milliseconds): enough
/// for an unordered pair of requests on two connections to land out of order many
/// times over, bounded in count.
const ROUNDS: usize = 60;

fn fill(byte: u8, n: usize) -> Vec<u8> {
    vec![byte; n]
}

/// An open while a buffered write of the file is in flight here: the open reply's
/// attributes may predate the write (it can still be queued on the other connection
/// when the server answers the open), and the client cached them as fresh, so the
/// getattr after the open (the mount's close-to-open check asks one at once, and the
/// kernel takes its size as the file's: a grown file reads short, an O_APPEND writer
/// writes at the stale end) said the size from before the write. As
/// `a_lookup_after_a_buffered_write_shows_its_size` (review_wb.rs): the small write
/// goes out on the connection whose server thread is busy with an 8 MiB write of
/// another file, the open on the other one.
#[test]
fn an_open_while_a_buffered_write_is_in_flight_shows_its_size() {
    let net = Net::new();
    let srv = Served::new(&net, "rv11-open", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(10));
        let c = ctx();
        let (big, small) = (fill(b'a', 8 * MIB), fill(b'b', 4096));
        let (x, xfh) = fs
            .create(&c, ROOT, b"x", libc::S_IFREG | 0o644, libc::O_RDWR)
            .unwrap();
        for round in 0..ROUNDS {
            let name = format!("f{round}");
            let (f, fh) = fs
                .create(
                    &c,
                    ROOT,
                    name.as_bytes(),
                    libc::S_IFREG | 0o644,
                    libc::O_RDWR,
                )
                .unwrap();
            // Connection k: the big write; k+1: statfs; k: the small write; k+1: open.
            assert_eq!(
                fs.write_behind(&c, x.ino, xfh, 0, &big).unwrap(),
                big.len() as u32
            );
            fs.statfs().unwrap();
            assert_eq!(fs.write_behind(&c, f.ino, fh, 0, &small).unwrap(), 4096);
            let fh2 = fs.open(&c, f.ino, libc::O_RDONLY).unwrap();
            let got = fs.getattr(f.ino).unwrap();
            fs.release(f.ino, fh2).unwrap();
            fs.flush(f.ino, fh).unwrap();
            fs.release(f.ino, fh).unwrap();
            assert_eq!(
                got.size, 4096,
                "round {round}: getattr after an open of a file written to 4 KiB here"
            );
        }
        fs.flush(x.ino, xfh).unwrap();
        fs.release(x.ino, xfh).unwrap();
    });
}

/// fsync is of the file, not of the descriptor (POSIX; and under `-o writeback` the
/// kernel writes pages through any writable handle, then fsyncs through the caller's):
/// writes answered through one handle, the server killed and restarted inside its
/// group-commit delay, then fsync through another handle of the same file must not say
/// 0. It did: only the handle written through was marked lost. The writer's own flush
/// reports it as well, and the fsync's report is given once.
#[test]
fn fsync_through_another_handle_reports_writes_lost_in_a_server_restart() {
    let net = Net::new();
    let mut srv = Served::new(&net, "rv11-fsync2", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(10));
        let c = ctx();
        let (f, writer) = fs
            .create(&c, ROOT, b"f", libc::S_IFREG | 0o644, libc::O_RDWR)
            .unwrap();
        let other = fs.open(&c, f.ino, libc::O_RDWR).unwrap();
        let reader = fs.open(&c, f.ino, libc::O_RDONLY).unwrap();
        fs.fsync(f.ino, writer, false).unwrap();
        assert_eq!(
            fs.write(&c, f.ino, writer, 0, &fill(b'w', MIB)).unwrap(),
            MIB as u32
        );
        srv.kill(libc::SIGKILL);
        srv.start(&net, &[]);
        let errno = |r: zcfs_backend::Result<()>| r.map_err(|e| e.errno).err();
        assert_eq!(
            errno(fs.fsync(f.ino, other, false)),
            Some(libc::EIO),
            "fsync through another handle after the restart"
        );
        assert_eq!(errno(fs.fsync(f.ino, other, false)), None, "reported once");
        assert_eq!(
            errno(fs.flush(f.ino, reader)),
            None,
            "a reader's close is not the writer's"
        );
        assert_eq!(
            errno(fs.flush(f.ino, writer)),
            Some(libc::EIO),
            "the writer's close"
        );
        for fh in [writer, other, reader] {
            fs.release(f.ino, fh).unwrap();
        }
    });
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

/// How many times a test looks (1 ms apart) for a request to have left the client.
const SENT_POLLS: usize = 5_000;

/// A buffered write the server does not commit before replying (above
/// `COMMIT_WRITE_MAX`).
const LARGE: usize = zcfs_client::COMMIT_WRITE_MAX + 4096;

/// A write sent through a handle while an fsync of it is on its way: the fsync's
/// success says nothing of that write (the server may run it after the commit), so a
/// server restart before the next fsync must make that one report EIO. The fsync's
/// reply cleared the handle's mark wholesale, the later write's with it, and the next
/// fsync said 0. The fsync is held on a cut link until it has left the client; the
/// write goes behind it; the link comes back; the write's reply is collected (getattr
/// settles it, not committing anything); then the server is killed and restarted.
#[test]
fn a_write_sent_during_an_fsync_is_not_made_durable_by_it() {
    use std::sync::atomic::Ordering;
    let net = Net::new();
    let mut srv = Served::new(&net, "rv11-fsync-race", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(30));
        let c = ctx();
        let (f, fh) = fs
            .create(&c, ROOT, b"f", libc::S_IFREG | 0o644, libc::O_RDWR)
            .unwrap();
        fs.fsync(f.ino, fh, false).unwrap();
        let sent = || fs.client().bytes_sent.load(Ordering::Acquire);
        let before = sent();
        net.link(false);
        let first = std::thread::scope(|s| {
            let fsync = s.spawn(|| fs.fsync(f.ino, fh, false));
            let mut polls = 0;
            while sent() == before && polls < SENT_POLLS {
                std::thread::sleep(Duration::from_millis(1));
                polls += 1;
            }
            assert!(sent() > before, "the fsync never left the client");
            // Above the bound of writes the server commits before replying: this one
            // is durable only through a later fsync or flush.
            assert_eq!(
                fs.write_behind(&c, f.ino, fh, 0, &fill(b'w', LARGE))
                    .unwrap(),
                LARGE as u32
            );
            net.link(true);
            fsync.join().unwrap()
        });
        assert!(first.is_ok(), "the fsync across the cut: {first:?}");
        assert_eq!(fs.getattr(f.ino).unwrap().size, LARGE as u64);
        srv.kill(libc::SIGKILL);
        srv.start(&net, &[]);
        assert_eq!(
            fs.fsync(f.ino, fh, false).map_err(|e| e.errno).err(),
            Some(libc::EIO),
            "the fsync after the restart: a write sent after the last fsync was sent"
        );
        fs.release(f.ino, fh).unwrap();
    });
    srv.kill(libc::SIGTERM);
    srv.fsck();
}
