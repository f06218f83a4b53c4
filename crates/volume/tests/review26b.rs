//! Review 26b: the prefault thread faults pages in from user space
//! (`zcfs_pmem::touch_writable`) and runs where `Region::populating_is_free` says
//! populating costs page tables alone (7460554).
//!
//! `Region::populating_is_free` answers true for every shared mapping in `CacheLine`
//! mode, taking that mode for "a DAX mapping". But the mode can be forced
//! (`VolumeConfig::persist`, `zcfs serve --persist clflush`: "cache-line flushes on
//! /dev/shm to measure what real PM would cost") on any file: a sparse tmpfs image, a
//! file on a disk file system. `Volume::prefault_in_background` then touches every
//! hole ahead of the allocator (256 MiB): it takes memory the sparse image's owner did
//! not ask for, and where the tmpfs has no room left the touch is a store fault the
//! kernel answers with SIGBUS, killing the process, with the volume idle. Before
//! 7460554, MADV_POPULATE_WRITE returned EFAULT/ENOMEM instead.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;
use zcfs_pmem::{FlushInstr, PersistMode};
use zcfs_volume::*;

struct Img(std::path::PathBuf);
impl Drop for Img {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn forced_cacheline() -> VolumeConfig {
    VolumeConfig {
        persist: Some(PersistMode::CacheLine(FlushInstr::Clflush)),
        ..Default::default()
    }
}

/// The documented contract of `prefault_in_background` ("Nothing for ... an image with
/// holes"): with `--persist clflush` on a sparse /dev/shm image the holes get memory.
#[test]
fn prefault_with_forced_cacheline_flushes_leaves_a_sparse_image_sparse() {
    let img = Img(std::path::PathBuf::from(format!(
        "/dev/shm/zcfs-review26b-sparse-{}.img",
        std::process::id()
    )));
    let _ = std::fs::remove_file(&img.0);
    Volume::mkfs(&img.0, 512 << 20, &MkfsOptions::default()).unwrap();
    let before = std::fs::metadata(&img.0).unwrap().blocks();
    let vol = Volume::open(&img.0, forced_cacheline()).unwrap();
    vol.prefault_in_background();
    std::thread::sleep(Duration::from_millis(500));
    let after = std::fs::metadata(&img.0).unwrap().blocks();
    drop(vol);
    eprintln!("blocks before {before} after {after}");
    assert_eq!(
        after,
        before,
        "the prefault thread gave the sparse image's holes {} MiB of memory",
        ((after - before) * 512) >> 20
    );
}

const CHILD: &str = "ZCFS_REVIEW26B_SIGBUS_CHILD";

/// What the child does: in a small tmpfs with no room left, open a sparse image with
/// cache-line flushes forced, start the prefault thread, and stay idle for a while.
fn idle_volume_on_a_full_tmpfs(dir: &std::path::Path) {
    let img = dir.join("v.img");
    Volume::mkfs(&img, 64 << 20, &MkfsOptions::default()).unwrap();
    // Fill what is left of the tmpfs.
    {
        use std::io::Write;
        let mut f = std::fs::File::create(dir.join("filler")).unwrap();
        let chunk = vec![1u8; 1 << 16];
        for _ in 0..4096 {
            if f.write_all(&chunk).is_err() {
                break;
            }
        }
    }
    let vol = Volume::open(&img, forced_cacheline()).unwrap();
    vol.prefault_in_background();
    std::thread::sleep(Duration::from_secs(2));
    drop(vol);
    println!("child survived");
}

/// An idle volume (no write at all) whose image has holes on a full tmpfs is killed by
/// SIGBUS from its own prefault thread.
#[test]
fn an_idle_volume_on_a_full_tmpfs_survives_its_prefault_thread() {
    if let Ok(dir) = std::env::var(CHILD) {
        idle_volume_on_a_full_tmpfs(std::path::Path::new(&dir));
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to mount a small tmpfs");
        return;
    }
    let dir = std::path::PathBuf::from(format!("/tmp/zcfs-review26b-tmpfs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=24m", "zcfs-r26b"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs");
    struct Mount(std::path::PathBuf);
    impl Drop for Mount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _m = Mount(dir.clone());
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "an_idle_volume_on_a_full_tmpfs_survives_its_prefault_thread",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, &dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "child: {:?}\n{}\n{}",
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::process::ExitStatusExt;
    assert_ne!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "the idle volume was killed by SIGBUS"
    );
    assert!(out.status.success() && stdout.contains("child survived"));
}

/// Guard: the prefault thread's touch (a byte swapped with itself) races writers of
/// the very pages it touches: each round starts a prefault thread at the start of the
/// data area while a writer fills blocks from there at full speed, half the rounds
/// with every CPU busy; then the volume is closed at once and opened again (the
/// thread's step may still run, on the anonymous memory put in the image's place).
/// Every byte written is there after the last reopen, and no round finds the volume
/// busy.
#[test]
fn writes_racing_the_prefault_touch_and_quick_reopens_lose_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const ROUNDS: u8 = 6;
    const LEN: usize = 24 << 20;
    let img = Img(std::path::PathBuf::from(format!(
        "/dev/shm/zcfs-review26b-race-{}.img",
        std::process::id()
    )));
    let _ = std::fs::remove_file(&img.0);
    Volume::mkfs(&img.0, 512 << 20, &MkfsOptions::default()).unwrap();
    {
        use std::os::unix::io::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&img.0)
            .unwrap();
        // SAFETY: fallocate on a descriptor we own, plain integers.
        assert_eq!(
            unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 512 << 20) },
            0
        );
    }
    let data = |round: u8| -> Vec<u8> {
        (0..LEN)
            .map(|i| {
                (i as u8)
                    .wrapping_mul(31)
                    .wrapping_add(round.wrapping_mul(7))
                    | 1
            })
            .collect()
    };
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    for round in 0..ROUNDS {
        let vol = Volume::open(&img.0, VolumeConfig::default()).expect("reopen at once");
        vol.prefault_in_background();
        let stop = Arc::new(AtomicBool::new(false));
        let spinners: Vec<_> = (0..if round % 2 == 1 { cpus } else { 0 })
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let t = std::time::Instant::now();
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) && t.elapsed() < Duration::from_secs(10) {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                })
            })
            .collect();
        let f = vol
            .create(
                &Cred::ROOT,
                ROOT_INO,
                format!("f{round}").as_bytes(),
                0o644,
                0,
            )
            .unwrap();
        let d = data(round);
        for (i, c) in d.chunks(64 << 10).enumerate() {
            assert_eq!(
                vol.write(&Cred::ROOT, f.ino, (i * (64 << 10)) as u64, c)
                    .unwrap(),
                c.len()
            );
        }
        drop(vol);
        stop.store(true, Ordering::Relaxed);
        for s in spinners {
            s.join().unwrap();
        }
    }
    let vol = Volume::open(&img.0, VolumeConfig::default()).unwrap();
    for round in 0..ROUNDS {
        let a = vol
            .lookup(&Cred::ROOT, ROOT_INO, format!("f{round}").as_bytes())
            .unwrap();
        let got = vol.read_with(a.ino, 0, LEN, |s| s.concat()).unwrap();
        assert!(got == data(round), "f{round} lost bytes");
    }
}
