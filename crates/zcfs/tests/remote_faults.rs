//! Remote access when things fail, between two network namespaces joined by a veth pair
//! (root required, as in CI): a server killed and restarted mid-workload, a cut link,
//! and a client killed while it holds files open (its session's handles are released
//! after the grace period).

mod common;
use common::remote::*;
use common::*;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcfs_backend::{Backend, ROOT};

#[test]
fn server_sigkill_mid_workload_then_restart() {
    let net = Net::new();
    let mut srv = Served::new(&net, "kill", &[]);
    let acked = Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    let writer_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|s| {
        let (net_r, acked_w, done_w) = (&net, acked.clone(), writer_done.clone());
        let writer = s.spawn(move || {
            net_r.in_cli(|| {
                let fs = client(net_r, Duration::from_secs(3));
                let mut errors = 0;
                for i in 0..4000u32 {
                    if done_w.load(Ordering::SeqCst) {
                        break;
                    }
                    let r = (|| {
                        let name = format!("f{i}");
                        let (f, fh) = fs.create(
                            &ctx(),
                            ROOT,
                            name.as_bytes(),
                            libc::S_IFREG | 0o644,
                            libc::O_RDWR,
                        )?;
                        fs.write(
                            &ctx(),
                            f.ino,
                            fh,
                            0,
                            &vec![(i % 251) as u8; 4096 + i as usize],
                        )?;
                        fs.fsync(f.ino, fh, false)?;
                        fs.release(f.ino, fh)
                    })();
                    match r {
                        Ok(()) => acked_w.lock().unwrap().push(i),
                        Err(e) => {
                            // The kill: a clear error, not a hang.
                            assert!(
                                [
                                    libc::ENOTCONN,
                                    libc::ETIMEDOUT,
                                    libc::ECONNREFUSED,
                                    libc::ECONNRESET,
                                    libc::EEXIST,
                                    libc::ENOENT,
                                    libc::ESTALE
                                ]
                                .contains(&e.errno),
                                "unexpected error {e}"
                            );
                            errors += 1;
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
                errors
            })
        });
        // Let it run, kill the server hard, restart it on the same volume.
        while acked.lock().unwrap().len() < 100 {
            std::thread::sleep(Duration::from_millis(10));
        }
        srv.kill(libc::SIGKILL);
        std::thread::sleep(Duration::from_millis(300));
        srv.start(&net, &[]);
        let t = Instant::now();
        let before = acked.lock().unwrap().len();
        while acked.lock().unwrap().len() < before + 100 {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "client did not carry on after the restart"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        writer_done.store(true, Ordering::SeqCst);
        let errors = writer.join().unwrap();
        assert!(errors >= 1, "the kill should have been noticed");
    });
    // Every acknowledged (fsync'd) file is there with its bytes.
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(5));
        for &i in acked.lock().unwrap().iter() {
            let a = fs
                .lookup(&ctx(), ROOT, format!("f{i}").as_bytes())
                .unwrap_or_else(|e| panic!("f{i} lost: {e}"));
            assert_eq!(
                read_all(&fs, a.ino, 0, 0, 1 << 20),
                vec![(i % 251) as u8; 4096 + i as usize],
                "f{i}"
            );
        }
    });
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

#[test]
fn cut_link_gives_a_bounded_error_then_recovers() {
    let net = Net::new();
    let srv = Served::new(&net, "cut", &[]);
    net.in_cli(|| {
        let timeout = Duration::from_secs(2);
        let fs = srv.client(&net, timeout);
        let (f, fh) = fs
            .create(&ctx(), ROOT, b"f", libc::S_IFREG | 0o644, libc::O_RDWR)
            .unwrap();
        fs.write(&ctx(), f.ino, fh, 0, b"before").unwrap();
        net.link(false);
        let t = Instant::now();
        let e = fs.write(&ctx(), f.ino, fh, 0, b"during").unwrap_err();
        let waited = t.elapsed();
        assert!(waited < timeout * 3, "error took {waited:?}");
        assert!(
            [
                libc::ETIMEDOUT,
                libc::ENOTCONN,
                libc::EHOSTUNREACH,
                libc::ENETUNREACH
            ]
            .contains(&e.errno),
            "{e}"
        );
        net.link(true);
        // Reconnects by itself; the handle still works.
        let t = Instant::now();
        loop {
            match fs.write(&ctx(), f.ino, fh, 0, b"after!") {
                Ok(_) => break,
                Err(e) => {
                    assert!(t.elapsed() < Duration::from_secs(20), "no recovery: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        assert_eq!(read_all(&fs, f.ino, fh, 0, 6), b"after!");
        assert!(fs.client().reconnects.load(Ordering::Relaxed) >= 1);
    });
}

#[test]
fn a_killed_clients_handles_are_released_after_grace() {
    let net = Net::new();
    let mut srv = Served::new(&net, "killed", &["--grace", "2"]);
    let observer = net.in_cli(|| client(&net, Duration::from_secs(10)));
    // The root directory's first block, allocated for its first entry, stays.
    let (w, wh) = observer
        .create(
            &ctx(),
            ROOT,
            b"warm-up",
            libc::S_IFREG | 0o644,
            libc::O_RDWR,
        )
        .unwrap();
    observer.release(w.ino, wh).unwrap();
    observer.unlink(&ctx(), ROOT, b"warm-up").unwrap();
    let before = observer.statfs().unwrap();
    // A client process (a FUSE mount) with a file open for writing and one for
    // reading, both unlinked, kept busy: it is killed in the middle of both.
    let mut m = RemoteMount::new(&net, &srv, "killed-mp", &[]);
    let (wpath, rpath) = (m.path("w"), m.path("r"));
    sh(&format!("head -c 8M /dev/urandom > {rpath}"));
    let busy = |script: String| {
        Command::new("bash")
            .arg("-c")
            .arg(script)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    // Each keeps its file open on one descriptor and goes through it again and again
    // (a new handle each time, the same 4 or 8 MiB).
    let mut writer = busy(format!(
        "exec 3>{wpath}; rm {wpath}; while true; do \
         dd if=/dev/zero of=/dev/fd/3 bs=1M count=4 conv=notrunc || exit; done"
    ));
    let mut reader = busy(format!(
        "exec 4<{rpath}; rm {rpath}; while true; do \
         dd if=/dev/fd/4 of=/dev/null bs=1M || exit; done"
    ));
    let t = Instant::now();
    loop {
        let v: serde_json::Value =
            serde_json::from_slice(&observer.server_stats().unwrap()).unwrap();
        if v["handles_open"].as_u64().unwrap() >= 2 && t.elapsed() > Duration::from_secs(1) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(observer.statfs().unwrap().bfree < before.bfree);
    m.kill(libc::SIGKILL);
    let _ = writer.kill();
    let _ = reader.kill();
    writer.wait().unwrap();
    reader.wait().unwrap();
    // Within the grace period the session keeps them; after it, all is given back.
    let killed = Instant::now();
    let t = Instant::now();
    loop {
        let v: serde_json::Value =
            serde_json::from_slice(&observer.server_stats().unwrap()).unwrap();
        let s = observer.statfs().unwrap();
        if v["sessions_expired"].as_u64().unwrap() >= 1
            && v["handles_open"].as_u64().unwrap() == 0
            && (s.bfree, s.ffree) == (before.bfree, before.ffree)
        {
            assert!(
                killed.elapsed() >= Duration::from_millis(1500),
                "released before the grace period ran out: {:?}",
                killed.elapsed()
            );
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{v} {s:?} {before:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(observer);
    let err = srv.kill(libc::SIGTERM);
    assert!(!err.contains("panicked"), "{err}");
    srv.fsck();
}
