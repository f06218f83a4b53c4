//! The Prometheus text exposition format (version 0.0.4): `# HELP`, `# TYPE`, counters
//! and gauges, and histograms as cumulative `_bucket{le=...}`, `_sum` and `_count`,
//! labelled by operation (`op="..."`). Latencies are in seconds.

use crate::histogram::{bucket_bound_ns, HistogramSnapshot, BUCKETS};
use crate::table::OpSnapshot;
use std::fmt::Write;

/// What a `/metrics` answer's Content-Type says.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A label value with `\`, `"` and newlines escaped as the format requires.
pub fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// Nanoseconds as seconds with all nine decimals (exact, no float rounding).
fn seconds(ns: u64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

/// A bucket bound as seconds, `+Inf` for the overflow bucket. The bounds are whole
/// microseconds: six decimals.
fn le(i: usize) -> String {
    match bucket_bound_ns(i) {
        Some(ns) => {
            let us = ns / 1_000;
            format!("{}.{:06}", us / 1_000_000, us % 1_000_000)
        }
        None => "+Inf".into(),
    }
}

/// A text exposition being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// A counter without labels (`name` should end in `_total`).
    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.header(name, "counter", help);
        let _ = writeln!(self.out, "{name} {value}");
    }

    /// A gauge without labels.
    pub fn gauge(&mut self, name: &str, help: &str, value: u64) {
        self.header(name, "gauge", help);
        let _ = writeln!(self.out, "{name} {value}");
    }

    /// A counter per operation; nothing when no operation ran.
    pub fn op_counter(&mut self, name: &str, help: &str, values: &[(&str, u64)]) {
        if values.is_empty() {
            return;
        }
        self.header(name, "counter", help);
        for (op, v) in values {
            let _ = writeln!(self.out, "{name}{{op=\"{}\"}} {v}", escape_label(op));
        }
    }

    /// A latency histogram per operation, in seconds; nothing when no operation ran.
    pub fn op_histogram(&mut self, name: &str, help: &str, values: &[(&str, &HistogramSnapshot)]) {
        if values.is_empty() {
            return;
        }
        self.header(name, "histogram", help);
        for (op, h) in values {
            let op = escape_label(op);
            let mut cumulative = 0;
            for i in 0..BUCKETS {
                cumulative += h.buckets[i];
                let _ = writeln!(
                    self.out,
                    "{name}_bucket{{op=\"{op}\",le=\"{}\"}} {cumulative}",
                    le(i)
                );
            }
            let _ = writeln!(self.out, "{name}_sum{{op=\"{op}\"}} {}", seconds(h.sum_ns));
            let _ = writeln!(self.out, "{name}_count{{op=\"{op}\"}} {cumulative}");
        }
    }

    /// The standard per-operation families under `prefix` (`zcfs_server`,
    /// `zcfs_mount`): `_requests_total`, `_request_errors_total`,
    /// `_request_bytes_total` (payload bytes read or written; only `with_bytes`) and
    /// `_request_duration_seconds`.
    pub fn ops(&mut self, prefix: &str, ops: &[(&str, OpSnapshot)], with_bytes: bool) {
        let pick = |f: fn(&OpSnapshot) -> u64| -> Vec<(&str, u64)> {
            ops.iter().map(|(n, s)| (*n, f(s))).collect()
        };
        self.op_counter(
            &format!("{prefix}_requests_total"),
            "Requests handled, by operation.",
            &pick(|s| s.count),
        );
        self.op_counter(
            &format!("{prefix}_request_errors_total"),
            "Requests answered with an error, by operation.",
            &pick(|s| s.errors),
        );
        if with_bytes {
            self.op_counter(
                &format!("{prefix}_request_bytes_total"),
                "Payload bytes read or written, by operation.",
                &pick(|s| s.bytes),
            );
        }
        let hists: Vec<(&str, &HistogramSnapshot)> =
            ops.iter().map(|(n, s)| (*n, &s.latency)).collect();
        self.op_histogram(
            &format!("{prefix}_request_duration_seconds"),
            "Time from a request's arrival to its reply, by operation.",
            &hists,
        );
    }

    /// Text already in the format (a family written elsewhere in this crate).
    pub(crate) fn push_raw(&mut self, s: &str) {
        self.out.push_str(s);
    }

    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::histogram::FINITE_BUCKETS;
    use crate::table::OpTable;

    #[test]
    fn a_small_case_renders_exactly() {
        let t = OpTable::new(2);
        t.op(0).record(1_000, true, 4096); // <= 1 µs
        t.op(0).record(3_000, false, 0); // <= 4 µs
        let ops = t.ran([(0, "read"), (1, "write")]);
        let mut e = Exposition::new();
        e.counter("zcfs_test_connections_total", "Connections accepted.", 7);
        e.gauge("zcfs_test_sessions", "Sessions now.", 2);
        e.ops("zcfs_test", &ops, true);
        let text = e.finish();
        let mut want = String::from(
            "# HELP zcfs_test_connections_total Connections accepted.\n\
             # TYPE zcfs_test_connections_total counter\n\
             zcfs_test_connections_total 7\n\
             # HELP zcfs_test_sessions Sessions now.\n\
             # TYPE zcfs_test_sessions gauge\n\
             zcfs_test_sessions 2\n\
             # HELP zcfs_test_requests_total Requests handled, by operation.\n\
             # TYPE zcfs_test_requests_total counter\n\
             zcfs_test_requests_total{op=\"read\"} 2\n\
             # HELP zcfs_test_request_errors_total Requests answered with an error, by operation.\n\
             # TYPE zcfs_test_request_errors_total counter\n\
             zcfs_test_request_errors_total{op=\"read\"} 1\n\
             # HELP zcfs_test_request_bytes_total Payload bytes read or written, by operation.\n\
             # TYPE zcfs_test_request_bytes_total counter\n\
             zcfs_test_request_bytes_total{op=\"read\"} 4096\n\
             # HELP zcfs_test_request_duration_seconds Time from a request's arrival to its reply, by operation.\n\
             # TYPE zcfs_test_request_duration_seconds histogram\n\
             zcfs_test_request_duration_seconds_bucket{op=\"read\",le=\"0.000001\"} 1\n\
             zcfs_test_request_duration_seconds_bucket{op=\"read\",le=\"0.000002\"} 1\n",
        );
        for i in 2..FINITE_BUCKETS {
            let us = 1u64 << i;
            want += &format!(
                "zcfs_test_request_duration_seconds_bucket{{op=\"read\",le=\"{}.{:06}\"}} 2\n",
                us / 1_000_000,
                us % 1_000_000
            );
        }
        want += "zcfs_test_request_duration_seconds_bucket{op=\"read\",le=\"+Inf\"} 2\n\
                 zcfs_test_request_duration_seconds_sum{op=\"read\"} 0.000004000\n\
                 zcfs_test_request_duration_seconds_count{op=\"read\"} 2\n";
        assert_eq!(text, want);
        assert!(text.contains("le=\"0.000004\"} 2\n"));
        assert!(
            text.contains("le=\"67.108864\"} 2\n"),
            "the last finite bound"
        );
    }

    #[test]
    fn nothing_ran_renders_no_operation_families() {
        let mut e = Exposition::new();
        e.ops("zcfs_test", &[], true);
        assert_eq!(e.finish(), "");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
