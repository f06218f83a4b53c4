//! Review 26: the volume's prefault thread under SCHED_IDLE (877cf7f).
//!
//! The thread holds the region's `live` mutex (and, inside MADV_POPULATE_WRITE, the
//! process's mmap lock) for a whole 1 MiB step. Under SCHED_IDLE it gets a CPU only
//! when no normal thread wants one: with both CPUs busy it is preempted mid-step and
//! then everything that needs what it holds waits for it (priority inversion): the
//! volume's close (Region::drop locks `live`) and every mmap/munmap of the process.
//! Measured here (2 CPUs, two spinning nice-0 threads): close and mmap up to ~1.9 s
//! under SCHED_IDLE; ~1.1 s with the thread at nice 19 as before 877cf7f, so the
//! inversion predates it and SCHED_IDLE makes it worse.
//!
//! Fixed: a step faults pages in from user space (`zcfs_pmem::touch_writable`, no
//! address-space lock held between pages) and holds the mapping by reference, not a
//! lock; closing puts anonymous memory in the image's place at once (the file, and its
//! lock, go with the close) and the last holder unmaps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
mod common;
use common::allocate_whole;
use zcfs_volume::*;

/// This thread at the default priority (nice 0), as an application's threads run,
/// even when the test runs under `nice` (as root; elsewhere it stays as it is).
fn normal_priority() {
    // SAFETY: setpriority on the calling thread (who 0), plain integers.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 0) };
}

/// `n` normal-priority threads that spin until `stop` (or 20 s, whichever is first).
fn busy(n: usize, stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                normal_priority();
                let t = Instant::now();
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) && t.elapsed() < Duration::from_secs(20) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            })
        })
        .collect()
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

struct Img(std::path::PathBuf);
impl Drop for Img {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn fresh_image(name: &str) -> Img {
    let path = std::path::PathBuf::from(format!(
        "/dev/shm/zcfs-review26-{name}-{}.img",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    Volume::mkfs(&path, 1 << 30, &MkfsOptions::default()).unwrap();
    allocate_whole(&path); // Else no prefault thread runs.
    Img(path)
}

/// Closing a volume whose prefault thread is working, while every CPU runs
/// normal-priority work (an application's compute threads), should not wait for the
/// SCHED_IDLE thread to be given a CPU again. Worst of 5 rounds.
#[test]
fn closing_a_volume_is_prompt_while_every_cpu_is_busy() {
    normal_priority();
    let img = fresh_image("close");
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let vol = Volume::open(&img.0, VolumeConfig::default()).unwrap();
        vol.prefault_in_background();
        // Let it start (it runs at normal priority until it sets SCHED_IDLE).
        std::thread::sleep(Duration::from_millis(2));
        let stop = Arc::new(AtomicBool::new(false));
        let spinners = busy(cpus(), &stop);
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        drop(vol);
        let took = t.elapsed();
        stop.store(true, Ordering::Relaxed);
        for s in spinners {
            s.join().unwrap();
        }
        eprintln!("close took {took:?}");
        worst = worst.max(took);
    }
    assert!(
        worst < Duration::from_millis(100),
        "closing the volume took {worst:?} while the CPUs were busy"
    );
}

/// While the volume's prefault thread works and every CPU runs normal-priority work,
/// an mmap+munmap in the server process (a thread's stack, a large allocation, a
/// same-host client's buffers) should not wait for the SCHED_IDLE thread's madvise,
/// which holds the process's mmap lock. Worst of 2 s of calls.
#[test]
#[ignore = "finding, reduced not gone: with the prefault faulting from user space, an mmap under full CPU load still waits 11-95 ms, once 287 ms (0.4-1.8 s with MADV_POPULATE_WRITE; 4-12 ms with no prefault); cause not found"]
fn mmap_in_the_server_process_is_prompt_while_the_volume_prefaults_under_load() {
    normal_priority();
    let img = fresh_image("mmap");
    let vol = Volume::open(&img.0, VolumeConfig::default()).unwrap();
    vol.prefault_in_background();
    std::thread::sleep(Duration::from_millis(2));
    let stop = Arc::new(AtomicBool::new(false));
    let spinners = busy(cpus(), &stop);
    std::thread::sleep(Duration::from_millis(100));
    let mut worst = Duration::ZERO;
    let mut calls = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        let t = Instant::now();
        // SAFETY: a fresh anonymous mapping, unmapped at once; plain values.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                1 << 20,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p, 1 << 20);
        }
        worst = worst.max(t.elapsed());
        calls += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    for s in spinners {
        s.join().unwrap();
    }
    drop(vol);
    eprintln!("{calls} mmap+munmap, worst {worst:?}");
    assert!(
        worst < Duration::from_millis(100),
        "an mmap+munmap took {worst:?} while the volume prefaulted under CPU load"
    );
}
