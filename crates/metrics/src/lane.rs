//! The layer-2 lane of a client or a server as `zcfs stat` shows it and as Prometheus
//! text (`PREFIX_l2_*`, `PREFIX_path_requests_total{op,path}`): the interface, the
//! sockets' bind mode (copy or zero-copy, as the kernel reports the bind), the poll mode,
//! whether the lane is up and the one-line reason when it went down or was refused, and
//! the requests per operation on each path (layer 2 or TCP).

use crate::prometheus::{escape_label, Exposition};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Requests of one operation on each path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathCounts {
    pub l2: u64,
    pub tcp: u64,
}

/// The lane's state and counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneReport {
    /// The interface the lane was asked for.
    pub iface: String,
    /// `copy` or `zero-copy` as the data socket's bind reported it; empty when no
    /// socket was bound (the lane was refused or not tried yet).
    pub bind_mode: String,
    /// `busy` or `wait`.
    pub poll: String,
    /// Whether requests ride the lane now.
    pub up: bool,
    /// Why it went down or was refused (one line; empty: it did not).
    pub reason: String,
    /// Requests per operation name and path (operations with none left out).
    pub requests: BTreeMap<String, PathCounts>,
    /// The lane's other counters by name (`fell_back`, `malformed`, ...).
    pub counters: BTreeMap<String, u64>,
}

impl LaneReport {
    /// The requests on each path, all operations together.
    pub fn totals(&self) -> PathCounts {
        self.requests
            .values()
            .fold(PathCounts::default(), |a, c| PathCounts {
                l2: a.l2 + c.l2,
                tcp: a.tcp + c.tcp,
            })
    }

    /// As lines of `zcfs stat` text.
    pub fn text(&self) -> String {
        let mut out = format!(
            "layer 2     {} on {} ({} mode, {} poll)",
            if self.up { "up" } else { "down" },
            self.iface,
            if self.bind_mode.is_empty() {
                "no"
            } else {
                &self.bind_mode
            },
            self.poll
        );
        if !self.reason.is_empty() {
            let _ = write!(out, ": {}", self.reason);
        }
        out.push('\n');
        let t = self.totals();
        let _ = write!(
            out,
            "paths       {} requests on layer 2, {} on TCP",
            t.l2, t.tcp
        );
        for (name, v) in &self.counters {
            let _ = write!(out, "; {name} {v}");
        }
        out.push('\n');
        if !self.requests.is_empty() {
            let _ = writeln!(out, "{:<12} {:>10} {:>10}", "op", "layer 2", "tcp");
            for (op, c) in &self.requests {
                let _ = writeln!(out, "{op:<12} {:>10} {:>10}", c.l2, c.tcp);
            }
        }
        out
    }

    /// The lane's families under `prefix` (`zcfs_server`, `zcfs_mount`).
    pub fn prometheus(&self, e: &mut Exposition, prefix: &str) {
        e.gauge(
            &format!("{prefix}_l2_up"),
            "Whether requests ride the layer-2 lane now (1) or not (0).",
            self.up as u64,
        );
        e.labelled(
            &format!("{prefix}_l2_info"),
            "gauge",
            "The layer-2 lane: interface, bind mode (copy or zero-copy), poll mode, and why it is down (empty: it is not).",
            &[(
                vec![
                    ("iface", self.iface.as_str()),
                    ("bind_mode", self.bind_mode.as_str()),
                    ("poll", self.poll.as_str()),
                    ("reason", self.reason.as_str()),
                ],
                1,
            )],
        );
        for (name, v) in &self.counters {
            e.counter(
                &format!("{prefix}_l2_{name}_total"),
                &format!("Layer-2 lane: {}.", name.replace('_', " ")),
                *v,
            );
        }
        let mut rows = Vec::new();
        for (op, c) in &self.requests {
            rows.push((vec![("op", op.as_str()), ("path", "l2")], c.l2));
            rows.push((vec![("op", op.as_str()), ("path", "tcp")], c.tcp));
        }
        e.labelled(
            &format!("{prefix}_path_requests_total"),
            "counter",
            "Requests by operation and path (l2: the layer-2 lane, tcp: the TCP connections).",
            &rows,
        );
    }
}

impl Exposition {
    /// A family of samples with labels (`kind` counter or gauge); nothing when empty.
    pub fn labelled(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        rows: &[(Vec<(&str, &str)>, u64)],
    ) {
        if rows.is_empty() {
            return;
        }
        let mut s = format!("# HELP {name} {help}\n# TYPE {name} {kind}\n");
        for (labels, v) in rows {
            let l: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            let _ = writeln!(s, "{name}{{{}}} {v}", l.join(","));
        }
        self.push_raw(&s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LaneReport {
        let mut r = LaneReport {
            iface: "veth0".into(),
            bind_mode: "copy".into(),
            poll: "wait".into(),
            up: false,
            reason: "no reply to a \"read\" within 1s".into(),
            ..Default::default()
        };
        r.requests
            .insert("read".into(), PathCounts { l2: 5, tcp: 2 });
        r.requests
            .insert("write".into(), PathCounts { l2: 0, tcp: 3 });
        r.counters.insert("fell_back".into(), 1);
        r
    }

    #[test]
    fn the_lane_renders_as_prometheus_text_exactly() {
        let mut e = Exposition::new();
        sample().prometheus(&mut e, "zcfs_test");
        assert_eq!(
            e.finish(),
            "# HELP zcfs_test_l2_up Whether requests ride the layer-2 lane now (1) or not (0).\n\
             # TYPE zcfs_test_l2_up gauge\n\
             zcfs_test_l2_up 0\n\
             # HELP zcfs_test_l2_info The layer-2 lane: interface, bind mode (copy or zero-copy), poll mode, and why it is down (empty: it is not).\n\
             # TYPE zcfs_test_l2_info gauge\n\
             zcfs_test_l2_info{iface=\"veth0\",bind_mode=\"copy\",poll=\"wait\",reason=\"no reply to a \\\"read\\\" within 1s\"} 1\n\
             # HELP zcfs_test_l2_fell_back_total Layer-2 lane: fell back.\n\
             # TYPE zcfs_test_l2_fell_back_total counter\n\
             zcfs_test_l2_fell_back_total 1\n\
             # HELP zcfs_test_path_requests_total Requests by operation and path (l2: the layer-2 lane, tcp: the TCP connections).\n\
             # TYPE zcfs_test_path_requests_total counter\n\
             zcfs_test_path_requests_total{op=\"read\",path=\"l2\"} 5\n\
             zcfs_test_path_requests_total{op=\"read\",path=\"tcp\"} 2\n\
             zcfs_test_path_requests_total{op=\"write\",path=\"l2\"} 0\n\
             zcfs_test_path_requests_total{op=\"write\",path=\"tcp\"} 3\n"
        );
    }

    #[test]
    fn the_lane_as_text_and_json() {
        let r = sample();
        let t = r.text();
        assert!(t.starts_with("layer 2     down on veth0 (copy mode, wait poll): no reply"));
        assert!(
            t.contains("5 requests on layer 2, 5 on TCP; fell_back 1"),
            "{t}"
        );
        assert!(t.contains("read                  5          2\n"), "{t}");
        let back: LaneReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert_eq!(r.totals(), PathCounts { l2: 5, tcp: 5 });
    }
}
