//! Results as files: `NAME.json` (every row) and `NAME.md` (the summary tables, also
//! printed), and the tables themselves: the remote headline (zcfs beside raw TCP on the
//! same link) and the local ablations (consistency, page attach).

use crate::rows::Row;
use anyhow::Result;
use std::path::Path;

/// Write `out/NAME.json` and `out/NAME.md`, and print the summary.
pub fn write(out: &Path, name: &str, json: &serde_json::Value, md: &str) -> Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join(format!("{name}.json")),
        serde_json::to_string_pretty(json)?,
    )?;
    std::fs::write(out.join(format!("{name}.md")), md)?;
    println!("{md}");
    Ok(())
}

/// As [`write`], for a result that is a plain list of rows (`samehost.json`).
pub fn write_rows(out: &Path, name: &str, rows: &serde_json::Value, md: &str) -> Result<()> {
    write(out, name, rows, md)
}

/// The headline table: zcfs beside raw TCP on the same link.
pub fn remote_summary(rows: &[Row], link: &str) -> String {
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

pub fn human(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{} KiB", n >> 10)
    }
}

/// The local tables for results.md.
pub fn local_summary(rows: &[Row]) -> String {
    let find = |sys: &str, size: usize| rows.iter().find(|r| r.system == sys && r.size == size);
    let mut out = String::from(
        "### Consistency: the same engine with the log on (synchronous, batched) and off\n\n",
    );
    out += "| write size | log, synchronous µs | log, batched µs | no log µs | cost of the log (sync/no-log) |\n|---:|---:|---:|---:|---:|\n";
    for size in [1 << 10, 4 << 10, 64 << 10, 1 << 20] {
        if let (Some(s), Some(b), Some(n)) = (
            find("consistency-log-sync", size),
            find("consistency-log-batched", size),
            find("consistency-no-log", size),
        ) {
            out += &format!(
                "| {} | {:.2} | {:.2} | {:.2} | {:+.1} % |\n",
                human(size),
                s.p50_us,
                b.p50_us,
                n.p50_us,
                100.0 * (s.p50_us / n.p50_us - 1.0)
            );
        }
    }
    out += "\n### Page attach (zcopy_to) vs a copying read, touching every page\n\n| size | zcopy_to µs | copying read µs | attach / copy |\n|---:|---:|---:|---:|\n";
    for size in [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20] {
        if let (Some(a), Some(c)) = (find("zcopy_to", size), find("copying-read", size)) {
            out += &format!(
                "| {} | {:.2} | {:.2} | {:.2}x |\n",
                human(size),
                a.p50_us,
                c.p50_us,
                a.p50_us / c.p50_us
            );
        }
    }
    out
}
