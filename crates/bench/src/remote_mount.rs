//! `zcfs-bench remote-mount`: 4 KiB random reads at QD1 through a remote FUSE mount
//! (`zcfs mount HOST:PORT MNT`, fio with O_DIRECT, psync) beside the client library's
//! own 4 KiB QD1 reads (`Client::call`), each over TCP and over the layer-2 lane
//! (`--l2`), against ONE `zcfs serve --l2` on a two-queue veth pair (issue 12: "through
//! a remote mount over layer 2, 4 KiB QD1 read within 10 µs of the library").
//!
//! The server serves one layer-2 peer at a time, so every measurement sets up its own
//! client (a library connection, or a mount) and ends it afterwards; a lane the server
//! refused as busy (the previous peer's connection not yet gone) is set up again,
//! bounded. A row counts only if the reads rode the path it names (the client's
//! per-path counters say so). The cases run in rounds, the order rotated every round,
//! so drift on the shared machine hits them alike; each figure is the median of its
//! rounds. Every loop is bounded in count and time; the mounts and fio are stopped by
//! PID and the namespaces removed on the way out.

use crate::cpu::{process_cpu, SERVER_PID};
use crate::remote::{bench_file_name, prepare, start_server_with, ServerProc};
use crate::rows::{row, Row};
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use zcfs_client::l2::{L2Options, L2Poll};
use zcfs_client::{Caller, ClientConfig, RemoteFs};
use zcfs_netns::{owned_name, Pair, CLI_IF, SRV_IF};
use zcfs_protocol::{NodeRef, ReadReq};

/// The port of the server.
const PORT: u16 = 7073;
/// The read size.
const SIZE: usize = 4096;
/// The file the reads hit (short mode's file of `prepare`).
const FILE: u64 = 256 << 20;
/// Library reads per measurement at most (the time bound usually ends it first).
const MAX_OPS: u64 = 200_000;
/// Library reads before the timed ones (they also set the lane up).
const WARM_UP: u64 = 200;
/// Attempts at a client whose lane comes up (the server takes the next peer once the
/// previous one's connection has ended), and the pause between them.
const LANE_TRIES: u32 = 25;
const LANE_RETRY: Duration = Duration::from_millis(200);
/// How long a mount may take to appear, and to go away after SIGTERM.
const MOUNT_PATIENCE: Duration = Duration::from_secs(15);
/// fio's time beyond its run time before it is killed.
const FIO_GRACE: Duration = Duration::from_secs(30);

/// `system` of the rows.
pub const MOUNT: &str = "zcfs-mount";
pub const LIBRARY: &str = "zcfs-library";
pub const MOUNT_NULL: &str = "zcfs-mount-null";

#[derive(clap::Args, Clone)]
pub struct RemoteMountArgs {
    /// Where to write remote-mount.json and remote-mount.md.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// The zcfs binary (default: next to this one).
    #[arg(long)]
    pub zcfs: Option<PathBuf>,
    /// Rounds; each figure is the median of its rounds.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds per measurement (fio's run time; the library's reads are bounded by count
    /// too).
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// The transports, comma-separated: tcp, l2 (needs root and AF_XDP on the veth pair).
    #[arg(long, default_value = "tcp,l2", value_delimiter = ',')]
    pub transport: Vec<String>,
    /// How both ends of the lane wait for frames, comma-separated: wait (poll(2)), busy
    /// (spin: a core each). One server per mode, its rounds one after another.
    #[arg(long, default_value = "wait", value_delimiter = ',')]
    pub l2_poll: Vec<String>,
    /// More mount options for every mount (`-o`), e.g. threads=1.
    #[arg(long)]
    pub mount_options: Option<String>,
}

/// Library or mount, and over which transport; or a mount of the null backend (`zcfs
/// mount null`: the FUSE round trip alone, no server).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Case {
    pub mount: bool,
    pub l2: bool,
    pub null: bool,
}

impl Case {
    fn system(self) -> &'static str {
        match (self.mount, self.null) {
            (true, true) => MOUNT_NULL,
            (true, false) => MOUNT,
            _ => LIBRARY,
        }
    }

    fn transport(self) -> &'static str {
        match (self.null, self.l2) {
            (true, _) => "none",
            (_, true) => "l2",
            _ => "tcp",
        }
    }
}

/// The cases of the transports asked for: the library and the mount on each, and the
/// null backend's mount.
pub fn cases(tcp: bool, l2: bool) -> Vec<Case> {
    let mut v = vec![Case {
        mount: true,
        l2: false,
        null: true,
    }];
    for on in [false, true] {
        if (on && l2) || (!on && tcp) {
            v.push(Case {
                mount: false,
                l2: on,
                null: false,
            });
            v.push(Case {
                mount: true,
                l2: on,
                null: false,
            });
        }
    }
    v
}

/// The order of the cases in round `round`: rotated by one every round, so no case
/// always runs first or right after the same other.
pub fn order(cases: &[Case], round: usize) -> Vec<Case> {
    let n = cases.len().max(1);
    (0..cases.len()).map(|i| cases[(i + round) % n]).collect()
}

/// One measured case of one round, with the path counts that show where its reads went.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    #[serde(flatten)]
    pub row: Row,
    pub l2_poll: String,
    pub round: usize,
    /// Reads the client sent over layer 2 and over TCP (whole measurement, warm-up
    /// included).
    pub reads_l2: u64,
    pub reads_tcp: u64,
    /// A mount's own time per read (its FUSE read callback, reply included: `zcfs stat
    /// MNT`), mean µs. An upper bound of its work: the timer stops when the callback's
    /// thread runs again after the reply, and the reader it woke may run first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_read_mean_us: Option<f64>,
}

/// What one case measured: its row, the client's reads per path, the mount's own mean.
struct Measured {
    row: Row,
    reads_l2: u64,
    reads_tcp: u64,
    daemon_read_mean_us: Option<f64>,
}

/// A case's figure: the median of its rounds (p50 and p99 each the median of theirs).
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    pub system: String,
    pub transport: String,
    pub l2_poll: String,
    pub rounds: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    /// Mounts: the mount's own mean time per read (median of the rounds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_read_mean_us: Option<f64>,
    pub cpu_us_per_op: f64,
    pub p50_us_each_round: Vec<f64>,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The figures of every (poll, case) with samples.
pub fn figures(samples: &[Sample]) -> Vec<Figure> {
    let mut keys: Vec<(String, String, String)> = Vec::new();
    for s in samples {
        let k = (
            s.l2_poll.clone(),
            s.row.transport.clone().unwrap_or_default(),
            s.row.system.clone(),
        );
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|(poll, transport, system)| {
            let of: Vec<&Sample> = samples
                .iter()
                .filter(|s| {
                    s.l2_poll == poll
                        && s.row.system == system
                        && s.row.transport.as_deref() == Some(transport.as_str())
                })
                .collect();
            let mut each: Vec<(usize, f64)> = of.iter().map(|s| (s.round, s.row.p50_us)).collect();
            each.sort_by_key(|x| x.0);
            Figure {
                system,
                transport,
                l2_poll: poll,
                rounds: of.len(),
                p50_us: median(of.iter().map(|s| s.row.p50_us).collect()),
                p99_us: median(of.iter().map(|s| s.row.p99_us).collect()),
                mean_us: median(of.iter().map(|s| s.row.mean_us).collect()),
                daemon_read_mean_us: {
                    let d: Vec<f64> = of.iter().filter_map(|s| s.daemon_read_mean_us).collect();
                    (!d.is_empty()).then(|| median(d))
                },
                cpu_us_per_op: median(of.iter().map(|s| s.row.cpu_us_per_op).collect()),
                p50_us_each_round: each.into_iter().map(|x| x.1).collect(),
            }
        })
        .collect()
}

/// `mount − library` per poll mode and transport: (poll, transport, library, mount).
pub fn differences(figs: &[Figure]) -> Vec<(String, String, f64, f64)> {
    let mut out = Vec::new();
    for lib in figs.iter().filter(|f| f.system == LIBRARY) {
        if let Some(m) = figs
            .iter()
            .find(|f| f.system == MOUNT && f.transport == lib.transport && f.l2_poll == lib.l2_poll)
        {
            out.push((
                lib.l2_poll.clone(),
                lib.transport.clone(),
                lib.p50_us,
                m.p50_us,
            ));
        }
    }
    out
}

/// The goal of issue 12 this measures: a mount within this many µs of the library.
pub const GOAL_US: f64 = 10.0;

/// remote-mount.md: the table and the goal's verdict.
pub fn summary(figs: &[Figure]) -> String {
    let mut out = String::from(
        "### 4 KiB random read, QD1: a remote FUSE mount (fio, O_DIRECT, psync) beside the client library\n\n\
         | server's lane poll | transport | library p50 µs | mount p50 µs | mount − library µs | library p99 µs | mount p99 µs | rounds |\n\
         |---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut lines = Vec::new();
    for (poll, transport, lib, mnt) in differences(figs) {
        let f = |sys: &str| {
            figs.iter()
                .find(|f| f.system == sys && f.transport == transport && f.l2_poll == poll)
                .expect("listed by differences")
        };
        let (l, m) = (f(LIBRARY), f(MOUNT));
        out += &format!(
            "| {poll} | {transport} | {lib:.1} | {mnt:.1} | {:+.1} | {:.1} | {:.1} | {} |\n",
            mnt - lib,
            l.p99_us,
            m.p99_us,
            l.rounds.min(m.rounds),
        );
        if transport == "l2" {
            lines.push(format!(
                "- over layer 2 ({poll}): the mount is {:.1} µs above the library: goal (≤ {GOAL_US} µs) {}",
                mnt - lib,
                if mnt - lib <= GOAL_US { "holds" } else { "not met" }
            ));
        }
    }
    for n in figs.iter().filter(|f| f.system == MOUNT_NULL) {
        out += &format!(
            "\nThe FUSE round trip alone (`zcfs mount null`, same fio job, no server; the {} \
             server running beside it): p50 {:.1} µs, p99 {:.1} µs.\n",
            n.l2_poll, n.p50_us, n.p99_us,
        );
    }
    out += "\nThe poll mode is the server's (a busy server spins a core also while TCP \
            requests run) and, on layer 2, the client's too.\n";
    if !lines.is_empty() {
        out += "\n";
        out += &lines.join("\n");
        out += "\n";
    }
    out
}

/// The library's reads: QD1, random 4 KiB offsets in the file, `Client::call` (as
/// `zcfs-bench remote`'s lane rows), timed around each call.
fn library(fs: &RemoteFs, ino: u64, secs: f64) -> Result<Row> {
    let slots = FILE / SIZE as u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % slots) * SIZE as u64
    };
    let read = |offset: u64| read_once(fs, ino, offset);
    for _ in 0..WARM_UP {
        read(next())?;
    }
    let cpu0 = crate::cpu::cpu_now();
    let deadline = Duration::from_secs_f64(secs);
    let mut lat = Vec::new();
    let t = Instant::now();
    while (lat.len() as u64) < MAX_OPS && t.elapsed() < deadline {
        let off = next();
        let t0 = Instant::now();
        read(off)?;
        lat.push(t0.elapsed().as_nanos() as u64);
    }
    let el = t.elapsed();
    let n = lat.len() as u64;
    let r = row(LIBRARY, "read", "rand", SIZE, 1, &mut lat, el, n);
    Ok(crate::cpu::with_cpu(r, cpu0))
}

/// One 4 KiB read at `offset` through `Client::call`.
fn read_once(fs: &RemoteFs, ino: u64, offset: u64) -> Result<()> {
    let req = ReadReq {
        node: NodeRef::ino(ino),
        fh: 0,
        offset,
        size: SIZE as u32,
    };
    let r = fs
        .client()
        .call(&req.into(), Caller::process(), &[])
        .map_err(|e| anyhow!("read: {e}"))?;
    if r.data.len() != SIZE {
        bail!("short read: {} of {SIZE}", r.data.len());
    }
    Ok(())
}

/// Reads per path in a lane report (`read` requests).
fn read_counts(lane: &serde_json::Value) -> (u64, u64) {
    let r = &lane["requests"]["read"];
    (
        r["l2"].as_u64().unwrap_or(0),
        r["tcp"].as_u64().unwrap_or(0),
    )
}

/// A row counts only if its reads went the way it says: over layer 2, most of them
/// there and the lane still up; over TCP, none there.
fn check_path(case: Case, up: bool, l2: u64, tcp: u64) -> Result<()> {
    if case.l2 {
        if !up || l2 < tcp.saturating_mul(9) || l2 == 0 {
            bail!(
                "the {} reads did not ride the lane (up {up}, {l2} on layer 2, {tcp} on TCP)",
                case.system()
            );
        }
    } else if l2 > 0 {
        bail!("{} reads rode layer 2 in a TCP case", l2);
    }
    Ok(())
}

/// One library case in the client namespace: connect (with the lane if asked), measure,
/// disconnect (so the server can give the lane to the next client).
fn library_case(
    net: &Pair,
    addr: &str,
    ino: u64,
    case: Case,
    poll: L2Poll,
    secs: f64,
) -> Result<Measured> {
    net.cli.run(|| -> Result<Measured> {
        for attempt in 1..=LANE_TRIES {
            let mut c = ClientConfig::new(addr);
            c.connections = 1;
            c.timeout = Duration::from_secs(30);
            if case.l2 {
                c.l2 = Some(L2Options {
                    poll,
                    ..L2Options::new(CLI_IF)
                });
            }
            let fs = RemoteFs::connect(c).map_err(|e| anyhow!("{addr}: {e}"))?;
            if case.l2 {
                // The lane is set up on first use: one read, then is it up?
                read_once(&fs, ino, 0)?;
                let up = fs.client().lane_report().is_some_and(|l| l.up);
                if !up && attempt < LANE_TRIES {
                    // Refused (busy: the previous peer's connection is still ending).
                    drop(fs);
                    std::thread::sleep(LANE_RETRY);
                    continue;
                }
            }
            let mut r = library(&fs, ino, secs)?;
            let lane = match fs.client().lane_report() {
                Some(l) => serde_json::to_value(&l)?,
                None => serde_json::Value::Null,
            };
            let (l2, tcp) = read_counts(&lane);
            let up = lane["up"].as_bool().unwrap_or(false);
            check_path(case, up, l2, tcp)?;
            r.transport = Some(case.transport().into());
            return Ok(Measured {
                row: r,
                reads_l2: l2,
                reads_tcp: tcp,
                daemon_read_mean_us: None,
            });
        }
        unreachable!("the last attempt returns")
    })?
}

/// `zcfs mount` in the client namespace, stopped by PID (SIGTERM, then SIGKILL and a
/// lazy unmount) on drop, its mount point removed.
struct Mount {
    child: Child,
    mp: PathBuf,
}

fn mounted(mp: &Path) -> bool {
    let Some(p) = mp.to_str() else { return false };
    std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|s| s.lines().any(|l| l.split(' ').nth(4) == Some(p)))
}

impl Mount {
    fn start(
        zcfs: &Path,
        net: &Pair,
        addr: &str,
        case: Case,
        poll: &str,
        opts: Option<&str>,
        log: &Path,
    ) -> Result<Mount> {
        let mp = PathBuf::from(format!(
            "/tmp/zcfs-bench-mnt-{}-{}",
            std::process::id(),
            case.transport()
        ));
        std::fs::create_dir_all(&mp)?;
        let mut cmd = net.cli.command(zcfs);
        cmd.arg("mount").arg(addr).arg(&mp);
        if case.l2 {
            cmd.args(["--l2", CLI_IF, "-o", &format!("l2_poll={poll}")]);
        }
        if let Some(o) = opts {
            cmd.args(["-o", o]);
        }
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let child = cmd
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .context("starting zcfs mount")?;
        let mut m = Mount { child, mp };
        let t = Instant::now();
        while !mounted(&m.mp) {
            if let Some(st) = m.child.try_wait()? {
                bail!("zcfs mount exited ({st}); see {}", log.display());
            }
            if t.elapsed() > MOUNT_PATIENCE {
                bail!("no mount at {} after {MOUNT_PATIENCE:?}", m.mp.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The mount shows in mountinfo a moment before its process answers `zcfs stat`.
        loop {
            match m.stat(zcfs) {
                Ok(_) => return Ok(m),
                Err(e) if t.elapsed() > MOUNT_PATIENCE => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// `zcfs stat MNT --json`: the mount's figures (`ops`) and lane report (`l2`).
    fn stat(&self, zcfs: &Path) -> Result<serde_json::Value> {
        let out = Command::new(zcfs)
            .arg("stat")
            .arg(&self.mp)
            .arg("--json")
            .output()?;
        if !out.status.success() {
            bail!(
                "zcfs stat {}: {}",
                self.mp.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let pid = self.child.id() as i32;
        // SAFETY: signalling our own child; it unmounts on SIGTERM.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < MOUNT_PATIENCE {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = self.child.wait();
        }
        if mounted(&self.mp) {
            if let Ok(c) = std::ffi::CString::new(self.mp.as_os_str().as_encoded_bytes()) {
                // SAFETY: a valid C string; detaching our own mount point.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
        let _ = std::fs::remove_dir(&self.mp);
    }
}

/// fio: 4 KiB random O_DIRECT reads, psync, QD1, `secs` long, on `file`; its row
/// (CPU per operation: fio's own plus the mount's and the server's while it ran).
fn fio(file: &Path, secs: f64, mount_pid: u32, json: &Path) -> Result<Row> {
    let server = SERVER_PID.load(Ordering::Relaxed);
    let cpu =
        || process_cpu(mount_pid).unwrap_or_default() + process_cpu(server).unwrap_or_default();
    let cpu0 = cpu();
    let mut child = Command::new("fio")
        .args([
            "--name=qd1",
            "--rw=randread",
            "--bs=4k",
            "--direct=1",
            "--ioengine=psync",
        ])
        .args([
            "--iodepth=1",
            "--time_based=1",
            "--randrepeat=0",
            "--norandommap=1",
        ])
        .args([
            "--lat_percentiles=1",
            "--clat_percentiles=0",
            "--percentile_list=50:99",
        ])
        .arg(format!("--size={}", FILE))
        .arg(format!("--runtime={}ms", (secs * 1000.0) as u64))
        .arg(format!("--filename={}", file.display()))
        .args(["--output-format=json"])
        .arg(format!("--output={}", json.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting fio (apt-get install fio)")?;
    let limit = Duration::from_secs_f64(secs) + FIO_GRACE;
    let t = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("fio ran past {limit:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let fs_cpu = cpu().saturating_sub(cpu0);
    if !st.success() {
        let mut e = String::new();
        if let Some(mut s) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut s, &mut e);
        }
        bail!("fio failed ({st}): {}", e.trim());
    }
    let txt = std::fs::read_to_string(json)?;
    fio_row(&txt, fs_cpu)
}

/// The row of fio's JSON output (notes before the JSON are skipped).
pub fn fio_row(txt: &str, fs_cpu: Duration) -> Result<Row> {
    let start = txt.find('{').context("no JSON in fio's output")?;
    let j: serde_json::Value = serde_json::from_str(&txt[start..])?;
    let job = &j["jobs"][0];
    let rd = &job["read"];
    let ops = rd["total_ios"].as_u64().context("fio: no read.total_ios")?;
    let pct = &rd["lat_ns"]["percentile"];
    let p = |k: &str| -> Result<f64> {
        Ok(pct[k]
            .as_f64()
            .with_context(|| format!("fio: no lat percentile {k}"))?
            / 1e3)
    };
    let secs = job["job_runtime"].as_f64().unwrap_or(0.0) / 1e3;
    let fio_cpu = (job["usr_cpu"].as_f64().unwrap_or(0.0) + job["sys_cpu"].as_f64().unwrap_or(0.0))
        / 100.0
        * secs;
    Ok(Row {
        system: MOUNT.into(),
        op: "read".into(),
        pattern: "rand".into(),
        size: SIZE,
        qd: 1,
        ops,
        mean_us: rd["lat_ns"]["mean"].as_f64().unwrap_or(0.0) / 1e3,
        p50_us: p("50.000000")?,
        p99_us: p("99.000000")?,
        mb_s: rd["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        cpu_us_per_op: if ops > 0 {
            (fio_cpu + fs_cpu.as_secs_f64()) * 1e6 / ops as f64
        } else {
            0.0
        },
        transport: None,
        l2_poll: None,
    })
}

/// One mount case: mount (with the lane if asked; again while the server still serves
/// the previous peer), fio, the mount's path counts, unmount.
#[allow(clippy::too_many_arguments)]
fn mount_case(
    zcfs: &Path,
    net: &Pair,
    addr: &str,
    name: &str,
    case: Case,
    poll: &str,
    opts: Option<&str>,
    secs: f64,
    work: &Path,
) -> Result<Measured> {
    let log = work.join(format!("mount-{}.log", case.transport()));
    let source = if case.null { "null" } else { addr };
    for attempt in 1..=LANE_TRIES {
        let m = Mount::start(zcfs, net, source, case, poll, opts, &log)?;
        let file = m.mp.join(name);
        // The first requests (the lane is set up on first use).
        std::fs::metadata(&file).with_context(|| format!("{}", file.display()))?;
        if case.l2 {
            let lane = m.stat(zcfs)?["l2"].clone();
            if lane["up"] != true {
                if attempt < LANE_TRIES {
                    drop(m);
                    std::thread::sleep(LANE_RETRY);
                    continue;
                }
                bail!("the mount's lane did not come up: {}", lane["reason"]);
            }
        }
        let mut r = fio(&file, secs, m.child.id(), &work.join("fio.json"))?;
        let st = m.stat(zcfs)?;
        let lane = &st["l2"];
        let (l2, tcp) = read_counts(lane);
        check_path(case, lane["up"] == true, l2, tcp)?;
        r.system = case.system().into();
        r.transport = Some(case.transport().into());
        return Ok(Measured {
            row: r,
            reads_l2: l2,
            reads_tcp: tcp,
            // Every read of this mount was fio's (a fresh mount; the stat reads nothing).
            daemon_read_mean_us: st["ops"]["read"]["mean_us"].as_f64(),
        });
    }
    unreachable!("the last attempt returns")
}

/// Whether other work shared the machine: every [`Others::PERIOD`] a look at the
/// processes running (state R) that are neither this one's (by parent chain) nor the
/// kernel's threads, and their names.
struct Others {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    seen: std::sync::Arc<std::sync::Mutex<(u64, u64, Vec<String>)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Others {
    const PERIOD: Duration = Duration::from_millis(200);

    fn start() -> Others {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = std::sync::Arc::new(std::sync::Mutex::new((0, 0, Vec::new())));
        let (st, se) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            let me = std::process::id();
            while !st.load(Ordering::Relaxed) {
                let names = others_running(me);
                let mut g = se.lock().unwrap_or_else(|e| e.into_inner());
                g.0 += 1;
                if !names.is_empty() {
                    g.1 += 1;
                }
                for n in names {
                    if !g.2.contains(&n) && g.2.len() < 16 {
                        g.2.push(n);
                    }
                }
                drop(g);
                std::thread::sleep(Self::PERIOD);
            }
        });
        Others {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// Since the last call: the share of looks that found another process running, and
    /// the names found.
    fn take(&self) -> (f64, Vec<String>) {
        let mut g = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let r = (g.1 as f64 / g.0.max(1) as f64, std::mem::take(&mut g.2));
        *g = (0, 0, Vec::new());
        r
    }
}

impl Drop for Others {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// (state, parent, name) of a process from /proc/PID/stat.
fn proc_stat(pid: u32) -> Option<(char, u32, String)> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = st.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_string();
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((state, ppid, name))
}

/// The names of the processes running now that are not `me` or its descendants, nor
/// kernel threads (those under kthreadd, pid 2: they include the softirq work of our
/// own traffic).
fn others_running(me: u32) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        let Some((state, mut ppid, name)) = proc_stat(pid) else {
            continue;
        };
        if state != 'R' || pid == me || pid == 2 {
            continue;
        }
        // Up the parent chain (bounded): ours, or the kernel's?
        let mut ours = false;
        for _ in 0..32 {
            if ppid == me || ppid == 2 {
                ours = true;
                break;
            }
            match proc_stat(ppid) {
                Some((_, p, _)) if ppid > 1 => ppid = p,
                _ => break,
            }
        }
        if !ours {
            out.push(name);
        }
    }
    out
}

/// The rounds against one server (poll mode `poll`).
fn block(
    shared: &mut Vec<serde_json::Value>,
    a: &RemoteMountArgs,
    zcfs: &Path,
    net: &Pair,
    cases: &[Case],
    poll: L2Poll,
    work: &Path,
) -> Result<Vec<Sample>> {
    let poll_name = match poll {
        L2Poll::Busy => "busy",
        L2Poll::Wait => "wait",
    };
    let with_l2 = cases.iter().any(|c| c.l2);
    let extra: Vec<&str> = if with_l2 {
        vec!["--l2", SRV_IF, "--l2-poll", poll_name]
    } else {
        vec![]
    };
    let srv: ServerProc = start_server_with(zcfs, net, PORT, &extra, "rmount", true)?;
    SERVER_PID.store(srv.child.id(), Ordering::Relaxed);
    let addr = format!("{}:{PORT}", net.srv_ip);
    let ino = net.cli.run(|| -> Result<u64> {
        let mut c = ClientConfig::new(&addr);
        c.connections = 1;
        c.timeout = Duration::from_secs(30);
        let fs = RemoteFs::connect(c).map_err(|e| anyhow!("{addr}: {e}"))?;
        prepare(&fs, true)
    })??;
    let name = bench_file_name();
    let mut out = Vec::new();
    let rounds = a.rounds.max(1);
    let others = Others::start();
    for round in 0..rounds {
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        others.take();
        for case in order(cases, round) {
            let Measured {
                row,
                reads_l2,
                reads_tcp,
                daemon_read_mean_us,
            } = if case.mount {
                mount_case(
                    zcfs,
                    net,
                    &addr,
                    &name,
                    case,
                    poll_name,
                    a.mount_options.as_deref(),
                    a.seconds,
                    work,
                )?
            } else {
                library_case(net, &addr, ino, case, poll, a.seconds)?
            };
            let own = daemon_read_mean_us
                .map(|d| format!(" (mean {:.1} us, the mount's own {d:.1})", row.mean_us))
                .unwrap_or_default();
            let paths = if case.l2 {
                format!(" (the client's reads: {reads_l2} on layer 2, {reads_tcp} on TCP)")
            } else {
                String::new()
            };
            eprintln!(
                "{poll_name} round {} {:<13} {:<3}: p50 {:>7.1} us, p99 {:>7.1} us, {} timed reads{own}{paths}",
                round + 1,
                row.system,
                case.transport(),
                row.p50_us,
                row.p99_us,
                row.ops,
            );
            out.push(Sample {
                row,
                l2_poll: poll_name.into(),
                round,
                reads_l2,
                reads_tcp,
                daemon_read_mean_us,
            });
        }
        let (busy, names) = others.take();
        let load = load
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        eprintln!(
            "{poll_name} round {} of {rounds} done (load at its start: {load}; other processes \
             running in {:.0} % of looks{}{})",
            round + 1,
            busy * 100.0,
            if names.is_empty() { "" } else { ": " },
            names.join(" ")
        );
        shared.push(serde_json::json!({
            "l2_poll": poll_name, "round": round, "loadavg_at_start": load,
            "others_running_share": busy, "others": names,
        }));
    }
    drop(srv);
    SERVER_PID.store(0, Ordering::Relaxed);
    Ok(out)
}

pub fn run(a: &RemoteMountArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("zcfs-bench remote-mount needs root (network namespaces, mounts)");
    }
    let zcfs = crate::remote::zcfs_binary(a.zcfs.as_deref())?;
    if !(0.05..=600.0).contains(&a.seconds) {
        bail!("--seconds {}: 0.05 to 600", a.seconds);
    }
    for t in &a.transport {
        if !crate::lane::TRANSPORTS.contains(&t.as_str()) {
            bail!("--transport {t}: tcp or l2");
        }
    }
    let (tcp, l2) = (
        a.transport.iter().any(|t| t == "tcp"),
        a.transport.iter().any(|t| t == "l2"),
    );
    if l2 {
        if let Some(why) = crate::lane::unavailable() {
            bail!("--transport l2: {why}");
        }
    }
    let mut polls = Vec::new();
    for p in &a.l2_poll {
        let poll: L2Poll = p.parse().map_err(|e| anyhow!("--l2-poll {p}: {e}"))?;
        if !polls.contains(&poll) {
            polls.push(poll);
        }
    }
    if !l2 {
        // Without the lane the server's poll mode means nothing: one block.
        polls.truncate(1);
    }
    let cases = cases(tcp, l2);
    let work = PathBuf::from(format!("/tmp/zcfs-bench-rmount-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let net = Pair::create_with_queues(&owned_name(std::process::id(), "rmount"), 203, 2)?;
    let load0 = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut samples = Vec::new();
    let mut rounds_info = Vec::new();
    let mut result = Ok(());
    for &poll in &polls {
        match block(&mut rounds_info, a, &zcfs, &net, &cases, poll, &work) {
            Ok(s) => samples.extend(s),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let load1 = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    drop(net);
    // The mounts' logs are kept beside the results when something failed.
    if result.is_err() {
        let _ = std::fs::create_dir_all(&a.out);
        for t in ["tcp", "l2"] {
            let _ = std::fs::copy(
                work.join(format!("mount-{t}.log")),
                a.out.join(format!("remote-mount-{t}.log")),
            );
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    result?;
    let figs = figures(&samples);
    let mut md = summary(&figs);
    if let Some(o) = &a.mount_options {
        md += &format!("\nEvery mount with `-o {o}`.\n");
    }
    let diffs: Vec<serde_json::Value> = differences(&figs)
        .into_iter()
        .map(|(poll, transport, lib, mnt)| {
            serde_json::json!({
                "l2_poll": poll, "transport": transport, "library_p50_us": lib,
                "mount_p50_us": mnt, "mount_minus_library_us": mnt - lib,
            })
        })
        .collect();
    let json = serde_json::json!({
        "seconds_per_measurement": a.seconds,
        "rounds": a.rounds.max(1),
        "loadavg_before": load0.trim(),
        "loadavg_after": load1.trim(),
        "goal_us": GOAL_US,
        "mount_options": a.mount_options,
        "machine_per_round": rounds_info,
        "figures": figs,
        "differences": diffs,
        "rows": samples,
    });
    crate::report::write(&a.out, "remote-mount", &json, &md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_runs_in_every_position_over_the_rounds() {
        let c = cases(true, true);
        assert_eq!(c.len(), 5);
        let firsts: Vec<Case> = (0..5).map(|r| order(&c, r)[0]).collect();
        for x in &c {
            assert!(firsts.contains(x), "{x:?} never first");
        }
        assert_eq!(cases(true, false).len(), 3);
        assert!(cases(true, false).iter().all(|c| !c.l2));
    }

    fn sample(system: &str, transport: &str, round: usize, p50: f64) -> Sample {
        let mut lat = vec![1000u64];
        let mut r = row(
            system,
            "read",
            "rand",
            SIZE,
            1,
            &mut lat,
            Duration::from_secs(1),
            1,
        );
        r.p50_us = p50;
        r.mean_us = p50 + 2.0;
        r.transport = Some(transport.into());
        Sample {
            row: r,
            l2_poll: "wait".into(),
            round,
            reads_l2: 0,
            reads_tcp: 0,
            daemon_read_mean_us: (system == MOUNT).then_some(p50 - 5.0),
        }
    }

    #[test]
    fn the_difference_is_mount_minus_library_of_the_median_rounds() {
        let s = vec![
            sample(LIBRARY, "l2", 0, 20.0),
            sample(LIBRARY, "l2", 1, 40.0),
            sample(LIBRARY, "l2", 2, 30.0),
            sample(MOUNT, "l2", 0, 45.0),
            sample(MOUNT, "l2", 1, 35.0),
            sample(MOUNT, "l2", 2, 99.0),
            sample(LIBRARY, "tcp", 0, 25.0),
            sample(MOUNT_NULL, "none", 0, 12.0),
        ];
        let f = figures(&s);
        let d = differences(&f);
        assert_eq!(d, vec![("wait".into(), "l2".into(), 30.0, 45.0)]);
        let md = summary(&f);
        assert!(md.contains("| wait | l2 | 30.0 | 45.0 | +15.0 |"), "{md}");
        assert!(md.contains("goal (≤ 10 µs) not met"), "{md}");
        assert!(
            md.contains("no server; the wait server running beside it): p50 12.0 µs"),
            "{md}"
        );
    }

    #[test]
    fn a_row_counts_only_on_the_path_it_names() {
        let l2 = Case {
            mount: true,
            l2: true,
            null: false,
        };
        let tcp = Case {
            mount: true,
            l2: false,
            null: false,
        };
        assert!(check_path(l2, true, 1000, 3).is_ok());
        assert!(check_path(l2, false, 1000, 3).is_err(), "lane went down");
        assert!(check_path(l2, true, 10, 1000).is_err(), "most on TCP");
        assert!(check_path(tcp, false, 0, 1000).is_ok());
        assert!(check_path(tcp, false, 1, 1000).is_err());
    }

    #[test]
    fn fio_json_gives_p50_p99_and_ops() {
        let txt = r#"note: something
{"jobs":[{"job_runtime":1000,"usr_cpu":10.0,"sys_cpu":40.0,
  "read":{"total_ios":20000,"bw_bytes":81920000,
    "lat_ns":{"mean":49000.0,"percentile":{"50.000000":47104,"99.000000":90112}}}}]}"#;
        let r = fio_row(txt, Duration::from_millis(500)).unwrap();
        assert_eq!(r.ops, 20000);
        assert_eq!(r.p50_us, 47.104);
        assert_eq!(r.p99_us, 90.112);
        assert!((r.mb_s - 81.92).abs() < 1e-9);
        // (0.5 s of fio + 0.5 s of the file system) over 20,000 reads.
        assert!((r.cpu_us_per_op - 50.0).abs() < 1e-9, "{}", r.cpu_us_per_op);
    }
}
