//! `zcfs-bench library ADDR`: the client library against a server someone else started
//! (scripts/bench-mount.sh runs it in the client namespace of its mount), so the mount's
//! figures have the library's on the same link and server in the same run beside them.
//! Prints one CSV line per figure: `library,<test>,<value>,<unit>`.

use crate::remote::{prepare, zcfs_bench};
use crate::rows::median_of;
use anyhow::Result;
use std::time::Duration;
use zcfs_client::{ClientConfig, RemoteFs};

pub fn run(addr: &str, repeat: usize, secs: f64) -> Result<()> {
    let mut c = ClientConfig::new(addr);
    c.connections = 1;
    c.timeout = Duration::from_secs(30);
    let fs = RemoteFs::connect(c).map_err(|e| anyhow::anyhow!("{addr}: {e}"))?;
    let short = true;
    let ino = prepare(&fs, short)?;
    // (test, size, write, random, qd, figure)
    let cases: [(&str, usize, bool, bool, usize, &str); 6] = [
        ("seq-write-1m-qd16", 1 << 20, true, false, 16, "MB/s"),
        ("seq-read-1m-qd16", 1 << 20, false, false, 16, "MB/s"),
        ("seq-write-128k-qd16", 128 << 10, true, false, 16, "MB/s"),
        ("randread-4k-qd1", 4 << 10, false, true, 1, "p50_us"),
        ("randwrite-4k-qd1", 4 << 10, true, true, 1, "p50_us"),
        ("randread-4k-qd16", 4 << 10, false, true, 16, "IOPS"),
    ];
    for (test, size, write, random, qd, unit) in cases {
        let r = median_of(repeat, || {
            zcfs_bench(&fs, ino, "library", size, write, random, qd, secs, short)
        })?;
        let value = match unit {
            "MB/s" => r.mb_s,
            "p50_us" => r.p50_us,
            _ => r.mb_s * 1e6 / size as f64,
        };
        println!("library,{test},{value:.1},{unit}");
    }
    Ok(())
}
