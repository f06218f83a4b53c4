//! `zcfs-bench remote`: two network namespaces joined by a veth pair; the raw TCP limit
//! on that link (round trips of each size, pipelined throughput) measured with the same
//! request shapes zcfs uses; then the zcfs client library against `zcfs serve` (QD1
//! latency and QD16 throughput, 1 KiB..16 MiB, sequential and random, read and write),
//! and zero-copy against one-copy writes. Every loop is bounded in count and time.

use crate::cpu::{cpu_now, with_cpu, SERVER_PID};
use crate::rows::{max_ops, median_of, op_name, pattern_name, row, sizes, Row};
use crate::{raw, report, RemoteArgs};
use anyhow::{bail, Context, Result};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zcfs_backend::{Backend, Ctx, ROOT};
use zcfs_client::{ClientConfig, RemoteFs};
use zcfs_netns::{owned_name, Pair};
use zcfs_protocol::{NodeRef, ReadReq, Request, WriteReq};

pub(crate) struct ServerProc {
    pub(crate) child: Child,
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
    net: &Pair,
    port: u16,
    one_copy: bool,
    tag: &str,
) -> Result<ServerProc> {
    start_server_with(
        zcfs,
        net,
        port,
        if one_copy { &["--one-copy"] } else { &[] },
        tag,
        true,
    )
}

pub(crate) fn start_server_with(
    zcfs: &Path,
    net: &Pair,
    port: u16,
    extra: &[&str],
    tag: &str,
    insecure: bool,
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
    let mut cmd = net.srv.command(zcfs);
    cmd.arg("serve").arg(&image);
    cmd.args([
        "--listen",
        &format!("{}:{port}", net.srv_ip),
        "--no-root-squash",
    ]);
    if insecure {
        cmd.arg("--insecure");
    }
    cmd.args(extra);
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

/// The name of [`prepare`]'s file in the root directory: after the process, so that runs
/// one after another against one server each get their own.
pub(crate) fn bench_file_name() -> String {
    format!("bench.{}", std::process::id())
}

/// Create the test file ([`bench_file_name`]) and fill it (so reads hit data, not holes).
pub(crate) fn prepare(fs: &RemoteFs, short: bool) -> Result<u64> {
    let name = bench_file_name();
    let (a, fh) = fs
        .create(
            &Ctx::default(),
            ROOT,
            name.as_bytes(),
            libc::S_IFREG | 0o644,
            libc::O_RDWR,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let chunk = vec![0x3cu8; 8 << 20];
    let mut off = 0;
    while off < file_size(short) {
        fs.write(&Ctx::default(), a.ino, fh, off, &chunk)
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
pub(crate) fn zcfs_bench(
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
                commit: false,
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
                .submit(&req(next()), zcfs_client::Caller::process(), &payload)
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
    let (op, pattern) = (op_name(write), pattern_name(random));
    let r = row(system, op, pattern, size, qd, &mut lat, el, done);
    Ok(with_cpu(r, cpu0))
}

/// The secret of the channel benchmark's servers (a file of mode 0600).
const BENCH_SECRET: &[u8] = b"zcfs-bench-channel-secret-0123456789";

/// `--channel`: the cost of the message MACs and of `--integrity full` beside no MAC,
/// 4 KiB and 1 MiB, sequential read and write at QD1 and QD16, in rounds: each round
/// measures every configuration once, in turn, so drift on the shared machine hits
/// them alike; the median of the rounds is reported with its ratio to no MAC.
fn channel_cost(a: &RemoteArgs, zcfs: &Path, net: &Pair, secs: f64) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let rounds = a.repeat.unwrap_or(5).max(1);
    let secret = PathBuf::from(format!("/dev/shm/zcfs-bench-secret-{}", std::process::id()));
    std::fs::write(&secret, BENCH_SECRET)?;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600))?;
    let sf = secret.to_string_lossy().into_owned();
    let systems: [(&str, u16, Vec<&str>, bool); 3] = [
        ("no-mac", 7080, vec![], true),
        ("mac", 7081, vec!["--secret-file", &sf], false),
        (
            "mac+full",
            7082,
            vec!["--secret-file", &sf, "--integrity", "full"],
            false,
        ),
    ];
    let mut procs = Vec::new();
    for (tag, port, extra, insecure) in &systems {
        procs.push(start_server_with(zcfs, net, *port, extra, tag, *insecure)?);
    }
    let srv_ip = net.srv_ip;
    let cases: Vec<(usize, bool, usize)> = [4096usize, 1 << 20]
        .iter()
        .flat_map(|&s| [false, true].map(move |w| (s, w)))
        .flat_map(|(s, w)| [1usize, 16].map(move |q| (s, w, q)))
        .collect();
    let rows = net.cli.run(move || -> Result<Vec<Row>> {
        let mut fss = Vec::new();
        for (i, (_, port, _, insecure)) in systems.iter().enumerate() {
            let mut c = ClientConfig::new(&format!("{srv_ip}:{port}"));
            c.connections = 1;
            c.timeout = Duration::from_secs(30);
            if !insecure {
                c.secret = Some(BENCH_SECRET.to_vec());
            }
            if i == 2 {
                c.integrity = zcfs_protocol::channel::Integrity::Full;
            }
            let fs = RemoteFs::connect(c).map_err(|e| anyhow::anyhow!("{port}: {e}"))?;
            let ino = prepare(&fs, true)?;
            fss.push((fs, ino));
        }
        // runs[case][system] = rows of each round.
        let mut runs = vec![vec![Vec::new(); systems.len()]; cases.len()];
        for round in 0..rounds {
            for (ci, &(size, write, qd)) in cases.iter().enumerate() {
                for (si, (fs, ino)) in fss.iter().enumerate() {
                    let r = zcfs_bench(fs, *ino, systems[si].0, size, write, false, qd, secs, true)?;
                    runs[ci][si].push(r);
                }
            }
            eprintln!("round {} of {rounds} done", round + 1);
        }
        let mut rows = Vec::new();
        for (ci, &(size, write, qd)) in cases.iter().enumerate() {
            let med = |v: &mut Vec<Row>| -> Row {
                v.sort_by(|a, b| a.mb_s.total_cmp(&b.mb_s));
                v[v.len() / 2].clone()
            };
            let base = med(&mut runs[ci][0]);
            for si in 0..systems.len() {
                let r = med(&mut runs[ci][si]);
                let p50s: Vec<f64> = {
                    let mut p: Vec<f64> = runs[ci][si].iter().map(|x| x.p50_us).collect();
                    p.sort_by(f64::total_cmp);
                    p
                };
                let p50 = p50s[p50s.len() / 2];
                let bp50 = {
                    let mut p: Vec<f64> = runs[ci][0].iter().map(|x| x.p50_us).collect();
                    p.sort_by(f64::total_cmp);
                    p[p.len() / 2]
                };
                eprintln!(
                    "channel {:<8} {} {:>8} B qd{qd:<2}: {:>8.1} MB/s ({:.3} of no-mac), p50 {:>8.1} us ({:.3} of no-mac), cpu {:>6.1} us/op",
                    systems[si].0,
                    if write { "write" } else { "read " },
                    size,
                    r.mb_s,
                    r.mb_s / base.mb_s,
                    p50,
                    p50 / bp50,
                    r.cpu_us_per_op
                );
                rows.push(Row { p50_us: p50, ..r });
            }
        }
        Ok(rows)
    })??;
    drop(procs);
    let _ = std::fs::remove_file(&secret);
    let json =
        serde_json::json!({ "seconds_per_measurement": secs, "rounds": rounds, "rows": rows });
    report::write(
        &a.out,
        "remote-channel",
        &json,
        &report::remote_summary(&rows, "veth (unshaped)"),
    )
}

/// The zcfs binary: `given`, else the one next to this program.
pub(crate) fn zcfs_path(given: Option<&Path>) -> Result<PathBuf> {
    Ok(match given {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()?.with_file_name("zcfs"),
    })
}

/// [`zcfs_path`], which must exist.
pub(crate) fn zcfs_binary(given: Option<&Path>) -> Result<PathBuf> {
    let zcfs = zcfs_path(given)?;
    if !zcfs.exists() {
        bail!(
            "{} not found: build it with `cargo build --release` or pass --zcfs",
            zcfs.display()
        );
    }
    Ok(zcfs)
}

pub fn run(a: &RemoteArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("zcfs-bench remote needs root (it creates network namespaces)");
    }
    let zcfs = zcfs_binary(a.zcfs.as_deref())?;
    let secs = a.seconds.unwrap_or(if a.short { 0.5 } else { 1.5 });
    let repeat = a.repeat.unwrap_or(if a.short { 1 } else { 3 });
    for t in &a.transport {
        if !crate::lane::TRANSPORTS.contains(&t.as_str()) {
            bail!("--transport {t}: tcp or l2");
        }
    }
    let with_l2 = a.transport.iter().any(|t| t == "l2");
    if with_l2 {
        if let Some(why) = crate::lane::unavailable() {
            bail!("--transport l2: {why}");
        }
        if a.tbf.is_some() || a.channel {
            bail!("--transport l2 goes with neither --tbf (AF_XDP frames bypass tc) nor --channel");
        }
    }
    // Two queues: the lane's commands and data travel on queues of their own.
    let net = Pair::create_with_queues(
        &owned_name(std::process::id(), "bench"),
        200,
        if with_l2 { 2 } else { 1 },
    )?;
    if let Some(rate) = &a.tbf {
        net.shape(rate)?;
    }
    let link = a.tbf.clone().unwrap_or_else(|| "veth (unshaped)".into());
    if a.channel {
        return channel_cost(a, &zcfs, &net, secs);
    }
    eprintln!("link: {link}; {secs} s per measurement, median of {repeat} runs");

    // Raw TCP server in the server namespace.
    let raw_addr = format!("{}:7100", net.srv_ip);
    let (tx, rx) = std::sync::mpsc::channel();
    let ra = raw_addr.clone();
    net.srv.spawn(move || match TcpListener::bind(&ra) {
        Ok(l) => {
            tx.send(Ok(())).ok();
            raw::server(l)
        }
        Err(e) => {
            tx.send(Err(e)).ok();
        }
    })?;
    rx.recv()?.context("raw TCP server")?;

    let zc = start_server(&zcfs, &net, 7070, false, "zc")?;
    let oc = start_server(&zcfs, &net, 7071, true, "oc")?;
    // The children are the server processes (they enter the namespace, then exec zcfs).
    let (zc_pid, oc_pid) = (zc.child.id(), oc.child.id());
    let short = a.short;
    let sizes = sizes(short);
    let (zc_addr, oc_addr) = (
        format!("{}:7070", net.srv_ip),
        format!("{}:7071", net.srv_ip),
    );
    let (rows, copies) = net
        .cli
        .run(move || -> Result<(Vec<Row>, serde_json::Value)> {
            let mut rows = Vec::new();
            for &size in &sizes {
                for write in [false, true] {
                    for qd in [1, 16] {
                        let r = median_of(repeat, || raw::bench(&raw_addr, size, write, qd, secs))?;
                        eprintln!(
                            "raw-tcp {} {:>8} B qd{qd:<2}: p50 {:>9.1} us, {:>8.1} MB/s",
                            r.op, size, r.p50_us, r.mb_s
                        );
                        rows.push(r);
                    }
                }
            }
            for write in [false, true] {
                let r = median_of(repeat, || raw::stream(&raw_addr, write, secs))?;
                eprintln!("raw-tcp stream {}: {:>8.1} MB/s", r.op, r.mb_s);
                rows.push(r);
            }
            let connect = |addr: &str| {
                let mut c = ClientConfig::new(addr);
                c.connections = 1;
                c.timeout = Duration::from_secs(30);
                RemoteFs::connect(c).map_err(|e| anyhow::anyhow!("{addr}: {e}"))
            };
            // One server's rows (each size, direction, pattern and queue depth given),
            // and its user-space copy counter afterwards.
            let server_rows = |system: &str,
                               pid: u32,
                               addr: &str,
                               writes: &[bool],
                               randoms: &[bool],
                               rows: &mut Vec<Row>|
             -> Result<serde_json::Value> {
                SERVER_PID.store(pid, std::sync::atomic::Ordering::Relaxed);
                let fs = connect(addr)?;
                let ino = prepare(&fs, short)?;
                for &size in &sizes {
                    for &write in writes {
                        for &random in randoms {
                            for qd in [1, 16] {
                                let r = median_of(repeat, || {
                                    zcfs_bench(&fs, ino, system, size, write, random, qd, secs, short)
                                })?;
                                eprintln!(
                                    "{system} {} {} {:>8} B qd{qd:<2}: p50 {:>9.1} us, {:>8.1} MB/s",
                                    r.op, r.pattern, size, r.p50_us, r.mb_s
                                );
                                rows.push(r);
                            }
                        }
                    }
                }
                let stats: serde_json::Value = serde_json::from_slice(
                    &fs.server_stats().map_err(|e| anyhow::anyhow!("{e}"))?,
                )?;
                eprintln!(
                    "{system} server: {} user-space copies per payload byte",
                    stats["user_copies_per_payload_byte"]
                );
                Ok(stats)
            };
            let both = [false, true];
            let zstats = server_rows("zcfs", zc_pid, &zc_addr, &both, &both, &mut rows)?;
            // The one-copy server: sequential writes only, as before.
            let ostats = server_rows("zcfs-one-copy", oc_pid, &oc_addr, &[true], &[false], &mut rows)?;
            let copies = serde_json::json!({
                "zero_copy_server": zstats["user_copies_per_payload_byte"],
                "one_copy_server": ostats["user_copies_per_payload_byte"],
            });
            Ok((rows, copies))
        })??;
    drop((zc, oc));
    let mut rows = rows;
    let mut md = report::remote_summary(&rows, &link);
    let mut lane = serde_json::Value::Null;
    let mut lane_by_poll = serde_json::Value::Null;
    if with_l2 {
        let rounds = a.repeat.unwrap_or(if a.short { 3 } else { 5 }).max(1);
        eprintln!("the layer-2 lane beside TCP: {rounds} rounds");
        let mut by_poll = serde_json::Map::new();
        let mut first = None;
        for name in &a.l2_poll {
            let poll: zcfs_client::l2::L2Poll = name
                .parse()
                .map_err(|e| anyhow::anyhow!("--l2-poll {name}: {e}"))?;
            match crate::lane::compare(&zcfs, &net, secs, rounds, poll) {
                Ok((mut lrows, info)) => {
                    for r in &mut lrows {
                        r.l2_poll = Some(name.clone());
                    }
                    md += &format!("\nLane poll mode: {name}\n");
                    md += &crate::lane::summary(&lrows);
                    md += "\n";
                    md += &crate::lane::ratio_lines(&lrows).join("\n");
                    md += "\n";
                    rows.extend(lrows);
                    first.get_or_insert_with(|| info.clone());
                    by_poll.insert(name.clone(), info);
                }
                // The TCP rows stand; the run says why it has no lane rows.
                Err(e) => {
                    eprintln!("layer 2 skipped: {e:#}");
                    let skipped = serde_json::json!({ "skipped": format!("{e:#}") });
                    first.get_or_insert_with(|| skipped.clone());
                    by_poll.insert(name.clone(), skipped);
                }
            }
        }
        // `l2`: the first mode's lane info (as before); `l2_by_poll`: every mode's.
        lane = first.unwrap_or(serde_json::Value::Null);
        lane_by_poll = serde_json::Value::Object(by_poll);
    }
    for r in &mut rows {
        r.transport.get_or_insert_with(|| "tcp".into());
    }
    let json = serde_json::json!({
        "link": link, "seconds_per_measurement": secs, "repeat": repeat,
        "user_copies_per_payload_byte": copies, "rows": rows, "l2": lane, "l2_by_poll": lane_by_poll
    });
    report::write(&a.out, "remote", &json, &md)
}
