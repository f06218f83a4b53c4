//! Local volume benchmarks (`cargo bench -p zcfs-volume`): latency/throughput of 4 KiB
//! write+commit (synchronous and batched, msync and cache-line persistence), 4 KiB read
//! (copying and zero-copy), create, and the cost of consistency at 1 MiB writes (the
//! same engine with the log switched off, a measurement-only mode).
//!
//! Volumes live in /dev/shm, the default stand-in for PM. Compare within one run.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcfs_volume::*;

struct Scratch {
    path: PathBuf,
    vol: Option<Arc<Volume>>,
}

impl Scratch {
    fn new(name: &str, cfg: VolumeConfig) -> Scratch {
        let path = PathBuf::from(format!("/dev/shm/zcfs-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        Volume::mkfs(
            &path,
            2 << 30,
            &MkfsOptions {
                inodes: Some(1 << 20),
                log_bytes: None,
                ..Default::default()
            },
        )
        .unwrap();
        let vol = Volume::open(&path, cfg).unwrap();
        Scratch {
            path,
            vol: Some(vol),
        }
    }
    fn vol(&self) -> &Volume {
        self.vol.as_ref().unwrap()
    }

    /// Create the file "f" in the root directory; its inode number.
    fn file(&self) -> u64 {
        let f = self.vol().create(&Cred::ROOT, ROOT_INO, b"f", 0o644, 0);
        f.unwrap().ino
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.vol.take();
        let _ = std::fs::remove_file(&self.path);
    }
}

const FILE_BLOCKS: u64 = 4096; // 16 MiB working file

fn cacheline() -> Option<PersistMode> {
    Some(PersistMode::CacheLine(zcfs_pmem::FlushInstr::detect()))
}

fn write_4k(c: &mut Criterion) {
    let mut g = c.benchmark_group("write_4k_commit");
    g.throughput(Throughput::Bytes(4096));
    let cases: [(&str, VolumeConfig); 4] = [
        ("sync_msync", VolumeConfig::synchronous()),
        ("batched_msync", VolumeConfig::default()),
        (
            "sync_clwb",
            VolumeConfig {
                persist: cacheline(),
                ..VolumeConfig::synchronous()
            },
        ),
        (
            "batched_clwb",
            VolumeConfig {
                persist: cacheline(),
                ..VolumeConfig::default()
            },
        ),
    ];
    for (name, cfg) in cases {
        let s = Scratch::new(name, cfg);
        let ino = s.file();
        let buf = vec![0x5au8; 4096];
        for i in 0..FILE_BLOCKS {
            s.vol().write(&Cred::ROOT, ino, i * 4096, &buf).unwrap();
        }
        let mut i = 0u64;
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                i = (i * 7 + 13) % FILE_BLOCKS;
                s.vol().write(&Cred::ROOT, ino, i * 4096, &buf).unwrap();
            })
        });
    }
    g.finish();
}

fn read_4k(c: &mut Criterion) {
    let mut g = c.benchmark_group("read_4k");
    g.throughput(Throughput::Bytes(4096));
    let s = Scratch::new("read", VolumeConfig::default());
    let ino = s.file();
    let data = vec![0x33u8; (FILE_BLOCKS * 4096) as usize];
    s.vol().write(&Cred::ROOT, ino, 0, &data).unwrap();
    let mut buf = vec![0u8; 4096];
    let mut i = 0u64;
    g.bench_function("copy", |b| {
        b.iter(|| {
            i = (i * 7 + 13) % FILE_BLOCKS;
            s.vol().read(ino, i * 4096, &mut buf).unwrap()
        })
    });
    g.bench_function("zero_copy_borrow", |b| {
        b.iter(|| {
            i = (i * 7 + 13) % FILE_BLOCKS;
            // Touch the first and last byte so the slice is really used.
            s.vol()
                .read_with(ino, i * 4096, 4096, |sl| {
                    sl[0][0] as usize + sl[0][4095] as usize
                })
                .unwrap()
        })
    });
    g.finish();
}

fn create(c: &mut Criterion) {
    let mut g = c.benchmark_group("create");
    for (name, cfg) in [
        ("sync", VolumeConfig::synchronous()),
        ("batched", VolumeConfig::default()),
    ] {
        let s = Scratch::new(&format!("create-{name}"), cfg);
        let d = s.vol().mkdir(&Cred::ROOT, ROOT_INO, b"d", 0o755).unwrap();
        let mut n = 0u64;
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| {
                let names: Vec<Vec<u8>> = (0..iters)
                    .map(|k| format!("file-{}", n + k).into_bytes())
                    .collect();
                let start = Instant::now();
                for nm in &names {
                    s.vol().create(&Cred::ROOT, d.ino, nm, 0o644, 0).unwrap();
                }
                let t = start.elapsed();
                n += iters;
                // Keep the inode table from filling up (not timed).
                for nm in &names {
                    s.vol().unlink(&Cred::ROOT, d.ino, nm).unwrap();
                }
                t
            })
        });
    }
    g.finish();
}

fn consistency_cost_1m(c: &mut Criterion) {
    let mut g = c.benchmark_group("write_1m_consistency");
    g.throughput(Throughput::Bytes(1 << 20));
    let cases: [(&str, VolumeConfig); 4] = [
        ("log_on_msync", VolumeConfig::synchronous()),
        (
            "log_off_msync",
            VolumeConfig {
                no_log: true,
                ..VolumeConfig::synchronous()
            },
        ),
        (
            "log_on_clwb",
            VolumeConfig {
                persist: cacheline(),
                ..VolumeConfig::synchronous()
            },
        ),
        (
            "log_off_clwb",
            VolumeConfig {
                persist: cacheline(),
                no_log: true,
                ..VolumeConfig::synchronous()
            },
        ),
    ];
    for (name, cfg) in cases {
        let s = Scratch::new(name, cfg);
        let ino = s.file();
        let buf = vec![0x77u8; 1 << 20];
        let mut i = 0u64;
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                i = (i + 1) % 64;
                s.vol().write(&Cred::ROOT, ino, i << 20, &buf).unwrap();
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = write_4k, read_4k, create, consistency_cost_1m
}
criterion_main!(benches);
