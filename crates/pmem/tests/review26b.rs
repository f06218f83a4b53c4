//! Review 26b: a region dropped while a `Prefaulter` step runs puts anonymous memory in
//! the image's place (7460554). Guard: the file's mapping and lock go with the drop
//! (an open right after succeeds), the step ends on the anonymous memory without
//! touching the file, and the range is unmapped when it does.

use std::os::unix::io::AsRawFd;
use std::time::{Duration, Instant};
use zcfs_pmem::{LockMode, OpenParams, Region};

fn maps_naming(path: &str) -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.ends_with(path))
        .count()
}

fn mapped_at(addr: usize) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .any(|l| {
            let r = l.split_whitespace().next().unwrap();
            let (a, b) = r.split_once('-').unwrap();
            let (a, b) = (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            );
            (a..b).contains(&addr)
        })
}

#[test]
fn dropping_a_region_mid_step_releases_the_file_at_once_and_unmaps_after_the_step() {
    const LEN: usize = 256 << 20;
    let path = format!("/dev/shm/zcfs-review26b-pmem-{}.img", std::process::id());
    struct Rm(String);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _rm = Rm(path.clone());
    {
        let f = std::fs::File::create(&path).unwrap();
        // SAFETY: fallocate on a descriptor we own, plain integers.
        assert_eq!(
            unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, LEN as i64) },
            0
        );
    }
    let params = OpenParams {
        lock: LockMode::Exclusive,
        ..Default::default()
    };
    for round in 0..3u8 {
        let r = Region::open(std::path::Path::new(&path), &params).unwrap();
        // SAFETY: nothing else uses the region yet.
        unsafe { r.write(round as usize * 4096 + 7, &[round + 1]) };
        let base = {
            // SAFETY: reading one byte nothing writes.
            unsafe { r.slice(0, 1) }.as_ptr() as usize
        };
        let p = r.prefaulter();
        let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = started.clone();
        let t = std::thread::spawn(move || {
            s2.store(true, std::sync::atomic::Ordering::SeqCst);
            // One long step: the whole region, several times.
            let t0 = Instant::now();
            let mut n = 0;
            while n < 8 && t0.elapsed() < Duration::from_secs(3) {
                if !p.populate(0, LEN) {
                    break;
                }
                n += 1;
            }
        });
        while !started.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(5));
        drop(r);
        assert_eq!(
            maps_naming(&path),
            0,
            "round {round}: the image is still mapped"
        );
        let again = Region::open(std::path::Path::new(&path), &params)
            .unwrap_or_else(|e| panic!("round {round}: reopen right after the drop: {e}"));
        drop(again);
        t.join().unwrap();
        assert!(
            !mapped_at(base),
            "round {round}: the range stayed mapped after the step"
        );
    }
    let bytes = std::fs::read(&path).unwrap();
    for round in 0..3usize {
        assert_eq!(bytes[round * 4096 + 7], round as u8 + 1);
    }
    assert!(
        bytes
            .iter()
            .enumerate()
            .all(|(i, &b)| b == 0 || (i % 4096 == 7 && i < 3 * 4096)),
        "the step changed bytes of the file"
    );
}
