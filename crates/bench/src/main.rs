//! zcfs-bench: measures zcfs and the limits of the machine side by side, in one run.
//!
//! - `remote` (remote.rs): the client library across a veth pair against `zcfs serve`,
//!   beside the raw TCP limit of the same link (raw.rs); zero- against one-copy writes.
//! - `remote-mount` (remote_mount.rs): 4 KiB QD1 reads through a remote FUSE mount (fio)
//!   beside the client library's, over TCP and over the layer-2 lane, one server.
//! - `local` (local.rs): the library API on a local volume; consistency and page-attach
//!   ablations.
//! - `samehost` (samehost.rs): the same-host interface (direct map, shared buffer)
//!   beside a local FUSE mount and in-process calls.
//! - For `scripts/bench.sh`: `netns` (namespaces, netns.rs), `cpu-time` and
//!   `fio-cpu-row` (CPU accounting, cpu.rs), `create-files` (small files, files.rs).
//!
//! Every measurement is a [`rows::Row`]; report.rs writes them out with their tables.

mod cpu;
mod files;
mod lane;
mod library;
mod local;
mod netns;
mod raw;
mod remote;
mod remote_mount;
mod report;
mod rows;
mod samehost;

use anyhow::Result;
use clap::Parser;
use std::path::PathBuf;

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
    /// 4 KiB random reads at QD1 through a remote FUSE mount (fio, O_DIRECT) beside the
    /// client library's, over TCP and the layer-2 lane, in alternating rounds:
    /// remote-mount.json and remote-mount.md.
    RemoteMount(remote_mount::RemoteMountArgs),
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
    /// Same-host interface (direct map, shared buffer) beside a local FUSE mount and
    /// in-process Volume calls: bench-results/samehost.json and samehost.md.
    Samehost {
        /// A short run (a few seconds): fewer operations, one round, a smaller file.
        #[arg(long)]
        quick: bool,
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
        /// Seconds per measurement at most (bounded further by an operation count).
        #[arg(long)]
        seconds: Option<f64>,
        /// Rounds (interleaved); the median round of each measurement is reported.
        #[arg(long)]
        rounds: Option<usize>,
        /// The zcfs binary for the FUSE mount (default: next to this one).
        #[arg(long)]
        zcfs: Option<PathBuf>,
    },
    /// The same-host client side of `samehost` (run by it in a child process).
    #[command(hide = true)]
    SamehostClient {
        sock: PathBuf,
        #[arg(long)]
        secs: f64,
        #[arg(long)]
        rounds: usize,
        #[arg(long)]
        quick: bool,
        #[arg(long)]
        full: bool,
    },
    /// Network namespaces for scripts: create, run inside, remove.
    #[command(subcommand)]
    Netns(netns::NetnsCmd),
    /// Print the CPU time (user + system) the processes have used so far, together, in
    /// microseconds (processes already gone count nothing).
    CpuTime { pids: Vec<u32> },
    /// Print the cpu.csv line of one fio job: target,test,ops,fio_cpu_us_per_op,
    /// fs_cpu_us_per_op (nothing if the job did no I/O).
    FioCpuRow {
        /// fio's --output-format=json output.
        fio_json: PathBuf,
        target: String,
        test: String,
        /// CPU time the file system's processes used while fio ran (see cpu-time).
        fs_cpu_us: u64,
    },
    /// Create COUNT files of 4 KiB in DIR, each created, written and closed.
    CreateFiles { dir: PathBuf, count: usize },
    /// Exit 0 when the layer-2 lane can be measured here (root, the XDP program built,
    /// AF_XDP sockets); else print why (one line) and exit 1.
    L2Check,
    /// The client library against a running server at ADDR (no secret): the figures
    /// scripts/bench-mount.sh sets beside the mount's, as CSV lines.
    Library {
        addr: String,
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        #[arg(long, default_value_t = 0.5)]
        seconds: f64,
    },
}

#[derive(clap::Args, Clone)]
pub struct RemoteArgs {
    /// About a minute: 4 KiB and 1 MiB only, short runs.
    #[arg(long)]
    pub short: bool,
    /// Shape the link with tc tbf, e.g. 1gbit (the RZCFS evaluation's link).
    #[arg(long)]
    pub tbf: Option<String>,
    /// Where to write results.json and results.md.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// The zcfs binary (default: next to this one).
    #[arg(long)]
    pub zcfs: Option<PathBuf>,
    /// Seconds per measurement (bounded further by an operation count).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Runs of each measurement; the median run is reported (default 3, short mode 1;
    /// 5 with --channel).
    #[arg(long)]
    pub repeat: Option<usize>,
    /// Only the cost of the authenticated channel: 4 KiB and 1 MiB reads and writes
    /// against three servers in the same run, interleaved round by round: --insecure
    /// (no MAC), a secret (header and body MACs, the default), and a secret with
    /// --integrity full (payload MACs too).
    #[arg(long)]
    pub channel: bool,
    /// The transports to measure, comma-separated: tcp (the matrices above), l2 (also
    /// the layer-2 lane beside TCP against one `zcfs serve --l2`, round by round: needs
    /// root and AF_XDP on the veth pair).
    #[arg(long, default_value = "tcp", value_delimiter = ',')]
    pub transport: Vec<String>,
    /// How both ends of the layer-2 lane wait for frames (with `--transport l2`): wait
    /// (poll(2)) or busy (spin on the rings: one core each); comma-separated for a
    /// comparison in each mode (`wait,busy`).
    #[arg(long, default_value = "wait", value_delimiter = ',')]
    pub l2_poll: Vec<String>,
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Remote(a) => remote::run(&a),
        Cmd::RemoteMount(a) => remote_mount::run(&a),
        Cmd::L2Check => match lane::unavailable() {
            None => Ok(()),
            Some(why) => {
                println!("{why}");
                std::process::exit(1)
            }
        },
        Cmd::Local {
            short,
            out,
            seconds,
            repeat,
        } => {
            let secs = seconds.unwrap_or(if short { 0.3 } else { 1.0 });
            let rows = local::run(short, secs, repeat.unwrap_or(if short { 1 } else { 3 }))?;
            report::write(
                &out,
                "local",
                &serde_json::json!({ "seconds_per_measurement": secs, "rows": rows }),
                &report::local_summary(&rows),
            )
        }
        Cmd::Samehost {
            quick,
            out,
            seconds,
            rounds,
            zcfs,
        } => {
            let p = samehost::Params {
                quick,
                secs: seconds.unwrap_or(if quick { 0.2 } else { 1.0 }),
                rounds: rounds.unwrap_or(if quick { 1 } else { 5 }),
            };
            let (rows, skipped) = samehost::run(p, zcfs)?;
            report::write_rows(
                &out,
                "samehost",
                &serde_json::to_value(&rows)?,
                &samehost::summary(&rows, &skipped),
            )
        }
        Cmd::SamehostClient {
            sock,
            secs,
            rounds,
            quick,
            full: _,
        } => samehost::client(
            &sock,
            samehost::Params {
                quick,
                secs,
                rounds,
            },
        ),
        Cmd::Netns(c) => netns::run(c),
        Cmd::CpuTime { pids } => {
            println!("{}", cpu::cpu_time(&pids));
            Ok(())
        }
        Cmd::FioCpuRow {
            fio_json,
            target,
            test,
            fs_cpu_us,
        } => {
            if let Some(line) = cpu::fio_cpu_row(&fio_json, &target, &test, fs_cpu_us)? {
                println!("{line}");
            }
            Ok(())
        }
        Cmd::CreateFiles { dir, count } => files::create_files(&dir, count),
        Cmd::Library {
            addr,
            repeat,
            seconds,
        } => library::run(&addr, repeat, seconds),
    }
}
