//! Round-trip micro-benchmark (root): a 256-byte request answered by a 4 KiB block (three
//! frames, last segment first, landing contiguous in the client's region) across a veth
//! pair between two namespaces, with busy polling and with poll(), against a TCP
//! ping-pong (TCP_NODELAY, 256 B -> 4096 B) on the same link in the same run.
//!
//! `cargo run --release -p zcfs-xsk --example pingpong [ITERATIONS]`

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zcfs_netns::{owned_name, Pair, CLI_IF, SRV_IF};
use zcfs_xsk::{
    mac_address, Desc, FrameIo, Region, XdpProgram, XskConfig, XskSocket, ETHERTYPE_COMMAND,
    ETHERTYPE_DATA, XDP_PACKET_HEADROOM,
};

/// Round trips measured per mode (after WARMUP unmeasured ones), unless given.
const ITERATIONS: usize = 20_000;
const WARMUP: usize = 1_000;
const REQUEST: usize = 256;
const BLOCK: usize = 4096;
const SEG: [usize; 3] = [1496, 1496, 1104];
const HDR: usize = 16;
/// Where the reply block lands in the client's region.
const BLOCK_AT: u64 = 8192;
/// A frame's wait bound: a lost frame ends the run with an error, not a hang.
const FRAME_LIMIT: Duration = Duration::from_secs(5);
/// The request field that ends the server.
const STOP: u16 = 0xFFFF;
const REGION: usize = 1 << 20;

fn header(dst: [u8; 6], src: [u8; 6], ethertype: u16, field: u16) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[..6].copy_from_slice(&dst);
    h[6..12].copy_from_slice(&src);
    h[12..14].copy_from_slice(&ethertype.to_be_bytes());
    h[14..].copy_from_slice(&field.to_be_bytes());
    h
}

/// Receive exactly `n` frames, spinning or polling.
fn recv(s: &mut XskSocket, n: usize, busy: bool, out: &mut Vec<Desc>) -> Result<(), String> {
    out.clear();
    let t = Instant::now();
    while out.len() < n {
        let want = n - out.len();
        if s.recv(out, want) == 0 {
            if t.elapsed() > FRAME_LIMIT {
                return Err(format!("{} of {n} frames after {FRAME_LIMIT:?}", out.len()));
            }
            if !busy {
                s.wait(Duration::from_millis(100))
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(())
}

/// Serve requests until STOP: each answered with the block as three frames, last first.
fn serve(
    mut s: XskSocket,
    dst: [u8; 6],
    src: [u8; 6],
    busy: bool,
    ready: std::sync::mpsc::Sender<()>,
) -> Result<(), String> {
    let region = s.region() as *const Region;
    // SAFETY: the region lives in `s`'s Arc for as long as `s`; `r` is only used below.
    let r = unsafe { &*region };
    // Request buffers: 64 fill entries at 4 KiB steps; replies built at 512 KiB on.
    let fills: Vec<u64> = (0..64).map(|i| i * 4096).collect();
    s.fill(&fills);
    // A request sent before the fill entries are posted would be dropped.
    ready.send(()).map_err(|e| e.to_string())?;
    let block: Vec<u8> = (0..BLOCK).map(|i| (i * 7 + 3) as u8).collect();
    let tx_base = 512 * 1024u64;
    let mut descs = Vec::new();
    let mut comps = Vec::new();
    loop {
        recv(&mut s, 1, busy, &mut descs).or_else(|e| {
            // An idle server between modes is not an error; keep waiting.
            if e.starts_with("0 of") {
                Ok(())
            } else {
                Err(e)
            }
        })?;
        let Some(d) = descs.first().copied() else {
            continue;
        };
        let mut h = [0u8; HDR];
        r.read(d.addr, &mut h).map_err(|e| e.to_string())?;
        s.fill(&[d.addr - XDP_PACKET_HEADROOM]);
        let field = u16::from_be_bytes([h[14], h[15]]);
        if field == STOP {
            return Ok(());
        }
        let mut frames = [Desc { addr: 0, len: 0 }; 3];
        for (k, seg) in (0..3).rev().enumerate() {
            let addr = tx_base + k as u64 * 2048;
            let off: usize = SEG[..seg].iter().sum();
            r.write(addr, &header(dst, src, ETHERTYPE_DATA, field))
                .map_err(|e| e.to_string())?;
            r.write(addr + HDR as u64, &block[off..off + SEG[seg]])
                .map_err(|e| e.to_string())?;
            frames[k] = Desc {
                addr,
                len: (HDR + SEG[seg]) as u32,
            };
        }
        // The previous reply's buffers are complete before they are rewritten: copy mode
        // completes in the send call; wait for the completions to be sure.
        let mut queued = 0;
        while queued < 3 {
            queued += s.transmit(&frames[queued..]);
        }
        comps.clear();
        let t = Instant::now();
        while comps.len() < 3 && t.elapsed() < FRAME_LIMIT {
            let want = 3 - comps.len();
            s.completions(&mut comps, want);
        }
    }
}

fn fills_for(b: u64) -> [u64; 3] {
    let r = HDR as u64 + XDP_PACKET_HEADROOM;
    [2992 + b - r, 1496 + b - r, b - r]
}

/// One client run: `n` round trips; returns the round-trip times.
fn client(
    s: &mut XskSocket,
    dst: [u8; 6],
    src: [u8; 6],
    busy: bool,
    n: usize,
) -> Result<Vec<Duration>, String> {
    let region = s.region_arc().clone();
    let mut times = Vec::with_capacity(n);
    let mut descs = Vec::new();
    let mut comps = Vec::new();
    let mut first = [0u8; 8];
    for i in 0..WARMUP + n {
        let field = (i % 0x7FFF) as u16;
        let mut req = vec![0u8; REQUEST];
        req[..HDR].copy_from_slice(&header(dst, src, ETHERTYPE_COMMAND, field));
        region.write(0, &req).map_err(|e| e.to_string())?;
        let t = Instant::now();
        s.fill(&fills_for(BLOCK_AT));
        while s.transmit(&[Desc {
            addr: 0,
            len: REQUEST as u32,
        }]) == 0
        {}
        recv(s, 3, busy, &mut descs)
            .map_err(|e| format!("round trip {i}: {e}; client {:?}", s.statistics()))?;
        let rtt = t.elapsed();
        if descs.last().map(|d| d.addr) != Some(BLOCK_AT - HDR as u64) {
            return Err(format!("reply landed at {descs:?}"));
        }
        region
            .read(BLOCK_AT, &mut first)
            .map_err(|e| e.to_string())?;
        if first != [3, 10, 17, 24, 31, 38, 45, 52] {
            return Err(format!("reply block starts {first:?}"));
        }
        comps.clear();
        while comps.is_empty() {
            s.completions(&mut comps, 1);
        }
        if i >= WARMUP {
            times.push(rtt);
        }
    }
    Ok(times)
}

fn report(name: &str, mut t: Vec<Duration>) {
    t.sort();
    let pct = |p: f64| t[((t.len() as f64 * p) as usize).min(t.len() - 1)].as_secs_f64() * 1e6;
    let mean = t.iter().sum::<Duration>().as_secs_f64() * 1e6 / t.len() as f64;
    println!(
        "{name:<22} n={:<6} p50={:>7.1} us  p99={:>7.1} us  mean={:>7.1} us  min={:>6.1} us",
        t.len(),
        pct(0.50),
        pct(0.99),
        mean,
        t[0].as_secs_f64() * 1e6
    );
}

fn tcp(pair: &Pair, n: usize) -> Vec<Duration> {
    let addr = std::net::SocketAddr::from((pair.srv_ip, 7911));
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let server = pair
        .srv
        .spawn(move || {
            let l = std::net::TcpListener::bind(addr).unwrap();
            ready_tx.send(()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            c.set_nodelay(true).unwrap();
            let (mut req, reply) = ([0u8; REQUEST], [7u8; BLOCK]);
            while c.read_exact(&mut req).is_ok() {
                c.write_all(&reply).unwrap();
            }
        })
        .unwrap();
    ready.recv().unwrap();
    let times = pair
        .cli
        .run(|| {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.set_nodelay(true).unwrap();
            let (req, mut reply) = ([1u8; REQUEST], [0u8; BLOCK]);
            let mut times = Vec::with_capacity(n);
            for i in 0..WARMUP + n {
                let t = Instant::now();
                c.write_all(&req).unwrap();
                c.read_exact(&mut reply).unwrap();
                if i >= WARMUP {
                    times.push(t.elapsed());
                }
            }
            times
        })
        .unwrap();
    server.join().unwrap();
    times
}

fn main() -> Result<(), String> {
    let n: usize = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|e| format!("ITERATIONS {a:?}: {e}"))?,
        None => ITERATIONS,
    };
    let pair = Pair::create_with_queues(&owned_name(std::process::id(), "pingpong"), 79, 1)
        .map_err(|e| format!("creating the veth pair (root needed): {e}"))?;
    println!("{n} round trips per mode, 256 B request -> 4 KiB reply, veth between namespaces");
    for busy in [true, false] {
        let config = XskConfig {
            busy_poll: busy,
            ..XskConfig::default()
        };
        let side = |ns: &zcfs_netns::Netns, ifname: &'static str| {
            ns.run(move || -> Result<_, String> {
                let mut prog = XdpProgram::attach(ifname).map_err(|e| e.to_string())?;
                let region = Arc::new(Region::anonymous(REGION).map_err(|e| e.to_string())?);
                let s = XskSocket::new(region, ifname, 0, config).map_err(|e| e.to_string())?;
                prog.register(0, &s).map_err(|e| e.to_string())?;
                Ok((prog, s, mac_address(ifname).map_err(|e| e.to_string())?))
            })
            .map_err(|e| e.to_string())?
        };
        let (srv_prog, srv, srv_mac) = side(&pair.srv, SRV_IF)?;
        let (cli_prog, mut cli, cli_mac) = side(&pair.cli, CLI_IF)?;
        if busy {
            println!(
                "XDP attach mode {:?}, bind mode {:?}",
                srv_prog.mode(),
                srv.mode()
            );
        }
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || serve(srv, cli_mac, srv_mac, busy, ready_tx));
        ready
            .recv()
            .map_err(|_| "the server ended before it was ready")?;
        let times = client(&mut cli, srv_mac, cli_mac, busy, n);
        let req = header(srv_mac, cli_mac, ETHERTYPE_COMMAND, STOP);
        cli.region().write(0, &req).map_err(|e| e.to_string())?;
        cli.transmit(&[Desc {
            addr: 0,
            len: REQUEST as u32,
        }]);
        server.join().map_err(|_| "server panicked")??;
        report(
            if busy {
                "af_xdp busy-poll"
            } else {
                "af_xdp poll()"
            },
            times?,
        );
        drop((srv_prog, cli_prog));
    }
    report("tcp (nodelay)", tcp(&pair, n));
    Ok(())
}
