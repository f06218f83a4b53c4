//! Write-behind sends a write without holding its inode's queue (behind.rs): the next
//! write of the same file is answered while an earlier one is still going out, and
//! whatever must see a write being sent (a flush) waits for it. Root required (network
//! namespaces), as in CI.

mod common;
use common::remote::*;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use zcfs_backend::Backend;

/// A send that blocks (the link is cut, so the socket's buffer fills) holds up neither
/// the writer's next write of the file (answered at once) nor anything else of the
/// file that does not need it; a close meanwhile waits for it and, once the link is
/// back, every byte is there.
#[test]
fn a_write_still_being_sent_holds_up_only_what_must_see_it() {
    let net = Net::new();
    let srv = Served::new(&net, "wb-sends", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(30));
        let c = ctx();
        let (f, fh) = create_file(&fs, "f", libc::O_RDWR);
        fs.fsync(f.ino, fh, false).unwrap();
        let big = vec![7u8; 4 << 20];
        let small = vec![9u8; 4096];
        net.link(false);
        std::thread::scope(|s| {
            // A large write whose send blocks: nothing leaves the cut link.
            let (sent_tx, sent_rx) = mpsc::channel();
            let (fs, c, big, small) = (&fs, &c, &big, &small);
            s.spawn(move || {
                let r = fs.write_behind(c, f.ino, fh, 0, big);
                sent_tx.send(r.map(|n| n as usize)).unwrap();
            });
            assert!(
                sent_rx.recv_timeout(Duration::from_millis(1500)).is_err(),
                "the large write went out over a cut link?"
            );
            // The next write of the file, elsewhere in it: answered while the first
            // is still being sent.
            let (answered_tx, answered_rx) = mpsc::channel();
            let t = Instant::now();
            s.spawn(move || {
                let mut answered = |n: u32| answered_tx.send(n).unwrap();
                let _ = fs.write_behind_answering(c, f.ino, fh, 8 << 20, small, &mut answered);
            });
            let n = answered_rx
                .recv_timeout(Duration::from_secs(5))
                .expect("the next write waited for the first one's send");
            assert_eq!(n, 4096);
            assert!(t.elapsed() < Duration::from_secs(5));
            // A close now must wait for both writes to be sent and durable.
            let (flushed_tx, flushed_rx) = mpsc::channel();
            s.spawn(move || flushed_tx.send(fs.flush(f.ino, fh)).unwrap());
            assert!(
                flushed_rx.recv_timeout(Duration::from_secs(1)).is_err(),
                "a close returned while a write was still being sent"
            );
            net.link(true);
            assert_eq!(
                sent_rx
                    .recv_timeout(Duration::from_secs(60))
                    .unwrap()
                    .unwrap(),
                big.len()
            );
            flushed_rx
                .recv_timeout(Duration::from_secs(60))
                .expect("the close never returned")
                .expect("the close failed");
        });
        assert_eq!(read_all(&fs, f.ino, fh, 0, big.len() as u32), big);
        assert_eq!(read_all(&fs, f.ino, fh, 8 << 20, 4096), small);
        assert_eq!(fs.write_behind_held(), 0);
        fs.release(f.ino, fh).unwrap();
    });
}

/// A writer that unwinds after its write was queued as being sent (here a panic in the
/// answer) leaves nothing that later waits on it forever: the close reports EIO for the
/// write it never sent, and the file goes on working.
#[test]
fn a_write_abandoned_before_its_send_hangs_no_one() {
    let net = Net::new();
    let srv = Served::new(&net, "wb-abandoned", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(10));
        let c = ctx();
        let (f, fh) = create_file(&fs, "f", libc::O_RDWR);
        let small = vec![3u8; 4096];
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut answer = |_: u32| panic!("the writer's answer unwinds");
            fs.write_behind_answering(&c, f.ino, fh, 0, &small, &mut answer)
        }));
        assert!(r.is_err());
        // On a thread of its own, not scoped: if it never returns, the test fails
        // rather than hangs.
        let fs = std::sync::Arc::new(fs);
        let (done_tx, done_rx) = mpsc::channel();
        let closer = fs.clone();
        std::thread::spawn(move || {
            let _ = done_tx.send(closer.flush(f.ino, fh));
        });
        let e = done_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the close waited for a write nobody sends")
            .unwrap_err();
        assert_eq!(e.errno, libc::EIO, "{e:?}");
        assert_eq!(fs.write_behind_held(), 0, "its slot given back");
        // Every close of the handle says so until an fsync takes the error.
        assert_eq!(fs.fsync(f.ino, fh, false).unwrap_err().errno, libc::EIO);
        assert_eq!(fs.write_behind(&c, f.ino, fh, 0, &small).unwrap(), 4096);
        fs.flush(f.ino, fh).unwrap();
        assert_eq!(read_all(&*fs, f.ino, fh, 0, 4096), small);
        fs.release(f.ino, fh).unwrap();
    });
}
