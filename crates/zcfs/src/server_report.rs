//! A server's counters as text: `zcfs stat HOST:PORT` and `zcfs serve` at shutdown.

use zcfs_server::StatsReport;

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
    out += &format!(
        "{:<12} {:>10} {:>8} {:>14} {:>10} {:>10}\n",
        "op", "count", "errors", "bytes", "mean us", "max us"
    );
    for (name, o) in &r.ops {
        out += &format!(
            "{name:<12} {:>10} {:>8} {:>14} {:>10.1} {:>10.1}\n",
            o.count, o.errors, o.bytes, o.mean_us, o.max_us
        );
    }
    out
}
