//! zcfs-bench: measures zcfs and the limits of the machine side by side, in one run.
//!
//! `zcfs-bench remote`: two network namespaces joined by a veth pair; the raw TCP limit
//! on that link (round trips of each size, pipelined throughput) measured with the same
//! request shapes zcfs uses; then the zcfs client library against `zcfs serve` (QD1
//! latency and QD16 throughput, 1 KiB..16 MiB, sequential and random, read and write),
//! and zero-copy against one-copy writes. Every loop is bounded in count and time.

mod local;
mod netns;

use anyhow::{bail, Context, Result};
use clap::Parser;
use netns::Net;
use serde::Serialize;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zcfs_backend::{Backend, Ctx, ROOT};
use zcfs_client::{ClientConfig, RemoteFs};
use zcfs_protocol::{Cred, NodeRef, ReadReq, Request, WriteReq};

#[derive(Parser)]
#[command(
    name = "zcfs-bench",
    about = "zcfs benchmarks beside the machine's limits, in one run"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Client library across a veth pair vs raw TCP on the same link; zero- vs one-copy.
    Remote(RemoteArgs),
    /// Library API on a local volume; consistency and page-attach ablations.
    Local {
        #[arg(long)]
        short: bool,
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
        #[arg(long)]
        seconds: Option<f64>,
        #[arg(long)]
        repeat: Option<usize>,
    },
}

#[derive(clap::Args, Clone)]
struct RemoteArgs {
    /// About a minute: 4 KiB and 1 MiB only, short runs.
    #[arg(long)]
    short: bool,
    /// Shape the link with tc tbf, e.g. 1gbit (the RZCFS evaluation's link).
    #[arg(long)]
    tbf: Option<String>,
    /// Where to write results.json and results.md.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    /// The zcfs binary (default: next to this one).
    #[arg(long)]
    zcfs: Option<PathBuf>,
    /// Seconds per measurement (bounded further by an operation count).
    #[arg(long)]
    seconds: Option<f64>,
    /// Runs of each measurement; the median run is reported (default 3, short mode 1).
    #[arg(long)]
    repeat: Option<usize>,
}

/// Run a measurement `n` times and keep the median run: by p50 latency at QD1, by
/// throughput when pipelined. The shared machine is noisy; one run is not a figure.
fn median_of(n: usize, mut f: impl FnMut() -> Result<Row>) -> Result<Row> {
    let mut runs = (0..n.max(1)).map(|_| f()).collect::<Result<Vec<Row>>>()?;
    runs.sort_by(|a, b| {
        let key = |r: &Row| if r.qd == 1 { r.p50_us } else { -r.mb_s };
        key(a).total_cmp(&key(b))
    });
    Ok(runs.swap_remove(runs.len() / 2))
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    system: String,
    op: String,
    pattern: String,
    size: usize,
    qd: usize,
    ops: u64,
    mean_us: f64,
    p50_us: f64,
    p99_us: f64,
    mb_s: f64,
    /// CPU time per operation, client and server together (user + system).
    cpu_us_per_op: f64,
}

/// The server process being measured (0 = none: its CPU is in this process).
pub(crate) static SERVER_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// CPU time (user + system) of this process plus the server process, if any.
pub(crate) fn cpu_now() -> Duration {
    // SAFETY: rusage is plain data filled by getrusage.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    let mut d = tv(r.ru_utime) + tv(r.ru_stime);
    let pid = SERVER_PID.load(std::sync::atomic::Ordering::Relaxed);
    if pid != 0 {
        if let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // Fields after the command name: utime and stime are the 12th and 13th.
            let f: Vec<&str> = st
                .rsplit_once(')')
                .map_or("", |(_, r)| r)
                .split_whitespace()
                .collect();
            let ticks: u64 = f.get(11).and_then(|x| x.parse().ok()).unwrap_or(0)
                + f.get(12).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            // SAFETY: sysconf has no preconditions.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
            d += Duration::from_nanos(ticks * 1_000_000_000 / hz);
        }
    }
    d
}

/// Set the CPU-per-operation figure of a row measured since `cpu0`.
pub(crate) fn with_cpu(mut r: Row, cpu0: Duration) -> Row {
    let cpu = cpu_now().saturating_sub(cpu0);
    r.cpu_us_per_op = if r.ops == 0 {
        0.0
    } else {
        cpu.as_secs_f64() * 1e6 / r.ops as f64
    };
    r
}

#[allow(clippy::too_many_arguments)]
fn row(
    system: &str,
    op: &str,
    pattern: &str,
    size: usize,
    qd: usize,
    lat_ns: &mut [u64],
    elapsed: Duration,
    ops: u64,
) -> Row {
    lat_ns.sort_unstable();
    let pct = |p: f64| {
        if lat_ns.is_empty() {
            0.0
        } else {
            lat_ns[((lat_ns.len() - 1) as f64 * p) as usize] as f64 / 1e3
        }
    };
    Row {
        system: system.into(),
        op: op.into(),
        pattern: pattern.into(),
        size,
        qd,
        ops,
        mean_us: if lat_ns.is_empty() {
            0.0
        } else {
            lat_ns.iter().sum::<u64>() as f64 / lat_ns.len() as f64 / 1e3
        },
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        mb_s: ops as f64 * size as f64 / elapsed.as_secs_f64() / 1e6,
        cpu_us_per_op: 0.0,
    }
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Remote(a) => remote(a),
        Cmd::Local {
            short,
            out,
            seconds,
            repeat,
        } => {
            let secs = seconds.unwrap_or(if short { 0.3 } else { 1.0 });
            let rows = local::run(short, secs, repeat.unwrap_or(if short { 1 } else { 3 }))?;
            std::fs::create_dir_all(&out)?;
            std::fs::write(
                out.join("local.json"),
                serde_json::to_string_pretty(
                    &serde_json::json!({ "seconds_per_measurement": secs, "rows": rows }),
                )?,
            )?;
            let md = local::summary(&rows);
            std::fs::write(out.join("local.md"), &md)?;
            println!("{md}");
            Ok(())
        }
    }
}

/// Operations per measurement, so slow cases stay bounded too.
fn max_ops(size: usize) -> u64 {
    ((256 << 20) / size as u64).clamp(16, 20_000)
}

fn sizes(short: bool) -> Vec<usize> {
    if short {
        vec![4 << 10, 1 << 20]
    } else {
        vec![1 << 10, 4 << 10, 64 << 10, 1 << 20, 16 << 20]
    }
}

// ---------------------------------------------------------------- raw TCP baseline

/// Raw server: 16-byte requests (kind, n). kind 1: reply n bytes; kind 2: receive n
/// bytes, reply 8.
fn raw_server(l: TcpListener) {
    static DATA: [u8; 1 << 20] = [0x5a; 1 << 20];
    for s in l.incoming() {
        let Ok(mut s) = s else { return };
        let _ = s.set_nodelay(true);
        std::thread::spawn(move || {
            let mut sink = vec![0u8; 1 << 20];
            loop {
                let mut req = [0u8; 16];
                if s.read_exact(&mut req).is_err() {
                    return;
                }
                let kind = u64::from_le_bytes(req[..8].try_into().unwrap());
                let mut n = u64::from_le_bytes(req[8..].try_into().unwrap()) as usize;
                let r = match kind {
                    1 => (|| {
                        while n > 0 {
                            let k = n.min(DATA.len());
                            s.write_all(&DATA[..k])?;
                            n -= k;
                        }
                        Ok::<_, std::io::Error>(())
                    })(),
                    2 => (|| {
                        while n > 0 {
                            let k = n.min(sink.len());
                            s.read_exact(&mut sink[..k])?;
                            n -= k;
                        }
                        s.write_all(&[0u8; 8])
                    })(),
                    // Streams, for the bandwidth limit: send until the peer closes,
                    // or receive until it does.
                    3 => loop {
                        if s.write_all(&DATA).is_err() {
                            return;
                        }
                    },
                    4 => loop {
                        match s.read(&mut sink) {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                    },
                    _ => return,
                };
                if r.is_err() {
                    return;
                }
            }
        });
    }
}

/// One request: header and payload in one writev, as zcfs sends them.
fn raw_request(s: &mut TcpStream, kind: u64, n: usize, payload: &[u8]) -> std::io::Result<()> {
    let mut req = [0u8; 16];
    req[..8].copy_from_slice(&kind.to_le_bytes());
    req[8..].copy_from_slice(&(n as u64).to_le_bytes());
    let mut iov = vec![std::io::IoSlice::new(&req)];
    if kind == 2 {
        let mut left = n;
        while left > 0 {
            let k = left.min(payload.len());
            iov.push(std::io::IoSlice::new(&payload[..k]));
            left -= k;
        }
    }
    let mut bufs = &mut iov[..];
    while !bufs.is_empty() {
        let w = s.write_vectored(bufs)?;
        std::io::IoSlice::advance_slices(&mut bufs, w);
    }
    Ok(())
}

fn raw_reply(s: &mut TcpStream, kind: u64, n: usize, buf: &mut [u8]) -> std::io::Result<()> {
    let mut left = if kind == 1 { n } else { 8 };
    while left > 0 {
        let k = left.min(buf.len());
        s.read_exact(&mut buf[..k])?;
        left -= k;
    }
    Ok(())
}

fn raw_bench(addr: &str, size: usize, write: bool, qd: usize, secs: f64) -> Result<Row> {
    let cpu0 = cpu_now();
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let kind = if write { 2 } else { 1 };
    let payload = vec![0xa5u8; size.min(1 << 20)];
    let mut buf = vec![0u8; size.min(1 << 20)];
    let limit = max_ops(size);
    let deadline = Duration::from_secs_f64(secs);
    // Warm the connection up (window growth) as zcfs's was by preparing its file.
    let warm = Instant::now();
    let mut moved = 0usize;
    while moved < 64 << 20 && warm.elapsed() < Duration::from_millis(300) {
        raw_request(&mut s, kind, size, &payload)?;
        raw_reply(&mut s, kind, size, &mut buf)?;
        moved += size;
    }
    let mut lat = Vec::new();
    let t = Instant::now();
    let mut done = 0u64;
    if qd == 1 {
        while done < limit && t.elapsed() < deadline {
            let t0 = Instant::now();
            raw_request(&mut s, kind, size, &payload)?;
            raw_reply(&mut s, kind, size, &mut buf)?;
            lat.push(t0.elapsed().as_nanos() as u64);
            done += 1;
        }
    } else {
        // A writer thread keeps `qd` requests ahead of the replies; send times come
        // back in order, for the latency of each.
        let mut w = s.try_clone()?;
        let (tx, rx) = std::sync::mpsc::sync_channel::<()>(qd);
        let (ttx, trx) = std::sync::mpsc::channel::<Instant>();
        let sent = std::thread::spawn(move || -> std::io::Result<u64> {
            let mut n = 0;
            while rx.recv().is_ok() {
                ttx.send(Instant::now()).ok();
                raw_request(&mut w, kind, size, &payload)?;
                n += 1;
            }
            Ok(n)
        });
        for _ in 0..qd {
            tx.send(()).ok();
        }
        while done < limit * 4 && t.elapsed() < deadline {
            raw_reply(&mut s, kind, size, &mut buf)?;
            if let Ok(t0) = trx.recv() {
                lat.push(t0.elapsed().as_nanos() as u64);
            }
            done += 1;
            tx.send(()).ok();
        }
        drop(tx);
        let issued = sent
            .join()
            .map_err(|_| anyhow::anyhow!("raw writer panicked"))??;
        for _ in done..issued {
            raw_reply(&mut s, kind, size, &mut buf)?;
        }
    }
    let el = t.elapsed();
    Ok(with_cpu(
        row(
            "raw-tcp",
            if write { "write" } else { "read" },
            "-",
            size,
            qd,
            &mut lat,
            el,
            done,
        ),
        cpu0,
    ))
}

/// One-way TCP streaming bandwidth on the link (what iperf3 measures): the ceiling
/// for bulk transfers.
fn raw_stream(addr: &str, write: bool, secs: f64) -> Result<Row> {
    let mut s = TcpStream::connect(addr)?;
    let mut req = [0u8; 16];
    req[..8].copy_from_slice(&(if write { 4u64 } else { 3 }).to_le_bytes());
    s.write_all(&req)?;
    let mut buf = vec![0x77u8; 1 << 20];
    let warm = Duration::from_millis(300);
    let t = Instant::now();
    let mut bytes = 0u64;
    let mut t0 = None;
    while t.elapsed() < warm + Duration::from_secs_f64(secs) {
        let n = if write {
            s.write(&buf)?
        } else {
            s.read(&mut buf)?
        };
        if t.elapsed() >= warm {
            t0.get_or_insert_with(Instant::now);
            bytes += n as u64;
        }
    }
    let el = t0.map_or(Duration::from_millis(1), |t0| t0.elapsed());
    let mut r = row(
        "raw-tcp-stream",
        if write { "write" } else { "read" },
        "-",
        1 << 20,
        0,
        &mut [],
        el,
        0,
    );
    r.mb_s = bytes as f64 / el.as_secs_f64() / 1e6;
    Ok(r)
}

// ---------------------------------------------------------------- zcfs

struct ServerProc {
    child: Child,
    image: PathBuf,
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.image);
    }
}

fn start_server(
    zcfs: &Path,
    net: &Net,
    port: u16,
    one_copy: bool,
    tag: &str,
) -> Result<ServerProc> {
    let image = PathBuf::from(format!(
        "/dev/shm/zcfs-bench-{tag}-{}.img",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&image);
    let st = Command::new(zcfs)
        .arg("mkfs")
        .arg(&image)
        .args(["--size", "4G"])
        .stdout(Stdio::null())
        .status()?;
    if !st.success() {
        bail!("zcfs mkfs failed");
    }
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &net.srv])
        .arg(zcfs)
        .arg("serve")
        .arg(&image);
    cmd.args(["--listen", &format!("{}:{port}", net.srv_ip), "--insecure"]);
    if one_copy {
        cmd.arg("--one-copy");
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line)?;
    if !line.starts_with("serving") {
        bail!("zcfs serve did not start: {line}");
    }
    Ok(ServerProc { child, image })
}

fn file_size(short: bool) -> u64 {
    if short {
        256 << 20
    } else {
        1 << 30
    }
}

/// Create the test file and fill it (so reads hit data, not holes).
fn prepare(fs: &RemoteFs, short: bool) -> Result<u64> {
    let (a, fh) = fs
        .create(
            &Ctx::default(),
            ROOT,
            b"bench",
            libc::S_IFREG | 0o644,
            libc::O_RDWR,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let chunk = vec![0x3cu8; 8 << 20];
    let mut off = 0;
    while off < file_size(short) {
        fs.write(a.ino, fh, off, &chunk)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        off += chunk.len() as u64;
    }
    Ok(a.ino)
}

fn offsets(size: usize, random: bool, short: bool) -> impl FnMut() -> u64 {
    let slots = (file_size(short) / size as u64).max(1);
    let mut i = 0u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    move || {
        let slot = if random {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % slots
        } else {
            i += 1;
            (i - 1) % slots
        };
        slot * size as u64
    }
}

#[allow(clippy::too_many_arguments)]
fn zcfs_bench(
    fs: &RemoteFs,
    ino: u64,
    system: &str,
    size: usize,
    write: bool,
    random: bool,
    qd: usize,
    secs: f64,
    short: bool,
) -> Result<Row> {
    let cpu0 = cpu_now();
    let client = fs.client();
    let data = vec![0x6bu8; size];
    let mut next = offsets(size, random, short);
    let limit = max_ops(size);
    let deadline = Duration::from_secs_f64(secs);
    let node = NodeRef::ino(ino);
    let req = |offset: u64| -> Request {
        if write {
            WriteReq {
                node,
                fh: 0,
                offset,
                size: size as u32,
            }
            .into()
        } else {
            ReadReq {
                node,
                fh: 0,
                offset,
                size: size as u32,
            }
            .into()
        }
    };
    let payload: Vec<&[u8]> = if write { vec![&data] } else { vec![] };
    let mut lat = Vec::new();
    let mut done = 0u64;
    let t = Instant::now();
    let mut q: VecDeque<(Instant, zcfs_client::Ticket)> = VecDeque::new();
    while done < limit * if qd > 1 { 4 } else { 1 } && t.elapsed() < deadline {
        while q.len() < qd {
            // Timed from before the request leaves (submit returns once it is sent).
            let t0 = Instant::now();
            let tk = client
                .submit(&req(next()), Cred::default(), &payload)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            q.push_back((t0, tk));
        }
        let (t0, tk) = q.pop_front().unwrap();
        let r = tk.wait().map_err(|e| anyhow::anyhow!("{e}"))?;
        if !write && r.data.len() != size {
            bail!("short read: {} of {size}", r.data.len());
        }
        lat.push(t0.elapsed().as_nanos() as u64);
        done += 1;
    }
    for (_, tk) in q {
        tk.wait().map_err(|e| anyhow::anyhow!("{e}"))?;
        done += 1;
    }
    let el = t.elapsed();
    Ok(with_cpu(
        row(
            system,
            if write { "write" } else { "read" },
            if random { "rand" } else { "seq" },
            size,
            qd,
            &mut lat,
            el,
            done,
        ),
        cpu0,
    ))
}

fn remote(a: RemoteArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("zcfs-bench remote needs root (it creates network namespaces)");
    }
    let zcfs = match &a.zcfs {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("zcfs"),
    };
    if !zcfs.exists() {
        bail!(
            "{} not found: build it with `cargo build --release` or pass --zcfs",
            zcfs.display()
        );
    }
    let secs = a.seconds.unwrap_or(if a.short { 0.5 } else { 1.5 });
    let repeat = a.repeat.unwrap_or(if a.short { 1 } else { 3 });
    let net = Net::new(&format!("{}", std::process::id() % 10000), 200)?;
    if let Some(rate) = &a.tbf {
        net.shape(rate)?;
    }
    let link = a.tbf.clone().unwrap_or_else(|| "veth (unshaped)".into());
    eprintln!("link: {link}; {secs} s per measurement, median of {repeat} runs");

    // Raw TCP server in the server namespace.
    let raw_addr = format!("{}:7100", net.srv_ip);
    let (tx, rx) = std::sync::mpsc::channel();
    let ra = raw_addr.clone();
    Net::spawn_in(&net.srv, move || match TcpListener::bind(&ra) {
        Ok(l) => {
            tx.send(Ok(())).ok();
            raw_server(l)
        }
        Err(e) => {
            tx.send(Err(e)).ok();
        }
    })?;
    rx.recv()?.context("raw TCP server")?;

    let zc = start_server(&zcfs, &net, 7070, false, "zc")?;
    let oc = start_server(&zcfs, &net, 7071, true, "oc")?;
    // `ip netns exec` executes zcfs in place: the children are the server processes.
    let (zc_pid, oc_pid) = (zc.child.id(), oc.child.id());
    let short = a.short;
    let sizes = sizes(short);
    let cli_ns = net.cli.clone();
    let (zc_addr, oc_addr) = (
        format!("{}:7070", net.srv_ip),
        format!("{}:7071", net.srv_ip),
    );
    let copies = std::sync::Arc::new(std::sync::Mutex::new(serde_json::Value::Null));
    let copies_w = copies.clone();
    let rows = Net::within(&cli_ns, move || -> Result<Vec<Row>> {
        let mut rows = Vec::new();
        for &size in &sizes {
            for write in [false, true] {
                for qd in [1, 16] {
                    let r = median_of(repeat, || raw_bench(&raw_addr, size, write, qd, secs))?;
                    eprintln!(
                        "raw-tcp {} {:>8} B qd{qd:<2}: p50 {:>9.1} us, {:>8.1} MB/s",
                        r.op, size, r.p50_us, r.mb_s
                    );
                    rows.push(r);
                }
            }
        }
        for write in [false, true] {
            let r = median_of(repeat, || raw_stream(&raw_addr, write, secs))?;
            eprintln!("raw-tcp stream {}: {:>8.1} MB/s", r.op, r.mb_s);
            rows.push(r);
        }
        let connect = |addr: &str| {
            let mut c = ClientConfig::new(addr);
            c.connections = 1;
            c.timeout = Duration::from_secs(30);
            RemoteFs::connect(c).map_err(|e| anyhow::anyhow!("{addr}: {e}"))
        };
        SERVER_PID.store(zc_pid, std::sync::atomic::Ordering::Relaxed);
        let fs = connect(&zc_addr)?;
        let ino = prepare(&fs, short)?;
        for &size in &sizes {
            for write in [false, true] {
                for random in [false, true] {
                    for qd in [1, 16] {
                        let r = median_of(repeat, || {
                            zcfs_bench(&fs, ino, "zcfs", size, write, random, qd, secs, short)
                        })?;
                        eprintln!(
                            "zcfs {} {} {:>8} B qd{qd:<2}: p50 {:>9.1} us, {:>8.1} MB/s",
                            r.op, r.pattern, size, r.p50_us, r.mb_s
                        );
                        rows.push(r);
                    }
                }
            }
        }
        let zstats: serde_json::Value =
            serde_json::from_slice(&fs.server_stats().map_err(|e| anyhow::anyhow!("{e}"))?)?;
        eprintln!(
            "zcfs server: {} user-space copies per payload byte",
            zstats["user_copies_per_payload_byte"]
        );
        SERVER_PID.store(oc_pid, std::sync::atomic::Ordering::Relaxed);
        let ofs = connect(&oc_addr)?;
        let oino = prepare(&ofs, short)?;
        for &size in &sizes {
            for qd in [1, 16] {
                let r = median_of(repeat, || {
                    zcfs_bench(
                        &ofs,
                        oino,
                        "zcfs-one-copy",
                        size,
                        true,
                        false,
                        qd,
                        secs,
                        short,
                    )
                })?;
                eprintln!(
                    "zcfs-one-copy write {:>8} B qd{qd:<2}: p50 {:>9.1} us, {:>8.1} MB/s",
                    size, r.p50_us, r.mb_s
                );
                rows.push(r);
            }
        }
        let ostats: serde_json::Value =
            serde_json::from_slice(&ofs.server_stats().map_err(|e| anyhow::anyhow!("{e}"))?)?;
        eprintln!(
            "one-copy server: {} user-space copies per payload byte",
            ostats["user_copies_per_payload_byte"]
        );
        *copies_w.lock().unwrap() = serde_json::json!({
            "zero_copy_server": zstats["user_copies_per_payload_byte"],
            "one_copy_server": ostats["user_copies_per_payload_byte"],
        });
        Ok(rows)
    })??;
    drop((zc, oc));
    std::fs::create_dir_all(&a.out)?;
    let copies = copies.lock().unwrap().clone();
    let json = serde_json::json!({
        "link": link, "seconds_per_measurement": secs, "repeat": repeat,
        "user_copies_per_payload_byte": copies, "rows": rows
    });
    std::fs::write(
        a.out.join("remote.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    let md = summary(&rows, &link);
    std::fs::write(a.out.join("remote.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// The headline table: zcfs beside raw TCP on the same link.
fn summary(rows: &[Row], link: &str) -> String {
    let find = |sys: &str, op: &str, pat: &str, size: usize, qd: usize| {
        rows.iter().find(|r| {
            r.system == sys
                && r.op == op
                && (r.pattern == pat || pat == "-")
                && r.size == size
                && r.qd == qd
        })
    };
    let mut out = format!("### zcfs client library vs raw TCP, {link}\n\n");
    for op in ["read", "write"] {
        if let (Some(st), Some(z)) = (
            find("raw-tcp-stream", op, "-", 1 << 20, 0),
            find("zcfs", op, "seq", 1 << 20, 16),
        ) {
            out += &format!(
                "- 1 MiB {op}s at QD16: {:.0} MB/s = {:.0} % of the raw TCP streaming bandwidth ({:.0} MB/s)\n",
                z.mb_s,
                100.0 * z.mb_s / st.mb_s,
                st.mb_s
            );
        }
    }
    out += "\n";
    out += "| op | size | QD1 p50 zcfs µs | QD1 p50 raw µs | latency ratio | QD16 zcfs MB/s | QD16 raw MB/s | fraction of raw | one-copy MB/s | zero/one-copy |\n";
    out += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.size).collect();
    sizes.sort();
    sizes.dedup();
    for op in ["read", "write"] {
        for &size in &sizes {
            let (Some(z1), Some(r1), Some(z16), Some(r16)) = (
                find("zcfs", op, "seq", size, 1),
                find("raw-tcp", op, "-", size, 1),
                find("zcfs", op, "seq", size, 16),
                find("raw-tcp", op, "-", size, 16),
            ) else {
                continue;
            };
            let oc = if op == "write" {
                find("zcfs-one-copy", op, "seq", size, 16)
            } else {
                None
            };
            out += &format!(
                "| {op} | {} | {:.1} | {:.1} | {:.2}x | {:.0} | {:.0} | {:.0} % | {} | {} |\n",
                human(size),
                z1.p50_us,
                r1.p50_us,
                z1.p50_us / r1.p50_us,
                z16.mb_s,
                r16.mb_s,
                100.0 * z16.mb_s / r16.mb_s,
                oc.map_or("-".into(), |o| format!("{:.0}", o.mb_s)),
                oc.map_or("-".into(), |o| format!("{:.2}x", z16.mb_s / o.mb_s)),
            );
        }
    }
    out
}

fn human(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{} KiB", n >> 10)
    }
}
