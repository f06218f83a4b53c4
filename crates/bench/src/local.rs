//! `zcfs-bench local`: the library API on a /dev/shm volume, and two ablations.
//! - matrix: read/write, seq/rand, 1 KiB..16 MiB, QD1 latency and QD16 (16 callers);
//! - consistency (CCM Figs. 7-8): synchronous commit with the log, batched group commit,
//!   and the log switched off, for 1 KiB..1 MiB writes;
//! - page attach (FLAC): `zcopy_to` against a copying read, 4 KiB..2 MiB, each touching
//!   every page of the result.

use crate::cpu::{cpu_now, with_cpu};
use crate::rows::{max_ops, median_of, op_name, pattern_name, row, sizes, Row};
use anyhow::Result;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcfs_volume::{Cred, MkfsOptions, Volume, VolumeConfig, ROOT_INO};

struct Vol {
    path: PathBuf,
    vol: Option<Arc<Volume>>,
}

impl Vol {
    fn new(tag: &str, cfg: VolumeConfig) -> Result<Vol> {
        let path = PathBuf::from(format!(
            "/dev/shm/zcfs-bench-local-{tag}-{}.img",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        Volume::mkfs(
            &path,
            4 << 30,
            &MkfsOptions {
                inodes: None,
                log_bytes: None,
                ..Default::default()
            },
        )?;
        Ok(Vol {
            vol: Some(Volume::open(&path, cfg)?),
            path,
        })
    }
    fn v(&self) -> &Arc<Volume> {
        self.vol.as_ref().unwrap()
    }
}

impl Drop for Vol {
    fn drop(&mut self) {
        self.vol.take();
        let _ = std::fs::remove_file(&self.path);
    }
}

const FILE: u64 = 512 << 20;

fn fill(v: &Volume) -> Result<u64> {
    let f = v.create(&Cred::ROOT, ROOT_INO, b"bench", 0o644, 0)?;
    let chunk = vec![0x42u8; 8 << 20];
    let mut off = 0;
    while off < FILE {
        v.write(&Cred::ROOT, f.ino, off, &chunk)?;
        off += chunk.len() as u64;
    }
    // Overwrite it once more, untimed: copy-on-write then cycles through blocks already
    // backed by pages (the steady state), not through never-touched tmpfs pages.
    off = 0;
    while off < FILE {
        v.write(&Cred::ROOT, f.ino, off, &chunk)?;
        off += chunk.len() as u64;
    }
    v.sync()?;
    Ok(f.ino)
}

fn offset(i: u64, size: usize, random: bool) -> u64 {
    let slots = FILE / size as u64;
    let slot = if random {
        i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 7
    } else {
        i
    };
    (slot % slots) * size as u64
}

/// `qd` callers each doing ops until the deadline or their share of `limit`.
#[allow(clippy::too_many_arguments)]
fn run_ops(
    v: &Arc<Volume>,
    ino: u64,
    size: usize,
    write: bool,
    random: bool,
    qd: usize,
    secs: f64,
    system: &str,
) -> Result<Row> {
    let cpu0 = cpu_now();
    let limit = max_ops(size) * if qd > 1 { 4 } else { 1 };
    let deadline = Duration::from_secs_f64(secs);
    let t = Instant::now();
    let results: Vec<Result<Vec<u64>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..qd)
            .map(|q| {
                let v = v.clone();
                s.spawn(move || -> Result<Vec<u64>> {
                    let mut buf = vec![0x5au8; size];
                    let mut lat = Vec::new();
                    let mut i = q as u64 * 7919;
                    while (lat.len() as u64) < limit / qd as u64 && t.elapsed() < deadline {
                        let off = offset(i, size, random);
                        i += 1;
                        let t0 = Instant::now();
                        if write {
                            v.write(&Cred::ROOT, ino, off, &buf)?;
                        } else {
                            v.read(ino, off, &mut buf)?;
                        }
                        lat.push(t0.elapsed().as_nanos() as u64);
                    }
                    Ok(lat)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    let el = t.elapsed();
    let mut lat = Vec::new();
    for r in results {
        lat.extend(r?);
    }
    let n = lat.len() as u64;
    let (op, pattern) = (op_name(write), pattern_name(random));
    let r = row(system, op, pattern, size, qd, &mut lat, el, n);
    Ok(with_cpu(r, cpu0))
}

pub fn run(short: bool, secs: f64, repeat: usize) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let sizes = sizes(short);
    // The matrix, on the default configuration (batched group commit).
    let vol = Vol::new("matrix", VolumeConfig::default())?;
    let ino = fill(vol.v())?;
    for &size in &sizes {
        for write in [false, true] {
            for random in [false, true] {
                for qd in [1, 16] {
                    let r = median_of(repeat, || {
                        run_ops(
                            vol.v(),
                            ino,
                            size,
                            write,
                            random,
                            qd,
                            secs,
                            "zcfs-lib-local",
                        )
                    })?;
                    eprintln!(
                        "zcfs-lib-local {} {} {:>8} B qd{qd:<2}: p50 {:>8.2} us, {:>8.1} MB/s",
                        r.op, r.pattern, size, r.p50_us, r.mb_s
                    );
                    rows.push(r);
                }
            }
        }
    }
    drop(vol);
    // Consistency ablation.
    let cases = [
        ("log-sync", VolumeConfig::synchronous()),
        ("log-batched", VolumeConfig::default()),
        (
            "no-log",
            VolumeConfig {
                no_log: true,
                ..VolumeConfig::synchronous()
            },
        ),
    ];
    for (name, cfg) in cases {
        let vol = Vol::new(name, cfg)?;
        let ino = fill(vol.v())?;
        for size in [1 << 10, 4 << 10, 64 << 10, 1 << 20] {
            let r = median_of(repeat, || {
                run_ops(
                    vol.v(),
                    ino,
                    size,
                    true,
                    false,
                    1,
                    secs,
                    &format!("consistency-{name}"),
                )
            })?;
            eprintln!(
                "consistency {name:<11} write {:>8} B: p50 {:>8.2} us, {:>8.1} MB/s",
                size, r.p50_us, r.mb_s
            );
            rows.push(r);
        }
    }
    // Page attach vs copying read.
    let vol = Vol::new("zcopy", VolumeConfig::default())?;
    let ino = fill(vol.v())?;
    for size in [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20] {
        for attach in [true, false] {
            let r = median_of(repeat, || {
                let mut lat = Vec::new();
                let mut buf = vec![0u8; size];
                let t = Instant::now();
                let mut i = 0;
                while lat.len() < 20_000 && t.elapsed() < Duration::from_secs_f64(secs) {
                    let off = offset(i, size, true);
                    i += 1;
                    let t0 = Instant::now();
                    let mut sum = 0u64;
                    if attach {
                        let pages = vol.v().zcopy_to(ino, off, size)?;
                        for p in pages.as_slice().chunks(4096) {
                            sum += p[0] as u64;
                        }
                    } else {
                        vol.v().read(ino, off, &mut buf)?;
                        for p in buf.chunks(4096) {
                            sum += p[0] as u64;
                        }
                    }
                    std::hint::black_box(sum);
                    lat.push(t0.elapsed().as_nanos() as u64);
                }
                let (el, n) = (t.elapsed(), lat.len() as u64);
                Ok(row(
                    if attach { "zcopy_to" } else { "copying-read" },
                    "read",
                    "rand",
                    size,
                    1,
                    &mut lat,
                    el,
                    n,
                ))
            })?;
            eprintln!("{:<13} {:>8} B: p50 {:>8.2} us", r.system, size, r.p50_us);
            rows.push(r);
        }
    }
    Ok(rows)
}
