//! One histogram, error count and byte count per operation, indexed by the caller's
//! operation code.

use crate::histogram::{Histogram, HistogramSnapshot};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// An operation's latencies (their count is the operation's count), errors and
/// payload bytes.
#[derive(Debug, Default)]
pub struct OpMetrics {
    pub latency: Histogram,
    errors: AtomicU64,
    bytes: AtomicU64,
}

impl OpMetrics {
    /// Count one operation that took `ns` nanoseconds and moved `bytes` bytes.
    #[inline]
    pub fn record(&self, ns: u64, ok: bool, bytes: u64) {
        self.latency.record(ns);
        if !ok {
            self.errors.fetch_add(1, Relaxed);
        }
        if bytes != 0 {
            self.bytes.fetch_add(bytes, Relaxed);
        }
    }

    pub fn snapshot(&self) -> OpSnapshot {
        // The histogram first: errors read afterwards are never fewer than those of
        // the operations it counts.
        let latency = self.latency.snapshot();
        OpSnapshot {
            count: latency.count(),
            errors: self.errors.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            latency,
        }
    }
}

/// An operation's figures at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpSnapshot {
    /// Operations done (the histogram's count).
    pub count: u64,
    pub errors: u64,
    pub bytes: u64,
    pub latency: HistogramSnapshot,
}

/// `OpMetrics` for operation codes 0 .. slots.
#[derive(Debug)]
pub struct OpTable {
    ops: Box<[OpMetrics]>,
}

impl OpTable {
    pub fn new(slots: usize) -> OpTable {
        OpTable {
            ops: (0..slots).map(|_| OpMetrics::default()).collect(),
        }
    }

    /// The metrics of operation `code` (a caller's bug if out of range: the table has
    /// a slot for every code the caller defines).
    #[inline]
    pub fn op(&self, code: usize) -> &OpMetrics {
        &self.ops[code]
    }

    pub fn slots(&self) -> usize {
        self.ops.len()
    }

    /// The snapshots of the named operations that ran at least once, in the order
    /// given.
    pub fn ran<'a>(
        &self,
        names: impl IntoIterator<Item = (usize, &'a str)>,
    ) -> Vec<(&'a str, OpSnapshot)> {
        names
            .into_iter()
            .filter(|&(code, _)| code < self.ops.len())
            .map(|(code, name)| (name, self.ops[code].snapshot()))
            .filter(|(_, s)| s.count > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_errors_and_bytes_per_operation() {
        let t = OpTable::new(3);
        t.op(0).record(1_500, true, 4096);
        t.op(0).record(2_500, false, 0);
        t.op(2).record(10, true, 0);
        let ran = t.ran([(0, "read"), (1, "write"), (2, "getattr"), (7, "bogus")]);
        let names: Vec<_> = ran.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["read", "getattr"], "only operations that ran");
        let read = &ran[0].1;
        assert_eq!((read.count, read.errors, read.bytes), (2, 1, 4096));
        assert_eq!(read.latency.count(), read.count);
        assert_eq!(read.latency.sum_ns, 4_000);
        assert_eq!(t.slots(), 3);
    }
}
