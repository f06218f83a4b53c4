//! The layer-2 lane on an interface of its own (issue 12; docs/benchmarks.md, "What the
//! lane's XDP program costs bulk TCP on the same veth"): the server and client
//! namespaces are joined by two veth pairs, TCP on the first (veth-srv, veth-cli: the
//! only one with addresses), the lane on the second (veth-lane-srv, veth-lane-cli, no
//! addresses), so zcfs's XDP program sees no TCP segment. Root and zcfs's XDP program;
//! skipped otherwise unless ZCFS_REQUIRE_L2=1. Every loop is bounded.

mod common;
use common::remote::*;
use common::*;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use zcfs_backend::{Backend, ROOT};
use zcfs_client::l2::{DEFAULT_L2_READ_MAX, L2_REPLY_TIMEOUT, L2_RETRY_AFTER, L2_SILENT_RETRIES};
use zcfs_protocol::l2::MAX_WRITE;
use zcfs_protocol::Op;
use zcfs_xsk::BindMode;

/// The first pair carries TCP and no XDP program; the second has zcfs's program on
/// both ends.
fn assert_xdp_only_on_the_lane_pair(net: &Net) {
    for (srv, dev) in [(true, L2_SRV_IF), (false, L2_CLI_IF)] {
        let link = net.link_show(srv, dev);
        assert!(
            !link.contains("xdp"),
            "an XDP program on TCP's {dev}: {link}"
        );
    }
    for (srv, dev) in [(true, LANE_SRV_IF), (false, LANE_CLI_IF)] {
        let link = net.link_show(srv, dev);
        assert!(
            link.contains("prog/xdp") && link.contains("zcfs_xdp"),
            "zcfs's XDP program is not on the lane's {dev}: {link}"
        );
    }
}

/// Bytes of a test file: position-dependent, so a block read from the wrong place or
/// a shifted copy does not match.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    seeded_bytes(seed, len)
}

/// A session whose TCP connection runs over one veth pair and whose lane runs over a
/// second: the client library gets the lane (copy mode, on the lane's interface);
/// writes up to `MAX_WRITE` ride it inline, larger ones up to `MAX_LANDING_WRITE` land
/// in place over it, and reads up to the read limit ride it; larger ones go on TCP,
/// as the per-path counters of both ends show exactly; every byte read back matches
/// the model; only the lane's pair has an XDP program, and only the first pair has an
/// IP route.
#[test]
fn a_lane_on_a_veth_pair_of_its_own_carries_reads_and_writes_beside_tcp() {
    if !l2_ready() {
        return;
    }
    // One queue on TCP's pair: it could not even hold a lane.
    let net = Net::with_lane_pair(1);
    let mut srv = Served::new(&net, "ownpair-lib", &["--l2", LANE_SRV_IF]);
    // TCP can only take the first pair: the route to the server is there, and the
    // lane's pair has no IPv4 address.
    let route = net.ip(false, &["route", "get", &srv_ip(&net)]);
    assert!(route.contains(&format!("dev {L2_CLI_IF} ")), "{route}");
    for (srv_side, dev) in [(true, LANE_SRV_IF), (false, LANE_CLI_IF)] {
        assert_eq!(
            net.ip(srv_side, &["-4", "-o", "addr", "show", "dev", dev]),
            ""
        );
    }
    const FILE: usize = 2 << 20;
    let most = zcfs_protocol::l2::MAX_LANDING_WRITE as usize;
    let (lane_writes, tcp_writes, lane_reads, tcp_reads) = net.in_cli(|| {
        let fs = client_l2_landing(&net, LANE_CLI_IF, Duration::from_secs(10));
        let c = fs.client().clone();
        assert_eq!(
            c.l2_status(),
            Some((true, BindMode::Copy)),
            "the lane is up, in copy mode (veth): {:?}",
            c.lane_report()
        );
        let r = c.lane_report().unwrap();
        assert_eq!(
            (r.iface.as_str(), r.bind_mode.as_str()),
            (LANE_CLI_IF, "copy")
        );
        // With the lane held at both ends.
        assert_xdp_only_on_the_lane_pair(&net);
        let (f, fh) = create_file(&fs, "f", libc::O_RDWR);
        // The whole file first, in one write (on TCP: past MAX_LANDING_WRITE).
        let mut model = pattern(u64::MAX, FILE);
        assert_eq!(
            fs.write(&ctx(), f.ino, fh, 0, &model).unwrap() as usize,
            FILE
        );
        let (mut lane_writes, mut tcp_writes, mut landed) = (0u64, 1u64, 0u64);
        // Writes of 1 byte to 1 MiB + 1 at odd places: those up to MAX_WRITE ride the
        // lane inline (in parts past one command), the larger up to MAX_LANDING_WRITE
        // land in place over it, one byte more goes on TCP.
        let mut at = 0usize;
        for i in 0..400u64 {
            let len = match i % 8 {
                0 => 40 << 10,
                1 => MAX_WRITE as usize,
                2 => MAX_WRITE as usize + 1,
                3 => most + 1,
                4 => most,
                n => 1 + (i as usize * 977 * n as usize) % 6000,
            };
            let off = (at + i as usize * 4099) % (FILE - len);
            let data = pattern(i, len);
            assert_eq!(
                fs.write(&ctx(), f.ino, fh, off as u64, &data).unwrap() as usize,
                len
            );
            model[off..off + len].copy_from_slice(&data);
            if len <= MAX_WRITE as usize {
                lane_writes += 1;
            } else if len <= most {
                lane_writes += 1;
                landed += 1;
            } else {
                tcp_writes += 1;
            }
            at = off + len;
        }
        fs.fsync(f.ino, fh, false).unwrap();
        // Reads of 4 KiB and 64 KiB (the lane's default limit) ride it, 100 KiB and
        // 1 MiB go on TCP (the last, short 100 KiB one rides it); each pass covers the
        // whole file, every read checked.
        let (mut lane_reads, mut tcp_reads) = (0u64, 0u64);
        for size in [4096usize, 64 << 10, 100 << 10, FILE] {
            let mut off = 0;
            while off < FILE {
                let n = size.min(FILE - off);
                let got = read_all(&fs, f.ino, fh, off as u64, n as u32);
                assert!(got == model[off..off + n], "{size}-byte read at {off}");
                if n <= DEFAULT_L2_READ_MAX as usize {
                    lane_reads += 1;
                } else {
                    tcp_reads += 1;
                }
                off += n;
            }
        }
        fs.release(f.ino, fh).unwrap();
        let count = |op: Op| c.l2_counters.requests[op as usize].load(Ordering::SeqCst);
        let tcp = |op: Op| c.tcp_requests[op as usize].load(Ordering::SeqCst);
        assert_eq!(count(Op::Write), lane_writes, "writes over layer 2");
        assert_eq!(tcp(Op::Write), tcp_writes, "writes over TCP");
        assert_eq!(count(Op::Read), lane_reads, "reads over layer 2");
        assert_eq!(tcp(Op::Read), tcp_reads, "reads over TCP");
        assert_eq!(count(Op::Create), 1);
        assert_eq!(tcp(Op::L2Setup), 1, "one offer");
        assert_eq!(c.l2_counters.fell_back.load(Ordering::SeqCst), 0);
        assert_eq!(c.l2_counters.landed.load(Ordering::SeqCst), landed);
        assert!(c.l2_status().unwrap().0, "the lane stayed up");
        (lane_writes, tcp_writes, lane_reads, tcp_reads)
    });
    // 200 inline writes and 150 landing ones on the lane, 50 and the first on TCP;
    // 512 + 32 + 1 reads on the lane, 20 + 1 on TCP.
    assert_eq!(
        (lane_writes, tcp_writes, lane_reads, tcp_reads),
        (350, 51, 545, 21)
    );
    // The server's side of the same: its lane on its own pair, the same counts.
    let s = stat_json(&net, &srv, &net.addr());
    let l2 = &s["l2"];
    assert_eq!(l2["iface"], LANE_SRV_IF, "{l2}");
    assert_eq!(l2["bind_mode"], "copy", "{l2}");
    assert_eq!(l2["requests"]["write"]["l2"], lane_writes, "{l2}");
    assert_eq!(l2["requests"]["write"]["tcp"], tcp_writes, "{l2}");
    assert_eq!(l2["requests"]["read"]["l2"], lane_reads, "{l2}");
    assert_eq!(l2["counters"]["accepted"], 1, "{l2}");
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

/// The server's address (the first pair's server end).
fn srv_ip(net: &Net) -> String {
    net.addr().rsplit_once(':').unwrap().0.to_string()
}

/// The same through `zcfs mount --l2 veth-lane-cli`: a file written through the mount
/// reads back whole with O_DIRECT 4 KiB reads that ride the lane (the mount's and the
/// server's counters say so), small O_DIRECT writes ride it too, and only the lane's
/// pair has an XDP program while the mount holds the lane.
#[test]
fn a_mount_whose_lane_has_a_veth_pair_of_its_own() {
    if !l2_ready() {
        return;
    }
    let net = Net::with_lane_pair(1);
    let mut srv = Served::new(&net, "ownpair-mnt", &["--l2", LANE_SRV_IF]);
    let mut m = RemoteMount::new(&net, &srv, "ownpair-mp", &["--l2", LANE_CLI_IF]);
    const LEN: usize = 256 << 10;
    let data = pattern(7, LEN);
    fs::write(m.path("f"), &data).unwrap();
    let direct = || {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(m.path("f"))
            .unwrap()
    };
    // Overwrite every 8th block with O_DIRECT 4 KiB writes (one request each).
    let mut model = data.clone();
    let mut buf = AlignedBlock::new();
    let mut f = direct();
    for b in (0..LEN / 4096).step_by(8) {
        let block = pattern(1000 + b as u64, 4096);
        buf.0.copy_from_slice(&block);
        f.seek(SeekFrom::Start((b * 4096) as u64)).unwrap();
        f.write_all(&buf.0).unwrap();
        model[b * 4096..(b + 1) * 4096].copy_from_slice(&block);
    }
    drop(f);
    // Read it all back with O_DIRECT 4 KiB reads (past the page cache: each a request).
    let mut f = direct();
    for b in 0..LEN / 4096 {
        f.seek(SeekFrom::Start((b * 4096) as u64)).unwrap();
        f.read_exact(&mut buf.0).unwrap();
        assert!(
            buf.0[..] == model[b * 4096..(b + 1) * 4096],
            "block {b} through the mount"
        );
    }
    drop(f);
    assert_xdp_only_on_the_lane_pair(&net);
    let mount = stat_json(&net, &srv, m.mp.to_str().unwrap());
    let lane = &mount["l2"];
    assert_eq!(lane["up"], true, "the mount's lane: {lane}");
    assert_eq!(lane["iface"], LANE_CLI_IF, "{lane}");
    assert_eq!(lane["bind_mode"], "copy", "{lane}");
    let on_lane = |op: &str| lane["requests"][op]["l2"].as_u64().unwrap_or(0);
    assert!(on_lane("read") >= (LEN / 4096) as u64, "{lane}");
    assert!(on_lane("write") >= (LEN / 4096 / 8) as u64, "{lane}");
    assert_eq!(lane["counters"]["fell_back"], 0, "{lane}");
    let server = stat_json(&net, &srv, &net.addr());
    let sl = &server["l2"];
    assert_eq!(sl["iface"], LANE_SRV_IF, "{sl}");
    assert!(
        sl["requests"]["read"]["l2"].as_u64().unwrap_or(0) >= (LEN / 4096) as u64,
        "{sl}"
    );
    m.stop(libc::SIGTERM);
    assert!(!mounted(&m.mp), "SIGTERM left the mount behind");
    fs::remove_dir(&m.mp).unwrap();
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

/// A 4 KiB buffer aligned for O_DIRECT.
#[repr(C, align(4096))]
struct AlignedBlock([u8; 4096]);

impl AlignedBlock {
    fn new() -> Box<AlignedBlock> {
        Box::new(AlignedBlock([0; 4096]))
    }
}

/// The client's `--l2` names an interface that does not reach the server's lane (the
/// first pair's end, two queues: the lane opens there, is accepted by the server on
/// the second pair, and its frames go nowhere). The set-up's probe gets no reply: the
/// session stays on TCP from connect on, with one offer and one release (the server's
/// interface is free again for a client on the right one), no request stalls later
/// and none falls back; a `zcfs mount` so configured logs exactly one line about the
/// lane and works. Before the probe such a lane was set up again every
/// L2_RETRY_AFTER, each time stalling a request for L2_REPLY_TIMEOUT and logging.
#[test]
fn a_lane_on_an_interface_that_does_not_reach_the_servers_is_given_up_at_set_up() {
    if !l2_ready() {
        return;
    }
    let net = Net::with_lane_pair(2);
    let mut srv = Served::new(&net, "ownpair-wrong", &["--l2", LANE_SRV_IF]);
    net.in_cli(|| {
        let t = Instant::now();
        let fs = client_l2_on(&net, L2_CLI_IF, Duration::from_secs(10));
        let c = fs.client().clone();
        assert!(
            t.elapsed() < L2_REPLY_TIMEOUT + Duration::from_secs(5),
            "connect took {:?}",
            t.elapsed()
        );
        assert_eq!(c.l2_status(), None, "no lane: {:?}", c.lane_report());
        let r = c.lane_report().unwrap();
        assert!(!r.up);
        assert!(
            r.reason.contains("no reply over layer 2") && r.reason.contains(L2_CLI_IF),
            "the reason: {:?}",
            r.reason
        );
        // The client's program is gone with the lane it gave up (detached when the
        // lane's last holder lets go: on a loaded machine a moment later; one suite
        // run in session 32 looked too soon).
        let t = Instant::now();
        while net.link_show(false, L2_CLI_IF).contains("xdp") {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the client's XDP program is still attached 5 s after it gave the lane up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // Work for longer than a retry would take to come and fail: all on TCP, none
        // held for L2_REPLY_TIMEOUT.
        let (f, fh) = create_file(&fs, "f", libc::O_RDWR);
        let until = Instant::now() + 2 * (L2_RETRY_AFTER + L2_REPLY_TIMEOUT);
        let mut i = 0u64;
        let mut slowest = Duration::ZERO;
        while Instant::now() < until {
            let t = Instant::now();
            let data = pattern(i, 4096);
            fs.write(&ctx(), f.ino, fh, (i % 64) * 4096, &data).unwrap();
            assert!(read_all(&fs, f.ino, fh, (i % 64) * 4096, 4096) == data);
            fs.getattr(f.ino).unwrap();
            slowest = slowest.max(t.elapsed());
            i += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        fs.release(f.ino, fh).unwrap();
        assert!(
            slowest < L2_REPLY_TIMEOUT,
            "a request was held {slowest:?} (a lane set up again and silent)"
        );
        let tcp = |op: Op| c.tcp_requests[op as usize].load(Ordering::SeqCst);
        assert_eq!(tcp(Op::L2Setup), 1, "the lane was offered once");
        assert_eq!(tcp(Op::L2Release), 1, "and given back once");
        assert!(tcp(Op::Read) >= i && tcp(Op::Write) >= i);
        for op in zcfs_protocol::ALL_OPS {
            assert_eq!(
                c.l2_counters.requests[*op as usize].load(Ordering::SeqCst),
                0
            );
        }
        assert_eq!(c.l2_counters.fell_back.load(Ordering::SeqCst), 0);
        // The server's interface is free: a client on the right one gets the lane while
        // the first is still connected.
        let right = client_l2_on(&net, LANE_CLI_IF, Duration::from_secs(10));
        assert_eq!(
            right.client().l2_status(),
            Some((true, BindMode::Copy)),
            "{:?}",
            right.client().lane_report()
        );
        let a = right.lookup(&ctx(), ROOT, b"f").unwrap();
        let rfh = right.open(&ctx(), a.ino, libc::O_RDONLY).unwrap();
        assert_eq!(read_all(&right, a.ino, rfh, 0, 4096).len(), 4096);
        right.release(a.ino, rfh).unwrap();
        let rc = right.client();
        assert!(rc.l2_counters.requests[Op::Read as usize].load(Ordering::SeqCst) == 1);
        drop(right);
        drop(fs);
    });
    // A mount so configured: one line about the lane in its log, and it works.
    let log = std::env::temp_dir().join(format!("zcfs-ownpair-wrong-{}.log", std::process::id()));
    let mut m = RemoteMount::logged(
        &net,
        &srv,
        "ownpair-wrong-mp",
        &["--l2", L2_CLI_IF],
        fs::File::create(&log).unwrap(),
    );
    let until = Instant::now() + 2 * (L2_RETRY_AFTER + L2_REPLY_TIMEOUT);
    let mut n = 0;
    while Instant::now() < until {
        let data = pattern(100 + n, 8192);
        fs::write(m.path(&format!("g{n}")), &data).unwrap();
        assert!(fs::read(m.path(&format!("g{n}"))).unwrap() == data);
        let _ = fs::metadata(m.path("f")).unwrap();
        n += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let mount = stat_json(&net, &srv, m.mp.to_str().unwrap());
    assert_eq!(mount["l2"]["up"], false, "{}", mount["l2"]);
    m.stop(libc::SIGTERM);
    let text = fs::read_to_string(&log).unwrap();
    fs::remove_file(&log).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("layer-2")).collect();
    assert_eq!(lines.len(), 1, "the mount's log:\n{text}");
    assert!(
        lines[0].contains("not used") && lines[0].contains("no reply over layer 2"),
        "{}",
        lines[0]
    );
    assert!(!mounted(&m.mp), "SIGTERM left the mount behind");
    fs::remove_dir(&m.mp).unwrap();
    // Nothing of the lane is left attached anywhere but the server's own interface.
    assert!(!net.link_show(false, L2_CLI_IF).contains("xdp"));
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

/// A lane that worked, then the server restarted with its lane on the other pair (one
/// this client's interface does not reach): the lost lane fails over to TCP, the lane
/// set up again is silent and tried again only `L2_SILENT_RETRIES` times, each after
/// `L2_RETRY_AFTER`; then the session stays on TCP: no more offers, no request held
/// for `L2_REPLY_TIMEOUT` any longer, every read still right.
#[test]
fn a_lane_that_worked_and_then_went_silent_is_tried_again_a_bounded_number_of_times() {
    if !l2_ready() {
        return;
    }
    let net = Net::with_lane_pair(2);
    let mut srv = Served::new(&net, "ownpair-moved", &["--l2", LANE_SRV_IF]);
    net.in_cli(|| {
        let fs = client_l2_on(&net, LANE_CLI_IF, Duration::from_secs(10));
        let c = fs.client().clone();
        assert_eq!(c.l2_status(), Some((true, BindMode::Copy)));
        let (f, fh) = create_file(&fs, "f", libc::O_RDWR);
        let data = pattern(3, 4096);
        fs.write(&ctx(), f.ino, fh, 0, &data).unwrap();
        fs.release(f.ino, fh).unwrap();
        // A fresh handle each time (a restart's handles are reopened, but a fresh one
        // needs no hook): open, 4 KiB read, release, all of which ride a lane.
        let read_once = || -> Result<Vec<u8>, zcfs_backend::Error> {
            let fh = fs.open(&ctx(), f.ino, libc::O_RDONLY)?;
            let mut out = Vec::new();
            fs.read(f.ino, fh, 0, 4096, &mut |s: &[&[u8]]| {
                out.extend(s.iter().flat_map(|x| x.iter()));
                Ok(())
            })?;
            fs.release(f.ino, fh)?;
            Ok(out)
        };
        assert_eq!(read_once().unwrap(), data);
        let count = |op: Op| c.l2_counters.requests[op as usize].load(Ordering::SeqCst);
        assert!(count(Op::Read) >= 1, "the first lane carried reads");
        // The server comes back with its lane on the first pair.
        srv.kill(libc::SIGTERM);
        srv.start(&net, &["--l2", L2_SRV_IF]);
        let lane_reads = count(Op::Read);
        // Until the client gives the lane up (bounded: one loss, then silent set-ups of at
        // most L2_REPLY_TIMEOUT each, L2_RETRY_AFTER apart).
        let t = Instant::now();
        let patience = (L2_RETRY_AFTER + L2_REPLY_TIMEOUT) * (L2_SILENT_RETRIES + 2) * 2;
        while c.l2_status().is_some() {
            assert!(
                t.elapsed() < patience,
                "the lane still tried after {:?}: {:?}",
                t.elapsed(),
                c.lane_report()
            );
            match read_once() {
                Ok(got) => assert_eq!(got, data),
                // Right after the restart: the session being found gone.
                Err(e) => assert!(
                    t.elapsed() < Duration::from_secs(10)
                        && [
                            libc::ENOTCONN,
                            libc::ECONNREFUSED,
                            libc::ECONNRESET,
                            libc::EBADF
                        ]
                        .contains(&e.errno),
                    "{e}"
                ),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let tcp = |op: Op| c.tcp_requests[op as usize].load(Ordering::SeqCst);
        // The first lane (it brought reads' data, so its loss starts the count afresh),
        // then the lane set up again L2_SILENT_RETRIES + 1 times.
        assert_eq!(
            tcp(Op::L2Setup),
            2 + u64::from(L2_SILENT_RETRIES),
            "{:?}",
            c.lane_report()
        );
        let r = c.lane_report().unwrap();
        assert!(r.reason.contains("no reply over layer 2"), "{r:?}");
        assert_eq!(count(Op::Read), lane_reads, "no read rode a silent lane");
        // From now on: TCP only, without stalls, and no further offer.
        let until = Instant::now() + 2 * (L2_RETRY_AFTER + L2_REPLY_TIMEOUT);
        let mut slowest = Duration::ZERO;
        while Instant::now() < until {
            let t = Instant::now();
            assert_eq!(read_once().unwrap(), data);
            slowest = slowest.max(t.elapsed());
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(slowest < L2_REPLY_TIMEOUT, "a request was held {slowest:?}");
        assert_eq!(tcp(Op::L2Setup), 2 + u64::from(L2_SILENT_RETRIES));
        assert_eq!(c.l2_status(), None);
    });
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

/// A lane that carries only commands (metadata) is set up again however often it is
/// lost: here the server restarts more times than `L2_SILENT_RETRIES` allows for lanes
/// lost with data due, and after each restart the lane comes back and carries the
/// client's requests again (review 27d: such a lane was given up for good after four
/// losses, since none had brought a read's data).
#[test]
fn a_metadata_only_lane_comes_back_after_every_server_restart() {
    if !l2_ready() {
        return;
    }
    let net = Net::with_lane_pair(1);
    let args = ["--l2", LANE_SRV_IF];
    let mut srv = Served::new(&net, "ownpair-meta", &args);
    let srv = std::sync::Mutex::new(&mut srv);
    let cycles = L2_SILENT_RETRIES + 2;
    net.in_cli(|| {
        let fs = client_l2_on(&net, LANE_CLI_IF, Duration::from_secs(10));
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
            assert_eq!(c.l2_endpoint_stats().map(|_| ()), Some(()));
        }
        assert_eq!(c.lane_report().unwrap().reason, "");
    });
    srv.into_inner().unwrap().kill(libc::SIGTERM);
}
