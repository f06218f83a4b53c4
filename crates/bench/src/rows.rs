//! One measurement as every benchmark reports it ([`Row`]), built from latencies
//! ([`row`]), repeated and reduced to its median run ([`median_of`]), and the bounds all
//! measurement loops share ([`max_ops`], [`sizes`]).

use anyhow::Result;
use serde::Serialize;
use std::time::Duration;

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub system: String,
    pub op: String,
    pub pattern: String,
    pub size: usize,
    pub qd: usize,
    pub ops: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mb_s: f64,
    /// CPU time per operation, client and server together (user + system).
    pub cpu_us_per_op: f64,
    /// The path of a remote row: `tcp` or `l2` (the layer-2 lane); none for local rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    /// The layer-2 comparison's poll mode (`wait` or `busy`), on both transports' rows
    /// of it: TCP is measured beside a lane that spins or sleeps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l2_poll: Option<String>,
}

/// Run a measurement `n` times and keep the median run: by p50 latency at QD1, by
/// throughput when pipelined. The shared machine is noisy; one run is not a figure.
pub fn median_of(n: usize, mut f: impl FnMut() -> Result<Row>) -> Result<Row> {
    let mut runs = (0..n.max(1)).map(|_| f()).collect::<Result<Vec<Row>>>()?;
    runs.sort_by(|a, b| {
        let key = |r: &Row| if r.qd == 1 { r.p50_us } else { -r.mb_s };
        key(a).total_cmp(&key(b))
    });
    Ok(runs.swap_remove(runs.len() / 2))
}

/// The `op` of a row of reads or writes.
pub fn op_name(write: bool) -> &'static str {
    if write {
        "write"
    } else {
        "read"
    }
}

/// The `pattern` of a row of random or sequential I/O.
pub fn pattern_name(random: bool) -> &'static str {
    if random {
        "rand"
    } else {
        "seq"
    }
}

/// A row from the latencies of `ops` operations of `size` bytes that took `elapsed`
/// (CPU time is filled in by [`crate::cpu::with_cpu`]).
#[allow(clippy::too_many_arguments)]
pub fn row(
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
        transport: None,
        l2_poll: None,
    }
}

/// Operations per measurement, so slow cases stay bounded too.
pub fn max_ops(size: usize) -> u64 {
    ((256 << 20) / size as u64).clamp(16, 20_000)
}

/// The request sizes of the matrices.
pub fn sizes(short: bool) -> Vec<usize> {
    if short {
        vec![4 << 10, 1 << 20]
    } else {
        vec![1 << 10, 4 << 10, 64 << 10, 1 << 20, 16 << 20]
    }
}
