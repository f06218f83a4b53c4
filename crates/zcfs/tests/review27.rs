//! Review 27: reads answered when the server's reply comes (Client::call_then,
//! Backend::read_then, FuseFs::read on the reader thread). Through real `zcfs serve`
//! servers and FUSE mounts between two network namespaces; root required, as in CI.
//!
//! Run: nice -n 19 cargo test --release -p zcfs --test review27 -- --test-threads 2
//! (and `-- --ignored` for the findings, if any are marked so).

mod common;
use common::remote::*;
use common::*;
use std::fs;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const BLK: usize = 4096;

/// A 4 KiB aligned buffer (O_DIRECT).
struct Aligned {
    ptr: *mut u8,
    len: usize,
}
unsafe impl Send for Aligned {}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, BLK).unwrap();
        // SAFETY: non-zero size, valid layout; freed in Drop with the same layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Aligned { ptr, len }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: we own `len` bytes at `ptr`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, BLK).unwrap();
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

/// Byte `i` of the reference file.
fn pat(i: u64, salt: u8) -> u8 {
    ((i / 4096) as u8).wrapping_mul(31) ^ (i as u8) ^ salt
}

fn pattern(off: u64, len: usize, salt: u8) -> Vec<u8> {
    (0..len as u64).map(|i| pat(off + i, salt)).collect()
}

fn open_direct(p: &str, write: bool) -> fs::File {
    fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(p)
        .unwrap()
}

/// `zcfs mount` of `srv` (inside the client namespace), its child kept so that its
/// exit can be watched.
fn fill(path: &str, len: usize, salt: u8) {
    fs::write(path, pattern(0, len, salt)).unwrap();
}

/// Writes answered by write-behind (buffered, the app's write returned before the
/// server had the bytes) are what an O_DIRECT read of the same range returns next,
/// through another handle and through the same one, from many threads at once.
#[test]
fn a_read_after_a_write_behind_write_returns_the_written_bytes() {
    let net = Net::new();
    let srv = Served::new(&net, "rev27-wbr", &[]);
    let m = RemoteMount::new(&net, &srv, "wbr", &[]);
    let p = m.path("f");
    const REGION: usize = 64 << 10;
    const THREADS: usize = 8;
    fill(&p, REGION * THREADS, 0);
    let bad = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (p, bad) = (p.clone(), bad.clone());
            s.spawn(move || {
                let w = fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&p)
                    .unwrap();
                let r = open_direct(&p, false);
                let rw = open_direct(&p, true);
                let mut buf = Aligned::new(REGION);
                for round in 0..40u32 {
                    if t0.elapsed() > Duration::from_secs(60) {
                        break;
                    }
                    let base = (t * REGION) as u64;
                    // A few writes of odd sizes and places inside the region.
                    let salt = (round as u8).wrapping_mul(7).wrapping_add(t as u8 + 1);
                    r.read_exact_at(buf.as_mut(), base).unwrap();
                    let mut want = buf.as_mut().to_vec();
                    for k in 0..4usize {
                        let off = (k * 13_001 + round as usize * 977) % (REGION - 3000);
                        let len = 1 + (k * 611 + round as usize * 37) % 2999;
                        let data = pattern(base + off as u64, len, salt.wrapping_add(k as u8));
                        w.write_all_at(&data, base + off as u64).unwrap();
                        want[off..off + len].copy_from_slice(&data);
                    }
                    for (which, f) in [("other handle", &r), ("same file, O_DIRECT rw", &rw)] {
                        f.read_exact_at(buf.as_mut(), base).unwrap();
                        if buf.as_mut()[..] != want[..] {
                            let first = buf
                                .as_mut()
                                .iter()
                                .zip(&want)
                                .position(|(a, b)| a != b)
                                .unwrap();
                            eprintln!(
                                "thread {t} round {round} ({which}): first difference at {first}"
                            );
                            bad.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            });
        }
    });
    assert_eq!(
        bad.load(Ordering::SeqCst),
        0,
        "reads missed bytes written before them"
    );
}

/// Many O_DIRECT reads at once (more than the server lets the client pipeline): each
/// is answered with its bytes, none hangs, and afterwards the in-flight slots are all
/// back (another burst goes through as fast).
#[test]
fn many_concurrent_reads_past_the_in_flight_bound_are_all_answered() {
    let net = Net::new();
    let srv = Served::new(&net, "rev27-qd", &["--max-inflight", "4"]);
    let m = RemoteMount::new(&net, &srv, "qd", &["--threads", "4"]);
    let p = m.path("f");
    const LEN: usize = 8 << 20;
    fill(&p, LEN, 3);
    for burst in 0..2 {
        let (tx, rx) = mpsc::channel();
        let t0 = Instant::now();
        for t in 0..64u64 {
            let (p, tx) = (p.clone(), tx.clone());
            std::thread::spawn(move || {
                let f = open_direct(&p, false);
                let mut buf = Aligned::new(BLK);
                let mut wrong = 0;
                for i in 0..40u64 {
                    let off = ((t * 7919 + i * 104_729) % (LEN / BLK) as u64) * BLK as u64;
                    match f.read_at(buf.as_mut(), off) {
                        Ok(BLK) if buf.as_mut()[..] == pattern(off, BLK, 3)[..] => {}
                        r => {
                            eprintln!("read at {off}: {:?}", r.map_err(|e| e.to_string()));
                            wrong += 1;
                        }
                    }
                }
                let _ = tx.send(wrong);
            });
        }
        drop(tx);
        let mut wrong = 0;
        for n in 0..64 {
            match rx.recv_timeout(Duration::from_secs(120).saturating_sub(t0.elapsed())) {
                Ok(w) => wrong += w,
                Err(_) => panic!("burst {burst}: only {n} of 64 readers finished: a read hangs"),
            }
        }
        eprintln!("burst {burst}: 64x40 reads in {:?}", t0.elapsed());
        assert_eq!(wrong, 0, "burst {burst}: wrong or failed reads");
    }
    // Reads at and past the end of the file.
    let f = fs::File::open(&p).unwrap();
    let mut b = vec![0u8; 8192];
    assert_eq!(f.read_at(&mut b, LEN as u64 - 100).unwrap(), 100);
    assert_eq!(&b[..100], &pattern(LEN as u64 - 100, 100, 3)[..]);
    assert_eq!(f.read_at(&mut b, LEN as u64).unwrap(), 0);
    assert_eq!(f.read_at(&mut b, LEN as u64 + 12345).unwrap(), 0);
    let d = open_direct(&p, false);
    let mut a = Aligned::new(8192);
    assert_eq!(d.read_at(a.as_mut(), LEN as u64 - 4096).unwrap(), 4096);
    assert_eq!(d.read_at(a.as_mut(), LEN as u64).unwrap(), 0);
}

/// Readers of a file (O_DIRECT and buffered, eviction in between) while the server is
/// killed and restarted: every read returns (the right bytes, or an error) within a
/// bound, and once the server is back the reads are right again.
#[test]
fn reads_across_a_server_kill_and_restart_are_each_answered() {
    let net = Net::new();
    let mut srv = Served::new(&net, "rev27-restart", &[]);
    let m = RemoteMount::new(&net, &srv, "restart", &["-o", "timeout=2"]);
    let p = m.path("f");
    const LEN: usize = 2 << 20;
    fill(&p, LEN, 9);
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<(u64, u64, u64, Duration)>();
    for t in 0..8u64 {
        let (p, tx, stop) = (p.clone(), tx.clone(), stop.clone());
        std::thread::spawn(move || {
            let direct = t % 2 == 0;
            let mut buf = Aligned::new(64 << 10);
            let (mut ok, mut wrong, mut errs, mut longest) = (0, 0, 0, Duration::ZERO);
            let t0 = Instant::now();
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(90) {
                // A fresh open each time: the handle of the restarted server.
                let f = if direct {
                    fs::OpenOptions::new()
                        .read(true)
                        .custom_flags(libc::O_DIRECT)
                        .open(&p)
                } else {
                    fs::File::open(&p)
                };
                let f = match f {
                    Ok(f) => f,
                    Err(_) => {
                        errs += 1;
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                };
                for _ in 0..8 {
                    let off = ((t * 31 + i * 17) % (LEN as u64 / (64 << 10))) * (64 << 10);
                    i += 1;
                    let s = Instant::now();
                    let r = f.read_at(buf.as_mut(), off);
                    longest = longest.max(s.elapsed());
                    match r {
                        Ok(n) if n == 64 << 10 && buf.as_mut()[..] == pattern(off, n, 9)[..] => {
                            ok += 1
                        }
                        // A buffered read whose later pages failed (the server down)
                        // returns the bytes before them, as read(2) does after a
                        // partial transfer: right bytes, fewer of them. An error.
                        Ok(n) if n < 64 << 10 && buf.as_mut()[..n] == pattern(off, n, 9)[..] => {
                            eprintln!("thread {t}: short read ({n}) at {off}, its bytes right");
                            errs += 1
                        }
                        Ok(n) => {
                            eprintln!("thread {t}: wrong bytes ({n}) at {off}");
                            wrong += 1
                        }
                        Err(_) => errs += 1,
                    }
                }
                if !direct {
                    // SAFETY: fadvise on a descriptor we own.
                    unsafe {
                        libc::posix_fadvise(
                            std::os::fd::AsRawFd::as_raw_fd(&f),
                            0,
                            0,
                            libc::POSIX_FADV_DONTNEED,
                        )
                    };
                }
            }
            let _ = tx.send((ok, wrong, errs, longest));
        });
    }
    drop(tx);
    std::thread::sleep(Duration::from_millis(1500));
    srv.kill(libc::SIGKILL);
    std::thread::sleep(Duration::from_millis(800));
    srv.start(&net, &[]);
    std::thread::sleep(Duration::from_millis(4000));
    // Back: a read through a fresh handle is right.
    let probe = (|| {
        let t = Instant::now();
        loop {
            let f = fs::File::open(&p);
            if let Ok(f) = f {
                let mut b = vec![0u8; 4096];
                if f.read_at(&mut b, 8192).is_ok_and(|n| n == 4096) {
                    return b == pattern(8192, 4096, 9);
                }
            }
            if t.elapsed() > Duration::from_secs(20) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })();
    stop.store(true, Ordering::SeqCst);
    let (mut ok, mut wrong, mut errs, mut longest) = (0, 0, 0, Duration::ZERO);
    for n in 0..8 {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok((o, w, e, l)) => {
                ok += o;
                wrong += w;
                errs += e;
                longest = longest.max(l);
            }
            Err(_) => panic!("only {n} of 8 readers finished: a read hangs"),
        }
    }
    eprintln!("reads ok {ok} wrong {wrong} errors {errs}; longest {longest:?}");
    assert!(probe, "reads not right after the restart");
    assert_eq!(wrong, 0, "wrong bytes returned");
    assert!(
        longest < Duration::from_secs(20),
        "a read took {longest:?} (client timeout 2 s)"
    );
}

/// What one outstanding read came back with: its result, whether the bytes were the
/// file's, and when.
type ReadOutcome = (Result<usize, Option<i32>>, bool, Duration);

/// Block `i` of the file read through `files[i]` (O_DIRECT), each on a thread of its own,
/// the file closed right after its read; the outcomes arrive on the channel (times from
/// the call).
fn read_each_block(files: Vec<fs::File>, salt: u8) -> mpsc::Receiver<ReadOutcome> {
    let (tx, rx) = mpsc::channel();
    let t0 = Instant::now();
    for (i, f) in files.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = Aligned::new(BLK);
            let r = f.read_at(buf.as_mut(), (i * BLK) as u64);
            let ok = matches!(r, Ok(BLK))
                && buf.as_mut()[..] == pattern((i * BLK) as u64, BLK, salt)[..];
            drop(f);
            let _ = tx.send((r.map_err(|e| e.raw_os_error()), ok, t0.elapsed()));
        });
    }
    rx
}

/// The link cut with reads outstanding (no reply will come), and the mount lazily
/// unmounted meanwhile: each read returns within a bound of the client's timeout, and
/// the mount process exits once the last file is closed.
#[test]
fn reads_outstanding_at_a_cut_link_and_a_lazy_unmount_end() {
    let net = Net::new();
    let srv = Served::new(&net, "rev27-cut", &[]);
    let mut m = RemoteMount::new(&net, &srv, "cut", &["-o", "timeout=2"]);
    let p = m.path("f");
    fill(&p, 1 << 20, 5);
    let files: Vec<fs::File> = (0..8).map(|_| open_direct(&p, false)).collect();
    net.link(false);
    let rx = read_each_block(files, 5);
    std::thread::sleep(Duration::from_millis(300));
    let out = zcfs()
        .arg("umount")
        .arg("--lazy")
        .arg(&m.mp)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut results = Vec::new();
    for n in 0..8 {
        match rx.recv_timeout(Duration::from_secs(40)) {
            Ok(r) => results.push(r),
            Err(_) => {
                net.link(true);
                panic!("only {n} of 8 reads returned with the link cut: {results:?}");
            }
        }
    }
    eprintln!("{results:?}");
    for (r, ok, took) in &results {
        assert!(r.is_err() || *ok, "a read returned wrong bytes: {r:?}");
        assert!(*took < Duration::from_secs(20), "a read took {took:?}");
    }
    assert!(
        m.exits_within(Duration::from_secs(30)),
        "the mount process did not exit after a lazy unmount with its files closed"
    );
    net.link(true);
}

/// A file open across a server restart that deleted it meanwhile (another client
/// unlinked it while the server was down... here: unlinked while open, which a restart
/// does not keep): the read fails (ESTALE or EIO), it does not hang nor return another
/// file's bytes; a file open across the restart that still exists reads right.
#[test]
fn a_read_of_a_handle_lost_in_a_restart_fails_cleanly() {
    read_of_a_handle_lost_in_a_restart(libc::SIGKILL);
}

/// The same with the server stopped cleanly (it lets go of the unlinked file then: the
/// re-open fails, and reads of the handle fail with ESTALE at once).
#[test]
fn a_read_of_a_handle_lost_in_a_clean_restart_fails_cleanly() {
    read_of_a_handle_lost_in_a_restart(libc::SIGTERM);
}

fn read_of_a_handle_lost_in_a_restart(sig: i32) {
    let net = Net::new();
    let mut srv = Served::new(&net, &format!("rev27-stale{sig}"), &[]);
    let m = RemoteMount::new(&net, &srv, &format!("stale{sig}"), &["-o", "timeout=2"]);
    let (pa, pb) = (m.path("a"), m.path("b"));
    fill(&pa, 256 << 10, 1);
    fill(&pb, 256 << 10, 2);
    let fa = open_direct(&pa, false);
    let fb = open_direct(&pb, false);
    let mut buf = Aligned::new(BLK);
    fa.read_exact_at(buf.as_mut(), 0).unwrap();
    fs::remove_file(&pa).unwrap();
    fa.read_exact_at(buf.as_mut(), BLK as u64).unwrap();
    assert_eq!(buf.as_mut()[..], pattern(BLK as u64, BLK, 1)[..]);
    srv.kill(sig);
    srv.start(&net, &[]);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Aligned::new(BLK);
        let mut out = Vec::new();
        for _ in 0..3 {
            let r = fa.read_at(buf.as_mut(), 2 * BLK as u64);
            out.push((
                r.map_err(|e| e.raw_os_error()),
                buf.as_mut()[..] == pattern(2 * BLK as u64, BLK, 1)[..],
            ));
        }
        let rb = fb.read_at(buf.as_mut(), 3 * BLK as u64);
        let okb = buf.as_mut()[..] == pattern(3 * BLK as u64, BLK, 2)[..];
        let _ = tx.send((out, rb.map_err(|e| e.raw_os_error()), okb));
    });
    let (out, rb, okb) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("a read after the restart hangs");
    eprintln!("{out:?} {rb:?} {okb}");
    for (r, same) in &out {
        match r {
            Ok(n) => assert!(
                *n == BLK && *same,
                "read of the lost file returned {n} bytes, its own: {same}"
            ),
            Err(e) => assert!(
                [Some(libc::ESTALE), Some(libc::EIO), Some(libc::EBADF)].contains(e),
                "{e:?}"
            ),
        }
    }
    assert!(
        rb == Ok(BLK) && okb,
        "the surviving file reads {rb:?} right: {okb}"
    );
}

/// `read_then` on a backend, waited for (bounded).
fn read_then_waited(
    fs: &dyn zcfs_backend::Backend,
    ino: u64,
    fh: u64,
    off: u64,
    len: u32,
) -> Result<Vec<u8>, i32> {
    let (tx, rx) = mpsc::channel();
    fs.read_then(
        ino,
        fh,
        off,
        len,
        Box::new(move |r| {
            let _ = tx.send(r.map_err(|e| e.errno));
        }),
    );
    rx.recv_timeout(Duration::from_secs(60))
        .expect("read_then never completed")
}

/// Files x, f and g of 8 KiB (pattern salt 4), each fsync'd.
fn three_files(fs: &zcfs_client::RemoteFs) {
    use zcfs_backend::Backend;
    for name in ["x", "f", "g"] {
        let (a, fh) = create_file(fs, name, libc::O_RDWR);
        fs.write(&ctx(), a.ino, fh, 0, &pattern(0, 8192, 4))
            .unwrap();
        fs.fsync(a.ino, fh, false).unwrap();
        fs.release(a.ino, fh).unwrap();
    }
}

/// x, f and g opened with `flags` and x closed again: g's server handle is then one a
/// new session of the server does not have. g's (ino, handle); f stays open.
fn open_third(fs: &zcfs_client::RemoteFs, flags: i32) -> (u64, u64) {
    use zcfs_backend::Backend;
    let open = |name: &str| {
        let a = fs
            .lookup(&ctx(), zcfs_backend::ROOT, name.as_bytes())
            .unwrap();
        (a.ino, fs.open(&ctx(), a.ino, flags).unwrap())
    };
    let x = open("x");
    let _f = open("f");
    let g = open("g");
    fs.release(x.0, x.1).unwrap();
    g
}

/// Files open across a server restart (still there, re-opened by the client's restart
/// hook): the first read after the restart, through `read` and through `read_then`,
/// returns the file's bytes. (Seen through the mount: the first read of an open file
/// after a restart failed with EBADF, the next ones were right.) Three files opened,
/// the first closed: the server's handle of the third is one the new session does
/// not have.
#[test]
fn the_first_read_after_a_restart_reads_the_reopened_file() {
    use zcfs_backend::Backend;
    let net = Net::new();
    let mut srv = Served::new(&net, "rev27-first", &[]);
    net.in_cli(|| three_files(&srv.client(&net, Duration::from_secs(2))));
    let mut outcomes = Vec::new();
    for then in [false, true] {
        net.in_cli(|| {
            let fs = srv.client(&net, Duration::from_secs(2));
            let g = open_third(&fs, libc::O_RDONLY);
            assert_eq!(read_all(&fs, g.0, g.1, 0, 4096), pattern(0, 4096, 4));
            srv.kill(libc::SIGKILL);
            srv.start(&net, &[]);
            let r = if then {
                read_then_waited(&fs, g.0, g.1, 4096, 4096)
            } else {
                let mut got = Vec::new();
                fs.read(g.0, g.1, 4096, 4096, &mut |s: &[&[u8]]| {
                    got = s.concat();
                    Ok(())
                })
                .map(|()| got)
                .map_err(|e| e.errno)
            };
            let second = read_all(&fs, g.0, g.1, 4096, 4096);
            outcomes.push((
                then,
                r.map(|d| d == pattern(4096, 4096, 4)),
                second == pattern(4096, 4096, 4),
            ));
        });
    }
    eprintln!("(read_then, first read right, second read right): {outcomes:?}");
    for (then, first, second) in outcomes {
        assert!(second, "read_then {then}: the second read is wrong");
        assert_eq!(
            first,
            Ok(true),
            "read_then {then}: the first read after the restart"
        );
    }
}

/// SIGTERM to the mount process while reads wait for a server that cannot answer (the
/// link cut): the reads return at once (the process ends the FUSE connection) and the
/// process exits within a bound of the client's timeout.
#[test]
fn the_mount_process_stops_with_reads_outstanding() {
    let net = Net::new();
    let srv = Served::new(&net, "rev27-term", &[]);
    let mut m = RemoteMount::new(&net, &srv, "term", &["-o", "timeout=5"]);
    let p = m.path("f");
    fill(&p, 1 << 20, 6);
    let files: Vec<fs::File> = (0..8).map(|_| open_direct(&p, false)).collect();
    net.link(false);
    let rx = read_each_block(files, 6);
    std::thread::sleep(Duration::from_millis(300));
    let pid = m.pid().unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    // Its FUSE `destroy` sends a SYNC_ALL, which waits out the client's timeout (and
    // its resend) with the link cut: within three timeouts.
    let exited = m.exits_within(Duration::from_secs(16));
    let mut results = Vec::new();
    for _ in 0..8 {
        match rx.recv_timeout(Duration::from_secs(40)) {
            Ok(r) => results.push(r),
            Err(_) => break,
        }
    }
    net.link(true);
    eprintln!("{results:?}");
    assert!(
        exited,
        "the mount process did not exit within 16 s of SIGTERM (client timeout 5 s)"
    );
    assert_eq!(results.len(), 8, "a read never returned");
    for (r, ok, _) in &results {
        assert!(r.is_err() || *ok, "a read returned wrong bytes: {r:?}");
    }
}

/// A write-behind write past the end of the file, answered (the app's write returned,
/// the file is now longer), and then a read of the range before it, which crosses the
/// old end of file: the read returns the hole's zeros up to the write, not a short
/// read that says the file ends at its old size. The link is slow, so the write is
/// still on its way when the read goes out (on the other connection).
#[test]
fn a_read_up_to_a_write_behind_write_past_eof_sees_the_hole_not_the_old_eof() {
    use zcfs_backend::Backend;
    let net = Net::new();
    net.shape("20mbit");
    let srv = Served::new(&net, "rev27-hole", &[]);
    net.in_cli(|| {
        let fs = Arc::new(srv.client(&net, Duration::from_secs(30)));
        let mut outcomes = Vec::new();
        for (round, then) in [(0u64, false), (1, true)] {
            let name = format!("h{round}");
            let (a, fh) = create_file(&fs, &name, libc::O_RDWR);
            fs.write(&ctx(), a.ino, fh, 0, &[7u8; 4096]).unwrap();
            let (tx, rx) = mpsc::channel();
            let writer = {
                let fs = fs.clone();
                std::thread::spawn(move || {
                    let big = vec![9u8; 4 << 20];
                    fs.write_behind_answering(&ctx(), a.ino, fh, 8192, &big, &mut |_| {
                        let _ = tx.send(());
                    })
                })
            };
            rx.recv_timeout(Duration::from_secs(30))
                .expect("write never answered");
            let got = if then {
                read_then_waited(&*fs, a.ino, fh, 0, 8192)
            } else {
                let mut got = Vec::new();
                fs.read(a.ino, fh, 0, 8192, &mut |s: &[&[u8]]| {
                    got = s.concat();
                    Ok(())
                })
                .map(|()| got)
                .map_err(|e| e.errno)
            };
            writer.join().unwrap().unwrap();
            let mut want = vec![7u8; 4096];
            want.extend_from_slice(&[0u8; 4096]);
            outcomes.push((
                then,
                got.as_ref().map(|d| d.len()).map_err(|e| *e),
                got == Ok(want),
            ));
            fs.release(a.ino, fh).unwrap();
        }
        eprintln!("(read_then, bytes read, right): {outcomes:?}");
        for (then, n, right) in outcomes {
            assert!(
                right,
                "read_then {then}: read {n:?} bytes of 8192 (4096 written, 4096 hole)"
            );
        }
    });
}

/// fio at queue depth 64 (libaio, O_DIRECT, 4 KiB random reads; the kernel sends them as
/// async requests), each block checked against the checksum fio wrote into it; then
/// buffered sequential reads of the same file, checked too.
#[test]
fn fio_qd64_direct_random_reads_verify() {
    if std::process::Command::new("fio")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no fio");
        return;
    }
    let net = Net::new();
    let srv = Served::new(&net, "rev27-fio", &[]);
    let m = RemoteMount::new(&net, &srv, "fio", &["-o", "timeout=5"]);
    let file = m.path("fio.dat");
    let common = format!(
        "--name=j --filename={file} --size=32m --bs=4k --verify=crc32c --verify_fatal=1 --group_reporting"
    );
    let run = |extra: &str| {
        let out = std::process::Command::new("timeout")
            .arg("120")
            .arg("sh")
            .arg("-c")
            .arg(format!(
                "fio {common} {extra} --output-format=terse --terse-version=3"
            ))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "fio {extra}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let s = String::from_utf8_lossy(&out.stdout).to_string();
        // terse v3: field 6 is read KiB, 8 read IOPS
        let f: Vec<&str> = s.trim().split(';').collect();
        eprintln!("fio {extra}: read {} KiB, {} IOPS", f[5], f[7]);
    };
    run("--rw=write --do_verify=0 --direct=0");
    run("--rw=randread --direct=1 --ioengine=libaio --iodepth=64 --runtime=8 --time_based=0");
    run("--rw=read --direct=0 --ioengine=psync");
    run("--rw=randread --direct=1 --ioengine=libaio --iodepth=64 --numjobs=2 --runtime=8");
}

/// The same for the other requests that carry a server handle: the first write (waited
/// for, and written behind), fsync, lseek and fallocate of a file kept open across a
/// server restart (SIGKILL; what was fsync'd before is durable) succeed, and the file
/// then holds every byte written. (Reads were fixed first: a request built with the old
/// session's handle and resent into the new one was refused EBADF.)
#[test]
fn the_first_handle_requests_after_a_restart_use_the_reopened_file() {
    use zcfs_backend::Backend;
    let net = Net::new();
    let mut srv = Served::new(&net, "rev27-firstw", &[]);
    net.in_cli(|| three_files(&srv.client(&net, Duration::from_secs(2))));
    // One restart per kind of first request.
    for first in ["write", "write_behind", "fsync", "lseek", "fallocate"] {
        net.in_cli(|| {
            let fs = srv.client(&net, Duration::from_secs(2));
            let g = open_third(&fs, libc::O_RDWR);
            assert_eq!(read_all(&fs, g.0, g.1, 0, 4096), pattern(0, 4096, 4));
            srv.kill(libc::SIGKILL);
            srv.start(&net, &[]);
            let new = pattern(4096, 4096, 9);
            let r = match first {
                "write" => fs.write(&ctx(), g.0, g.1, 4096, &new).map(|_| ()),
                "write_behind" => fs
                    .write_behind(&ctx(), g.0, g.1, 4096, &new)
                    .and_then(|_| fs.fsync(g.0, g.1, false)),
                "fsync" => fs.fsync(g.0, g.1, false),
                "lseek" => fs.lseek(g.0, g.1, 0, libc::SEEK_DATA).map(|_| ()),
                _ => fs.fallocate(&ctx(), g.0, g.1, 0, 8192, 0),
            };
            assert_eq!(
                r.map_err(|e| e.errno),
                Ok(()),
                "{first}: the first request after the restart"
            );
            if first.starts_with("write") {
                fs.fsync(g.0, g.1, false).unwrap();
                assert_eq!(read_all(&fs, g.0, g.1, 4096, 4096), new, "{first}");
                fs.write(&ctx(), g.0, g.1, 4096, &pattern(4096, 4096, 4))
                    .unwrap();
                fs.fsync(g.0, g.1, false).unwrap();
            }
            fs.release(g.0, g.1).unwrap();
        });
    }
    srv.kill(libc::SIGTERM);
}

/// Review 27d (42592a0): a server that hangs (here SIGSTOP: our fsync times out, so we
/// break the connection before the server closes it) and is then restarted: the first
/// handle request after the restart still uses the reopened file (held).
#[test]
fn the_first_handle_request_after_a_hang_and_restart_uses_the_reopened_file() {
    use zcfs_backend::Backend;
    let net = Net::new();
    let mut srv = Served::new(&net, "rev27d-hang", &[]);
    net.in_cli(|| three_files(&srv.client(&net, Duration::from_secs(2))));
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(1));
        let g = open_third(&fs, libc::O_RDWR);
        assert_eq!(read_all(&fs, g.0, g.1, 0, 4096), pattern(0, 4096, 4));
        srv.signal(libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(200));
        let hung = fs.fsync(g.0, g.1, false);
        assert!(hung.is_err(), "a request to a stopped server fails");
        srv.kill(libc::SIGKILL);
        srv.start(&net, &[]);
        let r = fs.lseek(g.0, g.1, 0, libc::SEEK_DATA).map(|_| ());
        assert_eq!(
            r.map_err(|e| e.errno),
            Ok(()),
            "the first handle request after the restart"
        );
        fs.release(g.0, g.1).unwrap();
    });
    srv.kill(libc::SIGTERM);
}
