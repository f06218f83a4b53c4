//! The layer-2 protocol against TCP on one veth pair in one run (root):
//! (a) 4 KiB read QD1 (command request -> 4 KiB data reply through the Endpoint), busy
//!     polling and FrameIo::wait; (b) 1 KiB and 4 KiB writes QD1 (1 KiB: data inline in
//!     the command, 4 KiB: data into a slot the server granted ahead, commit command, ack);
//! (c) bulk client->server MB/s with extents of 32 blocks; and TCP ping-pongs of the
//! same sizes on the same link. Each measured RUNS times; medians printed.
//!
//! `cargo run --release -p zcfs-l2 --example l2bench`

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{l2_ready, peer, Link, Peer, TIMING};
use zcfs_l2::{Event, Extent, BLOCK_SIZE, MAX_EXTENT_BLOCKS};
use zcfs_xsk::Region;

const RUNS: usize = 3;
const ITERS: usize = 10_000;
const BULK_FOR: Duration = Duration::from_secs(3);
/// Bulk: transfers in flight, each of this many 32-block extents.
const BULK_QD: usize = 4;
const BULK_EXTENTS: usize = 4;
const BLOCK: u64 = BLOCK_SIZE as u64;
const SLOT: u64 = BULK_EXTENTS as u64 * (MAX_EXTENT_BLOCKS as u64 + 1) * BLOCK;
/// Blocks for the QD1 phases, behind the bulk slots (a 4 KiB write's slot posted ahead
/// outlives its phase).
const QD1_AREA: u64 = BLOCK + BULK_QD as u64 * SLOT;
const REGION: u64 = QD1_AREA + 2 * BULK_QD as u64 * BLOCK + BLOCK;
/// Any one phase ends by this at the latest.
const PHASE_LIMIT: Duration = Duration::from_secs(120);

fn now(t0: Instant) -> u64 {
    t0.elapsed().as_nanos() as u64
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Read,
    Write1k,
    Write4k,
    Bulk,
}

/// The server's loop for one phase: answers until it gets the command b"end".
fn serve(mut s: Peer, mode: Mode, busy: bool, t0: Instant) -> Peer {
    let src = [Extent {
        offset: QD1_AREA + BLOCK,
        blocks: 1,
    }];
    let slot = |i: usize| Extent {
        offset: QD1_AREA + BLOCK + (i as u64 % BULK_QD as u64) * 2 * BLOCK,
        blocks: 1,
    };
    let start = Instant::now();
    let mut n = 0usize;
    // Writes of 4 KiB: a slot posted ahead, its id in every ack.
    let mut next = if mode == Mode::Write4k {
        s.ep.expect(&[slot(0)]).unwrap()
    } else {
        0
    };
    if mode == Mode::Write4k {
        s.ep.send_command(&next.to_le_bytes()).unwrap();
    }
    let mut committed = std::collections::HashSet::new();
    let mut commits = std::collections::VecDeque::new();
    while start.elapsed() < PHASE_LIMIT {
        let ev = s.ep.poll(now(t0)).unwrap();
        let idle = ev.is_empty();
        for e in ev {
            match e {
                Event::Command(c) if c == b"end" => return s,
                Event::Command(c) => match mode {
                    Mode::Read => {
                        let id = u32::from_le_bytes(c[..4].try_into().unwrap());
                        s.ep.send(id, &src).unwrap();
                    }
                    Mode::Write1k => s.ep.send_command(b"ok").unwrap(),
                    Mode::Write4k => {
                        commits.push_back(u32::from_le_bytes(c[..4].try_into().unwrap()))
                    }
                    Mode::Bulk => {
                        // A request for a transfer of BULK_EXTENTS extents in slot k.
                        let k = c[0] as u64;
                        let dst: Vec<Extent> = (0..BULK_EXTENTS as u64)
                            .map(|i| Extent {
                                offset: BLOCK
                                    + k * SLOT
                                    + i * (MAX_EXTENT_BLOCKS as u64 + 1) * BLOCK,
                                blocks: MAX_EXTENT_BLOCKS,
                            })
                            .collect();
                        let id = s.ep.expect(&dst).unwrap();
                        let mut r = vec![k as u8];
                        r.extend_from_slice(&id.to_le_bytes());
                        s.ep.send_command(&r).unwrap();
                    }
                },
                Event::Committed(id) => {
                    committed.insert(id);
                }
                Event::Delivered(_) => {}
                // The slot a 4 KiB-write phase posted ahead for a write that never came
                // times out in a later phase: not this phase's business.
                Event::Aborted(_) | Event::SlotsFree(_) => {}
                other => panic!("server: {other:?}; stats {:?}", s.ep.stats()),
            }
        }
        // A 4 KiB write is answered once its data committed and its commit arrived.
        while let Some(&id) = commits.front() {
            if !committed.remove(&id) {
                break;
            }
            commits.pop_front();
            n += 1;
            next = s.ep.expect(&[slot(n)]).unwrap();
            s.ep.send_command(&next.to_le_bytes()).unwrap();
        }
        if idle && !busy {
            s.ep.wait_command(Duration::from_millis(1)).unwrap();
        }
    }
    panic!("server phase did not end");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

/// Client side of a latency phase: returns (p50, p99) in µs.
fn client_latency(c: &mut Peer, mode: Mode, busy: bool, t0: Instant) -> (f64, f64) {
    let dst = [Extent {
        offset: QD1_AREA + BLOCK,
        blocks: 1,
    }];
    let src = dst;
    let mut lat = Vec::with_capacity(ITERS);
    let start = Instant::now();
    let payload = vec![0x5Au8; 1024];
    // 4 KiB writes: the first slot's id.
    let mut slot_id = None;
    let step = |c: &mut Peer, want_data: bool| -> Vec<Event> {
        let ev = c.ep.poll(now(t0)).unwrap();
        if ev.is_empty() && !busy {
            if want_data {
                c.ep.wait_data(Duration::from_millis(1)).unwrap();
            } else {
                c.ep.wait_command(Duration::from_millis(1)).unwrap();
            }
        }
        ev
    };
    if mode == Mode::Write4k {
        while slot_id.is_none() {
            assert!(start.elapsed() < PHASE_LIMIT);
            for e in step(c, false) {
                if let Event::Command(r) = e {
                    slot_id = Some(u32::from_le_bytes(r[..4].try_into().unwrap()));
                }
            }
        }
    }
    for _ in 0..ITERS {
        let t = Instant::now();
        let mut done = false;
        match mode {
            Mode::Read => {
                let id = c.ep.expect(&dst).unwrap();
                c.ep.send_command(&id.to_le_bytes()).unwrap();
                while !done {
                    assert!(start.elapsed() < PHASE_LIMIT);
                    done = step(c, true).contains(&Event::Committed(id));
                }
            }
            Mode::Write1k => {
                c.ep.send_command(&payload).unwrap();
                while !done {
                    assert!(start.elapsed() < PHASE_LIMIT);
                    done = step(c, false)
                        .iter()
                        .any(|e| matches!(e, Event::Command(_)));
                }
            }
            Mode::Write4k => {
                let id = slot_id.take().unwrap();
                c.ep.send(id, &src).unwrap();
                c.ep.send_command(&id.to_le_bytes()).unwrap();
                while slot_id.is_none() {
                    assert!(start.elapsed() < PHASE_LIMIT);
                    for e in step(c, false) {
                        if let Event::Command(r) = e {
                            slot_id = Some(u32::from_le_bytes(r[..4].try_into().unwrap()));
                        }
                    }
                }
            }
            Mode::Bulk => unreachable!(),
        }
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    // Let the last Delivered/acks settle, then end the server's phase.
    c.ep.send_command(b"end").unwrap();
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(20) {
        c.ep.poll(now(t0)).unwrap();
    }
    let p50 = pct(&mut lat, 0.5);
    let p99 = pct(&mut lat, 0.99);
    (p50, p99)
}

/// Bulk client->server: MB/s of committed and delivered transfers.
fn client_bulk(c: &mut Peer, t0: Instant) -> f64 {
    let start = Instant::now();
    for k in 0..BULK_QD {
        c.ep.send_command(&[k as u8]).unwrap();
    }
    let mut bytes = 0u64;
    let per = BULK_EXTENTS as u64 * MAX_EXTENT_BLOCKS as u64 * BLOCK;
    let mut inflight = 0;
    let mut slots = std::collections::HashMap::new();
    let mut stop = false;
    let mut failed = 0u64;
    loop {
        assert!(start.elapsed() < PHASE_LIMIT);
        if !stop && start.elapsed() >= BULK_FOR {
            stop = true;
        }
        for e in c.ep.poll(now(t0)).unwrap() {
            match e {
                Event::Command(r) => {
                    let k = r[0] as u64;
                    let id = u32::from_le_bytes(r[1..5].try_into().unwrap());
                    let src: Vec<Extent> = (0..BULK_EXTENTS as u64)
                        .map(|i| Extent {
                            offset: BLOCK + k * SLOT + i * MAX_EXTENT_BLOCKS as u64 * BLOCK,
                            blocks: MAX_EXTENT_BLOCKS,
                        })
                        .collect();
                    c.ep.send(id, &src).unwrap();
                    slots.insert(id, k as u8);
                    inflight += 1;
                }
                Event::Delivered(id) => {
                    bytes += per;
                    inflight -= 1;
                    let k = slots.remove(&id).expect("a transfer we sent");
                    if !stop {
                        c.ep.send_command(&[k]).unwrap();
                    }
                }
                // Not committed (timed out under a drain, say): ask for the slot again
                // (or stop waiting for it); its bytes are not counted.
                Event::Failed(id) => {
                    failed += 1;
                    inflight -= 1;
                    let k = slots.remove(&id).expect("a transfer we sent");
                    if !stop {
                        c.ep.send_command(&[k]).unwrap();
                    }
                }
                other => panic!("client: {other:?}"),
            }
        }
        if stop && inflight == 0 {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if failed > 0 {
        eprintln!("bulk: {failed} transfers failed and were asked for again");
    }
    c.ep.send_command(b"end").unwrap();
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(20) {
        c.ep.poll(now(t0)).unwrap();
    }
    bytes as f64 / secs / 1e6
}

// ---- TCP baseline on the same link ----

/// Server: per request of `req` bytes answer `reply` bytes; until the peer closes.
fn tcp_serve(l: TcpListener, req: usize, reply: usize) {
    let (mut s, _) = l.accept().unwrap();
    s.set_nodelay(true).unwrap();
    let mut b = vec![0u8; req.max(1)];
    let r = vec![0xA5u8; reply];
    loop {
        if s.read_exact(&mut b[..req]).is_err() {
            return;
        }
        if reply > 0 && s.write_all(&r).is_err() {
            return;
        }
    }
}

fn tcp_latency(addr: std::net::SocketAddr, req: usize, reply: usize) -> (f64, f64) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let q = vec![1u8; req];
    let mut r = vec![0u8; reply];
    let mut lat = Vec::with_capacity(ITERS);
    for _ in 0..ITERS {
        let t = Instant::now();
        s.write_all(&q).unwrap();
        s.read_exact(&mut r).unwrap();
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    (pct(&mut lat, 0.5), pct(&mut lat, 0.99))
}

fn tcp_bulk(addr: std::net::SocketAddr) -> f64 {
    let mut s = TcpStream::connect(addr).unwrap();
    let chunk = vec![7u8; (MAX_EXTENT_BLOCKS as usize) * BLOCK_SIZE];
    let t = Instant::now();
    let mut bytes = 0u64;
    while t.elapsed() < BULK_FOR {
        s.write_all(&chunk).unwrap();
        bytes += chunk.len() as u64;
    }
    // The server answers one byte once it read everything.
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut one = [0u8; 1];
    s.read_exact(&mut one).unwrap();
    bytes as f64 / t.elapsed().as_secs_f64() / 1e6
}

fn tcp_sink(l: TcpListener) {
    let (mut s, _) = l.accept().unwrap();
    let mut b = vec![0u8; 1 << 20];
    while s.read(&mut b).map(|n| n > 0).unwrap_or(false) {}
    s.write_all(&[1]).unwrap();
}

type Rows = Vec<(String, Vec<f64>, Vec<f64>)>;

fn add(rows: &mut Rows, name: &str, a: f64, b: f64) {
    match rows.iter_mut().find(|r| r.0 == name) {
        Some(r) => {
            r.1.push(a);
            r.2.push(b);
        }
        None => rows.push((name.to_string(), vec![a], vec![b])),
    }
}

fn main() {
    if !l2_ready() {
        eprintln!("l2bench needs root and a build with clang");
        std::process::exit(1);
    }
    let mut link = Link::new("l2bench");
    let srv_region = Arc::new(Region::anonymous(REGION as usize + common::STAGING).unwrap());
    let cli_region = Arc::new(Region::anonymous(REGION as usize + common::STAGING).unwrap());
    let srv_ip = link.pair.srv_ip;
    let t0 = Instant::now();
    let mut rows: Rows = Vec::new();
    for run in 0..RUNS {
        for busy in [true, false] {
            // Each session its own key, as real sessions have: a late frame or record of
            // the previous session fails the tag instead of landing in this one.
            let key = format!("bench-{run}-{busy}");
            let mut s = peer(
                &mut link,
                true,
                srv_region.clone(),
                REGION,
                key.as_bytes(),
                1,
                0,
                TIMING,
                busy,
            );
            let mut c = peer(
                &mut link,
                false,
                cli_region.clone(),
                REGION,
                key.as_bytes(),
                2,
                0,
                TIMING,
                busy,
            );
            let modes: &[Mode] = if busy {
                &[Mode::Read, Mode::Write1k, Mode::Write4k, Mode::Bulk]
            } else {
                &[Mode::Read, Mode::Write1k, Mode::Write4k]
            };
            let tag = if busy { "busy" } else { "wait" };
            for &mode in modes {
                let h = std::thread::spawn(move || serve(s, mode, busy, t0));
                let (name, a, b) = match mode {
                    Mode::Read => {
                        let (p50, p99) = client_latency(&mut c, mode, busy, t0);
                        (format!("l2 read 4k qd1 {tag} (p50/p99 us)"), p50, p99)
                    }
                    Mode::Write1k => {
                        let (p50, p99) = client_latency(&mut c, mode, busy, t0);
                        (format!("l2 write 1k qd1 {tag} (p50/p99 us)"), p50, p99)
                    }
                    Mode::Write4k => {
                        let (p50, p99) = client_latency(&mut c, mode, busy, t0);
                        (format!("l2 write 4k qd1 {tag} (p50/p99 us)"), p50, p99)
                    }
                    Mode::Bulk => (
                        "l2 bulk 32-block extents (MB/s)".to_string(),
                        client_bulk(&mut c, t0),
                        0.0,
                    ),
                };
                s = h.join().unwrap();
                eprintln!("run {run}: {name}: {a:.1} {b:.1}");
                add(&mut rows, &name, a, b);
            }
            // Sockets closed before the next bind (retried while the kernel releases them).
            drop((s, c));
        }
        // TCP: 64 B -> 4 KiB (read), 1 KiB + 64 -> 8 (write 1k), 4 KiB + 64 -> 8 (write 4k).
        for (name, req, reply) in [
            ("tcp read 4k qd1 (p50/p99 us)", 64usize, 4096usize),
            ("tcp write 1k qd1 (p50/p99 us)", 1024 + 64, 8),
            ("tcp write 4k qd1 (p50/p99 us)", 4096 + 64, 8),
        ] {
            let l = link
                .pair
                .srv
                .run(move || TcpListener::bind((srv_ip, 0)).unwrap())
                .unwrap();
            let addr = l.local_addr().unwrap();
            let h = link
                .pair
                .srv
                .spawn(move || tcp_serve(l, req, reply))
                .unwrap();
            let (p50, p99) = link
                .pair
                .cli
                .run(move || tcp_latency(addr, req, reply))
                .unwrap();
            h.join().unwrap();
            eprintln!("run {run}: {name}: {p50:.1} {p99:.1}");
            add(&mut rows, name, p50, p99);
        }
        let l = link
            .pair
            .srv
            .run(move || TcpListener::bind((srv_ip, 0)).unwrap())
            .unwrap();
        let addr = l.local_addr().unwrap();
        let h = link.pair.srv.spawn(move || tcp_sink(l)).unwrap();
        let mb = link.pair.cli.run(move || tcp_bulk(addr)).unwrap();
        h.join().unwrap();
        eprintln!("run {run}: tcp bulk 128 KiB writes (MB/s): {mb:.1}");
        add(&mut rows, "tcp bulk 128 KiB writes (MB/s)", mb, 0.0);
    }
    println!("medians of {RUNS} runs ({ITERS} iterations per latency figure):");
    let med: Vec<(String, f64, f64)> = rows
        .iter()
        .map(|(n, a, b)| (n.clone(), median(a.clone()), median(b.clone())))
        .collect();
    for (n, a, b) in &med {
        println!("{n:45} {a:9.1} {b:9.1}");
    }
    let get = |n: &str| {
        med.iter()
            .find(|r| r.0 == n)
            .map(|r| r.1)
            .unwrap_or(f64::NAN)
    };
    println!("ratios l2/tcp (p50; bulk MB/s):");
    for (l2, tcp) in [
        (
            "l2 read 4k qd1 busy (p50/p99 us)",
            "tcp read 4k qd1 (p50/p99 us)",
        ),
        (
            "l2 read 4k qd1 wait (p50/p99 us)",
            "tcp read 4k qd1 (p50/p99 us)",
        ),
        (
            "l2 write 1k qd1 busy (p50/p99 us)",
            "tcp write 1k qd1 (p50/p99 us)",
        ),
        (
            "l2 write 1k qd1 wait (p50/p99 us)",
            "tcp write 1k qd1 (p50/p99 us)",
        ),
        (
            "l2 write 4k qd1 busy (p50/p99 us)",
            "tcp write 4k qd1 (p50/p99 us)",
        ),
        (
            "l2 write 4k qd1 wait (p50/p99 us)",
            "tcp write 4k qd1 (p50/p99 us)",
        ),
        (
            "l2 bulk 32-block extents (MB/s)",
            "tcp bulk 128 KiB writes (MB/s)",
        ),
    ] {
        println!("{l2:45} {:6.2}", get(l2) / get(tcp));
    }
}
