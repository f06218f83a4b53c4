//! `zcfs-bench remote --transport tcp,l2`: the layer-2 lane beside TCP on the same veth
//! pair, against ONE `zcfs serve --l2` (its image the data socket's UMEM), from two
//! clients in the client namespace: one on TCP only, one that offers the lane. Both
//! call the client library the same way (`Client::call`, one thread per request in
//! flight), so the path is the only difference. The cases run in rounds, each round
//! measuring every case on both transports in turn (the order swapped every round), so
//! drift on the shared machine hits both alike; the median of the rounds is reported.
//! Every loop is bounded in count and time.

use crate::cpu::{cpu_now, with_cpu, SERVER_PID};
use crate::remote::{prepare, start_server_with};
use crate::rows::{max_ops, op_name, row, Row};
use anyhow::{anyhow, bail, Result};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use zcfs_client::l2::{L2Options, L2Poll};
use zcfs_client::{Caller, ClientConfig, RemoteFs};
use zcfs_netns::{Pair, CLI_IF, SRV_IF};
use zcfs_protocol::{NodeRef, ReadReq, Request, WriteReq};

/// The port of the lane's server.
const PORT: u16 = 7072;
/// The `system` of the comparison's rows (apart from the matrices' `zcfs` rows).
pub const SYSTEM: &str = "zcfs-lane";
/// The transports, as the rows name them.
pub const TRANSPORTS: [&str; 2] = ["tcp", "l2"];
/// The file the cases read and write (short mode's size of the matrices' file).
const FILE: u64 = 256 << 20;

/// The cases: (size, write, requests in flight).
pub fn cases() -> Vec<(usize, bool, usize)> {
    let mut v = Vec::new();
    for write in [false, true] {
        v.push((1 << 10, write, 1));
        v.push((4 << 10, write, 1));
        v.push((16 << 10, write, 1));
        // Above the inline limit: writes land in place over layer 2 (the threshold's
        // measurement), reads of 64 KiB ride the lane, 256 KiB go on TCP.
        v.push((64 << 10, write, 1));
        v.push((256 << 10, write, 1));
        v.push((1 << 20, write, 1));
        v.push((1 << 20, write, 16));
    }
    v
}

/// Why the lane cannot be measured here (None: it can be tried).
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the layer-2 lane needs root".into());
    }
    if !zcfs_xsk::xdp_object_available() {
        return Some("zcfs was built without its XDP program (clang missing?)".into());
    }
    // SAFETY: socket(2) has no memory preconditions; the descriptor is closed at once.
    let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW, 0) };
    if fd < 0 {
        return Some(format!(
            "no AF_XDP sockets here: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: our own descriptor, closed once.
    unsafe { libc::close(fd) };
    None
}

/// One case on `fs`: `qd` threads, each calling the library once at a time.
fn measure(
    fs: &RemoteFs,
    ino: u64,
    transport: &str,
    (size, write, qd): (usize, bool, usize),
    secs: f64,
) -> Result<Row> {
    let cpu0 = cpu_now();
    let client = fs.client();
    let limit = max_ops(size) * if qd > 1 { 4 } else { 1 };
    let deadline = Duration::from_secs_f64(secs);
    let slots = (FILE / size as u64).max(1);
    let node = NodeRef::ino(ino);
    let next = AtomicU64::new(0);
    let t = Instant::now();
    let lats: Vec<Result<Vec<u64>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..qd)
            .map(|_| {
                s.spawn(|| -> Result<Vec<u64>> {
                    let data = vec![0x6bu8; size];
                    let mut lat = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= limit || t.elapsed() >= deadline {
                            return Ok(lat);
                        }
                        let offset = (i % slots) * size as u64;
                        let (req, payload): (Request, Vec<&[u8]>) = if write {
                            let w = WriteReq {
                                node,
                                fh: 0,
                                offset,
                                size: size as u32,
                                commit: false,
                            };
                            (w.into(), vec![&data])
                        } else {
                            let r = ReadReq {
                                node,
                                fh: 0,
                                offset,
                                size: size as u32,
                            };
                            (r.into(), vec![])
                        };
                        let t0 = Instant::now();
                        let r = client
                            .call(&req, Caller::process(), &payload)
                            .map_err(|e| anyhow!("{transport}: {e}"))?;
                        if !write && r.data.len() != size {
                            bail!("{transport}: short read: {} of {size}", r.data.len());
                        }
                        lat.push(t0.elapsed().as_nanos() as u64);
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a thread panicked")))
            })
            .collect()
    });
    let el = t.elapsed();
    let mut lat = Vec::new();
    for l in lats {
        lat.extend(l?);
    }
    let done = lat.len() as u64;
    let mut r = row(SYSTEM, op_name(write), "seq", size, qd, &mut lat, el, done);
    r.transport = Some(transport.into());
    Ok(with_cpu(r, cpu0))
}

/// The median of a case's rounds: by p50 at QD1, by throughput when pipelined (its
/// p50 the median of the rounds' p50s).
fn median(mut v: Vec<Row>) -> Row {
    let mut p50: Vec<f64> = v.iter().map(|r| r.p50_us).collect();
    p50.sort_by(f64::total_cmp);
    if v[0].qd == 1 {
        v.sort_by(|a, b| a.p50_us.total_cmp(&b.p50_us));
    } else {
        v.sort_by(|a, b| a.mb_s.total_cmp(&b.mb_s));
    }
    let mid = v.len() / 2;
    Row {
        p50_us: p50[p50.len() / 2],
        ..v.swap_remove(mid)
    }
}

/// The comparison: rows of both transports (medians of `rounds`), and what the two
/// ends' stats say about the lane (its bind mode, the requests per path).
pub fn compare(
    zcfs: &Path,
    net: &Pair,
    secs: f64,
    rounds: usize,
    poll: L2Poll,
) -> Result<(Vec<Row>, serde_json::Value)> {
    let poll_arg = match poll {
        L2Poll::Busy => "busy",
        L2Poll::Wait => "wait",
    };
    let srv = start_server_with(
        zcfs,
        net,
        PORT,
        &["--l2", SRV_IF, "--l2-poll", poll_arg],
        "lane",
        true,
    )?;
    SERVER_PID.store(srv.child.id(), Ordering::Relaxed);
    let addr = format!("{}:{PORT}", net.srv_ip);
    let out = net.cli.run(move || -> Result<(Vec<Row>, serde_json::Value)> {
        let connect = |l2: bool| -> Result<RemoteFs> {
            let mut c = ClientConfig::new(&addr);
            c.connections = 1;
            c.timeout = Duration::from_secs(30);
            if l2 {
                c.l2 = Some(L2Options {
                    poll,
                    ..L2Options::new(CLI_IF)
                });
            }
            RemoteFs::connect(c).map_err(|e| anyhow!("{addr}: {e}"))
        };
        let tcp = connect(false)?;
        let l2 = connect(true)?;
        let lane = l2.client().lane_report().expect("asked for");
        if !lane.up {
            bail!("the layer-2 lane did not come up: {}", lane.reason);
        }
        let ino = prepare(&tcp, true)?;
        let fss = [&tcp, &l2];
        let cases = cases();
        // runs[case][transport]
        let mut runs = vec![vec![Vec::new(); 2]; cases.len()];
        for round in 0..rounds {
            for (ci, &case) in cases.iter().enumerate() {
                let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
                for ti in order {
                    runs[ci][ti].push(measure(fss[ti], ino, TRANSPORTS[ti], case, secs)?);
                }
            }
            eprintln!("lane round {} of {rounds} done", round + 1);
        }
        let mut rows = Vec::new();
        for per in runs {
            for v in per {
                rows.push(median(v));
            }
        }
        for line in ratio_lines(&rows) {
            eprintln!("{line} ({poll_arg} poll)");
        }
        let client = l2.client().lane_report();
        let server: serde_json::Value =
            serde_json::from_slice(&tcp.server_stats().map_err(|e| anyhow!("{e}"))?)?;
        if let Some(c) = &client {
            let t = c.totals();
            eprintln!(
                "lane client: {} ({} mode, {} poll), {} requests on layer 2, {} on TCP, {} fell back",
                if c.up { "up" } else { "down" },
                c.bind_mode,
                c.poll,
                t.l2,
                t.tcp,
                c.counters.get("fell_back").copied().unwrap_or(0)
            );
        }
        if let Some(st) = l2.client().l2_endpoint_stats() {
            eprintln!(
                "lane client endpoint: {} commands sent, {} retransmitted, {} drains ({} stalled), {} groups failed, longest gap between polls {:.1} ms",
                st.commands_sent,
                st.command_retransmits,
                st.drains,
                st.drains_stalled,
                st.groups_failed,
                st.max_poll_gap_ns as f64 / 1e6
            );
        }
        let info = serde_json::json!({ "client": client, "server": server["l2"] });
        Ok((rows, info))
    })??;
    drop(srv);
    SERVER_PID.store(0, Ordering::Relaxed);
    Ok(out)
}

/// `l2/tcp ...` lines: each case's p50 and throughput over the lane against TCP.
pub fn ratio_lines(rows: &[Row]) -> Vec<String> {
    let mut out = Vec::new();
    for (size, write, qd) in cases() {
        let find = |t: &str| {
            rows.iter().find(|r| {
                r.system == SYSTEM
                    && r.transport.as_deref() == Some(t)
                    && r.size == size
                    && r.op == op_name(write)
                    && r.qd == qd
            })
        };
        if let (Some(t), Some(l)) = (find("tcp"), find("l2")) {
            out.push(format!(
                "l2/tcp {:<5} {:>7} qd{qd:<2}: p50 {:>8.1} vs {:>8.1} us = {:.2}x; {:>7.1} vs {:>7.1} MB/s = {:.2}x",
                op_name(write),
                crate::report::human(size),
                l.p50_us,
                t.p50_us,
                l.p50_us / t.p50_us,
                l.mb_s,
                t.mb_s,
                l.mb_s / t.mb_s
            ));
        }
    }
    out
}

/// The table of remote.md's "Layer 2 beside TCP" section.
pub fn summary(rows: &[Row]) -> String {
    let mut out = String::from(
        "### Layer 2 beside TCP (one server, same veth pair, alternating rounds)\n\n\
         | op | size | QD | TCP p50 µs | L2 p50 µs | L2/TCP p50 | TCP MB/s | L2 MB/s | L2/TCP MB/s |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (size, write, qd) in cases() {
        let find = |t: &str| {
            rows.iter().find(|r| {
                r.system == SYSTEM
                    && r.transport.as_deref() == Some(t)
                    && r.size == size
                    && r.op == op_name(write)
                    && r.qd == qd
            })
        };
        if let (Some(t), Some(l)) = (find("tcp"), find("l2")) {
            out += &format!(
                "| {} | {} | {qd} | {:.1} | {:.1} | {:.2}x | {:.0} | {:.0} | {:.2}x |\n",
                op_name(write),
                crate::report::human(size),
                t.p50_us,
                l.p50_us,
                l.p50_us / t.p50_us,
                t.mb_s,
                l.mb_s,
                l.mb_s / t.mb_s
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(t: &str, size: usize, write: bool, qd: usize, p50: f64, mb_s: f64) -> Row {
        let mut lat = vec![1000u64];
        let mut x = row(
            SYSTEM,
            op_name(write),
            "seq",
            size,
            qd,
            &mut lat,
            Duration::from_secs(1),
            1,
        );
        x.p50_us = p50;
        x.mb_s = mb_s;
        x.transport = Some(t.into());
        x
    }

    #[test]
    fn the_ratio_is_l2_over_tcp_for_each_case_with_both_rows() {
        let rows = vec![
            r("tcp", 4096, false, 1, 40.0, 100.0),
            r("l2", 4096, false, 1, 20.0, 200.0),
            // No l2 row for 1 KiB reads: no line.
            r("tcp", 1024, false, 1, 30.0, 30.0),
        ];
        let lines = ratio_lines(&rows);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("= 0.50x;"), "{}", lines[0]);
        assert!(lines[0].ends_with("= 2.00x"), "{}", lines[0]);
        let md = summary(&rows);
        assert!(
            md.contains("| read | 4 KiB | 1 | 40.0 | 20.0 | 0.50x | 100 | 200 | 2.00x |"),
            "{md}"
        );
    }

    #[test]
    fn rows_say_their_transport_in_json() {
        let v = serde_json::to_value(r("l2", 4096, true, 1, 1.0, 1.0)).unwrap();
        assert_eq!(v["transport"], "l2");
        let mut lat = vec![];
        let local = row(
            "x",
            "read",
            "seq",
            1,
            1,
            &mut lat,
            Duration::from_secs(1),
            0,
        );
        assert!(serde_json::to_value(local)
            .unwrap()
            .get("transport")
            .is_none());
    }

    #[test]
    fn the_median_round_is_kept() {
        let m = median(vec![
            r("l2", 4096, false, 1, 30.0, 1.0),
            r("l2", 4096, false, 1, 10.0, 3.0),
            r("l2", 4096, false, 1, 20.0, 2.0),
        ]);
        assert_eq!((m.p50_us, m.mb_s), (20.0, 2.0));
        let m = median(vec![
            r("l2", 1 << 20, false, 16, 30.0, 100.0),
            r("l2", 1 << 20, false, 16, 10.0, 300.0),
            r("l2", 1 << 20, false, 16, 50.0, 200.0),
        ]);
        assert_eq!((m.p50_us, m.mb_s), (30.0, 200.0));
    }
}
