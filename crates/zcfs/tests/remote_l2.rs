//! The layer-2 lane when its server dies (issue 12), between two network namespaces
//! joined by a two-queue veth pair (root and zcfs's XDP program; skipped otherwise
//! unless ZCFS_REQUIRE_L2=1): the server killed by PID and restarted while reads ride
//! the lane in bulk.

mod common;
use common::remote::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zcfs_backend::{Backend, ROOT};
use zcfs_protocol::Op;

/// The bulk file: 64 KiB blocks (one lane read each), every block its own pattern.
const BIG_BLOCKS: u64 = 256;
const BLOCK: usize = 64 << 10;
/// Bounds of the workload: iterations of each thread, and the whole test's time.
const ITERATIONS: u32 = 4000;
const PATIENCE: Duration = Duration::from_secs(60);

fn block(i: u64) -> Vec<u8> {
    (0..BLOCK)
        .map(|j| (i as usize * 131 + j * 7 + (j >> 12)) as u8)
        .collect()
}

fn small(i: u32) -> Vec<u8> {
    vec![(i % 251) as u8; 4096 + (i as usize % 977)]
}

/// Read `len` bytes at `off` into one buffer, or the error.
fn try_read(
    fs: &dyn Backend,
    ino: u64,
    fh: u64,
    off: u64,
    len: u32,
) -> Result<Vec<u8>, zcfs_backend::Error> {
    let mut out = Vec::new();
    fs.read(ino, fh, off, len, &mut |s: &[&[u8]]| {
        for x in s {
            out.extend_from_slice(x);
        }
        Ok(())
    })?;
    Ok(out)
}

/// Sets the flag when dropped: the worker stops also when the main thread panics.
struct StopOnDrop(Arc<AtomicBool>);
impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Errors a request may report while the server is down or just restarted (EBADF: a
/// handle the killed server gave, presented to the new one).
const OUTAGE: [i32; 7] = [
    libc::EBADF,
    libc::ENOTCONN,
    libc::ETIMEDOUT,
    libc::ECONNREFUSED,
    libc::ECONNRESET,
    libc::ENOENT,
    libc::ESTALE,
];

/// SIGKILL of the server (by its PID) and a restart on the same image during bulk
/// reads over the lane and creates (which ride the lane too): every request either
/// succeeds or reports an outage error (the lane's requests fail over to TCP); no
/// create runs twice (an exclusive create answered EEXIST would be a second run of a
/// create the dead server had executed); every acknowledged file and every block of
/// the bulk file reads back as the model says; fsck is clean.
#[test]
fn server_killed_and_restarted_during_bulk_reads_over_the_lane() {
    if !l2_ready() {
        return;
    }
    let net = Net::with_queues(2);
    let mut srv = Served::new(&net, "l2kill", &["--l2", L2_SRV_IF]);
    // The bulk file, written on TCP (writes do not ride the lane).
    let big = net.in_cli(|| {
        let fs = client(&net, Duration::from_secs(5));
        let (a, fh) = fs
            .create(&ctx(), ROOT, b"big", libc::S_IFREG | 0o644, libc::O_RDWR)
            .unwrap();
        for i in 0..BIG_BLOCKS {
            fs.write(&ctx(), a.ino, fh, i * BLOCK as u64, &block(i))
                .unwrap();
        }
        fs.fsync(a.ino, fh, false).unwrap();
        fs.release(a.ino, fh).unwrap();
        a.ino
    });
    let stop = Arc::new(AtomicBool::new(false));
    let reads_ok = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(Mutex::new(Vec::<u32>::new()));
    let t0 = Instant::now();
    let (lane_reads, fell_back, twice) = std::thread::scope(|s| {
        let (net_r, stop_w, reads_w, acked_w) =
            (&net, stop.clone(), reads_ok.clone(), acked.clone());
        let worker = s.spawn(move || {
            net_r.in_cli(|| {
                let fs = client_l2(net_r, Duration::from_secs(3));
                let c = fs.client().clone();
                assert!(c.lane_report().unwrap().up, "the lane came up");
                let mut twice = Vec::new();
                for i in 0..ITERATIONS {
                    if stop_w.load(Ordering::SeqCst) || t0.elapsed() > PATIENCE {
                        break;
                    }
                    // Bulk: four 64 KiB reads of the big file, each checked.
                    let r = (|| {
                        let fh = fs.open(&ctx(), big, libc::O_RDONLY)?;
                        for k in 0..4u64 {
                            let b = (i as u64 * 4 + k) % BIG_BLOCKS;
                            let got = try_read(&fs, big, fh, b * BLOCK as u64, BLOCK as u32)?;
                            assert!(got == block(b), "block {b} read back wrong");
                            reads_w.fetch_add(1, Ordering::SeqCst);
                        }
                        fs.release(big, fh)
                    })();
                    if let Err(e) = r {
                        assert!(OUTAGE.contains(&e.errno), "unexpected error {e}");
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    // An exclusive create (over the lane), its bytes (TCP), fsync.
                    let name = format!("f{i}");
                    let r = fs
                        .create(
                            &ctx(),
                            ROOT,
                            name.as_bytes(),
                            libc::S_IFREG | 0o644,
                            libc::O_RDWR | libc::O_EXCL,
                        )
                        .and_then(|(f, fh)| {
                            fs.write(&ctx(), f.ino, fh, 0, &small(i))?;
                            fs.fsync(f.ino, fh, false)?;
                            fs.release(f.ino, fh)
                        });
                    match r {
                        Ok(()) => acked_w.lock().unwrap().push(i),
                        Err(e) if e.errno == libc::EEXIST => twice.push(i),
                        Err(e) => {
                            assert!(OUTAGE.contains(&e.errno), "unexpected error {e}");
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                }
                (
                    c.l2_counters.requests[Op::Read as usize].load(Ordering::SeqCst),
                    c.l2_counters.fell_back.load(Ordering::SeqCst),
                    twice,
                )
            })
        });
        let _stop = StopOnDrop(stop.clone());
        // Bulk reads under way over the lane: kill the server by its PID, restart it.
        while reads_ok.load(Ordering::SeqCst) < 200 {
            assert!(t0.elapsed() < PATIENCE, "no bulk reads before the kill");
            std::thread::sleep(Duration::from_millis(5));
        }
        let err = srv.kill(libc::SIGKILL);
        assert!(!err.contains("panicked"), "{err}");
        std::thread::sleep(Duration::from_millis(300));
        srv.start(&net, &["--l2", L2_SRV_IF]);
        let (reads, files) = (reads_ok.load(Ordering::SeqCst), acked.lock().unwrap().len());
        while reads_ok.load(Ordering::SeqCst) < reads + 200
            || acked.lock().unwrap().len() < files + 20
        {
            assert!(
                t0.elapsed() < PATIENCE,
                "the client did not carry on after the restart"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::SeqCst);
        worker.join().unwrap()
    });
    assert!(lane_reads > 0, "no read rode the lane");
    assert!(
        fell_back > 0 || reads_ok.load(Ordering::SeqCst) > lane_reads,
        "after the kill, reads went to TCP"
    );
    assert!(
        twice.is_empty(),
        "creates executed twice (EEXIST on an exclusive create of a fresh name): {twice:?}"
    );
    // Everything reads back as the model says, through a fresh client.
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(5));
        for b in 0..BIG_BLOCKS {
            assert!(
                read_all(&fs, big, 0, b * BLOCK as u64, BLOCK as u32) == block(b),
                "block {b} of the bulk file"
            );
        }
        for &i in acked.lock().unwrap().iter() {
            let a = fs
                .lookup(&ctx(), ROOT, format!("f{i}").as_bytes())
                .unwrap_or_else(|e| panic!("f{i} lost: {e}"));
            assert_eq!(read_all(&fs, a.ino, 0, 0, 1 << 20), small(i), "f{i}");
        }
    });
    srv.kill(libc::SIGTERM);
    srv.fsck();
}
