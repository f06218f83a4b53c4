//! An operation's figures as `zcfs stat` shows them and sends them as JSON.

use crate::table::OpSnapshot;
use serde::{Deserialize, Serialize};

/// One non-empty latency bucket: its upper bound in microseconds (`None`: above the
/// last bound) and how many requests fell into it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketCount {
    pub le_us: Option<u64>,
    pub count: u64,
}

/// An operation's count, errors, payload bytes and latency (microseconds).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpReport {
    pub count: u64,
    pub errors: u64,
    pub bytes: u64,
    pub mean_us: f64,
    pub max_us: f64,
    /// Estimated from the histogram (within its bucket, never above the maximum).
    #[serde(default)]
    pub p50_us: f64,
    #[serde(default)]
    pub p99_us: f64,
    /// The histogram's non-empty buckets (their counts add up to `count`).
    #[serde(default)]
    pub histogram: Vec<BucketCount>,
}

impl From<&OpSnapshot> for OpReport {
    fn from(s: &OpSnapshot) -> OpReport {
        let h = &s.latency;
        OpReport {
            count: s.count,
            errors: s.errors,
            bytes: s.bytes,
            mean_us: h.mean_ns() / 1e3,
            max_us: h.max_ns as f64 / 1e3,
            p50_us: h.quantile_ns(0.5) / 1e3,
            p99_us: h.quantile_ns(0.99) / 1e3,
            histogram: h
                .nonempty()
                .into_iter()
                .map(|(le, count)| BucketCount {
                    le_us: le.map(|ns| ns / 1_000),
                    count,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::OpTable;

    #[test]
    fn a_report_keeps_counts_and_estimates() {
        let t = OpTable::new(1);
        for _ in 0..99 {
            t.op(0).record(3_000, true, 10);
        }
        t.op(0).record(1_000_000, false, 0);
        let r = OpReport::from(&t.op(0).snapshot());
        assert_eq!((r.count, r.errors, r.bytes), (100, 1, 990));
        assert_eq!(r.max_us, 1_000.0);
        assert!(r.p50_us > 2.0 && r.p50_us <= 4.0, "{}", r.p50_us);
        assert!(r.p99_us <= 4.0, "{}", r.p99_us);
        assert_eq!(
            r.histogram,
            vec![
                BucketCount {
                    le_us: Some(4),
                    count: 99
                },
                BucketCount {
                    le_us: Some(1024),
                    count: 1
                }
            ]
        );
        let total: u64 = r.histogram.iter().map(|b| b.count).sum();
        assert_eq!(total, r.count);
        // An older report without the histogram fields still reads.
        let old: OpReport =
            serde_json::from_str(r#"{"count":1,"errors":0,"bytes":0,"mean_us":2.0,"max_us":2.0}"#)
                .unwrap();
        assert_eq!((old.count, old.p50_us, old.histogram.len()), (1, 0.0, 0));
    }
}
