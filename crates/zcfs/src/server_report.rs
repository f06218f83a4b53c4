//! A server's counters as text: `zcfs stat HOST:PORT` and `zcfs serve` at shutdown.

use std::collections::BTreeMap;
use zcfs_server::{OpReport, StatsReport};

pub fn format_report(r: &StatsReport) -> String {
    let mut out = format!(
        "connections {} active, {} total; rejected: {} malformed, {} authentication, {} over limit\n\
         payload     {} bytes read, {} written; {:.3} user-space copies per payload byte\n",
        r.connections_active,
        r.connections_total,
        r.rejected_malformed,
        r.rejected_auth,
        r.rejected_limit,
        r.payload_bytes_read,
        r.payload_bytes_written,
        r.user_copies_per_payload_byte
    );
    if let Some(l) = &r.l2 {
        out += &l.text();
    }
    out += &format_ops(&r.ops, true);
    out
}

/// Per operation that ran: count, errors, (payload bytes), and latency in microseconds
/// (mean, p50 and p99 estimated from the histogram, max).
pub fn format_ops(ops: &BTreeMap<String, OpReport>, with_bytes: bool) -> String {
    let bytes_head = if with_bytes {
        format!(" {:>14}", "bytes")
    } else {
        String::new()
    };
    let mut out = format!(
        "{:<12} {:>10} {:>8}{bytes_head} {:>10} {:>10} {:>10} {:>10}\n",
        "op", "count", "errors", "mean us", "p50 us", "p99 us", "max us"
    );
    for (name, o) in ops {
        let bytes = if with_bytes {
            format!(" {:>14}", o.bytes)
        } else {
            String::new()
        };
        out += &format!(
            "{name:<12} {:>10} {:>8}{bytes} {:>10.1} {:>10.1} {:>10.1} {:>10.1}\n",
            o.count, o.errors, o.mean_us, o.p50_us, o.p99_us, o.max_us
        );
    }
    out
}
