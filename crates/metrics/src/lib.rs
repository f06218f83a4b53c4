//! Live per-operation metrics: a lock-free latency histogram (log2 buckets of atomics,
//! 1 µs .. 67 s), per-operation tables of them, the Prometheus text exposition format,
//! and a minimal HTTP/1.1 listener answering `GET /metrics`.
//!
//! Recording an operation costs two relaxed atomic adds (its bucket and the sum), a
//! load (the maximum; a `fetch_max` only when it grows), and one more add for an error
//! or for payload bytes. Readers take snapshots; nothing ever locks.

mod histogram;
mod http;
mod lane;
mod prometheus;
mod report;
mod table;

pub use histogram::{
    bucket_bound_ns, bucket_of, Histogram, HistogramSnapshot, BUCKETS, FINITE_BUCKETS,
    FIRST_BOUND_NS,
};
pub use http::{HttpConfig, MetricsHttp, HTTP_MAX_REQUEST, HTTP_REQUEST_DEADLINE, METRICS_PATH};
pub use lane::{LaneReport, PathCounts};
pub use prometheus::{escape_label, Exposition, CONTENT_TYPE};
pub use report::{BucketCount, OpReport};
pub use table::{OpMetrics, OpSnapshot, OpTable};
