//! Review of write-behind sending without its inode's queue held (behind.rs,
//! branch wbunlock). Root required (network namespaces), as in CI.

mod common;
use common::remote::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use zcfs_backend::Backend;

/// A getattr (stat, or a close, fsync or read: whatever settles the inode) of a file
/// that others keep writing through write-behind is answered while they write: it waits
/// for the writes already answered when it came, not for a moment when none of the
/// file's writes is being sent. With two writers on a slow link there is no such
/// moment: one's next write is queued while the other's is still going out.
#[test]
fn a_stat_of_a_file_written_without_pause_is_not_starved() {
    let net = Net::new();
    net.shape("20mbit");
    let srv = Served::new(&net, "rvwb-starve", &[]);
    net.in_cli(|| {
        let fs = Arc::new(srv.client(&net, Duration::from_secs(30)));
        let (f, fh) = create_file(&fs, "f", libc::O_RDWR);
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..2u64)
            .map(|i| {
                let (fs, stop) = (fs.clone(), stop.clone());
                std::thread::spawn(move || {
                    let buf = vec![i as u8 + 1; 128 << 10];
                    let t = Instant::now();
                    let mut off = i * (256 << 20);
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed)
                        && t.elapsed() < Duration::from_secs(15)
                        && n < 1000
                    {
                        fs.write_behind(&ctx(), f.ino, fh, off, &buf).unwrap();
                        off += buf.len() as u64;
                        n += 1;
                        // The writer's trip back through the kernel for its next write.
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    n
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(700));
        // On a thread of its own: if it never returns, the test fails rather than hangs.
        let (tx, rx) = mpsc::channel();
        let g = fs.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            let r = g.getattr(f.ino);
            let _ = tx.send((r.map(|a| a.size), t.elapsed()));
        });
        let r = rx.recv_timeout(Duration::from_secs(8));
        stop.store(true, Ordering::Relaxed);
        let written: Vec<u32> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        let (size, took) = r.expect("a getattr waited until the writers stopped writing");
        eprintln!("getattr took {took:?}; writes {written:?}");
        assert!(size.unwrap() > 0);
        fs.flush(f.ino, fh).unwrap();
        fs.release(f.ino, fh).unwrap();
        assert_eq!(fs.write_behind_held(), 0);
    });
}
