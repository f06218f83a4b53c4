//! Review 28b: the lane's silent-retry rule of 51ecb94 ("only a lane lost with data due
//! (a read's, a landing write's) and none ever come counts as silent"). Attacks: data
//! that came one way hides data that never comes the other way; a request whose own
//! frames are full-size but which is no "data" (an inline write's command parts); data
//! "due" that the server never asked for (a landing write answered "resend on TCP").
//! Root and zcfs's XDP program; skipped otherwise unless ZCFS_REQUIRE_L2=1. And (4) the
//! read-ahead window set through mountinfo (29e6d16): a local mount, root and /dev/fuse.
//! Every loop is bounded in count and time.
//!
//! Run (findings are ignored so the suite stays green):
//!   ZCFS_REQUIRE_L2=1 nice -n 19 cargo test --release -p zcfs --test review28b -- \
//!       --ignored --test-threads=1 --nocapture

mod common;
use common::remote::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use zcfs_backend::{Backend, ROOT};
use zcfs_client::l2::{L2_REPLY_TIMEOUT, L2_RETRY_AFTER, L2_SILENT_RETRIES};
use zcfs_protocol::l2::MAX_WRITE;
use zcfs_protocol::Op;

/// Offers of the lane made (`L2Setup` on TCP) and requests held about
/// `L2_REPLY_TIMEOUT` by it, while `step` runs every 20 ms: first for as long as a
/// bounded retry takes to be over (one loss, then `L2_SILENT_RETRIES + 1` set-ups),
/// then (the figures returned) for as long again as a retry takes to come and fail,
/// twice. `step` returns how long its request on the lane took.
fn offers_and_stalls_late(
    c: &zcfs_client::Client,
    mut step: impl FnMut(u64) -> Duration,
) -> (u64, u32, Duration) {
    let tcp = |op: Op| c.tcp_requests[op as usize].load(Ordering::SeqCst);
    // What the lane did: set-ups offered and requests sent on it. A slow step during
    // which it did nothing is the machine's (a loaded 2-vCPU guest), not the lane's.
    let lane_activity = || {
        tcp(Op::L2Setup)
            + c.l2_counters
                .requests
                .iter()
                .map(|r| r.load(Ordering::SeqCst))
                .sum::<u64>()
    };
    let given_up = || {
        c.lane_report()
            .is_some_and(|r| r.reason.contains("lanes in a row"))
    };
    let mut n = 0u64;
    let mut run = |until: Instant, stop_early: &dyn Fn() -> bool| {
        let (mut stalls, mut slowest, mut unrelated) = (0u32, Duration::ZERO, 0u32);
        while Instant::now() < until && n < 5000 && !stop_early() {
            let before = lane_activity();
            let took = step(n);
            if took >= L2_REPLY_TIMEOUT * 9 / 10 {
                if lane_activity() != before {
                    stalls += 1;
                    slowest = slowest.max(took);
                } else {
                    unrelated += 1;
                }
            }
            n += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        if unrelated > 0 {
            eprintln!("{unrelated} slow steps with no lane activity (not counted)");
        }
        (stalls, slowest)
    };
    // Phase 1: until the lane is given up, or for as long as the rule allows and twice
    // that again (each cycle runs longer than its nominal time on a loaded machine; a
    // rule that sets the lane up for ever shows in phase 2 all the same).
    let phase1 = (L2_RETRY_AFTER + L2_REPLY_TIMEOUT) * (L2_SILENT_RETRIES + 2);
    let (stalls_early, _) = run(Instant::now() + 3 * phase1, &given_up);
    let offers_early = tcp(Op::L2Setup);
    let (stalls_late, slowest_late) = run(
        Instant::now() + 2 * (L2_RETRY_AFTER + L2_REPLY_TIMEOUT),
        &|| false,
    );
    let offers_late = tcp(Op::L2Setup) - offers_early;
    eprintln!(
        "phase 1: {offers_early} offers, {stalls_early} stalls; phase 2: {offers_late} offers, \
         {stalls_late} stalls (slowest {slowest_late:?}); lane {:?}",
        c.lane_report().map(|r| (r.up, r.reason, r.counters))
    );
    (offers_late, stalls_late, slowest_late)
}

/// (3a) Data that came one way hides data that never comes the other way. The lane's
/// own pair with the client end's MTU at 512, as in review 27b: commands pass both
/// ways, and so do a landing write's data frames (client to server: the server's end
/// takes 1514-byte frames), but a read's data frames (server to client, 1514 bytes)
/// are dropped by the client's end. A client that writes (landing: past `MAX_WRITE`)
/// and then reads: the landing write sets `data_came`, the read loses the lane, and
/// `l2_lane` resets the count of silent lanes because "data came" — the lane is set up
/// again for ever, every read held `L2_REPLY_TIMEOUT` each time, as before review 27b's
/// fix. (Before 51ecb94 only a read answered over the lane reset the count.) The rule
/// should ask whether the data due in the direction that failed ever came (a read's
/// data, not a landing write's), or whether the request that lost the lane had data
/// due and none came for it. The suite's own review 27c test
/// (`a_lane_idle_past_the_healthy_age_then_lost_at_its_first_read_is_not_retried_for_ever`,
/// not ignored) fails at 51ecb94 for this reason (its 64 KiB write lands now: 5 reads
/// stalled, 4 allowed) and passes with 51ecb94 reverted, as do this test and (3b).
#[test]
fn a_lane_whose_landing_writes_pass_but_reads_data_never_comes_is_not_set_up_again_for_ever() {
    if !l2_ready() {
        return;
    }
    let net = Net::with_lane_pair(1);
    let mut srv = Served::new(&net, "rv28b-land-read", &["--l2", LANE_SRV_IF]);
    net.ip(false, &["link", "set", "dev", LANE_CLI_IF, "mtu", "512"]);
    let (offers_late, stalls_late, slowest_late, landed) = net.in_cli(|| {
        let fs = client_l2_landing(&net, LANE_CLI_IF, Duration::from_secs(10));
        let c = fs.client().clone();
        let (f, fh) = create_file(&fs, "f", libc::O_RDWR);
        // Landing writes: 64 KiB, past MAX_WRITE and within MAX_LANDING_WRITE.
        const LAND: usize = 64 << 10;
        assert!(LAND > MAX_WRITE as usize);
        let mut model = seeded_bytes(1, 4 * LAND);
        assert_eq!(
            fs.write(&ctx(), f.ino, fh, 0, &model).unwrap() as usize,
            model.len()
        );
        let r = offers_and_stalls_late(&c, |n| {
            // A write, then a read of what is there.
            let off = (n % 4) as usize * LAND;
            let data = seeded_bytes(n + 2, LAND);
            assert_eq!(
                fs.write(&ctx(), f.ino, fh, off as u64, &data).unwrap() as usize,
                LAND
            );
            model[off..off + LAND].copy_from_slice(&data);
            let t = Instant::now();
            let got = read_all(&fs, f.ino, fh, off as u64, 4096);
            let took = t.elapsed();
            assert!(got == model[off..off + 4096], "read {n}");
            took
        });
        let landed = c.l2_counters.landed.load(Ordering::SeqCst);
        fs.release(f.ino, fh).unwrap();
        (r.0, r.1, r.2, landed)
    });
    srv.kill(libc::SIGTERM);
    srv.fsck();
    // The setting: writes did land over the lane.
    assert!(landed > 0, "no write landed: the setting does not hold");
    assert_eq!(
        (offers_late, stalls_late),
        (0, 0),
        "still setting the lane up and stalling reads (slowest {slowest_late:?}, {landed} \
         writes landed)"
    );
}

/// (3b) A request whose own frames are full-size is no "data" to the rule. The lane's
/// own pair with the server end's MTU at 512: the probe's Ping passes, and so do small
/// commands, but a write up to `MAX_WRITE` rides the lane inline, in command parts of
/// up to 1514 bytes, which the server's end drops. Each such write waits
/// `L2_REPLY_TIMEOUT` and loses the lane; no data was due on it (no read, no landing),
/// so the loss counts as a lane "that carried only commands" and the lane is set up
/// again for ever: a client that writes small files on a link with an MTU mismatch
/// (the misconfiguration of review 27b, the other way round) has a write held 1 s every
/// ~3 s, for ever. (Before 51ecb94 such a lane counted as silent: no read answered over
/// it.) A multi-part command (full-size frames due) should count as data due, or the
/// rule count a lane lost at a request whose frames never got through.
#[test]
fn a_lane_that_drops_full_size_command_frames_is_not_set_up_again_for_ever() {
    if !l2_ready() {
        return;
    }
    let net = Net::with_lane_pair(1);
    let mut srv = Served::new(&net, "rv28b-inline", &["--l2", LANE_SRV_IF]);
    net.ip(true, &["link", "set", "dev", LANE_SRV_IF, "mtu", "512"]);
    let (offers_late, stalls_late, slowest_late) = net.in_cli(|| {
        let fs = client_l2_landing(&net, LANE_CLI_IF, Duration::from_secs(10));
        let c = fs.client().clone();
        assert_eq!(
            c.l2_status().map(|s| s.0),
            Some(true),
            "the probe passed: {:?}",
            c.lane_report()
        );
        let (f, fh) = create_file(&fs, "f", libc::O_RDWR);
        let r = offers_and_stalls_late(&c, |n| {
            // 4 KiB: inline on the lane (three command parts).
            let data = seeded_bytes(n + 1, 4096);
            let t = Instant::now();
            assert_eq!(
                fs.write(&ctx(), f.ino, fh, (n % 64) * 4096, &data).unwrap(),
                4096
            );
            t.elapsed()
        });
        fs.release(f.ino, fh).unwrap();
        r
    });
    srv.kill(libc::SIGTERM);
    srv.fsck();
    assert_eq!(
        (offers_late, stalls_late),
        (0, 0),
        "still setting the lane up and stalling writes (slowest {slowest_late:?})"
    );
}

/// (3c) Data "due" that the server never asked for. A landing write sets `data_due` when
/// it is staged, before the server says anything; the server may answer "resend on
/// TCP" instead of asking for the data (no room laid out for landing: a full volume, or
/// one too fragmented; `MAX_PENDING_LANDINGS` writes held), and no data frame is ever
/// sent. Such a lane carried only commands, yet a loss of it counts as silent: on a full
/// volume, a client whose writes past `MAX_WRITE` fail (ENOSPC, as they must) loses the
/// lane for good after `L2_SILENT_RETRIES + 1` server restarts, the case 51ecb94 was
/// to fix (review 27d). `data_due` should be set when the server asks for the data
/// (send-data), not when the write is staged.
#[test]
fn a_lane_whose_landing_writes_are_sent_back_to_tcp_comes_back_after_every_server_restart() {
    if !l2_ready() {
        return;
    }
    let net = Net::with_lane_pair(1);
    let args = ["--l2", LANE_SRV_IF];
    let mut srv = Served::sized(&net, "rv28b-full", "64M", &args);
    // Fill the volume (on TCP: a client without the lane).
    net.in_cli(|| {
        let fs = client(&net, Duration::from_secs(10));
        let (f, fh) = create_file(&fs, "fill", libc::O_RDWR);
        let mut off = 0u64;
        for chunk in [1usize << 20, 4096] {
            let data = vec![0x5a; chunk];
            for _ in 0..256 {
                match fs.write(&ctx(), f.ino, fh, off, &data) {
                    Ok(n) => off += n as u64,
                    Err(e) if e.errno == libc::ENOSPC => break,
                    Err(e) => panic!("filling: {e:?}"),
                }
            }
        }
        fs.fsync(f.ino, fh, false).unwrap();
        fs.release(f.ino, fh).unwrap();
        eprintln!("volume full after {off} bytes");
    });
    let srv = std::sync::Mutex::new(&mut srv);
    let cycles = L2_SILENT_RETRIES + 2;
    net.in_cli(|| {
        let fs = client_l2_landing(&net, LANE_CLI_IF, Duration::from_secs(10));
        let c = fs.client().clone();
        let getattr_l2 = || c.l2_counters.requests[Op::Getattr as usize].load(Ordering::SeqCst);
        for n in 0..=cycles {
            if n > 0 {
                let mut s = srv.lock().unwrap();
                s.kill(libc::SIGKILL);
                s.start(&net, &args);
            }
            // Metadata requests until one rides the lane again (bounded).
            let before = getattr_l2();
            let t = Instant::now();
            while getattr_l2() == before && t.elapsed() < Duration::from_secs(20) {
                fs.getattr(ROOT).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
            assert!(
                getattr_l2() > before,
                "after restart {n} of {cycles} the lane did not come back: {:?}",
                c.lane_report()
            );
            // A write past MAX_WRITE: offered to land, sent back to TCP by the server (no
            // room), where it fails as a full volume must.
            let fell_back = c.l2_counters.fell_back.load(Ordering::SeqCst);
            let f = fs.lookup(&ctx(), ROOT, b"fill").unwrap();
            let fh = fs.open(&ctx(), f.ino, libc::O_RDWR).unwrap();
            let w = fs.write(&ctx(), f.ino, fh, 1 << 30, &vec![1u8; 64 << 10]);
            assert_eq!(w.map_err(|e| e.errno), Err(libc::ENOSPC), "cycle {n}");
            let _ = fs.release(f.ino, fh);
            fs.forget(f.ino, 1);
            assert!(
                c.l2_counters.fell_back.load(Ordering::SeqCst) > fell_back,
                "cycle {n}: the write was not offered to the lane: {:?}",
                c.lane_report()
            );
            assert_eq!(c.l2_counters.landed.load(Ordering::SeqCst), 0);
        }
        assert_eq!(c.lane_report().unwrap().reason, "");
    });
    srv.into_inner().unwrap().kill(libc::SIGTERM);
}

/// (4) The read-ahead window now needs the mount's line in mountinfo (29e6d16), and
/// `mount_at` decodes only the space, tab and backslash escapes, not the newline
/// (`\012`, escaped by the kernel as well). A mount point whose name holds a newline is
/// never found: the window stays the kernel's (before 29e6d16 a stat found the device
/// whatever the name), and, as before, there is no stat socket and a SIGTERM leaves the
/// mount behind as not "still ours". Root and /dev/fuse; a local volume.
#[test]
fn a_mount_point_with_a_newline_gets_the_read_ahead_window_and_is_unmounted_on_sigterm() {
    use std::os::unix::fs::MetadataExt;
    use std::process::Stdio;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/dev/fuse").exists() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let pid = std::process::id();
    let image = std::path::PathBuf::from(format!("/dev/shm/zcfs-rv28b-nl-{pid}.img"));
    common::mkfs(&image, "64M", &[]);
    let mp = std::env::temp_dir().join(format!("zcfs-rv28b-nl\nmp-{pid}"));
    std::fs::create_dir_all(&mp).unwrap();
    let escaped = mp.to_str().unwrap().replace('\n', "\\012");
    let in_mountinfo = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(escaped.as_str()))
    };
    let mut child = common::zcfs()
        .arg("mount")
        .arg(&image)
        .arg(&mp)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !in_mountinfo() && t.elapsed() < Duration::from_secs(20) {
        assert!(child.try_wait().unwrap().is_none(), "the mount exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mounted = in_mountinfo();
    let mut ra = String::new();
    if mounted {
        let dev = std::fs::metadata(&mp).unwrap().dev();
        let knob = format!(
            "/sys/class/bdi/{}:{}/read_ahead_kb",
            libc::major(dev),
            libc::minor(dev)
        );
        // Set right after the mount appears: looked at until it is (bounded).
        let t = Instant::now();
        ra = std::fs::read_to_string(&knob).unwrap();
        while ra.trim() != "16384" && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
            ra = std::fs::read_to_string(&knob).unwrap();
        }
    }
    // SIGTERM: the process unmounts and exits.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let left_mounted = in_mountinfo();
    if left_mounted {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&mp)
            .status();
    }
    let _ = std::fs::remove_dir(&mp);
    let _ = std::fs::remove_file(&image);
    assert!(mounted, "the mount did not come up");
    assert!(
        ra.trim() == "16384" && !left_mounted,
        "read_ahead_kb {} (16384 asked), left mounted after SIGTERM: {left_mounted}",
        ra.trim()
    );
}
