//! CPU time (user + system) of the processes doing the work: this process and, when the
//! server is a process of its own, the server ([`SERVER_PID`]) for the benchmarks here;
//! any processes for `scripts/bench.sh` (`zcfs-bench cpu-time`), and the CPU per
//! operation of a fio job beside the file system's processes (`zcfs-bench fio-cpu-row`).

use crate::rows::Row;
use anyhow::{Context, Result};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The server process being measured (0 = none: its CPU is in this process).
pub static SERVER_PID: AtomicU32 = AtomicU32::new(0);

/// CPU time (user + system) a process has used so far, from /proc/PID/stat; `None` once
/// it is gone.
pub fn process_cpu(pid: u32) -> Option<Duration> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): utime and stime are the
    // 12th and 13th.
    let f: Vec<&str> = st
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    let ticks: u64 = f.get(11).and_then(|x| x.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
}

/// CPU time (user + system) of this process plus the server process, if any.
pub fn cpu_now() -> Duration {
    // SAFETY: rusage is plain data filled by getrusage.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    let d = tv(r.ru_utime) + tv(r.ru_stime);
    match SERVER_PID.load(Ordering::Relaxed) {
        0 => d,
        pid => d + process_cpu(pid).unwrap_or_default(),
    }
}

/// Set the CPU-per-operation figure of a row measured since `cpu0`.
pub fn with_cpu(mut r: Row, cpu0: Duration) -> Row {
    let cpu = cpu_now().saturating_sub(cpu0);
    r.cpu_us_per_op = if r.ops == 0 {
        0.0
    } else {
        cpu.as_secs_f64() * 1e6 / r.ops as f64
    };
    r
}

/// `zcfs-bench cpu-time PID...`: the CPU time the processes have used so far, together,
/// in whole microseconds (processes already gone count nothing).
pub fn cpu_time(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|&p| process_cpu(p))
        .map(|d| d.as_micros() as u64)
        .sum()
}

/// `zcfs-bench fio-cpu-row`: the line of `csv/cpu.csv` for one fio job
/// (`target,test,ops,fio_cpu_us_per_op,fs_cpu_us_per_op`), from fio's JSON output and
/// the CPU time the file system's processes used while it ran; `None` if the job did
/// no I/O.
pub fn fio_cpu_row(
    fio_json: &Path,
    target: &str,
    test: &str,
    fs_cpu_us: u64,
) -> Result<Option<String>> {
    let txt = std::fs::read_to_string(fio_json)
        .with_context(|| format!("reading {}", fio_json.display()))?;
    // fio may print notes before the JSON.
    let start = txt.find('{').context("no JSON in fio's output")?;
    let j: serde_json::Value = serde_json::from_str(&txt[start..])?;
    let job = &j["jobs"][0];
    let int = |v: &serde_json::Value, what: &str| {
        v.as_u64()
            .with_context(|| format!("fio output without {what}"))
    };
    let num = |v: &serde_json::Value, what: &str| {
        v.as_f64()
            .with_context(|| format!("fio output without {what}"))
    };
    let ops = int(&job["read"]["total_ios"], "read.total_ios")?
        + int(&job["write"]["total_ios"], "write.total_ios")?;
    let secs = int(&job["job_runtime"], "job_runtime")? as f64 / 1000.0;
    let fio_cpu =
        (num(&job["usr_cpu"], "usr_cpu")? + num(&job["sys_cpu"], "sys_cpu")?) / 100.0 * secs;
    // The file system's processes also worked during fio's 1 s ramp: scale to the timed part.
    let fs_cpu = fs_cpu_us as f64 / 1e6 * secs / (secs + 1.0);
    if ops == 0 {
        return Ok(None);
    }
    Ok(Some(format!(
        "{target},{test},{ops},{:.2},{:.2}",
        fio_cpu * 1e6 / ops as f64,
        fs_cpu * 1e6 / ops as f64
    )))
}
