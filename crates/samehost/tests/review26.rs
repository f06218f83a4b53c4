//! Review 26: the client's window prefault thread (70ad138), which populates the
//! writable mapping of a fully allocated image under SCHED_IDLE, 1 MiB per
//! MADV_POPULATE_WRITE. Inside madvise it holds the process's mmap lock; when every CPU
//! runs normal-priority work (an application's compute threads: the very process that
//! checkpoints) it is preempted mid-step and gets the CPU back only rarely, and all the
//! while every mmap, munmap, mprotect, fork and thread creation of the application
//! waits for it.
//!
//! Fixed: the thread faults pages in from user space (`zcfs_pmem::touch_writable`),
//! holding no lock of the address space between pages.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcfs_samehost::client::Client;

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

/// A served image of `size` bytes with every byte allocated (so `direct_map` starts
/// the window prefault thread).
fn serve_allocated(name: &str, size: u64) -> Served {
    let s = serve_sized(name, size, |_| {});
    allocate_whole(&s.image);
    s
}

/// The longest of 1 MiB anonymous mmap+munmap pairs over `dur`.
fn worst_mmap(dur: Duration) -> (Duration, u32) {
    let mut worst = Duration::ZERO;
    let mut calls = 0;
    let t0 = Instant::now();
    while t0.elapsed() < dur {
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
    (worst, calls)
}

/// An application whose CPUs are busy maps memory promptly after `direct_map`.
#[test]
fn the_applications_mmap_is_prompt_while_its_window_is_prefaulted_under_load() {
    normal_priority();
    let s = serve_allocated("r26-mmap", 512 << 20);
    let stop = Arc::new(AtomicBool::new(false));
    let spinners = busy(cpus(), &stop);
    std::thread::sleep(Duration::from_millis(50));
    let (base, _) = worst_mmap(Duration::from_millis(500));
    let mut c = Client::connect(&s.sock).unwrap();
    c.direct_map().unwrap();
    let (worst, calls) = worst_mmap(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    for t in spinners {
        t.join().unwrap();
    }
    drop(c);
    eprintln!("without the thread: worst {base:?}; with it: {calls} calls, worst {worst:?}");
    assert!(
        worst < Duration::from_millis(100),
        "an mmap+munmap took {worst:?} (without the prefault thread: {base:?})"
    );
}
