//! A latency histogram of atomics with power-of-two bucket bounds.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The upper bound of the first bucket: 1 µs (in nanoseconds).
pub const FIRST_BOUND_NS: u64 = 1_000;
/// Buckets with an upper bound: bucket `i` holds (2^(i-1) µs, 2^i µs], the first
/// [0, 1 µs]; the last finite bound is 2^26 µs = 67.108864 s.
pub const FINITE_BUCKETS: usize = 27;
/// The finite buckets and one overflow bucket (+Inf) for anything slower.
pub const BUCKETS: usize = FINITE_BUCKETS + 1;

/// The upper bound of bucket `i` in nanoseconds; `None` for the overflow bucket
/// (and beyond).
pub const fn bucket_bound_ns(i: usize) -> Option<u64> {
    if i < FINITE_BUCKETS {
        Some(FIRST_BOUND_NS << i)
    } else {
        None
    }
}

/// The bucket holding a latency of `ns` nanoseconds: the first whose bound is at
/// least `ns` (a bound is inclusive, as Prometheus' `le`).
#[inline]
pub fn bucket_of(ns: u64) -> usize {
    // Whole microseconds, rounded up: v <= 1000 << i  <=>  ceil(v / 1000) <= 1 << i.
    let us = ns.div_ceil(FIRST_BOUND_NS);
    let i = if us <= 1 {
        0
    } else {
        (u64::BITS - (us - 1).leading_zeros()) as usize
    };
    i.min(FINITE_BUCKETS)
}

/// Latencies recorded from any number of threads at once, without a lock.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Count one latency of `ns` nanoseconds.
    #[inline]
    pub fn record(&self, ns: u64) {
        self.buckets[bucket_of(ns)].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
        // A load first: the maximum rarely grows, and a plain load is cheaper than
        // a read-modify-write on a line other threads update.
        if ns > self.max_ns.load(Relaxed) {
            self.max_ns.fetch_max(ns, Relaxed);
        }
    }

    /// The counts now (each read on its own: writers keep going meanwhile).
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Relaxed)),
            sum_ns: self.sum_ns.load(Relaxed),
            max_ns: self.max_ns.load(Relaxed),
        }
    }
}

/// A histogram's counts at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Per bucket (not cumulative); the last is the overflow bucket.
    pub buckets: [u64; BUCKETS],
    pub sum_ns: u64,
    pub max_ns: u64,
}

impl Default for HistogramSnapshot {
    fn default() -> Self {
        HistogramSnapshot {
            buckets: [0; BUCKETS],
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

impl HistogramSnapshot {
    /// How many latencies were recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The mean latency in nanoseconds (0 when empty).
    pub fn mean_ns(&self) -> f64 {
        match self.count() {
            0 => 0.0,
            n => self.sum_ns as f64 / n as f64,
        }
    }

    /// An estimate of the `q` quantile (0 ..= 1) in nanoseconds: the bucket holding
    /// the rank ceil(q * count), interpolated linearly inside it, never above the
    /// maximum recorded. 0 when empty.
    pub fn quantile_ns(&self, q: f64) -> f64 {
        let count = self.count();
        if count == 0 {
            return 0.0;
        }
        let rank = ((q.clamp(0.0, 1.0) * count as f64).ceil() as u64).clamp(1, count);
        let mut below = 0u64;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n == 0 || below + n < rank {
                below += n;
                continue;
            }
            let lower = if i == 0 {
                0
            } else {
                bucket_bound_ns(i - 1).unwrap_or(0)
            };
            let upper = bucket_bound_ns(i).unwrap_or(self.max_ns).max(lower);
            let frac = (rank - below) as f64 / n as f64;
            let est = lower as f64 + (upper - lower) as f64 * frac;
            return est.min(self.max_ns as f64);
        }
        self.max_ns as f64
    }

    /// The buckets that hold something, as (upper bound in ns, None for +Inf; count).
    pub fn nonempty(&self) -> Vec<(Option<u64>, u64)> {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(i, &n)| (bucket_bound_ns(i), n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_bounds_are_inclusive_and_powers_of_two() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 0);
        assert_eq!(bucket_of(FIRST_BOUND_NS), 0);
        assert_eq!(bucket_of(FIRST_BOUND_NS + 1), 1);
        assert_eq!(bucket_of(2_000), 1);
        assert_eq!(bucket_of(2_001), 2);
        assert_eq!(bucket_of(4_000), 2);
        assert_eq!(bucket_of(4_001), 3);
        for i in 0..FINITE_BUCKETS {
            let b = bucket_bound_ns(i).unwrap();
            assert_eq!(bucket_of(b), i, "at the bound of {i}");
            assert_eq!(bucket_of(b + 1), i + 1, "just above the bound of {i}");
        }
        // The last finite bound, 2^26 µs, is 67.108864 s; anything slower overflows.
        let last = bucket_bound_ns(FINITE_BUCKETS - 1).unwrap();
        assert_eq!(last, 67_108_864_000);
        assert_eq!(bucket_of(last), FINITE_BUCKETS - 1);
        assert_eq!(bucket_of(last + 1), FINITE_BUCKETS);
        assert_eq!(bucket_of(u64::MAX), FINITE_BUCKETS);
        assert_eq!(bucket_bound_ns(FINITE_BUCKETS), None);
        assert_eq!(BUCKETS, FINITE_BUCKETS + 1);
    }

    #[test]
    fn records_count_sum_max_and_buckets() {
        let h = Histogram::default();
        for ns in [500, 1_000, 1_001, 3_000, u64::MAX / 4] {
            h.record(ns);
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 5);
        assert_eq!(s.buckets[0], 2);
        assert_eq!(s.buckets[1], 1);
        assert_eq!(s.buckets[2], 1);
        assert_eq!(s.buckets[FINITE_BUCKETS], 1);
        assert_eq!(s.sum_ns, 500 + 1_000 + 1_001 + 3_000 + u64::MAX / 4);
        assert_eq!(s.max_ns, u64::MAX / 4);
    }

    #[test]
    fn quantiles_interpolate_within_a_bucket_and_stop_at_the_maximum() {
        let empty = HistogramSnapshot::default();
        assert_eq!(empty.quantile_ns(0.5), 0.0);
        let h = Histogram::default();
        // 100 latencies in (16 µs, 32 µs]: the median is half way, 24 µs.
        for _ in 0..100 {
            h.record(20_000);
        }
        let s = h.snapshot();
        assert_eq!(s.quantile_ns(0.5), 20_000.0, "never above the maximum");
        h.record(32_000);
        let s = h.snapshot();
        assert_eq!(s.quantile_ns(0.5), 16_000.0 + 16_000.0 * 51.0 / 101.0);
        assert_eq!(s.quantile_ns(1.0), 32_000.0);
        // One slow outlier in the overflow bucket: p100 is its exact maximum.
        h.record(100_000_000_000);
        let s = h.snapshot();
        assert_eq!(s.quantile_ns(1.0), 100_000_000_000.0);
        assert!(s.quantile_ns(0.99) <= 32_000.0);
        assert_eq!(
            s.nonempty(),
            vec![(Some(32_000), 101), (None, 1)],
            "the non-empty buckets"
        );
    }

    #[test]
    fn concurrent_recording_loses_nothing() {
        const THREADS: u64 = 8;
        const PER_THREAD: u64 = 20_000;
        let h = std::sync::Arc::new(Histogram::default());
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let h = h.clone();
                std::thread::spawn(move || {
                    for i in 0..PER_THREAD {
                        h.record(t * 1_000 + i % 5_000);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let s = h.snapshot();
        assert_eq!(s.count(), THREADS * PER_THREAD);
        let want_sum: u64 = (0..THREADS)
            .map(|t| (0..PER_THREAD).map(|i| t * 1_000 + i % 5_000).sum::<u64>())
            .sum();
        assert_eq!(s.sum_ns, want_sum);
        assert_eq!(s.max_ns, (THREADS - 1) * 1_000 + 4_999);
    }
}
